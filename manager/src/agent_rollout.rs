//! What an AgentRollout should do next, decided from the robots as they
//! are: which robots to mark for the new agent (the annotation the server
//! turns into an order), which to unmark, and the rollout's status. Pure;
//! the controller reads and writes.
//!
//! The rules are an `everyRobot` group's: at most `maxParallel` robots
//! upgrade at once; an offline robot that has not started waits without
//! holding a place; a robot that joins later is reached; once more robots
//! than `maxFailed` failed or rolled back, no new robot starts.
//!
//! An update must never land in the middle of a mission: a robot starts
//! only while its facts meet the rollout's `when`, within its
//! `maintenanceWindow`, and (with `waitForTasks`) once its running batch
//! tasks, or all its tasks, ended. A robot that waits says why in the
//! rollout's status and holds no place; one that waits for its tasks is
//! cordoned meanwhile (nothing new lands there), and uncordoned by the
//! rollout once its upgrade ended or it no longer waits.

use std::collections::BTreeMap;
use std::time::Duration;

use jiff::Timestamp;
use k8s4r_api::facts::{unmet, Facts};
use k8s4r_api::{
    AgentRolloutSpec, AgentRolloutStatus, AgentUpgradeStatus, CountOrPercent, RobotUpgrade,
    RobotUpgradePhase, RolloutState, WaitForTasks,
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
    /// When its agent last registered (a new process, with the version it
    /// runs).
    pub registered_at: Option<Timestamp>,
    /// Its facts, as last reported.
    pub facts: Option<&'a Facts>,
    /// Its tasks that are dispatched or running.
    pub running: Running,
    /// Whether it is cordoned (`spec.unschedulable`), by anyone.
    pub unschedulable: bool,
    /// The rollout that cordoned it, if one did (the annotation
    /// `robot.k8s4r.io/cordoned-for-rollout`).
    pub cordoned_for: Option<&'a str>,
}

/// A robot's tasks that are dispatched or running.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct Running {
    pub batch: usize,
    pub all: usize,
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
    /// Robots to cordon for it: they wait for their tasks to end.
    pub cordon: Vec<String>,
    /// Robots it cordoned that no longer wait.
    pub uncordon: Vec<String>,
}

/// Why a robot that has not started may not start now, if it may not:
/// its facts, the maintenance window, or (`true` beside it) its running
/// tasks, which it waits for cordoned.
fn waits_for(spec: &AgentRolloutSpec, robot: &RobotView<'_>, now: Timestamp) -> Option<(String, bool)> {
    let no_facts = Facts::new();
    let facts = robot.facts.unwrap_or(&no_facts);
    if let Some(condition) = unmet(&spec.when, facts) {
        let has = facts
            .get(&condition.key)
            .map_or_else(|| "<none>".to_owned(), ToString::to_string);
        let needs = condition.to_string();
        let needs = needs.strip_prefix(&condition.key).unwrap_or(&needs).trim();
        return Some((format!("{} {has}, needs {needs}", condition.key), false));
    }
    if let Some(closed) = window_closed(spec, now) {
        return Some((closed, false));
    }
    let (count, kind) = match spec.wait_for_tasks.unwrap_or_default() {
        WaitForTasks::None => return None,
        WaitForTasks::Batch => (robot.running.batch, "batch "),
        WaitForTasks::All => (robot.running.all, ""),
    };
    (count > 0).then(|| {
        (
            format!("waits for its {count} running {kind}task(s) to end (cordoned meanwhile)"),
            true,
        )
    })
}

/// Why no robot may start now by the rollout's maintenance window, if
/// none may: outside it (or a window that cannot be read, which never
/// opens), with when the next one opens.
pub fn window_closed(spec: &AgentRolloutSpec, now: Timestamp) -> Option<String> {
    let window = spec.maintenance_window.as_ref()?;
    let schedule = match crate::periodic::Schedule::parse(&window.schedule, window.time_zone.as_deref()) {
        Ok(schedule) => schedule,
        Err(e) => return Some(format!("its maintenance window cannot be read: {e}")),
    };
    let Ok(length) = k8s4r_api::parse_duration(&window.duration) else {
        return Some(format!(
            "its maintenance window's duration {:?} cannot be read",
            window.duration
        ));
    };
    if schedule.open_at(now, length) {
        return None;
    }
    Some(match schedule.next_after(now) {
        Some(next) => format!("outside its maintenance window; the next opens at {next}"),
        None => "outside its maintenance window, which never opens again".to_owned(),
    })
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
            // On the version, but its trial not settled yet (its agent
            // reports Healthy once the cluster confirmed it): it keeps its
            // place, so that no more than maxParallel robots are ever
            // mid-upgrade, unless it went quiet for long.
            return match robot.upgrade {
                Some(u)
                    if u.rollout == self.name
                        && u.version == spec.version
                        && in_progress(u.phase)
                        && (robot.online || !self.overdue(u.since, now)) =>
                {
                    (
                        u.phase,
                        Some("on the new version; its trial is not confirmed yet".into()),
                    )
                }
                _ => (RobotUpgradePhase::Healthy, None),
            };
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
                // The process that reported its trial healthy calls itself
                // another version: the artifact's binary is not the
                // version the rollout names. Ordering it again would only
                // repeat the same switch.
                RobotUpgradePhase::Healthy if reported_since_registering(u, robot) => (
                    RobotUpgradePhase::Failed,
                    Some(format!(
                        "its new agent confirmed its trial but reports version {}, not {}: \
                         the artifact's binary is another version",
                        robot.agent_version.unwrap_or("unknown"),
                        spec.version
                    )),
                ),
                // It reported healthy, then a later process runs another
                // version (rolled back by hand): again.
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

/// Whether the robot's report came from the process that runs now: it
/// was recorded after the agent's last registration.
fn reported_since_registering(report: &AgentUpgradeStatus, robot: &RobotView<'_>) -> bool {
    matches!((report.since, robot.registered_at), (Some(since), Some(registered)) if since >= registered)
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
    cordon: Vec<String>,
    uncordon: Vec<String>,
    /// Robots that may not start now, and why (their facts, the window,
    /// their tasks).
    held: Vec<(String, String)>,
}

/// What a robot that has not started waits for.
#[derive(Clone, Copy, PartialEq, Eq)]
enum Waits {
    /// It does not wait (it upgrades, is done, or is offline).
    Not,
    /// A place: it may start.
    Turn,
    /// Its facts or the window.
    Robot,
    /// Its running tasks.
    Tasks,
}

impl Tally {
    fn count(&mut self, rollout: &Rollout<'_>, robot: &RobotView<'_>, now: Timestamp) {
        let (phase, mut reason) = rollout.phase_of(robot, now);
        let mut waits = Waits::Not;
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
                    match waits_for(rollout.spec, robot, now) {
                        None => {
                            self.waiting.push(robot.name.to_owned());
                            waits = Waits::Turn;
                        }
                        Some((why, for_tasks)) => {
                            self.held.push((robot.name.to_owned(), why.clone()));
                            reason = Some(why);
                            waits = if for_tasks { Waits::Tasks } else { Waits::Robot };
                        }
                    }
                }
                false
            }
        };
        match waits {
            Waits::Tasks if !robot.unschedulable => self.cordon.push(robot.name.to_owned()),
            _ => {}
        }
        // Its cordon stays while it waits its turn or for its tasks, or
        // upgrades; otherwise the rollout lets it go.
        let holds = keeps_mark || matches!(waits, Waits::Tasks | Waits::Turn);
        if robot.cordoned_for == Some(rollout.name) && !holds {
            self.uncordon.push(robot.name.to_owned());
        }
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
        if !matches(robot) && robot.cordoned_for == Some(rollout.name) {
            tally.uncordon.push(robot.name.to_owned());
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
    let stopped = spec.paused || over_budget || rollout.cancelled_by.is_some();
    if stopped {
        // Nobody starts: nobody waits cordoned for it either.
        tally.cordon.clear();
        let busy: Vec<&str> = tally
            .entries
            .iter()
            .filter(|e| in_progress(e.phase))
            .map(|e| e.robot.as_str())
            .collect();
        for robot in robots.iter().filter(|r| r.cordoned_for == Some(rollout.name)) {
            if !busy.contains(&robot.name) {
                tally.uncordon.push(robot.name.to_owned());
            }
        }
    }
    let mark = if stopped {
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
    tally.uncordon.sort();
    tally.uncordon.dedup();
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
        cordon: tally.cordon,
        uncordon: tally.uncordon,
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
    let held = match tally.held.as_slice() {
        [] => String::new(),
        [(robot, why)] => format!("; 1 waits ({robot}: {why})"),
        [(robot, why), rest @ ..] => format!(
            "; {} wait ({robot}: {why}; and {} more)",
            rest.len() + 1,
            rest.len()
        ),
    };
    (
        RolloutState::Progressing,
        format!("{upgraded} of {total} robots run {version}; {busy} upgrading{held}"),
    )
}

#[cfg(test)]
mod tests;
