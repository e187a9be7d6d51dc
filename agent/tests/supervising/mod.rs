//! What the tests of the supervisor against real processes share: task
//! builders, a harness around a real supervisor, and waits that poll a
//! condition with a deadline.
#![allow(dead_code)]

use std::os::unix::fs::PermissionsExt;
use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

use k8s4r_agent::supervisor::{
    self, DiskSize, Policy, Submit, SupervisorConfig, SupervisorHandle, TaskEvent, TaskOutcome, TaskRequest,
};
use k8s4r_api::{Artifact, DurationString, TaskTemplate};
use tokio::sync::mpsc::UnboundedReceiver;

/// How long any condition may take before a test fails.
pub const PATIENCE: Duration = Duration::from_secs(30);

// ---------------------------------------------------------------- builders

pub fn task(command: &str, args: &[&str]) -> TaskTemplate {
    TaskTemplate {
        driver: "raw_exec".to_owned(),
        command: command.to_owned(),
        args: args.iter().map(|a| (*a).to_owned()).collect(),
        ..TaskTemplate::default()
    }
}

pub fn sh(script: &str) -> TaskTemplate {
    task("/bin/sh", &["-c", script])
}

pub trait TemplateExt {
    fn with_timeout(self, t: &str) -> Self;
    fn with_kill_timeout(self, t: &str) -> Self;
    fn with_driver(self, d: &str) -> Self;
    fn with_user(self, u: &str) -> Self;
    fn with_cwd(self, d: &str) -> Self;
    fn with_artifact(self, url: String, destination: &str, sha256: String) -> Self;
}

impl TemplateExt for TaskTemplate {
    fn with_timeout(mut self, t: &str) -> Self {
        self.timeout = Some(DurationString::from(t));
        self
    }
    fn with_kill_timeout(mut self, t: &str) -> Self {
        self.kill_timeout = Some(DurationString::from(t));
        self
    }
    fn with_driver(mut self, d: &str) -> Self {
        self.driver = d.to_owned();
        self
    }
    fn with_user(mut self, u: &str) -> Self {
        self.user = Some(u.to_owned());
        self
    }
    fn with_cwd(mut self, d: &str) -> Self {
        self.working_dir = Some(d.to_owned());
        self
    }
    fn with_artifact(mut self, url: String, destination: &str, sha256: String) -> Self {
        self.artifacts.push(Artifact {
            url,
            destination: destination.to_owned(),
            sha256,
        });
        self
    }
}

// ----------------------------------------------------------------- harness

/// The request for `attempt` of Task `uid` (named after it), unfenced.
pub fn request(uid: &str, attempt: u32, spec: TaskTemplate) -> TaskRequest {
    TaskRequest {
        uid: uid.to_owned(),
        attempt,
        name: uid.to_owned(),
        spec,
        stop_after: None,
        config: None,
    }
}

pub struct Harness {
    pub dir: tempfile::TempDir,
    pub handle: SupervisorHandle,
    pub events: UnboundedReceiver<TaskEvent>,
    pub seen: Vec<TaskEvent>,
}

pub fn state_dir() -> tempfile::TempDir {
    let dir = tempfile::tempdir().unwrap();
    std::fs::set_permissions(dir.path(), std::fs::Permissions::from_mode(0o755)).unwrap();
    dir
}

/// raw_exec on (as root, where these tests run): most tests here use it to
/// run shell scripts; the exec tests below lock it down again.
pub fn config(dir: &Path) -> SupervisorConfig {
    SupervisorConfig {
        state_dir: dir.to_path_buf(),
        artifact_timeout: Duration::from_secs(5),
        policy: Policy {
            raw_exec: true,
            allow_root: true,
            ..SupervisorConfig::default().policy
        },
        disk_reserve: Some(DiskSize::Bytes(1 << 20)),
        // As the agent's binary runs them: each under its shim, its output
        // written by its logger.
        shim_program: Some(PathBuf::from(env!("CARGO_BIN_EXE_k8s4r-agent"))),
        ..SupervisorConfig::default()
    }
}

impl Harness {
    pub fn new() -> Self {
        Self::with_config(|_| {})
    }

    pub fn with_config(adjust: impl FnOnce(&mut SupervisorConfig)) -> Self {
        let dir = state_dir();
        let mut config = config(dir.path());
        adjust(&mut config);
        let (handle, events) = supervisor::spawn(config).unwrap();
        Harness {
            dir,
            handle,
            events,
            seen: Vec::new(),
        }
    }

    pub async fn submit(&self, uid: &str, spec: TaskTemplate) {
        self.submit_attempt(uid, 1, spec).await;
    }

    /// Submits `attempt` of `uid`, which must be accepted.
    pub async fn submit_attempt(&self, uid: &str, attempt: u32, spec: TaskTemplate) {
        let req = request(uid, attempt, spec);
        assert_eq!(self.handle.submit(req).await.unwrap(), Submit::Accepted);
    }

    /// Waits for the end of `attempt` of `uid`.
    pub async fn finished_attempt(&mut self, uid: &str, attempt: u32) -> TaskOutcome {
        self.wait_for(&format!("{uid} attempt {attempt} finished"), |e| match e {
            TaskEvent::Finished {
                uid: u,
                attempt: a,
                outcome,
            } if u == uid && *a == attempt => Some(outcome.clone()),
            _ => None,
        })
        .await
    }

    /// Waits for the first event that `pick` accepts (events already seen
    /// included).
    pub async fn wait_for<T>(&mut self, what: &str, mut pick: impl FnMut(&TaskEvent) -> Option<T>) -> T {
        if let Some(found) = self.seen.iter().find_map(&mut pick) {
            return found;
        }
        let deadline = tokio::time::Instant::now() + PATIENCE;
        loop {
            let event = tokio::time::timeout_at(deadline, self.events.recv())
                .await
                .unwrap_or_else(|_| panic!("timed out waiting for {what}; seen: {:#?}", self.seen))
                .expect("event channel closed");
            let found = pick(&event);
            self.seen.push(event);
            if let Some(found) = found {
                return found;
            }
        }
    }

    pub async fn started(&mut self, uid: &str) -> u32 {
        self.wait_for(&format!("{uid} started"), |e| match e {
            TaskEvent::Started { uid: u, pid, .. } if u == uid => Some(*pid),
            _ => None,
        })
        .await
    }

    pub async fn finished(&mut self, uid: &str) -> TaskOutcome {
        self.wait_for(&format!("{uid} finished"), |e| match e {
            TaskEvent::Finished { uid: u, outcome, .. } if u == uid => Some(outcome.clone()),
            _ => None,
        })
        .await
    }

    pub async fn run(&mut self, uid: &str, spec: TaskTemplate) -> TaskOutcome {
        self.submit(uid, spec).await;
        self.finished(uid).await
    }

    pub fn log(&self, uid: &str, file: &str) -> String {
        std::fs::read_to_string(self.dir.path().join(format!("tasks/{uid}-1/logs/{file}")))
            .unwrap_or_default()
    }
}

impl Drop for Harness {
    /// Every test ends with a clean shutdown: no task, process or cgroup
    /// outlives it.
    fn drop(&mut self) {
        let handle = self.handle.clone();
        tokio::task::block_in_place(|| tokio::runtime::Handle::current().block_on(handle.shutdown()));
    }
}

/// Processes (zombies included) whose process group is `pgid`.
pub fn group_members(pgid: u32, include_zombies: bool) -> Vec<i32> {
    let mut found = Vec::new();
    for entry in std::fs::read_dir("/proc").unwrap().flatten() {
        let Some(pid) = entry.file_name().to_str().and_then(|s| s.parse::<i32>().ok()) else {
            continue;
        };
        let Ok(stat) = std::fs::read_to_string(format!("/proc/{pid}/stat")) else {
            continue;
        };
        let Some(close) = stat.rfind(')') else { continue };
        let fields: Vec<&str> = stat[close + 1..].split_whitespace().collect();
        let zombie = fields[0] == "Z" || fields[0] == "X";
        if fields[2].parse::<u32>() == Ok(pgid) && (include_zombies || !zombie) {
            found.push(pid);
        }
    }
    found
}

pub async fn poll_until(what: &str, mut condition: impl FnMut() -> bool) {
    let deadline = Instant::now() + PATIENCE;
    while !condition() {
        assert!(Instant::now() < deadline, "timed out waiting until {what}");
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
}

pub fn elapsed(outcome: &TaskOutcome) -> Duration {
    let started = outcome.started_at.expect("started");
    let d = outcome.finished_at.duration_since(started);
    Duration::try_from(d).unwrap()
}
