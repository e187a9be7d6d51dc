//! `k8s4r logs` of large output against a real agent: read whole and
//! byte-exact, and a read that is cut (the connection, or the robot) fails
//! with a message on stderr instead of ending as if it were complete.

use std::io::Write;
use std::path::Path;
use std::process::Command;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;

use k8s4r::up::kubeconfig_path;
use k8s4r_api::{RobotPhase, TaskState};
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::{TcpListener, TcpStream};

// Not every test file uses every helper.
#[allow(unused_imports)]
mod support;
use support::*;

/// About 43 MB of numbered lines (in batches of 100,000, so that the
/// agent's log writer, which drops what it cannot keep up with, keeps up
/// on a busy machine): more than the robot's lease let a read take at the
/// old pace.
const SCRIPT: &str =
    "i=0; while [ $i -lt 55 ]; do seq $((i*100000+1)) $(((i+1)*100000)); i=$((i+1)); sleep 0.05; done";

/// The task's stdout log on the robot (the one file under the agent's
/// state directory named so).
fn robot_log(dir: &Path) -> Option<std::path::PathBuf> {
    for entry in std::fs::read_dir(dir).ok()?.flatten() {
        let path = entry.path();
        // (`logs/.times` holds the logs' time indexes, named as they are.)
        let hidden = entry.file_name().to_string_lossy().starts_with('.');
        if path.is_dir() && !hidden {
            if let Some(found) = robot_log(&path) {
                return Some(found);
            }
        } else if path.file_name().is_some_and(|n| n == "stdout.log") {
            return Some(path);
        }
    }
    None
}

/// An environment with one robot that keeps large logs, and a finished
/// task on it that wrote `LINES` lines.
async fn env_with_big_log(robot: &str) -> Env {
    let mut env = Env::start(&[]).await;
    env.spawn_agent_with(robot, &[], &["--log-max-bytes", "200000000"]);
    env.wait_phase(robot, RobotPhase::Online).await;
    env.create_job(job_json(
        "big",
        serde_json::json!([{ "name": "t", "count": 1, "task": sh(SCRIPT, "5m") }]),
    ))
    .await;
    let tasks = env.wait_tasks_final("big", 1).await;
    assert_eq!(
        tasks[0].status.as_ref().and_then(|s| s.state),
        Some(TaskState::Completed)
    );
    env
}

/// A one-shot read of tens of megabytes completes, byte for byte, with
/// nothing said on stderr.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_large_log_is_read_whole_and_exact() {
    let env = env_with_big_log("big-1").await;
    let file = env.dir.path().join("read.out");
    let mut out = std::fs::File::create(&file).expect("output file");
    let mut err = Vec::new();
    let started = std::time::Instant::now();
    let result = k8s4r::logs::copy(
        &env.client,
        "default",
        "big-t-0",
        "",
        None,
        false,
        &mut out,
        &mut err,
    )
    .await;
    out.flush().unwrap();
    let took = started.elapsed();
    let err = String::from_utf8_lossy(&err).into_owned();
    assert!(
        result.is_ok(),
        "the read failed: {:#} (stderr: {err})",
        result.unwrap_err()
    );
    assert_eq!(err, "", "nothing to say about a complete read");
    let size = std::fs::metadata(&file).unwrap().len();
    let on_robot = robot_log(&env.dir.path().join("agents/big-1")).expect("the task's log on the robot");
    assert!(
        std::fs::metadata(&on_robot).unwrap().len() > 30_000_000,
        "the task wrote tens of megabytes"
    );
    assert_eq!(
        sha256(&file),
        sha256(&on_robot),
        "the output, byte for byte ({size} bytes read)"
    );
    println!("read {size} bytes in {took:?}");
    env.stop().await;
}

/// Output that counts the bytes written and calls `at` once when more
/// than `after` have gone through.
struct Tripwire<F: FnMut()> {
    written: u64,
    after: u64,
    at: Option<F>,
}

impl<F: FnMut()> Write for Tripwire<F> {
    fn write(&mut self, buf: &[u8]) -> std::io::Result<usize> {
        self.written += buf.len() as u64;
        if self.written > self.after {
            if let Some(mut at) = self.at.take() {
                at();
            }
        }
        Ok(buf.len())
    }
    fn flush(&mut self) -> std::io::Result<()> {
        Ok(())
    }
}

/// The robot's agent killed in the middle of a read: the read ends with
/// a warning on stderr and an error, not as if the output were complete.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_read_whose_robot_goes_away_fails_saying_so() {
    let mut env = env_with_big_log("big-2").await;
    let pid = env.agents[0].1 .0.id();
    let mut out = Tripwire {
        written: 0,
        after: 1 << 20,
        at: Some(move || {
            let pid = nix::unistd::Pid::from_raw(i32::try_from(pid).expect("a pid"));
            nix::sys::signal::kill(pid, nix::sys::signal::Signal::SIGKILL).expect("kill the agent");
        }),
    };
    let mut err = Vec::new();
    let result = k8s4r::logs::copy(
        &env.client,
        "default",
        "big-t-0",
        "",
        None,
        false,
        &mut out,
        &mut err,
    )
    .await;
    let err = String::from_utf8_lossy(&err).into_owned();
    let failure = format!("{:#}", result.expect_err("a cut read fails"));
    assert!(err.contains("stopped answering"), "stderr: {err}");
    assert!(failure.contains("incomplete"), "{failure}");
    assert!(
        out.written < 40_000_000,
        "only part of the output arrived: {}",
        out.written
    );
    env.kill_agent("big-2");
    env.stop().await;
}

/// Forwards one connection to `upstream` and cuts both ways once more
/// than `limit` bytes came back.
async fn cutting_proxy(upstream: String, limit: u64) -> String {
    let listener = TcpListener::bind("127.0.0.1:0").await.expect("bind");
    let addr = listener.local_addr().unwrap();
    tokio::spawn(async move {
        while let Ok((client, _)) = listener.accept().await {
            let upstream = upstream.clone();
            tokio::spawn(async move {
                let Ok(server) = TcpStream::connect(&upstream).await else {
                    return;
                };
                let (mut cr, mut cw) = client.into_split();
                let (mut sr, mut sw) = server.into_split();
                let sent = Arc::new(AtomicU64::new(0));
                let up = tokio::spawn(async move { tokio::io::copy(&mut cr, &mut sw).await });
                let mut buf = vec![0u8; 64 * 1024];
                while let Ok(n) = sr.read(&mut buf).await {
                    if n == 0 || cw.write_all(&buf[..n]).await.is_err() {
                        break;
                    }
                    if sent.fetch_add(n as u64, Ordering::Relaxed) + n as u64 > limit {
                        break;
                    }
                }
                up.abort();
            });
        }
    });
    format!("https://{addr}")
}

/// The connection to the API server cut in the middle of a read: the
/// read fails, saying that it was cut.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_read_whose_connection_is_cut_fails_saying_so() {
    let env = env_with_big_log("big-3").await;
    let kubeconfig = kube::config::Kubeconfig::read_from(kubeconfig_path(&env.data_dir)).expect("kubeconfig");
    let mut config = kube::Config::from_custom_kubeconfig(kubeconfig, &Default::default())
        .await
        .expect("config");
    let upstream = config.cluster_url.authority().expect("an address").to_string();
    config.cluster_url = cutting_proxy(upstream, 2 << 20).await.parse().expect("a URL");
    let client = kube::Client::try_from(config).expect("client");
    let mut out = Vec::new();
    let mut err = Vec::new();
    let result = k8s4r::logs::copy(&client, "default", "big-t-0", "", None, false, &mut out, &mut err).await;
    let failure = format!("{:#}", result.expect_err("a cut read fails"));
    assert!(failure.contains("the read was cut"), "{failure}");
    assert!(out.len() < 40_000_000, "only part of the output: {}", out.len());
    env.stop().await;
}

/// `k8s4r logs` of task `name` in `default` (`query` as the logs API
/// takes it): stdout, stderr and how it ended.
async fn read_text(env: &Env, name: &str, query: &str) -> (String, String, anyhow::Result<()>) {
    let (mut out, mut err) = (Vec::new(), Vec::new());
    let result = k8s4r::logs::copy(
        &env.client,
        "default",
        name,
        query,
        None,
        false,
        &mut out,
        &mut err,
    )
    .await;
    let text = |b: &[u8]| String::from_utf8_lossy(b).into_owned();
    (text(&out), text(&err), result)
}

/// While its robot is offline, a running task's last output is what the
/// cluster holds: `k8s4r logs` prints it, says why on stderr, and fails
/// as partial.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_running_tasks_last_output_is_read_while_its_robot_is_offline() {
    let mut env = Env::start(&[]).await;
    env.spawn_agent_with("rb1", &[], &["--output-tail-every", "1s"]);
    env.wait_phase("rb1", RobotPhase::Online).await;
    let script = "echo leaving the dock; echo at waypoint 3; exec sleep 60";
    env.create_job(job_json(
        "mission",
        serde_json::json!([{ "name": "drive", "count": 1, "task": sh(script, "10m") }]),
    ))
    .await;
    eventually("the running task's output in its status", || async {
        let status = env.job_tasks("mission").await.pop()?.status?;
        let running = status.state == Some(TaskState::Running);
        (running && status.output_tail.as_deref()?.contains("at waypoint 3")).then_some(())
    })
    .await;

    env.kill_agent("rb1");
    env.wait_phase("rb1", RobotPhase::Offline).await;
    let (out, err, result) = read_text(&env, "mission-drive-0", "").await;
    assert_eq!(out, "leaving the dock\nat waypoint 3\n", "stderr: {err}");
    assert!(err.contains("robot rb1 is offline"), "{err}");
    let error = result.expect_err("only part of the output: a failure");
    assert!(
        error.downcast_ref::<k8s4r::logs::Partial>().is_some(),
        "{error:#}"
    );
    // `k8s4r logs` says it by its exit code.
    let run = Command::new(env!("CARGO_BIN_EXE_e2e-k8s4r"))
        .arg("logs")
        .arg("mission-drive-0")
        .arg("--kubeconfig")
        .arg(kubeconfig_path(&env.data_dir))
        .output()
        .expect("run k8s4r logs");
    assert_eq!(
        run.status.code(),
        Some(i32::from(k8s4r::logs::EXIT_PARTIAL)),
        "{}",
        String::from_utf8_lossy(&run.stderr)
    );
    assert_eq!(
        String::from_utf8_lossy(&run.stdout),
        "leaving the dock\nat waypoint 3\n"
    );
    let task = env.job_tasks("mission").await.pop().and_then(|t| t.status);
    assert_eq!(
        task.and_then(|s| s.state),
        Some(TaskState::Running),
        "the task still runs as far as the cluster knows"
    );
    env.stop().await;
}

/// `--since` reads from the time each line was written (the logger's time
/// index), not whole files.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn since_prints_what_was_written_since_not_whole_files() {
    let mut env = Env::start(&[]).await;
    env.spawn_agent("rb1", &[]);
    env.wait_phase("rb1", RobotPhase::Online).await;
    let marker = env.scratch.join("late");
    let script = format!(
        "seq 1 300 | sed 's/^/early /'; sleep 4; echo late; touch {}; exec sleep 60",
        marker.display()
    );
    env.create_job(job_json(
        "since",
        serde_json::json!([{ "name": "t", "count": 1, "task": sh(&script, "10m") }]),
    ))
    .await;
    eventually("the late line written", || async {
        marker.exists().then_some(())
    })
    .await;
    let (out, err, result) = read_text(&env, "since-t-0", "sinceSeconds=2").await;
    result.expect("read the logs");
    assert_eq!(out, "late\n", "stderr: {err}");
    env.stop().await;
}
