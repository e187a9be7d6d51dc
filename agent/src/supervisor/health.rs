//! What the supervisor says of itself: whether it takes tasks (and why
//! not), how many it holds, its disk use. Published
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
}

/// What the health last said, to send only changes.
type Key = (bool, &'static str, usize, u64);

/// The publisher.
pub(crate) struct Health {
    tx: watch::Sender<AgentHealth>,
    key: Option<Key>,
    state_dir: PathBuf,
}

impl Health {
    /// A supervisor that takes tasks, and the channel that follows it.
    pub(crate) fn new(state_dir: PathBuf) -> (Self, watch::Receiver<AgentHealth>) {
        let (tx, rx) = watch::channel(ready(0, 0));
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
        let key = (accepting, reason, s.tasks, s.disk_used);
        if self.key == Some(key) {
            return;
        }
        self.key = Some(key);
        let mut health = ready(s.tasks, s.disk_used);
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
fn ready(tasks: usize, disk_used_bytes: u64) -> AgentHealth {
    AgentHealth {
        accepting_tasks: true,
        reason: Some(AgentHealth::REASON_READY.to_owned()),
        message: None,
        tasks: u32::try_from(tasks).unwrap_or(u32::MAX),
        disk_used_bytes,
        dropped_output_bytes: 0,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const MIB: u64 = 1 << 20;

    fn snapshot(journal: &Path) -> Snapshot<'_> {
        Snapshot {
            shutting_down: false,
            disk_full: None,
            journal_healthy: true,
            journal,
            tasks: 2,
            disk_used: 300,
        }
    }

    /// The health the channel holds, if it changed since last seen.
    fn changed(rx: &mut watch::Receiver<AgentHealth>) -> Option<AgentHealth> {
        rx.has_changed().unwrap().then(|| rx.borrow_and_update().clone())
    }

    #[test]
    fn a_new_supervisor_takes_tasks_and_holds_none() {
        let (_health, rx) = Health::new(PathBuf::from("/state"));
        assert_eq!(
            *rx.borrow(),
            AgentHealth {
                accepting_tasks: true,
                reason: Some("Ready".into()),
                message: None,
                tasks: 0,
                disk_used_bytes: 0,
                dropped_output_bytes: 0,
            }
        );
    }

    #[test]
    fn the_counts_are_published_and_an_unchanged_health_is_not_sent_again() {
        let journal = PathBuf::from("/state/journal");
        let (mut health, mut rx) = Health::new(PathBuf::from("/state"));
        health.publish(&snapshot(&journal));
        let sent = changed(&mut rx).expect("published");
        assert!(sent.accepting_tasks);
        assert_eq!(sent.reason.as_deref(), Some("Ready"));
        assert_eq!((sent.tasks, sent.disk_used_bytes), (2, 300));

        health.publish(&snapshot(&journal));
        assert_eq!(changed(&mut rx), None, "nothing changed: nothing sent");

        for changed_one in [
            Snapshot {
                tasks: 3,
                ..snapshot(&journal)
            },
            Snapshot {
                disk_used: 301,
                ..snapshot(&journal)
            },
        ] {
            health.publish(&changed_one);
            let sent = changed(&mut rx).expect("a change is published");
            assert_eq!(
                (sent.tasks, sent.disk_used_bytes),
                (changed_one.tasks as u32, changed_one.disk_used)
            );
        }
    }

    #[test]
    fn shutting_down_comes_before_a_full_disk_which_comes_before_a_failing_journal() {
        let journal = PathBuf::from("/state/journal");
        let (mut health, mut rx) = Health::new(PathBuf::from("/state"));
        let everything_wrong = Snapshot {
            shutting_down: true,
            disk_full: Some((MIB, 2 * MIB)),
            journal_healthy: false,
            ..snapshot(&journal)
        };
        health.publish(&everything_wrong);
        let sent = changed(&mut rx).unwrap();
        assert!(!sent.accepting_tasks);
        assert_eq!(sent.reason.as_deref(), Some("ShuttingDown"));
        assert_eq!(sent.message.as_deref(), Some("the agent is shutting down"));
        assert_eq!(
            (sent.tasks, sent.disk_used_bytes),
            (2, 300),
            "the counts still go"
        );

        health.publish(&Snapshot {
            shutting_down: false,
            ..everything_wrong
        });
        let sent = changed(&mut rx).unwrap();
        assert_eq!(sent.reason.as_deref(), Some("DiskFull"));
        assert_eq!(
            sent.message.as_deref(),
            Some("the disk holding /state is full (1.0 MiB free, 2.0 MiB kept for the agent)")
        );

        health.publish(&Snapshot {
            journal_healthy: false,
            ..snapshot(&journal)
        });
        let sent = changed(&mut rx).unwrap();
        assert!(!sent.accepting_tasks);
        assert_eq!(sent.reason.as_deref(), Some("JournalFailing"));
        assert_eq!(
            sent.message.as_deref(),
            Some("cannot write the journal /state/journal: a task started now could not be settled after a crash")
        );

        health.publish(&snapshot(&journal));
        let sent = changed(&mut rx).unwrap();
        assert!(sent.accepting_tasks);
        assert_eq!((sent.reason.as_deref(), sent.message), (Some("Ready"), None));
    }

    #[test]
    fn a_count_beyond_u32_is_capped() {
        let journal = PathBuf::from("/state/journal");
        let (mut health, rx) = Health::new(PathBuf::from("/state"));
        health.publish(&Snapshot {
            tasks: usize::MAX,
            ..snapshot(&journal)
        });
        assert_eq!(rx.borrow().tasks, u32::MAX);
    }

    #[test]
    fn a_stopped_supervisor_takes_nothing_and_holds_nothing() {
        let journal = PathBuf::from("/state/journal");
        let (mut health, mut rx) = Health::new(PathBuf::from("/state"));
        health.publish(&snapshot(&journal));
        changed(&mut rx).unwrap();
        health.stopped();
        assert_eq!(
            changed(&mut rx),
            Some(AgentHealth {
                accepting_tasks: false,
                reason: Some("ShuttingDown".into()),
                message: Some("the agent has stopped its tasks".into()),
                tasks: 0,
                disk_used_bytes: 0,
                dropped_output_bytes: 0,
            })
        );
    }
}
