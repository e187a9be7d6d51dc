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
