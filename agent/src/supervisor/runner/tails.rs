//! Running tasks' latest output, sent to the cluster as it goes: every
//! `output_tail_every`, each running task whose output changed since its
//! last report gets a status (still running) carrying the last
//! `output_tail_bytes` of it, the same tail its final status carries. The
//! server writes it to the Task's `status.outputTail`, which `k8s4r logs`
//! and the dashboard show while the robot cannot be asked (offline, cut
//! off). The files are read off the loop; a task that ended meanwhile
//! sends nothing more (its final status carries its last output).

use std::collections::hash_map::DefaultHasher;
use std::collections::HashMap;
use std::hash::{Hash, Hasher};

use super::*;

/// The round of tails: whether it is armed, and per task what was sent.
#[derive(Default)]
pub(crate) struct Tails {
    armed: bool,
    /// A hash of the tail last sent, per table id.
    sent: HashMap<u64, u64>,
}

/// One running task's tail, read off the loop.
pub(crate) struct Tail {
    id: u64,
    uid: String,
    attempt: u32,
    started: jiff::Timestamp,
    text: String,
}

fn hash_of(text: &str) -> u64 {
    let mut hasher = DefaultHasher::new();
    text.hash(&mut hasher);
    hasher.finish()
}

impl Runner {
    /// Arms the next round while the table holds a task and none is armed
    /// (a zero interval: never).
    pub(super) fn arm_tails(&mut self) {
        let every = self.config.output_tail_every;
        if every.is_zero() || self.tails.armed || self.table.is_empty() {
            return;
        }
        self.tails.armed = true;
        self.table.schedule(Deadline::Tails, every);
    }

    /// Reads the running tasks' tails on the blocking pool.
    pub(super) fn read_tails(&mut self) {
        self.tails.armed = false;
        let running: Vec<_> = self
            .table
            .tasks()
            .filter_map(|(id, t)| match &t.phase {
                Phase::Running(r) => Some((
                    id,
                    t.uid.clone(),
                    t.attempt,
                    r.started.started_at,
                    t.dir.join("logs"),
                )),
                _ => None,
            })
            .collect();
        self.tails.sent.retain(|id, _| running.iter().any(|r| r.0 == *id));
        if !running.is_empty() {
            let max = self.config.output_tail_bytes;
            self.offload_with(move || {
                let read = running
                    .into_iter()
                    .map(|(id, uid, attempt, started, logs)| Tail {
                        id,
                        uid,
                        attempt,
                        started,
                        text: logs::lossy_tail(&logs::files_tail(&logs, max)),
                    })
                    .collect();
                Housework::Tails(read)
            });
        }
        self.arm_tails();
    }

    /// Sends each tail that changed, for a task still running.
    pub(super) fn on_tails(&mut self, read: Vec<Tail>) {
        for tail in read {
            let running = self
                .table
                .get(tail.id)
                .is_some_and(|t| t.attempt == tail.attempt && matches!(t.phase, Phase::Running(_)));
            if !running || tail.text.is_empty() {
                continue;
            }
            let hash = hash_of(&tail.text);
            if self.tails.sent.insert(tail.id, hash) == Some(hash) {
                continue;
            }
            self.journal.event(TaskEvent::Output {
                uid: tail.uid,
                attempt: tail.attempt,
                started: tail.started,
                tail: tail.text,
            });
        }
    }
}
