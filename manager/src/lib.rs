//! k8s4r-manager: every decision of k8s4r, as kube-runtime controllers.
//!
//! - [`controllers::job`]: one TaskGroup per group of a Job; Job status;
//!   finished Jobs deleted after their ttl ([`expiry`]).
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

pub mod agent_rollout;
pub mod aggregate;
pub mod cli;
pub mod config;
pub mod config_change;
pub mod controllers;
pub mod deadline;
pub mod error;
pub mod expiry;
pub mod fleet;
pub mod leader;
pub mod ledger;
pub mod lifecycle;
pub mod liveness;
pub mod manual;
pub mod metrics;
pub mod periodic;
pub mod scheduler;
pub mod webhook;

use std::sync::Arc;

use tokio_util::sync::CancellationToken;

pub use config::{LeaderConfig, ManagerConfig};
pub use error::{Error, Result};
pub use metrics::Metrics;

/// Runs the manager on `client` until `shutdown` is cancelled (or, with
/// leader election, until the Lease is lost: [`Error::LeadershipLost`]).
pub async fn run(config: ManagerConfig, client: kube::Client, shutdown: CancellationToken) -> Result<()> {
    run_with_metrics(config, client, Arc::new(Metrics::default()), shutdown).await
}

/// [`run`], recording into the given metrics (tests and benchmarks read them).
pub async fn run_with_metrics(
    config: ManagerConfig,
    client: kube::Client,
    metrics: Arc<Metrics>,
    shutdown: CancellationToken,
) -> Result<()> {
    let server_stop = shutdown.child_token();
    let server = match config.metrics_addr {
        Some(addr) => {
            let (bound, serve) = k8s4r_service::health::bind(addr, metrics.clone(), server_stop.clone())
                .await
                .map_err(|source| Error::Metrics { addr, source })?;
            tracing::info!(addr = %bound, "serving /metrics, /healthz, /readyz");
            Some(tokio::spawn(serve))
        }
        None => None,
    };
    // Every replica answers the webhook, leading or not.
    let webhook = match &config.webhook {
        Some(webhook) => {
            let (bound, serve) = webhook::bind(webhook, server_stop.clone())
                .await
                .map_err(|source| Error::Webhook {
                    addr: webhook.addr,
                    source,
                })?;
            tracing::info!(addr = %bound, path = webhook::PATH, "serving the validating admission webhook");
            Some(tokio::spawn(serve))
        }
        None => None,
    };
    let result = match config.leader.clone() {
        Some(leader) => leader::run(client, config, leader, metrics, shutdown.clone()).await,
        None => {
            let identity = default_identity();
            controllers::run(client, config, metrics, identity, shutdown.clone()).await
        }
    };
    server_stop.cancel();
    for task in [server, webhook].into_iter().flatten() {
        let _ = task.await;
    }
    result
}

/// This replica's name: the pod name when there is one, else host and pid.
pub fn default_identity() -> String {
    std::env::var("POD_NAME")
        .or_else(|_| std::env::var("HOSTNAME"))
        .map(|h| format!("{h}-{}", std::process::id()))
        .unwrap_or_else(|_| format!("k8s4r-manager-{}", std::process::id()))
}
