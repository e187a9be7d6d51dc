//! Command-line flags.

use clap::Parser;

/// The k8s4r controllers.
#[derive(Debug, Parser)]
pub struct Args {}

impl Args {
    /// Runs the manager.
    pub async fn run(self) -> anyhow::Result<()> {
        Ok(())
    }
}
