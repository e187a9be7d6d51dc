//! Configuration a task takes from ConfigMaps and Secrets: the references a
//! task template makes, in Kubernetes's own shapes. How they resolve for a
//! robot is [`crate::config_resolve`].

use std::fmt;

use schemars::JsonSchema;
use serde::{Deserialize, Serialize};

/// Kubernetes's bound on a ConfigMap's or Secret's data.
pub const MAX_OBJECT_BYTES: usize = 1024 * 1024;
/// The most configuration (values and file contents) one task may take:
/// it travels in the dispatch (base64 for files), which the broker bounds
/// at 256 KiB.
pub const MAX_TASK_CONFIG_BYTES: usize = 128 * 1024;
/// The placeholder a reference's object name or key may hold: the name of
/// the robot the task is placed on.
pub const ROBOT_PLACEHOLDER: &str = "$(K8S4R_ROBOT_ID)";
/// Default mode of a file from a ConfigMap.
pub const CONFIG_MAP_FILE_MODE: u32 = 0o644;
/// Default mode of a file from a Secret.
pub const SECRET_FILE_MODE: u32 = 0o400;

/// Where an environment variable's value comes from (exactly one).
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct EnvVarSource {
    /// A key of a ConfigMap in the task's namespace.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub config_map_key_ref: Option<KeySelector>,
    /// A key of a Secret in the task's namespace.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub secret_key_ref: Option<KeySelector>,
}

/// One key of a ConfigMap or Secret.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct KeySelector {
    /// The object's name; `$(K8S4R_ROBOT_ID)` in it stands for the robot's
    /// name.
    pub name: String,
    /// The key; `$(K8S4R_ROBOT_ID)` in it stands for the robot's name.
    pub key: String,
    /// When true, a missing object or key leaves the variable unset instead
    /// of keeping the task from the robot.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub optional: Option<bool>,
}

/// Every key of a ConfigMap or Secret as environment variables.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct EnvFromSource {
    /// Put before each key to make the variable's name.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub prefix: Option<String>,
    /// A ConfigMap in the task's namespace.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub config_map_ref: Option<ObjectSelector>,
    /// A Secret in the task's namespace.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub secret_ref: Option<ObjectSelector>,
}

/// A whole ConfigMap or Secret.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct ObjectSelector {
    /// The object's name; `$(K8S4R_ROBOT_ID)` in it stands for the robot's
    /// name.
    pub name: String,
    /// When true, a missing object is as if empty.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub optional: Option<bool>,
}

/// Files written from a ConfigMap or a Secret (exactly one) into a
/// directory under the task's directory before it starts, owned by the
/// task's user.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct ConfigFiles {
    /// The directory, relative to the task's directory (no `..`).
    #[schemars(length(min = 1, max = 1024))]
    pub path: String,
    /// Files from a ConfigMap (default mode 0644).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub config_map: Option<ConfigMapFiles>,
    /// Files from a Secret (default mode 0400).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub secret: Option<SecretFiles>,
}

/// A ConfigMap's keys as files (Kubernetes's `ConfigMapVolumeSource`).
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct ConfigMapFiles {
    /// The ConfigMap's name (`$(K8S4R_ROBOT_ID)` allowed).
    pub name: String,
    /// The keys to write, each to its own path; unset: every key, each to
    /// a file named after it.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub items: Vec<KeyToPath>,
    /// Mode of the files (an integer: 0644 in YAML, 420 in JSON).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub default_mode: Option<u32>,
    /// When true, a missing object or key writes nothing instead of keeping
    /// the task from the robot.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub optional: Option<bool>,
}

/// A Secret's keys as files (Kubernetes's `SecretVolumeSource`).
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct SecretFiles {
    /// The Secret's name (`$(K8S4R_ROBOT_ID)` allowed).
    pub secret_name: String,
    /// The keys to write, each to its own path; unset: every key.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub items: Vec<KeyToPath>,
    /// Mode of the files (default 0400: only the task's user reads them).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub default_mode: Option<u32>,
    /// When true, a missing object or key writes nothing.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub optional: Option<bool>,
}

/// One key written to one file.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct KeyToPath {
    /// The key (`$(K8S4R_ROBOT_ID)` allowed).
    pub key: String,
    /// The file, relative to the files' directory (no `..`).
    pub path: String,
    /// Its mode; unset: the files' `defaultMode`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub mode: Option<u32>,
}

/// A ConfigMap or a Secret.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, Hash, Serialize, Deserialize, JsonSchema)]
pub enum ObjectKind {
    ConfigMap,
    Secret,
}

impl fmt::Display for ObjectKind {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(match self {
            ObjectKind::ConfigMap => "ConfigMap",
            ObjectKind::Secret => "Secret",
        })
    }
}

/// Whether `name` may name an environment variable taken from a key.
pub fn is_env_name(name: &str) -> bool {
    !name.is_empty() && !name.contains(['=', '\0'])
}

/// What a running service does when a ConfigMap or Secret it takes
/// changes (its files are rewritten first in every case). Batch tasks keep
/// the values they started with.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub enum OnConfigChange {
    /// Files rewritten in place, nothing else: variables keep their values
    /// until the process starts again (Kubernetes's volumes).
    #[default]
    None,
    /// The process is stopped (its stop signal, `killTimeout`) and started
    /// again with the new values: a rolling restart, no more of the group
    /// at once than its `maxParallel` (default 1).
    Restart,
    /// `configChangeSignal` (default SIGHUP) is sent to its process group,
    /// for software that reloads its files.
    Signal,
}

impl OnConfigChange {
    /// Whether it is the default (`none`).
    pub fn is_none(&self) -> bool {
        *self == OnConfigChange::None
    }

    /// Its name, as a spec writes it.
    pub fn as_str(&self) -> &'static str {
        match self {
            OnConfigChange::None => "none",
            OnConfigChange::Restart => "restart",
            OnConfigChange::Signal => "signal",
        }
    }
}

/// A ConfigMap or Secret a task's configuration came from, at the version
/// read.
#[derive(Clone, Debug, PartialEq, Eq, PartialOrd, Ord, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct ConfigSource {
    /// ConfigMap or Secret.
    pub kind: ObjectKind,
    /// The object's name (the robot's put in for `$(K8S4R_ROBOT_ID)`).
    pub name: String,
    /// The object's resourceVersion as it was read.
    pub resource_version: String,
}

impl ConfigSource {
    /// The objects' versions in one line, in a fixed order (kind, then
    /// name): `ConfigMap/calibration@1042,Secret/fleet-keys@977`. Two lists
    /// of the same objects at the same versions give the same line.
    pub fn versions(sources: &[ConfigSource]) -> String {
        let mut sorted: Vec<&ConfigSource> = sources.iter().collect();
        sorted.sort();
        sorted.dedup();
        sorted
            .iter()
            .map(|s| format!("{}/{}@{}", s.kind, s.name, s.resource_version))
            .collect::<Vec<_>>()
            .join(",")
    }
}

/// The manager's request that a running attempt take its configuration
/// again (the annotation [`crate::names::ANNOTATION_CONFIG_REFRESH`], as
/// JSON): the server reads the objects and sends them to the robot.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct ConfigRefresh {
    /// The attempt asked.
    pub attempt: u32,
    /// Increases with each request within the attempt; the robot reports
    /// the one it applied.
    pub generation: u64,
    /// The objects' versions the manager saw ([`ConfigSource::versions`]).
    pub versions: String,
    /// When it was asked: one its robot has not reported after a while is
    /// asked again (a report lost with an agent's restart).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub at: Option<jiff::Timestamp>,
}

impl ConfigRefresh {
    /// The request a Task's annotations carry, if any (a malformed one is
    /// none).
    pub fn of(annotations: Option<&std::collections::BTreeMap<String, String>>) -> Option<Self> {
        let value = annotations?.get(crate::names::ANNOTATION_CONFIG_REFRESH)?;
        serde_json::from_str(value).ok()
    }
}
