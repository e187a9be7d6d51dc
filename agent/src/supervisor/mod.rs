//! The task supervisor: one tokio task, on a thread of its own, that owns
//! every running process.
//!
//! It starts tasks through a driver (each under a shim, so that it outlives
//! the agent), waits for them (child waits polled in a `FuturesUnordered`
//! it drives itself), enforces each
//! deadline with SIGTERM to the task's process group and SIGKILL after the
//! task's kill timeout (one `DelayQueue` for every timer), and reports
//! [`TaskEvent`]s on a channel. A running task costs a record in that one
//! task, not a tokio task, thread or polling loop.
//!
//! Nothing on its thread waits for the disk: task directories are made
//! and artifacts fetched on tokio's blocking pool, tasks write their output
//! to their log files themselves, and the journal, through which the events
//! pass, is written by a thread of its own. Its own
//! thread keeps the agent's other work (the MQTT session, the outbox's
//! fsyncs) from delaying a deadline too.
//!
//! The pieces, in the rumqttc split the agent follows: `table` (the task
//! records, their deadlines and transitions), [`outcome`] (how an attempt
//! ended, and whether it runs again), `policy` (who a task may run as),
//! `disk` (budget and reserve) and `containment` (a task's processes
//! without cgroups) are the pure state and decisions; `admission`,
//! `launching`, `checks`, `cleanup`, `disk_watch`, `journal` and
//! `health` the components that own a concern's state; `runner` the event
//! loop that owns processes (its module doc draws the
//! lifecycle); [`SupervisorHandle`] the cheap cloneable front. The runner
//! starts processes through `process::Launcher`, the seam its unit tests
//! fill with a fake driver; the journal has a seam of its own
//! (`journal::Journal`).

mod admission;
pub mod artifacts;
pub(crate) mod checks;
mod cleanup;
mod containment;
pub mod disk;
mod disk_watch;
#[cfg(test)]
mod fake;
mod health;
mod journal;
mod launching;
pub(crate) mod log_times;
pub(crate) mod logs;
pub mod outcome;
pub mod policy;
mod prestop;
pub(crate) mod process;
mod procfs;
mod reaper;
mod recovery;
mod restarts;
mod runner;
mod startup;
mod stats;
mod table;
mod task_config;

use std::ops::RangeInclusive;
use std::path::PathBuf;
use std::time::Duration;

use k8s4r_api::{AgentHealth, Quantity, TaskAttempt, TaskPolicy, TaskTemplate};
use tokio::sync::{mpsc, oneshot, watch};

pub use disk::DiskSize;
pub(crate) use logs::Stream as LogFile;
pub use outcome::TaskOutcome;
pub use policy::Policy;
pub use stats::{Histogram, SupervisorStats};

/// The directory of `attempt` of the Task `uid` under the agent's tasks
/// directory.
pub fn task_dir(tasks_dir: &std::path::Path, uid: &str, attempt: u32) -> PathBuf {
    tasks_dir.join(format!("{uid}-{attempt}"))
}

/// This boot's id (the kernel's `boot_id`).
pub(crate) fn boot_id() -> String {
    procfs::boot_id()
}

/// Where the agent keeps what only this boot needs and no disk should
/// stall: `$RUNTIME_DIRECTORY` (systemd's tmpfs for the unit, kept across
/// its restarts), else `state_dir/run`.
pub fn runtime_dir(state_dir: &std::path::Path) -> PathBuf {
    std::env::var_os("RUNTIME_DIRECTORY")
        .map(PathBuf::from)
        .filter(|d| d.is_absolute())
        .unwrap_or_else(|| state_dir.join("run"))
}

/// Where a task's shim writes how its command ended: under the runtime
/// directory, which only the agent's user may write (so the shim's write
/// never waits for a stalled disk).
pub(crate) fn exit_status_file(runtime_dir: &std::path::Path, uid: &str, attempt: u32) -> PathBuf {
    runtime_dir.join("tasks").join(exit_status_name(uid, attempt))
}

fn exit_status_name(uid: &str, attempt: u32) -> String {
    format!("{uid}-{attempt}.exit")
}

/// Removes the shims' records older than `age` but those of attempts in
/// `held` (file names). Blocking.
fn forget_old_exit_statuses(
    runtime_dir: &std::path::Path,
    held: &std::collections::HashSet<String>,
    age: Duration,
) {
    let Ok(entries) = std::fs::read_dir(runtime_dir.join("tasks")) else {
        return;
    };
    for entry in entries.flatten() {
        let name = entry.file_name().to_string_lossy().into_owned();
        let old = entry
            .metadata()
            .and_then(|m| m.modified())
            .is_ok_and(|at| at.elapsed().is_ok_and(|e| e > age));
        if old && !held.contains(&name) {
            let _ = std::fs::remove_file(entry.path());
        }
    }
}

/// Settings of the supervisor.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct SupervisorConfig {
    /// The robot's id, given to each task as `K8S4R_ROBOT_ID` (none when
    /// empty).
    pub robot_id: String,
    /// Task directories go under `state_dir/tasks/<uid>-<attempt>/`, the
    /// journal and the disk reserve under `state_dir/`.
    pub state_dir: PathBuf,
    /// Size of one log file before it is rotated.
    pub log_max_bytes: u64,
    /// Log files kept per stream (the current one included).
    pub log_max_files: u32,
    /// Bytes of output kept for the status message.
    pub output_tail_bytes: usize,
    /// How often a running task's output tail is sent as a status
    /// ([`TaskEvent::Output`]) when it changed; zero: never.
    pub output_tail_every: Duration,
    /// Largest artifact accepted.
    pub artifact_max_bytes: u64,
    /// Time limit of one download attempt.
    pub artifact_timeout: Duration,
    /// Retries of a failed download (network errors and 5xx only).
    pub artifact_retries: u32,
    /// A writable cgroup v2 subtree; None: the agent's own cgroup, if usable.
    pub cgroup_root: Option<PathBuf>,
    /// Who tasks may run as.
    pub policy: Policy,
    /// The uids exec tasks that name no user get, one each.
    pub task_uids: RangeInclusive<u32>,
    /// Most tasks held at once (fetching or running); more are refused.
    pub max_tasks: usize,
    /// `pids.max` of every task (RLIMIT_NPROC of exec tasks without a
    /// cgroup); None: no limit.
    pub task_pids_max: Option<u64>,
    /// Disk for all task directories together.
    pub disk_budget: DiskSize,
    /// Disk kept free for the agent's own records (outbox, journal); None:
    /// [`DEFAULT_DISK_RESERVE`], at most 5% of the file system.
    pub disk_reserve: Option<DiskSize>,
    /// Reap every zombie the agent inherits, not only those it can tell
    /// are its tasks'. Right for the agent's own process (which starts no
    /// other children); wrong where the supervisor shares its process
    /// with code that waits for children of its own.
    pub reap_all_orphans: bool,
    /// On shutdown, leave running tasks running for the next agent to
    /// re-adopt, instead of stopping them. Right for the agent's own
    /// process under systemd (a restart or an upgrade must not stop a
    /// mission; the unit's real stop stops them, `--stop-left-tasks`);
    /// wrong where the supervisor's process ends for good, as `k8s4r
    /// up`'s does.
    pub leave_tasks_running: bool,
    /// The task shim's program (the agent's own binary): tasks run under
    /// it, so that they outlive the agent with their exit status kept.
    /// None: tasks are the supervisor's own children (a supervisor in a
    /// process that is not the agent's binary, as in tests).
    pub shim_program: Option<PathBuf>,
    /// Task outputs: the spool's quota and what to do when it is full, the
    /// upload rate, the part size.
    pub outputs: crate::outputs::OutputsConfig,
    /// The podman driver's settings; None: the robot does not offer it.
    pub podman: Option<k8s4r_drivers::PodmanConfig>,
    /// Unused images kept beside those held tasks name, the most recently
    /// used first (podman).
    pub image_keep: usize,
    /// Disk all the images the agent brought may take together (podman);
    /// a share is of the file system podman keeps them on.
    pub image_budget: DiskSize,
}

/// Unused images kept when the robot's configuration says nothing.
pub const DEFAULT_IMAGE_KEEP: usize = 3;

/// The images' disk when the robot's configuration says nothing.
pub const DEFAULT_IMAGE_BUDGET: DiskSize = DiskSize::Percent(25);

/// The disk reserve when none is configured (capped at 5% of a small disk).
pub const DEFAULT_DISK_RESERVE: u64 = 32 << 20;

/// The task uids when none are configured: above the 16-bit range systemd
/// uses for users and `DynamicUser`, below the usual start of subordinate
/// uids (100000) of rootless containers.
pub const DEFAULT_TASK_UIDS: RangeInclusive<u32> = 70_000..=79_999;

impl SupervisorConfig {
    /// The limits of a download: a task's artifacts, or an agent upgrade.
    pub fn artifact_limits(&self) -> artifacts::Limits {
        artifacts::Limits {
            max_bytes: self.artifact_max_bytes,
            timeout: self.artifact_timeout,
            retries: self.artifact_retries,
        }
    }

    /// The task attempts' directories: `state_dir/tasks`.
    pub fn tasks_dir(&self) -> PathBuf {
        self.state_dir.join("tasks")
    }

    /// See [`runtime_dir`].
    pub fn runtime_dir(&self) -> PathBuf {
        runtime_dir(&self.state_dir)
    }

    /// The journal of the task attempts: `state_dir/journal.jsonl`.
    pub fn journal_file(&self) -> PathBuf {
        self.state_dir.join(journal::FILE_NAME)
    }

    /// The file that holds the disk reserve: `state_dir/reserve`.
    pub fn reserve_file(&self) -> PathBuf {
        self.state_dir.join("reserve")
    }

    /// The disk reserve's size as configured, for a person.
    pub fn reserve_described(&self) -> String {
        match self.disk_reserve {
            None => format!(
                "{}, at most 5% of the file system",
                DiskSize::Bytes(DEFAULT_DISK_RESERVE)
            ),
            Some(DiskSize::Percent(p)) => format!("{p}% of the file system"),
            Some(size) => size.to_string(),
        }
    }
}

impl Default for SupervisorConfig {
    fn default() -> Self {
        SupervisorConfig {
            robot_id: String::new(),
            state_dir: PathBuf::from("/var/lib/k8s4r"),
            log_max_bytes: 10 * 1024 * 1024,
            log_max_files: 10,
            output_tail_bytes: 4096,
            output_tail_every: Duration::from_secs(60),
            artifact_max_bytes: 1 << 30,
            artifact_timeout: Duration::from_secs(300),
            artifact_retries: 3,
            cgroup_root: None,
            policy: Policy {
                raw_exec: false,
                allow_root: false,
                allowed_users: Vec::new(),
                allowed_groups: Vec::new(),
                default_user: None,
            },
            task_uids: DEFAULT_TASK_UIDS,
            max_tasks: 64,
            task_pids_max: Some(k8s4r_drivers::DEFAULT_PIDS_MAX),
            disk_budget: DiskSize::Percent(50),
            disk_reserve: None,
            reap_all_orphans: false,
            leave_tasks_running: false,
            shim_program: None,
            outputs: crate::outputs::OutputsConfig::default(),
            podman: None,
            image_keep: DEFAULT_IMAGE_KEEP,
            image_budget: DEFAULT_IMAGE_BUDGET,
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
    /// The robot stops the attempt when it has had no contact with the
    /// cluster for this long (the dispatch's `stopAfter`: it is fenced). It
    /// may have been replaced after that, so it is never started again
    /// from the journal; the next agent re-adopts it if it still runs, and
    /// fences it from the last contact of this one.
    pub stop_after: Option<std::time::Duration>,
    /// What the spec takes from ConfigMaps and Secrets, as the dispatch
    /// carried it; `None` when it takes nothing, or for an attempt started
    /// again from the journal (its directory keeps it).
    pub config: Option<k8s4r_api::protocol::TaskConfig>,
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
        /// Set when the robot started it again (`restart`), not for the
        /// attempt's first start.
        restarted: Option<Restarted>,
        /// The configuration from ConfigMaps and Secrets it runs with, for
        /// a task that takes some (and knows it: not one re-adopted or
        /// started again from the journal before any change).
        config: Option<k8s4r_api::protocol::ConfigReport>,
    },
    /// A running attempt took a change of its configuration (its files
    /// rewritten, then what its `onConfigChange` says), or found nothing
    /// to change. A restart for it is reported by the `Started` that
    /// follows, which carries the change.
    Reconfigured {
        /// Task uid.
        uid: String,
        /// Attempt.
        attempt: u32,
        /// The configuration it runs with now, and what was done.
        config: k8s4r_api::protocol::ConfigReport,
    },
    /// A running attempt printed since its last report: its latest
    /// output, for the cluster to show while the robot cannot be asked.
    Output {
        /// Task uid.
        uid: String,
        /// Attempt.
        attempt: u32,
        /// When the attempt started.
        started: jiff::Timestamp,
        /// The last of its output (stdout and stderr), as the final status
        /// carries it.
        tail: String,
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

/// A restart on the robot, as the Task's status shows it.
#[derive(Clone, Debug, PartialEq)]
pub struct Restarted {
    /// Restarts of the attempt so far, this one included.
    pub count: u32,
    /// The exit code of the process this restart replaced.
    pub last_exit_code: Option<i32>,
    /// Why it was restarted, for a person ("exited with code 3", a failed
    /// health check, ...).
    pub cause: String,
    /// When it started again.
    pub at: jiff::Timestamp,
}

impl TaskEvent {
    /// The task uid the event is about.
    pub fn uid(&self) -> &str {
        match self {
            TaskEvent::Started { uid, .. }
            | TaskEvent::Output { uid, .. }
            | TaskEvent::Reconfigured { uid, .. }
            | TaskEvent::Finished { uid, .. } => uid,
        }
    }

    /// The attempt the event is about.
    pub fn attempt(&self) -> u32 {
        match self {
            TaskEvent::Started { attempt, .. }
            | TaskEvent::Output { attempt, .. }
            | TaskEvent::Reconfigured { attempt, .. }
            | TaskEvent::Finished { attempt, .. } => *attempt,
        }
    }
}

/// Failures of the supervisor itself (a bad task is never one of these).
#[derive(Debug, thiserror::Error)]
pub enum SupervisorError {
    /// The supervisor's thread could not be started.
    #[error("cannot start the supervisor's thread: {0}")]
    Thread(std::io::Error),
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
        cause: outcome::StopCause,
        done: oneshot::Sender<()>,
    },
    /// A running attempt's configuration changed.
    Reconfigure {
        uid: String,
        attempt: u32,
        config: Box<k8s4r_api::protocol::TaskConfig>,
    },
    Running(oneshot::Sender<Vec<TaskAttempt>>),
    /// How to run a command inside a running attempt (an exec session).
    Sandbox {
        /// None: on the robot itself.
        uid: Option<String>,
        attempt: Option<u32>,
        reply: oneshot::Sender<Result<checks::AsTask, String>>,
    },
    Stats(oneshot::Sender<SupervisorStats>),
    Shutdown(oneshot::Sender<()>),
    /// The robot's facts changed (or were read for the first time).
    Facts(k8s4r_api::Facts),
}

/// The cheap, cloneable front of the supervisor.
#[derive(Clone, Debug)]
pub struct SupervisorHandle {
    commands: mpsc::UnboundedSender<Command>,
    health: watch::Receiver<AgentHealth>,
    offer: Offer,
    /// The attempts of the previous run it holds from its start
    /// (re-adopted, or started again from the journal).
    held_at_start: Vec<TaskAttempt>,
    leases_at_start: Vec<(String, u32, Duration)>,
    /// Task outputs waiting for their upload.
    outputs: std::sync::Arc<crate::outputs::Spool>,
}

/// What the robot offers tasks, fixed at start.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Offer {
    /// The drivers tasks may name.
    pub drivers: Vec<String>,
    /// Who tasks may run as and how much they may take.
    pub policy: TaskPolicy,
}

impl SupervisorHandle {
    /// The supervisor's health, updated as it changes: whether it takes
    /// tasks (and why not), how many it holds, its disk use. The channel
    /// closes when the supervisor has ended (cleanly or not).
    pub fn health(&self) -> watch::Receiver<AgentHealth> {
        self.health.clone()
    }

    /// The attempts of the previous run it held as it started: the robot
    /// reports them from its first registration on.
    pub fn held_at_start(&self) -> &[TaskAttempt] {
        &self.held_at_start
    }

    /// Those of [`Self::held_at_start`] the robot fences, each with its
    /// `stopAfter`: the session fences them from the last contact of the
    /// previous agent.
    pub fn leases_at_start(&self) -> &[(String, u32, Duration)] {
        &self.leases_at_start
    }

    /// The drivers and task policy to report at registration.
    pub fn offer(&self) -> &Offer {
        &self.offer
    }

    /// The spool of task outputs, for the uploader.
    pub fn outputs(&self) -> &std::sync::Arc<crate::outputs::Spool> {
        &self.outputs
    }

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

    /// The robot's facts now: new tasks' `when` is checked against them,
    /// and running tasks whose `whileRunning: stop` condition no longer
    /// holds are stopped (reason ConditionLost).
    pub fn set_facts(&self, facts: k8s4r_api::Facts) {
        let _ = self.commands.send(Command::Facts(facts));
    }

    /// Cancels a task (every attempt of it when `attempt` is None): see
    /// [`Self::stop`]; it ends with reason Cancelled.
    pub async fn cancel(&self, uid: &str, attempt: Option<u32>, reason: String) {
        self.stop(uid, attempt, outcome::StopCause::Cancelled(reason))
            .await;
    }

    /// Stops a task (every attempt of it when `attempt` is None) for
    /// `cause`: its `preStop`, its stop signal, SIGKILL after its kill
    /// timeout, then `Finished` with the cause's reason. Returns once the
    /// stop has begun, not when the task is gone.
    pub async fn stop(&self, uid: &str, attempt: Option<u32>, cause: outcome::StopCause) {
        let (tx, rx) = oneshot::channel();
        let command = Command::Cancel {
            uid: uid.to_owned(),
            attempt,
            cause,
            done: tx,
        };
        if self.commands.send(command).is_ok() {
            let _ = rx.await;
        }
    }

    /// Gives a running attempt its changed configuration: its files are
    /// rewritten, then its `onConfigChange` acts; a [`TaskEvent`] says what
    /// was done (nothing for an attempt it does not hold, or a change older
    /// than the one it applied).
    pub fn reconfigure(&self, uid: &str, attempt: u32, config: k8s4r_api::protocol::TaskConfig) {
        let _ = self.commands.send(Command::Reconfigure {
            uid: uid.to_owned(),
            attempt,
            config: Box::new(config),
        });
    }

    /// The attempts that are running (or fetching their artifacts).
    /// How to run a command as running attempt `attempt` (any, if None)
    /// of task `uid` runs: its driver, user, directory, environment and
    /// cgroup. An error says why not (not here, not running, stopping).
    /// Without a task: raw_exec, not prepared (the caller says as whom).
    pub(crate) async fn sandbox(
        &self,
        uid: Option<&str>,
        attempt: Option<u32>,
    ) -> Result<checks::AsTask, String> {
        let (reply, rx) = oneshot::channel();
        let command = Command::Sandbox {
            uid: uid.map(str::to_owned),
            attempt,
            reply,
        };
        if self.commands.send(command).is_err() {
            return Err("the agent's supervisor has stopped".into());
        }
        rx.await
            .unwrap_or_else(|_| Err("the agent's supervisor has stopped".into()))
    }

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

/// Stops what is left of the tasks an agent that ended for good left
/// behind, except the services the next agent re-adopts (each with its
/// stop signal, then SIGKILL after its kill timeout; its `preStop` needs
/// the agent and is not run); returns how many it found. For the unit's
/// `ExecStopPost` when systemd stops the unit (not when it restarts it:
/// see [`crate::unit`]): with `KillMode=process` systemd leaves task
/// processes alone, and a batch task or a fenced service must not run on
/// unsupervised. Each is marked, and the journal left as it is: the next
/// agent reports them as `AgentShutdown`.
pub fn stop_left_tasks(state_dir: &std::path::Path) -> std::io::Result<usize> {
    let boot_id = procfs::boot_id();
    let left: Vec<journal::Unfinished> = journal::replay(state_dir)?
        .into_iter()
        .filter(|task| task.started.is_some() && !outlives_the_unit(task))
        .collect();
    // Marked once signalled: one that had ended by itself reports its end.
    let asked = left
        .iter()
        .filter_map(|task| {
            let asked = recovery::ask_to_stop(task, &boot_id)?;
            recovery::mark_stopped(task);
            Some(asked)
        })
        .collect();
    recovery::wait_for(asked);
    for task in &left {
        let message = recovery::kill_leftovers(task, &boot_id);
        tracing::info!(uid = %task.uid, attempt = task.attempt, %message, "task left by the agent stopped");
    }
    Ok(left.len())
}

/// A service with no `stopAfter`: it runs on while the agent's unit is
/// stopped (the next agent re-adopts it); delete its Job to stop it.
fn outlives_the_unit(task: &journal::Unfinished) -> bool {
    task.resume
        .as_ref()
        .is_some_and(|r| r.spec.kind == k8s4r_api::TaskKind::Service && r.stop_after_ms.is_none())
}

/// Starts the supervisor on a thread of its own (with its own
/// single-threaded runtime). It first reads the journal of a previous run,
/// kills what survived of its tasks and reports each of them as `Finished`
/// with reason AgentRestarted: those are the first events on the channel.
///
/// If the supervisor ever ends other than by [`SupervisorHandle::shutdown`]
/// (a bug, a panic), its health channel closes: the agent then exits, so
/// that systemd restarts it and the journal settles what was running.
pub fn spawn(
    config: SupervisorConfig,
) -> Result<(SupervisorHandle, mpsc::UnboundedReceiver<TaskEvent>), SupervisorError> {
    let (events_tx, events_rx) = mpsc::unbounded_channel();
    let (commands_tx, commands_rx) = mpsc::unbounded_channel();
    let (runner, health, offer) = runner::Runner::on_this_machine(config, events_tx)?;
    let held_at_start = runner.attempts();
    let leases_at_start = runner.leases();
    let outputs = runner.outputs.clone();
    // A bounded blocking pool: a burst of 500 tasks made as many threads,
    // which then took the CPU from the thread that fires deadlines.
    let runtime = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .max_blocking_threads(BLOCKING_THREADS)
        .thread_name("k8s4r-supervisor-work")
        .build()
        .map_err(SupervisorError::Thread)?;
    std::thread::Builder::new()
        .name("k8s4r-supervisor".to_owned())
        .spawn(move || {
            k8s4r_drivers::favour_current_thread();
            runtime.block_on(runner.run(commands_rx))
        })
        .map_err(SupervisorError::Thread)?;
    Ok((
        SupervisorHandle {
            commands: commands_tx,
            held_at_start,
            leases_at_start,
            health,
            offer,
            outputs,
        },
        events_rx,
    ))
}

/// Threads of the supervisor's blocking pool, at most.
const BLOCKING_THREADS: usize = 8;

/// The capacity part of the robot's task policy.
fn limits_report(max_tasks: usize, disk_budget: u64) -> (u32, Option<Quantity>) {
    (
        u32::try_from(max_tasks).unwrap_or(u32::MAX),
        Some(Quantity::from_bytes(disk_budget)),
    )
}
