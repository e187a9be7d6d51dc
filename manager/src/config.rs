//! What the manager is told to do, independent of where it came from
//! (flags for the binary, code for `k8s4r up` and the tests).

use std::net::SocketAddr;
use std::time::Duration;

use crate::lifecycle::LifecycleConfig;
use crate::liveness::LivenessConfig;

/// Leader election with a Lease.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct LeaderConfig {
    /// The Lease's name (in [`ManagerConfig::namespace`]).
    pub lease_name: String,
    /// This replica's identity (the Lease holder).
    pub identity: String,
    /// How long a held Lease lasts without renewal, in seconds.
    pub lease_seconds: u64,
    /// How long before expiry the holder renews it, in seconds.
    pub renew_grace_seconds: u64,
}

/// Everything the controllers need to know.
#[derive(Clone, Debug)]
pub struct ManagerConfig {
    /// Namespace of the bootstrap-token Secret and the leader Lease.
    pub namespace: String,
    /// Namespace of the per-robot Leases the server renews.
    pub robot_lease_namespace: String,
    /// Name of the Secret whose values are the accepted bootstrap tokens.
    pub bootstrap_secret: String,
    /// Approve every registering robot without checking its token.
    pub auto_approve: bool,
    /// Heartbeat timeout and disconnect grace.
    pub liveness: LivenessConfig,
    /// Dispatch timeout, robot-lost grace, timeout backstop.
    pub lifecycle: LifecycleConfig,
    /// Leader election; `None` runs the controllers at once.
    pub leader: Option<LeaderConfig>,
    /// Where `/metrics`, `/healthz` and `/readyz` are served; `None`: nowhere.
    pub metrics_addr: Option<SocketAddr>,
    /// The limit on every call to the API server.
    pub api_timeout: Duration,
    /// First requeue after a reconcile error; doubled per failure.
    pub error_backoff: Duration,
    /// The cap of the error backoff.
    pub error_backoff_max: Duration,
    /// Coalesces bursts of changes to one Robot (allocation follows every
    /// task placed on it) into one reconcile.
    pub robot_debounce: Duration,
    /// Coalesces bursts of Task changes into one status write of their
    /// TaskGroup (and of TaskGroup changes into one of their Job).
    pub status_debounce: Duration,
    /// Publish Kubernetes Events.
    pub events: bool,
}

impl Default for ManagerConfig {
    fn default() -> Self {
        Self {
            namespace: "k8s4r-system".into(),
            robot_lease_namespace: "k8s4r-robot-leases".into(),
            bootstrap_secret: "k8s4r-bootstrap-tokens".into(),
            auto_approve: false,
            liveness: LivenessConfig::default(),
            lifecycle: LifecycleConfig::default(),
            leader: None,
            metrics_addr: None,
            api_timeout: Duration::from_secs(10),
            error_backoff: Duration::from_millis(500),
            error_backoff_max: Duration::from_secs(300),
            robot_debounce: Duration::from_millis(500),
            status_debounce: Duration::ZERO,
            events: true,
        }
    }
}

/// The requeue after the `failures`-th consecutive error (1 for the first):
/// doubling from `base`, never above `cap`.
pub fn error_backoff(base: Duration, cap: Duration, failures: u32) -> Duration {
    let factor = 1u32
        .checked_shl(failures.saturating_sub(1).min(31))
        .unwrap_or(u32::MAX);
    base.checked_mul(factor).unwrap_or(cap).min(cap)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn error_backoff_doubles_and_is_capped() {
        let base = Duration::from_millis(500);
        let cap = Duration::from_secs(5);
        let got: Vec<u128> = (1..=6).map(|n| error_backoff(base, cap, n).as_millis()).collect();
        assert_eq!(got, vec![500, 1000, 2000, 4000, 5000, 5000]);
        assert_eq!(error_backoff(base, cap, u32::MAX), cap);
    }
}
