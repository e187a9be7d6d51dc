//! The k8s4r robot agent.

pub mod backoff;
pub mod config;
pub mod host;
pub mod inbound;
pub mod outbox;
pub mod supervisor;
