//! RobotController: approves registrations, marks robots Offline and Online
//! from the liveness the server records, and keeps `status.allocated`.

use std::sync::Arc;

use jiff::Timestamp;
use k8s4r_api::condition::{find_condition, set_condition};
use k8s4r_api::names::{CONDITION_ACCEPTING_TASKS, CONDITION_APPROVED, CONDITION_CONNECTED, CONDITION_READY};
use k8s4r_api::{Condition, ConditionStatus, Quantity, Robot, RobotPhase, RobotResources, RobotStatus};
use k8s_openapi::api::coordination::v1::Lease;
use k8s_openapi::api::core::v1::Secret;
use kube::runtime::controller::Action;
use kube::runtime::reflector::ObjectRef;
use kube::{Api, ResourceExt};
use serde::Serialize;
use sha2::{Digest, Sha256};
use tracing::instrument;

use super::{condition_at, key_of, Context, Look, Note};
use crate::error::{Error, Result};
use crate::liveness::{approval, verdict, Approval, Liveness, Verdict};

/// How often a robot waiting for a token Secret looks for it again.
const SECRET_RECHECK: std::time::Duration = std::time::Duration::from_secs(30);

/// The Robot status fields the manager writes.
#[derive(Debug, Default, PartialEq, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct RobotStatusPatch {
    #[serde(skip_serializing_if = "Option::is_none")]
    phase: Option<RobotPhase>,
    #[serde(skip_serializing_if = "Option::is_none")]
    message: Option<String>,
    #[serde(skip_serializing_if = "Option::is_none")]
    conditions: Option<Vec<Condition>>,
    #[serde(skip_serializing_if = "Option::is_none")]
    allocated: Option<RobotResources>,
    #[serde(skip_serializing_if = "Option::is_none")]
    schedulable: Option<bool>,
    #[serde(skip_serializing_if = "Option::is_none")]
    last_heartbeat_time: Option<Timestamp>,
}

/// Reconciles one Robot.
#[instrument(skip_all, fields(robot = %robot.name_any()))]
pub async fn reconcile(robot: Arc<Robot>, ctx: Arc<Context>) -> Result<Action> {
    let ctx = ctx.as_ref();
    ctx.instrumented(
        "robot",
        robot,
        Look::cached(&ctx.stores.robots),
        |robot| async move { reconcile_robot(&robot, ctx).await },
    )
    .await
}

/// Backs off a Robot whose reconcile failed.
pub fn error_policy(robot: Arc<Robot>, error: &Error, ctx: Arc<Context>) -> Action {
    ctx.error_policy("robot", &key_of(robot.as_ref()), error)
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
        lease_duration: lease
            .and_then(|l| l.spec.as_ref()?.lease_duration_seconds)
            .and_then(|s| u64::try_from(s).ok())
            .map(std::time::Duration::from_secs),
        last_registration: status.last_registration_time,
        approved: find_condition(&status.conditions, CONDITION_APPROVED)
            .filter(|c| c.status == ConditionStatus::True)
            .and_then(|c| c.last_transition_time),
        connected: find_condition(&status.conditions, CONDITION_CONNECTED)
            .map(|c| (c.status, c.last_transition_time)),
    }
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
    super::rollout::unmark_orphan(ctx, robot).await?;

    let PhasePlan {
        mut patch,
        event,
        mut requeue,
    } = match status.phase {
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
            let decision = approval(presented, known.as_deref(), ctx.config.auto_approve);
            plan_approval(&status, decision, Timestamp::now())
        }
        Some(phase @ (RobotPhase::Online | RobotPhase::Offline)) => {
            let live = liveness_of(robot, robot_lease(ctx, &robot.name_any()).as_deref());
            let now = Timestamp::now();
            let verdict = verdict(phase, &live, now, &ctx.config.liveness);
            plan_liveness(&status, verdict, live.lease_renew, now)
        }
    };

    let phase_change = patch.phase.is_some() || patch.conditions.is_some();
    patch.schedulable = schedulable_change(robot);
    let writing = phase_change || patch.message.is_some() || patch.schedulable.is_some();
    let alloc = allocated(ctx, &name);
    if status.allocated.as_ref() != Some(&alloc) {
        // `allocated` is for people (the scheduler keeps its own ledger):
        // a robot taking tasks in a burst gets it written at most once per
        // interval, unless something else is written anyway.
        match ctx.allocations.due(&name, writing, std::time::Duration::MAX) {
            None => patch.allocated = Some(alloc),
            Some(wait) => requeue = Some(requeue.map_or(wait, |r| r.min(wait))),
        }
    }
    if writing || patch.allocated.is_some() {
        // Conditions are a list the server writes too: guard the whole
        // read-modify-write with the version it was read at.
        let version = if phase_change {
            robot.resource_version()
        } else {
            None
        };
        ctx.patch_status(&api, &name, version, &patch).await?;
        if let Some(note) = event {
            tracing::info!(robot = %name, reason = note.reason, note = %note.message, "robot phase");
            ctx.publish(robot, note);
        }
    }
    Ok(match requeue {
        Some(after) => Action::requeue(after.max(std::time::Duration::from_millis(10))),
        None => Action::await_change(),
    })
}

/// `status.schedulable` as it should now be written, or None when it
/// already says so: false while the robot is cordoned. The spec field is
/// left out when false, so a column on it would print nothing for a robot
/// that takes tasks.
pub fn schedulable_change(robot: &Robot) -> Option<bool> {
    let schedulable = !robot.spec.unschedulable;
    let written = robot.status.as_ref().and_then(|s| s.schedulable);
    (written != Some(schedulable)).then_some(schedulable)
}

/// What a Robot's phase calls for.
#[derive(Debug, Default, PartialEq)]
pub struct PhasePlan {
    /// The status fields to write; `conditions` only when they changed.
    pub patch: RobotStatusPatch,
    /// The Event that goes with the write.
    pub event: Option<Note>,
    /// When to look again; `None`: on a change only.
    pub requeue: Option<std::time::Duration>,
}

/// Plans the status of a robot waiting for approval (Pending, Rejected or
/// new) from the approval `decision`.
pub fn plan_approval(status: &RobotStatus, decision: Approval, now: Timestamp) -> PhasePlan {
    let mut plan = PhasePlan::default();
    let mut conditions = status.conditions.clone();
    match decision {
        Approval::Approve(message) => {
            plan.patch.phase = Some(RobotPhase::Online);
            set_condition(
                &mut conditions,
                condition_at(
                    CONDITION_APPROVED,
                    ConditionStatus::True,
                    "Approved",
                    message.clone(),
                    now,
                ),
            );
            set_condition(
                &mut conditions,
                condition_at(
                    CONDITION_READY,
                    ConditionStatus::True,
                    "Registered",
                    "registered and approved",
                    now,
                ),
            );
            plan.event = Some(Note::normal("Approved", message.clone()));
            plan.patch.message = Some(message);
        }
        Approval::Reject(message) => {
            if status.phase != Some(RobotPhase::Rejected) || status.message.as_deref() != Some(&message) {
                plan.patch.phase = Some(RobotPhase::Rejected);
                set_condition(
                    &mut conditions,
                    condition_at(
                        CONDITION_APPROVED,
                        ConditionStatus::False,
                        "Rejected",
                        message.clone(),
                        now,
                    ),
                );
                plan.event = Some(Note::warning("Rejected", message.clone()));
                plan.patch.message = Some(message);
            }
        }
        Approval::Wait(message) => {
            if status.phase.is_none() {
                plan.patch.phase = Some(RobotPhase::Pending);
            }
            if status.message.as_deref() != Some(&message) {
                plan.patch.message = Some(message);
            }
            plan.requeue = Some(SECRET_RECHECK);
        }
    }
    if conditions != status.conditions {
        plan.patch.conditions = Some(conditions);
    }
    plan
}

/// Plans the status of an approved robot (Online or Offline) from the
/// liveness `verdict`; `lease_renew` is the robot's last sign of life its
/// Lease shows.
///
/// An Offline robot takes no tasks, whatever its agent last said: its
/// `AcceptingTasks` condition becomes Unknown (as a node's conditions do
/// when its kubelet stops posting), until its next heartbeat says again;
/// and its `lastHeartbeatTime`, which the server writes coalesced, becomes
/// its Lease's last renewal when that is newer (within a Lease interval of
/// its last heartbeat), so that the HEARTBEAT column gives the age of what
/// it shows (its facts and usage, marked stale) as closely as the cluster
/// knows it.
pub fn plan_liveness(
    status: &RobotStatus,
    verdict: Verdict,
    lease_renew: Option<Timestamp>,
    now: Timestamp,
) -> PhasePlan {
    let mut plan = PhasePlan::default();
    let (phase, ready, event, reason, message) = match verdict {
        Verdict::Stay(after) => {
            plan.requeue = after;
            return plan;
        }
        Verdict::Offline { reason, message } => (
            RobotPhase::Offline,
            ConditionStatus::False,
            Note::warning("Offline", message.clone()),
            reason,
            message,
        ),
        Verdict::Online { reason, message } => (
            RobotPhase::Online,
            ConditionStatus::True,
            Note::normal("Online", message.clone()),
            reason,
            message,
        ),
    };
    plan.patch.phase = Some(phase);
    let mut conditions = status.conditions.clone();
    set_condition(
        &mut conditions,
        condition_at(CONDITION_READY, ready, reason, message.clone(), now),
    );
    if phase == RobotPhase::Offline {
        if find_condition(&conditions, CONDITION_ACCEPTING_TASKS).is_some() {
            set_condition(
                &mut conditions,
                condition_at(
                    CONDITION_ACCEPTING_TASKS,
                    ConditionStatus::Unknown,
                    "RobotOffline",
                    "the robot is offline: it takes no tasks, and what it last reported is stale",
                    now,
                ),
            );
        }
        plan.patch.last_heartbeat_time =
            lease_renew.filter(|renew| status.last_heartbeat_time < Some(*renew));
    }
    plan.event = Some(event);
    plan.patch.message = Some(message);
    if conditions != status.conditions {
        plan.patch.conditions = Some(conditions);
    }
    plan
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::time::Duration;

    fn now() -> Timestamp {
        "2026-11-25T10:00:00Z".parse().unwrap()
    }

    fn in_phase(phase: Option<RobotPhase>) -> RobotStatus {
        RobotStatus {
            phase,
            ..RobotStatus::default()
        }
    }

    #[test]
    fn an_approved_robot_goes_online_and_ready() {
        let plan = plan_approval(&in_phase(None), Approval::Approve("token accepted".into()), now());
        assert_eq!(plan.patch.phase, Some(RobotPhase::Online));
        assert_eq!(plan.patch.message.as_deref(), Some("token accepted"));
        let conditions = plan.patch.conditions.unwrap();
        let approved = find_condition(&conditions, CONDITION_APPROVED).unwrap();
        assert_eq!(approved.status, ConditionStatus::True);
        assert_eq!(approved.last_transition_time, Some(now()));
        let ready = find_condition(&conditions, CONDITION_READY).unwrap();
        assert_eq!(ready.reason.as_deref(), Some("Registered"));
        assert_eq!(plan.event, Some(Note::normal("Approved", "token accepted")));
        assert_eq!(plan.requeue, None);
    }

    #[test]
    fn a_rejection_is_written_once() {
        let plan = plan_approval(&in_phase(None), Approval::Reject("unknown token".into()), now());
        assert_eq!(plan.patch.phase, Some(RobotPhase::Rejected));
        assert_eq!(plan.event, Some(Note::warning("Rejected", "unknown token")));
        let rejected = RobotStatus {
            phase: Some(RobotPhase::Rejected),
            message: Some("unknown token".into()),
            conditions: plan.patch.conditions.unwrap(),
            ..RobotStatus::default()
        };
        let again = plan_approval(&rejected, Approval::Reject("unknown token".into()), now());
        assert_eq!(again, PhasePlan::default());
    }

    #[test]
    fn a_robot_waiting_for_its_secret_is_pending_and_looks_again() {
        let wait = || Approval::Wait("no bootstrap secret yet".into());
        let plan = plan_approval(&in_phase(None), wait(), now());
        assert_eq!(plan.patch.phase, Some(RobotPhase::Pending));
        assert_eq!(plan.patch.message.as_deref(), Some("no bootstrap secret yet"));
        assert_eq!(plan.patch.conditions, None);
        assert_eq!(plan.requeue, Some(SECRET_RECHECK));
        let waiting = RobotStatus {
            phase: Some(RobotPhase::Pending),
            message: Some("no bootstrap secret yet".into()),
            ..RobotStatus::default()
        };
        let again = plan_approval(&waiting, wait(), now());
        assert_eq!(again.patch, RobotStatusPatch::default());
        assert_eq!(again.requeue, Some(SECRET_RECHECK));
    }

    #[test]
    fn liveness_moves_a_robot_offline_and_back() {
        let mut online = in_phase(Some(RobotPhase::Online));
        online.conditions.push(condition_at(
            CONDITION_ACCEPTING_TASKS,
            ConditionStatus::True,
            "Ready",
            "the agent takes tasks",
            now(),
        ));
        online.last_heartbeat_time = Some("2026-11-25T09:55:00Z".parse().unwrap());
        let stay = plan_liveness(&online, Verdict::Stay(Some(Duration::from_secs(5))), None, now());
        assert_eq!(stay.patch, RobotStatusPatch::default());
        assert_eq!(stay.requeue, Some(Duration::from_secs(5)));

        let offline = Verdict::Offline {
            reason: "HeartbeatTimeout",
            message: "silent for 2m".into(),
        };
        let renewed: Timestamp = "2026-11-25T09:57:30Z".parse().unwrap();
        let plan = plan_liveness(&online, offline, Some(renewed), now());
        assert_eq!(plan.patch.phase, Some(RobotPhase::Offline));
        assert_eq!(plan.event, Some(Note::warning("Offline", "silent for 2m")));
        assert_eq!(
            plan.patch.last_heartbeat_time,
            Some(renewed),
            "the Lease's last renewal, not the coalesced heartbeat"
        );
        let conditions = plan.patch.conditions.unwrap();
        let ready = find_condition(&conditions, CONDITION_READY).unwrap();
        assert_eq!(ready.status, ConditionStatus::False);
        let accepting = find_condition(&conditions, CONDITION_ACCEPTING_TASKS).unwrap();
        assert_eq!(
            (accepting.status, accepting.reason.as_deref()),
            (ConditionStatus::Unknown, Some("RobotOffline")),
            "an Offline robot is not shown accepting tasks"
        );

        let back = Verdict::Online {
            reason: "Heartbeat",
            message: "heard again".into(),
        };
        let status = RobotStatus {
            phase: Some(RobotPhase::Offline),
            conditions,
            ..RobotStatus::default()
        };
        let plan = plan_liveness(&status, back, None, now());
        assert_eq!(plan.patch.phase, Some(RobotPhase::Online));
        assert_eq!(plan.event, Some(Note::normal("Online", "heard again")));
    }

    #[test]
    fn schedulable_follows_the_cordon_and_is_written_once() {
        let mut robot = Robot::new("r1", k8s4r_api::RobotSpec::default());
        assert_eq!(schedulable_change(&robot), Some(true), "never written yet");
        robot.status = Some(RobotStatus {
            schedulable: Some(true),
            ..RobotStatus::default()
        });
        assert_eq!(schedulable_change(&robot), None);
        robot.spec.unschedulable = true;
        assert_eq!(schedulable_change(&robot), Some(false), "cordoned");
        robot.status.as_mut().unwrap().schedulable = Some(false);
        assert_eq!(schedulable_change(&robot), None);
        let patch = RobotStatusPatch {
            schedulable: Some(false),
            ..RobotStatusPatch::default()
        };
        assert_eq!(
            serde_json::to_value(&patch).unwrap(),
            serde_json::json!({ "schedulable": false }),
            "false is written, so the column prints it"
        );
    }

    #[test]
    fn token_hash_is_lowercase_hex_sha256() {
        assert_eq!(
            sha256_hex(b"abc"),
            "ba7816bf8f01cfea414140de5dae2223b00361a396177a9cb410ff61f20015ad"
        );
    }
}
