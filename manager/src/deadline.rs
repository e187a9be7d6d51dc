//! A Job's `activeDeadlineSeconds`, as a Kubernetes Job's: once the Job
//! has been active that long it fails with reason `DeadlineExceeded`. The
//! manager carries it out as a cancel of the Job, recorded in its status
//! as a person's is (with a value of its own, and the deadline named as
//! who asked) and passed on to its TaskGroups and Tasks the same way, so
//! that its tasks stop as a person's cancel stops them, running ones on
//! their robots included; the Job then ends Failed, not Cancelled.
//!
//! The deadline counts from the Job's creation, or from a person's last
//! retry of it: a retry runs the Job again for as long again. Pure.

use std::time::Duration;

use jiff::Timestamp;
use k8s4r_api::condition::set_condition;
use k8s4r_api::names::CONDITION_FAILED;
use k8s4r_api::{Condition, ConditionStatus, Job, JobStatus, ManualAction, WorkState};

/// How the cancel values the deadline writes begin.
pub const CANCEL_PREFIX: &str = "active-deadline-";
/// Who the deadline's cancel names as having asked.
pub const REQUESTED_BY: &str = "the Job's activeDeadlineSeconds";
/// The reason of the Job's Failed condition and Event.
pub const REASON: &str = "DeadlineExceeded";

/// What a Job's deadline calls for now.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum ActiveDeadline {
    /// No deadline, or the Job has finished, or its cancel is recorded.
    None,
    /// It passes in this long.
    Later(Duration),
    /// It passed: the cancel to act on, as a person's would be.
    Due(ManualAction),
}

/// What `job`'s `activeDeadlineSeconds` calls for at `now`.
pub fn active_deadline(job: &Job, now: Timestamp) -> ActiveDeadline {
    let Some(seconds) = job.spec.active_deadline_seconds else {
        return ActiveDeadline::None;
    };
    let status = job.status.as_ref();
    if status.and_then(|s| s.state).is_some_and(WorkState::is_finished) {
        return ActiveDeadline::None;
    }
    let created = job.metadata.creation_timestamp.as_ref().map(|t| t.0);
    let retried = status.and_then(|s| s.retry.as_ref()).map(|r| r.at);
    let Some(since) = created.max(retried) else {
        return ActiveDeadline::None;
    };
    let limit = Duration::from_secs(u64::try_from(seconds).unwrap_or(0));
    let active = Duration::try_from(now.duration_since(since)).unwrap_or_default();
    if let Some(left) = limit.checked_sub(active).filter(|l| !l.is_zero()) {
        return ActiveDeadline::Later(left);
    }
    let value = format!("{CANCEL_PREFIX}{}", since.as_second());
    let recorded = status
        .and_then(|s| s.cancellation.as_ref())
        .is_some_and(|c| c.value == value);
    if recorded {
        return ActiveDeadline::None;
    }
    ActiveDeadline::Due(ManualAction {
        value,
        by: Some(REQUESTED_BY.to_owned()),
        at: now,
        attempt: 0,
        message: Some(message(seconds)),
        noop: false,
    })
}

fn message(seconds: i64) -> String {
    format!("the Job was active longer than its activeDeadlineSeconds ({seconds}s); its unfinished tasks are cancelled")
}

/// Whether the cancel `status` acted on is the deadline's.
pub fn cancelled_by_deadline(status: &JobStatus) -> bool {
    status
        .cancellation
        .as_ref()
        .is_some_and(|c| c.value.starts_with(CANCEL_PREFIX))
}

/// A finished Job that the deadline cancelled ends Failed, its Failed
/// condition saying `DeadlineExceeded`; true when it was so rewritten.
pub fn fail_past_deadline(status: &mut JobStatus, seconds: Option<i64>, generation: Option<i64>) -> bool {
    let finished = status.state.is_some_and(WorkState::is_finished);
    if !finished || status.state == Some(WorkState::Completed) || !cancelled_by_deadline(status) {
        return false;
    }
    status.state = Some(WorkState::Failed);
    let mut failed = Condition::new(
        CONDITION_FAILED,
        ConditionStatus::True,
        REASON,
        message(seconds.unwrap_or(0)),
    );
    failed.observed_generation = generation;
    let kept = status
        .conditions
        .iter()
        .find(|c| c.type_ == CONDITION_FAILED && c.reason.as_deref() == Some(REASON))
        .and_then(|c| c.last_transition_time);
    failed.last_transition_time = kept.or(status.completion_time);
    set_condition(&mut status.conditions, failed);
    true
}

#[cfg(test)]
mod tests {
    use super::*;
    use k8s4r_api::{JobSpec, ManualAction};
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

    #[test]
    fn the_deadline_cancels_once_then_the_job_fails_deadline_exceeded() {
        assert_eq!(
            active_deadline(&job(None), at("2026-12-03T11:00:00Z")),
            ActiveDeadline::None
        );
        let mut j = job(Some(60));
        assert_eq!(
            active_deadline(&j, at("2026-12-03T10:00:45Z")),
            ActiveDeadline::Later(Duration::from_secs(15))
        );
        let ActiveDeadline::Due(cancel) = active_deadline(&j, at("2026-12-03T10:01:00Z")) else {
            panic!("due at 60 s");
        };
        let said = cancel.message.clone().unwrap_or_default();
        assert!(said.contains("activeDeadlineSeconds (60s)"), "{said}");
        assert_eq!(cancel.by.as_deref(), Some(REQUESTED_BY));
        let value = cancel.value.clone();
        j.status = Some(JobStatus {
            cancellation: Some(cancel),
            ..JobStatus::default()
        });
        assert_eq!(
            active_deadline(&j, at("2026-12-03T10:02:00Z")),
            ActiveDeadline::None,
            "acted on once"
        );

        let action = |value: &str| ManualAction {
            value: value.into(),
            by: Some(REQUESTED_BY.into()),
            at: at("2026-12-03T10:01:00Z"),
            attempt: 0,
            message: None,
            noop: false,
        };
        let mut status = JobStatus {
            state: Some(WorkState::Cancelled),
            cancellation: Some(action(&value)),
            ..JobStatus::default()
        };
        assert!(fail_past_deadline(&mut status, Some(60), Some(1)));
        assert_eq!(status.state, Some(WorkState::Failed));
        let failed = k8s4r_api::condition::find_condition(&status.conditions, CONDITION_FAILED).unwrap();
        assert_eq!(
            (failed.status, failed.reason.as_deref()),
            (ConditionStatus::True, Some(REASON))
        );
        // A person's cancel stays a cancel.
        let mut person = JobStatus {
            state: Some(WorkState::Cancelled),
            cancellation: Some(action("now")),
            ..JobStatus::default()
        };
        assert!(!fail_past_deadline(&mut person, Some(60), None));
        assert_eq!(person.state, Some(WorkState::Cancelled));
    }

    #[test]
    fn a_retry_runs_the_job_for_as_long_again() {
        let mut j = job(Some(60));
        j.status = Some(JobStatus {
            retry: Some(ManualAction {
                value: "again".into(),
                by: None,
                at: at("2026-12-03T10:05:00Z"),
                attempt: 0,
                message: None,
                noop: false,
            }),
            ..JobStatus::default()
        });
        assert_eq!(
            active_deadline(&j, at("2026-12-03T10:05:30Z")),
            ActiveDeadline::Later(Duration::from_secs(30))
        );
        assert!(matches!(
            active_deadline(&j, at("2026-12-03T10:06:00Z")),
            ActiveDeadline::Due(_)
        ));
    }
}
