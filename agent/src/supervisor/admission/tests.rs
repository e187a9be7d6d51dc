use futures::future::AbortHandle;
use k8s4r_api::{Quantity, TaskResources};
use tempfile::TempDir;

use super::*;
use crate::supervisor::disk::DiskSize;
use crate::supervisor::disk_watch::DiskWatch;
use crate::supervisor::fake::FakeDriver;
use crate::supervisor::table::{NewTask, Table, Task};

const MIB: u64 = 1 << 20;
/// The robot's task uids: three, far above any user of the machine the
/// tests run on (Admission bars the uids /etc/passwd has).
const FIRST: u32 = 3_900_000_000;
/// The launchers the robot offers, in order.
const DRIVERS: &[&str] = &["raw_exec", "exec"];

/// The admission of a robot whose agent is root or not, with the
/// default (locked) policy, at most 4 tasks and 3 task uids.
fn admission(agent_is_root: bool) -> (Admission, TempDir) {
    admission_with(agent_is_root, |_| {})
}

fn admission_with(agent_is_root: bool, adjust: impl FnOnce(&mut SupervisorConfig)) -> (Admission, TempDir) {
    let state = tempfile::tempdir().unwrap();
    let mut config = config(state.path());
    adjust(&mut config);
    (Admission::new(&config, agent_is_root, HashSet::new(), &[]), state)
}

fn config(state_dir: &Path) -> SupervisorConfig {
    SupervisorConfig {
        state_dir: state_dir.to_path_buf(),
        task_uids: FIRST..=FIRST + 2,
        max_tasks: 4,
        ..SupervisorConfig::default()
    }
}

/// An exec task that names no user: a uid of its own under a root agent.
fn exec() -> TaskTemplate {
    TaskTemplate {
        driver: "exec".into(),
        command: "true".into(),
        ..TaskTemplate::default()
    }
}

fn with_disk(template: TaskTemplate, disk: &str) -> TaskTemplate {
    TaskTemplate {
        resources: Some(TaskResources {
            disk: Some(Quantity::from(disk)),
            ..TaskResources::default()
        }),
        ..template
    }
}

/// Room for anything: no task held, an empty disk budget of 100 MiB.
fn room() -> Capacity {
    Capacity {
        held: 0,
        disk_taken: 0,
        disk_budget: 100 * MIB,
        disk_full: None,
    }
}

fn admitted(result: Result<Admitted, Failure>) -> Admitted {
    match result {
        Ok(admitted) => admitted,
        Err(f) => panic!("refused ({:?}): {}", f.reason, f.message),
    }
}

fn refused(result: Result<Admitted, Failure>) -> Failure {
    match result {
        Ok(a) => panic!("admitted as {:?}", a.run_as),
        Err(f) => f,
    }
}

/// The own uid a new task `uid` (or a resumed one) gets.
fn own_uid(a: &mut Admission, uid: &str, resumed: Option<Resumed>) -> Option<u32> {
    admitted(a.admit(uid, &exec(), resumed, DRIVERS, &room())).own_uid
}

fn resumed(uid: Option<u32>) -> Option<Resumed> {
    Some(Resumed { restarts: 2, uid })
}

#[test]
fn an_invalid_spec_is_refused_with_what_is_wrong() {
    let (mut a, _state) = admission(true);
    let no_command = TaskTemplate {
        command: String::new(),
        ..exec()
    };
    let f = refused(a.admit("t", &no_command, None, DRIVERS, &room()));
    assert_eq!(f.reason, TaskReason::InvalidSpec);
    assert!(
        f.message.starts_with("invalid spec: ") && f.message.contains("spec.command"),
        "{}",
        f.message
    );
    assert_eq!(
        own_uid(&mut a, "next", None),
        Some(FIRST),
        "a refusal takes no uid"
    );
}

#[test]
fn a_uid_that_cannot_name_a_directory_is_refused() {
    let (mut a, _state) = admission(true);
    let too_long = "x".repeat(201);
    for uid in ["", ".", "..", "a/b", "/", "a\0b", too_long.as_str()] {
        let f = refused(a.admit(uid, &exec(), None, DRIVERS, &room()));
        assert_eq!(f.reason, TaskReason::InvalidSpec, "{uid:?}");
        assert_eq!(f.message, "task uid cannot name a directory", "{uid:?}");
    }
    // Dots within a name, and the longest name, are fine.
    assert_eq!(own_uid(&mut a, "...", None), Some(FIRST));
    assert_eq!(own_uid(&mut a, &"x".repeat(200), None), Some(FIRST + 1));
}

#[test]
fn over_capacity_counts_the_tasks_then_a_full_disk_then_the_disk_budget() {
    let ten_mib = with_disk(exec(), "10Mi");
    let nearly_full = Capacity {
        held: 3,
        disk_taken: 90 * MIB,
        ..room()
    };
    assert_eq!(
        over_capacity(4, &nearly_full, &ten_mib),
        None,
        "exactly the budget fits"
    );
    let at_max = Capacity { held: 4, ..room() };
    assert_eq!(
        over_capacity(4, &at_max, &exec()).as_deref(),
        Some("this robot already holds its maximum of 4 tasks (max_tasks)")
    );
    let disk_full = Capacity {
        disk_full: Some((MIB, 2 * MIB)),
        ..room()
    };
    assert_eq!(
        over_capacity(4, &disk_full, &exec()).as_deref(),
        Some("the robot's disk is full (1.0 MiB free, 2.0 MiB kept for the agent); it takes no task until space is back")
    );
    let a_byte_more = Capacity {
        disk_taken: 90 * MIB + 1,
        ..nearly_full
    };
    assert_eq!(
        over_capacity(4, &a_byte_more, &ten_mib).as_deref(),
        Some("resources.disk of 10.0 MiB does not fit: its tasks take 90.0 MiB of the robot's disk budget of 100.0 MiB")
    );
    // A task that asks for no disk is not weighed against the budget,
    // and what is taken never overflows.
    let over_budget = Capacity {
        disk_taken: u64::MAX,
        ..room()
    };
    assert_eq!(over_capacity(4, &over_budget, &exec()), None);
    assert!(over_capacity(4, &over_budget, &ten_mib).is_some());
}

#[test]
fn a_robot_at_its_maximum_or_on_a_full_disk_refuses_as_over_capacity() {
    let (mut a, _state) = admission(true);
    let at_max = Capacity { held: 4, ..room() };
    let f = refused(a.admit("t", &exec(), None, DRIVERS, &at_max));
    assert_eq!(f.reason, TaskReason::OverCapacity);
    assert!(f.message.contains("maximum of 4 tasks"), "{}", f.message);
    let disk_full = Capacity {
        disk_full: Some((0, MIB)),
        ..room()
    };
    let f = refused(a.admit("t", &exec(), None, DRIVERS, &disk_full));
    assert_eq!(f.reason, TaskReason::OverCapacity);
    assert!(f.message.contains("disk is full"), "{}", f.message);
    assert_eq!(
        own_uid(&mut a, "next", None),
        Some(FIRST),
        "a refusal takes no uid"
    );
}

#[test]
fn a_driver_the_robot_does_not_offer_is_an_invalid_spec() {
    let (mut a, _state) = admission(false);
    let f = refused(a.admit("t", &exec(), None, &["raw_exec"], &room()));
    assert_eq!(f.reason, TaskReason::InvalidSpec);
    assert_eq!(f.message, "driver \"exec\" is not available on this robot");
    // The launcher is the offered one of that name.
    let ok = admitted(a.admit("t", &exec(), None, DRIVERS, &room()));
    assert_eq!(ok.driver, 1);
}

#[test]
fn a_policy_refusal_keeps_the_policys_reason_and_takes_no_uid() {
    let (mut a, _state) = admission(true);
    let raw = TaskTemplate {
        driver: "raw_exec".into(),
        ..exec()
    };
    let f = refused(a.admit("t", &raw, None, DRIVERS, &room()));
    assert_eq!(f.reason, TaskReason::NotPermitted);
    assert!(f.message.contains("raw_exec driver is off"), "{}", f.message);
    let root = TaskTemplate {
        user: Some("root".into()),
        ..exec()
    };
    assert_eq!(
        refused(a.admit("t", &root, None, DRIVERS, &room())).reason,
        TaskReason::NotPermitted
    );

    let (mut open, _state) = admission_with(true, |c| c.policy.raw_exec = true);
    let raw_with_user = TaskTemplate {
        user: Some("robot".into()),
        ..raw
    };
    let f = refused(open.admit("t", &raw_with_user, None, DRIVERS, &room()));
    assert_eq!(f.reason, TaskReason::InvalidSpec, "{}", f.message);
    assert_eq!(own_uid(&mut a, "next", None), Some(FIRST));
}

#[test]
fn a_task_that_runs_as_the_agent_or_a_named_user_takes_no_uid() {
    let (mut a, _state) = admission(false);
    let ok = admitted(a.admit("t", &exec(), None, DRIVERS, &room()));
    assert_eq!((ok.run_as, ok.own_uid), (RunAs::Agent, None));

    let (mut a, _state) = admission_with(true, |c| c.policy.allowed_users = vec!["robot".into()]);
    let named = TaskTemplate {
        user: Some("robot".into()),
        ..exec()
    };
    let ok = admitted(a.admit("t", &named, resumed(Some(FIRST + 1)), DRIVERS, &room()));
    assert_eq!((ok.run_as, ok.own_uid), (RunAs::Named("robot".into()), None));
    assert_eq!(
        own_uid(&mut a, "next", None),
        Some(FIRST),
        "the rotation did not move"
    );
}

#[test]
fn own_uids_come_from_the_rotation_until_every_one_is_in_use() {
    let (mut a, _state) = admission(true);
    let ok = admitted(a.admit("a", &exec(), None, DRIVERS, &room()));
    assert_eq!((ok.run_as, ok.own_uid), (RunAs::TaskUid(FIRST), Some(FIRST)));
    assert_eq!(own_uid(&mut a, "b", None), Some(FIRST + 1));
    assert_eq!(own_uid(&mut a, "c", None), Some(FIRST + 2));

    let f = refused(a.admit("d", &exec(), None, DRIVERS, &room()));
    assert_eq!(f.reason, TaskReason::OverCapacity);
    assert_eq!(
        f.message,
        format!("every task uid of this robot ({FIRST}-{}) is in use", FIRST + 2)
    );

    a.release(None);
    assert!(
        a.admit("d", &exec(), None, DRIVERS, &room()).is_err(),
        "nothing released"
    );
    a.release(Some(FIRST + 1));
    assert_eq!(own_uid(&mut a, "d", None), Some(FIRST + 1));
}

#[test]
fn a_resumed_task_gets_its_own_uid_back_when_it_is_free() {
    let (mut a, _state) = admission(true);
    assert_eq!(own_uid(&mut a, "old", resumed(Some(FIRST + 2))), Some(FIRST + 2));
    assert_eq!(
        own_uid(&mut a, "new", None),
        Some(FIRST),
        "the rotation did not move"
    );
    // Its uid is another task's now, or outside the range: the next in turn.
    assert_eq!(own_uid(&mut a, "old2", resumed(Some(FIRST))), Some(FIRST + 1));
    a.release(Some(FIRST + 1));
    assert_eq!(own_uid(&mut a, "old3", resumed(Some(7))), Some(FIRST + 1));
    a.release(Some(FIRST + 1));
    assert_eq!(own_uid(&mut a, "old4", resumed(None)), Some(FIRST + 1));
}

#[test]
fn a_barred_uid_never_comes_back() {
    let (mut a, _state) = admission(true);
    assert_eq!(own_uid(&mut a, "a", None), Some(FIRST));
    a.bar(FIRST);
    a.release(Some(FIRST));
    assert_eq!(own_uid(&mut a, "b", None), Some(FIRST + 1));
    assert_eq!(own_uid(&mut a, "c", None), Some(FIRST + 2));
    assert!(a.admit("d", &exec(), None, DRIVERS, &room()).is_err());
    a.release(Some(FIRST + 2));
    assert_eq!(
        own_uid(&mut a, "e", resumed(Some(FIRST))),
        Some(FIRST + 2),
        "not even to the task that had it"
    );
}

#[test]
fn uids_running_at_start_are_barred_but_a_readopted_tasks_own() {
    let state = tempfile::tempdir().unwrap();
    let running = HashSet::from([FIRST, FIRST + 1]);
    let mut a = Admission::new(&config(state.path()), true, running, &[FIRST + 1]);
    assert_eq!(
        own_uid(&mut a, "adopted", resumed(Some(FIRST + 1))),
        Some(FIRST + 1)
    );
    assert_eq!(own_uid(&mut a, "new", None), Some(FIRST + 2));
    assert!(a.admit("more", &exec(), None, DRIVERS, &room()).is_err());
}

#[test]
fn the_rotation_goes_on_from_the_position_kept_in_the_state_dir() {
    let state = tempfile::tempdir().unwrap();
    std::fs::write(state.path().join(UID_POSITION_FILE), format!("{}\n", FIRST + 1)).unwrap();
    let mut a = Admission::new(&config(state.path()), true, HashSet::new(), &[]);
    assert_eq!(own_uid(&mut a, "a", None), Some(FIRST + 1));

    // A position outside the range (the range changed) is ignored.
    std::fs::write(state.path().join(UID_POSITION_FILE), "12\n").unwrap();
    let mut a = Admission::new(&config(state.path()), true, HashSet::new(), &[]);
    assert_eq!(own_uid(&mut a, "a", None), Some(FIRST));
}

#[test]
fn a_restart_runs_as_the_policy_says_now() {
    let (a, _state) = admission(true);
    assert_eq!(a.rerun_as(&exec(), Some(FIRST)), Some(RunAs::TaskUid(FIRST)));
    assert_eq!(a.rerun_as(&exec(), None), None, "no uid of its own to run as");
    let raw = TaskTemplate {
        driver: "raw_exec".into(),
        ..exec()
    };
    assert_eq!(a.rerun_as(&raw, None), None, "the policy refuses it now");
    let (a, _state) = admission(false);
    assert_eq!(a.rerun_as(&exec(), Some(FIRST)), Some(RunAs::Agent));
}

#[test]
fn prep_input_keeps_the_rotations_position_only_for_a_new_uid() {
    let (mut a, state) = admission_with(true, |c| c.policy.allow_root = true);
    assert_eq!(own_uid(&mut a, "a", None), Some(FIRST));
    let input = |new_uid| {
        a.prep_input(
            PathBuf::from("/t/a-1"),
            Arc::new(FakeDriver::default()),
            exec(),
            RunAs::TaskUid(FIRST),
            true,
            new_uid,
        )
    };
    let new = input(true);
    assert_eq!(
        new.new_uid_position,
        Some((state.path().join(UID_POSITION_FILE), FIRST + 1))
    );
    assert!(new.allow_root && new.keep_dir);
    assert_eq!(
        (new.dir.as_path(), &new.run_as),
        (Path::new("/t/a-1"), &RunAs::TaskUid(FIRST))
    );
    assert_eq!(input(false).new_uid_position, None);
}

#[tokio::test]
async fn preparing_makes_a_fresh_closed_task_dir_or_completes_a_kept_one() {
    let tasks = tempfile::tempdir().unwrap();
    let dir = tasks.path().join("t-1");
    let (a, _state) = admission(false);
    let input = |keep_dir| {
        a.prep_input(
            dir.clone(),
            Arc::new(FakeDriver::default()),
            exec(),
            RunAs::Agent,
            keep_dir,
            false,
        )
    };
    let mode = |sub: &str| {
        let meta = std::fs::metadata(dir.join(sub)).unwrap();
        meta.permissions().mode() & 0o777
    };

    let prepared = prepare(input(false))
        .await
        .unwrap_or_else(|f| panic!("{}", f.message));
    assert_eq!(prepared.task_dir, dir.join("work"));
    assert!(prepared.identity.is_none(), "the agent's own user");
    // Others may pass through to work/ (the task's own), never into
    // logs/ or fetch/.
    assert_eq!((mode(""), mode("logs"), mode("fetch")), (0o711, 0o700, 0o700));

    std::fs::write(dir.join("work/kept"), "x").unwrap();
    std::fs::remove_dir(dir.join("fetch")).unwrap();
    std::fs::set_permissions(&dir, std::fs::Permissions::from_mode(0o755)).unwrap();
    prepare(input(true))
        .await
        .unwrap_or_else(|f| panic!("{}", f.message));
    assert!(dir.join("work/kept").exists(), "a kept directory keeps its files");
    assert!(dir.join("fetch").is_dir(), "what it lacks is made again");
    assert_eq!((mode(""), mode("fetch")), (0o711, 0o700));

    prepare(input(false))
        .await
        .unwrap_or_else(|f| panic!("{}", f.message));
    assert!(!dir.join("work/kept").exists(), "a new attempt starts afresh");
}

#[test]
fn capacity_counts_what_each_held_task_takes_or_may_take() {
    let state = tempfile::tempdir().unwrap();
    let config = SupervisorConfig {
        disk_budget: DiskSize::Bytes(500 * MIB),
        ..config(state.path())
    };
    let disk = DiskWatch::new(&config, state.path().join("tasks"), 1 << 40);
    let mut table = Table::new();
    for (uid, limit, used) in [
        ("a", Some("10Mi"), 3 * MIB),
        ("b", Some("10Mi"), 12 * MIB),
        ("c", None, 5 * MIB),
    ] {
        let template = match limit {
            Some(limit) => with_disk(exec(), limit),
            None => exec(),
        };
        let new = NewTask {
            uid: uid.into(),
            attempt: 1,
            name: uid.into(),
            dir: PathBuf::from("/t"),
            template,
            driver: 0,
            own_uid: None,
        };
        let mut task = Task::preparing(new, AbortHandle::new_pair().0);
        task.disk_used = used;
        table.insert(task);
    }
    let c = Capacity::of(&table, &disk);
    assert_eq!(c.held, 3);
    assert_eq!(c.disk_taken, (10 + 12 + 5) * MIB);
    assert_eq!(c.disk_budget, 500 * MIB);
    assert_eq!(c.disk_full, None);
}
