use clap::Parser;

#[tokio::main]
async fn main() -> anyhow::Result<()> {
    k8s4r_manager::cli::Args::parse().run().await
}
