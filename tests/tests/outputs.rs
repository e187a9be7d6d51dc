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

fn sha256(path: &Path) -> String {
    let out = std::process::Command::new("sha256sum")
        .arg(path)
        .output()
        .expect("sha256sum runs");
    String::from_utf8_lossy(&out.stdout)
        .split_whitespace()
        .next()
        .expect("a checksum")
        .to_owned()
}

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
