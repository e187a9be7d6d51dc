//! The real manager (`k8s4r-manager`), built in this package so the fault
//! scenarios can run it as a process they SIGKILL and restart.

use clap::Parser;

#[tokio::main]
async fn main() -> anyhow::Result<()> {
    k8s4r_manager::cli::Args::parse().run().await
}
