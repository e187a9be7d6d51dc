//! k8s4r-manager: every decision of k8s4r, as kube-runtime controllers.
//!
//! - [`controllers::job`]: one TaskGroup per group of a Job; Job status.
//! - [`controllers::taskgroup`]: `count` Tasks per TaskGroup; its status.
//! - [`controllers::task`]: scheduling ([`scheduler`]) and the lifecycle
//!   ([`lifecycle`]): dispatch timeouts, lost robots, the timeout backstop,
//!   restarts with backoff.
//! - [`controllers::robot`]: approval and Online/Offline ([`liveness`]),
//!   `status.allocated`.
//!
//! The decision logic is plain functions over plain data; the controllers
//! only read objects, call them and write the outcome. [`run`] starts
//! everything on a given client, so `k8s4r up` can run the manager in its
//! own process.

pub mod aggregate;
pub mod cli;
pub mod config;
pub mod error;
pub mod ledger;
pub mod lifecycle;
pub mod liveness;
pub mod metrics;
pub mod scheduler;

pub use error::{Error, Result};
