//! Command-line flags of `k8s4r-manager`; every flag has a `K8S4R_*`
//! environment variable.

use k8s4r_api::names;
use std::net::SocketAddr;
use std::path::PathBuf;
use std::time::Duration;

use anyhow::Context as _;
use clap::{ArgAction, Parser};
use k8s4r_api::logging::LogFormat;

use crate::config::{LeaderConfig, ManagerConfig};
use crate::lifecycle::LifecycleConfig;
use crate::liveness::LivenessConfig;

fn duration(s: &str) -> Result<Duration, String> {
    k8s4r_api::parse_duration(s).map_err(|e| e.to_string())
}

/// The k8s4r controllers: Jobs, TaskGroups, Tasks and Robots.
#[derive(Debug, Parser)]
#[command(name = "k8s4r-manager", version)]
pub struct Args {
    /// Kubeconfig to use; without it, the in-cluster service account or the
    /// default kubeconfig ($KUBECONFIG, ~/.kube/config).
    #[arg(long, env = "K8S4R_KUBECONFIG")]
    pub kubeconfig: Option<PathBuf>,
    /// Namespace of the bootstrap-token Secret and the leader Lease.
    #[arg(long, env = "K8S4R_NAMESPACE", default_value = names::DEFAULT_NAMESPACE)]
    pub namespace: String,
    /// Namespace of the per-robot Leases the server renews.
    #[arg(
        long,
        env = "K8S4R_ROBOT_LEASE_NAMESPACE",
        default_value = names::DEFAULT_ROBOT_LEASE_NAMESPACE
    )]
    pub robot_lease_namespace: String,
    /// A robot whose last heartbeat is older than this goes Offline.
    #[arg(long, env = "K8S4R_HEARTBEAT_TIMEOUT", default_value = "5m", value_parser = duration)]
    pub heartbeat_timeout: Duration,
    /// A robot that disconnected (it said `online: false` as it stopped, or
    /// its last will did) goes Offline after this; 0: at once.
    #[arg(long, env = "K8S4R_DISCONNECT_GRACE", default_value = "0s", value_parser = duration)]
    pub disconnect_grace: Duration,
    /// A robot registered or approved and not heard since goes Offline
    /// after this instead, when longer than --heartbeat-timeout: its first
    /// heartbeat waits for the registration's answer, which can take
    /// minutes in a storm of many thousands (0: no grace).
    #[arg(long, env = "K8S4R_STARTUP_GRACE", default_value = "10m", value_parser = duration)]
    pub startup_grace: Duration,
    /// The deadline of a dispatch: a robot refuses it later, and the
    /// attempt is then failed (DispatchTimeout) and retried.
    #[arg(long, env = "K8S4R_DISPATCH_TIMEOUT", default_value = "60s", value_parser = duration)]
    pub dispatch_timeout: Duration,
    /// Slack added to the fencing time before a silent robot's attempt is
    /// replaced (RobotLost): the robot stops it itself after the group's
    /// disconnect.stopAfter; this covers clock skew between cluster machines.
    #[arg(long, env = "K8S4R_ROBOT_LOST_GRACE", default_value = "30s", value_parser = duration)]
    pub robot_lost_grace: Duration,
    /// The servers' --lease-interval (how often they renew the Lease of a
    /// robot that holds work): a robot's Lease is never read as renewed more
    /// often, whatever its leaseDurationSeconds says.
    #[arg(long, env = "K8S4R_ROBOT_LEASE_INTERVAL", default_value = "60s", value_parser = duration)]
    pub robot_lease_interval: Duration,
    /// Slack after timeout + killTimeout before the manager fails a task its
    /// robot never reported finished (TimeoutBackstop).
    #[arg(long, env = "K8S4R_BACKSTOP_GRACE", default_value = "60s", value_parser = duration)]
    pub backstop_grace: Duration,
    /// Retries for attempts lost with their robot or never acknowledged,
    /// on top of each task's restart policy.
    #[arg(long, env = "K8S4R_LOST_RETRIES", default_value_t = 3)]
    pub lost_retries: u32,
    /// Approve every registering robot without checking its token.
    #[arg(long, env = "K8S4R_AUTO_APPROVE")]
    pub auto_approve: bool,
    /// Secret (in --namespace) whose values are the accepted bootstrap tokens.
    #[arg(
        long,
        env = "K8S4R_BOOTSTRAP_TOKEN_SECRET",
        default_value = names::DEFAULT_BOOTSTRAP_SECRET
    )]
    pub bootstrap_token_secret: String,
    /// Address of /metrics, /healthz and /readyz.
    #[arg(long, env = "K8S4R_METRICS_ADDR", default_value = "0.0.0.0:8080")]
    pub metrics_addr: SocketAddr,
    /// Serve the validating admission webhook (POST /validate, HTTPS) on this
    /// address; needs --webhook-cert-file and --webhook-key-file.
    #[arg(long, env = "K8S4R_WEBHOOK_ADDR", requires_all = ["webhook_cert_file", "webhook_key_file"])]
    pub webhook_addr: Option<SocketAddr>,
    /// The webhook's certificate chain (PEM), e.g. from a cert-manager Secret.
    #[arg(long, env = "K8S4R_WEBHOOK_CERT_FILE")]
    pub webhook_cert_file: Option<std::path::PathBuf>,
    /// The webhook's private key (PEM).
    #[arg(long, env = "K8S4R_WEBHOOK_KEY_FILE")]
    pub webhook_key_file: Option<std::path::PathBuf>,
    /// Run controllers only while holding the leader Lease.
    #[arg(long, env = "K8S4R_LEADER_ELECTION", default_value_t = true, action = ArgAction::Set)]
    pub leader_election: bool,
    /// Name of the leader Lease (in --namespace).
    #[arg(long, env = "K8S4R_LEASE_NAME", default_value = "k8s4r-manager")]
    pub lease_name: String,
    /// This replica's identity in the Lease (default: pod or host name and pid).
    #[arg(long, env = "K8S4R_IDENTITY")]
    pub identity: Option<String>,
    /// Limit on every call to the API server.
    #[arg(long, env = "K8S4R_API_TIMEOUT", default_value = "10s", value_parser = duration)]
    pub api_timeout: Duration,
    /// Routine (Normal) Events published per second at most; Warnings are
    /// never held back. 0: no limit.
    #[arg(long, env = "K8S4R_EVENT_QPS", default_value_t = 50)]
    pub event_qps: u32,
    /// The burst of routine Events allowed above --event-qps.
    #[arg(long, env = "K8S4R_EVENT_BURST", default_value_t = 100)]
    pub event_burst: u32,
    /// Publish routine (Normal) Events such as Scheduled, Started and
    /// Completed; false: only Warnings and a deleted Job's last record
    /// (with the server's --routine-events=false too, a one-task Job then
    /// costs five API writes fewer; its status still says what happened).
    #[arg(long, env = "K8S4R_ROUTINE_EVENTS", default_value_t = true, action = clap::ArgAction::Set)]
    pub routine_events: bool,
    /// Delete a finished Job (completed, failed or cancelled), with its
    /// TaskGroups and Tasks, this long after it finished, unless its
    /// spec.ttlSecondsAfterFinished says otherwise; a PeriodicJob's runs
    /// keep to its history limits instead. Unset: finished Jobs are kept.
    #[arg(long, env = "K8S4R_JOB_TTL_AFTER_FINISHED", value_parser = duration)]
    pub job_ttl_after_finished: Option<Duration>,
    /// Reconciles each controller runs at once at most (each may hold a
    /// connection to the API server); never two of the same object.
    #[arg(long, env = "K8S4R_CONCURRENT_RECONCILES", default_value_t = 64, value_parser = clap::value_parser!(u16).range(1..))]
    pub concurrent_reconciles: u16,
    /// Log format.
    #[arg(long, env = "K8S4R_LOG_FORMAT", value_enum, default_value_t = LogFormat::Text)]
    pub log_format: LogFormat,
    /// Log filter (RUST_LOG syntax, e.g. `k8s4r_manager=debug,info`); without
    /// it RUST_LOG applies, else `info`.
    #[arg(long, env = "K8S4R_LOG")]
    pub log: Option<String>,
}

impl Args {
    /// The webhook these flags describe, its certificate read from disk.
    fn webhook(&self) -> anyhow::Result<Option<crate::webhook::WebhookConfig>> {
        let (Some(addr), Some(cert), Some(key)) =
            (self.webhook_addr, &self.webhook_cert_file, &self.webhook_key_file)
        else {
            return Ok(None);
        };
        let read = |p: &std::path::Path| {
            std::fs::read_to_string(p).with_context(|| format!("reading the webhook's {}", p.display()))
        };
        Ok(Some(crate::webhook::WebhookConfig {
            addr,
            cert_pem: read(cert)?,
            key_pem: read(key)?,
        }))
    }

    /// The manager configuration these flags describe.
    pub fn config(&self) -> ManagerConfig {
        let leader = self.leader_election.then(|| {
            let identity = self.identity.clone().unwrap_or_else(crate::default_identity);
            LeaderConfig::new(self.lease_name.clone(), identity)
        });
        ManagerConfig {
            namespace: self.namespace.clone(),
            robot_lease_namespace: self.robot_lease_namespace.clone(),
            bootstrap_secret: self.bootstrap_token_secret.clone(),
            auto_approve: self.auto_approve,
            liveness: LivenessConfig {
                heartbeat_timeout: self.heartbeat_timeout,
                disconnect_grace: self.disconnect_grace,
                startup_grace: self.startup_grace,
            },
            lifecycle: LifecycleConfig {
                dispatch_timeout: self.dispatch_timeout,
                robot_lost_grace: self.robot_lost_grace,
                lease_interval: self.robot_lease_interval,
                backstop_grace: self.backstop_grace,
                lost_retries: self.lost_retries,
                ..LifecycleConfig::default()
            },
            leader,
            metrics_addr: Some(self.metrics_addr),
            api_timeout: self.api_timeout,
            event_qps: self.event_qps,
            event_burst: self.event_burst,
            routine_events: self.routine_events,
            job_ttl_after_finished: self.job_ttl_after_finished,
            concurrency: self.concurrent_reconciles,
            ..ManagerConfig::default()
        }
    }

    /// Runs the manager until SIGTERM or SIGINT.
    pub async fn run(self) -> anyhow::Result<()> {
        k8s4r_api::logging::init(self.log_format, self.log.as_deref())?;
        let client = k8s4r_service::process::client(self.kubeconfig.as_deref()).await?;
        let shutdown = k8s4r_service::process::shutdown_on_signals();
        let config = ManagerConfig {
            webhook: self.webhook()?,
            ..self.config()
        };
        crate::run(config, client, shutdown)
            .await
            .context("k8s4r-manager stopped")
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use clap::CommandFactory;

    #[test]
    fn flags_are_consistent() {
        Args::command().debug_assert();
    }

    #[test]
    fn defaults_follow_the_design() {
        let args = Args::parse_from(["k8s4r-manager"]);
        let config = args.config();
        assert_eq!(config.liveness.heartbeat_timeout, Duration::from_secs(300));
        assert_eq!(
            config.liveness,
            LivenessConfig::default(),
            "the flags' defaults are the code's"
        );
        assert!(config.leader.is_some());
        assert!(!config.auto_approve);
        assert_eq!(config.job_ttl_after_finished, None, "finished Jobs are kept");
        assert_eq!(config.concurrency, ManagerConfig::default().concurrency);
        let args = Args::parse_from([
            "k8s4r-manager",
            "--leader-election=false",
            "--heartbeat-timeout",
            "90s",
            "--auto-approve",
            "--job-ttl-after-finished",
            "7d",
        ]);
        let config = args.config();
        assert!(config.leader.is_none());
        assert_eq!(config.liveness.heartbeat_timeout, Duration::from_secs(90));
        assert!(config.auto_approve);
        assert_eq!(
            config.job_ttl_after_finished,
            Some(Duration::from_secs(7 * 24 * 3600))
        );
    }
}
