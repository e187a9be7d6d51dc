use clap::Parser;

#[tokio::main]
async fn main() -> anyhow::Result<()> {
    k8s4r::Args::parse().run().await
}
