//! Placing a Task: the robot its attempt gets (chosen under the
//! scheduler's lock and reserved in the ledger) and the writes that give it
//! (`spec.targetRobot` first, then the status `dispatching`). A Task the
//! manager is about to create is placed before it is created, so it is
//! created with its robot and needs only its status written.

use std::time::Duration;

use jiff::Timestamp;
use k8s4r_api::condition::set_condition;
use k8s4r_api::names::CONDITION_SCHEDULED;
use k8s4r_api::validation::validate_task_spec;
use k8s4r_api::{ConditionStatus, Task, TaskReason, TaskState, TaskStatus};
use kube::api::Patch;
use kube::runtime::reflector::ObjectRef;
use kube::{Api, ResourceExt};
use serde::Serialize;

use super::super::config::Cached;
use super::super::{condition_at, demand_of, group_of, key_of, Context, SchedState};
use super::TaskStatusPatch;
use crate::error::Result;
use crate::ledger::Placement;
use crate::lifecycle::plus;
use crate::scheduler::{choose_outranked, choose_sampled, ConfigLookup, NoFit, Request};
use k8s4r_service::patch::Guarded;

#[derive(Debug, Serialize)]
#[serde(rename_all = "camelCase")]
struct TargetRobot<'a> {
    target_robot: &'a str,
}

/// The robot the next attempt avoids: the one that lost the last attempt
/// (silent, or it never started it, or was not ready for it, or was
/// drained, or lost a start condition), which is not given the next one
/// while another robot fits.
pub(super) fn avoided_robot(status: &TaskStatus) -> Option<String> {
    status
        .attempts
        .last()
        .filter(|a| {
            matches!(
                a.reason,
                Some(
                    TaskReason::DispatchTimeout
                        | TaskReason::RobotLost
                        | TaskReason::NotOnRobot
                        | TaskReason::OverCapacity
                        | TaskReason::NotPermitted
                        | TaskReason::NotReady
                        | TaskReason::ImageUnavailable
                        | TaskReason::Drained
                        | TaskReason::ConditionLost
                )
            )
        })
        .and_then(|a| a.robot.clone())
}

/// One scheduling decision.
struct Choice {
    /// The robot chosen, or why none fits.
    robot: Result<String, NoFit>,
    /// The waiting tasks of higher priority that robots were left to.
    outranked_by: Vec<ObjectRef<Task>>,
}

/// Who asks for a decision.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Asker {
    /// The Task controller, for a Task that exists.
    Task,
    /// The TaskGroup controller, for a Task it is about to create: a robot
    /// found is reserved as owed ([`crate::ledger::Ledger::owed`]), and none
    /// found is not recorded (the Task controller decides again and says
    /// why).
    Creation,
}

/// Chooses a robot for `attempt` of `task` under the scheduler's lock and
/// records the choice there: the robot reserved in the ledger, or the task
/// waiting. `None` when this attempt was placed already.
fn decide(
    task: &Task,
    ctx: &Context,
    key: &str,
    attempt: u32,
    request: &Request<'_>,
    asker: Asker,
) -> Option<Choice> {
    let obj_ref = ObjectRef::from_obj(task);
    let priority = task.spec.priority;
    let mut guard = ctx.sched();
    let sched = &mut *guard;
    if sched.ledger.attempt_of(key).is_some_and(|a| a >= attempt) {
        // This attempt was placed already; the cache has not caught up.
        // Its watch event will bring the Task back.
        tracing::debug!(attempt, known = ?sched.ledger.attempt_of(key), "attempt placed already");
        return None;
    }
    // A robot a waiting task of higher priority fits is left to it, and
    // the next best is tried.
    let view: &SchedState = sched;
    let (outcome, outranked_by) = choose_outranked(
        &view.robots,
        &view.cursor,
        request,
        |n| view.ledger.usage(n),
        |robot, already| outranking(ctx, view, robot, priority, already),
    );
    match &outcome {
        Ok(robot) => {
            let placement = Placement {
                robot: robot.clone(),
                group: request.group.to_owned(),
                demand: request.demand.clone(),
            };
            // The next decision looks on from here, and the tasks that
            // left it a robot look again.
            for lower in sched.placed(key, &obj_ref, attempt, placement) {
                ctx.triggers.task(lower);
            }
            if asker == Asker::Creation {
                sched.ledger.owe(key);
            }
        }
        Err(_) if asker == Asker::Task => sched.unplaced(&obj_ref, priority, &outranked_by),
        Err(_) => {}
    }
    ctx.metrics.set_waiting(sched.waiting.len());
    Some(Choice {
        robot: outcome,
        outranked_by,
    })
}

/// The robot for `attempt` of `task`, which is pending: the one it was
/// created with when that placement is still owed its status, else a new
/// decision (`Err` when no robot fits). `None` when this attempt was placed
/// already and the cache has not caught up.
pub(super) fn robot_for(
    task: &Task,
    ctx: &Context,
    key: &str,
    status: &TaskStatus,
    attempt: u32,
) -> Option<Result<String, NoFit>> {
    if let Some(robot) = owed_robot(task, ctx, key, attempt) {
        return Some(Ok(robot));
    }
    let group = group_of(task);
    let avoid = avoided_robot(status);
    let config = config_of(task, ctx);
    let request = request_for(task, &group, avoid.as_deref(), config_ref(&config));
    let choice = decide(task, ctx, key, attempt, &request, Asker::Task)?;
    for higher in choice.outranked_by {
        ctx.triggers.task(higher);
    }
    Some(choice.robot)
}

/// The robot `task` was created with, when that placement (made by
/// [`place_new`]) is still owed its status and the Task still names it:
/// handed out once (a later look at a stale cache finds it placed, as any
/// other). A placement the Task no longer matches is taken back.
fn owed_robot(task: &Task, ctx: &Context, key: &str, attempt: u32) -> Option<String> {
    let mut sched = ctx.sched();
    let (owed_attempt, robot) = sched.ledger.owed(key)?;
    let robot = robot.to_owned();
    let named = task.spec.target_robot.as_deref() == Some(robot.as_str());
    if owed_attempt == attempt && named && sched.robots.contains_key(&robot) {
        sched.ledger.settle(key);
        return Some(robot);
    }
    sched.ledger.unreserve(key, owed_attempt, &robot);
    room_freed(ctx, &sched, &robot);
    None
}

/// Wakes what a reservation taken back concerns: its robot (its
/// `allocated`) and the tasks waiting for room.
fn room_freed(ctx: &Context, sched: &SchedState, robot: &str) {
    ctx.triggers.robot(robot);
    for waiting in sched.waiting_by_priority() {
        ctx.triggers.task(waiting);
    }
}

/// Places a Task the manager is about to create, so that it is created
/// naming its robot in `spec.targetRobot` and its placement costs one more
/// write (the status), not two: the reservation is owed until the Task
/// controller writes `dispatching`. A Task whose spec is invalid, or that
/// no robot fits now, is left unplaced; the Task controller decides for it
/// as for any other. Returns the robot.
pub fn place_new(task: &mut Task, ctx: &Context) -> Option<String> {
    if task.spec.target_robot.is_some() || validate_task_spec(&task.spec).is_err() {
        return None;
    }
    let key = key_of(task);
    let group = group_of(task);
    let config = config_of(task, ctx);
    let request = request_for(task, &group, None, config_ref(&config));
    let choice = decide(task, ctx, &key, 1, &request, Asker::Creation)?;
    for higher in choice.outranked_by {
        ctx.triggers.task(higher);
    }
    let robot = choice.robot.ok()?;
    task.spec.target_robot = Some(robot.clone());
    Some(robot)
}

/// Takes back the placement [`place_new`] made for a Task that was not
/// created (it existed already, or the create failed), while it is still
/// owed: not one the Task that exists under that name holds.
pub fn unplace_new(task: &Task, ctx: &Context) {
    let Some(robot) = &task.spec.target_robot else {
        return;
    };
    let key = key_of(task);
    let mut sched = ctx.sched();
    if sched.ledger.owed(&key) == Some((1, robot.as_str())) {
        sched.ledger.unreserve(&key, 1, robot);
        room_freed(ctx, &sched, robot);
    }
}

/// Most waiting tasks of higher priority one decision looks at.
const MAX_OUTRANKING_LOOKS: usize = 8;

/// What `task` takes from ConfigMaps and Secrets, looked up in the cache.
fn config_of<'a>(task: &'a Task, ctx: &'a Context) -> Option<Cached<'a>> {
    let namespace = task.metadata.namespace.as_deref().unwrap_or_default();
    Cached::of(&task.spec.template, namespace, &ctx.stores)
}

fn config_ref<'a>(config: &'a Option<Cached<'a>>) -> Option<&'a dyn ConfigLookup> {
    config.as_ref().map(|c| c as &dyn ConfigLookup)
}

/// What `task` asks of the scheduler.
fn request_for<'a>(
    task: &'a Task,
    group: &'a str,
    avoid: Option<&'a str>,
    config: Option<&'a dyn ConfigLookup>,
) -> Request<'a> {
    Request {
        group,
        selector: task.spec.robot_selector.as_ref(),
        constraints: &task.spec.constraints,
        driver: &task.spec.template.driver,
        demand: demand_of(task),
        avoid,
        robot: task.spec.robot_name.as_deref(),
        anti_affinity: task.spec.anti_affinity.as_ref(),
        affinity: &task.spec.affinity,
        reserved: &[],
        when: &task.spec.template.when,
        config,
    }
}

/// A waiting task of higher priority than `priority` that `robot` fits, if
/// any (the highest first), other than those `already` given a robot.
fn outranking(
    ctx: &Context,
    sched: &SchedState,
    robot: &str,
    priority: i32,
    already: &[ObjectRef<Task>],
) -> Option<ObjectRef<Task>> {
    let mut higher: Vec<(&ObjectRef<Task>, i32)> = sched
        .waiting
        .iter()
        .filter(|(r, p)| **p > priority && !already.contains(r))
        .map(|(r, p)| (r, *p))
        .collect();
    if higher.is_empty() {
        return None;
    }
    higher.sort_by(|a, b| b.1.cmp(&a.1).then_with(|| a.0.name.cmp(&b.0.name)));
    higher
        .into_iter()
        .take(MAX_OUTRANKING_LOOKS)
        .find(|(waiting, _)| {
            let Some(other) = ctx.stores.tasks.get(waiting) else {
                return false;
            };
            let pending = other
                .status
                .as_ref()
                .and_then(|s| s.state)
                .is_none_or(|s| s == TaskState::Pending);
            if !pending || other.spec.robot_name.as_deref().is_some_and(|r| r != robot) {
                return false;
            }
            let group = group_of(&other);
            let config = config_of(&other, ctx);
            let request = Request {
                robot: Some(robot),
                ..request_for(&other, &group, None, config_ref(&config))
            };
            choose_sampled(&sched.robots, "", &request, |n| sched.ledger.usage(n)).is_ok()
        })
        .map(|(r, _)| r.clone())
}

#[allow(clippy::too_many_arguments)]
pub(super) async fn place(
    task: &Task,
    ctx: &Context,
    api: &Api<Task>,
    name: &str,
    status: &TaskStatus,
    attempt: u32,
    robot: &str,
    now: Timestamp,
) -> Result<()> {
    // The robot first, then `dispatching`: the server acts on the state and
    // must find the new robot already there. A Task created with its robot
    // (or whose last attempt had it) names it already.
    let mut rv = task.resource_version();
    if task.spec.target_robot.as_deref() != Some(robot) {
        let target = TargetRobot { target_robot: robot };
        let spec = Guarded::spec(rv.as_deref(), &target);
        let updated = ctx
            .api::<Task, _>(
                "set the target robot of",
                name,
                api.patch(name, &ctx.kube.patch_params(), &Patch::Merge(&spec)),
            )
            .await?;
        rv = updated.resource_version();
        ctx.metrics.target_patches.inc();
    }
    let patch = plan_dispatch(status, attempt, robot, now, ctx.config.lifecycle.dispatch_timeout);
    ctx.patch_status(api, name, rv, patch).await?;
    Ok(())
}

/// The status patch that starts `attempt` on `robot`: dispatching, with a
/// deadline `dispatch_timeout` from `now`, and what the last attempt left
/// behind cleared.
pub fn plan_dispatch(
    status: &TaskStatus,
    attempt: u32,
    robot: &str,
    now: Timestamp,
    dispatch_timeout: Duration,
) -> TaskStatusPatch {
    let mut conditions = status.conditions.clone();
    set_condition(
        &mut conditions,
        condition_at(
            CONDITION_SCHEDULED,
            ConditionStatus::True,
            "Scheduled",
            format!("attempt {attempt} assigned to robot {robot}"),
            now,
        ),
    );
    TaskStatusPatch {
        state: Some(TaskState::Dispatching),
        attempt: Some(attempt),
        seq: Some(0),
        robot: Some(Some(robot.to_owned())),
        dispatch_time: Some(Some(now)),
        dispatch_deadline: Some(Some(plus(now, dispatch_timeout))),
        observed_running_time: Some(None),
        next_attempt_time: Some(None),
        exit_code: Some(None),
        signal: Some(None),
        reason: Some(None),
        message: Some(None),
        start_time: Some(None),
        finish_time: Some(None),
        output_tail: Some(None),
        // Restarts on the robot count per attempt.
        restart_count: Some(None),
        last_exit_code: Some(None),
        last_restart_time: Some(None),
        conditions: Some(conditions),
        attempts: None,
        retry: None,
        cancellation: None,
        eviction: None,
        // The new attempt's robot reports what it runs with.
        config: Some(None),
    }
}
