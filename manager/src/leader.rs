//! Leader election: only the replica holding the Lease runs controllers.

use std::sync::Arc;

use k8s4r_service::leader::Election;
use kube::Client;
use tokio_util::sync::CancellationToken;

use crate::config::{LeaderConfig, ManagerConfig};
use crate::controllers;
use crate::error::Result;
use crate::metrics::Metrics;

/// Waits for the Lease, runs the controllers while holding it, and stops
/// them (returning) when it is lost or `shutdown` is cancelled. Losing the
/// Lease is reported as an error so that the process exits and restarts as
/// a follower, rather than acting on caches that another leader now owns.
pub async fn run(
    client: Client,
    config: ManagerConfig,
    leader: LeaderConfig,
    metrics: Arc<Metrics>,
    shutdown: CancellationToken,
) -> Result<()> {
    let mut election = Election::start(
        client.clone(),
        &config.namespace,
        &leader,
        k8s4r_api::names::MANAGER_CONTROLLERS,
    )
    .await?;
    tracing::info!(identity = %leader.identity, lease = %leader.lease_name, "waiting for leadership");
    // A follower that reached the API server and its Lease is ready: it is
    // doing its job, standing by. (Were it not, a rolling update of two
    // replicas would wait forever for the new follower.)
    metrics.set_ready(true);
    while !election.is_leader() {
        tokio::select! {
            changed = election.changed() => { changed?; }
            _ = shutdown.cancelled() => {
                let _ = election.resign().await;
                return Ok(());
            }
        }
    }
    tracing::info!(identity = %leader.identity, "leading");
    metrics.set_leader(true);
    // Not ready again until the controllers' caches are filled.
    metrics.set_ready(false);
    let stop = shutdown.child_token();
    let controllers = controllers::run(
        client,
        config,
        metrics.clone(),
        leader.identity.clone(),
        stop.clone(),
    );
    tokio::pin!(controllers);
    let outcome = loop {
        tokio::select! {
            result = &mut controllers => break result,
            changed = election.changed() => {
                if !changed.unwrap_or(false) {
                    tracing::warn!(identity = %leader.identity, "lost leadership, stopping controllers");
                    stop.cancel();
                    let _ = (&mut controllers).await;
                    metrics.set_leader(false);
                    return Err(crate::Error::LeadershipLost);
                }
            }
        }
    };
    metrics.set_leader(false);
    // Resigning releases the Lease, so a follower takes over at once
    // instead of waiting for it to expire.
    let _ = election.resign().await;
    outcome
}
