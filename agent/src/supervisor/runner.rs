//! The supervisor's event loop: the one task that owns every process.
//!
//! ```text
//!  Submit ──admission──► Preparing ──(dirs, user, artifacts: blocking pool)──► Launching
//!     │ refused              │ stop: aborted                                    │ (cgroup, fork+exec:
//!     ▼                      ▼                                                  │  blocking pool)
//!  Finished ◄──────────── Finished ◄── verdict ◄── exit ◄── Running ◄────────────┘
//!                                        │ restarts left     │ deadline: SIGTERM, then SIGKILL
//!                                        ▼                   │ stop (cancel, check, disk, shutdown)
//!                                     Waiting ──Restart──► Launching
//! ```
//!
//! The runner keeps the task table (its timers included), the processes
//! and the loop; each concern is a component that owns its state:
//! [`Admission`] (policy, uids, preparation), [`Containment`] (cgroups,
//! sweeps, reaping), [`DiskWatch`], [`Output`], the [`Journal`], [`Health`]
//! and the pure rules of [`outcome`](super::outcome). It runs on a thread
//! of its own and does nothing there that can take a millisecond: every
//! walk of /proc, fork and exec, cgroup removal, disk walk, file read or
//! write, TLS and hashing runs on the blocking pool, the journal's and the
//! log writer's threads, or the artifact fetcher's, and comes back as an
//! event. Everything a task can get wrong fails that task (a `Finished`
//! event with the reason), never the loop.

use std::io;
use std::path::PathBuf;
use std::process::ExitStatus;
use std::sync::Arc;
use std::time::Duration;

use futures::future::{AbortHandle, Abortable, Aborted};
use futures::stream::FuturesUnordered;
use futures::StreamExt;
use k8s4r_api::{TaskKind, TaskReason, TaskState};
use k8s4r_drivers::Prepared;
use nix::sys::signal::Signal;
use tokio::signal::unix::{signal, SignalKind};
use tokio::sync::{mpsc, oneshot};
use tokio::time::Instant;

use super::admission::{prepare, Admission, Capacity, Failure, Resumed};
use super::checks;
use super::cleanup::{self, Containment, UidFate, Wants};
use super::containment::Lineage;
use super::disk::Measurement;
use super::disk_watch::{self, DiskWatch, Seen, MEASURE_BUSY};
use super::health::{Health, Snapshot};
use super::journal::{self, Journal, Record};
use super::launching::{self, task_env, LaunchJob, Launched, Refused};
use super::logs::{self, Stream};
use super::outcome::{
    self, failed_outcome, final_verdict, may_restart, verdict, Ending, Exit, StopCause, Unstarted,
};
use super::output::{self, Kept, Output, PipeFd};
use super::process::{BoxFuture, Launcher};
use super::stats::SupervisorStats;
use super::table::{Deadline, NewTask, Phase, Stop, Table, Task};
use super::{Command, Submit, SupervisorConfig, SupervisorError, TaskEvent, TaskOutcome, TaskRequest};

/// A task's preparation: its id and the prepared task (or Aborted).
type Prep = BoxFuture<(u64, Result<Result<Prepared, Failure>, Aborted>)>;

/// Work done off the loop, coming back to it.
pub(crate) enum Housework {
    Measured(Measurement),
    /// A health check's probe came back (`pid`: an exec check's process,
    /// now reaped).
    Checked {
        id: u64,
        index: usize,
        pid: Option<i32>,
        probe: checks::Probe,
    },
    /// A task's process started, or could not.
    Launched {
        id: u64,
        result: Result<Box<Launched>, Refused>,
    },
    /// Containment's work came back.
    Contained(cleanup::Done),
    /// A service's end, once its output tail was read from its log files.
    Ended {
        uid: String,
        attempt: u32,
        outcome: Box<TaskOutcome>,
        free_work: bool,
    },
    Done,
}

pub(crate) struct Runner {
    pub(super) config: SupervisorConfig,
    pub(super) launchers: Vec<Arc<dyn Launcher>>,
    pub(super) table: Table,
    pub(super) admission: Admission,
    pub(super) containment: Containment,
    pub(super) disk: DiskWatch,
    pub(super) output: Output,
    pub(super) journal: Box<dyn Journal>,
    pub(super) health: Health,
    pub(super) http_checks: checks::HttpClient,
    pub(super) boot_id: String,
    pub(super) tasks_dir: PathBuf,
    pub(super) waits: FuturesUnordered<BoxFuture<(u64, io::Result<ExitStatus>)>>,
    pub(super) preparing: FuturesUnordered<Prep>,
    pub(super) housework: FuturesUnordered<BoxFuture<Housework>>,
    pub(super) stats: SupervisorStats,
    pub(super) shutting_down: bool,
    pub(super) shutdown_waiters: Vec<oneshot::Sender<()>>,
}

impl Runner {
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
            if self.shutting_down && self.table.is_empty() && !self.containment.lingering() {
                break;
            }
            if !self.journal.is_alive() || !self.output.is_alive() {
                // A bug killed a helper thread: without the journal no event
                // leaves. End, so that the agent exits and is restarted, and
                // the journal settles what runs.
                tracing::error!(
                    journal = self.journal.is_alive(),
                    logs = self.output.is_alive(),
                    "a thread of the supervisor died; the supervisor stops"
                );
                return;
            }
            self.publish_health();
            let handling = std::time::Instant::now();
            // Biased: timers first so that a flood of output or commands
            // never delays a deadline.
            let branch = tokio::select! {
                biased;
                Some((deadline, at)) = self.table.next_deadline(), if self.table.has_deadlines() => {
                    self.on_deadline(deadline, at);
                    "deadline"
                }
                Some((id, status)) = self.waits.next(), if !self.waits.is_empty() => {
                    self.on_exit(id, status);
                    "exit"
                }
                command = commands.recv(), if commands_open => {
                    match command {
                        Some(command) => self.on_command(command),
                        None => {
                            // Every handle is gone: nobody can stop these
                            // tasks any more, so stop them now.
                            commands_open = false;
                            self.begin_shutdown();
                        }
                    }
                    "command"
                }
                Some((id, result)) = self.preparing.next(), if !self.preparing.is_empty() => {
                    if let Ok(result) = result {
                        self.on_prepared(id, result);
                    }
                    "prepared"
                }
                Some((id, stream, fd, result)) = self.output.next(), if !self.output.is_empty() => {
                    self.on_output(id, stream, fd, result);
                    "output"
                }
                Some(work) = self.housework.next(), if !self.housework.is_empty() => {
                    self.on_housework(work);
                    "housework"
                }
                Some(()) = recv_signal(&mut sigchld) => {
                    self.reap();
                    "sigchld"
                }
            };
            self.stats.handled(branch, handling.elapsed());
        }
        self.finish_shutdown().await;
    }

    /// After the loop: what containment still does is given two seconds,
    /// the rest of the housework five, then the logs and the journal are
    /// flushed and the waiters answered.
    async fn finish_shutdown(&mut self) {
        self.reap();
        let give_up = Instant::now() + Duration::from_secs(2);
        while self.containment.busy() && Instant::now() < give_up {
            match tokio::time::timeout_at(give_up, self.housework.next()).await {
                Ok(Some(work)) => self.on_housework(work),
                _ => break,
            }
        }
        let _ = tokio::time::timeout(Duration::from_secs(5), async {
            while let Some(work) = self.housework.next().await {
                if let Housework::Ended {
                    uid,
                    attempt,
                    outcome,
                    free_work,
                } = work
                {
                    self.end(uid, attempt, *outcome, free_work);
                }
            }
        })
        .await;
        let _ = self.output.flush().await;
        let flushed = self.journal.flush();
        let _ = tokio::task::spawn_blocking(move || flushed.recv_timeout(Duration::from_secs(5))).await;
        self.health.stopped();
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
                if self.table.is_known(&(req.uid.clone(), req.attempt)) {
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
                && self.table.get(id).is_some_and(|t| {
                    t.template.kind == TaskKind::Service
                        && t.resumable
                        && t.stop.is_none()
                        && !matches!(t.phase, Phase::Launching { .. })
                });
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
            Phase::Launching { .. } | Phase::Waiting => {}
        }
    }

    /// Checks a new task against the spec's rules, the robot's capacity
    /// and its policy, gives it a uid and a directory, then prepares it off
    /// this thread; its id, or None when it was refused (every refusal
    /// becomes a Finished event). `resumed`: it is an attempt of the
    /// previous run, from the journal.
    pub(super) fn begin(&mut self, req: TaskRequest, resumed: Option<Resumed>) -> Option<u64> {
        let TaskRequest {
            uid,
            attempt,
            name,
            spec,
            fenced,
        } = req;
        let capacity = Capacity::of(&self.table, &self.disk);
        let drivers: Vec<&str> = self.launchers.iter().map(|l| l.name()).collect();
        let admitted = match self.admission.admit(&uid, &spec, resumed, &drivers, &capacity) {
            Ok(admitted) => admitted,
            Err(Failure { reason, message }) => {
                self.finish_early(uid, attempt, reason, message);
                return None;
            }
        };
        let dir = super::task_dir(&self.tasks_dir, &uid, attempt);
        let launcher = Arc::clone(&self.launchers[admitted.driver]);
        let new_uid = resumed.is_none() && admitted.own_uid.is_some();
        let input = self.admission.prep_input(
            dir.clone(),
            launcher,
            spec.clone(),
            admitted.run_as,
            resumed.is_some(),
            new_uid,
        );
        let (abort, registration) = AbortHandle::new_pair();
        let new = NewTask {
            uid,
            attempt,
            name,
            dir,
            template: spec,
            driver: admitted.driver,
            own_uid: admitted.own_uid,
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

    /// Starts a prepared task: its cgroup, output and process are made on
    /// the blocking pool, and come back as [`Housework::Launched`].
    fn start(&mut self, id: u64, prepared: Prepared) {
        if let Some(task) = self.table.get_mut(id).filter(|t| t.is_running()) {
            // Re-adopted: it was prepared again for its checks and restarts.
            task.prepared.get_or_insert(prepared);
            return;
        }
        if !self.table.launching(id) {
            return;
        }
        let Some(task) = self.table.get(id) else {
            return;
        };
        // A restart's cgroup is a new one: the last run's may still be
        // waiting for its processes to die.
        let restarting = matches!(task.phase, Phase::Launching { restarting: true, .. });
        let cgroup_name = match task.restarts.as_ref().filter(|_| restarting) {
            Some(budget) => format!("{}-{}-r{}", task.uid, task.attempt, budget.count + 1),
            None => format!("{}-{}", task.uid, task.attempt),
        };
        let job = LaunchJob {
            cgroup_name,
            cgroups: self.containment.cgroups(),
            service: task.template.kind == TaskKind::Service,
            logs_dir: task.dir.join("logs"),
            launcher: Arc::clone(&self.launchers[task.driver]),
            env: task_env(
                &task.uid,
                task.attempt,
                &task.name,
                &prepared.task_dir,
                &self.config.robot_id,
            ),
            template: task.template.clone(),
            prepared,
            owned: self.containment.owned(),
        };
        self.offload_with(move || Housework::Launched {
            id,
            result: launching::launch(job).map(Box::new),
        });
    }

    /// A process started (or could not): it is the task's from now on.
    fn on_launched(&mut self, id: u64, result: Result<Box<Launched>, Refused>) {
        let launched = match result {
            Ok(launched) => *launched,
            Err((reason, message)) => return self.finish_unstarted(id, reason, message),
        };
        let Some(task) = self.table.get_mut(id) else {
            // Cannot happen: a launching task is never taken out. Whatever
            // started is not left running unsupervised.
            launched.process.group.signal(Signal::SIGKILL);
            return;
        };
        let Phase::Launching { restarting, stop } = std::mem::replace(&mut task.phase, Phase::Waiting) else {
            return;
        };
        let logs_dir = task.dir.join("logs");
        let handed = launching::hand_over(task, restarting, &self.boot_id, launched);
        let record = Record::Started {
            uid: task.uid.clone(),
            attempt: task.attempt,
            at: handed.record,
        };
        let event = TaskEvent::Started {
            uid: task.uid.clone(),
            attempt: task.attempt,
            pid: handed.pid,
            at: handed.at,
            restarted: handed.restarted,
        };
        self.table.started(id, handed.running, handed.now);
        let exit = handed.exit;
        self.waits.push(Box::pin(async move { (id, exit.await) }));
        if let Some((stdout, stderr)) = handed.piped {
            self.output.attach(id, logs_dir, stdout, stderr);
        }
        self.journal.write(Some(record), vec![event]);
        self.schedule_first_checks(id);
        if let Some(cause) = stop {
            self.stop(id, cause);
        }
    }

    /// Arms a running task's health checks, each after its initial delay.
    pub(super) fn schedule_first_checks(&mut self, id: u64) {
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
                let wants = self.containment.remove_cgroups();
                return self.apply(wants);
            }
            Deadline::Sweep => {
                let table = &self.table;
                let wants = self.containment.sweep(|id| lineage_of(table, id));
                return self.apply(wants);
            }
            Deadline::Measure => return self.measure(),
            Deadline::Restart(id) => return self.restart(id),
            Deadline::Check(id, index) => return self.run_check(id, index),
            Deadline::Term(_) | Deadline::Kill(_) => {}
        }
        let Some((signal, task)) = self.table.deadline_passed(deadline, at) else {
            return;
        };
        let Phase::Running(running) = &task.phase else {
            return;
        };
        running.group.signal(signal);
        let late = Instant::now().saturating_duration_since(at);
        let has_lineage = running.lineage.is_some();
        let mut seen = Vec::new();
        if signal == Signal::SIGTERM {
            self.stats.sigterm_late.record(late);
        } else {
            self.stats.sigkill_late.record(late);
            // One write: the kernel kills the whole cgroup.
            if let Some(cgroup) = &task.cgroup {
                seen = cgroup.pids().unwrap_or_default();
                let _ = cgroup.kill();
            }
        }
        self.table.remember_pids(seen);
        if has_lineage {
            let id = match deadline {
                Deadline::Term(id) | Deadline::Kill(id) => id,
                _ => return,
            };
            let wants = self.containment.sweep_soon(id, signal);
            self.apply(wants);
        }
    }

    /// Cancel or shutdown: SIGTERM now, SIGKILL after the kill timeout. A
    /// task already being stopped keeps its cause and its escalation.
    fn stop(&mut self, id: u64, cause: StopCause) {
        let when = match self.table.stop(id, &cause, Instant::now()) {
            Stop::Unstarted(abort) => {
                abort.abort();
                Unstarted::Preparing
            }
            Stop::Waiting => Unstarted::Waiting,
            Stop::Terminate(group) => {
                group.signal(Signal::SIGTERM);
                if self.table.get(id).is_some_and(has_lineage) {
                    let wants = self.containment.sweep_soon(id, Signal::SIGTERM);
                    self.apply(wants);
                }
                return;
            }
            Stop::Nothing => return,
        };
        let (reason, message) = outcome::unstarted(&cause, when);
        self.finish_unstarted(id, reason, message);
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
        let mut seen = Vec::new();
        if let Some(cgroup) = &task.cgroup {
            seen = cgroup.pids().unwrap_or_default();
            let _ = cgroup.kill();
        }
        self.table.remember_pids(seen);
        if lineage {
            let wants = self.containment.sweep_soon(id, Signal::SIGKILL);
            self.apply(wants);
        }
    }

    fn on_exit(&mut self, id: u64, status: io::Result<ExitStatus>) {
        let Some(mut task) = self.table.remove(id) else {
            return;
        };
        let Phase::Running(running) = std::mem::replace(&mut task.phase, Phase::Waiting) else {
            return;
        };
        self.containment.owned().remove(running.pid);
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
        let restart = self.restart_after(&mut task, exit);
        // The task is its whole process group (and cgroup, or lineage):
        // nothing of it outlives its main process. Orphans come back to us
        // as zombies. A task that runs again keeps its uid.
        running.group.signal(Signal::SIGKILL);
        let mut lineage = running.lineage;
        if let (Some(lineage), Some(_)) = (lineage.as_mut(), restart) {
            // The next run has the same uid and markers: the sweep must
            // know the old run by its groups and sessions only.
            lineage.forget_identity();
        }
        let own_uid = task.own_uid.filter(|_| restart.is_none());
        let wants = self.containment.exited(task.cgroup.take(), lineage, own_uid);
        self.apply(wants);
        self.table.remember_group(running.pgid);
        let pipes = [task.stdout.take(), task.stderr.take()];
        self.output.finish(
            id,
            pipes,
            Kept {
                tail: &mut task.tail,
                dropped: &mut task.dropped_output,
            },
        );
        match restart {
            Some(wait) => self.wait_to_restart(task, exit, wait),
            None => self.finish(task, exit, running.started.started_at),
        }
    }

    /// How long until the task starts again on the robot, if it does.
    fn restart_after(&self, task: &mut Task, exit: Exit) -> Option<Duration> {
        let budget = task.restarts.as_mut()?;
        if !may_restart(task.stop.as_ref(), self.shutting_down) {
            return None;
        }
        let v = verdict(exit, task.stop.as_ref(), task.kill_timeout);
        let wait = budget.after_exit(v.state == TaskState::Completed, v.exit_code, Instant::now());
        budget.last_cause = Some(v.message);
        wait
    }

    fn wait_to_restart(&mut self, mut task: Task, exit: Exit, wait: Duration) {
        tracing::info!(
            uid = %task.uid,
            attempt = task.attempt,
            exit_code = ?exit.code,
            signal = ?exit.signal,
            wait = %k8s4r_api::duration::format_duration(wait),
            "task exited; restarting it on the robot"
        );
        task.phase = Phase::Waiting;
        self.table.wait_to_restart(task, wait);
    }

    /// The attempt is over: its outcome by the rules, its tail (a service's
    /// from its log files, read off the loop), its end.
    fn finish(&mut self, task: Task, exit: Exit, started_at: jiff::Timestamp) {
        let ending = Ending {
            stop: task.stop.as_ref(),
            kind: task.template.kind,
            restarts: task.restarts.as_ref().map_or(0, |b| b.count),
            dropped_output: task.dropped_output,
            disk_full: self.disk.full().map(|(free, _)| free),
        };
        let v = final_verdict(exit, task.kill_timeout, &ending);
        if task.dropped_output > 0 {
            tracing::warn!(uid = %task.uid, bytes = task.dropped_output, queued = self.output.queued(), "task output dropped: log writer too slow");
        }
        // What a task stopped for its disk use wrote goes at once: the disk
        // needs it back (its logs stay, they are bounded).
        let free_work = matches!(task.stop, Some(StopCause::DiskLimit(_)));
        let mut outcome = TaskOutcome {
            state: v.state,
            exit_code: v.exit_code,
            signal: v.signal,
            reason: v.reason,
            message: v.message,
            started_at: Some(started_at),
            finished_at: jiff::Timestamp::now(),
            output_tail: String::new(),
        };
        // Known finished from now: a dispatch of it again is a duplicate.
        self.table.remember_finished(task.uid.clone(), task.attempt);
        if task.template.kind != TaskKind::Service {
            outcome.output_tail = task.tail.text();
            return self.end(task.uid, task.attempt, outcome, free_work);
        }
        // A service wrote to its log files itself.
        let (logs_dir, max) = (task.dir.join("logs"), self.config.output_tail_bytes);
        let (uid, attempt) = (task.uid, task.attempt);
        self.offload_with(move || {
            outcome.output_tail = output::lossy_tail(&logs::files_tail(&logs_dir, max));
            Housework::Ended {
                uid,
                attempt,
                outcome: Box::new(outcome),
                free_work,
            }
        });
    }

    /// The attempts it holds.
    pub(crate) fn attempts(&self) -> Vec<k8s4r_api::TaskAttempt> {
        self.table.attempts()
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
        let as_task = || checks::AsTask {
            launcher: Arc::clone(&self.launchers[task.driver]),
            template: task.template.clone(),
            env: task
                .prepared
                .as_ref()
                .map(|p| {
                    task_env(
                        &task.uid,
                        task.attempt,
                        &task.name,
                        &p.task_dir,
                        &self.config.robot_id,
                    )
                })
                .unwrap_or_default(),
            prepared: task.prepared.clone(),
            cgroup: task.cgroup.clone(),
            owned: self.containment.owned(),
        };
        match checks::probe(check, &self.http_checks, as_task) {
            Some(probe) => self.housework.push(Box::pin(async move {
                let (probe, pid) = probe.await;
                Housework::Checked {
                    id,
                    index,
                    pid,
                    probe,
                }
            })),
            // Re-adopted and not prepared again yet: check next time.
            None => {
                let interval = check.timing.interval;
                self.table.schedule(Deadline::Check(id, index), interval);
            }
        }
    }

    /// A probe came back: count it, stop the task if it made it unhealthy,
    /// else check again after the interval.
    fn on_checked(&mut self, id: u64, index: usize, pid: Option<i32>, probe: checks::Probe) {
        if let Some(pid) = pid {
            self.containment.owned().remove(pid);
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
        let Some(run_as) = self.admission.rerun_as(&task.template, task.own_uid) else {
            let message = "cannot run it again: the robot's policy no longer allows it".to_owned();
            return self.finish_unstarted(id, TaskReason::NotPermitted, message);
        };
        let launcher = Arc::clone(&self.launchers[task.driver]);
        let input = self.admission.prep_input(
            task.dir.clone(),
            launcher,
            task.template.clone(),
            run_as,
            true,
            false,
        );
        self.preparing
            .push(Box::pin(async move { (id, Ok(prepare(input).await)) }));
    }

    fn on_output(&mut self, id: u64, stream: Stream, fd: PipeFd, result: io::Result<Vec<u8>>) {
        let data = match result {
            Ok(data) if !data.is_empty() => data,
            // End of file or a broken pipe: this stream is done.
            _ => return,
        };
        // The task is over: whatever escaped it may not keep us reading.
        if let Some(task) = self.table.get_mut(id) {
            let kept = Kept {
                tail: &mut task.tail,
                dropped: &mut task.dropped_output,
            };
            self.output.received(id, stream, fd, data, kept);
        }
    }

    fn on_housework(&mut self, work: Housework) {
        match work {
            Housework::Measured(m) => self.on_measured(m),
            Housework::Checked {
                id,
                index,
                pid,
                probe,
            } => self.on_checked(id, index, pid, probe),
            Housework::Launched { id, result } => self.on_launched(id, result),
            Housework::Contained(done) => self.on_contained(done),
            Housework::Ended {
                uid,
                attempt,
                outcome,
                free_work,
            } => self.end(uid, attempt, *outcome, free_work),
            Housework::Done => {}
        }
    }

    /// SIGCHLD: the orphans the tasks left are reaped off the loop.
    fn reap(&mut self) {
        let (groups, pids) = self.table.orphan_marks();
        let lineages = self
            .table
            .tasks()
            .filter_map(|(_, t)| match &t.phase {
                Phase::Running(r) => r.lineage.clone(),
                _ => None,
            })
            .collect();
        let wants = self.containment.reap(groups, pids, lineages);
        self.apply(wants);
    }

    fn on_contained(&mut self, done: cleanup::Done) {
        let follow = match &done {
            cleanup::Done::Reaped => Some(self.containment.reaped()),
            cleanup::Done::Swept { .. } => Some(true),
            cleanup::Done::CgroupsRemoved { .. } => None,
        };
        let (wants, lineages) = self.containment.done(done);
        for (id, lineage) in lineages {
            if let Some(Phase::Running(running)) = self.table.get_mut(id).map(|t| &mut t.phase) {
                running.lineage = Some(lineage);
            }
        }
        self.apply(wants);
        match follow {
            // After a sweep, what it killed is reaped.
            Some(true) => self.reap(),
            // Reaped zombies may free a cgroup.
            Some(false) => {
                let wants = self.containment.remove_cgroups();
                self.apply(wants);
            }
            None => {}
        }
    }

    /// Does what containment asks: its jobs on the blocking pool, its
    /// timers, the uids it is done with.
    fn apply(&mut self, wants: Wants) {
        for job in wants.jobs {
            self.offload_with(move || Housework::Contained(job.run()));
        }
        if let Some(after) = wants.sweep_after {
            self.table.schedule(Deadline::Sweep, after);
        }
        if let Some(after) = wants.cleanup_after {
            self.table.schedule_cleanup(after);
        }
        self.table.remember_pids(wants.seen);
        for fate in wants.uids {
            match fate {
                UidFate::Free(uid) => self.admission.release(Some(uid)),
                UidFate::Barred(uid) => self.admission.bar(uid),
            }
        }
    }

    /// Measures the disk `after` from now, unless a measurement is due
    /// sooner already.
    pub(super) fn schedule_measure(&mut self, after: Duration) {
        if self.disk.schedule(after) {
            self.table.schedule(Deadline::Measure, after);
        }
    }

    /// Measures the disk on the blocking pool.
    fn measure(&mut self) {
        let services = self
            .table
            .tasks()
            .filter(|(_, t)| t.template.kind == TaskKind::Service)
            .flat_map(|(_, t)| disk_watch::service_logs(&t.dir))
            .collect();
        if let Some(work) = self.disk.measure(services) {
            self.offload_with(move || Housework::Measured(work()));
        }
    }

    /// Applies the disk rules to a measurement.
    fn on_measured(&mut self, m: Measurement) {
        let mut seen = Vec::new();
        for (id, task) in self.table.tasks_mut() {
            task.disk_used = m.dirs.get(&task.dir).copied().unwrap_or(0);
            seen.push(Seen {
                id,
                dir: task.dir.clone(),
                running: task.is_running(),
                limit: task.disk_limit,
            });
        }
        let actions = self.disk.measured(&m, &seen, self.table.is_empty());
        for (id, why) in actions.stop {
            self.kill_now(id, StopCause::DiskLimit(why));
        }
        if !actions.remove.is_empty() {
            let remove = actions.remove;
            self.offload(move || remove.iter().for_each(|dir| disk_watch::remove_dir(dir)));
        }
        if let Some(next) = actions.next {
            self.schedule_measure(next);
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
        self.admission.release(task.own_uid);
        let outcome = failed_outcome(reason, message, String::new());
        self.end(task.uid, task.attempt, outcome, false);
    }

    fn end(&mut self, uid: String, attempt: u32, outcome: TaskOutcome, free_work: bool) {
        self.table.remember_finished(uid.clone(), attempt);
        let table = &self.table;
        let retire = self
            .disk
            .retire((uid.clone(), attempt), free_work, |key| table.holds(key));
        self.offload(retire);
        let record = Record::Ended {
            uid: uid.clone(),
            attempt,
        };
        let event = TaskEvent::Finished {
            uid,
            attempt,
            outcome,
        };
        self.journal.write(Some(record), vec![event]);
    }

    /// Runs `work` on the blocking pool at once; the loop only keeps its
    /// handle (and waits for it at shutdown).
    fn offload(&mut self, work: impl FnOnce() + Send + 'static) {
        self.offload_with(move || {
            work();
            Housework::Done
        });
    }

    /// Runs `work` on the blocking pool; what it gives comes back to the
    /// loop.
    fn offload_with(&mut self, work: impl FnOnce() -> Housework + Send + 'static) {
        let handle = tokio::task::spawn_blocking(work);
        self.housework.push(Box::pin(async move {
            handle.await.unwrap_or_else(|e| {
                tracing::error!(error = %e, "work of the supervisor failed on the blocking pool");
                Housework::Done
            })
        }));
    }

    /// Publishes the health when it changed.
    fn publish_health(&mut self) {
        let snapshot = Snapshot {
            shutting_down: self.shutting_down,
            disk_full: self.disk.full(),
            journal_healthy: self.journal.healthy(),
            journal: self.journal.path(),
            tasks: self.table.len(),
            disk_used: self.disk.used(),
            dropped_output: self.output.dropped(),
        };
        self.health.publish(&snapshot);
    }
}

/// A running task's lineage (a task without a cgroup), as it stands.
fn lineage_of(table: &Table, id: u64) -> Option<Lineage> {
    match &table.get(id)?.phase {
        Phase::Running(r) => r.lineage.clone(),
        _ => None,
    }
}

fn has_lineage(task: &Task) -> bool {
    matches!(&task.phase, Phase::Running(r) if r.lineage.is_some())
}

async fn recv_signal(signal: &mut Option<tokio::signal::unix::Signal>) -> Option<()> {
    match signal {
        Some(signal) => signal.recv().await,
        None => std::future::pending().await,
    }
}

#[cfg(test)]
mod tests;
