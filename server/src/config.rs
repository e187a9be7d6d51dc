//! The server's settings, independent of how they were given (flags,
//! environment, or `k8s4r up` building them in code).

use std::net::SocketAddr;
use std::path::PathBuf;
use std::time::Duration;

use crate::decide::Coalescing;
use crate::error::Error;

/// Where the Leases of robots live unless told otherwise.
pub const DEFAULT_LEASE_NAMESPACE: &str = "k8s4r-robot-leases";

/// How to reach the broker.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct BrokerConfig {
    /// `mqtt://host[:port]` or `mqtts://host[:port]`.
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

/// A parsed broker URL.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct BrokerAddr {
    /// Host name or address.
    pub host: String,
    /// Port.
    pub port: u16,
    /// mqtts.
    pub tls: bool,
}

/// Parses `mqtt://host[:port]` (default port 1883) or `mqtts://host[:port]`
/// (default 8883).
pub fn parse_broker_url(url: &str) -> Result<BrokerAddr, Error> {
    let bad = |reason: &str| Error::Config(format!("broker URL {url:?}: {reason}"));
    let (tls, rest) = if let Some(rest) = url.strip_prefix("mqtts://") {
        (true, rest)
    } else if let Some(rest) = url.strip_prefix("mqtt://") {
        (false, rest)
    } else {
        return Err(bad("must start with mqtt:// or mqtts://"));
    };
    let rest = rest.trim_end_matches('/');
    let default_port = if tls { 8883 } else { 1883 };
    let (host, port) = match rest.strip_prefix('[') {
        Some(v6) => {
            let (host, after) = v6.split_once(']').ok_or_else(|| bad("unclosed '['"))?;
            (host, after.strip_prefix(':'))
        }
        None => match rest.rsplit_once(':') {
            Some((host, port)) => (host, Some(port)),
            None => (rest, None),
        },
    };
    let port = match port {
        Some(p) => p.parse::<u16>().map_err(|_| bad("the port is not a number"))?,
        None => default_port,
    };
    if host.is_empty() || host.contains('/') {
        return Err(bad("no host"));
    }
    Ok(BrokerAddr {
        host: host.to_owned(),
        port,
        tls,
    })
}

/// Everything the bridge needs besides a kube client.
#[derive(Debug, Clone, PartialEq)]
pub struct ServerConfig {
    /// The broker.
    pub broker: BrokerConfig,
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
    /// This replica's name, for the dispatch leader Lease.
    pub identity: String,
    /// Whether replicas elect one leader to publish dispatches and cancels.
    pub leader_election: bool,
    /// Timeout of every Kubernetes API call.
    pub api_timeout: Duration,
    /// Timeout of every publish (until the broker's PUBACK).
    pub publish_timeout: Duration,
    /// Upper bound of retry backoff.
    pub max_backoff: Duration,
    /// Inbound workers; a robot's messages always go to the same one, in order.
    pub workers: usize,
}

impl ServerConfig {
    /// Defaults for a broker URL.
    pub fn new(broker_url: impl Into<String>) -> Self {
        let identity = "k8s4r-server".to_owned();
        Self {
            broker: BrokerConfig::new(broker_url, identity.clone()),
            topic_prefix: k8s4r_api::protocol::DEFAULT_PREFIX.to_owned(),
            shared_group: None,
            legacy_topics: false,
            lease_namespace: DEFAULT_LEASE_NAMESPACE.to_owned(),
            coalescing: Coalescing::default(),
            metrics_addr: None,
            identity,
            leader_election: false,
            api_timeout: Duration::from_secs(10),
            publish_timeout: Duration::from_secs(10),
            max_backoff: Duration::from_secs(30),
            workers: 8,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn broker_urls() {
        let a = parse_broker_url("mqtt://localhost").unwrap();
        assert_eq!((a.host.as_str(), a.port, a.tls), ("localhost", 1883, false));
        let a = parse_broker_url("mqtts://broker.example:9000/").unwrap();
        assert_eq!((a.host.as_str(), a.port, a.tls), ("broker.example", 9000, true));
        let a = parse_broker_url("mqtt://[::1]:1884").unwrap();
        assert_eq!((a.host.as_str(), a.port), ("::1", 1884));
        assert!(parse_broker_url("tcp://x").is_err());
        assert!(parse_broker_url("mqtt://x:port").is_err());
        assert!(parse_broker_url("mqtt://").is_err());
    }
}
