//! RobotController: approves registrations, marks robots Offline and Online
//! from the liveness the server records, and keeps `status.allocated`.

use std::sync::Arc;

use jiff::Timestamp;
use k8s4r_api::condition::{find_condition, set_condition};
use k8s4r_api::names::{CONDITION_APPROVED, CONDITION_CONNECTED, CONDITION_READY};
use k8s4r_api::{Condition, ConditionStatus, Quantity, Robot, RobotPhase, RobotResources};
use k8s_openapi::api::coordination::v1::Lease;
use k8s_openapi::api::core::v1::Secret;
use kube::runtime::controller::Action;
use kube::runtime::events::EventType;
use kube::runtime::reflector::ObjectRef;
use kube::{Api, ResourceExt};
use serde::Serialize;
use sha2::{Digest, Sha256};
use tracing::instrument;

use super::context::lock;
use super::Context;
use crate::error::{Error, Result};
use crate::liveness::{approval, verdict, Approval, Liveness, Verdict};

/// How often a robot waiting for a token Secret looks for it again.
const SECRET_RECHECK: std::time::Duration = std::time::Duration::from_secs(30);

/// The Robot status fields the manager writes.
#[derive(Debug, Default, Serialize)]
#[serde(rename_all = "camelCase")]
struct RobotStatusPatch {
    #[serde(skip_serializing_if = "Option::is_none")]
    phase: Option<RobotPhase>,
    #[serde(skip_serializing_if = "Option::is_none")]
    message: Option<String>,
    #[serde(skip_serializing_if = "Option::is_none")]
    conditions: Option<Vec<Condition>>,
    #[serde(skip_serializing_if = "Option::is_none")]
    allocated: Option<RobotResources>,
}

/// Reconciles one Robot.
#[instrument(skip_all, fields(robot = %robot.name_any()))]
pub async fn reconcile(robot: Arc<Robot>, ctx: Arc<Context>) -> Result<Action> {
    let key = robot.name_any();
    ctx.instrumented("robot", key, reconcile_robot(&robot, &ctx))
        .await
}

/// Backs off a Robot whose reconcile failed.
pub fn error_policy(robot: Arc<Robot>, error: &Error, ctx: Arc<Context>) -> Action {
    ctx.error_policy("robot", robot.name_any(), error)
}

/// Hex SHA-256, as the server writes the token hash.
pub fn sha256_hex(data: &[u8]) -> String {
    Sha256::digest(data).iter().map(|b| format!("{b:02x}")).collect()
}

async fn known_token_hashes(ctx: &Context) -> Result<Option<Vec<String>>> {
    let api: Api<Secret> = Api::namespaced(ctx.client(), &ctx.config.namespace);
    let name = &ctx.config.bootstrap_secret;
    let secret = ctx.api::<Secret, _>("read", name, api.get_opt(name)).await?;
    // `stringData` is folded into `data` by a real API server; read both in
    // case one stores it as written.
    Ok(secret.map(|s| {
        let data = s.data.unwrap_or_default();
        let text = s.string_data.unwrap_or_default();
        data.values()
            .map(|v| String::from_utf8_lossy(&v.0).into_owned())
            .chain(text.into_values())
            .map(|token| sha256_hex(token.trim().as_bytes()))
            .collect()
    }))
}

/// The robot's Lease, as last watched.
pub(crate) fn robot_lease(ctx: &Context, robot: &str) -> Option<Arc<Lease>> {
    ctx.stores
        .leases
        .get(&ObjectRef::new(robot).within(&ctx.config.robot_lease_namespace))
}

/// What the cluster recorded of the robot's signs of life.
pub(crate) fn liveness_of(robot: &Robot, lease: Option<&Lease>) -> Liveness {
    let status = robot.status.clone().unwrap_or_default();
    Liveness {
        last_heartbeat: status.last_heartbeat_time,
        lease_renew: lease
            .and_then(|l| l.spec.as_ref().and_then(|s| s.renew_time.clone()))
            .map(|t| t.0),
        last_registration: status.last_registration_time,
        connected: find_condition(&status.conditions, CONDITION_CONNECTED)
            .map(|c| (c.status, c.last_transition_time)),
    }
}

/// `None` when a Robot's `allocated` may be written now (and then it is
/// taken as written); else how long until it may.
fn allocation_due(ctx: &Context, robot: &str, writing_anyway: bool) -> Option<std::time::Duration> {
    let now = std::time::Instant::now();
    let mut written = lock(&ctx.allocation_written);
    let wait = written
        .get(robot)
        .map(|at| {
            ctx.config
                .allocation_interval
                .saturating_sub(now.duration_since(*at))
        })
        .filter(|wait| !wait.is_zero() && !writing_anyway);
    if wait.is_none() {
        written.insert(robot.to_owned(), now);
    }
    wait
}

fn allocated(ctx: &Context, robot: &str) -> RobotResources {
    let sched = ctx.sched();
    let usage = sched.ledger.usage(robot);
    RobotResources {
        cpu: Some(Quantity::from_millicores(usage.map_or(0, |u| u.cpu_milli))),
        memory: Some(Quantity::from_bytes(usage.map_or(0, |u| u.memory_bytes))),
        tasks: usage.map_or(0, |u| u.tasks),
    }
}

async fn reconcile_robot(robot: &Robot, ctx: &Context) -> Result<Action> {
    if robot.metadata.deletion_timestamp.is_some() {
        return Ok(Action::await_change());
    }
    let name = robot.name_any();
    let api: Api<Robot> = Api::all(ctx.client());
    let status = robot.status.clone().unwrap_or_default();
    let mut patch = RobotStatusPatch::default();
    let mut conditions = status.conditions.clone();
    let mut requeue = None;
    let mut event = None;

    match status.phase {
        None | Some(RobotPhase::Pending) | Some(RobotPhase::Rejected) => {
            let known = if ctx.config.auto_approve {
                None
            } else {
                known_token_hashes(ctx).await?
            };
            let presented = robot
                .annotations()
                .get(k8s4r_api::names::ANNOTATION_TOKEN_SHA256)
                .map(String::as_str);
            match approval(presented, known.as_deref(), ctx.config.auto_approve) {
                Approval::Approve(message) => {
                    patch.phase = Some(RobotPhase::Online);
                    set_condition(
                        &mut conditions,
                        Condition::new(
                            CONDITION_APPROVED,
                            ConditionStatus::True,
                            "Approved",
                            message.clone(),
                        ),
                    );
                    set_condition(
                        &mut conditions,
                        Condition::new(
                            CONDITION_READY,
                            ConditionStatus::True,
                            "Registered",
                            "registered and approved",
                        ),
                    );
                    event = Some((EventType::Normal, "Approved", message.clone()));
                    patch.message = Some(message);
                }
                Approval::Reject(message) => {
                    if status.phase != Some(RobotPhase::Rejected)
                        || status.message.as_deref() != Some(&message)
                    {
                        patch.phase = Some(RobotPhase::Rejected);
                        set_condition(
                            &mut conditions,
                            Condition::new(
                                CONDITION_APPROVED,
                                ConditionStatus::False,
                                "Rejected",
                                message.clone(),
                            ),
                        );
                        event = Some((EventType::Warning, "Rejected", message.clone()));
                        patch.message = Some(message);
                    }
                }
                Approval::Wait(message) => {
                    if status.phase.is_none() {
                        patch.phase = Some(RobotPhase::Pending);
                    }
                    if status.message.as_deref() != Some(&message) {
                        patch.message = Some(message);
                    }
                    requeue = Some(SECRET_RECHECK);
                }
            }
        }
        Some(phase @ (RobotPhase::Online | RobotPhase::Offline)) => {
            let live = liveness_of(robot, robot_lease(ctx, &robot.name_any()).as_deref());
            match verdict(phase, &live, Timestamp::now(), &ctx.config.liveness) {
                Verdict::Stay(after) => requeue = after,
                Verdict::Offline { reason, message } => {
                    patch.phase = Some(RobotPhase::Offline);
                    set_condition(
                        &mut conditions,
                        Condition::new(CONDITION_READY, ConditionStatus::False, reason, message.clone()),
                    );
                    event = Some((EventType::Warning, "Offline", message.clone()));
                    patch.message = Some(message);
                }
                Verdict::Online { reason, message } => {
                    patch.phase = Some(RobotPhase::Online);
                    set_condition(
                        &mut conditions,
                        Condition::new(CONDITION_READY, ConditionStatus::True, reason, message.clone()),
                    );
                    event = Some((EventType::Normal, "Online", message.clone()));
                    patch.message = Some(message);
                }
            }
        }
    }

    if conditions != status.conditions {
        patch.conditions = Some(conditions);
    }
    let phase_change = patch.phase.is_some() || patch.conditions.is_some();
    let alloc = allocated(ctx, &name);
    if status.allocated.as_ref() != Some(&alloc) {
        // `allocated` is for people (the scheduler keeps its own ledger):
        // a robot taking tasks in a burst gets it written at most once per
        // interval, unless something else is written anyway.
        match allocation_due(ctx, &name, phase_change || patch.message.is_some()) {
            None => patch.allocated = Some(alloc),
            Some(wait) => requeue = Some(requeue.map_or(wait, |r| r.min(wait))),
        }
    }
    if phase_change || patch.allocated.is_some() || patch.message.is_some() {
        // Conditions are a list the server writes too: guard the whole
        // read-modify-write with the version it was read at.
        let version = if phase_change {
            robot.resource_version()
        } else {
            None
        };
        ctx.patch_status(&api, &name, version, &patch).await?;
        if let Some((kind, reason, note)) = event {
            tracing::info!(robot = %name, reason, %note, "robot phase");
            ctx.event(robot, kind, reason, note);
        }
    }
    Ok(match requeue {
        Some(after) => Action::requeue(after.max(std::time::Duration::from_millis(10))),
        None => Action::await_change(),
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn token_hash_is_lowercase_hex_sha256() {
        assert_eq!(
            sha256_hex(b"abc"),
            "ba7816bf8f01cfea414140de5dae2223b00361a396177a9cb410ff61f20015ad"
        );
    }
}
