//! Wiring: from a [`Config`] to a running agent, and the handle to it.

use std::path::PathBuf;
use std::sync::{Arc, Mutex, OnceLock};

use k8s4r_api::protocol::Topics;
use k8s4r_api::AgentHealth;
use tokio::sync::watch;
use tokio::task::JoinHandle;
use tokio_util::sync::CancellationToken;

use crate::config::{Config, ConfigError};
use crate::mqtt::{self, TlsError};
use crate::outbox::{Outbox, OutboxError};
use crate::session::{Session, SessionStatus};
use crate::supervisor::{self, SupervisorError};
use crate::upgrade::Upgrades;

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
    #[error("state directory {path}: {source} (state_dir, --state-dir, chooses another)")]
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
    health: watch::Receiver<AgentHealth>,
    shutdown: CancellationToken,
    failure: Arc<OnceLock<String>>,
}

impl AgentHandle {
    /// Why the agent stopped on its own, if it did (its supervisor ended
    /// without being asked to): it must then exit non-zero.
    pub fn failure(&self) -> Option<String> {
        self.failure.get().cloned()
    }

    /// The supervisor's health, as the heartbeat reports it.
    pub fn health(&self) -> AgentHealth {
        self.health.borrow().clone()
    }

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

/// Starts the agent: opens the outbox, starts the supervisor and the MQTT
/// session. The session runs until `shutdown` is cancelled and its shutdown
/// sequence ends; the returned task finishes then. If the supervisor ends
/// on its own, the session is shut down as well (without cancelling
/// `shutdown`, which may be shared) and [`AgentHandle::failure`] says why.
pub fn start(
    config: &Config,
    shutdown: CancellationToken,
) -> Result<(AgentHandle, JoinHandle<()>), AgentError> {
    mqtt::install_crypto_provider();
    // Said before the directory is made: a hand-started agent that may not
    // write there learns where it tried.
    tracing::info!("the agent's {}", config.state_layout());
    std::fs::create_dir_all(&config.state_dir).map_err(|source| AgentError::StateDir {
        path: config.state_dir.clone(),
        source,
    })?;
    let outbox = Outbox::open(&config.outbox_dir(), config.outbox_max_entries)?;
    if !outbox.is_empty() {
        tracing::info!(
            entries = outbox.len(),
            "status updates from a previous run wait in the outbox"
        );
    }
    let options = mqtt::options(config, &Topics::new(&config.topic_prefix))?;
    let (supervisor, events) = supervisor::spawn(config.supervisor.clone())?;
    let health = supervisor.health();
    tracing::info!(
        robot = %config.robot_id,
        broker = %format!("{}:{}", config.broker.host, config.broker.port),
        tls = config.broker.tls.is_some(),
        drivers = ?supervisor.offer().drivers,
        allow_root = config.supervisor.policy.allow_root,
        "agent starting"
    );
    let (admitted, seen) =
        crate::admitted::Admitted::open(&config.state_dir).map_err(|source| AgentError::StateDir {
            path: config.state_dir.join(crate::admitted::FILE),
            source,
        })?;
    let (mut session, status) = Session::new(config, options, outbox, (admitted, seen), supervisor, events);
    let stop = shutdown.child_token();
    let upgrades = Arc::new(Mutex::new(Upgrades::at_start(
        &config.state_dir,
        config.upgrade_trust.clone(),
    )));
    session = session.with_upgrades(
        Arc::clone(&upgrades),
        stop.clone(),
        config.supervisor.artifact_limits(),
    );
    session = session.with_watchdog(crate::watchdog::Watchdog::from_env());
    if let Some(source) = &config.facts {
        tracing::info!(file = ?source.file, command = ?source.command, "reading the robot's facts");
        session = session.with_facts(crate::facts::watch(source.clone(), stop.clone()));
    }
    let failure = Arc::new(OnceLock::new());
    tokio::spawn(watch_supervisor(
        health.clone(),
        stop.clone(),
        Arc::clone(&failure),
    ));
    tokio::spawn(crate::upgrade::watch_trial(
        upgrades,
        stop.clone(),
        Arc::clone(&failure),
    ));
    let task = tokio::spawn(session.run(stop.clone()));
    let handle = AgentHandle {
        status,
        health,
        shutdown: stop,
        failure,
    };
    Ok((handle, task))
}

/// Stops the agent when the supervisor ends without having been asked to
/// (its health channel closes): an agent that heartbeats while it cannot
/// run a task would hide the robot's failure. The agent then exits
/// non-zero, systemd restarts it, and the journal settles the tasks.
async fn watch_supervisor(
    mut health: watch::Receiver<AgentHealth>,
    stop: CancellationToken,
    failure: Arc<OnceLock<String>>,
) {
    loop {
        tokio::select! {
            changed = health.changed() => if changed.is_err() { break },
            // A requested shutdown ends the supervisor too: expected.
            _ = stop.cancelled() => return,
        }
    }
    if stop.is_cancelled() {
        return;
    }
    let why = "the task supervisor stopped unexpectedly; the agent exits so that it is restarted".to_owned();
    tracing::error!("{why}");
    let _ = failure.set(why);
    stop.cancel();
}

#[cfg(test)]
mod tests {
    use super::*;

    #[tokio::test]
    async fn a_supervisor_that_ends_on_its_own_stops_the_agent_with_a_failure() {
        let (tx, rx) = watch::channel(AgentHealth::default());
        let shared = CancellationToken::new();
        let stop = shared.child_token();
        let failure = Arc::new(OnceLock::new());
        let watcher = tokio::spawn(watch_supervisor(rx, stop.clone(), Arc::clone(&failure)));
        tx.send(AgentHealth::default()).unwrap();
        drop(tx); // what a panic on the supervisor's thread does
        watcher.await.unwrap();
        assert!(stop.is_cancelled());
        assert!(
            !shared.is_cancelled(),
            "a shared token (k8s4r up's) is left alone"
        );
        assert!(failure.get().is_some_and(|w| w.contains("stopped unexpectedly")));
    }

    #[tokio::test]
    async fn a_requested_shutdown_is_no_failure() {
        let (tx, rx) = watch::channel(AgentHealth::default());
        let stop = CancellationToken::new();
        let failure = Arc::new(OnceLock::new());
        let watcher = tokio::spawn(watch_supervisor(rx, stop.clone(), Arc::clone(&failure)));
        stop.cancel();
        drop(tx);
        watcher.await.unwrap();
        assert!(failure.get().is_none());
    }
}
