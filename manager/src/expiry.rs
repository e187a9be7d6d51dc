//! When a finished Job is deleted, as Kubernetes' TTL-after-finished
//! controller deletes batch/v1 Jobs: after `spec.ttlSecondsAfterFinished`,
//! else after the manager's `--job-ttl-after-finished`, counted from the
//! Job's `status.completionTime`.
//!
//! ```text
//!   pending / running ──finishes──▶ completed / failed / cancelled
//!                                   (completionTime recorded)
//!                                        │ the ttl passes: the Job is
//!                                        │ requeued for that instant
//!                                        ▼
//!                                   Expired Event (a one-line summary),
//!                                   then the Job is deleted; its TaskGroups
//!                                   and Tasks follow by their owner
//!                                   references
//! ```
//!
//! The ttl is read at every decision, so one changed after the Job finished
//! counts (as in Kubernetes). The runs of a PeriodicJob keep to its history
//! limits: the manager's default does not apply to them, a ttl in their own
//! spec (from the jobTemplate) does.
//!
//! Pure functions with the clock passed in; the Job controller
//! ([`crate::controllers::job`]) acts on them.

use std::time::Duration;

use jiff::{SignedDuration, Timestamp};
use k8s4r_api::duration::format_duration;
use k8s4r_api::{Job, JobStatus, PeriodicJob, WorkState};
use kube::{Resource, ResourceExt};

/// The reason of the Event recorded before an expired Job is deleted.
pub const REASON_EXPIRED: &str = "Expired";

/// Where a Job's time after finishing comes from.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum TtlSource {
    /// Its own `spec.ttlSecondsAfterFinished`.
    Spec,
    /// The manager's `--job-ttl-after-finished`.
    Default,
}

impl TtlSource {
    fn as_str(self) -> &'static str {
        match self {
            TtlSource::Spec => "ttlSecondsAfterFinished",
            TtlSource::Default => "--job-ttl-after-finished",
        }
    }
}

/// How long a finished Job is kept, and who said so.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Ttl {
    /// The time from its finish to its deletion.
    pub after: Duration,
    /// Who set it.
    pub source: TtlSource,
}

/// What to do about a Job's expiry now.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Expiry {
    /// Kept: not finished, no ttl applies, or its finish time is not
    /// recorded yet (the status write that records it brings the Job back).
    Kept,
    /// It expires after this long: look again then.
    Later(Duration),
    /// Its time is up: record this summary in an Event, then delete it.
    Due(String),
}

/// The ttl of `job`: its own, else `default` unless a PeriodicJob owns it.
/// A negative ttl of its own (validation refuses one; a Job stored past
/// validation is failed as InvalidSpec) counts as unset.
pub fn ttl_of(job: &Job, default: Option<Duration>) -> Option<Ttl> {
    let own = job
        .spec
        .ttl_seconds_after_finished
        .and_then(|s| u64::try_from(s).ok())
        .map(|s| Ttl {
            after: Duration::from_secs(s),
            source: TtlSource::Spec,
        });
    own.or_else(|| {
        let periodic_run = job
            .owner_references()
            .iter()
            .any(|o| o.kind == PeriodicJob::kind(&()) && o.api_version == PeriodicJob::api_version(&()));
        default.filter(|_| !periodic_run).map(|after| Ttl {
            after,
            source: TtlSource::Default,
        })
    })
}

/// Decides at `now` whether `job` (as last written) is due for deletion,
/// with `default` the manager's `--job-ttl-after-finished`.
pub fn plan_expiry(job: &Job, default: Option<Duration>, now: Timestamp) -> Expiry {
    let Some(status) = &job.status else {
        return Expiry::Kept;
    };
    let Some(state) = status.state.filter(|s| s.is_finished()) else {
        return Expiry::Kept;
    };
    let (Some(ttl), Some(finished)) = (ttl_of(job, default), status.completion_time) else {
        return Expiry::Kept;
    };
    let expires = SignedDuration::try_from(ttl.after)
        .ok()
        .and_then(|after| finished.checked_add(after).ok());
    // Past the last instant jiff knows (year 9999): never.
    let Some(expires) = expires else {
        return Expiry::Kept;
    };
    match Duration::try_from(expires.duration_since(now)) {
        Ok(left) if !left.is_zero() => Expiry::Later(left),
        _ => Expiry::Due(summary(state, status, finished, ttl)),
    }
}

/// The Expired Event's note: one line of bounded length (a state, counts,
/// a time and a duration; no names or messages).
fn summary(state: WorkState, status: &JobStatus, finished: Timestamp, ttl: Ttl) -> String {
    let c = &status.counts;
    // Whole seconds: the record is for a person.
    let finished = Timestamp::from_second(finished.as_second()).unwrap_or(finished);
    format!(
        "{} job deleted {} after it finished ({}): {} of {} tasks succeeded, {} failed, {} cancelled; finished at {finished}",
        state.as_str(),
        format_duration(ttl.after),
        ttl.source.as_str(),
        c.completed,
        c.total,
        c.failed,
        c.cancelled,
    )
}

#[cfg(test)]
mod tests {
    use super::*;
    use k8s4r_api::{JobSpec, PeriodicJobSpec, TaskCounts};

    fn t(secs: i64) -> Timestamp {
        Timestamp::from_second(1_800_000_000 + secs).unwrap()
    }

    const HOUR: Duration = Duration::from_secs(3600);

    /// A Job with `ttl` of its own, in `state` since `t(0)` when that is
    /// finished.
    fn job(state: WorkState, ttl: Option<i32>) -> Job {
        let mut job = Job::new(
            "j",
            JobSpec {
                ttl_seconds_after_finished: ttl,
                ..JobSpec::default()
            },
        );
        job.status = Some(JobStatus {
            state: Some(state),
            counts: TaskCounts {
                total: 3,
                completed: 2,
                failed: 1,
                ..TaskCounts::default()
            },
            completion_time: state.is_finished().then(|| t(0)),
            ..JobStatus::default()
        });
        job
    }

    fn run_of_periodic(mut job: Job) -> Job {
        let mut pj = PeriodicJob::new("nightly", PeriodicJobSpec::default());
        pj.metadata.uid = Some("uid-nightly".into());
        job.metadata.owner_references = Some(vec![pj.controller_owner_ref(&()).unwrap()]);
        job
    }

    #[test]
    fn a_job_not_finished_is_kept_whatever_its_ttl() {
        for state in [WorkState::Pending, WorkState::Running] {
            assert_eq!(
                plan_expiry(&job(state, Some(0)), Some(HOUR), t(1_000_000)),
                Expiry::Kept
            );
        }
    }

    #[test]
    fn without_a_ttl_or_a_default_a_finished_job_is_kept() {
        assert_eq!(
            plan_expiry(&job(WorkState::Completed, None), None, t(1_000_000)),
            Expiry::Kept
        );
    }

    #[test]
    fn its_own_ttl_counts_from_its_completion_time() {
        let j = job(WorkState::Completed, Some(30));
        assert_eq!(
            plan_expiry(&j, None, t(0)),
            Expiry::Later(Duration::from_secs(30))
        );
        assert_eq!(
            plan_expiry(&j, None, t(29)),
            Expiry::Later(Duration::from_secs(1))
        );
        let half_a_second_before = t(30) - SignedDuration::from_millis(500);
        assert_eq!(
            plan_expiry(&j, None, half_a_second_before),
            Expiry::Later(Duration::from_millis(500)),
            "the requeue is for the instant it expires"
        );
        for now in [t(30), t(31), t(100_000)] {
            assert!(matches!(plan_expiry(&j, None, now), Expiry::Due(_)), "{now}");
        }
    }

    #[test]
    fn a_ttl_of_zero_deletes_it_as_soon_as_it_finishes() {
        assert!(matches!(
            plan_expiry(&job(WorkState::Completed, Some(0)), None, t(0)),
            Expiry::Due(_)
        ));
    }

    #[test]
    fn failed_and_cancelled_jobs_expire_too() {
        for state in [WorkState::Failed, WorkState::Cancelled] {
            assert!(
                matches!(plan_expiry(&job(state, Some(10)), None, t(10)), Expiry::Due(_)),
                "{state:?}"
            );
        }
    }

    #[test]
    fn the_default_applies_only_to_jobs_without_a_ttl_of_their_own() {
        let plain = job(WorkState::Completed, None);
        assert_eq!(
            plan_expiry(&plain, Some(HOUR), t(60)),
            Expiry::Later(HOUR - Duration::from_secs(60))
        );
        let longer = job(WorkState::Completed, Some(7200));
        assert_eq!(
            plan_expiry(&longer, Some(HOUR), t(3600)),
            Expiry::Later(HOUR),
            "its own ttl wins, even when longer"
        );
        let at_once = job(WorkState::Completed, Some(0));
        assert!(matches!(plan_expiry(&at_once, Some(HOUR), t(0)), Expiry::Due(_)));
    }

    #[test]
    fn a_periodic_jobs_runs_keep_to_its_history_unless_they_set_a_ttl() {
        let run = run_of_periodic(job(WorkState::Completed, None));
        assert_eq!(ttl_of(&run, Some(HOUR)), None);
        assert_eq!(plan_expiry(&run, Some(HOUR), t(1_000_000)), Expiry::Kept);
        let run = run_of_periodic(job(WorkState::Completed, Some(60)));
        assert_eq!(
            ttl_of(&run, Some(HOUR)),
            Some(Ttl {
                after: Duration::from_secs(60),
                source: TtlSource::Spec
            })
        );
        assert!(matches!(plan_expiry(&run, Some(HOUR), t(60)), Expiry::Due(_)));
    }

    #[test]
    fn a_ttl_changed_after_the_finish_counts() {
        let mut j = job(WorkState::Completed, Some(3600));
        assert_eq!(
            plan_expiry(&j, None, t(1800)),
            Expiry::Later(Duration::from_secs(1800))
        );
        j.spec.ttl_seconds_after_finished = Some(60);
        assert!(matches!(plan_expiry(&j, None, t(1800)), Expiry::Due(_)));
        j.spec.ttl_seconds_after_finished = Some(7200);
        assert_eq!(
            plan_expiry(&j, None, t(1800)),
            Expiry::Later(Duration::from_secs(5400))
        );
        j.spec.ttl_seconds_after_finished = None;
        assert_eq!(plan_expiry(&j, None, t(1800)), Expiry::Kept);
    }

    #[test]
    fn a_negative_ttl_counts_as_unset() {
        let j = job(WorkState::Failed, Some(-1));
        assert_eq!(ttl_of(&j, None), None);
        assert_eq!(ttl_of(&j, Some(HOUR)).map(|t| t.source), Some(TtlSource::Default));
    }

    #[test]
    fn a_finished_job_without_a_completion_time_waits_for_it() {
        let mut j = job(WorkState::Completed, Some(0));
        if let Some(s) = j.status.as_mut() {
            s.completion_time = None;
        }
        assert_eq!(plan_expiry(&j, None, t(1_000_000)), Expiry::Kept);
    }

    #[test]
    fn the_longest_ttl_neither_overflows_nor_expires() {
        let j = job(WorkState::Completed, Some(i32::MAX));
        assert!(matches!(plan_expiry(&j, None, t(1)), Expiry::Later(_)));
        let forever = Duration::from_secs(u64::MAX);
        assert_eq!(
            plan_expiry(&job(WorkState::Completed, None), Some(forever), t(1)),
            Expiry::Kept
        );
    }

    #[test]
    fn the_summary_is_one_line_with_the_counts_the_finish_and_the_ttl() {
        let mut j = job(WorkState::Failed, Some(90));
        if let Some(s) = j.status.as_mut() {
            s.completion_time = Some(t(0) + SignedDuration::from_millis(250));
        }
        let Expiry::Due(note) = plan_expiry(&j, None, t(100)) else {
            panic!("not due");
        };
        assert_eq!(
            note,
            "failed job deleted 1m30s after it finished (ttlSecondsAfterFinished): \
             2 of 3 tasks succeeded, 1 failed, 0 cancelled; finished at 2027-01-15T08:00:00Z"
        );
        let Expiry::Due(note) = plan_expiry(&job(WorkState::Completed, None), Some(HOUR), t(3600)) else {
            panic!("not due");
        };
        assert!(note.contains("(--job-ttl-after-finished)"), "{note}");
        assert!(!note.contains('\n'));
    }
}
