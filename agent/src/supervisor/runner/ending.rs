//! The end of an attempt on the runner: its outcome by the rules of
//! [`outcome`](crate::supervisor::outcome), its output tail, the journal's
//! record and the `Finished` event in one write, and its directory handed
//! to the disk watch to retire.

use super::*;

impl Runner {
    /// The attempt is over: its outcome by the rules, its tail (a service's
    /// from its log files, read off the loop), its end.
    pub(super) fn finish(&mut self, task: Task, exit: Exit, started_at: jiff::Timestamp) {
        let ending = Ending {
            stop: task.stop.as_ref(),
            kind: task.template.kind,
            restarts: task.restarts.as_ref().map_or(0, |b| b.count),
            dropped_output: task.dropped_output,
            disk_full: self.disk.full().map(|(free, _)| free),
        };
        let mut v = final_verdict(exit, task.kill_timeout, &ending);
        if let Some(why) = &task.pre_stop_failed {
            v.message.push_str(&format!("; its preStop {why}"));
        }
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
