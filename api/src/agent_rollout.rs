//! The AgentRollout resource: a new version of the robot agent taken to
//! the robots a selector matches, a few at a time, each robot verifying,
//! staging and switching to it by itself and switching back when the new
//! agent is not confirmed healthy in time (cluster-scoped, like Robot).

use jiff::Timestamp;
use schemars::JsonSchema;
use serde::{Deserialize, Serialize};

use crate::job::CountOrPercent;
use crate::selector::LabelSelector;

/// Which agent to run where, and how carefully.
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize, JsonSchema)]
#[cfg_attr(
    feature = "kube",
    derive(kube::CustomResource),
    kube(
        group = "robot.k8s4r.io",
        version = "v1alpha1",
        kind = "AgentRollout",
        plural = "agentrollouts",
        shortname = "rar",
        category = "k8s4r",
        status = "AgentRolloutStatus",
        doc = "A new version of the robot agent, rolled out to the robots a selector matches.",
        printcolumn(name = "Version", type_ = "string", json_path = ".spec.version"),
        printcolumn(name = "State", type_ = "string", json_path = ".status.state"),
        printcolumn(
            name = "Upgraded",
            type_ = "integer",
            json_path = ".status.upgraded",
            description = "Robots confirmed healthy on the new version."
        ),
        printcolumn(name = "Robots", type_ = "integer", json_path = ".status.robots"),
        printcolumn(name = "Failed", type_ = "integer", json_path = ".status.failed"),
        printcolumn(
            name = "Message",
            type_ = "string",
            json_path = ".status.message",
            priority = "1"
        ),
        printcolumn(name = "Age", type_ = "date", json_path = ".metadata.creationTimestamp")
    )
)]
#[serde(rename_all = "camelCase")]
pub struct AgentRolloutSpec {
    /// The version to run, exactly as `k8s4r-agent --version` prints it
    /// after the program's name (for example `0.2.0`).
    pub version: String,
    /// One binary per architecture (as the Robot's status.device.arch
    /// names it: x86_64, aarch64, arm).
    #[schemars(length(min = 1))]
    pub artifacts: Vec<AgentArtifact>,
    /// The robots it applies to; all robots when empty.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub robot_selector: Option<LabelSelector>,
    /// At most this many robots upgrade at once. Default 1.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(range(min = 1))]
    pub max_parallel: Option<i32>,
    /// Once more robots than this failed or rolled back (a count or a
    /// percentage of the matched robots), the rollout pauses. Default 0.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub max_failed: Option<CountOrPercent>,
    /// How long a robot's new agent has, from its switch, to register and
    /// be confirmed before the robot switches back by itself. Default 2m.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(regex(pattern = r"^([0-9]+(ns|us|µs|ms|s|m|h|d))+$"))]
    pub health_timeout: Option<String>,
    /// No robot starts upgrading while true; those under way finish (on
    /// the robot, an upgrade under way cannot be taken back half done).
    /// Setting it back to false resumes the rollout. To abort one, set the
    /// annotation `robot.k8s4r.io/cancel` or delete it: no robot starts,
    /// and robots already switched finish their trial.
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub paused: bool,
    /// Start conditions on the robot's facts, as a task's `when` (for
    /// example `docked In [true]`, `battery Gt 50`): a robot is ordered
    /// only while its facts meet them, and its agent checks them again
    /// just before it switches (it does not switch otherwise). A robot
    /// that does not meet them waits without holding a place.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    #[schemars(length(max = 16))]
    pub when: Vec<crate::facts::FactRequirement>,
    /// When robots may start upgrading: a cron schedule, how long each
    /// window lasts, and the time zone the schedule is read in. Outside it
    /// no robot starts (those under way finish).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub maintenance_window: Option<MaintenanceWindow>,
    /// Whether a robot's running tasks must end before it upgrades:
    /// `batch` (its running batch tasks; services keep running and are
    /// re-adopted by the new agent), `all`, or `none` (the default). A
    /// robot that waits for its tasks is cordoned meanwhile, so that
    /// nothing new lands there; the rollout uncordons it once its upgrade
    /// ended.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub wait_for_tasks: Option<WaitForTasks>,
}

/// A recurring window in which robots may start upgrading.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct MaintenanceWindow {
    /// When each window opens: a cron schedule (five fields, or six with
    /// seconds), as a PeriodicJob's.
    #[schemars(length(min = 1))]
    pub schedule: String,
    /// How long each window stays open.
    #[schemars(regex(pattern = r"^([0-9]+(ns|us|µs|ms|s|m|h|d))+$"))]
    pub duration: String,
    /// The IANA time zone the schedule is read in (default UTC).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub time_zone: Option<String>,
}

/// Which of a robot's running tasks must end before it upgrades.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub enum WaitForTasks {
    /// None: services and batch tasks keep running across the switch.
    #[default]
    None,
    /// Its running batch tasks.
    Batch,
    /// All its running tasks, services included.
    All,
}

/// The agent binary for one architecture.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct AgentArtifact {
    /// The architecture it is built for.
    #[schemars(length(min = 1))]
    pub arch: String,
    /// Where robots download it (http or https).
    #[schemars(regex(pattern = r"^https?://"))]
    pub url: String,
    /// Its SHA-256, 64 lowercase hex digits.
    #[schemars(regex(pattern = r"^[0-9a-f]{64}$"))]
    pub sha256: String,
    /// Its minisign signature (the whole `.minisig` file), made by
    /// `k8s4r sign-agent`; robots that pin a key refuse a binary without.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub signature: Option<String>,
}

/// Where a rollout stands.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
pub enum RolloutState {
    /// Robots are being upgraded, or wait their turn.
    Progressing,
    /// A person paused it (spec.paused).
    Paused,
    /// More robots failed than maxFailed allows: no robot starts until a
    /// person raises maxFailed (or makes a new rollout with a fixed
    /// artifact).
    PausedOnFailures,
    /// Every matched robot runs the version.
    Complete,
    /// A person cancelled it (the annotation robot.k8s4r.io/cancel): no
    /// robot starts; robots already switched finish their trial.
    Aborted,
}

/// Where one robot's upgrade stands.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
pub enum RobotUpgradePhase {
    /// Waits its turn (or for the robot to come online).
    Pending,
    /// Asked to upgrade; downloading and verifying.
    Downloading,
    /// Verified and staged beside the running agent.
    Staged,
    /// Switched; the new agent is starting and must be confirmed.
    Restarting,
    /// The new agent is confirmed.
    Healthy,
    /// The new agent was not confirmed in time; the robot switched back.
    RolledBack,
    /// The robot refused the binary (signature, digest, architecture) or
    /// could not download it.
    Failed,
}

/// One robot in a rollout.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct RobotUpgrade {
    /// The Robot's name.
    pub robot: String,
    pub phase: RobotUpgradePhase,
    /// Why it failed or rolled back, or what it waits for.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub reason: Option<String>,
    /// When the phase last changed.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub since: Option<Timestamp>,
}

/// What the manager last saw of a rollout.
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct AgentRolloutStatus {
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub state: Option<RolloutState>,
    /// What it waits for, in a sentence.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub message: Option<String>,
    /// Robots the selector matches.
    #[serde(default)]
    pub robots: i32,
    /// Robots confirmed on the version.
    #[serde(default)]
    pub upgraded: i32,
    /// Robots that failed or rolled back.
    #[serde(default)]
    pub failed: i32,
    /// The matched robots not done (pending, in progress, failed, rolled
    /// back), then those this rollout took to the version (healthy); at
    /// most 1000, the rest counted only.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub robot_upgrades: Vec<RobotUpgrade>,
    /// The generation of the spec this status was made from.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub observed_generation: Option<i64>,
}
