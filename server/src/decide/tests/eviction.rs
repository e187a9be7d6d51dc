//! Cancels of a person's cancel and of `k8s4r drain`'s eviction.

use super::*;
use k8s4r_api::ManualAction;

fn asked(attempt: u32, by: Option<&str>) -> Option<ManualAction> {
    Some(ManualAction {
        value: "2026-11-22T09:59:00Z".into(),
        by: by.map(str::to_owned),
        at: t("2026-11-22T09:59:00Z"),
        attempt,
        ..Default::default()
    })
}

/// A Task running `attempt` on rb1, its dispatch acknowledged.
fn running(attempt: u32) -> TaskBuilder {
    TaskBuilder::new()
        .target("rb1")
        .state(TaskState::Running, attempt, 3)
        .dispatched(attempt)
}

fn evicted(mut task: TaskBuilder, attempt: u32, by: Option<&str>) -> Task {
    task.0.status.as_mut().unwrap().eviction = asked(attempt, by);
    task.0
}

#[test]
fn an_evicted_attempt_is_stopped_by_a_cancel_that_drains() {
    let task = evicted(running(2), 2, Some("alice"));
    let action = decide_task(&task, Some(RobotPhase::Online), None, now());
    assert_eq!(
        action,
        TaskAction::Evict {
            robot: "rb1".into(),
            attempt: 2
        }
    );
    let stop = Stop::eviction(task.status.as_ref().unwrap());
    assert_eq!(stop.reason, "robot drained (k8s4r drain by alice)");
    let message = stop.message("u1", 2);
    assert!(message.drain);
    assert_eq!(
        String::from_utf8(k8s4r_api::protocol::encode(&message)).unwrap(),
        r#"{"v":1,"taskUid":"u1","attempt":2,"reason":"robot drained (k8s4r drain by alice)","drain":true}"#
    );
    let anonymous = evicted(running(2), 2, None);
    assert_eq!(
        Stop::eviction(anonymous.status.as_ref().unwrap()).reason,
        "robot drained (k8s4r drain)"
    );
}

#[test]
fn an_eviction_acts_on_its_own_attempt_only_and_only_if_it_was_sent() {
    // Asked at attempt 1; the task runs attempt 2 elsewhere now.
    let moved = evicted(running(2), 1, None);
    assert_eq!(
        decide_task(&moved, Some(RobotPhase::Online), None, now()),
        TaskAction::Nothing
    );
    // An eviction that found nothing to do stops nothing.
    let mut noop = evicted(running(2), 2, None);
    noop.status.as_mut().unwrap().eviction.as_mut().unwrap().noop = true;
    assert_eq!(
        decide_task(&noop, Some(RobotPhase::Online), None, now()),
        TaskAction::Nothing
    );
    // A dispatch never sent is neither sent nor cancelled.
    let unsent = evicted(
        TaskBuilder::new()
            .target("rb1")
            .state(TaskState::Dispatching, 2, 0),
        2,
        None,
    );
    assert_eq!(
        decide_task(&unsent, Some(RobotPhase::Online), None, now()),
        TaskAction::Nothing
    );
    // Over: the robot reported the attempt drained.
    let over = evicted(
        TaskBuilder::new().target("rb1").state(TaskState::Failed, 2, 4),
        2,
        None,
    );
    assert_eq!(
        decide_task(&over, Some(RobotPhase::Online), None, now()),
        TaskAction::Nothing
    );
}

#[test]
fn a_cancel_wins_over_an_eviction() {
    let mut task = evicted(running(2), 2, Some("alice"));
    task.status.as_mut().unwrap().cancellation = asked(2, Some("bob"));
    assert_eq!(
        decide_task(&task, Some(RobotPhase::Online), None, now()),
        TaskAction::Cancel {
            robot: "rb1".into(),
            attempt: 2
        }
    );
    assert_eq!(Stop::of_task(&task), Stop::cancel("cancelled by bob"));
    let deleted = TaskBuilder(task).finalizer().deleting().0;
    assert_eq!(Stop::of_task(&deleted), Stop::cancel("Task deleted"));
}

#[test]
fn a_robot_holding_an_evicted_attempt_is_told_to_drain_it() {
    let task = evicted(running(2), 2, Some("alice"));
    let held = TaskAttempt::new("u1", 2);
    let stop = unwanted(&held, "rb1", &task).expect("the robot should not hold it");
    assert!(stop.drain, "{stop:?}");
    let holding = Holding {
        held: std::slice::from_ref(&held),
        complete: true,
        last_seq: Some(3),
        sent_at: Some(now()),
    };
    let lookup = |_: &str| Some(std::sync::Arc::new(task.clone()));
    let plan = plan_reconcile("rb1", holding, lookup, [&task], now());
    assert_eq!(plan.cancel, [(held.clone(), stop)]);
    // A cancelled one is cancelled, not drained.
    let mut cancelled = task.clone();
    cancelled.status.as_mut().unwrap().cancellation = asked(2, None);
    assert_eq!(
        unwanted(&held, "rb1", &cancelled),
        Some(Stop::cancel("the Task was cancelled"))
    );
    // The attempt after the eviction is wanted.
    let next = evicted(running(3), 2, None);
    assert_eq!(unwanted(&TaskAttempt::new("u1", 3), "rb1", &next), None);
}
