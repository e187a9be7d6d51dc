//! End-to-end: the podman driver through the whole stack (the real API
//! server, server, manager, Mosquitto, an agent offering podman on a store
//! of the test's own, the real `k8s4r` CLI): a tag alone refused at apply;
//! a robot that cannot reach the registry waits `ImageUnavailable` instead
//! of failing, gets the image by `k8s4r image push` (resuming an archive it
//! half has) and runs the task from it.

use std::process::{Command, Output, Stdio};

use k8s4r::up::kubeconfig_path;
use k8s4r_api::{Task, TaskReason, TaskState};
use k8s4r_testbed::registry::{PodmanStore, Registry};
use kube::api::PostParams;

mod support;
use support::*;

/// The CLI, as people run it, on the test's kubeconfig.
fn cli(env: &Env) -> Command {
    let mut cmd = Command::new(env!("CARGO_BIN_EXE_e2e-k8s4r"));
    cmd.env("KUBECONFIG", kubeconfig_path(&env.data_dir))
        .env("RUST_BACKTRACE", "0");
    cmd
}

/// Runs the CLI off the runtime's workers; its output.
async fn run(mut cmd: Command) -> Output {
    let child = cmd
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .expect("run k8s4r");
    tokio::task::spawn_blocking(move || child.wait_with_output().expect("wait for k8s4r"))
        .await
        .expect("the wait")
}

fn text(out: &Output) -> String {
    format!(
        "{}{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    )
}

fn podman_task(image: &str, script: &str) -> serde_json::Value {
    serde_json::json!({
        "driver": "podman",
        "image": image,
        "command": "/bin/sh",
        "args": ["-c", script],
        "timeout": "5m",
    })
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_tag_without_a_digest_is_refused_at_apply_with_the_field_named() {
    let env = Env::start(&[]).await;
    let job = job_json(
        "tagged",
        serde_json::json!([{ "name": "t", "count": 1, "task": podman_task("ros:humble", "true") }]),
    );
    let job: k8s4r_api::Job = serde_json::from_value(job).unwrap();
    let err = env
        .jobs()
        .create(&PostParams::default(), &job)
        .await
        .expect_err("a tag alone is refused");
    let message = err.to_string();
    assert!(
        message.contains("image") && message.contains("by digest"),
        "{message}"
    );
    env.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_robot_that_cannot_reach_the_registry_gets_the_image_pushed_through_the_cluster() {
    let registry = Registry::start();
    let image = registry.push_test_image("offline");
    let store = PodmanStore::new();
    let mut env = Env::start(&[]).await;
    let mut extra: Vec<String> = ["--podman", "true", "--podman-pull-timeout", "5s"]
        .iter()
        .map(|s| s.to_string())
        .collect();
    extra.extend(store.args().into_iter().map(|a| format!("--podman-arg={a}")));
    let extra: Vec<&str> = extra.iter().map(String::as_str).collect();
    env.spawn_agent_with("rb1", &["name=rb1"], &extra);
    env.wait_phase("rb1", k8s4r_api::RobotPhase::Online).await;
    let robots: kube::Api<k8s4r_api::Robot> = kube::Api::all(env.client.clone());
    let drivers = robots
        .get("rb1")
        .await
        .unwrap()
        .status
        .unwrap_or_default()
        .drivers;
    assert!(drivers.iter().any(|d| d == "podman"), "{drivers:?}");

    // The archive is made where the registry answers (a person's
    // machine); then the registry is gone for the robot.
    let archive = env.dir.path().join("offline.oci.tar");
    let copied = Command::new("skopeo")
        .args(["copy", "--quiet", "--src-tls-verify=false"])
        .arg(format!("docker://{image}"))
        .arg(format!("oci-archive:{}", archive.display()))
        .output()
        .expect("run skopeo (scripts/setup.sh installs it)");
    assert!(
        copied.status.success(),
        "{}",
        String::from_utf8_lossy(&copied.stderr)
    );
    drop(registry);

    let script = "cat /image-marker; echo ran in a container";
    env.create_job(job_json(
        "nav",
        serde_json::json!([{ "name": "t", "count": 1, "task": podman_task(&image, script) }]),
    ))
    .await;
    // It waits, saying why, and uses no retry.
    let waiting: Task = eventually("the task waits for its image", || async {
        let t = env.tasks().get("nav-t-0").await.ok()?;
        let s = t.status.as_ref()?;
        s.attempts
            .iter()
            .any(|a| a.reason == Some(TaskReason::ImageUnavailable))
            .then_some(t)
    })
    .await;
    let status = waiting.status.unwrap();
    assert_ne!(status.state, Some(TaskState::Failed), "{status:?}");
    let said = status
        .attempts
        .iter()
        .find_map(|a| a.message.clone())
        .unwrap_or_default();
    assert!(said.contains("is unavailable"), "{said}");

    // Half of the archive is already on the robot (a push cut before):
    // only the rest is sent.
    let bytes = std::fs::read(&archive).unwrap();
    let sha = sha256(&archive);
    let spool = env.dir.path().join("agents/rb1/images");
    std::fs::create_dir_all(&spool).unwrap();
    let half = bytes.len() / 2;
    std::fs::write(spool.join(format!("{sha}.part")), &bytes[..half]).unwrap();
    let mut push = cli(&env);
    push.args(["image", "push", "robot/rb1", "--archive"])
        .arg(&archive);
    let out = run(push).await;
    assert!(out.status.success(), "{}", text(&out));
    let said = text(&out);
    assert!(
        said.contains(&format!("{half} of {} were already there", bytes.len())),
        "{said}"
    );
    assert!(
        !spool.join(format!("{sha}.part")).exists(),
        "the archive is removed once loaded"
    );

    let done = eventually("the task completes from the pushed image", || async {
        let t = env.tasks().get("nav-t-0").await.ok()?;
        (t.status.as_ref()?.state? == TaskState::Completed).then_some(t)
    })
    .await;
    let tail = done.status.unwrap().output_tail.unwrap_or_default();
    assert!(
        tail.contains("from the image") && tail.contains("ran in a container"),
        "{tail}"
    );

    // A push of what is not an archive of an image fails, saying so.
    let junk = env.dir.path().join("junk.tar");
    std::fs::write(&junk, b"not an image").unwrap();
    let mut push = cli(&env);
    push.args(["image", "push", "robot/rb1", "--archive"]).arg(&junk);
    let out = run(push).await;
    assert!(!out.status.success(), "{}", text(&out));
    env.stop().await;
}
