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
        printcolumn(name = "Arch", type_ = "string", json_path = ".status.device.arch"),
        printcolumn(name = "Running", type_ = "integer", json_path = ".status.allocated.tasks"),
        printcolumn(
            name = "Agent",
            type_ = "string",
            json_path = ".status.agentVersion",
            priority = "1"
        ),
        printcolumn(name = "Heartbeat", type_ = "date", json_path = ".status.lastHeartbeatTime"),
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
    /// When the server last recorded a heartbeat (coalesced: see the server's
    /// write budget; the Lease of the robot's name in the namespace
    /// `k8s4r-robot-leases` holds the precise renew time).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub last_heartbeat_time: Option<Timestamp>,
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
    /// Task drivers the agent offers (`exec`, `raw_exec`).
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub drivers: Vec<String>,
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
    /// Number of tasks.
    #[serde(default)]
    pub tasks: u32,
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
