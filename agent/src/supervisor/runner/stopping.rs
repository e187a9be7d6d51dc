//! The runner's side of stopping a task. Every stop but the disk's
//! escalates: the task's `preStop` (once per stop, off the loop), then its
//! `stopSignal` to its process group, then SIGKILL to everything left
//! `killTimeout` after the stop began (the table arms that deadline, and
//! a `preStop` never moves it). The disk cannot wait: it kills at once.

use super::*;
use crate::supervisor::prestop::{self, ENV_STOP_REASON};

impl Runner {
    /// Stops a task for `cause`: its escalation begins now. A task already
    /// being stopped keeps its cause and its escalation.
    pub(super) fn stop(&mut self, id: u64, cause: StopCause) {
        let when = match self.table.stop(id, &cause, Instant::now()) {
            Stop::Unstarted(abort) => {
                abort.abort();
                Unstarted::Preparing
            }
            Stop::Waiting => Unstarted::Waiting,
            Stop::Escalate => return self.escalate(id),
            Stop::Nothing => return,
        };
        let (reason, message) = outcome::unstarted(&cause, when);
        self.finish_unstarted(id, reason, message);
    }

    /// The next step of a stopping task: its `preStop` if it has one that
    /// has not begun, else its stop signal.
    pub(super) fn escalate(&mut self, id: u64) {
        let Some(task) = self.table.get_mut(id) else {
            return;
        };
        let Some(timeout) = task
            .pre_stop
            .filter(|_| !task.pre_stop_begun && task.is_running())
        else {
            return self.signal_stop(id);
        };
        task.pre_stop_begun = true;
        let Some((as_task, logs_dir)) = self.pre_stop_of(id) else {
            // Re-adopted and not prepared again in this run: nothing to
            // run it with.
            if let Some(task) = self.table.get_mut(id) {
                task.pre_stop_failed =
                    Some("not run: the task was re-adopted after an agent restart".to_owned());
            }
            return self.signal_stop(id);
        };
        self.housework.push(Box::pin(async move {
            let (pid, result) = prestop::run(as_task, logs_dir, timeout).await;
            Housework::PreStopped { id, pid, result }
        }));
    }

    /// What a task's `preStop` runs as, and where its output goes.
    fn pre_stop_of(&self, id: u64) -> Option<(checks::AsTask, PathBuf)> {
        let task = self.table.get(id)?;
        let prepared = task.prepared.clone()?;
        let template = prestop::template_of(&task.template)?;
        let mut env = task_env(
            &task.uid,
            task.attempt,
            &task.name,
            &prepared.task_dir,
            &self.config.robot_id,
        );
        let reason = task.stop.as_ref().map_or("Cancelled", StopCause::env_name);
        env.push((ENV_STOP_REASON.to_owned(), reason.to_owned()));
        let as_task = checks::AsTask {
            launcher: Arc::clone(&self.launchers[task.driver]),
            template,
            prepared: Some(prepared),
            env,
            cgroup: task.cgroup.clone(),
            owned: self.containment.owned(),
        };
        Some((as_task, task.dir.join("logs")))
    }

    /// A task's `preStop` ended: its stop signal goes now (unless the task
    /// ended meanwhile, or its kill timeout came first).
    pub(super) fn on_pre_stopped(&mut self, id: u64, pid: Option<i32>, result: Result<(), String>) {
        if let Some(pid) = pid {
            self.containment.owned().remove(pid);
        }
        let Some(task) = self.table.get_mut(id) else {
            return;
        };
        match result {
            Ok(()) => tracing::info!(uid = %task.uid, attempt = task.attempt, "preStop done"),
            Err(why) => {
                tracing::warn!(uid = %task.uid, attempt = task.attempt, %why, "preStop failed; stopping the task anyway");
                task.pre_stop_failed = Some(why);
            }
        }
        self.signal_stop(id);
    }

    /// Sends a running task's stop signal to its process group (and to
    /// what left it, for a task without a cgroup).
    fn signal_stop(&mut self, id: u64) {
        let Some(task) = self.table.get(id) else {
            return;
        };
        let Phase::Running(running) = &task.phase else {
            return;
        };
        let signal = task.stop_signal;
        running.group.signal(signal);
        if running.lineage.is_some() {
            let wants = self.containment.sweep_soon(id, signal);
            self.apply(wants);
        }
    }

    /// Kills a running task at once (the disk cannot wait for its kill
    /// timeout).
    pub(super) fn kill_now(&mut self, id: u64, cause: StopCause) {
        let Some(task) = self.table.kill_now(id, cause) else {
            return;
        };
        tracing::warn!(uid = %task.uid, attempt = task.attempt, "stopping a task for its disk use");
        self.kill_group(id);
    }

    /// SIGKILL to a running task's group, its cgroup (one write: the
    /// kernel kills it whole) and what left them.
    pub(super) fn kill_group(&mut self, id: u64) {
        let Some(task) = self.table.get(id) else {
            return;
        };
        let Phase::Running(running) = &task.phase else {
            return;
        };
        running.group.signal(Signal::SIGKILL);
        self.launchers[task.driver].kill_beyond_group(&task.dir.join("work"));
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
}
