//! TaskController: places pending Tasks on robots and carries each attempt
//! through its lifecycle (see [`crate::lifecycle`]).

use std::sync::Arc;
use std::time::Duration;

use jiff::Timestamp;
use k8s4r_api::condition::{find_condition, set_condition};
use k8s4r_api::names::CONDITION_SCHEDULED;
use k8s4r_api::validation::validate_task_spec;
use k8s4r_api::{
    AttemptRecord, Condition, ConditionStatus, ManualAction, Robot, Task, TaskReason, TaskState, TaskStatus,
};
use k8s_openapi::api::coordination::v1::Lease;
use kube::runtime::controller::Action;
use kube::runtime::events::EventType;
use kube::runtime::reflector::ObjectRef;
use kube::{Api, ResourceExt};
use serde::Serialize;
use tracing::instrument;

use super::robot::{liveness_of, robot_lease};
use super::{condition_at, key_of, Context, Look, Note};
use crate::error::{Error, Result};
use crate::lifecycle::{ended_as, never_sent, next_step, plus, LifecycleConfig, RobotHealth, Step};
use crate::manual::TaskManual;

/// How long a task that found no robot waits before looking again on its
/// own; robot changes wake it much sooner.
mod placement;
mod refresh;
mod requests;

use placement::{place, robot_for};
pub use placement::{place_new, plan_dispatch, unplace_new};
use requests::{apply_manual, manual_request, refuse_retry, retry_forbidden_by};
pub use requests::{plan_manual, plan_refused_retry, ManualPlan};

const UNSCHEDULABLE_RECHECK: Duration = Duration::from_secs(300);

/// The Task status fields the manager writes. `Some(None)` clears a field.
#[derive(Debug, Default, PartialEq, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct TaskStatusPatch {
    #[serde(skip_serializing_if = "Option::is_none")]
    state: Option<TaskState>,
    #[serde(skip_serializing_if = "Option::is_none")]
    attempt: Option<u32>,
    #[serde(skip_serializing_if = "Option::is_none")]
    seq: Option<u64>,
    #[serde(skip_serializing_if = "Option::is_none")]
    robot: Option<Option<String>>,
    #[serde(skip_serializing_if = "Option::is_none")]
    exit_code: Option<Option<i32>>,
    #[serde(skip_serializing_if = "Option::is_none")]
    signal: Option<Option<i32>>,
    #[serde(skip_serializing_if = "Option::is_none")]
    reason: Option<Option<TaskReason>>,
    #[serde(skip_serializing_if = "Option::is_none")]
    message: Option<Option<String>>,
    #[serde(skip_serializing_if = "Option::is_none")]
    dispatch_time: Option<Option<Timestamp>>,
    #[serde(skip_serializing_if = "Option::is_none")]
    dispatch_deadline: Option<Option<Timestamp>>,
    #[serde(skip_serializing_if = "Option::is_none")]
    observed_running_time: Option<Option<Timestamp>>,
    #[serde(skip_serializing_if = "Option::is_none")]
    start_time: Option<Option<Timestamp>>,
    #[serde(skip_serializing_if = "Option::is_none")]
    finish_time: Option<Option<Timestamp>>,
    #[serde(skip_serializing_if = "Option::is_none")]
    next_attempt_time: Option<Option<Timestamp>>,
    #[serde(skip_serializing_if = "Option::is_none")]
    output_tail: Option<Option<String>>,
    #[serde(skip_serializing_if = "Option::is_none")]
    restart_count: Option<Option<u32>>,
    #[serde(skip_serializing_if = "Option::is_none")]
    last_exit_code: Option<Option<i32>>,
    #[serde(skip_serializing_if = "Option::is_none")]
    last_restart_time: Option<Option<Timestamp>>,
    #[serde(skip_serializing_if = "Option::is_none")]
    attempts: Option<Vec<AttemptRecord>>,
    #[serde(skip_serializing_if = "Option::is_none")]
    retry: Option<ManualAction>,
    #[serde(skip_serializing_if = "Option::is_none")]
    cancellation: Option<ManualAction>,
    #[serde(skip_serializing_if = "Option::is_none")]
    eviction: Option<ManualAction>,
    #[serde(skip_serializing_if = "Option::is_none")]
    conditions: Option<Vec<Condition>>,
    #[serde(skip_serializing_if = "Option::is_none")]
    config: Option<Option<k8s4r_api::TaskConfigStatus>>,
}

impl TaskStatusPatch {
    /// A patch that clears what describes the current attempt (its robot,
    /// exit code, signal, reason, message, restarts and times), for a Task
    /// that goes back to wait for its next attempt: `kubectl get` then shows
    /// no robot, exit code or reason of an attempt that is over, which
    /// `attempts[]` keeps. `outputTail` stays, for `k8s4r logs`, until the
    /// next dispatch replaces it; `seq` is reset by that dispatch.
    fn attempt_over() -> Self {
        TaskStatusPatch {
            robot: Some(None),
            exit_code: Some(None),
            signal: Some(None),
            reason: Some(None),
            message: Some(None),
            dispatch_time: Some(None),
            dispatch_deadline: Some(None),
            observed_running_time: Some(None),
            start_time: Some(None),
            finish_time: Some(None),
            restart_count: Some(None),
            last_exit_code: Some(None),
            last_restart_time: Some(None),
            config: Some(None),
            ..TaskStatusPatch::default()
        }
    }
}

/// Reconciles one Task.
#[instrument(skip_all, fields(task = %key_of(task.as_ref())))]
pub async fn reconcile(task: Arc<Task>, ctx: Arc<Context>) -> Result<Action> {
    let ctx = ctx.as_ref();
    ctx.instrumented("task", task, Look::cached(&ctx.stores.tasks), |task| async move {
        reconcile_task(&task, ctx).await
    })
    .await
}

/// Backs off a Task whose reconcile failed.
pub fn error_policy(task: Arc<Task>, error: &Error, ctx: Arc<Context>) -> Action {
    ctx.error_policy("task", &key_of(task.as_ref()), error)
}

fn robot_health(ctx: &Context, robot: Option<&str>) -> RobotHealth {
    let Some(name) = robot else {
        return RobotHealth::Missing;
    };
    let lease = robot_lease(ctx, name);
    let robot = ctx.stores.robots.get(&ObjectRef::new(name));
    health_of(robot.as_deref(), lease.as_deref(), ctx)
}

/// [`robot_health`] from the API server rather than the caches.
async fn fresh_robot_health(ctx: &Context, robot: Option<&str>) -> Result<RobotHealth> {
    let Some(name) = robot else {
        return Ok(RobotHealth::Missing);
    };
    let robots: Api<Robot> = Api::all(ctx.client());
    let leases: Api<Lease> = Api::namespaced(ctx.client(), &ctx.config.robot_lease_namespace);
    let robot = ctx.api::<Robot, _>("read", name, robots.get_opt(name)).await?;
    let lease = ctx.api::<Lease, _>("read", name, leases.get_opt(name)).await?;
    Ok(health_of(robot.as_ref(), lease.as_ref(), ctx))
}

/// What a Robot and its Lease say of the robot's health.
fn health_of(robot: Option<&Robot>, lease: Option<&Lease>, ctx: &Context) -> RobotHealth {
    let Some(robot) = robot else {
        // A deleted Robot's agent may still run the attempt: while its Lease
        // tells when it was last heard, fence from that.
        return match lease.and_then(|l| l.spec.as_ref()?.renew_time.clone()) {
            Some(renewed) => RobotHealth::Known {
                last_heard: Some(renewed.0),
                record_lag: record_lag(lease, ctx),
            },
            None => RobotHealth::Missing,
        };
    };
    RobotHealth::Known {
        last_heard: liveness_of(robot, lease).last_seen(),
        record_lag: record_lag(lease, ctx),
    }
}

/// Whether a step fails the current attempt because its robot went quiet
/// (it then starts a replacement): decided only on fresh reads.
pub fn replaces_a_silent_robots_attempt(step: &Step) -> bool {
    matches!(
        step,
        Step::Fail {
            reason: TaskReason::RobotLost | TaskReason::DispatchTimeout,
            ..
        }
    )
}

/// How stale the record of a robot's last contact may be
/// ([`crate::lifecycle::record_lag`]).
fn record_lag(lease: Option<&Lease>, ctx: &Context) -> Duration {
    let duration = lease.and_then(|l| l.spec.as_ref()?.lease_duration_seconds);
    crate::lifecycle::record_lag(duration, &ctx.config.lifecycle)
}

fn publish_progress(ctx: &Context, task: &Task) {
    let Some(progressed) = ctx.progress(task) else {
        return;
    };
    let (attempt, state, seen_running) = (progressed.attempt, progressed.state, progressed.seen_running);
    let status = task.status.clone().unwrap_or_default();
    let robot = status.robot.clone().unwrap_or_default();
    // A restart for a configuration change is said by its ConfigChanged.
    if let Some(count) = progressed.restarted.filter(|_| !progressed.reconfigured) {
        // The robot's message says how often and why.
        let why = status
            .message
            .clone()
            .unwrap_or_else(|| format!("restarted on the robot ({count})"));
        ctx.event(
            task,
            EventType::Warning,
            "Restarted",
            format!("attempt {attempt} on robot {robot}: {why}"),
        );
    }
    if progressed.reconfigured {
        if let Some(config) = &status.config {
            let what = config.message.as_deref().unwrap_or("taken");
            // "not applied" / "not sent": the task runs on with what it had.
            let type_ = match what.starts_with("not ") {
                true => EventType::Warning,
                false => EventType::Normal,
            };
            ctx.event(
                task,
                type_,
                "ConfigChanged",
                format!(
                    "attempt {attempt} on robot {robot} runs with {}: {what}",
                    describe_sources(&config.sources)
                ),
            );
        }
    }
    if !progressed.moved {
        return;
    }
    // An attempt that ran is Started in `kubectl describe` even when it was
    // over before this controller looked.
    if state.is_terminal() && !seen_running && status.start_time.is_some() {
        ctx.event(
            task,
            EventType::Normal,
            "Started",
            format!("attempt {attempt} started on robot {robot}"),
        );
    }
    match state {
        TaskState::Running => ctx.event(
            task,
            EventType::Normal,
            "Started",
            format!("attempt {attempt} started on robot {robot}"),
        ),
        TaskState::Completed => ctx.event(
            task,
            EventType::Normal,
            "Completed",
            format!("attempt {attempt} completed on robot {robot}"),
        ),
        TaskState::Failed => {
            let policy = task.spec.restart_policy.as_ref();
            if let Some(note) = crate::lifecycle::exhausted(&status, policy, &ctx.config.lifecycle) {
                ctx.event(
                    task,
                    EventType::Warning,
                    "RetriesExhausted",
                    format!("attempt {attempt} on robot {robot}: {note}"),
                );
            }
            let (kind, reason) = match ended_as(&status) {
                Some(TaskReason::Timeout) => (EventType::Warning, "TimedOut"),
                Some(TaskReason::ConditionLost) => (EventType::Warning, "ConditionLost"),
                // The agent's restart or upgrade: the task goes on.
                Some(TaskReason::AgentShutdown) => (EventType::Normal, "AgentShutdown"),
                // The manager's own failures got their Event when decided,
                // and an attempt that returns gets its own when it does.
                Some(
                    TaskReason::RobotLost
                    | TaskReason::DispatchTimeout
                    | TaskReason::TimeoutBackstop
                    | TaskReason::NotReady
                    | TaskReason::ImageUnavailable
                    | TaskReason::Drained,
                ) => return,
                _ => (EventType::Warning, "Failed"),
            };
            let exit = status
                .exit_code
                .map(|c| format!(", exit code {c}"))
                .unwrap_or_default();
            let why = status.message.clone().unwrap_or_default();
            ctx.event(
                task,
                kind,
                reason,
                format!("attempt {attempt} failed on robot {robot}{exit}: {why}"),
            );
        }
        TaskState::Pending | TaskState::Dispatching | TaskState::Cancelled => {}
    }
}

/// The objects of a configuration, each with its resourceVersion, for a
/// person: `ConfigMap calibration (resourceVersion 1042), Secret keys
/// (resourceVersion 977)`.
fn describe_sources(sources: &[k8s4r_api::config_ref::ConfigSource]) -> String {
    if sources.is_empty() {
        return "no ConfigMap or Secret".to_owned();
    }
    sources
        .iter()
        .map(|s| format!("{} {} (resourceVersion {})", s.kind, s.name, s.resource_version))
        .collect::<Vec<_>>()
        .join(", ")
}

async fn reconcile_task(task: &Task, ctx: &Context) -> Result<Action> {
    if task.metadata.deletion_timestamp.is_some() {
        return Ok(Action::await_change());
    }
    publish_progress(ctx, task);
    let now = Timestamp::now();
    if let Some(manual) = manual_request(task, ctx, now) {
        if let TaskManual::Retry(action) = &manual {
            if let Some(run) = retry_forbidden_by(task, ctx).await? {
                return refuse_retry(task, ctx, action.clone(), &run).await;
            }
        }
        return apply_manual(task, ctx, manual, now).await;
    }
    let status = task.status.as_ref();
    let robot = status
        .and_then(|s| s.robot.as_deref())
        .or(task.spec.target_robot.as_deref());
    let health = robot_health(ctx, robot);
    let mut step = decide_step(task, health, now, &ctx.config.lifecycle);
    if replaces_a_silent_robots_attempt(&step) {
        // The caches may lag (a stalled or relisting Lease watch while the
        // server keeps renewing): a replacement is decided on the Lease and
        // the Robot as the API server has them now, never on a cache alone.
        let fresh = fresh_robot_health(ctx, robot).await?;
        if fresh != health {
            tracing::info!(uid = ?task.metadata.uid, cached = ?health, ?fresh, "the robot's record was stale in the cache; deciding on the API server's");
        }
        step = decide_step(task, fresh, now, &ctx.config.lifecycle);
        if !replaces_a_silent_robots_attempt(&step) {
            ctx.metrics.stale_robot_records.inc();
        }
    }
    if matches!(step, Step::Wait(_) | Step::Done) {
        // A running service whose ConfigMaps or Secrets changed.
        if let Some(turn) = refresh::refresh_config(task, ctx).await? {
            step = match step {
                Step::Wait(Some(after)) => Step::Wait(Some(after.min(turn))),
                _ => Step::Wait(Some(turn)),
            };
        }
    }
    tracing::debug!(?step, uid = ?task.metadata.uid, "next step");
    match step {
        Step::Wait(Some(after)) => Ok(Action::requeue(after)),
        Step::Wait(None) | Step::Done => Ok(Action::await_change()),
        Step::Schedule => schedule(task, ctx, now).await,
        Step::Fail { reason, message } => fail(task, ctx, reason, message, now).await,
        Step::Retry { delay } => retry(task, ctx, delay, now).await,
        Step::Return { reason, delay } => give_back(task, ctx, reason, delay, now).await,
    }
}

/// The next step for a Task (no manual request pending) whose robot's
/// health is `health`: an attempt no server began to send fails once its
/// deadline passed, whatever its robot; otherwise the lifecycle decides.
pub fn decide_step(task: &Task, health: RobotHealth, now: Timestamp, cfg: &LifecycleConfig) -> Step {
    let status = task.status.as_ref();
    let sent = k8s4r_api::task::sent_attempt(task.metadata.annotations.as_ref());
    never_sent(status, sent, now, cfg).unwrap_or_else(|| next_step(&task.spec, status, health, now, cfg))
}

fn names(task: &Task) -> Result<(String, String)> {
    let ns = task.namespace().ok_or_else(|| Error::Malformed {
        kind: "Task",
        name: task.name_any(),
        reason: "no namespace".into(),
    })?;
    Ok((ns, task.name_any()))
}

async fn schedule(task: &Task, ctx: &Context, now: Timestamp) -> Result<Action> {
    let (ns, name) = names(task)?;
    let api: Api<Task> = Api::namespaced(ctx.client(), &ns);
    let status = task.status.clone().unwrap_or_default();
    if let Err(errors) = validate_task_spec(&task.spec) {
        let patch = TaskStatusPatch {
            state: Some(TaskState::Failed),
            reason: Some(Some(TaskReason::InvalidSpec)),
            message: Some(Some(errors.to_string())),
            finish_time: Some(Some(now)),
            ..TaskStatusPatch::default()
        };
        ctx.patch_status(&api, &name, task.resource_version(), patch)
            .await?;
        ctx.event(task, EventType::Warning, "InvalidSpec", errors.to_string());
        return Ok(Action::await_change());
    }

    let key = key_of(task);
    let attempt = status.attempt + 1;
    let robot = match robot_for(task, ctx, &key, &status, attempt) {
        None => return Ok(Action::await_change()),
        Some(Ok(robot)) => robot,
        Some(Err(nofit)) => {
            ctx.metrics.unschedulable.inc();
            let message = nofit.to_string();
            let left = match pending_deadline(task, now) {
                Err(waited) => {
                    // It waits no more: tasks that gave way to it may go.
                    let lower = ctx.sched().stop_waiting(&ObjectRef::from_obj(task));
                    for lower in lower {
                        ctx.triggers.task(lower);
                    }
                    let message = format!("{waited}: {message}");
                    return fail(task, ctx, TaskReason::Unschedulable, message, now).await;
                }
                Ok(left) => left,
            };
            if let Some(patch) = plan_unschedulable(&status, nofit.reason(), &message, now) {
                ctx.patch_status(&api, &name, task.resource_version(), patch)
                    .await?;
                ctx.event(task, EventType::Warning, "FailedScheduling", message);
            }
            let recheck = left.map_or(UNSCHEDULABLE_RECHECK, |l| l.min(UNSCHEDULABLE_RECHECK));
            return Ok(Action::requeue(recheck.max(Duration::from_millis(100))));
        }
    };

    let placed = place(task, ctx, &api, &name, &status, attempt, &robot, now).await;
    if placed.is_err() {
        ctx.sched().ledger.unreserve(&key, attempt, &robot);
    }
    placed?;
    // The ledger changed here, not in the watch: tell the robot's
    // controller so its `status.allocated` follows.
    ctx.triggers.robot(&robot);

    ctx.metrics.decisions.inc();
    let since = status
        .next_attempt_time
        .or_else(|| task.metadata.creation_timestamp.as_ref().map(|t| t.0));
    if let Some(since) = since {
        if let Ok(latency) = Duration::try_from(now.duration_since(since)) {
            ctx.metrics.scheduled(latency);
        }
    }
    ctx.event(
        task,
        EventType::Normal,
        "Scheduled",
        format!("attempt {attempt} assigned to robot {robot}"),
    );
    Ok(Action::requeue(ctx.config.lifecycle.dispatch_timeout))
}

/// How long a Task no robot fits may still wait by its Job's
/// `pendingDeadlineSeconds` (None: no deadline), or, once past it, what
/// to say of its wait. It waits from the latest of its creation, when its
/// retry came due, and a person's last retry or eviction of it.
pub fn pending_deadline(task: &Task, now: Timestamp) -> Result<Option<Duration>, String> {
    let Some(seconds) = task.spec.pending_deadline_seconds else {
        return Ok(None);
    };
    let deadline = Duration::from_secs(u64::try_from(seconds).unwrap_or(0));
    let status = task.status.as_ref();
    let acted = |a: Option<&k8s4r_api::ManualAction>| a.filter(|a| !a.noop).map(|a| a.at);
    let since = [
        task.metadata.creation_timestamp.as_ref().map(|t| t.0),
        status.and_then(|s| s.next_attempt_time),
        status.and_then(|s| acted(s.retry.as_ref())),
        status.and_then(|s| acted(s.eviction.as_ref())),
    ]
    .into_iter()
    .flatten()
    .max();
    let Some(since) = since else {
        return Ok(Some(deadline));
    };
    let waited = Duration::try_from(now.duration_since(since)).unwrap_or_default();
    match deadline.checked_sub(waited).filter(|left| !left.is_zero()) {
        Some(left) => Ok(Some(left)),
        None => Err(format!(
            "waited {} for a robot, past its Job's pendingDeadlineSeconds ({seconds}s)",
            k8s4r_api::duration::format_duration(Duration::from_secs(waited.as_secs()))
        )),
    }
}

/// The status patch of a Task no robot fits (`reason` is `Unschedulable`,
/// `ConfigMissing` or `ConfigInvalid`, `message` says why), or `None` when
/// its status says so already.
pub fn plan_unschedulable(
    status: &TaskStatus,
    reason: TaskReason,
    message: &str,
    now: Timestamp,
) -> Option<TaskStatusPatch> {
    let previous = find_condition(&status.conditions, CONDITION_SCHEDULED);
    if status.state.is_some()
        && status.reason == Some(reason)
        && previous.and_then(|c| c.message.as_deref()) == Some(message)
    {
        return None;
    }
    let mut conditions = status.conditions.clone();
    set_condition(
        &mut conditions,
        condition_at(
            CONDITION_SCHEDULED,
            ConditionStatus::False,
            &format!("{reason:?}"),
            message,
            now,
        ),
    );
    Some(TaskStatusPatch {
        state: Some(TaskState::Pending),
        // The REASON column says the task waits, the message why.
        reason: Some(Some(reason)),
        message: Some(Some(message.to_owned())),
        conditions: Some(conditions),
        ..TaskStatusPatch::default()
    })
}

async fn fail(
    task: &Task,
    ctx: &Context,
    reason: TaskReason,
    message: String,
    now: Timestamp,
) -> Result<Action> {
    let (ns, name) = names(task)?;
    let api: Api<Task> = Api::namespaced(ctx.client(), &ns);
    let patch = plan_fail(reason, &message, now);
    ctx.patch_status(&api, &name, task.resource_version(), patch)
        .await?;
    let event = match reason {
        TaskReason::RobotLost => "RobotLost",
        TaskReason::TimeoutBackstop => "TimedOut",
        TaskReason::Unschedulable => "PendingDeadlineExceeded",
        _ => "DispatchTimeout",
    };
    tracing::info!(task = %name, ?reason, %message, "failing attempt");
    ctx.event(task, EventType::Warning, event, message);
    Ok(Action::await_change())
}

/// The status patch by which the manager fails the current attempt
/// ([`Step::Fail`]).
pub fn plan_fail(reason: TaskReason, message: &str, now: Timestamp) -> TaskStatusPatch {
    TaskStatusPatch {
        state: Some(TaskState::Failed),
        reason: Some(Some(reason)),
        message: Some(Some(message.to_owned())),
        finish_time: Some(Some(now)),
        ..TaskStatusPatch::default()
    }
}

/// The status patch that sends a Task whose current attempt failed back to
/// pending until `at`, the attempt kept in `attempts[]` (once) as ended
/// for `reason` and cleared from the rest of the status
/// ([`TaskStatusPatch::attempt_over`]); the caller says in `message` why
/// the task waits.
pub fn plan_pending_again(
    status: &TaskStatus,
    reason: Option<TaskReason>,
    at: Timestamp,
    now: Timestamp,
) -> TaskStatusPatch {
    let mut attempts = status.attempts.clone();
    if !attempts.iter().any(|a| a.attempt == status.attempt) {
        attempts.push(AttemptRecord::of_current(status, TaskState::Failed, reason, now));
    }
    TaskStatusPatch {
        state: Some(TaskState::Pending),
        next_attempt_time: Some(Some(at)),
        attempts: Some(attempts),
        ..TaskStatusPatch::attempt_over()
    }
}

/// What sending back a Task whose attempt ended without failing (`reason`:
/// `NotReady` or `Drained`) writes and says: pending again after `delay`,
/// the attempt recorded as ended for `reason`, and a Warning Event named
/// after it.
pub fn plan_return(
    status: &TaskStatus,
    reason: TaskReason,
    delay: Duration,
    now: Timestamp,
) -> (TaskStatusPatch, Note) {
    let robot = status.robot.as_deref().unwrap_or("?");
    // The robot's own words, when it said why (an older agent answers a
    // drain with Cancelled, which would only mislead).
    let said = status.message.as_deref().filter(|m| !m.is_empty());
    let why = match (reason, said) {
        (_, Some(said)) if status.reason == Some(reason) => said.to_owned(),
        (TaskReason::NotReady, _) => "its facts did not meet a start condition".to_owned(),
        _ => "the robot was drained".to_owned(),
    };
    let message = format!(
        "attempt {} on robot {robot}: {why}; the task waits for a robot again (no retry used)",
        status.attempt
    );
    // The reason is the ended attempt's, kept in `attempts[]`; the
    // message says why the task waits.
    let patch = TaskStatusPatch {
        message: Some(Some(message.clone())),
        ..plan_pending_again(status, Some(reason), plus(now, delay), now)
    };
    let event = match reason {
        TaskReason::NotReady => Note::warning("NotReady", message),
        TaskReason::ImageUnavailable => Note::warning("ImageUnavailable", message),
        _ => Note::warning("Drained", message),
    };
    (patch, event)
}

/// Sends a Task whose attempt ended without failing back to pending (see
/// [`plan_return`]).
async fn give_back(
    task: &Task,
    ctx: &Context,
    reason: TaskReason,
    delay: Duration,
    now: Timestamp,
) -> Result<Action> {
    let (ns, name) = names(task)?;
    let api: Api<Task> = Api::namespaced(ctx.client(), &ns);
    let status = task.status.clone().unwrap_or_default();
    let (patch, event) = plan_return(&status, reason, delay, now);
    ctx.patch_status(&api, &name, task.resource_version(), patch)
        .await?;
    ctx.publish(task, event);
    Ok(Action::requeue(delay))
}

/// What retrying a Task whose current attempt failed writes and says:
/// pending again after `delay`, the attempt recorded, and a message (also
/// the Event's) that says how it ended and when the next one comes, with
/// the robot's own words, which `attempts[]` does not keep.
pub fn plan_retry(status: &TaskStatus, delay: Duration, now: Timestamp) -> (TaskStatusPatch, Note) {
    let robot = status
        .robot
        .as_deref()
        .map(|r| format!(" on robot {r}"))
        .unwrap_or_default();
    let why = status
        .reason
        .map(|r| format!("{r:?}"))
        .unwrap_or_else(|| "failed".into());
    let exit = status
        .exit_code
        .map(|c| format!(", exit code {c}"))
        .unwrap_or_default();
    let said = status
        .message
        .as_deref()
        .filter(|m| !m.is_empty())
        .map(|m| format!(": {m}"))
        .unwrap_or_default();
    let message = format!(
        "attempt {}{robot} ended ({why}{exit}){said}; attempt {} in {}s",
        status.attempt,
        status.attempt + 1,
        delay.as_secs()
    );
    let patch = TaskStatusPatch {
        message: Some(Some(message.clone())),
        reason: Some(Some(TaskReason::BackOff)),
        ..plan_pending_again(status, status.reason, plus(now, delay), now)
    };
    (patch, Note::normal("Retrying", message))
}

async fn retry(task: &Task, ctx: &Context, delay: Duration, now: Timestamp) -> Result<Action> {
    let (ns, name) = names(task)?;
    let api: Api<Task> = Api::namespaced(ctx.client(), &ns);
    let status = task.status.clone().unwrap_or_default();
    let (patch, event) = plan_retry(&status, delay, now);
    ctx.patch_status(&api, &name, task.resource_version(), patch)
        .await?;
    ctx.publish(task, event);
    Ok(Action::requeue(delay))
}

#[cfg(test)]
mod tests;
