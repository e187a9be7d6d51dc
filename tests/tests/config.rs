//! End-to-end: configuration from ConfigMaps and Secrets on real agents,
//! a real Mosquitto and the real API server: variables and files (a key per
//! robot among them), a task that waits for what is missing and starts when
//! it appears, a service started again with the network cut after an agent
//! restart, an object over Kubernetes's bound refused, and a planted secret
//! found nowhere it should not be.

use std::path::{Path, PathBuf};

use k8s4r::up::kubeconfig_path;
use k8s4r_api::names::LABEL_JOB;
use k8s4r_api::{Task, TaskReason, TaskState};
use k8s_openapi::api::core::v1::{ConfigMap, Secret};
use kube::api::{ListParams, Patch, PatchParams, PostParams};
use kube::Api;

mod support;
use support::*;

/// The secret value planted: it must reach the task and nothing else.
const PLANTED: &str = "PLANTED-0a1b2c3d-s3cr3t";

async fn create_config_map(env: &Env, name: &str, data: &[(&str, &str)]) {
    let cm: ConfigMap = serde_json::from_value(serde_json::json!({
        "metadata": { "name": name, "namespace": "default" },
        "data": data.iter().map(|(k, v)| (k.to_string(), serde_json::Value::from(*v))).collect::<serde_json::Map<_, _>>(),
    }))
    .expect("a ConfigMap");
    Api::<ConfigMap>::namespaced(env.client.clone(), "default")
        .create(&PostParams::default(), &cm)
        .await
        .expect("create the ConfigMap");
}

async fn create_secret(env: &Env, name: &str, data: &[(&str, &str)]) {
    let secret: Secret = serde_json::from_value(serde_json::json!({
        "metadata": { "name": name, "namespace": "default" },
        "stringData": data.iter().map(|(k, v)| (k.to_string(), serde_json::Value::from(*v))).collect::<serde_json::Map<_, _>>(),
    }))
    .expect("a Secret");
    Api::<Secret>::namespaced(env.client.clone(), "default")
        .create(&PostParams::default(), &secret)
        .await
        .expect("create the Secret");
}

/// A task template taking a key per robot, a Secret key, a whole Secret
/// with a prefix, and files from a ConfigMap and a Secret.
fn configured(mut task: serde_json::Value) -> serde_json::Value {
    task["env"] = serde_json::json!([
        { "name": "CAL", "valueFrom": { "configMapKeyRef": { "name": "calibration", "key": "$(K8S4R_ROBOT_ID)" } } },
        { "name": "TOKEN", "valueFrom": { "secretKeyRef": { "name": "fleet-api", "key": "token" } } },
        { "name": "PLAIN", "value": "literal" },
    ]);
    task["envFrom"] = serde_json::json!([{ "prefix": "API_", "secretRef": { "name": "fleet-api" } }]);
    task["files"] = serde_json::json!([
        { "path": "conf", "configMap": { "name": "ros-params" } },
        { "path": "secrets", "secret": { "secretName": "fleet-api", "items": [{ "key": "token", "path": "token" }] } },
    ]);
    task
}

/// What the task prints: its uid, its files' modes and owners, whether the
/// secret reached it (never the secret itself), the per-robot value and
/// the parameter file.
const REPORT: &str = r#"echo "uid=$(id -u) token-mode=$(stat -c %a secrets/token) token-owner=$(stat -c %u secrets/token) params-mode=$(stat -c %a conf/params.yaml)"
[ "$TOKEN" = "$(cat secrets/token)" ] && [ "$API_token" = "$TOKEN" ] && [ -n "$TOKEN" ] && echo token-ok
echo "cal=$CAL plain=$PLAIN params=$(cat conf/params.yaml)""#;

fn task_dirs(env: &Env, robot: &str) -> PathBuf {
    env.dir.path().join("agents").join(robot).join("tasks")
}

/// Every file under `dir` whose content holds `needle`.
fn files_holding(dir: &Path, needle: &str) -> Vec<PathBuf> {
    let mut found = Vec::new();
    let Ok(entries) = std::fs::read_dir(dir) else {
        return found;
    };
    for entry in entries.flatten() {
        let path = entry.path();
        let Ok(meta) = std::fs::symlink_metadata(&path) else {
            continue;
        };
        if meta.is_dir() {
            found.extend(files_holding(&path, needle));
        } else if meta.is_file()
            && std::fs::read(&path).is_ok_and(|b| String::from_utf8_lossy(&b).contains(needle))
        {
            found.push(path);
        }
    }
    found
}

async fn only_task(env: &Env, job: &str) -> Option<Task> {
    env.tasks()
        .list(&ListParams::default().labels(&format!("{LABEL_JOB}={job}")))
        .await
        .ok()?
        .items
        .pop()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn config_maps_and_secrets_reach_tasks_per_robot_and_a_missing_key_waits_until_it_exists() {
    let env = Env::start(&[("cfg-a", &["name=a"]), ("cfg-b", &["name=b"])]).await;
    create_config_map(&env, "calibration", &[("cfg-a", "offset-a")]).await;
    create_config_map(&env, "ros-params", &[("params.yaml", "rate: 10")]).await;
    create_secret(&env, "fleet-api", &[("token", PLANTED)]).await;

    // The exec driver: a user of the task's own gets the files.
    let mut task = configured(serde_json::json!({
        "driver": "exec", "command": "/bin/sh", "args": ["-c", REPORT], "timeout": "1m",
    }));
    task["killTimeout"] = serde_json::json!("1s");
    env.create_job(job_json(
        "on-a",
        serde_json::json!([{ "name": "g", "count": 1, "task": task.clone(),
            "robotSelector": { "matchLabels": { "name": "a" } } }]),
    ))
    .await;
    let tasks = env.wait_tasks_final("on-a", 1).await;
    let status = tasks[0].status.clone().unwrap_or_default();
    assert_eq!(status.state, Some(TaskState::Completed), "{status:?}");
    let tail = status.output_tail.clone().unwrap_or_default();
    let uid = tail
        .split_whitespace()
        .find_map(|w| w.strip_prefix("uid="))
        .unwrap_or_else(|| panic!("{tail}"));
    assert_ne!(uid, "0", "an exec task runs as a user of its own: {tail}");
    assert!(tail.contains("token-mode=400"), "{tail}");
    assert!(tail.contains(&format!("token-owner={uid}")), "{tail}");
    assert!(tail.contains("params-mode=644"), "{tail}");
    assert!(tail.contains("token-ok"), "{tail}");
    assert!(
        tail.contains("cal=offset-a plain=literal params=rate: 10"),
        "{tail}"
    );
    // Its files and the kept copy went with the attempt.
    eventually("the configuration removed from the robot", || async {
        let left = files_holding(&task_dirs(&env, "cfg-a"), PLANTED);
        left.is_empty().then_some(())
    })
    .await;

    // On cfg-b the per-robot key is missing: the task waits, saying which.
    env.create_job(job_json(
        "on-b",
        serde_json::json!([{ "name": "g", "count": 1, "task": task,
            "robotSelector": { "matchLabels": { "name": "b" } } }]),
    ))
    .await;
    let waiting = eventually("the task waiting for its configuration", || async {
        let task = only_task(&env, "on-b").await?;
        let status = task.status.clone()?;
        (status.reason == Some(TaskReason::ConfigMissing)).then_some(task)
    })
    .await;
    let message = waiting
        .status
        .clone()
        .unwrap_or_default()
        .message
        .unwrap_or_default();
    assert!(
        message.contains(r#"ConfigMap "calibration" has no key "cfg-b""#),
        "{message}"
    );
    let kubeconfig = kubeconfig_path(&env.data_dir);
    let name = waiting.metadata.name.clone().unwrap_or_default();
    let table = kubectl(&kubeconfig, &["get", "rtask", &name, "-n", "default"]);
    assert!(table.contains("ConfigMissing"), "{table}");
    // The key appears: the task starts and takes it.
    Api::<ConfigMap>::namespaced(env.client.clone(), "default")
        .patch(
            "calibration",
            &PatchParams::default(),
            &Patch::Merge(serde_json::json!({ "data": { "cfg-b": "offset-b" } })),
        )
        .await
        .expect("add the key");
    let tasks = env.wait_tasks_final("on-b", 1).await;
    let status = tasks[0].status.clone().unwrap_or_default();
    assert_eq!(status.state, Some(TaskState::Completed), "{status:?}");
    let tail = status.output_tail.unwrap_or_default();
    assert!(
        tail.contains("cal=offset-b") && tail.contains("token-ok"),
        "{tail}"
    );

    // An object over Kubernetes's 1 MiB is refused, named.
    let big: ConfigMap = serde_json::from_value(serde_json::json!({
        "metadata": { "name": "too-big", "namespace": "default" },
        "data": { "map.pgm": "x".repeat(1024 * 1024 + 1) },
    }))
    .expect("a ConfigMap");
    let refused = Api::<ConfigMap>::namespaced(env.client.clone(), "default")
        .create(&PostParams::default(), &big)
        .await
        .expect_err("over 1 MiB is refused");
    let said = refused.to_string();
    assert!(
        said.contains(r#""too-big""#) && said.contains("Too long"),
        "{said}"
    );

    // The planted secret is nowhere it should not be: the Tasks, Events,
    // kubectl's views, the agents' logs, journals and task directories.
    let mut views = vec![
        kubectl(&kubeconfig, &["get", "rtask", "-A", "-o", "yaml"]),
        kubectl(&kubeconfig, &["describe", "rtask", "-A"]),
        kubectl(&kubeconfig, &["get", "events", "-A", "-o", "yaml"]),
        kubectl(&kubeconfig, &["get", "jobs.robot.k8s4r.io", "-A", "-o", "yaml"]),
    ];
    for robot in ["cfg-a", "cfg-b"] {
        views.push(std::fs::read_to_string(env.dir.path().join(format!("{robot}.log"))).unwrap_or_default());
    }
    for view in &views {
        assert!(!view.contains(PLANTED), "the secret leaked:\n{view}");
    }
    let on_disk = files_holding(&env.dir.path().join("agents"), PLANTED);
    assert!(on_disk.is_empty(), "the secret is left on a robot: {on_disk:?}");
    env.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_service_started_again_offline_after_an_agent_restart_still_has_its_configuration() {
    let mut env = Env::start(&[("cfg-svc", &[])]).await;
    create_config_map(&env, "calibration", &[("cfg-svc", "offset-svc")]).await;
    create_config_map(&env, "ros-params", &[("params.yaml", "rate: 20")]).await;
    create_secret(&env, "fleet-api", &[("token", PLANTED)]).await;
    let runs = env.scratch.join("runs");
    let pid_file = env.scratch.join("pid");
    // Each run says what it got, then stays up.
    let script = format!(
        r#"ok=no; [ "$TOKEN" = "$(cat secrets/token)" ] && [ -n "$TOKEN" ] && ok=yes
echo "cal=$CAL params=$(cat conf/params.yaml) token=$ok" >> {runs}; echo $$ > {pid}; exec sleep 600"#,
        runs = runs.display(),
        pid = pid_file.display()
    );
    let mut task = configured(sh(&script, "1h"));
    task["kind"] = serde_json::json!("service");
    task["restart"] = serde_json::json!({"attempts": 5, "interval": "10m", "delay": "200ms"});
    env.create_job(job_json(
        "svc",
        serde_json::json!([{ "name": "g", "count": 1, "task": task }]),
    ))
    .await;
    let first = "cal=offset-svc params=rate: 20 token=yes";
    eventually("the service's first run", || async {
        let lines = std::fs::read_to_string(&runs).ok()?;
        (lines.lines().count() == 1 && lines.contains(first)).then_some(())
    })
    .await;
    let old_pid = read_pid(&pid_file).await;

    // The robot reboots with the network cut: the agent stops (its
    // service dies while no agent runs) and comes back with its broker
    // gone; it starts the service again on its own, with its
    // configuration, from what it kept.
    env.stop_agent("cfg-svc");
    kill(old_pid);
    env.broker_url = format!("mqtt://127.0.0.1:{}", free_port());
    env.spawn_agent("cfg-svc", &[]);
    eventually("the service started again offline", || async {
        let lines = std::fs::read_to_string(&runs).ok()?;
        (lines.lines().count() >= 2).then_some(())
    })
    .await;
    // And once more while this agent runs it: a restart on the robot.
    let pid = eventually("the second run's pid", || async {
        let pid = std::fs::read_to_string(&pid_file)
            .ok()?
            .trim()
            .parse::<i32>()
            .ok()?;
        (pid != old_pid).then_some(pid)
    })
    .await;
    kill(pid);
    let lines = eventually("the service's third run", || async {
        let lines = std::fs::read_to_string(&runs).ok()?;
        (lines.lines().count() >= 3).then_some(lines)
    })
    .await;
    assert!(
        lines.lines().all(|l| l == first),
        "every run got the same configuration:\n{lines}"
    );
    // Nothing secret in the journal: the spec's references only.
    let journal =
        std::fs::read_to_string(env.dir.path().join("agents/cfg-svc/journal.jsonl")).unwrap_or_default();
    assert!(!journal.contains(PLANTED), "{journal}");
    let pid = read_pid(&pid_file).await;
    env.stop().await;
    kill(pid);
}

fn kill(pid: i32) {
    let _ = nix::sys::signal::kill(nix::unistd::Pid::from_raw(pid), nix::sys::signal::Signal::SIGKILL);
}
