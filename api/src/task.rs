//! The Task resource: one process to run on one robot (owned by a TaskGroup).

use jiff::Timestamp;
use schemars::JsonSchema;
use serde::{Deserialize, Serialize};

use crate::condition::Condition;
use crate::config_ref::{ConfigFiles, EnvFromSource, EnvVarSource};
use crate::disconnect::DisconnectPolicy;
use crate::duration::DurationString;
use crate::quantity::Quantity;
use crate::selector::{AntiAffinity, Constraint, LabelSelector, WeightedAffinity};
use crate::task_kind::TaskKind;

/// The drivers an agent may offer. A robot offers `raw_exec` and `podman`
/// only when its configuration turns them on.
pub const DRIVERS: &[&str] = &[DRIVER_EXEC, DRIVER_RAW_EXEC, DRIVER_PODMAN];
/// Runs the command isolated: a user of its own, no_new_privs, its own
/// directory and resource limits.
pub const DRIVER_EXEC: &str = "exec";
/// Runs the command as the agent's user (root on a robot), in its own
/// process group: off unless the robot's configuration turns it on.
pub const DRIVER_RAW_EXEC: &str = "raw_exec";
/// Runs the task in a container from `image` (pinned by digest), with
/// podman and no daemon: off unless the robot's configuration turns it on.
pub const DRIVER_PODMAN: &str = "podman";

/// What to run and how: the part of a task the robot needs. A Job's groups
/// carry one of these; each Task carries a copy.
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct TaskTemplate {
    /// How to run the command: `exec` (isolated), `raw_exec`, or `podman`
    /// (a container from `image`).
    #[schemars(extend("enum" = ["exec", "raw_exec", "podman"]))]
    pub driver: String,
    /// The program to run: a path, or a name looked up in PATH. With
    /// `podman`, the container's entrypoint; empty: the image's own
    /// entrypoint and command (then `args`, when given, replace the
    /// image's command), as in a Kubernetes container.
    #[serde(default)]
    pub command: String,
    /// Arguments to the program.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub args: Vec<String>,
    /// Environment variables set for the process: a value, or a key of a
    /// ConfigMap or Secret (`valueFrom`). They win over `envFrom`'s.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub env: Vec<EnvVar>,
    /// Every key of a ConfigMap or Secret as an environment variable (a key
    /// that is not a variable name is skipped).
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    #[schemars(length(max = 16))]
    pub env_from: Vec<EnvFromSource>,
    /// Files from ConfigMaps and Secrets, written under the task's
    /// directory before it starts, owned by its user (Secrets 0400 by
    /// default), removed when the attempt ends.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    #[schemars(length(max = 16))]
    pub files: Vec<ConfigFiles>,
    /// What a running service does when a ConfigMap or Secret it takes
    /// changes, once its files are rewritten: `none` (the default: files
    /// only; variables keep their values until it starts again),
    /// `restart` (a rolling restart, at most the group's `maxParallel` at
    /// once, default 1) or `signal` (`configChangeSignal` to its process
    /// group). Batch tasks keep the values they started with.
    #[serde(default, skip_serializing_if = "crate::config_ref::OnConfigChange::is_none")]
    pub on_config_change: crate::config_ref::OnConfigChange,
    /// The signal `onConfigChange: signal` sends: SIGHUP (the default),
    /// SIGUSR1 or SIGUSR2.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub config_change_signal: Option<StopSignal>,
    /// Working directory, relative to the task's own directory on the robot
    /// (no `..`); defaults to that directory.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(length(min = 1, max = 1024))]
    pub working_dir: Option<String>,
    /// The user to run as (exec driver). Unset: a user of the task's own,
    /// from the robot's range of task uids. A named user must be one the
    /// robot allows (`allowed_users`; `root` needs `allow_root`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(length(min = 1, max = 32))]
    pub user: Option<String>,
    /// Supplementary groups of the process (exec driver), e.g. `dialout`,
    /// `video` or `gpio` for devices; each must be one the robot allows
    /// (`allowed_groups`).
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    #[schemars(length(max = 32))]
    pub groups: Vec<String>,
    /// Files downloaded into the task directory before start.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    #[schemars(length(max = 64))]
    pub artifacts: Vec<Artifact>,
    /// Wall-clock limit from start, at most 30 days; then SIGTERM. Unset:
    /// no limit.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub timeout: Option<DurationString>,
    /// Time between SIGTERM and SIGKILL (default 5s, at most 5m).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub kill_timeout: Option<DurationString>,
    /// CPU and memory the task needs; used for placement and limits.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub resources: Option<TaskResources>,
    /// `batch` (default): runs to completion. `service`: runs until its
    /// Job is deleted; it never completes, and the robot restarts it
    /// whenever it exits (by `restart`).
    #[serde(default, skip_serializing_if = "TaskKind::is_batch")]
    pub kind: TaskKind,
    /// Restarts on the robot itself, with or without the cluster, before
    /// the attempt is reported failed (Nomad's `restart` block). Unset: a
    /// service gets 2 restarts within 30m, 15s apart, then fails; a batch
    /// task none.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub restart: Option<LocalRestart>,
    /// Health checks the robot runs while the task runs: after
    /// `failureThreshold` failures in a row the process is stopped
    /// (SIGTERM, then SIGKILL after `killTimeout`) and restarted by
    /// `restart`, the reason in its status and Events.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    #[schemars(length(max = 8))]
    pub checks: Vec<HealthCheck>,
    /// The signal that asks the task to stop, sent to its process group on
    /// every stop (timeout, cancel, failed check, lost contact, drain,
    /// agent shutdown); SIGKILL follows after `killTimeout`. Default
    /// SIGTERM; `SIGINT` for `ros2 launch`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub stop_signal: Option<StopSignal>,
    /// A command run in the task's sandbox before its stop signal, on every
    /// stop, with `K8S4R_STOP_REASON` in its environment. Its time counts
    /// in `killTimeout`: SIGKILL comes `killTimeout` after the stop began.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub pre_stop: Option<PreStop>,
    /// Facts the robot must report for the task to start there (all of
    /// them), e.g. `battery Gt 30`; a condition with `whileRunning: stop`
    /// also stops the task when it no longer holds.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    #[schemars(length(max = 16))]
    pub when: Vec<crate::facts::FactRequirement>,
    /// Files the robot uploads to the cluster's bucket: paths or globs
    /// under the working directory, taken when the attempt ends or, for
    /// rolling files, once each is closed and settled. Each is listed in
    /// the Task's status.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    #[schemars(length(max = 16))]
    pub outputs: Vec<crate::output::Output>,
    /// The container image of a `podman` task, pinned by digest:
    /// `[registry/]name[:tag]@sha256:<64 hex digits>`. A tag alone is
    /// refused. The robot pulls it once from its registry, or it is
    /// loaded onto the robot beforehand (`k8s4r image push`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(length(min = 1, max = 512))]
    pub image: Option<String>,
    /// The network of a `podman` task's container: `host` (the default,
    /// for ROS 2's discovery), `bridge` or `none`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub network: Option<crate::container::ContainerNetwork>,
    /// Devices given to a `podman` task's container: paths under `/dev`
    /// (`/dev/video0`, a serial port) or CDI names (`nvidia.com/gpu=all`),
    /// each one the robot's configuration allows (`podman_devices`).
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    #[schemars(length(max = 16))]
    pub devices: Vec<String>,
}

/// The signal a task is asked to stop with.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
pub enum StopSignal {
    #[default]
    #[serde(rename = "SIGTERM")]
    Term,
    #[serde(rename = "SIGINT")]
    Int,
    #[serde(rename = "SIGHUP")]
    Hup,
    #[serde(rename = "SIGQUIT")]
    Quit,
    #[serde(rename = "SIGUSR1")]
    Usr1,
    #[serde(rename = "SIGUSR2")]
    Usr2,
}

impl StopSignal {
    /// Its name, as a spec writes it.
    pub fn name(self) -> &'static str {
        match self {
            StopSignal::Term => "SIGTERM",
            StopSignal::Int => "SIGINT",
            StopSignal::Hup => "SIGHUP",
            StopSignal::Quit => "SIGQUIT",
            StopSignal::Usr1 => "SIGUSR1",
            StopSignal::Usr2 => "SIGUSR2",
        }
    }

    /// Its number on Linux.
    pub fn number(self) -> i32 {
        match self {
            StopSignal::Term => 15,
            StopSignal::Int => 2,
            StopSignal::Hup => 1,
            StopSignal::Quit => 3,
            StopSignal::Usr1 => 10,
            StopSignal::Usr2 => 12,
        }
    }
}

/// A command run before a task's stop signal.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct PreStop {
    /// The program: a path, or a name looked up in PATH.
    #[schemars(length(min = 1, max = 4096))]
    pub command: String,
    /// Its arguments.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub args: Vec<String>,
    /// How long it may take, at most the task's `killTimeout` (default:
    /// half of it); then it is killed and the stop goes on.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub timeout: Option<DurationString>,
}

/// One health check: exactly one of `exec`, `tcp` and `http`.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct HealthCheck {
    /// A name for messages (default: what it checks).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(length(min = 1, max = 63))]
    pub name: Option<String>,
    /// Runs a command as the task runs (its driver, user, directory and
    /// environment): healthy when it exits 0.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub exec: Option<ExecCheck>,
    /// Opens a TCP connection: healthy when it connects.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub tcp: Option<TcpCheck>,
    /// Sends an HTTP GET: healthy on a 2xx or 3xx answer.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub http: Option<HttpCheck>,
    /// Time between checks (default 10s; 100ms to 1h).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub interval: Option<DurationString>,
    /// How long one check may take (default 2s, at most the interval).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub timeout: Option<DurationString>,
    /// Failures in a row that make the task unhealthy (default 3).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub failure_threshold: Option<u32>,
    /// Wait after each start before the first check (default: the
    /// interval; at most 1h).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub initial_delay: Option<DurationString>,
}

/// A command run as a health check.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct ExecCheck {
    /// The program: a path, or a name looked up in PATH.
    pub command: String,
    /// Its arguments.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub args: Vec<String>,
}

/// A TCP connection as a health check.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct TcpCheck {
    /// The port.
    pub port: u16,
    /// The host (default 127.0.0.1: the robot itself).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub host: Option<String>,
}

/// An HTTP GET as a health check.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct HttpCheck {
    /// The port.
    pub port: u16,
    /// The path (default `/`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub path: Option<String>,
    /// The host (default 127.0.0.1: the robot itself).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub host: Option<String>,
}

/// Restarts of an attempt on the robot (Nomad's `restart` block): at most
/// `attempts` restarts within any `interval`, the first after `delay`, each
/// further one in a row after twice the last (at most `maxDelay`).
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct LocalRestart {
    /// Restarts allowed within `interval` (0: none).
    #[serde(default)]
    pub attempts: u32,
    /// The window `attempts` counts in (default 30m).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub interval: Option<DurationString>,
    /// Wait before a restart (default 15s); doubled for each restart in a
    /// row within the interval.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub delay: Option<DurationString>,
    /// Upper bound of that wait (default 5m).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub max_delay: Option<DurationString>,
    /// When the restarts within the interval are used up: `fail` (the
    /// attempt is reported failed; the cluster's `restartPolicy` may then
    /// retry it) or `delay` (wait until the interval allows another).
    #[serde(default)]
    pub mode: LocalRestartMode,
}

impl LocalRestart {
    /// A service's restarts when it sets none (Nomad's default for
    /// services): 2 within 30m, after 15s, then fail.
    pub fn service_default() -> LocalRestart {
        LocalRestart {
            attempts: 2,
            interval: Some(DurationString("30m".to_owned())),
            delay: Some(DurationString("15s".to_owned())),
            max_delay: None,
            mode: LocalRestartMode::Fail,
        }
    }
}

/// What happens when a task's restarts on the robot are used up.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub enum LocalRestartMode {
    /// The attempt is reported failed.
    #[default]
    Fail,
    /// The robot waits until the interval allows another restart.
    Delay,
}

impl TaskTemplate {
    /// Its `resources.disk` in bytes, when it sets a valid one.
    pub fn disk_bytes(&self) -> Option<u64> {
        self.resources
            .as_ref()
            .and_then(|r| r.disk.as_ref())
            .and_then(|q| q.to_units().ok())
    }
}

/// One environment variable.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct EnvVar {
    /// Variable name.
    pub name: String,
    /// Variable value (empty when it comes from `valueFrom`).
    #[serde(default)]
    pub value: String,
    /// A key of a ConfigMap or Secret instead of `value`, read when the
    /// task is dispatched to its robot.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub value_from: Option<EnvVarSource>,
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

/// CPU, memory and disk requests of a task.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct TaskResources {
    /// CPU, e.g. "500m".
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub cpu: Option<Quantity>,
    /// Memory, e.g. "256Mi".
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub memory: Option<Quantity>,
    /// Disk for the task's directory on the robot (its downloads, the
    /// files it writes, its logs), e.g. "500Mi": counted against the
    /// robot's disk budget when placing it, and a task that outgrows it is
    /// stopped (reason DiskLimit).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub disk: Option<Quantity>,
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
    /// Retries for attempts that ended through no fault of the task (its
    /// robot lost or cut off, the dispatch not taken, the attempt gone
    /// from the robot), apart from `attempts`. Default: the manager's
    /// `--lost-retries` (3).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub lost_retries: Option<u32>,
    /// New attempts after the robot stopped one because a start condition
    /// stopped holding (`whileRunning: stop`: an e-stop pressed, a battery
    /// low). Such an attempt uses no retry: the next one waits for the
    /// condition to hold again. Beyond this many the task fails, saying so.
    /// Default 20.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub condition_restarts: Option<u32>,
}

/// New attempts after a lost start condition when `conditionRestarts` is
/// not set.
pub const DEFAULT_CONDITION_RESTARTS: u32 = 20;

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
        printcolumn(
            name = "Robot",
            type_ = "string",
            json_path = ".status.robot",
            description = "The robot of the current attempt; empty while the task waits for one."
        ),
        printcolumn(name = "Attempt", type_ = "integer", json_path = ".status.attempt"),
        printcolumn(name = "Exit", type_ = "integer", json_path = ".status.exitCode"),
        printcolumn(name = "Restarts", type_ = "integer", json_path = ".status.restartCount"),
        printcolumn(name = "Reason", type_ = "string", json_path = ".status.reason"),
        printcolumn(name = "Age", type_ = "date", json_path = ".metadata.creationTimestamp"),
        printcolumn(
            name = "Config",
            type_ = "string",
            json_path = ".status.config.versions",
            priority = 1,
            description = "The ConfigMaps and Secrets the attempt runs with, each at its resourceVersion."
        )
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
    /// What happens when the task's robot loses the cluster, from its group.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub disconnect: Option<DisconnectPolicy>,
    /// Scheduling priority (higher first), from the Job.
    #[serde(default)]
    pub priority: i32,
    /// How long the task may wait for a robot before it fails
    /// `Unschedulable`, from the Job's `pendingDeadlineSeconds`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub pending_deadline_seconds: Option<i64>,
    /// At most one running task of the task's group per robot (or per value
    /// of a robot label), from its group.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub anti_affinity: Option<AntiAffinity>,
    /// Robots preferred, with weights, from its group.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub affinity: Vec<WeightedAffinity>,
    /// The one robot this task may run on (an everyRobot group's task).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub robot_name: Option<String>,
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
    /// Stopped for good by a person (the `robot.k8s4r.io/cancel`
    /// annotation); the manager's state, never a robot's.
    Cancelled,
}

impl TaskState {
    /// Completed, Failed or Cancelled: a robot's later `running` never
    /// replaces it.
    pub fn is_terminal(self) -> bool {
        matches!(
            self,
            TaskState::Completed | TaskState::Failed | TaskState::Cancelled
        )
    }

    /// The lower-case name used in status and on the wire.
    pub fn as_str(self) -> &'static str {
        match self {
            TaskState::Pending => "pending",
            TaskState::Dispatching => "dispatching",
            TaskState::Running => "running",
            TaskState::Completed => "completed",
            TaskState::Failed => "failed",
            TaskState::Cancelled => "cancelled",
        }
    }
}

/// Why a task attempt ended the way it did, or, while the task waits for
/// its next attempt, why it waits (`Unschedulable`, `BackOff`).
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
    /// The robot's agent stopped the attempt as it shut down (a restart,
    /// an upgrade, a stop of k8s4r-agent): not the task's doing, nor a
    /// person's. The task waits for a robot again, using no retry.
    AgentShutdown,
    /// The robot went offline while the task ran.
    RobotLost,
    /// The robot never acknowledged the dispatch.
    DispatchTimeout,
    /// The robot stopped reporting past the timeout (manager's backstop).
    TimeoutBackstop,
    /// The robot stopped the attempt itself: it had heard nothing from the
    /// cluster for the group's `disconnect.stopAfter`.
    Disconnected,
    /// The robot reported in without the attempt the Task shows running on
    /// it (the agent lost it, e.g. across a restart).
    NotOnRobot,
    /// The robot's configuration does not allow what the task asks for (a
    /// driver it does not offer, running as root, a user or group it does
    /// not allow).
    NotPermitted,
    /// The robot refused the dispatch: it already runs its `max_tasks`, or
    /// its disk budget for tasks is used up, or its disk is full.
    OverCapacity,
    /// The task's directory outgrew its `resources.disk` or the robot's
    /// disk budget, or filled the robot's disk; the task was stopped.
    DiskLimit,
    /// Its health checks failed `failureThreshold` times in a row; the
    /// robot stopped it.
    Unhealthy,
    /// The robot's facts did not satisfy the task's `when` when it was
    /// about to start it: the task waits again (no retry used).
    NotReady,
    /// A `whileRunning: stop` condition stopped holding on the robot, which
    /// stopped the task.
    ConditionLost,
    /// The robot was drained (`k8s4r drain`): the attempt was stopped and
    /// the task waits for another robot (no retry used).
    Drained,
    /// While the task waits (state pending): no robot fits it now; its
    /// `Scheduled` condition and message say why, robot by robot. As the
    /// end of a failed task: it waited past its Job's
    /// `pendingDeadlineSeconds`, and the message says why no robot fit.
    Unschedulable,
    /// While the task waits (state pending): a ConfigMap or Secret (or a
    /// key of one) its template needs on the robots that fit it does not
    /// exist yet; the message names it. Creating it starts the task.
    ConfigMissing,
    /// While the task waits (state pending): what it takes from ConfigMaps
    /// and Secrets cannot be given to it (more than a task may take, or a
    /// variable's value that is not text); the message names the object.
    /// Changing the object starts it. As the end of a failed task: it was
    /// found only as the attempt was dispatched (never sent), and the task
    /// fails for good.
    ConfigInvalid,
    /// The task's container image is not on the robot and the robot could
    /// not pull it (its registry unreachable, the digest unknown there):
    /// the task waits for a robot again, using no retry, backing off, until
    /// the image can be had (pulled, or `k8s4r image push`ed to the robot).
    ImageUnavailable,
    /// Not the end of an attempt: the task waits for its restart policy's
    /// delay before the next attempt; its message says how the last one
    /// ended and when the next comes.
    BackOff,
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
    /// The robot running (or that ran) the current attempt; none while the
    /// task waits for its next attempt (the earlier ones are in `attempts`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub robot: Option<String>,
    /// Exit code of the process (143/137 after SIGTERM/SIGKILL).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub exit_code: Option<i32>,
    /// The signal that ended the process, if one did.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub signal: Option<i32>,
    /// Why the attempt ended (Timeout, Error, RobotLost, ...), or while the
    /// task is pending, why it waits (Unschedulable, BackOff).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub reason: Option<TaskReason>,
    /// Details for a person.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub message: Option<String>,
    /// When the current attempt was dispatched.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub dispatch_time: Option<Timestamp>,
    /// When the manager's dispatch stops being valid: a robot that gets it
    /// later refuses it, and the manager gives up on it then.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub dispatch_deadline: Option<Timestamp>,
    /// When the server first saw this attempt running, by the cluster's
    /// clock (the timeout backstop counts from here, not from the robot's
    /// clock).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub observed_running_time: Option<Timestamp>,
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
    /// The robot's restarts of the current attempt.
    #[serde(flatten)]
    pub restarts: RestartStatus,
    /// Earlier attempts, oldest first.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub attempts: Vec<AttemptRecord>,
    /// The last `robot.k8s4r.io/retry` acted on.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub retry: Option<ManualAction>,
    /// The `robot.k8s4r.io/cancel` acted on.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub cancellation: Option<ManualAction>,
    /// The last `robot.k8s4r.io/evict` acted on (`k8s4r drain`): its
    /// `attempt` is the one the robot was asked to stop so that the task
    /// runs elsewhere.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub eviction: Option<ManualAction>,
    /// Scheduled and similar conditions.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub conditions: Vec<Condition>,
    /// The ConfigMaps and Secrets the current attempt runs with, as its
    /// robot reported them.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub config: Option<TaskConfigStatus>,
    /// Files the task's attempts left for the cluster (`outputs`), each
    /// with where it is in the bucket and how its upload stands.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    #[schemars(length(max = 100))]
    pub outputs: Vec<OutputStatus>,
}

/// One output file of one attempt.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct OutputStatus {
    /// The attempt that wrote it.
    pub attempt: u32,
    /// The file, relative to the task's working directory.
    pub path: String,
    /// Its object in the bucket.
    #[serde(default, skip_serializing_if = "String::is_empty")]
    pub key: String,
    /// Its size in bytes.
    pub size: u64,
    /// Its sha256 (hex), as the robot read it before sending it; the
    /// object carries it too (`x-amz-meta-sha256`).
    pub sha256: String,
    pub state: OutputState,
    /// Why it was dropped, or what holds it.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub message: Option<String>,
    /// When it reached this state.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub time: Option<Timestamp>,
}

/// Where an output's upload stands.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
pub enum OutputState {
    /// Its parts are being sent.
    #[default]
    Uploading,
    /// Whole in the bucket.
    Uploaded,
    /// Given up: `message` says why.
    Dropped,
}

/// What configuration from ConfigMaps and Secrets an attempt runs with
/// (names and versions only, never a value).
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct TaskConfigStatus {
    /// The objects at their versions, in one line
    /// (`ConfigMap/calibration@1042,Secret/fleet-keys@977`).
    #[serde(default)]
    pub versions: String,
    /// The same, one by one.
    #[serde(default)]
    pub sources: Vec<crate::config_ref::ConfigSource>,
    /// The last change the robot applied (0: none since the dispatch).
    #[serde(default)]
    pub generation: u64,
    /// What the robot did with the last change. Written as null when a
    /// report has none (the status is merge-patched: nothing of an earlier
    /// report stays).
    #[serde(default)]
    pub message: Option<String>,
}

impl TaskStatus {
    /// Whether the current attempt is being evicted (`k8s4r drain`): its
    /// robot is asked to stop it, and the task then waits for another
    /// robot without using a retry.
    pub fn eviction_requested(&self) -> bool {
        self.eviction
            .as_ref()
            .is_some_and(|e| !e.noop && e.attempt >= self.attempt && self.attempt > 0)
    }

    /// Whether the current attempt is cancelled: a cancel covers the
    /// attempt it was made at and the ones before; a retry made after it
    /// starts anew.
    pub fn cancel_requested(&self) -> bool {
        let Some(cancel) = self.cancellation.as_ref().filter(|c| !c.noop) else {
            return false;
        };
        let retried = self
            .retry
            .as_ref()
            .is_some_and(|r| !r.noop && r.at >= cancel.at && r.attempt >= cancel.attempt);
        cancel.attempt >= self.attempt && !retried
    }
}

/// A person's retry or cancel (an annotation), as the manager acted on it.
/// The same annotation value acts once.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct ManualAction {
    /// The annotation's value.
    pub value: String,
    /// Who asked: the `robot.k8s4r.io/requested-by` annotation (`k8s4r
    /// retry|cancel` set it to the user), else the field manager that wrote
    /// the annotation (e.g. `kubectl-annotate`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub by: Option<String>,
    /// When the manager acted on it.
    pub at: Timestamp,
    /// The attempt it acted at (a Task's), 0 for a Job or TaskGroup. A
    /// Task's retry budget counts the attempts after it; a retry that did
    /// nothing (`noop`) keeps the attempt of the retry before it (0 if
    /// none), so that it neither resets nor loses that budget.
    #[serde(default)]
    pub attempt: u32,
    /// What it did, for a person.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub message: Option<String>,
    /// It found nothing to do (retrying a running task, cancelling a
    /// finished one): recorded so that the value acts once, but it neither
    /// cancels nor lifts a cancel.
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub noop: bool,
}

/// A robot's restarts of one attempt (`restart`), as the Task's status
/// and the robot's status updates carry them.
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct RestartStatus {
    /// How often the robot restarted the attempt's process.
    #[serde(default, skip_serializing_if = "is_zero")]
    pub restart_count: u32,
    /// The exit code of the process the last restart replaced.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub last_exit_code: Option<i32>,
    /// When the robot last restarted it.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub last_restart_time: Option<Timestamp>,
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
    /// What the status said about it when it ended.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub message: Option<String>,
    /// When it started on its robot (none for one that never started).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub start_time: Option<Timestamp>,
    /// When it ended.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub finish_time: Option<Timestamp>,
}

impl AttemptRecord {
    /// The record of `status`'s current attempt, ended in `state` for
    /// `reason`, at its finish time or else `now`.
    pub fn of_current(
        status: &TaskStatus,
        state: TaskState,
        reason: Option<TaskReason>,
        now: Timestamp,
    ) -> Self {
        AttemptRecord {
            attempt: status.attempt,
            robot: status.robot.clone(),
            state,
            exit_code: status.exit_code,
            reason,
            message: status.message.clone(),
            start_time: status.start_time,
            finish_time: status.finish_time.or(Some(now)),
        }
    }
}

/// The highest attempt of a Task that may have reached its robot, from its
/// annotations: the one the server recorded it was about to publish, or
/// the one whose publish the broker acknowledged. A cancel of an attempt
/// at or below it must go to the robot and wait for its report.
pub fn sent_attempt(annotations: Option<&std::collections::BTreeMap<String, String>>) -> u32 {
    let read = |key: &str| {
        annotations
            .and_then(|a| a.get(key))
            .and_then(|v| v.parse::<u32>().ok())
            .unwrap_or(0)
    };
    read(crate::names::ANNOTATION_SENDING_ATTEMPT).max(read(crate::names::ANNOTATION_DISPATCHED_ATTEMPT))
}

/// A compact handle on one attempt of one task.
#[derive(Clone, Debug, PartialEq, Eq, Hash, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct TaskAttempt {
    /// The Task's metadata.uid.
    pub uid: String,
    /// The attempt number.
    pub attempt: u32,
    /// The Task's `namespace/name`, as its dispatch gave it: a server whose
    /// cache lacks the uid reads the Task by this name before it cancels
    /// the attempt (agents before this field leave it out).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub name: Option<String>,
}

impl TaskAttempt {
    /// Attempt `attempt` of the Task with uid `uid`, without its name.
    pub fn new(uid: impl Into<String>, attempt: u32) -> Self {
        Self {
            uid: uid.into(),
            attempt,
            name: None,
        }
    }

    /// The same attempt, naming its Task (`namespace/name`).
    pub fn named(self, name: Option<String>) -> Self {
        Self { name, ..self }
    }
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
    /// Cancelled by a person.
    #[serde(default)]
    pub cancelled: i32,
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
            TaskState::Cancelled => self.cancelled += 1,
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
        self.cancelled += other.cancelled;
    }
}

fn is_zero(n: &u32) -> bool {
    *n == 0
}
