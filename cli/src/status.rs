//! `k8s4r status` (the cluster on one screen) and `k8s4r version`.

use std::collections::BTreeMap;
use std::path::Path;
use std::time::Duration;

use anyhow::Context as _;
use clap::Args as ClapArgs;
use k8s4r_api::{Job, Robot, RobotPhase, Task, TaskState, WorkState};
use kube::api::ListParams;
use kube::{Api, Client, ResourceExt};

use crate::operate::KubeArgs;

/// How long `status` and `version` wait for the API server.
const API_TIMEOUT: Duration = Duration::from_secs(10);
/// Reasons for waiting shown, the most common first.
const TOP_REASONS: usize = 5;
/// Offline robots named, the longest silent first.
const OFFLINE_LISTED: usize = 10;

/// `k8s4r status`.
#[derive(Debug, Clone, ClapArgs)]
pub struct StatusArgs {
    /// Jobs and tasks of this namespace only (default: every namespace).
    #[command(flatten)]
    pub kube: KubeArgs,
}

/// `k8s4r version`.
#[derive(Debug, Clone, ClapArgs)]
pub struct VersionArgs {
    /// Only the client's version; do not ask the cluster.
    #[arg(long)]
    pub client: bool,
    #[command(flatten)]
    pub kube: KubeArgs,
}

/// What `status` prints, counted from the lists.
#[derive(Debug, Default, PartialEq, Eq)]
pub struct Summary {
    /// Robots per phase (no phase yet: "Pending").
    pub robots: BTreeMap<String, usize>,
    /// Cordoned robots.
    pub cordoned: usize,
    /// Jobs per state.
    pub jobs: BTreeMap<String, usize>,
    /// Tasks per state.
    pub tasks: BTreeMap<String, usize>,
    /// Why waiting tasks wait, with how many, the most common first.
    pub waiting: Vec<(usize, String)>,
    /// Offline robots, the longest silent first (at most
    /// [`OFFLINE_LISTED`]): how long, and what they last reported.
    pub offline: Vec<String>,
    /// Offline robots not listed.
    pub offline_more: usize,
}

/// One Offline robot, as `status` names it: how long it has been silent
/// and what it last reported, said to be stale.
pub fn offline_line(robot: &Robot, now: jiff::Timestamp) -> String {
    let status = robot.status.clone().unwrap_or_default();
    let silent = match status.last_heartbeat_time {
        Some(t) => {
            let secs = now.duration_since(t).as_secs().max(0) as u64;
            format!(
                "silent for {}",
                k8s4r_api::duration::format_duration(Duration::from_secs(secs))
            )
        }
        None => "never heard from".to_owned(),
    };
    let mut stale = Vec::new();
    if let Some(facts) = k8s4r_api::facts::shown(robot.labels(), &status.facts, false) {
        stale.push(format!("facts {facts}"));
    }
    if let Some(u) = &status.usage {
        stale.push(format!("usage {:.0}% cpu", u.cpu_percent));
    }
    let name = robot.metadata.name.as_deref().unwrap_or_default();
    if stale.is_empty() {
        return format!("{name}  {silent}");
    }
    format!("{name}  {silent}; as of then (stale): {}", stale.join(", "))
}

impl Summary {
    /// Counts `robots`, `jobs` and `tasks`.
    pub fn of(robots: &[Robot], jobs: &[Job], tasks: &[Task]) -> Summary {
        let mut s = Summary::default();
        for r in robots {
            let phase = r
                .status
                .as_ref()
                .and_then(|st| st.phase)
                .unwrap_or(RobotPhase::Pending);
            *s.robots.entry(format!("{phase:?}")).or_default() += 1;
            if r.spec.unschedulable {
                s.cordoned += 1;
            }
        }
        for j in jobs {
            let state = j
                .status
                .as_ref()
                .and_then(|st| st.state)
                .unwrap_or(WorkState::Pending);
            *s.jobs.entry(lower(&format!("{state:?}"))).or_default() += 1;
        }
        let mut reasons: BTreeMap<String, usize> = BTreeMap::new();
        for t in tasks {
            let status = t.status.clone().unwrap_or_default();
            let state = status.state.unwrap_or(TaskState::Pending);
            *s.tasks.entry(lower(&format!("{state:?}"))).or_default() += 1;
            if state == TaskState::Pending {
                let why = status
                    .message
                    .filter(|m| !m.trim().is_empty())
                    .unwrap_or_else(|| "no reason given yet".to_owned());
                *reasons.entry(why).or_default() += 1;
            }
        }
        let mut waiting: Vec<(usize, String)> = reasons.into_iter().map(|(why, n)| (n, why)).collect();
        waiting.sort_by(|a, b| b.0.cmp(&a.0).then_with(|| a.1.cmp(&b.1)));
        waiting.truncate(TOP_REASONS);
        s.waiting = waiting;
        let mut offline: Vec<&Robot> = robots
            .iter()
            .filter(|r| r.status.as_ref().and_then(|st| st.phase) == Some(RobotPhase::Offline))
            .collect();
        offline.sort_by_key(|r| {
            (
                r.status.as_ref().and_then(|st| st.last_heartbeat_time),
                r.name_any(),
            )
        });
        s.offline_more = offline.len().saturating_sub(OFFLINE_LISTED);
        let now = jiff::Timestamp::now();
        s.offline = offline
            .iter()
            .take(OFFLINE_LISTED)
            .map(|r| offline_line(r, now))
            .collect();
        s
    }

    /// The screen.
    pub fn render(&self, scope: &str) -> String {
        let line = |counts: &BTreeMap<String, usize>| {
            let total: usize = counts.values().sum();
            if total == 0 {
                return "none".to_owned();
            }
            let parts: Vec<String> = counts.iter().map(|(k, n)| format!("{n} {k}")).collect();
            format!("{total}: {}", parts.join(", "))
        };
        let mut out = String::new();
        out.push_str(&format!("ROBOTS  {}", line(&self.robots)));
        if self.cordoned > 0 {
            out.push_str(&format!(" ({} cordoned)", self.cordoned));
        }
        out.push('\n');
        if !self.offline.is_empty() {
            out.push_str("OFFLINE ROBOTS (the longest silent first)\n");
            for line in &self.offline {
                out.push_str(&format!("  {line}\n"));
            }
            if self.offline_more > 0 {
                out.push_str(&format!("  ... and {} more\n", self.offline_more));
            }
        }
        out.push_str(&format!("JOBS    {} ({scope})\n", line(&self.jobs)));
        out.push_str(&format!("TASKS   {}\n", line(&self.tasks)));
        if !self.waiting.is_empty() {
            out.push_str("WHY TASKS WAIT (most common first)\n");
            for (n, why) in &self.waiting {
                out.push_str(&format!("  {n:>5}  {why}\n"));
            }
        }
        out
    }
}

fn lower(s: &str) -> String {
    s.to_lowercase()
}

async fn list<K>(api: Api<K>, what: &str) -> anyhow::Result<Vec<K>>
where
    K: kube::Resource + Clone + serde::de::DeserializeOwned + std::fmt::Debug,
{
    let listed = tokio::time::timeout(API_TIMEOUT, api.list(&ListParams::default()))
        .await
        .with_context(|| {
            format!(
                "listing {what}: the API server did not answer in {}s",
                API_TIMEOUT.as_secs()
            )
        })?
        .with_context(|| format!("listing {what}"))?;
    Ok(listed.items)
}

/// Prints one screen on the cluster.
pub async fn status(args: StatusArgs, data_dir: &Path) -> anyhow::Result<()> {
    let only = args.kube.namespace.clone();
    let (client, _) = args.kube.connect(data_dir).await?;
    let (jobs, tasks): (Api<Job>, Api<Task>) = match &only {
        Some(ns) => (
            Api::namespaced(client.clone(), ns),
            Api::namespaced(client.clone(), ns),
        ),
        None => (Api::all(client.clone()), Api::all(client.clone())),
    };
    let robots = list(Api::<Robot>::all(client.clone()), "robots").await?;
    let jobs = list(jobs, "jobs").await?;
    let tasks = list(tasks, "tasks").await?;
    let scope = match &only {
        Some(ns) => format!("namespace {ns}"),
        None => "all namespaces".to_owned(),
    };
    print!("{}", Summary::of(&robots, &jobs, &tasks).render(&scope));
    Ok(())
}

/// The client's version, with the commit it was built from if known.
pub fn client_version() -> String {
    let commit = option_env!("K8S4R_GIT_COMMIT").unwrap_or("unknown");
    format!("{} (commit {commit})", env!("CARGO_PKG_VERSION"))
}

/// The API server's version, or why it is not known.
pub async fn server_version(client: &Client) -> Result<String, String> {
    match tokio::time::timeout(API_TIMEOUT, client.apiserver_version()).await {
        Ok(Ok(info)) => Ok(format!("{} ({})", info.git_version, info.platform)),
        Ok(Err(e)) => Err(format!("unreachable: {e}")),
        Err(_) => Err(format!("unreachable: no answer in {}s", API_TIMEOUT.as_secs())),
    }
}

/// Prints the versions; an unreachable cluster is said, not an error.
pub async fn version(args: VersionArgs, data_dir: &Path) -> anyhow::Result<()> {
    println!("Client Version: k8s4r {}", client_version());
    if args.client {
        return Ok(());
    }
    let server = match args.kube.connect(data_dir).await {
        Ok((client, _)) => server_version(&client).await,
        Err(e) => Err(format!("unknown: {e:#}")),
    };
    match server {
        Ok(v) => println!("Server Version: {v}"),
        Err(why) => println!("Server Version: {why}"),
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;
    use k8s4r_api::{RobotSpec, RobotStatus, TaskStatus};

    fn robot(phase: Option<RobotPhase>, cordoned: bool) -> Robot {
        let mut r = Robot::new("r", RobotSpec::default());
        r.spec.unschedulable = cordoned;
        r.status = Some(RobotStatus {
            phase,
            ..RobotStatus::default()
        });
        r
    }

    fn task(state: TaskState, message: Option<&str>) -> Task {
        let mut t: Task = serde_json::from_value(serde_json::json!({
            "apiVersion": "robot.k8s4r.io/v1alpha1", "kind": "Task",
            "metadata": { "name": "t" },
            "spec": { "driver": "exec", "command": "true" },
        }))
        .unwrap();
        t.status = Some(TaskStatus {
            state: Some(state),
            message: message.map(str::to_owned),
            ..TaskStatus::default()
        });
        t
    }

    #[test]
    fn counts_and_orders_the_reasons_tasks_wait() {
        let robots = [
            robot(Some(RobotPhase::Online), false),
            robot(Some(RobotPhase::Online), true),
            robot(None, false),
        ];
        let lacking = "no robot fits: 2 lack the driver raw_exec";
        let tasks = [
            task(TaskState::Pending, Some(lacking)),
            task(TaskState::Pending, Some(lacking)),
            task(TaskState::Pending, Some("waiting for the retry backoff")),
            task(TaskState::Pending, None),
            task(TaskState::Running, None),
        ];
        let s = Summary::of(&robots, &[], &tasks);
        assert_eq!(s.robots.get("Online"), Some(&2));
        assert_eq!(s.robots.get("Pending"), Some(&1));
        assert_eq!(s.cordoned, 1);
        assert_eq!(s.tasks.get("pending"), Some(&4));
        assert_eq!(s.waiting[0], (2, lacking.to_owned()));
        assert_eq!(s.waiting.len(), 3);
        let screen = s.render("all namespaces");
        assert!(
            screen.contains("ROBOTS  3: 2 Online, 1 Pending (1 cordoned)\n"),
            "{screen}"
        );
        assert!(screen.contains("JOBS    none (all namespaces)\n"), "{screen}");
        assert!(screen.contains("TASKS   5: 4 pending, 1 running\n"), "{screen}");
        assert!(
            screen.contains("      2  no robot fits: 2 lack the driver raw_exec\n"),
            "{screen}"
        );
    }

    #[tokio::test]
    async fn an_unreachable_cluster_is_said_not_failed() {
        let dir = tempfile::tempdir().unwrap();
        let kubeconfig = dir.path().join("kubeconfig");
        // Nothing listens on port 1.
        std::fs::write(
            &kubeconfig,
            "apiVersion: v1\nkind: Config\nclusters: [{name: c, cluster: {server: 'https://127.0.0.1:1'}}]\n\
             users: [{name: u, user: {token: t}}]\ncontexts: [{name: x, context: {cluster: c, user: u}}]\ncurrent-context: x\n",
        )
        .unwrap();
        let (client, _) = KubeArgs {
            kubeconfig: Some(kubeconfig.clone()),
            context: None,
            namespace: None,
        }
        .connect(dir.path())
        .await
        .unwrap();
        let why = server_version(&client).await.unwrap_err();
        assert!(why.starts_with("unreachable: "), "{why}");
        let args = VersionArgs {
            client: false,
            kube: KubeArgs {
                kubeconfig: Some(kubeconfig),
                context: None,
                namespace: None,
            },
        };
        version(args, dir.path())
            .await
            .expect("version does not fail for an unreachable cluster");
    }

    #[test]
    fn an_offline_robot_is_named_with_its_silence_and_its_stale_facts() {
        let mut r = robot(Some(RobotPhase::Offline), false);
        let status = r.status.as_mut().unwrap();
        status.last_heartbeat_time = Some("2026-12-03T10:00:00Z".parse().unwrap());
        status.facts = serde_json::from_str(r#"{"battery": 80, "estop": false}"#).unwrap();
        let now = "2026-12-03T10:03:12Z".parse().unwrap();
        assert_eq!(
            offline_line(&r, now),
            "r  silent for 3m12s; as of then (stale): facts battery=80 estop=false"
        );
        let s = Summary::of(&[r, robot(Some(RobotPhase::Online), false)], &[], &[]);
        assert_eq!(s.offline.len(), 1);
        let screen = s.render("all namespaces");
        assert!(screen.contains("OFFLINE ROBOTS"), "{screen}");
        assert!(
            screen.contains("(stale): facts battery=80 estop=false"),
            "{screen}"
        );
    }

    #[test]
    fn the_client_version_names_its_commit() {
        let v = client_version();
        assert!(v.starts_with(env!("CARGO_PKG_VERSION")), "{v}");
        assert!(v.contains("(commit "), "{v}");
    }
}
