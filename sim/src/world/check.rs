//! The checker that reads a simulated run's history: what a user would
//! check, from what physically happened (processes started and ended) and
//! what the robots were told.

use std::collections::BTreeMap;
use std::fmt;

use k8s4r_api::{DisconnectPolicy, Reconcile, TaskState};

use super::cluster::Cluster;
use super::history::{Entry, What};
use super::Ms;

/// Which rule a violation breaks.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Kind {
    /// Two attempts of one Task ran at once.
    Overlap,
    /// One (task, attempt) started a process twice.
    Rerun,
    /// The cluster failed an attempt whose process was running (its robot
    /// had not fenced it).
    ReplacedWhileRunning,
    /// A completion the robot was told was recorded is not in the cluster.
    LostCompletion,
    /// Under `reconcile: keepOriginal`, an attempt was placed after a robot
    /// was told an earlier one's completion was recorded: the task would
    /// run again after it was done.
    PlacedAfterCompletion,
    /// A Task was not over by the end.
    Unfinished,
}

/// A broken rule, about one Task.
#[derive(Clone, Debug)]
pub struct Violation {
    pub kind: Kind,
    pub task: String,
    /// The attempt it is about, when it is about one.
    pub attempt: Option<u32>,
    pub at: Ms,
    pub detail: String,
}

impl fmt::Display for Violation {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(
            f,
            "{:?} of {} at {:.3}s: {}",
            self.kind,
            self.task,
            self.at as f64 / 1000.0,
            self.detail
        )
    }
}

/// A process of `uid`'s `attempt` starts on `robot` at `at`: the rules
/// it may break against the runs before it, which it joins.
fn started(list: &mut Vec<Run>, robot: usize, uid: &str, attempt: u32, at: Ms) -> Vec<Violation> {
    let mut out = Vec::new();
    let violation = |kind, detail| Violation {
        kind,
        task: uid.to_owned(),
        attempt: Some(attempt),
        at,
        detail,
    };
    if list.iter().any(|r| r.attempt == attempt) {
        out.push(violation(
            Kind::Rerun,
            format!("attempt {attempt} started again on rb{robot}"),
        ));
    }
    if let Some(other) = list.iter().find(|r| r.end.is_none()) {
        let detail = format!(
            "attempt {attempt} started on rb{robot} while attempt {} runs on rb{}",
            other.attempt, other.robot
        );
        out.push(violation(Kind::Overlap, detail));
    }
    list.push(Run {
        robot,
        attempt,
        start: at,
        end: None,
    });
    out
}

struct Run {
    robot: usize,
    attempt: u32,
    start: Ms,
    end: Option<Ms>,
}

/// Checks a run's history against the cluster's final state.
pub fn check(history: &[Entry], cluster: &Cluster, end: Ms) -> Vec<Violation> {
    let mut out = Vec::new();
    let mut runs: BTreeMap<String, Vec<Run>> = BTreeMap::new();
    let mut recorded: Vec<(Ms, String, u32)> = Vec::new();
    for entry in history {
        match &entry.what {
            What::Start { robot, uid, attempt } => {
                let list = runs.entry(uid.clone()).or_default();
                out.extend(started(list, *robot, uid, *attempt, entry.at));
            }
            What::Placed { uid, attempt, robot } => {
                // Under keepReplacement the replacement, and its retries,
                // go on whatever the original did (its completion is kept
                // in attempts[]).
                let found = recorded.iter().find(|(_, u, a)| u == uid && a < attempt);
                if let Some((at, _, done)) = found.filter(|_| keeps_original(cluster, uid)) {
                    out.push(Violation {
                        kind: Kind::PlacedAfterCompletion,
                        task: uid.clone(),
                        attempt: Some(*attempt),
                        at: entry.at,
                        detail: format!(
                            "attempt {attempt} placed on rb{robot} after a robot was told at {:.3}s that attempt {done}'s completion was recorded",
                            *at as f64 / 1000.0
                        ),
                    });
                }
            }
            What::Exit { uid, attempt, .. } => {
                if let Some(run) = runs.get_mut(uid).and_then(|l| {
                    l.iter_mut()
                        .rev()
                        .find(|r| r.attempt == *attempt && r.end.is_none())
                }) {
                    run.end = Some(entry.at);
                }
            }
            What::Failed { uid, attempt, reason } => {
                let running = runs
                    .get(uid)
                    .and_then(|l| l.iter().find(|r| r.attempt == *attempt && r.end.is_none()));
                if let Some(run) = running {
                    out.push(Violation {
                        kind: Kind::ReplacedWhileRunning,
                        task: uid.clone(),
                        attempt: Some(*attempt),
                        at: entry.at,
                        detail: format!(
                            "the cluster failed attempt {attempt} ({reason:?}) while it ran on rb{} since {:.3}s",
                            run.robot,
                            run.start as f64 / 1000.0
                        ),
                    });
                }
            }
            What::Recorded {
                uid,
                attempt,
                state: TaskState::Completed,
                ..
            } => {
                recorded.push((entry.at, uid.clone(), *attempt));
            }
            _ => {}
        }
    }
    let lost = lost_completions(&recorded, &runs, &out, cluster);
    out.extend(lost);
    out.extend(unfinished(cluster, end));
    out
}

/// Completions a robot was told were recorded that the Task does not show.
/// An attempt that ran twice is reported once, as a rerun (one the cluster
/// replaced while it ran, as that): `found_before` holds those.
fn lost_completions(
    recorded: &[(Ms, String, u32)],
    runs: &BTreeMap<String, Vec<Run>>,
    found_before: &[Violation],
    cluster: &Cluster,
) -> Vec<Violation> {
    let mut found = Vec::new();
    for (at, uid, attempt) in recorded {
        let starts = runs
            .get(uid)
            .map_or(0, |l| l.iter().filter(|r| r.attempt == *attempt).count());
        let replaced = found_before.iter().any(|v: &Violation| {
            v.kind == Kind::ReplacedWhileRunning && v.task == *uid && v.attempt == Some(*attempt)
        });
        if starts == 1 && !replaced && !shows_completed(cluster, uid, *attempt) {
            found.push(Violation {
                kind: Kind::LostCompletion,
                task: uid.clone(),
                attempt: Some(*attempt),
                at: *at,
                detail: format!("the robot was told attempt {attempt}'s completion was recorded; the Task does not show it"),
            });
        }
    }
    found
}

/// The Tasks not over at the end.
fn unfinished(cluster: &Cluster, end: Ms) -> impl Iterator<Item = Violation> + '_ {
    cluster
        .tasks()
        .iter()
        .filter(|(_, task)| !cluster.settled(task))
        .map(move |(uid, task)| {
            let state = task.status.as_ref().and_then(|s| s.state);
            Violation {
                kind: Kind::Unfinished,
                task: uid.clone(),
                attempt: None,
                at: end,
                detail: format!("still {} at the end", state.map_or("new", TaskState::as_str)),
            }
        })
}

fn keeps_original(cluster: &Cluster, uid: &str) -> bool {
    cluster
        .task(uid)
        .is_some_and(|t| DisconnectPolicy::reconcile(t.spec.disconnect.as_ref()) == Reconcile::KeepOriginal)
}

fn shows_completed(cluster: &Cluster, uid: &str, attempt: u32) -> bool {
    let Some(status) = cluster.task(uid).and_then(|t| t.status.as_ref()) else {
        return false;
    };
    let current = status.attempt == attempt && status.state == Some(TaskState::Completed);
    let kept = status
        .attempts
        .iter()
        .any(|a| a.attempt == attempt && a.state == TaskState::Completed);
    let late = status.state == Some(TaskState::Completed)
        && status
            .message
            .as_deref()
            .is_some_and(|m| m.contains(&format!("attempt {attempt} completed")));
    current || kept || late
}
