//! The supervisor's task table: one record per task it holds, found by id
//! or by (uid, attempt), each task's deadlines, and the attempts and
//! process groups of tasks recently finished. Plain state: the runner owns
//! the processes, pipes and files and asks the table what to do next.
//!
//! A task's life in the table, with what the runner sends on each step:
//!
//! ```text
//!  insert ──► Preparing ──started──► Running ──────────── exit ──► removed
//!   (dir, user,  │                 ▲  │                              ▲
//!   artifacts)   │ stop            │  ├─ timeout: escalate, Kill armed│
//!                ▼                 │  │  at the deadline + killTimeout│
//!             removed              │  ├─ stop: escalate, Kill armed at│
//!         (never started)          │  │  now + killTimeout (once)     │
//!                                  │  └─ Kill: SIGKILL ───────────────┘
//!                          Restart │     exit, restarts left (`restart`)
//!                                  └── Waiting ◄──┘   (stop: removed)
//! ```
//!
//! To escalate is to run the task's `preStop` (once per stop; the runner
//! does it) and then send its `stopSignal` (SIGTERM by default): the Kill
//! deadline stays `killTimeout` after the stop began, whatever the
//! `preStop` took, so that no stop takes longer than the fence counts.
//!
//! Deadlines come from the spec, so no arithmetic on them may panic: a
//! timer beyond the timer wheel's horizon is armed at the horizon and
//! armed again when it fires early.
//!
//! A removed task's (uid, attempt) is remembered as finished, so that a
//! redelivered dispatch of it is recognised as a duplicate.

use std::collections::{HashMap, HashSet, VecDeque};
use std::hash::Hash;
use std::path::PathBuf;
use std::time::Duration;

use futures::future::AbortHandle;
use futures::StreamExt;
use k8s4r_api::{TaskAttempt, TaskTemplate};
use k8s4r_drivers::{Prepared, TaskCgroup};
use nix::sys::signal::Signal;
use tokio::time::Instant;
use tokio_util::time::{delay_queue, DelayQueue};

use super::checks::Check;
use super::containment::Lineage;
use super::journal;
use super::outcome::StopCause;
use super::process::ProcessGroup;
use super::restarts::Budget;

/// Finished (uid, attempt)s remembered to ignore redelivered dispatches.
const REMEMBERED_FINISHED: usize = 4096;
/// Process groups of finished tasks whose orphans are still reaped.
const REMEMBERED_GROUPS: usize = 1024;
/// Processes seen in finished tasks' cgroups whose zombies are reaped.
const REMEMBERED_PIDS: usize = 8192;
/// The furthest a timer is armed ahead: tokio's timer wheel holds about
/// two years, and panics beyond. A deadline further out is armed here and
/// again when this fires.
pub(crate) const HORIZON: Duration = Duration::from_secs(365 * 24 * 3600);

/// A timer that fired.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Deadline {
    /// The task's timeout: its escalation begins (preStop, stop signal).
    Term(u64),
    /// The kill timeout after the stop began: SIGKILL.
    Kill(u64),
    /// Retry removing the cgroups that still had dying processes.
    Cleanup,
    /// Look for the processes of tasks without a cgroup, and signal them.
    Sweep,
    /// Measure the disk.
    Measure,
    /// Remove the images no task needs.
    Images,
    /// Start a task waiting to restart.
    Restart(u64),
    /// Run health check `.1` of a running task.
    Check(u64, usize),
    /// Send the output tails of running tasks that printed.
    Tails,
}

pub(crate) enum Phase {
    /// Its directory, user and artifacts are being prepared; it starts
    /// when they are.
    Preparing {
        abort: AbortHandle,
    },
    /// Its process is being started on the blocking pool (`restarting`:
    /// a restart on the robot); a stop that came meanwhile (`stop`) acts
    /// once it runs.
    Launching {
        restarting: bool,
        stop: Option<StopCause>,
    },
    Running(Box<Running>),
    /// Its process exited and it restarts on the robot when its
    /// `Restart` timer fires.
    Waiting,
}

/// A started task's process.
pub(crate) struct Running {
    pub pid: i32,
    pub pgid: i32,
    pub started: journal::Started,
    pub group: Box<dyn ProcessGroup>,
    /// Its processes, when no cgroup holds them.
    pub lineage: Option<Lineage>,
}

pub(crate) struct Task {
    pub uid: String,
    pub attempt: u32,
    pub name: String,
    pub dir: PathBuf,
    pub phase: Phase,
    /// What to run.
    pub template: TaskTemplate,
    /// Index of its launcher in the runner's list.
    pub driver: usize,
    /// The task uid it runs as, if it got one.
    pub own_uid: Option<u32>,
    /// Its `resources.disk`, in bytes.
    pub disk_limit: Option<u64>,
    /// Bytes its directory took at the last measurement.
    pub disk_used: u64,
    pub timeout: Option<Duration>,
    pub kill_timeout: Duration,
    /// The signal that asks it to stop (`stopSignal`).
    pub stop_signal: Signal,
    /// How long its `preStop` may take, when it has one.
    pub pre_stop: Option<Duration>,
    /// Its `preStop` has begun for this run (it runs once per stop).
    pub pre_stop_begun: bool,
    /// What went wrong with its `preStop`, for its status.
    pub pre_stop_failed: Option<String>,
    /// Why the supervisor is stopping it, once it is.
    pub stop: Option<StopCause>,
    pub cgroup: Option<TaskCgroup>,
    /// Its logger, while it runs (a task with one, started by this agent).
    pub logger: Option<tokio::process::Child>,
    /// It writes its log files itself (no logger): the agent rotates them.
    pub own_logs: bool,
    /// Its `stopAfter`, when the robot fences it.
    pub stop_after: Option<Duration>,
    /// Its restarts on the robot, if it has any.
    pub restarts: Option<Budget>,
    /// What its driver prepared, kept to start it again (tasks with
    /// restarts only).
    pub prepared: Option<Prepared>,
    /// It is an attempt of the previous run, started again from the
    /// journal: its first start here counts as a restart.
    pub resumed: bool,
    /// Its health checks.
    pub checks: Vec<Check>,
    /// The configuration from ConfigMaps and Secrets it runs with (what
    /// its dispatch or the last change carried), for its reports; none
    /// when it takes none, or it came from the journal and no change
    /// came since.
    pub config: Option<k8s4r_api::protocol::ConfigReport>,
    /// A change of its configuration is being written (off the loop).
    pub config_writing: bool,
    /// The newest change that came meanwhile, taken next.
    pub config_next: Option<Box<k8s4r_api::protocol::TaskConfig>>,
    /// The journal can start it again (it has restarts on the robot and
    /// no `stopAfter`): a service that may outlive the agent.
    pub resumable: bool,
    /// When its timeout is due, once it runs.
    due: Option<Instant>,
    /// The pending timer, if any (cleared when it fires).
    timer: Option<delay_queue::Key>,
}

/// What a task being prepared is.
pub(crate) struct NewTask {
    pub uid: String,
    pub attempt: u32,
    pub name: String,
    pub dir: PathBuf,
    pub template: TaskTemplate,
    pub driver: usize,
    pub own_uid: Option<u32>,
}

impl Task {
    /// A task being prepared.
    pub(crate) fn preparing(new: NewTask, abort: AbortHandle) -> Task {
        Task {
            timeout: k8s4r_api::validation::timeout_of(&new.template),
            kill_timeout: k8s4r_api::validation::kill_timeout_of(&new.template),
            stop_signal: stop_signal(&new.template),
            pre_stop: k8s4r_api::validation::pre_stop_timeout_of(&new.template),
            pre_stop_begun: false,
            pre_stop_failed: None,
            disk_limit: new.template.disk_bytes(),
            disk_used: 0,
            restarts: Budget::of(&new.template),
            checks: Check::all_of(&new.template),
            resumable: false,
            uid: new.uid,
            attempt: new.attempt,
            name: new.name,
            dir: new.dir,
            template: new.template,
            driver: new.driver,
            own_uid: new.own_uid,
            phase: Phase::Preparing { abort },
            due: None,
            timer: None,
            stop: None,
            cgroup: None,
            stop_after: None,
            logger: None,
            own_logs: false,
            prepared: None,
            resumed: false,
            config: None,
            config_writing: false,
            config_next: None,
        }
    }

    /// Its process group, when it runs.
    pub(crate) fn pgid(&self) -> Option<i32> {
        match &self.phase {
            Phase::Running(running) => Some(running.pgid),
            Phase::Preparing { .. } | Phase::Launching { .. } | Phase::Waiting => None,
        }
    }

    /// Whether its process has started.
    pub(crate) fn is_running(&self) -> bool {
        matches!(self.phase, Phase::Running(_))
    }
}

/// What stopping a task takes.
pub(crate) enum Stop {
    /// It was still being prepared: abort that; it never started.
    Unstarted(AbortHandle),
    /// Its escalation begins now (its `preStop`, then its stop signal);
    /// SIGKILL is armed for its kill timeout.
    Escalate,
    /// It was waiting to restart: it ends without running again.
    Waiting,
    /// It is already being stopped, or is not here.
    Nothing,
}

pub(crate) struct Table {
    tasks: HashMap<u64, Task>,
    by_key: HashMap<(String, u32), u64>,
    next_id: u64,
    finished: Recent<(String, u32)>,
    recent_groups: Recent<i32>,
    recent_pids: Recent<i32>,
    timers: DelayQueue<Deadline>,
}

impl Table {
    pub(crate) fn new() -> Self {
        Table {
            tasks: HashMap::new(),
            by_key: HashMap::new(),
            next_id: 0,
            finished: Recent::new(REMEMBERED_FINISHED),
            recent_groups: Recent::new(REMEMBERED_GROUPS),
            recent_pids: Recent::new(REMEMBERED_PIDS),
            timers: DelayQueue::new(),
        }
    }

    /// Whether this (uid, attempt) is held or was recently finished.
    pub(crate) fn is_known(&self, key: &(String, u32)) -> bool {
        self.by_key.contains_key(key) || self.finished.contains(key)
    }

    /// Whether this (uid, attempt) is held now.
    pub(crate) fn holds(&self, key: &(String, u32)) -> bool {
        self.by_key.contains_key(key)
    }

    /// Adds a task and returns its id.
    pub(crate) fn insert(&mut self, task: Task) -> u64 {
        let id = self.next_id;
        self.next_id += 1;
        self.by_key.insert((task.uid.clone(), task.attempt), id);
        self.tasks.insert(id, task);
        id
    }

    pub(crate) fn get_mut(&mut self, id: u64) -> Option<&mut Task> {
        self.tasks.get_mut(&id)
    }

    pub(crate) fn get(&self, id: u64) -> Option<&Task> {
        self.tasks.get(&id)
    }

    pub(crate) fn tasks_mut(&mut self) -> impl Iterator<Item = (u64, &mut Task)> {
        self.tasks.iter_mut().map(|(id, t)| (*id, t))
    }

    /// Takes a task out, its timer cancelled.
    pub(crate) fn remove(&mut self, id: u64) -> Option<Task> {
        let mut task = self.tasks.remove(&id)?;
        self.by_key.remove(&(task.uid.clone(), task.attempt));
        if let Some(key) = task.timer.take() {
            self.timers.try_remove(&key);
        }
        Some(task)
    }

    /// Remembers an attempt that is over (held or not).
    pub(crate) fn remember_finished(&mut self, uid: String, attempt: u32) {
        self.finished.insert((uid, attempt));
    }

    /// Remembers the process group of a task that is over, so that its
    /// orphans are still reaped.
    pub(crate) fn remember_group(&mut self, pgid: i32) {
        self.recent_groups.insert(pgid);
    }

    /// Remembers processes of a task (seen in its cgroup before it was
    /// killed), so that their zombies are reaped wherever they went.
    pub(crate) fn remember_pids(&mut self, pids: impl IntoIterator<Item = i32>) {
        for pid in pids {
            self.recent_pids.insert(pid);
        }
    }

    pub(crate) fn len(&self) -> usize {
        self.tasks.len()
    }

    pub(crate) fn is_empty(&self) -> bool {
        self.tasks.is_empty()
    }

    pub(crate) fn tasks(&self) -> impl Iterator<Item = (u64, &Task)> {
        self.tasks.iter().map(|(id, t)| (*id, t))
    }

    /// Every task's id.
    pub(crate) fn ids(&self) -> Vec<u64> {
        self.tasks.keys().copied().collect()
    }

    /// The ids of `uid`'s tasks: every attempt, or only `attempt`.
    pub(crate) fn ids_of(&self, uid: &str, attempt: Option<u32>) -> Vec<u64> {
        self.tasks
            .iter()
            .filter(|(_, t)| t.uid == uid && attempt.is_none_or(|a| a == t.attempt))
            .map(|(id, _)| *id)
            .collect()
    }

    /// The attempts held, in order.
    pub(crate) fn attempts(&self) -> Vec<TaskAttempt> {
        let mut attempts: Vec<TaskAttempt> = self
            .tasks
            .values()
            .map(|t| TaskAttempt::new(t.uid.clone(), t.attempt).named(Some(t.name.clone())))
            .collect();
        attempts.sort_by(|a, b| (&a.uid, a.attempt).cmp(&(&b.uid, b.attempt)));
        attempts
    }

    /// The fenced attempts it holds, each with its `stopAfter`.
    pub(crate) fn leases(&self) -> Vec<(String, u32, Duration)> {
        let mut leases: Vec<_> = self
            .tasks
            .values()
            .filter_map(|t| Some((t.uid.clone(), t.attempt, t.stop_after?)))
            .collect();
        leases.sort();
        leases
    }

    /// What marks a process as a task's, running or recently finished:
    /// its process group, or its pid (seen in a task's cgroup).
    pub(crate) fn orphan_marks(&self) -> (HashSet<i32>, HashSet<i32>) {
        let mut groups: HashSet<i32> = self.tasks.values().filter_map(Task::pgid).collect();
        groups.extend(self.recent_groups.set.iter().copied());
        (groups, self.recent_pids.set.clone())
    }

    /// A prepared (or waiting) task is being started; false if it is gone
    /// or already running.
    pub(crate) fn launching(&mut self, id: u64) -> bool {
        let Some(task) = self.tasks.get_mut(&id) else {
            return false;
        };
        let restarting = match task.phase {
            Phase::Waiting => true,
            Phase::Preparing { .. } => task.resumed,
            Phase::Launching { .. } | Phase::Running(_) => return false,
        };
        task.phase = Phase::Launching {
            restarting,
            stop: None,
        };
        true
    }

    /// A preparing task's process has started at `now`: its timeout runs
    /// from then.
    pub(crate) fn started(&mut self, id: u64, running: Running, now: Instant) {
        let Some(task) = self.tasks.get_mut(&id) else {
            return;
        };
        task.phase = Phase::Running(Box::new(running));
        if let Some(timeout) = task.timeout {
            task.due = Some(later(now, timeout));
            task.timer = Some(arm(&mut self.timers, Deadline::Term(id), now, timeout));
        }
    }

    /// A re-adopted task runs (since `ran_for` before `now`): its timeout
    /// counts from its start, so what is left of it is armed.
    pub(crate) fn adopted(&mut self, id: u64, running: Running, now: Instant, ran_for: Duration) {
        let Some(task) = self.tasks.get_mut(&id) else {
            return;
        };
        task.phase = Phase::Running(Box::new(running));
        if let Some(timeout) = task.timeout {
            let left = timeout.saturating_sub(ran_for);
            task.due = Some(later(now, left));
            task.timer = Some(arm(&mut self.timers, Deadline::Term(id), now, left));
        }
    }

    /// A task's deadline has come: SIGTERM for "escalate now" (its preStop,
    /// then its stop signal), SIGKILL for "kill its group", with the next
    /// step armed. None for a task that is gone, not running, or whose
    /// deadline lies beyond the horizon (armed again).
    pub(crate) fn deadline_passed(&mut self, deadline: Deadline, at: Instant) -> Option<(Signal, &Task)> {
        let (id, signal) = match deadline {
            Deadline::Term(id) => (id, Signal::SIGTERM),
            Deadline::Kill(id) => (id, Signal::SIGKILL),
            Deadline::Cleanup
            | Deadline::Sweep
            | Deadline::Measure
            | Deadline::Images
            | Deadline::Tails
            | Deadline::Restart(_)
            | Deadline::Check(..) => return None,
        };
        let task = self.tasks.get_mut(&id)?;
        task.timer = None;
        if !matches!(task.phase, Phase::Running(_)) {
            return None;
        }
        if signal == Signal::SIGTERM {
            if let Some(due) = task.due.filter(|due| *due > at) {
                task.timer = Some(arm(&mut self.timers, Deadline::Term(id), at, due - at));
                return None;
            }
            if task.stop.is_none() {
                task.stop = task.timeout.map(StopCause::Timeout);
            }
            // From the deadline, not from now: lateness does not add up.
            task.timer = Some(arm(&mut self.timers, Deadline::Kill(id), at, task.kill_timeout));
        }
        Some((signal, task))
    }

    /// Stops a running task at once with SIGKILL (its escalation skipped:
    /// it takes what the robot cannot spare). None if it is not running.
    pub(crate) fn kill_now(&mut self, id: u64, cause: StopCause) -> Option<&Task> {
        let task = self.tasks.get_mut(&id)?;
        if !matches!(task.phase, Phase::Running(_)) {
            return None;
        }
        if let Some(key) = task.timer.take() {
            self.timers.try_remove(&key);
        }
        if !matches!(task.stop, Some(StopCause::DiskLimit(_))) {
            task.stop = Some(cause);
        }
        Some(task)
    }

    /// Cancel or shutdown at `now`. A task already being stopped keeps its
    /// cause and its escalation.
    pub(crate) fn stop(&mut self, id: u64, cause: &StopCause, now: Instant) -> Stop {
        let Some(task) = self.tasks.get_mut(&id) else {
            return Stop::Nothing;
        };
        match &mut task.phase {
            Phase::Preparing { abort } => Stop::Unstarted(abort.clone()),
            Phase::Waiting => Stop::Waiting,
            Phase::Launching { stop, .. } => {
                stop.get_or_insert_with(|| cause.clone());
                Stop::Nothing
            }
            // A task stopped for a failed check or to take its new
            // configuration, then cancelled (or the agent stops): it ends
            // for the new reason, without a restart, on the escalation
            // already under way.
            Phase::Running(_)
                if matches!(
                    task.stop,
                    Some(StopCause::Unhealthy(_) | StopCause::ConfigChanged(_))
                ) =>
            {
                task.stop = Some(cause.clone());
                Stop::Nothing
            }
            Phase::Running(_) if task.stop.is_some() => Stop::Nothing,
            Phase::Running(_) => {
                task.stop = Some(cause.clone());
                if let Some(key) = task.timer.take() {
                    self.timers.try_remove(&key);
                }
                task.timer = Some(arm(&mut self.timers, Deadline::Kill(id), now, task.kill_timeout));
                Stop::Escalate
            }
        }
    }

    /// Puts back a task whose process exited, to start again after `wait`;
    /// returns its new id.
    pub(crate) fn wait_to_restart(&mut self, mut task: Task, wait: Duration) -> u64 {
        task.phase = Phase::Waiting;
        task.due = None;
        // The next run starts afresh: not being stopped, checks passing.
        task.stop = None;
        task.pre_stop_begun = false;
        task.pre_stop_failed = None;
        for check in &mut task.checks {
            check.reset();
        }
        let id = self.insert(task);
        let timer = self.timers.insert(Deadline::Restart(id), wait.min(HORIZON));
        if let Some(task) = self.tasks.get_mut(&id) {
            task.timer = Some(timer);
        }
        id
    }

    /// A waiting task's `Restart` timer fired: what to start it with. None
    /// for a task that is gone or no longer waiting.
    pub(crate) fn restart_due(&mut self, id: u64) -> Option<Option<Prepared>> {
        let task = self.tasks.get_mut(&id)?;
        if !matches!(task.phase, Phase::Waiting) {
            return None;
        }
        task.timer = None;
        Some(task.prepared.clone())
    }

    /// Retries the removal of leftover cgroups after `after`.
    pub(crate) fn schedule_cleanup(&mut self, after: Duration) {
        self.timers.insert(Deadline::Cleanup, after.min(HORIZON));
    }

    /// Arms a one-off timer (a sweep, a measurement) `after` from now.
    pub(crate) fn schedule(&mut self, deadline: Deadline, after: Duration) {
        self.timers.insert(deadline, after.min(HORIZON));
    }

    /// Whether any timer is pending.
    pub(crate) fn has_deadlines(&self) -> bool {
        !self.timers.is_empty()
    }

    /// The next timer to fire and when it was due. Cancel-safe.
    pub(crate) async fn next_deadline(&mut self) -> Option<(Deadline, Instant)> {
        let expired = self.timers.next().await?;
        let at = expired.deadline();
        Some((expired.into_inner(), at))
    }
}

/// The signal `template` is asked to stop with.
pub(crate) fn stop_signal(template: &TaskTemplate) -> Signal {
    let number = k8s4r_api::validation::stop_signal_of(template).number();
    Signal::try_from(number).unwrap_or(Signal::SIGTERM)
}

/// `now + after`, or the furthest instant the clock can hold.
fn later(now: Instant, after: Duration) -> Instant {
    now.checked_add(after).unwrap_or_else(|| far_future(now))
}

fn far_future(now: Instant) -> Instant {
    // Far enough for any spec (validation caps timeouts at 30 days).
    now.checked_add(Duration::from_secs(100 * 365 * 24 * 3600))
        .unwrap_or(now)
}

/// Arms `deadline` `after` from `from`, no further than the horizon.
fn arm(
    timers: &mut DelayQueue<Deadline>,
    deadline: Deadline,
    from: Instant,
    after: Duration,
) -> delay_queue::Key {
    let now = Instant::now();
    let at = later(from, after).min(later(now, HORIZON));
    timers.insert_at(deadline, at)
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

#[cfg(test)]
mod tests;
