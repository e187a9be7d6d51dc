//! The server's settings, independent of how they were given (flags,
//! environment, or `k8s4r up` building them in code).

use std::net::SocketAddr;
use std::path::PathBuf;
use std::time::Duration;

use crate::decide::Coalescing;
use k8s4r_service::leader::LeaderConfig;

use crate::ingress::Limits;

/// Where the Leases of robots live unless told otherwise.
pub const DEFAULT_LEASE_NAMESPACE: &str = k8s4r_api::names::DEFAULT_ROBOT_LEASE_NAMESPACE;

/// How to reach the broker.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct BrokerConfig {
    /// `mqtt://host[:port]` or `mqtts://host[:port]` (see [`k8s4r_mqtt::BrokerUrl`]).
    pub url: String,
    /// PEM CA bundle to verify the broker (required for mqtts).
    pub ca_file: Option<PathBuf>,
    /// PEM client certificate for mutual TLS.
    pub client_cert: Option<PathBuf>,
    /// PEM private key of the client certificate.
    pub client_key: Option<PathBuf>,
    /// Username.
    pub username: Option<String>,
    /// Password.
    pub password: Option<String>,
    /// MQTT client id; stable across restarts so the broker keeps the
    /// session (and queues robot messages while the server restarts).
    pub client_id: String,
    /// Keep-alive interval.
    pub keep_alive: Duration,
}

impl BrokerConfig {
    /// A plain-TCP broker at `url` with client id `client_id`.
    pub fn new(url: impl Into<String>, client_id: impl Into<String>) -> Self {
        Self {
            url: url.into(),
            ca_file: None,
            client_cert: None,
            client_key: None,
            username: None,
            password: None,
            client_id: client_id.into(),
            keep_alive: Duration::from_secs(30),
        }
    }
}

/// Where the logs API ([`crate::logs`]) listens and with which certificate.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct LogsConfig {
    /// The address.
    pub addr: SocketAddr,
    /// Its certificate chain, PEM.
    pub cert_pem: String,
    /// Its key, PEM.
    pub key_pem: String,
    /// Silence after which an exec, port-forward or copy session ends, on
    /// both sides (the robot hangs its process up).
    pub session_lease: std::time::Duration,
}

/// Everything the bridge needs besides a kube client.
#[derive(Debug, Clone, PartialEq)]
pub struct ServerConfig {
    /// The broker (its TLS files, credentials and client id serve every
    /// broker in `more_brokers` too).
    pub broker: BrokerConfig,
    /// Further brokers the robots are spread over (`mqtt://` or `mqtts://`
    /// URLs): the server holds a connection to each and answers a robot on
    /// the broker it last heard the robot on, so a fleet too large for one
    /// broker needs no bridge to a central one.
    pub more_brokers: Vec<String>,
    /// Topic prefix (`k8s4r`).
    pub topic_prefix: String,
    /// Shared-subscription group: replicas in one group split the robots'
    /// messages (`$share/<group>/...`). None: a plain subscription.
    pub shared_group: Option<String>,
    /// Also accept the seed protocol's shared `register` and `heartbeat` topics.
    pub legacy_topics: bool,
    /// Namespace of the per-robot Leases (created if missing).
    pub lease_namespace: String,
    /// Heartbeat write limits.
    pub coalescing: Coalescing,
    /// Where to serve /metrics, /healthz and /readyz; None: not served.
    pub metrics_addr: Option<SocketAddr>,
    /// Where to serve the logs API (the backend of the APIService
    /// `v1alpha1.logs.k8s4r.io`); None: not served.
    pub logs: Option<LogsConfig>,
    /// This replica's name (the Events it records say so).
    pub identity: String,
    /// Leader election among replicas: only the holder of this Lease (in
    /// `lease_namespace`) publishes dispatches and cancels. `None`: this
    /// replica always publishes.
    pub leader: Option<LeaderConfig>,
    /// Routine (Normal) Events (`Dispatched`, `CancelSent`, `EvictionSent`)
    /// recorded per second at most, with bursts of `event_burst`, under the
    /// same rule as the manager's: at scale a `Dispatched` per attempt is an
    /// API write per task. 0: no limit.
    pub event_qps: u32,
    /// The burst of routine Events allowed above `event_qps`.
    pub event_burst: u32,
    /// Record routine (Normal) Events at all; false: only Warnings.
    pub routine_events: bool,
    /// Timeout of every Kubernetes API call.
    pub api_timeout: Duration,
    /// Timeout of every publish (until the broker's PUBACK).
    pub publish_timeout: Duration,
    /// Upper bound of retry backoff.
    pub max_backoff: Duration,
    /// How long a robot's `online: false` is held before it is recorded,
    /// and forgotten if the broker connection drops meanwhile (a broker
    /// that stops publishes every robot's last will) or the robot comes
    /// back (`crate::wills`). Zero: recorded at once.
    pub will_hold: Duration,
    /// Inbound workers; a robot's messages always go to the same one, in order.
    pub workers: usize,
    /// Each robot's share of the inbound path: queued bytes and rate.
    pub ingress: Limits,
    /// The bucket task outputs go to; None: robots are told there is none.
    pub outputs: Option<crate::bucket::BucketConfig>,
}

/// How long a robot's `online: false` is held by default: well past the
/// moment between a stopping broker's last wills and its closing the
/// server's connection (milliseconds), short beside the heartbeat timeout.
pub const DEFAULT_WILL_HOLD: Duration = Duration::from_secs(2);

/// Inbound workers by default. Each waits on its own API write, so this is
/// how many of a storm's writes are in flight at once: at 8, on an API
/// server answering a write in 0.5 s (two shared cores under a
/// 100,000-robot storm), registration answers queued 20 s behind other
/// robots' writes and robots asked again; 32 halved the storm
/// (BENCHMARKS.md). A real API server's priority levels hold more seats
/// than one replica's workers (deploy/cluster/50-flowcontrol.yaml).
pub const DEFAULT_WORKERS: usize = 32;

impl ServerConfig {
    /// Every broker, `broker` first, each with `broker`'s settings.
    pub fn brokers(&self) -> Vec<BrokerConfig> {
        let more = self.more_brokers.iter().map(|url| BrokerConfig {
            url: url.clone(),
            ..self.broker.clone()
        });
        std::iter::once(self.broker.clone()).chain(more).collect()
    }

    /// Defaults for a broker URL.
    pub fn new(broker_url: impl Into<String>) -> Self {
        let identity = "k8s4r-server".to_owned();
        Self {
            broker: BrokerConfig::new(broker_url, identity.clone()),
            more_brokers: Vec::new(),
            topic_prefix: k8s4r_api::protocol::DEFAULT_PREFIX.to_owned(),
            shared_group: None,
            legacy_topics: false,
            lease_namespace: DEFAULT_LEASE_NAMESPACE.to_owned(),
            coalescing: Coalescing::default(),
            metrics_addr: None,
            logs: None,
            identity,
            leader: None,
            event_qps: 50,
            event_burst: 100,
            routine_events: true,
            api_timeout: Duration::from_secs(10),
            publish_timeout: Duration::from_secs(10),
            max_backoff: Duration::from_secs(30),
            will_hold: DEFAULT_WILL_HOLD,
            workers: DEFAULT_WORKERS,
            ingress: Limits::default(),
            outputs: None,
        }
    }
}
