//! everyRobot groups: one Task per matching robot, rolled out at most
//! `maxParallel` robots at a time and stopped once more than `maxFailed`
//! failed. Plain data in, a plan out; the TaskGroup controller carries it
//! out.

use std::collections::{BTreeMap, BTreeSet};

use k8s4r_api::{CountOrPercent, Rollout, TaskState};

/// How many robots' states the group's status lists.
pub const PER_ROBOT_SHOWN: usize = 100;

/// A Task the group already has, for one robot.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Existing {
    /// Its name.
    pub task: String,
    /// Its effective state (a failure to be retried counts as pending).
    pub state: TaskState,
    /// It was ever placed on its robot (attempt > 0).
    pub placed: bool,
    /// It waits for a robot that is not online now: it holds no place
    /// under `maxParallel`.
    pub parked: bool,
}

/// What the group's controller should do.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct Plan {
    /// Robots to create a Task for now, by name.
    pub create: Vec<String>,
    /// Tasks to delete: waiting for a robot that is gone, or never placed
    /// and for a robot the group no longer matches.
    pub delete: Vec<String>,
    /// Robots still to be reached (not counting `create`).
    pub waiting: i32,
    /// The Tasks the group should have: kept, created and still to come.
    pub desired: i32,
    /// The status's rollout line.
    pub rollout: Rollout,
}

/// Plans one reconcile of an everyRobot group.
///
/// `matched` are the robots the group's task can run on; `known` every
/// Robot there is; `existing` the group's Tasks by robot. A group that
/// already completed (`finished`) reaches no new robot: a robot
/// registering after the rollout completed does not reopen it.
pub fn plan(
    matched: &BTreeSet<String>,
    known: &BTreeSet<String>,
    existing: &BTreeMap<String, Existing>,
    max_parallel: Option<i32>,
    max_failed: Option<&CountOrPercent>,
    finished: bool,
) -> Plan {
    let mut delete = Vec::new();
    let mut kept = BTreeMap::new();
    let mut parked = BTreeSet::new();
    for (robot, task) in existing {
        let gone = !known.contains(robot);
        let unwanted = !matched.contains(robot) && !task.placed;
        if task.state == TaskState::Pending && (gone || unwanted) {
            delete.push(task.task.clone());
        } else {
            kept.insert(robot.clone(), task.state);
            if task.parked {
                parked.insert(robot.clone());
            }
        }
    }
    let unreached: Vec<&String> = matched.iter().filter(|r| !kept.contains_key(*r)).collect();
    let robots = i32::try_from(kept.len() + unreached.len()).unwrap_or(i32::MAX);
    let failed = kept.values().filter(|s| **s == TaskState::Failed).count();
    let active = kept
        .iter()
        .filter(|(r, s)| !s.is_terminal() && !parked.contains(*r))
        .count();
    let stopped = stopped(max_failed, robots, failed);
    let room = match max_parallel {
        Some(max) => usize::try_from(max).unwrap_or(0).saturating_sub(active),
        None => usize::MAX,
    };
    let create: Vec<String> = if stopped.is_some() || finished {
        Vec::new()
    } else {
        unreached.iter().take(room).map(|r| (*r).clone()).collect()
    };
    let waiting = if stopped.is_some() || finished {
        0
    } else {
        unreached.len() - create.len()
    };
    let waiting = i32::try_from(waiting).unwrap_or(i32::MAX);
    let started = i32::try_from(kept.len() + create.len()).unwrap_or(i32::MAX);
    let mut per_robot: BTreeMap<String, TaskState> = kept.clone();
    per_robot.extend(create.iter().map(|r| (r.clone(), TaskState::Pending)));
    let per_robot = per_robot.into_iter().take(PER_ROBOT_SHOWN).collect();
    Plan {
        create,
        delete,
        waiting,
        desired: started + waiting,
        rollout: Rollout {
            robots,
            started,
            waiting,
            per_robot,
            stopped: stopped.or_else(|| {
                (finished && !unreached.is_empty()).then(|| {
                    format!(
                        "finished before {} robots that came later were reached",
                        unreached.len()
                    )
                })
            }),
        },
    }
}

/// Why the rollout stops: more of its `robots` `failed` than `maxFailed`
/// allows.
fn stopped(max_failed: Option<&CountOrPercent>, robots: i32, failed: usize) -> Option<String> {
    let limit = max_failed.and_then(|m| m.of(robots))?;
    if i32::try_from(failed).unwrap_or(i32::MAX) <= limit {
        return None;
    }
    let allowed = match max_failed {
        Some(CountOrPercent::Percent(p)) => p.clone(),
        Some(CountOrPercent::Count(n)) => n.to_string(),
        None => String::new(),
    };
    Some(format!(
        "rollout stopped: {failed} robots failed, more than maxFailed {allowed} allows ({limit})"
    ))
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Every robot the tests name exists, but `gone`.
    fn known() -> BTreeSet<String> {
        robots(&["a", "b", "c", "d", "e", "late"])
    }

    fn robots(names: &[&str]) -> BTreeSet<String> {
        names.iter().map(|n| (*n).to_owned()).collect()
    }

    fn tasks(states: &[(&str, TaskState)]) -> BTreeMap<String, Existing> {
        states
            .iter()
            .map(|(r, s)| {
                (
                    (*r).to_owned(),
                    Existing {
                        task: format!("g-{r}"),
                        state: *s,
                        placed: *s != TaskState::Pending,
                        parked: false,
                    },
                )
            })
            .collect()
    }

    #[test]
    fn every_matching_robot_gets_a_task() {
        let p = plan(
            &robots(&["a", "b", "c"]),
            &known(),
            &tasks(&[("a", TaskState::Running)]),
            None,
            None,
            false,
        );
        assert_eq!(p.create, vec!["b", "c"]);
        assert_eq!((p.waiting, p.desired), (0, 3));
        assert_eq!(p.rollout.robots, 3);
        assert_eq!(p.rollout.per_robot.len(), 3);
    }

    #[test]
    fn max_parallel_bounds_the_robots_running_at_once() {
        let all = robots(&["a", "b", "c", "d", "e"]);
        let p = plan(&all, &known(), &tasks(&[]), Some(2), None, false);
        assert_eq!(p.create, vec!["a", "b"]);
        assert_eq!((p.waiting, p.desired), (3, 5));
        let p = plan(
            &all,
            &known(),
            &tasks(&[("a", TaskState::Completed), ("b", TaskState::Running)]),
            Some(2),
            None,
            false,
        );
        assert_eq!(p.create, vec!["c"], "one slot freed");
        assert_eq!(p.waiting, 2);
    }

    #[test]
    fn max_failed_stops_the_rollout() {
        let all = robots(&["a", "b", "c", "d"]);
        let one = CountOrPercent::Count(1);
        let two_failed = tasks(&[("a", TaskState::Failed), ("b", TaskState::Failed)]);
        let p = plan(&all, &known(), &two_failed, Some(2), Some(&one), false);
        assert!(p.create.is_empty());
        assert_eq!((p.waiting, p.desired), (0, 2));
        assert_eq!(
            p.rollout.stopped.as_deref(),
            Some("rollout stopped: 2 robots failed, more than maxFailed 1 allows (1)")
        );
        let p = plan(
            &all,
            &known(),
            &tasks(&[("a", TaskState::Failed)]),
            Some(2),
            Some(&one),
            false,
        );
        assert_eq!(p.create, vec!["b", "c"], "one failure is tolerated");
        let quarter = CountOrPercent::Percent("25%".into());
        let p = plan(&all, &known(), &two_failed, None, Some(&quarter), false);
        assert!(p.rollout.stopped.is_some(), "25% of 4 is 1");
    }

    #[test]
    fn a_robot_that_stops_matching_loses_only_an_unplaced_task() {
        let existing = {
            let mut t = tasks(&[("a", TaskState::Running)]);
            t.extend(tasks(&[("gone", TaskState::Pending)]));
            t
        };
        let p = plan(&robots(&["b"]), &known(), &existing, None, None, false);
        assert_eq!(p.delete, vec!["g-gone"]);
        assert_eq!(p.create, vec!["b"]);
        assert_eq!(p.desired, 2, "a's running task is kept");
    }

    #[test]
    fn a_robot_that_is_gone_or_offline_does_not_hold_the_rollout() {
        let mut existing = tasks(&[("a", TaskState::Running)]);
        existing.insert(
            "gone".into(),
            Existing {
                task: "g-gone".into(),
                state: TaskState::Pending,
                placed: true,
                parked: true,
            },
        );
        existing.insert(
            "b".into(),
            Existing {
                task: "g-b".into(),
                state: TaskState::Pending,
                placed: false,
                parked: true,
            },
        );
        let p = plan(
            &robots(&["a", "b", "c", "d"]),
            &known(),
            &existing,
            Some(2),
            None,
            false,
        );
        assert_eq!(p.delete, vec!["g-gone"], "its robot was deleted");
        assert_eq!(p.create, vec!["c"], "b waits for its robot outside maxParallel");
        assert_eq!(p.waiting, 1);
    }

    #[test]
    fn a_finished_group_reaches_no_new_robot() {
        let p = plan(
            &robots(&["a", "late"]),
            &known(),
            &tasks(&[("a", TaskState::Completed)]),
            None,
            None,
            true,
        );
        assert!(p.create.is_empty());
        assert_eq!(p.desired, 1);
        assert!(p.rollout.stopped.unwrap().contains("1 robots that came later"));
    }
}
