//! What an AgentRollout should do next, decided from the robots as they
//! are: which robots to mark for the new agent (the annotation the server
//! turns into an order), which to unmark, and the rollout's status. Pure;
//! the controller reads and writes.
//!
//! The rules are an `everyRobot` group's: at most `maxParallel` robots
//! upgrade at once; an offline robot that has not started waits without
//! holding a place; a robot that joins later is reached; once more robots
//! than `maxFailed` failed or rolled back, no new robot starts.

use std::collections::BTreeMap;

use jiff::Timestamp;
use k8s4r_api::{
    AgentRolloutSpec, AgentRolloutStatus, AgentUpgradeStatus, CountOrPercent, RobotUpgrade,
    RobotUpgradePhase, RolloutState,
};

/// What the plan needs of one Robot.
#[derive(Debug, Clone)]
pub struct RobotView<'a> {
    pub name: &'a str,
    pub labels: &'a BTreeMap<String, String>,
    pub online: bool,
    pub arch: Option<&'a str>,
    pub agent_version: Option<&'a str>,
    pub upgrade: Option<&'a AgentUpgradeStatus>,
    /// The rollout the robot is marked for, if any.
    pub marked_for: Option<&'a str>,
}

/// The writes one reconcile makes.
#[derive(Debug, Clone, PartialEq)]
pub struct Plan {
    pub status: AgentRolloutStatus,
    /// Robots to mark for this rollout.
    pub mark: Vec<String>,
    /// Robots marked for it that no longer should be.
    pub unmark: Vec<String>,
}

/// Where one matched robot stands in rollout `name`.
fn phase_of(
    name: &str,
    spec: &AgentRolloutSpec,
    robot: &RobotView<'_>,
) -> (RobotUpgradePhase, Option<String>) {
    if robot.agent_version == Some(spec.version.as_str()) {
        return (RobotUpgradePhase::Healthy, None);
    }
    let arch = robot.arch.unwrap_or("unknown");
    if !spec.artifacts.iter().any(|a| a.arch == arch) {
        return (
            RobotUpgradePhase::Failed,
            Some(format!("the rollout has no artifact for its architecture {arch}")),
        );
    }
    match robot.upgrade {
        Some(u) if u.rollout == name && u.version == spec.version => match u.phase {
            // It reported healthy, but runs another version (rolled back
            // by hand, or its report is older than its version): again.
            RobotUpgradePhase::Healthy => (RobotUpgradePhase::Pending, None),
            phase => (phase, u.reason.clone()),
        },
        _ if robot.marked_for == Some(name) => (RobotUpgradePhase::Downloading, Some("ordered".into())),
        _ => (RobotUpgradePhase::Pending, None),
    }
}

fn in_progress(phase: RobotUpgradePhase) -> bool {
    matches!(
        phase,
        RobotUpgradePhase::Downloading | RobotUpgradePhase::Staged | RobotUpgradePhase::Restarting
    )
}

/// Decides rollout `name`'s next step over every Robot there is.
pub fn plan(name: &str, spec: &AgentRolloutSpec, robots: &[RobotView<'_>], now: Timestamp) -> Plan {
    let matched: Vec<&RobotView<'_>> = robots
        .iter()
        .filter(|r| spec.robot_selector.as_ref().is_none_or(|s| s.matches(r.labels)))
        .collect();
    let total = i32::try_from(matched.len()).unwrap_or(i32::MAX);
    let max_parallel = usize::try_from(spec.max_parallel.unwrap_or(1).max(1)).unwrap_or(1);
    let max_failed = spec
        .max_failed
        .as_ref()
        .unwrap_or(&CountOrPercent::Count(0))
        .of(total)
        .unwrap_or(0);
    let mut entries = Vec::new();
    let (mut upgraded, mut failed, mut busy) = (0, 0, 0usize);
    let mut waiting = Vec::new();
    let mut unmark = Vec::new();
    for robot in &matched {
        let (mut phase, mut reason) = phase_of(name, spec, robot);
        let marked = robot.marked_for == Some(name);
        match phase {
            RobotUpgradePhase::Healthy => {
                upgraded += 1;
                if marked {
                    unmark.push(robot.name.to_owned());
                }
                continue;
            }
            RobotUpgradePhase::Failed | RobotUpgradePhase::RolledBack => {
                failed += 1;
                if marked {
                    unmark.push(robot.name.to_owned());
                }
            }
            // Ordered but offline before it reported anything: the place
            // goes to another robot, and it waits.
            RobotUpgradePhase::Downloading if marked && !robot.online && robot.upgrade.is_none() => {
                unmark.push(robot.name.to_owned());
                (phase, reason) = (RobotUpgradePhase::Pending, Some("offline".into()));
            }
            p if in_progress(p) => busy += 1,
            _ => {
                if robot.online {
                    waiting.push(robot.name);
                }
                reason =
                    reason.or_else(|| Some(if robot.online { "waits its turn" } else { "offline" }.into()));
            }
        }
        entries.push(RobotUpgrade {
            robot: robot.name.to_owned(),
            phase,
            reason,
            since: robot.upgrade.and_then(|u| u.since),
        });
    }
    // Robots marked for this rollout that it no longer matches.
    for robot in robots {
        if robot.marked_for == Some(name) && !matched.iter().any(|m| m.name == robot.name) {
            unmark.push(robot.name.to_owned());
        }
    }
    let over_budget = failed > max_failed;
    let mut mark = Vec::new();
    if !spec.paused && !over_budget {
        for robot in waiting {
            if busy >= max_parallel {
                break;
            }
            if !unmark.iter().any(|u| u == robot) {
                mark.push(robot.to_owned());
                busy += 1;
            }
        }
    }
    for entry in &mut entries {
        if mark.contains(&entry.robot) {
            entry.phase = RobotUpgradePhase::Downloading;
            entry.reason = Some("ordered".into());
            entry.since = Some(now);
        }
    }
    let (state, message) = if upgraded == total {
        (
            RolloutState::Complete,
            format!("all {total} robots run {}", spec.version),
        )
    } else if over_budget {
        (
            RolloutState::PausedOnFailures,
            format!(
                "{failed} robots failed or rolled back, more than maxFailed allows ({max_failed}): no \
                 robot starts; raise maxFailed, or fix the artifact and make a new rollout"
            ),
        )
    } else if spec.paused {
        (RolloutState::Paused, "paused (spec.paused)".to_owned())
    } else {
        (
            RolloutState::Progressing,
            format!(
                "{upgraded} of {total} robots run {}; {busy} upgrading",
                spec.version
            ),
        )
    };
    Plan {
        status: AgentRolloutStatus {
            state: Some(state),
            message: Some(message),
            robots: total,
            upgraded,
            failed,
            robot_upgrades: entries,
            observed_generation: None,
            conditions: Vec::new(),
        },
        mark,
        unmark,
    }
}

#[cfg(test)]
mod tests {
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
            since: None,
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
                })
                .collect()
        }
    }

    fn now() -> Timestamp {
        "2026-11-26T04:00:00Z".parse().unwrap()
    }

    #[test]
    fn one_robot_at_a_time_and_the_next_when_it_is_done() {
        let fleet = Fleet::new(vec![None, None, None]);
        let first = plan("r", &spec(1, 0), &fleet.views(&[], &[], &[]), now());
        assert_eq!(first.mark, ["r0"]);
        assert_eq!(first.status.state, Some(RolloutState::Progressing));
        let busy = plan("r", &spec(1, 0), &fleet.views(&[], &[], &[0]), now());
        assert!(busy.mark.is_empty(), "r0 holds the only place");
        let done = plan("r", &spec(1, 0), &fleet.views(&[], &[0], &[0]), now());
        assert_eq!(
            (done.mark, done.unmark),
            (vec!["r1".to_owned()], vec!["r0".to_owned()])
        );
        assert_eq!(done.status.upgraded, 1);
        let all = plan("r", &spec(1, 0), &fleet.views(&[], &[0, 1, 2], &[]), now());
        assert_eq!(all.status.state, Some(RolloutState::Complete));
        assert!(all.status.robot_upgrades.is_empty());
    }

    #[test]
    fn offline_robots_wait_without_holding_a_place() {
        let fleet = Fleet::new(vec![None, None, None]);
        let p = plan("r", &spec(1, 0), &fleet.views(&[0], &[], &[0]), now());
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
        let p = plan("r", &spec(1, 0), &restarting.views(&[0], &[], &[0]), now());
        assert!(p.mark.is_empty() && p.unmark.is_empty());
    }

    #[test]
    fn failures_beyond_max_failed_pause_the_rollout() {
        let fleet = Fleet::new(vec![report(RobotUpgradePhase::RolledBack), None, None]);
        let p = plan("r", &spec(1, 0), &fleet.views(&[], &[], &[0]), now());
        assert_eq!(p.status.state, Some(RolloutState::PausedOnFailures));
        assert_eq!(p.unmark, ["r0"]);
        assert!(p.mark.is_empty(), "no other robot is touched");
        assert_eq!(p.status.failed, 1);
        let r0 = &p.status.robot_upgrades[0];
        assert_eq!(
            (r0.phase, r0.reason.as_deref()),
            (RobotUpgradePhase::RolledBack, Some("because"))
        );
        let tolerant = plan("r", &spec(1, 1), &fleet.views(&[], &[], &[]), now());
        assert_eq!(tolerant.mark, ["r1"]);
    }

    #[test]
    fn paused_rollouts_start_nobody_and_a_missing_artifact_is_a_failure() {
        let fleet = Fleet::new(vec![None, None]);
        let paused = AgentRolloutSpec {
            paused: true,
            ..spec(2, 5)
        };
        let p = plan("r", &paused, &fleet.views(&[], &[], &[]), now());
        assert_eq!((p.status.state, p.mark.len()), (Some(RolloutState::Paused), 0));
        let arm_only = AgentRolloutSpec {
            artifacts: vec![AgentArtifact {
                arch: "aarch64".into(),
                ..spec(1, 0).artifacts[0].clone()
            }],
            ..spec(1, 0)
        };
        let p = plan("r", &arm_only, &fleet.views(&[], &[], &[]), now());
        assert_eq!(p.status.failed, 2);
        assert!(p.status.robot_upgrades[0]
            .reason
            .as_deref()
            .unwrap()
            .contains("no artifact for its architecture x86_64"));
    }
}
