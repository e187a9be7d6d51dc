//! Agent upgrades through the bridge. What a robot reports of its upgrade
//! goes into its Robot's `status.agentUpgrade`; a robot the manager marked
//! for an AgentRollout (the annotation `robot.k8s4r.io/agent-rollout`) and
//! not yet on its version is sent the order, again at most every
//! [`ORDER_EVERY`] while it reports nothing newer.

use std::time::Duration;

use jiff::Timestamp;
use k8s4r_api::names::ANNOTATION_AGENT_ROLLOUT;
use k8s4r_api::protocol::{encode, UpgradeOrder, UpgradeReport, PROTOCOL_VERSION};
use k8s4r_api::{AgentRollout, AgentRolloutSpec, AgentUpgradeStatus, Robot, RobotStatus, RobotUpgradePhase};
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
    agent_upgrade: &'a AgentUpgradeStatus,
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
        self.patch_robot_status(
            name,
            &UpgradePatch {
                agent_upgrade: &status,
            },
            None,
            "robot_upgrade",
        )
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
            Ok(Some(r)) => r.spec,
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
    })
}
