//! `apiserver-lite`: serve the embedded API server, or benchmark it.

use clap::Parser;

#[tokio::main]
async fn main() -> anyhow::Result<()> {
    apiserver_lite::cli::Args::parse().run().await
}
