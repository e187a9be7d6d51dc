//! Finding every process of a task when there is no cgroup to ask.
//!
//! A task's processes may leave its process group (`setpgid`), its
//! session (`setsid`) and its parent (double fork: the agent, a child
//! subreaper, inherits the orphan). A [`Lineage`] remembers what it has
//! seen of a task (pids, process groups, sessions) and finds the rest in a
//! snapshot of /proc:
//!
//! - processes in a group or session the task's processes were seen in;
//! - children of the task's processes, to any depth;
//! - processes running as the task's own uid (a task uid is one task's
//!   alone, and a process cannot give it up: `no_new_privs`);
//! - orphans the agent inherited whose environment names the task.
//!
//! Killing is then "signal every member, look again, until none is left".
//! A process that leaves everything behind (its own session, a cleared
//! environment, a shared user) before the agent ever sees it is out of
//! reach without cgroups; SECURITY.md says so.

use std::collections::{HashMap, HashSet};

use super::procfs::Stat;

/// What the supervisor knows of one task's processes.
#[derive(Clone, Debug)]
pub(crate) struct Lineage {
    /// Known processes, by pid, with their start time (a pid reused by
    /// another process is not the task's).
    pids: HashMap<i32, u64>,
    groups: HashSet<i32>,
    sessions: HashSet<i32>,
    /// A uid only this task runs as.
    own_uid: Option<u32>,
    /// `K8S4R_TASK_UID=..` and `K8S4R_TASK_ATTEMPT=..` as the task's
    /// environment has them.
    markers: [Vec<u8>; 2],
    /// Whether orphans are recognised by the markers.
    by_markers: bool,
}

impl Lineage {
    /// The lineage of a task whose leader `pid` (started at `start_time`)
    /// leads its own group and session.
    pub(crate) fn new(pid: i32, start_time: u64, own_uid: Option<u32>, uid: &str, attempt: u32) -> Self {
        Lineage {
            pids: HashMap::from([(pid, start_time)]),
            groups: HashSet::from([pid]),
            sessions: HashSet::from([pid]),
            own_uid,
            markers: [
                format!("{}={uid}", k8s4r_api::names::ENV_TASK_UID).into_bytes(),
                format!("{}={attempt}", k8s4r_api::names::ENV_TASK_ATTEMPT).into_bytes(),
            ],
            by_markers: true,
        }
    }

    /// Whether a process is known to be the task's, from what was seen so
    /// far (for reaping its zombies).
    pub(crate) fn knows(&self, pid: i32, stat: &Stat) -> bool {
        self.pids.get(&pid) == Some(&stat.start_time)
            || self.groups.contains(&stat.pgrp)
            || self.sessions.contains(&stat.session)
    }

    /// Forgets the task's uid and environment markers: the processes are
    /// then known by their groups, sessions and descendants only (a task
    /// restarting under the same identity must not be taken for the old
    /// run's leftovers).
    pub(crate) fn forget_identity(&mut self) {
        self.own_uid = None;
        self.by_markers = false;
    }

    /// The task's live processes in `procs` (a snapshot of /proc), learning
    /// every new one. `agent` is the agent's pid; `uid_of` and `environ_has`
    /// read /proc for the few processes the snapshot cannot place.
    pub(crate) fn members(
        &mut self,
        procs: &[(i32, Stat)],
        agent: i32,
        uid_of: impl Fn(i32) -> Option<u32>,
        environ_has: impl Fn(i32, &[u8]) -> bool,
    ) -> Vec<i32> {
        let mut found: HashSet<i32> = HashSet::new();
        // Each pass may add parents whose children the next pass finds.
        loop {
            let before = found.len();
            for (pid, stat) in procs {
                let pid = *pid;
                if pid <= 1 || pid == agent || found.contains(&pid) {
                    continue;
                }
                let known_parent = self.pids.contains_key(&stat.ppid) && stat.ppid != agent;
                let ours = self.knows(pid, stat)
                    || known_parent
                    || self.own_uid.is_some_and(|own| uid_of(pid) == Some(own))
                    || (self.by_markers
                        && stat.ppid == agent
                        && self.markers.iter().all(|m| environ_has(pid, m)));
                if ours {
                    found.insert(pid);
                    self.pids.insert(pid, stat.start_time);
                    self.groups.insert(stat.pgrp);
                    self.sessions.insert(stat.session);
                }
            }
            if found.len() == before {
                break;
            }
        }
        procs
            .iter()
            .filter(|(pid, stat)| found.contains(pid) && stat.is_live())
            .map(|(pid, _)| *pid)
            .collect()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const AGENT: i32 = 100;

    fn p(pid: i32, ppid: i32, pgrp: i32, session: i32) -> (i32, Stat) {
        (
            pid,
            Stat {
                state: 'S',
                ppid,
                pgrp,
                session,
                start_time: 1000 + pid as u64,
            },
        )
    }

    fn sorted(mut v: Vec<i32>) -> Vec<i32> {
        v.sort_unstable();
        v
    }

    fn lineage(own_uid: Option<u32>) -> Lineage {
        Lineage::new(200, 1200, own_uid, "task-a", 1)
    }

    #[test]
    fn group_session_and_descendants_are_found_to_any_depth() {
        let procs = vec![
            p(1, 0, 1, 1),
            p(AGENT, 1, AGENT, AGENT),
            p(200, AGENT, 200, 200), // the leader
            p(201, 200, 200, 200),   // a child in its group
            p(202, 200, 202, 202),   // a child that called setsid
            p(203, 202, 202, 202),   // its child
            p(204, 203, 204, 204),   // and a grandchild with its own session
            p(300, AGENT, 300, 300), // another task
            p(301, 1, 301, 301),     // something else on the robot
        ];
        let mut l = lineage(None);
        let found = l.members(&procs, AGENT, |_| None, |_, _| false);
        assert_eq!(sorted(found), vec![200, 201, 202, 203, 204]);
    }

    #[test]
    fn once_seen_an_escaped_session_stays_known_after_its_parent_dies() {
        let mut l = lineage(None);
        let before = vec![p(200, AGENT, 200, 200), p(202, 200, 202, 202)];
        assert_eq!(
            sorted(l.members(&before, AGENT, |_| None, |_, _| false)),
            vec![200, 202]
        );
        // The leader died; 202 was re-parented to the agent and forked 205.
        let after = vec![p(202, AGENT, 202, 202), p(205, 202, 202, 202)];
        assert_eq!(
            sorted(l.members(&after, AGENT, |_| None, |_, _| false)),
            vec![202, 205]
        );
    }

    #[test]
    fn a_reused_pid_is_not_the_tasks() {
        let mut l = lineage(None);
        let mut reused = p(200, 1, 999, 999);
        reused.1.start_time = 5;
        assert!(l.members(&[reused], AGENT, |_| None, |_, _| false).is_empty());
    }

    #[test]
    fn the_tasks_own_uid_finds_what_left_everything_else() {
        let mut l = lineage(Some(70_001));
        let procs = vec![p(200, AGENT, 200, 200), p(400, 1, 400, 400), p(401, 1, 401, 401)];
        let found = l.members(&procs, AGENT, |pid| (pid == 400).then_some(70_001), |_, _| false);
        assert_eq!(sorted(found), vec![200, 400]);
    }

    #[test]
    fn orphans_of_the_agent_are_claimed_by_their_environment() {
        let mut l = lineage(None);
        let procs = vec![
            p(500, AGENT, 500, 500),
            p(501, AGENT, 501, 501),
            p(502, 1, 502, 502),
        ];
        let env = |pid: i32, var: &[u8]| match pid {
            500 => var == b"K8S4R_TASK_UID=task-a" || var == b"K8S4R_TASK_ATTEMPT=1",
            // The same task's next attempt is not this attempt's.
            501 => var == b"K8S4R_TASK_UID=task-a" || var == b"K8S4R_TASK_ATTEMPT=2",
            _ => true,
        };
        assert_eq!(l.members(&procs, AGENT, |_| None, env), vec![500]);
    }

    #[test]
    fn zombies_are_known_but_not_live_members() {
        let mut l = lineage(None);
        let mut zombie = p(201, 200, 200, 200);
        zombie.1.state = 'Z';
        let procs = vec![p(200, AGENT, 200, 200), zombie];
        assert_eq!(l.members(&procs, AGENT, |_| None, |_, _| false), vec![200]);
        assert!(l.knows(201, &zombie.1));
    }
}
