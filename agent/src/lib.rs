//! The k8s4r robot agent.

pub mod admitted;
pub mod agent;
pub mod cli;
pub mod config;
pub mod facts;
pub mod fence;
pub mod gate;
pub mod host;
pub mod inbound;
pub mod link;
pub mod log_reader;
pub mod logger;
pub mod mqtt;
pub mod outbox;
pub mod outputs;
pub mod reach;
pub mod session;
pub mod supervisor;
pub mod unit;
pub mod upgrade;
pub mod watchdog;

static VERSION: std::sync::OnceLock<&'static str> = std::sync::OnceLock::new();

/// The version this agent says it is: its package's, unless the binary set
/// another at start ([`cli::main_as`]; the upgrade tests build a "next"
/// version that way).
pub fn version() -> &'static str {
    VERSION.get().copied().unwrap_or(env!("CARGO_PKG_VERSION"))
}
