//! The Robot resource: one robot of the fleet (cluster-scoped, like a Node).

use std::collections::BTreeMap;

use jiff::Timestamp;
use schemars::JsonSchema;
use serde::{Deserialize, Serialize};

use crate::condition::Condition;
use crate::quantity::Quantity;

/// What a person may say about a robot. Everything the robot reports about
/// itself is in the status.
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize, JsonSchema)]
#[cfg_attr(
    feature = "kube",
    derive(kube::CustomResource),
    kube(
        group = "robot.k8s4r.io",
        version = "v1alpha1",
        kind = "Robot",
        plural = "robots",
        shortname = "rbt",
        category = "k8s4r",
        status = "RobotStatus",
        doc = "A robot of the fleet, registered by its agent over MQTT.",
        printcolumn(name = "Phase", type_ = "string", json_path = ".status.phase"),
        printcolumn(
            name = "Connected",
            type_ = "string",
            json_path = ".status.conditions[?(@.type==\"Connected\")].status",
            description = "Whether the robot is connected to the broker now (the Connected condition)."
        ),
        printcolumn(
            name = "Schedulable",
            type_ = "boolean",
            json_path = ".status.schedulable",
            description = "False while the robot is cordoned (spec.unschedulable)."
        ),
        printcolumn(name = "Arch", type_ = "string", json_path = ".status.device.arch"),
        printcolumn(name = "Running", type_ = "integer", json_path = ".status.allocated.tasks"),
        printcolumn(
            name = "Agent",
            type_ = "string",
            json_path = ".status.agentVersion",
            priority = "1"
        ),
        printcolumn(
            name = "Drivers",
            type_ = "string",
            json_path = ".status.drivers",
            description = "The task drivers the robot's agent offers.",
            priority = "1"
        ),
        printcolumn(
            name = "Facts",
            type_ = "string",
            json_path = ".status.shownFacts",
            priority = "1"
        ),
        printcolumn(
            name = "Heartbeat",
            type_ = "date",
            json_path = ".status.lastHeartbeatTime",
            description = "When the server last recorded a heartbeat: refreshed at most every 4 minutes while the robot holds work and every 30 minutes while it holds none (the server's --heartbeat-refresh and --idle-heartbeat-refresh), unless something else changes; REFRESH says which. CONNECTED and PHASE are current."
        ),
        printcolumn(
            name = "Refresh",
            type_ = "string",
            json_path = ".status.heartbeatRefresh",
            description = "How far HEARTBEAT may lag the robot's last heartbeat while it is Online: the server records one at most this often unless something else changes (4m while the robot holds work, 30m while it holds none). An Offline robot's HEARTBEAT is its Lease's last renewal (within a minute of its last heartbeat while it held work, 10 minutes while it held none)."
        ),
        printcolumn(name = "Age", type_ = "date", json_path = ".metadata.creationTimestamp")
    )
)]
#[serde(rename_all = "camelCase")]
pub struct RobotSpec {
    /// When true, no new tasks are scheduled onto this robot (like
    /// `kubectl cordon`); tasks already running keep running.
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub unschedulable: bool,
}

/// The robot's lifecycle phase.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, Serialize, Deserialize, JsonSchema)]
pub enum RobotPhase {
    /// Registered, waiting for approval.
    Pending,
    /// Approved and heartbeating; tasks may be scheduled onto it.
    Online,
    /// Approved, but heartbeats stopped or it disconnected.
    Offline,
    /// Registration refused (for example a wrong bootstrap token).
    Rejected,
}

/// What the robot reported and what the cluster decided about it.
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct RobotStatus {
    /// Pending, Online, Offline or Rejected.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub phase: Option<RobotPhase>,
    /// Why the robot is in its phase, for a person.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub message: Option<String>,
    /// When the server last recorded a heartbeat. Coalesced to save API
    /// writes: rewritten only once it is 240 s old while the robot holds
    /// work (the server's `--heartbeat-refresh`) and 1800 s old while it
    /// holds none (`--idle-heartbeat-refresh`), or sooner when usage or a
    /// condition changed. The Lease of the robot's name in the namespace
    /// `k8s4r-robot-leases` holds a fresher time (renewed every 60 s while
    /// the robot holds work, every 600 s while it holds none);
    /// condition `Connected` and the phase say whether the robot is there
    /// now.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub last_heartbeat_time: Option<Timestamp>,
    /// How often the server records a heartbeat at most while nothing else
    /// changes, as it was when it last did (`4m` while the robot holds
    /// work, `30m` while it holds none): how far `lastHeartbeatTime` may
    /// lag the robot's last heartbeat while it is Online.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub heartbeat_refresh: Option<String>,
    /// When the robot last registered.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub last_registration_time: Option<Timestamp>,
    /// Hardware and operating system, as the agent reported them.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub device: Option<DeviceInfo>,
    /// Resources the robot offers to tasks.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub capacity: Option<RobotResources>,
    /// Resources requested by the tasks assigned to the robot.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub allocated: Option<RobotResources>,
    /// The latest usage figures from a heartbeat.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub usage: Option<Usage>,
    /// Task drivers the agent offers (`exec`, `raw_exec`, `podman`).
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub drivers: Vec<String>,
    /// What the robot lets tasks do, as its agent reported it; the
    /// scheduler places only tasks the robot would accept.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub task_policy: Option<TaskPolicy>,
    /// The agent's version.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub agent_version: Option<String>,
    /// Labels the robot itself reported; the server applies these keys to
    /// metadata.labels and never touches other keys (a person's).
    #[serde(default, skip_serializing_if = "BTreeMap::is_empty")]
    pub reported_labels: BTreeMap<String, String>,
    /// Ready, Connected and similar conditions.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub conditions: Vec<Condition>,
    /// False while the robot is cordoned (`spec.unschedulable`: `k8s4r
    /// cordon`, `drain`), true otherwise; written by the manager for the
    /// SCHEDULABLE column, since a spec field left out when false prints
    /// nothing. The scheduler reads the spec. An Offline robot, or one whose
    /// `AcceptingTasks` condition is False, takes no new tasks either.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub schedulable: Option<bool>,
    /// The robot's own state as its agent last reported it (battery,
    /// docked, e-stop, ...): what tasks' `when` conditions read.
    #[serde(default, skip_serializing_if = "BTreeMap::is_empty")]
    pub facts: crate::facts::Facts,
    /// The facts the Robot's `robot.k8s4r.io/show-facts` label names, as
    /// `battery=80 docked=true` (the FACTS column of `-o wide`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub shown_facts: Option<String>,
    /// Where the robot's last agent upgrade stands, as its agent reported
    /// it.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub agent_upgrade: Option<AgentUpgradeStatus>,
}

/// A robot's account of its last agent upgrade.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct AgentUpgradeStatus {
    /// The AgentRollout that asked for it.
    pub rollout: String,
    /// The version it was to run.
    pub version: String,
    pub phase: crate::agent_rollout::RobotUpgradePhase,
    /// Why it failed or was rolled back.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub reason: Option<String>,
    /// When the server recorded this phase.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub since: Option<Timestamp>,
}

/// Hardware and operating system of a robot.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct DeviceInfo {
    /// CPU architecture (`x86_64`, `aarch64`, `arm`).
    pub arch: String,
    /// Operating system (`linux`).
    pub os: String,
    /// Distribution and version, e.g. `Debian GNU/Linux 12`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub os_version: Option<String>,
    /// Kernel version.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub kernel: Option<String>,
    /// Host name.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub hostname: Option<String>,
    /// Logical CPUs.
    pub cpus: u32,
    /// Total memory in bytes.
    pub memory_bytes: u64,
    /// Total size of the disk holding the agent's state dir, in bytes.
    #[serde(default)]
    pub disk_bytes: u64,
}

/// CPU, memory and task count, for capacity and allocation.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct RobotResources {
    /// CPU, e.g. "4" or "1500m".
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub cpu: Option<Quantity>,
    /// Memory, e.g. "8Gi".
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub memory: Option<Quantity>,
    /// Number of tasks (capacity: the most the robot runs at once, 0 when
    /// it reported no limit; allocated: those assigned to it).
    #[serde(default)]
    pub tasks: u32,
}

/// What a robot lets its tasks do and how much of it they may take:
/// reported by its agent at registration, from the robot's own
/// configuration (which alone decides; the scheduler only avoids sending
/// what the robot would refuse).
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct TaskPolicy {
    /// The most tasks the robot runs at once (its `max_tasks`; 0: no limit).
    #[serde(default)]
    pub max_tasks: u32,
    /// Disk the robot gives its task directories in all (its
    /// `disk_budget`), against which tasks' `resources.disk` is counted.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub disk_budget: Option<Quantity>,
    /// Tasks may run as root (`user: root`, or raw_exec under a root agent).
    #[serde(default)]
    pub allow_root: bool,
    /// Users a task may name in `user` (besides root, which `allowRoot`
    /// governs).
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub allowed_users: Vec<String>,
    /// Groups a task may name in `groups`.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub allowed_groups: Vec<String>,
}

impl TaskPolicy {
    /// Why a task with this `user` and these `groups` would be refused, if
    /// it would. `runs_as_root` says whether the task would end up root.
    pub fn refusal(&self, user: Option<&str>, groups: &[String], runs_as_root: bool) -> Option<String> {
        if runs_as_root && !self.allow_root {
            return Some("the robot does not run tasks as root (allow_root = false)".to_owned());
        }
        if let Some(user) = user.filter(|u| *u != "root") {
            if !self.allowed_users.iter().any(|a| a == user) {
                return Some(format!(
                    "the robot does not allow user {user:?} (allowed_users: {})",
                    list_or_none(&self.allowed_users)
                ));
            }
        }
        let refused: Vec<&str> = groups
            .iter()
            .filter(|g| !self.allowed_groups.contains(g))
            .map(String::as_str)
            .collect();
        if !refused.is_empty() {
            return Some(format!(
                "the robot does not allow group(s) {} (allowed_groups: {})",
                refused.join(", "),
                list_or_none(&self.allowed_groups)
            ));
        }
        None
    }
}

fn list_or_none(items: &[String]) -> String {
    if items.is_empty() {
        "none".to_owned()
    } else {
        items.join(", ")
    }
}

/// The agent's own state, in every heartbeat: whether it can take tasks
/// and how full it is. The server turns `acceptingTasks` into the Robot's
/// `AcceptingTasks` condition; the scheduler skips a robot whose condition
/// is False.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct AgentHealth {
    /// The agent takes new tasks.
    pub accepting_tasks: bool,
    /// Why not, as a CamelCase word (see [`AgentHealth::reason`]).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub reason: Option<String>,
    /// Why not, for a person.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub message: Option<String>,
    /// Attempts the supervisor holds (fetching or running).
    #[serde(default)]
    pub tasks: u32,
    /// Bytes the task directories take on disk (at the last measurement).
    #[serde(default)]
    pub disk_used_bytes: u64,
    /// Bytes of task output not logged since the agent started, because
    /// the disk could not keep up: only agents that wrote their tasks'
    /// output themselves dropped any. Tasks now write their log files
    /// themselves, and agents report 0.
    #[serde(default)]
    pub dropped_output_bytes: u64,
}

/// Reasons of [`AgentHealth`] (and of the `AcceptingTasks` condition).
impl AgentHealth {
    /// Everything is fine.
    pub const REASON_READY: &'static str = "Ready";
    /// The task supervisor has stopped; the agent is about to exit.
    pub const REASON_SUPERVISOR_STOPPED: &'static str = "SupervisorStopped";
    /// The disk holding the agent's state is full (below its reserve).
    pub const REASON_DISK_FULL: &'static str = "DiskFull";
    /// The state journal cannot be written: a task started now could not
    /// be settled after a crash.
    pub const REASON_JOURNAL_FAILING: &'static str = "JournalFailing";
    /// The agent is shutting down.
    pub const REASON_SHUTTING_DOWN: &'static str = "ShuttingDown";
    /// It takes tasks, but its facts file or command was refused: its
    /// facts are unknown.
    pub const REASON_FACTS_REFUSED: &'static str = "FactsRefused";
}

/// Usage figures a heartbeat carries.
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct Usage {
    /// CPU busy, percent of all CPUs (0-100).
    pub cpu_percent: f64,
    /// Memory in use, bytes.
    pub memory_used_bytes: u64,
    /// Memory in all, bytes.
    pub memory_total_bytes: u64,
    /// Free space on the disk of the agent's state dir, bytes.
    pub disk_free_bytes: u64,
    /// Load average over 1 minute.
    pub load1: f64,
    /// Load average over 5 minutes.
    pub load5: f64,
    /// Load average over 15 minutes.
    pub load15: f64,
}

impl Usage {
    /// Whether `new` moved enough from these figures to be worth telling
    /// the cluster: CPU by 20 points, memory in use by 10% of the total,
    /// free disk by 10% (or to or from zero), or another memory total. The
    /// server writes usage to the Robot by this rule, and an agent leaves
    /// usage out of its heartbeats by it.
    pub fn moved_materially(&self, new: &Usage) -> bool {
        let cpu = (self.cpu_percent - new.cpu_percent).abs() >= 20.0;
        let total = new.memory_total_bytes.max(self.memory_total_bytes).max(1) as f64;
        let memory = (self.memory_used_bytes as f64 - new.memory_used_bytes as f64).abs() / total >= 0.10;
        let disk = if self.disk_free_bytes == 0 || new.disk_free_bytes == 0 {
            self.disk_free_bytes != new.disk_free_bytes
        } else {
            (self.disk_free_bytes as f64 - new.disk_free_bytes as f64).abs() / self.disk_free_bytes as f64
                >= 0.10
        };
        cpu || memory || disk || self.memory_total_bytes != new.memory_total_bytes
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_policy_says_what_it_refuses() {
        let policy = TaskPolicy {
            allowed_users: vec!["robot".into()],
            allowed_groups: vec!["dialout".into(), "video".into()],
            ..TaskPolicy::default()
        };
        assert_eq!(policy.refusal(None, &[], false), None);
        assert_eq!(policy.refusal(Some("robot"), &["video".into()], false), None);
        let root = policy.refusal(Some("root"), &[], true).unwrap();
        assert!(root.contains("allow_root = false"), "{root}");
        let user = policy.refusal(Some("postgres"), &[], false).unwrap();
        assert!(user.contains("\"postgres\"") && user.contains("robot"), "{user}");
        let groups = policy
            .refusal(None, &["dialout".into(), "disk".into(), "shadow".into()], false)
            .unwrap();
        assert!(groups.contains("disk, shadow"), "{groups}");
        let open = TaskPolicy {
            allow_root: true,
            ..TaskPolicy::default()
        };
        assert_eq!(open.refusal(Some("root"), &[], true), None);
        assert!(open
            .refusal(None, &["dialout".into()], false)
            .unwrap()
            .contains("none"));
    }
}
