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
