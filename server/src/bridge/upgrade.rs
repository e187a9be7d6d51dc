//! Agent upgrades through the bridge. What a robot reports of its upgrade
//! goes into its Robot's `status.agentUpgrade`; a robot the manager marked
//! for an AgentRollout (the annotation `robot.k8s4r.io/agent-rollout`) and
//! not yet on its version is sent the order, again at most every
//! [`ORDER_EVERY`] while it reports nothing newer.
//!
//! The annotation only points at the rollout: whoever may patch Robots
//! (the operator role, for cordons) can set it. The authority is the
//! rollout itself ([`rollout_orders`]): its status, which only the manager
//! writes, must list the robot as ordered within `maxParallel`, and the
//! rollout must be progressing, not paused or cancelled, with a selector
//! that matches the robot.

use std::time::Duration;

use jiff::Timestamp;
use k8s4r_api::names::{ANNOTATION_AGENT_ROLLOUT, ANNOTATION_CANCEL};
use k8s4r_api::protocol::{encode, UpgradeOrder, UpgradeReport, PROTOCOL_VERSION};
use k8s4r_api::{
    AgentRollout, AgentRolloutSpec, AgentUpgradeStatus, Robot, RobotStatus, RobotUpgradePhase, RolloutState,
};
use kube::Api;
use serde::Serialize;
use tracing::{info, warn};

use super::Bridge;
use crate::error::Result;

/// How often an order goes out again to a robot that did not act on it
/// (it was offline, or the message was lost).
pub const ORDER_EVERY: Duration = Duration::from_secs(30);
/// A rollout's health timeout when it names none.
pub const DEFAULT_HEALTH_TIMEOUT: Duration = Duration::from_secs(120);

#[derive(Debug, Serialize)]
#[serde(rename_all = "camelCase")]
struct UpgradePatch<'a> {
    agent_upgrade: UpgradeFields<'a>,
}

/// `status.agentUpgrade` as a merge patch writes it: every field, a
/// missing reason as null, so that a reason of an earlier phase (a failure)
/// does not outlive it.
#[derive(Debug, Serialize)]
#[serde(rename_all = "camelCase")]
struct UpgradeFields<'a> {
    rollout: &'a str,
    version: &'a str,
    phase: RobotUpgradePhase,
    reason: Option<&'a str>,
    since: Option<Timestamp>,
}

impl<'a> UpgradePatch<'a> {
    fn of(status: &'a AgentUpgradeStatus) -> Self {
        Self {
            agent_upgrade: UpgradeFields {
                rollout: &status.rollout,
                version: &status.version,
                phase: status.phase,
                reason: status.reason.as_deref(),
                since: status.since,
            },
        }
    }
}

impl Bridge {
    /// Records what `robot` said of its upgrade, when it says something
    /// new (a phase, a version, a reason).
    pub(super) async fn record_upgrade(&self, robot: &Robot, report: Option<&UpgradeReport>) -> Result<()> {
        let Some(report) = report else {
            return Ok(());
        };
        let known = robot.status.as_ref().and_then(|s| s.agent_upgrade.as_ref());
        let same = known.is_some_and(|k| {
            k.rollout == report.rollout
                && k.version == report.version
                && k.phase == report.phase
                && k.reason == report.reason
        });
        if same {
            return Ok(());
        }
        let name = robot.metadata.name.as_deref().unwrap_or_default();
        let status = AgentUpgradeStatus {
            rollout: report.rollout.clone(),
            version: report.version.clone(),
            phase: report.phase,
            reason: report.reason.clone(),
            since: Some(Timestamp::now()),
        };
        info!(robot = name, rollout = %status.rollout, version = %status.version, phase = ?status.phase, reason = status.reason.as_deref().unwrap_or(""), "agent upgrade");
        self.patch_robot_status(name, &UpgradePatch::of(&status), None, "robot_upgrade")
            .await
    }

    /// Sends the order at once to a robot newly marked for a rollout (seen
    /// by the Robot watch), when it is online.
    pub(super) async fn order_on_mark(&self, robot: &Robot) {
        let name = robot.metadata.name.clone().unwrap_or_default();
        let mark = robot
            .metadata
            .annotations
            .as_ref()
            .and_then(|a| a.get(ANNOTATION_AGENT_ROLLOUT));
        {
            let mut seen = super::lock(&self.marks_seen);
            match mark {
                None => {
                    seen.remove(&name);
                    return;
                }
                Some(m) if seen.get(&name) == Some(m) => return,
                Some(m) => {
                    seen.insert(name.clone(), m.clone());
                }
            }
        }
        let online = robot.status.as_ref().and_then(|s| s.phase) == Some(k8s4r_api::RobotPhase::Online);
        if online {
            self.order_upgrade(robot, None, &mut None).await;
        }
    }

    /// Sends `robot` its rollout's order when it is marked for one, runs
    /// another version and has not acted on it (by its report); looked at
    /// most every [`ORDER_EVERY`].
    pub(super) async fn order_upgrade(
        &self,
        robot: &Robot,
        report: Option<&UpgradeReport>,
        last_order: &mut Option<tokio::time::Instant>,
    ) {
        let Some(rollout) = robot
            .metadata
            .annotations
            .as_ref()
            .and_then(|a| a.get(ANNOTATION_AGENT_ROLLOUT))
        else {
            return;
        };
        if last_order.is_some_and(|at| at.elapsed() < ORDER_EVERY) {
            return;
        }
        // The rollout is read at most every ORDER_EVERY per robot, whatever
        // the outcome: not once per heartbeat of a robot already at work.
        *last_order = Some(tokio::time::Instant::now());
        let name = robot.metadata.name.as_deref().unwrap_or_default();
        let status = robot.status.clone().unwrap_or_default();
        let rollouts: Api<AgentRollout> = Api::all(self.robots.clone().into_client());
        let spec = match rollouts.get_opt(rollout).await {
            Ok(Some(r)) => match rollout_orders(&r, robot) {
                Ok(()) => r.spec,
                Err(why) => {
                    warn!(robot = name, rollout, "no upgrade order: {why}");
                    self.metrics.message_out("agent_upgrade", "refused");
                    return;
                }
            },
            Ok(None) => return,
            Err(e) => {
                warn!(robot = name, rollout, error = %e, "cannot read the rollout; the order waits");
                return;
            }
        };
        let Some(order) = order_for(&status, rollout, &spec, report) else {
            return;
        };
        match self
            .publisher
            .publish(self.topics.agent_upgrade(name), encode(&order))
            .await
        {
            Ok(()) => {
                info!(robot = name, rollout, version = %order.version, "upgrade order sent");
                self.metrics.message_out("agent_upgrade", "acked");
            }
            Err(error) => {
                warn!(robot = name, %error, "upgrade order not delivered; sent again later");
                self.metrics.message_out("agent_upgrade", "failed");
            }
        }
    }
}

/// The order a robot in `status`, marked for `rollout`, is to get now, if
/// any: none when it runs the version already, acted on this very order
/// (by its `report`, or its Robot's last word), or has no artifact for its
/// architecture.
fn order_for(
    status: &RobotStatus,
    rollout: &str,
    spec: &AgentRolloutSpec,
    report: Option<&UpgradeReport>,
) -> Option<UpgradeOrder> {
    if status.agent_version.as_deref() == Some(spec.version.as_str()) {
        return None;
    }
    // A robot that acted on this very order says so: while it works on it,
    // its reports name it; once it ended (a refusal or a rollback, the
    // manager's to weigh), its Robot keeps the last word. A robot recorded
    // mid-way whose agent now says nothing lost the work (it restarted): it
    // is ordered again.
    let ended = matches!(
        status.agent_upgrade.as_ref(),
        Some(u) if u.rollout == rollout
            && u.version == spec.version
            && matches!(u.phase, RobotUpgradePhase::Failed | RobotUpgradePhase::RolledBack | RobotUpgradePhase::Healthy)
    );
    let acted = ended || report.is_some_and(|r| r.rollout == rollout && r.version == spec.version);
    if acted {
        return None;
    }
    let arch = status.device.as_ref().map(|d| d.arch.clone()).unwrap_or_default();
    let artifact = spec.artifacts.iter().find(|a| a.arch == arch)?;
    let health_timeout = spec
        .health_timeout
        .as_deref()
        .and_then(|t| k8s4r_api::parse_duration(t).ok())
        .unwrap_or(DEFAULT_HEALTH_TIMEOUT);
    Some(UpgradeOrder {
        v: PROTOCOL_VERSION,
        rollout: rollout.to_owned(),
        version: spec.version.clone(),
        url: artifact.url.clone(),
        sha256: artifact.sha256.clone(),
        signature: artifact.signature.clone(),
        health_timeout_ms: u64::try_from(health_timeout.as_millis()).unwrap_or(u64::MAX),
        when: spec.when.clone(),
    })
}

/// Whether `rollout` orders `robot` now: the manager listed it in the
/// rollout's status as ordered (`Downloading` and on), within
/// `maxParallel`, and the rollout is progressing, not paused, cancelled or
/// being deleted, and selects the robot. `Err` says why not.
pub fn rollout_orders(rollout: &AgentRollout, robot: &Robot) -> std::result::Result<(), String> {
    let name = robot.metadata.name.as_deref().unwrap_or_default();
    if rollout.metadata.deletion_timestamp.is_some() {
        return Err("the rollout is being deleted".into());
    }
    let cancelled = rollout
        .metadata
        .annotations
        .as_ref()
        .is_some_and(|a| a.contains_key(ANNOTATION_CANCEL));
    if cancelled || rollout.spec.paused {
        return Err("the rollout is paused or cancelled".into());
    }
    let status = rollout.status.clone().unwrap_or_default();
    if status.state != Some(RolloutState::Progressing) {
        return Err(format!("the rollout is {:?}, not progressing", status.state));
    }
    let labels = robot.metadata.labels.clone().unwrap_or_default();
    if !rollout
        .spec
        .robot_selector
        .as_ref()
        .is_none_or(|s| s.matches(&labels))
    {
        return Err("the rollout's selector does not match the robot".into());
    }
    let ordered = |phase: RobotUpgradePhase| {
        matches!(
            phase,
            RobotUpgradePhase::Downloading | RobotUpgradePhase::Staged | RobotUpgradePhase::Restarting
        )
    };
    if !status
        .robot_upgrades
        .iter()
        .any(|u| u.robot == name && ordered(u.phase))
    {
        return Err("the rollout's status does not list the robot as ordered".into());
    }
    let max_parallel = usize::try_from(rollout.spec.max_parallel.unwrap_or(1).max(1)).unwrap_or(1);
    let busy = status.robot_upgrades.iter().filter(|u| ordered(u.phase)).count();
    if busy > max_parallel {
        return Err(format!(
            "the rollout lists {busy} robots at work, over its maxParallel {max_parallel}"
        ));
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;
    use k8s4r_api::{AgentRolloutStatus, RobotUpgrade};

    fn robot(name: &str, labels: &[(&str, &str)]) -> Robot {
        let mut robot = Robot::new(name, Default::default());
        robot.metadata.labels = Some(labels.iter().map(|(k, v)| ((*k).into(), (*v).into())).collect());
        robot
    }

    fn listed(robot: &str, phase: RobotUpgradePhase) -> RobotUpgrade {
        RobotUpgrade {
            robot: robot.into(),
            phase,
            reason: None,
            since: None,
        }
    }

    fn rollout(entries: Vec<RobotUpgrade>) -> AgentRollout {
        let mut rollout = AgentRollout::new(
            "next",
            AgentRolloutSpec {
                version: "2.0.0".into(),
                robot_selector: Some(
                    serde_json::from_value(serde_json::json!({"matchLabels": {"site": "lab"}})).unwrap(),
                ),
                max_parallel: Some(1),
                ..AgentRolloutSpec::default()
            },
        );
        rollout.status = Some(AgentRolloutStatus {
            state: Some(RolloutState::Progressing),
            robot_upgrades: entries,
            ..AgentRolloutStatus::default()
        });
        rollout
    }

    #[test]
    fn only_a_robot_the_progressing_rollout_lists_as_ordered_is_ordered() {
        let rb1 = robot("rb1", &[("site", "lab")]);
        let ordered = rollout(vec![listed("rb1", RobotUpgradePhase::Downloading)]);
        assert_eq!(rollout_orders(&ordered, &rb1), Ok(()));
        // Marked by hand, not listed (or listed as waiting): no order.
        let waiting = rollout(vec![listed("rb1", RobotUpgradePhase::Pending)]);
        assert!(rollout_orders(&waiting, &rb1)
            .unwrap_err()
            .contains("does not list"));
        assert!(rollout_orders(&rollout(Vec::new()), &rb1).is_err());
        // The selector decides, whatever the status says.
        let elsewhere = robot("rb1", &[("site", "field")]);
        assert!(rollout_orders(&ordered, &elsewhere)
            .unwrap_err()
            .contains("selector"));
        // Paused, cancelled, complete or over maxParallel: no order.
        let mut paused = ordered.clone();
        paused.spec.paused = true;
        assert!(rollout_orders(&paused, &rb1).is_err());
        let mut cancelled = ordered.clone();
        cancelled.metadata.annotations = Some([(ANNOTATION_CANCEL.to_owned(), "now".to_owned())].into());
        assert!(rollout_orders(&cancelled, &rb1).is_err());
        let mut complete = ordered.clone();
        complete.status.as_mut().unwrap().state = Some(RolloutState::Complete);
        assert!(rollout_orders(&complete, &rb1)
            .unwrap_err()
            .contains("not progressing"));
        let crowded = rollout(vec![
            listed("rb1", RobotUpgradePhase::Downloading),
            listed("rb2", RobotUpgradePhase::Staged),
        ]);
        assert!(rollout_orders(&crowded, &rb1)
            .unwrap_err()
            .contains("maxParallel"));
    }

    #[test]
    fn a_phase_without_a_reason_clears_the_reason_of_the_phase_before() {
        let healthy = AgentUpgradeStatus {
            rollout: "next".into(),
            version: "2.0.0".into(),
            phase: RobotUpgradePhase::Healthy,
            reason: None,
            since: None,
        };
        let patch = serde_json::to_value(UpgradePatch::of(&healthy)).unwrap();
        assert_eq!(
            patch["agentUpgrade"]["reason"],
            serde_json::Value::Null,
            "a merge patch keeps a field it leaves out: {patch}"
        );
        assert!(patch["agentUpgrade"].as_object().unwrap().contains_key("reason"));
    }
}
