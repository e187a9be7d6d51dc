//! The supervisor's event loop: the one task that owns every process.

use std::collections::{HashMap, HashSet, VecDeque};
use std::future::Future;
use std::hash::Hash;
use std::io;
use std::os::unix::fs::PermissionsExt;
use std::path::{Path, PathBuf};
use std::pin::Pin;
use std::process::ExitStatus;
use std::time::Duration;

use futures::future::{AbortHandle, Abortable, Aborted};
use futures::stream::FuturesUnordered;
use futures::StreamExt;
use k8s4r_api::validation::{kill_timeout_of, timeout_of, validate_task_template};
use k8s4r_api::{TaskAttempt, TaskReason, TaskTemplate};
use k8s4r_drivers::{Cgroups, Driver, DriverError, ExecDriver, Launch, Prepared, RawExecDriver, TaskCgroup};
use nix::sys::signal::{killpg, Signal};
use nix::unistd::Pid;
use tokio::signal::unix::{signal, SignalKind};
use tokio::sync::{mpsc, oneshot};
use tokio::time::Instant;
use tokio_util::time::{delay_queue, DelayQueue};

use super::journal::{self, Journal, Record};
use super::logs::{LogWriter, Stream};
use super::outcome::{verdict, Exit, StopCause};
use super::output::{self, PipeFd, PipeRead, Tail};
use super::stats::SupervisorStats;
use super::{
    artifacts, failed_outcome, procfs, reaper, recovery, Command, Submit, SupervisorConfig, SupervisorError,
    TaskEvent, TaskOutcome, TaskRequest,
};

/// Finished (uid, attempt)s remembered to ignore redelivered dispatches.
const REMEMBERED_FINISHED: usize = 4096;
/// Process groups of finished tasks whose orphans are still reaped.
const REMEMBERED_GROUPS: usize = 1024;
/// Most output read from a pipe when its task's process has exited.
const DRAIN_MAX: usize = 1 << 20;
/// Directories of finished tasks kept (logs, artifacts); older ones go.
const KEEP_FINISHED_DIRS: usize = 100;
/// Rewrite the journal once this many lines were appended...
const COMPACT_AFTER: usize = 4096;

type BoxFuture<T> = Pin<Box<dyn Future<Output = T> + Send>>;
/// A download of a task's artifacts: its id and the result (or Aborted).
type Fetch = BoxFuture<(u64, Result<Result<(), String>, Aborted>)>;

/// Which timer of a task fired.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Timer {
    /// The task's timeout: SIGTERM.
    Term,
    /// The kill timeout after SIGTERM: SIGKILL.
    Kill,
    /// Retry removing the cgroups that still had dying processes.
    Cleanup,
}

/// The task id of timers that belong to no task.
const NO_TASK: u64 = u64::MAX;
/// How often the removal of leftover cgroups is retried.
const CLEANUP_EVERY: Duration = Duration::from_secs(1);

enum Phase {
    /// Downloading artifacts; starts when they are in.
    Fetching {
        abort: AbortHandle,
        pending: Box<Pending>,
    },
    Running {
        pid: i32,
        pgid: i32,
        started: journal::Started,
    },
}

/// What a task needs to start once its artifacts are in.
struct Pending {
    template: TaskTemplate,
    prepared: Prepared,
    driver: usize,
}

struct Task {
    uid: String,
    attempt: u32,
    name: String,
    dir: PathBuf,
    phase: Phase,
    timeout: Option<Duration>,
    kill_timeout: Duration,
    /// The pending timer, if any (cleared when it fires).
    timer: Option<delay_queue::Key>,
    stop: Option<StopCause>,
    stdout: Option<PipeFd>,
    stderr: Option<PipeFd>,
    tail: Tail,
    cgroup: Option<TaskCgroup>,
    dropped_output: u64,
}

/// A bounded set that forgets its oldest members.
struct Recent<T> {
    set: HashSet<T>,
    order: VecDeque<T>,
    cap: usize,
}

impl<T: Hash + Eq + Clone> Recent<T> {
    fn new(cap: usize) -> Self {
        Recent {
            set: HashSet::new(),
            order: VecDeque::new(),
            cap,
        }
    }

    fn insert(&mut self, value: T) {
        if self.set.insert(value.clone()) {
            self.order.push_back(value);
            if self.order.len() > self.cap {
                if let Some(old) = self.order.pop_front() {
                    self.set.remove(&old);
                }
            }
        }
    }

    fn contains(&self, value: &T) -> bool {
        self.set.contains(value)
    }
}

pub(crate) struct Runner {
    config: SupervisorConfig,
    events: mpsc::UnboundedSender<TaskEvent>,
    drivers: Vec<Box<dyn Driver>>,
    cgroups: Option<Cgroups>,
    journal: Journal,
    logs: LogWriter,
    boot_id: String,
    tasks_dir: PathBuf,
    tasks: HashMap<u64, Task>,
    by_key: HashMap<(String, u32), u64>,
    /// Pids tokio waits for: never reaped by the orphan reaper.
    owned_pids: HashSet<i32>,
    finished: Recent<(String, u32)>,
    recent_groups: Recent<i32>,
    /// Cgroups of finished tasks that still had processes in them.
    cgroups_to_remove: Vec<TaskCgroup>,
    /// Directories of finished tasks, oldest first.
    finished_dirs: VecDeque<((String, u32), PathBuf)>,
    cleanup_scheduled: bool,
    next_id: u64,
    timers: DelayQueue<(u64, Timer)>,
    waits: FuturesUnordered<BoxFuture<(u64, io::Result<ExitStatus>)>>,
    pipes: FuturesUnordered<PipeRead>,
    fetches: FuturesUnordered<Fetch>,
    http: Option<reqwest::Client>,
    stats: SupervisorStats,
    shutting_down: bool,
    shutdown_waiters: Vec<oneshot::Sender<()>>,
}

impl Runner {
    /// Prepares the state dir, settles the previous run (its events go out
    /// first) and everything the loop needs.
    pub(crate) fn new(
        config: SupervisorConfig,
        events: mpsc::UnboundedSender<TaskEvent>,
    ) -> Result<Self, SupervisorError> {
        let tasks_dir = config.state_dir.join("tasks");
        let state_error = |path: &Path| {
            let path = path.to_path_buf();
            move |source| SupervisorError::StateDir { path, source }
        };
        std::fs::create_dir_all(&tasks_dir).map_err(state_error(&tasks_dir))?;
        allow_traversal(&config.state_dir).map_err(state_error(&config.state_dir))?;
        // exec tasks run as another user and must be able to walk down to
        // their own directory; the listing stays private.
        std::fs::set_permissions(&tasks_dir, std::fs::Permissions::from_mode(0o711))
            .map_err(state_error(&tasks_dir))?;
        raise_fd_limit();
        reaper::become_subreaper();

        let journal_error = |path: PathBuf| move |source| SupervisorError::Journal { path, source };
        let journal_path = config.state_dir.join(journal::FILE_NAME);
        let (mut journal, unfinished) =
            Journal::open(&config.state_dir).map_err(journal_error(journal_path.clone()))?;
        let boot_id = procfs::boot_id();
        let mut finished = Recent::new(REMEMBERED_FINISHED);
        let mut recent_groups = Recent::new(REMEMBERED_GROUPS);
        let mut cgroups_to_remove = Vec::new();
        for task in &unfinished {
            if let Some(path) = task.started.as_ref().and_then(|s| s.cgroup.clone()) {
                cgroups_to_remove.push(TaskCgroup::at(path));
            }
            // Killed members re-parented to us (a subreaper) get reaped.
            if let Some(started) = &task.started {
                recent_groups.insert(started.pgid);
            }
            let outcome = recovery::settle(task, &boot_id, config.output_tail_bytes);
            tracing::warn!(uid = %task.uid, attempt = task.attempt, message = %outcome.message, "task of the previous run settled");
            finished.insert((task.uid.clone(), task.attempt));
            let _ = events.send(TaskEvent::Finished {
                uid: task.uid.clone(),
                attempt: task.attempt,
                outcome,
            });
        }
        // Nothing runs yet: start from an empty journal (this also gets rid
        // of a torn last line).
        journal.compact([]).map_err(journal_error(journal_path))?;

        let cgroups = match Cgroups::detect(config.cgroup_root.as_deref()) {
            Ok(cgroups) => {
                tracing::info!(root = %cgroups.root().display(), controllers = ?cgroups.controllers(), "task cgroups enabled");
                Some(cgroups)
            }
            Err(why) => {
                tracing::info!(%why, "no task cgroups: tasks are killed by process group only");
                None
            }
        };
        let logs = LogWriter::start(config.log_max_bytes, config.log_max_files)
            .map_err(SupervisorError::LogWriter)?;
        let drivers: Vec<Box<dyn Driver>> = vec![
            Box::new(ExecDriver::new(config.exec_default_user.clone())),
            Box::new(RawExecDriver),
        ];
        let finished_dirs = existing_task_dirs(&tasks_dir);
        let mut runner = Runner {
            config,
            events,
            drivers,
            cgroups,
            journal,
            logs,
            boot_id,
            tasks_dir,
            tasks: HashMap::new(),
            by_key: HashMap::new(),
            owned_pids: HashSet::new(),
            finished,
            recent_groups,
            cgroups_to_remove,
            finished_dirs,
            cleanup_scheduled: false,
            next_id: 0,
            timers: DelayQueue::new(),
            waits: FuturesUnordered::new(),
            pipes: FuturesUnordered::new(),
            fetches: FuturesUnordered::new(),
            http: None,
            stats: SupervisorStats::default(),
            shutting_down: false,
            shutdown_waiters: Vec::new(),
        };
        // Leftover cgroups of the previous run go once their processes do.
        runner.remove_cgroups();
        Ok(runner)
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
            if self.shutting_down && self.tasks.is_empty() {
                break;
            }
            // Biased: timers first so that a flood of output or commands
            // never delays a deadline.
            tokio::select! {
                biased;
                Some(expired) = self.timers.next(), if !self.timers.is_empty() => {
                    let deadline = expired.deadline();
                    let (id, timer) = expired.into_inner();
                    self.on_timer(id, timer, deadline);
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
                Some((id, stream, fd, result)) = self.pipes.next(), if !self.pipes.is_empty() => {
                    self.on_output(id, stream, fd, result);
                }
                Some((id, result)) = self.fetches.next(), if !self.fetches.is_empty() => {
                    if let Ok(result) = result {
                        self.on_fetched(id, result);
                    }
                }
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
        let _ = self.logs.flush().await;
        if let Err(e) = self.journal.sync() {
            tracing::warn!(path = %self.journal.path().display(), error = %e, "cannot sync the journal");
        }
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
                if self.by_key.contains_key(&key) || self.finished.contains(&key) {
                    let _ = reply.send(Ok(Submit::Duplicate));
                    return;
                }
                let _ = reply.send(Ok(Submit::Accepted));
                self.begin(req);
            }
            Command::Cancel {
                uid,
                attempt,
                reason,
                done,
            } => {
                let ids: Vec<u64> = self
                    .tasks
                    .iter()
                    .filter(|(_, t)| t.uid == uid && attempt.is_none_or(|a| a == t.attempt))
                    .map(|(id, _)| *id)
                    .collect();
                for id in ids {
                    self.stop(id, StopCause::Cancelled(reason.clone()));
                }
                let _ = done.send(());
            }
            Command::Running(reply) => {
                let mut running: Vec<TaskAttempt> = self
                    .tasks
                    .values()
                    .map(|t| TaskAttempt {
                        uid: t.uid.clone(),
                        attempt: t.attempt,
                    })
                    .collect();
                running.sort_by(|a, b| (&a.uid, a.attempt).cmp(&(&b.uid, b.attempt)));
                let _ = reply.send(running);
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
        let ids: Vec<u64> = self.tasks.keys().copied().collect();
        tracing::info!(tasks = ids.len(), "supervisor shutting down");
        for id in ids {
            self.stop(id, StopCause::Shutdown);
        }
    }

    /// Validates and prepares a new task, then fetches or starts it. Every
    /// failure becomes a Finished event.
    fn begin(&mut self, req: TaskRequest) {
        let TaskRequest {
            uid,
            attempt,
            name,
            spec,
        } = req;
        if let Err(e) = validate_task_template(&spec) {
            return self.finish_early(
                uid,
                attempt,
                TaskReason::InvalidSpec,
                format!("invalid spec: {e}"),
            );
        }
        if !is_path_component(&uid) {
            return self.finish_early(
                uid,
                attempt,
                TaskReason::InvalidSpec,
                "task uid cannot name a directory".to_owned(),
            );
        }
        let Some(driver) = self.drivers.iter().position(|d| d.name() == spec.driver) else {
            let message = format!("driver {:?} is not available on this robot", spec.driver);
            return self.finish_early(uid, attempt, TaskReason::InvalidSpec, message);
        };
        let dir = self.tasks_dir.join(format!("{uid}-{attempt}"));
        if let Err(e) = make_task_dir(&dir) {
            let message = format!("cannot create task directory {}: {e}", dir.display());
            return self.finish_early(uid, attempt, TaskReason::StartFailed, message);
        }
        let prepared = match self.drivers[driver].prepare(&spec, &dir.join("work")) {
            Ok(prepared) => prepared,
            Err(e) => return self.finish_driver_error(uid, attempt, e),
        };
        let id = self.next_id;
        self.next_id += 1;
        self.journal_append(&Record::Accepted {
            uid: uid.clone(),
            attempt,
            task_dir: dir.clone(),
        });
        let artifacts = spec.artifacts.clone();
        let owner = prepared.identity.as_ref().map(|i| (i.uid, i.gid));
        let work = prepared.task_dir.clone();
        let (abort, registration) = AbortHandle::new_pair();
        let task = Task {
            timeout: timeout_of(&spec),
            kill_timeout: kill_timeout_of(&spec),
            uid: uid.clone(),
            attempt,
            name,
            dir,
            phase: Phase::Fetching {
                abort,
                pending: Box::new(Pending {
                    template: spec,
                    prepared,
                    driver,
                }),
            },
            timer: None,
            stop: None,
            stdout: None,
            stderr: None,
            tail: Tail::new(self.config.output_tail_bytes),
            cgroup: None,
            dropped_output: 0,
        };
        self.tasks.insert(id, task);
        self.by_key.insert((uid, attempt), id);
        if artifacts.is_empty() {
            return self.start(id);
        }
        let client = match &self.http {
            Some(client) => client.clone(),
            None => match artifacts::client() {
                Ok(client) => self.http.insert(client).clone(),
                Err(message) => return self.on_fetched(id, Err(message)),
            },
        };
        let limits = artifacts::Limits {
            max_bytes: self.config.artifact_max_bytes,
            timeout: self.config.artifact_timeout,
            retries: self.config.artifact_retries,
        };
        let fetch = Abortable::new(
            artifacts::fetch_all(client, artifacts, work, owner, limits),
            registration,
        );
        self.fetches.push(Box::pin(async move { (id, fetch.await) }));
    }

    fn on_fetched(&mut self, id: u64, result: Result<(), String>) {
        match result {
            Ok(()) => self.start(id),
            Err(message) => {
                tracing::warn!(id, %message, "artifact download failed");
                self.finish_unstarted(id, TaskReason::ArtifactFailed, message);
            }
        }
    }

    /// Starts a task whose artifacts are in.
    fn start(&mut self, id: u64) {
        let Some(task) = self.tasks.get_mut(&id) else {
            return;
        };
        let Phase::Fetching { pending, .. } = &task.phase else {
            return;
        };
        let name = format!("{}-{}", task.uid, task.attempt);
        let cgroup = self.cgroups.as_ref().and_then(|c| match c.create(&name) {
            Ok(cgroup) => Some(cgroup),
            Err(e) => {
                tracing::warn!(task = %name, error = %e, "cannot create the task's cgroup; killing by process group only");
                None
            }
        });
        let pipes = output::pipe().and_then(|out| Ok((out, output::pipe()?)));
        let ((stdout, stdout_w), (stderr, stderr_w)) = match pipes {
            Ok(pipes) => pipes,
            Err(e) => {
                remove_cgroup(cgroup.as_ref());
                return self.finish_unstarted(
                    id,
                    TaskReason::StartFailed,
                    format!("cannot create output pipes: {e}"),
                );
            }
        };
        let extra_env = vec![
            ("K8S4R_TASK_UID".to_owned(), task.uid.clone()),
            ("K8S4R_TASK_ATTEMPT".to_owned(), task.attempt.to_string()),
            ("K8S4R_TASK_NAME".to_owned(), task.name.clone()),
            (
                "K8S4R_TASK_DIR".to_owned(),
                pending.prepared.task_dir.display().to_string(),
            ),
        ];
        let launched = self.drivers[pending.driver].start(Launch {
            template: &pending.template,
            prepared: &pending.prepared,
            extra_env: &extra_env,
            stdout: stdout_w,
            stderr: stderr_w,
            cgroup: cgroup.as_ref(),
        });
        let launched = match launched {
            Ok(launched) => launched,
            Err(e) => {
                remove_cgroup(cgroup.as_ref());
                let reason = driver_reason(&e);
                return self.finish_unstarted(id, reason, e.to_string());
            }
        };
        let now = Instant::now();
        let at = jiff::Timestamp::now();
        let pid = launched.pid as i32;
        let started = journal::Started {
            pid,
            pgid: launched.pgid,
            pid_start: procfs::stat(pid).map(|s| s.start_time).unwrap_or(0),
            boot_id: self.boot_id.clone(),
            cgroup: cgroup.as_ref().map(|c| c.path().to_path_buf()),
            started_at: at,
        };
        let record = Record::Started {
            uid: task.uid.clone(),
            attempt: task.attempt,
            at: started.clone(),
        };
        task.phase = Phase::Running {
            pid,
            pgid: launched.pgid,
            started,
        };
        task.cgroup = cgroup;
        task.stdout = Some(stdout.clone());
        task.stderr = Some(stderr.clone());
        if let Some(timeout) = task.timeout {
            task.timer = Some(self.timers.insert_at((id, Timer::Term), now + timeout));
        }
        let event = TaskEvent::Started {
            uid: task.uid.clone(),
            attempt: task.attempt,
            pid: launched.pid,
            at,
        };
        self.logs.open(id, task.dir.join("logs"));
        self.owned_pids.insert(pid);
        let mut child = launched.child;
        self.waits.push(Box::pin(async move { (id, child.wait().await) }));
        self.pipes.push(output::read_next(id, Stream::Stdout, stdout));
        self.pipes.push(output::read_next(id, Stream::Stderr, stderr));
        self.journal_append(&record);
        let _ = self.events.send(event);
    }

    fn on_timer(&mut self, id: u64, timer: Timer, deadline: Instant) {
        if timer == Timer::Cleanup {
            self.cleanup_scheduled = false;
            return self.remove_cgroups();
        }
        let Some(task) = self.tasks.get_mut(&id) else {
            return;
        };
        task.timer = None;
        let Phase::Running { pgid, .. } = task.phase else {
            return;
        };
        match timer {
            Timer::Term => {
                if task.stop.is_none() {
                    task.stop = task.timeout.map(StopCause::Timeout);
                }
                signal_group(pgid, Signal::SIGTERM);
                self.stats
                    .sigterm_late
                    .record(Instant::now().saturating_duration_since(deadline));
                // From the deadline, not from now: lateness does not add up.
                task.timer = Some(
                    self.timers
                        .insert_at((id, Timer::Kill), deadline + task.kill_timeout),
                );
            }
            Timer::Cleanup => {}
            Timer::Kill => {
                signal_group(pgid, Signal::SIGKILL);
                self.stats
                    .sigkill_late
                    .record(Instant::now().saturating_duration_since(deadline));
                if let Some(cgroup) = &task.cgroup {
                    let _ = cgroup.kill();
                }
            }
        }
    }

    /// Cancel or shutdown: SIGTERM now, SIGKILL after the kill timeout. A
    /// task already being stopped keeps its cause and its escalation.
    fn stop(&mut self, id: u64, cause: StopCause) {
        let Some(task) = self.tasks.get_mut(&id) else {
            return;
        };
        match &task.phase {
            Phase::Fetching { abort, .. } => {
                abort.abort();
                let message = match &cause {
                    StopCause::Cancelled(why) => format!("cancelled ({why}) before it started"),
                    StopCause::Shutdown => "agent shutting down".to_owned(),
                    StopCause::Timeout(_) => "timed out".to_owned(),
                };
                self.finish_unstarted(id, TaskReason::Cancelled, message);
            }
            Phase::Running { pgid, .. } => {
                if task.stop.is_some() {
                    return;
                }
                let pgid = *pgid;
                task.stop = Some(cause);
                if let Some(key) = task.timer.take() {
                    self.timers.try_remove(&key);
                }
                signal_group(pgid, Signal::SIGTERM);
                task.timer = Some(self.timers.insert((id, Timer::Kill), task.kill_timeout));
            }
        }
    }

    fn on_exit(&mut self, id: u64, status: io::Result<ExitStatus>) {
        let Some(mut task) = self.tasks.remove(&id) else {
            return;
        };
        self.by_key.remove(&(task.uid.clone(), task.attempt));
        if let Some(key) = task.timer.take() {
            self.timers.try_remove(&key);
        }
        let Phase::Running { pid, pgid, started } = &task.phase else {
            return;
        };
        self.owned_pids.remove(pid);
        // The task is its whole process group (and cgroup): nothing of it
        // outlives its main process. Orphans come back to us as zombies.
        signal_group(*pgid, Signal::SIGKILL);
        if let Some(cgroup) = task.cgroup.take() {
            let _ = cgroup.kill();
            if cgroup.remove().is_err() {
                self.cgroups_to_remove.push(cgroup);
                self.remove_cgroups();
            }
        }
        self.recent_groups.insert(*pgid);
        for (stream, fd) in [
            (Stream::Stdout, task.stdout.take()),
            (Stream::Stderr, task.stderr.take()),
        ] {
            if let Some(fd) = fd {
                let rest = output::drain(&fd, DRAIN_MAX);
                if !rest.is_empty() {
                    task.tail.push(&rest);
                    self.logs.write(id, stream, rest);
                }
            }
        }
        self.logs.close(id);
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
        if task.dropped_output > 0 {
            tracing::warn!(uid = %task.uid, bytes = task.dropped_output, "task output dropped: log writer too slow");
        }
        let v = verdict(exit, task.stop.as_ref(), task.kill_timeout);
        let outcome = TaskOutcome {
            state: v.state,
            exit_code: v.exit_code,
            signal: v.signal,
            reason: v.reason,
            message: v.message,
            started_at: Some(started.started_at),
            finished_at: jiff::Timestamp::now(),
            output_tail: task.tail.text(),
        };
        self.end(task.uid, task.attempt, outcome);
    }

    fn on_output(&mut self, id: u64, stream: Stream, fd: PipeFd, result: io::Result<Vec<u8>>) {
        let data = match result {
            Ok(data) if !data.is_empty() => data,
            // End of file or a broken pipe: this stream is done.
            _ => return,
        };
        let Some(task) = self.tasks.get_mut(&id) else {
            // The task is over; whatever escaped it may not keep us reading.
            return;
        };
        task.tail.push(&data);
        let len = data.len() as u64;
        if !self.logs.write(id, stream, data) {
            task.dropped_output += len;
        }
        self.pipes.push(output::read_next(id, stream, fd));
    }

    fn reap_orphans(&mut self) {
        let live_groups: HashSet<i32> = self
            .tasks
            .values()
            .filter_map(|t| match t.phase {
                Phase::Running { pgid, .. } => Some(pgid),
                Phase::Fetching { .. } => None,
            })
            .collect();
        let recent = &self.recent_groups;
        reaper::reap_orphans(&self.owned_pids, |pgrp| {
            live_groups.contains(&pgrp) || recent.contains(&pgrp)
        });
        self.remove_cgroups();
    }

    /// Removes the cgroups of finished tasks once their last process is
    /// gone; retried every second while some remain.
    fn remove_cgroups(&mut self) {
        self.cgroups_to_remove
            .retain(|c| c.remove().is_err() && c.path().exists());
        if !self.cgroups_to_remove.is_empty() && !self.cleanup_scheduled {
            self.cleanup_scheduled = true;
            self.timers.insert((NO_TASK, Timer::Cleanup), CLEANUP_EVERY);
        }
    }

    /// A task that never started (bad spec, start failure, ...).
    fn finish_early(&mut self, uid: String, attempt: u32, reason: TaskReason, message: String) {
        tracing::warn!(%uid, attempt, ?reason, %message, "task not started");
        self.finished.insert((uid.clone(), attempt));
        if is_path_component(&uid) {
            self.retire_dir(uid.clone(), attempt);
        }
        let _ = self.events.send(TaskEvent::Finished {
            uid,
            attempt,
            outcome: failed_outcome(reason, message, String::new()),
        });
    }

    fn finish_driver_error(&mut self, uid: String, attempt: u32, e: DriverError) {
        let reason = driver_reason(&e);
        self.finish_early(uid, attempt, reason, e.to_string());
    }

    /// A task that has a record but no process.
    fn finish_unstarted(&mut self, id: u64, reason: TaskReason, message: String) {
        let Some(task) = self.tasks.remove(&id) else {
            return;
        };
        self.by_key.remove(&(task.uid.clone(), task.attempt));
        if reason != TaskReason::Cancelled {
            tracing::warn!(uid = %task.uid, attempt = task.attempt, ?reason, %message, "task not started");
        }
        self.end(
            task.uid,
            task.attempt,
            failed_outcome(reason, message, String::new()),
        );
    }

    fn end(&mut self, uid: String, attempt: u32, outcome: TaskOutcome) {
        self.journal_append(&Record::Ended {
            uid: uid.clone(),
            attempt,
        });
        self.finished.insert((uid.clone(), attempt));
        self.retire_dir(uid.clone(), attempt);
        let _ = self.events.send(TaskEvent::Finished {
            uid,
            attempt,
            outcome,
        });
        if self.journal.appended > COMPACT_AFTER && self.journal.appended > 4 * self.tasks.len() {
            self.compact_journal();
        }
    }

    /// Keeps the directory of a finished task among the last
    /// [`KEEP_FINISHED_DIRS`]; the oldest beyond that are deleted.
    fn retire_dir(&mut self, uid: String, attempt: u32) {
        let dir = self.tasks_dir.join(format!("{uid}-{attempt}"));
        if !dir.exists() {
            return;
        }
        self.finished_dirs.push_back(((uid, attempt), dir));
        while self.finished_dirs.len() > KEEP_FINISHED_DIRS {
            let Some((key, dir)) = self.finished_dirs.pop_front() else {
                break;
            };
            // The same attempt dispatched again runs in that directory.
            if !self.by_key.contains_key(&key) {
                self.logs.remove_dir(dir);
            }
        }
    }

    fn compact_journal(&mut self) {
        let mut live = Vec::with_capacity(self.tasks.len() * 2);
        for task in self.tasks.values() {
            live.push(Record::Accepted {
                uid: task.uid.clone(),
                attempt: task.attempt,
                task_dir: task.dir.clone(),
            });
            if let Phase::Running { started, .. } = &task.phase {
                live.push(Record::Started {
                    uid: task.uid.clone(),
                    attempt: task.attempt,
                    at: started.clone(),
                });
            }
        }
        if let Err(e) = self.journal.compact(&live) {
            tracing::warn!(path = %self.journal.path().display(), error = %e, "cannot compact the journal");
        }
    }

    fn journal_append(&mut self, record: &Record) {
        if let Err(e) = self.journal.append(record) {
            tracing::error!(path = %self.journal.path().display(), error = %e, "cannot write the journal");
        }
    }
}

fn driver_reason(e: &DriverError) -> TaskReason {
    if e.is_invalid_spec() {
        TaskReason::InvalidSpec
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

fn signal_group(pgid: i32, signal: Signal) {
    if pgid <= 1 {
        return; // never signal our own or init's group by mistake
    }
    if let Err(e) = killpg(Pid::from_raw(pgid), signal) {
        if e != nix::errno::Errno::ESRCH {
            tracing::warn!(pgid, ?signal, error = %e, "cannot signal a task's process group");
        }
    }
}

fn remove_cgroup(cgroup: Option<&TaskCgroup>) {
    if let Some(cgroup) = cgroup {
        let _ = cgroup.remove();
    }
}

/// `<dir>/work` (the task's own) and `<dir>/logs` (the agent's), fresh.
fn make_task_dir(dir: &Path) -> io::Result<()> {
    if dir.exists() {
        std::fs::remove_dir_all(dir)?;
    }
    std::fs::create_dir_all(dir.join("work"))?;
    std::fs::create_dir_all(dir.join("logs"))?;
    std::fs::set_permissions(dir, std::fs::Permissions::from_mode(0o711))?;
    std::fs::set_permissions(dir.join("logs"), std::fs::Permissions::from_mode(0o700))
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
