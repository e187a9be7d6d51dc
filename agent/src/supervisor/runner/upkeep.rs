//! The runner's side of the components that keep the robot clean and its
//! disk in bounds: it hands their jobs to the blocking pool, arms their
//! timers and applies their verdicts (reaped orphans, swept lineages,
//! cgroups removed, tasks over their disk limit).

use super::*;

impl Runner {
    /// SIGCHLD: the orphans the tasks left are reaped off the loop.
    pub(super) fn reap(&mut self) {
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

    pub(super) fn on_contained(&mut self, done: cleanup::Done) {
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
    pub(super) fn apply(&mut self, wants: Wants) {
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
    pub(in crate::supervisor) fn schedule_measure(&mut self, after: Duration) {
        if self.disk.schedule(after) {
            self.table.schedule(Deadline::Measure, after);
        }
    }

    /// Measures the disk on the blocking pool.
    pub(super) fn measure(&mut self) {
        // Tasks with a logger have their logs rotated as they are written.
        let dirs: Vec<_> = self
            .table
            .tasks()
            .filter(|(_, t)| t.own_logs)
            .map(|(_, t)| t.dir.clone())
            .collect();
        let caps = (self.config.log_max_bytes, self.config.log_max_files);
        // The shims' records of ends reported long ago go: a record stays
        // a minute after its attempt left the table, for its end to be in
        // the journal (a record read after a crash is worth more than one
        // removed early).
        let held: std::collections::HashSet<String> = self
            .table
            .tasks()
            .map(|(_, t)| super::super::exit_status_name(&t.uid, t.attempt))
            .collect();
        let runtime = self.config.runtime_dir();
        let chores = move || {
            dirs.iter().for_each(|dir| super::ending::rotate_logs(dir, caps));
            super::super::forget_old_exit_statuses(&runtime, &held, Duration::from_secs(60));
        };
        if let Some(work) = self.disk.measure(chores) {
            self.offload_with(move || Housework::Measured(work()));
        }
    }

    /// Applies the disk rules to a measurement.
    pub(super) fn on_measured(&mut self, m: Measurement) {
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
}
