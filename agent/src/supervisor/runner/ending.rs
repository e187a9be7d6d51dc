//! The end of an attempt on the runner: its outcome by the rules of
//! [`outcome`](crate::supervisor::outcome), its output tail, the journal's
//! record and the `Finished` event in one write, and its directory handed
//! to the disk watch to retire.

use super::*;

/// How long the end of a task waits for its logger to write the last of
/// its output (the logger ends once the task's processes are all gone).
const LOGGER_DRAIN: Duration = Duration::from_secs(2);

/// Rotates the log files a task wrote itself (copy and truncate).
pub(super) fn rotate_logs(dir: &std::path::Path, (max_bytes, max_files): (u64, u32)) {
    for path in crate::supervisor::disk_watch::task_logs(dir) {
        if let Err(e) = logs::rotate_shared(&path, max_bytes, max_files) {
            tracing::warn!(path = %path.display(), error = %e, "cannot rotate a task's log");
        }
    }
}

/// An ended attempt's outputs, to take into the spool.
struct Outputs {
    spool: std::sync::Arc<crate::outputs::Spool>,
    uid: String,
    attempt: u32,
    work_dir: std::path::PathBuf,
    within: Option<String>,
    outputs: Vec<k8s4r_api::output::Output>,
}

impl Outputs {
    /// An attempt's outputs in its directory `task_dir`, if its template
    /// names any.
    fn of(
        spool: &std::sync::Arc<crate::outputs::Spool>,
        uid: &str,
        attempt: u32,
        task_dir: &std::path::Path,
        template: &k8s4r_api::TaskTemplate,
    ) -> Option<Outputs> {
        (!template.outputs.is_empty()).then(|| Outputs {
            spool: spool.clone(),
            uid: uid.to_owned(),
            attempt,
            work_dir: task_dir.join("work"),
            within: template.working_dir.clone(),
            outputs: template.outputs.clone(),
        })
    }

    /// Blocking: links and reads the files.
    fn take(self) {
        let at = crate::outputs::spool::Attempt {
            uid: &self.uid,
            attempt: self.attempt,
            work_dir: &self.work_dir,
            within: self.within.as_deref(),
        };
        let outputs: Vec<&k8s4r_api::output::Output> = self.outputs.iter().collect();
        let taken = self.spool.take_attempt(at, &outputs);
        if taken > 0 {
            tracing::info!(uid = %self.uid, attempt = self.attempt, files = taken, "outputs taken for upload");
        }
    }
}

impl Runner {
    /// Attempts that ended while no agent ran (settled from the journal
    /// at start): their outputs are taken as an ended attempt's are.
    pub(crate) fn take_outputs_of_settled(
        &mut self,
        settled: Vec<(String, u32, std::path::PathBuf, k8s4r_api::TaskTemplate)>,
    ) {
        for (uid, attempt, task_dir, template) in settled {
            if let Some(outputs) = Outputs::of(&self.outputs, &uid, attempt, &task_dir, &template) {
                self.offload_with(move || {
                    outputs.take();
                    Housework::Done
                });
            }
        }
    }

    /// A task that started (or was re-adopted) with continuous outputs:
    /// its directory is looked at while it runs.
    pub(crate) fn watch_outputs(&mut self, id: u64) {
        let Some(task) = self.table.get(id) else {
            return;
        };
        let watch = crate::outputs::continuous::Watch::of(
            &task.uid,
            task.attempt,
            task.dir.join("work"),
            task.template.working_dir.clone(),
            &task.template.outputs,
        );
        if let Some(watch) = watch {
            self.outputs.watch(watch);
        }
    }

    /// The attempt is over: its outcome by the rules, its tail (from its
    /// log files, read off the loop), its end.
    pub(super) fn finish(&mut self, mut task: Task, exit: Exit, started_at: jiff::Timestamp) {
        // Its image may have become unused.
        if task.template.driver == k8s4r_api::task::DRIVER_PODMAN {
            self.collect_images();
        }
        let ending = Ending {
            stop: task.stop.as_ref(),
            kind: task.template.kind,
            restarts: task.restarts.as_ref().map_or(0, |b| b.count),
            disk_full: self.disk.full().map(|(free, _)| free),
        };
        let mut v = final_verdict(exit, task.kill_timeout, &ending);
        if let Some(why) = &task.pre_stop_failed {
            v.message.push_str(&format!("; its preStop {why}"));
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
        let (dir, max) = (task.dir.clone(), self.config.output_tail_bytes);
        let caps = (self.config.log_max_bytes, self.config.log_max_files);
        // Without a logger the task wrote its files itself: they are
        // brought within their caps now that nothing writes them.
        let rotate = task.own_logs;
        let logger = task.logger.take();
        let owned = self.containment.owned();
        let (uid, attempt) = (task.uid, task.attempt);
        self.outputs.unwatch(&uid, attempt);
        let outputs = Outputs::of(&self.outputs, &uid, attempt, &dir, &task.template);
        self.housework.push(Box::pin(async move {
            // The logger writes the last of the output once every process
            // of the task is gone; a stalled disk does not hold the end up.
            if let Some(mut logger) = logger {
                let pid = logger.id();
                if tokio::time::timeout(LOGGER_DRAIN, logger.wait()).await.is_ok() {
                    // Reaped: the pid is the kernel's to give again.
                    if let Some(pid) = pid {
                        owned.remove(pid as i32);
                    }
                }
            }
            let read = tokio::task::spawn_blocking(move || {
                let tail = logs::lossy_tail(&logs::files_tail(&dir.join("logs"), max));
                if rotate {
                    rotate_logs(&dir, caps);
                }
                // Before the end is journaled and the directory may go.
                if let Some(outputs) = outputs {
                    outputs.take();
                }
                tail
            });
            outcome.output_tail = read.await.unwrap_or_default();
            Housework::Ended {
                uid,
                attempt,
                outcome: Box::new(outcome),
                free_work,
            }
        }));
    }

    /// A task that never got a record (bad spec, refused).
    pub(super) fn finish_early(&mut self, uid: String, attempt: u32, reason: TaskReason, message: String) {
        tracing::warn!(%uid, attempt, ?reason, %message, "task not started");
        self.table.remember_finished(uid.clone(), attempt);
        self.journal.event(TaskEvent::Finished {
            uid,
            attempt,
            outcome: failed_outcome(reason, message, String::new()),
        });
    }

    /// A task that has a record but no process.
    pub(super) fn finish_unstarted(&mut self, id: u64, reason: TaskReason, message: String) {
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

    pub(super) fn end(&mut self, uid: String, attempt: u32, outcome: TaskOutcome, free_work: bool) {
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
}
