//! `k8s4r cordon|uncordon|drain`, the real binary against the embedded API
//! server; the test plays the manager and the server (a drained task
//! leaves the robot when its eviction is asked).

use std::path::{Path, PathBuf};
use std::process::{Output, Stdio};
use std::time::Duration;

use apiserver_lite::Config;
use k8s4r_api::names::ANNOTATION_EVICT;
use k8s4r_api::{Robot, RobotSpec, Task, TaskKind, TaskSpec, TaskState, TaskTemplate};
use kube::api::{Patch, PatchParams, PostParams};
use kube::{Api, Client};

const DEADLINE: Duration = Duration::from_secs(20);

fn k8s4r(kubeconfig: &Path, args: &[&str]) -> tokio::process::Command {
    let mut command = tokio::process::Command::new(env!("CARGO_BIN_EXE_k8s4r"));
    command
        .args(args)
        .arg("--kubeconfig")
        .arg(kubeconfig)
        .env_remove("KUBECONFIG")
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .kill_on_drop(true);
    command
}

async fn run(kubeconfig: &Path, args: &[&str]) -> Output {
    let output = k8s4r(kubeconfig, args).output();
    tokio::time::timeout(DEADLINE, output)
        .await
        .expect("k8s4r returns in time")
        .expect("k8s4r runs")
}

fn text(bytes: &[u8]) -> String {
    String::from_utf8_lossy(bytes).into_owned()
}

/// A Task in `default`, in `state` on `robot`.
async fn task(client: &Client, name: &str, kind: TaskKind, state: TaskState, robot: &str) {
    let tasks: Api<Task> = Api::namespaced(client.clone(), "default");
    let spec = TaskSpec {
        template: TaskTemplate {
            kind,
            driver: "raw_exec".into(),
            command: "sleep".into(),
            args: vec!["600".into()],
            ..Default::default()
        },
        target_robot: Some(robot.into()),
        ..Default::default()
    };
    tasks
        .create(&PostParams::default(), &Task::new(name, spec))
        .await
        .expect("task created");
    set_state(client, name, state, Some(robot)).await;
}

/// Plays the manager: the Task's state and robot.
async fn set_state(client: &Client, name: &str, state: TaskState, robot: Option<&str>) {
    let tasks: Api<Task> = Api::namespaced(client.clone(), "default");
    let body = serde_json::json!({ "status": { "state": state, "attempt": 1, "robot": robot } });
    tasks
        .patch_status(name, &PatchParams::default(), &Patch::Merge(&body))
        .await
        .expect("task status set");
}

async fn setup() -> (apiserver_lite::RunningServer, Client, tempfile::TempDir, PathBuf) {
    let api = Config::for_tests().start().await.expect("apiserver-lite starts");
    let client = api.client().await.expect("kube client");
    k8s4r_api::crd::apply(&client, "tests")
        .await
        .expect("CRDs applied");
    let robots: Api<Robot> = Api::all(client.clone());
    robots
        .create(&PostParams::default(), &Robot::new("rb1", RobotSpec::default()))
        .await
        .expect("robot created");
    let dir = tempfile::tempdir().unwrap();
    let kubeconfig = dir.path().join("kubeconfig");
    api.write_kubeconfig(&kubeconfig).unwrap();
    (api, client, dir, kubeconfig)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn cordon_and_uncordon_say_what_they_did() {
    let (_api, client, _dir, kubeconfig) = setup().await;
    let robots: Api<Robot> = Api::all(client.clone());
    let out = run(&kubeconfig, &["cordon", "rb1"]).await;
    assert!(out.status.success(), "{}", text(&out.stderr));
    assert_eq!(text(&out.stdout), "robot/rb1 cordoned\n");
    assert!(robots.get("rb1").await.unwrap().spec.unschedulable);
    let out = run(&kubeconfig, &["cordon", "robot/rb1"]).await;
    assert_eq!(text(&out.stdout), "robot/rb1 already cordoned\n");
    let out = run(&kubeconfig, &["uncordon", "rb1"]).await;
    assert_eq!(text(&out.stdout), "robot/rb1 uncordoned\n");
    assert!(!robots.get("rb1").await.unwrap().spec.unschedulable);
    let out = run(&kubeconfig, &["uncordon", "rb1"]).await;
    assert_eq!(text(&out.stdout), "robot/rb1 already uncordoned\n");
    let out = run(&kubeconfig, &["drain", "rb9"]).await;
    assert!(!out.status.success());
    assert!(
        text(&out.stderr).contains(r#"robot "rb9" not found"#),
        "{}",
        text(&out.stderr)
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn drain_evicts_the_batch_tasks_and_waits_until_they_left() {
    let (_api, client, _dir, kubeconfig) = setup().await;
    task(&client, "job-a-0", TaskKind::Batch, TaskState::Running, "rb1").await;
    task(&client, "job-b-0", TaskKind::Batch, TaskState::Dispatching, "rb1").await;
    task(&client, "nav-0", TaskKind::Service, TaskState::Running, "rb1").await;
    task(&client, "job-c-0", TaskKind::Batch, TaskState::Running, "rb2").await;
    let drain = k8s4r(&kubeconfig, &["drain", "rb1", "--timeout", "20s"])
        .spawn()
        .expect("drain starts");

    // The manager and the server: each evicted task ends on its robot
    // and waits for another one.
    let tasks: Api<Task> = Api::namespaced(client.clone(), "default");
    for name in ["job-a-0", "job-b-0"] {
        k8s4r_testbed::eventually(DEADLINE, &format!("{name} is evicted"), || async {
            let task = tasks.get(name).await.ok()?;
            task.metadata
                .annotations?
                .contains_key(ANNOTATION_EVICT)
                .then_some(())
        })
        .await;
        set_state(&client, name, TaskState::Pending, None).await;
    }
    let out = tokio::time::timeout(DEADLINE, drain.wait_with_output())
        .await
        .expect("drain returns")
        .unwrap();
    assert!(out.status.success(), "{}", text(&out.stderr));
    let stdout = text(&out.stdout);
    let lines: Vec<&str> = stdout.lines().collect();
    assert_eq!(lines[0], "robot/rb1 cordoned", "{stdout}");
    assert!(lines.contains(&"evicting task default/job-a-0"), "{stdout}");
    assert!(lines.contains(&"evicting task default/job-b-0"), "{stdout}");
    assert_eq!(lines.last(), Some(&"robot/rb1 drained"), "{stdout}");
    assert!(
        text(&out.stderr).contains("default/nav-0"),
        "the service is said to stay"
    );
    for name in ["nav-0", "job-c-0"] {
        let task = tasks.get(name).await.unwrap();
        let evicted = task
            .metadata
            .annotations
            .unwrap_or_default()
            .contains_key(ANNOTATION_EVICT);
        assert!(!evicted, "{name} is left alone");
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_drain_out_of_time_fails_naming_what_is_left() {
    let (_api, client, _dir, kubeconfig) = setup().await;
    task(&client, "nav-0", TaskKind::Service, TaskState::Running, "rb1").await;
    let out = run(
        &kubeconfig,
        &["drain", "rb1", "--services", "stop", "--timeout", "1s"],
    )
    .await;
    assert!(!out.status.success());
    let stderr = text(&out.stderr);
    assert!(
        stderr.contains(
            "robot/rb1 not drained within 1s: still on it: default/nav-0 (running; the manager has not acted"
        ),
        "{stderr}"
    );
}
