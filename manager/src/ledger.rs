//! What is assigned to which robot, kept in memory.
//!
//! Robot `status.allocated` lags (it is written after the fact, coalesced),
//! and many tasks are scheduled at once, so the scheduler cannot read
//! allocation from the API. The ledger is the scheduler's own record: a
//! decision reserves its robot before the Task is patched, and every Task
//! the watch delivers corrects the record. Attempt numbers order the two:
//! an observation older than a reservation does not undo it.

use std::collections::{BTreeSet, HashMap};

use crate::scheduler::{Demand, Usage};

/// Where one task's current attempt is placed.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Placement {
    /// The robot.
    pub robot: String,
    /// The spread group (namespace/taskgroup).
    pub group: String,
    /// What the task requests.
    pub demand: Demand,
}

#[derive(Clone, Debug)]
struct Entry {
    attempt: u32,
    placement: Placement,
    /// Placed before the Task was created: its `spec.targetRobot` names the
    /// robot, its status does not yet.
    owed: bool,
}

/// Assignments per task and usage per robot.
#[derive(Debug, Default)]
pub struct Ledger {
    by_task: HashMap<String, Entry>,
    by_robot: HashMap<String, (Usage, BTreeSet<String>)>,
}

impl Ledger {
    /// Records what a watch event shows about task `key`: its attempt and,
    /// when the attempt occupies a robot (dispatching or running), where.
    pub fn observe(&mut self, key: &str, attempt: u32, placement: Option<Placement>) {
        if let Some(existing) = self.by_task.get(key) {
            if attempt < existing.attempt {
                // A reservation for a newer attempt the watch has not shown yet.
                return;
            }
            if placement.as_ref() == Some(&existing.placement) && attempt == existing.attempt {
                // The Task's status shows the placement: nothing is owed.
                if let Some(entry) = self.by_task.get_mut(key) {
                    entry.owed = false;
                }
                return;
            }
        }
        self.remove(key);
        if let Some(placement) = placement {
            self.insert(key, attempt, placement);
        }
    }

    /// Reserves a robot for `attempt` of task `key` before the Task says so.
    pub fn reserve(&mut self, key: &str, attempt: u32, placement: Placement) {
        self.remove(key);
        self.insert(key, attempt, placement);
    }

    /// Marks the reservation of task `key` as made before the Task existed:
    /// the Task is created naming its robot, and its status is still to be
    /// written ([`Ledger::owed`]).
    pub fn owe(&mut self, key: &str) {
        if let Some(entry) = self.by_task.get_mut(key) {
            entry.owed = true;
        }
    }

    /// The attempt and robot of task `key`'s reservation if it was made
    /// before the Task existed and its status does not show it yet.
    pub fn owed(&self, key: &str) -> Option<(u32, &str)> {
        self.by_task
            .get(key)
            .filter(|e| e.owed)
            .map(|e| (e.attempt, e.placement.robot.as_str()))
    }

    /// Marks the owed reservation of task `key` as being written: the Task
    /// controller has taken it to write the status.
    pub fn settle(&mut self, key: &str) {
        if let Some(entry) = self.by_task.get_mut(key) {
            entry.owed = false;
        }
    }

    /// Takes back a reservation made before task `key` existed, once the
    /// Task has moved on without it (cancelled or failed while pending).
    pub fn drop_owed(&mut self, key: &str) {
        if self.owed(key).is_some() {
            self.remove(key);
        }
    }

    /// Takes back a reservation whose patch failed (only that one: not an
    /// entry the watch has since confirmed elsewhere).
    pub fn unreserve(&mut self, key: &str, attempt: u32, robot: &str) {
        if self
            .by_task
            .get(key)
            .is_some_and(|e| e.attempt == attempt && e.placement.robot == robot)
        {
            self.remove(key);
        }
    }

    /// The attempt the ledger knows task `key` to be at, if it is placed.
    pub fn attempt_of(&self, key: &str) -> Option<u32> {
        self.by_task.get(key).map(|e| e.attempt)
    }

    /// Forgets a task (it was deleted).
    pub fn remove(&mut self, key: &str) {
        let Some(entry) = self.by_task.remove(key) else {
            return;
        };
        let robot = &entry.placement.robot;
        if let Some((usage, tasks)) = self.by_robot.get_mut(robot) {
            usage.cpu_milli = usage.cpu_milli.saturating_sub(entry.placement.demand.cpu_milli);
            usage.memory_bytes = usage
                .memory_bytes
                .saturating_sub(entry.placement.demand.memory_bytes);
            usage.disk_bytes = usage.disk_bytes.saturating_sub(entry.placement.demand.disk_bytes);
            usage.tasks = usage.tasks.saturating_sub(1);
            if let Some(n) = usage.per_group.get_mut(&entry.placement.group) {
                *n = n.saturating_sub(1);
                if *n == 0 {
                    usage.per_group.remove(&entry.placement.group);
                }
            }
            tasks.remove(key);
            if tasks.is_empty() {
                self.by_robot.remove(robot);
            }
        }
    }

    fn insert(&mut self, key: &str, attempt: u32, placement: Placement) {
        let (usage, tasks) = self.by_robot.entry(placement.robot.clone()).or_default();
        usage.cpu_milli += placement.demand.cpu_milli;
        usage.memory_bytes += placement.demand.memory_bytes;
        usage.disk_bytes = usage.disk_bytes.saturating_add(placement.demand.disk_bytes);
        usage.tasks += 1;
        *usage.per_group.entry(placement.group.clone()).or_default() += 1;
        tasks.insert(key.to_owned());
        self.by_task.insert(
            key.to_owned(),
            Entry {
                attempt,
                placement,
                owed: false,
            },
        );
    }

    /// What is assigned to `robot`.
    pub fn usage(&self, robot: &str) -> Option<&Usage> {
        self.by_robot.get(robot).map(|(u, _)| u)
    }

    /// The tasks (namespace/name) assigned to `robot`.
    pub fn tasks_on(&self, robot: &str) -> Vec<String> {
        self.by_robot
            .get(robot)
            .map(|(_, t)| t.iter().cloned().collect())
            .unwrap_or_default()
    }

    /// The robot task `key` is assigned to, if any.
    pub fn robot_of(&self, key: &str) -> Option<&str> {
        self.by_task.get(key).map(|e| e.placement.robot.as_str())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn on(robot: &str, cpu: u64) -> Placement {
        Placement {
            robot: robot.into(),
            group: "ns/g".into(),
            demand: Demand {
                cpu_milli: cpu,
                ..Demand::default()
            },
        }
    }

    #[test]
    fn observations_add_and_release_usage() {
        let mut l = Ledger::default();
        l.observe("ns/t1", 1, Some(on("a", 500)));
        l.observe("ns/t2", 1, Some(on("a", 250)));
        let u = l.usage("a").unwrap();
        assert_eq!((u.cpu_milli, u.tasks, u.per_group["ns/g"]), (750, 2, 2));
        l.observe("ns/t1", 1, None);
        assert_eq!(l.usage("a").unwrap().cpu_milli, 250);
        l.remove("ns/t2");
        assert!(l.usage("a").is_none());
        assert!(l.tasks_on("a").is_empty());
    }

    #[test]
    fn a_reservation_survives_older_observations() {
        let mut l = Ledger::default();
        l.reserve("ns/t", 2, on("b", 100));
        l.observe("ns/t", 1, None);
        assert_eq!(l.robot_of("ns/t"), Some("b"), "the watch still shows attempt 1");
        l.observe("ns/t", 2, Some(on("b", 100)));
        assert_eq!(l.usage("b").unwrap().tasks, 1, "no double count");
        l.observe("ns/t", 2, None);
        assert_eq!(l.robot_of("ns/t"), None, "attempt 2 finished");
    }

    #[test]
    fn a_failed_patch_takes_its_reservation_back() {
        let mut l = Ledger::default();
        l.observe("ns/t", 1, Some(on("a", 100)));
        l.unreserve("ns/t", 2, "a");
        assert_eq!(l.robot_of("ns/t"), Some("a"), "not that attempt's reservation");
        l.reserve("ns/t", 2, on("b", 100));
        l.unreserve("ns/t", 2, "a");
        assert_eq!(l.robot_of("ns/t"), Some("b"), "not that robot's reservation");
        assert_eq!(l.attempt_of("ns/t"), Some(2));
        l.unreserve("ns/t", 2, "b");
        assert_eq!(l.robot_of("ns/t"), None);
        assert!(l.usage("a").is_none() && l.usage("b").is_none());
    }

    #[test]
    fn moving_a_task_moves_its_usage() {
        let mut l = Ledger::default();
        l.observe("ns/t", 1, Some(on("a", 100)));
        l.observe("ns/t", 2, Some(on("b", 100)));
        assert!(l.usage("a").is_none());
        assert_eq!(l.tasks_on("b"), vec!["ns/t".to_string()]);
    }

    #[test]
    fn a_placement_made_before_creation_is_owed_until_the_status_shows_it() {
        let mut l = Ledger::default();
        l.reserve("ns/t", 1, on("a", 100));
        l.owe("ns/t");
        l.observe("ns/t", 0, None);
        assert_eq!(l.owed("ns/t"), Some((1, "a")), "created, pending: still owed");
        l.observe("ns/t", 1, Some(on("a", 100)));
        assert_eq!(l.owed("ns/t"), None, "the status shows it");
        assert_eq!(l.robot_of("ns/t"), Some("a"));
        l.drop_owed("ns/t");
        assert_eq!(l.robot_of("ns/t"), Some("a"), "not owed: kept");

        l.reserve("ns/v", 1, on("c", 100));
        l.owe("ns/v");
        l.settle("ns/v");
        assert_eq!(l.owed("ns/v"), None, "handed out");
        assert_eq!(l.attempt_of("ns/v"), Some(1), "still reserved");

        l.reserve("ns/u", 1, on("b", 100));
        l.owe("ns/u");
        l.drop_owed("ns/u");
        assert!(l.usage("b").is_none(), "cancelled while pending: room given back");
    }
}
