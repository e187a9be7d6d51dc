//! The real server (`k8s4r-server`), built in this package so the fault
//! scenarios can run it as a process they SIGKILL and restart.

use clap::Parser;

#[tokio::main]
async fn main() -> anyhow::Result<()> {
    k8s4r_server::cli::Args::parse().run().await?;
    Ok(())
}
