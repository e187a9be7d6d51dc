use super::placement::avoided_robot;
use super::*;

fn now() -> Timestamp {
    "2026-11-25T10:00:00Z".parse().unwrap()
}

fn action(message: &str) -> ManualAction {
    ManualAction {
        value: "1".into(),
        by: Some("ann".into()),
        at: now(),
        attempt: 2,
        message: Some(message.into()),
        noop: false,
    }
}

fn failed(attempt: u32, robot: &str) -> TaskStatus {
    TaskStatus {
        state: Some(TaskState::Failed),
        attempt,
        robot: Some(robot.into()),
        exit_code: Some(3),
        reason: Some(TaskReason::Error),
        ..TaskStatus::default()
    }
}

#[test]
fn a_cancel_before_the_robot_has_the_task_ends_it_now() {
    let plan = plan_manual(
        &TaskStatus::default(),
        TaskManual::CancelNow(action("cancelled by ann")),
        now(),
    );
    assert_eq!(plan.patch.state, Some(TaskState::Cancelled));
    assert_eq!(plan.patch.reason, Some(Some(TaskReason::Cancelled)));
    assert_eq!(plan.patch.finish_time, Some(Some(now())));
    assert_eq!(plan.patch.next_attempt_time, Some(None));
    assert_eq!(plan.event, Note::normal("Cancelled", "cancelled by ann"));
}

#[test]
fn a_cancel_of_a_running_attempt_is_only_recorded() {
    let plan = plan_manual(
        &TaskStatus::default(),
        TaskManual::CancelRunning(action("stopping")),
        now(),
    );
    assert_eq!(plan.patch.state, None);
    assert_eq!(plan.patch.cancellation, Some(action("stopping")));
    assert_eq!(plan.event.reason, "Cancelling");
}

#[test]
fn a_stopped_attempt_is_cancelled_by_whoever_asked() {
    let status = TaskStatus {
        cancellation: Some(action("x")),
        finish_time: Some(Timestamp::UNIX_EPOCH),
        ..failed(2, "r1")
    };
    let plan = plan_manual(&status, TaskManual::Cancelled, now());
    let message = "cancelled by ann: attempt 2 stopped on robot r1";
    assert_eq!(plan.patch.state, Some(TaskState::Cancelled));
    assert_eq!(plan.patch.message, Some(Some(message.into())));
    assert_eq!(plan.patch.finish_time, Some(Some(Timestamp::UNIX_EPOCH)));
    assert_eq!(plan.event, Note::normal("Cancelled", message));
}

#[test]
fn a_request_with_nothing_to_do_is_recorded() {
    let nothing = |cancel| TaskManual::Record {
        cancel,
        action: action("nothing"),
    };
    let plan = plan_manual(&TaskStatus::default(), nothing(true), now());
    assert_eq!(plan.patch.cancellation, Some(action("nothing")));
    assert_eq!(plan.event.reason, "NothingToCancel");
    let plan = plan_manual(&TaskStatus::default(), nothing(false), now());
    assert_eq!(plan.patch.retry, Some(action("nothing")));
    assert_eq!(plan.event.reason, "NothingToRetry");
}

#[test]
fn a_retry_records_the_attempt_that_ended() {
    let plan = plan_manual(&failed(2, "r1"), TaskManual::Retry(action("retried")), now());
    assert_eq!(plan.patch.state, Some(TaskState::Pending));
    let attempts = plan.patch.attempts.unwrap();
    assert_eq!(attempts.len(), 1);
    assert_eq!(attempts[0].attempt, 2);
    assert_eq!(attempts[0].robot.as_deref(), Some("r1"));
    assert_eq!(attempts[0].exit_code, Some(3));
    assert_eq!(attempts[0].finish_time, Some(now()));
    assert_eq!(plan.event, Note::normal("Retried", "retried"));
}

/// `kubectl get rtask` after a person's retry of a cancelled task
/// showed the cancelled attempt's ROBOT, EXIT 143 and REASON Cancelled
/// on the task that waited for its next attempt.
#[test]
fn a_persons_retry_clears_the_ended_attempt_from_the_columns() {
    let cancelled = TaskStatus {
        state: Some(TaskState::Cancelled),
        exit_code: Some(143),
        signal: Some(15),
        reason: Some(TaskReason::Cancelled),
        message: Some("cancelled by ann: attempt 2 stopped on robot r1".into()),
        finish_time: Some(Timestamp::UNIX_EPOCH),
        ..failed(2, "r1")
    };
    let plan = plan_manual(&cancelled, TaskManual::Retry(action("retried by ann")), now());
    let patch = plan.patch;
    assert_eq!(patch.state, Some(TaskState::Pending));
    assert_eq!(
        (&patch.robot, patch.exit_code, patch.signal, patch.reason),
        (&Some(None), Some(None), Some(None), Some(None))
    );
    assert_eq!(patch.finish_time, Some(None));
    assert_eq!(patch.message, Some(Some("retried by ann".into())));
    let attempts = patch.attempts.clone().unwrap();
    assert_eq!(
        (
            attempts[0].state,
            attempts[0].robot.as_deref(),
            attempts[0].exit_code,
            attempts[0].reason,
            attempts[0].finish_time
        ),
        (
            TaskState::Cancelled,
            Some("r1"),
            Some(143),
            Some(TaskReason::Cancelled),
            Some(Timestamp::UNIX_EPOCH)
        ),
        "the ended attempt keeps its values in attempts[]"
    );
    // A merge patch removes a field written as null.
    let body = serde_json::to_value(&patch).unwrap();
    for field in ["robot", "exitCode", "signal", "reason"] {
        assert_eq!(body.get(field), Some(&serde_json::Value::Null), "{field}: {body}");
    }
}

#[test]
fn a_retry_shows_the_attempt_to_come_not_the_one_that_ended() {
    let status = TaskStatus {
        signal: Some(15),
        message: Some("exited with code 3".into()),
        restarts: k8s4r_api::RestartStatus {
            restart_count: 2,
            last_exit_code: Some(1),
            last_restart_time: Some(Timestamp::UNIX_EPOCH),
        },
        dispatch_time: Some(Timestamp::UNIX_EPOCH),
        start_time: Some(Timestamp::UNIX_EPOCH),
        finish_time: Some(now()),
        output_tail: Some("boom\n".into()),
        ..failed(1, "r1")
    };
    let (patch, event) = plan_retry(&status, Duration::from_secs(10), now());
    assert_eq!(patch.state, Some(TaskState::Pending));
    assert_eq!(
        patch.next_attempt_time,
        Some(Some(plus(now(), Duration::from_secs(10))))
    );
    assert_eq!(
        (&patch.robot, patch.exit_code, patch.signal),
        (&Some(None), Some(None), Some(None))
    );
    // The REASON column says the task waits for its retry's delay.
    assert_eq!(patch.reason, Some(Some(TaskReason::BackOff)));
    assert_eq!(patch.restart_count, Some(None));
    assert_eq!(patch.last_exit_code, Some(None));
    assert_eq!(patch.dispatch_time, Some(None));
    assert_eq!((patch.start_time, patch.finish_time), (Some(None), Some(None)));
    assert_eq!(patch.output_tail, None, "the last output stays for k8s4r logs");
    let message = "attempt 1 on robot r1 ended (Error, exit code 3): exited with code 3; attempt 2 in 10s";
    assert_eq!(patch.message, Some(Some(message.into())));
    assert_eq!(event, Note::normal("Retrying", message));
    let attempts = patch.attempts.clone().unwrap();
    assert_eq!(
        (
            attempts[0].attempt,
            attempts[0].robot.as_deref(),
            attempts[0].exit_code,
            attempts[0].reason,
            attempts[0].finish_time
        ),
        (1, Some("r1"), Some(3), Some(TaskReason::Error), Some(now()))
    );
    let body = serde_json::to_value(&patch).unwrap();
    assert_eq!(body.get("reason"), Some(&serde_json::json!("BackOff")));
    for field in ["robot", "exitCode", "signal", "restartCount", "startTime"] {
        assert_eq!(body.get(field), Some(&serde_json::Value::Null), "{field}: {body}");
    }
    assert_eq!(body.get("outputTail"), None, "{body}");
}

#[test]
fn an_unschedulable_task_is_told_once_per_reason() {
    let status = TaskStatus {
        state: Some(TaskState::Pending),
        ..TaskStatus::default()
    };
    let patch =
        plan_unschedulable(&status, TaskReason::Unschedulable, "0/2 robots: 2 offline", now()).unwrap();
    assert_eq!(patch.state, Some(TaskState::Pending));
    // The REASON column says the task waits for a robot.
    assert_eq!(patch.reason, Some(Some(TaskReason::Unschedulable)));
    let conditions = patch.conditions.unwrap();
    assert_eq!(conditions[0].reason.as_deref(), Some("Unschedulable"));
    assert_eq!(conditions[0].last_transition_time, Some(now()));
    let told = TaskStatus {
        conditions,
        reason: Some(TaskReason::Unschedulable),
        ..status
    };
    assert_eq!(
        plan_unschedulable(&told, TaskReason::Unschedulable, "0/2 robots: 2 offline", now()),
        None
    );
    assert!(plan_unschedulable(&told, TaskReason::Unschedulable, "0/3 robots: 3 offline", now()).is_some());
}

#[test]
fn a_dispatch_starts_a_clean_attempt_with_a_deadline() {
    let patch = plan_dispatch(&failed(1, "r1"), 2, "r2", now(), Duration::from_secs(60));
    assert_eq!(patch.state, Some(TaskState::Dispatching));
    assert_eq!(patch.attempt, Some(2));
    assert_eq!(patch.robot, Some(Some("r2".into())));
    assert_eq!(
        patch.dispatch_deadline,
        Some(Some(plus(now(), Duration::from_secs(60))))
    );
    assert_eq!(patch.exit_code, Some(None));
    assert_eq!(patch.reason, Some(None));
    let conditions = patch.conditions.unwrap();
    assert_eq!(
        conditions[0].message.as_deref(),
        Some("attempt 2 assigned to robot r2")
    );
}

#[test]
fn the_robot_that_lost_the_last_attempt_is_avoided() {
    let mut status = failed(1, "r1");
    status.attempts.push(AttemptRecord {
        start_time: None,
        attempt: 1,
        robot: Some("r1".into()),
        state: TaskState::Failed,
        exit_code: None,
        reason: Some(TaskReason::RobotLost),
        message: None,
        finish_time: None,
    });
    assert_eq!(avoided_robot(&status).as_deref(), Some("r1"));
    status.attempts[0].reason = Some(TaskReason::Error);
    assert_eq!(avoided_robot(&status), None);
}

fn running(attempt: u32, robot: &str) -> TaskStatus {
    TaskStatus {
        state: Some(TaskState::Running),
        exit_code: None,
        reason: None,
        ..failed(attempt, robot)
    }
}

#[test]
fn an_eviction_of_an_attempt_on_its_robot_is_recorded_for_the_server() {
    let status = running(2, "r1");
    let plan = plan_manual(&status, TaskManual::Evict(action("evicted by ann")), now());
    assert_eq!(
        plan.patch,
        TaskStatusPatch {
            eviction: Some(action("evicted by ann")),
            ..TaskStatusPatch::default()
        },
        "the attempt runs on until its robot reports its end"
    );
    assert_eq!(plan.event, Note::normal("Evicted", "evicted by ann"));
    let plan = plan_manual(&status, TaskManual::NothingToEvict(action("nothing")), now());
    assert_eq!(plan.patch.eviction, Some(action("nothing")));
    assert_eq!(plan.patch.state, None);
    assert_eq!(plan.event.reason, "NothingToEvict");
}

#[test]
fn an_eviction_of_an_attempt_never_sent_moves_the_task_at_once() {
    let status = TaskStatus {
        state: Some(TaskState::Dispatching),
        ..running(2, "r1")
    };
    let plan = plan_manual(&status, TaskManual::EvictNow(action("evicted")), now());
    assert_eq!(plan.patch.state, Some(TaskState::Pending));
    assert_eq!(plan.patch.next_attempt_time, Some(None), "no wait");
    assert_eq!(plan.patch.eviction, Some(action("evicted")));
    assert_eq!((&plan.patch.robot, plan.patch.reason), (&Some(None), Some(None)));
    assert_eq!(plan.patch.message, Some(Some("evicted".into())));
    let attempts = plan.patch.attempts.unwrap();
    assert_eq!(attempts.len(), 1);
    assert_eq!(
        (
            attempts[0].attempt,
            attempts[0].reason,
            attempts[0].robot.as_deref()
        ),
        (2, Some(TaskReason::Drained), Some("r1"))
    );
    assert_eq!(plan.event.reason, "Evicted");
}

/// The whole of an eviction as the manager sees it: recorded, the
/// attempt runs on, the robot reports its end (an older agent says
/// Cancelled), the task is pending again with no retry used and goes
/// to another robot.
#[test]
fn a_drained_end_returns_the_task_to_pending() {
    use crate::lifecycle::{next_step, retry_delay, LifecycleConfig, RobotHealth, Step};
    let cfg = LifecycleConfig::default();
    let spec = k8s4r_api::TaskSpec::default();
    let health = RobotHealth::heard_at(now());
    let mut status = running(2, "r1");
    status.eviction = Some(action("evicted by ann"));
    assert!(matches!(
        next_step(&spec, Some(&status), health, now(), &cfg),
        Step::Wait(_)
    ));
    status.state = Some(TaskState::Failed);
    status.reason = Some(TaskReason::Cancelled);
    status.message = Some("cancelled".into());
    let step = next_step(&spec, Some(&status), health, now(), &cfg);
    let Step::Return { reason, delay } = step else {
        panic!("{step:?}");
    };
    assert_eq!((reason, delay), (TaskReason::Drained, Duration::ZERO));
    let (patch, event) = plan_return(&status, reason, delay, now());
    assert_eq!(patch.state, Some(TaskState::Pending));
    assert_eq!(
        (&patch.robot, patch.exit_code, patch.reason),
        (&Some(None), Some(None), Some(None)),
        "the drained attempt's robot and reason are in attempts[], not the columns"
    );
    assert_eq!(
        patch.message.clone().flatten().as_deref(),
        Some(
            "attempt 2 on robot r1: the robot was drained; the task waits for a robot again (no retry used)"
        )
    );
    assert_eq!(patch.next_attempt_time, Some(Some(now())));
    assert_eq!(patch.cancellation, None, "never marked cancelled");
    assert_eq!(event.reason, "Drained");
    assert_eq!(event.type_, EventType::Warning);
    assert_eq!(
        event.message,
        "attempt 2 on robot r1: the robot was drained; the task waits for a robot again (no retry used)"
    );
    status.attempts = patch.attempts.unwrap();
    assert_eq!(status.attempts[0].reason, Some(TaskReason::Drained));
    assert_eq!(avoided_robot(&status).as_deref(), Some("r1"));
    // The next attempt fails: no retry was used by the drain.
    status.attempt = 3;
    status.reason = Some(TaskReason::RobotLost);
    assert_eq!(retry_delay(&status, None, &cfg), Some(Duration::ZERO));
}

#[test]
fn a_robot_not_ready_says_why_in_its_own_words() {
    let status = TaskStatus {
        reason: Some(TaskReason::NotReady),
        message: Some("battery Gt 30 is not met (battery=12)".into()),
        ..failed(1, "r1")
    };
    let (patch, event) = plan_return(&status, TaskReason::NotReady, Duration::from_secs(1), now());
    assert_eq!(event.reason, "NotReady");
    assert_eq!(
        event.message,
        "attempt 1 on robot r1: battery Gt 30 is not met (battery=12); \
         the task waits for a robot again (no retry used)"
    );
    assert_eq!(
        patch.next_attempt_time,
        Some(Some(plus(now(), Duration::from_secs(1))))
    );
    let attempts = patch.attempts.unwrap();
    assert_eq!(attempts[0].reason, Some(TaskReason::NotReady));
    let status = TaskStatus { attempts, ..status };
    assert_eq!(avoided_robot(&status).as_deref(), Some("r1"));
}

#[test]
fn a_refused_retry_is_recorded_once_and_leaves_the_task_alone() {
    let plan = plan_refused_retry(action("retried"), "nightly-1795630020", 0);
    let recorded = plan.patch.retry.clone().unwrap();
    assert!(recorded.noop, "the value acts once");
    assert_eq!(recorded.value, "1");
    let message = recorded.message.unwrap();
    assert!(
        message.contains("Forbid") && message.contains("nightly-1795630020"),
        "{message}"
    );
    assert_eq!(
        plan.patch,
        TaskStatusPatch {
            retry: plan.patch.retry.clone(),
            ..TaskStatusPatch::default()
        },
        "no state, attempt or message of the Task changes"
    );
    assert_eq!(plan.event.reason, "RetryRefused");
}

/// The 30-minute fault run (third run) saw a refused retry of an old
/// run's Task start it again: the refusal recorded the current attempt
/// as the retry budget's base, which bought the Task its lost-robot
/// retries afresh, and they ran beside the newer run.
#[test]
fn a_refused_retry_buys_the_task_no_retries() {
    use crate::lifecycle::{retry_delay, LifecycleConfig};
    use crate::manual::retry_base;
    let cfg = LifecycleConfig::default();
    let mut status = failed(4, "r1");
    status.reason = Some(TaskReason::RobotLost);
    status.attempts = (1..=4)
        .map(|attempt| AttemptRecord {
            start_time: None,
            attempt,
            robot: Some("r1".into()),
            state: TaskState::Failed,
            exit_code: None,
            reason: Some(TaskReason::RobotLost),
            message: None,
            finish_time: None,
        })
        .collect();
    assert_eq!(
        retry_delay(&status, None, &cfg),
        None,
        "the lost-robot retries are used up"
    );
    let refused = plan_refused_retry(action("retried"), "nightly-1795630020", retry_base(&status));
    status.retry = refused.patch.retry;
    assert_eq!(
        retry_delay(&status, None, &cfg),
        None,
        "a refused retry is no retry"
    );

    // After a person's retry that acted at attempt 4, a refused one
    // keeps counting from 4.
    status.retry = Some(action("retried"));
    status.retry.as_mut().unwrap().attempt = 4;
    let before = retry_delay(&status, None, &cfg);
    let refused = plan_refused_retry(action("again"), "nightly-1795630020", retry_base(&status));
    status.retry = refused.patch.retry;
    assert_eq!(retry_base(&status), 4);
    assert_eq!(retry_delay(&status, None, &cfg), before);
}

#[test]
fn a_task_waits_for_a_robot_until_its_jobs_pending_deadline() {
    let mut task: Task = serde_json::from_value(serde_json::json!({
        "apiVersion": "robot.k8s4r.io/v1alpha1", "kind": "Task",
        "metadata": { "name": "t", "namespace": "default", "creationTimestamp": "2026-11-25T09:59:00Z" },
        "spec": { "driver": "exec", "command": "true" },
    }))
    .unwrap();
    assert_eq!(pending_deadline(&task, now()), Ok(None), "no deadline: waits");
    task.spec.pending_deadline_seconds = Some(90);
    assert_eq!(pending_deadline(&task, now()), Ok(Some(Duration::from_secs(30))));
    let later: Timestamp = "2026-11-25T10:00:31Z".parse().unwrap();
    let why = pending_deadline(&task, later).unwrap_err();
    assert_eq!(
        why,
        "waited 1m31s for a robot, past its Job's pendingDeadlineSeconds (90s)"
    );
    // A retry waits from when it came due.
    task.status = Some(TaskStatus {
        next_attempt_time: Some("2026-11-25T10:00:20Z".parse().unwrap()),
        ..TaskStatus::default()
    });
    assert_eq!(pending_deadline(&task, later), Ok(Some(Duration::from_secs(79))));
}

#[test]
fn a_persons_retry_restarts_the_pending_deadline() {
    let mut task: Task = serde_json::from_value(serde_json::json!({
        "apiVersion": "robot.k8s4r.io/v1alpha1", "kind": "Task",
        "metadata": { "name": "t", "namespace": "default", "creationTimestamp": "2026-11-25T08:00:00Z" },
        "spec": { "driver": "exec", "command": "true", "pendingDeadlineSeconds": 600 },
    }))
    .unwrap();
    assert!(
        pending_deadline(&task, now()).is_err(),
        "two hours after its creation"
    );
    task.status = Some(TaskStatus {
        retry: Some(ManualAction {
            at: "2026-11-25T09:59:00Z".parse().unwrap(),
            ..action("retried")
        }),
        ..TaskStatus::default()
    });
    assert_eq!(pending_deadline(&task, now()), Ok(Some(Duration::from_secs(540))));
}
