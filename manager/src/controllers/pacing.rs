//! Writes that only report progress, paced: at most one per object per
//! interval, counted from the object's creation (for one younger than the
//! interval, from when the manager first saw it). A Robot's `allocated`
//! follows every task placed on it, and a TaskGroup's or Job's counts
//! follow every Task that changes state; while a large group is placed,
//! written each time they were most of the manager's writes. Kubernetes'
//! own Job controller batches its Pod updates for a second the same way.
//!
//! For a TaskGroup or a Job, progress is everything but news: news is a
//! change of its state to an end or back from one (each written once, at
//! once), a person's cancel or retry acted on, a deadline that ran out, an
//! everyRobot rollout that stopped. The rest (counts, conditions that say
//! "not yet", a first status that only says `pending`, and the steps
//! between `pending` and `running`, a task placed or one waiting for its
//! retry) waits for the object's turn, as Kubernetes' Job
//! controller holds its Job's `active` count for a second. So a Job whose
//! task is placed within a second of its creation never writes `pending`,
//! and one whose task also ends within that second never writes `running`
//! (docs/contract.md, "What a task costs"). A young object's turn is
//! counted from when the manager first saw it, not from its creation time,
//! which is in whole seconds; and a Job that would say only `pending`
//! waits while a group of it has its first status on the way.

use std::collections::HashMap;
use std::sync::Mutex;
use std::time::{Duration, Instant};

use k8s4r_api::{JobStatus, Rollout, TaskCounts, TaskGroupStatus, WorkState};

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
    /// more than progress) may always go. An object not written yet counts
    /// as written at its creation, `age` ago; one younger than the interval
    /// (and a second, as creation times are in whole seconds: an object
    /// created late in one has an age of up to a second as soon as it
    /// exists) as written when first asked about.
    pub fn due(&self, key: &str, urgent: bool, age: Duration) -> Option<Duration> {
        let now = Instant::now();
        let mut written = lock(&self.written);
        let since = match written.at.get(key) {
            Some(at) => now.duration_since(*at),
            None if age < self.interval.saturating_add(CREATION_GRAIN) && !urgent => {
                written.at.insert(key.to_owned(), now);
                Duration::ZERO
            }
            None => age,
        };
        let wait = Some(self.interval.saturating_sub(since)).filter(|wait| !wait.is_zero() && !urgent);
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

/// How much an age read from a creation time may exceed the object's true
/// age: creation times are in whole seconds.
const CREATION_GRAIN: Duration = Duration::from_secs(1);

/// Whether the state in `new` is news against `old`'s (none: the status
/// was never written): a change to or from an end, and a first state that
/// is one. Steps between `pending` and `running` (a task placed, or one
/// waiting for its retry) are progress.
fn state_news(old: Option<Option<WorkState>>, new: Option<WorkState>) -> bool {
    let under_way = |s: Option<WorkState>| matches!(s, None | Some(WorkState::Pending | WorkState::Running));
    match old {
        Some(old) => old != new && !(under_way(old) && under_way(new)),
        None => !under_way(new),
    }
}

/// Whether a Job's status that says only `pending`, and only progress,
/// should wait for a group of it whose state is `group` and which was
/// created `age` ago: one that has written no state yet has its first
/// status on its way (within the interval from when the manager first saw
/// it, and a second, as creation times are in whole seconds), and that
/// status, `running` most likely, would outdate the Job's at once.
pub fn awaits_group(group: Option<WorkState>, age: Duration, interval: Duration) -> bool {
    group.is_none() && age < interval.saturating_mul(2).saturating_add(CREATION_GRAIN)
}

/// Whether TaskGroup status `new` differs from `old` (none: never written)
/// only in progress (see the module's doc).
pub fn group_progress_only(old: Option<&TaskGroupStatus>, new: &TaskGroupStatus) -> bool {
    let news = state_news(old.map(|o| o.state), new.state);
    let old = old.cloned().unwrap_or_default();
    !news && without_group_progress(&old) == without_group_progress(new)
}

fn without_group_progress(s: &TaskGroupStatus) -> TaskGroupStatus {
    TaskGroupStatus {
        state: None,
        completions: None,
        counts: TaskCounts::default(),
        robots: Vec::new(),
        desired: None,
        rollout: s.rollout.as_ref().map(|r| Rollout {
            stopped: r.stopped.clone(),
            ..Rollout::default()
        }),
        observed_generation: None,
        conditions: Vec::new(),
        ..s.clone()
    }
}

/// Whether Job status `new` differs from `old` (none: never written) only
/// in progress (see the module's doc).
pub fn job_progress_only(old: Option<&JobStatus>, new: &JobStatus) -> bool {
    let news = state_news(old.map(|o| o.state), new.state);
    let old = old.cloned().unwrap_or_default();
    !news && without_job_progress(&old) == without_job_progress(new)
}

fn without_job_progress(s: &JobStatus) -> JobStatus {
    JobStatus {
        state: None,
        completions: None,
        counts: TaskCounts::default(),
        groups: Vec::new(),
        start_time: None,
        observed_generation: None,
        conditions: Vec::new(),
        ..s.clone()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use k8s4r_api::GroupSummary;

    const NEW: Duration = Duration::ZERO;
    const OLD: Duration = Duration::MAX;

    #[test]
    fn counts_are_progress_and_a_change_of_state_is_not() {
        let old = TaskGroupStatus {
            state: Some(WorkState::Running),
            completions: Some("1/3".into()),
            ..TaskGroupStatus::default()
        };
        let mut new = old.clone();
        new.completions = Some("2/3".into());
        new.counts.completed = 2;
        new.robots = vec!["r1".into()];
        assert!(group_progress_only(Some(&old), &new));
        new.state = Some(WorkState::Completed);
        assert!(!group_progress_only(Some(&old), &new));
        assert!(!group_progress_only(None, &new), "finished at its first write");
        new.state = Some(WorkState::Pending);
        assert!(group_progress_only(None, &new), "the first pending is progress");
        new.state = Some(WorkState::Running);
        assert!(group_progress_only(None, &new), "a first running waits its turn");
        let pending = TaskGroupStatus {
            state: Some(WorkState::Pending),
            ..TaskGroupStatus::default()
        };
        assert!(
            group_progress_only(Some(&pending), &old),
            "pending to running waits"
        );
        let mut back = pending.clone();
        back.completions = old.completions.clone();
        assert!(
            group_progress_only(Some(&old), &back),
            "running back to pending (a retry's wait) waits too"
        );
        let reopened = TaskGroupStatus {
            state: Some(WorkState::Failed),
            ..TaskGroupStatus::default()
        };
        assert!(!group_progress_only(Some(&reopened), &old), "a retry reopens it");
        new.rollout = Some(Rollout {
            stopped: Some("a robot failed".into()),
            ..Rollout::default()
        });
        assert!(!group_progress_only(Some(&old), &new), "a stopped rollout");

        let old = JobStatus {
            state: Some(WorkState::Running),
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
        assert!(job_progress_only(Some(&old), &new));
        new.groups[0].state = Some(WorkState::Failed);
        assert!(job_progress_only(Some(&old), &new), "running, a group over");
        new.state = Some(WorkState::Failed);
        assert!(!job_progress_only(Some(&old), &new));
        assert!(!job_progress_only(None, &new), "failed at its first write");
        new.state = Some(WorkState::Running);
        new.deadline_time = Some(jiff::Timestamp::UNIX_EPOCH);
        assert!(!job_progress_only(Some(&old), &new), "a deadline ran out");
    }

    #[test]
    fn a_pending_job_waits_for_a_young_group_that_has_written_nothing() {
        let second = Duration::from_secs(1);
        assert!(awaits_group(None, NEW, second));
        assert!(awaits_group(None, Duration::from_millis(2_500), second));
        assert!(!awaits_group(None, Duration::from_secs(3), second), "not forever");
        assert!(!awaits_group(Some(WorkState::Pending), NEW, second), "written");
    }

    #[test]
    fn progress_waits_out_the_interval_and_urgent_writes_do_not() {
        let pacer = Pacer::new(Duration::from_secs(60));
        assert_eq!(
            pacer.due("ns/a", false, OLD),
            None,
            "the first write of an old object goes"
        );
        let wait = pacer.due("ns/a", false, OLD).expect("held back");
        assert!(wait > Duration::from_secs(59) && wait <= Duration::from_secs(60));
        assert_eq!(pacer.due("ns/b", false, OLD), None, "per object");
        assert_eq!(pacer.due("ns/a", true, OLD), None, "urgent");
        assert!(pacer.due("ns/a", false, OLD).is_some(), "the urgent write counts");
    }

    #[test]
    fn a_new_object_counts_as_written_when_first_asked_about() {
        let pacer = Pacer::new(Duration::from_secs(60));
        let wait = pacer
            .due("ns/a", false, Duration::from_secs(20))
            .expect("held back");
        assert!(wait > Duration::from_secs(59) && wait <= Duration::from_secs(60));
        let again = pacer
            .due("ns/a", false, Duration::from_secs(21))
            .expect("still held back");
        assert!(again <= wait, "counted from the first ask, not again");
        assert_eq!(pacer.due("ns/a", true, NEW), None, "urgent");
        assert!(pacer.due("ns/b", false, NEW).is_some());
        assert_eq!(pacer.due("ns/c", true, NEW), None, "an urgent first write goes");
        assert!(pacer.due("ns/c", false, NEW).is_some(), "and counts");
    }

    #[test]
    fn an_age_read_from_whole_seconds_still_counts_as_young() {
        let pacer = Pacer::new(Duration::from_secs(1));
        // Created late in a second, first seen early in the next but one.
        assert!(
            pacer
                .due("ns/late", false, Duration::from_millis(1_500))
                .is_some(),
            "held back its turn"
        );
        assert_eq!(
            pacer.due("ns/old", false, Duration::from_millis(2_500)),
            None,
            "an object past its turn and a second is old"
        );
    }

    #[test]
    fn an_interval_of_zero_holds_nothing_back() {
        let pacer = Pacer::new(Duration::ZERO);
        assert_eq!(pacer.due("ns/a", false, NEW), None);
        assert_eq!(pacer.due("ns/a", false, NEW), None);
    }

    #[test]
    fn objects_written_long_ago_are_forgotten() {
        let pacer = Pacer::new(Duration::ZERO);
        for i in 0..PRUNE_AT + 10 {
            pacer.due(&format!("ns/{i}"), false, NEW);
        }
        assert!(lock(&pacer.written).at.len() <= 11, "pruned once full");
    }
}
