//! The k8s4r robot agent.

pub mod agent;
pub mod cli;
pub mod config;
pub mod facts;
pub mod fence;
pub mod host;
pub mod inbound;
pub mod link;
pub mod log_reader;
pub mod mqtt;
pub mod outbox;
pub mod session;
pub mod supervisor;
pub mod upgrade;
