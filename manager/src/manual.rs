//! A person's retry and cancel, asked with annotations
//! (`robot.k8s4r.io/retry`, `robot.k8s4r.io/cancel`) so that kubectl alone
//! can drive them, and a Task's eviction (`robot.k8s4r.io/evict`, which
//! `k8s4r drain` sets on the tasks of the robot it drains). Each value acts once: the object's status records the
//! value acted on, and the same value seen again does nothing. A Job passes
//! its request on to its TaskGroups and a TaskGroup to its Tasks (as
//! annotations, so that each level records and shows what it did); the
//! Task is where work stops or starts again.
//!
//! Pure functions; the controllers carry the decisions out.

use jiff::Timestamp;
use k8s4r_api::names::{ANNOTATION_CANCEL, ANNOTATION_REQUESTED_BY, ANNOTATION_RETRY};
use k8s4r_api::{ManualAction, TaskState, TaskStatus};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::ObjectMeta;

/// One request read off an object's annotations.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Request {
    /// The annotation's value.
    pub value: String,
    /// Who asked, as far as the object tells (see [`ManualAction::by`]).
    pub by: Option<String>,
}

impl Request {
    /// The record of acting on it at `now`.
    pub fn acted(&self, now: Timestamp, attempt: u32, message: impl Into<String>) -> ManualAction {
        ManualAction {
            value: self.value.clone(),
            by: self.by.clone(),
            at: now,
            attempt,
            message: Some(message.into()),
            noop: false,
        }
    }

    /// The record of finding nothing to do about it at `now`.
    pub fn nothing(&self, now: Timestamp, attempt: u32, message: impl Into<String>) -> ManualAction {
        ManualAction {
            noop: true,
            ..self.acted(now, attempt, message)
        }
    }
}

/// The request `annotation` carries on `meta`, if it is set and not
/// empty. Who asked: `robot.k8s4r.io/requested-by`, else the field manager
/// that owns the annotation in managedFields.
pub fn request(meta: &ObjectMeta, annotation: &str) -> Option<Request> {
    let value = meta.annotations.as_ref()?.get(annotation)?.trim();
    if value.is_empty() {
        return None;
    }
    let by = meta
        .annotations
        .as_ref()
        .and_then(|a| a.get(ANNOTATION_REQUESTED_BY))
        .map(|b| b.trim().to_owned())
        .filter(|b| !b.is_empty())
        .or_else(|| owner_of_annotation(meta, annotation));
    Some(Request {
        value: value.to_owned(),
        by,
    })
}

fn owner_of_annotation(meta: &ObjectMeta, annotation: &str) -> Option<String> {
    let key = format!("f:{annotation}");
    meta.managed_fields
        .iter()
        .flatten()
        .filter(|m| {
            m.fields_v1
                .as_ref()
                .is_some_and(|f| f.0["f:metadata"]["f:annotations"].get(&key).is_some())
        })
        .max_by_key(|m| m.time.as_ref().map(|t| t.0))
        .and_then(|m| m.manager.clone())
}

/// The attempt a Task's retry budget counts from: the one a person's last
/// retry that acted was made at (0 if none). A retry that finds nothing to
/// do records this again rather than the current attempt, so that it
/// neither resets the budget (a refused retry would otherwise buy the
/// Task its retries again) nor loses the base of the retry before it.
pub fn retry_base(status: &TaskStatus) -> u32 {
    status.retry.as_ref().map_or(0, |r| r.attempt)
}

/// A new request: set, and not the value acted on last.
pub fn pending(request: Option<Request>, last: Option<&ManualAction>) -> Option<Request> {
    request.filter(|r| last.is_none_or(|l| l.value != r.value))
}

/// What a Task does about a person's requests.
#[derive(Clone, Debug, PartialEq)]
pub enum TaskManual {
    /// Record the cancel; the task is not running: it is cancelled now.
    CancelNow(ManualAction),
    /// Record the cancel; the attempt runs on its robot, which the server
    /// now asks to stop it (the manager marks it cancelled on its report).
    CancelRunning(ManualAction),
    /// The cancelled attempt has ended on its robot: mark it cancelled.
    Cancelled,
    /// Record a request that has nothing to act on (so that it acts once).
    Record {
        /// Which annotation.
        cancel: bool,
        /// The record.
        action: ManualAction,
    },
    /// Start a new attempt now, the retry budget counted afresh.
    Retry(ManualAction),
    /// Record the eviction; the attempt may be on its robot, which the
    /// server now asks to stop it (a cancel that drains). Its end, however
    /// the robot words it, sends the task back to pending without a retry
    /// ([`crate::lifecycle::ended_as`]).
    Evict(ManualAction),
    /// Record the eviction; the attempt was never sent to its robot: the
    /// task is pending again now, as a new attempt, without a retry.
    EvictNow(ManualAction),
    /// Record an eviction that has nothing to act on (so that it acts once).
    NothingToEvict(ManualAction),
}

/// Decides about `status`'s Task's requests. `finished` says whether the
/// task is done for good (completed, or failed with no retry to come).
/// `dispatched` says whether the current attempt was sent to its robot.
pub fn decide_task(
    status: &TaskStatus,
    cancel: Option<Request>,
    retry: Option<Request>,
    finished: bool,
    dispatched: bool,
    now: Timestamp,
) -> Option<TaskManual> {
    let state = status.state.unwrap_or(TaskState::Pending);
    if let Some(cancel) = pending(cancel, status.cancellation.as_ref()) {
        let by = cancel
            .by
            .as_deref()
            .map(|b| format!(" by {b}"))
            .unwrap_or_default();
        let attempt = status.attempt;
        return Some(match state {
            TaskState::Completed | TaskState::Cancelled => TaskManual::Record {
                cancel: true,
                action: cancel.nothing(
                    now,
                    attempt,
                    format!("nothing to cancel: the task is {}", state.as_str()),
                ),
            },
            TaskState::Failed if finished => TaskManual::Record {
                cancel: true,
                action: cancel.nothing(now, attempt, "nothing to cancel: the task failed for good"),
            },
            // Never sent to its robot: nothing runs there.
            TaskState::Dispatching if !dispatched => {
                TaskManual::CancelNow(cancel.acted(now, attempt, format!("cancelled{by}")))
            }
            TaskState::Dispatching | TaskState::Running => TaskManual::CancelRunning(cancel.acted(
                now,
                attempt,
                format!("cancelled{by}: stopping attempt {attempt}"),
            )),
            TaskState::Pending | TaskState::Failed => {
                TaskManual::CancelNow(cancel.acted(now, attempt, format!("cancelled{by}")))
            }
        });
    }
    if state == TaskState::Failed && status.cancel_requested() {
        return Some(TaskManual::Cancelled);
    }
    if let Some(retry) = pending(retry, status.retry.as_ref()) {
        let by = retry
            .by
            .as_deref()
            .map(|b| format!(" by {b}"))
            .unwrap_or_default();
        let attempt = status.attempt;
        let again = (state == TaskState::Failed && finished) || state == TaskState::Cancelled;
        return Some(if again {
            TaskManual::Retry(retry.acted(
                now,
                attempt,
                format!("retried{by} after attempt {attempt}; retries counted afresh"),
            ))
        } else {
            TaskManual::Record {
                cancel: false,
                action: retry.nothing(
                    now,
                    retry_base(status),
                    format!("nothing to retry: the task is {}", state.as_str()),
                ),
            }
        });
    }
    None
}

/// Decides about a Task's eviction (`robot.k8s4r.io/evict`), once its
/// cancel and retry had nothing to do. `dispatched` says whether the
/// current attempt was sent to its robot, as for [`decide_task`].
pub fn decide_eviction(
    status: &TaskStatus,
    evict: Option<Request>,
    dispatched: bool,
    now: Timestamp,
) -> Option<TaskManual> {
    let evict = pending(evict, status.eviction.as_ref())?;
    let state = status.state.unwrap_or(TaskState::Pending);
    let attempt = status.attempt;
    let robot = status.robot.as_deref().unwrap_or("?");
    let by = evict
        .by
        .as_deref()
        .map(|b| format!(" by {b}"))
        .unwrap_or_default();
    let nothing = |why: String| {
        TaskManual::NothingToEvict(evict.nothing(now, attempt, format!("nothing to evict: {why}")))
    };
    if status.cancel_requested() {
        return Some(nothing("the task is being cancelled".into()));
    }
    Some(match state {
        TaskState::Dispatching if !dispatched => TaskManual::EvictNow(evict.acted(
            now,
            attempt,
            format!("evicted{by}: attempt {attempt} was never sent to robot {robot}; the task waits for another robot"),
        )),
        TaskState::Dispatching | TaskState::Running => TaskManual::Evict(evict.acted(
            now,
            attempt,
            format!("evicted{by}: stopping attempt {attempt} on robot {robot}; the task then runs elsewhere"),
        )),
        TaskState::Pending | TaskState::Failed | TaskState::Completed | TaskState::Cancelled => {
            nothing(format!("the task is {} (no attempt on a robot)", state.as_str()))
        }
    })
}

/// The annotations a Job or TaskGroup passes on to its children for the
/// requests it acts on: the value, and who asked.
pub fn passed_on(annotation: &str, request: &Request) -> serde_json::Value {
    let mut annotations = serde_json::Map::new();
    annotations.insert(annotation.to_owned(), request.value.clone().into());
    if let Some(by) = &request.by {
        annotations.insert(ANNOTATION_REQUESTED_BY.to_owned(), by.clone().into());
    }
    serde_json::json!({ "metadata": { "annotations": annotations } })
}

/// Whether a Job or TaskGroup stays cancelled: it was, and no retry came
/// after.
pub fn still_cancelled(cancel: Option<&ManualAction>, retry: Option<&ManualAction>) -> bool {
    cancel
        .filter(|c| !c.noop)
        .is_some_and(|c| retry.filter(|r| !r.noop).is_none_or(|r| r.at < c.at))
}

/// What a Job or TaskGroup does about its requests: the ones to pass on.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct Owner {
    /// A new cancel.
    pub cancel: Option<Request>,
    /// A new retry.
    pub retry: Option<Request>,
}

/// The new requests on a Job or TaskGroup, given what it acted on last.
pub fn decide_owner(
    meta: &ObjectMeta,
    cancelled: Option<&ManualAction>,
    retried: Option<&ManualAction>,
) -> Owner {
    Owner {
        cancel: pending(request(meta, ANNOTATION_CANCEL), cancelled),
        retry: pending(request(meta, ANNOTATION_RETRY), retried),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use k8s_openapi::apimachinery::pkg::apis::meta::v1::{FieldsV1, ManagedFieldsEntry, Time};

    fn meta(annotations: &[(&str, &str)]) -> ObjectMeta {
        ObjectMeta {
            annotations: Some(
                annotations
                    .iter()
                    .map(|(k, v)| ((*k).to_owned(), (*v).to_owned()))
                    .collect(),
            ),
            ..ObjectMeta::default()
        }
    }

    fn now() -> Timestamp {
        "2026-11-23T10:00:00Z".parse().unwrap()
    }

    fn status(state: TaskState, attempt: u32) -> TaskStatus {
        TaskStatus {
            state: Some(state),
            attempt,
            ..TaskStatus::default()
        }
    }

    fn req(value: &str) -> Option<Request> {
        Some(Request {
            value: value.into(),
            by: Some("alice".into()),
        })
    }

    #[test]
    fn who_asked_comes_from_requested_by_else_the_field_manager() {
        let m = meta(&[(ANNOTATION_CANCEL, "now"), (ANNOTATION_REQUESTED_BY, "alice")]);
        assert_eq!(
            request(&m, ANNOTATION_CANCEL).unwrap().by.as_deref(),
            Some("alice")
        );
        let mut m = meta(&[(ANNOTATION_CANCEL, "now")]);
        m.managed_fields = Some(vec![
            ManagedFieldsEntry {
                manager: Some("k8s4r-manager".into()),
                fields_v1: Some(FieldsV1(serde_json::json!({"f:status": {}}))),
                ..ManagedFieldsEntry::default()
            },
            ManagedFieldsEntry {
                manager: Some("kubectl-annotate".into()),
                time: Some(Time(now())),
                fields_v1: Some(FieldsV1(serde_json::json!({
                    "f:metadata": {"f:annotations": {"f:robot.k8s4r.io/cancel": {}}}
                }))),
                ..ManagedFieldsEntry::default()
            },
        ]);
        assert_eq!(
            request(&m, ANNOTATION_CANCEL).unwrap().by.as_deref(),
            Some("kubectl-annotate")
        );
        assert_eq!(
            request(&meta(&[(ANNOTATION_CANCEL, " ")]), ANNOTATION_CANCEL),
            None
        );
    }

    #[test]
    fn a_cancel_stops_what_runs_and_cancels_what_waits() {
        let running = status(TaskState::Running, 2);
        match decide_task(&running, req("c1"), None, false, true, now()) {
            Some(TaskManual::CancelRunning(a)) => {
                assert_eq!((a.value.as_str(), a.attempt), ("c1", 2));
                assert_eq!(
                    a.message.as_deref(),
                    Some("cancelled by alice: stopping attempt 2")
                );
            }
            other => panic!("{other:?}"),
        }
        let pending = status(TaskState::Pending, 1);
        assert!(matches!(
            decide_task(&pending, req("c1"), None, false, true, now()),
            Some(TaskManual::CancelNow(_))
        ));
        let retrying = status(TaskState::Failed, 1);
        assert!(
            matches!(
                decide_task(&retrying, req("c1"), None, false, true, now()),
                Some(TaskManual::CancelNow(_))
            ),
            "a failure waiting for its retry is cancelled at once"
        );
        let done = status(TaskState::Completed, 1);
        assert!(matches!(
            decide_task(&done, req("c1"), None, true, true, now()),
            Some(TaskManual::Record { cancel: true, .. })
        ));
    }

    #[test]
    fn the_same_value_acts_once() {
        let mut s = status(TaskState::Running, 1);
        s.cancellation = Some(req("c1").unwrap().acted(now(), 1, "cancelled"));
        assert_eq!(decide_task(&s, req("c1"), None, false, true, now()), None);
        s.state = Some(TaskState::Failed);
        assert_eq!(
            decide_task(&s, req("c1"), None, false, true, now()),
            Some(TaskManual::Cancelled),
            "the robot's report of the stopped attempt makes it cancelled"
        );
        s.state = Some(TaskState::Cancelled);
        assert_eq!(decide_task(&s, req("c1"), None, true, true, now()), None);
        let mut f = status(TaskState::Failed, 3);
        f.retry = Some(req("r1").unwrap().acted(now(), 2, "retried"));
        assert_eq!(decide_task(&f, None, req("r1"), true, true, now()), None);
        assert!(matches!(
            decide_task(&f, None, req("r2"), true, true, now()),
            Some(TaskManual::Retry(_))
        ));
    }

    #[test]
    fn records_of_nothing_to_do_neither_cancel_nor_lift_a_cancel() {
        let mut s = status(TaskState::Running, 1);
        s.cancellation = Some(req("c1").unwrap().acted(now(), 1, "stopping"));
        let later: Timestamp = "2026-11-23T10:00:05Z".parse().unwrap();
        match decide_task(&s, req("c1"), req("r1"), false, true, later) {
            Some(TaskManual::Record {
                cancel: false,
                action,
            }) => s.retry = Some(action),
            other => panic!("{other:?}"),
        }
        assert!(
            s.cancel_requested(),
            "a retry of a running task did not lift the cancel"
        );
        let mut f = status(TaskState::Failed, 2);
        match decide_task(&f, req("c9"), None, true, true, now()) {
            Some(TaskManual::Record { cancel: true, action }) => f.cancellation = Some(action),
            other => panic!("{other:?}"),
        }
        assert!(!f.cancel_requested());
        assert_eq!(
            decide_task(&f, req("c9"), None, true, true, now()),
            None,
            "a task that failed for good keeps its failure"
        );
        let sending = status(TaskState::Dispatching, 1);
        assert!(matches!(
            decide_task(&sending, req("c"), None, false, false, now()),
            Some(TaskManual::CancelNow(_))
        ));
    }

    #[test]
    fn only_a_finished_failure_or_a_cancel_is_retried() {
        assert!(matches!(
            decide_task(
                &status(TaskState::Cancelled, 1),
                None,
                req("r"),
                true,
                true,
                now()
            ),
            Some(TaskManual::Retry(_))
        ));
        for (state, finished) in [
            (TaskState::Running, false),
            (TaskState::Completed, true),
            (TaskState::Failed, false),
        ] {
            assert!(
                matches!(
                    decide_task(&status(state, 1), None, req("r"), finished, true, now()),
                    Some(TaskManual::Record { cancel: false, .. })
                ),
                "{state:?}"
            );
        }
    }

    #[test]
    fn a_retry_with_nothing_to_do_keeps_the_retry_budgets_base() {
        // A failure that will be retried (not finished) at attempt 5.
        let mut s = status(TaskState::Failed, 5);
        let Some(TaskManual::Record { action, .. }) = decide_task(&s, None, req("r1"), false, true, now())
        else {
            panic!("a record");
        };
        assert_eq!((action.attempt, action.noop), (0, true), "no retry acted before");
        s.retry = Some(req("r0").unwrap().acted(now(), 3, "retried"));
        let Some(TaskManual::Record { action, .. }) = decide_task(&s, None, req("r1"), false, true, now())
        else {
            panic!("a record");
        };
        assert_eq!(action.attempt, 3, "the retry that acted at attempt 3");
    }

    #[test]
    fn an_eviction_stops_what_may_be_on_the_robot_and_moves_what_is_not() {
        let mut running = status(TaskState::Running, 2);
        running.robot = Some("r1".into());
        match decide_eviction(&running, req("d1"), true, now()) {
            Some(TaskManual::Evict(a)) => {
                assert_eq!((a.value.as_str(), a.attempt, a.noop), ("d1", 2, false));
                assert_eq!(
                    a.message.as_deref(),
                    Some("evicted by alice: stopping attempt 2 on robot r1; the task then runs elsewhere")
                );
                running.eviction = Some(a);
            }
            other => panic!("{other:?}"),
        }
        assert!(running.eviction_requested(), "what the server acts on");
        assert_eq!(
            decide_eviction(&running, req("d1"), true, now()),
            None,
            "acts once"
        );

        let sent = status(TaskState::Dispatching, 1);
        assert!(matches!(
            decide_eviction(&sent, req("d1"), true, now()),
            Some(TaskManual::Evict(_))
        ));
        let unsent = status(TaskState::Dispatching, 1);
        match decide_eviction(&unsent, req("d1"), false, now()) {
            Some(TaskManual::EvictNow(a)) => assert_eq!((a.attempt, a.noop), (1, false)),
            other => panic!("{other:?}"),
        }
    }

    #[test]
    fn an_eviction_with_no_attempt_on_a_robot_is_only_recorded() {
        for state in [
            TaskState::Pending,
            TaskState::Failed,
            TaskState::Completed,
            TaskState::Cancelled,
        ] {
            let mut s = status(state, 3);
            match decide_eviction(&s, req("d1"), true, now()) {
                Some(TaskManual::NothingToEvict(a)) => {
                    assert!(a.noop, "{state:?}");
                    let message = a.message.clone().unwrap_or_default();
                    assert!(message.starts_with("nothing to evict: the task is"), "{message}");
                    s.eviction = Some(a);
                }
                other => panic!("{state:?}: {other:?}"),
            }
            assert!(
                !s.eviction_requested(),
                "{state:?}: a record of nothing evicts nothing"
            );
        }
        let mut cancelling = status(TaskState::Running, 1);
        cancelling.cancellation = Some(req("c1").unwrap().acted(now(), 1, "stopping"));
        assert!(matches!(
            decide_eviction(&cancelling, req("d1"), true, now()),
            Some(TaskManual::NothingToEvict(_))
        ));
        assert_eq!(
            decide_eviction(&status(TaskState::Running, 1), None, true, now()),
            None
        );
    }

    #[test]
    fn an_owner_stays_cancelled_until_a_later_retry() {
        let c = req("c").unwrap().acted(now(), 0, "");
        let earlier = req("r")
            .unwrap()
            .acted("2026-11-23T09:00:00Z".parse().unwrap(), 0, "");
        let later = req("r")
            .unwrap()
            .acted("2026-11-23T11:00:00Z".parse().unwrap(), 0, "");
        assert!(still_cancelled(Some(&c), None));
        assert!(still_cancelled(Some(&c), Some(&earlier)));
        assert!(!still_cancelled(Some(&c), Some(&later)));
        assert!(!still_cancelled(None, Some(&later)));
        let m = meta(&[(ANNOTATION_CANCEL, "c"), (ANNOTATION_RETRY, "r")]);
        let owner = decide_owner(&m, Some(&c), None);
        assert_eq!(owner.cancel, None, "acted on already");
        assert_eq!(owner.retry.map(|r| r.value).as_deref(), Some("r"));
    }

    #[test]
    fn a_retry_after_a_cancel_is_not_cancelled_again() {
        let mut s = status(TaskState::Pending, 2);
        s.cancellation = Some(req("c1").unwrap().acted(now(), 2, "cancelled"));
        assert!(s.cancel_requested());
        s.retry = Some(req("r1").unwrap().acted(now(), 2, "retried"));
        assert!(
            !s.cancel_requested(),
            "retried after the cancel, not yet scheduled"
        );
        assert_eq!(decide_task(&s, req("c1"), req("r1"), false, true, now()), None);
        s.attempt = 3;
        s.retry = None;
        assert!(!s.cancel_requested(), "the cancel covered attempt 2");
    }
}
