//! What the manager is told to do, independent of where it came from
//! (flags for the binary, code for `k8s4r up` and the tests).

use std::net::SocketAddr;
use std::time::Duration;

use k8s4r_api::names;

use crate::lifecycle::LifecycleConfig;
use crate::liveness::LivenessConfig;

pub use k8s4r_service::leader::LeaderConfig;

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
    /// A Robot's `status.allocated` (what people read; the scheduler keeps
    /// its own ledger) is written at most this often while tasks land on
    /// it, unless its status is written anyway.
    pub allocation_interval: Duration,
    /// A TaskGroup's or Job's status that changed only in its counts (or
    /// completions, or the robots its tasks are on) is written at most this
    /// often; a change of state or condition is written at once.
    pub progress_interval: Duration,
    /// Coalesces bursts of Task changes into one status write of their
    /// TaskGroup (and of TaskGroup changes into one of their Job).
    pub status_debounce: Duration,
    /// Publish Kubernetes Events.
    pub events: bool,
    /// Routine (Normal) Events published per second at most, with bursts
    /// of `event_burst`, as kubelet's `--event-qps`: at scale a Scheduled
    /// or Started Event per task would double the API writes. Warnings are
    /// never held back. 0: no limit.
    pub event_qps: u32,
    /// The burst of routine Events allowed above `event_qps`.
    pub event_burst: u32,
    /// Publish routine (Normal) Events at all; false: only Warnings.
    pub routine_events: bool,
    /// Serve the validating admission webhook; `None`: not served.
    pub webhook: Option<crate::webhook::WebhookConfig>,
    /// How long a finished Job without a `ttlSecondsAfterFinished` of its
    /// own is kept before it is deleted (not a PeriodicJob's run: those
    /// keep to its history limits); `None`: kept until someone deletes it.
    pub job_ttl_after_finished: Option<Duration>,
    /// Reconciles each controller runs at once at most (never two of one
    /// object), as kube-controller-manager's `--concurrent-*-syncs`: every
    /// reconcile in flight may hold a connection to the API server, and
    /// unbounded, 60,000 Tasks and 100,000 Robots opened thousands and
    /// filled apiserver-lite's 2,048, which locked the server out. The rest
    /// wait for a slot first come first served.
    pub concurrency: u16,
}

impl Default for ManagerConfig {
    fn default() -> Self {
        Self {
            namespace: names::DEFAULT_NAMESPACE.into(),
            robot_lease_namespace: names::DEFAULT_ROBOT_LEASE_NAMESPACE.into(),
            bootstrap_secret: names::DEFAULT_BOOTSTRAP_SECRET.into(),
            auto_approve: false,
            liveness: LivenessConfig::default(),
            lifecycle: LifecycleConfig::default(),
            leader: None,
            metrics_addr: None,
            api_timeout: Duration::from_secs(10),
            error_backoff: Duration::from_millis(500),
            error_backoff_max: Duration::from_secs(300),
            robot_debounce: Duration::from_millis(500),
            allocation_interval: Duration::from_secs(5),
            status_debounce: Duration::ZERO,
            progress_interval: Duration::from_secs(1),
            events: true,
            event_qps: 50,
            event_burst: 100,
            routine_events: true,
            webhook: None,
            job_ttl_after_finished: None,
            concurrency: 64,
        }
    }
}
