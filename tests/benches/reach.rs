//! Sessions on a robot through the cluster, on the real programs: the
//! embedded API server, server and manager, a real Mosquitto on loopback,
//! a real agent process and the real `k8s4r` CLI.
//!
//! - `portforward_mib_per_s`: four connections at once through `k8s4r
//!   port-forward` to an HTTP server on the robot, each downloading a file
//!   (the robot's session rate limit off, `--session-bytes-per-second 0`:
//!   what the path carries; the default limit is 8 MiB/s);
//! - `exec_echo_p99_ms`: one byte typed into `k8s4r exec -i TASK -- cat`
//!   to its echo on the CLI's stdout;
//! - `exec_session_agent_kib`: the agent's resident memory per open exec
//!   session (idle sessions held open).
//!
//! Run as:
//!
//!     cargo bench -p k8s4r-e2e --bench reach -- [MiB per connection] [echoes] [sessions]
//!     (defaults 64, 200, 20)

use std::io::{BufRead, Read, Write};
use std::path::Path;
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use k8s4r::up::{kubeconfig_path, manager_config, Stack, UpArgs};
use k8s4r_api::{Robot, RobotPhase, Task, TaskState};
use k8s4r_testbed::{eventually, free_port, Mosquitto};
use kube::api::PostParams;
use kube::Api;
use tokio_util::sync::CancellationToken;

const DEADLINE: Duration = Duration::from_secs(120);

struct Killed(Child);

impl Drop for Killed {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

fn cli(data_dir: &Path) -> Command {
    let mut cmd = Command::new(env!("CARGO_BIN_EXE_e2e-k8s4r"));
    cmd.env("KUBECONFIG", kubeconfig_path(data_dir))
        .env("RUST_BACKTRACE", "0");
    cmd
}

fn rss_kib(pid: u32) -> u64 {
    std::fs::read_to_string(format!("/proc/{pid}/status"))
        .unwrap_or_default()
        .lines()
        .find_map(|l| l.strip_prefix("VmRSS:"))
        .and_then(|v| v.trim().trim_end_matches("kB").trim().parse().ok())
        .unwrap_or(0)
}

fn p(v: &mut [Duration], q: f64) -> Duration {
    v.sort();
    let i = ((v.len() as f64 * q).ceil() as usize).clamp(1, v.len()) - 1;
    v[i]
}

/// One HTTP/1.0 GET: the body's length; None when nothing answers.
async fn http_get_len(port: u16, path: &str) -> Option<usize> {
    use tokio::io::{AsyncReadExt, AsyncWriteExt};
    let mut socket = tokio::net::TcpStream::connect(("127.0.0.1", port)).await.ok()?;
    socket
        .write_all(format!("GET {path} HTTP/1.0\r\n\r\n").as_bytes())
        .await
        .ok()?;
    let mut total = 0usize;
    let mut buf = vec![0u8; 256 * 1024];
    let mut head = Vec::new();
    let mut body_from = None;
    loop {
        let n = socket.read(&mut buf).await.ok()?;
        if n == 0 {
            break;
        }
        if body_from.is_none() {
            head.extend_from_slice(&buf[..n]);
            if let Some(at) = head.windows(4).position(|w| w == b"\r\n\r\n") {
                body_from = Some(());
                total += head.len() - at - 4;
            }
        } else {
            total += n;
        }
    }
    body_from.map(|()| total)
}

#[tokio::main]
async fn main() {
    let numbers: Vec<usize> = std::env::args().skip(1).filter_map(|a| a.parse().ok()).collect();
    let mib = numbers.first().copied().unwrap_or(64);
    let echoes = numbers.get(1).copied().unwrap_or(200);
    let sessions = numbers.get(2).copied().unwrap_or(20);
    println!(
        "INFO load average at start: {}",
        std::fs::read_to_string("/proc/loadavg")
            .unwrap_or_default()
            .trim()
    );
    let dir = tempfile::tempdir().expect("a dir");
    let mosquitto = Mosquitto::start();
    let data_dir = dir.path().join("data");
    let (api, broker) = (format!("127.0.0.1:{}", free_port()), mosquitto.url());
    let args = UpArgs::from_flags(&[
        "--api-bind",
        &api,
        "--mqtt-bind",
        "127.0.0.1:0",
        "--broker-url",
        &broker,
        "--local-agent",
        "false",
        "--in-memory",
        "--no-dashboard",
        "--store-listen",
        "127.0.0.1:0",
    ])
    .expect("the flags of up");
    let stack = Stack::start_with(&args, &data_dir, CancellationToken::new(), manager_config())
        .await
        .expect("the stack starts");
    let token = std::fs::read_to_string(data_dir.join("bootstrap-token")).expect("token");
    let agent = Killed(
        Command::new(env!("CARGO_BIN_EXE_e2e-agent"))
            .args([
                "--robot-id",
                "bench-1",
                "--token",
                token.trim(),
                "--broker-url",
                &mosquitto.url(),
            ])
            .arg("--state-dir")
            .arg(dir.path().join("agent"))
            .args(["--raw-exec", "true", "--allow-root", "true"])
            .args([
                "--session-bytes-per-second",
                "0",
                "--max-sessions",
                &(sessions + 8).to_string(),
            ])
            .stdout(Stdio::null())
            .stderr(std::fs::File::create(dir.path().join("agent.log")).expect("log"))
            .spawn()
            .expect("the agent"),
    );
    let robots: Api<Robot> = Api::all(stack.client.clone());
    eventually(DEADLINE, "the robot Online", || async {
        let r = robots.get_opt("bench-1").await.ok()??;
        (r.status?.phase? == RobotPhase::Online).then_some(())
    })
    .await;

    // A task serving four files of `mib` MiB on the robot's loopback.
    let served = dir.path().join("served");
    std::fs::create_dir_all(&served).expect("dir");
    let chunk = vec![0x5au8; 1 << 20];
    for i in 0..4 {
        let mut f = std::fs::File::create(served.join(format!("f{i}"))).expect("file");
        for _ in 0..mib {
            f.write_all(&chunk).expect("write");
        }
    }
    let port = free_port();
    let job: k8s4r_api::Job = serde_json::from_value(serde_json::json!({
        "apiVersion": "robot.k8s4r.io/v1alpha1", "kind": "Job",
        "metadata": { "name": "bench", "namespace": "default" },
        "spec": { "taskGroups": [{ "name": "t", "count": 1, "task": {
            "driver": "raw_exec", "command": "/bin/sh", "timeout": "1h", "killTimeout": "1s",
            "args": ["-c", format!("cd {} && exec python3 -m http.server {port} --bind 127.0.0.1 >/dev/null 2>&1", served.display())],
        }}]},
    }))
    .expect("a Job");
    Api::<k8s4r_api::Job>::namespaced(stack.client.clone(), "default")
        .create(&PostParams::default(), &job)
        .await
        .expect("create the Job");
    let tasks: Api<Task> = Api::namespaced(stack.client.clone(), "default");
    eventually(DEADLINE, "the task running", || async {
        let t = tasks.get("bench-t-0").await.ok()?;
        (t.status?.state? == TaskState::Running).then_some(())
    })
    .await;

    // Port-forward throughput.
    let local = free_port();
    let _forward = Killed(
        cli(&data_dir)
            .args(["port-forward", "bench-t-0", &format!("{local}:{port}")])
            .stdout(Stdio::null())
            .spawn()
            .expect("port-forward"),
    );
    eventually(DEADLINE, "the forward answering", || async {
        let probe = tokio::time::timeout(Duration::from_secs(5), http_get_len(local, "/f0")).await;
        probe.ok().flatten().filter(|n| *n == mib << 20)
    })
    .await;
    let started = Instant::now();
    let lens = futures::future::join_all((0..4).map(|i| {
        let path = format!("/f{i}");
        async move { http_get_len(local, &path).await.unwrap_or(0) }
    }))
    .await;
    let took = started.elapsed();
    assert!(lens.iter().all(|n| *n == mib << 20), "every file whole: {lens:?}");
    let total = (4 * mib) as f64;
    println!("port-forward: {total} MiB over 4 connections in {took:?}");
    println!(
        "BENCH portforward_mib_per_s {:.1} MiB/s",
        total / took.as_secs_f64()
    );

    // Keystroke to echo.
    let mut cat = Killed(
        cli(&data_dir)
            .args(["exec", "-i", "bench-t-0", "--", "cat"])
            .stdin(Stdio::piped())
            .stdout(Stdio::piped())
            .spawn()
            .expect("exec"),
    );
    let mut stdin = cat.0.stdin.take().expect("stdin");
    let mut stdout = std::io::BufReader::new(cat.0.stdout.take().expect("stdout"));
    let latencies = tokio::task::spawn_blocking(move || {
        let mut v = Vec::with_capacity(echoes);
        let mut line = String::new();
        // The first one opens the session's path; not counted.
        for i in 0..=echoes {
            let start = Instant::now();
            stdin.write_all(b"x\n").expect("type");
            stdin.flush().expect("flush");
            line.clear();
            stdout.read_line(&mut line).expect("echo");
            if i > 0 {
                v.push(start.elapsed());
            }
        }
        drop(stdin);
        let mut rest = Vec::new();
        let _ = stdout.read_to_end(&mut rest);
        v
    })
    .await
    .expect("echoes");
    let mut latencies = latencies;
    let ms = |d: Duration| d.as_secs_f64() * 1000.0;
    println!(
        "exec echo: {echoes} keystrokes; median {:.2} ms, max {:.2} ms",
        ms(p(&mut latencies, 0.5)),
        ms(p(&mut latencies, 1.0))
    );
    println!("BENCH exec_echo_p99_ms {:.2} ms", ms(p(&mut latencies, 0.99)));
    drop(cat);

    // Agent memory per open session.
    let agent_pid = agent.0.id();
    tokio::time::sleep(Duration::from_secs(2)).await;
    let before = rss_kib(agent_pid);
    let mut open = Vec::new();
    for _ in 0..sessions {
        let mut session = Killed(
            cli(&data_dir)
                .args(["exec", "-i", "bench-t-0", "--", "sh", "-c", "echo open; exec cat"])
                .stdin(Stdio::piped())
                .stdout(Stdio::piped())
                .spawn()
                .expect("exec"),
        );
        let mut out = std::io::BufReader::new(session.0.stdout.take().expect("stdout"));
        let mut line = String::new();
        out.read_line(&mut line).expect("open");
        assert_eq!(line, "open\n");
        open.push((session, out));
    }
    // Each has moved a little data, as a shell session has.
    for (session, out) in &mut open {
        let stdin = session.0.stdin.as_mut().expect("stdin");
        stdin.write_all(&[b'y'; 4000]).expect("type");
        stdin.write_all(b"\n").expect("type");
        let mut line = String::new();
        out.read_line(&mut line).expect("echo");
    }
    tokio::time::sleep(Duration::from_secs(2)).await;
    let after = rss_kib(agent_pid);
    println!("agent RSS: {before} KiB idle, {after} KiB with {sessions} sessions open");
    println!(
        "BENCH exec_session_agent_kib {:.0} KiB",
        after.saturating_sub(before) as f64 / sessions as f64
    );
    drop(open);
    drop(agent);
    let _ = stack.stop().await;
}
