//! Task outputs with a real agent, the server and `k8s4r up`'s embedded
//! object store: what a task names in `outputs` ends up in the bucket,
//! whole, with its sha256 on the Task, and the robot never holds the
//! bucket's secret.

use std::path::{Path, PathBuf};

use k8s4r_api::{OutputState, RobotPhase, Task, TaskState};

// Not every test file uses every helper.
#[allow(unused_imports)]
mod support;
use support::*;

/// Where the embedded store keeps `key`.
fn stored(env: &Env, key: &str) -> PathBuf {
    env.data_dir
        .join("outputs")
        .join(k8s4r::up::STORE_BUCKET)
        .join(key)
}

/// Every file under `dir`, recursively.
fn files_under(dir: &Path) -> Vec<PathBuf> {
    let mut out = Vec::new();
    let mut stack = vec![dir.to_owned()];
    while let Some(d) = stack.pop() {
        for entry in std::fs::read_dir(&d).into_iter().flatten().flatten() {
            let path = entry.path();
            match entry.file_type() {
                Ok(t) if t.is_dir() => stack.push(path),
                Ok(t) if t.is_file() => out.push(path),
                _ => {}
            }
        }
    }
    out
}

async fn outputs_of(env: &Env, task: &str, n: usize) -> Task {
    eventually(&format!("{n} outputs of {task} uploaded"), || async {
        let t = env.tasks().get(task).await.ok()?;
        let listed = &t.status.as_ref()?.outputs;
        (listed.len() == n && listed.iter().all(|o| o.state == OutputState::Uploaded)).then_some(t)
    })
    .await
}

/// A 200 MB recording and a small report, named by two patterns, arrive
/// whole: the Task lists each with the sha256 the robot read, and the
/// object in the store has it. The robot's state directory and log never
/// hold the store's secret; the spool is empty once the uploads are done.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn outputs_reach_the_bucket_whole_with_their_sha256() {
    let mut env = Env::start(&[]).await;
    env.spawn_agent_with("up-1", &[], &["--upload-bytes-per-second", "0"]);
    env.wait_phase("up-1", RobotPhase::Online).await;
    let mut task = sh(
        "mkdir -p bags && head -c 200000000 /dev/urandom > bags/run.mcap && echo '<ok/>' > report.xml && ln -s /etc/passwd bags/passwd.mcap",
        "5m",
    );
    task["outputs"] = serde_json::json!([
        { "path": "bags/*.mcap" },
        { "path": "report.xml" },
    ]);
    env.create_job(job_json(
        "rec",
        serde_json::json!([{ "name": "t", "count": 1, "task": task }]),
    ))
    .await;
    let tasks = env.wait_tasks_final("rec", 1).await;
    assert_eq!(
        tasks[0].status.as_ref().and_then(|s| s.state),
        Some(TaskState::Completed)
    );
    // The link to /etc/passwd is not an output.
    let done = outputs_of(&env, "rec-t-0", 2).await;
    let listed = &done.status.as_ref().unwrap().outputs;
    let bag = listed
        .iter()
        .find(|o| o.path == "bags/run.mcap")
        .expect("the bag is listed");
    assert_eq!(bag.size, 200_000_000);
    assert_eq!(bag.attempt, 1);
    assert_eq!(bag.key, "default/rec/rec-t-0/1/up-1/bags/run.mcap");
    let object = stored(&env, &bag.key);
    assert_eq!(std::fs::metadata(&object).unwrap().len(), 200_000_000);
    assert_eq!(sha256(&object), bag.sha256, "the object is what the robot read");
    let report = listed
        .iter()
        .find(|o| o.path == "report.xml")
        .expect("the report is listed");
    assert_eq!(std::fs::read(stored(&env, &report.key)).unwrap(), b"<ok/>\n");

    // Listed and downloaded through the cluster, checked against the
    // sha256; refused to a user without `get` on tasks/outputs.
    let kubeconfig = k8s4r::up::kubeconfig_path(&env.data_dir);
    let listed = std::process::Command::new(env!("CARGO_BIN_EXE_e2e-k8s4r"))
        .args(["outputs", "rec-t-0", "--kubeconfig"])
        .arg(&kubeconfig)
        .output()
        .expect("k8s4r outputs runs");
    let table = String::from_utf8_lossy(&listed.stdout);
    assert!(
        listed.status.success(),
        "{}",
        String::from_utf8_lossy(&listed.stderr)
    );
    assert!(
        table
            .lines()
            .any(|l| l.contains("bags/run.mcap") && l.contains("200000000") && l.contains("Uploaded")),
        "{table}"
    );
    let got = env.dir.path().join("run.mcap");
    let started = std::time::Instant::now();
    k8s4r::outputs::download(&env.client, "default", "rec-t-0", "bags/run.mcap", None, &got)
        .await
        .expect("the download");
    println!("downloaded 200 MB through the cluster in {:?}", started.elapsed());
    assert_eq!(sha256(&got), bag.sha256);
    let bob = env.stack.as_ref().unwrap().client_as("bob", &[]).await.unwrap();
    let mine = env.dir.path().join("bob-report.xml");
    let refused = k8s4r::outputs::download(&bob, "default", "rec-t-0", "report.xml", None, &mine)
        .await
        .expect_err("bob may not");
    let message = format!("{refused:#}");
    assert!(
        message.contains("you may not read the outputs of task rec-t-0"),
        "{message}"
    );
    assert!(!mine.exists() && !mine.with_extension("k8s4r-partial").exists());
    kubectl(
        &kubeconfig,
        &[
            "create",
            "rolebinding",
            "bob-outputs",
            "-n",
            "default",
            "--clusterrole=k8s4r-log-reader",
            "--user=bob",
        ],
    );
    eventually("bob may read outputs once bound", || async {
        k8s4r::outputs::download(&bob, "default", "rec-t-0", "report.xml", None, &mine)
            .await
            .ok()
    })
    .await;
    assert_eq!(std::fs::read(&mine).unwrap(), b"<ok/>\n");

    // The secret is the server's alone.
    let secret = env.stack.as_ref().unwrap().bucket.secret_key.clone();
    let robot_dir = env.dir.path().join("agents/up-1");
    let mut looked = files_under(&robot_dir);
    looked.push(env.dir.path().join("up-1.log"));
    for file in looked {
        let bytes = std::fs::read(&file).unwrap_or_default();
        assert!(
            !bytes.windows(secret.len()).any(|w| w == secret.as_bytes()),
            "{} holds the bucket's secret",
            file.display()
        );
    }
    // Nothing waits in the spool.
    let spool = robot_dir.join("outputs");
    eventually("the spool emptied", || async {
        let left: Vec<PathBuf> = files_under(&spool)
            .into_iter()
            .filter(|p| p.file_name().is_some_and(|n| n != "journal.jsonl"))
            .collect();
        left.is_empty().then_some(())
    })
    .await;
    env.stop().await;
}

/// Lines of the robot's outputs journal that record a part the bucket took.
fn parts_journaled(env: &Env, robot: &str) -> usize {
    let journal = env
        .dir
        .path()
        .join("agents")
        .join(robot)
        .join("outputs/journal.jsonl");
    std::fs::read_to_string(journal)
        .unwrap_or_default()
        .matches("\"partSent\"")
        .count()
}

/// A job of one task on `robot` that writes `bytes` random bytes to
/// `bags/run.mcap`, an output.
fn recording(name: &str, robot: &str, bytes: u64) -> serde_json::Value {
    let mut task = sh(
        &format!("mkdir -p bags && head -c {bytes} /dev/urandom > bags/run.mcap"),
        "5m",
    );
    task["outputs"] = serde_json::json!([{ "path": "bags/*.mcap" }]);
    let mut job = job_json(
        name,
        serde_json::json!([{ "name": "t", "count": 1, "task": task }]),
    );
    job["spec"]["robotSelector"] = serde_json::json!({ "matchLabels": { "robot": robot } });
    job
}

const PART: u64 = 8 << 20;

/// The link to the bucket cut in the middle of a 200 MB upload, then the
/// agent SIGKILLed further on and started again: the upload goes on from
/// the last part the bucket confirmed, the object is whole, and the robot
/// sent at most the part on the way again each time (counted on the wire,
/// by a proxy before the store).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_cut_link_and_a_killed_agent_resume_from_the_last_confirmed_part() {
    let store = std::net::SocketAddr::from(([127, 0, 0, 1], k8s4r_testbed::free_port()));
    let proxy = k8s4r_testbed::proxy::Proxy::start(store).await;
    let mut env = Env::start_with_store(store, format!("http://{}", proxy.addr())).await;
    let flags = ["--upload-bytes-per-second", "25000000", "--label", "robot=res-1"];
    env.spawn_agent_with("res-1", &[], &flags);
    env.wait_phase("res-1", RobotPhase::Online).await;
    let size = 200_000_000;
    env.create_job(recording("cut", "res-1", size)).await;

    eventually("three parts confirmed", || async {
        (parts_journaled(&env, "res-1") >= 3).then_some(())
    })
    .await;
    proxy.set(k8s4r_testbed::proxy::Fault::Cut);
    let cut_at = parts_journaled(&env, "res-1");
    tokio::time::sleep(std::time::Duration::from_secs(2)).await;
    assert_eq!(
        parts_journaled(&env, "res-1"),
        cut_at,
        "no part gets through a cut link"
    );
    proxy.heal();

    eventually("ten parts confirmed", || async {
        (parts_journaled(&env, "res-1") >= 10).then_some(())
    })
    .await;
    env.kill_agent("res-1");
    let before_restart = parts_journaled(&env, "res-1");
    env.spawn_agent_with("res-1", &[], &flags);

    let done = outputs_of(&env, "cut-t-0", 1).await;
    let bag = &done.status.as_ref().unwrap().outputs[0];
    assert_eq!(bag.size, size);
    assert_eq!(sha256(&stored(&env, &bag.key)), bag.sha256);
    assert!(
        parts_journaled(&env, "res-1") >= before_restart,
        "the journal kept its parts"
    );
    let sent = proxy.upstream_bytes();
    // Two faults, at most one part again each; requests' headers besides.
    let most = size + 2 * PART + 2_000_000;
    println!("sent {sent} bytes for {size} (at most {most})");
    assert!(
        sent >= size && sent <= most,
        "{sent} bytes sent for a {size}-byte file"
    );
    env.stop().await;
}

/// A full quota applies the robot's policy and says so: with `refuse`, the
/// file that does not fit is listed Dropped on the Task with the reason,
/// with a Warning Event; with `dropOldest`, the older one is.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_full_quota_applies_its_policy_and_says_so_on_the_task() {
    let mut env = Env::start(&[]).await;
    // Slow uploads: the first file still waits when the second is taken.
    for (robot, policy) in [("q-refuse", "refuse"), ("q-drop", "dropOldest")] {
        env.spawn_agent_with(
            robot,
            &[],
            &[
                "--label",
                &format!("robot={robot}"),
                "--upload-bytes-per-second",
                "100000",
                "--outputs-quota-bytes",
                "1000000",
                "--outputs-when-full",
                policy,
            ],
        );
        env.wait_phase(robot, RobotPhase::Online).await;
    }
    for (job, robot) in [("refused", "q-refuse"), ("dropped", "q-drop")] {
        let mut task = sh(
            "head -c 600000 /dev/urandom > a.bin && head -c 600000 /dev/urandom > b.bin",
            "1m",
        );
        task["outputs"] = serde_json::json!([{ "path": "a.bin" }, { "path": "b.bin" }]);
        let mut spec = job_json(
            job,
            serde_json::json!([{ "name": "t", "count": 1, "task": task }]),
        );
        spec["spec"]["robotSelector"] = serde_json::json!({ "matchLabels": { "robot": robot } });
        env.create_job(spec).await;
    }
    let listed = |task: &'static str| {
        let env = &env;
        async move {
            eventually(&format!("{task} lists a dropped output"), || async {
                let t = env.tasks().get(task).await.ok()?;
                let outputs = t.status?.outputs;
                outputs
                    .iter()
                    .any(|o| o.state == OutputState::Dropped)
                    .then_some(outputs)
            })
            .await
        }
    };
    let refused = listed("refused-t-0").await;
    let dropped: Vec<_> = refused
        .iter()
        .filter(|o| o.state == OutputState::Dropped)
        .collect();
    assert_eq!(dropped.len(), 1, "{refused:?}");
    assert_eq!(
        dropped[0].path, "b.bin",
        "refuse keeps what waits: the newer file is refused"
    );
    let why = dropped[0].message.as_deref().unwrap_or_default();
    assert!(why.contains("quota is full") && why.contains("refuse"), "{why}");

    let by_age = listed("dropped-t-0").await;
    let dropped: Vec<_> = by_age
        .iter()
        .filter(|o| o.state == OutputState::Dropped)
        .collect();
    assert_eq!(dropped.len(), 1, "{by_age:?}");
    assert_eq!(dropped[0].path, "a.bin", "dropOldest drops the older file");
    assert!(dropped[0]
        .message
        .as_deref()
        .unwrap_or_default()
        .contains("dropOldest"));
    // The one kept arrives.
    outputs_uploaded(&env, "dropped-t-0", "b.bin").await;

    let events: kube::Api<k8s_openapi::api::events::v1::Event> =
        kube::Api::namespaced(env.client.clone(), "default");
    let notes: Vec<String> = eventually("the Warning Events", || async {
        let notes: Vec<String> = events
            .list(&Default::default())
            .await
            .ok()?
            .items
            .into_iter()
            .filter(|e| e.reason.as_deref() == Some("OutputDropped"))
            .filter_map(|e| e.note)
            .collect();
        (notes.len() >= 2).then_some(notes)
    })
    .await;
    assert!(
        notes
            .iter()
            .any(|n| n.contains("b.bin") && n.contains("q-refuse")),
        "{notes:?}"
    );
    assert!(
        notes.iter().any(|n| n.contains("a.bin") && n.contains("q-drop")),
        "{notes:?}"
    );
    env.stop().await;
}

async fn outputs_uploaded(env: &Env, task: &str, path: &str) {
    eventually(&format!("{path} of {task} uploaded"), || async {
        let t = env.tasks().get(task).await.ok()?;
        t.status?
            .outputs
            .iter()
            .any(|o| o.path == path && o.state == OutputState::Uploaded)
            .then_some(())
    })
    .await;
}

/// An upload keeps to the robot's rate (within 10%, measured on the wire),
/// and heartbeat confirmations keep coming within their interval while it
/// goes.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn uploads_keep_to_their_rate_and_heartbeats_to_their_interval() {
    let store = std::net::SocketAddr::from(([127, 0, 0, 1], k8s4r_testbed::free_port()));
    let proxy = k8s4r_testbed::proxy::Proxy::start(store).await;
    let mut env = Env::start_with_store(store, format!("http://{}", proxy.addr())).await;
    let rate: u64 = 2_000_000;
    env.spawn_agent_with(
        "rate-1",
        &[],
        &[
            "--label",
            "robot=rate-1",
            "--upload-bytes-per-second",
            &rate.to_string(),
            "--log",
            "info,k8s4r_agent::session::core::downlink=debug",
        ],
    );
    env.wait_phase("rate-1", RobotPhase::Online).await;
    env.create_job(recording("paced", "rate-1", 24_000_000)).await;
    // Past the first burst.
    let (from, t0) = eventually("the upload under way", || async {
        let sent = proxy.upstream_bytes();
        (sent > 1_000_000).then(|| (sent, std::time::Instant::now()))
    })
    .await;
    tokio::time::sleep(std::time::Duration::from_secs(8)).await;
    let (to, t1) = (proxy.upstream_bytes(), std::time::Instant::now());
    let measured = (to - from) as f64 / (t1 - t0).as_secs_f64();
    println!("upload rate {measured:.0} B/s for a limit of {rate}");
    assert!(
        (measured - rate as f64).abs() <= rate as f64 * 0.10,
        "{measured:.0} B/s against a limit of {rate}"
    );
    outputs_uploaded(&env, "paced-t-0", "bags/run.mcap").await;

    // Heartbeats every second (the tests' interval): confirmed within it
    // all along the upload.
    let log = std::fs::read_to_string(env.dir.path().join("rate-1.log")).unwrap();
    let during: Vec<&str> = log
        .lines()
        .skip_while(|l| !l.contains(" output upload "))
        .take_while(|l| !l.contains(" output uploaded "))
        .filter(|l| l.contains("heartbeat confirmed"))
        .collect();
    let after_ms: Vec<u64> = during
        .iter()
        .filter_map(|l| {
            l.split("after_ms=")
                .nth(1)?
                .split_whitespace()
                .next()?
                .parse()
                .ok()
        })
        .collect();
    assert!(
        after_ms.len() >= 8,
        "confirmations during a 12 s upload: {after_ms:?}"
    );
    assert!(
        after_ms.iter().all(|ms| *ms < 1000),
        "a confirmation took longer than the interval: {after_ms:?}"
    );
    env.stop().await;
}

/// A task's rolling files (`when: continuous`) leave while it runs, each
/// once it is closed and settled, and each once; a file it holds open is
/// left until the attempt ends, then taken with the rest.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn rolling_files_leave_while_the_task_runs_each_once() {
    let mut env = Env::start(&[]).await;
    env.spawn_agent_with(
        "roll-1",
        &[],
        &["--label", "robot=roll-1", "--upload-bytes-per-second", "0"],
    );
    env.wait_phase("roll-1", RobotPhase::Online).await;
    let mut task = sh(
        "mkdir -p bags; exec 4>bags/open.mcap; echo held >&4; \
         for i in 1 2 3; do (exec 3>bags/part-$i.mcap; head -c 100000 /dev/urandom >&3; sleep 1); done; \
         i=0; while [ $i -lt 600 ] && [ ! -e stop ]; do sleep 0.1; i=$((i+1)); done",
        "5m",
    );
    task["outputs"] = serde_json::json!([{ "path": "bags/*.mcap", "when": "continuous", "settle": "1s" }]);
    let mut job = job_json(
        "roll",
        serde_json::json!([{ "name": "t", "count": 1, "task": task }]),
    );
    job["spec"]["robotSelector"] = serde_json::json!({ "matchLabels": { "robot": "roll-1" } });
    env.create_job(job).await;

    // The three closed parts, while the task still runs; not the open file.
    let running = eventually("three parts uploaded while the task runs", || async {
        let t = env.tasks().get("roll-t-0").await.ok()?;
        let status = t.status.as_ref()?;
        let uploaded = status
            .outputs
            .iter()
            .filter(|o| o.state == OutputState::Uploaded)
            .count();
        (uploaded == 3).then_some(t)
    })
    .await;
    let status = running.status.as_ref().unwrap();
    assert_eq!(status.state, Some(TaskState::Running), "taken while it ran");
    assert!(
        status.outputs.iter().all(|o| o.path != "bags/open.mcap"),
        "a file held open is not taken: {:?}",
        status.outputs
    );
    // Let it end: the open file goes with the end of the attempt.
    let work = env.dir.path().join("agents/roll-1/tasks");
    let dir = std::fs::read_dir(&work)
        .unwrap()
        .flatten()
        .next()
        .expect("the task's directory")
        .path();
    std::fs::write(dir.join("work/stop"), b"").unwrap();
    let done = outputs_of(&env, "roll-t-0", 4).await;
    let mut paths: Vec<String> = done.status.unwrap().outputs.into_iter().map(|o| o.path).collect();
    paths.sort();
    assert_eq!(
        paths,
        [
            "bags/open.mcap",
            "bags/part-1.mcap",
            "bags/part-2.mcap",
            "bags/part-3.mcap"
        ]
    );
    // Each taken once.
    let log = std::fs::read_to_string(env.dir.path().join("roll-1.log")).unwrap();
    assert_eq!(log.matches(" output upload ").count(), 4, "{log}");
    env.stop().await;
}

/// The same path against a second, independent S3 implementation (moto,
/// installed by scripts/setup.sh), as `k8s4r up --outputs-endpoint` uses
/// a bucket of its own: the agent's parts, the server's multipart upload
/// and the download back through the cluster.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn moto_takes_what_an_agent_uploads() {
    let moto = tokio::task::spawn_blocking(|| k8s4r_testbed::moto::Moto::start("fleet-outputs"))
        .await
        .expect("moto starts");
    let keys = tempfile::NamedTempFile::new().expect("a file");
    std::fs::write(
        keys.path(),
        "accessKeyId=moto-key\nsecretAccessKey=moto-secret-never-on-a-robot\n",
    )
    .unwrap();
    let credentials = keys.path().display().to_string();
    let mut env = Env::start_with_up_flags(&[
        "--outputs-endpoint",
        &moto.endpoint,
        "--outputs-bucket",
        "fleet-outputs",
        "--outputs-credentials",
        &credentials,
    ])
    .await;
    env.spawn_agent_with(
        "moto-1",
        &[],
        &["--label", "robot=moto-1", "--upload-bytes-per-second", "0"],
    );
    env.wait_phase("moto-1", RobotPhase::Online).await;
    env.create_job(recording("viamoto", "moto-1", 20_000_000)).await;
    let done = outputs_of(&env, "viamoto-t-0", 1).await;
    let bag = &done.status.as_ref().unwrap().outputs[0];
    assert_eq!(bag.size, 20_000_000);
    let got = env.dir.path().join("from-moto.mcap");
    k8s4r::outputs::download(&env.client, "default", "viamoto-t-0", "bags/run.mcap", None, &got)
        .await
        .expect("the download from moto");
    assert_eq!(sha256(&got), bag.sha256);
    let log = std::fs::read(env.dir.path().join("moto-1.log")).unwrap();
    let secret = b"moto-secret-never-on-a-robot";
    assert!(!log.windows(secret.len()).any(|w| w == secret));
    env.stop().await;
}
