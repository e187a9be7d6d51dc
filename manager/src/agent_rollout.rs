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
use std::time::Duration;

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

/// The rollout as the plan reads it.
#[derive(Debug, Clone, Copy)]
pub struct Rollout<'a> {
    pub name: &'a str,
    pub spec: &'a AgentRolloutSpec,
    /// Who cancelled it (the cancel annotation), when someone did.
    pub cancelled_by: Option<&'a str>,
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

/// Robots listed in a rollout's status at most (all are counted).
pub const MAX_LISTED: usize = 1000;

/// A robot's health timeout when the rollout names none (the server sends
/// the same default with the order).
pub const DEFAULT_HEALTH_TIMEOUT: Duration = Duration::from_secs(120);

impl Rollout<'_> {
    fn health_timeout(&self) -> Duration {
        self.spec
            .health_timeout
            .as_deref()
            .and_then(|t| k8s4r_api::parse_duration(t).ok())
            .unwrap_or(DEFAULT_HEALTH_TIMEOUT)
    }

    /// Where one matched robot stands.
    fn phase_of(&self, robot: &RobotView<'_>, now: Timestamp) -> (RobotUpgradePhase, Option<String>) {
        let spec = self.spec;
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
        let marked = robot.marked_for == Some(self.name);
        match robot.upgrade {
            Some(u) if u.rollout == self.name && u.version == spec.version => match u.phase {
                // It reported healthy, but runs another version (rolled back
                // by hand, or its report is older than its version): again.
                RobotUpgradePhase::Healthy => (RobotUpgradePhase::Pending, None),
                // Switched, then silent for far longer than its trial: it
                // lost power or its network. It settles its trial by itself
                // when it comes back; meanwhile its place goes to another.
                phase if in_progress(phase) && !robot.online && self.overdue(u.since, now) => (
                    RobotUpgradePhase::Pending,
                    Some(format!(
                        "offline since it was {}; it settles its upgrade when it comes back",
                        phase_word(phase)
                    )),
                ),
                phase => (phase, u.reason.clone()),
            },
            // Ordered but offline before it reported anything: the place
            // goes to another robot, and it waits.
            _ if marked && !robot.online => (RobotUpgradePhase::Pending, Some("offline".into())),
            _ if marked => (RobotUpgradePhase::Downloading, Some("ordered".into())),
            _ => match robot.marked_for {
                Some(other) => (
                    RobotUpgradePhase::Pending,
                    Some(format!("upgrading for rollout {other} first")),
                ),
                None if robot.online => (RobotUpgradePhase::Pending, Some("waits its turn".into())),
                None => (RobotUpgradePhase::Pending, Some("offline".into())),
            },
        }
    }

    /// Whether a phase recorded at `since` is older than twice the health
    /// timeout (a trial is long settled on the robot by then).
    fn overdue(&self, since: Option<Timestamp>, now: Timestamp) -> bool {
        let Some(since) = since else {
            return false;
        };
        let waited = Duration::try_from(now.duration_since(since)).unwrap_or_default();
        waited > self.health_timeout() * 2
    }
}

fn phase_word(phase: RobotUpgradePhase) -> &'static str {
    match phase {
        RobotUpgradePhase::Downloading => "downloading",
        RobotUpgradePhase::Staged => "staged",
        _ => "restarting",
    }
}

fn in_progress(phase: RobotUpgradePhase) -> bool {
    matches!(
        phase,
        RobotUpgradePhase::Downloading | RobotUpgradePhase::Staged | RobotUpgradePhase::Restarting
    )
}

/// The matched robots, sorted out.
#[derive(Default)]
struct Tally {
    entries: Vec<RobotUpgrade>,
    upgraded: i32,
    failed: i32,
    busy: usize,
    /// Online robots that wait for a place, in name order.
    waiting: Vec<String>,
    unmark: Vec<String>,
}

impl Tally {
    fn count(&mut self, rollout: &Rollout<'_>, robot: &RobotView<'_>, now: Timestamp) {
        let (phase, reason) = rollout.phase_of(robot, now);
        let marked = robot.marked_for == Some(rollout.name);
        let keeps_mark = match phase {
            RobotUpgradePhase::Healthy => {
                self.upgraded += 1;
                false
            }
            RobotUpgradePhase::Failed | RobotUpgradePhase::RolledBack => {
                self.failed += 1;
                false
            }
            p if in_progress(p) => {
                self.busy += 1;
                true
            }
            _ => {
                if robot.online && robot.marked_for.is_none() {
                    self.waiting.push(robot.name.to_owned());
                }
                false
            }
        };
        if marked && !keeps_mark {
            self.unmark.push(robot.name.to_owned());
        }
        // A robot on the version is listed when this rollout took it there
        // (one already on it is only counted).
        let took_it = robot.upgrade.is_some_and(|u| u.rollout == rollout.name);
        if phase != RobotUpgradePhase::Healthy || took_it {
            self.entries.push(RobotUpgrade {
                robot: robot.name.to_owned(),
                phase,
                reason,
                since: robot
                    .upgrade
                    .filter(|u| u.rollout == rollout.name)
                    .and_then(|u| u.since),
            });
        }
    }
}

/// Decides rollout `rollout`'s next step over every Robot there is.
pub fn plan(rollout: Rollout<'_>, robots: &[RobotView<'_>], now: Timestamp) -> Plan {
    let spec = rollout.spec;
    let matches = |r: &RobotView<'_>| spec.robot_selector.as_ref().is_none_or(|s| s.matches(r.labels));
    let mut tally = Tally::default();
    let mut total = 0i32;
    for robot in robots {
        if matches(robot) {
            total = total.saturating_add(1);
            tally.count(&rollout, robot, now);
        } else if robot.marked_for == Some(rollout.name) {
            // Marked for it, but its labels changed since.
            tally.unmark.push(robot.name.to_owned());
        }
    }
    let max_failed = spec
        .max_failed
        .as_ref()
        .unwrap_or(&CountOrPercent::Count(0))
        .of(total)
        .unwrap_or(0);
    let over_budget = tally.failed > max_failed;
    if rollout.cancelled_by.is_some() {
        // Robots switched already finish their trial on the robot; the
        // others are let go.
        for entry in &tally.entries {
            if entry.phase == RobotUpgradePhase::Downloading {
                tally.unmark.push(entry.robot.clone());
            }
        }
    }
    let mark = if spec.paused || over_budget || rollout.cancelled_by.is_some() {
        Vec::new()
    } else {
        let max_parallel = usize::try_from(spec.max_parallel.unwrap_or(1).max(1)).unwrap_or(1);
        let room = max_parallel.saturating_sub(tally.busy);
        tally.waiting.iter().take(room).cloned().collect::<Vec<_>>()
    };
    for entry in tally.entries.iter_mut().filter(|e| mark.contains(&e.robot)) {
        entry.phase = RobotUpgradePhase::Downloading;
        entry.reason = Some("ordered".into());
        entry.since = Some(now);
    }
    let busy = tally.busy + mark.len();
    // The status must stay small on a large fleet: the robots not done
    // first, then those done, at most MAX_LISTED.
    tally
        .entries
        .sort_by_key(|e| (e.phase == RobotUpgradePhase::Healthy, e.robot.clone()));
    tally.entries.truncate(MAX_LISTED);
    let (state, message) = state_of(&rollout, &tally, total, max_failed, busy);
    tally.unmark.sort();
    tally.unmark.dedup();
    Plan {
        status: AgentRolloutStatus {
            state: Some(state),
            message: Some(message),
            robots: total,
            upgraded: tally.upgraded,
            failed: tally.failed,
            robot_upgrades: tally.entries,
            observed_generation: None,
        },
        mark,
        unmark: tally.unmark,
    }
}

/// The rollout's state and its message.
fn state_of(
    rollout: &Rollout<'_>,
    tally: &Tally,
    total: i32,
    max_failed: i32,
    busy: usize,
) -> (RolloutState, String) {
    let version = &rollout.spec.version;
    let (upgraded, failed) = (tally.upgraded, tally.failed);
    if let Some(by) = rollout.cancelled_by {
        let finishing = if busy > 0 {
            format!("; {busy} robots finish the upgrade under way")
        } else {
            String::new()
        };
        return (
            RolloutState::Aborted,
            format!("cancelled by {by}: {upgraded} of {total} robots run {version}{finishing}"),
        );
    }
    if upgraded == total {
        return (
            RolloutState::Complete,
            format!("all {total} robots run {version}"),
        );
    }
    if failed > max_failed {
        return (
            RolloutState::PausedOnFailures,
            format!(
                "{failed} robots failed or rolled back, more than maxFailed allows ({max_failed}): no \
                 robot starts; raise maxFailed, or fix the artifact and make a new rollout"
            ),
        );
    }
    if rollout.spec.paused {
        return (
            RolloutState::Paused,
            format!("paused (spec.paused): {upgraded} of {total} robots run {version}"),
        );
    }
    if failed > 0 && upgraded + failed == total {
        return (
            RolloutState::Complete,
            format!("{upgraded} of {total} robots run {version}; {failed} failed or rolled back"),
        );
    }
    (
        RolloutState::Progressing,
        format!("{upgraded} of {total} robots run {version}; {busy} upgrading"),
    )
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
                })
                .collect()
        }
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
}
