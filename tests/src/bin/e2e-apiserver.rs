//! The real `apiserver-lite`, built in this package so the fault scenarios
//! can run it as a process they stop and restart.

use clap::Parser;

#[tokio::main]
async fn main() -> anyhow::Result<()> {
    apiserver_lite::cli::Args::parse().run().await
}
