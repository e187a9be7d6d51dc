use super::*;
use k8s4r_api::{Constraint, ConstraintOperator, LabelSelector, TaskCounts, TaskGroupStatus};

fn constraint(attr: &str) -> Constraint {
    Constraint {
        attribute: attr.into(),
        operator: ConstraintOperator::Exists,
        value: String::new(),
    }
}

#[test]
fn groups_inherit_the_jobs_selector_and_constraints() {
    let job = JobSpec {
        robot_selector: Some(LabelSelector::from_labels([("site", "lab")])),
        constraints: vec![constraint("arch")],
        task_groups: vec![
            TaskGroupTemplate {
                name: "a".into(),
                count: Some(2),
                robot_selector: Some(LabelSelector::from_labels([("tier", "gold")])),
                constraints: vec![constraint("os")],
                ..TaskGroupTemplate::default()
            },
            TaskGroupTemplate {
                name: "b".into(),
                count: Some(1),
                ..TaskGroupTemplate::default()
            },
        ],
        priority: 7,
        order: Vec::new(),
        pending_deadline_seconds: Some(600),
        ..JobSpec::default()
    };
    let groups = desired_groups("j", &job);
    let a = &groups["j-a"];
    assert_eq!(a.job, "j");
    assert_eq!(a.priority, 7);
    assert_eq!(
        a.pending_deadline_seconds,
        Some(600),
        "the job's pending deadline"
    );
    let selector = a.template.robot_selector.as_ref().unwrap();
    assert_eq!(selector.match_labels.len(), 2);
    assert_eq!(a.template.constraints.len(), 2);
    let b = &groups["j-b"];
    assert_eq!(b.template.robot_selector, job.robot_selector);
    assert_eq!(b.template.constraints, vec![constraint("arch")]);
}

fn now() -> Timestamp {
    "2026-11-25T10:00:00Z".parse().unwrap()
}

fn template(name: &str, count: i32, after: &[&str]) -> TaskGroupTemplate {
    TaskGroupTemplate {
        name: name.into(),
        count: Some(count),
        after: after.iter().map(|a| (*a).to_owned()).collect(),
        ..TaskGroupTemplate::default()
    }
}

/// Job `j` in namespace `ns`, with a uid to own its groups with.
fn job(groups: Vec<TaskGroupTemplate>) -> Job {
    let mut job = Job::new(
        "j",
        JobSpec {
            task_groups: groups,
            ..JobSpec::default()
        },
    );
    job.metadata.namespace = Some("ns".into());
    job.metadata.uid = Some("uid-j".into());
    job.metadata.generation = Some(1);
    job
}

fn owner(job: &Job) -> OwnerReference {
    job.controller_owner_ref(&()).unwrap()
}

/// The TaskGroup of `job`'s group `group` as it should be, in `state`
/// with `counts`.
fn stored(job: &Job, group: &str, state: WorkState, counts: TaskCounts) -> (String, Arc<TaskGroup>) {
    let name = group_name("j", group);
    let mut tg = TaskGroup::new(&name, desired_groups("j", &job.spec)[&name].clone());
    tg.status = Some(TaskGroupStatus {
        state: Some(state),
        counts,
        ..TaskGroupStatus::default()
    });
    (name, Arc::new(tg))
}

fn counts(completed: i32, failed: i32) -> TaskCounts {
    TaskCounts {
        total: completed + failed,
        completed,
        failed,
        ..TaskCounts::default()
    }
}

#[test]
fn an_invalid_spec_fails_the_job_once() {
    let mut j = job(vec![template("a", 1, &[])]);
    let status = plan_invalid(&j, "spec.taskGroups: empty", now()).unwrap();
    assert_eq!(status.state, Some(WorkState::Failed));
    assert_eq!(status.observed_generation, Some(1));
    assert_eq!(status.conditions[0].reason.as_deref(), Some("InvalidSpec"));
    assert_eq!(status.conditions[0].last_transition_time, Some(now()));
    assert_eq!(status.completion_time, Some(now()));
    j.status = Some(status);
    assert_eq!(plan_invalid(&j, "spec.taskGroups: empty", now()), None);
}

#[test]
fn groups_are_created_once_the_groups_they_run_after_complete() {
    let j = job(vec![template("a", 1, &[]), template("b", 1, &["a"])]);
    let plan = plan_groups(&j, &owner(&j), &BTreeMap::new(), &[], false);
    let created: Vec<String> = plan
        .writes
        .iter()
        .map(|w| match w {
            GroupWrite::Create(tg) => tg.name_any(),
            GroupWrite::Replace(tg) => panic!("replaced {}", tg.name_any()),
        })
        .collect();
    assert_eq!(created, ["j-a"]);
    assert_eq!(plan.gates["b"], Gate::Waiting(vec!["a".into()]));
    let GroupWrite::Create(a) = &plan.writes[0] else {
        unreachable!()
    };
    assert_eq!(a.namespace().as_deref(), Some("ns"));
    assert_eq!(a.labels()[LABEL_JOB], "j");
    assert_eq!(a.owner_references()[0].uid, "uid-j");

    let stored = BTreeMap::from([stored(&j, "a", WorkState::Completed, counts(1, 0))]);
    let plan = plan_groups(&j, &owner(&j), &stored, &["j-a".into()], false);
    assert_eq!(plan.gates["b"], Gate::Open);
    assert!(matches!(&plan.writes[..], [GroupWrite::Create(b)] if b.name_any() == "j-b"));
    assert!(plan.delete.is_empty());
}

#[test]
fn a_changed_group_is_replaced_and_a_removed_one_deleted() {
    let j = job(vec![template("a", 2, &[])]);
    let (name, a) = stored(&j, "a", WorkState::Running, counts(0, 0));
    let mut old = (*a).clone();
    old.spec.template.count = Some(1);
    let stored = BTreeMap::from([(name, Arc::new(old))]);
    let owned = ["j-a".to_owned(), "j-gone".to_owned()];
    let plan = plan_groups(&j, &owner(&j), &stored, &owned, false);
    assert!(matches!(&plan.writes[..], [GroupWrite::Replace(a)] if a.spec.template.count == Some(2)));
    assert_eq!(plan.delete, ["j-gone"]);
}

#[test]
fn a_cancelled_job_starts_nothing_new() {
    let j = job(vec![template("a", 1, &[]), template("b", 1, &[])]);
    let stored = BTreeMap::from([stored(&j, "a", WorkState::Running, counts(0, 0))]);
    let plan = plan_groups(&j, &owner(&j), &stored, &["j-a".into()], true);
    assert!(plan.writes.is_empty());
    assert_eq!(plan.gates["a"], Gate::Open);
    assert_eq!(plan.gates["b"], Gate::Skipped("the Job was cancelled".into()));
}

#[test]
fn a_completed_job_says_so_once() {
    let mut j = job(vec![template("a", 2, &[])]);
    let stored = BTreeMap::from([stored(&j, "a", WorkState::Completed, counts(2, 0))]);
    let gates = BTreeMap::from([("a".to_owned(), Gate::Open)]);
    let plan = plan_job_status(&j, &stored, &gates, Requests::default(), None, now());
    let status = plan.status.unwrap();
    assert_eq!(status.state, Some(WorkState::Completed));
    assert_eq!(status.completion_time, Some(now()));
    assert_eq!(
        plan.event,
        Some(Note::normal("Completed", "all 2 tasks completed"))
    );
    j.status = Some(status);
    let again = plan_job_status(&j, &stored, &gates, Requests::default(), None, now());
    assert_eq!(again, JobStatusPlan::default());
}

#[test]
fn a_failed_job_names_the_groups_it_skipped() {
    let j = job(vec![template("a", 1, &[]), template("b", 1, &["a"])]);
    let stored = BTreeMap::from([stored(&j, "a", WorkState::Failed, counts(0, 1))]);
    let gates = BTreeMap::from([
        ("a".to_owned(), Gate::Open),
        ("b".to_owned(), Gate::Skipped("group a failed".into())),
    ]);
    let plan = plan_job_status(&j, &stored, &gates, Requests::default(), None, now());
    assert_eq!(plan.status.unwrap().state, Some(WorkState::Failed));
    assert_eq!(
        plan.event,
        Some(Note::warning(
            "Failed",
            "1 tasks failed after their retries; skipped groups that run after them: b"
        ))
    );
}

#[test]
fn a_cancelled_job_that_skipped_groups_is_cancelled() {
    let j = job(vec![template("a", 1, &[]), template("b", 1, &[])]);
    let stored = BTreeMap::from([stored(&j, "a", WorkState::Completed, counts(1, 0))]);
    let gates = BTreeMap::from([
        ("a".to_owned(), Gate::Open),
        ("b".to_owned(), Gate::Skipped("the Job was cancelled".into())),
    ]);
    let requests = Requests {
        cancelled: true,
        ..Requests::default()
    };
    let plan = plan_job_status(&j, &stored, &gates, requests, None, now());
    assert_eq!(plan.status.unwrap().state, Some(WorkState::Cancelled));
    assert_eq!(plan.event, None);
}
