//! Hostile dispatches against the real agent process and a real Mosquitto
//! (issue 15): each must fail only itself, with a clear status, while the
//! robot keeps running other tasks and heartbeating. No sleeps to wait for
//! anything: every wait is for a message or a condition, with a deadline.
//!
//! Most need root (task uids, mounts), which is how the tests run here and
//! in CI; without it they say so and pass without testing.

mod support;

use std::collections::HashMap;
use std::os::unix::fs::PermissionsExt;
use std::path::{Path, PathBuf};
use std::process::Command;
use std::sync::Arc;
use std::time::{Duration, Instant};

use k8s4r_api::protocol::{encode, Dispatch, Heartbeat, StatusUpdate};
use k8s4r_api::{Artifact, DurationString, TaskReason, TaskState, TaskTemplate};
use sha2::{Digest, Sha256};
use support::{eventually, Agent, Broker, Server};
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::TcpListener;
use tokio::sync::Notify;

const LONG: Duration = Duration::from_secs(60);

fn is_root() -> bool {
    let root = nix::unistd::geteuid().is_root();
    if !root {
        eprintln!("skipped: needs root");
    }
    root
}

fn task(driver: &str, script: &str) -> TaskTemplate {
    TaskTemplate {
        driver: driver.to_owned(),
        command: "/bin/sh".to_owned(),
        args: vec!["-c".to_owned(), script.to_owned()],
        ..TaskTemplate::default()
    }
}

trait TemplateExt {
    fn timeout(self, t: &str) -> Self;
    fn kill_timeout(self, t: &str) -> Self;
}

impl TemplateExt for TaskTemplate {
    fn timeout(mut self, t: &str) -> Self {
        self.timeout = Some(DurationString::from(t));
        self
    }
    fn kill_timeout(mut self, t: &str) -> Self {
        self.kill_timeout = Some(DurationString::from(t));
        self
    }
}

/// One robot: a broker, the test's server, the real agent, its state dir.
struct Robot {
    id: String,
    server: Server,
    agent: Agent,
    _dir: tempfile::TempDir,
    state: PathBuf,
    statuses: HashMap<String, Vec<StatusUpdate>>,
    heartbeats: Vec<Heartbeat>,
    _broker: Broker,
}

impl Robot {
    /// An approved robot whose state dir is `state` (or one of its own).
    async fn start(id: &str, state: Option<&Path>, extra: &[&str]) -> Robot {
        let broker = Broker::start();
        let mut server = Server::connect(&broker, id).await;
        let dir = tempfile::tempdir().unwrap();
        // Tasks run as uids of their own and must walk down to their
        // directory, as they do under /var/lib on a robot.
        std::fs::set_permissions(dir.path(), std::fs::Permissions::from_mode(0o755)).unwrap();
        let state = state.map_or_else(|| dir.path().join("state"), Path::to_path_buf);
        // Off the state's disk, as systemd's tmpfs for the unit is.
        let run = dir.path().join("run");
        std::fs::create_dir(&run).unwrap();
        let env = [("RUNTIME_DIRECTORY", run.to_str().unwrap())];
        let agent = Agent::start_with_env(&broker, id, &state, extra, &env);
        server.approve(id).await;
        Robot {
            id: id.to_owned(),
            server,
            agent,
            _dir: dir,
            state,
            statuses: HashMap::new(),
            heartbeats: Vec::new(),
            _broker: broker,
        }
    }

    async fn send(&self, uid: &str, spec: TaskTemplate) {
        let dispatch = Dispatch::new(uid, format!("default/{uid}"), 1, spec);
        self.server
            .publish(self.server.topics.dispatch(&self.id), encode(&dispatch))
            .await;
    }

    /// Reads messages until `done` holds, keeping every status and
    /// heartbeat.
    async fn pump_until(&mut self, what: &str, mut done: impl FnMut(&Robot) -> bool) {
        let deadline = Instant::now() + LONG;
        while !done(self) {
            let left = deadline.saturating_duration_since(Instant::now());
            assert!(!left.is_zero(), "timed out waiting for {what}");
            let m = self.server.next("", left).await;
            if m.topic.ends_with("/status") {
                let update: StatusUpdate = m.decode();
                self.statuses
                    .entry(update.task_uid.clone())
                    .or_default()
                    .push(update);
            } else if m.topic.ends_with("/heartbeat") {
                self.heartbeats.push(m.decode());
            }
        }
    }

    fn last(&self, uid: &str) -> Option<&StatusUpdate> {
        self.statuses.get(uid).and_then(|s| s.last())
    }

    fn is_over(&self, uid: &str) -> bool {
        self.last(uid).is_some_and(|u| u.state.is_terminal())
    }

    /// The final status of `uid`.
    async fn terminal(&mut self, uid: &str) -> StatusUpdate {
        self.pump_until(&format!("{uid} to end"), |r| r.is_over(uid))
            .await;
        self.last(uid).cloned().unwrap()
    }

    async fn running(&mut self, uid: &str) {
        self.pump_until(&format!("{uid} to run"), |r| {
            r.statuses
                .get(uid)
                .is_some_and(|s| s.iter().any(|u| u.state == TaskState::Running))
        })
        .await;
    }

    /// The robot is fine: it runs a task to completion and heartbeats after.
    async fn still_works(&mut self, canary: &str) {
        self.send(canary, task("exec", "echo alive")).await;
        let last = self.terminal(canary).await;
        assert_eq!(
            (last.state, last.output_tail.as_deref()),
            (TaskState::Completed, Some("alive\n")),
            "{last:#?}"
        );
        let seen = self.heartbeats.len();
        self.pump_until("a heartbeat after that", |r| r.heartbeats.len() > seen)
            .await;
        assert!(self.agent.is_running(), "{}", self.agent.log());
    }

    fn work_dir(&self, uid: &str) -> PathBuf {
        self.state.join(format!("tasks/{uid}-1/work"))
    }
}

/// Asserts a refusal: failed, never started, the reason, and a message
/// with `needle`.
fn assert_refused(update: &StatusUpdate, reason: TaskReason, needle: &str) {
    assert_eq!(update.state, TaskState::Failed, "{update:#?}");
    assert_eq!(update.reason, Some(reason), "{update:#?}");
    let message = update.message.as_deref().unwrap_or_default();
    assert!(message.contains(needle), "{message:?} lacks {needle:?}");
}

#[tokio::test]
async fn huge_and_overflowing_durations_fail_only_their_task() {
    let mut robot = Robot::start("hostile-durations", None, &[]).await;
    let cases = [
        ("years", task("exec", "true").timeout("3y"), "spec.timeout"),
        (
            "u64",
            task("exec", "true").timeout("18446744073709551615s"),
            "spec.timeout",
        ),
        (
            "overflow",
            task("exec", "true").timeout("99999999999999999999999d"),
            "spec.timeout",
        ),
        (
            "kill",
            task("exec", "true").kill_timeout("100000h"),
            "spec.killTimeout",
        ),
    ];
    for (uid, spec, _) in &cases {
        robot.send(uid, spec.clone()).await;
    }
    for (uid, _, field) in cases {
        let last = robot.terminal(uid).await;
        assert_refused(&last, TaskReason::InvalidSpec, field);
    }
    // The longest timeout allowed runs, and so does everything else.
    robot
        .send("month", task("exec", "sleep 1000").timeout("30d"))
        .await;
    robot.running("month").await;
    robot.still_works("after-durations").await;
}

#[tokio::test]
async fn working_directories_stay_inside_the_task_directory() {
    if !is_root() {
        return;
    }
    let mut robot = Robot::start("hostile-cwd", None, &[]).await;
    let mut cases = Vec::new();
    for (uid, dir) in [("abs", "/etc"), ("up", ".."), ("deep", "a/../../../etc")] {
        let mut spec = task("exec", "pwd");
        spec.working_dir = Some(dir.to_owned());
        robot.send(uid, spec).await;
        cases.push(uid);
    }
    for uid in cases {
        let last = robot.terminal(uid).await;
        assert_refused(&last, TaskReason::InvalidSpec, "workingDir");
    }
    let mut spec = task("exec", "pwd");
    spec.working_dir = Some(".".to_owned());
    robot.send("here", spec).await;
    let last = robot.terminal("here").await;
    let work = robot.work_dir("here").canonicalize().unwrap();
    assert_eq!(
        last.output_tail,
        Some(format!("{}\n", work.display())),
        "{last:#?}"
    );
    robot.still_works("after-cwd").await;
}

/// An HTTP server whose `/slow` sends half the body, then waits for `go`.
async fn slow_server(body: Vec<u8>, go: Arc<Notify>, requested: Arc<Notify>) -> String {
    let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    tokio::spawn(async move {
        loop {
            let Ok((mut socket, _)) = listener.accept().await else {
                return;
            };
            let body = body.clone();
            let go = Arc::clone(&go);
            let requested = Arc::clone(&requested);
            tokio::spawn(async move {
                let mut request = Vec::new();
                let mut buf = [0u8; 1024];
                while !request.windows(4).any(|w| w == b"\r\n\r\n") {
                    match socket.read(&mut buf).await {
                        Ok(0) | Err(_) => return,
                        Ok(n) => request.extend_from_slice(&buf[..n]),
                    }
                }
                let head = format!(
                    "HTTP/1.1 200 OK\r\ncontent-length: {}\r\nconnection: close\r\n\r\n",
                    body.len()
                );
                let half = body.len() / 2;
                let _ = socket.write_all(head.as_bytes()).await;
                let _ = socket.write_all(&body[..half]).await;
                let _ = socket.flush().await;
                requested.notify_one();
                go.notified().await;
                let _ = socket.write_all(&body[half..]).await;
                let _ = socket.shutdown().await;
            });
        }
    });
    format!("http://{addr}/slow")
}

fn sha256(data: &[u8]) -> String {
    Sha256::digest(data).iter().map(|b| format!("{b:02x}")).collect()
}

#[tokio::test]
async fn a_link_planted_during_an_artifact_download_is_never_followed() {
    if !is_root() {
        return;
    }
    let mut robot = Robot::start("hostile-artifact", None, &[]).await;
    let outside = tempfile::tempdir().unwrap();
    let victim = outside.path().join("shadow");
    std::fs::write(&victim, b"root:secret\n").unwrap();
    let victim_dir = outside.path().join("etc");
    std::fs::create_dir(&victim_dir).unwrap();

    let body = b"#!/bin/sh\necho payload\n".repeat(100);
    for (uid, destination, plant) in [
        // The attack on the old agent: root wrote `<dest>.partial` in the
        // task's own directory, through a link planted there.
        ("partial", "payload", "payload.partial"),
        // A link where the artifact itself goes: replaced, not followed.
        ("final", "payload", "payload"),
        // A link on the way down: refused.
        ("dir", "bin/payload", "bin"),
    ] {
        let (go, requested) = (Arc::new(Notify::new()), Arc::new(Notify::new()));
        let url = slow_server(body.clone(), Arc::clone(&go), Arc::clone(&requested)).await;
        let mut spec = task("exec", "./payload | head -1; ls -A");
        spec.artifacts.push(Artifact {
            url,
            destination: destination.to_owned(),
            sha256: sha256(&body),
        });
        robot.send(uid, spec).await;
        // Mid-download, something running as the task's user plants a link
        // in the task's directory (root plays it here).
        tokio::time::timeout(LONG, requested.notified())
            .await
            .expect("the download started");
        let target = if plant == "bin" { &victim_dir } else { &victim };
        std::os::unix::fs::symlink(target, robot.work_dir(uid).join(plant)).unwrap();
        go.notify_one();
        let last = robot.terminal(uid).await;
        assert_eq!(
            std::fs::read(&victim).unwrap(),
            b"root:secret\n",
            "{uid}: the victim was written"
        );
        assert_eq!(std::fs::read_dir(&victim_dir).unwrap().count(), 0, "{uid}");
        if plant == "bin" {
            assert_refused(&last, TaskReason::ArtifactFailed, "bin is a symbolic link");
        } else {
            assert_eq!(last.state, TaskState::Completed, "{uid}: {last:#?}");
            assert!(
                last.output_tail.as_deref().unwrap_or("").starts_with("payload\n"),
                "{last:#?}"
            );
        }
    }
    robot.still_works("after-artifacts").await;
}

#[tokio::test]
async fn root_users_groups_and_drivers_the_robot_does_not_allow_are_refused() {
    if !is_root() {
        return;
    }
    let tty = nix::unistd::Group::from_name("tty")
        .unwrap()
        .unwrap()
        .gid
        .as_raw();
    let mut robot = Robot::start(
        "hostile-policy",
        None,
        &[
            "--raw-exec",
            "false",
            "--allow-root",
            "false",
            "--allowed-group",
            "tty",
        ],
    )
    .await;
    let with = |user: Option<&str>, groups: &[&str]| {
        let mut spec = task("exec", "id -u; id -G");
        spec.user = user.map(Into::into);
        spec.groups = groups.iter().map(|g| (*g).to_owned()).collect();
        spec
    };
    robot.send("root", with(Some("root"), &[])).await;
    robot.send("nobody", with(Some("nobody"), &[])).await;
    robot.send("disk", with(None, &["disk"])).await;
    robot.send("raw", task("raw_exec", "id -u")).await;
    robot.send("allowed", with(None, &["tty"])).await;
    for (uid, needle) in [
        ("root", "allow_root = false"),
        ("nobody", "does not allow user \"nobody\""),
        ("disk", "group(s) disk"),
        ("raw", "raw_exec driver is off"),
    ] {
        let last = robot.terminal(uid).await;
        assert_refused(&last, TaskReason::NotPermitted, needle);
    }
    let last = robot.terminal("allowed").await;
    assert_eq!(last.state, TaskState::Completed, "{last:#?}");
    let out = last.output_tail.unwrap_or_default();
    let mut lines = out.lines();
    let uid: u32 = lines.next().unwrap().parse().unwrap();
    assert!((70_000..=79_999).contains(&uid), "a uid of its own: {out}");
    assert_eq!(
        lines.next(),
        Some(format!("{uid} {tty}").as_str()),
        "its group and tty: {out}"
    );
    robot.still_works("after-policy").await;
}

#[tokio::test]
async fn the_agents_environment_never_reaches_a_task() {
    let broker = Broker::start();
    let mut server = Server::connect(&broker, "hostile-env").await;
    let dir = tempfile::tempdir().unwrap();
    std::fs::set_permissions(dir.path(), std::fs::Permissions::from_mode(0o755)).unwrap();
    let agent = Agent::start_with_env(
        &broker,
        "hostile-env",
        &dir.path().join("state"),
        &[],
        &[
            ("K8S4R_PASSWORD", "hunter2-password"),
            ("K8S4R_TOKEN", "hunter2-token"),
        ],
    );
    server.approve("hostile-env").await;
    let mut robot = Robot {
        id: "hostile-env".to_owned(),
        server,
        agent,
        state: dir.path().join("state"),
        _dir: dir,
        statuses: HashMap::new(),
        heartbeats: Vec::new(),
        _broker: broker,
    };
    robot.send("raw-env", task("raw_exec", "env")).await;
    robot
        .send(
            "exec-env",
            task("exec", "env; cat /proc/$PPID/environ 2>&1 | tr '\\0' '\\n'"),
        )
        .await;
    for uid in ["raw-env", "exec-env"] {
        let last = robot.terminal(uid).await;
        let out = last.output_tail.unwrap_or_default();
        assert!(!out.contains("hunter2"), "{uid} sees the agent's secrets:\n{out}");
        assert!(out.contains(&format!("K8S4R_TASK_UID={uid}")), "{uid}:\n{out}");
    }
}

#[tokio::test]
async fn two_thousand_tasks_at_once_each_get_a_clear_status() {
    let mut robot = Robot::start("hostile-many", None, &["--max-tasks", "50"]).await;
    const N: usize = 2000;
    for i in 0..N {
        robot.send(&format!("many-{i}"), task("exec", "sleep 0.2")).await;
    }
    robot
        .pump_until("2,000 final statuses", |r| {
            (0..N).all(|i| r.is_over(&format!("many-{i}")))
        })
        .await;
    let mut counts: HashMap<Option<TaskReason>, usize> = HashMap::new();
    for i in 0..N {
        let last = robot.last(&format!("many-{i}")).unwrap();
        *counts.entry(last.reason).or_default() += 1;
        if last.reason == Some(TaskReason::OverCapacity) {
            assert_eq!(
                last.message.as_deref(),
                Some("this robot already holds its maximum of 50 tasks (max_tasks)")
            );
        }
    }
    let completed = counts.get(&Some(TaskReason::Completed)).copied().unwrap_or(0);
    let refused = counts.get(&Some(TaskReason::OverCapacity)).copied().unwrap_or(0);
    assert_eq!(completed + refused, N, "{counts:?}");
    assert!(completed >= 50, "at least the first 50 ran: {counts:?}");
    robot.still_works("after-many").await;
}

/// Processes that leave the task's group: a child with a session of its
/// own, a double fork whose orphan comes to the agent, and (exec only,
/// found by its uid) one that also clears its environment. Each ignores
/// SIGTERM and writes its pid to `pids`.
const ESCAPE: &str = r#"
setsid sh -c 'echo $$ >> pids; trap "" TERM HUP; while :; do sleep 1; done' &
sh -c 'setsid sh -c "echo \$\$ >> pids; trap \"\" TERM HUP; while :; do sleep 1; done" & exit 0'
sh -c 'setsid env -i /bin/sh -c "echo \$\$ >> pids; trap \"\" TERM HUP; while :; do /bin/sleep 1; done" & exit 0'
sleep 1000
"#;

#[tokio::test]
async fn a_task_that_setsids_and_forks_is_killed_whole_without_cgroups() {
    if !is_root() {
        return;
    }
    let not_a_cgroup = tempfile::tempdir().unwrap();
    let cgroup_root = not_a_cgroup.path().display().to_string();
    let mut robot = Robot::start("hostile-escape", None, &["--cgroup-root", &cgroup_root]).await;
    assert!(
        robot.agent.log().contains("no task cgroups"),
        "{}",
        robot.agent.log()
    );
    robot
        .send("escape", task("exec", ESCAPE).timeout("1s").kill_timeout("300ms"))
        .await;
    robot.running("escape").await;
    let pids_file = robot.work_dir("escape").join("pids");
    let pids = eventually("three escapees", LONG, || {
        let pids: Vec<i32> = std::fs::read_to_string(&pids_file)
            .unwrap_or_default()
            .lines()
            .filter_map(|l| l.trim().parse().ok())
            .collect();
        (pids.len() == 3).then_some(pids)
    })
    .await;
    let last = robot.terminal("escape").await;
    assert_eq!(last.reason, Some(TaskReason::Timeout), "{last:#?}");
    for pid in pids {
        // Killed and reaped: not even a zombie is left.
        eventually(&format!("escapee {pid} gone"), LONG, || {
            (!Path::new(&format!("/proc/{pid}")).exists()).then_some(())
        })
        .await;
    }
    robot.still_works("after-escape").await;
}

/// A small file system of its own, unmounted on drop.
struct Mount {
    dir: tempfile::TempDir,
    image: Option<PathBuf>,
}

impl Mount {
    fn tmpfs(size: &str) -> Option<Mount> {
        let dir = tempfile::tempdir().unwrap();
        let ok = Command::new("mount")
            .args(["-t", "tmpfs", "-o", &format!("size={size},mode=0755"), "tmpfs"])
            .arg(dir.path())
            .status()
            .is_ok_and(|s| s.success());
        ok.then_some(Mount { dir, image: None })
    }

    fn ext4(size_mib: u32) -> Option<Mount> {
        let dir = tempfile::tempdir().unwrap();
        let image = dir.path().with_extension("img");
        let run = |cmd: &mut Command| cmd.status().is_ok_and(|s| s.success());
        let ok = run(Command::new("truncate")
            .arg("-s")
            .arg(format!("{size_mib}M"))
            .arg(&image))
            && run(Command::new("mkfs.ext4").args(["-q", "-F"]).arg(&image))
            && run(Command::new("mount")
                .args(["-o", "loop"])
                .arg(&image)
                .arg(dir.path()));
        if !ok {
            let _ = std::fs::remove_file(&image);
            return None;
        }
        std::fs::set_permissions(dir.path(), std::fs::Permissions::from_mode(0o755)).unwrap();
        Some(Mount {
            dir,
            image: Some(image),
        })
    }

    fn path(&self) -> &Path {
        self.dir.path()
    }
}

impl Drop for Mount {
    fn drop(&mut self) {
        let _ = Command::new("fsfreeze").arg("-u").arg(self.dir.path()).status();
        let _ = Command::new("umount").arg("-l").arg(self.dir.path()).status();
        if let Some(image) = &self.image {
            let _ = std::fs::remove_file(image);
        }
    }
}

#[tokio::test]
async fn a_full_disk_fails_only_the_task_that_filled_it() {
    if !is_root() {
        return;
    }
    let Some(mount) = Mount::tmpfs("48m") else {
        eprintln!("skipped: cannot mount a tmpfs");
        return;
    };
    let state = mount.path().join("state");
    let mut robot = Robot::start(
        "hostile-disk",
        Some(&state),
        &["--disk-budget", "100%", "--disk-reserve", "4Mi"],
    )
    .await;
    // The reserve is taken as soon as the agent looked at its disk.
    eventually("the reserve", LONG, || {
        std::fs::metadata(state.join("reserve"))
            .is_ok_and(|m| m.len() >= 4 << 20)
            .then_some(())
    })
    .await;
    robot
        .send("bystander", task("exec", "sleep 3; echo still here"))
        .await;
    robot.running("bystander").await;
    // Writes until the disk is full, then keeps running: the agent must
    // stop it, and only it.
    robot
        .send(
            "filler",
            task("exec", "cat /dev/zero > big; echo full; sleep 1000"),
        )
        .await;
    let last = robot.terminal("filler").await;
    assert_refused(&last, TaskReason::DiskLimit, "disk is full");
    assert_eq!(last.exit_code, Some(137), "{last:#?}");
    let bystander = robot.terminal("bystander").await;
    assert_eq!(
        (bystander.state, bystander.output_tail.as_deref()),
        (TaskState::Completed, Some("still here\n")),
        "{bystander:#?}"
    );
    // Space comes back (the filler's files went): the robot takes its
    // reserve back and tasks again. Until it has measured, a dispatch is
    // refused, saying the disk is full; so ask until one runs.
    eventually("the reserve back", LONG, || {
        std::fs::metadata(state.join("reserve"))
            .is_ok_and(|m| m.len() >= 4 << 20)
            .then_some(())
    })
    .await;
    let deadline = Instant::now() + LONG;
    for i in 0.. {
        let uid = format!("after-full-{i}");
        robot.send(&uid, task("exec", "echo alive")).await;
        let last = robot.terminal(&uid).await;
        if last.state == TaskState::Completed {
            break;
        }
        assert_refused(&last, TaskReason::OverCapacity, "disk is full");
        assert!(Instant::now() < deadline, "the robot never took a task again");
    }
    robot.still_works("after-full").await;
}

#[tokio::test]
async fn a_stalled_disk_delays_no_deadline() {
    if !is_root() {
        return;
    }
    let Some(mount) = Mount::ext4(64) else {
        eprintln!("skipped: cannot mount a loop device");
        return;
    };
    let state = mount.path().join("state");
    let mut robot = Robot::start("hostile-stall", Some(&state), &[]).await;
    // Dropped before the robot: an agent blocked on a frozen disk cannot
    // even be killed.
    let _thaw = Thaw(mount.path().to_path_buf());
    let pid_file = tempfile::NamedTempFile::new().unwrap();
    let script = format!(
        "echo $$ > {}; while :; do echo lots of output lots of output lots of output; done",
        pid_file.path().display()
    );
    robot
        .send("chatty", task("raw_exec", &script).timeout("2s"))
        .await;
    // Its pid, not its running report (held a second by the agent, while
    // the task fills the small disk), says it runs.
    let pid: i32 = eventually("the task's pid", LONG, || {
        std::fs::read_to_string(pid_file.path()).ok()?.trim().parse().ok()
    })
    .await;
    // The SD card stops answering: every write to the state dir blocks.
    let frozen = Instant::now();
    assert!(Command::new("fsfreeze")
        .arg("-f")
        .arg(mount.path())
        .status()
        .unwrap()
        .success());
    // The deadline is kept anyway: the process is gone about 2s after it
    // started, not whenever the disk comes back.
    eventually("the task killed at its deadline", Duration::from_secs(10), || {
        let stat = std::fs::read_to_string(format!("/proc/{pid}/stat")).ok();
        let dead = stat.is_none_or(|s| {
            s.rsplit(')')
                .next()
                .is_some_and(|r| r.trim_start().starts_with('Z'))
        });
        dead.then_some(())
    })
    .await;
    let killed_after = frozen.elapsed();
    assert!(killed_after < Duration::from_secs(5), "{killed_after:?}");
    assert!(Command::new("fsfreeze")
        .arg("-u")
        .arg(mount.path())
        .status()
        .unwrap()
        .success());
    let last = robot.terminal("chatty").await;
    assert_eq!(
        (last.reason, last.exit_code),
        (Some(TaskReason::Timeout), Some(143)),
        "{last:#?}"
    );
    let ran = last.finish_time.unwrap().duration_since(last.start_time.unwrap());
    assert!(ran < jiff::SignedDuration::from_secs(5), "{ran:?}");
    robot.still_works("after-stall").await;
}

/// Thaws a file system when dropped.
struct Thaw(PathBuf);

impl Drop for Thaw {
    fn drop(&mut self) {
        let _ = Command::new("fsfreeze").arg("-u").arg(&self.0).status();
    }
}
