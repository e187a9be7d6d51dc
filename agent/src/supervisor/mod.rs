//! The task supervisor: one tokio task that owns every running process.
//!
//! It starts tasks through a driver, waits for them (child waits and output
//! pipes polled in `FuturesUnordered`s it drives itself), enforces each
//! deadline with SIGTERM to the task's process group and SIGKILL after the
//! task's kill timeout (one `DelayQueue` for every timer), writes the state
//! journal and reports [`TaskEvent`]s on a channel. A running task costs a
//! record in that one task, not a tokio task, thread or polling loop.
//!
//! The pieces, in the rumqttc split the agent follows: [`outcome`] is the
//! pure state logic, `runner` the event loop that owns processes and pipes,
//! [`SupervisorHandle`] the cheap cloneable front.

mod artifacts;
mod journal;
mod logs;
pub mod outcome;
mod output;
mod procfs;
mod reaper;
mod recovery;
mod runner;
mod stats;

use std::path::PathBuf;
use std::time::Duration;

use k8s4r_api::{TaskAttempt, TaskReason, TaskState, TaskTemplate};
use tokio::sync::{mpsc, oneshot};

pub use outcome::TaskOutcome;
pub use stats::{Histogram, SupervisorStats};

/// Settings of the supervisor.
#[derive(Clone, Debug)]
pub struct SupervisorConfig {
    /// Task directories go under `state_dir/tasks/<uid>-<attempt>/`, the
    /// journal under `state_dir/`.
    pub state_dir: PathBuf,
    /// Size of one log file before it is rotated.
    pub log_max_bytes: u64,
    /// Log files kept per stream (the current one included).
    pub log_max_files: u32,
    /// Bytes of output kept for the status message.
    pub output_tail_bytes: usize,
    /// Largest artifact accepted.
    pub artifact_max_bytes: u64,
    /// Time limit of one download attempt.
    pub artifact_timeout: Duration,
    /// Retries of a failed download (network errors and 5xx only).
    pub artifact_retries: u32,
    /// The user of exec tasks that name none, when the agent is root.
    pub exec_default_user: String,
    /// A writable cgroup v2 subtree; None: the agent's own cgroup, if usable.
    pub cgroup_root: Option<PathBuf>,
}

impl Default for SupervisorConfig {
    fn default() -> Self {
        SupervisorConfig {
            state_dir: PathBuf::from("/var/lib/k8s4r"),
            log_max_bytes: 10 * 1024 * 1024,
            log_max_files: 10,
            output_tail_bytes: 4096,
            artifact_max_bytes: 1 << 30,
            artifact_timeout: Duration::from_secs(300),
            artifact_retries: 3,
            exec_default_user: "nobody".to_owned(),
            cgroup_root: None,
        }
    }
}

/// One attempt of one task to run.
#[derive(Clone, Debug)]
pub struct TaskRequest {
    /// The Task's metadata.uid.
    pub uid: String,
    /// The attempt number.
    pub attempt: u32,
    /// The Task's name (for logs and the task's environment).
    pub name: String,
    /// What to run.
    pub spec: TaskTemplate,
}

/// The answer to a submission.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Submit {
    /// New: the task's events will follow.
    Accepted,
    /// This (uid, attempt) is already known (running or finished); ignored.
    Duplicate,
}

/// What the supervisor reports.
#[derive(Clone, Debug, PartialEq)]
pub enum TaskEvent {
    /// The process is running.
    Started {
        /// Task uid.
        uid: String,
        /// Attempt.
        attempt: u32,
        /// The process (and process group) id.
        pid: u32,
        /// When it started.
        at: jiff::Timestamp,
    },
    /// The attempt is over (or never started).
    Finished {
        /// Task uid.
        uid: String,
        /// Attempt.
        attempt: u32,
        /// How it ended.
        outcome: TaskOutcome,
    },
}

impl TaskEvent {
    /// The task uid the event is about.
    pub fn uid(&self) -> &str {
        match self {
            TaskEvent::Started { uid, .. } | TaskEvent::Finished { uid, .. } => uid,
        }
    }

    /// The attempt the event is about.
    pub fn attempt(&self) -> u32 {
        match self {
            TaskEvent::Started { attempt, .. } | TaskEvent::Finished { attempt, .. } => *attempt,
        }
    }
}

/// Failures of the supervisor itself (a bad task is never one of these).
#[derive(Debug, thiserror::Error)]
pub enum SupervisorError {
    /// The state directory could not be created or used.
    #[error("state directory {}: {source}", path.display())]
    StateDir {
        /// The path.
        path: PathBuf,
        /// The error.
        source: std::io::Error,
    },
    /// The journal could not be opened or rewritten.
    #[error("journal {}: {source}", path.display())]
    Journal {
        /// The path.
        path: PathBuf,
        /// The error.
        source: std::io::Error,
    },
    /// The log writer thread could not be started.
    #[error("cannot start the log writer: {0}")]
    LogWriter(std::io::Error),
    /// `spawn` was called outside a tokio runtime.
    #[error("the supervisor must be spawned inside a tokio runtime")]
    NoRuntime,
    /// The supervisor is shutting down and takes no new tasks.
    #[error("the supervisor is shutting down")]
    ShuttingDown,
    /// The supervisor has stopped.
    #[error("the supervisor has stopped")]
    Stopped,
}

pub(crate) enum Command {
    Submit(Box<TaskRequest>, oneshot::Sender<Result<Submit, SupervisorError>>),
    Cancel {
        uid: String,
        attempt: Option<u32>,
        reason: String,
        done: oneshot::Sender<()>,
    },
    Running(oneshot::Sender<Vec<TaskAttempt>>),
    Stats(oneshot::Sender<SupervisorStats>),
    Shutdown(oneshot::Sender<()>),
}

/// The cheap, cloneable front of the supervisor.
#[derive(Clone, Debug)]
pub struct SupervisorHandle {
    commands: mpsc::UnboundedSender<Command>,
}

impl SupervisorHandle {
    /// Hands a task over. A bad spec, driver, user, cwd or command is still
    /// `Accepted`, then reported as a `Finished` event (InvalidSpec or
    /// StartFailed); only a supervisor that is shutting down or gone errs.
    pub async fn submit(&self, req: TaskRequest) -> Result<Submit, SupervisorError> {
        let (tx, rx) = oneshot::channel();
        self.commands
            .send(Command::Submit(Box::new(req), tx))
            .map_err(|_| SupervisorError::Stopped)?;
        rx.await.map_err(|_| SupervisorError::Stopped)?
    }

    /// Stops a task (every attempt of it when `attempt` is None): SIGTERM,
    /// SIGKILL after its kill timeout, then `Finished` with reason
    /// Cancelled. Returns once the signal is sent, not when the task is gone.
    pub async fn cancel(&self, uid: &str, attempt: Option<u32>, reason: String) {
        let (tx, rx) = oneshot::channel();
        let command = Command::Cancel {
            uid: uid.to_owned(),
            attempt,
            reason,
            done: tx,
        };
        if self.commands.send(command).is_ok() {
            let _ = rx.await;
        }
    }

    /// The attempts that are running (or fetching their artifacts).
    pub async fn running(&self) -> Vec<TaskAttempt> {
        let (tx, rx) = oneshot::channel();
        if self.commands.send(Command::Running(tx)).is_err() {
            return Vec::new();
        }
        rx.await.unwrap_or_default()
    }

    /// How late SIGTERM and SIGKILL have left after their deadlines so far.
    pub async fn stats(&self) -> SupervisorStats {
        let (tx, rx) = oneshot::channel();
        if self.commands.send(Command::Stats(tx)).is_err() {
            return SupervisorStats::default();
        }
        rx.await.unwrap_or_default()
    }

    /// Stops accepting tasks, terminates every task through its escalation,
    /// waits for them (their `Finished` events, reason Cancelled, are still
    /// sent) and flushes the journal.
    pub async fn shutdown(&self) {
        let (tx, rx) = oneshot::channel();
        if self.commands.send(Command::Shutdown(tx)).is_ok() {
            let _ = rx.await;
        }
    }
}

/// Starts the supervisor. It first reads the journal of a previous run,
/// kills the process groups that survived it and reports each of those
/// tasks as `Finished` with reason AgentRestarted: those are the first
/// events on the channel. Must be called inside a tokio runtime.
pub fn spawn(
    config: SupervisorConfig,
) -> Result<(SupervisorHandle, mpsc::UnboundedReceiver<TaskEvent>), SupervisorError> {
    let runtime = tokio::runtime::Handle::try_current().map_err(|_| SupervisorError::NoRuntime)?;
    let (events_tx, events_rx) = mpsc::unbounded_channel();
    let (commands_tx, commands_rx) = mpsc::unbounded_channel();
    let runner = runner::Runner::new(config, events_tx)?;
    runtime.spawn(runner.run(commands_rx));
    Ok((
        SupervisorHandle {
            commands: commands_tx,
        },
        events_rx,
    ))
}

/// A task that ended before it could run: bad spec, start failure, ...
pub(crate) fn failed_outcome(reason: TaskReason, message: String, tail: String) -> TaskOutcome {
    TaskOutcome {
        state: TaskState::Failed,
        exit_code: None,
        signal: None,
        reason,
        message,
        started_at: None,
        finished_at: jiff::Timestamp::now(),
        output_tail: tail,
    }
}
