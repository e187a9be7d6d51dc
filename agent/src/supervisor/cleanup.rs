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
mod tests {
    use std::path::PathBuf;

    use tokio::time::Instant;

    use super::*;
    use crate::supervisor::procfs::Stat;

    /// Fake pids: above any kernel's `pid_max`, so no process has them.
    const PID: i32 = 10_000_000;

    fn containment() -> Containment {
        Containment::new(None, false, OwnedPids::default(), Vec::new())
    }

    /// The lineage of a task whose leader was `pid`.
    fn lineage(pid: i32) -> Lineage {
        Lineage::new(pid, 7, None, "cleanup-test", 1)
    }

    /// Whether `l` is the lineage of the task led by `pid`.
    fn led_by(l: &Lineage, pid: i32) -> bool {
        let stat = Stat {
            state: 'S',
            ppid: 1,
            pgrp: pid,
            session: pid,
            start_time: 7,
        };
        l.knows(pid, &stat)
    }

    fn lingering(pid: i32, own_uid: Option<u32>) -> Lingering {
        Lingering {
            lineage: lineage(pid),
            own_uid,
            rounds: 0,
        }
    }

    /// Asks for nothing at all.
    fn nothing(w: &Wants) -> bool {
        w.jobs.is_empty()
            && w.sweep_after.is_none()
            && w.cleanup_after.is_none()
            && w.uids.is_empty()
            && w.seen.is_empty()
    }

    /// The one job `w` asks for: a sweep's tasks to signal and lingering ones.
    fn sweep_job(w: Wants) -> (Vec<(u64, Lineage, Signal)>, Vec<Lingering>) {
        match <[Job; 1]>::try_from(w.jobs) {
            Ok(
                [Job::Sweep {
                    signal, lingering, ..
                }],
            ) => (signal, lingering),
            _ => panic!("not one sweep"),
        }
    }

    /// The one job `w` asks for: the cgroups to remove, by path.
    fn removal(w: &Wants) -> Vec<(PathBuf, Option<u32>)> {
        match w.jobs.as_slice() {
            [Job::RemoveCgroups(cgroups)] => cgroups
                .iter()
                .map(|(c, uid)| (c.path().to_path_buf(), *uid))
                .collect(),
            _ => panic!("not one removal"),
        }
    }

    fn cgroup(name: &str) -> TaskCgroup {
        TaskCgroup::at(PathBuf::from(format!("/sys/fs/cgroup/k8s4r/{name}")))
    }

    fn swept(over: Vec<(Lingering, bool)>, lingering: Vec<Lingering>) -> Done {
        Done::Swept {
            lineages: Vec::new(),
            lingering,
            over,
        }
    }

    #[test]
    fn a_task_with_neither_cgroup_nor_lineage_gives_its_uid_back_at_once() {
        let mut c = containment();
        let w = c.exited(None, None, Some(70_001));
        assert_eq!(w.uids, vec![UidFate::Free(70_001)]);
        assert!(w.jobs.is_empty() && w.sweep_after.is_none() && w.cleanup_after.is_none());
        assert!(nothing(&c.exited(None, None, None)));
        assert!(!c.busy() && !c.lingering());
    }

    #[test]
    fn a_lineage_is_swept_at_once_then_at_a_pace_until_nothing_is_left() {
        let mut c = containment();
        let w = c.exited(None, Some(lineage(PID)), Some(70_001));
        assert_eq!(w.sweep_after, Some(Duration::ZERO));
        assert!(
            w.jobs.is_empty() && w.uids.is_empty(),
            "the uid waits for the sweep"
        );
        assert!(c.lingering() && c.busy());
        assert!(
            nothing(&c.exited(None, Some(lineage(PID + 1)), Some(70_002))),
            "one sweep is armed"
        );

        let (signal, both) = sweep_job(c.sweep(|_| None));
        assert!(signal.is_empty());
        assert_eq!(both.len(), 2);
        assert!(!c.lingering() && c.busy(), "the sweep has them");
        assert!(nothing(&c.sweep(|_| None)), "one sweep at a time");

        // The second task's processes are gone; the first's are not yet.
        let [first, second] = <[Lingering; 2]>::try_from(both).ok().unwrap();
        assert!(led_by(&first.lineage, PID) && led_by(&second.lineage, PID + 1));
        let (w, lineages) = c.done(swept(vec![(second, false)], vec![first]));
        assert!(lineages.is_empty());
        assert_eq!(w.uids, vec![UidFate::Free(70_002)]);
        assert_eq!(
            w.sweep_after,
            Some(SWEEP_EVERY),
            "the next look, at the sweeps' pace"
        );
        assert!(c.lingering());

        let (_, left) = sweep_job(c.sweep(|_| None));
        let [first] = <[Lingering; 1]>::try_from(left).ok().unwrap();
        // Its processes survived every SIGKILL: its uid is never handed out again.
        let (w, _) = c.done(swept(vec![(first, true)], Vec::new()));
        assert_eq!(w.uids, vec![UidFate::Barred(70_001)]);
        assert_eq!(w.sweep_after, None);
        assert!(!c.lingering() && !c.busy());
    }

    #[tokio::test(start_paused = true)]
    async fn a_lingering_task_gives_its_uid_back_after_the_looks_it_took() {
        let mut c = containment();
        let t0 = Instant::now();
        let mut w = c.exited(None, Some(lineage(PID)), Some(70_001));
        let mut looks = 0;
        // The runner's part: arm the timer, sweep when it fires; the
        // processes are gone at the third look.
        let fates = loop {
            tokio::time::sleep(w.sweep_after.expect("a sweep is armed")).await;
            let (_, lingering) = sweep_job(c.sweep(|_| None));
            looks += 1;
            let done = if looks < 3 {
                swept(Vec::new(), lingering)
            } else {
                swept(lingering.into_iter().map(|l| (l, false)).collect(), Vec::new())
            };
            w = c.done(done).0;
            if !w.uids.is_empty() {
                break w.uids;
            }
        };
        assert_eq!(fates, vec![UidFate::Free(70_001)]);
        assert_eq!(Instant::now() - t0, 2 * SWEEP_EVERY);
    }

    #[test]
    fn running_tasks_are_signalled_at_the_next_sweep_and_sigkill_wins() {
        let mut c = containment();
        assert_eq!(c.sweep_soon(1, Signal::SIGTERM).sweep_after, Some(Duration::ZERO));
        assert!(
            nothing(&c.sweep_soon(1, Signal::SIGKILL)),
            "one sweep serves them all"
        );
        assert!(nothing(&c.sweep_soon(2, Signal::SIGKILL)));
        assert!(nothing(&c.sweep_soon(2, Signal::SIGTERM)));
        assert!(nothing(&c.sweep_soon(3, Signal::SIGTERM)));
        // Task 3 ended meanwhile: it has no lineage to signal.
        let (mut signal, lingering) = sweep_job(c.sweep(|id| (id != 3).then(|| lineage(PID + id as i32))));
        assert!(lingering.is_empty());
        signal.sort_by_key(|(id, ..)| *id);
        let signals: Vec<(u64, Signal)> = signal.iter().map(|(id, _, sig)| (*id, *sig)).collect();
        assert_eq!(signals, vec![(1, Signal::SIGKILL), (2, Signal::SIGKILL)]);
        assert!(led_by(&signal[0].1, PID + 1));

        // Due while the sweep runs: the next sweep follows at once, and the
        // lineages it learnt go back to the runner.
        assert!(nothing(&c.sweep_soon(4, Signal::SIGTERM)));
        let learnt = signal.into_iter().map(|(id, l, _)| (id, l)).collect();
        let done = Done::Swept {
            lineages: learnt,
            lingering: Vec::new(),
            over: Vec::new(),
        };
        let (w, lineages) = c.done(done);
        assert_eq!(lineages.iter().map(|(id, _)| *id).collect::<Vec<_>>(), vec![1, 2]);
        assert_eq!(w.sweep_after, Some(Duration::ZERO));
        let (signal, _) = sweep_job(c.sweep(|id| Some(lineage(PID + id as i32))));
        assert_eq!(
            signal.iter().map(|(id, _, sig)| (*id, *sig)).collect::<Vec<_>>(),
            vec![(4, Signal::SIGTERM)]
        );
    }

    #[test]
    fn a_sweep_with_nothing_to_do_runs_nothing_and_the_next_arms_again() {
        let mut c = containment();
        assert!(c.sweep_soon(1, Signal::SIGTERM).sweep_after.is_some());
        assert!(nothing(&c.sweep(|_| None)), "the task is gone");
        assert!(!c.busy());
        assert_eq!(c.sweep_soon(2, Signal::SIGTERM).sweep_after, Some(Duration::ZERO));
    }

    #[test]
    fn a_retry_timer_already_armed_stays_the_only_one() {
        let mut c = containment();
        let _ = c.exited(Some(cgroup("a")), None, None);
        let held = || Done::CgroupsRemoved {
            left: vec![(cgroup("a"), None)],
            freed: Vec::new(),
            seen: Vec::new(),
        };
        let (w, _) = c.done(held());
        assert_eq!(w.cleanup_after, Some(CLEANUP_EVERY));
        // Reaped zombies may have freed it: tried again before the timer.
        let w = c.remove_cgroups();
        assert_eq!(removal(&w).len(), 1);
        let (w, _) = c.done(held());
        assert_eq!(w.cleanup_after, None, "the armed timer stays the only one");
        // The timer fires: tried again, and a failure arms it again.
        let w = c.cleanup_due();
        assert_eq!(removal(&w).len(), 1);
        let (w, _) = c.done(held());
        assert_eq!(w.cleanup_after, Some(CLEANUP_EVERY));
    }

    #[test]
    fn cgroups_are_removed_one_job_at_a_time_and_retried_every_second() {
        let mut c = containment();
        let w = c.exited(Some(cgroup("a")), None, Some(70_001));
        assert_eq!(
            removal(&w),
            vec![(cgroup("a").path().to_path_buf(), Some(70_001))]
        );
        assert!(w.uids.is_empty(), "the uid waits for the removal");
        // A lineage does not matter to a task with a cgroup.
        let w = c.exited(Some(cgroup("b")), Some(lineage(PID)), Some(70_002));
        assert!(nothing(&w), "one removal at a time");
        assert!(!c.lingering() && c.busy());

        // The first is gone; the second came meanwhile and goes at once.
        let done = Done::CgroupsRemoved {
            left: Vec::new(),
            freed: vec![Some(70_001)],
            seen: vec![PID + 5],
        };
        let (w, lineages) = c.done(done);
        assert!(lineages.is_empty());
        assert_eq!(w.uids, vec![UidFate::Free(70_001)]);
        assert_eq!(w.seen, vec![PID + 5]);
        assert_eq!(
            removal(&w),
            vec![(cgroup("b").path().to_path_buf(), Some(70_002))]
        );
        assert_eq!(w.cleanup_after, None);

        // It still holds processes: tried again a second later, until it goes.
        let held = Done::CgroupsRemoved {
            left: vec![(cgroup("b"), Some(70_002))],
            freed: Vec::new(),
            seen: Vec::new(),
        };
        let (w, _) = c.done(held);
        assert!(w.jobs.is_empty() && w.uids.is_empty());
        assert_eq!(w.cleanup_after, Some(CLEANUP_EVERY));
        assert!(c.busy());
        let w = c.cleanup_due();
        assert_eq!(
            removal(&w),
            vec![(cgroup("b").path().to_path_buf(), Some(70_002))]
        );
        assert!(nothing(&c.remove_cgroups()), "in flight");
        let done = Done::CgroupsRemoved {
            left: Vec::new(),
            freed: vec![Some(70_002)],
            seen: Vec::new(),
        };
        let (w, _) = c.done(done);
        assert_eq!(w.uids, vec![UidFate::Free(70_002)]);
        assert!(w.jobs.is_empty() && w.cleanup_after.is_none());
        assert!(!c.busy());
        assert!(nothing(&c.remove_cgroups()), "nothing left to remove");
    }

    #[test]
    fn cgroups_left_by_the_last_run_go_at_the_first_removal() {
        let mut c = Containment::new(
            None,
            false,
            OwnedPids::default(),
            vec![(cgroup("old"), Some(70_009))],
        );
        assert!(c.busy());
        assert_eq!(
            removal(&c.remove_cgroups()),
            vec![(cgroup("old").path().to_path_buf(), Some(70_009))]
        );
    }

    #[test]
    fn removing_frees_an_empty_or_gone_cgroup_and_keeps_one_that_stays() {
        // Plain directories: no cgroup.procs, so nothing is signalled.
        let root = tempfile::tempdir().unwrap();
        let empty = root.path().join("empty");
        let stays = root.path().join("stays");
        std::fs::create_dir(&empty).unwrap();
        std::fs::create_dir(&stays).unwrap();
        std::fs::write(stays.join("file"), "").unwrap();
        let job = Job::RemoveCgroups(vec![
            (TaskCgroup::at(empty.clone()), Some(1)),
            (TaskCgroup::at(root.path().join("gone")), None),
            (TaskCgroup::at(stays.clone()), Some(3)),
        ]);
        let Done::CgroupsRemoved { left, freed, seen } = job.run() else {
            panic!("not a removal");
        };
        assert_eq!(freed, vec![Some(1), None]);
        let left: Vec<_> = left
            .iter()
            .map(|(c, uid)| (c.path().to_path_buf(), *uid))
            .collect();
        assert_eq!(left, vec![(stays, Some(3))]);
        assert!(seen.is_empty());
        assert!(!empty.exists());
    }

    #[test]
    fn a_finished_lineage_with_no_process_left_is_over_at_the_first_look() {
        let job = Job::Sweep {
            signal: vec![(9, lineage(PID + 9), Signal::SIGTERM)],
            lingering: vec![lingering(PID, Some(70_001))],
            agent: std::process::id() as i32,
        };
        let Done::Swept {
            lineages,
            lingering,
            over,
        } = job.run()
        else {
            panic!("not a sweep");
        };
        assert_eq!(lineages.iter().map(|(id, _)| *id).collect::<Vec<_>>(), vec![9]);
        assert!(lingering.is_empty());
        assert_eq!(over.len(), 1);
        let (l, survived) = &over[0];
        assert!(!survived && l.rounds == 1 && l.own_uid == Some(70_001));
    }

    #[test]
    fn reaps_run_one_at_a_time_and_signals_meanwhile_make_one_more() {
        let mut c = Containment::new(None, true, OwnedPids::default(), Vec::new());
        let w = c.reap(HashSet::from([5]), HashSet::from([6]), vec![lineage(PID)]);
        match w.jobs.as_slice() {
            [Job::Reap(filter)] => {
                assert!(filter.reap_all);
                assert_eq!(
                    (&filter.groups, &filter.pids),
                    (&HashSet::from([5]), &HashSet::from([6]))
                );
                assert_eq!(filter.lineages.len(), 1);
            }
            _ => panic!("not one reap"),
        }
        assert!(nothing(&c.reap(HashSet::new(), HashSet::new(), Vec::new())));
        assert!(nothing(&c.reap(HashSet::new(), HashSet::new(), Vec::new())));
        assert!(c.reaped(), "SIGCHLD came meanwhile: reap again");
        assert!(!c.reaped());
        assert_eq!(c.reap(HashSet::new(), HashSet::new(), Vec::new()).jobs.len(), 1);
        assert!(!c.reaped());
    }

    #[test]
    fn a_reap_knows_the_lingering_and_the_last_256_finished_lineages() {
        let mut c = containment();
        c.exited(None, Some(lineage(PID)), None);
        let filter_lineages = |c: &mut Containment| {
            let w = c.reap(HashSet::new(), HashSet::new(), vec![lineage(PID - 1)]);
            c.reaped();
            match <[Job; 1]>::try_from(w.jobs) {
                Ok([Job::Reap(filter)]) => filter.lineages,
                _ => panic!("not one reap"),
            }
        };
        let known = filter_lineages(&mut c);
        assert_eq!(known.len(), 2);
        assert!(led_by(&known[0], PID - 1) && led_by(&known[1], PID));

        let (_, first) = sweep_job(c.sweep(|_| None));
        c.done(swept(first.into_iter().map(|l| (l, false)).collect(), Vec::new()));
        let over: Vec<(Lingering, bool)> = (1..=REMEMBERED_LINEAGES as i32)
            .map(|i| (lingering(PID + i, None), false))
            .collect();
        c.done(swept(over, Vec::new()));
        let known = filter_lineages(&mut c);
        assert_eq!(known.len(), 1 + REMEMBERED_LINEAGES);
        assert!(!known.iter().any(|l| led_by(l, PID)), "the oldest is forgotten");
        assert!(led_by(&known[1], PID + 1) && led_by(&known[REMEMBERED_LINEAGES], PID + 256));
    }
}
