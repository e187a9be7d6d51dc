use super::*;
use k8s4r_api::AgentArtifact;

fn spec(max_parallel: i32, max_failed: i32) -> AgentRolloutSpec {
    AgentRolloutSpec {
        version: "0.2.0".into(),
        artifacts: vec![AgentArtifact {
            arch: "x86_64".into(),
            url: "http://files/agent".into(),
            sha256: "ab".repeat(32),
            signature: None,
        }],
        max_parallel: Some(max_parallel),
        max_failed: Some(CountOrPercent::Count(max_failed)),
        ..AgentRolloutSpec::default()
    }
}

struct Fleet {
    labels: BTreeMap<String, String>,
    upgrades: Vec<Option<AgentUpgradeStatus>>,
}

fn report(phase: RobotUpgradePhase) -> Option<AgentUpgradeStatus> {
    Some(AgentUpgradeStatus {
        rollout: "r".into(),
        version: "0.2.0".into(),
        phase,
        reason: Some("because".into()),
        since: Some("2026-11-26T03:59:00Z".parse().unwrap()),
    })
}

impl Fleet {
    fn new(upgrades: Vec<Option<AgentUpgradeStatus>>) -> Self {
        Fleet {
            labels: BTreeMap::new(),
            upgrades,
        }
    }
    /// Robot `i` is `r{i}`, online unless listed, on the old version
    /// unless listed, marked when listed.
    fn views<'a>(&'a self, offline: &[usize], new: &[usize], marked: &[usize]) -> Vec<RobotView<'a>> {
        const NAMES: [&str; 4] = ["r0", "r1", "r2", "r3"];
        (0..self.upgrades.len())
            .map(|i| RobotView {
                name: NAMES[i],
                labels: &self.labels,
                online: !offline.contains(&i),
                arch: Some("x86_64"),
                agent_version: Some(if new.contains(&i) { "0.2.0" } else { "0.1.0" }),
                upgrade: self.upgrades[i].as_ref(),
                marked_for: marked.contains(&i).then_some("r"),
                registered_at: Some("2026-11-26T03:58:00Z".parse().unwrap()),
                facts: None,
                running: Running::default(),
                unschedulable: false,
                cordoned_for: None,
            })
            .collect()
    }
}

fn facts(pairs: &[(&str, serde_json::Value)]) -> Facts {
    pairs
        .iter()
        .map(|(k, v)| ((*k).to_owned(), serde_json::from_value(v.clone()).unwrap()))
        .collect()
}

fn when(json: serde_json::Value) -> Vec<k8s4r_api::facts::FactRequirement> {
    serde_json::from_value(json).unwrap()
}

#[test]
fn a_robot_on_the_version_keeps_its_place_until_its_trial_is_confirmed() {
    let fleet = Fleet::new(vec![report(RobotUpgradePhase::Restarting), None]);
    // r0 registered on the new version, its trial not confirmed yet.
    let p = plan_of(&spec(1, 0), &fleet.views(&[], &[0], &[0]));
    assert!(p.mark.is_empty(), "r1 waits: {p:?}");
    assert_eq!(p.status.upgraded, 0);
    let confirmed = Fleet::new(vec![report(RobotUpgradePhase::Healthy), None]);
    let p = plan_of(&spec(1, 0), &confirmed.views(&[], &[0], &[0]));
    assert_eq!(p.mark, ["r1"]);
    assert_eq!(p.status.upgraded, 1);
}

#[test]
fn a_robot_that_does_not_meet_when_waits_saying_why_and_holds_no_place() {
    let fleet = Fleet::new(vec![None, None]);
    let spec = AgentRolloutSpec {
        when: when(serde_json::json!([
            {"key": "docked", "operator": "In", "values": ["true"]},
            {"key": "battery", "operator": "Gt", "values": ["50"]}
        ])),
        ..spec(1, 0)
    };
    let (undocked, low) = (
        facts(&[("docked", false.into()), ("battery", 90.into())]),
        facts(&[("docked", true.into()), ("battery", 20.into())]),
    );
    let mut views = fleet.views(&[], &[], &[]);
    views[0].facts = Some(&undocked);
    views[1].facts = Some(&low);
    let p = plan_of(&spec, &views);
    assert!(p.mark.is_empty(), "{p:?}");
    let reasons: Vec<_> = p
        .status
        .robot_upgrades
        .iter()
        .map(|e| e.reason.clone().unwrap())
        .collect();
    assert_eq!(
        reasons,
        ["docked false, needs In [true]", "battery 20, needs Gt 50"]
    );
    // r1 charges: it goes, r0 still waits (and held r1 back from nothing).
    let charged = facts(&[("docked", true.into()), ("battery", 80.into())]);
    views[1].facts = Some(&charged);
    assert_eq!(plan_of(&spec, &views).mark, ["r1"]);
}

#[test]
fn outside_its_maintenance_window_no_robot_starts() {
    let fleet = Fleet::new(vec![None]);
    let window = |schedule: &str| AgentRolloutSpec {
        maintenance_window: Some(k8s4r_api::MaintenanceWindow {
            schedule: schedule.into(),
            duration: "2h".into(),
            time_zone: Some("UTC".into()),
        }),
        ..spec(1, 0)
    };
    // now() is 04:00 UTC: a 03:00 window of 2 h is open, a 01:00 one
    // closed until tomorrow.
    assert_eq!(
        plan_of(&window("0 3 * * *"), &fleet.views(&[], &[], &[])).mark,
        ["r0"]
    );
    let closed = plan_of(&window("0 1 * * *"), &fleet.views(&[], &[], &[]));
    assert!(closed.mark.is_empty());
    let why = closed.status.robot_upgrades[0].reason.clone().unwrap();
    assert!(
        why.contains("outside its maintenance window; the next opens at 2026-11-27T01:00:00Z"),
        "{why}"
    );
    let broken = plan_of(&window("not cron"), &fleet.views(&[], &[], &[]));
    assert!(broken.mark.is_empty(), "a window that cannot be read never opens");
}

#[test]
fn a_robot_waits_cordoned_for_its_batch_tasks_and_is_uncordoned_when_done() {
    let fleet = Fleet::new(vec![None, report(RobotUpgradePhase::Healthy)]);
    let spec = AgentRolloutSpec {
        wait_for_tasks: Some(WaitForTasks::Batch),
        ..spec(1, 0)
    };
    let mut views = fleet.views(&[], &[1], &[]);
    views[0].running = Running { batch: 1, all: 2 };
    let p = plan_of(&spec, &views);
    assert!(p.mark.is_empty());
    assert_eq!(p.cordon, ["r0"]);
    let why = p.status.robot_upgrades[0].reason.clone().unwrap();
    assert!(why.contains("1 running batch task(s)"), "{why}");
    // Cordoned and still busy: not cordoned again, not let go.
    views[0].unschedulable = true;
    views[0].cordoned_for = Some("r");
    let p = plan_of(&spec, &views);
    assert!(p.cordon.is_empty() && p.uncordon.is_empty(), "{p:?}");
    // Its batch task ended (its service runs on): it goes, cordoned.
    views[0].running = Running { batch: 0, all: 1 };
    let p = plan_of(&spec, &views);
    assert_eq!(p.mark, ["r0"]);
    assert!(p.uncordon.is_empty());
    // Upgraded: the rollout lifts its cordon; a person's stays.
    let done = Fleet::new(vec![report(RobotUpgradePhase::Healthy)]);
    let mut views = done.views(&[], &[0], &[0]);
    views[0].unschedulable = true;
    views[0].cordoned_for = Some("r");
    assert_eq!(plan_of(&spec, &views).uncordon, ["r0"]);
    views[0].cordoned_for = None;
    assert!(plan_of(&spec, &views).uncordon.is_empty());
    // `all` waits for the service too.
    let all = AgentRolloutSpec {
        wait_for_tasks: Some(WaitForTasks::All),
        ..spec.clone()
    };
    let fleet = Fleet::new(vec![None]);
    let mut views = fleet.views(&[], &[], &[]);
    views[0].running = Running { batch: 0, all: 1 };
    assert!(plan_of(&all, &views).mark.is_empty());
    // A paused rollout holds nobody cordoned.
    views[0].unschedulable = true;
    views[0].cordoned_for = Some("r");
    let paused = AgentRolloutSpec { paused: true, ..all };
    assert_eq!(plan_of(&paused, &views).uncordon, ["r0"]);
}

fn now() -> Timestamp {
    "2026-11-26T04:00:00Z".parse().unwrap()
}

fn plan_of(spec: &AgentRolloutSpec, views: &[RobotView<'_>]) -> Plan {
    let rollout = Rollout {
        name: "r",
        spec,
        cancelled_by: None,
    };
    plan(rollout, views, now())
}

#[test]
fn one_robot_at_a_time_and_the_next_when_it_is_done() {
    let fleet = Fleet::new(vec![None, None, None]);
    let first = plan_of(&spec(1, 0), &fleet.views(&[], &[], &[]));
    assert_eq!(first.mark, ["r0"]);
    assert_eq!(first.status.state, Some(RolloutState::Progressing));
    let busy = plan_of(&spec(1, 0), &fleet.views(&[], &[], &[0]));
    assert!(busy.mark.is_empty(), "r0 holds the only place");
    let done = plan_of(&spec(1, 0), &fleet.views(&[], &[0], &[0]));
    assert_eq!(
        (done.mark, done.unmark),
        (vec!["r1".to_owned()], vec!["r0".to_owned()])
    );
    assert_eq!(done.status.upgraded, 1);
    let all = plan_of(&spec(1, 0), &fleet.views(&[], &[0, 1, 2], &[]));
    assert_eq!(all.status.state, Some(RolloutState::Complete));
    assert!(all.status.robot_upgrades.is_empty());
}

#[test]
fn offline_robots_wait_without_holding_a_place() {
    let fleet = Fleet::new(vec![None, None, None]);
    let p = plan_of(&spec(1, 0), &fleet.views(&[0], &[], &[0]));
    assert_eq!(p.unmark, ["r0"], "ordered, offline, silent: its place is freed");
    assert_eq!(p.mark, ["r1"]);
    let r0 = &p.status.robot_upgrades[0];
    assert_eq!(
        (r0.phase, r0.reason.as_deref()),
        (RobotUpgradePhase::Pending, Some("offline"))
    );
    // One that is restarting onto the new agent is offline for a moment
    // and keeps its place.
    let restarting = Fleet::new(vec![report(RobotUpgradePhase::Restarting), None, None]);
    let p = plan_of(&spec(1, 0), &restarting.views(&[0], &[], &[0]));
    assert!(p.mark.is_empty() && p.unmark.is_empty());
}

#[test]
fn failures_beyond_max_failed_pause_the_rollout() {
    let fleet = Fleet::new(vec![report(RobotUpgradePhase::RolledBack), None, None]);
    let p = plan_of(&spec(1, 0), &fleet.views(&[], &[], &[0]));
    assert_eq!(p.status.state, Some(RolloutState::PausedOnFailures));
    assert_eq!(p.unmark, ["r0"]);
    assert!(p.mark.is_empty(), "no other robot is touched");
    assert_eq!(p.status.failed, 1);
    let r0 = &p.status.robot_upgrades[0];
    assert_eq!(
        (r0.phase, r0.reason.as_deref()),
        (RobotUpgradePhase::RolledBack, Some("because"))
    );
    let tolerant = plan_of(&spec(1, 1), &fleet.views(&[], &[], &[]));
    assert_eq!(tolerant.mark, ["r1"]);
}

#[test]
fn paused_rollouts_start_nobody_and_a_missing_artifact_is_a_failure() {
    let fleet = Fleet::new(vec![None, None]);
    let paused = AgentRolloutSpec {
        paused: true,
        ..spec(2, 5)
    };
    let p = plan_of(&paused, &fleet.views(&[], &[], &[]));
    assert_eq!((p.status.state, p.mark.len()), (Some(RolloutState::Paused), 0));
    let arm_only = AgentRolloutSpec {
        artifacts: vec![AgentArtifact {
            arch: "aarch64".into(),
            ..spec(1, 0).artifacts[0].clone()
        }],
        ..spec(1, 0)
    };
    let p = plan_of(&arm_only, &fleet.views(&[], &[], &[]));
    assert_eq!(p.status.failed, 2);
    assert!(p.status.robot_upgrades[0]
        .reason
        .as_deref()
        .unwrap()
        .contains("no artifact for its architecture x86_64"));
}

#[test]
fn a_robot_marked_for_another_rollout_waits_and_one_silent_too_long_frees_its_place() {
    let fleet = Fleet::new(vec![None, None]);
    let mut views = fleet.views(&[], &[], &[]);
    views[0].marked_for = Some("other");
    let p = plan_of(&spec(1, 0), &views);
    assert_eq!(p.mark, ["r1"]);
    assert_eq!(
        p.status.robot_upgrades[0].reason.as_deref(),
        Some("upgrading for rollout other first")
    );
    // Restarting, offline, its report 1 minute old: still its place
    // (health timeout 2m); 10 minutes old: the place goes on.
    let stuck = Fleet::new(vec![report(RobotUpgradePhase::Restarting), None]);
    let p = plan_of(&spec(1, 0), &stuck.views(&[0], &[], &[0]));
    assert!(p.mark.is_empty());
    let later = Rollout {
        name: "r",
        spec: &spec(1, 0),
        cancelled_by: None,
    };
    let p = plan(
        later,
        &stuck.views(&[0], &[], &[0]),
        "2026-11-26T04:09:00Z".parse().unwrap(),
    );
    assert_eq!((p.mark, p.unmark), (vec!["r1".to_owned()], vec!["r0".to_owned()]));
}

#[test]
fn a_cancelled_rollout_starts_nobody_and_lets_ordered_robots_go() {
    let fleet = Fleet::new(vec![report(RobotUpgradePhase::Restarting), None, None]);
    let s = spec(3, 0);
    let cancelled = Rollout {
        name: "r",
        spec: &s,
        cancelled_by: Some("alice"),
    };
    let p = plan(cancelled, &fleet.views(&[], &[], &[0, 1]), now());
    assert!(p.mark.is_empty());
    assert_eq!(p.unmark, ["r1"], "r1 was only ordered; r0 finishes its trial");
    assert_eq!(p.status.state, Some(RolloutState::Aborted));
    assert!(p.status.message.unwrap().starts_with("cancelled by alice"));
}

#[test]
fn a_new_binary_that_reports_the_old_version_fails_instead_of_being_ordered_again() {
    // r0's new process confirmed its trial (reported after it registered)
    // yet calls itself 0.1.0.
    let fleet = Fleet::new(vec![report(RobotUpgradePhase::Healthy), None]);
    let views = fleet.views(&[], &[], &[0]);
    let p = plan_of(&spec(1, 5), &views);
    assert_eq!(
        p.status.robot_upgrades[0].phase,
        RobotUpgradePhase::Failed,
        "{p:?}"
    );
    let why = p.status.robot_upgrades[0].reason.clone().unwrap();
    assert!(why.contains("reports version 0.1.0, not 0.2.0"), "{why}");
    assert_eq!(p.unmark, ["r0"]);
    assert_eq!(p.mark, ["r1"], "the place goes to the next robot");
    assert_eq!(p.status.failed, 1);
    // Registered again after its report (rolled back by hand): ordered again.
    let mut views = fleet.views(&[], &[], &[]);
    views[0].registered_at = Some("2026-11-26T03:59:30Z".parse().unwrap());
    views.truncate(1);
    let p = plan_of(&spec(1, 5), &views);
    assert_eq!(p.mark, ["r0"], "{p:?}");
}
