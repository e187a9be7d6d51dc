//! The Job and TaskGroup resources: what people submit, and its fan-out.

use jiff::Timestamp;
use schemars::JsonSchema;
use serde::{Deserialize, Serialize};

use crate::condition::Condition;
use crate::disconnect::DisconnectPolicy;
use crate::selector::{Constraint, LabelSelector};
use crate::task::{RestartPolicy, TaskCounts, TaskTemplate};

/// A batch of work for the fleet: one or more groups of identical tasks.
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize, JsonSchema)]
#[cfg_attr(
    feature = "kube",
    derive(kube::CustomResource),
    kube(
        group = "robot.k8s4r.io",
        version = "v1alpha1",
        kind = "Job",
        plural = "jobs",
        shortname = "rjob",
        category = "k8s4r",
        namespaced,
        status = "JobStatus",
        doc = "A batch of work for the fleet: groups of tasks run on chosen robots.",
        printcolumn(name = "State", type_ = "string", json_path = ".status.state"),
        printcolumn(name = "Completions", type_ = "string", json_path = ".status.completions"),
        printcolumn(name = "Running", type_ = "integer", json_path = ".status.counts.running"),
        printcolumn(name = "Failed", type_ = "integer", json_path = ".status.counts.failed"),
        printcolumn(name = "Age", type_ = "date", json_path = ".metadata.creationTimestamp")
    )
)]
#[serde(rename_all = "camelCase")]
pub struct JobSpec {
    /// Robots every task of the job may run on, by label.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub robot_selector: Option<LabelSelector>,
    /// Placement rules over robot attributes for every task of the job.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub constraints: Vec<Constraint>,
    /// The groups of tasks.
    pub task_groups: Vec<TaskGroupTemplate>,
    /// Scheduling priority (higher first).
    #[serde(default)]
    pub priority: i32,
}

/// One group of a Job: `count` copies of one task.
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct TaskGroupTemplate {
    /// The group's name, unique within the job (a DNS label).
    pub name: String,
    /// How many tasks to run.
    pub count: i32,
    /// The task each of them runs.
    pub task: TaskTemplate,
    /// Robots this group's tasks may run on, in addition to the job's selector.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub robot_selector: Option<LabelSelector>,
    /// Placement rules for this group, in addition to the job's.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub constraints: Vec<Constraint>,
    /// Retries of failed tasks.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub restart_policy: Option<RestartPolicy>,
    /// What happens to the group's tasks when their robot loses the cluster.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub disconnect: Option<DisconnectPolicy>,
}

/// The lifecycle state of a Job or TaskGroup.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub enum WorkState {
    /// No task has started yet.
    Pending,
    /// Some task is dispatching or running, or waiting for a retry.
    Running,
    /// Every task completed.
    Completed,
    /// Some task failed for good.
    Failed,
}

impl WorkState {
    /// The state of a set of tasks of which `expected` should exist.
    ///
    /// Failed wins as soon as one task failed for good and nothing else runs;
    /// completed needs every expected task completed.
    pub fn of(counts: &TaskCounts, expected: i32) -> WorkState {
        let active = counts.dispatching + counts.running;
        if counts.failed > 0 && active == 0 && counts.pending == 0 {
            WorkState::Failed
        } else if counts.completed >= expected && counts.total >= expected && counts.failed == 0 {
            WorkState::Completed
        } else if active > 0 || counts.completed > 0 || counts.failed > 0 {
            WorkState::Running
        } else {
            WorkState::Pending
        }
    }

    /// Completed or Failed.
    pub fn is_finished(self) -> bool {
        matches!(self, WorkState::Completed | WorkState::Failed)
    }
}

/// What the job's groups are doing.
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct JobStatus {
    /// pending, running, completed or failed.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub state: Option<WorkState>,
    /// Completed tasks out of all, e.g. "3/5".
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub completions: Option<String>,
    /// Tasks per state over every group.
    #[serde(default)]
    pub counts: TaskCounts,
    /// One summary per group.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub groups: Vec<GroupSummary>,
    /// When the first task started.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub start_time: Option<Timestamp>,
    /// When the job completed or failed.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub completion_time: Option<Timestamp>,
    /// The generation this status was computed from.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub observed_generation: Option<i64>,
    /// Complete, Failed and similar conditions.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub conditions: Vec<Condition>,
}

/// A group's line in its Job's status.
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct GroupSummary {
    /// The group's name.
    pub name: String,
    /// Its TaskGroup object.
    pub task_group: String,
    /// Its state.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub state: Option<WorkState>,
    /// Its tasks per state.
    #[serde(default)]
    pub counts: TaskCounts,
}

/// One group of a Job, as its own object (owned by the Job).
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize, JsonSchema)]
#[cfg_attr(
    feature = "kube",
    derive(kube::CustomResource),
    kube(
        group = "robot.k8s4r.io",
        version = "v1alpha1",
        kind = "TaskGroup",
        plural = "taskgroups",
        shortname = "rtg",
        category = "k8s4r",
        namespaced,
        status = "TaskGroupStatus",
        doc = "One group of a Job: count copies of one task.",
        printcolumn(name = "State", type_ = "string", json_path = ".status.state"),
        printcolumn(name = "Count", type_ = "integer", json_path = ".spec.count"),
        printcolumn(name = "Completions", type_ = "string", json_path = ".status.completions"),
        printcolumn(name = "Running", type_ = "integer", json_path = ".status.counts.running"),
        printcolumn(name = "Failed", type_ = "integer", json_path = ".status.counts.failed"),
        printcolumn(name = "Age", type_ = "date", json_path = ".metadata.creationTimestamp")
    )
)]
#[serde(rename_all = "camelCase")]
pub struct TaskGroupSpec {
    /// The group as the Job declares it, with the job's selector and
    /// constraints already merged in.
    #[serde(flatten)]
    pub template: TaskGroupTemplate,
    /// The owning job's name.
    pub job: String,
    /// Scheduling priority, from the job.
    #[serde(default)]
    pub priority: i32,
}

/// What the group's tasks are doing.
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct TaskGroupStatus {
    /// pending, running, completed or failed.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub state: Option<WorkState>,
    /// Completed tasks out of all, e.g. "3/5".
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub completions: Option<String>,
    /// Tasks per state.
    #[serde(default)]
    pub counts: TaskCounts,
    /// Robots the group's tasks are assigned to.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub robots: Vec<String>,
    /// The generation this status was computed from.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub observed_generation: Option<i64>,
    /// Conditions.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub conditions: Vec<Condition>,
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::task::TaskState;

    fn counts(states: &[TaskState]) -> TaskCounts {
        let mut c = TaskCounts::default();
        for s in states {
            c.add(Some(*s));
        }
        c
    }

    #[test]
    fn work_state_aggregates_tasks() {
        use TaskState::*;
        assert_eq!(WorkState::of(&counts(&[]), 2), WorkState::Pending);
        assert_eq!(WorkState::of(&counts(&[Pending, Pending]), 2), WorkState::Pending);
        assert_eq!(WorkState::of(&counts(&[Running, Pending]), 2), WorkState::Running);
        assert_eq!(
            WorkState::of(&counts(&[Completed, Pending]), 2),
            WorkState::Running
        );
        assert_eq!(
            WorkState::of(&counts(&[Completed, Completed]), 2),
            WorkState::Completed
        );
        assert_eq!(
            WorkState::of(&counts(&[Completed]), 2),
            WorkState::Running,
            "one task still to be created"
        );
        assert_eq!(WorkState::of(&counts(&[Failed, Running]), 2), WorkState::Running);
        assert_eq!(WorkState::of(&counts(&[Failed, Completed]), 2), WorkState::Failed);
        assert_eq!(
            WorkState::of(&counts(&[]), 0),
            WorkState::Completed,
            "an empty group is done"
        );
    }
}
