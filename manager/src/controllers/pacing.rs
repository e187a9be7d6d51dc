//! Writes that only report progress, paced: at most one per object per
//! interval. A Robot's `allocated` follows every task placed on it, and a
//! TaskGroup's or Job's counts follow every Task that changes state; while
//! a large group is placed, written each time they were most of the
//! manager's writes. Kubernetes' own Job controller batches its Pod
//! updates for a second the same way. A write that carries more than
//! progress (a state, a condition) is never held back.

use std::collections::HashMap;
use std::sync::Mutex;
use std::time::{Duration, Instant};

use k8s4r_api::{GroupSummary, JobStatus, Rollout, TaskCounts, TaskGroupStatus};

use k8s4r_service::lock;

/// Objects remembered before the ones written longer than an interval ago
/// are forgotten (they may be written at once anyway); after that, twice
/// as many as were kept, so that a busy fleet does not scan them per write.
const PRUNE_AT: usize = 4_096;

/// When each object's progress was last written.
#[derive(Debug)]
pub struct Pacer {
    interval: Duration,
    written: Mutex<Written>,
}

#[derive(Debug)]
struct Written {
    at: HashMap<String, Instant>,
    prune_at: usize,
}

impl Pacer {
    /// At most one progress write per object per `interval`.
    pub fn new(interval: Duration) -> Self {
        Pacer {
            interval,
            written: Mutex::new(Written {
                at: HashMap::new(),
                prune_at: PRUNE_AT,
            }),
        }
    }

    /// `None` when object `key` may be written now (and then it is taken as
    /// written); else how long until it may. An `urgent` write (it carries
    /// more than progress) may always go.
    pub fn due(&self, key: &str, urgent: bool) -> Option<Duration> {
        let now = Instant::now();
        let mut written = lock(&self.written);
        let wait = written
            .at
            .get(key)
            .map(|at| self.interval.saturating_sub(now.duration_since(*at)))
            .filter(|wait| !wait.is_zero() && !urgent);
        if wait.is_none() {
            if written.at.len() >= written.prune_at {
                written.at.retain(|_, at| now.duration_since(*at) < self.interval);
                written.prune_at = PRUNE_AT.max(2 * written.at.len());
            }
            written.at.insert(key.to_owned(), now);
        }
        wait
    }
}

/// Whether TaskGroup status `new` differs from `old` only in progress: its
/// counts, completions, the robots its tasks are on, an everyRobot
/// rollout's tallies.
pub fn group_progress_only(old: &TaskGroupStatus, new: &TaskGroupStatus) -> bool {
    without_group_progress(old) == without_group_progress(new)
}

fn without_group_progress(s: &TaskGroupStatus) -> TaskGroupStatus {
    TaskGroupStatus {
        completions: None,
        counts: TaskCounts::default(),
        robots: Vec::new(),
        rollout: s.rollout.as_ref().map(|r| Rollout {
            stopped: r.stopped.clone(),
            ..Rollout::default()
        }),
        ..s.clone()
    }
}

/// Whether Job status `new` differs from `old` only in progress: its
/// counts and completions, and its groups' counts.
pub fn job_progress_only(old: &JobStatus, new: &JobStatus) -> bool {
    without_job_progress(old) == without_job_progress(new)
}

fn without_job_progress(s: &JobStatus) -> JobStatus {
    JobStatus {
        completions: None,
        counts: TaskCounts::default(),
        groups: s
            .groups
            .iter()
            .map(|g| GroupSummary {
                counts: TaskCounts::default(),
                ..g.clone()
            })
            .collect(),
        ..s.clone()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use k8s4r_api::WorkState;

    #[test]
    fn counts_are_progress_and_a_state_is_not() {
        let old = TaskGroupStatus {
            state: Some(WorkState::Running),
            completions: Some("1/3".into()),
            ..TaskGroupStatus::default()
        };
        let mut new = old.clone();
        new.completions = Some("2/3".into());
        new.counts.completed = 2;
        new.robots = vec!["r1".into()];
        assert!(group_progress_only(&old, &new));
        new.state = Some(WorkState::Completed);
        assert!(!group_progress_only(&old, &new));

        let old = JobStatus {
            groups: vec![GroupSummary {
                name: "g".into(),
                state: Some(WorkState::Running),
                ..GroupSummary::default()
            }],
            ..JobStatus::default()
        };
        let mut new = old.clone();
        new.counts.running = 1;
        new.groups[0].counts.running = 1;
        assert!(job_progress_only(&old, &new));
        new.groups[0].state = Some(WorkState::Failed);
        assert!(!job_progress_only(&old, &new));
    }

    #[test]
    fn progress_waits_out_the_interval_and_urgent_writes_do_not() {
        let pacer = Pacer::new(Duration::from_secs(60));
        assert_eq!(pacer.due("ns/a", false), None, "the first write goes");
        let wait = pacer.due("ns/a", false).expect("held back");
        assert!(wait > Duration::from_secs(59) && wait <= Duration::from_secs(60));
        assert_eq!(pacer.due("ns/b", false), None, "per object");
        assert_eq!(pacer.due("ns/a", true), None, "urgent");
        assert!(pacer.due("ns/a", false).is_some(), "the urgent write counts");
    }

    #[test]
    fn an_interval_of_zero_holds_nothing_back() {
        let pacer = Pacer::new(Duration::ZERO);
        assert_eq!(pacer.due("ns/a", false), None);
        assert_eq!(pacer.due("ns/a", false), None);
    }

    #[test]
    fn objects_written_long_ago_are_forgotten() {
        let pacer = Pacer::new(Duration::ZERO);
        for i in 0..PRUNE_AT + 10 {
            pacer.due(&format!("ns/{i}"), false);
        }
        assert!(lock(&pacer.written).at.len() <= 11, "pruned once full");
    }
}
