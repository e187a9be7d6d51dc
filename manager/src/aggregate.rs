//! Status aggregation: Tasks into their TaskGroup, TaskGroups into their Job.

use std::collections::{BTreeMap, BTreeSet};

use jiff::Timestamp;
use k8s4r_api::condition::{find_condition, set_condition};
use k8s4r_api::names::{CONDITION_COMPLETE, CONDITION_FAILED, CONDITION_SCHEDULED};
use k8s4r_api::{
    Condition, ConditionStatus, GroupSummary, JobSpec, JobStatus, TaskCounts, TaskGroupStatus, TaskState,
    WorkState,
};

/// One Task as its group counts it.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct TaskView<'a> {
    /// Its effective state (a failure that will be retried counts as pending).
    pub state: TaskState,
    /// The robot of its current attempt, if it has one.
    pub robot: Option<&'a str>,
}

/// "3/5".
fn completions(counts: &TaskCounts, expected: i32) -> String {
    format!("{}/{}", counts.completed, expected)
}

/// The status of a TaskGroup that should have `expected` Tasks.
pub fn group_status<'a>(
    expected: i32,
    tasks: impl IntoIterator<Item = TaskView<'a>>,
    previous: Option<&TaskGroupStatus>,
    generation: Option<i64>,
) -> TaskGroupStatus {
    let mut counts = TaskCounts::default();
    let mut robots = BTreeSet::new();
    for task in tasks {
        counts.add(Some(task.state));
        if matches!(task.state, TaskState::Dispatching | TaskState::Running) {
            if let Some(r) = task.robot {
                robots.insert(r.to_owned());
            }
        }
    }
    let state = WorkState::of(&counts, expected);
    let mut conditions = previous.map(|p| p.conditions.clone()).unwrap_or_default();
    finished_conditions(&mut conditions, state, generation);
    TaskGroupStatus {
        state: Some(state),
        completions: Some(completions(&counts, expected)),
        counts,
        robots: robots.into_iter().collect(),
        desired: previous.and_then(|p| p.desired),
        rollout: None,
        observed_generation: generation,
        conditions,
        retry: previous.and_then(|p| p.retry.clone()),
        cancellation: previous.and_then(|p| p.cancellation.clone()),
    }
}

/// One group as its Job sees it.
#[derive(Clone, Debug)]
pub struct GroupView<'a> {
    /// The group's name in the Job.
    pub name: &'a str,
    /// Its TaskGroup object's name.
    pub task_group: String,
    /// How many Tasks the group should have (`count`, or what an
    /// everyRobot group's status says; at least 1 before it says).
    pub count: i32,
    /// The TaskGroup's status, when it exists and has one.
    pub status: Option<&'a TaskGroupStatus>,
    /// Whether it may start (see [`gates`]).
    pub gate: Gate,
}

/// Whether a group of a Job may start, given the groups it runs after.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Gate {
    /// It may start (or has started).
    Open,
    /// It waits for these groups to complete.
    Waiting(Vec<String>),
    /// It will never start, and why.
    Skipped(String),
}

/// Decides every group's gate. `state` gives the state of a group whose
/// TaskGroup exists (a group that exists is open for good: ordering only
/// holds back creation). The Job must have passed validation (no cycle);
/// a cycle met anyway leaves its groups waiting.
pub fn gates(spec: &JobSpec, state: impl Fn(&str) -> Option<WorkState>) -> BTreeMap<String, Gate> {
    fn visit(
        spec: &JobSpec,
        name: &str,
        state: &dyn Fn(&str) -> Option<WorkState>,
        done: &mut BTreeMap<String, Gate>,
        open: &mut BTreeSet<String>,
    ) -> Gate {
        if let Some(g) = done.get(name) {
            return g.clone();
        }
        let Some(group) = spec.task_groups.iter().find(|g| g.name == name) else {
            return Gate::Waiting(vec![name.to_owned()]);
        };
        if state(name).is_some() {
            done.insert(name.to_owned(), Gate::Open);
            return Gate::Open;
        }
        if !open.insert(name.to_owned()) {
            return Gate::Waiting(vec![name.to_owned()]);
        }
        let mut waiting = Vec::new();
        let mut skipped = None;
        for dep in spec.dependencies_of(group) {
            let dep_gate = visit(spec, dep, state, done, open);
            match (dep_gate, state(dep)) {
                (Gate::Skipped(_), _) => {
                    skipped.get_or_insert_with(|| format!("group {dep} was skipped"));
                }
                (_, Some(WorkState::Failed)) => {
                    skipped.get_or_insert_with(|| format!("group {dep} failed"));
                }
                (_, Some(WorkState::Cancelled)) => {
                    skipped.get_or_insert_with(|| format!("group {dep} was cancelled"));
                }
                (_, Some(WorkState::Completed)) => {}
                _ => waiting.push(dep.to_owned()),
            }
        }
        open.remove(name);
        let gate = match skipped {
            Some(why) => Gate::Skipped(why),
            None if waiting.is_empty() => Gate::Open,
            None => Gate::Waiting(waiting),
        };
        done.insert(name.to_owned(), gate.clone());
        gate
    }
    let mut done = BTreeMap::new();
    for group in &spec.task_groups {
        visit(spec, &group.name, &state, &mut done, &mut BTreeSet::new());
    }
    done
}

/// The status of a Job from its groups.
pub fn job_status(
    groups: &[GroupView<'_>],
    previous: Option<&JobStatus>,
    generation: Option<i64>,
    now: Timestamp,
) -> JobStatus {
    let mut counts = TaskCounts::default();
    let mut expected = 0;
    let mut summaries = Vec::with_capacity(groups.len());
    let mut failed_groups = Vec::new();
    let mut skipped_groups = Vec::new();
    for g in groups {
        let (group_counts, state, message) = group_part(g);
        match g.gate {
            Gate::Skipped(_) => skipped_groups.push(g.name),
            Gate::Waiting(_) => expected += g.count.max(0),
            Gate::Open => {
                expected += g.count.max(0);
                if state == WorkState::Failed {
                    failed_groups.push(g.name);
                }
            }
        }
        counts.merge(&group_counts);
        summaries.push(GroupSummary {
            name: g.name.to_owned(),
            task_group: g.task_group.clone(),
            state: Some(state),
            counts: group_counts,
            message,
        });
    }
    let mut state = WorkState::of(&counts, expected);
    if state == WorkState::Completed && !skipped_groups.is_empty() {
        // Skipped groups only follow a failure; never a completed Job.
        state = WorkState::Failed;
    }
    let start_time = previous.and_then(|p| p.start_time).or_else(|| {
        let started = counts.dispatching + counts.running + counts.completed + counts.failed > 0;
        started.then_some(now)
    });
    let completion_time = if state.is_finished() {
        previous.and_then(|p| p.completion_time).or(Some(now))
    } else {
        None
    };
    let mut conditions = previous.map(|p| p.conditions.clone()).unwrap_or_default();
    finished_conditions(&mut conditions, state, generation);
    if state == WorkState::Failed && !failed_groups.is_empty() {
        group_failed_condition(&mut conditions, &failed_groups, &skipped_groups, generation);
    }
    JobStatus {
        state: Some(state),
        completions: Some(completions(&counts, expected)),
        counts,
        groups: summaries,
        start_time,
        completion_time,
        observed_generation: generation,
        conditions,
        retry: previous.and_then(|p| p.retry.clone()),
        cancellation: previous.and_then(|p| p.cancellation.clone()),
        deadline_time: previous.and_then(|p| p.deadline_time),
    }
}

/// One group's part of its Job's status: its counts, state and message.
fn group_part(g: &GroupView<'_>) -> (TaskCounts, WorkState, Option<String>) {
    match &g.gate {
        Gate::Skipped(why) => (
            TaskCounts::default(),
            WorkState::Skipped,
            Some(format!("skipped: {why}")),
        ),
        Gate::Waiting(deps) => {
            // Its tasks are still to come: pending, so that the Job
            // neither completes nor fails without them.
            let n = g.count.max(0);
            let waiting = TaskCounts {
                total: n,
                pending: n,
                ..TaskCounts::default()
            };
            (
                waiting,
                WorkState::Pending,
                Some(format!("waits for {}", deps.join(", "))),
            )
        }
        Gate::Open => {
            let state = g.status.and_then(|s| s.state).unwrap_or(WorkState::Pending);
            let rollout = g.status.and_then(|s| s.rollout.as_ref());
            (
                g.status.map(|s| s.counts.clone()).unwrap_or_default(),
                state,
                rollout.and_then(|r| r.stopped.clone()).or_else(|| {
                    // A group that waits says why (no robot matches it).
                    g.status
                        .and_then(|s| find_condition(&s.conditions, CONDITION_SCHEDULED))
                        .filter(|c| c.status == ConditionStatus::False)
                        .and_then(|c| c.message.clone())
                }),
            )
        }
    }
}

/// Says in the `Failed` condition which groups failed, and which were
/// skipped after them.
fn group_failed_condition(
    conditions: &mut Vec<Condition>,
    failed_groups: &[&str],
    skipped_groups: &[&str],
    generation: Option<i64>,
) {
    let mut message = format!("group {} failed", failed_groups.join(", "));
    if !skipped_groups.is_empty() {
        message.push_str(&format!("; skipped: {}", skipped_groups.join(", ")));
    }
    let mut c = Condition::new(CONDITION_FAILED, ConditionStatus::True, "GroupFailed", message);
    c.observed_generation = generation;
    set_condition(conditions, c);
}

/// Keeps `Complete` and `Failed` conditions in step with the state.
fn finished_conditions(conditions: &mut Vec<Condition>, state: WorkState, generation: Option<i64>) {
    let (complete, failed) = match state {
        WorkState::Completed => (ConditionStatus::True, ConditionStatus::False),
        WorkState::Failed => (ConditionStatus::False, ConditionStatus::True),
        _ => (ConditionStatus::False, ConditionStatus::False),
    };
    let mut c = Condition::new(
        CONDITION_COMPLETE,
        complete,
        "TasksCompleted",
        "every task completed",
    );
    if complete == ConditionStatus::False {
        c.reason = Some("NotComplete".into());
        c.message = Some("not every task has completed".into());
    }
    c.observed_generation = generation;
    set_condition(conditions, c);
    let mut f = Condition::new(
        CONDITION_FAILED,
        failed,
        "TaskFailed",
        "a task failed after its retries",
    );
    if failed == ConditionStatus::False {
        f.reason = Some("NoFailure".into());
        f.message = Some("no task failed for good".into());
    }
    f.observed_generation = generation;
    set_condition(conditions, f);
}

#[cfg(test)]
mod tests {
    use super::*;
    use k8s4r_api::condition::find_condition;

    fn views(states: &[(TaskState, Option<&'static str>)]) -> Vec<TaskView<'static>> {
        states
            .iter()
            .map(|(state, robot)| TaskView {
                state: *state,
                robot: *robot,
            })
            .collect()
    }

    #[test]
    fn group_counts_states_and_lists_active_robots() {
        use TaskState::*;
        let s = group_status(
            4,
            views(&[
                (Running, Some("r1")),
                (Dispatching, Some("r2")),
                (Completed, Some("r3")),
                (Pending, None),
            ]),
            None,
            Some(3),
        );
        assert_eq!(s.state, Some(WorkState::Running));
        assert_eq!(s.completions.as_deref(), Some("1/4"));
        assert_eq!(
            (s.counts.total, s.counts.running, s.counts.dispatching),
            (4, 1, 1)
        );
        assert_eq!(s.robots, vec!["r1".to_string(), "r2".to_string()], "r3 is done");
        assert_eq!(s.observed_generation, Some(3));
    }

    #[test]
    fn group_completes_and_fails() {
        use TaskState::*;
        let done = group_status(2, views(&[(Completed, None), (Completed, None)]), None, None);
        assert_eq!(done.state, Some(WorkState::Completed));
        let c = find_condition(&done.conditions, "Complete").unwrap();
        assert_eq!(c.status, ConditionStatus::True);
        let failed = group_status(2, views(&[(Completed, None), (Failed, None)]), None, None);
        assert_eq!(failed.state, Some(WorkState::Failed));
        assert_eq!(
            find_condition(&failed.conditions, "Failed").unwrap().status,
            ConditionStatus::True
        );
        let short = group_status(3, views(&[(Completed, None), (Completed, None)]), None, None);
        assert_eq!(
            short.state,
            Some(WorkState::Running),
            "a task still to be created"
        );
    }

    #[test]
    fn job_sums_groups_and_keeps_its_times() {
        let t0 = Timestamp::from_second(1_700_000_000).unwrap();
        let t1 = Timestamp::from_second(1_700_000_100).unwrap();
        let a = group_status(1, views(&[(TaskState::Completed, None)]), None, None);
        let b = group_status(1, views(&[(TaskState::Running, Some("r"))]), None, None);
        let groups = [
            GroupView {
                name: "a",
                task_group: "j-a".into(),
                count: 1,
                status: Some(&a),
                gate: Gate::Open,
            },
            GroupView {
                name: "b",
                task_group: "j-b".into(),
                count: 1,
                status: Some(&b),
                gate: Gate::Open,
            },
        ];
        let s = job_status(&groups, None, Some(1), t0);
        assert_eq!(s.state, Some(WorkState::Running));
        assert_eq!(s.completions.as_deref(), Some("1/2"));
        assert_eq!(s.start_time, Some(t0));
        assert_eq!(s.completion_time, None);
        assert_eq!(s.groups.len(), 2);
        assert_eq!(s.groups[1].state, Some(WorkState::Running));

        let b_done = group_status(1, views(&[(TaskState::Completed, None)]), None, None);
        let groups = [
            groups[0].clone(),
            GroupView {
                status: Some(&b_done),
                ..groups[1].clone()
            },
        ];
        let done = job_status(&groups, Some(&s), Some(1), t1);
        assert_eq!(done.state, Some(WorkState::Completed));
        assert_eq!(done.start_time, Some(t0), "kept from before");
        assert_eq!(done.completion_time, Some(t1));
        let again = job_status(
            &groups,
            Some(&done),
            Some(1),
            t1 + jiff::SignedDuration::from_secs(5),
        );
        assert_eq!(again.completion_time, Some(t1), "stable across reconciles");
    }

    #[test]
    fn job_without_groups_created_yet_is_pending() {
        let now = Timestamp::from_second(1_700_000_000).unwrap();
        let groups = [GroupView {
            name: "a",
            task_group: "j-a".into(),
            count: 3,
            status: None,
            gate: Gate::Open,
        }];
        let s = job_status(&groups, None, None, now);
        assert_eq!(s.state, Some(WorkState::Pending));
        assert_eq!(s.start_time, None);
        assert_eq!(s.completions.as_deref(), Some("0/3"));
    }

    #[test]
    fn a_job_says_why_its_group_waits() {
        let now = Timestamp::from_second(1_700_000_000).unwrap();
        let why = "no robot matches the group: 0/1 robots: 1 lack driver raw_exec";
        let group_status = TaskGroupStatus {
            state: Some(WorkState::Pending),
            conditions: vec![Condition::new(
                CONDITION_SCHEDULED,
                ConditionStatus::False,
                "NoMatchingRobot",
                why,
            )],
            ..TaskGroupStatus::default()
        };
        let groups = [GroupView {
            name: "a",
            task_group: "j-a".into(),
            count: 1,
            status: Some(&group_status),
            gate: Gate::Open,
        }];
        let s = job_status(&groups, None, None, now);
        assert_eq!(s.groups[0].message.as_deref(), Some(why));
    }

    fn ordered_spec() -> JobSpec {
        let group = |name: &str, after: &[&str]| k8s4r_api::TaskGroupTemplate {
            name: name.into(),
            count: Some(2),
            after: after.iter().map(|a| (*a).to_owned()).collect(),
            ..Default::default()
        };
        JobSpec {
            task_groups: vec![
                group("map", &[]),
                group("drive", &["map"]),
                group("report", &["drive"]),
                group("free", &[]),
            ],
            ..JobSpec::default()
        }
    }

    #[test]
    fn groups_wait_for_theirs_and_are_skipped_after_a_failure() {
        let spec = ordered_spec();
        let g = gates(&spec, |n| {
            (n == "map" || n == "free").then_some(WorkState::Running)
        });
        assert_eq!(g["map"], Gate::Open);
        assert_eq!(g["free"], Gate::Open);
        assert_eq!(g["drive"], Gate::Waiting(vec!["map".into()]));
        assert_eq!(g["report"], Gate::Waiting(vec!["drive".into()]));
        let g = gates(&spec, |n| match n {
            "map" => Some(WorkState::Completed),
            _ => None,
        });
        assert_eq!(g["drive"], Gate::Open);
        let g = gates(&spec, |n| match n {
            "map" => Some(WorkState::Failed),
            _ => None,
        });
        assert_eq!(g["drive"], Gate::Skipped("group map failed".into()));
        assert_eq!(g["report"], Gate::Skipped("group drive was skipped".into()));
        assert_eq!(g["free"], Gate::Open);
    }

    #[test]
    fn a_job_with_skipped_groups_fails_naming_the_cause() {
        let failed = TaskGroupStatus {
            state: Some(WorkState::Failed),
            counts: TaskCounts {
                total: 2,
                failed: 1,
                completed: 1,
                ..TaskCounts::default()
            },
            ..TaskGroupStatus::default()
        };
        let groups = [
            GroupView {
                name: "map",
                task_group: "j-map".into(),
                count: 2,
                status: Some(&failed),
                gate: Gate::Open,
            },
            GroupView {
                name: "drive",
                task_group: "j-drive".into(),
                count: 2,
                status: None,
                gate: Gate::Skipped("group map failed".into()),
            },
        ];
        let s = job_status(&groups, None, Some(1), Timestamp::now());
        assert_eq!(s.state, Some(WorkState::Failed));
        assert_eq!(s.groups[1].state, Some(WorkState::Skipped));
        assert_eq!(s.groups[1].message.as_deref(), Some("skipped: group map failed"));
        let c = find_condition(&s.conditions, "Failed").unwrap();
        assert_eq!(
            (c.reason.as_deref(), c.message.as_deref()),
            (Some("GroupFailed"), Some("group map failed; skipped: drive"))
        );
        let waiting = [
            GroupView {
                name: "map",
                task_group: "j-map".into(),
                count: 2,
                status: Some(&TaskGroupStatus {
                    state: Some(WorkState::Completed),
                    counts: TaskCounts {
                        total: 2,
                        completed: 2,
                        ..TaskCounts::default()
                    },
                    ..TaskGroupStatus::default()
                }),
                gate: Gate::Open,
            },
            GroupView {
                name: "drive",
                task_group: "j-drive".into(),
                count: 2,
                status: None,
                gate: Gate::Waiting(vec!["map".into()]),
            },
        ];
        let s = job_status(&waiting, None, Some(1), Timestamp::now());
        assert_eq!(
            s.state,
            Some(WorkState::Running),
            "not complete while a group waits"
        );
        assert_eq!(s.completions.as_deref(), Some("2/4"));
        assert_eq!(s.groups[1].message.as_deref(), Some("waits for map"));
    }
}
