//! What to write for a message, given what the cluster shows: pure functions,
//! no I/O, so every rule of the protocol bridge is unit-tested here.
//!
//! The I/O layers ([`crate::bridge`] for robot messages, [`crate::dispatch`]
//! for dispatches and cancels) read the current
//! object, call one of these, and carry out the plan with a patch guarded by
//! the object's `resourceVersion`; on a 409 they re-read and ask again.

use std::collections::BTreeMap;
use std::time::Duration;

use jiff::Timestamp;
use k8s4r_api::condition::{find_condition, set_condition};
use k8s4r_api::names::CONDITION_ACCEPTING_TASKS;
use k8s4r_api::protocol::{Register, StatusUpdate};
use k8s4r_api::robot::{AgentHealth, TaskPolicy};
use k8s4r_api::validation::{validate_label_key, validate_label_value};
use k8s4r_api::{
    Condition, ConditionStatus, DeviceInfo, DisconnectPolicy, Quantity, Reconcile, RestartStatus, Robot,
    RobotPhase, RobotResources, Task, TaskReason, TaskState, TaskStatus, Usage,
};
use serde::Serialize;

/// The Robot condition the server owns.
pub use k8s4r_api::names::CONDITION_CONNECTED;
pub use k8s4r_api::names::{ANNOTATION_DISPATCHED_ATTEMPT, ANNOTATION_TOKEN_SHA256};

/// Why a message from a robot was refused. Each is logged and counted; none
/// leads to a write.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum Rejection {
    /// The robot has never registered.
    #[error("robot {robot:?} is not registered")]
    UnknownRobot {
        /// The robot id.
        robot: String,
    },
    /// No Task has this uid.
    #[error("no task with uid {uid:?}")]
    UnknownTask {
        /// The uid from the topic.
        uid: String,
    },
    /// The Task is assigned to another robot (or to none).
    #[error("task {task} is assigned to {assigned:?}, not to robot {robot:?}")]
    NotAssigned {
        /// namespace/name.
        task: String,
        /// The robot that sent the update.
        robot: String,
        /// `spec.targetRobot`.
        assigned: Option<String>,
    },
    /// The Task was never dispatched for this attempt.
    #[error("task {task} is at attempt {current}, the robot reported attempt {reported}")]
    FutureAttempt {
        /// namespace/name.
        task: String,
        /// `status.attempt`.
        current: u32,
        /// The update's attempt.
        reported: u32,
    },
    /// Robots report running, completed or failed only.
    #[error("robots may not report state {state}")]
    InvalidState {
        /// The reported state.
        state: &'static str,
    },
    /// The uid in the body differs from the topic's.
    #[error("task uid {body:?} in the body does not match {topic:?} in the topic")]
    TaskMismatch {
        /// The uid in the body.
        body: String,
        /// The uid in the topic.
        topic: String,
    },
    /// A label the robot reported is not a valid Kubernetes label.
    #[error("label {key:?}={value:?}: {reason}")]
    InvalidLabel {
        /// The key.
        key: String,
        /// The value.
        value: String,
        /// What is wrong.
        reason: String,
    },
}

impl Rejection {
    /// The `outcome` label of the message counter.
    pub fn outcome(&self) -> &'static str {
        match self {
            Rejection::UnknownRobot { .. } => "rejected_unknown_robot",
            Rejection::UnknownTask { .. } => "rejected_unknown_task",
            Rejection::NotAssigned { .. } => "rejected_not_assigned",
            Rejection::FutureAttempt { .. } => "rejected_future_attempt",
            Rejection::InvalidState { .. } => "rejected_invalid_state",
            Rejection::TaskMismatch { .. } => "rejected_task_mismatch",
            Rejection::InvalidLabel { .. } => "rejected_invalid_label",
        }
    }
}

// ---------------------------------------------------------------- register

/// A merge patch of `metadata` on a Robot.
#[derive(Debug, Clone, Default, PartialEq, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct MetadataPatch {
    /// Labels to set (Some) or remove (None).
    #[serde(skip_serializing_if = "BTreeMap::is_empty")]
    pub labels: BTreeMap<String, Option<String>>,
    /// Annotations to set.
    #[serde(skip_serializing_if = "BTreeMap::is_empty")]
    pub annotations: BTreeMap<String, Option<String>>,
}

impl MetadataPatch {
    /// Whether the patch changes nothing.
    pub fn is_empty(&self) -> bool {
        self.labels.is_empty() && self.annotations.is_empty()
    }
}

/// The server's part of a Robot's status, as a merge patch.
#[derive(Debug, Clone, Default, PartialEq, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct RobotStatusPatch {
    /// Set only when the server creates the Robot: Pending.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub phase: Option<RobotPhase>,
    /// Device info.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub device: Option<DeviceInfo>,
    /// Drivers.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub drivers: Option<Vec<String>>,
    /// Agent version.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub agent_version: Option<String>,
    /// Reported labels: set (Some) or removed (None).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub reported_labels: Option<BTreeMap<String, Option<String>>>,
    /// Capacity derived from the device.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub capacity: Option<RobotResources>,
    /// When it registered.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub last_registration_time: Option<Timestamp>,
    /// When a heartbeat was last recorded.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub last_heartbeat_time: Option<Timestamp>,
    /// How often one is recorded at most, as of this write.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub heartbeat_refresh: Option<String>,
    /// Usage from the last recorded heartbeat.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub usage: Option<Usage>,
    /// The whole conditions list (a merge patch replaces lists), only when
    /// `Connected` or `AcceptingTasks` changes; written under a
    /// resourceVersion precondition.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub conditions: Option<Vec<Condition>>,
    /// The robot's own task policy, as registered.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub task_policy: Option<TaskPolicy>,
}

/// What to do for a `register`.
#[derive(Debug, Clone, PartialEq)]
pub struct RegisterPlan {
    /// The Robot does not exist: create it first (with these labels and
    /// annotations), then patch the status.
    pub create: bool,
    /// Labels and the token annotation.
    pub metadata: MetadataPatch,
    /// The status patch (always non-empty: lastRegistrationTime changes).
    pub status: RobotStatusPatch,
    /// Whether to write `status`: not for a known Online robot registering
    /// again with nothing new to say (a registration sent again while the
    /// first waited for its answer, a reconnect storm, an agent restart),
    /// however long since its last registration; `lastRegistrationTime` is
    /// then the last registration that changed something.
    pub write_status: bool,
    /// Answer on `response` at once with this phase (Online or Rejected);
    /// otherwise wait for the manager's decision.
    pub respond: Option<RobotPhase>,
}

/// Hex SHA-256 of a bootstrap token; the token itself is never stored.
pub fn token_sha256(token: &str) -> String {
    use sha2::Digest;
    let digest = sha2::Sha256::digest(token.as_bytes());
    digest.iter().map(|b| format!("{b:02x}")).collect()
}

/// Whether what was written `at` is `every` old or older at `now` (never
/// written: stale). A time ahead of ours (another replica's clock) is
/// fresh.
fn stale(at: Option<Timestamp>, every: Duration, now: Timestamp) -> bool {
    at.is_none_or(|at| {
        jiff::SignedDuration::try_from(every).is_ok_and(|every| now.duration_since(at) >= every)
    })
}

/// Plans the writes for a `register` of a robot whose Robot object is
/// `existing` (None: unknown so far).
///
/// Labels: a key the robot reports is applied to `metadata.labels` unless a
/// person owns it, i.e. unless the label exists with a value that differs
/// from what the robot reported last time (a person set or changed it), or
/// the robot reported it before and it is gone (a person removed it: the
/// robot does not put it back, whatever it reports now). A key the robot
/// stops reporting is removed only if it still holds the value the robot
/// reported. Keys the robot never reported are never touched.
pub fn plan_register(
    msg: &Register,
    existing: Option<&Robot>,
    now: Timestamp,
) -> Result<RegisterPlan, Rejection> {
    for (key, value) in &msg.labels {
        let invalid = |reason: String| Rejection::InvalidLabel {
            key: key.clone(),
            value: value.clone(),
            reason,
        };
        validate_label_key(key).map_err(invalid)?;
        validate_label_value(value).map_err(invalid)?;
    }
    let (mut metadata, reported) = label_changes(msg, existing);
    if let Some(token) = &msg.token {
        let hash = token_sha256(token);
        let current = existing
            .and_then(|r| r.metadata.annotations.as_ref())
            .and_then(|a| a.get(ANNOTATION_TOKEN_SHA256));
        if current != Some(&hash) {
            metadata
                .annotations
                .insert(ANNOTATION_TOKEN_SHA256.to_owned(), Some(hash));
        }
    }
    let phase = existing.and_then(|r| r.status.as_ref()).and_then(|s| s.phase);
    let (status, changed) = registered_status(msg, existing, reported, now);
    let same = existing.and_then(|r| r.status.as_ref()).is_some_and(|old| {
        old.device == status.device
            && old.drivers == msg.drivers
            && old.agent_version == status.agent_version
            && old.capacity == status.capacity
            && old.task_policy == status.task_policy
    });
    // A known Online robot that says nothing new costs no write, however
    // long since it last registered: its Lease says it is alive, and
    // nothing fences on `lastRegistrationTime` (the agent's lease on its
    // attempts runs from heartbeats the Lease records, never from a
    // registration). So a reconnect storm of an unchanged fleet writes only
    // what the disconnection itself changed (`Connected`). A Pending robot
    // that says nothing new is not written either: it waits for the
    // manager's decision, which a write would only queue behind one more
    // (in a storm of 100,000 every unanswered robot registers again every
    // 5 to 60 s, and each of those writes delayed the approvals); the
    // manager looks again at a robot waiting for its bootstrap Secret by
    // itself. Offline and Rejected are written: an Offline robot back after
    // its heartbeat timeout sends no heartbeat until its registration is
    // answered, so the fresh `lastRegistrationTime` is what makes it Online
    // again, and a Rejected one gets the manager's look again.
    let write_status = !(same
        && matches!(phase, Some(RobotPhase::Online | RobotPhase::Pending))
        && metadata.is_empty()
        && status.reported_labels.is_none()
        && !changed);
    Ok(RegisterPlan {
        create: existing.is_none(),
        metadata,
        status,
        write_status,
        respond: phase.filter(|p| matches!(p, RobotPhase::Online | RobotPhase::Rejected)),
    })
}

/// The label writes a registration asks for (see [`plan_register`] for
/// who owns a label), and the change to `status.reportedLabels` (a removed
/// key as None).
fn label_changes(
    msg: &Register,
    existing: Option<&Robot>,
) -> (MetadataPatch, BTreeMap<String, Option<String>>) {
    let empty = BTreeMap::new();
    let labels = existing
        .and_then(|r| r.metadata.labels.as_ref())
        .unwrap_or(&empty);
    let before = existing
        .and_then(|r| r.status.as_ref())
        .map_or(&empty, |s| &s.reported_labels);
    let mut metadata = MetadataPatch::default();
    for (key, value) in &msg.labels {
        let robot_owned = match labels.get(key) {
            None => !before.contains_key(key),
            Some(current) => before.get(key) == Some(current),
        };
        if robot_owned && labels.get(key) != Some(value) {
            metadata.labels.insert(key.clone(), Some(value.clone()));
        }
    }
    for (key, old) in before {
        if !msg.labels.contains_key(key) && labels.get(key) == Some(old) {
            metadata.labels.insert(key.clone(), None);
        }
    }
    let mut reported: BTreeMap<String, Option<String>> = msg
        .labels
        .iter()
        .filter(|(k, v)| before.get(*k) != Some(*v))
        .map(|(k, v)| (k.clone(), Some(v.clone())))
        .collect();
    for key in before.keys() {
        if !msg.labels.contains_key(key) {
            reported.insert(key.clone(), None);
        }
    }
    (metadata, reported)
}

/// The status a registration writes, and whether it changed the
/// conditions (`Connected`, `AcceptingTasks`).
fn registered_status(
    msg: &Register,
    existing: Option<&Robot>,
    reported: BTreeMap<String, Option<String>>,
    now: Timestamp,
) -> (RobotStatusPatch, bool) {
    let status = existing.and_then(|r| r.status.as_ref());
    let mut conditions = status.map(|s| s.conditions.clone()).unwrap_or_default();
    let mut changed = false;
    if let Some(list) = connected(&conditions, true, now) {
        conditions = list;
        changed = true;
    }
    if let Some(list) = accepting(&conditions, msg.health.as_ref(), now) {
        conditions = list;
        changed = true;
    }
    let patch = RobotStatusPatch {
        phase: status
            .and_then(|s| s.phase)
            .is_none()
            .then_some(RobotPhase::Pending),
        device: Some(msg.device.clone()),
        drivers: Some(msg.drivers.clone()),
        agent_version: Some(msg.agent_version.clone()),
        reported_labels: (!reported.is_empty()).then_some(reported),
        capacity: Some(RobotResources {
            cpu: Some(Quantity::from_millicores(u64::from(msg.device.cpus) * 1000)),
            memory: Some(Quantity::from_bytes(msg.device.memory_bytes)),
            tasks: msg.task_policy.as_ref().map_or(0, |p| p.max_tasks),
        }),
        last_registration_time: Some(now),
        conditions: changed.then_some(conditions),
        task_policy: msg.task_policy.clone(),
        ..Default::default()
    };
    (patch, changed)
}

/// The conditions list with `AcceptingTasks` following the agent's health,
/// or None when it already does (or the agent reports none).
pub fn accepting(
    conditions: &[Condition],
    health: Option<&AgentHealth>,
    now: Timestamp,
) -> Option<Vec<Condition>> {
    let health = health?;
    let (status, reason, message) = if health.accepting_tasks {
        // A robot that takes tasks may still say something is wrong (its
        // facts file refused): the condition carries it.
        match (&health.reason, &health.message) {
            (Some(reason), Some(message)) => (ConditionStatus::True, reason.clone(), message.clone()),
            _ => (
                ConditionStatus::True,
                AgentHealth::REASON_READY.to_owned(),
                "the agent takes tasks".to_owned(),
            ),
        }
    } else {
        (
            ConditionStatus::False,
            health
                .reason
                .clone()
                .unwrap_or_else(|| AgentHealth::REASON_SUPERVISOR_STOPPED.to_owned()),
            health
                .message
                .clone()
                .unwrap_or_else(|| "the agent takes no tasks".to_owned()),
        )
    };
    let current = find_condition(conditions, CONDITION_ACCEPTING_TASKS);
    let same = current.is_some_and(|c| {
        c.status == status
            && c.reason.as_deref() == Some(reason.as_str())
            && c.message.as_deref() == Some(message.as_str())
    });
    if same {
        return None;
    }
    let mut condition = Condition::new(CONDITION_ACCEPTING_TASKS, status, &reason, message);
    condition.last_transition_time = Some(now);
    let mut list = conditions.to_vec();
    set_condition(&mut list, condition);
    Some(list)
}

// ---------------------------------------------------------------- task status

/// The server's part of a Task's status, as a merge patch: what the robot
/// reported. Fields that describe how an attempt ended are written as null
/// when the report has none, so a Task never mixes two reports.
#[derive(Debug, Clone, PartialEq, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct TaskStatusPatch {
    /// running, completed or failed.
    pub state: TaskState,
    /// The report's seq.
    pub seq: u64,
    /// Exit code (null while running).
    pub exit_code: Option<i32>,
    /// Signal (null unless one ended the process).
    pub signal: Option<i32>,
    /// Reason (null while running).
    pub reason: Option<TaskReason>,
    /// Details, when the report has some.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub message: Option<String>,
    /// Start time, when the report has it.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub start_time: Option<Timestamp>,
    /// Finish time (null while running).
    pub finish_time: Option<Timestamp>,
    /// Output tail, when the report has it.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub output_tail: Option<String>,
    /// When the server first saw the attempt reported, by its own clock:
    /// set once per attempt (the manager's backstop counts from it).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub observed_running_time: Option<Timestamp>,
    /// The robot's restarts of the attempt, when the report counts some
    /// (a report without them leaves what an earlier one said).
    #[serde(flatten)]
    pub restarts: Option<RestartStatus>,
    /// The configuration the attempt runs with, when the report says.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub config: Option<Box<k8s4r_api::TaskConfigStatus>>,
}

/// Why a well-formed update was not applied: at-least-once delivery makes
/// these normal, so they are counted but are not errors.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Ignored {
    /// For an attempt older than the Task's, or one the manager has closed.
    StaleAttempt,
    /// Same attempt, seq not newer than the one applied.
    Duplicate,
    /// The Task's attempt already ended; a late report cannot reopen it.
    Terminal,
}

impl Ignored {
    /// The `outcome` label of the message counter.
    pub fn outcome(self) -> &'static str {
        match self {
            Ignored::StaleAttempt => "stale",
            Ignored::Duplicate => "duplicate",
            Ignored::Terminal => "terminal",
        }
    }
}

/// A status patch of `attempts[]` alone: a late completion kept in the
/// Task's history.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct AttemptsPatch {
    /// The whole list, with the attempt's record marked completed.
    pub attempts: Vec<k8s4r_api::AttemptRecord>,
}

/// The decision on one status update.
#[derive(Debug, Clone, PartialEq)]
pub enum StatusDecision {
    /// Patch the Task's status.
    Apply(TaskStatusPatch),
    /// Record a replaced attempt's late completion in `attempts[]`; the
    /// Task's state is the replacement's.
    Record(AttemptsPatch),
    /// Drop it (counted).
    Ignore(Ignored),
}

/// Decides what a status update from `robot` does to `task` (None: no Task
/// has the topic's uid).
///
/// `status.seq` counts only once a robot report was applied in the current
/// attempt (state running or later); while the Task is pending or
/// dispatching it is the previous attempt's and is read as 0.
pub fn decide_status(
    update: &StatusUpdate,
    topic_uid: &str,
    robot: &str,
    task: Option<&Task>,
    now: Timestamp,
) -> Result<StatusDecision, Rejection> {
    if update.task_uid != topic_uid {
        return Err(Rejection::TaskMismatch {
            body: update.task_uid.clone(),
            topic: topic_uid.to_owned(),
        });
    }
    if !matches!(
        update.state,
        TaskState::Running | TaskState::Completed | TaskState::Failed
    ) {
        return Err(Rejection::InvalidState {
            state: update.state.as_str(),
        });
    }
    let task = task.ok_or_else(|| Rejection::UnknownTask {
        uid: topic_uid.to_owned(),
    })?;
    let name = task_name(task);
    let status = task.status.clone().unwrap_or_default();
    if let Some(decision) = replaced_attempt(update, robot, task, &status) {
        return Ok(decision);
    }
    if task.spec.target_robot.as_deref() != Some(robot) {
        return Err(Rejection::NotAssigned {
            task: name,
            robot: robot.to_owned(),
            assigned: task.spec.target_robot.clone(),
        });
    }
    if update.attempt > status.attempt {
        return Err(Rejection::FutureAttempt {
            task: name,
            current: status.attempt,
            reported: update.attempt,
        });
    }
    if let Some(decision) = completed_after_fail(update, robot, &status) {
        return Ok(decision);
    }
    if update.attempt < status.attempt || status.attempts.iter().any(|a| a.attempt == update.attempt) {
        return Ok(StatusDecision::Ignore(Ignored::StaleAttempt));
    }
    let reported = matches!(
        status.state,
        Some(TaskState::Running | TaskState::Completed | TaskState::Failed)
    );
    let seq = if reported { status.seq } else { 0 };
    if !update.supersedes(status.attempt, seq, status.state) {
        let terminal = status.state.is_some_and(TaskState::is_terminal);
        return Ok(StatusDecision::Ignore(if terminal {
            Ignored::Terminal
        } else {
            Ignored::Duplicate
        }));
    }
    Ok(StatusDecision::Apply(applied(update, &status, now)))
}

/// The patch an update that supersedes the status makes.
fn applied(update: &StatusUpdate, status: &TaskStatus, now: Timestamp) -> TaskStatusPatch {
    TaskStatusPatch {
        state: update.state,
        seq: update.seq,
        exit_code: update.exit_code,
        signal: update.signal,
        reason: update.reason,
        message: update.message.clone(),
        start_time: update.start_time,
        finish_time: update.finish_time,
        output_tail: update.output_tail.as_deref().map(bounded_tail),
        observed_running_time: status.observed_running_time.is_none().then_some(now),
        restarts: (update.restarts.restart_count > 0).then(|| update.restarts.clone()),
        // A report older than what the status says (a restart's `Started`
        // after the server recorded a change it could not send) leaves it.
        config: update
            .config
            .as_ref()
            .filter(|c| c.generation >= status.config.as_ref().map_or(0, |s| s.generation))
            .map(|c| Box::new(config_status(c))),
    }
}

/// What a Task's status shows of the configuration a report says the
/// attempt runs with.
pub fn config_status(report: &k8s4r_api::protocol::ConfigReport) -> k8s4r_api::TaskConfigStatus {
    k8s4r_api::TaskConfigStatus {
        versions: k8s4r_api::config_ref::ConfigSource::versions(&report.sources),
        sources: report.sources.clone(),
        generation: report.generation,
        message: report.message.clone(),
    }
}

/// A replaced attempt's late completion that does not decide the Task
/// (`reconcile: keepReplacement`, or the Task is over already): kept in its
/// record in `attempts[]`, so that what the robot is told was recorded is
/// (the simulation found it thrown away: seed 52).
fn record_late(
    update: &StatusUpdate,
    robot: &str,
    status: &TaskStatus,
    keep_original: bool,
) -> StatusDecision {
    let mut attempts = status.attempts.clone();
    let Some(record) = attempts
        .iter_mut()
        .find(|a| a.attempt == update.attempt && a.robot.as_deref() == Some(robot))
    else {
        return StatusDecision::Ignore(Ignored::StaleAttempt);
    };
    let why = record.reason.map(|r| format!("{r:?}")).unwrap_or_default();
    let stands = if keep_original {
        "the Task had ended first"
    } else {
        "the replacement's result stands (reconcile: keepReplacement)"
    };
    record.state = TaskState::Completed;
    record.exit_code = update.exit_code;
    record.reason = Some(TaskReason::Completed);
    record.message = Some(format!(
        "completed on robot {robot} after the cluster had replaced it ({why}); {stands}"
    ));
    record.finish_time = update.finish_time.or(record.finish_time);
    StatusDecision::Record(AttemptsPatch { attempts })
}

/// The completion of the current attempt after the cluster gave it up
/// (`RobotLost` or `DispatchTimeout`) and before a replacement was placed:
/// the failure written, or the retry too (the Task pending again at the
/// same attempt, which `attempts[]` records as lost). The work is done and
/// nothing replaced it yet, so the completion stands, whatever the
/// reconcile policy. (It used to be ignored, as terminal or stale, and
/// confirmed to the robot, which forgot it; the retry then ran the task
/// again, `keepOriginal` or not. The deterministic simulation found both
/// windows: seeds 22 and 30.)
fn completed_after_fail(update: &StatusUpdate, robot: &str, status: &TaskStatus) -> Option<StatusDecision> {
    if update.attempt != status.attempt || update.state != TaskState::Completed {
        return None;
    }
    let failed = status.state == Some(TaskState::Failed) && given_up(status.reason);
    let record = status.attempts.iter().find(|a| a.attempt == update.attempt);
    let given_up_here = record.is_some_and(|a| given_up(a.reason) && a.robot.as_deref() == Some(robot));
    // Waiting for its next attempt, or failed while it waited (its Job's
    // pendingDeadlineSeconds): the lost attempt's completion still stands.
    let waiting = matches!(status.state, Some(TaskState::Pending))
        || (status.state == Some(TaskState::Failed) && status.reason == Some(TaskReason::Unschedulable));
    let retrying = waiting && given_up_here;
    if !(failed || retrying) {
        return None;
    }
    let why = if failed {
        status.reason
    } else {
        record.and_then(|a| a.reason)
    };
    let why = why.map(|r| format!("{r:?}")).unwrap_or_default();
    Some(StatusDecision::Apply(completion(
        update,
        update.seq.max(status.seq),
        format!(
            "attempt {} completed on robot {robot} after the cluster had given it up ({why}); the completion stands and no retry follows",
            update.attempt
        ),
    )))
}

/// The most of a robot's output tail a Task's status keeps: a robot's
/// own setting sends 4 KiB unless its operator chose more, and a robot
/// that sends more (up to a whole message) costs the API server no more
/// than this per write.
pub const MAX_OUTPUT_TAIL_BYTES: usize = 64 * 1024;

/// The end of `tail`, at most [`MAX_OUTPUT_TAIL_BYTES`], cut at a
/// character's start.
fn bounded_tail(tail: &str) -> String {
    let mut start = tail.len().saturating_sub(MAX_OUTPUT_TAIL_BYTES);
    while !tail.is_char_boundary(start) {
        start += 1;
    }
    tail[start..].to_owned()
}

/// Whether an attempt ended because the cluster gave it up (its robot
/// silent, its dispatch not taken), not by the robot's own report.
fn given_up(reason: Option<TaskReason>) -> bool {
    matches!(reason, Some(TaskReason::RobotLost | TaskReason::DispatchTimeout))
}

/// The patch that completes a Task with a late report's completion: its
/// exit, times and output, `seq`, and a message saying why it stands.
fn completion(update: &StatusUpdate, seq: u64, message: String) -> TaskStatusPatch {
    TaskStatusPatch {
        state: TaskState::Completed,
        seq,
        exit_code: update.exit_code,
        signal: update.signal,
        reason: Some(TaskReason::Completed),
        message: Some(message),
        start_time: update.start_time,
        finish_time: update.finish_time,
        output_tail: update.output_tail.as_deref().map(bounded_tail),
        observed_running_time: None,
        restarts: None,
        config: None,
    }
}

/// A late report of an attempt that was replaced while its robot was cut
/// off. Its completion is recorded and, under `reconcile: keepOriginal`,
/// completes the Task (the server then cancels the replacement, which the
/// Task no longer wants); anything else about it is stale.
fn replaced_attempt(
    update: &StatusUpdate,
    robot: &str,
    task: &Task,
    status: &TaskStatus,
) -> Option<StatusDecision> {
    if update.attempt >= status.attempt {
        return None;
    }
    let record = status
        .attempts
        .iter()
        .find(|a| a.attempt == update.attempt && a.robot.as_deref() == Some(robot))?;
    if record.state == TaskState::Completed && update.state == TaskState::Completed {
        // Its late completion is kept already.
        return Some(StatusDecision::Ignore(Ignored::Duplicate));
    }
    let was_lost = given_up(record.reason);
    let keep_original = DisconnectPolicy::reconcile(task.spec.disconnect.as_ref()) == Reconcile::KeepOriginal;
    // Open: not completed or cancelled. A Task whose replacement failed is
    // open too, whether a retry follows or not: the original did the work
    // (the simulation's seed 1002291 had it kept in the history only, and
    // the task ran a fifth time).
    let open = !matches!(status.state, Some(TaskState::Completed | TaskState::Cancelled));
    if !(was_lost && update.state == TaskState::Completed) {
        return Some(StatusDecision::Ignore(Ignored::StaleAttempt));
    }
    if !(keep_original && open) {
        return Some(record_late(update, robot, status, keep_original));
    }
    let replacement = status.attempt;
    Some(StatusDecision::Apply(completion(
        update,
        status.seq,
        format!(
            "attempt {} completed on robot {robot} while it was cut off (reconcile: keepOriginal); replacement attempt {replacement} is stopped",
            update.attempt
        ),
    )))
}

mod connection;
mod dispatch;
mod heartbeat;
mod reconcile;

pub use connection::{absent_at_start, connected, heard_after, REASON_NOT_CONNECTED_AT_START};
pub use dispatch::{
    config_to_send, decide_task, dispatched_attempt, dispatching, expired_unsent, has_finalizer, phase_of,
    reachable, sent_attempt, ConfigSend, Stop, TaskAction,
};
pub use heartbeat::{plan_heartbeat, plan_lease, Coalescing, HeartbeatMemory, HeartbeatPlan, LeaseRecord};
pub use reconcile::{plan_reconcile, unwanted, Holding, ReconcilePlan, DISPATCH_GRACE};

/// `namespace/name` of a Task, for logs and errors.
pub fn task_name(task: &Task) -> String {
    format!(
        "{}/{}",
        task.metadata.namespace.as_deref().unwrap_or_default(),
        task.metadata.name.as_deref().unwrap_or_default()
    )
}

#[cfg(test)]
mod tests;
