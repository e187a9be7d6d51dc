//! End-to-end: reaching robots with the real `k8s4r` CLI through the real
//! API server, server, Mosquitto and agents: exec into a task (its user,
//! directory and environment; a pty driven by a script; stdin with its
//! end; the exit status), copies both ways, port-forward of 100 MB over
//! four connections, refusals by RBAC and by the robot's settings, a robot
//! cut off mid-session, and a session saturating a thin link beside the
//! robot's heartbeats. (The shipped ACL's session topics are checked in
//! deploy.rs.)

use std::io::{Read, Write};
use std::os::fd::AsFd;
use std::path::{Path, PathBuf};
use std::process::{Command, Output, Stdio};
use std::time::Duration;

use k8s4r::up::kubeconfig_path;
use k8s4r_api::{Task, TaskState};
use k8s4r_testbed::proxy::{Fault, Proxy};
use k8s_openapi::api::events::v1::Event;
use kube::api::ListParams;
use kube::Api;
use sha2::{Digest, Sha256};

mod support;
use support::*;

/// The CLI, as people run it, on the test's kubeconfig.
fn cli(env: &Env) -> Command {
    let mut cmd = Command::new(env!("CARGO_BIN_EXE_e2e-k8s4r"));
    cmd.env("KUBECONFIG", kubeconfig_path(&env.data_dir))
        .env("RUST_BACKTRACE", "0");
    cmd
}

/// Runs the CLI to its end, off the runtime's workers (the stack runs on
/// them: a worker blocked in a wait can strand a task it was to run).
async fn run(cmd: &mut Command) -> Output {
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

/// A task that runs until stopped: `script` first, then a long sleep.
fn long_task(driver: &str, script: &str) -> serde_json::Value {
    let mut task = sh(&format!("{script}; exec sleep 3600"), "30m");
    task["driver"] = driver.into();
    task
}

/// Creates a Job of one task and waits until it runs; its Task.
async fn running_task(env: &Env, job: &str, task: serde_json::Value) -> Task {
    running_task_on(env, job, task, None).await
}

/// Like [`running_task`], on the robot labelled `name=<robot>`.
async fn running_task_on(env: &Env, job: &str, task: serde_json::Value, robot: Option<&str>) -> Task {
    let mut group = serde_json::json!({ "name": "t", "count": 1, "task": task });
    if let Some(robot) = robot {
        group["robotSelector"] = serde_json::json!({ "matchLabels": { "name": robot } });
    }
    env.create_job(job_json(job, serde_json::json!([group]))).await;
    let name = format!("{job}-t-0");
    eventually(&format!("{name} running"), || async {
        let t = env.tasks().get(&name).await.ok()?;
        (t.status.as_ref()?.state? == TaskState::Running).then_some(t)
    })
    .await
}

fn sha256(bytes: &[u8]) -> String {
    format!("{:x}", Sha256::digest(bytes))
}

fn random_file(path: &Path, len: usize) -> String {
    let mut bytes = vec![0u8; len];
    std::fs::File::open("/dev/urandom")
        .unwrap()
        .read_exact(&mut bytes)
        .unwrap();
    std::fs::write(path, &bytes).unwrap();
    sha256(&bytes)
}

/// Session Events of `regarding` with `reason`.
async fn session_events(env: &Env, reason: &str) -> Vec<String> {
    let events: Api<Event> = Api::namespaced(env.client.clone(), "default");
    events
        .list(&ListParams::default())
        .await
        .map(|l| l.items)
        .unwrap_or_default()
        .into_iter()
        .filter(|e| e.reason.as_deref() == Some(reason))
        .filter_map(|e| e.note)
        .collect()
}

/// Exec into a task: its user, directory and environment, stdin with its
/// end, the exit status, a pty driven like a person (type, read the echo,
/// resize, exit with a status), copies both ways, and the Events.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn exec_and_copies_reach_a_running_task_as_it_runs() {
    let env = Env::start(&[("reach-1", &[])]).await;
    let mut task = long_task("exec", "echo hi > file.txt");
    task["env"] = serde_json::json!([{ "name": "GREETING", "value": "hello" }]);
    let task = running_task(&env, "svc", task).await;
    let uid = task.metadata.uid.clone().unwrap();
    let name = "svc-t-0";

    // Its user, directory and environment; its exit status is ours.
    let out = run(cli(&env).args([
        "exec",
        name,
        "--",
        "sh",
        "-c",
        "echo uid=$(id -u) owner=$(stat -c %u file.txt); pwd; echo $GREETING; exit 3",
    ]))
    .await;
    assert_eq!(out.status.code(), Some(3), "{}", text(&out));
    let said = String::from_utf8_lossy(&out.stdout).to_string();
    let lines: Vec<&str> = said.lines().collect();
    let (uid_line, pwd, greeting) = (lines[0], lines[1], lines[2]);
    let ids: Vec<&str> = uid_line
        .split(' ')
        .map(|w| w.split('=').nth(1).unwrap())
        .collect();
    assert_ne!(ids[0], "0", "the task's own user, not root: {said}");
    assert_eq!(ids[0], ids[1], "the user the task runs as: {said}");
    assert!(
        pwd.contains(&uid) && pwd.ends_with("/work"),
        "the task's directory: {pwd}"
    );
    assert_eq!(greeting, "hello");

    // stdin, and its end.
    let mut child = cli(&env)
        .args(["exec", "-i", name, "--", "sh", "-c", "wc -c; echo after-eof"])
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .spawn()
        .unwrap();
    child.stdin.take().unwrap().write_all(b"abc\n").unwrap();
    let out = tokio::task::spawn_blocking(move || child.wait_with_output().unwrap())
        .await
        .unwrap();
    assert!(out.status.success());
    assert_eq!(String::from_utf8_lossy(&out.stdout).trim(), "4\nafter-eof");

    // A terminal: type, read the echo, resize, exit with a status.
    pty_session(&env, name).await;

    // Copies both ways, with checksums; the file is the task user's.
    let local = env.scratch.join("up.bin");
    let sum = random_file(&local, 3_000_000);
    let out = run(cli(&env).args(["cp"]).arg(&local).arg(format!("{name}:data.bin"))).await;
    assert!(out.status.success(), "{}", text(&out));
    let out = run(cli(&env).args([
        "exec",
        name,
        "--",
        "sh",
        "-c",
        "sha256sum data.bin | cut -d' ' -f1; stat -c %u data.bin; id -u; ls",
    ]))
    .await;
    let seen = String::from_utf8_lossy(&out.stdout).to_string();
    let seen: Vec<&str> = seen.lines().collect();
    assert_eq!(seen[0], sum, "the robot has what was sent");
    assert_eq!(seen[1], seen[2], "owned by the task's user");
    assert!(
        !seen.iter().any(|l| l.contains("k8s4r-part")),
        "no partial file left: {seen:?}"
    );
    let back = env.scratch.join("down.bin");
    let out = run(cli(&env).args(["cp", &format!("{name}:data.bin")]).arg(&back)).await;
    assert!(out.status.success(), "{}", text(&out));
    assert_eq!(sha256(&std::fs::read(&back).unwrap()), sum);
    // A file that is not there fails, saying so, and leaves nothing here.
    let missing = env.scratch.join("missing.bin");
    let out = run(cli(&env).args(["cp", &format!("{name}:nope.bin")]).arg(&missing)).await;
    assert!(!out.status.success());
    assert!(text(&out).contains("No such file"), "{}", text(&out));
    assert!(!missing.exists() && !env.scratch.join("missing.k8s4r-part").exists());

    // Every session is recorded: who, what, how it ended.
    let ended = eventually("the sessions' Events", || async {
        let ended = session_events(&env, "SessionEnded").await;
        (ended.len() >= 5).then_some(ended)
    })
    .await;
    assert!(
        ended
            .iter()
            .any(|n| n.contains("exit status 3") && n.contains("exec")),
        "{ended:?}"
    );
    let opened = session_events(&env, "SessionOpened").await;
    assert!(
        opened
            .iter()
            .any(|n| n.contains(name) && n.contains("copy to data.bin")),
        "{opened:?}"
    );
    env.stop().await;
}

/// Drives `k8s4r exec -it` in a pty as a person would.
async fn pty_session(env: &Env, name: &str) {
    let pty = nix::pty::openpty(None, None).unwrap();
    let slave_path = nix::unistd::ttyname(pty.slave.as_fd()).unwrap();
    let stty = |size: &str| {
        let args: Vec<&str> = size.split(' ').collect();
        let out = Command::new("stty")
            .arg("-F")
            .arg(&slave_path)
            .args(["rows", args[0], "cols", args[1]])
            .output()
            .unwrap();
        assert!(
            out.status.success(),
            "stty: {}",
            String::from_utf8_lossy(&out.stderr)
        );
    };
    stty("30 100");
    let io = |fd: &std::os::fd::OwnedFd| Stdio::from(fd.try_clone().unwrap());
    let mut child = cli(env)
        .args(["exec", "-i", "-t", name, "--", "sh"])
        .stdin(io(&pty.slave))
        .stdout(io(&pty.slave))
        .stderr(io(&pty.slave))
        .spawn()
        .unwrap();
    drop(pty.slave);
    let master = std::fs::File::from(pty.master);
    let (tx, mut rx) = tokio::sync::mpsc::unbounded_channel::<Vec<u8>>();
    let mut reader = master.try_clone().unwrap();
    std::thread::spawn(move || {
        let mut buf = [0u8; 4096];
        while let Ok(n) = reader.read(&mut buf) {
            if n == 0 || tx.send(buf[..n].to_vec()).is_err() {
                return;
            }
        }
    });
    let mut seen = String::new();
    let mut expect = async |what: &str| {
        let found = tokio::time::timeout(DEADLINE, async {
            while !seen.contains(what) {
                match rx.recv().await {
                    Some(bytes) => seen.push_str(&String::from_utf8_lossy(&bytes)),
                    None => return false,
                }
            }
            true
        })
        .await;
        assert!(
            found == Ok(true),
            "waited for {what:?} in the terminal; it shows {seen:?}"
        );
        // What came after it is for the next wait.
        let at = seen.find(what).map_or(0, |i| i + what.len());
        seen = seen[at..].to_owned();
    };
    let mut writer = master;
    // The echo of what is typed, then the answers: a terminal, its size.
    writer.write_all(b"tty; stty size; echo $TERM\n").unwrap();
    expect("stty size; echo $TERM").await;
    expect("/dev/pts/").await;
    expect("30 100").await;
    expect("xterm").await;
    stty("40 120");
    nix::sys::signal::kill(
        nix::unistd::Pid::from_raw(child.id() as i32),
        nix::sys::signal::Signal::SIGWINCH,
    )
    .unwrap();
    // The new size arrives with the next SIGWINCH the client relays.
    let deadline = tokio::time::Instant::now() + DEADLINE;
    loop {
        writer.write_all(b"stty size\n").unwrap();
        let until = tokio::time::Instant::now() + Duration::from_millis(500);
        let mut got = String::new();
        while let Ok(Some(bytes)) = tokio::time::timeout_at(until, rx.recv()).await {
            got.push_str(&String::from_utf8_lossy(&bytes));
        }
        if got.contains("40 120") {
            break;
        }
        assert!(
            tokio::time::Instant::now() < deadline,
            "the remote terminal never resized: {got:?}"
        );
    }
    writer.write_all(b"exit 7\n").unwrap();
    let status = tokio::task::spawn_blocking(move || child.wait().unwrap())
        .await
        .unwrap();
    assert_eq!(status.code(), Some(7), "the remote shell's exit status");
}

/// One HTTP/1.0 GET of `path` on `port`: the body.
async fn http_get(port: u16, path: &str) -> Vec<u8> {
    try_http_get(port, path).await.expect("an HTTP answer")
}

async fn try_http_get(port: u16, path: &str) -> Option<Vec<u8>> {
    use tokio::io::{AsyncReadExt, AsyncWriteExt};
    let mut socket = tokio::net::TcpStream::connect(("127.0.0.1", port)).await.ok()?;
    socket
        .write_all(format!("GET {path} HTTP/1.0\r\n\r\n").as_bytes())
        .await
        .ok()?;
    let mut all = Vec::new();
    socket.read_to_end(&mut all).await.ok()?;
    let at = all.windows(4).position(|w| w == b"\r\n\r\n")? + 4;
    Some(all.split_off(at))
}

/// A kubeconfig that acts as `user` (impersonated by the admin's).
fn kubeconfig_as(env: &Env, user: &str) -> PathBuf {
    let admin = std::fs::read_to_string(kubeconfig_path(&env.data_dir)).unwrap();
    let mut config: serde_yaml::Value = serde_yaml::from_str(&admin).unwrap();
    for entry in config["users"].as_sequence_mut().unwrap() {
        entry["user"]["as"] = user.into();
    }
    let path = env.scratch.join(format!("{user}.kubeconfig"));
    std::fs::write(&path, serde_yaml::to_string(&config).unwrap()).unwrap();
    path
}

/// Port-forward of 100 MB over four connections at once (checksums
/// match); a viewer is refused by RBAC; robots refuse by their settings,
/// naming the setting; a robot that allows it runs a session as its
/// configured user, at the configured ports only.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn port_forward_and_who_may_open_what() {
    let mut env = Env::start(&[("fwd-1", &["name=fwd-1"])]).await;
    // Two more: one that takes no sessions, one that takes robot sessions.
    env.spawn_agent_with("closed-1", &["name=closed-1"], &["--sessions", "off"]);
    env.spawn_agent_with(
        "open-1",
        &["name=open-1"],
        &[
            "--sessions",
            "robot",
            "--session-user",
            "nobody",
            "--forward-ports",
            "1-1000",
        ],
    );
    env.wait_phase("closed-1", k8s4r_api::RobotPhase::Online).await;
    env.wait_phase("open-1", k8s4r_api::RobotPhase::Online).await;

    // Four files of 25 MB, served by a task on the robot's loopback.
    let served = env.scratch.join("served");
    std::fs::create_dir_all(&served).unwrap();
    let sums: Vec<String> = (0..4)
        .map(|i| random_file(&served.join(format!("part{i}")), 25_000_000))
        .collect();
    let port = free_port();
    let task = long_task(
        "raw_exec",
        &format!(
            "cd {} && python3 -m http.server {port} --bind 127.0.0.1 >/dev/null 2>&1 & sleep 0",
            served.display()
        ),
    );
    running_task_on(&env, "web", task, Some("fwd-1")).await;
    let local = free_port();
    let mut forward = Proc(
        cli(&env)
            .args(["port-forward", "web-t-0", &format!("{local}:{port}")])
            .stdout(Stdio::piped())
            .stderr(Stdio::piped())
            .spawn()
            .unwrap(),
    );
    // Listening, and the server on the robot answering through it.
    eventually("the forward answering", || async {
        let probe = tokio::time::timeout(Duration::from_secs(5), try_http_get(local, "/")).await;
        probe.ok().flatten().filter(|body| !body.is_empty())
    })
    .await;
    let started = std::time::Instant::now();
    let paths: Vec<String> = (0..4).map(|i| format!("/part{i}")).collect();
    let bodies = futures::future::join_all(paths.iter().map(|p| http_get(local, p))).await;
    let took = started.elapsed();
    for (i, body) in bodies.iter().enumerate() {
        assert_eq!(body.len(), 25_000_000, "part {i} whole");
        assert_eq!(sha256(body), sums[i], "part {i} as it is on the robot");
    }
    eprintln!("100 MB through four forwarded connections in {took:?}");
    let _ = forward.0.kill();

    // A viewer may read, not exec.
    kubectl(
        &kubeconfig_path(&env.data_dir),
        &[
            "create",
            "rolebinding",
            "ann-view",
            "-n",
            "default",
            "--clusterrole=view",
            "--user=ann",
        ],
    );
    let ann = kubeconfig_as(&env, "ann");
    let out = run(cli(&env)
        .env("KUBECONFIG", &ann)
        .args(["exec", "web-t-0", "--", "true"]))
    .await;
    assert!(!out.status.success());
    assert!(
        text(&out).contains("you may not open exec sessions on task web-t-0")
            && text(&out).contains("tasks/exec"),
        "{}",
        text(&out)
    );

    // A robot that takes task sessions only says so for a robot session.
    let out = run(cli(&env).args(["exec", "robot/fwd-1", "--", "id"])).await;
    assert!(!out.status.success());
    assert!(
        text(&out).contains("robot fwd-1 takes sessions inside tasks only")
            && text(&out).contains("sessions = \"tasks\""),
        "{}",
        text(&out)
    );
    // One with sessions off refuses everything, naming the setting.
    let mut closed = long_task("raw_exec", "true");
    closed["killTimeout"] = "1s".into();
    running_task_on(&env, "closed", closed, Some("closed-1")).await;
    let out = run(cli(&env).args(["exec", "closed-t-0", "--", "true"])).await;
    assert!(!out.status.success());
    assert!(
        text(&out).contains("robot closed-1 takes no sessions") && text(&out).contains("sessions = \"off\""),
        "{}",
        text(&out)
    );

    // One that allows robot sessions runs them as its session user, and
    // forwards only the ports it lists.
    let out = run(cli(&env).args(["exec", "robot/open-1", "--", "id", "-un"])).await;
    assert!(out.status.success(), "{}", text(&out));
    assert_eq!(String::from_utf8_lossy(&out.stdout).trim(), "nobody");
    let high = free_port();
    let said = env.scratch.join("refused-forward.log");
    let mut refused = Proc(
        cli(&env)
            .args(["port-forward", "robot/open-1", &format!("{high}:2000")])
            .stdout(Stdio::null())
            .stderr(std::fs::File::create(&said).unwrap())
            .spawn()
            .unwrap(),
    );
    eventually("the refused forward said why", || async {
        // Each connection is a session: this one is refused by the robot.
        if let Ok(mut s) = tokio::net::TcpStream::connect(("127.0.0.1", high)).await {
            let mut sink = Vec::new();
            let _ = tokio::time::timeout(
                Duration::from_secs(5),
                tokio::io::AsyncReadExt::read_to_end(&mut s, &mut sink),
            )
            .await;
        }
        let out = std::fs::read_to_string(&said).unwrap_or_default();
        (out.contains("does not forward port 2000") && out.contains("forward_ports")).then_some(())
    })
    .await;
    let _ = refused.0.kill();
    env.stop().await;
}

/// `text` without terminal colour codes.
fn strip_ansi(text: &str) -> String {
    let mut out = String::with_capacity(text.len());
    let mut chars = text.chars();
    while let Some(c) = chars.next() {
        if c == '\u{1b}' {
            for c in chars.by_ref() {
                if c.is_ascii_alphabetic() {
                    break;
                }
            }
            continue;
        }
        out.push(c);
    }
    out
}

/// The heartbeat round trips the agent's log shows since `from` lines in,
/// in ms.
fn heartbeat_round_trips(log: &Path, from: usize) -> Vec<u64> {
    strip_ansi(&std::fs::read_to_string(log).unwrap_or_default())
        .lines()
        .skip(from)
        .filter(|l| l.contains("heartbeat confirmed"))
        .filter_map(|l| l.split("after_ms=").nth(1)?.split(' ').next()?.parse().ok())
        .collect()
}

/// A robot cut off mid-session: the client ends non-zero saying so, and
/// the robot leaves no process of it behind. A session that saturates a
/// thin link keeps the robot's heartbeats confirmed within their
/// interval (1 s here).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_cut_off_robot_ends_its_sessions_and_a_busy_link_keeps_heartbeats() {
    let lease = Duration::from_secs(3);
    let mut env = Env::start_with_session_lease(&[], lease).await;
    let broker: std::net::SocketAddr = env.broker_url.trim_start_matches("mqtt://").parse().unwrap();
    let proxy = Proxy::start(broker).await;
    env.spawn_agent_via(
        "thin-1",
        &[],
        &["--log", "info,k8s4r_agent::session::core::downlink=debug"],
        &proxy.mqtt_url(),
    );
    env.wait_phase("thin-1", k8s4r_api::RobotPhase::Online).await;
    let log = env.dir.path().join("thin-1.log");
    running_task(&env, "held", long_task("raw_exec", "true")).await;

    // A saturated link: 1 MiB/s each way, 6 MB out of the robot.
    proxy.set(Fault::Throttle(1 << 20));
    let from = std::fs::read_to_string(&log).unwrap_or_default().lines().count();
    let started = std::time::Instant::now();
    let out = run(cli(&env).args(["exec", "held-t-0", "--", "sh", "-c", "head -c 6000000 /dev/zero"])).await;
    let took = started.elapsed();
    assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
    assert_eq!(out.stdout.len(), 6_000_000, "every byte");
    assert!(took >= Duration::from_secs(4), "the link was the limit: {took:?}");
    let trips = heartbeat_round_trips(&log, from);
    assert!(
        trips.len() >= 3,
        "heartbeats went on during the session: {trips:?}"
    );
    assert!(
        trips.iter().all(|ms| *ms < 1000),
        "a heartbeat waited past its interval behind the session: {trips:?} ms"
    );
    proxy.heal();

    // Cut off before the robot answers: said within the robot's time to
    // answer, not hung.
    proxy.set(Fault::Blackhole);
    let started = std::time::Instant::now();
    let out = run(cli(&env).args(["exec", "held-t-0", "--", "true"])).await;
    assert!(!out.status.success());
    assert!(
        text(&out).contains("robot thin-1 did not answer the session"),
        "{}",
        text(&out)
    );
    assert!(
        started.elapsed() < Duration::from_secs(30),
        "{:?}",
        started.elapsed()
    );
    proxy.heal();

    // Cut off mid-session.
    let pid_file = env.scratch.join("sleeper.pid");
    let said = env.scratch.join("cut-session.log");
    let mut session = cli(&env)
        .args(["exec", "held-t-0", "--", "sh", "-c"])
        .arg(format!(
            "echo $$ > {}; echo started; exec sleep 1000",
            pid_file.display()
        ))
        .stdout(Stdio::piped())
        .stderr(std::fs::File::create(&said).unwrap())
        .spawn()
        .unwrap();
    // Started, and the session open (its output came through).
    let mut stdout = session.stdout.take().unwrap();
    let first = tokio::task::spawn_blocking(move || {
        let mut line = [0u8; 8];
        stdout.read_exact(&mut line).map(|()| line)
    });
    let first = tokio::time::timeout(DEADLINE, first)
        .await
        .unwrap()
        .unwrap()
        .unwrap();
    assert_eq!(&first, b"started\n");
    let pid = read_pid(&pid_file).await;
    assert!(Path::new(&format!("/proc/{pid}")).exists());
    proxy.set(Fault::Blackhole);
    let ended = tokio::task::spawn_blocking(move || session.wait().unwrap());
    let status = tokio::time::timeout(DEADLINE, ended).await;
    let err = std::fs::read_to_string(&said).unwrap_or_default();
    let status = status
        .unwrap_or_else(|_| panic!("the client did not end; it said {err:?}"))
        .unwrap();
    assert!(!status.success(), "ended non-zero");
    assert!(err.contains("robot thin-1 stopped answering"), "{err}");
    eventually("the session's process gone from the robot", || async {
        (!Path::new(&format!("/proc/{pid}")).exists()).then_some(())
    })
    .await;
    proxy.heal();
    env.stop().await;
}
