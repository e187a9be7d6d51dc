//! Containment: nothing of a task outlives it. Its cgroup is killed and
//! removed once empty; without cgroups its processes are found through
//! /proc ([`Lineage`]) and signalled, look after look, until none is left;
//! its orphans come back to the agent (a child subreaper) and are reaped.
//! Its own uid goes back to the rotation only then.
//!
//! The state lives here; the work (walks of /proc, `kill` loops, cgroup
//! reads, writes and removals, `waitpid`) runs on the blocking pool as
//! [`Job`]s whose results come back to [`Containment`]: a walk of /proc
//! with 500 processes took 7–8 ms on the supervisor's thread, and a
//! cgroup's removal waits for the kernel.

use std::collections::{HashMap, HashSet, VecDeque};
use std::time::Duration;

use k8s4r_drivers::{Cgroups, TaskCgroup};
use nix::sys::signal::Signal;
use nix::unistd::Pid;

use super::containment::Lineage;
use super::reaper::OwnedPids;
use super::{procfs, reaper};

/// Between two looks for the processes of a task without a cgroup.
pub(crate) const SWEEP_EVERY: Duration = Duration::from_millis(50);
/// Looks after which a task's processes that will not die are given up
/// on (and its task uid never handed out again).
const SWEEP_ROUNDS: u32 = 200;
/// How often the removal of leftover cgroups is retried.
pub(crate) const CLEANUP_EVERY: Duration = Duration::from_secs(1);
/// Lineages of finished tasks remembered to reap their zombies.
const REMEMBERED_LINEAGES: usize = 256;

/// What is left of a finished task without a cgroup: processes that
/// escaped its group, killed until none is left.
#[derive(Clone)]
pub(crate) struct Lingering {
    lineage: Lineage,
    own_uid: Option<u32>,
    rounds: u32,
}

/// What becomes of a task uid once containment is done with it.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum UidFate {
    /// Nothing runs as it: it may be handed out again.
    Free(u32),
    /// Something survived as it: never again.
    Barred(u32),
}

/// Work for the blocking pool.
pub(crate) enum Job {
    /// Signal the members of running tasks' lineages, and kill what is left
    /// of finished ones.
    Sweep {
        signal: Vec<(u64, Lineage, Signal)>,
        lingering: Vec<Lingering>,
        agent: i32,
    },
    /// Kill and remove these cgroups.
    RemoveCgroups(Vec<(TaskCgroup, Option<u32>)>),
    /// Reap the zombies the filter recognises.
    Reap(OrphanFilter),
}

/// A job's result.
pub(crate) enum Done {
    Swept {
        /// The running tasks' lineages, with the members learnt.
        lineages: Vec<(u64, Lineage)>,
        lingering: Vec<Lingering>,
        /// Finished tasks whose processes are all gone (or given up on).
        over: Vec<(Lingering, bool)>,
    },
    CgroupsRemoved {
        /// Still holding processes.
        left: Vec<(TaskCgroup, Option<u32>)>,
        /// The uids of those removed.
        freed: Vec<Option<u32>>,
        /// Processes seen in them.
        seen: Vec<i32>,
    },
    Reaped,
}

/// What makes a zombie child a task's, for the reaper: a snapshot of the
/// runner's knowledge when the job was made.
pub(crate) struct OrphanFilter {
    pub reap_all: bool,
    /// Process groups of tasks running or recently over.
    pub groups: HashSet<i32>,
    /// Processes seen in tasks' cgroups.
    pub pids: HashSet<i32>,
    /// Lineages of tasks running, lingering or recently over.
    pub lineages: Vec<Lineage>,
    pub owned: OwnedPids,
}

impl Job {
    /// Does the work (blocking).
    pub(crate) fn run(self) -> Done {
        match self {
            Job::Sweep {
                signal,
                lingering,
                agent,
            } => sweep(signal, lingering, agent),
            Job::RemoveCgroups(cgroups) => remove_cgroups(cgroups),
            Job::Reap(filter) => {
                reaper::reap_orphans(&filter.owned, |pid, stat| {
                    filter.reap_all
                        || filter.groups.contains(&stat.pgrp)
                        || filter.pids.contains(&pid)
                        || filter.lineages.iter().any(|l| l.knows(pid, stat))
                });
                Done::Reaped
            }
        }
    }
}

fn sweep(signal: Vec<(u64, Lineage, Signal)>, mut lingering: Vec<Lingering>, agent: i32) -> Done {
    let procs = procfs::snapshot();
    let mut lineages = Vec::new();
    for (id, mut lineage, sig) in signal {
        for pid in lineage.members(&procs, agent, procfs::real_uid, procfs::environ_has) {
            let _ = nix::sys::signal::kill(Pid::from_raw(pid), sig);
        }
        lineages.push((id, lineage));
    }
    let mut over = Vec::new();
    let mut left = Vec::new();
    for mut l in lingering.drain(..) {
        let members = l
            .lineage
            .members(&procs, agent, procfs::real_uid, procfs::environ_has);
        for pid in &members {
            let _ = nix::sys::signal::kill(Pid::from_raw(*pid), Signal::SIGKILL);
        }
        l.rounds += 1;
        if members.is_empty() || l.rounds > SWEEP_ROUNDS {
            if !members.is_empty() {
                tracing::error!(pids = ?members, "processes of a finished task survive SIGKILL; giving up on them");
            }
            over.push((l, !members.is_empty()));
        } else {
            left.push(l);
        }
    }
    Done::Swept {
        lineages,
        lingering: left,
        over,
    }
}

fn remove_cgroups(cgroups: Vec<(TaskCgroup, Option<u32>)>) -> Done {
    let mut seen = Vec::new();
    let mut freed = Vec::new();
    let mut left = Vec::new();
    for (cgroup, uid) in cgroups {
        seen.extend(cgroup.pids().unwrap_or_default());
        let _ = cgroup.kill();
        if cgroup.remove().is_ok() || !cgroup.path().exists() {
            freed.push(uid);
        } else {
            left.push((cgroup, uid));
        }
    }
    Done::CgroupsRemoved { left, freed, seen }
}

/// What the runner asks of containment after an event.
#[derive(Default)]
pub(crate) struct Wants {
    /// Jobs to run now.
    pub jobs: Vec<Job>,
    /// A sweep timer to arm, after this long.
    pub sweep_after: Option<Duration>,
    /// A cleanup timer to arm.
    pub cleanup_after: Option<Duration>,
    /// Uids done with.
    pub uids: Vec<UidFate>,
    /// Processes seen in cgroups: their zombies are the tasks'.
    pub seen: Vec<i32>,
}

/// The containment state.
pub(crate) struct Containment {
    cgroups: Option<Cgroups>,
    agent: i32,
    reap_all: bool,
    owned: OwnedPids,
    /// Cgroups of finished tasks that still had processes, with the uid to
    /// give back once they are gone (while no removal is in flight).
    to_remove: Vec<(TaskCgroup, Option<u32>)>,
    removing: bool,
    /// A cgroup came while a removal was in flight: another goes at once.
    fresh: bool,
    cleanup_armed: bool,
    /// Running tasks to signal at the next sweep, and how.
    due: HashMap<u64, Signal>,
    lingering: Vec<Lingering>,
    sweep_armed: bool,
    sweeping: bool,
    recent: VecDeque<Lineage>,
    reaping: bool,
    reap_again: bool,
}

impl Containment {
    pub(crate) fn new(
        cgroups: Option<Cgroups>,
        reap_all: bool,
        owned: OwnedPids,
        to_remove: Vec<(TaskCgroup, Option<u32>)>,
    ) -> Self {
        Containment {
            cgroups,
            agent: std::process::id() as i32,
            reap_all,
            owned,
            to_remove,
            removing: false,
            fresh: false,
            cleanup_armed: false,
            due: HashMap::new(),
            lingering: Vec::new(),
            sweep_armed: false,
            sweeping: false,
            recent: VecDeque::new(),
            reaping: false,
            reap_again: false,
        }
    }

    /// The cgroup v2 subtree tasks get cgroups in, if the robot has one.
    pub(crate) fn cgroups(&self) -> Option<Cgroups> {
        self.cgroups.clone()
    }

    /// The pids tokio waits for.
    pub(crate) fn owned(&self) -> OwnedPids {
        self.owned.clone()
    }

    /// Whether something of a finished task is still being dealt with.
    pub(crate) fn busy(&self) -> bool {
        !self.lingering.is_empty() || !self.to_remove.is_empty() || self.removing || self.sweeping
    }

    /// Whether finished tasks' processes are still being killed.
    pub(crate) fn lingering(&self) -> bool {
        !self.lingering.is_empty()
    }

    /// Signal `id`'s processes (a task without a cgroup) at the next sweep:
    /// one look at /proc serves every task due.
    pub(crate) fn sweep_soon(&mut self, id: u64, signal: Signal) -> Wants {
        let entry = self.due.entry(id).or_insert(signal);
        if signal == Signal::SIGKILL {
            *entry = Signal::SIGKILL;
        }
        self.arm_sweep(Duration::ZERO)
    }

    fn arm_sweep(&mut self, after: Duration) -> Wants {
        if self.sweep_armed || self.sweeping {
            return Wants::default();
        }
        self.sweep_armed = true;
        Wants {
            sweep_after: Some(after),
            ..Wants::default()
        }
    }

    /// The sweep timer fired: the job, given the lineages of running tasks
    /// (`lineage_of`).
    pub(crate) fn sweep(&mut self, lineage_of: impl Fn(u64) -> Option<Lineage>) -> Wants {
        self.sweep_armed = false;
        if self.sweeping {
            return Wants::default();
        }
        let signal: Vec<(u64, Lineage, Signal)> = std::mem::take(&mut self.due)
            .into_iter()
            .filter_map(|(id, sig)| Some((id, lineage_of(id)?, sig)))
            .collect();
        let lingering = std::mem::take(&mut self.lingering);
        if signal.is_empty() && lingering.is_empty() {
            return Wants::default();
        }
        self.sweeping = true;
        Wants {
            jobs: vec![Job::Sweep {
                signal,
                lingering,
                agent: self.agent,
            }],
            ..Wants::default()
        }
    }

    /// A task's process ended: its cgroup (killed, then removed) or what
    /// is left of its lineage (swept until gone); `own_uid` comes back once
    /// nothing runs as it (None when the task keeps it to run again).
    pub(crate) fn exited(
        &mut self,
        cgroup: Option<TaskCgroup>,
        lineage: Option<Lineage>,
        own_uid: Option<u32>,
    ) -> Wants {
        match (cgroup, lineage) {
            (Some(cgroup), _) => {
                self.to_remove.push((cgroup, own_uid));
                self.fresh |= self.removing;
                self.remove_cgroups()
            }
            (None, Some(lineage)) => {
                self.lingering.push(Lingering {
                    lineage,
                    own_uid,
                    rounds: 0,
                });
                self.arm_sweep(Duration::ZERO)
            }
            (None, None) => Wants {
                uids: own_uid.map(UidFate::Free).into_iter().collect(),
                ..Wants::default()
            },
        }
    }

    /// The cleanup timer fired: removes the cgroups of finished tasks (and
    /// a later failure may arm the timer again).
    pub(crate) fn cleanup_due(&mut self) -> Wants {
        self.cleanup_armed = false;
        self.remove_cgroups()
    }

    /// Removes the cgroups of finished tasks (one was added, or reaped
    /// zombies may have freed one). A timer already armed stays the only
    /// one.
    pub(crate) fn remove_cgroups(&mut self) -> Wants {
        if self.removing || self.to_remove.is_empty() {
            return Wants::default();
        }
        self.removing = true;
        Wants {
            jobs: vec![Job::RemoveCgroups(std::mem::take(&mut self.to_remove))],
            ..Wants::default()
        }
    }

    /// SIGCHLD: reap the zombies of tasks (in `groups`, among `pids` seen
    /// in their cgroups, or of the running tasks' `lineages`, and of those
    /// finished), one reap at a time: the signals that came meanwhile make
    /// one more.
    pub(crate) fn reap(
        &mut self,
        groups: HashSet<i32>,
        pids: HashSet<i32>,
        mut lineages: Vec<Lineage>,
    ) -> Wants {
        if self.reaping {
            self.reap_again = true;
            return Wants::default();
        }
        self.reaping = true;
        lineages.extend(self.lingering.iter().map(|l| l.lineage.clone()));
        lineages.extend(self.recent.iter().cloned());
        let filter = OrphanFilter {
            reap_all: self.reap_all,
            groups,
            pids,
            lineages,
            owned: self.owned.clone(),
        };
        Wants {
            jobs: vec![Job::Reap(filter)],
            ..Wants::default()
        }
    }

    /// A reap is over; whether another is due.
    pub(crate) fn reaped(&mut self) -> bool {
        self.reaping = false;
        std::mem::take(&mut self.reap_again)
    }

    /// A job came back: what it says, and what follows.
    pub(crate) fn done(&mut self, done: Done) -> (Wants, Vec<(u64, Lineage)>) {
        match done {
            Done::Swept {
                lineages,
                lingering,
                over,
            } => {
                self.sweeping = false;
                self.lingering.extend(lingering);
                let mut wants = Wants::default();
                for (left, survived) in over {
                    if let Some(uid) = left.own_uid {
                        wants.uids.push(if survived {
                            UidFate::Barred(uid)
                        } else {
                            UidFate::Free(uid)
                        });
                    }
                    self.recent.push_back(left.lineage);
                    if self.recent.len() > REMEMBERED_LINEAGES {
                        self.recent.pop_front();
                    }
                }
                if !self.due.is_empty() {
                    wants.sweep_after = self.arm_sweep(Duration::ZERO).sweep_after;
                } else if !self.lingering.is_empty() {
                    wants.sweep_after = self.arm_sweep(SWEEP_EVERY).sweep_after;
                }
                (wants, lineages)
            }
            Done::CgroupsRemoved { left, freed, seen } => {
                self.removing = false;
                self.to_remove.extend(left);
                let mut wants = Wants {
                    uids: freed.into_iter().flatten().map(UidFate::Free).collect(),
                    seen,
                    ..Wants::default()
                };
                if std::mem::take(&mut self.fresh) {
                    wants.jobs = self.remove_cgroups().jobs;
                } else if !self.to_remove.is_empty() && !self.cleanup_armed {
                    self.cleanup_armed = true;
                    wants.cleanup_after = Some(CLEANUP_EVERY);
                }
                (wants, Vec::new())
            }
            Done::Reaped => (Wants::default(), Vec::new()),
        }
    }
}

#[cfg(test)]
mod tests;
