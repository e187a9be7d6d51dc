//! The runner's side of a task's health checks: a check falls due, its
//! probe runs off the loop (an exec check through the task's own driver,
//! in its cgroup), and what it found is counted; a task whose check failed
//! `failureThreshold` times in a row is stopped.

use super::*;

impl Runner {
    /// Runs health check `index` of a running task; its probe comes back
    /// as housework.
    pub(super) fn run_check(&mut self, id: u64, index: usize) {
        let Some(task) = self.table.get(id) else {
            return;
        };
        let (Phase::Running(_), None, Some(check)) = (&task.phase, &task.stop, task.checks.get(index)) else {
            return;
        };
        let as_task = || self.as_task(task);
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

    /// What a command run as `task` runs (an exec check, an exec
    /// session): its driver, spec, preparation, environment and cgroup.
    pub(super) fn as_task(&self, task: &Task) -> checks::AsTask {
        checks::AsTask {
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
        }
    }

    /// How an exec session runs inside attempt `attempt` (any, if None)
    /// of task `uid`: as [`Runner::as_task`], when it is running and not
    /// being stopped.
    pub(super) fn sandbox(&self, uid: Option<&str>, attempt: Option<u32>) -> Result<checks::AsTask, String> {
        let Some(uid) = uid else {
            // On the robot itself: raw_exec, its caller says as whom; the
            // reaper must leave the process to its waiter all the same.
            return Ok(checks::AsTask {
                launcher: Arc::new(k8s4r_drivers::RawExecDriver::with_pids_max(None)),
                template: k8s4r_api::TaskTemplate::default(),
                prepared: None,
                env: Vec::new(),
                cgroup: None,
                owned: self.containment.owned(),
            });
        };
        let ids = self.table.ids_of(uid, attempt);
        let Some(&id) = ids.first() else {
            return Err(match attempt {
                Some(a) => format!("attempt {a} of task {uid} is not on this robot"),
                None => format!("task {uid} is not on this robot"),
            });
        };
        let task = self.table.get(id).ok_or("the task has just ended")?;
        if task.stop.is_some() {
            return Err("the task is being stopped".into());
        }
        if !matches!(task.phase, Phase::Running(_)) {
            return Err("the task is not running (yet)".into());
        }
        if task.prepared.is_none() {
            return Err("the task was re-adopted by this agent and is not prepared again yet; try again after its next restart".into());
        }
        Ok(self.as_task(task))
    }

    /// A probe came back: count it, stop the task if it made it unhealthy,
    /// else check again after the interval.
    pub(super) fn on_checked(&mut self, id: u64, index: usize, pid: Option<i32>, probe: checks::Probe) {
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
}
