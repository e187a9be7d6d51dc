//! `apiserver-lite`: serve the embedded API server, or benchmark it.

use clap::Parser;

/// The server allocates on every request; glibc's malloc spent a fifth of
/// the write path (BENCHMARKS.md).
#[global_allocator]
static ALLOCATOR: mimalloc::MiMalloc = mimalloc::MiMalloc;

#[tokio::main]
async fn main() -> anyhow::Result<()> {
    apiserver_lite::cli::Args::parse().run().await
}
