//! The real `apiserver-lite`, built in this package so the fault scenarios
//! can run it as a process they stop and restart.

use clap::Parser;

/// The allocator the real program runs with (glibc's malloc took a third
/// of this server's CPU in a 100,000-robot scale bench), so that what the
/// tests and benches measure is what users run.
#[global_allocator]
static ALLOCATOR: mimalloc::MiMalloc = mimalloc::MiMalloc;

#[tokio::main]
async fn main() -> anyhow::Result<()> {
    apiserver_lite::cli::Args::parse().run().await
}
