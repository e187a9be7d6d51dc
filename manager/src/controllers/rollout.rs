//! AgentRolloutController: takes a new agent version to the robots a
//! rollout selects, a few at a time ([`crate::agent_rollout::plan`]). It
//! lists a robot as ordered in the rollout's status, then marks it with the
//! annotation `robot.k8s4r.io/agent-rollout`; the server sends the marked
//! robot the order once the rollout's status bears the mark out, and the robot reports its
//! progress into its Robot's `status.agentUpgrade`, which this controller
//! counts. Robots marked for a rollout that is gone are let go by the
//! RobotController ([`unmark_orphan`]).

use std::collections::BTreeMap;
use std::sync::Arc;
use std::time::Duration;

use jiff::Timestamp;
use k8s4r_api::names::{ANNOTATION_AGENT_ROLLOUT, ANNOTATION_CANCEL, ANNOTATION_CORDONED_FOR_ROLLOUT};
use k8s4r_api::{
    AgentRollout, AgentRolloutStatus, Robot, RobotPhase, RobotUpgradePhase, RolloutState, TaskKind, TaskState,
};
use kube::runtime::controller::Action;
use kube::runtime::events::EventType;
use kube::runtime::reflector::ObjectRef;
use kube::{Api, ResourceExt};
use tracing::instrument;

use super::{key_of, Context, Look};
use crate::agent_rollout::{plan, RobotView, Rollout, Running};
use crate::error::{Error, Result};

/// How often a rollout is looked at without a change: robots offline for
/// too long give their place up only with time.
const RECHECK: Duration = Duration::from_secs(30);

/// Reconciles one AgentRollout.
#[instrument(skip_all, fields(agentrollout = %rollout.name_any()))]
pub async fn reconcile(rollout: Arc<AgentRollout>, ctx: Arc<Context>) -> Result<Action> {
    let ctx = ctx.as_ref();
    ctx.instrumented(
        "agentrollout",
        rollout,
        Look::cached(&ctx.stores.rollouts),
        |rollout| async move { reconcile_rollout(&rollout, ctx).await },
    )
    .await
}

/// Backs off an AgentRollout whose reconcile failed.
pub fn error_policy(rollout: Arc<AgentRollout>, error: &Error, ctx: Arc<Context>) -> Action {
    ctx.error_policy("agentrollout", &key_of(rollout.as_ref()), error)
}

/// What the plan reads of a Robot; `running` counts its tasks.
fn view_of<'a>(robot: &'a Robot, running: &BTreeMap<String, Running>) -> RobotView<'a> {
    let status = robot.status.as_ref();
    let name = robot.metadata.name.as_deref().unwrap_or_default();
    let annotation = |key: &str| {
        robot
            .metadata
            .annotations
            .as_ref()
            .and_then(|a| a.get(key))
            .map(String::as_str)
    };
    RobotView {
        facts: status.map(|s| &s.facts),
        running: running.get(name).copied().unwrap_or_default(),
        unschedulable: robot.spec.unschedulable,
        cordoned_for: annotation(ANNOTATION_CORDONED_FOR_ROLLOUT),
        name: robot.metadata.name.as_deref().unwrap_or_default(),
        labels: robot.metadata.labels.as_ref().unwrap_or(&EMPTY),
        online: status.and_then(|s| s.phase) == Some(RobotPhase::Online),
        arch: status.and_then(|s| s.device.as_ref()).map(|d| d.arch.as_str()),
        agent_version: status.and_then(|s| s.agent_version.as_deref()),
        upgrade: status.and_then(|s| s.agent_upgrade.as_ref()),
        registered_at: status.and_then(|s| s.last_registration_time),
        marked_for: robot
            .metadata
            .annotations
            .as_ref()
            .and_then(|a| a.get(ANNOTATION_AGENT_ROLLOUT))
            .map(String::as_str),
    }
}

static EMPTY: std::collections::BTreeMap<String, String> = std::collections::BTreeMap::new();

fn mark_patch(rollout: Option<&str>) -> serde_json::Value {
    serde_json::json!({ "metadata": { "annotations": { ANNOTATION_AGENT_ROLLOUT: rollout } } })
}

/// Cordons a robot for `rollout` (Some), or lifts that cordon (None).
fn cordon_patch(rollout: Option<&str>) -> serde_json::Value {
    serde_json::json!({
        "metadata": { "annotations": { ANNOTATION_CORDONED_FOR_ROLLOUT: rollout } },
        "spec": { "unschedulable": rollout.map(|_| true) },
    })
}

/// Per robot, its tasks that are dispatched or running (the Task cache).
fn running_tasks(ctx: &Context) -> BTreeMap<String, Running> {
    let mut running: BTreeMap<String, Running> = BTreeMap::new();
    for task in ctx.stores.tasks.state() {
        let status = task.status.as_ref();
        let state = status.and_then(|s| s.state);
        if !matches!(state, Some(TaskState::Dispatching | TaskState::Running)) {
            continue;
        }
        let Some(robot) = status
            .and_then(|s| s.robot.clone())
            .or_else(|| task.spec.target_robot.clone())
        else {
            continue;
        };
        let entry = running.entry(robot).or_default();
        entry.all += 1;
        if task.spec.template.kind == TaskKind::Batch {
            entry.batch += 1;
        }
    }
    running
}

async fn reconcile_rollout(rollout: &AgentRollout, ctx: &Context) -> Result<Action> {
    if rollout.metadata.deletion_timestamp.is_some() {
        return Ok(Action::await_change());
    }
    let name = rollout.name_any();
    let cancel = crate::manual::request(&rollout.metadata, ANNOTATION_CANCEL);
    let cancelled_by = cancel
        .as_ref()
        .map(|c| c.by.clone().unwrap_or_else(|| "a person".to_owned()));
    let robots = ctx.stores.robots.state();
    let running = running_tasks(ctx);
    let views: Vec<RobotView<'_>> = robots.iter().map(|r| view_of(r, &running)).collect();
    let now = Timestamp::now();
    let planned = plan(
        Rollout {
            name: &name,
            spec: &rollout.spec,
            cancelled_by: cancelled_by.as_deref(),
        },
        &views,
        now,
    );
    let robot_api: Api<Robot> = Api::all(ctx.client());
    ctx.annotate_all(&robot_api, &planned.unmark, &mark_patch(None))
        .await?;
    ctx.annotate_all(&robot_api, &planned.uncordon, &cordon_patch(None))
        .await?;
    ctx.annotate_all(&robot_api, &planned.cordon, &cordon_patch(Some(&name)))
        .await?;
    let previous = rollout.status.clone().unwrap_or_default();
    let mut status = planned.status;
    status.observed_generation = rollout.metadata.generation;
    keep_since(&previous, &mut status);
    publish_changes(ctx, rollout, &previous, &status);
    // The status first: it is what the server checks a mark against (an
    // annotation on a Robot, which more people may write, only points at
    // the rollout), so it must list a robot before the robot is marked.
    if status != previous {
        let api: Api<AgentRollout> = Api::all(ctx.client());
        ctx.patch_status(&api, &name, None, &status).await?;
    }
    ctx.annotate_all(&robot_api, &planned.mark, &mark_patch(Some(&name)))
        .await?;
    for robot in &planned.mark {
        ctx.event(
            rollout,
            EventType::Normal,
            "Ordered",
            format!("robot {robot} ordered to upgrade to {}", rollout.spec.version),
        );
    }
    Ok(match status.state {
        Some(RolloutState::Complete) => Action::await_change(),
        _ => Action::requeue(RECHECK),
    })
}

/// A robot's `since` stays what it was while its phase stays the same.
fn keep_since(previous: &AgentRolloutStatus, status: &mut AgentRolloutStatus) {
    for entry in &mut status.robot_upgrades {
        let before = previous
            .robot_upgrades
            .iter()
            .find(|p| p.robot == entry.robot && p.phase == entry.phase);
        if let Some(before) = before {
            entry.since = before.since.or(entry.since);
        }
    }
}

/// Events for what changed: a robot that failed or rolled back (a
/// Warning, with its reason), and the rollout's new state.
fn publish_changes(
    ctx: &Context,
    rollout: &AgentRollout,
    previous: &AgentRolloutStatus,
    status: &AgentRolloutStatus,
) {
    for entry in &status.robot_upgrades {
        let was = previous
            .robot_upgrades
            .iter()
            .find(|p| p.robot == entry.robot)
            .map(|p| p.phase);
        let word = match entry.phase {
            RobotUpgradePhase::RolledBack => "rolled back",
            RobotUpgradePhase::Failed => "failed",
            _ => continue,
        };
        if was != Some(entry.phase) {
            ctx.event(
                rollout,
                EventType::Warning,
                if entry.phase == RobotUpgradePhase::Failed {
                    "UpgradeFailed"
                } else {
                    "RolledBack"
                },
                format!(
                    "robot {} {word}: {}",
                    entry.robot,
                    entry.reason.as_deref().unwrap_or("no reason given")
                ),
            );
        }
    }
    if previous.state != status.state {
        let (type_, reason) = match status.state {
            Some(RolloutState::PausedOnFailures) => (EventType::Warning, "PausedOnFailures"),
            Some(RolloutState::Complete) => (EventType::Normal, "Complete"),
            Some(RolloutState::Aborted) => (EventType::Normal, "Aborted"),
            Some(RolloutState::Paused) => (EventType::Normal, "Paused"),
            _ => (EventType::Normal, "Progressing"),
        };
        ctx.event(rollout, type_, reason, status.message.clone().unwrap_or_default());
    }
}

/// Lets `robot` go when the rollout it is marked for is gone (deleted: an
/// abort). Called by the RobotController.
pub(super) async fn unmark_orphan(ctx: &Context, robot: &Robot) -> Result<()> {
    let gone = |key: &str| {
        robot
            .annotations()
            .get(key)
            .filter(|rollout| ctx.stores.rollouts.get(&ObjectRef::new(rollout)).is_none())
    };
    let api: Api<Robot> = Api::all(ctx.client());
    if let Some(rollout) = gone(ANNOTATION_AGENT_ROLLOUT) {
        tracing::info!(robot = %robot.name_any(), rollout, "the robot's rollout is gone; unmarking it");
        ctx.annotate_all(&api, &[robot.name_any()], &mark_patch(None))
            .await?;
    }
    if let Some(rollout) = gone(ANNOTATION_CORDONED_FOR_ROLLOUT) {
        tracing::info!(robot = %robot.name_any(), rollout, "the rollout that cordoned the robot is gone; uncordoning it");
        ctx.annotate_all(&api, &[robot.name_any()], &cordon_patch(None))
            .await?;
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;
    use k8s4r_api::RobotUpgrade;

    fn entry(robot: &str, phase: RobotUpgradePhase, since: &str) -> RobotUpgrade {
        RobotUpgrade {
            robot: robot.into(),
            phase,
            reason: None,
            since: Some(since.parse().unwrap()),
        }
    }

    #[test]
    fn since_stays_while_the_phase_does() {
        let previous = AgentRolloutStatus {
            robot_upgrades: vec![entry(
                "r0",
                RobotUpgradePhase::Downloading,
                "2026-11-26T04:00:00Z",
            )],
            ..AgentRolloutStatus::default()
        };
        let mut status = AgentRolloutStatus {
            robot_upgrades: vec![
                entry("r0", RobotUpgradePhase::Downloading, "2026-11-26T04:05:00Z"),
                entry("r1", RobotUpgradePhase::Staged, "2026-11-26T04:05:00Z"),
            ],
            ..AgentRolloutStatus::default()
        };
        keep_since(&previous, &mut status);
        assert_eq!(
            status.robot_upgrades[0].since,
            Some("2026-11-26T04:00:00Z".parse().unwrap())
        );
        assert_eq!(
            status.robot_upgrades[1].since,
            Some("2026-11-26T04:05:00Z".parse().unwrap())
        );
    }
}
