//! A Job's `activeDeadlineSeconds`, as a Kubernetes Job's: once the Job
//! has been active that long it fails with reason `DeadlineExceeded`. The
//! manager records when it ran out (`status.deadlineTime`) and passes a
//! cancel of its own to the Job's TaskGroups (the annotation
//! `robot.k8s4r.io/cancel`, with `robot.k8s4r.io/requested-by` naming the
//! deadline), so that its tasks stop as a person's cancel stops them,
//! running ones on their robots included; once they ended the Job is
//! Failed, not Cancelled. A person's cancel already in force is left to
//! do that. The Job's own annotations, a person's, are never written.
//!
//! The deadline counts from the Job's creation, or from a person's last
//! retry of it: a retry runs the Job again for as long again. Pure.

use std::time::Duration;

use jiff::Timestamp;
use k8s4r_api::condition::set_condition;
use k8s4r_api::names::CONDITION_FAILED;
use k8s4r_api::{Condition, ConditionStatus, Job, JobStatus, ManualAction, WorkState};

/// How the cancel values the deadline passes on begin.
pub const CANCEL_PREFIX: &str = "active-deadline-";
/// Who the deadline's cancel names as having asked.
pub const REQUESTED_BY: &str = "the Job's activeDeadlineSeconds";
/// The reason of the Job's Failed condition and Event.
pub const REASON: &str = "DeadlineExceeded";

/// What a Job's deadline calls for now.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum ActiveDeadline {
    /// No deadline, or none that ran out.
    None,
    /// It runs out in this long.
    Later(Duration),
    /// It ran out `at` (recorded, or now when `new`): the Job's unfinished
    /// tasks are cancelled with the cancel value `cancel`.
    Passed {
        at: Timestamp,
        cancel: String,
        new: bool,
    },
    /// It ran out `at`, and the Job is over: only the record stays.
    Over(Timestamp),
}

impl ActiveDeadline {
    /// When it ran out, if it did.
    pub fn time(&self) -> Option<Timestamp> {
        match self {
            ActiveDeadline::Passed { at, .. } | ActiveDeadline::Over(at) => Some(*at),
            _ => None,
        }
    }
}

/// What `job`'s `activeDeadlineSeconds` calls for at `now`, `retry`
/// being a person's last retry as this reconcile recorded it (it may be
/// newer than the Job's status says).
pub fn active_deadline(job: &Job, retry: Option<&ManualAction>, now: Timestamp) -> ActiveDeadline {
    let Some(seconds) = job.spec.active_deadline_seconds else {
        return ActiveDeadline::None;
    };
    let status = job.status.as_ref();
    let created = job.metadata.creation_timestamp.as_ref().map(|t| t.0);
    let retried = retry.filter(|r| !r.noop).map(|r| r.at);
    let Some(since) = created.max(retried) else {
        return ActiveDeadline::None;
    };
    let limit = Duration::from_secs(u64::try_from(seconds).unwrap_or(0));
    // A record counts for this run only: one made at or after its end.
    let end = jiff::SignedDuration::try_from(limit)
        .ok()
        .and_then(|l| since.checked_add(l).ok());
    let recorded = status
        .and_then(|s| s.deadline_time)
        .filter(|t| end.is_some_and(|end| *t >= end));
    if status.and_then(|s| s.state).is_some_and(WorkState::is_finished) {
        return recorded.map_or(ActiveDeadline::None, ActiveDeadline::Over);
    }
    let active = Duration::try_from(now.duration_since(since)).unwrap_or_default();
    match limit.checked_sub(active).filter(|l| !l.is_zero()) {
        Some(left) if recorded.is_none() => ActiveDeadline::Later(left),
        _ => ActiveDeadline::Passed {
            at: recorded.unwrap_or(now),
            cancel: format!("{CANCEL_PREFIX}{}", since.as_second()),
            new: recorded.is_none(),
        },
    }
}

/// What the Job says of its deadline.
pub fn message(seconds: Option<i64>) -> String {
    format!(
        "the Job was active longer than its activeDeadlineSeconds ({}s); its unfinished tasks are cancelled",
        seconds.unwrap_or(0)
    )
}

/// A finished Job whose deadline ran out ends Failed (unless it completed),
/// its Failed condition saying `DeadlineExceeded`; true when it was so
/// rewritten.
pub fn fail_past_deadline(status: &mut JobStatus, seconds: Option<i64>, generation: Option<i64>) -> bool {
    let finished = status.state.is_some_and(WorkState::is_finished);
    if !finished || status.state == Some(WorkState::Completed) || status.deadline_time.is_none() {
        return false;
    }
    status.state = Some(WorkState::Failed);
    let mut failed = Condition::new(CONDITION_FAILED, ConditionStatus::True, REASON, message(seconds));
    failed.observed_generation = generation;
    failed.last_transition_time = status.deadline_time;
    set_condition(&mut status.conditions, failed);
    true
}

#[cfg(test)]
mod tests {
    use super::*;
    use k8s4r_api::JobSpec;
    use k8s_openapi::apimachinery::pkg::apis::meta::v1::Time;

    fn job(deadline: Option<i64>) -> Job {
        let mut job = Job::new(
            "mission",
            JobSpec {
                active_deadline_seconds: deadline,
                ..JobSpec::default()
            },
        );
        job.metadata.creation_timestamp = Some(Time("2026-12-03T10:00:00Z".parse().unwrap()));
        job
    }

    fn at(t: &str) -> Timestamp {
        t.parse().unwrap()
    }

    fn retried(when: &str) -> ManualAction {
        ManualAction {
            value: "again".into(),
            by: None,
            at: at(when),
            attempt: 0,
            message: None,
            noop: false,
        }
    }

    #[test]
    fn the_deadline_is_recorded_once_then_the_job_fails_deadline_exceeded() {
        assert_eq!(
            active_deadline(&job(None), None, at("2026-12-03T11:00:00Z")),
            ActiveDeadline::None
        );
        let mut j = job(Some(60));
        assert_eq!(
            active_deadline(
                &j,
                j.status.as_ref().and_then(|s| s.retry.as_ref()),
                at("2026-12-03T10:00:45Z")
            ),
            ActiveDeadline::Later(Duration::from_secs(15))
        );
        let due = active_deadline(
            &j,
            j.status.as_ref().and_then(|s| s.retry.as_ref()),
            at("2026-12-03T10:01:00Z"),
        );
        let ActiveDeadline::Passed {
            at: ran_out,
            cancel,
            new: true,
        } = due
        else {
            panic!("due at 60 s: {due:?}");
        };
        assert!(cancel.starts_with(CANCEL_PREFIX), "{cancel}");
        j.status = Some(JobStatus {
            deadline_time: Some(ran_out),
            ..JobStatus::default()
        });
        assert_eq!(
            active_deadline(
                &j,
                j.status.as_ref().and_then(|s| s.retry.as_ref()),
                at("2026-12-03T10:02:00Z")
            ),
            ActiveDeadline::Passed {
                at: ran_out,
                cancel: cancel.clone(),
                new: false
            },
            "recorded: the same cancel, no new Event"
        );

        let mut status = JobStatus {
            state: Some(WorkState::Cancelled),
            deadline_time: Some(ran_out),
            ..JobStatus::default()
        };
        assert!(fail_past_deadline(&mut status, Some(60), Some(1)));
        assert_eq!(status.state, Some(WorkState::Failed));
        let failed = k8s4r_api::condition::find_condition(&status.conditions, CONDITION_FAILED).unwrap();
        assert_eq!(
            (failed.status, failed.reason.as_deref()),
            (ConditionStatus::True, Some(REASON))
        );
        j.status = Some(status);
        assert_eq!(
            active_deadline(
                &j,
                j.status.as_ref().and_then(|s| s.retry.as_ref()),
                at("2026-12-03T11:00:00Z")
            ),
            ActiveDeadline::Over(ran_out),
            "over: the record stays, nothing is passed on"
        );
        // A person's cancel without a deadline stays a cancel.
        let mut person = JobStatus {
            state: Some(WorkState::Cancelled),
            ..JobStatus::default()
        };
        assert!(!fail_past_deadline(&mut person, Some(60), None));
        assert_eq!(person.state, Some(WorkState::Cancelled));
    }

    #[test]
    fn a_retry_runs_the_job_for_as_long_again() {
        let mut j = job(Some(60));
        j.status = Some(JobStatus {
            retry: Some(retried("2026-12-03T10:05:00Z")),
            // The deadline of the run before the retry no longer counts.
            deadline_time: Some(at("2026-12-03T10:01:00Z")),
            ..JobStatus::default()
        });
        assert_eq!(
            active_deadline(
                &j,
                j.status.as_ref().and_then(|s| s.retry.as_ref()),
                at("2026-12-03T10:05:30Z")
            ),
            ActiveDeadline::Later(Duration::from_secs(30))
        );
        assert!(matches!(
            active_deadline(
                &j,
                j.status.as_ref().and_then(|s| s.retry.as_ref()),
                at("2026-12-03T10:06:00Z")
            ),
            ActiveDeadline::Passed { new: true, .. }
        ));
    }
}
