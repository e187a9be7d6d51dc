//! The start of a task's life on the runner: admission, preparation off
//! the loop, the launch on the blocking pool and the hand-over of the
//! process to the runner; a restart goes the same way.

use super::*;

impl Runner {
    /// Checks a new task against the spec's rules, the robot's capacity
    /// and its policy, gives it a uid and a directory, then prepares it off
    /// this thread; its id, or None when it was refused (every refusal
    /// becomes a Finished event). `resumed`: it is an attempt of the
    /// previous run, from the journal.
    pub(in crate::supervisor) fn begin(&mut self, req: TaskRequest, resumed: Option<Resumed>) -> Option<u64> {
        let TaskRequest {
            uid,
            attempt,
            name,
            spec,
            stop_after,
            config,
        } = req;
        if let (None, Some(why)) = (resumed, self.not_ready_for(&spec)) {
            self.finish_early(uid, attempt, TaskReason::NotReady, why);
            return None;
        }
        let capacity = Capacity::of(&self.table, &self.disk);
        let drivers: Vec<&str> = self.launchers.iter().map(|l| l.name()).collect();
        let admitted = match self.admission.admit(&uid, &spec, resumed, &drivers, &capacity) {
            Ok(admitted) => admitted,
            Err(Failure { reason, message }) => {
                self.finish_early(uid, attempt, reason, message);
                return None;
            }
        };
        let dir = crate::supervisor::task_dir(&self.tasks_dir, &uid, attempt);
        let launcher = Arc::clone(&self.launchers[admitted.driver]);
        let new_uid = resumed.is_none() && admitted.own_uid.is_some();
        let (abort, registration) = AbortHandle::new_pair();
        let report = config.as_ref().map(|c| k8s4r_api::protocol::ConfigReport {
            generation: c.generation,
            sources: c.sources.clone(),
            message: None,
        });
        let input = self
            .admission
            .prep_input(
                dir.clone(),
                launcher,
                spec.clone(),
                admitted.run_as,
                resumed.is_some(),
                new_uid,
            )
            .with_config(config, abort.clone());
        let new = NewTask {
            uid,
            attempt,
            name,
            dir,
            template: spec,
            driver: admitted.driver,
            own_uid: admitted.own_uid,
        };
        let mut task = Task::preparing(new, abort);
        task.config = report;
        // Started again from the journal after a reboot or an agent restart:
        // what has restarts on the robot and cannot have been replaced.
        task.resumable = stop_after.is_none() && task.restarts.is_some();
        task.stop_after = stop_after;
        if let (Some(resumed), Some(budget)) = (resumed, task.restarts.as_mut()) {
            budget.count = resumed.restarts;
            task.resumed = true;
        }
        let take_over = Box::new(journal::Resume {
            name: task.name.clone(),
            spec: task.template.clone(),
            restart: task.resumable,
            stop_after_ms: stop_after.map(|d| u64::try_from(d.as_millis()).unwrap_or(u64::MAX)),
        });
        let record = Record::Accepted {
            uid: task.uid.clone(),
            attempt,
            task_dir: task.dir.clone(),
            resume: task.resumable.then(|| take_over.clone()),
            adopt: (!task.resumable).then_some(take_over),
        };
        let id = self.table.insert(task);
        self.journal.write(Some(record), Vec::new());
        let prep = Abortable::new(prepare(input), registration);
        self.preparing.push(Box::pin(async move { (id, prep.await) }));
        self.schedule_measure(MEASURE_BUSY);
        Some(id)
    }

    pub(super) fn on_prepared(&mut self, id: u64, result: Result<Prepared, Failure>) {
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
    pub(super) fn start(&mut self, id: u64, prepared: Prepared) {
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
            shim: self
                .config
                .shim_program
                .clone()
                .map(|program| k8s4r_drivers::shim::Shim {
                    program,
                    status_file: crate::supervisor::exit_status_file(
                        &self.config.runtime_dir(),
                        &task.uid,
                        task.attempt,
                    ),
                    // The shim SIGKILLs a fenced task when the agent would
                    // have, should no agent run by then.
                    fence: task.stop_after.map(|d| d.saturating_add(task.kill_timeout)),
                }),
            log_caps: (self.config.log_max_bytes, self.config.log_max_files),
        };
        self.offload_with(move || Housework::Launched {
            id,
            result: launching::launch(job).map(Box::new),
        });
    }

    /// A process started (or could not): it is the task's from now on.
    pub(super) fn on_launched(&mut self, id: u64, result: Result<Box<Launched>, Refused>) {
        let launched = match result {
            Ok(launched) => *launched,
            Err((reason, message)) => return self.finish_unstarted(id, reason, message),
        };
        // Neither can happen (a launching task is never taken out nor
        // moved on): whatever started is not left running unsupervised.
        let Some(task) = self.table.get_mut(id) else {
            return self.abandon(launched);
        };
        let Phase::Launching { restarting, stop } = std::mem::replace(&mut task.phase, Phase::Waiting) else {
            return self.abandon(launched);
        };
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
            config: task.config.clone(),
        };
        self.table.started(id, handed.running, handed.now);
        self.watch_outputs(id);
        let exit = handed.exit;
        self.waits.push(Box::pin(async move { (id, exit.await) }));
        self.journal.write(Some(record), vec![event]);
        self.schedule_first_checks(id);
        if let Some(cause) = stop {
            self.stop(id, cause);
        } else if self.shutting_down && self.config.leave_tasks_running {
            // The agent began to stop while this process was being
            // started: it is left running for the next agent, as the
            // tasks already running were (`begin_shutdown`).
            self.leave_running(id);
        }
    }

    /// Kills a started process that no task takes, and gives its pid up.
    fn abandon(&mut self, launched: Launched) {
        launched.process.group.signal(Signal::SIGKILL);
        self.containment.owned().remove(launched.process.pid as i32);
    }

    /// Arms a running task's health checks, each after its initial delay.
    pub(in crate::supervisor) fn schedule_first_checks(&mut self, id: u64) {
        let delays: Vec<Duration> = self
            .table
            .get(id)
            .map(|t| t.checks.iter().map(|c| c.timing.initial_delay).collect())
            .unwrap_or_default();
        for (index, after) in delays.into_iter().enumerate() {
            self.table.schedule(Deadline::Check(id, index), after);
        }
    }

    /// Starts again a task that was waiting to restart; one that was never
    /// prepared in this run (re-adopted) is prepared first.
    pub(super) fn restart(&mut self, id: u64) {
        match self.table.restart_due(id) {
            Some(Some(prepared)) => self.start(id, prepared),
            Some(None) => self.prepare_again(id),
            None => {}
        }
    }

    /// Prepares a task again in its kept directory; it starts when that is
    /// done (or fails, as a start would).
    pub(super) fn prepare_again(&mut self, id: u64) {
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
}
