//! Leader election: only the replica holding the Lease runs controllers.

use std::sync::atomic::Ordering;
use std::sync::Arc;

use kube::Client;
use kube_lease_manager::LeaseManagerBuilder;
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
    let manager = LeaseManagerBuilder::new(client.clone(), &leader.lease_name)
        .with_namespace(&config.namespace)
        .with_identity(&leader.identity)
        .with_duration(leader.lease_seconds)
        .with_grace(leader.renew_grace_seconds)
        .with_field_manager(k8s4r_api::names::MANAGER_CONTROLLERS)
        .build()
        .await?;
    let (mut leading, watcher) = manager.watch().await;
    tracing::info!(identity = %leader.identity, lease = %leader.lease_name, "waiting for leadership");
    // A follower that reached the API server and its Lease is ready: it is
    // doing its job, standing by. (Were it not, a rolling update of two
    // replicas would wait forever for the new follower.)
    metrics.ready.store(true, Ordering::Relaxed);
    loop {
        if *leading.borrow_and_update() {
            break;
        }
        tokio::select! {
            changed = leading.changed() => {
                if changed.is_err() {
                    return Err(lost(watcher).await);
                }
            }
            _ = shutdown.cancelled() => {
                drop(leading);
                let _ = watcher.await;
                return Ok(());
            }
        }
    }
    tracing::info!(identity = %leader.identity, "leading");
    metrics.leader.store(true, Ordering::Relaxed);
    // Not ready again until the controllers' caches are filled.
    metrics.ready.store(false, Ordering::Relaxed);
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
            changed = leading.changed() => {
                if changed.is_err() || !*leading.borrow_and_update() {
                    tracing::warn!(identity = %leader.identity, "lost leadership, stopping controllers");
                    stop.cancel();
                    let _ = (&mut controllers).await;
                    metrics.leader.store(false, Ordering::Relaxed);
                    return Err(crate::Error::LeadershipLost);
                }
            }
        }
    };
    metrics.leader.store(false, Ordering::Relaxed);
    // Dropping the receiver makes the watcher release the Lease, so a
    // follower takes over at once instead of waiting for it to expire.
    drop(leading);
    let _ = watcher.await;
    outcome
}

async fn lost(
    watcher: tokio::task::JoinHandle<kube_lease_manager::Result<kube_lease_manager::LeaseManager>>,
) -> crate::Error {
    match watcher.await {
        Ok(Err(e)) => crate::Error::Leader(e),
        _ => crate::Error::LeadershipLost,
    }
}
