//! The scheduler's view of the cluster's objects: what a Task asks for and
//! where it sits, what a Robot offers. Pure functions, so the scheduler
//! ([`crate::scheduler`]) never reads Kubernetes types itself.

use std::collections::BTreeMap;

use k8s4r_api::condition::find_condition;
use k8s4r_api::names::{ANNOTATION_CANCEL, CONDITION_ACCEPTING_TASKS, LABEL_GROUP, LABEL_JOB};
use k8s4r_api::{ConditionStatus, Robot, Task, TaskState};
use kube::{Resource, ResourceExt};

use crate::ledger::Placement;
use crate::lifecycle::{effective_state, LifecycleConfig};
use crate::scheduler::{Demand, RobotFacts};

pub fn key_of<K: Resource>(obj: &K) -> String {
    format!("{}/{}", obj.namespace().unwrap_or_default(), obj.name_any())
}

/// The spread group of a task: its TaskGroup (by label, else by owner).
pub fn group_of(task: &Task) -> String {
    let ns = task.namespace().unwrap_or_default();
    let labels = task.labels();
    match (labels.get(LABEL_JOB), labels.get(LABEL_GROUP)) {
        (Some(job), Some(group)) => format!("{ns}/{job}-{group}"),
        _ => match task.owner_references().first() {
            Some(owner) => format!("{ns}/{}", owner.name),
            None => key_of(task),
        },
    }
}

/// What a task requests; unparsable quantities count as nothing (the spec
/// is validated before scheduling, so they never get that far).
pub fn demand_of(task: &Task) -> Demand {
    let template = &task.spec.template;
    let resources = template.resources.as_ref();
    Demand {
        cpu_milli: resources
            .and_then(|r| r.cpu.as_ref())
            .and_then(|q| q.to_milli().ok())
            .unwrap_or(0),
        memory_bytes: resources
            .and_then(|r| r.memory.as_ref())
            .and_then(|q| q.to_units().ok())
            .unwrap_or(0),
        disk_bytes: template.disk_bytes().unwrap_or(0),
        user: template.user.clone(),
        groups: template.groups.clone(),
    }
}

/// Where a Task's current attempt sits, if it occupies a robot.
pub fn placement_of(task: &Task) -> Option<Placement> {
    let status = task.status.as_ref()?;
    if !matches!(status.state, Some(TaskState::Dispatching | TaskState::Running)) {
        return None;
    }
    let robot = status.robot.clone().or_else(|| task.spec.target_robot.clone())?;
    Some(Placement {
        robot,
        group: group_of(task),
        demand: demand_of(task),
    })
}

/// What the scheduler needs to know about a Robot.
pub fn facts_of(robot: &Robot) -> RobotFacts {
    let status = robot.status.clone().unwrap_or_default();
    let mut attributes = BTreeMap::new();
    if let Some(d) = &status.device {
        attributes.insert("arch".to_owned(), d.arch.clone());
        attributes.insert("os".to_owned(), d.os.clone());
        attributes.insert("cpus".to_owned(), d.cpus.to_string());
        attributes.insert("memory".to_owned(), d.memory_bytes.to_string());
        for (k, v) in [
            ("osVersion", &d.os_version),
            ("kernel", &d.kernel),
            ("hostname", &d.hostname),
        ] {
            if let Some(v) = v {
                attributes.insert(k.to_owned(), v.clone());
            }
        }
    }
    if let Some(v) = &status.agent_version {
        attributes.insert("agentVersion".to_owned(), v.clone());
    }
    let capacity = status.capacity.as_ref();
    let policy = status.task_policy.as_ref();
    let refusing = find_condition(&status.conditions, CONDITION_ACCEPTING_TASKS)
        .filter(|c| c.status == ConditionStatus::False)
        .map(|c| {
            let reason = c.reason.as_deref().unwrap_or("NotAccepting");
            match &c.message {
                Some(message) => format!("{reason}: {message}"),
                None => reason.to_owned(),
            }
        });
    RobotFacts {
        name: robot.name_any(),
        phase: status.phase,
        unschedulable: robot.spec.unschedulable,
        labels: robot.labels().clone(),
        attributes,
        drivers: status.drivers.clone(),
        cpu_milli: capacity
            .and_then(|c| c.cpu.as_ref())
            .and_then(|q| q.to_milli().ok()),
        memory_bytes: capacity
            .and_then(|c| c.memory.as_ref())
            .and_then(|q| q.to_units().ok()),
        refusing,
        max_tasks: policy.map(|p| p.max_tasks).filter(|n| *n > 0),
        disk_bytes: policy
            .and_then(|p| p.disk_budget.as_ref())
            .and_then(|q| q.to_units().ok()),
        policy: policy.cloned(),
        facts: status.facts.clone(),
    }
}

/// What a TaskGroup's reconcile reads of one of its Tasks: its counts and
/// robots, a cancel passed on, an everyRobot rollout's progress, the Task's
/// slot. A Task event that leaves it as it was (the server's records of a
/// dispatch, a finalizer, a restart) does not wake the group: at 100 Jobs a
/// second those were most of the group controller's work.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct SeenByGroup {
    state: TaskState,
    robot: Option<String>,
    placed: bool,
    cancel: Option<String>,
    deleting: bool,
    labels: std::collections::BTreeMap<String, String>,
    robot_name: Option<String>,
}

impl SeenByGroup {
    pub fn of(task: &Task, lifecycle: &LifecycleConfig) -> Self {
        let status = task.status.as_ref();
        SeenByGroup {
            state: effective_state(&task.spec, status, lifecycle),
            robot: status
                .and_then(|s| s.robot.clone())
                .or_else(|| task.spec.target_robot.clone()),
            placed: status.is_some_and(|s| s.attempt > 0),
            cancel: task.annotations().get(ANNOTATION_CANCEL).cloned(),
            deleting: task.meta().deletion_timestamp.is_some(),
            labels: task.labels().clone(),
            robot_name: task.spec.robot_name.clone(),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use k8s4r_api::RobotPhase;
    use k8s4r_api::{
        DeviceInfo, Quantity, RobotResources, RobotSpec, RobotStatus, TaskResources, TaskSpec, TaskStatus,
        TaskTemplate,
    };

    fn task(state: Option<TaskState>) -> Task {
        let mut t = Task::new(
            "j-g-0",
            TaskSpec {
                template: TaskTemplate {
                    driver: "exec".into(),
                    command: "true".into(),
                    resources: Some(TaskResources {
                        cpu: Some(Quantity::from("250m")),
                        memory: Some(Quantity::from("64Mi")),
                        ..TaskResources::default()
                    }),
                    ..TaskTemplate::default()
                },
                target_robot: Some("r1".into()),
                ..TaskSpec::default()
            },
        );
        t.metadata.namespace = Some("ns".into());
        t.labels_mut().insert(LABEL_JOB.into(), "j".into());
        t.labels_mut().insert(LABEL_GROUP.into(), "g".into());
        t.status = Some(TaskStatus {
            state,
            attempt: 1,
            ..TaskStatus::default()
        });
        t
    }

    #[test]
    fn only_dispatching_and_running_tasks_occupy_a_robot() {
        let running = placement_of(&task(Some(TaskState::Running))).unwrap();
        assert_eq!(running.robot, "r1");
        assert_eq!(running.group, "ns/j-g");
        assert_eq!(
            running.demand,
            Demand {
                cpu_milli: 250,
                memory_bytes: 64 << 20,
                ..Demand::default()
            }
        );
        assert!(placement_of(&task(Some(TaskState::Dispatching))).is_some());
        for state in [
            None,
            Some(TaskState::Pending),
            Some(TaskState::Completed),
            Some(TaskState::Failed),
        ] {
            assert!(placement_of(&task(state)).is_none(), "{state:?}");
        }
    }

    #[test]
    fn robot_facts_come_from_labels_device_and_capacity() {
        let mut robot = Robot::new("r1", RobotSpec { unschedulable: true });
        robot.labels_mut().insert("site".into(), "lab".into());
        robot.status = Some(RobotStatus {
            phase: Some(RobotPhase::Online),
            device: Some(DeviceInfo {
                arch: "aarch64".into(),
                os: "linux".into(),
                cpus: 4,
                memory_bytes: 1024,
                kernel: Some("6.1".into()),
                ..DeviceInfo::default()
            }),
            capacity: Some(RobotResources {
                cpu: Some(Quantity::from("4")),
                memory: Some(Quantity::from("1Gi")),
                tasks: 0,
            }),
            agent_version: Some("0.1.0".into()),
            drivers: vec!["exec".into()],
            ..RobotStatus::default()
        });
        let f = facts_of(&robot);
        assert!(f.unschedulable);
        assert_eq!(f.attribute("arch"), Some("aarch64"));
        assert_eq!(f.attribute("kernel"), Some("6.1"));
        assert_eq!(f.attribute("cpus"), Some("4"));
        assert_eq!(f.attribute("agentVersion"), Some("0.1.0"));
        assert_eq!(f.attribute("label.site"), Some("lab"));
        assert_eq!(f.attribute("hostname"), None);
        assert_eq!((f.cpu_milli, f.memory_bytes), (Some(4000), Some(1 << 30)));
        assert_eq!(
            (f.refusing.as_deref(), f.max_tasks, f.disk_bytes),
            (None, None, None)
        );
        assert_eq!(f.policy, None, "an agent that reports no policy");
        assert!(f.facts.is_empty(), "a robot that reports no facts");
        let status = robot.status.as_mut().unwrap();
        status.facts = serde_json::from_str(r#"{"battery": 80, "docked": true}"#).unwrap();
        assert_eq!(facts_of(&robot).facts, robot.status.unwrap().facts);
    }

    #[test]
    fn a_robots_health_condition_limits_and_policy_reach_the_scheduler() {
        use k8s4r_api::{Condition, TaskPolicy};
        let mut robot = Robot::new("r2", RobotSpec::default());
        let policy = TaskPolicy {
            max_tasks: 8,
            disk_budget: Some(Quantity::from("2Gi")),
            allowed_groups: vec!["dialout".into()],
            ..TaskPolicy::default()
        };
        robot.status = Some(RobotStatus {
            phase: Some(RobotPhase::Online),
            task_policy: Some(policy.clone()),
            conditions: vec![Condition::new(
                CONDITION_ACCEPTING_TASKS,
                ConditionStatus::False,
                "DiskFull",
                "the disk holding /var/lib/k8s4r is full",
            )],
            ..RobotStatus::default()
        });
        let f = facts_of(&robot);
        assert_eq!(
            f.refusing.as_deref(),
            Some("DiskFull: the disk holding /var/lib/k8s4r is full")
        );
        assert_eq!((f.max_tasks, f.disk_bytes), (Some(8), Some(2 << 30)));
        assert_eq!(f.policy, Some(policy));
        let status = robot.status.as_mut().unwrap();
        status.conditions[0].status = ConditionStatus::True;
        assert_eq!(facts_of(&robot).refusing, None);

        let mut t = task(Some(TaskState::Running));
        t.spec.template.user = Some("robot".into());
        t.spec.template.groups = vec!["video".into()];
        t.spec.template.resources.as_mut().unwrap().disk = Some(Quantity::from("1Gi"));
        let demand = demand_of(&t);
        assert_eq!(demand.disk_bytes, 1 << 30);
        assert_eq!(
            (demand.user.as_deref(), demand.groups.as_slice()),
            (Some("robot"), &["video".to_owned()][..])
        );
    }
}
