//! Placement: which robot a task goes to.
//!
//! Plain data in, a decision out. The controller turns Robots into
//! [`RobotFacts`] once per change (not once per decision), keeps what is
//! already assigned in a [`crate::ledger::Ledger`], and asks [`choose`] for
//! each task. Filters run first (phase, cordon, whether the robot takes
//! tasks at all, selector, constraints, driver, the robot's task policy,
//! the task's start conditions on the robot's facts, its task limit, free CPU, memory and disk, the group's required
//! anti-affinity); among the robots left, the one the group's preferred
//! affinity weighs highest wins, then the tasks of one group spread across
//! robots, then the least allocated robot wins. A task of lower priority
//! leaves a robot to a waiting task of higher priority that fits it
//! (`Request::reserved`).
//!
//! A large fleet is not scored whole for every task: [`choose_sampled`]
//! looks at robots from where the last decision left off and scores the
//! first [`SAMPLE`] that fit, as Nomad limits the feasible nodes it ranks.
//! A task with a preferred affinity still sees every robot.

use std::cmp::Ordering;
use std::collections::{BTreeMap, HashMap, HashSet};
use std::fmt;
use std::ops::Bound;

use k8s4r_api::config_resolve::Problem;
use k8s4r_api::selector::{affinity_weight, SelectorOperator};
use k8s4r_api::{
    AntiAffinity, Constraint, FactRequirement, Facts, LabelSelector, RobotPhase, TaskPolicy, TaskReason,
    WeightedAffinity,
};

/// What the scheduler needs to know about one robot.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct RobotFacts {
    /// The Robot's name (its id).
    pub name: String,
    /// Its phase; `None` before the server wrote one.
    pub phase: Option<RobotPhase>,
    /// Cordoned by a person.
    pub unschedulable: bool,
    /// `metadata.labels`.
    pub labels: BTreeMap<String, String>,
    /// Device attributes constraints may name (`arch`, `os`, `cpus`, ...).
    pub attributes: BTreeMap<String, String>,
    /// Drivers the agent offers.
    pub drivers: Vec<String>,
    /// CPU capacity in millicores; `None` when the robot reported none, and
    /// then CPU requests are not counted against it.
    pub cpu_milli: Option<u64>,
    /// Memory capacity in bytes; `None` as for CPU.
    pub memory_bytes: Option<u64>,
    /// The robot says it takes tasks (its `AcceptingTasks` condition is not
    /// False); when it does not, why.
    pub refusing: Option<String>,
    /// The most tasks it runs at once; `None` when it reported no limit.
    pub max_tasks: Option<u32>,
    /// Its disk budget for task directories, in bytes; `None` as for CPU.
    pub disk_bytes: Option<u64>,
    /// Who it lets tasks run as; `None` for an agent that does not say (no
    /// policy filter then: the agent still refuses what it does not allow).
    pub policy: Option<TaskPolicy>,
    /// What it last said about its own state (battery, docked, ...): what
    /// a task's start conditions read.
    pub facts: Facts,
}

impl RobotFacts {
    /// The value a constraint's attribute names: `label.<key>` reads a label,
    /// anything else a device attribute.
    pub fn attribute(&self, name: &str) -> Option<&str> {
        match name.strip_prefix("label.") {
            Some(key) => self.labels.get(key).map(String::as_str),
            None => self.attributes.get(name).map(String::as_str),
        }
    }
}

/// What one task asks of a robot: CPU, memory, disk, and who it runs as.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Demand {
    /// Millicores.
    pub cpu_milli: u64,
    /// Bytes.
    pub memory_bytes: u64,
    /// Bytes of disk for its directory.
    pub disk_bytes: u64,
    /// The user it names, if any.
    pub user: Option<String>,
    /// The supplementary groups it names.
    pub groups: Vec<String>,
}

/// What is already assigned to one robot.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Usage {
    /// Millicores requested by its tasks.
    pub cpu_milli: u64,
    /// Bytes requested by its tasks.
    pub memory_bytes: u64,
    /// Disk bytes requested by its tasks.
    pub disk_bytes: u64,
    /// Number of tasks.
    pub tasks: u32,
    /// Tasks per spread group (see [`Request::group`]).
    pub per_group: HashMap<String, u32>,
}

/// One task asking for a robot.
#[derive(Clone, Debug)]
pub struct Request<'a> {
    /// Tasks sharing this key are spread across robots (namespace/taskgroup).
    pub group: &'a str,
    /// The merged robot selector.
    pub selector: Option<&'a LabelSelector>,
    /// The merged constraints.
    pub constraints: &'a [Constraint],
    /// The driver the task needs.
    pub driver: &'a str,
    /// Its CPU and memory requests.
    pub demand: Demand,
    /// A robot to use only when nothing else fits (the one whose dispatch
    /// just timed out).
    pub avoid: Option<&'a str>,
    /// The one robot the task may run on (an everyRobot group's task).
    pub robot: Option<&'a str>,
    /// At most one running task of `group` per robot, or per value of a
    /// robot label.
    pub anti_affinity: Option<&'a AntiAffinity>,
    /// Robots preferred, with weights.
    pub affinity: &'a [WeightedAffinity],
    /// Robots kept for waiting tasks of higher priority.
    pub reserved: &'a [String],
    /// The start conditions (`when`) the robot's facts must all satisfy.
    pub when: &'a [FactRequirement],
    /// What the task takes from ConfigMaps and Secrets, when it takes
    /// anything: it must resolve on the robot.
    pub config: Option<&'a dyn ConfigLookup>,
}

/// Whether a task's references to ConfigMaps and Secrets resolve on a
/// robot (a key may be per robot).
pub trait ConfigLookup: fmt::Debug + Sync {
    /// What keeps them from resolving on `robot`, if anything.
    fn problem(&self, robot: &str) -> Option<Problem>;
}

/// Why one robot was filtered out. The order is the order of the filters.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub enum Rejection {
    /// Phase Offline.
    Offline,
    /// Phase Pending, Rejected or none: not approved.
    NotApproved,
    /// `spec.unschedulable`.
    Cordoned,
    /// It says it takes no task now (disk full, supervisor failing, ...).
    NotAccepting,
    /// The robot selector does not match its labels.
    Selector,
    /// A constraint does not admit it.
    Constraint,
    /// It does not offer the task's driver.
    Driver,
    /// Its task policy refuses the task's user or groups.
    Policy,
    /// Its facts do not satisfy the task's start condition at this index
    /// (the first one that fails).
    Unmet(usize),
    /// A ConfigMap or Secret (or key) the task needs there is missing, or
    /// all it takes is too much.
    Config,
    /// It runs a task of the same group (required anti-affinity per robot).
    AntiAffinity,
    /// It lacks the anti-affinity's topology label.
    TopologyMissing,
    /// A robot with the same topology label value runs a task of the group.
    TopologyTaken,
    /// Kept for a waiting task of higher priority.
    Reserved,
    /// It runs as many tasks as it allows.
    TaskLimit,
    /// Not enough free CPU.
    Cpu,
    /// Not enough free memory.
    Memory,
    /// Not enough of its disk budget left.
    Disk,
}

impl Rejection {
    /// For a person; `topology_key` and `conditions` (the texts of the
    /// task's start conditions) name what some rejections refer to.
    fn describe(self, topology_key: &str, conditions: &[String], driver: &str) -> String {
        let fixed = match self {
            Rejection::Driver => return format!("lack driver {driver}{}", driver_setting(driver)),
            Rejection::Unmet(i) => {
                return match conditions.get(i) {
                    Some(condition) => format!("don't meet {condition}"),
                    None => "don't meet a start condition".to_owned(),
                };
            }
            Rejection::Config => "lack the task's configuration",
            Rejection::AntiAffinity => "already run a task of this group (anti-affinity)",
            Rejection::TopologyMissing => {
                return format!("lack label {topology_key} (anti-affinity)");
            }
            Rejection::TopologyTaken => {
                return format!("share their {topology_key} with a task of this group (anti-affinity)");
            }
            Rejection::Reserved => "kept for a waiting task of higher priority",
            Rejection::Offline => "offline",
            Rejection::NotApproved => "not approved",
            Rejection::Cordoned => "unschedulable",
            Rejection::NotAccepting => "not accepting tasks",
            Rejection::Selector => "don't match selector",
            Rejection::Constraint => "don't meet constraints",
            Rejection::Policy => "don't allow the task's user or groups",
            Rejection::TaskLimit => "at their task limit",
            Rejection::Cpu => "insufficient cpu",
            Rejection::Memory => "insufficient memory",
            Rejection::Disk => "insufficient disk",
        };
        fixed.to_owned()
    }
}

/// The agent setting that offers `driver`, as a hint after its name.
fn driver_setting(driver: &str) -> &'static str {
    match driver {
        k8s4r_api::task::DRIVER_RAW_EXEC => {
            " (agent setting raw_exec = true / --raw-exec true; an agent running as root needs allow_root = true too)"
        }
        k8s4r_api::task::DRIVER_EXEC => " (every agent offers it; these run an agent that does not)",
        k8s4r_api::task::DRIVER_PODMAN => " (agent setting podman = true / --podman true, with podman installed on the robot)",
        _ => "",
    }
}

/// No robot fits: how many were looked at and why each was refused.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct NoFit {
    /// Robots considered.
    pub total: usize,
    /// Robots refused, per first failing filter.
    pub rejections: BTreeMap<Rejection, usize>,
    /// The anti-affinity's topology label, to name it.
    pub topology_key: Option<Box<str>>,
    /// The one robot the task may run on, when it has one.
    pub robot: Option<Box<str>>,
    /// The task's start conditions as text (`battery Gt 30`), to name the
    /// one a robot does not meet.
    pub conditions: Box<[String]>,
    /// The task's driver, to name it when robots lack it (boxed: the
    /// struct is an `Err` returned by value).
    pub driver: Box<str>,
    /// Facts the task's start conditions name that no robot looked at
    /// reports (a typo, most often), each with the reported fact closest
    /// to it, if one is close.
    pub unreported: Box<[(String, Option<String>)]>,
    /// What names the rarer reasons (a box, as rare: the struct is an
    /// `Err` returned by value).
    pub hints: Option<Box<Hints>>,
}

/// What a [`NoFit`] says of the rarer reasons.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Hints {
    /// What of the robot selector no robot looked at has, with the closest
    /// label robots do have (`no robot has label "sitee" (robots have
    /// "site")`): only when no robot looked at matches the selector.
    pub unmatched: Vec<String>,
    /// Why the task's configuration does not resolve, on the first robot
    /// refused for it.
    pub config: Option<Problem>,
}

impl NoFit {
    /// The reason a task that fits no robot waits with: its configuration's
    /// when that is what keeps it from a robot it would otherwise fit.
    pub fn reason(&self) -> TaskReason {
        match self.hints.as_ref().and_then(|h| h.config.as_ref()) {
            Some(problem) if self.rejections.contains_key(&Rejection::Config) => problem.reason(),
            _ => TaskReason::Unschedulable,
        }
    }
}

/// Labels named for a selector value no robot has, at most.
const VALUES_NAMED: usize = 5;
/// Values of one label key compared with a value no robot has, at most
/// (a key with a value per robot, such as a host name, is not searched
/// whole).
const VALUES_COMPARED: usize = 1000;

/// Each part of `selector` that no robot of `robots` satisfies, said with
/// the label key or values robots have instead.
pub fn selector_hints<'a>(
    selector: &LabelSelector,
    robots: impl Iterator<Item = &'a BTreeMap<String, String>>,
) -> Vec<String> {
    let mut seen: BTreeMap<&str, std::collections::BTreeSet<&str>> = BTreeMap::new();
    for labels in robots {
        for (k, v) in labels {
            let values = seen.entry(k).or_default();
            if values.len() < VALUES_COMPARED {
                values.insert(v);
            }
        }
    }
    let key_hint = |key: &str| {
        let near = closest(key, seen.keys().copied());
        match near {
            Some(near) => format!("no robot has label {key:?} (robots have {near:?})"),
            None => format!("no robot has label {key:?}"),
        }
    };
    let value_hint = |key: &str, wanted: &[&str], values: &std::collections::BTreeSet<&str>| {
        let named: Vec<&str> = values.iter().copied().take(VALUES_NAMED).collect();
        let more = values.len().saturating_sub(VALUES_NAMED);
        let near = wanted.iter().find_map(|w| closest(w, values.iter().copied()));
        let mut hint = format!("no robot has {key}={}", wanted.join("|"));
        match near {
            Some(near) => hint.push_str(&format!(" (robots have {key}={near})")),
            None if more > 0 => hint.push_str(&format!(
                " (robots have {key}={} and {more} more)",
                named.join("|")
            )),
            None => hint.push_str(&format!(" (robots have {key}={})", named.join("|"))),
        }
        hint
    };
    let mut hints = Vec::new();
    let wanted = selector
        .match_labels
        .iter()
        .map(|(k, v)| (k.as_str(), vec![v.as_str()]))
        .chain(
            selector
                .match_expressions
                .iter()
                .filter_map(|r| match r.operator {
                    SelectorOperator::In => {
                        Some((r.key.as_str(), r.values.iter().map(String::as_str).collect()))
                    }
                    SelectorOperator::Exists => Some((r.key.as_str(), Vec::new())),
                    _ => None,
                }),
        );
    for (key, values) in wanted {
        match seen.get(key) {
            None => hints.push(key_hint(key)),
            Some(have) if !values.is_empty() && !values.iter().any(|v| have.contains(v)) => {
                hints.push(value_hint(key, &values, have));
            }
            Some(_) => {}
        }
    }
    hints
}

/// The fact robots report that is closest to `key`, when one is close
/// enough to be what was meant (a few letters apart).
pub fn closest<'a>(key: &str, reported: impl IntoIterator<Item = &'a str>) -> Option<&'a str> {
    let limit = (key.chars().count() / 3).clamp(1, 3);
    reported
        .into_iter()
        .map(|r| (strsim::damerau_levenshtein(key, r), r))
        .filter(|(d, _)| *d <= limit)
        .min()
        .map(|(_, r)| r)
}

impl fmt::Display for NoFit {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        if let (Some(robot), 0) = (&self.robot, self.total) {
            return write!(f, "0/1 robots: robot {robot} (the task's own) is not registered");
        }
        write!(f, "0/{} robots", self.total)?;
        if self.total == 0 {
            return f.write_str(" registered");
        }
        f.write_str(":")?;
        let key = self.topology_key.as_deref().unwrap_or_default();
        for (i, (why, n)) in self.rejections.iter().enumerate() {
            let sep = if i == 0 { " " } else { ", " };
            write!(
                f,
                "{sep}{n} {}",
                why.describe(key, &self.conditions, &self.driver)
            )?;
        }
        if let Some(robot) = &self.robot {
            write!(f, " (the task runs only on robot {robot})")?;
        }
        for (key, near) in self.unreported.iter() {
            write!(f, "; no robot reports a fact named {key:?}")?;
            if let Some(near) = near {
                write!(f, " (robots report {near:?})")?;
            }
        }
        if let Some(hints) = &self.hints {
            for hint in &hints.unmatched {
                write!(f, "; {hint}")?;
            }
            if let Some(problem) = &hints.config {
                write!(f, "; {problem}")?;
            }
        }
        Ok(())
    }
}

/// How a robot's change can matter to tasks waiting for a robot.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum RobotChange {
    /// Nothing the scheduler reads changed.
    None,
    /// Only its facts changed: only a task whose start conditions they
    /// meet now and did not before ([`newly_met`]) may fit where it did
    /// not. (Facts such as a battery level change often; waking every
    /// waiting task on each change would cost a reconcile per task.)
    Facts,
    /// Anything else: any waiting task may fit now.
    Other,
}

/// How `new` differs from `old` (`None`: a robot not seen before).
pub fn robot_change(old: Option<&RobotFacts>, new: &RobotFacts) -> RobotChange {
    let Some(old) = old else {
        return RobotChange::Other;
    };
    if old == new {
        return RobotChange::None;
    }
    let with_old_facts = RobotFacts {
        facts: old.facts.clone(),
        ..new.clone()
    };
    if with_old_facts == *old {
        RobotChange::Facts
    } else {
        RobotChange::Other
    }
}

/// Whether facts that changed from `old` to `new` meet every one of
/// `when` now and did not before: a task waiting with those conditions may
/// fit on the robot now.
pub fn newly_met(when: &[FactRequirement], old: &Facts, new: &Facts) -> bool {
    !when.is_empty() && when.iter().all(|c| c.admits(new)) && !when.iter().all(|c| c.admits(old))
}

/// Whether a robot that [`check`] answered so may take the task later: it
/// passed, or was refused only for now (offline, not accepting tasks, its
/// facts not meeting a start condition, busy, full, or the group's task
/// already there).
pub fn may_take_later(checked: Result<(), Rejection>) -> bool {
    match checked {
        Ok(()) => true,
        Err(r) => matches!(
            r,
            Rejection::Offline
                | Rejection::NotAccepting
                | Rejection::Unmet(_)
                | Rejection::Config
                | Rejection::AntiAffinity
                | Rejection::TopologyTaken
                | Rejection::Reserved
                | Rejection::TaskLimit
                | Rejection::Cpu
                | Rejection::Memory
                | Rejection::Disk
        ),
    }
}

/// Runs every filter over one robot; the first that refuses it wins.
pub fn check(robot: &RobotFacts, request: &Request<'_>, usage: Option<&Usage>) -> Result<(), Rejection> {
    match robot.phase {
        Some(RobotPhase::Online) => {}
        Some(RobotPhase::Offline) => return Err(Rejection::Offline),
        _ => return Err(Rejection::NotApproved),
    }
    if robot.unschedulable {
        return Err(Rejection::Cordoned);
    }
    if robot.refusing.is_some() {
        return Err(Rejection::NotAccepting);
    }
    if let Some(selector) = request.selector {
        if !selector.matches(&robot.labels) {
            return Err(Rejection::Selector);
        }
    }
    if !request
        .constraints
        .iter()
        .all(|c| c.admits(robot.attribute(&c.attribute)))
    {
        return Err(Rejection::Constraint);
    }
    if !robot.drivers.iter().any(|d| d == request.driver) {
        return Err(Rejection::Driver);
    }
    if let Some(policy) = &robot.policy {
        let demand = &request.demand;
        let root = demand.user.as_deref() == Some("root");
        if policy
            .refusal(demand.user.as_deref(), &demand.groups, root)
            .is_some()
        {
            return Err(Rejection::Policy);
        }
    }
    // The robot's facts are its own word, checked again by its agent at
    // admission with a fresher view.
    if let Some(index) = request.when.iter().position(|c| !c.admits(&robot.facts)) {
        return Err(Rejection::Unmet(index));
    }
    if request.config.is_some_and(|c| c.problem(&robot.name).is_some()) {
        return Err(Rejection::Config);
    }
    if let Some(anti) = request.anti_affinity {
        match anti.topology_key.as_deref() {
            None => {
                let here = usage.and_then(|u| u.per_group.get(request.group)).copied();
                if here.unwrap_or(0) > 0 {
                    return Err(Rejection::AntiAffinity);
                }
            }
            Some(key) => {
                if !robot.labels.contains_key(key) {
                    return Err(Rejection::TopologyMissing);
                }
            }
        }
    }
    if request.reserved.contains(&robot.name) {
        return Err(Rejection::Reserved);
    }
    room(robot, request, usage)
}

/// The capacity filters: the robot's task limit, free CPU, memory and disk.
fn room(robot: &RobotFacts, request: &Request<'_>, usage: Option<&Usage>) -> Result<(), Rejection> {
    if let Some(max) = robot.max_tasks {
        if usage.map_or(0, |u| u.tasks) >= max {
            return Err(Rejection::TaskLimit);
        }
    }
    let (cpu_used, memory_used) = usage.map_or((0, 0), |u| (u.cpu_milli, u.memory_bytes));
    if let Some(cap) = robot.cpu_milli {
        if cpu_used.saturating_add(request.demand.cpu_milli) > cap {
            return Err(Rejection::Cpu);
        }
    }
    if let Some(cap) = robot.memory_bytes {
        if memory_used.saturating_add(request.demand.memory_bytes) > cap {
            return Err(Rejection::Memory);
        }
    }
    if let Some(cap) = robot.disk_bytes {
        let used = usage.map_or(0, |u| u.disk_bytes);
        if used.saturating_add(request.demand.disk_bytes) > cap {
            return Err(Rejection::Disk);
        }
    }
    Ok(())
}

/// How good a fitting robot is; lower is better.
#[derive(Clone, Debug, PartialEq, Eq, PartialOrd, Ord)]
pub struct Score {
    /// The robot to avoid sorts last.
    pub avoided: bool,
    /// The preferred affinity's weight, negated (higher weight first).
    pub affinity: i64,
    /// Tasks of the same group already there (spread).
    pub same_group: u32,
    /// The fuller of CPU and memory after placing the task, in per mille.
    pub load_permille: u64,
    /// Tasks already there.
    pub tasks: u32,
}

/// Scores a robot that passed [`check`].
pub fn score(robot: &RobotFacts, request: &Request<'_>, usage: Option<&Usage>) -> Score {
    let empty = Usage::default();
    let usage = usage.unwrap_or(&empty);
    let ratio = |used: u64, want: u64, cap: Option<u64>| match cap {
        Some(cap) if cap > 0 => used.saturating_add(want).saturating_mul(1000) / cap,
        _ => 0,
    };
    let load_permille = ratio(usage.cpu_milli, request.demand.cpu_milli, robot.cpu_milli).max(ratio(
        usage.memory_bytes,
        request.demand.memory_bytes,
        robot.memory_bytes,
    ));
    Score {
        avoided: request.avoid == Some(robot.name.as_str()),
        affinity: -affinity_weight(request.affinity, &robot.labels),
        same_group: usage.per_group.get(request.group).copied().unwrap_or(0),
        load_permille,
        tasks: usage.tasks,
    }
}

/// How many robots that fit one decision scores at most (when the task
/// has no preferred affinity). Robots are looked at from just after the
/// one chosen last, so successive decisions walk the fleet and spread.
pub const SAMPLE: usize = 16;

/// Picks a robot for `request` from a fleet kept by name: the best of the
/// first [`SAMPLE`] robots that fit, looking from just after `cursor` (the
/// robot chosen last) and wrapping round; every robot when the task
/// prefers some (affinity). A task pinned to one robot looks only at it
/// (unless a topology anti-affinity needs to see where its group runs).
/// Ties go to the robot looked at first, so a fleet of equals is walked in
/// turn. When nothing fits, every robot was looked at, so the [`NoFit`] counts
/// are the fleet's.
pub fn choose_sampled<'r, 'u>(
    robots: &'r BTreeMap<String, RobotFacts>,
    cursor: &str,
    request: &Request<'_>,
    usage: impl Fn(&str) -> Option<&'u Usage>,
) -> Result<&'r RobotFacts, NoFit> {
    let topology = request.anti_affinity.is_some_and(|a| a.topology_key.is_some());
    if let (Some(only), false) = (request.robot, topology) {
        return choose(robots.get(only), request, usage);
    }
    let limit = if request.affinity.is_empty() {
        SAMPLE
    } else {
        usize::MAX
    };
    let after = robots.range::<str, _>((Bound::Excluded(cursor), Bound::Unbounded));
    let through = robots.range::<str, _>((Bound::Unbounded, Bound::Included(cursor)));
    let scan = Scan {
        limit,
        ties_by_name: false,
    };
    choose_among(after.chain(through).map(|(_, r)| r), request, usage, scan)
}

/// Most robots one decision leaves to tasks of higher priority before it
/// gives up for now.
pub const MAX_RESERVED: usize = 4;

/// Picks a robot as [`choose_sampled`] does, but leaves a robot that a
/// waiting task of higher priority fits to that task and tries the next
/// best, at most [`MAX_RESERVED`] times. `outranking(robot, already)` names
/// such a task, other than those `already` left a robot.
///
/// Returns the chosen robot's name (or why none fits) and the tasks robots
/// were left to, in the order they were found: the caller wakes them, and
/// when nothing was chosen, they wake the caller's task in turn.
pub fn choose_outranked<'u, T>(
    robots: &BTreeMap<String, RobotFacts>,
    cursor: &str,
    request: &Request<'_>,
    usage: impl Fn(&str) -> Option<&'u Usage>,
    outranking: impl Fn(&str, &[T]) -> Option<T>,
) -> (Result<String, NoFit>, Vec<T>) {
    let mut reserved: Vec<String> = Vec::new();
    let mut outranked_by = Vec::new();
    let outcome = loop {
        let attempt_request = Request {
            reserved: &reserved,
            ..request.clone()
        };
        let chosen = choose_sampled(robots, cursor, &attempt_request, &usage).map(|r| r.name.clone());
        let Ok(robot) = chosen else {
            break chosen;
        };
        match outranking(&robot, &outranked_by) {
            Some(higher) if reserved.len() < MAX_RESERVED => {
                reserved.push(robot);
                outranked_by.push(higher);
            }
            _ => break Ok(robot),
        }
    };
    (outcome, outranked_by)
}

/// Picks the best robot for `request`, or says why none fits.
///
/// `usage` looks up what is already assigned to a robot by name. Ties go to
/// the robot whose name sorts first, so decisions are reproducible.
pub fn choose<'r, 'u, I>(
    robots: I,
    request: &Request<'_>,
    usage: impl Fn(&str) -> Option<&'u Usage>,
) -> Result<&'r RobotFacts, NoFit>
where
    I: IntoIterator<Item = &'r RobotFacts>,
    I::IntoIter: Clone,
{
    let scan = Scan {
        limit: usize::MAX,
        ties_by_name: true,
    };
    choose_among(robots, request, usage, scan)
}

/// How far a choice looks, and how it breaks ties.
struct Scan {
    /// Stop once this many robots that fit have been scored.
    limit: usize,
    /// Ties go to the name that sorts first; otherwise to the robot looked
    /// at first.
    ties_by_name: bool,
}

fn choose_among<'r, 'u, I>(
    robots: I,
    request: &Request<'_>,
    usage: impl Fn(&str) -> Option<&'u Usage>,
    scan: Scan,
) -> Result<&'r RobotFacts, NoFit>
where
    I: IntoIterator<Item = &'r RobotFacts>,
    I::IntoIter: Clone,
{
    let mut scored = 0;
    let mut best: Option<(Score, &'r RobotFacts)> = None;
    let topology_key = request.anti_affinity.and_then(|a| a.topology_key.as_deref());
    let mut nofit = NoFit {
        topology_key: topology_key.map(Into::into),
        robot: request.robot.map(Into::into),
        driver: request.driver.into(),
        ..NoFit::default()
    };
    // One pass more, only for a topology anti-affinity: the values of the
    // label where a task of the group runs.
    let robots = robots.into_iter();
    let taken: HashSet<&str> = match topology_key {
        Some(key) => robots
            .clone()
            .filter(|r| {
                usage(&r.name)
                    .and_then(|u| u.per_group.get(request.group))
                    .is_some_and(|n| *n > 0)
            })
            .filter_map(|r| r.labels.get(key).map(String::as_str))
            .collect(),
        None => HashSet::new(),
    };
    let mut reported: std::collections::BTreeSet<&'r str> = std::collections::BTreeSet::new();
    let mut config: Option<Problem> = None;
    for robot in robots.clone() {
        if request.robot.is_some_and(|only| only != robot.name) {
            continue;
        }
        nofit.total += 1;
        reported.extend(robot.facts.keys().map(String::as_str));
        let used = usage(&robot.name);
        let checked = check(robot, request, used).and_then(|()| {
            let value = topology_key.and_then(|k| robot.labels.get(k));
            match value {
                Some(v) if taken.contains(v.as_str()) => Err(Rejection::TopologyTaken),
                _ => Ok(()),
            }
        });
        if let Err(why) = checked {
            *nofit.rejections.entry(why).or_default() += 1;
            if why == Rejection::Config && config.is_none() {
                config = request.config.and_then(|c| c.problem(&robot.name));
            }
            continue;
        }
        let s = score(robot, request, used);
        let better = match &best {
            None => true,
            Some((bs, br)) => match s.cmp(bs) {
                Ordering::Less => true,
                Ordering::Equal => scan.ties_by_name && robot.name < br.name,
                Ordering::Greater => false,
            },
        };
        if better {
            best = Some((s, robot));
        }
        scored += 1;
        if scored >= scan.limit {
            break;
        }
    }
    best.map(|(_, r)| r).ok_or_else(|| {
        let mut unreported: Vec<(String, Option<String>)> = Vec::new();
        for condition in request.when {
            let key = condition.key.as_str();
            if !reported.contains(key) && !unreported.iter().any(|(k, _)| k == key) {
                let near = closest(key, reported.iter().copied()).map(str::to_owned);
                unreported.push((key.to_owned(), near));
            }
        }
        // Only when no robot looked at matches the selector: then it is
        // what keeps the task waiting.
        let looked_at = robots.filter(|r| request.robot.is_none_or(|only| only == r.name));
        let unmatched = match request.selector {
            Some(selector)
                if nofit.rejections.contains_key(&Rejection::Selector)
                    && !looked_at.clone().any(|r| selector.matches(&r.labels)) =>
            {
                selector_hints(selector, looked_at.map(|r| &r.labels))
            }
            _ => Vec::new(),
        };
        let hints =
            (!unmatched.is_empty() || config.is_some()).then(|| Box::new(Hints { unmatched, config }));
        NoFit {
            conditions: request.when.iter().map(ToString::to_string).collect(),
            unreported: unreported.into(),
            hints,
            ..nofit
        }
    })
}

#[cfg(test)]
pub(crate) mod tests;
