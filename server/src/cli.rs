//! Command-line flags (each also an `K8S4R_...` environment variable) and
//! the process around [`crate::run`]: logging, kube client, signals.

use std::net::SocketAddr;
use std::path::PathBuf;
use std::time::Duration;

use clap::Parser;
use k8s4r_api::logging::LogFormat;
use k8s4r_service::leader::LeaderConfig;

use crate::config::{BrokerConfig, ServerConfig};
use crate::decide::Coalescing;
use crate::error::{Error, Result};

fn duration(s: &str) -> std::result::Result<Duration, String> {
    k8s4r_api::parse_duration(s).map_err(|e| e.to_string())
}

/// k8s4r-server: the bridge between the robots' MQTT broker and Kubernetes.
#[derive(Debug, Clone, Parser)]
#[command(name = "k8s4r-server", version, about)]
pub struct Args {
    /// Kubeconfig file; without it, the in-cluster config (or $KUBECONFIG,
    /// or ~/.kube/config) is used.
    #[arg(long, env = "K8S4R_KUBECONFIG")]
    pub kubeconfig: Option<PathBuf>,

    /// Broker URL: mqtt://host[:port] or mqtts://host[:port]. Several,
    /// comma-separated (or the flag repeated), when the robots are spread
    /// over brokers: the server connects to each, with the same TLS files,
    /// credentials and client id, and answers a robot on the broker it
    /// last heard it on.
    #[arg(
        long,
        env = "K8S4R_BROKER_URL",
        default_value = "mqtt://localhost:1883",
        value_delimiter = ','
    )]
    pub broker_url: Vec<String>,

    /// PEM CA bundle that signed the broker's certificate (mqtts).
    #[arg(long, env = "K8S4R_CA_FILE")]
    pub ca_file: Option<PathBuf>,

    /// PEM client certificate for mutual TLS.
    #[arg(long, env = "K8S4R_CLIENT_CERT", requires = "client_key")]
    pub client_cert: Option<PathBuf>,

    /// PEM private key of --client-cert.
    #[arg(long, env = "K8S4R_CLIENT_KEY", requires = "client_cert")]
    pub client_key: Option<PathBuf>,

    /// Broker username.
    #[arg(long, env = "K8S4R_MQTT_USERNAME")]
    pub username: Option<String>,

    /// Broker password (prefer the environment variable).
    #[arg(long, env = "K8S4R_MQTT_PASSWORD", hide_env_values = true)]
    pub password: Option<String>,

    /// MQTT client id; default `k8s4r-server-<identity>`. Keep it stable:
    /// the broker holds the session (and queued messages) under it.
    #[arg(long, env = "K8S4R_MQTT_CLIENT_ID")]
    pub client_id: Option<String>,

    /// Topic prefix.
    #[arg(long, env = "K8S4R_TOPIC_PREFIX", default_value = k8s4r_api::protocol::DEFAULT_PREFIX)]
    pub topic_prefix: String,

    /// Shared-subscription group: replicas with the same group split the
    /// robots' messages between them.
    #[arg(long, env = "K8S4R_SHARED_GROUP")]
    pub shared_group: Option<String>,

    /// Also accept the seed protocol's shared `<prefix>/register` and
    /// `<prefix>/heartbeat` topics (robot id in the body).
    #[arg(long, env = "K8S4R_LEGACY_TOPICS")]
    pub legacy_topics: bool,

    /// Namespace of the per-robot Leases (and of the leader Lease).
    #[arg(long, env = "K8S4R_LEASE_NAMESPACE", default_value = crate::config::DEFAULT_LEASE_NAMESPACE)]
    pub lease_namespace: String,

    /// Renew the Lease of a robot that holds work at most this often. The
    /// manager replaces a silent robot's attempt this much later.
    #[arg(long, env = "K8S4R_LEASE_INTERVAL", default_value = "60s", value_parser = duration)]
    pub lease_interval: Duration,

    /// Renew the Lease of a robot that holds no work at most this often (at
    /// least --lease-interval). It is renewed at once, at --lease-interval,
    /// when it is heard holding work; the manager's heartbeat timeout of an
    /// idle robot is three times this.
    #[arg(long, env = "K8S4R_IDLE_LEASE_INTERVAL", default_value = "600s", value_parser = duration)]
    pub idle_lease_interval: Duration,

    /// Write status.lastHeartbeatTime of a robot that holds work at most
    /// this often (sooner when its usage changes materially).
    #[arg(long, env = "K8S4R_HEARTBEAT_REFRESH", default_value = "240s", value_parser = duration)]
    pub heartbeat_refresh: Duration,

    /// Write status.lastHeartbeatTime of a robot that holds no work at most
    /// this often (at least --heartbeat-refresh).
    #[arg(long, env = "K8S4R_IDLE_HEARTBEAT_REFRESH", default_value = "1800s", value_parser = duration)]
    pub idle_heartbeat_refresh: Duration,

    /// Address of /metrics, /healthz and /readyz.
    #[arg(long, env = "K8S4R_METRICS_ADDR", default_value = "0.0.0.0:9090")]
    pub metrics_addr: SocketAddr,

    /// Serve the logs API (`logs.k8s4r.io/v1alpha1`, the backend of its
    /// APIService) on this address, HTTPS.
    #[arg(long, env = "K8S4R_LOGS_ADDR")]
    pub logs_addr: Option<SocketAddr>,
    /// Silence after which an exec, port-forward or copy session ends, on
    /// both sides: a robot cut off mid-session hangs its process up after
    /// this, and the client is told.
    #[arg(long, env = "K8S4R_SESSION_LEASE", default_value = "30s", value_parser = k8s4r_api::duration::parse_duration)]
    pub session_lease: std::time::Duration,
    /// The logs API's certificate (PEM); without it and --logs-key-file, a
    /// self-signed one is made at start (for an APIService with
    /// insecureSkipTLSVerify, or whose caBundle a tool such as cert-manager
    /// keeps).
    #[arg(long, env = "K8S4R_LOGS_CERT_FILE", requires = "logs_key_file")]
    pub logs_cert_file: Option<std::path::PathBuf>,
    /// The logs API's key (PEM).
    #[arg(long, env = "K8S4R_LOGS_KEY_FILE", requires = "logs_cert_file")]
    pub logs_key_file: Option<std::path::PathBuf>,

    /// The S3 endpoint task outputs go to (`https://s3.eu-west-1.amazonaws.com`,
    /// `http://minio.storage:9000`): path-style requests, SigV4.
    #[arg(long, env = "K8S4R_OUTPUTS_ENDPOINT", requires_all = ["outputs_bucket", "outputs_secret"])]
    pub outputs_endpoint: Option<String>,
    /// The bucket in it.
    #[arg(long, env = "K8S4R_OUTPUTS_BUCKET", requires = "outputs_endpoint")]
    pub outputs_bucket: Option<String>,
    /// The region signatures name.
    #[arg(long, env = "K8S4R_OUTPUTS_REGION", default_value = "us-east-1")]
    pub outputs_region: String,
    /// The Secret (NAMESPACE/NAME) with the bucket's credentials, keys
    /// `accessKeyId` and `secretAccessKey`; read at start, by the server
    /// only (robots get presigned URLs).
    #[arg(long, env = "K8S4R_OUTPUTS_SECRET", requires = "outputs_endpoint")]
    pub outputs_secret: Option<String>,

    /// This replica's name (default: $HOSTNAME, the pod name).
    #[arg(long, env = "K8S4R_IDENTITY")]
    pub identity: Option<String>,

    /// Elect one replica (Lease `k8s4r-server-leader`) to publish
    /// dispatches and cancels; needed when running more than one replica.
    #[arg(long, env = "K8S4R_LEADER_ELECTION")]
    pub leader_election: bool,

    /// Messages per second one robot may send on average; beyond it they
    /// are dropped and counted (a dropped status is sent again by its robot).
    #[arg(long, env = "K8S4R_ROBOT_RATE", default_value_t = 50.0, value_parser = positive_rate)]
    pub robot_rate: f64,

    /// Messages one robot may send at once after being quiet.
    #[arg(long, env = "K8S4R_ROBOT_BURST", default_value_t = 200.0, value_parser = burst)]
    pub robot_burst: f64,

    /// Bytes one robot may have waiting in the server; beyond it its
    /// messages are dropped and counted.
    #[arg(long, env = "K8S4R_ROBOT_QUEUE_BYTES", default_value_t = crate::ingress::Limits::default().queue_bytes)]
    pub robot_queue_bytes: usize,

    /// Timeout of every Kubernetes API call.
    #[arg(long, env = "K8S4R_API_TIMEOUT", default_value = "10s", value_parser = duration)]
    pub api_timeout: Duration,

    /// Routine (Normal) Events such as Dispatched recorded per second at
    /// most, as the manager's --event-qps; 0: no limit.
    #[arg(long, env = "K8S4R_EVENT_QPS", default_value_t = 50)]
    pub event_qps: u32,

    /// The burst of routine Events allowed above --event-qps.
    #[arg(long, env = "K8S4R_EVENT_BURST", default_value_t = 100)]
    pub event_burst: u32,

    /// Record routine (Normal) Events such as Dispatched; false: only
    /// Warnings, as the manager's --routine-events.
    #[arg(long, env = "K8S4R_ROUTINE_EVENTS", default_value_t = true, action = clap::ArgAction::Set)]
    pub routine_events: bool,

    /// Timeout of every publish, until the broker's PUBACK.
    #[arg(long, env = "K8S4R_PUBLISH_TIMEOUT", default_value = "10s", value_parser = duration)]
    pub publish_timeout: Duration,

    /// How long a robot's `online: false` (its last will, or its own word
    /// as it stops) is held before it is recorded: forgotten if the
    /// server's connection to that broker drops meanwhile (a broker that
    /// stops publishes every robot's last will: not every robot's fault)
    /// or the robot says `online: true` again. 0: recorded at once.
    #[arg(long, env = "K8S4R_WILL_HOLD", default_value = "2s", value_parser = duration)]
    pub will_hold: Duration,

    /// Parallel workers for robot messages (one robot's stay in order).
    #[arg(long, env = "K8S4R_WORKERS", default_value_t = crate::config::DEFAULT_WORKERS)]
    pub workers: usize,

    /// Log format.
    #[arg(long, env = "K8S4R_LOG_FORMAT", value_enum, default_value = "text")]
    pub log_format: LogFormat,

    /// Log filter (RUST_LOG syntax, e.g. `k8s4r_server=debug,info`); without
    /// it RUST_LOG applies, else `info`.
    #[arg(long, alias = "log-level", env = "K8S4R_LOG")]
    pub log: Option<String>,
}

fn positive_rate(s: &str) -> Result<f64, String> {
    match s.parse::<f64>() {
        Ok(r) if r.is_finite() && r > 0.0 => Ok(r),
        _ => Err(format!("{s:?} is not a rate above zero (messages per second)")),
    }
}

fn burst(s: &str) -> Result<f64, String> {
    match s.parse::<f64>() {
        Ok(b) if b.is_finite() && b >= 1.0 => Ok(b),
        _ => Err(format!("{s:?} is not a burst of at least one message")),
    }
}

impl Args {
    /// The settings these flags describe.
    pub fn server_config(&self) -> ServerConfig {
        let identity = self
            .identity
            .clone()
            .or_else(|| std::env::var("HOSTNAME").ok().filter(|h| !h.is_empty()))
            .unwrap_or_else(|| "k8s4r-server".to_owned());
        let client_id = self
            .client_id
            .clone()
            .unwrap_or_else(|| format!("k8s4r-server-{identity}"));
        // The default gives one at least; an empty one fails as a URL.
        let mut urls = self.broker_url.iter().cloned();
        let first = urls.next().unwrap_or_default();
        let mut config = ServerConfig::new(first.clone());
        config.more_brokers = urls.collect();
        config.broker = BrokerConfig {
            ca_file: self.ca_file.clone(),
            client_cert: self.client_cert.clone(),
            client_key: self.client_key.clone(),
            username: self.username.clone(),
            password: self.password.clone(),
            ..BrokerConfig::new(first, client_id)
        };
        config.topic_prefix = self.topic_prefix.clone();
        config.shared_group = self.shared_group.clone();
        config.legacy_topics = self.legacy_topics;
        config.lease_namespace = self.lease_namespace.clone();
        config.coalescing = Coalescing {
            lease_interval: self.lease_interval,
            idle_lease_interval: self.idle_lease_interval,
            status_refresh: self.heartbeat_refresh,
            idle_status_refresh: self.idle_heartbeat_refresh,
        };
        config.metrics_addr = Some(self.metrics_addr);
        config.leader = self
            .leader_election
            .then(|| LeaderConfig::new(crate::leader::LEADER_LEASE, identity.clone()));
        config.identity = identity;
        config.api_timeout = self.api_timeout;
        config.event_qps = self.event_qps;
        config.event_burst = self.event_burst;
        config.routine_events = self.routine_events;
        config.publish_timeout = self.publish_timeout;
        config.will_hold = self.will_hold;
        config.workers = self.workers;
        config.ingress = crate::ingress::Limits {
            queue_bytes: self.robot_queue_bytes,
            rate: self.robot_rate,
            burst: self.robot_burst,
        };
        config
    }

    /// The logs API these flags describe, its certificate read (or made).
    fn logs_config(&self) -> Result<Option<crate::config::LogsConfig>> {
        let Some(addr) = self.logs_addr else {
            return Ok(None);
        };
        let (cert_pem, key_pem) = match (&self.logs_cert_file, &self.logs_key_file) {
            (Some(cert), Some(key)) => {
                let read = |p: &std::path::Path| {
                    std::fs::read_to_string(p)
                        .map_err(|e| Error::Config(format!("reading {}: {e}", p.display())))
                };
                (read(cert)?, read(key)?)
            }
            _ => crate::logs::self_signed(&[self.identity.clone().unwrap_or_default()])
                .map_err(Error::Config)?,
        };
        Ok(Some(crate::config::LogsConfig {
            addr,
            cert_pem,
            key_pem,
            session_lease: self.session_lease,
        }))
    }

    /// Sets up logging, connects to Kubernetes, runs until SIGTERM or SIGINT.
    pub async fn run(self) -> Result<()> {
        k8s4r_api::logging::init(self.log_format, self.log.as_deref())
            .map_err(|e| Error::Config(e.to_string()))?;
        // rumqttc and kube are built without a default crypto provider.
        k8s4r_mqtt::install_crypto_provider();
        let client = k8s4r_service::process::client(self.kubeconfig.as_deref())
            .await
            .map_err(|e| Error::Config(e.to_string()))?;
        let shutdown = k8s4r_service::process::shutdown_on_signals();
        let mut config = self.server_config();
        config.logs = self.logs_config()?;
        config.outputs = self.outputs_config(&client).await?;
        crate::run(config, client, shutdown).await
    }

    /// The outputs' bucket, its credentials read from their Secret.
    async fn outputs_config(&self, client: &kube::Client) -> Result<Option<crate::bucket::BucketConfig>> {
        let (Some(endpoint), Some(bucket), Some(secret)) =
            (&self.outputs_endpoint, &self.outputs_bucket, &self.outputs_secret)
        else {
            return Ok(None);
        };
        let Some((ns, name)) = secret.split_once('/') else {
            return Err(Error::Config(format!(
                "--outputs-secret {secret:?}: name it NAMESPACE/NAME"
            )));
        };
        let secrets: kube::Api<k8s_openapi::api::core::v1::Secret> =
            kube::Api::namespaced(client.clone(), ns);
        let found = secrets
            .get_opt(name)
            .await
            .map_err(|e| Error::Config(format!("reading the outputs' Secret {secret}: {e}")))?
            .ok_or_else(|| Error::Config(format!("the outputs' Secret {secret} does not exist")))?;
        let key = |k: &str| {
            found
                .data
                .as_ref()
                .and_then(|d| d.get(k))
                .and_then(|v| String::from_utf8(v.0.clone()).ok())
                .filter(|v| !v.is_empty())
                .ok_or_else(|| Error::Config(format!("the outputs' Secret {secret} has no key {k}")))
        };
        let config = crate::bucket::BucketConfig {
            endpoint: endpoint.clone(),
            bucket: bucket.clone(),
            region: self.outputs_region.clone(),
            access_key: key("accessKeyId")?,
            secret_key: key("secretAccessKey")?,
        };
        crate::bucket::Bucket::new(&config).map_err(|e| Error::Config(e.to_string()))?;
        Ok(Some(config))
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use clap::CommandFactory;
    use std::path::Path;

    #[test]
    fn flags_are_consistent() {
        Args::command().debug_assert();
    }

    #[test]
    fn flags_become_a_config() {
        let args = Args::parse_from([
            "k8s4r-server",
            "--broker-url",
            "mqtt://broker:1884",
            "--shared-group",
            "servers",
            "--heartbeat-refresh",
            "2m",
            "--identity",
            "pod-0",
            "--legacy-topics",
        ]);
        let config = args.server_config();
        assert_eq!(config.broker.client_id, "k8s4r-server-pod-0");
        assert_eq!(config.coalescing.status_refresh, Duration::from_secs(120));
        assert_eq!(config.shared_group.as_deref(), Some("servers"));
        assert!(config.legacy_topics);
        let filters = crate::subscriptions(&config);
        assert!(filters.contains(&"$share/servers/k8s4r/robots/+/heartbeat".to_owned()));
        assert!(filters.contains(&"$share/servers/k8s4r/register".to_owned()));
        assert!(config.more_brokers.is_empty());
    }

    #[test]
    fn several_brokers_share_the_first_ones_settings() {
        let args = Args::parse_from([
            "k8s4r-server",
            "--broker-url",
            "mqtts://edge-0:8883,mqtts://edge-1:8883",
            "--broker-url",
            "mqtts://edge-2:8883",
            "--ca-file",
            "/etc/k8s4r/ca.pem",
            "--identity",
            "pod-0",
        ]);
        let brokers = args.server_config().brokers();
        let urls: Vec<_> = brokers.iter().map(|b| b.url.as_str()).collect();
        assert_eq!(
            urls,
            [
                "mqtts://edge-0:8883",
                "mqtts://edge-1:8883",
                "mqtts://edge-2:8883"
            ]
        );
        for broker in &brokers {
            assert_eq!(broker.client_id, "k8s4r-server-pod-0");
            assert_eq!(broker.ca_file.as_deref(), Some(Path::new("/etc/k8s4r/ca.pem")));
        }
    }
}
