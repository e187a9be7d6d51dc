//! What the robot lets a task do, decided from the task's spec and the
//! agent's configuration alone (no lookups, so it runs on the supervisor's
//! thread), and the task uids handed out to exec tasks that name no user.
//!
//! Least privilege by default: `raw_exec` is off, nothing runs as root,
//! no named user or supplementary group is allowed, and an exec task that
//! names no user gets a uid of its own (like systemd's `DynamicUser`), so
//! that tasks can neither read each other's `/proc/<pid>/environ` nor
//! signal each other.

use std::collections::HashSet;
use std::ops::RangeInclusive;

use k8s4r_api::task::DRIVER_RAW_EXEC;
use k8s4r_api::{TaskPolicy, TaskReason, TaskTemplate};
use k8s4r_drivers::identity::RunAs;

/// The part of the agent's configuration about who tasks run as.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Policy {
    /// Offer the raw_exec driver.
    pub raw_exec: bool,
    /// Run tasks as root when they ask (`user: root`, or raw_exec under a
    /// root agent).
    pub allow_root: bool,
    /// Users a task may name (root aside).
    pub allowed_users: Vec<String>,
    /// Groups a task may name.
    pub allowed_groups: Vec<String>,
    /// The user of exec tasks that name none; None: a task uid of their own.
    pub default_user: Option<String>,
}

/// How the task is to run, once allowed.
#[derive(Clone, Debug, PartialEq, Eq)]
pub(crate) enum Plan {
    /// As this user (or the agent's own).
    Run(RunAs),
    /// As a task uid of its own, to be handed out.
    OwnUid,
}

/// Why a task may not run here.
#[derive(Clone, Debug, PartialEq, Eq)]
pub(crate) struct Refusal {
    pub reason: TaskReason,
    pub message: String,
}

impl Policy {
    /// What the robot reports about itself (the limits added by the caller).
    pub fn report(&self) -> TaskPolicy {
        TaskPolicy {
            allow_root: self.allow_root,
            allowed_users: self.allowed_users.clone(),
            allowed_groups: self.allowed_groups.clone(),
            ..TaskPolicy::default()
        }
    }

    /// Decides how `t` runs, for an agent that is root or not.
    pub(crate) fn decide(&self, t: &TaskTemplate, agent_is_root: bool) -> Result<Plan, Refusal> {
        let refuse = |message: String| Refusal {
            reason: TaskReason::NotPermitted,
            message,
        };
        let report = self.report();
        if t.driver == DRIVER_RAW_EXEC {
            if !self.raw_exec {
                return Err(refuse(
                    "the raw_exec driver is off on this robot (raw_exec = true in the agent's config turns it on)"
                        .to_owned(),
                ));
            }
            if t.user.is_some() {
                return Err(Refusal {
                    reason: TaskReason::InvalidSpec,
                    message:
                        "spec.user: raw_exec runs tasks as the agent's user; `user` is for the exec driver"
                            .to_owned(),
                });
            }
            if let Some(why) = report.refusal(None, &t.groups, agent_is_root) {
                let why = if agent_is_root && !self.allow_root {
                    format!("raw_exec runs tasks as the agent's user, root here: {why}")
                } else {
                    why
                };
                return Err(refuse(why));
            }
            return Ok(Plan::Run(RunAs::Agent));
        }
        let (plan, root) = match (&t.user, &self.default_user) {
            (Some(user), _) => (Plan::Run(RunAs::Named(user.clone())), user == "root"),
            (None, Some(default)) => (Plan::Run(RunAs::Named(default.clone())), default == "root"),
            (None, None) if agent_is_root => (Plan::OwnUid, false),
            (None, None) => (Plan::Run(RunAs::Agent), false),
        };
        match report.refusal(t.user.as_deref(), &t.groups, root) {
            Some(why) => Err(refuse(why)),
            None => Ok(plan),
        }
    }
}

/// The uids exec tasks get when they name no user: handed out in turn
/// across the range, so that a uid comes back only after all the others
/// were used; never one a user of the robot has, nor one still in use.
#[derive(Debug)]
pub(crate) struct TaskUids {
    range: RangeInclusive<u32>,
    next: u32,
    in_use: HashSet<u32>,
    /// Uids of the robot's users (from /etc/passwd) or of processes the
    /// supervisor could not kill: never handed out.
    barred: HashSet<u32>,
}

impl TaskUids {
    /// Uids from `range`, except `barred`.
    pub(crate) fn new(range: RangeInclusive<u32>, barred: HashSet<u32>) -> Self {
        TaskUids {
            next: *range.start(),
            range,
            in_use: HashSet::new(),
            barred,
        }
    }

    /// The rotation goes on from `next` (kept in the state directory
    /// across agent restarts), when it is in the range.
    pub(crate) fn starting_at(mut self, next: Option<u32>) -> Self {
        if let Some(next) = next.filter(|n| self.range.contains(n)) {
            self.next = next;
        }
        self
    }

    /// Where the rotation goes on from: the uid tried next.
    pub(crate) fn position(&self) -> u32 {
        self.next
    }

    /// The next free uid, or None when every one is taken.
    pub(crate) fn take(&mut self) -> Option<u32> {
        let (first, last) = (*self.range.start(), *self.range.end());
        let size = u64::from(last - first) + 1;
        for _ in 0..size {
            let uid = self.next;
            self.next = if uid >= last { first } else { uid + 1 };
            if !self.in_use.contains(&uid) && !self.barred.contains(&uid) {
                self.in_use.insert(uid);
                return Some(uid);
            }
        }
        None
    }

    /// `uid` if it is free (a task's own from the previous run); false if
    /// it is not.
    pub(crate) fn take_exact(&mut self, uid: u32) -> bool {
        let free = self.range.contains(&uid) && !self.in_use.contains(&uid) && !self.barred.contains(&uid);
        if free {
            self.in_use.insert(uid);
        }
        free
    }

    /// Gives a uid back once nothing runs as it any more.
    pub(crate) fn give_back(&mut self, uid: u32) {
        self.in_use.remove(&uid);
    }

    /// Never hands `uid` out again (something running as it survived).
    pub(crate) fn bar(&mut self, uid: u32) {
        self.in_use.remove(&uid);
        self.barred.insert(uid);
    }
}

/// Uids of /etc/passwd in `range`: a task must never share one with a
/// user of the robot.
pub(crate) fn passwd_uids(range: &RangeInclusive<u32>) -> HashSet<u32> {
    let Ok(text) = std::fs::read_to_string("/etc/passwd") else {
        return HashSet::new();
    };
    text.lines()
        .filter_map(|line| line.split(':').nth(2)?.parse::<u32>().ok())
        .filter(|uid| range.contains(uid))
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    fn exec(user: Option<&str>, groups: &[&str]) -> TaskTemplate {
        TaskTemplate {
            driver: "exec".into(),
            command: "true".into(),
            user: user.map(Into::into),
            groups: groups.iter().map(|g| (*g).to_owned()).collect(),
            ..TaskTemplate::default()
        }
    }

    fn raw() -> TaskTemplate {
        TaskTemplate {
            driver: "raw_exec".into(),
            ..exec(None, &[])
        }
    }

    fn locked() -> Policy {
        Policy {
            raw_exec: false,
            allow_root: false,
            allowed_users: vec![],
            allowed_groups: vec![],
            default_user: None,
        }
    }

    fn refused(r: Result<Plan, Refusal>) -> Refusal {
        r.expect_err("refused")
    }

    #[test]
    fn by_default_exec_tasks_get_a_uid_of_their_own_and_nothing_else() {
        let p = locked();
        assert_eq!(p.decide(&exec(None, &[]), true), Ok(Plan::OwnUid));
        assert_eq!(p.decide(&exec(None, &[]), false), Ok(Plan::Run(RunAs::Agent)));
        let r = refused(p.decide(&raw(), true));
        assert_eq!(r.reason, TaskReason::NotPermitted);
        assert!(r.message.contains("raw_exec driver is off"), "{}", r.message);
        let r = refused(p.decide(&exec(Some("root"), &[]), true));
        assert!(r.message.contains("allow_root = false"), "{}", r.message);
        let r = refused(p.decide(&exec(Some("postgres"), &[]), true));
        assert!(r.message.contains("\"postgres\""), "{}", r.message);
        let r = refused(p.decide(&exec(None, &["dialout"]), true));
        assert!(r.message.contains("dialout"), "{}", r.message);
    }

    #[test]
    fn the_robot_opens_what_its_config_says() {
        let p = Policy {
            raw_exec: true,
            allowed_users: vec!["robot".into()],
            allowed_groups: vec!["dialout".into(), "video".into()],
            ..locked()
        };
        assert_eq!(
            p.decide(&exec(Some("robot"), &["video"]), true),
            Ok(Plan::Run(RunAs::Named("robot".into())))
        );
        assert_eq!(p.decide(&exec(None, &["dialout"]), true), Ok(Plan::OwnUid));
        // raw_exec under a root agent is root: that needs allow_root too.
        let r = refused(p.decide(&raw(), true));
        assert!(r.message.contains("root here"), "{}", r.message);
        assert_eq!(p.decide(&raw(), false), Ok(Plan::Run(RunAs::Agent)));
        let root = Policy {
            allow_root: true,
            ..p.clone()
        };
        assert_eq!(root.decide(&raw(), true), Ok(Plan::Run(RunAs::Agent)));
        assert_eq!(
            root.decide(&exec(Some("root"), &[]), true),
            Ok(Plan::Run(RunAs::Named("root".into())))
        );
        let r = refused(root.decide(
            &TaskTemplate {
                user: Some("robot".into()),
                ..raw()
            },
            true,
        ));
        assert_eq!(r.reason, TaskReason::InvalidSpec);
    }

    #[test]
    fn a_configured_default_user_replaces_the_task_uid() {
        let p = Policy {
            default_user: Some("nobody".into()),
            ..locked()
        };
        assert_eq!(
            p.decide(&exec(None, &[]), true),
            Ok(Plan::Run(RunAs::Named("nobody".into())))
        );
        let root_default = Policy {
            default_user: Some("root".into()),
            ..locked()
        };
        assert!(root_default.decide(&exec(None, &[]), true).is_err());
    }

    #[test]
    fn task_uids_go_round_skip_what_is_taken_and_run_out() {
        let mut uids = TaskUids::new(10..=13, HashSet::from([11])).starting_at(Some(99));
        assert_eq!(uids.take(), Some(10));
        assert_eq!(uids.take(), Some(12));
        uids.give_back(10);
        assert_eq!(
            uids.take(),
            Some(13),
            "the next in turn, not the one just given back"
        );
        assert_eq!(uids.take(), Some(10));
        assert_eq!(uids.take(), None);
        assert_eq!(uids.in_use.len(), 3);
        uids.bar(12);
        assert_eq!(uids.take(), None, "a barred uid never comes back");
        uids.give_back(13);
        assert_eq!(uids.take(), Some(13));
    }

    #[test]
    fn the_rotation_goes_on_where_the_last_run_left_it() {
        let mut first = TaskUids::new(10..=13, HashSet::new());
        assert_eq!(first.take(), Some(10));
        assert_eq!(first.take(), Some(11));
        // The agent restarts; the position was kept.
        let mut second = TaskUids::new(10..=13, HashSet::new()).starting_at(Some(first.position()));
        assert_eq!(second.take(), Some(12), "not 10 again");
        assert_eq!(second.take(), Some(13));
        assert_eq!(second.take(), Some(10));
    }
}
