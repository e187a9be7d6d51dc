//! The real `k8s4r` command, built in this package so the dashboard tests
//! can run `k8s4r up` and `k8s4r dashboard` as processes (and kill them).

use clap::Parser;

#[tokio::main]
async fn main() -> anyhow::Result<()> {
    k8s4r::Args::parse().run().await
}
