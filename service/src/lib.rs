//! The plumbing every cluster program (k8s4r-server, k8s4r-manager) needs
//! to talk to Kubernetes and to be operated, in one copy:
//!
//! - [`call`]: every API call under a timeout, its failure named after what
//!   was being done, and its latency counted;
//! - [`patch`]: merge patches guarded by a `resourceVersion`;
//! - [`events`]: Events whose repeats are counted only when they say the
//!   same thing;
//! - [`backoff`]: a per-object retry delay for reconcilers;
//! - [`metrics`] and [`health`]: Prometheus metrics on `prometheus-client`
//!   and the `/metrics`, `/healthz`, `/readyz` endpoints;
//! - [`leader`]: leader election on a Lease, with `kube-lease-manager`;
//! - [`watch`]: watch streams whose relists reach controllers only once
//!   the cache holds them;
//! - [`written`]: a program's own last writes, until its watch brings them
//!   back;
//! - [`websocket`]: accepting a WebSocket on an axum route;
//! - [`lock()`]: a `Mutex` lock that survives a panic elsewhere.
//!
//! It holds no decisions: what to write and when stays in each program.

pub mod backoff;
pub mod call;
pub mod events;
pub mod health;
pub mod https;
pub mod leader;
mod lock;
pub mod metrics;
pub mod patch;
pub mod process;
pub mod watch;
pub mod websocket;
pub mod written;

pub use call::{ApiError, Kube};
pub use lock::lock;
