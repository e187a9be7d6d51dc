//! The Job and TaskGroup resources: what people submit, and its fan-out.

use jiff::Timestamp;
use std::borrow::Cow;

use schemars::{JsonSchema, Schema, SchemaGenerator};
use serde::{Deserialize, Serialize};

use crate::condition::Condition;
use crate::disconnect::DisconnectPolicy;
use crate::selector::{AntiAffinity, Constraint, LabelSelector, WeightedAffinity};
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
    /// Groups that run one after another, in this order (a shorthand for
    /// `after` on each of them). Groups not listed start at once.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub order: Vec<String>,
    /// Seconds after the job finished (completed, failed or cancelled)
    /// before it is deleted, with its task groups and tasks; 0 deletes it
    /// as soon as it finishes. Unset: the manager's
    /// --job-ttl-after-finished, if it has one (not for the runs of a
    /// PeriodicJob, which keep to its history limits); else kept.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(range(min = 0))]
    pub ttl_seconds_after_finished: Option<i32>,
    /// Seconds the job may be active, from its start, before it fails
    /// with reason `DeadlineExceeded`: its unfinished tasks are cancelled
    /// (a running one stopped on its robot, as a person's cancel would),
    /// and no new one starts. As a Kubernetes Job's; unset: no limit.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(range(min = 1, max = 31_536_000))]
    pub active_deadline_seconds: Option<i64>,
    /// Seconds a task of the job may wait for a robot (from its creation,
    /// when its retry came due, or a person's retry or eviction of it,
    /// whichever is latest) before it fails for good with
    /// reason `Unschedulable` and the reason no robot fits. Unset: it
    /// waits as long as it takes.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(range(min = 1, max = 31_536_000))]
    pub pending_deadline_seconds: Option<i64>,
}

impl JobSpec {
    /// The groups `group` waits for: its own `after` and, when it is listed
    /// in `order`, the group listed before it.
    pub fn dependencies_of<'a>(&'a self, group: &'a TaskGroupTemplate) -> Vec<&'a str> {
        let mut deps: Vec<&str> = group.after.iter().map(String::as_str).collect();
        if let Some(i) = self.order.iter().position(|g| *g == group.name) {
            if let Some(before) = i.checked_sub(1).and_then(|b| self.order.get(b)) {
                if !deps.contains(&before.as_str()) {
                    deps.push(before);
                }
            }
        }
        deps
    }
}

/// How a group decides how many tasks it runs.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub enum GroupMode {
    /// `count` copies, placed by the scheduler.
    #[default]
    Count,
    /// One task on every approved robot the group's selector and constraints
    /// match, including robots that register while the group runs (Nomad's
    /// sysbatch, a Kubernetes DaemonSet run to completion).
    EveryRobot,
}

impl GroupMode {
    fn is_count(&self) -> bool {
        *self == GroupMode::Count
    }
}

impl TaskGroupTemplate {
    /// The tasks a `count` group runs (none when it says none).
    pub fn count(&self) -> i32 {
        self.count.unwrap_or(0).max(0)
    }
}

/// A number of tasks, or a percentage of the group's robots ("10%").
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(untagged)]
pub enum CountOrPercent {
    /// So many tasks.
    Count(i32),
    /// A percentage such as "25%".
    Percent(String),
}

impl CountOrPercent {
    /// The number of tasks out of `total` (a percentage rounds down);
    /// `None` for a malformed value.
    pub fn of(&self, total: i32) -> Option<i32> {
        match self {
            CountOrPercent::Count(n) if *n >= 0 => Some(*n),
            CountOrPercent::Count(_) => None,
            CountOrPercent::Percent(p) => {
                let pct: i64 = p.strip_suffix('%')?.trim().parse().ok()?;
                if !(0..=100).contains(&pct) {
                    return None;
                }
                i32::try_from(i64::from(total.max(0)) * pct / 100).ok()
            }
        }
    }
}

impl JsonSchema for CountOrPercent {
    fn schema_name() -> Cow<'static, str> {
        "CountOrPercent".into()
    }

    fn json_schema(_: &mut SchemaGenerator) -> Schema {
        schemars::json_schema!({
            "x-kubernetes-int-or-string": true,
            "anyOf": [{"type": "integer"}, {"type": "string"}],
            "description": "A number of tasks, or a percentage of the group's robots such as \"10%\"."
        })
    }

    fn inline_schema() -> bool {
        true
    }
}

/// One group of a Job: `count` copies of one task.
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct TaskGroupTemplate {
    /// The group's name, unique within the job (a DNS label).
    pub name: String,
    /// How many tasks to run: required in mode `count`, left out in mode
    /// `everyRobot`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub count: Option<i32>,
    /// `count` (the default) or `everyRobot`: one task per matching robot.
    #[serde(default, skip_serializing_if = "GroupMode::is_count")]
    pub mode: GroupMode,
    /// everyRobot: at most this many robots run the group's task at once.
    /// A group of services (either mode): at most this many of its tasks
    /// restart at once for a configuration change (`onConfigChange:
    /// restart`; default 1).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub max_parallel: Option<i32>,
    /// everyRobot: once more tasks than this have failed for good (a count
    /// or a percentage of the matched robots), no further robot is started.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub max_failed: Option<CountOrPercent>,
    /// Groups of the same Job that must complete before this one starts.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub after: Vec<String>,
    /// At most one running task of this group per robot (or per value of a
    /// robot label).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub anti_affinity: Option<AntiAffinity>,
    /// Robots this group prefers, with weights.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub affinity: Vec<WeightedAffinity>,
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
    /// Never started: a group it runs after failed or was skipped, or the
    /// Job was cancelled first.
    Skipped,
    /// Cancelled by a person; nothing of it runs any more.
    Cancelled,
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
        } else if counts.cancelled > 0 && active == 0 && counts.pending == 0 {
            WorkState::Cancelled
        } else if counts.completed >= expected && counts.total >= expected && counts.failed == 0 {
            WorkState::Completed
        } else if active > 0 || counts.completed > 0 || counts.failed > 0 || counts.cancelled > 0 {
            WorkState::Running
        } else {
            WorkState::Pending
        }
    }

    /// The lower-case name used in status.
    pub fn as_str(self) -> &'static str {
        match self {
            WorkState::Pending => "pending",
            WorkState::Running => "running",
            WorkState::Completed => "completed",
            WorkState::Failed => "failed",
            WorkState::Skipped => "skipped",
            WorkState::Cancelled => "cancelled",
        }
    }

    /// Completed, Failed, Skipped or Cancelled.
    pub fn is_finished(self) -> bool {
        matches!(
            self,
            WorkState::Completed | WorkState::Failed | WorkState::Skipped | WorkState::Cancelled
        )
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
    /// When its `activeDeadlineSeconds` ran out: its unfinished tasks were
    /// cancelled then, and it fails `DeadlineExceeded` once they ended (a
    /// person's retry runs it again for as long, and clears this).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub deadline_time: Option<Timestamp>,
    /// The generation this status was computed from.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub observed_generation: Option<i64>,
    /// Complete, Failed and similar conditions.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub conditions: Vec<Condition>,
    /// The last `robot.k8s4r.io/retry` acted on (passed to its failed
    /// Tasks).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub retry: Option<crate::task::ManualAction>,
    /// The `robot.k8s4r.io/cancel` acted on (passed to its groups).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub cancellation: Option<crate::task::ManualAction>,
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
    /// Why it has not started: the groups it waits for, or why it was
    /// skipped.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub message: Option<String>,
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
        printcolumn(name = "Desired", type_ = "integer", json_path = ".status.desired"),
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
    /// The job's `pendingDeadlineSeconds`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub pending_deadline_seconds: Option<i64>,
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
    /// How many tasks the group should have (`count`, or the robots an
    /// everyRobot group matched).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub desired: Option<i32>,
    /// everyRobot: how far the rollout over the fleet got.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub rollout: Option<Rollout>,
    /// The generation this status was computed from.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub observed_generation: Option<i64>,
    /// Conditions.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub conditions: Vec<Condition>,
    /// The last `robot.k8s4r.io/retry` acted on (passed to its failed
    /// Tasks).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub retry: Option<crate::task::ManualAction>,
    /// The `robot.k8s4r.io/cancel` acted on (passed to its Tasks).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub cancellation: Option<crate::task::ManualAction>,
}

/// An everyRobot group's progress over the fleet.
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct Rollout {
    /// Robots the group matches (and robots whose task is kept after they
    /// stopped matching).
    pub robots: i32,
    /// Robots whose task was created.
    pub started: i32,
    /// Robots not reached yet.
    pub waiting: i32,
    /// Per robot, the state of its task (at most the first 100 robots by
    /// name; the Tasks, labelled with their robot, show every one).
    #[serde(default, skip_serializing_if = "std::collections::BTreeMap::is_empty")]
    pub per_robot: std::collections::BTreeMap<String, crate::task::TaskState>,
    /// Set when the rollout stopped before reaching every robot, and why.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub stopped: Option<String>,
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

    #[test]
    fn work_state_names_are_the_serialized_ones() {
        use WorkState::*;
        for state in [Pending, Running, Completed, Failed, Skipped, Cancelled] {
            assert_eq!(serde_json::to_value(state).unwrap(), state.as_str());
        }
    }
}
