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
    // `k8s4r logs` (its output and what it says around it) has the task's
    // own output, never the secret.
    let task_name = tasks[0].metadata.name.clone().unwrap_or_default();
    let logs = std::process::Command::new(env!("CARGO_BIN_EXE_e2e-k8s4r"))
        .args(["logs", &task_name, "--kubeconfig"])
        .arg(kubeconfig_path(&env.data_dir))
        .output()
        .expect("run k8s4r logs");
    let said = format!(
        "{}{}",
        String::from_utf8_lossy(&logs.stdout),
        String::from_utf8_lossy(&logs.stderr)
    );
    assert!(said.contains("token-ok"), "{said}");
    assert!(!said.contains(PLANTED), "k8s4r logs shows the secret:\n{said}");

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

/// The events on `task` with `reason`, as kubectl shows them.
async fn events_of(env: &Env, task: &str, reason: &str) -> Vec<String> {
    use k8s_openapi::api::events::v1::Event;
    let events = Api::<Event>::namespaced(env.client.clone(), "default")
        .list(&ListParams::default())
        .await
        .map(|l| l.items)
        .unwrap_or_default();
    events
        .into_iter()
        .filter(|e| e.regarding.as_ref().and_then(|r| r.name.as_deref()) == Some(task))
        .filter(|e| e.reason.as_deref() == Some(reason))
        .filter_map(|e| e.note)
        .collect()
}

async fn resource_version(env: &Env, name: &str) -> String {
    Api::<ConfigMap>::namespaced(env.client.clone(), "default")
        .get(name)
        .await
        .expect("the ConfigMap")
        .metadata
        .resource_version
        .unwrap_or_default()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_changed_config_map_reaches_a_running_service_which_gets_its_signal_with_the_new_file_in_place() {
    let env = Env::start(&[("cfg-sig", &[])]).await;
    create_config_map(&env, "ros-params", &[("params.yaml", "rate: 1")]).await;
    let runs = env.scratch.join("runs");
    let pid_file = env.scratch.join("pid");
    // On SIGHUP it says what its file holds then: the new file must be in
    // place before the signal.
    let script = format!(
        r#"trap 'echo "hup params=$(cat conf/params.yaml)" >> {runs}' HUP
echo $$ > {pid}; echo "start params=$(cat conf/params.yaml)" >> {runs}
while true; do sleep 0.1; done"#,
        runs = runs.display(),
        pid = pid_file.display()
    );
    let mut task = sh(&script, "1h");
    task["kind"] = serde_json::json!("service");
    task["files"] = serde_json::json!([{ "path": "conf", "configMap": { "name": "ros-params" } }]);
    task["onConfigChange"] = serde_json::json!("signal");
    env.create_job(job_json(
        "sig",
        serde_json::json!([{ "name": "g", "count": 1, "task": task }]),
    ))
    .await;
    eventually("the service's first run", || async {
        let lines = std::fs::read_to_string(&runs).ok()?;
        lines.contains("start params=rate: 1").then_some(())
    })
    .await;
    let before = resource_version(&env, "ros-params").await;
    let running = eventually("the task showing the version it runs with", || async {
        let task = only_task(&env, "sig").await?;
        let config = task.status.clone()?.config?;
        (config.versions == format!("ConfigMap/ros-params@{before}")).then_some(task)
    })
    .await;
    let name = running.metadata.name.clone().unwrap_or_default();

    Api::<ConfigMap>::namespaced(env.client.clone(), "default")
        .patch(
            "ros-params",
            &PatchParams::default(),
            &Patch::Merge(serde_json::json!({ "data": { "params.yaml": "rate: 2" } })),
        )
        .await
        .expect("change the ConfigMap");
    let after = resource_version(&env, "ros-params").await;
    let lines = eventually("SIGHUP with the new file in place", || async {
        let lines = std::fs::read_to_string(&runs).ok()?;
        lines.contains("hup params=rate: 2").then_some(lines)
    })
    .await;
    assert_eq!(
        lines.lines().filter(|l| l.starts_with("start")).count(),
        1,
        "signalled, not restarted:\n{lines}"
    );
    assert!(
        !lines.contains("hup params=rate: 1"),
        "the signal came before the file:\n{lines}"
    );
    // The Task says which version it runs with (kubectl's wide view too),
    // and an Event names the object and its resourceVersion.
    let config = eventually("the new version in the Task's status", || async {
        let config = only_task(&env, "sig").await?.status?.config?;
        (config.versions == format!("ConfigMap/ros-params@{after}")).then_some(config)
    })
    .await;
    assert_eq!(config.generation, 1, "{config:?}");
    assert!(
        config
            .message
            .as_deref()
            .unwrap_or_default()
            .contains("sent SIGHUP"),
        "{config:?}"
    );
    let kubeconfig = kubeconfig_path(&env.data_dir);
    let wide = kubectl(
        &kubeconfig,
        &["get", "rtask", &name, "-n", "default", "-o", "wide"],
    );
    assert!(wide.contains(&format!("ConfigMap/ros-params@{after}")), "{wide}");
    let notes = eventually("the ConfigChanged Event", || async {
        let notes = events_of(&env, &name, "ConfigChanged").await;
        (!notes.is_empty()).then_some(notes)
    })
    .await;
    assert!(
        notes[0].contains(&format!("ConfigMap ros-params (resourceVersion {after})")),
        "{notes:?}"
    );
    let pid = read_pid(&pid_file).await;
    env.stop().await;
    kill(pid);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_rolling_restart_for_a_changed_config_map_keeps_to_the_groups_max_parallel() {
    let robots = ["roll-a", "roll-b", "roll-c"];
    let env = Env::start(&[("roll-a", &[]), ("roll-b", &[]), ("roll-c", &[])]).await;
    create_config_map(&env, "fleet", &[("version", "1")]).await;
    let log = env.scratch.join("restarts");
    // Each run notes its start (with the value its variable got) and its
    // stop, which takes a second: restarts that overlap would show.
    let script = format!(
        r#"echo $$ > {log}.$K8S4R_ROBOT_ID.pid
echo "$(date +%s%N) start $K8S4R_ROBOT_ID v=$VERSION" >> {log}
trap 'echo "$(date +%s%N) stopping $K8S4R_ROBOT_ID" >> {log}; sleep 1; echo "$(date +%s%N) stopped $K8S4R_ROBOT_ID" >> {log}; exit 0' TERM
while true; do sleep 0.1; done"#,
        log = log.display()
    );
    let mut task = sh(&script, "1h");
    task["kind"] = serde_json::json!("service");
    task["killTimeout"] = serde_json::json!("5s");
    task["env"] = serde_json::json!([
        { "name": "VERSION", "valueFrom": { "configMapKeyRef": { "name": "fleet", "key": "version" } } },
    ]);
    task["onConfigChange"] = serde_json::json!("restart");
    env.create_job(job_json(
        "roll",
        serde_json::json!([{ "name": "g", "count": 3, "antiAffinity": {}, "maxParallel": 1, "task": task }]),
    ))
    .await;
    eventually("three services running with version 1", || async {
        let lines = std::fs::read_to_string(&log).ok()?;
        (lines.matches("v=1").count() == 3).then_some(())
    })
    .await;
    // Every robot has reported what it runs with: the change is seen by all.
    eventually("each task showing its configuration", || async {
        let tasks = env
            .tasks()
            .list(&ListParams::default().labels(&format!("{LABEL_JOB}=roll")))
            .await
            .ok()?
            .items;
        (tasks.len() == 3
            && tasks
                .iter()
                .all(|t| t.status.as_ref().is_some_and(|s| s.config.is_some())))
        .then_some(())
    })
    .await;
    Api::<ConfigMap>::namespaced(env.client.clone(), "default")
        .patch(
            "fleet",
            &PatchParams::default(),
            &Patch::Merge(serde_json::json!({ "data": { "version": "2" } })),
        )
        .await
        .expect("change the ConfigMap");
    let lines = eventually("three services restarted with version 2", || async {
        let lines = std::fs::read_to_string(&log).ok()?;
        (lines.matches("v=2").count() == 3).then_some(lines)
    })
    .await;
    // Each robot's restart spans its "stopping" to its next "start"; no
    // two of them overlap (maxParallel: 1).
    let mut spans: Vec<(u128, u128, &str)> = Vec::new();
    for robot in robots {
        let at = |what: &str| -> u128 {
            lines
                .lines()
                .find(|l| l.contains(what))
                .and_then(|l| l.split_whitespace().next()?.parse().ok())
                .unwrap_or_else(|| panic!("no {what:?} in:\n{lines}"))
        };
        let stopping = at(&format!("stopping {robot}"));
        let restarted = at(&format!("start {robot} v=2"));
        assert!(stopping < restarted, "{robot}:\n{lines}");
        spans.push((stopping, restarted, robot));
    }
    spans.sort();
    for pair in spans.windows(2) {
        assert!(
            pair[0].1 <= pair[1].0,
            "{} and {} restarted at once:\n{lines}",
            pair[0].2,
            pair[1].2
        );
    }
    let pids: Vec<i32> = robots
        .iter()
        .filter_map(|r| {
            std::fs::read_to_string(format!("{}.{r}.pid", log.display()))
                .ok()?
                .trim()
                .parse()
                .ok()
        })
        .collect();
    env.stop().await;
    for pid in pids {
        kill(pid);
    }
}

fn kill(pid: i32) {
    let _ = nix::sys::signal::kill(nix::unistd::Pid::from_raw(pid), nix::sys::signal::Signal::SIGKILL);
}
