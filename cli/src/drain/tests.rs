use super::*;
use clap::Parser;
use k8s4r_api::{ManualAction, TaskKind, TaskSpec, TaskStatus, TaskTemplate};

/// A Task in namespace `default` with uid `uid-NAME`, in `state` on `robot`.
fn task(name: &str, kind: TaskKind, state: TaskState, robot: &str) -> Task {
    let mut task = Task::new(
        name,
        TaskSpec {
            template: TaskTemplate {
                kind,
                ..Default::default()
            },
            ..Default::default()
        },
    );
    task.metadata.namespace = Some("default".into());
    task.metadata.uid = Some(format!("uid-{name}"));
    task.status = Some(TaskStatus {
        state: Some(state),
        attempt: 1,
        robot: Some(robot.into()),
        ..Default::default()
    });
    task
}

fn names(held: &[Held]) -> Vec<&str> {
    held.iter().map(|h| h.name.as_str()).collect()
}

fn fleet() -> Vec<Task> {
    vec![
        task("job-a-0", TaskKind::Batch, TaskState::Running, "rb1"),
        task("job-b-0", TaskKind::Batch, TaskState::Dispatching, "rb1"),
        task("nav-0", TaskKind::Service, TaskState::Running, "rb1"),
        task("job-c-0", TaskKind::Batch, TaskState::Running, "rb2"),
        task("job-d-0", TaskKind::Batch, TaskState::Completed, "rb1"),
        task("job-e-0", TaskKind::Batch, TaskState::Pending, "rb1"),
    ]
}

#[test]
fn robots_are_named_as_kubectl_names_them() {
    assert_eq!(parse_robot("rb1").unwrap(), "rb1");
    assert_eq!(parse_robot("robot/rb1").unwrap(), "rb1");
    assert_eq!(parse_robot("rbt/rb1").unwrap(), "rb1");
    assert_eq!(parse_robot("robots.robot.k8s4r.io/rb1").unwrap(), "rb1");
    assert!(parse_robot("task/rb1")
        .unwrap_err()
        .to_string()
        .contains("not a robot"));
    assert!(parse_robot("robot/").is_err());
}

#[test]
fn cordon_says_what_it_did_as_kubectl_does() {
    assert_eq!(cordon_line("rb1", true, true), "robot/rb1 cordoned");
    assert_eq!(cordon_line("rb1", true, false), "robot/rb1 already cordoned");
    assert_eq!(cordon_line("rb1", false, true), "robot/rb1 uncordoned");
    assert_eq!(cordon_line("rb1", false, false), "robot/rb1 already uncordoned");
}

#[test]
fn a_drain_evicts_what_runs_on_the_robot_and_leaves_services_unless_told() {
    let tasks = fleet();
    let plan = plan_drain(&tasks, "rb1", Services::Leave, &HashMap::new());
    assert_eq!(names(&plan.evict), ["default/job-a-0", "default/job-b-0"]);
    assert_eq!(names(&plan.waiting), ["default/job-a-0", "default/job-b-0"]);
    assert_eq!(names(&plan.left), ["default/nav-0"]);
    assert_eq!(plan.evict[0].key, ("uid-job-a-0".to_owned(), 1));

    let plan = plan_drain(&tasks, "rb1", Services::Stop, &HashMap::new());
    assert_eq!(
        names(&plan.evict),
        ["default/job-a-0", "default/job-b-0", "default/nav-0"]
    );
    assert!(plan.left.is_empty());
}

#[test]
fn a_task_is_asked_once_per_attempt_and_its_leaving_is_seen() {
    let mut tasks = fleet();
    let asked: HashMap<(String, u32), String> = [
        (("uid-job-a-0".to_owned(), 1), "default/job-a-0".to_owned()),
        (("uid-job-b-0".to_owned(), 1), "default/job-b-0".to_owned()),
    ]
    .into();
    let plan = plan_drain(&tasks, "rb1", Services::Leave, &asked);
    assert!(plan.evict.is_empty(), "asked already: {plan:?}");
    assert_eq!(plan.waiting.len(), 2);
    assert!(gone(&asked, &plan.waiting).is_empty());
    // job-a-0 waits for another robot; job-b-0 was placed here again (a
    // new attempt): it is asked again.
    tasks[0].status.as_mut().unwrap().state = Some(TaskState::Pending);
    tasks[1].status.as_mut().unwrap().attempt = 2;
    let plan = plan_drain(&tasks, "rb1", Services::Leave, &asked);
    assert_eq!(names(&plan.evict), ["default/job-b-0"]);
    assert_eq!(
        gone(&asked, &plan.waiting),
        ["default/job-a-0", "default/job-b-0"]
    );
}

#[test]
fn a_drain_out_of_time_names_what_is_still_there() {
    let mut evicting = task("job-a-0", TaskKind::Batch, TaskState::Running, "rb1");
    evicting.status.as_mut().unwrap().eviction = Some(ManualAction {
        value: "v".into(),
        attempt: 1,
        at: jiff::Timestamp::UNIX_EPOCH,
        ..Default::default()
    });
    let tasks = [
        evicting,
        task("job-b-0", TaskKind::Batch, TaskState::Dispatching, "rb1"),
    ];
    let plan = plan_drain(&tasks, "rb1", Services::Leave, &HashMap::new());
    assert!(plan.waiting[0].evicting && !plan.waiting[1].evicting);
    let message = timeout_message("rb1", Duration::from_secs(300), &plan.waiting, false);
    assert_eq!(
        message,
        "robot/rb1 not drained within 5m: still on it: default/job-a-0 (running), \
         default/job-b-0 (dispatching; the manager has not acted on its eviction: is k8s4r-manager running?)"
    );
    let message = timeout_message("rb1", Duration::from_secs(60), &plan.waiting[..1], true);
    assert!(
        message.ends_with("(robot/rb1 is offline: it stops them when it is back)"),
        "{message}"
    );
}

#[test]
fn drain_flags_read_as_documented() {
    let args = crate::Args::try_parse_from(["k8s4r", "drain", "rb1"]).unwrap();
    let crate::Command::Drain(drain) = args.command else {
        panic!("not a drain")
    };
    assert_eq!(
        (drain.services, drain.timeout),
        (Services::Leave, Duration::from_secs(300))
    );
    let args = crate::Args::try_parse_from([
        "k8s4r",
        "drain",
        "robot/rb1",
        "--services",
        "stop",
        "--timeout",
        "0",
        "-n",
        "lab",
    ])
    .unwrap();
    let crate::Command::Drain(drain) = args.command else {
        panic!("not a drain")
    };
    assert_eq!((drain.services, drain.timeout), (Services::Stop, Duration::ZERO));
    assert_eq!(drain.kube.namespace.as_deref(), Some("lab"));
    assert!(
        crate::Args::try_parse_from(["k8s4r", "cordon"]).is_err(),
        "a robot is needed"
    );
}
