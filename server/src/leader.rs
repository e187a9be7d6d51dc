//! Leader election for the Kubernetes → MQTT side when replicas scale out.
//!
//! Every replica handles robot messages (shared subscriptions split them);
//! only the holder of the Lease `k8s4r-server-leader` publishes dispatches
//! and cancels, so no Task is published twice by two replicas. The election
//! itself is [`k8s4r_service::leader`]'s, the same as the manager's: a
//! replica restarted under the same identity takes its Lease back at once,
//! and one that stops releases it for the others.

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::Duration;

use k8s4r_api::names::MANAGER_SERVER;
use k8s4r_service::leader::{Election, LeaderConfig};
use kube::Client;
use tokio_util::sync::CancellationToken;
use tracing::{info, warn};

/// The Lease replicas compete for, in the lease namespace.
pub const LEADER_LEASE: &str = "k8s4r-server-leader";
/// How long to wait before campaigning again after the API server failed us.
const RETRY: Duration = Duration::from_secs(3);

/// Whether this replica may publish to robots. Cheap to clone.
#[derive(Clone, Debug)]
pub struct Leadership(Arc<AtomicBool>);

impl Leadership {
    /// Always the leader: one replica, no election.
    pub fn always() -> Self {
        Self(Arc::new(AtomicBool::new(true)))
    }

    /// Not the leader until an election says so.
    pub fn follower() -> Self {
        Self(Arc::new(AtomicBool::new(false)))
    }

    /// Whether this replica leads now.
    pub fn is_leader(&self) -> bool {
        self.0.load(Ordering::Relaxed)
    }

    fn set(&self, leader: bool) {
        if self.0.swap(leader, Ordering::Relaxed) != leader {
            info!(leader, "leadership changed");
        }
    }
}

/// Campaigns for `config`'s Lease in `namespace` until `shutdown`, keeping
/// `leadership` current, then resigns. An election that fails (the API
/// server away) makes this replica a follower and starts again.
pub async fn campaign(
    client: Client,
    namespace: String,
    config: LeaderConfig,
    leadership: Leadership,
    api_timeout: Duration,
    shutdown: CancellationToken,
) {
    while !shutdown.is_cancelled() {
        let started = tokio::select! {
            _ = shutdown.cancelled() => break,
            started = tokio::time::timeout(
                api_timeout,
                Election::start(client.clone(), &namespace, &config, MANAGER_SERVER),
            ) => started,
        };
        let mut election = match started {
            Ok(Ok(election)) => election,
            Ok(Err(error)) => {
                warn!(%error, "could not start the leader election");
                tokio::select! {
                    _ = shutdown.cancelled() => break,
                    _ = tokio::time::sleep(RETRY) => continue,
                }
            }
            Err(_) => {
                let error = format!("the API server did not answer within {api_timeout:?}");
                warn!(%error, "could not start the leader election");
                tokio::select! {
                    _ = shutdown.cancelled() => break,
                    _ = tokio::time::sleep(RETRY) => continue,
                }
            }
        };
        leadership.set(election.is_leader());
        let failed = loop {
            tokio::select! {
                _ = shutdown.cancelled() => break false,
                changed = election.changed() => match changed {
                    Ok(leader) => leadership.set(leader),
                    Err(error) => {
                        warn!(%error, "leader election");
                        break true;
                    }
                },
            }
        };
        leadership.set(false);
        // Hand over at once instead of making the others wait out the Lease.
        match tokio::time::timeout(api_timeout, election.resign()).await {
            Ok(Ok(())) if !failed => info!("left the leader election"),
            Ok(Ok(())) => {}
            Ok(Err(error)) => warn!(%error, "could not release the leader lease"),
            Err(_) => warn!("releasing the leader lease timed out"),
        }
        if failed {
            tokio::select! {
                _ = shutdown.cancelled() => break,
                _ = tokio::time::sleep(RETRY) => {}
            }
        }
    }
}
