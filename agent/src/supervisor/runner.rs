//! The supervisor's event loop: the one task that owns every process.
//!
//! It runs on a thread of its own and never waits for the disk there:
//! task directories, users and artifacts are prepared on tokio's blocking
//! pool, logs and the journal have threads of their own, the disk is
//! measured on the blocking pool. Everything a task can get wrong fails
//! that task (a `Finished` event with the reason), never the loop.

use std::collections::{HashSet, VecDeque};
use std::io;
use std::os::unix::fs::PermissionsExt;
use std::path::{Path, PathBuf};
use std::process::ExitStatus;
use std::sync::Arc;
use std::time::Duration;

use futures::future::{AbortHandle, Abortable, Aborted};
use futures::stream::FuturesUnordered;
use futures::StreamExt;
use k8s4r_api::task::DRIVER_RAW_EXEC;
use k8s4r_api::validation::validate_task_template;
use k8s4r_api::{names, AgentHealth, TaskKind, TaskPolicy, TaskReason, TaskState, TaskTemplate};
use k8s4r_drivers::identity::{self, RunAs};
use k8s4r_drivers::{Cgroups, DriverError, ExecDriver, Launch, Prepared, RawExecDriver, TaskCgroup};
use nix::sys::signal::Signal;
use nix::unistd::Pid;
use tokio::signal::unix::{signal, SignalKind};
use tokio::sync::{mpsc, oneshot, watch};
use tokio::time::Instant;

use super::containment::Lineage;
use super::disk::{self, Measurement, Reserve, TaskUse};
use super::journal::{self, JournalHandle, Record};
use super::logs::{self, LogWriter, Stream};
use super::outcome::{verdict, Exit, StopCause};
use super::output::{self, PipeFd, PipeRead};
use super::policy::{passwd_uids, Plan, TaskUids};
use super::process::{self, BoxFuture, Launcher, Process};
use super::stats::SupervisorStats;
use super::table::{Deadline, NewTask, Phase, Running, Stop, Table, Task};

/// An attempt of the previous run started again from the journal.
#[derive(Clone, Copy, Debug)]
struct Resumed {
    /// Its restarts on the robot so far.
    restarts: u32,
    /// The uid it ran as, if it had one of its own.
    uid: Option<u32>,
}
use super::{
    artifacts, checks, failed_outcome, procfs, ready_health, reaper, recovery, Command, Offer, Restarted,
    Submit, SupervisorConfig, SupervisorError, TaskEvent, TaskOutcome, TaskRequest,
};

/// Most output read from a pipe when its task's process has exited.
const DRAIN_MAX: usize = 1 << 20;
/// Directories of finished tasks kept (logs, artifacts); older ones go
/// (sooner when the disk budget needs the room).
const KEEP_FINISHED_DIRS: usize = 100;
/// How often the removal of leftover cgroups is retried.
const CLEANUP_EVERY: Duration = Duration::from_secs(1);
/// Between two looks for the processes of a task without a cgroup.
const SWEEP_EVERY: Duration = Duration::from_millis(50);
/// Looks after which a task's processes that will not die are given up
/// on (and its task uid never handed out again).
const SWEEP_ROUNDS: u32 = 200;
/// How often the disk is measured while tasks run (or it is full)...
const MEASURE_BUSY: Duration = Duration::from_secs(2);
/// ...and while the robot is idle.
const MEASURE_IDLE: Duration = Duration::from_secs(30);
/// Lineages of finished tasks remembered to reap their zombies.
const REMEMBERED_LINEAGES: usize = 256;

/// Why a task could not be prepared.
struct Failure {
    reason: TaskReason,
    message: String,
}

impl Failure {
    fn new(reason: TaskReason, message: impl Into<String>) -> Self {
        Failure {
            reason,
            message: message.into(),
        }
    }
}

impl From<DriverError> for Failure {
    fn from(e: DriverError) -> Self {
        Failure::new(driver_reason(&e), e.to_string())
    }
}

/// A task's preparation: its id and the prepared task (or Aborted).
type Prep = BoxFuture<(u64, Result<Result<Prepared, Failure>, Aborted>)>;

/// Work done on the blocking pool for the loop.
enum Housework {
    Measured(Measurement),
    /// A health check's probe came back (`pid`: an exec check's process,
    /// now reaped).
    Checked {
        id: u64,
        index: usize,
        pid: Option<i32>,
        probe: checks::Probe,
    },
    Done,
}

/// The disk rules' state.
struct DiskState {
    budget: u64,
    reserve: Reserve,
    /// The last measurement said the disk is full.
    full: bool,
    /// Free bytes at the last measurement.
    free: u64,
    /// Bytes all task directories took at the last measurement.
    used: u64,
    measuring: bool,
    /// When the next measurement is due.
    next: Option<Instant>,
}

/// What is left of a finished task without a cgroup: processes that
/// escaped its group, killed until none is left.
struct Lingering {
    lineage: Lineage,
    own_uid: Option<u32>,
    rounds: u32,
}

/// Tasks whose processes are looked for at the next sweep.
#[derive(Default)]
struct Sweeps {
    term: HashSet<u64>,
    kill: HashSet<u64>,
    lingering: Vec<Lingering>,
    scheduled: bool,
}

/// What the health last said, to send only changes.
type HealthKey = (bool, &'static str, usize, u64, u64);

pub(crate) struct Runner {
    config: SupervisorConfig,
    launchers: Vec<Arc<dyn Launcher>>,
    agent_is_root: bool,
    agent_pid: i32,
    uids: TaskUids,
    /// Where the uid rotation's position is kept across restarts.
    uid_file: PathBuf,
    cgroups: Option<Cgroups>,
    journal: JournalHandle,
    logs: LogWriter,
    boot_id: String,
    tasks_dir: PathBuf,
    table: Table,
    /// Pids tokio waits for: never reaped by the orphan reaper.
    owned_pids: HashSet<i32>,
    /// Cgroups of finished tasks that still had processes in them, with
    /// the task uid to give back once they are empty.
    cgroups_to_remove: Vec<(TaskCgroup, Option<u32>)>,
    /// Directories of finished tasks, oldest first.
    finished_dirs: VecDeque<((String, u32), PathBuf)>,
    cleanup_scheduled: bool,
    waits: FuturesUnordered<BoxFuture<(u64, io::Result<ExitStatus>)>>,
    pipes: FuturesUnordered<PipeRead>,
    preparing: FuturesUnordered<Prep>,
    housework: FuturesUnordered<BoxFuture<Housework>>,
    http: Option<reqwest::Client>,
    /// For HTTP health checks (follows no redirect).
    check_http: Option<reqwest::Client>,
    disk: DiskState,
    sweeps: Sweeps,
    /// Lineages of finished tasks, for reaping their zombies.
    recent_lineages: VecDeque<Lineage>,
    health: watch::Sender<AgentHealth>,
    health_key: Option<HealthKey>,
    dropped_output: u64,
    stats: SupervisorStats,
    shutting_down: bool,
    shutdown_waiters: Vec<oneshot::Sender<()>>,
}

impl Runner {
    /// The supervisor of this machine's processes: the exec driver (and
    /// raw_exec when the configuration offers it), task cgroups where the
    /// agent has a writable cgroup v2 subtree, and the agent as the
    /// subreaper of what its tasks leave.
    pub(crate) fn on_this_machine(
        config: SupervisorConfig,
        events: mpsc::UnboundedSender<TaskEvent>,
    ) -> Result<(Self, watch::Receiver<AgentHealth>, Offer), SupervisorError> {
        raise_fd_limit();
        reaper::become_subreaper();
        let cgroups = match Cgroups::detect(config.cgroup_root.as_deref()) {
            Ok(cgroups) => {
                tracing::info!(root = %cgroups.root().display(), controllers = ?cgroups.controllers(), "task cgroups enabled");
                Some(cgroups)
            }
            Err(why) => {
                tracing::info!(%why, "no task cgroups: a task's processes are found through /proc to be killed");
                None
            }
        };
        let mut launchers: Vec<Arc<dyn Launcher>> =
            vec![Arc::new(ExecDriver::new().with_pids_max(config.task_pids_max))];
        if config.policy.raw_exec {
            launchers.push(Arc::new(RawExecDriver::with_pids_max(config.task_pids_max)));
        }
        Runner::new(config, events, launchers, cgroups)
    }

    /// Prepares the state dir, settles the previous run (its events go out
    /// first) and everything the loop needs.
    pub(crate) fn new(
        config: SupervisorConfig,
        events: mpsc::UnboundedSender<TaskEvent>,
        launchers: Vec<Arc<dyn Launcher>>,
        cgroups: Option<Cgroups>,
    ) -> Result<(Self, watch::Receiver<AgentHealth>, Offer), SupervisorError> {
        let tasks_dir = config.state_dir.join("tasks");
        let state_error = |path: &Path| {
            let path = path.to_path_buf();
            move |source| SupervisorError::StateDir { path, source }
        };
        std::fs::create_dir_all(&tasks_dir).map_err(state_error(&tasks_dir))?;
        allow_traversal(&config.state_dir).map_err(state_error(&config.state_dir))?;
        // exec tasks run as other users and must be able to walk down to
        // their own directory; the listing stays private.
        std::fs::set_permissions(&tasks_dir, std::fs::Permissions::from_mode(0o711))
            .map_err(state_error(&tasks_dir))?;
        warn_if_unreachable(&tasks_dir);

        let journal_path = config.state_dir.join(journal::FILE_NAME);
        let journal_error = |source| SupervisorError::Journal {
            path: journal_path.clone(),
            source,
        };
        let unfinished = journal::replay(&config.state_dir).map_err(journal_error)?;
        let boot_id = procfs::boot_id();
        let mut table = Table::new();
        let mut cgroups_to_remove = Vec::new();
        let mut settled = Vec::new();
        let mut resumed = Vec::new();
        let mut adopted = Vec::new();
        // What is taken over: the journal starts over holding it, so that a
        // crash before their new records are written loses none of them.
        let mut kept: Vec<journal::Unfinished> = Vec::new();
        for task in &unfinished {
            // A service the last agent left running is re-adopted as it runs.
            if let (Some(resume), Some(started)) = (&task.resume, &task.started) {
                let alive = started.boot_id == boot_id
                    && procfs::stat(started.pid)
                        .is_some_and(|s| s.start_time == started.pid_start && s.is_live());
                if alive && resume.spec.kind == k8s4r_api::TaskKind::Service {
                    tracing::info!(uid = %task.uid, attempt = task.attempt, pid = started.pid, "re-adopting a service of the previous run");
                    adopted.push((task.clone(), (**resume).clone(), started.clone()));
                    kept.push(task.clone());
                    continue;
                }
            }
            if let Some(path) = task.started.as_ref().and_then(|s| s.cgroup.clone()) {
                cgroups_to_remove.push((TaskCgroup::at(path), None));
            }
            // Killed members re-parented to us (a subreaper) get reaped.
            if let Some(started) = &task.started {
                table.remember_group(started.pgid);
            }
            // What restarts on the robot starts again, cluster or not.
            if let Some(resume) = &task.resume {
                let message = recovery::kill_leftovers(task, &boot_id);
                tracing::warn!(uid = %task.uid, attempt = task.attempt, %message, "task of the previous run started again");
                let request = TaskRequest {
                    uid: task.uid.clone(),
                    attempt: task.attempt,
                    name: resume.name.clone(),
                    spec: resume.spec.clone(),
                    fenced: false,
                };
                let how = Resumed {
                    restarts: task.started.as_ref().map_or(0, |s| s.restarts),
                    uid: task.started.as_ref().and_then(|s| s.task_uid),
                };
                resumed.push((request, how));
                kept.push(task.clone());
                continue;
            }
            let outcome = recovery::settle(task, &boot_id, config.output_tail_bytes);
            tracing::warn!(uid = %task.uid, attempt = task.attempt, message = %outcome.message, "task of the previous run settled");
            table.remember_finished(task.uid.clone(), task.attempt);
            settled.push(TaskEvent::Finished {
                uid: task.uid.clone(),
                attempt: task.attempt,
                outcome,
            });
        }
        #[cfg(not(test))]
        let journal = JournalHandle::start(&config.state_dir, events, &kept).map_err(journal_error)?;
        #[cfg(test)]
        let journal = JournalHandle::inline(&config.state_dir, events, &kept).map_err(journal_error)?;
        for event in settled {
            journal.event(event);
        }

        let (total, _, _) = disk::space(&config.state_dir).map_err(state_error(&config.state_dir))?;
        let budget = config.disk_budget.of(total);
        let reserve = Reserve {
            path: config.state_dir.join("reserve"),
            bytes: match config.disk_reserve {
                Some(size) => size.of(total),
                None => super::DEFAULT_DISK_RESERVE.min(total / 20),
            },
        };
        let mut barred = passwd_uids(&config.task_uids);
        barred.extend(uids_running(&config.task_uids));
        // A re-adopted service's own uid is running: its, not barred.
        for (_, _, started) in &adopted {
            if let Some(uid) = started.task_uid {
                barred.remove(&uid);
            }
        }
        let uid_file = config.state_dir.join(UID_POSITION_FILE);
        let kept = std::fs::read_to_string(&uid_file)
            .ok()
            .and_then(|t| t.trim().parse::<u32>().ok());
        let uids = TaskUids::new(config.task_uids.clone(), barred).starting_at(kept);
        let (max_tasks, disk_budget) = super::limits_report(config.max_tasks, budget);
        // raw_exec is offered only when it can run something: it is on, and
        // the agent is not root or root is allowed.
        let agent_is_root = nix::unistd::geteuid().is_root();
        let raw_exec = config.policy.raw_exec && (!agent_is_root || config.policy.allow_root);
        let offer = Offer {
            drivers: launchers
                .iter()
                .map(|l| l.name().to_owned())
                .filter(|name| name != DRIVER_RAW_EXEC || raw_exec)
                .collect(),
            policy: TaskPolicy {
                max_tasks,
                disk_budget,
                ..config.policy.report()
            },
        };
        let (health, health_rx) = watch::channel(ready_health(0, 0, 0));
        let logs = LogWriter::start(config.log_max_bytes, config.log_max_files)
            .map_err(SupervisorError::LogWriter)?;
        let finished_dirs = existing_task_dirs(&tasks_dir);
        let mut runner = Runner {
            agent_is_root,
            agent_pid: std::process::id() as i32,
            config,
            launchers,
            uids,
            uid_file,
            cgroups,
            journal,
            logs,
            boot_id,
            tasks_dir,
            table,
            owned_pids: HashSet::new(),
            cgroups_to_remove,
            finished_dirs,
            cleanup_scheduled: false,
            waits: FuturesUnordered::new(),
            pipes: FuturesUnordered::new(),
            preparing: FuturesUnordered::new(),
            housework: FuturesUnordered::new(),
            http: None,
            check_http: None,
            disk: DiskState {
                budget,
                reserve,
                full: false,
                free: 0,
                used: 0,
                measuring: false,
                next: None,
            },
            sweeps: Sweeps::default(),
            recent_lineages: VecDeque::new(),
            health,
            health_key: None,
            dropped_output: 0,
            stats: SupervisorStats::default(),
            shutting_down: false,
            shutdown_waiters: Vec::new(),
        };
        // Leftover cgroups of the previous run go once their processes do.
        runner.remove_cgroups();
        // Adopted first: their uids are theirs before anything takes one.
        for (task, resume, started) in adopted {
            runner.adopt(task, resume, started);
        }
        for (request, how) in resumed {
            runner.begin(request, Some(how));
        }
        // Their directories are in use, not finished ones to clean up.
        let table = &runner.table;
        runner.finished_dirs.retain(|(key, _)| !table.holds(key));
        // The first measurement takes the disk reserve.
        runner.schedule_measure(Duration::ZERO);
        Ok((runner, health_rx, offer))
    }

    pub(crate) async fn run(mut self, mut commands: mpsc::UnboundedReceiver<Command>) {
        let mut sigchld = match signal(SignalKind::child()) {
            Ok(s) => Some(s),
            Err(e) => {
                tracing::warn!(error = %e, "cannot watch SIGCHLD; orphaned task processes are reaped late");
                None
            }
        };
        let mut commands_open = true;
        loop {
            if self.shutting_down && self.table.is_empty() && self.sweeps.lingering.is_empty() {
                break;
            }
            if !self.journal.is_alive() || !self.logs.is_alive() {
                // A bug killed a helper thread: without the journal no event
                // leaves. End, so that the agent exits and is restarted, and
                // the journal settles what runs.
                tracing::error!(
                    journal = self.journal.is_alive(),
                    logs = self.logs.is_alive(),
                    "a thread of the supervisor died; the supervisor stops"
                );
                return;
            }
            self.update_health();
            // Biased: timers first so that a flood of output or commands
            // never delays a deadline.
            tokio::select! {
                biased;
                Some((deadline, at)) = self.table.next_deadline(), if self.table.has_deadlines() => {
                    self.on_deadline(deadline, at);
                }
                Some((id, status)) = self.waits.next(), if !self.waits.is_empty() => {
                    self.on_exit(id, status);
                }
                command = commands.recv(), if commands_open => match command {
                    Some(command) => self.on_command(command),
                    None => {
                        // Every handle is gone: nobody can stop these tasks
                        // any more, so stop them now.
                        commands_open = false;
                        self.begin_shutdown();
                    }
                },
                Some((id, result)) = self.preparing.next(), if !self.preparing.is_empty() => {
                    if let Ok(result) = result {
                        self.on_prepared(id, result);
                    }
                }
                Some((id, stream, fd, result)) = self.pipes.next(), if !self.pipes.is_empty() => {
                    self.on_output(id, stream, fd, result);
                }
                Some(work) = self.housework.next(), if !self.housework.is_empty() => match work {
                    Housework::Measured(m) => self.on_measured(m),
                    Housework::Checked { id, index, pid, probe } => self.on_checked(id, index, pid, probe),
                    Housework::Done => {}
                },
                Some(()) = recv_signal(&mut sigchld) => {
                    self.reap_orphans();
                }
            }
        }
        self.reap_orphans();
        // Cgroups whose last processes were still dying: give them a
        // moment so a clean shutdown leaves none behind.
        let give_up = Instant::now() + Duration::from_secs(2);
        while !self.cgroups_to_remove.is_empty() && Instant::now() < give_up {
            tokio::time::sleep(Duration::from_millis(20)).await;
            self.reap_orphans();
        }
        // Directories still being closed or removed: finish that first.
        let _ = tokio::time::timeout(Duration::from_secs(5), async {
            while self.housework.next().await.is_some() {}
        })
        .await;
        let _ = self.logs.flush().await;
        let flushed = self.journal.flush();
        let _ = tokio::task::spawn_blocking(move || flushed.recv_timeout(Duration::from_secs(5))).await;
        let _ = self.health.send(AgentHealth {
            accepting_tasks: false,
            reason: Some(AgentHealth::REASON_SHUTTING_DOWN.to_owned()),
            message: Some("the agent has stopped its tasks".to_owned()),
            ..AgentHealth::default()
        });
        for waiter in self.shutdown_waiters.drain(..) {
            let _ = waiter.send(());
        }
        // Commands still queued get their senders dropped: `Stopped`.
    }

    fn on_command(&mut self, command: Command) {
        match command {
            Command::Submit(req, reply) => {
                let req = *req;
                if self.shutting_down {
                    let _ = reply.send(Err(SupervisorError::ShuttingDown));
                    return;
                }
                let key = (req.uid.clone(), req.attempt);
                if self.table.is_known(&key) {
                    let _ = reply.send(Ok(Submit::Duplicate));
                    return;
                }
                let _ = reply.send(Ok(Submit::Accepted));
                self.begin(req, None);
            }
            Command::Cancel {
                uid,
                attempt,
                reason,
                done,
            } => {
                for id in self.table.ids_of(&uid, attempt) {
                    self.stop(id, StopCause::Cancelled(reason.clone()));
                }
                let _ = done.send(());
            }
            Command::Running(reply) => {
                let _ = reply.send(self.table.attempts());
            }
            Command::Stats(reply) => {
                let _ = reply.send(self.stats.clone());
            }
            Command::Shutdown(done) => {
                self.shutdown_waiters.push(done);
                self.begin_shutdown();
            }
        }
    }

    fn begin_shutdown(&mut self) {
        if self.shutting_down {
            return;
        }
        self.shutting_down = true;
        let ids = self.table.ids();
        tracing::info!(tasks = ids.len(), "supervisor shutting down");
        for id in ids {
            // A fenced one is stopped: nothing would fence it while no
            // agent runs.
            let service = self.config.leave_services_running
                && self
                    .table
                    .get(id)
                    .is_some_and(|t| t.template.kind == TaskKind::Service && t.resumable && t.stop.is_none());
            if service {
                self.leave_running(id);
            } else {
                self.stop(id, StopCause::Shutdown);
            }
        }
    }

    /// Lets go of a service as the agent stops: it keeps running (or is
    /// started again, if it was between runs) and the journal keeps it
    /// unfinished, so that the next agent re-adopts it.
    fn leave_running(&mut self, id: u64) {
        let Some(task) = self.table.remove(id) else {
            return;
        };
        match &task.phase {
            Phase::Running(running) => {
                tracing::info!(uid = %task.uid, attempt = task.attempt, pid = running.pid, "service left running for the next agent");
            }
            Phase::Preparing { abort } => abort.abort(),
            Phase::Waiting => {}
        }
    }

    /// Checks a new task against the spec's rules, the robot's capacity
    /// and its policy, gives it a uid and a directory, then prepares it off
    /// this thread; its id, or None when it was refused (every refusal
    /// becomes a Finished event). `resumed`: it is an attempt of the
    /// previous run, from the journal.
    fn begin(&mut self, req: TaskRequest, resumed: Option<Resumed>) -> Option<u64> {
        let TaskRequest {
            uid,
            attempt,
            name,
            spec,
            fenced,
        } = req;
        let (driver, run_as, own_uid, client) = match self.admit(&uid, &spec, resumed) {
            Ok(admitted) => admitted,
            Err((reason, message)) => {
                self.finish_early(uid, attempt, reason, message);
                return None;
            }
        };
        let dir = super::task_dir(&self.tasks_dir, &uid, attempt);
        let mut input = self.prep_input(
            dir.clone(),
            driver,
            spec.clone(),
            run_as,
            client,
            resumed.is_some(),
        );
        if resumed.is_none() && own_uid.is_some() {
            input.new_uid_position = Some((self.uid_file.clone(), self.uids.position()));
        }
        let (abort, registration) = AbortHandle::new_pair();
        let new = NewTask {
            uid,
            attempt,
            name,
            dir,
            template: spec,
            driver,
            own_uid,
        };
        let mut task = Task::preparing(new, abort, self.config.output_tail_bytes);
        // Started again from the journal after a reboot or an agent restart:
        // what has restarts on the robot and cannot have been replaced.
        task.resumable = !fenced && task.restarts.is_some();
        if let (Some(resumed), Some(budget)) = (resumed, task.restarts.as_mut()) {
            budget.count = resumed.restarts;
            task.resumed = true;
        }
        let record = Record::Accepted {
            uid: task.uid.clone(),
            attempt,
            task_dir: task.dir.clone(),
            resume: task.resumable.then(|| {
                Box::new(journal::Resume {
                    name: task.name.clone(),
                    spec: task.template.clone(),
                })
            }),
        };
        let id = self.table.insert(task);
        self.journal.write(Some(record), Vec::new());
        let prep = Abortable::new(prepare(input), registration);
        self.preparing.push(Box::pin(async move { (id, prep.await) }));
        self.schedule_measure(MEASURE_BUSY);
        Some(id)
    }

    /// Whether the robot takes `spec` now: its driver, who it runs as (a
    /// resumed task gets its own uid back if it can: its files are owned
    /// by it), and the client for its artifacts; or why not.
    #[allow(clippy::type_complexity)]
    fn admit(
        &mut self,
        uid: &str,
        spec: &TaskTemplate,
        resumed: Option<Resumed>,
    ) -> Result<(usize, RunAs, Option<u32>, Option<reqwest::Client>), (TaskReason, String)> {
        if let Err(e) = validate_task_template(spec) {
            return Err((TaskReason::InvalidSpec, format!("invalid spec: {e}")));
        }
        if !is_path_component(uid) {
            return Err((
                TaskReason::InvalidSpec,
                "task uid cannot name a directory".to_owned(),
            ));
        }
        if let Some(message) = self.over_capacity(spec) {
            return Err((TaskReason::OverCapacity, message));
        }
        let plan = self
            .config
            .policy
            .decide(spec, self.agent_is_root)
            .map_err(|refusal| (refusal.reason, refusal.message))?;
        let Some(driver) = self.launchers.iter().position(|d| d.name() == spec.driver) else {
            let message = format!("driver {:?} is not available on this robot", spec.driver);
            return Err((TaskReason::InvalidSpec, message));
        };
        let (run_as, own_uid) = match plan {
            Plan::Run(run_as) => (run_as, None),
            Plan::OwnUid => match resumed
                .and_then(|r| r.uid)
                .filter(|u| self.uids.take_exact(*u))
                .or_else(|| self.uids.take())
            {
                Some(u) => (RunAs::TaskUid(u), Some(u)),
                None => {
                    let message = format!(
                        "every task uid of this robot ({}-{}) is in use",
                        self.config.task_uids.start(),
                        self.config.task_uids.end()
                    );
                    return Err((TaskReason::OverCapacity, message));
                }
            },
        };
        match self.artifact_client(spec) {
            Ok(client) => Ok((driver, run_as, own_uid, client)),
            Err(message) => {
                self.give_back(own_uid);
                Err((TaskReason::StartFailed, message))
            }
        }
    }

    /// The HTTP client for `spec`'s artifacts (None when it has none),
    /// made once.
    fn artifact_client(&mut self, spec: &TaskTemplate) -> Result<Option<reqwest::Client>, String> {
        if spec.artifacts.is_empty() {
            return Ok(None);
        }
        if let Some(client) = &self.http {
            return Ok(Some(client.clone()));
        }
        let client = artifacts::client()?;
        Ok(Some(self.http.insert(client).clone()))
    }

    /// What preparing a task takes (`keep_dir`: a directory kept from an
    /// earlier run of it).
    fn prep_input(
        &self,
        dir: PathBuf,
        driver: usize,
        template: TaskTemplate,
        run_as: RunAs,
        client: Option<reqwest::Client>,
        keep_dir: bool,
    ) -> PrepInput {
        PrepInput {
            dir,
            launcher: Arc::clone(&self.launchers[driver]),
            template,
            run_as,
            allow_root: self.config.policy.allow_root,
            keep_dir,
            client,
            limits: artifacts::Limits {
                max_bytes: self.config.artifact_max_bytes,
                timeout: self.config.artifact_timeout,
                retries: self.config.artifact_retries,
            },
            new_uid_position: None,
        }
    }

    /// Why the robot cannot take `spec` now, if it cannot.
    fn over_capacity(&self, spec: &TaskTemplate) -> Option<String> {
        if self.table.len() >= self.config.max_tasks {
            return Some(format!(
                "this robot already holds its maximum of {} tasks (max_tasks)",
                self.config.max_tasks
            ));
        }
        if self.disk.full {
            return Some(format!(
                "the robot's disk is full ({} free, {} kept for the agent); it takes no task until space is back",
                disk::mib(self.disk.free),
                disk::mib(self.disk.reserve.bytes)
            ));
        }
        let wanted = spec.disk_bytes()?;
        let taken: u64 = self
            .table
            .tasks()
            .map(|(_, t)| t.disk_used.max(t.disk_limit.unwrap_or(0)))
            .sum();
        if taken.saturating_add(wanted) > self.disk.budget {
            return Some(format!(
                "resources.disk of {} does not fit: its tasks take {} of the robot's disk budget of {}",
                disk::mib(wanted),
                disk::mib(taken),
                disk::mib(self.disk.budget)
            ));
        }
        None
    }

    fn on_prepared(&mut self, id: u64, result: Result<Prepared, Failure>) {
        let running = self.table.get(id).is_some_and(Task::is_running);
        match result {
            // A re-adopted task runs on whether or not it could be prepared
            // again (its exec checks and restarts need it).
            Err(Failure { reason, message }) if running => {
                tracing::warn!(id, ?reason, %message, "a re-adopted task could not be prepared again");
            }
            Ok(prepared) => self.start(id, prepared),
            Err(Failure { reason, message }) => self.finish_unstarted(id, reason, message),
        }
    }

    /// Starts a prepared task.
    fn start(&mut self, id: u64, prepared: Prepared) {
        let Some(task) = self.table.get_mut(id) else {
            return;
        };
        if task.is_running() {
            // Re-adopted: it was prepared again for its checks and restarts.
            task.prepared.get_or_insert(prepared);
            return;
        }
        let task = &*task;
        // A restart's cgroup is a new one: the last run's may still be
        // waiting for its processes to die.
        let restarting = matches!(task.phase, Phase::Waiting) || task.resumed;
        let name = match task.restarts.as_ref().filter(|_| restarting) {
            Some(budget) => format!("{}-{}-r{}", task.uid, task.attempt, budget.count + 1),
            None => format!("{}-{}", task.uid, task.attempt),
        };
        let cgroup = self.cgroups.as_ref().and_then(|c| match c.create(&name) {
            Ok(cgroup) => Some(cgroup),
            Err(e) => {
                tracing::warn!(task = %name, error = %e, "cannot create the task's cgroup; its processes are found through /proc");
                None
            }
        });
        // A service writes to its log files itself, so that its output
        // reaches the disk while no agent runs (an agent restart leaves
        // it running); other tasks' output passes through the agent.
        let outputs = if task.template.kind == TaskKind::Service {
            open_log_files(&task.dir.join("logs")).map(|(out, err)| (None, out, err))
        } else {
            output::pipe()
                .and_then(|out| Ok((out, output::pipe()?)))
                .map(|((out, out_w), (err, err_w))| (Some((out, err)), out_w, err_w))
        };
        let (piped, stdout_w, stderr_w) = match outputs {
            Ok(outputs) => outputs,
            Err(e) => {
                remove_cgroup(cgroup.as_ref());
                let message = format!("cannot set up the task's output: {e}");
                return self.finish_unstarted(id, TaskReason::StartFailed, message);
            }
        };
        let extra_env = task_env(task, &prepared.task_dir, &self.config.robot_id);
        let launched = self.launchers[task.driver].start(Launch {
            template: &task.template,
            prepared: &prepared,
            extra_env: &extra_env,
            stdout: stdout_w,
            stderr: stderr_w,
            cgroup: cgroup.as_ref(),
        });
        let process = match launched {
            Ok(process) => process,
            Err(e) => {
                remove_cgroup(cgroup.as_ref());
                let reason = driver_reason(&e);
                return self.finish_unstarted(id, reason, e.to_string());
            }
        };
        let Process {
            pid: raw_pid,
            pgid,
            exit,
            group,
        } = process;
        let now = Instant::now();
        let at = jiff::Timestamp::now();
        let pid = raw_pid as i32;
        let pid_start = procfs::stat(pid).map(|s| s.start_time).unwrap_or(0);
        let started = journal::Started {
            pid,
            pgid,
            pid_start,
            boot_id: self.boot_id.clone(),
            cgroup: cgroup.as_ref().map(|c| c.path().to_path_buf()),
            task_uid: task.own_uid,
            started_at: at,
            restarts: task
                .restarts
                .as_ref()
                .map_or(0, |b| b.count + u32::from(restarting)),
        };
        let record = Record::Started {
            uid: task.uid.clone(),
            attempt: task.attempt,
            at: started.clone(),
        };
        let keep_prepared = task.restarts.is_some() || !task.checks.is_empty();
        let (uid, attempt) = (task.uid.clone(), task.attempt);
        let lineage = match cgroup {
            Some(_) => None,
            None => Some(Lineage::new(
                pid,
                pid_start,
                task.own_uid,
                &task.uid,
                task.attempt,
            )),
        };
        let logs_dir = task.dir.join("logs");
        let running = Running {
            pid,
            pgid,
            started,
            group,
            lineage,
        };
        let mut restarted = None;
        if let Some(task) = self.table.get_mut(id) {
            task.cgroup = cgroup;
            task.stdout = piped.as_ref().map(|(out, _)| out.clone());
            task.stderr = piped.as_ref().map(|(_, err)| err.clone());
            task.resumed = false;
            if let Some(budget) = task.restarts.as_mut().filter(|_| restarting) {
                budget.restarted(at);
                restarted = Some(Restarted {
                    count: budget.count,
                    last_exit_code: budget.last_exit_code,
                    cause: budget.last_cause.clone().unwrap_or_else(|| {
                        "the process had stopped while the agent or the robot restarted".to_owned()
                    }),
                    at,
                });
            }
        }
        if keep_prepared {
            if let Some(task) = self.table.get_mut(id) {
                task.prepared = Some(prepared);
            }
        }
        let event = TaskEvent::Started {
            uid,
            attempt,
            pid: raw_pid,
            at,
            restarted,
        };
        self.table.started(id, running, now);
        self.owned_pids.insert(pid);
        self.waits.push(Box::pin(async move { (id, exit.await) }));
        if let Some((stdout, stderr)) = piped {
            self.logs.open(id, logs_dir);
            self.pipes.push(output::read_next(id, Stream::Stdout, stdout));
            self.pipes.push(output::read_next(id, Stream::Stderr, stderr));
        }
        self.journal.write(Some(record), vec![event]);
        self.schedule_first_checks(id);
    }

    /// Arms a running task's health checks, each after its initial delay.
    fn schedule_first_checks(&mut self, id: u64) {
        let delays: Vec<Duration> = self
            .table
            .get(id)
            .map(|t| t.checks.iter().map(|c| c.timing.initial_delay).collect())
            .unwrap_or_default();
        for (index, after) in delays.into_iter().enumerate() {
            self.table.schedule(Deadline::Check(id, index), after);
        }
    }

    fn on_deadline(&mut self, deadline: Deadline, at: Instant) {
        match deadline {
            Deadline::Cleanup => {
                self.cleanup_scheduled = false;
                return self.remove_cgroups();
            }
            Deadline::Sweep => return self.sweep(),
            Deadline::Measure => return self.measure(),
            Deadline::Restart(id) => return self.restart(id),
            Deadline::Check(id, index) => return self.run_check(id, index),
            Deadline::Term(_) | Deadline::Kill(_) => {}
        }
        let id = match deadline {
            Deadline::Term(id) | Deadline::Kill(id) => id,
            _ => return,
        };
        let Some((signal, task)) = self.table.deadline_passed(deadline, at) else {
            return;
        };
        let Phase::Running(running) = &task.phase else {
            return;
        };
        running.group.signal(signal);
        let late = Instant::now().saturating_duration_since(at);
        let has_lineage = running.lineage.is_some();
        if signal == Signal::SIGTERM {
            self.stats.sigterm_late.record(late);
        } else {
            self.stats.sigkill_late.record(late);
            if let Some(cgroup) = &task.cgroup {
                let pids = cgroup.pids().unwrap_or_default();
                let _ = cgroup.kill();
                self.table.remember_pids(pids);
            }
        }
        if has_lineage {
            self.sweep_soon(id, signal);
        }
    }

    /// Cancel or shutdown: SIGTERM now, SIGKILL after the kill timeout. A
    /// task already being stopped keeps its cause and its escalation.
    fn stop(&mut self, id: u64, cause: StopCause) {
        match self.table.stop(id, &cause, Instant::now()) {
            Stop::Unstarted(abort) => {
                abort.abort();
                let message = match &cause {
                    StopCause::Cancelled(why) => format!("cancelled ({why}) before it started"),
                    StopCause::Shutdown => "agent shutting down".to_owned(),
                    StopCause::Timeout(_) => "timed out".to_owned(),
                    StopCause::DiskLimit(why) | StopCause::Unhealthy(why) => {
                        format!("stopped before it started: {why}")
                    }
                };
                self.finish_unstarted(id, TaskReason::Cancelled, message);
            }
            Stop::Waiting => {
                let message = match &cause {
                    StopCause::Cancelled(why) => format!("cancelled ({why}) while waiting to restart"),
                    StopCause::Shutdown => "agent shutting down".to_owned(),
                    StopCause::Timeout(_) => "timed out".to_owned(),
                    StopCause::DiskLimit(why) | StopCause::Unhealthy(why) => {
                        format!("stopped while waiting to restart: {why}")
                    }
                };
                let reason = match &cause {
                    StopCause::DiskLimit(_) => TaskReason::DiskLimit,
                    _ => TaskReason::Cancelled,
                };
                self.finish_unstarted(id, reason, message);
            }
            Stop::Terminate(group) => {
                group.signal(Signal::SIGTERM);
                let has_lineage = self
                    .table
                    .get(id)
                    .is_some_and(|t| matches!(&t.phase, Phase::Running(r) if r.lineage.is_some()));
                if has_lineage {
                    self.sweep_soon(id, Signal::SIGTERM);
                }
            }
            Stop::Nothing => {}
        }
    }

    /// Kills a running task at once (the disk cannot wait for its kill
    /// timeout).
    fn kill_now(&mut self, id: u64, cause: StopCause) {
        let Some(task) = self.table.kill_now(id, cause) else {
            return;
        };
        let Phase::Running(running) = &task.phase else {
            return;
        };
        tracing::warn!(uid = %task.uid, attempt = task.attempt, "stopping a task for its disk use");
        running.group.signal(Signal::SIGKILL);
        let lineage = running.lineage.is_some();
        if let Some(cgroup) = &task.cgroup {
            let pids = cgroup.pids().unwrap_or_default();
            let _ = cgroup.kill();
            self.table.remember_pids(pids);
        }
        if lineage {
            self.sweep_soon(id, Signal::SIGKILL);
        }
    }

    fn on_exit(&mut self, id: u64, status: io::Result<ExitStatus>) {
        let Some(mut task) = self.table.remove(id) else {
            return;
        };
        let Phase::Running(running) = task.phase else {
            return;
        };
        self.sweeps.term.remove(&id);
        self.sweeps.kill.remove(&id);
        self.owned_pids.remove(&running.pid);
        let exit = match status {
            Ok(status) => Exit::from(status),
            Err(e) => {
                tracing::warn!(uid = %task.uid, error = %e, "cannot wait for the task's process");
                Exit {
                    code: None,
                    signal: None,
                }
            }
        };
        let mut v = verdict(exit, task.stop.as_ref(), task.kill_timeout);
        // Restarted on the robot unless it was stopped on purpose (a failed
        // health check is a failure like any other).
        let restart = match (&task.stop, task.restarts.as_mut()) {
            (None | Some(StopCause::Unhealthy(_)), Some(budget)) if !self.shutting_down => {
                let wait = budget.after_exit(v.state == TaskState::Completed, v.exit_code, Instant::now());
                budget.last_cause = Some(v.message.clone());
                wait
            }
            _ => None,
        };
        // A task that runs again keeps its uid (its directory is its own).
        let own_uid = task.own_uid.filter(|_| restart.is_none());
        // The task is its whole process group (and cgroup, or lineage):
        // nothing of it outlives its main process. Orphans come back to us
        // as zombies.
        running.group.signal(Signal::SIGKILL);
        match (task.cgroup.take(), running.lineage) {
            (Some(cgroup), _) => {
                self.table.remember_pids(cgroup.pids().unwrap_or_default());
                let _ = cgroup.kill();
                if cgroup.remove().is_err() {
                    self.cgroups_to_remove.push((cgroup, own_uid));
                    self.remove_cgroups();
                } else {
                    self.give_back(own_uid);
                }
            }
            (None, Some(mut lineage)) => {
                if restart.is_some() {
                    // The next run has the same uid and markers: the sweep
                    // must know the old run by its groups and sessions only.
                    lineage.forget_identity();
                }
                self.sweeps.lingering.push(Lingering {
                    lineage,
                    own_uid,
                    rounds: 0,
                });
                self.schedule_sweep(Duration::ZERO);
            }
            (None, None) => self.give_back(own_uid),
        }
        self.table.remember_group(running.pgid);
        for (stream, fd) in [
            (Stream::Stdout, task.stdout.take()),
            (Stream::Stderr, task.stderr.take()),
        ] {
            if let Some(fd) = fd {
                let rest = output::drain(&fd, DRAIN_MAX);
                if !rest.is_empty() {
                    task.tail.push(&rest);
                    let len = rest.len() as u64;
                    if !self.logs.write(id, stream, rest) {
                        task.dropped_output += len;
                        self.dropped_output += len;
                    }
                }
            }
        }
        self.logs.close(id);
        if let Some(wait) = restart {
            tracing::info!(
                uid = %task.uid,
                attempt = task.attempt,
                exit_code = ?v.exit_code,
                signal = ?v.signal,
                wait = %k8s4r_api::duration::format_duration(wait),
                "task exited; restarting it on the robot"
            );
            task.phase = Phase::Waiting;
            self.table.wait_to_restart(task, wait);
            return;
        }
        let restarted = task.restarts.as_ref().map_or(0, |b| b.count);
        if task.stop.is_none() && task.template.kind == TaskKind::Service {
            // A service that ends is a failure, however it exited.
            if v.state == TaskState::Completed {
                v.state = TaskState::Failed;
                v.reason = TaskReason::Error;
            }
            v.message.push_str(&format!(
                "; the service's restarts on the robot are used up ({restarted} so far)"
            ));
        } else if restarted > 0 && task.stop.is_none() && v.state != TaskState::Completed {
            v.message.push_str(&format!(
                "; its restarts on the robot are used up ({restarted} so far)"
            ));
        }
        let mut message = v.message;
        if task.dropped_output > 0 {
            tracing::warn!(uid = %task.uid, bytes = task.dropped_output, queued = self.logs.queued(), "task output dropped: log writer too slow");
            message.push_str(&format!(
                "; {} bytes of its output were not logged (the disk could not keep up)",
                task.dropped_output
            ));
        }
        if v.state != k8s4r_api::TaskState::Completed {
            // A task that failed on a full disk should say so: it most
            // likely failed because of it.
            if let Ok((_, free, _)) = disk::space(&self.tasks_dir) {
                if free < self.disk.reserve.bytes && !matches!(task.stop, Some(StopCause::DiskLimit(_))) {
                    message.push_str(&format!(
                        "; the robot's disk was full when it ended ({} free)",
                        disk::mib(free)
                    ));
                }
            }
        }
        let outcome = TaskOutcome {
            state: v.state,
            exit_code: v.exit_code,
            signal: v.signal,
            reason: v.reason,
            message,
            started_at: Some(running.started.started_at),
            finished_at: jiff::Timestamp::now(),
            // A service wrote to its log files itself.
            output_tail: if task.template.kind == TaskKind::Service {
                output::lossy_tail(&logs::files_tail(
                    &task.dir.join("logs"),
                    self.config.output_tail_bytes,
                ))
            } else {
                task.tail.text()
            },
        };
        // What a task stopped for its disk use wrote goes at once: the disk
        // needs it back (its logs stay, they are bounded).
        let free_work = matches!(task.stop, Some(StopCause::DiskLimit(_)));
        self.end(task.uid, task.attempt, outcome, free_work);
    }

    /// The attempts it holds.
    pub(crate) fn attempts(&self) -> Vec<k8s4r_api::TaskAttempt> {
        self.table.attempts()
    }

    /// Takes back a service the previous agent left running: the same
    /// process, its timeout counted from its start, its checks; its
    /// driver prepares it again (kept directory) for checks and restarts.
    fn adopt(&mut self, task: journal::Unfinished, resume: journal::Resume, started: journal::Started) {
        let request = TaskRequest {
            uid: task.uid.clone(),
            attempt: task.attempt,
            name: resume.name,
            spec: resume.spec,
            fenced: false,
        };
        let how = Resumed {
            restarts: started.restarts,
            uid: started.task_uid,
        };
        let Some(id) = self.begin(request, Some(how)) else {
            // Refused now (its spec or the robot's policy): stop what runs.
            let message = recovery::kill_leftovers(&task, &self.boot_id);
            tracing::warn!(uid = %task.uid, attempt = task.attempt, %message, "a re-adopted service was refused");
            return;
        };
        let lineage = match started.cgroup {
            Some(_) => None,
            None => Some(Lineage::new(
                started.pid,
                started.pid_start,
                started.task_uid,
                &task.uid,
                task.attempt,
            )),
        };
        let (pid, pid_start) = (started.pid, started.pid_start);
        let ran_for = jiff::Timestamp::now()
            .duration_since(started.started_at)
            .try_into()
            .unwrap_or(Duration::ZERO);
        if let Some(t) = self.table.get_mut(id) {
            t.cgroup = started.cgroup.clone().map(TaskCgroup::at);
            t.resumed = false;
        }
        let record = Record::Started {
            uid: task.uid.clone(),
            attempt: task.attempt,
            at: started.clone(),
        };
        let running = Running {
            pid,
            pgid: started.pgid,
            group: process::group(started.pgid),
            started,
            lineage,
        };
        self.table.adopted(id, running, Instant::now(), ran_for);
        self.waits
            .push(Box::pin(async move { (id, adopted_exit(pid, pid_start).await) }));
        self.journal.write(Some(record), Vec::new());
        self.schedule_first_checks(id);
    }

    /// Runs health check `index` of a running task; its probe comes back
    /// as housework.
    fn run_check(&mut self, id: u64, index: usize) {
        let Some(task) = self.table.get(id) else {
            return;
        };
        let (Phase::Running(_), None, Some(check)) = (&task.phase, &task.stop, task.checks.get(index)) else {
            return;
        };
        let timeout = check.timing.timeout;
        let spec = check.spec.clone();
        let done = move |probe: checks::Probe, pid: Option<i32>| Housework::Checked {
            id,
            index,
            pid,
            probe,
        };
        if let Some(tcp) = spec.tcp {
            let probe = checks::tcp(tcp.host, tcp.port, timeout);
            self.housework
                .push(Box::pin(async move { done(probe.await, None) }));
        } else if let Some(http) = spec.http {
            let client = match &self.check_http {
                Some(client) => client.clone(),
                None => match checks::http_client() {
                    Ok(client) => self.check_http.insert(client).clone(),
                    Err(why) => return self.on_checked(id, index, None, Err(why)),
                },
            };
            let probe = checks::http(client, http.host, http.port, http.path, timeout);
            self.housework
                .push(Box::pin(async move { done(probe.await, None) }));
        } else if let Some(exec) = spec.exec {
            if task.prepared.is_none() {
                // Re-adopted and not prepared again yet: check next time.
                let interval = check.timing.interval;
                return self.table.schedule(Deadline::Check(id, index), interval);
            }
            match self.start_exec_check(id, exec) {
                Ok(process) => {
                    let pid = process.pid as i32;
                    self.owned_pids.insert(pid);
                    self.housework.push(Box::pin(async move {
                        let probe = checks_exec(process, timeout).await;
                        done(probe, Some(pid))
                    }));
                }
                Err(why) => self.on_checked(id, index, None, Err(why)),
            }
        }
    }

    /// Starts an exec check's command as the task runs: its driver, user,
    /// directory and environment; output discarded.
    fn start_exec_check(&self, id: u64, exec: k8s4r_api::ExecCheck) -> Result<Process, String> {
        let task = self.table.get(id).ok_or("the task is gone")?;
        let prepared = task.prepared.as_ref().ok_or("the task was not prepared")?;
        let template = TaskTemplate {
            command: exec.command,
            args: exec.args,
            ..task.template.clone()
        };
        let null = |what: &str| {
            std::fs::OpenOptions::new()
                .write(true)
                .open("/dev/null")
                .map(std::os::fd::OwnedFd::from)
                .map_err(|e| format!("cannot open /dev/null for the check's {what}: {e}"))
        };
        let extra_env = task_env(task, &prepared.task_dir, &self.config.robot_id);
        self.launchers[task.driver]
            .start(Launch {
                template: &template,
                prepared,
                extra_env: &extra_env,
                stdout: null("stdout")?,
                stderr: null("stderr")?,
                // Counted against the task's limits, like the task.
                cgroup: task.cgroup.as_ref(),
            })
            .map_err(|e| format!("cannot run the check: {e}"))
    }

    /// A probe came back: count it, stop the task if it made it unhealthy,
    /// else check again after the interval.
    fn on_checked(&mut self, id: u64, index: usize, pid: Option<i32>, probe: checks::Probe) {
        if let Some(pid) = pid {
            self.owned_pids.remove(&pid);
        }
        let Some(task) = self.table.get_mut(id) else {
            return;
        };
        if !task.is_running() || task.stop.is_some() {
            return;
        }
        let Some(check) = task.checks.get_mut(index) else {
            return;
        };
        let interval = check.timing.interval;
        match check.record(probe) {
            Some(why) => {
                tracing::warn!(uid = %task.uid, attempt = task.attempt, %why, "task unhealthy; stopping it");
                self.stop(id, StopCause::Unhealthy(why));
            }
            None => self.table.schedule(Deadline::Check(id, index), interval),
        }
    }

    /// Starts again a task that was waiting to restart; one that was never
    /// prepared in this run (re-adopted) is prepared first.
    fn restart(&mut self, id: u64) {
        match self.table.restart_due(id) {
            Some(Some(prepared)) => self.start(id, prepared),
            Some(None) => self.prepare_again(id),
            None => {}
        }
    }

    /// Prepares a task again in its kept directory; it starts when that is
    /// done (or fails, as a start would).
    fn prepare_again(&mut self, id: u64) {
        let Some(task) = self.table.get(id) else {
            return;
        };
        let run_as = match self.config.policy.decide(&task.template, self.agent_is_root) {
            Ok(Plan::Run(run_as)) => Some(run_as),
            Ok(Plan::OwnUid) => task.own_uid.map(RunAs::TaskUid),
            Err(_) => None,
        };
        let Some(run_as) = run_as else {
            let message = "cannot run it again: the robot's policy no longer allows it".to_owned();
            return self.finish_unstarted(id, TaskReason::NotPermitted, message);
        };
        let (dir, driver, template) = (task.dir.clone(), task.driver, task.template.clone());
        let client = match self.artifact_client(&template) {
            Ok(client) => client,
            Err(message) => return self.finish_unstarted(id, TaskReason::StartFailed, message),
        };
        let input = self.prep_input(dir, driver, template, run_as, client, true);
        self.preparing
            .push(Box::pin(async move { (id, Ok(prepare(input).await)) }));
    }

    fn on_output(&mut self, id: u64, stream: Stream, fd: PipeFd, result: io::Result<Vec<u8>>) {
        let data = match result {
            Ok(data) if !data.is_empty() => data,
            // End of file or a broken pipe: this stream is done.
            _ => return,
        };
        let Some(task) = self.table.get_mut(id) else {
            // The task is over; whatever escaped it may not keep us reading.
            return;
        };
        task.tail.push(&data);
        let len = data.len() as u64;
        if !self.logs.write(id, stream, data) {
            task.dropped_output += len;
            self.dropped_output += len;
        }
        self.pipes.push(output::read_next(id, stream, fd));
    }

    /// Signals the processes of `id` (a task without a cgroup) at the next
    /// sweep: one look at /proc serves every task due.
    fn sweep_soon(&mut self, id: u64, signal: Signal) {
        if signal == Signal::SIGKILL {
            self.sweeps.kill.insert(id);
        } else {
            self.sweeps.term.insert(id);
        }
        self.schedule_sweep(Duration::ZERO);
    }

    fn schedule_sweep(&mut self, after: Duration) {
        if !self.sweeps.scheduled {
            self.sweeps.scheduled = true;
            self.table.schedule(Deadline::Sweep, after);
        }
    }

    /// Finds the processes of the tasks due in /proc and signals them; the
    /// processes of finished tasks are killed, look after look, until none
    /// is left.
    fn sweep(&mut self) {
        self.sweeps.scheduled = false;
        let procs = procfs::snapshot();
        let agent = self.agent_pid;
        for (ids, signal) in [
            (std::mem::take(&mut self.sweeps.term), Signal::SIGTERM),
            (std::mem::take(&mut self.sweeps.kill), Signal::SIGKILL),
        ] {
            for id in ids {
                let Some(task) = self.table.get_mut(id) else {
                    continue;
                };
                let Phase::Running(running) = &mut task.phase else {
                    continue;
                };
                let Some(lineage) = running.lineage.as_mut() else {
                    continue;
                };
                for pid in lineage.members(&procs, agent, procfs::real_uid, procfs::environ_has) {
                    let _ = nix::sys::signal::kill(Pid::from_raw(pid), signal);
                }
            }
        }
        let mut done = Vec::new();
        for (i, left) in self.sweeps.lingering.iter_mut().enumerate() {
            let members = left
                .lineage
                .members(&procs, agent, procfs::real_uid, procfs::environ_has);
            for pid in &members {
                let _ = nix::sys::signal::kill(Pid::from_raw(*pid), Signal::SIGKILL);
            }
            left.rounds += 1;
            if members.is_empty() || left.rounds > SWEEP_ROUNDS {
                if !members.is_empty() {
                    tracing::error!(pids = ?members, "processes of a finished task survive SIGKILL; giving up on them");
                }
                done.push((i, !members.is_empty()));
            }
        }
        for (i, survived) in done.into_iter().rev() {
            let left = self.sweeps.lingering.swap_remove(i);
            if let Some(uid) = left.own_uid {
                if survived {
                    self.uids.bar(uid);
                } else {
                    self.uids.give_back(uid);
                }
            }
            self.recent_lineages.push_back(left.lineage);
            if self.recent_lineages.len() > REMEMBERED_LINEAGES {
                self.recent_lineages.pop_front();
            }
        }
        if !self.sweeps.lingering.is_empty() {
            self.schedule_sweep(SWEEP_EVERY);
        }
        self.reap_orphans();
    }

    /// Measures the disk `after` from now, unless a measurement is due
    /// sooner already.
    fn schedule_measure(&mut self, after: Duration) {
        let at = Instant::now() + after;
        if self.disk.next.is_some_and(|next| next <= at) {
            return;
        }
        self.disk.next = Some(at);
        self.table.schedule(Deadline::Measure, after);
    }

    /// Measures the disk on the blocking pool.
    fn measure(&mut self) {
        if self.disk.next.is_none_or(|next| Instant::now() < next) {
            return; // a timer another, sooner one replaced
        }
        self.disk.next = None;
        if self.disk.measuring {
            return; // the one in flight schedules the next
        }
        self.disk.measuring = true;
        let tasks_dir = self.tasks_dir.clone();
        let reserve = self.disk.reserve.clone();
        // Services write their log files themselves: rotated here.
        let shared_logs: Vec<PathBuf> = self
            .table
            .tasks()
            .filter(|(_, t)| t.template.kind == TaskKind::Service)
            .flat_map(|(_, t)| {
                [Stream::Stdout, Stream::Stderr].map(|s| t.dir.join("logs").join(s.file_name()))
            })
            .collect();
        let (max_bytes, max_files) = (self.config.log_max_bytes, self.config.log_max_files);
        let handle = tokio::task::spawn_blocking(move || {
            for path in &shared_logs {
                if let Err(e) = logs::rotate_shared(path, max_bytes, max_files) {
                    tracing::warn!(path = %path.display(), error = %e, "cannot rotate a service's log");
                }
            }
            disk::measure(&tasks_dir, &reserve)
        });
        self.housework.push(Box::pin(async move {
            Housework::Measured(handle.await.unwrap_or_default())
        }));
    }

    /// Applies the disk rules to a measurement.
    fn on_measured(&mut self, m: Measurement) {
        self.disk.measuring = false;
        tracing::debug!(free = m.free, reserve_held = m.reserve_held, dirs = m.dirs.len(), took = ?m.took, "disk measured");
        let mut running = Vec::new();
        for (id, task) in self.table.tasks_mut() {
            task.disk_used = m.dirs.get(&task.dir).copied().unwrap_or(0);
            if task.is_running() {
                running.push(TaskUse {
                    id,
                    used: task.disk_used,
                    limit: task.disk_limit,
                });
            }
        }
        let finished: Vec<(PathBuf, u64)> = self
            .finished_dirs
            .iter()
            .filter_map(|(_, dir)| Some((dir.clone(), *m.dirs.get(dir)?)))
            .collect();
        let limits = disk::Limits {
            budget: self.disk.budget,
            reserve: self.disk.reserve.bytes,
        };
        // A released reserve is owed: until it is taken back, its share of
        // the free space is not free.
        let free = if m.reserve_held {
            m.free
        } else {
            m.free.saturating_sub(self.disk.reserve.bytes)
        };
        let verdict = disk::assess(free, m.inodes_free, limits, &running, &finished);
        for (id, why) in verdict.stop {
            self.kill_now(id, StopCause::DiskLimit(why));
        }
        if !verdict.remove.is_empty() {
            let remove: HashSet<PathBuf> = verdict.remove.into_iter().collect();
            tracing::info!(
                dirs = remove.len(),
                "removing finished task directories to free disk"
            );
            self.finished_dirs.retain(|(_, dir)| !remove.contains(dir));
            self.offload(move || {
                for dir in remove {
                    remove_dir(&dir);
                }
            });
        }
        if verdict.full != self.disk.full {
            if verdict.full {
                tracing::error!(
                    free = m.free,
                    reserve = self.disk.reserve.bytes,
                    "disk full: taking no task until space is back"
                );
            } else {
                tracing::info!(free = m.free, "disk space is back: taking tasks again");
            }
        }
        self.disk.full = verdict.full;
        self.disk.free = free;
        self.disk.used = m.dirs.values().sum();
        let next = if self.table.is_empty() && !self.disk.full {
            MEASURE_IDLE
        } else {
            MEASURE_BUSY
        };
        self.schedule_measure(next);
    }

    fn reap_orphans(&mut self) {
        let is_task_group = self.table.task_groups();
        let reap_all = self.config.reap_all_orphans;
        let running: Vec<&Lineage> = self
            .table
            .tasks()
            .filter_map(|(_, t)| match &t.phase {
                Phase::Running(r) => r.lineage.as_ref(),
                Phase::Preparing { .. } | Phase::Waiting => None,
            })
            .collect();
        let lingering = &self.sweeps.lingering;
        let recent = &self.recent_lineages;
        reaper::reap_orphans(&self.owned_pids, |pid, stat| {
            reap_all
                || is_task_group(pid, stat.pgrp)
                || running.iter().any(|l| l.knows(pid, stat))
                || lingering.iter().any(|l| l.lineage.knows(pid, stat))
                || recent.iter().any(|l| l.knows(pid, stat))
        });
        drop(is_task_group);
        self.remove_cgroups();
    }

    /// Removes the cgroups of finished tasks once their last process is
    /// gone, killing what is left each time; retried every second while
    /// some remain.
    fn remove_cgroups(&mut self) {
        let mut freed = Vec::new();
        let mut seen = Vec::new();
        self.cgroups_to_remove.retain(|(cgroup, uid)| {
            seen.extend(cgroup.pids().unwrap_or_default());
            let _ = cgroup.kill();
            let gone = cgroup.remove().is_ok() || !cgroup.path().exists();
            if gone {
                freed.push(*uid);
            }
            !gone
        });
        self.table.remember_pids(seen);
        for uid in freed {
            self.give_back(uid);
        }
        if !self.cgroups_to_remove.is_empty() && !self.cleanup_scheduled {
            self.cleanup_scheduled = true;
            self.table.schedule_cleanup(CLEANUP_EVERY);
        }
    }

    fn give_back(&mut self, uid: Option<u32>) {
        if let Some(uid) = uid {
            self.uids.give_back(uid);
        }
    }

    /// A task that never got a record (bad spec, refused).
    fn finish_early(&mut self, uid: String, attempt: u32, reason: TaskReason, message: String) {
        tracing::warn!(%uid, attempt, ?reason, %message, "task not started");
        self.table.remember_finished(uid.clone(), attempt);
        self.journal.event(TaskEvent::Finished {
            uid,
            attempt,
            outcome: failed_outcome(reason, message, String::new()),
        });
    }

    /// A task that has a record but no process.
    fn finish_unstarted(&mut self, id: u64, reason: TaskReason, message: String) {
        let Some(task) = self.table.remove(id) else {
            return;
        };
        if reason != TaskReason::Cancelled {
            tracing::warn!(uid = %task.uid, attempt = task.attempt, ?reason, %message, "task not started");
        }
        self.give_back(task.own_uid);
        self.end(
            task.uid,
            task.attempt,
            failed_outcome(reason, message, String::new()),
            false,
        );
    }

    fn end(&mut self, uid: String, attempt: u32, outcome: TaskOutcome, free_work: bool) {
        self.table.remember_finished(uid.clone(), attempt);
        self.retire_dir(uid.clone(), attempt, free_work);
        let record = Record::Ended {
            uid: uid.clone(),
            attempt,
        };
        self.journal.write(
            Some(record),
            vec![TaskEvent::Finished {
                uid,
                attempt,
                outcome,
            }],
        );
    }

    /// Keeps the directory of a finished task among the last
    /// [`KEEP_FINISHED_DIRS`] (the oldest beyond that are deleted), closed
    /// to everyone but root: a later task given the same uid must not
    /// reach its files.
    fn retire_dir(&mut self, uid: String, attempt: u32, free_work: bool) {
        let dir = super::task_dir(&self.tasks_dir, &uid, attempt);
        self.finished_dirs.push_back(((uid, attempt), dir.clone()));
        let mut remove = Vec::new();
        while self.finished_dirs.len() > KEEP_FINISHED_DIRS {
            let Some((key, old)) = self.finished_dirs.pop_front() else {
                break;
            };
            // The same attempt dispatched again runs in that directory.
            if !self.table.holds(&key) {
                remove.push(old);
            }
        }
        self.offload(move || {
            let _ = std::fs::set_permissions(&dir, std::fs::Permissions::from_mode(0o700));
            if free_work {
                remove_dir(&dir.join("work"));
            }
            for old in remove {
                remove_dir(&old);
            }
        });
    }

    /// Runs `work` on the blocking pool at once; the loop only keeps its
    /// handle (and waits for it at shutdown).
    fn offload(&mut self, work: impl FnOnce() + Send + 'static) {
        let handle = tokio::task::spawn_blocking(work);
        self.housework.push(Box::pin(async move {
            let _ = handle.await;
            Housework::Done
        }));
    }

    /// Publishes the health when it changed.
    fn update_health(&mut self) {
        let (accepting, reason) = if self.shutting_down {
            (false, AgentHealth::REASON_SHUTTING_DOWN)
        } else if self.disk.full {
            (false, AgentHealth::REASON_DISK_FULL)
        } else if !self.journal.healthy() {
            (false, AgentHealth::REASON_JOURNAL_FAILING)
        } else {
            (true, AgentHealth::REASON_READY)
        };
        let key = (
            accepting,
            reason,
            self.table.len(),
            self.disk.used,
            self.dropped_output,
        );
        if self.health_key == Some(key) {
            return;
        }
        self.health_key = Some(key);
        let mut health = ready_health(self.table.len(), self.disk.used, self.dropped_output);
        if !accepting {
            health.accepting_tasks = false;
            health.reason = Some(reason.to_owned());
            health.message = Some(match reason {
                AgentHealth::REASON_DISK_FULL => format!(
                    "the disk holding {} is full ({} free, {} kept for the agent)",
                    self.config.state_dir.display(),
                    disk::mib(self.disk.free),
                    disk::mib(self.disk.reserve.bytes)
                ),
                AgentHealth::REASON_JOURNAL_FAILING => format!(
                    "cannot write the journal {}: a task started now could not be settled after a crash",
                    self.journal.path().display()
                ),
                _ => "the agent is shutting down".to_owned(),
            });
        }
        let _ = self.health.send(health);
    }
}

/// What preparing a task needs, moved off the loop.
struct PrepInput {
    dir: PathBuf,
    launcher: Arc<dyn Launcher>,
    template: TaskTemplate,
    run_as: RunAs,
    allow_root: bool,
    /// Keep what the directory holds (a task started again from the journal).
    keep_dir: bool,
    client: Option<reqwest::Client>,
    limits: artifacts::Limits,
    /// The task got a uid of its own, new to it: the rotation's position
    /// after it is kept in this file, and what the uid's earlier tasks
    /// left in the shared places is removed first.
    new_uid_position: Option<(PathBuf, u32)>,
}

/// Waits for a re-adopted process to end. It is not the agent's child, so
/// its exit status cannot be had: it is watched through /proc.
async fn adopted_exit(pid: i32, pid_start: u64) -> io::Result<ExitStatus> {
    const POLL: Duration = Duration::from_millis(100);
    while procfs::stat(pid).is_some_and(|s| s.start_time == pid_start && s.is_live()) {
        tokio::time::sleep(POLL).await;
    }
    Err(io::Error::other(
        "it ended after an agent restart re-adopted it, so its exit status is unknown",
    ))
}

/// Waits for an exec check's process: healthy when it exits 0 within
/// `timeout`; killed (and reaped) when it does not.
async fn checks_exec(process: Process, timeout: Duration) -> checks::Probe {
    let Process { exit, group, .. } = process;
    tokio::pin!(exit);
    let probe = tokio::time::timeout(timeout, &mut exit).await;
    // Whatever the check left in its group goes with it.
    group.signal(Signal::SIGKILL);
    match probe {
        Ok(Ok(status)) if status.success() => Ok(()),
        Ok(Ok(status)) => Err(format!(
            "the check command {}",
            verdict(Exit::from(status), None, Duration::ZERO).message
        )),
        Ok(Err(e)) => Err(format!("cannot wait for the check command: {e}")),
        Err(_) => {
            let _ = exit.await;
            Err(format!(
                "the check command did not finish within {}",
                k8s4r_api::duration::format_duration(timeout)
            ))
        }
    }
}

/// Makes the task's directory, resolves its user, lets the driver prepare
/// it, and fetches its artifacts: everything that touches the disk or the
/// user database, on the blocking pool.
async fn prepare(input: PrepInput) -> Result<Prepared, Failure> {
    let PrepInput {
        dir,
        launcher,
        template,
        run_as,
        allow_root,
        keep_dir,
        client,
        limits,
        new_uid_position,
    } = input;
    let artifacts = template.artifacts.clone();
    let task_dir = dir.clone();
    let prepared = tokio::task::spawn_blocking(move || -> Result<Prepared, Failure> {
        if let (Some((file, position)), RunAs::TaskUid(uid)) = (&new_uid_position, &run_as) {
            keep_uid_position(file, *position);
            clean_leftovers(*uid)?;
        }
        let made = if keep_dir && task_dir.is_dir() {
            reuse_task_dir(&task_dir)
        } else {
            make_task_dir(&task_dir)
        };
        made.map_err(|e| {
            Failure::new(
                TaskReason::StartFailed,
                format!("cannot create task directory {}: {e}", task_dir.display()),
            )
        })?;
        let identity = identity::resolve(&run_as, &template.groups, allow_root)?;
        Ok(launcher.prepare(&template, &task_dir.join("work"), identity)?)
    })
    .await
    .map_err(|e| Failure::new(TaskReason::StartFailed, format!("cannot prepare the task: {e}")))??;
    if let Some(client) = client {
        let places = artifacts::Places {
            fetch_dir: dir.join("fetch"),
            work_dir: prepared.task_dir.clone(),
            owner: prepared.identity.as_ref().map(|i| (i.uid, i.gid)),
        };
        artifacts::fetch_all(client, artifacts, places, limits)
            .await
            .map_err(|message| Failure::new(TaskReason::ArtifactFailed, message))?;
    }
    Ok(prepared)
}

/// Keeps the uid rotation's position for the next agent run (written
/// whole, then renamed; a failure only means the next run starts the
/// rotation elsewhere, which the clean-up below makes safe).
fn keep_uid_position(file: &Path, position: u32) {
    let tmp = file.with_extension("tmp");
    let written = std::fs::write(&tmp, format!("{position}\n")).and_then(|()| std::fs::rename(&tmp, file));
    if let Err(e) = written {
        tracing::warn!(path = %file.display(), error = %e, "cannot keep the task uid rotation's position");
    }
}

/// Removes what earlier tasks of `uid` left in the shared places before a
/// new task gets it; a leftover that cannot be removed fails the start
/// rather than hand it to another author's task.
fn clean_leftovers(uid: u32) -> Result<(), Failure> {
    let removed = k8s4r_drivers::leftovers::remove(uid);
    if !removed.files.is_empty() || removed.ipc > 0 {
        tracing::info!(
            uid,
            files = removed.files.len(),
            ipc = removed.ipc,
            "removed what earlier tasks of this uid left behind"
        );
    }
    if !removed.errors.is_empty() {
        return Err(Failure::new(
            TaskReason::StartFailed,
            format!(
                "cannot remove what an earlier task of uid {uid} left: {}",
                removed.errors.join("; ")
            ),
        ));
    }
    Ok(())
}

fn driver_reason(e: &DriverError) -> TaskReason {
    if e.is_invalid_spec() {
        TaskReason::InvalidSpec
    } else if e.is_not_permitted() {
        TaskReason::NotPermitted
    } else {
        TaskReason::StartFailed
    }
}

async fn recv_signal(signal: &mut Option<tokio::signal::unix::Signal>) -> Option<()> {
    match signal {
        Some(signal) => signal.recv().await,
        None => std::future::pending().await,
    }
}

fn remove_cgroup(cgroup: Option<&TaskCgroup>) {
    if let Some(cgroup) = cgroup {
        let _ = cgroup.remove();
    }
}

fn remove_dir(dir: &Path) {
    if let Err(e) = std::fs::remove_dir_all(dir) {
        if e.kind() != io::ErrorKind::NotFound {
            tracing::warn!(path = %dir.display(), error = %e, "cannot remove a finished task's directory");
        }
    }
}

/// The file under the state directory that keeps the task uid rotation's
/// position across agent restarts.
const UID_POSITION_FILE: &str = "task-uid-next";

/// `<dir>/work` (the task's own), `<dir>/logs` and `<dir>/fetch` (root's
/// alone: logs, and artifacts until they are handed over), fresh.
fn make_task_dir(dir: &Path) -> io::Result<()> {
    if dir.symlink_metadata().is_ok() {
        std::fs::remove_dir_all(dir)?;
    }
    std::fs::create_dir(dir)?;
    for sub in ["work", "logs", "fetch"] {
        std::fs::create_dir(dir.join(sub))?;
    }
    std::fs::set_permissions(dir, std::fs::Permissions::from_mode(0o711))?;
    std::fs::set_permissions(dir.join("logs"), std::fs::Permissions::from_mode(0o700))?;
    std::fs::set_permissions(dir.join("fetch"), std::fs::Permissions::from_mode(0o700))
}

/// A task directory kept from the previous run: what is missing of it is
/// made again.
fn reuse_task_dir(dir: &Path) -> io::Result<()> {
    for sub in ["work", "logs", "fetch"] {
        let path = dir.join(sub);
        if !path.is_dir() {
            std::fs::create_dir(&path)?;
        }
    }
    std::fs::set_permissions(dir, std::fs::Permissions::from_mode(0o711))?;
    std::fs::set_permissions(dir.join("logs"), std::fs::Permissions::from_mode(0o700))?;
    std::fs::set_permissions(dir.join("fetch"), std::fs::Permissions::from_mode(0o700))
}

/// The variables the agent adds to a task's environment (and its exec
/// checks').
fn task_env(task: &Task, task_dir: &Path, robot_id: &str) -> Vec<(String, String)> {
    let mut env = vec![
        (names::ENV_TASK_UID.to_owned(), task.uid.clone()),
        (names::ENV_TASK_ATTEMPT.to_owned(), task.attempt.to_string()),
        (names::ENV_TASK_NAME.to_owned(), task.name.clone()),
        (names::ENV_TASK_DIR.to_owned(), task_dir.display().to_string()),
    ];
    if !robot_id.is_empty() {
        env.push((names::ENV_ROBOT_ID.to_owned(), robot_id.to_owned()));
    }
    env
}

/// A service's log files, opened for it to append to.
fn open_log_files(logs_dir: &Path) -> io::Result<(std::os::fd::OwnedFd, std::os::fd::OwnedFd)> {
    use std::os::unix::fs::OpenOptionsExt;
    let open = |stream: Stream| {
        std::fs::OpenOptions::new()
            .create(true)
            .append(true)
            .mode(0o600)
            .custom_flags(nix::libc::O_NOFOLLOW)
            .open(logs_dir.join(stream.file_name()))
            .map(std::os::fd::OwnedFd::from)
    };
    Ok((open(Stream::Stdout)?, open(Stream::Stderr)?))
}

fn is_path_component(s: &str) -> bool {
    !s.is_empty() && s.len() <= 200 && s != "." && s != ".." && !s.contains(['/', '\0'])
}

/// Task directories left by earlier runs, oldest first: they count against
/// [`KEEP_FINISHED_DIRS`] too.
fn existing_task_dirs(tasks_dir: &Path) -> VecDeque<((String, u32), PathBuf)> {
    let Ok(entries) = std::fs::read_dir(tasks_dir) else {
        return VecDeque::new();
    };
    let mut dirs: Vec<(std::time::SystemTime, (String, u32), PathBuf)> = entries
        .flatten()
        .filter_map(|entry| {
            let name = entry.file_name().into_string().ok()?;
            let (uid, attempt) = name.rsplit_once('-')?;
            let key = (uid.to_owned(), attempt.parse().ok()?);
            let modified = entry.metadata().ok()?.modified().ok()?;
            Some((modified, key, entry.path()))
        })
        .collect();
    dirs.sort_by_key(|(modified, ..)| *modified);
    dirs.into_iter().map(|(_, key, path)| (key, path)).collect()
}

/// Task uids that processes run as now (left by an earlier run that could
/// not be settled): never handed out.
fn uids_running(range: &std::ops::RangeInclusive<u32>) -> HashSet<u32> {
    procfs::snapshot()
        .into_iter()
        .filter_map(|(pid, _)| procfs::real_uid(pid))
        .filter(|uid| range.contains(uid))
        .collect()
}

/// exec tasks run as other users and must walk down to their directories:
/// says so at start when a directory above the state dir stops them (else
/// each task would fail with a bare "Permission denied").
fn warn_if_unreachable(tasks_dir: &Path) {
    if !nix::unistd::geteuid().is_root() {
        return; // exec tasks run as the agent's user
    }
    for dir in tasks_dir.ancestors().skip(1) {
        let Ok(meta) = std::fs::metadata(dir) else {
            continue;
        };
        if meta.permissions().mode() & 0o001 == 0 {
            tracing::warn!(
                dir = %dir.display(),
                "exec tasks run as users of their own and cannot reach their directories: this directory is not searchable by others (chmod o+x it, or choose another state_dir)"
            );
            return;
        }
    }
}

/// exec tasks run as another user and must be able to walk through the
/// state dir to their own directory: add the search bits (not read).
fn allow_traversal(dir: &Path) -> io::Result<()> {
    let mode = std::fs::metadata(dir)?.permissions().mode();
    if mode & 0o011 != 0o011 {
        std::fs::set_permissions(dir, std::fs::Permissions::from_mode(mode | 0o011))?;
    }
    Ok(())
}

/// Each task holds a few fds (pipes, pidfd, logs): lift the soft limit to
/// the hard one so a thousand tasks fit.
fn raise_fd_limit() {
    use nix::sys::resource::{getrlimit, setrlimit, Resource};
    if let Ok((soft, hard)) = getrlimit(Resource::RLIMIT_NOFILE) {
        if soft < hard {
            let _ = setrlimit(Resource::RLIMIT_NOFILE, hard, hard);
        }
    }
}

#[cfg(test)]
mod tests;
