//! The supervisor's event loop: the one task that owns every process.
//!
//! A task's life, and the component each step belongs to:
//!
//! ```text
//!            admission (policy, uids, capacity, artifact client)
//!  Submit ───────────────► Preparing ── dirs, user, artifacts: blocking pool, fetch thread
//!     │ refused                │ stop: aborted
//!     ▼                        ▼
//!  Finished ◄───────────── Finished
//!     ▲                                      launching: cgroup, pipes, fork+exec
//!     │                        Launching ◄── on the blocking pool (8 threads)
//!     │                            │ started: hand_over
//!     │ ending (outcome.rs:        ▼
//!     │ verdict, restart     ┌─ Running ──── deadlines: SIGTERM, SIGKILL (runner)
//!     │ and message rules)   │     │         checks: probes off the loop (checking)
//!     └──── exit ◄───────────┘     │         disk_watch: measure, kill over the limit
//!             │ restarts left      │         stop: cancel, check, disk, shutdown
//!             ▼                    │
//!          Waiting ──restart──► Launching
//!
//!  after every exit: cleanup (cgroups removed, lineages swept, orphans
//!  reaped: blocking jobs) · the journal (record + event, one write, its
//!  own thread). Tasks write their output to their log files themselves.
//! ```
//!
//! The runner keeps only the loop, the task table (its timers included)
//! and the processes (it alone signals them). Each concern is a component
//! that owns its state and answers the lifecycle's events:
//! [`Admission`], [`Containment`] (cleanup.rs), [`DiskWatch`],
//! the [`Journal`], [`Health`], the restart [`Budget`](super::restarts::Budget)
//! and the pure rules of [`outcome`](super::outcome). The runner's side of
//! each lives in a child module: `starting` (admission to hand-over),
//! `checking`, `ending`, `upkeep` (cleanup and disk) and `shutdown`.
//!
//! Nothing on its thread can take a millisecond: every walk of /proc,
//! fork and exec, cgroup removal, disk walk, file read or write, TLS and
//! hashing runs on the blocking pool, the journal's and the log writer's
//! threads, or the artifact fetcher's, and comes back as an event. What a
//! handler took is counted per branch of the loop
//! ([`SupervisorStats::handlers`]). Everything a task can get wrong fails
//! that task (a `Finished` event with the reason), never the loop.

use std::io;
use std::path::PathBuf;
use std::process::ExitStatus;
use std::sync::Arc;
use std::time::Duration;

use futures::future::{AbortHandle, Abortable, Aborted};
use futures::stream::FuturesUnordered;
use futures::StreamExt;
use k8s4r_api::{TaskReason, TaskState};
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
use super::logs;
use super::outcome::{
    self, failed_outcome, final_verdict, may_restart, verdict, Ending, Exit, StopCause, Unstarted,
};
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
    /// A task's `preStop` ended (`pid`: its process, now reaped).
    PreStopped {
        id: u64,
        pid: Option<i32>,
        result: Result<(), String>,
    },
    /// A task's end, once its output tail was read from its log files.
    Ended {
        uid: String,
        attempt: u32,
        outcome: Box<TaskOutcome>,
        free_work: bool,
    },
    /// Running tasks' output tails, read.
    Tails(Vec<tails::Tail>),
    /// A running attempt's changed configuration, written (or not).
    Reconfigured {
        uid: String,
        attempt: u32,
        report: k8s4r_api::protocol::ConfigReport,
        applied: super::task_config::Applied,
    },
    /// A collection of unused images is done.
    ImagesCollected(k8s4r_drivers::podman::images::Collected),
    Done,
}

pub(crate) struct Runner {
    pub(super) config: SupervisorConfig,
    pub(super) launchers: Vec<Arc<dyn Launcher>>,
    pub(super) table: Table,
    pub(super) admission: Admission,
    pub(super) containment: Containment,
    pub(super) disk: DiskWatch,
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
    /// The robot's facts, once its agent has read them.
    pub(super) facts: Option<k8s4r_api::Facts>,
    /// Running tasks' output tails sent as they go.
    pub(super) tails: tails::Tails,
    /// Task outputs taken at the end of their attempts.
    pub(crate) outputs: Arc<crate::outputs::Spool>,
    /// The removal of unused images.
    pub(super) images: images::ImageCollection,
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
            if self.a_helper_died() {
                return;
            }
            self.publish_health();
            self.arm_tails();
            // Biased: timers first so that a flood of output or commands
            // never delays a deadline. Each arm notes when its handling
            // began (the wait before it is not the handler's).
            let now = std::time::Instant::now;
            let (branch, handling) = tokio::select! {
                biased;
                Some((deadline, at)) = self.table.next_deadline(), if self.table.has_deadlines() => {
                    let handling = now();
                    self.on_deadline(deadline, at);
                    ("deadline", handling)
                }
                Some((id, status)) = self.waits.next(), if !self.waits.is_empty() => {
                    let handling = now();
                    self.on_exit(id, status);
                    ("exit", handling)
                }
                command = commands.recv(), if commands_open => {
                    let handling = now();
                    match command {
                        Some(command) => self.on_command(command),
                        None => {
                            // Every handle is gone: nobody can stop these
                            // tasks any more, so stop them now.
                            commands_open = false;
                            self.begin_shutdown();
                        }
                    }
                    ("command", handling)
                }
                Some((id, result)) = self.preparing.next(), if !self.preparing.is_empty() => {
                    let handling = now();
                    if let Ok(result) = result {
                        self.on_prepared(id, result);
                    }
                    ("prepared", handling)
                }
                Some(work) = self.housework.next(), if !self.housework.is_empty() => {
                    let handling = now();
                    self.on_housework(work);
                    ("housework", handling)
                }
                Some(()) = recv_signal(&mut sigchld) => {
                    let handling = now();
                    self.reap();
                    ("sigchld", handling)
                }
            };
            self.stats.handled(branch, handling.elapsed());
        }
        self.finish_shutdown().await;
    }

    /// Whether a bug killed a helper thread: without the journal no event
    /// leaves. The loop then ends, so that the agent exits and is
    /// restarted, and the journal settles what runs.
    fn a_helper_died(&self) -> bool {
        let died = !self.journal.is_alive();
        if died {
            tracing::error!("the journal's thread died; the supervisor stops");
        }
        died
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
                cause,
                done,
            } => {
                for id in self.table.ids_of(&uid, attempt) {
                    self.stop(id, cause.clone());
                }
                let _ = done.send(());
            }
            Command::Running(reply) => {
                let _ = reply.send(self.table.attempts());
            }
            Command::Sandbox { uid, attempt, reply } => {
                let _ = reply.send(self.sandbox(uid.as_deref(), attempt));
            }
            Command::Stats(reply) => {
                let _ = reply.send(self.stats.clone());
            }
            Command::Shutdown(done) => {
                self.shutdown_waiters.push(done);
                self.begin_shutdown();
            }
            Command::Facts(facts) => self.on_facts(facts),
            Command::Reconfigure { uid, attempt, config } => self.reconfigure(uid, attempt, *config),
        }
    }

    fn on_deadline(&mut self, deadline: Deadline, at: Instant) {
        match deadline {
            Deadline::Cleanup => {
                let wants = self.containment.cleanup_due();
                return self.apply(wants);
            }
            Deadline::Sweep => {
                let table = &self.table;
                let wants = self.containment.sweep(|id| lineage_of(table, id));
                return self.apply(wants);
            }
            Deadline::Measure => return self.measure(),
            Deadline::Images => return self.collect_images(),
            Deadline::Tails => return self.read_tails(),
            Deadline::Restart(id) => return self.restart(id),
            Deadline::Check(id, index) => return self.run_check(id, index),
            Deadline::Term(_) | Deadline::Kill(_) => {}
        }
        let Some((signal, task)) = self.table.deadline_passed(deadline, at) else {
            return;
        };
        let late = Instant::now().saturating_duration_since(at);
        let (Deadline::Term(id) | Deadline::Kill(id)) = deadline else {
            return;
        };
        if signal == Signal::SIGTERM {
            // The timeout: the escalation begins (preStop, stop signal).
            self.stats.sigterm_late.record(late);
            return self.escalate(id);
        }
        if task.is_running() {
            self.stats.sigkill_late.record(late);
            self.kill_group(id);
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
        // as zombies. A task that runs again keeps its uid. A container's
        // runtime (podman's conmon) is killed with the rest: the driver
        // removes what it leaves.
        running.group.signal(Signal::SIGKILL);
        self.launchers[task.driver].kill_beyond_group(&task.dir.join("work"));
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
        if let Some(StopCause::ConfigChanged(why)) = &task.stop {
            // Asked for: at once, using none of the restarts.
            return Some(budget.requested(exit.code, format!("its configuration changed ({why})")));
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

    /// The attempts it holds.
    pub(crate) fn attempts(&self) -> Vec<k8s4r_api::TaskAttempt> {
        self.table.attempts()
    }

    /// The fenced attempts it holds, with their `stopAfter`.
    pub(crate) fn leases(&self) -> Vec<(String, u32, Duration)> {
        self.table.leases()
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
            Housework::PreStopped { id, pid, result } => self.on_pre_stopped(id, pid, result),
            Housework::Ended {
                uid,
                attempt,
                outcome,
                free_work,
            } => self.end(uid, attempt, *outcome, free_work),
            Housework::Tails(read) => self.on_tails(read),
            Housework::Reconfigured {
                uid,
                attempt,
                report,
                applied,
            } => self.on_reconfigured(uid, attempt, report, applied),
            Housework::ImagesCollected(collected) => self.on_images_collected(collected),
            Housework::Done => {}
        }
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

async fn recv_signal(signal: &mut Option<tokio::signal::unix::Signal>) -> Option<()> {
    match signal {
        Some(signal) => signal.recv().await,
        None => std::future::pending().await,
    }
}

mod checking;
mod conditions;
mod ending;
mod images;
mod reconfiguring;
mod shutdown;
mod starting;
mod stopping;
mod tails;
#[cfg(test)]
mod tests;
mod upkeep;
