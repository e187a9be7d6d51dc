//! Leader election for the Kubernetes → MQTT side when replicas scale out.
//!
//! Every replica handles robot messages (shared subscriptions split them);
//! only the holder of the Lease `k8s4r-server-leader` publishes dispatches
//! and cancels, so no Task is published twice by two replicas. A replica
//! restarted under the same identity takes its Lease back at once.

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::Duration;

use jiff::Timestamp;
use k8s_openapi::api::coordination::v1::{Lease, LeaseSpec};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::{MicroTime, ObjectMeta};
use kube::api::PostParams;
use kube::Api;
use tokio_util::sync::CancellationToken;
use tracing::{info, warn};

/// The Lease replicas compete for, in the lease namespace.
pub const LEADER_LEASE: &str = "k8s4r-server-leader";
/// How long a leader's claim holds without renewal.
const LEASE_DURATION: Duration = Duration::from_secs(15);
/// How often the leader renews (and followers look).
const RETRY_PERIOD: Duration = Duration::from_secs(3);

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

/// What to do with the Lease as found.
#[derive(Debug, PartialEq, Eq)]
pub enum Claim {
    /// Ours: renew it.
    Renew,
    /// Free or expired: take it.
    Take,
    /// Someone else's and fresh.
    Follow,
}

/// Decides the claim on a Lease for `identity` at `now`.
pub fn claim(spec: Option<&LeaseSpec>, identity: &str, now: Timestamp) -> Claim {
    let Some(spec) = spec else { return Claim::Take };
    match spec.holder_identity.as_deref() {
        Some(holder) if holder == identity => Claim::Renew,
        None => Claim::Take,
        Some(_) => {
            let duration = spec
                .lease_duration_seconds
                .map(|s| Duration::from_secs(s.max(0) as u64))
                .unwrap_or(LEASE_DURATION);
            match spec.renew_time.as_ref() {
                Some(MicroTime(at)) if now.duration_since(*at).unsigned_abs() < duration => Claim::Follow,
                _ => Claim::Take,
            }
        }
    }
}

/// Campaigns for the Lease until `shutdown`, keeping `leadership` current.
pub async fn campaign(
    api: Api<Lease>,
    identity: String,
    leadership: Leadership,
    timeout: Duration,
    shutdown: CancellationToken,
) {
    let mut last_renewed: Option<tokio::time::Instant> = None;
    loop {
        let result = tokio::time::timeout(timeout, try_once(&api, &identity)).await;
        match result {
            Ok(Ok(true)) => {
                last_renewed = Some(tokio::time::Instant::now());
                leadership.set(true);
            }
            Ok(Ok(false)) => leadership.set(false),
            Ok(Err(error)) => warn!(%error, "leader election"),
            Err(_) => warn!("leader election: the API server did not answer in time"),
        }
        // Step down before anyone else may take over.
        if last_renewed.is_none_or(|at| at.elapsed() > LEASE_DURATION - RETRY_PERIOD) {
            leadership.set(false);
        }
        tokio::select! {
            _ = shutdown.cancelled() => break,
            _ = tokio::time::sleep(RETRY_PERIOD) => {}
        }
    }
    if leadership.is_leader() {
        leadership.set(false);
        // Hand over at once instead of making the others wait out the Lease.
        match tokio::time::timeout(timeout, release(&api, &identity)).await {
            Ok(Ok(())) => info!("leader lease released"),
            Ok(Err(error)) => warn!(%error, "could not release the leader lease"),
            Err(_) => warn!("releasing the leader lease timed out"),
        }
    }
}

async fn release(api: &Api<Lease>, identity: &str) -> kube::Result<()> {
    let Some(mut lease) = api.get_opt(LEADER_LEASE).await? else {
        return Ok(());
    };
    let Some(spec) = lease.spec.as_mut() else {
        return Ok(());
    };
    if spec.holder_identity.as_deref() != Some(identity) {
        return Ok(());
    }
    spec.holder_identity = None;
    let pp = PostParams {
        field_manager: Some(k8s4r_api::names::MANAGER_SERVER.to_owned()),
        ..Default::default()
    };
    api.replace(LEADER_LEASE, &pp, &lease).await.map(|_| ())
}

async fn try_once(api: &Api<Lease>, identity: &str) -> kube::Result<bool> {
    let now = Timestamp::now();
    let existing = api.get_opt(LEADER_LEASE).await?;
    let spec = existing.as_ref().and_then(|l| l.spec.as_ref());
    let decision = claim(spec, identity, now);
    if decision == Claim::Follow {
        return Ok(false);
    }
    let transitions = spec.and_then(|s| s.lease_transitions).unwrap_or(0);
    let acquire = match decision {
        Claim::Renew => spec.and_then(|s| s.acquire_time.clone()),
        _ => Some(MicroTime(now)),
    };
    let lease = Lease {
        metadata: ObjectMeta {
            name: Some(LEADER_LEASE.to_owned()),
            resource_version: existing
                .as_ref()
                .and_then(|l| l.metadata.resource_version.clone()),
            ..Default::default()
        },
        spec: Some(LeaseSpec {
            holder_identity: Some(identity.to_owned()),
            lease_duration_seconds: Some(LEASE_DURATION.as_secs() as i32),
            acquire_time: acquire,
            renew_time: Some(MicroTime(now)),
            lease_transitions: Some(if decision == Claim::Take && existing.is_some() {
                transitions + 1
            } else {
                transitions
            }),
            ..Default::default()
        }),
    };
    let pp = PostParams {
        field_manager: Some(k8s4r_api::names::MANAGER_SERVER.to_owned()),
        ..Default::default()
    };
    let written = match existing {
        None => api.create(&pp, &lease).await,
        Some(_) => api.replace(LEADER_LEASE, &pp, &lease).await,
    };
    match written {
        Ok(_) => Ok(true),
        // Someone else wrote first: follow until the next look.
        Err(kube::Error::Api(s)) if s.code == 409 => Ok(false),
        Err(e) => Err(e),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn spec(holder: &str, renewed: &str) -> LeaseSpec {
        LeaseSpec {
            holder_identity: Some(holder.into()),
            renew_time: Some(MicroTime(renewed.parse().unwrap())),
            lease_duration_seconds: Some(15),
            ..Default::default()
        }
    }

    #[test]
    fn claims() {
        let now: Timestamp = "2026-11-22T10:00:00Z".parse().unwrap();
        assert_eq!(claim(None, "a", now), Claim::Take);
        assert_eq!(
            claim(Some(&spec("a", "2026-11-22T09:00:00Z")), "a", now),
            Claim::Renew
        );
        assert_eq!(
            claim(Some(&spec("b", "2026-11-22T09:59:55Z")), "a", now),
            Claim::Follow
        );
        assert_eq!(
            claim(Some(&spec("b", "2026-11-22T09:59:40Z")), "a", now),
            Claim::Take
        );
    }
}
