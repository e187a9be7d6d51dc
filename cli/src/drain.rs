//! `k8s4r cordon`, `uncordon` and `drain`: a robot taken out of service
//! for maintenance, in kubectl's words. Cordon sets the Robot's
//! `spec.unschedulable` (the scheduler places nothing new there); drain
//! cordons, then evicts what runs there by the annotation
//! `robot.k8s4r.io/evict` (the manager records it, the server sends the
//! robot a cancel that drains: the task stops through its preStop and stop
//! signal and waits for another robot, without using a retry), and waits
//! until the robot holds nothing.

use std::collections::{BTreeMap, HashMap};
use std::path::Path;
use std::time::{Duration, Instant};

use anyhow::{bail, Context as _};
use clap::{Args as ClapArgs, ValueEnum};
use k8s4r_api::names::{ANNOTATION_EVICT, ANNOTATION_REQUESTED_BY};
use k8s4r_api::{Robot, RobotPhase, Task, TaskState};
use kube::api::{ListParams, Patch, PatchParams};
use kube::{Api, Client};
use serde::Serialize;

use crate::operate::{explain, whoami, KubeArgs, FIELD_MANAGER};

/// How often a drain looks at what the robot still holds.
const POLL: Duration = Duration::from_millis(500);

/// `k8s4r cordon` and `k8s4r uncordon`.
#[derive(Debug, Clone, ClapArgs)]
pub struct RobotArgs {
    /// The Robot: NAME or robot/NAME.
    pub robot: String,
    #[command(flatten)]
    pub kube: KubeArgs,
}

/// What a drain does with the robot's services.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, ValueEnum)]
pub enum Services {
    /// They keep running there, and the drain does not wait for them.
    #[default]
    Leave,
    /// They are evicted too, and run elsewhere.
    Stop,
}

/// `k8s4r drain`.
#[derive(Debug, Clone, ClapArgs)]
pub struct DrainArgs {
    /// The Robot: NAME or robot/NAME.
    pub robot: String,
    /// The robot's services: `leave` them running (not waited for) or
    /// `stop` them too (they run elsewhere).
    #[arg(long, value_enum, default_value_t = Services::Leave)]
    pub services: Services,
    /// How long to wait until the robot holds nothing; 0 waits for ever.
    #[arg(long, default_value = "5m", value_parser = humantime::parse_duration)]
    pub timeout: Duration,
    #[command(flatten)]
    pub kube: KubeArgs,
}

/// The robot's name from `NAME` or `robot/NAME` (`robots`, `rbt`, or the
/// full resource name, as kubectl takes them).
pub fn parse_robot(arg: &str) -> anyhow::Result<String> {
    let (kind, name) = arg.split_once('/').unwrap_or(("robot", arg));
    let kind = kind.split('.').next().unwrap_or(kind).to_ascii_lowercase();
    if !matches!(kind.as_str(), "robot" | "robots" | "rbt") {
        bail!("{kind:?} is not a robot (write the robot's name, or robot/NAME)");
    }
    if name.is_empty() {
        bail!("no robot name in {arg:?}");
    }
    Ok(name.to_owned())
}

/// What `k8s4r cordon|uncordon` prints: `robot/rb1 cordoned`, or
/// `already cordoned` when it was (`on`: cordon).
pub fn cordon_line(robot: &str, on: bool, changed: bool) -> String {
    let verb = if on { "cordoned" } else { "uncordoned" };
    let already = if changed { "" } else { "already " };
    format!("robot/{robot} {already}{verb}")
}

/// `k8s4r cordon ROBOT` (`on`) or `k8s4r uncordon ROBOT`.
pub async fn cordon(args: RobotArgs, on: bool, data_dir: &Path) -> anyhow::Result<()> {
    let robot = parse_robot(&args.robot)?;
    let (client, _) = args.kube.connect(data_dir).await?;
    let changed = set_unschedulable(&client, &robot, on).await?;
    println!("{}", cordon_line(&robot, on, changed));
    Ok(())
}

/// The Robot's `spec.unschedulable`, as a merge patch (null: not cordoned).
#[derive(Debug, Serialize)]
struct SpecPatch {
    spec: Unschedulable,
}

#[derive(Debug, Serialize)]
struct Unschedulable {
    unschedulable: Option<bool>,
}

/// Cordons (`on`) or uncordons `robot`; false when it already was.
pub async fn set_unschedulable(client: &Client, robot: &str, on: bool) -> anyhow::Result<bool> {
    let robots: Api<Robot> = Api::all(client.clone());
    let current = read_robot(&robots, robot).await?;
    if current.spec.unschedulable == on {
        return Ok(false);
    }
    let patch = SpecPatch {
        spec: Unschedulable {
            unschedulable: on.then_some(true),
        },
    };
    let verb = if on { "cordon" } else { "uncordon" };
    robots
        .patch(robot, &patch_params(), &Patch::Merge(&patch))
        .await
        .map_err(|e| explain(e, verb, &format!("robot {robot}"), "", "robots"))?;
    Ok(true)
}

/// The Robot, or an error a person can act on.
async fn read_robot(robots: &Api<Robot>, robot: &str) -> anyhow::Result<Robot> {
    match robots.get_opt(robot).await {
        Ok(Some(found)) => Ok(found),
        Ok(None) => bail!("robot {robot:?} not found (`kubectl get robots` lists them)"),
        Err(e) => Err(explain(e, "read", &format!("robot {robot}"), "", "robots")),
    }
}

fn patch_params() -> PatchParams {
    PatchParams {
        field_manager: Some(FIELD_MANAGER.to_owned()),
        ..PatchParams::default()
    }
}

/// A task on the robot being drained.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Held {
    /// `namespace/name`.
    pub name: String,
    /// Its uid and attempt: a drain asks once per attempt.
    pub key: (String, u32),
    /// Dispatching or running.
    pub state: TaskState,
    /// The manager has recorded an eviction of this attempt.
    pub evicting: bool,
}

/// What one look at the robot's tasks calls for.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct DrainPlan {
    /// Tasks to evict now (not asked before).
    pub evict: Vec<Held>,
    /// Services left running (`--services leave`).
    pub left: Vec<Held>,
    /// What the drain still waits for.
    pub waiting: Vec<Held>,
}

/// Plans one look at `tasks`: those whose `status.robot` is `robot` and
/// that are dispatching or running there, less the services left, are
/// waited for; those of them not in `asked` are evicted now (a task placed
/// there just before the cordon is caught by a later look).
pub fn plan_drain(
    tasks: &[Task],
    robot: &str,
    services: Services,
    asked: &HashMap<(String, u32), String>,
) -> DrainPlan {
    let mut plan = DrainPlan::default();
    for task in tasks {
        let Some(status) = task.status.as_ref() else {
            continue;
        };
        let state = match status.state {
            Some(state @ (TaskState::Dispatching | TaskState::Running)) => state,
            _ => continue,
        };
        if status.robot.as_deref() != Some(robot) {
            continue;
        }
        let held = Held {
            name: format!(
                "{}/{}",
                task.metadata.namespace.as_deref().unwrap_or_default(),
                task.metadata.name.as_deref().unwrap_or_default()
            ),
            key: (task.metadata.uid.clone().unwrap_or_default(), status.attempt),
            state,
            evicting: status.eviction_requested(),
        };
        if !task.spec.template.kind.is_batch() && services == Services::Leave {
            plan.left.push(held);
            continue;
        }
        if !asked.contains_key(&held.key) {
            plan.evict.push(held.clone());
        }
        plan.waiting.push(held);
    }
    plan
}

/// The tasks asked to leave that no longer hold the robot, by name.
pub fn gone<'a>(asked: &'a HashMap<(String, u32), String>, waiting: &[Held]) -> Vec<&'a str> {
    let mut gone: Vec<&str> = asked
        .iter()
        .filter(|(key, _)| !waiting.iter().any(|h| &h.key == *key))
        .map(|(_, name)| name.as_str())
        .collect();
    gone.sort_unstable();
    gone
}

/// What a drain that ran out of time says: what is still there, and why
/// it may be.
pub fn timeout_message(robot: &str, timeout: Duration, waiting: &[Held], offline: bool) -> String {
    let tasks: Vec<String> = waiting
        .iter()
        .map(|h| {
            let state = h.state.as_str().to_lowercase();
            match h.evicting {
                true => format!("{} ({state})", h.name),
                false => format!(
                    "{} ({state}; the manager has not acted on its eviction: is k8s4r-manager running?)",
                    h.name
                ),
            }
        })
        .collect();
    let mut message = format!(
        "robot/{robot} not drained within {}: still on it: {}",
        humantime::format_duration(timeout),
        tasks.join(", ")
    );
    if offline {
        message.push_str(&format!(
            " (robot/{robot} is offline: it stops them when it is back)"
        ));
    }
    message
}

/// The annotations that evict a Task's attempt, as a merge patch.
#[derive(Debug, Serialize)]
struct EvictPatch<'a> {
    metadata: Annotations<'a>,
}

#[derive(Debug, Serialize)]
struct Annotations<'a> {
    annotations: BTreeMap<&'static str, &'a str>,
}

/// `k8s4r drain ROBOT`.
pub async fn drain(args: DrainArgs, data_dir: &Path) -> anyhow::Result<()> {
    let robot = parse_robot(&args.robot)?;
    let (client, _) = args.kube.connect(data_dir).await?;
    let changed = set_unschedulable(&client, &robot, true).await?;
    println!("{}", cordon_line(&robot, true, changed));
    // Every namespace, unless -n names one.
    let tasks: Api<Task> = match &args.kube.namespace {
        Some(ns) => Api::namespaced(client.clone(), ns),
        None => Api::all(client.clone()),
    };
    let value = jiff::Timestamp::now().to_string();
    let by = whoami(&client).await;
    let deadline = (!args.timeout.is_zero()).then(|| Instant::now() + args.timeout);
    let mut asked: HashMap<(String, u32), String> = HashMap::new();
    let mut told_left = false;
    let mut reported = Vec::new();
    loop {
        let list = tasks
            .list(&ListParams::default())
            .await
            .with_context(|| format!("listing the tasks on robot {robot}"))?;
        let plan = plan_drain(&list.items, &robot, args.services, &asked);
        if !told_left && !plan.left.is_empty() {
            let names: Vec<&str> = plan.left.iter().map(|h| h.name.as_str()).collect();
            eprintln!(
                "warning: leaving services running on robot/{robot}, not waited for: {} (--services stop evicts them too)",
                names.join(", ")
            );
            told_left = true;
        }
        for held in &plan.evict {
            println!("evicting task {}", held.name);
            if !held.evicting {
                evict(&client, held, &value, by.as_deref()).await?;
            }
            asked.insert(held.key.clone(), held.name.clone());
        }
        for name in gone(&asked, &plan.waiting) {
            if !reported.iter().any(|r| r == name) {
                println!("task {name} evicted");
                reported.push(name.to_owned());
            }
        }
        if plan.waiting.is_empty() {
            println!("robot/{robot} drained");
            return Ok(());
        }
        if deadline.is_some_and(|d| Instant::now() >= d) {
            let robots: Api<Robot> = Api::all(client.clone());
            let phase = read_robot(&robots, &robot)
                .await
                .ok()
                .and_then(|r| r.status?.phase);
            let offline = phase == Some(RobotPhase::Offline);
            bail!(timeout_message(&robot, args.timeout, &plan.waiting, offline));
        }
        tokio::time::sleep(POLL).await;
    }
}

/// Sets `robot.k8s4r.io/evict` (and who asked) on the task; a task gone
/// meanwhile needs nothing.
async fn evict(client: &Client, held: &Held, value: &str, by: Option<&str>) -> anyhow::Result<()> {
    let (namespace, name) = held
        .name
        .split_once('/')
        .unwrap_or(("default", held.name.as_str()));
    let mut annotations = BTreeMap::from([(ANNOTATION_EVICT, value)]);
    if let Some(by) = by {
        annotations.insert(ANNOTATION_REQUESTED_BY, by);
    }
    let patch = EvictPatch {
        metadata: Annotations { annotations },
    };
    let api: Api<Task> = Api::namespaced(client.clone(), namespace);
    match api.patch(name, &patch_params(), &Patch::Merge(&patch)).await {
        Ok(_) => Ok(()),
        Err(kube::Error::Api(e)) if e.code == 404 => Ok(()),
        Err(e) => {
            let place = format!(" in namespace {namespace}");
            Err(explain(e, "evict", &format!("task {name}"), &place, "tasks"))
        }
    }
}

#[cfg(test)]
mod tests;
