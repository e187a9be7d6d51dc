//! What a robot's list of the attempts it holds means: which to cancel,
//! which to look up, and which Tasks it shows were lost (docs/fencing.md,
//! "reconcile").

use jiff::Timestamp;
use k8s4r_api::{Task, TaskAttempt, TaskReason, TaskState, TaskStatus};

use super::{Stop, TaskStatusPatch};

/// How long after a dispatch's deadline a robot's list without the attempt
/// proves the attempt will never start (the list left the robot after the
/// deadline, by the robot's reckoning of the server's clock).
pub const DISPATCH_GRACE: std::time::Duration = std::time::Duration::from_secs(10);

/// What a robot said it holds, in a register or heartbeat.
#[derive(Debug, Clone, Copy)]
pub struct Holding<'a> {
    /// The attempts it runs, holds, or has not had its end confirmed.
    pub held: &'a [TaskAttempt],
    /// The list is complete (`reconcile: true`): absences mean something.
    pub complete: bool,
    /// The highest status seq the robot had assigned when it built the list.
    pub last_seq: Option<u64>,
    /// The server's time as the robot reckoned it when it built the list.
    pub sent_at: Option<Timestamp>,
}

/// What the server does after comparing what a robot says it holds with
/// what the Tasks want of it.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct ReconcilePlan {
    /// Attempts the robot holds that no Task wants any more: cancel them.
    pub cancel: Vec<(TaskAttempt, Stop)>,
    /// Attempts of Tasks this server's cache does not know: gone, or not
    /// in its cache yet (a lagging replica, a watch out of sync). Nothing
    /// may be concluded from the cache: the bridge reads each Task from
    /// the API server (by the name the robot gives), within the robot's
    /// budget and only while its watch is in sync, before it cancels
    /// ([`crate::held`]).
    pub unknown: Vec<TaskAttempt>,
    /// Tasks that show an attempt on the robot that the robot's complete
    /// list lacks: fail them at once, by this patch.
    pub lost: Vec<(String, TaskStatusPatch)>,
}

impl ReconcilePlan {
    /// Whether there is nothing to do.
    pub fn is_empty(&self) -> bool {
        self.cancel.is_empty() && self.unknown.is_empty() && self.lost.is_empty()
    }
}

/// Why the robot should not hold `held`, if it should not, as the cancel
/// will say it. An attempt newer than the Task shows is left alone: this
/// server's cache is behind.
pub fn unwanted(held: &TaskAttempt, robot: &str, task: &Task) -> Option<Stop> {
    if task.metadata.deletion_timestamp.is_some() {
        return Some(Stop::cancel("the Task is being deleted"));
    }
    let status = task.status.clone().unwrap_or_default();
    if held.attempt > status.attempt {
        return None;
    }
    if held.attempt < status.attempt {
        return Some(Stop::cancel(format!(
            "the Task is at attempt {}, not {}",
            status.attempt, held.attempt
        )));
    }
    if task.spec.target_robot.as_deref() != Some(robot) {
        return Some(Stop::cancel(format!(
            "the Task is assigned to {}",
            task.spec.target_robot.as_deref().unwrap_or("no robot")
        )));
    }
    let active = matches!(status.state, Some(TaskState::Dispatching | TaskState::Running));
    if status.cancel_requested() && active {
        return Some(Stop::cancel("the Task was cancelled"));
    }
    if status.eviction_requested() && active {
        return Some(Stop::eviction(&status));
    }
    match status.state {
        // Over: the robot lists it until its final status is confirmed.
        Some(TaskState::Dispatching | TaskState::Running | TaskState::Failed) => None,
        // Completed: a robot whose attempt ended ignores the cancel; one
        // still running it runs a replacement the original attempt's late
        // completion overtook (reconcile: keepOriginal), which must stop.
        // (Found by the deterministic simulation, seed 71: nothing stopped
        // it.)
        Some(TaskState::Completed) => Some(Stop::cancel(format!(
            "the Task is completed already; attempt {} is not wanted",
            held.attempt
        ))),
        Some(state) => Some(Stop::cancel(format!(
            "attempt {} is {} already",
            held.attempt,
            state.as_str()
        ))),
        None => Some(Stop::cancel("the Task has no attempt")),
    }
}

/// Compares what `robot` holds with what the Tasks want. `lookup` finds a
/// Task by uid; `assigned` are the Tasks targeting the robot. Only a
/// complete list fails Tasks, and only for what it can speak for: a running
/// attempt whose latest status the list postdates (`last_seq`), a dispatch
/// whose deadline had passed when the list was built (`sent_at`).
pub fn plan_reconcile<'a>(
    robot: &str,
    holding: Holding<'_>,
    lookup: impl Fn(&str) -> Option<std::sync::Arc<Task>>,
    assigned: impl IntoIterator<Item = &'a Task>,
    now: Timestamp,
) -> ReconcilePlan {
    let mut plan = ReconcilePlan::default();
    for attempt in holding.held {
        match lookup(&attempt.uid) {
            None => plan.unknown.push(attempt.clone()),
            Some(task) => {
                if let Some(why) = unwanted(attempt, robot, &task) {
                    plan.cancel.push((attempt.clone(), why));
                }
            }
        }
    }
    if !holding.complete {
        return plan;
    }
    for task in assigned {
        let Some(uid) = task.metadata.uid.as_deref() else {
            continue;
        };
        let status = task.status.clone().unwrap_or_default();
        let here =
            task.spec.target_robot.as_deref() == Some(robot) && task.metadata.deletion_timestamp.is_none();
        // Holding this attempt, or a newer one this server has not seen yet.
        if !here
            || holding
                .held
                .iter()
                .any(|h| h.uid == uid && h.attempt >= status.attempt)
        {
            continue;
        }
        let Some((reason, message)) = missing_from(robot, &holding, &status) else {
            continue;
        };
        plan.lost.push((
            uid.to_owned(),
            TaskStatusPatch {
                state: TaskState::Failed,
                seq: status.seq,
                exit_code: None,
                signal: None,
                reason: Some(reason),
                message: Some(message),
                start_time: None,
                finish_time: Some(now),
                output_tail: None,
                observed_running_time: None,
                restarts: None,
                config: None,
            },
        ));
    }
    plan
}

/// Why a complete list from `robot` without the current attempt of a Task
/// in `status` means the attempt is lost, if it does.
fn missing_from(robot: &str, holding: &Holding<'_>, status: &TaskStatus) -> Option<(TaskReason, String)> {
    match status.state {
        // The list was built after the robot reported this status: it would
        // hold the attempt if it still had it.
        Some(TaskState::Running) if holding.last_seq.is_some_and(|s| s >= status.seq) => Some((
            TaskReason::NotOnRobot,
            format!(
                "robot {robot} reported in without attempt {} (the agent lost it, e.g. across a restart)",
                status.attempt
            ),
        )),
        // The robot refuses a dispatch after its deadline; a list built well
        // after it without the attempt means it never starts.
        Some(TaskState::Dispatching)
            if status
                .dispatch_deadline
                .and_then(|d| d.checked_add(DISPATCH_GRACE).ok())
                .zip(holding.sent_at)
                .is_some_and(|(late, sent)| sent >= late) =>
        {
            Some((
                TaskReason::DispatchTimeout,
                format!(
                    "robot {robot} did not take attempt {} before its dispatch deadline",
                    status.attempt
                ),
            ))
        }
        _ => None,
    }
}
