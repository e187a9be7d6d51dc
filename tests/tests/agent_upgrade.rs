//! Agent upgrades end to end: real agents, each run by a stand-in for
//! systemd that follows `systemd/k8s4r-agent.service` (boot check before
//! every start, restart after every exit), real Mosquitto, the whole
//! stack, and AgentRollouts of real binaries signed with `k8s4r
//! sign-agent` and served over HTTP.

mod support;
#[path = "support/upgrades.rs"]
mod upgrades;

use std::collections::{BTreeMap, BTreeSet};
use std::path::Path;
use std::time::{Duration, Instant};

use k8s4r::up::kubeconfig_path;
use k8s4r_api::names::{ANNOTATION_AGENT_ROLLOUT, LABEL_JOB};
use k8s4r_api::{Robot, RobotPhase, RobotUpgradePhase, RolloutState, TaskState};
use k8s4r_e2e::NEXT_VERSION;
use kube::api::ListParams;
use kube::ResourceExt;
use support::{eventually, job_json, kubectl};
use upgrades::{fleet, slot_of, upgrade_of, version_of, Fleet, OLD_VERSION, ROLLOUT_DEADLINE};

fn alive(pid: i32) -> bool {
    nix::sys::signal::kill(nix::unistd::Pid::from_raw(pid), None).is_ok()
}

async fn read_pid(path: &Path) -> i32 {
    support::read_pid(path).await
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_rollout_reaches_three_robots_one_at_a_time_and_their_services_keep_running() {
    let robots = ["up-a", "up-b", "up-c"];
    let f = fleet(&robots, &[]).await;
    // A service on every robot, whose pid must not change.
    let script = format!(
        "echo $$ > {}/svc-$K8S4R_ROBOT_ID.pid; exec sleep 3600",
        f.env.scratch.display()
    );
    let mut task = support::sh(&script, "2h");
    task["kind"] = serde_json::json!("service");
    f.env
        .create_job(job_json(
            "svc",
            serde_json::json!([{ "name": "g", "mode": "everyRobot", "task": task }]),
        ))
        .await;
    let mut pids = BTreeMap::new();
    for robot in robots {
        let pid = read_pid(&f.env.scratch.join(format!("svc-{robot}.pid"))).await;
        pids.insert(robot, pid);
    }

    f.roll_out("next", "next", 1, 0, "60s").await;
    let started = Instant::now();
    let mut order: Vec<String> = Vec::new();
    let mut seen_marked: BTreeSet<String> = BTreeSet::new();
    loop {
        assert!(
            started.elapsed() < ROLLOUT_DEADLINE,
            "the rollout did not complete; order so far {order:?}"
        );
        let list = f
            .robots()
            .list(&ListParams::default())
            .await
            .expect("list robots");
        let marked: Vec<String> = list
            .items
            .iter()
            .filter(|r| r.annotations().contains_key(ANNOTATION_AGENT_ROLLOUT))
            .map(ResourceExt::name_any)
            .collect();
        assert!(
            marked.len() <= 1,
            "maxParallel 1, yet {marked:?} are marked at once"
        );
        let switching = list
            .items
            .iter()
            .filter(|r| {
                upgrade_of(r).is_some_and(|(_, phase, _)| {
                    matches!(
                        phase,
                        RobotUpgradePhase::Downloading
                            | RobotUpgradePhase::Staged
                            | RobotUpgradePhase::Restarting
                    )
                })
            })
            .count();
        assert!(
            switching <= 1,
            "maxParallel 1, yet {switching} robots upgrade at once"
        );
        seen_marked.extend(marked);
        for r in &list.items {
            if version_of(r) == Some(NEXT_VERSION) && !order.contains(&r.name_any()) {
                order.push(r.name_any());
            }
        }
        let rollout = f.rollouts().get("next").await.expect("read the rollout");
        if rollout.status.as_ref().and_then(|s| s.state) == Some(RolloutState::Complete) {
            let s = rollout.status.unwrap();
            assert_eq!((s.robots, s.upgraded, s.failed), (3, 3, 0));
            break;
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    assert_eq!(order.len(), 3, "every robot runs the new agent: {order:?}");
    assert_eq!(seen_marked.len(), 3, "each robot was ordered: {seen_marked:?}");
    for robot in robots {
        // The rollout counts a robot done once it runs the version; the
        // robot's own report that its trial passed may follow a moment
        // later.
        let r = k8s4r_testbed::eventually(
            ROLLOUT_DEADLINE,
            "the robot's upgrade reported healthy",
            || async {
                let r = f.robot(robot).await;
                (upgrade_of(&r).map(|u| u.1) == Some(RobotUpgradePhase::Healthy)).then_some(r)
            },
        )
        .await;
        assert_eq!(version_of(&r), Some(NEXT_VERSION));
        assert_eq!(r.status.as_ref().and_then(|s| s.phase), Some(RobotPhase::Online));
        let slots = f.slots(robot);
        let next = slot_of(NEXT_VERSION, &slots);
        assert_eq!(
            slots.current(),
            Some(next.clone()),
            "{robot} starts the new binary"
        );
        assert_eq!(slots.confirmed(), Some(next), "{robot} confirmed it");
        assert!(slots.trial().is_none());
        assert!(f.units[robot].starts() >= 2, "{robot}'s agent was restarted");
        assert!(alive(pids[robot]), "{robot}'s service survived the upgrade");
    }
    // The services were re-adopted, not restarted: the same pids, the
    // same attempt, no restart.
    let tasks = f
        .env
        .tasks()
        .list(&ListParams::default().labels(&format!("{LABEL_JOB}=svc")))
        .await
        .expect("list tasks");
    for t in &tasks.items {
        let s = t.status.as_ref().expect("status");
        assert_eq!(s.state, Some(TaskState::Running), "{}", t.name_any());
        assert_eq!((s.attempt, s.restarts.restart_count), (1, 0), "{}", t.name_any());
    }
    for robot in robots {
        let pid = read_pid(&f.env.scratch.join(format!("svc-{robot}.pid"))).await;
        assert_eq!(pid, pids[robot], "{robot}'s service kept its pid");
    }
    let shown = kubectl(&kubeconfig_path(&f.env.data_dir), &["get", "rar", "next"]);
    assert!(
        shown.contains("Complete") && shown.contains(NEXT_VERSION),
        "kubectl get rar shows it: {shown}"
    );
    f.stop().await;
}

/// Waits for the rollout to pause on a failure, and checks that exactly
/// one robot took the upgrade and rolled back, with a reason containing
/// `why`, and is Online on the old agent, while the others were never
/// touched. Returns that robot.
async fn one_rolled_back(f: &Fleet, rollout: &str, why: &str, within: Duration) -> String {
    let r = f
        .wait_state(rollout, RolloutState::PausedOnFailures, within)
        .await;
    let status = r.status.expect("status");
    assert_eq!((status.failed, status.upgraded), (1, 0), "{status:?}");
    let list = f
        .robots()
        .list(&ListParams::default())
        .await
        .expect("list robots");
    let rolled: Vec<&Robot> = list
        .items
        .iter()
        .filter(|r| upgrade_of(r).is_some_and(|(name, _, _)| name == rollout))
        .collect();
    assert_eq!(rolled.len(), 1, "only one robot took the upgrade");
    let robot = rolled[0].name_any();
    let (_, phase, reason) = upgrade_of(rolled[0]).expect("its report");
    assert_eq!(phase, RobotUpgradePhase::RolledBack, "{robot}: {reason:?}");
    let reason = reason.unwrap_or_default();
    assert!(reason.contains(why), "{robot}'s reason `{reason}` says `{why}`");
    let back = f.robot(&robot).await;
    assert_eq!(
        version_of(&back),
        Some(OLD_VERSION),
        "{robot} runs the old agent again"
    );
    let slots = f.slots(&robot);
    assert_eq!(slots.current(), Some(slot_of(OLD_VERSION, &slots)));
    assert!(slots.trial().is_none());
    for other in list.items.iter().filter(|r| r.name_any() != robot) {
        let name = other.name_any();
        assert!(
            !other.annotations().contains_key(ANNOTATION_AGENT_ROLLOUT),
            "{name} was never ordered"
        );
        assert_eq!(version_of(other), Some(OLD_VERSION));
        assert_eq!(f.units[&name].starts(), 1, "{name}'s agent was never restarted");
    }
    robot
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_broken_new_agent_is_rolled_back_by_the_robot_and_max_failed_zero_pauses_the_rollout() {
    let f = fleet(&["bad-a", "bad-b", "bad-c"], &[]).await;
    // Exits at every start: the boot check counts its starts and switches
    // back after three.
    let health = Duration::from_secs(30);
    f.roll_out("crash", "crash", 1, 0, "30s").await;
    let started = Instant::now();
    one_rolled_back(&f, "crash", "exited 3 times", health + Duration::from_secs(60)).await;
    println!(
        "crashing binary rolled back and reported in {:?}",
        started.elapsed()
    );
    f.delete_rollout("crash").await;

    // Starts, but cannot reach the broker: it gives itself up at its
    // health timeout.
    let health = Duration::from_secs(15);
    f.roll_out("lost", "lost", 1, 0, "15s").await;
    let started = Instant::now();
    one_rolled_back(&f, "lost", "health timeout", health + Duration::from_secs(60)).await;
    let took = started.elapsed();
    println!("unreachable binary rolled back and reported in {took:?}");
    // From the order to the old agent confirmed again: the health timeout,
    // one restart (RestartSec) and a registration.
    assert!(took < health + Duration::from_secs(30), "{took:?}");
    f.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_forged_signature_a_wrong_digest_another_architecture_and_an_older_release_are_refused_before_any_switch(
) {
    let f = fleet(&["ref-a"], &[]).await;
    let robot = "ref-a";
    for (artifact, why) in [
        ("forged", "signature does not verify"),
        ("digest", "sha256"),
        ("arm", "built for aarch64"),
        ("older", "is older than"),
    ] {
        f.roll_out(artifact, artifact, 1, 0, "60s").await;
        let r = f
            .wait_state(artifact, RolloutState::PausedOnFailures, support::DEADLINE)
            .await;
        let entry = &r.status.expect("status").robot_upgrades[0];
        assert_eq!(entry.phase, RobotUpgradePhase::Failed, "{artifact}: {entry:?}");
        let reason = entry.reason.clone().unwrap_or_default();
        assert!(reason.contains(why), "{artifact}: `{reason}` says `{why}`");
        let robot_now = f.robot(robot).await;
        assert_eq!(version_of(&robot_now), Some(OLD_VERSION));
        let slots = f.slots(robot);
        assert_eq!(
            slots.current(),
            Some(slot_of(OLD_VERSION, &slots)),
            "{artifact}: nothing switched"
        );
        assert!(
            !slot_of(NEXT_VERSION, &slots).exists(),
            "{artifact}: nothing staged"
        );
        assert!(slots.trial().is_none());
        assert_eq!(
            f.units[robot].starts(),
            1,
            "{artifact}: the agent was never restarted"
        );
        f.delete_rollout(artifact).await;
    }
    f.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn sigkill_at_each_step_of_the_switch_leaves_robots_that_come_back_and_finish() {
    let steps = [
        ("kill-downloaded", "downloaded"),
        ("kill-staged", "staged"),
        ("kill-switched", "switched"),
        ("kill-trial", "trial-start"),
    ];
    let robots: Vec<&str> = steps.iter().map(|(r, _)| *r).collect();
    let f = fleet(&robots, &steps).await;
    f.roll_out("next", "next", 4, 4, "60s").await;
    let done = k8s4r_testbed::eventually(ROLLOUT_DEADLINE, "the rollout complete or paused", || async {
        let r = f.rollouts().get("next").await.ok()?;
        let state = r.status.as_ref()?.state?;
        matches!(state, RolloutState::Complete | RolloutState::PausedOnFailures).then_some(r)
    })
    .await;
    for (robot, step) in steps {
        assert!(
            f.env.dir.path().join(format!("{robot}.failpoint")).exists(),
            "{robot}'s agent reached {step} and was killed there"
        );
        let r = f.robot(robot).await;
        assert_eq!(
            r.status.as_ref().and_then(|s| s.phase),
            Some(RobotPhase::Online),
            "{robot} came back"
        );
        let version = version_of(&r).unwrap_or_default().to_owned();
        assert!(
            version == NEXT_VERSION || version == OLD_VERSION,
            "{robot} runs one of the two binaries: {version}"
        );
        let slots = f.slots(robot);
        let current = slots.current().expect("a current binary");
        assert!(
            current == slot_of(NEXT_VERSION, &slots) || current == slot_of(OLD_VERSION, &slots),
            "{robot}: {current:?}"
        );
    }
    // Each kill costs a restart, not the upgrade: all four finish.
    let status = done.status.expect("status");
    assert_eq!(status.state, Some(RolloutState::Complete), "{status:?}");
    assert_eq!(status.upgraded, 4);
    f.stop().await;
}

/// A new agent that hangs (stopped, before the cluster could confirm it):
/// its own trial deadline hangs with it, so only systemd's watchdog sees
/// it. The stand-in follows the unit's WatchdogSec and TimeoutAbortSec;
/// the boot check at the next start rolls it back. Back on the old agent
/// within the health timeout, the watchdog interval and 10 s, from the
/// switch (the download and checks before it are not the hang's).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_new_agent_that_hangs_is_killed_by_the_watchdog_and_rolled_back() {
    let f = fleet(&["hang-a"], &[]).await;
    let unit = k8s4r_e2e::upgrade::UnitFile::parse(&k8s4r_e2e::upgrade::unit_file_text(), &[]);
    let watchdog = unit.watchdog.expect("the unit sets WatchdogSec");
    let health = Duration::from_secs(15);
    f.roll_out("hang", "hang", 1, 0, "15s").await;
    // The switch: the old agent restarts into the new one.
    let deadline = Instant::now() + Duration::from_secs(120);
    while f.units["hang-a"].starts() < 2 {
        assert!(Instant::now() < deadline, "the robot never switched");
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    let switched = Instant::now();
    let bound = health + watchdog + Duration::from_secs(10);
    one_rolled_back(&f, "hang", "health timeout", bound + Duration::from_secs(30)).await;
    let took = switched.elapsed();
    println!("hung binary rolled back and reported in {took:?} from the switch");
    assert!(f.units["hang-a"].watchdog_kills() >= 1, "the watchdog killed it");
    assert!(took < bound, "{took:?}, over {bound:?}");
    f.stop().await;
}

/// The operator role may patch Robots (to cordon them), so it can set the
/// annotation that points a robot at a rollout. That alone orders nothing:
/// the server sends an order only when the rollout's own status (the
/// manager's alone to write) lists the robot, and the rollout progresses
/// and selects it.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_operator_marking_a_robot_for_a_rollout_orders_no_upgrade() {
    let f = fleet(&["op-a"], &[]).await;
    let robot = "op-a";
    let kc = kubeconfig_path(&f.env.data_dir);
    // The operator role, and reading (kubectl reads before it patches).
    for role in ["k8s4r-operator", "k8s4r-viewer"] {
        kubectl(
            &kc,
            &[
                "create",
                "clusterrolebinding",
                &format!("ops-{role}"),
                &format!("--clusterrole={role}"),
                "--user=ops",
            ],
        );
    }
    for (name, selector, paused) in [
        (
            "elsewhere",
            serde_json::json!({"matchLabels": {"fleet": "nobody"}}),
            false,
        ),
        ("held", serde_json::json!({}), true),
    ] {
        let spec = serde_json::json!({"robotSelector": selector, "paused": paused});
        f.roll_out_with(name, "next", 1, 0, "60s", spec).await;
        // What the operator may do (patch, not read), and does.
        let mark = serde_json::json!({"metadata": {"annotations": {ANNOTATION_AGENT_ROLLOUT: name}}});
        kubectl(
            &kc,
            &[
                "patch",
                "robot",
                robot,
                "--type=merge",
                "-p",
                &mark.to_string(),
                "--as=ops",
            ],
        );
        // Unmarked at once, the robot would have had its order within a
        // second or two; give it ten.
        let until = Instant::now() + Duration::from_secs(10);
        while Instant::now() < until {
            let r = f.robot(robot).await;
            assert_eq!(upgrade_of(&r), None, "{name}: the robot acted on an order");
            tokio::time::sleep(Duration::from_millis(200)).await;
        }
        let slots = f.slots(robot);
        assert!(
            !slot_of(NEXT_VERSION, &slots).exists(),
            "{name}: nothing downloaded"
        );
        assert_eq!(
            f.units[robot].starts(),
            1,
            "{name}: the agent was never restarted"
        );
    }
    // Creating a rollout is a cluster-wide grant the operator lacks.
    let out = std::process::Command::new("kubectl")
        .args(["--kubeconfig"])
        .arg(&kc)
        .args([
            "patch",
            "agentrollout",
            "held",
            "--type=merge",
            "-p",
            r#"{"spec":{"paused":false}}"#,
            "--as=ops",
        ])
        .output()
        .expect("kubectl");
    assert!(!out.status.success(), "the operator may not resume a rollout");
    f.stop().await;
}

/// `when: docked In [true]`: an undocked robot is not ordered, and says
/// why in the rollout's status; once its facts say docked, it upgrades.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_rollout_with_when_docked_upgrades_a_robot_only_once_it_is_docked() {
    let f = fleet(&["dock-a"], &[]).await;
    let robot = "dock-a";
    f.set_facts(robot, serde_json::json!({"docked": false}));
    eventually("the cluster knows the robot is undocked", || async {
        let facts = f.robot(robot).await.status?.facts;
        (facts.get("docked")?.to_string() == "false").then_some(())
    })
    .await;
    let when = serde_json::json!({"when": [{"key": "docked", "operator": "In", "values": ["true"]}]});
    f.roll_out_with("docked", "next", 1, 0, "60s", when).await;
    let waiting = eventually("the rollout says why the robot waits", || async {
        let r = f.rollouts().get("docked").await.ok()?;
        let entry = r.status?.robot_upgrades.into_iter().find(|e| e.robot == robot)?;
        entry
            .reason
            .filter(|why| why.contains("docked false, needs In [true]"))
    })
    .await;
    // Waiting, it is never ordered.
    let until = Instant::now() + Duration::from_secs(5);
    while Instant::now() < until {
        assert_eq!(
            upgrade_of(&f.robot(robot).await),
            None,
            "ordered while undocked ({waiting})"
        );
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
    assert_eq!(f.units[robot].starts(), 1);
    f.set_facts(robot, serde_json::json!({"docked": true}));
    f.wait_state("docked", RolloutState::Complete, ROLLOUT_DEADLINE)
        .await;
    assert_eq!(version_of(&f.robot(robot).await), Some(NEXT_VERSION));
    f.stop().await;
}

/// `waitForTasks: batch`: a robot running a batch task is cordoned and not
/// ordered until the task ends by itself (completed, attempt 1); its
/// service keeps running across the upgrade (same pid), and the rollout
/// lifts the cordon once the robot is upgraded.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_rollout_waiting_for_batch_tasks_upgrades_after_the_mission_and_keeps_the_service() {
    let f = fleet(&["mission-a"], &[]).await;
    let robot = "mission-a";
    let scratch = &f.env.scratch;
    let (release, svc_pid) = (scratch.join("release"), scratch.join("svc.pid"));
    let mission = support::sh(
        &format!(
            "while [ ! -e {} ]; do sleep 0.1; done; echo mission done",
            release.display()
        ),
        "10m",
    );
    f.env
        .create_job(job_json(
            "mission",
            serde_json::json!([{ "name": "g", "count": 1, "task": mission }]),
        ))
        .await;
    let mut service = support::sh(
        &format!("echo $$ > {}; while :; do sleep 1; done", svc_pid.display()),
        "0s",
    );
    service.as_object_mut().expect("a task").remove("timeout");
    service["kind"] = "service".into();
    f.env
        .create_job(job_json(
            "svc",
            serde_json::json!([{ "name": "g", "count": 1, "task": service }]),
        ))
        .await;
    for job in ["mission", "svc"] {
        eventually(&format!("{job} runs"), || async {
            let tasks = f.env.job_tasks(job).await;
            let running = tasks.iter().any(|t| {
                t.status
                    .as_ref()
                    .is_some_and(|s| s.state == Some(TaskState::Running))
            });
            running.then_some(())
        })
        .await;
    }
    let pid = read_pid(&svc_pid).await;
    let wait = serde_json::json!({"waitForTasks": "batch"});
    f.roll_out_with("after-mission", "next", 1, 0, "60s", wait).await;
    eventually("the robot is cordoned while its mission runs", || async {
        let r = f.robot(robot).await;
        r.spec.unschedulable.then_some(())
    })
    .await;
    let until = Instant::now() + Duration::from_secs(5);
    while Instant::now() < until {
        assert_eq!(upgrade_of(&f.robot(robot).await), None, "ordered mid-mission");
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
    std::fs::write(&release, "").expect("end the mission");
    let tasks = f.env.wait_tasks_final("mission", 1).await;
    let status = tasks[0].status.clone().unwrap_or_default();
    assert_eq!(
        (status.state, status.attempt),
        (Some(TaskState::Completed), 1),
        "the mission ended by itself: {status:?}"
    );
    f.wait_state("after-mission", RolloutState::Complete, ROLLOUT_DEADLINE)
        .await;
    assert_eq!(version_of(&f.robot(robot).await), Some(NEXT_VERSION));
    assert_eq!(read_pid(&svc_pid).await, pid, "the service kept its process");
    assert!(alive(pid), "the service runs on");
    eventually("the rollout lifts its cordon", || async {
        (!f.robot(robot).await.spec.unschedulable).then_some(())
    })
    .await;
    f.stop().await;
}
