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

pub mod condition;
pub mod duration;
pub mod job;
#[cfg(feature = "logging")]
pub mod logging;
pub mod protocol;
pub mod quantity;
pub mod robot;
pub mod selector;
pub mod task;
pub mod validation;

#[cfg(feature = "kube")]
pub mod crd;

/// The API group of every k8s4r resource.
pub const GROUP: &str = "robot.k8s4r.io";
/// The API version of every k8s4r resource.
pub const VERSION: &str = "v1alpha1";

/// Labels, annotations and finalizers the programs agree on.
pub mod names {
    /// Label on TaskGroups and Tasks: the owning Job's name.
    pub const LABEL_JOB: &str = "robot.k8s4r.io/job";
    /// Label on Tasks: the group's name within its Job.
    pub const LABEL_GROUP: &str = "robot.k8s4r.io/group";
    /// Label on Tasks: the task's index within its group.
    pub const LABEL_INDEX: &str = "robot.k8s4r.io/index";
    /// Finalizer the server holds on a dispatched Task until the robot has
    /// stopped it (or is offline).
    pub const FINALIZER_CANCEL: &str = "robot.k8s4r.io/cancel-on-robot";
    /// Annotation on a Robot: hex SHA-256 of the bootstrap token it last
    /// registered with (the server writes it, the manager checks it).
    pub const ANNOTATION_TOKEN_SHA256: &str = "robot.k8s4r.io/bootstrap-token-sha256";
    /// Annotation on a Task: the highest attempt whose dispatch the broker
    /// acknowledged (the server writes it, the manager's dispatch timeout
    /// reads it).
    pub const ANNOTATION_DISPATCHED_ATTEMPT: &str = "robot.k8s4r.io/dispatched-attempt";
    /// Field manager of the server's writes.
    pub const MANAGER_SERVER: &str = "k8s4r-server";
    /// Field manager of the manager's writes.
    pub const MANAGER_CONTROLLERS: &str = "k8s4r-manager";
}

pub use condition::{Condition, ConditionStatus};
pub use duration::{parse_duration, DurationError, DurationString};
pub use job::{
    GroupSummary, JobSpec, JobStatus, TaskGroupSpec, TaskGroupStatus, TaskGroupTemplate, WorkState,
};
pub use quantity::{Quantity, QuantityError};
pub use robot::{DeviceInfo, RobotPhase, RobotResources, RobotSpec, RobotStatus, Usage};
pub use selector::{
    Constraint, ConstraintOperator, LabelSelector, LabelSelectorRequirement, SelectorOperator,
};
pub use task::{
    Artifact, AttemptRecord, EnvVar, RestartMode, RestartPolicy, TaskAttempt, TaskCounts, TaskReason,
    TaskResources, TaskSpec, TaskState, TaskStatus, TaskTemplate,
};

#[cfg(feature = "kube")]
pub use job::{Job, TaskGroup};
#[cfg(feature = "kube")]
pub use robot::Robot;
#[cfg(feature = "kube")]
pub use task::Task;
