//! What the supervisor says of itself: whether it takes tasks (and why
//! not), how many it holds, its disk use, the output it dropped. Published
//! on a watch channel, only when it changed.

use std::path::{Path, PathBuf};

use k8s4r_api::AgentHealth;
use tokio::sync::watch;

use super::disk;

/// What the health is made of.
pub(crate) struct Snapshot<'a> {
    pub shutting_down: bool,
    /// The disk is full: (free, reserve).
    pub disk_full: Option<(u64, u64)>,
    pub journal_healthy: bool,
    pub journal: &'a Path,
    pub tasks: usize,
    pub disk_used: u64,
    pub dropped_output: u64,
}

/// What the health last said, to send only changes.
type Key = (bool, &'static str, usize, u64, u64);

/// The publisher.
pub(crate) struct Health {
    tx: watch::Sender<AgentHealth>,
    key: Option<Key>,
    state_dir: PathBuf,
}

impl Health {
    /// A supervisor that takes tasks, and the channel that follows it.
    pub(crate) fn new(state_dir: PathBuf) -> (Self, watch::Receiver<AgentHealth>) {
        let (tx, rx) = watch::channel(ready(0, 0, 0));
        (
            Health {
                tx,
                key: None,
                state_dir,
            },
            rx,
        )
    }

    /// Publishes the health of `s` when it changed.
    pub(crate) fn publish(&mut self, s: &Snapshot<'_>) {
        let (accepting, reason) = if s.shutting_down {
            (false, AgentHealth::REASON_SHUTTING_DOWN)
        } else if s.disk_full.is_some() {
            (false, AgentHealth::REASON_DISK_FULL)
        } else if !s.journal_healthy {
            (false, AgentHealth::REASON_JOURNAL_FAILING)
        } else {
            (true, AgentHealth::REASON_READY)
        };
        let key = (accepting, reason, s.tasks, s.disk_used, s.dropped_output);
        if self.key == Some(key) {
            return;
        }
        self.key = Some(key);
        let mut health = ready(s.tasks, s.disk_used, s.dropped_output);
        if !accepting {
            health.accepting_tasks = false;
            health.reason = Some(reason.to_owned());
            health.message = Some(match (reason, s.disk_full) {
                (AgentHealth::REASON_DISK_FULL, Some((free, reserve))) => format!(
                    "the disk holding {} is full ({} free, {} kept for the agent)",
                    self.state_dir.display(),
                    disk::mib(free),
                    disk::mib(reserve)
                ),
                (AgentHealth::REASON_JOURNAL_FAILING, _) => format!(
                    "cannot write the journal {}: a task started now could not be settled after a crash",
                    s.journal.display()
                ),
                _ => "the agent is shutting down".to_owned(),
            });
        }
        let _ = self.tx.send(health);
    }

    /// The supervisor has stopped its tasks and ends.
    pub(crate) fn stopped(&self) {
        let _ = self.tx.send(AgentHealth {
            accepting_tasks: false,
            reason: Some(AgentHealth::REASON_SHUTTING_DOWN.to_owned()),
            message: Some("the agent has stopped its tasks".to_owned()),
            ..AgentHealth::default()
        });
    }
}

/// Health of a supervisor that takes tasks.
fn ready(tasks: usize, disk_used_bytes: u64, dropped_output_bytes: u64) -> AgentHealth {
    AgentHealth {
        accepting_tasks: true,
        reason: Some(AgentHealth::REASON_READY.to_owned()),
        message: None,
        tasks: u32::try_from(tasks).unwrap_or(u32::MAX),
        disk_used_bytes,
        dropped_output_bytes,
    }
}
