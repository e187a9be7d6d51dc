//! The contract shared by every k8s4r program: the resource types (Robot,
//! Job, TaskGroup, Task), the MQTT protocol and spec validation.
//!
//! Without the `kube` feature this crate is plain serde types and depends on
//! nothing heavier than serde and schemars, so the robot agent can link it
//! and still cross-build with rustc 1.85. With `kube`, the same types gain
//! their `CustomResource` roots (`Robot`, `Job`, `TaskGroup`, `Task`) and
//! [`crd`] renders the CRD YAML.

// kube-derive takes one `printcolumn(..)` per column; clippy reads their
// repeated `type_ = ".."` keys as duplicated attributes.
#![allow(clippy::duplicated_attributes)]

pub mod agent_rollout;
pub mod backoff;
pub mod condition;
pub mod config_ref;
pub mod config_resolve;
pub mod container;
pub mod disconnect;
pub mod duration;
pub mod facts;
pub mod job;
pub mod log_frame;
#[cfg(feature = "logging")]
pub mod logging;
pub mod names;
pub mod output;
pub mod periodic;
pub mod protocol;
pub mod quantity;
pub mod robot;
pub mod selector;
pub mod task;
pub mod task_kind;
pub mod validation;

#[cfg(feature = "kube")]
pub mod crd;

/// The API group of every k8s4r resource.
pub const GROUP: &str = "robot.k8s4r.io";
/// The API version of every k8s4r resource.
pub const VERSION: &str = "v1alpha1";

pub use agent_rollout::{
    AgentArtifact, AgentRolloutSpec, AgentRolloutStatus, MaintenanceWindow, RobotUpgrade, RobotUpgradePhase,
    RolloutState, WaitForTasks,
};
pub use condition::{Condition, ConditionStatus};
pub use disconnect::{DisconnectPolicy, Reconcile};
pub use duration::{parse_duration, parse_spec_duration, DurationError, DurationString};
pub use facts::{FactOperator, FactRequirement, FactValue, Facts, WhileRunning};
pub use job::{
    CountOrPercent, GroupMode, GroupSummary, JobSpec, JobStatus, Rollout, TaskGroupSpec, TaskGroupStatus,
    TaskGroupTemplate, WorkState,
};
pub use periodic::{ConcurrencyPolicy, JobTemplate, PeriodicJobSpec, PeriodicJobStatus};
pub use quantity::{Quantity, QuantityError};
pub use robot::{
    AgentHealth, AgentUpgradeStatus, DeviceInfo, RobotPhase, RobotResources, RobotSpec, RobotStatus,
    TaskPolicy, Usage,
};
pub use selector::{
    AntiAffinity, Constraint, ConstraintOperator, LabelSelector, LabelSelectorRequirement, SelectorOperator,
    WeightedAffinity,
};
pub use task::{
    Artifact, AttemptRecord, EnvVar, ExecCheck, HealthCheck, HttpCheck, LocalRestart, LocalRestartMode,
    ManualAction, OutputState, OutputStatus, PreStop, RestartMode, RestartPolicy, RestartStatus, StopSignal,
    TaskAttempt, TaskConfigStatus, TaskCounts, TaskReason, TaskResources, TaskSpec, TaskState, TaskStatus,
    TaskTemplate, TcpCheck,
};
pub use task_kind::TaskKind;

#[cfg(feature = "kube")]
pub use agent_rollout::AgentRollout;
#[cfg(feature = "kube")]
pub use job::{Job, TaskGroup};
#[cfg(feature = "kube")]
pub use periodic::PeriodicJob;
#[cfg(feature = "kube")]
pub use robot::Robot;
#[cfg(feature = "kube")]
pub use task::Task;
