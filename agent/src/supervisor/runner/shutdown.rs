//! The supervisor's end: what is stopped, what is left running for the
//! next agent, and what is waited for once the loop is over.

use super::*;

impl Runner {
    /// After the loop: what containment still does is given two seconds,
    /// the rest of the housework five, then the journal is flushed and the
    /// waiters answered.
    pub(super) async fn finish_shutdown(&mut self) {
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
        let flushed = self.journal.flush();
        let _ = tokio::task::spawn_blocking(move || flushed.recv_timeout(Duration::from_secs(5))).await;
        self.health.stopped();
        for waiter in self.shutdown_waiters.drain(..) {
            let _ = waiter.send(());
        }
        // Commands still queued get their senders dropped: `Stopped`.
    }

    pub(super) fn begin_shutdown(&mut self) {
        if self.shutting_down {
            return;
        }
        self.shutting_down = true;
        let ids = self.table.ids();
        tracing::info!(tasks = ids.len(), "supervisor shutting down");
        for id in ids {
            // A running task is re-adopted by the next agent (which fences
            // it from this one's last contact); one between runs is started
            // again from the journal if it restarts on the robot; one whose
            // process is being started is left once it runs (its process
            // may be running already: `on_launched`). The rest (being
            // stopped, fetching) is stopped.
            let (leave, launching) = match self.table.get(id) {
                Some(t) if self.config.leave_tasks_running && t.stop.is_none() => match &t.phase {
                    Phase::Running(_) => (true, false),
                    Phase::Launching { stop, .. } => (false, stop.is_none()),
                    Phase::Preparing { .. } | Phase::Waiting => (t.resumable, false),
                },
                _ => (false, false),
            };
            if launching {
                continue;
            }
            if leave {
                self.leave_running(id);
            } else {
                self.stop(id, StopCause::Shutdown);
            }
        }
    }

    /// Lets go of a task as the agent stops: it keeps running (or is
    /// started again, if it was between runs) and the journal keeps it
    /// unfinished, so that the next agent re-adopts it.
    pub(super) fn leave_running(&mut self, id: u64) {
        let Some(task) = self.table.remove(id) else {
            return;
        };
        match &task.phase {
            Phase::Running(running) => {
                tracing::info!(uid = %task.uid, attempt = task.attempt, pid = running.pgid, "task left running for the next agent");
            }
            Phase::Preparing { abort } => abort.abort(),
            Phase::Launching { .. } | Phase::Waiting => {}
        }
    }
}
