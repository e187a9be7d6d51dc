//! What the end-to-end tests share: the whole stack (embedded API server,
//! server, manager) in the test's process, a real Mosquitto, and real
//! agent processes, each with its own state dir and labels.
#![allow(dead_code)]

use std::future::Future;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::Duration;

use k8s4r::up::{manager_config, Stack, UpArgs};
use k8s4r_api::names::LABEL_JOB;
use k8s4r_api::{Job, Robot, RobotPhase, Task, TaskState, WorkState};
use kube::api::{ListParams, PostParams};
use kube::Api;
use tokio_util::sync::CancellationToken;

// Not every test uses each of them.
#[allow(unused_imports)]
pub use k8s4r_testbed::{free_port, kubectl, Mosquitto};

/// How long any condition may take before a test fails.
pub const DEADLINE: Duration = Duration::from_secs(60);

/// Polls `check` until it returns Some, or panics with `what` at the deadline.
pub async fn eventually<T, F, Fut>(what: &str, check: F) -> T
where
    F: FnMut() -> Fut,
    Fut: Future<Output = Option<T>>,
{
    k8s4r_testbed::eventually(DEADLINE, what, check).await
}

/// A child process killed (and reaped) on drop.
pub struct Proc(pub Child);

impl Drop for Proc {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

impl Drop for Env {
    fn drop(&mut self) {
        self.agents.clear();
        k8s4r_testbed::process::kill_tasks_under(self.dir.path());
    }
}

/// The stack, Mosquitto and the agents of one test.
pub struct Env {
    pub stack: Option<Stack>,
    pub client: kube::Client,
    pub agents: Vec<(String, Proc)>,
    pub data_dir: PathBuf,
    /// Where tasks leave their pid files and counters.
    pub scratch: PathBuf,
    pub broker_url: String,
    pub _mosquitto: Mosquitto,
    pub dir: tempfile::TempDir,
}

impl Env {
    /// Starts everything, with one agent per `(robot, labels)`, and waits
    /// until every robot is Online.
    pub async fn start(robots: &[(&str, &[&str])]) -> Env {
        Self::start_with(robots, true, k8s4r_api::protocol::reach::DEFAULT_SESSION_LEASE).await
    }

    /// Like [`Env::start`] with no robots, the object store listening on
    /// `listen` and robots told to reach it at `url` (a proxy before it).
    pub async fn start_with_store(listen: std::net::SocketAddr, url: String) -> Env {
        let listen = listen.to_string();
        Self::start_with_up_flags(&["--store-listen", &listen, "--store-url", &url]).await
    }

    /// Like [`Env::start`] with no robots, and these flags of `up` too.
    pub async fn start_with_up_flags(flags: &[&str]) -> Env {
        let flags = flags.iter().map(|f| f.to_string()).collect();
        Self::start_with_options(
            &[],
            true,
            k8s4r_api::protocol::reach::DEFAULT_SESSION_LEASE,
            flags,
        )
        .await
    }

    /// Like [`Env::start`], with exec and port-forward sessions ending
    /// after `lease` of silence (the default is 30 s).
    pub async fn start_with_session_lease(robots: &[(&str, &[&str])], lease: Duration) -> Env {
        Self::start_with(robots, true, lease).await
    }

    /// Like [`Env::start`], with the API server's objects kept in the data
    /// directory, as `k8s4r up` keeps them, so that [`Env::restart_cluster`]
    /// finds them again.
    pub async fn start_persistent(robots: &[(&str, &[&str])]) -> Env {
        Self::start_with(robots, false, k8s4r_api::protocol::reach::DEFAULT_SESSION_LEASE).await
    }

    async fn start_with(robots: &[(&str, &[&str])], in_memory: bool, session_lease: Duration) -> Env {
        Self::start_with_options(robots, in_memory, session_lease, Vec::new()).await
    }

    async fn start_with_options(
        robots: &[(&str, &[&str])],
        in_memory: bool,
        session_lease: Duration,
        up_flags: Vec<String>,
    ) -> Env {
        // RUST_LOG=k8s4r_manager=debug,k8s4r_server=debug shows, for a failed
        // test, what the stack did.
        let _ = tracing_subscriber::fmt()
            .with_env_filter(tracing_subscriber::EnvFilter::from_default_env())
            .with_test_writer()
            .try_init();
        let dir = tempfile::tempdir().expect("temp dir");
        let mosq = Mosquitto::start();
        let broker_url = mosq.url();
        let data_dir = dir.path().join("data");
        let scratch = dir.path().join("scratch");
        std::fs::create_dir_all(&scratch).expect("scratch dir");
        let stack = start_stack(&broker_url, &data_dir, in_memory, session_lease, &up_flags).await;
        let client = stack.client.clone();
        let mut env = Env {
            stack: Some(stack),
            client,
            agents: Vec::new(),
            data_dir,
            scratch,
            broker_url,
            _mosquitto: mosq,
            dir,
        };
        for (robot, labels) in robots {
            env.spawn_agent(robot, labels);
        }
        for (robot, _) in robots {
            env.wait_phase(robot, RobotPhase::Online).await;
        }
        env
    }

    /// Stops the server, the manager and the API server, replaces the
    /// broker by a fresh one (as `k8s4r up` starts its embedded broker
    /// anew, with nothing retained), and starts the cluster side again on
    /// the same data directory (see [`Env::start_persistent`]). Agents
    /// still running keep their old broker address: stop them first.
    pub async fn restart_cluster(&mut self) {
        if let Some(stack) = self.stack.take() {
            let _ = stack.stop().await;
        }
        let mosq = Mosquitto::start();
        self.broker_url = mosq.url();
        self._mosquitto = mosq;
        let stack = start_stack(
            &self.broker_url,
            &self.data_dir,
            false,
            k8s4r_api::protocol::reach::DEFAULT_SESSION_LEASE,
            &[],
        )
        .await;
        self.client = stack.client.clone();
        self.stack = Some(stack);
    }

    pub fn spawn_agent(&mut self, robot: &str, labels: &[&str]) {
        self.spawn_agent_with(robot, labels, &[]);
    }

    /// An agent with further flags.
    pub fn spawn_agent_with(&mut self, robot: &str, labels: &[&str], extra: &[&str]) {
        let broker_url = self.broker_url.clone();
        self.spawn_agent_via(robot, labels, extra, &broker_url);
    }

    /// An agent with further flags that reaches the broker at
    /// `broker_url` (a proxy in front of it).
    pub fn spawn_agent_via(&mut self, robot: &str, labels: &[&str], extra: &[&str], broker_url: &str) {
        let token = std::fs::read_to_string(self.data_dir.join("bootstrap-token")).expect("bootstrap token");
        let state_dir = self.dir.path().join("agents").join(robot);
        std::fs::create_dir_all(&state_dir).expect("state dir");
        let log = std::fs::File::create(self.dir.path().join(format!("{robot}.log"))).expect("agent log");
        let mut cmd = Command::new(env!("CARGO_BIN_EXE_e2e-agent"));
        cmd.arg("--robot-id")
            .arg(robot)
            .arg("--token")
            .arg(token.trim())
            .arg("--broker-url")
            .arg(broker_url)
            .arg("--state-dir")
            .arg(&state_dir)
            .arg("--heartbeat-interval")
            .arg("1s");
        // The scenarios' tasks are raw_exec shell scripts, unless the test
        // says otherwise.
        if !extra.contains(&"--raw-exec") {
            cmd.args(["--raw-exec", "true", "--allow-root", "true"]);
        }
        for label in labels {
            cmd.arg("--label").arg(label);
        }
        cmd.args(extra);
        let child = cmd
            .stdout(Stdio::null())
            .stderr(log)
            .spawn()
            .expect("the agent starts");
        self.agents.push((robot.to_owned(), Proc(child)));
    }

    /// The running agent of `robot`, no longer kept with the others.
    fn take_agent(&mut self, robot: &str) -> Proc {
        let i = self
            .agents
            .iter()
            .position(|(r, _)| r == robot)
            .expect("that agent runs");
        self.agents.remove(i).1
    }

    /// SIGKILLs the agent of `robot` (its tasks' processes are left alone).
    pub fn kill_agent(&mut self, robot: &str) {
        let mut proc = self.take_agent(robot);
        proc.0.kill().expect("SIGKILL the agent");
        proc.0.wait().expect("reap the agent");
    }

    /// SIGTERMs the agent of `robot`, as `systemctl stop` or a restart
    /// does, and waits for it to exit (it leaves its running tasks
    /// running).
    pub fn stop_agent(&mut self, robot: &str) {
        let mut proc = self.take_agent(robot);
        let pid = nix::unistd::Pid::from_raw(i32::try_from(proc.0.id()).expect("a pid"));
        nix::sys::signal::kill(pid, nix::sys::signal::Signal::SIGTERM).expect("SIGTERM the agent");
        proc.0.wait().expect("reap the agent");
    }

    /// Runs `--stop-left-tasks` for `robot`'s state, as the unit's
    /// `ExecStopPost` does when systemd stops the unit for good.
    pub fn stop_left_tasks(&self, robot: &str) {
        let out = Command::new(env!("CARGO_BIN_EXE_e2e-agent"))
            .args(["--robot-id", robot, "--broker-url", &self.broker_url])
            .arg("--state-dir")
            .arg(self.dir.path().join("agents").join(robot))
            .arg("--stop-left-tasks")
            .output()
            .expect("run --stop-left-tasks");
        assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
    }

    pub async fn wait_phase(&self, robot: &str, phase: RobotPhase) {
        let robots: Api<Robot> = Api::all(self.client.clone());
        eventually(&format!("robot {robot} {phase:?}"), || {
            let robots = robots.clone();
            async move {
                let r = robots.get_opt(robot).await.ok()??;
                (r.status?.phase? == phase).then_some(())
            }
        })
        .await;
    }

    pub fn jobs(&self) -> Api<Job> {
        Api::namespaced(self.client.clone(), "default")
    }

    pub fn tasks(&self) -> Api<Task> {
        Api::namespaced(self.client.clone(), "default")
    }

    pub async fn create_job(&self, job: serde_json::Value) -> Job {
        let job: Job = serde_json::from_value(job).expect("a valid Job");
        self.jobs()
            .create(&PostParams::default(), &job)
            .await
            .expect("create the Job")
    }

    pub async fn job_tasks(&self, job: &str) -> Vec<Task> {
        self.tasks()
            .list(&ListParams::default().labels(&format!("{LABEL_JOB}={job}")))
            .await
            .map(|l| l.items)
            .unwrap_or_default()
    }

    /// Waits until the Job is completed or failed and has `n` tasks, all of
    /// them in a final state. (A Task may show `failed` for a moment before
    /// a retry; the Job's aggregate state counts it as still going.)
    pub async fn wait_tasks_final(&self, job: &str, n: usize) -> Vec<Task> {
        eventually(&format!("{n} final tasks of {job}"), || async {
            let state = self.jobs().get(job).await.ok()?.status?.state?;
            if !matches!(state, WorkState::Completed | WorkState::Failed) {
                return None;
            }
            let tasks = self.job_tasks(job).await;
            let done = tasks.len() == n
                && tasks.iter().all(|t| {
                    matches!(
                        t.status.as_ref().and_then(|s| s.state),
                        Some(TaskState::Completed | TaskState::Failed)
                    )
                });
            done.then_some(tasks)
        })
        .await
    }

    /// Stops everything, and fails the test if the server or the manager
    /// needed a permission deploy/cluster's RBAC does not grant them.
    pub async fn stop(mut self) {
        self.agents.clear();
        if let Some(stack) = self.stack.take() {
            let record = stack.authenticator();
            let _ = stack.stop().await;
            // Only the programs' own accounts: a test's person may be refused.
            let denied: Vec<String> = record
                .denied()
                .into_iter()
                .filter(|d| d.contains("system:serviceaccount:"))
                .collect();
            assert!(
                denied.is_empty(),
                "deploy/cluster's RBAC denied the server or the manager:\n{}",
                denied.join("\n")
            );
        }
    }
}

/// The stack of a test on `broker_url`, with short liveness timeouts.
async fn start_stack(
    broker_url: &str,
    data_dir: &Path,
    in_memory: bool,
    session_lease: Duration,
    up_flags: &[String],
) -> Stack {
    let api = format!("127.0.0.1:{}", free_port());
    let lease = format!("{}ms", session_lease.as_millis());
    let mut flags = vec![
        // A free port for the store, unless the test names one (a later
        // flag wins).
        "--store-listen",
        "127.0.0.1:0",
        "--api-bind",
        &api,
        "--mqtt-bind",
        "127.0.0.1:0",
        "--broker-url",
        broker_url,
        "--local-agent",
        "false",
        "--no-dashboard",
        "--session-lease",
        &lease,
    ];
    if in_memory {
        flags.push("--in-memory");
    }
    flags.extend(up_flags.iter().map(String::as_str));
    let args = UpArgs::from_flags(&flags).expect("the flags of up");
    let mut manager = manager_config();
    // A SIGKILLed agent's connection drops, so Mosquitto publishes its
    // last will at once: the disconnect grace is what makes it Offline.
    // (Heartbeats reach the manager through the server's coalesced lease
    // renewals, so the heartbeat timeout keeps its default.)
    manager.liveness.disconnect_grace = Duration::from_secs(1);
    manager.lifecycle.robot_lost_grace = Duration::from_secs(1);
    Stack::start_with(&args, data_dir, CancellationToken::new(), manager)
        .await
        .expect("the stack starts")
}

pub fn job_json(name: &str, groups: serde_json::Value) -> serde_json::Value {
    serde_json::json!({
        "apiVersion": "robot.k8s4r.io/v1alpha1",
        "kind": "Job",
        "metadata": { "name": name, "namespace": "default" },
        "spec": { "taskGroups": groups },
    })
}

pub fn sh(script: &str, timeout: &str) -> serde_json::Value {
    serde_json::json!({
        "driver": "raw_exec",
        "command": "/bin/sh",
        "args": ["-c", script],
        "timeout": timeout,
        "killTimeout": "1s",
    })
}

/// The process group of `pid`, from /proc, if the process lives.
pub fn pgrp(pid: i32) -> Option<i32> {
    let stat = std::fs::read_to_string(format!("/proc/{pid}/stat")).ok()?;
    // pid (comm) state ppid pgrp ...; comm may hold spaces: split after ')'.
    let rest = &stat[stat.rfind(')')? + 2..];
    let fields: Vec<&str> = rest.split_whitespace().collect();
    if fields.first() == Some(&"Z") {
        return None;
    }
    fields.get(2)?.parse().ok()
}

/// Live (not zombie) processes whose process group is `group`.
pub fn group_members(group: i32) -> Vec<i32> {
    let Ok(entries) = std::fs::read_dir("/proc") else {
        return Vec::new();
    };
    entries
        .filter_map(|e| e.ok()?.file_name().to_str()?.parse::<i32>().ok())
        .filter(|pid| pgrp(*pid) == Some(group))
        .collect()
}

pub async fn read_pid(path: &Path) -> i32 {
    eventually(&format!("pid file {}", path.display()), || async {
        std::fs::read_to_string(path).ok()?.trim().parse::<i32>().ok()
    })
    .await
}

/// The sha256 of a file, as `sha256sum` prints it.
pub fn sha256(path: &Path) -> String {
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
