//! A person's requests on a Task: what a retry, cancel or evict annotation
//! asks now, the plan that carries it out, and a retry refused because a
//! `Forbid` PeriodicJob's other run is active.

use jiff::Timestamp;
use k8s4r_api::names::{ANNOTATION_CANCEL, ANNOTATION_EVICT, ANNOTATION_RETRY, LABEL_JOB};
use k8s4r_api::{AttemptRecord, ManualAction, Task, TaskReason, TaskState, TaskStatus};
use kube::runtime::controller::Action;
use kube::runtime::reflector::ObjectRef;
use kube::{Api, ResourceExt};

use super::{names, plan_pending_again, Context, Note, TaskStatusPatch};
use crate::error::Result;
use crate::lifecycle::retry_delay;
use crate::manual::{self, retry_base, TaskManual};

/// What a person's retry, cancel or evict annotation asks of the Task now,
/// if anything.
pub(super) fn manual_request(task: &Task, ctx: &Context, now: Timestamp) -> Option<TaskManual> {
    let default = TaskStatus::default();
    let status = task.status.as_ref().unwrap_or(&default);
    let finished = match status.state {
        Some(TaskState::Completed | TaskState::Cancelled) => true,
        Some(TaskState::Failed) => {
            retry_delay(status, task.spec.restart_policy.as_ref(), &ctx.config.lifecycle).is_none()
        }
        _ => false,
    };
    // Sent, or about to be: the server records that before it publishes,
    // under the same resourceVersion guard as this controller's writes.
    let dispatched = k8s4r_api::task::sent_attempt(task.metadata.annotations.as_ref()) >= status.attempt;
    manual::decide_task(
        status,
        manual::request(&task.metadata, ANNOTATION_CANCEL),
        manual::request(&task.metadata, ANNOTATION_RETRY),
        finished,
        dispatched,
        now,
    )
    .or_else(|| {
        let evict = manual::request(&task.metadata, ANNOTATION_EVICT);
        manual::decide_eviction(status, evict, dispatched, now)
    })
}

/// The active run that forbids a retry of `task` now: its Job is a run of
/// a PeriodicJob whose `concurrencyPolicy` is Forbid, and another run of
/// it is active (the retried attempt would run beside it).
pub(super) async fn retry_forbidden_by(task: &Task, ctx: &Context) -> Result<Option<String>> {
    let Some(job) = task.labels().get(LABEL_JOB) else {
        return Ok(None);
    };
    let ns = task.namespace().unwrap_or_default();
    super::super::periodic::forbidding_run(ctx, &ns, job).await
}

/// Records a refused retry (so that its value acts once) and says why in
/// a Warning Event; the Task stays as it is.
pub(super) async fn refuse_retry(
    task: &Task,
    ctx: &Context,
    action: ManualAction,
    run: &str,
) -> Result<Action> {
    let (ns, name) = names(task)?;
    let api: Api<Task> = Api::namespaced(ctx.client(), &ns);
    let base = task.status.as_ref().map_or(0, retry_base);
    let plan = plan_refused_retry(action, run, base);
    ctx.patch_status(&api, &name, task.resource_version(), plan.patch)
        .await?;
    ctx.publish(task, plan.event);
    Ok(Action::await_change())
}

/// A retry refused because run `run` of the Task's PeriodicJob is active
/// and the PeriodicJob forbids overlapping runs. It records the retry
/// budget's base (`base`, see [`retry_base`]) as it was.
pub fn plan_refused_retry(action: ManualAction, run: &str, base: u32) -> ManualPlan {
    let message = format!(
        "retry refused: the PeriodicJob forbids overlapping runs (concurrencyPolicy: Forbid) and its run {run} is active; retry once it has ended"
    );
    ManualPlan {
        patch: TaskStatusPatch {
            retry: Some(ManualAction {
                noop: true,
                attempt: base,
                message: Some(message.clone()),
                ..action
            }),
            ..TaskStatusPatch::default()
        },
        event: Note::warning("RetryRefused", message),
    }
}

/// Carries out a person's retry or cancel, and says so in an Event.
pub(super) async fn apply_manual(
    task: &Task,
    ctx: &Context,
    manual: TaskManual,
    now: Timestamp,
) -> Result<Action> {
    let (ns, name) = names(task)?;
    let api: Api<Task> = Api::namespaced(ctx.client(), &ns);
    let status = task.status.clone().unwrap_or_default();
    if matches!(manual, TaskManual::CancelNow(_)) {
        // A task cancelled while it waits for a robot waits no more.
        let mut sched = ctx.sched();
        for lower in sched.stop_waiting(&ObjectRef::from_obj(task)) {
            ctx.triggers.task(lower);
        }
    }
    let plan = plan_manual(&status, manual, now);
    ctx.patch_status(&api, &name, task.resource_version(), plan.patch)
        .await?;
    ctx.publish(task, plan.event);
    Ok(Action::await_change())
}

/// What carrying out a person's retry or cancel writes and says.
#[derive(Debug, PartialEq)]
pub struct ManualPlan {
    /// The Task's status patch.
    pub patch: TaskStatusPatch,
    /// The Event that says so.
    pub event: Note,
}

/// Plans carrying out `manual` on a Task whose status is `status`.
pub fn plan_manual(status: &TaskStatus, manual: TaskManual, now: Timestamp) -> ManualPlan {
    let note = |a: &ManualAction| a.message.clone().unwrap_or_default();
    match manual {
        TaskManual::CancelNow(action) => {
            let message = note(&action);
            ManualPlan {
                patch: TaskStatusPatch {
                    state: Some(TaskState::Cancelled),
                    reason: Some(Some(TaskReason::Cancelled)),
                    message: Some(Some(message.clone())),
                    finish_time: Some(Some(now)),
                    next_attempt_time: Some(None),
                    cancellation: Some(action),
                    ..TaskStatusPatch::default()
                },
                event: Note::normal("Cancelled", message),
            }
        }
        TaskManual::CancelRunning(action) => {
            let message = note(&action);
            ManualPlan {
                patch: TaskStatusPatch {
                    cancellation: Some(action),
                    ..TaskStatusPatch::default()
                },
                event: Note::normal("Cancelling", message),
            }
        }
        TaskManual::Cancelled => plan_cancelled(status, now),
        TaskManual::Record { cancel, action } => {
            let message = note(&action);
            let (patch, reason) = if cancel {
                let patch = TaskStatusPatch {
                    cancellation: Some(action),
                    ..TaskStatusPatch::default()
                };
                (patch, "NothingToCancel")
            } else {
                let patch = TaskStatusPatch {
                    retry: Some(action),
                    ..TaskStatusPatch::default()
                };
                (patch, "NothingToRetry")
            };
            ManualPlan {
                patch,
                event: Note::normal(reason, message),
            }
        }
        TaskManual::Retry(action) => plan_manual_retry(status, action, now),
        TaskManual::Evict(action) => plan_recorded_eviction(action, "Evicted"),
        TaskManual::EvictNow(action) => plan_eviction_now(status, action, now),
        TaskManual::NothingToEvict(action) => plan_recorded_eviction(action, "NothingToEvict"),
    }
}

/// An eviction recorded in `status.eviction` and said in an Event named
/// `reason`: for an attempt that may be on its robot, the server now asks
/// the robot to stop it (a cancel that drains); otherwise it records that
/// there was nothing to evict.
fn plan_recorded_eviction(action: ManualAction, reason: &'static str) -> ManualPlan {
    let message = action.message.clone().unwrap_or_default();
    ManualPlan {
        patch: TaskStatusPatch {
            eviction: Some(action),
            ..TaskStatusPatch::default()
        },
        event: Note::normal(reason, message),
    }
}

/// An eviction of an attempt never sent to its robot: the task is pending
/// again at once, the attempt kept as `Drained` (no retry used).
fn plan_eviction_now(status: &TaskStatus, action: ManualAction, now: Timestamp) -> ManualPlan {
    let message = action.message.clone().unwrap_or_default();
    let patch = TaskStatusPatch {
        message: Some(Some(message.clone())),
        eviction: Some(action),
        next_attempt_time: Some(None),
        ..plan_pending_again(status, Some(TaskReason::Drained), now, now)
    };
    ManualPlan {
        patch,
        event: Note::normal("Evicted", message),
    }
}

/// The cancelled attempt ended on its robot: the Task is cancelled.
fn plan_cancelled(status: &TaskStatus, now: Timestamp) -> ManualPlan {
    let by = status.cancellation.as_ref().and_then(|c| c.by.clone());
    let robot = status.robot.clone().unwrap_or_default();
    let message = match by {
        Some(by) => format!(
            "cancelled by {by}: attempt {} stopped on robot {robot}",
            status.attempt
        ),
        None => format!("cancelled: attempt {} stopped on robot {robot}", status.attempt),
    };
    ManualPlan {
        patch: TaskStatusPatch {
            state: Some(TaskState::Cancelled),
            reason: Some(Some(TaskReason::Cancelled)),
            message: Some(Some(message.clone())),
            finish_time: Some(status.finish_time.or(Some(now))),
            ..TaskStatusPatch::default()
        },
        event: Note::normal("Cancelled", message),
    }
}

/// A person's retry: back to pending now, the ended attempt recorded and
/// cleared from the rest of the status (as [`plan_pending_again`] does).
fn plan_manual_retry(status: &TaskStatus, action: ManualAction, now: Timestamp) -> ManualPlan {
    let mut attempts = status.attempts.clone();
    if status.attempt > 0 && !attempts.iter().any(|a| a.attempt == status.attempt) {
        attempts.push(AttemptRecord::of_current(
            status,
            status.state.unwrap_or(TaskState::Failed),
            status.reason,
            now,
        ));
    }
    let message = action.message.clone().unwrap_or_default();
    ManualPlan {
        patch: TaskStatusPatch {
            state: Some(TaskState::Pending),
            next_attempt_time: Some(None),
            message: Some(Some(message.clone())),
            attempts: Some(attempts),
            retry: Some(action),
            ..TaskStatusPatch::attempt_over()
        },
        event: Note::normal("Retried", message),
    }
}
