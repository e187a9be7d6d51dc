//! `Connected` after a restart of the cluster side.

use std::collections::HashSet;

use k8s4r_api::{Condition, ConditionStatus, Robot, RobotSpec, RobotStatus};

use super::super::{absent_at_start, heard_after, CONDITION_CONNECTED, REASON_NOT_CONNECTED_AT_START};
use super::t;

fn robot(name: &str, connected: bool, heard: &str) -> Robot {
    let mut robot = Robot::new(name, RobotSpec::default());
    let status = if connected {
        ConditionStatus::True
    } else {
        ConditionStatus::False
    };
    robot.status = Some(RobotStatus {
        conditions: vec![Condition::new(CONDITION_CONNECTED, status, "Connected", "")],
        last_heartbeat_time: Some(t(heard)),
        ..RobotStatus::default()
    });
    robot
}

#[test]
fn robots_the_broker_does_not_know_and_not_heard_since_start_are_not_connected() {
    let started = t("2026-11-22T10:00:00Z");
    let robots = [
        // Left Connected by the previous run, agent gone.
        robot("gone", true, "2026-11-22T09:58:00Z"),
        // Its presence is retained online: true.
        robot("present", true, "2026-11-22T09:58:00Z"),
        // Heartbeat recorded since the start.
        robot("heard", true, "2026-11-22T10:00:05Z"),
        // Already disconnected: nothing to write.
        robot("off", false, "2026-11-22T09:00:00Z"),
    ];
    let present: HashSet<String> = ["present".to_owned()].into();
    let absent = absent_at_start(robots.iter(), &present, started, t("2026-11-22T10:00:10Z"));
    assert_eq!(absent.len(), 1, "{absent:?}");
    let (name, conditions) = &absent[0];
    assert_eq!(name, "gone");
    let condition = conditions
        .iter()
        .find(|c| c.type_ == CONDITION_CONNECTED)
        .unwrap();
    assert_eq!(condition.status, ConditionStatus::False);
    assert_eq!(condition.reason.as_deref(), Some(REASON_NOT_CONNECTED_AT_START));
}

#[test]
fn a_held_will_is_outdated_by_anything_heard_from_the_robot_after_it() {
    let received = t("2026-11-22T10:00:00Z");
    let mut quiet = robot("r", true, "2026-11-22T09:59:00Z");
    quiet.status.as_mut().unwrap().conditions[0].last_transition_time = Some(t("2026-11-22T09:00:00Z"));
    assert!(
        !heard_after(&quiet, None, received),
        "connected all along: the will stands"
    );
    assert!(!heard_after(&quiet, Some(t("2026-11-22T09:59:30Z")), received));
    assert!(
        heard_after(&quiet, Some(t("2026-11-22T10:00:01Z")), received),
        "Lease renewed after"
    );
    let heartbeat = robot("r", true, "2026-11-22T10:00:01Z");
    assert!(heard_after(&heartbeat, None, received));
    // Another replica recorded its `online: true` after the will came.
    let mut back = quiet.clone();
    let status = back.status.as_mut().unwrap();
    status.conditions[0].last_transition_time = Some(t("2026-11-22T10:00:01Z"));
    assert!(heard_after(&back, None, received));
    // A Connected=False written after it is not the robot heard.
    let mut off = robot("r", false, "2026-11-22T09:59:00Z");
    off.status.as_mut().unwrap().conditions[0].last_transition_time = Some(t("2026-11-22T10:00:01Z"));
    assert!(!heard_after(&off, None, received));
    let mut registered = quiet.clone();
    registered.status.as_mut().unwrap().last_registration_time = Some(t("2026-11-22T10:00:01Z"));
    assert!(heard_after(&registered, None, received));
    assert!(!heard_after(
        &Robot::new("r", RobotSpec::default()),
        None,
        received
    ));
}
