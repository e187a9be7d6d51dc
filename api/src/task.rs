//! The Task resource: one process to run on one robot (owned by a TaskGroup).

use jiff::Timestamp;
use schemars::JsonSchema;
use serde::{Deserialize, Serialize};

use crate::condition::Condition;
use crate::duration::DurationString;
use crate::quantity::Quantity;
use crate::selector::{Constraint, LabelSelector};

/// The drivers an agent may offer.
pub const DRIVERS: &[&str] = &[DRIVER_EXEC, DRIVER_RAW_EXEC];
/// Runs the command isolated: another user, no_new_privs, its own directory
/// and resource limits.
pub const DRIVER_EXEC: &str = "exec";
/// Runs the command as the agent's user, in its own process group.
pub const DRIVER_RAW_EXEC: &str = "raw_exec";

/// What to run and how: the part of a task the robot needs. A Job's groups
/// carry one of these; each Task carries a copy.
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct TaskTemplate {
    /// How to run the command: `exec` (isolated) or `raw_exec`.
    #[schemars(extend("enum" = ["exec", "raw_exec"]))]
    pub driver: String,
    /// The program to run: a path, or a name looked up in PATH.
    pub command: String,
    /// Arguments to the program.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub args: Vec<String>,
    /// Environment variables set for the process.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub env: Vec<EnvVar>,
    /// Working directory; defaults to the task's own directory on the robot.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub working_dir: Option<String>,
    /// The user to run as (exec driver; default `nobody` when the agent is root).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub user: Option<String>,
    /// Files downloaded into the task directory before start.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub artifacts: Vec<Artifact>,
    /// Wall-clock limit from start; then SIGTERM. Unset: no limit.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub timeout: Option<DurationString>,
    /// Time between SIGTERM and SIGKILL (default 5s, at most 5m).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub kill_timeout: Option<DurationString>,
    /// CPU and memory the task needs; used for placement and limits.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub resources: Option<TaskResources>,
}

/// One environment variable.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct EnvVar {
    /// Variable name.
    pub name: String,
    /// Variable value.
    #[serde(default)]
    pub value: String,
}

/// A file fetched before the task starts.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct Artifact {
    /// Where to download from (http or https).
    pub url: String,
    /// Path relative to the task directory to save it as.
    pub destination: String,
    /// Expected SHA-256 of the content, 64 hex digits.
    pub sha256: String,
}

/// CPU and memory requests of a task.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct TaskResources {
    /// CPU, e.g. "500m".
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub cpu: Option<Quantity>,
    /// Memory, e.g. "256Mi".
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub memory: Option<Quantity>,
}

/// How failed attempts are retried.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct RestartPolicy {
    /// Retries after the first attempt (0: never retry).
    #[serde(default)]
    pub attempts: u32,
    /// Delay before the first retry; doubled for each further one.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub delay: Option<DurationString>,
    /// Upper bound of the delay (default 5m).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub max_delay: Option<DurationString>,
    /// What happens when the retries are used up: `fail` (the task fails).
    #[serde(default)]
    pub mode: RestartMode,
}

/// What happens when a task's retries are used up.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub enum RestartMode {
    /// The task is failed for good.
    #[default]
    Fail,
}

/// One task: a template plus where it may and does run.
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize, JsonSchema)]
#[cfg_attr(
    feature = "kube",
    derive(kube::CustomResource),
    kube(
        group = "robot.k8s4r.io",
        version = "v1alpha1",
        kind = "Task",
        plural = "tasks",
        shortname = "rtask",
        category = "k8s4r",
        namespaced,
        status = "TaskStatus",
        doc = "One process to run on one robot.",
        printcolumn(name = "State", type_ = "string", json_path = ".status.state"),
        printcolumn(name = "Robot", type_ = "string", json_path = ".spec.targetRobot"),
        printcolumn(name = "Attempt", type_ = "integer", json_path = ".status.attempt"),
        printcolumn(name = "Exit", type_ = "integer", json_path = ".status.exitCode"),
        printcolumn(name = "Reason", type_ = "string", json_path = ".status.reason"),
        printcolumn(name = "Age", type_ = "date", json_path = ".metadata.creationTimestamp")
    )
)]
#[serde(rename_all = "camelCase")]
pub struct TaskSpec {
    /// What to run.
    #[serde(flatten)]
    pub template: TaskTemplate,
    /// Robots the task may run on, by label.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub robot_selector: Option<LabelSelector>,
    /// Further placement rules over robot attributes.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub constraints: Vec<Constraint>,
    /// Retries of failed attempts.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub restart_policy: Option<RestartPolicy>,
    /// Scheduling priority (higher first), from the Job.
    #[serde(default)]
    pub priority: i32,
    /// The robot chosen by the scheduler; empty until scheduled.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub target_robot: Option<String>,
}

/// Where a task is in its lifecycle.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub enum TaskState {
    /// Waiting for a robot (or for a retry's delay).
    Pending,
    /// Assigned to a robot, sent, not yet started there.
    Dispatching,
    /// Running on the robot.
    Running,
    /// Exited 0.
    Completed,
    /// Failed for good (after its retries) or for this attempt.
    Failed,
}

impl TaskState {
    /// Completed or Failed: a robot's later `running` never replaces it.
    pub fn is_terminal(self) -> bool {
        matches!(self, TaskState::Completed | TaskState::Failed)
    }

    /// The lower-case name used in status and on the wire.
    pub fn as_str(self) -> &'static str {
        match self {
            TaskState::Pending => "pending",
            TaskState::Dispatching => "dispatching",
            TaskState::Running => "running",
            TaskState::Completed => "completed",
            TaskState::Failed => "failed",
        }
    }
}

/// Why a task attempt ended the way it did.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, Serialize, Deserialize, JsonSchema)]
pub enum TaskReason {
    /// Exited 0.
    Completed,
    /// Exited with a non-zero code.
    Error,
    /// Killed by a signal it did not ask for.
    Signaled,
    /// Ran past its timeout and was terminated.
    Timeout,
    /// Stopped because it was cancelled (task deleted or superseded).
    Cancelled,
    /// The process could not be started (command not found, bad user, cwd).
    StartFailed,
    /// An artifact could not be fetched or did not match its checksum.
    ArtifactFailed,
    /// The spec was refused (unknown driver, bad field).
    InvalidSpec,
    /// The agent restarted while the task ran; the task was killed.
    AgentRestarted,
    /// The robot went offline while the task ran.
    RobotLost,
    /// The robot never acknowledged the dispatch.
    DispatchTimeout,
    /// The robot stopped reporting past the timeout (manager's backstop).
    TimeoutBackstop,
    /// Some reason this version does not know.
    #[serde(other)]
    Unknown,
}

/// What happened to the task and its attempts.
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct TaskStatus {
    /// pending, dispatching, running, completed or failed.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub state: Option<TaskState>,
    /// The current attempt, from 1.
    #[serde(default)]
    pub attempt: u32,
    /// The sequence number of the last robot report applied in this attempt.
    #[serde(default)]
    pub seq: u64,
    /// The robot running (or that ran) the current attempt.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub robot: Option<String>,
    /// Exit code of the process (143/137 after SIGTERM/SIGKILL).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub exit_code: Option<i32>,
    /// The signal that ended the process, if one did.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub signal: Option<i32>,
    /// Why the attempt ended (Timeout, Error, RobotLost, ...).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub reason: Option<TaskReason>,
    /// Details for a person.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub message: Option<String>,
    /// When the current attempt was dispatched.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub dispatch_time: Option<Timestamp>,
    /// When the process started on the robot.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub start_time: Option<Timestamp>,
    /// When the attempt ended.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub finish_time: Option<Timestamp>,
    /// When the next attempt may start (restart backoff).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub next_attempt_time: Option<Timestamp>,
    /// The last few KiB of stdout and stderr.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub output_tail: Option<String>,
    /// Earlier attempts, oldest first.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub attempts: Vec<AttemptRecord>,
    /// Scheduled and similar conditions.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub conditions: Vec<Condition>,
}

/// How one earlier attempt ended.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct AttemptRecord {
    /// The attempt number.
    pub attempt: u32,
    /// The robot it ran on.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub robot: Option<String>,
    /// Its final state.
    pub state: TaskState,
    /// Its exit code.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub exit_code: Option<i32>,
    /// Why it ended.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub reason: Option<TaskReason>,
    /// When it ended.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub finish_time: Option<Timestamp>,
}

/// A compact handle on one attempt of one task.
#[derive(Clone, Debug, PartialEq, Eq, Hash, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct TaskAttempt {
    /// The Task's metadata.uid.
    pub uid: String,
    /// The attempt number.
    pub attempt: u32,
}

/// Counts of tasks per state.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct TaskCounts {
    /// All tasks.
    pub total: i32,
    /// Waiting for a robot or a retry.
    pub pending: i32,
    /// Sent to a robot, not yet started.
    pub dispatching: i32,
    /// Running.
    pub running: i32,
    /// Completed.
    pub completed: i32,
    /// Failed for good.
    pub failed: i32,
}

impl TaskCounts {
    /// Adds one task in `state` (None counts as pending).
    pub fn add(&mut self, state: Option<TaskState>) {
        self.total += 1;
        match state.unwrap_or(TaskState::Pending) {
            TaskState::Pending => self.pending += 1,
            TaskState::Dispatching => self.dispatching += 1,
            TaskState::Running => self.running += 1,
            TaskState::Completed => self.completed += 1,
            TaskState::Failed => self.failed += 1,
        }
    }

    /// Adds another set of counts.
    pub fn merge(&mut self, other: &TaskCounts) {
        self.total += other.total;
        self.pending += other.pending;
        self.dispatching += other.dispatching;
        self.running += other.running;
        self.completed += other.completed;
        self.failed += other.failed;
    }
}
