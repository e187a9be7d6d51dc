//! End-to-end, issue 28: the robot's state and its maintenance, on the
//! whole stack with real agent processes and a real Mosquitto. A robot's
//! facts (a file its software writes) decide which tasks start there and
//! which keep running; a malformed file is refused and said so while the
//! robot keeps working; `k8s4r drain` empties a robot, its batch tasks
//! finishing elsewhere exactly once.

use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

use k8s4r::up::kubeconfig_path;
use k8s4r_api::names::CONDITION_ACCEPTING_TASKS;
use k8s4r_api::{Robot, RobotPhase, TaskReason, TaskState};
use kube::Api;

mod support;
use support::*;

/// Writes `robot`'s facts file as a careful robot does (rename into place).
fn write_facts(file: &Path, text: &str) {
    let tmp = file.with_extension("tmp");
    std::fs::write(&tmp, text).expect("write the facts");
    std::fs::rename(&tmp, file).expect("rename the facts into place");
}

/// An agent for `robot` reading its facts from a file (written first).
async fn robot_with_facts(env: &mut Env, robot: &str, facts: &str) -> PathBuf {
    let file = env.scratch.join(format!("{robot}-facts.json"));
    write_facts(&file, facts);
    let path = file.display().to_string();
    env.spawn_agent_with(robot, &["site=lab"], &["--facts-file", &path]);
    env.wait_phase(robot, RobotPhase::Online).await;
    file
}

fn charging_job(name: &str, marker: &Path) -> serde_json::Value {
    let mut task = sh(
        &format!("echo \"ran on $K8S4R_ROBOT_ID\" > {}", marker.display()),
        "1m",
    );
    task["when"] = serde_json::json!([{ "key": "battery", "operator": "Gt", "values": ["30"] }]);
    job_json(
        name,
        serde_json::json!([{ "name": "g", "count": 1, "task": task }]),
    )
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_robot_low_on_battery_gets_no_task_until_its_facts_say_it_may() {
    let mut env = Env::start(&[]).await;
    let facts = robot_with_facts(&mut env, "r1", r#"{"battery": 10, "docked": true}"#).await;
    let marker = env.scratch.join("charged");
    env.create_job(charging_job("charge", &marker)).await;

    // It waits, and says for what.
    let why = eventually("the task waits, naming its condition", || async {
        let task = env.job_tasks("charge").await.into_iter().next()?;
        let status = serde_json::to_string(task.status.as_ref()?).ok()?;
        status.contains("battery Gt 30").then_some(status)
    })
    .await;
    assert!(why.contains("0/1 robots"), "{why}");
    assert!(!marker.exists(), "it never ran");

    // kubectl shows the facts a label names.
    let kubeconfig = kubeconfig_path(&env.data_dir);
    kubectl(
        &kubeconfig,
        &["label", "robot", "r1", "robot.k8s4r.io/show-facts=battery.docked"],
    );
    let wide = eventually("the FACTS column", || async {
        let out = kubectl(&kubeconfig, &["get", "robots", "-o", "wide"]);
        out.contains("battery=10 docked=true").then_some(out)
    })
    .await;
    assert!(wide.contains("FACTS"), "{wide}");

    // The robot charges: the task starts within a second.
    let written = Instant::now();
    write_facts(&facts, r#"{"battery": 80, "docked": true}"#);
    eventually("the task ran", || async { marker.exists().then_some(()) }).await;
    let took = written.elapsed();
    assert!(
        took < Duration::from_secs(1),
        "the task started {took:?} after the robot charged"
    );
    let tasks = env.wait_tasks_final("charge", 1).await;
    let status = tasks[0].status.clone().unwrap_or_default();
    assert_eq!(status.state, Some(TaskState::Completed), "{status:?}");
    env.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_estop_stops_a_motion_task_and_a_malformed_facts_file_is_refused() {
    let mut env = Env::start(&[]).await;
    let facts = robot_with_facts(&mut env, "r1", r#"{"estop": false}"#).await;
    let up = env.scratch.join("motion.up");
    let mut task = sh(&format!("touch {}; sleep 300", up.display()), "10m");
    task["when"] = serde_json::json!([{ "key": "estop", "operator": "In", "values": ["false"], "whileRunning": "stop" }]);
    env.create_job(job_json(
        "motion",
        serde_json::json!([{ "name": "g", "count": 1, "task": task }]),
    ))
    .await;
    eventually("the motion task runs", || async { up.exists().then_some(()) }).await;
    write_facts(&facts, r#"{"estop": true}"#);
    let status = eventually("the task is stopped ConditionLost", || async {
        let s = env.job_tasks("motion").await.into_iter().next()?.status?;
        let lost = Some(TaskReason::ConditionLost);
        (s.reason == lost || s.attempts.iter().any(|a| a.reason == lost)).then_some(s)
    })
    .await;
    let said = serde_json::to_string(&status).unwrap_or_default();
    assert!(
        said.contains("estop In [false] no longer holds"),
        "the condition is named: {said}"
    );

    // A malformed file: refused, said so, and the robot keeps working.
    write_facts(&facts, "{\"estop\": fals");
    let robots: Api<Robot> = Api::all(env.client.clone());
    let condition = eventually("AcceptingTasks says the facts are refused", || async {
        let status = robots.get("r1").await.ok()?.status?;
        let c = status
            .conditions
            .into_iter()
            .find(|c| c.type_ == CONDITION_ACCEPTING_TASKS)?;
        (c.reason.as_deref() == Some("FactsRefused")).then_some(c)
    })
    .await;
    assert!(
        condition
            .message
            .as_deref()
            .unwrap_or_default()
            .contains("r1-facts.json"),
        "the file is named: {condition:?}"
    );
    let marker = env.scratch.join("still-works");
    env.create_job(job_json(
        "plain",
        serde_json::json!([{ "name": "g", "count": 1, "task": sh(&format!("touch {}", marker.display()), "1m") }]),
    ))
    .await;
    env.wait_tasks_final("plain", 1).await;
    assert!(marker.exists(), "a task without conditions still runs");
    env.stop().await;
}

/// Whether `pid` runs (not gone, not a zombie).
fn alive(pid: i32) -> bool {
    std::fs::read_to_string(format!("/proc/{pid}/stat")).is_ok_and(|s| {
        s.rsplit(')')
            .next()
            .is_some_and(|r| !r.trim_start().starts_with('Z'))
    })
}

/// A batch task that writes its pid to `<name>.pid` and its attempt to
/// `<name>.runs`, then runs until `<name>.go` exists.
fn until_go(env: &Env, name: &str) -> (String, std::path::PathBuf, std::path::PathBuf) {
    let at = |ext: &str| env.scratch.join(format!("{name}.{ext}"));
    let script = format!(
        "echo $$ >> {pid}; echo $K8S4R_TASK_ATTEMPT >> {runs}; while [ ! -e {go} ]; do sleep 0.1; done",
        pid = at("pid").display(),
        runs = at("runs").display(),
        go = at("go").display()
    );
    (script, at("pid"), at("go"))
}

/// A plain restart of the agent (SIGTERM, as `systemctl restart` and an
/// upgrade's switch send) leaves the robot's batch tasks running: the new
/// agent re-adopts them and reports each end with its own exit code, in
/// attempt 1, whether it came after the restart (`after`) or while no agent
/// ran (`gap`, kept by its shim).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_agent_restart_leaves_a_batch_task_running_and_it_completes_in_attempt_1() {
    let mut env = Env::start(&[("r1", &["site=lab"])]).await;
    let mut pids = Vec::new();
    let mut gos = Vec::new();
    for name in ["after", "gap"] {
        let (script, pid, go) = until_go(&env, name);
        env.create_job(job_json(
            name,
            serde_json::json!([{ "name": "g", "count": 1, "task": sh(&script, "10m") }]),
        ))
        .await;
        pids.push(pid);
        gos.push(go);
    }
    let pid_of =
        |file: &std::path::Path| -> Option<i32> { std::fs::read_to_string(file).ok()?.trim().parse().ok() };
    let running: Vec<i32> = eventually("both tasks run", || async {
        let both: Vec<i32> = pids.iter().filter_map(|p| pid_of(p)).collect();
        (both.len() == 2).then_some(both)
    })
    .await;
    env.stop_agent("r1");
    assert!(
        running.iter().all(|pid| alive(*pid)),
        "a task stopped with the agent"
    );
    // One ends while no agent runs.
    std::fs::write(&gos[1], "").unwrap();
    eventually("the gap task ends", || async {
        (!alive(running[1])).then_some(())
    })
    .await;
    env.spawn_agent("r1", &["site=lab"]);
    let log = env.dir.path().join("r1.log");
    eventually("the new agent re-adopting the task", || async {
        let log = std::fs::read_to_string(&log).ok()?;
        log.contains("re-adopting a batch task of the previous run")
            .then_some(())
    })
    .await;
    std::fs::write(&gos[0], "").unwrap();
    for name in ["after", "gap"] {
        let tasks = env.wait_tasks_final(name, 1).await;
        let status = tasks[0].status.clone().unwrap_or_default();
        assert_eq!(
            (status.state, status.exit_code, status.attempt),
            (Some(TaskState::Completed), Some(0), 1),
            "{name}: {status:?}"
        );
        assert!(status.attempts.is_empty(), "{name}: {:?}", status.attempts);
        let ran = std::fs::read_to_string(env.scratch.join(format!("{name}.runs"))).unwrap_or_default();
        assert_eq!(ran.lines().count(), 1, "{name} ran again: {ran}");
    }
    env.stop().await;
}

/// An agent SIGKILLed while it still holds a task's start report (the
/// `status_hold`) loses that report; the next agent re-adopts the task and
/// reports its start again, so the Task shows `running` with its start
/// time while it runs, not `dispatching` until its end. The first agent
/// holds for 10 s (the most allowed) so that the kill lands within it; the
/// second runs at the default.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_start_lost_with_a_killed_agent_is_reported_again_by_the_next() {
    let mut env = Env::start(&[]).await;
    env.spawn_agent_with("r1", &["site=lab"], &["--status-hold", "10s"]);
    env.wait_phase("r1", RobotPhase::Online).await;
    let (script, pid, go) = until_go(&env, "held");
    env.create_job(job_json(
        "held",
        serde_json::json!([{ "name": "g", "count": 1, "task": sh(&script, "10m") }]),
    ))
    .await;
    let pid: i32 = eventually("the task runs", || async {
        std::fs::read_to_string(&pid).ok()?.trim().parse().ok()
    })
    .await;
    let state =
        |tasks: Vec<k8s4r_api::Task>| tasks.first().and_then(|t| t.status.clone()).unwrap_or_default();
    env.kill_agent("r1");
    let before = state(env.job_tasks("held").await);
    assert_ne!(
        before.state,
        Some(TaskState::Running),
        "the start left before the kill, so this test shows nothing: {before:?}"
    );
    assert!(alive(pid), "the task died with the agent");
    env.spawn_agent("r1", &["site=lab"]);
    let running = eventually("the Task shows running again", || async {
        let status = state(env.job_tasks("held").await);
        (status.state == Some(TaskState::Running)).then_some(status)
    })
    .await;
    assert_eq!(running.attempt, 1, "{running:?}");
    assert!(running.start_time.is_some(), "{running:?}");
    std::fs::write(&go, "").unwrap();
    let tasks = env.wait_tasks_final("held", 1).await;
    let status = tasks[0].status.clone().unwrap_or_default();
    assert_eq!(
        (status.state, status.exit_code, status.attempt),
        (Some(TaskState::Completed), Some(0), 1),
        "{status:?}"
    );
    assert_eq!(status.start_time, running.start_time, "{status:?}");
    let ran = std::fs::read_to_string(env.scratch.join("held.runs")).unwrap_or_default();
    assert_eq!(ran.lines().count(), 1, "it ran again: {ran}");
    env.stop().await;
}

/// The unit's stop for good (`--stop-left-tasks` after the agent ended)
/// stops the batch task the agent left, and the next agent reports it
/// `AgentShutdown`: the task is not failed, its next attempt runs, using no
/// retry, and completes.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_units_stop_ends_a_batch_task_agent_shutdown_and_the_next_attempt_completes() {
    let mut env = Env::start(&[("r1", &["site=lab"])]).await;
    let runs = env.scratch.join("stop-runs");
    let script = format!(
        "echo $K8S4R_TASK_ATTEMPT >> {runs}; if [ \"$K8S4R_TASK_ATTEMPT\" = 1 ]; then sleep 300; fi",
        runs = runs.display()
    );
    env.create_job(job_json(
        "survey",
        serde_json::json!([{ "name": "g", "count": 1, "task": sh(&script, "10m") }]),
    ))
    .await;
    eventually("attempt 1 runs", || async {
        std::fs::read_to_string(&runs)
            .ok()
            .filter(|t| t.contains('1'))
            .map(|_| ())
    })
    .await;
    env.stop_agent("r1");
    env.stop_left_tasks("r1");
    env.spawn_agent("r1", &["site=lab"]);
    let tasks = env.wait_tasks_final("survey", 1).await;
    let status = tasks[0].status.clone().unwrap_or_default();
    assert_eq!(status.state, Some(TaskState::Completed), "{status:?}");
    let first = status.attempts.first().expect("attempt 1 is listed");
    assert_eq!(
        first.reason,
        Some(TaskReason::AgentShutdown),
        "{:?}",
        status.attempts
    );
    assert!(
        status
            .attempts
            .iter()
            .all(|a| a.reason == Some(TaskReason::AgentShutdown)),
        "a retry was used: {:?}",
        status.attempts
    );
    let ran = std::fs::read_to_string(&runs).unwrap_or_default();
    assert_eq!(ran.lines().next(), Some("1"), "{ran}");
    assert!(ran.lines().count() >= 2, "no next attempt ran: {ran}");
    env.stop().await;
}

/// An e-stop pressed four times is the robot doing its job: each press
/// stops the motion task (`whileRunning: stop`), the next attempt waits for
/// the e-stop's release, and no retry of either budget is used (the
/// manager's lost budget is 3: the fourth press used to fail the task for
/// good). Released, the task runs to its end and completes.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn four_estop_presses_pause_a_mission_that_then_completes_using_no_retry() {
    let mut env = Env::start(&[]).await;
    let facts = robot_with_facts(&mut env, "r1", r#"{"estop": false}"#).await;
    let runs = env.scratch.join("runs");
    let done = env.scratch.join("done");
    // Each attempt counts its start, then works 3 s (long enough for a
    // press) unless it is the fifth, which finishes.
    let script = format!(
        "echo $K8S4R_TASK_ATTEMPT >> {runs}; n=$(wc -l < {runs});          if [ \"$n\" -ge 5 ]; then touch {done}; exit 0; fi; sleep 300",
        runs = runs.display(),
        done = done.display()
    );
    let mut task = sh(&script, "10m");
    task["when"] = serde_json::json!([{ "key": "estop", "operator": "In", "values": ["false"], "whileRunning": "stop" }]);
    env.create_job(job_json(
        "mission",
        serde_json::json!([{ "name": "g", "count": 1, "task": task }]),
    ))
    .await;
    let started = |n: usize| {
        let runs = runs.clone();
        move || {
            let runs = runs.clone();
            async move {
                let text = std::fs::read_to_string(&runs).ok()?;
                (text.lines().count() >= n).then_some(())
            }
        }
    };
    for press in 1..=4 {
        eventually(&format!("attempt {press} runs"), started(press)).await;
        write_facts(&facts, r#"{"estop": true}"#);
        eventually(&format!("press {press} stops it"), || async {
            let s = env.job_tasks("mission").await.into_iter().next()?.status?;
            let stopped = s
                .attempts
                .iter()
                .filter(|a| a.reason == Some(TaskReason::ConditionLost))
                .count();
            (stopped >= press || (s.reason == Some(TaskReason::ConditionLost) && s.attempt as usize == press))
                .then_some(())
        })
        .await;
        // Pressed, nothing runs: the next attempt waits for the release.
        write_facts(&facts, r#"{"estop": false}"#);
    }
    eventually("the fifth attempt finishes the mission", || async {
        done.exists().then_some(())
    })
    .await;
    let tasks = env.wait_tasks_final("mission", 1).await;
    let status = tasks[0].status.clone().unwrap_or_default();
    assert_eq!(status.state, Some(TaskState::Completed), "{status:?}");
    // Every earlier attempt was an e-stop (or a dispatch the robot, still
    // pressed, refused as not ready): none a failure of the task.
    let stops = status
        .attempts
        .iter()
        .filter(|a| a.reason == Some(TaskReason::ConditionLost))
        .count();
    assert_eq!(stops, 4, "{:?}", status.attempts);
    assert!(
        status
            .attempts
            .iter()
            .all(|a| matches!(a.reason, Some(TaskReason::ConditionLost | TaskReason::NotReady))),
        "{:?}",
        status.attempts
    );
    env.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn drain_moves_a_robots_batch_tasks_elsewhere_once_and_leaves_its_service() {
    let mut env = Env::start(&[("r1", &["pool=x"])]).await;
    let marks = env.scratch.join("marks");
    let script = format!(
        "m={m}; echo \"$K8S4R_TASK_NAME $K8S4R_TASK_ATTEMPT $K8S4R_ROBOT_ID start\" >> $m; \
         trap 'echo \"$K8S4R_TASK_NAME $K8S4R_TASK_ATTEMPT $K8S4R_ROBOT_ID stopped\" >> $m; exit 143' TERM; \
         i=0; while [ $i -lt 40 ]; do sleep 0.1; i=$((i+1)); done; \
         echo \"$K8S4R_TASK_NAME $K8S4R_TASK_ATTEMPT $K8S4R_ROBOT_ID done\" >> $m",
        m = marks.display()
    );
    env.create_job(job_json(
        "batch",
        serde_json::json!([{ "name": "g", "count": 2, "task": sh(&script, "5m") }]),
    ))
    .await;
    let mut service = sh("while :; do sleep 1; done", "0s");
    service.as_object_mut().expect("a task").remove("timeout");
    service["kind"] = "service".into();
    env.create_job(job_json(
        "svc",
        serde_json::json!([{ "name": "g", "count": 1, "task": service }]),
    ))
    .await;
    for job in ["batch", "svc"] {
        eventually(&format!("{job} runs on r1"), || async {
            let tasks = env.job_tasks(job).await;
            tasks
                .iter()
                .all(|t| {
                    t.status.as_ref().is_some_and(|s| {
                        s.state == Some(TaskState::Running) && s.robot.as_deref() == Some("r1")
                    })
                })
                .then_some(())
                .filter(|_| !tasks.is_empty())
        })
        .await;
    }
    env.spawn_agent("r2", &["pool=x"]);
    env.wait_phase("r2", RobotPhase::Online).await;

    let args = k8s4r::drain::DrainArgs {
        robot: "robot/r1".into(),
        services: k8s4r::drain::Services::Leave,
        timeout: Duration::from_secs(60),
        kube: k8s4r::operate::KubeArgs {
            kubeconfig: Some(kubeconfig_path(&env.data_dir)),
            context: None,
            namespace: None,
        },
    };
    k8s4r::drain::drain(args, &env.data_dir)
        .await
        .expect("the drain ends");
    // When it returns, r1 holds no batch task, and takes no new one.
    let robots: Api<Robot> = Api::all(env.client.clone());
    assert!(robots.get("r1").await.expect("r1").spec.unschedulable, "cordoned");
    for task in env.job_tasks("batch").await {
        let s = task.status.unwrap_or_default();
        let on_r1 = s.robot.as_deref() == Some("r1")
            && matches!(s.state, Some(TaskState::Running | TaskState::Dispatching));
        assert!(!on_r1, "a batch task still on r1 after the drain: {s:?}");
    }
    let svc = env.job_tasks("svc").await.remove(0).status.unwrap_or_default();
    assert_eq!(
        (svc.state, svc.robot.as_deref()),
        (Some(TaskState::Running), Some("r1")),
        "the service is left"
    );

    let tasks = env.wait_tasks_final("batch", 2).await;
    let text = std::fs::read_to_string(&marks).unwrap_or_default();
    for task in &tasks {
        let s = task.status.clone().unwrap_or_default();
        assert_eq!(
            (s.state, s.robot.as_deref()),
            (Some(TaskState::Completed), Some("r2")),
            "{s:?}"
        );
        assert!(
            s.attempts.iter().any(|a| a.reason == Some(TaskReason::Drained)),
            "{s:?}"
        );
        let name = format!("default/{}", task.metadata.name.clone().unwrap_or_default());
        let done: Vec<&str> = text
            .lines()
            .filter(|l| l.starts_with(&format!("{name} ")) && l.ends_with(" done"))
            .collect();
        assert_eq!(done.len(), 1, "{name} finished exactly once: {text}");
        assert!(done[0].contains(" r2 "), "{name} finished on r2: {text}");
        assert!(
            text.contains(&format!("{name} 1 r1 stopped")),
            "{name} was stopped on r1: {text}"
        );
    }
    env.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_offline_robot_is_not_shown_accepting_tasks_and_its_facts_are_marked_stale() {
    let mut env = Env::start(&[]).await;
    robot_with_facts(&mut env, "r1", r#"{"battery": 80, "estop": false}"#).await;
    let kubeconfig = kubeconfig_path(&env.data_dir);
    // Without a show-facts label, FACTS shows the robot's first facts;
    // REFRESH says how far HEARTBEAT may lag.
    let wide = eventually("the FACTS column without a label", || async {
        let out = kubectl(&kubeconfig, &["get", "robots", "-o", "wide"]);
        out.contains("battery=80 estop=false").then_some(out)
    })
    .await;
    assert!(wide.contains("REFRESH") && wide.contains("4m"), "{wide}");

    env.kill_agent("r1");
    env.wait_phase("r1", RobotPhase::Offline).await;
    let robots: Api<Robot> = Api::all(env.client.clone());
    let status = eventually("the robot's figures marked stale", || async {
        let status = robots.get("r1").await.ok()?.status?;
        let stale = status.shown_facts.as_deref()? == "stale: battery=80 estop=false";
        stale.then_some(status)
    })
    .await;
    let accepting = status
        .conditions
        .iter()
        .find(|c| c.type_ == CONDITION_ACCEPTING_TASKS)
        .expect("an AcceptingTasks condition");
    assert_eq!(
        (format!("{:?}", accepting.status), accepting.reason.as_deref()),
        ("Unknown".to_owned(), Some("RobotOffline")),
        "{accepting:?}"
    );
    let wide = kubectl(&kubeconfig, &["get", "robots", "-o", "wide"]);
    assert!(wide.contains("stale: battery=80"), "{wide}");
    let robot = robots.get("r1").await.expect("the robot");
    let screen = k8s4r::status::Summary::of(&[robot], &[], &[]).render("all namespaces");
    assert!(
        screen.contains("OFFLINE ROBOTS") && screen.contains("(stale): facts battery=80 estop=false"),
        "{screen}"
    );
    env.stop().await;
}
