use clap::Parser;
use k8s4r_server::cli::Args;

#[tokio::main]
async fn main() -> anyhow::Result<()> {
    Args::parse().run().await?;
    Ok(())
}
