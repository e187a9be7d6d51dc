//! Wiring: from a [`Config`] to a running agent, and the handle to it.

use std::path::PathBuf;

use k8s4r_api::protocol::Topics;
use tokio::sync::watch;
use tokio::task::JoinHandle;
use tokio_util::sync::CancellationToken;

use crate::config::{Config, ConfigError};
use crate::mqtt::{self, TlsError};
use crate::outbox::{Outbox, OutboxError};
use crate::session::{Session, SessionStatus};
use crate::supervisor::{self, SupervisorConfig, SupervisorError};

/// Why the agent could not start.
#[derive(Debug, thiserror::Error)]
pub enum AgentError {
    /// Bad configuration.
    #[error(transparent)]
    Config(#[from] ConfigError),
    /// TLS files unusable.
    #[error(transparent)]
    Tls(#[from] TlsError),
    /// The outbox could not be opened.
    #[error(transparent)]
    Outbox(#[from] OutboxError),
    /// The supervisor could not start.
    #[error("task supervisor: {0}")]
    Supervisor(#[from] SupervisorError),
    /// The state directory could not be created.
    #[error("state directory {path}: {source}")]
    StateDir {
        /// The directory.
        path: PathBuf,
        /// The error.
        source: std::io::Error,
    },
}

/// A cheap, cloneable handle on a running agent.
#[derive(Debug, Clone)]
pub struct AgentHandle {
    status: watch::Receiver<SessionStatus>,
    shutdown: CancellationToken,
}

impl AgentHandle {
    /// The session's current status.
    pub fn status(&self) -> SessionStatus {
        self.status.borrow().clone()
    }

    /// Waits until `f` holds for the status (or the agent stopped).
    pub async fn wait_for(&mut self, f: impl FnMut(&SessionStatus) -> bool) -> Option<SessionStatus> {
        self.status.wait_for(f).await.ok().map(|s| s.clone())
    }

    /// Starts the shutdown sequence.
    pub fn shutdown(&self) {
        self.shutdown.cancel();
    }
}

/// The supervisor's settings: its defaults, overridden by the config.
pub fn supervisor_config(config: &Config) -> SupervisorConfig {
    let s = &config.supervisor;
    let d = SupervisorConfig::default();
    SupervisorConfig {
        state_dir: config.state_dir.clone(),
        log_max_bytes: s.log_max_bytes.unwrap_or(d.log_max_bytes),
        log_max_files: s.log_max_files.unwrap_or(d.log_max_files),
        output_tail_bytes: s.output_tail_bytes.unwrap_or(d.output_tail_bytes),
        artifact_max_bytes: s.artifact_max_bytes.unwrap_or(d.artifact_max_bytes),
        artifact_timeout: s.artifact_timeout.unwrap_or(d.artifact_timeout),
        artifact_retries: s.artifact_retries.unwrap_or(d.artifact_retries),
        exec_default_user: s.exec_default_user.clone().unwrap_or(d.exec_default_user),
        cgroup_root: s.cgroup_root.clone().or(d.cgroup_root),
    }
}

/// Starts the agent: opens the outbox, starts the supervisor and the MQTT
/// session. The session runs until `shutdown` is cancelled and its shutdown
/// sequence ends; the returned task finishes then.
pub fn start(
    config: &Config,
    shutdown: CancellationToken,
) -> Result<(AgentHandle, JoinHandle<()>), AgentError> {
    mqtt::install_crypto_provider();
    std::fs::create_dir_all(&config.state_dir).map_err(|source| AgentError::StateDir {
        path: config.state_dir.clone(),
        source,
    })?;
    let outbox = Outbox::open(&config.state_dir.join("outbox"), config.outbox_max_entries)?;
    if !outbox.is_empty() {
        tracing::info!(
            entries = outbox.len(),
            "status updates from a previous run wait in the outbox"
        );
    }
    let options = mqtt::options(config, &Topics::new(&config.topic_prefix))?;
    let (supervisor, events) = supervisor::spawn(supervisor_config(config))?;
    let (session, status) = Session::new(config, options, outbox, supervisor, events);
    tracing::info!(
        robot = %config.robot_id,
        broker = %format!("{}:{}", config.broker.host, config.broker.port),
        tls = config.broker.tls.is_some(),
        "agent starting"
    );
    let task = tokio::spawn(session.run(shutdown.clone()));
    Ok((AgentHandle { status, shutdown }, task))
}
