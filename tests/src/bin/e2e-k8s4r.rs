//! The real `k8s4r` command, built in this package so the dashboard tests
//! can run `k8s4r up` and `k8s4r dashboard` as processes (and kill them).

use clap::Parser;

/// The allocator the real program runs with (glibc's malloc took a third
/// of this server's CPU in a 100,000-robot scale bench), so that what the
/// tests and benches measure is what users run.
#[global_allocator]
static ALLOCATOR: mimalloc::MiMalloc = mimalloc::MiMalloc;

#[tokio::main]
async fn main() -> anyhow::Result<()> {
    k8s4r::Args::parse().run().await
}
