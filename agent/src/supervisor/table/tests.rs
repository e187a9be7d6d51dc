use super::*;

/// A group nobody listens to: the table never signals, it only says so.
struct Quiet;

impl ProcessGroup for Quiet {
    fn signal(&self, _: Signal) {}
}

const KILL: Duration = Duration::from_secs(5);

fn fetching(uid: &str, attempt: u32, timeout: Option<&str>) -> Task {
    let template = TaskTemplate {
        timeout: timeout.map(Into::into),
        kill_timeout: Some(KILL.into()),
        ..TaskTemplate::default()
    };
    let (abort, _) = AbortHandle::new_pair();
    let new = NewTask {
        uid: uid.into(),
        attempt,
        name: uid.into(),
        dir: PathBuf::from("/t"),
        template,
        driver: 0,
        own_uid: None,
    };
    Task::preparing(new, abort)
}

fn running(pgid: i32) -> Running {
    Running {
        pid: pgid,
        pgid,
        started: journal::Started {
            pid: pgid,
            pgid,
            pid_start: 0,
            pgid_start: 0,
            logger: false,
            boot_id: String::new(),
            cgroup: None,
            task_uid: None,
            started_at: jiff::Timestamp::UNIX_EPOCH,
            restarts: 0,
            asks: None,
        },
        group: Box::new(Quiet),
        lineage: None,
    }
}

/// A task of its own table, started now; returns its id and when.
fn started(table: &mut Table, uid: &str, timeout: Option<&str>) -> (u64, Instant) {
    let id = table.insert(fetching(uid, 1, timeout));
    let now = Instant::now();
    table.started(id, running(42), now);
    (id, now)
}

fn key(uid: &str, attempt: u32) -> (String, u32) {
    (uid.to_owned(), attempt)
}

#[test]
fn attempts_are_known_while_held_and_after() {
    let mut table = Table::new();
    let id = table.insert(fetching("a", 1, None));
    assert!(table.holds(&key("a", 1)) && table.is_known(&key("a", 1)));
    assert!(!table.is_known(&key("a", 2)));

    let task = table.remove(id).unwrap();
    assert_eq!((task.uid.as_str(), task.attempt), ("a", 1));
    assert!(!table.is_known(&key("a", 1)), "removing alone forgets it");
    table.remember_finished(task.uid, task.attempt);
    assert!(table.is_known(&key("a", 1)) && !table.holds(&key("a", 1)));
    assert!(table.is_empty());
}

#[test]
fn lookups_by_uid_and_attempt() {
    let mut table = Table::new();
    let b2 = table.insert(fetching("b", 2, None));
    let a1 = table.insert(fetching("a", 1, None));
    let b1 = table.insert(fetching("b", 1, None));
    let mut all_b = table.ids_of("b", None);
    all_b.sort_unstable();
    assert_eq!(all_b, vec![b2, b1]);
    assert_eq!(table.ids_of("b", Some(1)), vec![b1]);
    assert_eq!(table.ids_of("a", Some(2)), Vec::<u64>::new());
    let attempts: Vec<_> = table.attempts().into_iter().map(|t| (t.uid, t.attempt)).collect();
    assert_eq!(attempts, vec![key("a", 1), key("b", 1), key("b", 2)]);
    assert_eq!((table.len(), table.ids().len()), (3, 3));
    assert!(table.get_mut(a1).is_some());
}

#[tokio::test(start_paused = true)]
async fn a_timeout_escalates_from_its_deadline_not_from_when_it_was_handled() {
    let mut table = Table::new();
    let id = table.insert(fetching("t", 1, Some("10s")));
    assert!(
        !table.has_deadlines(),
        "the timeout runs from the start, not the dispatch"
    );
    let t0 = Instant::now();
    table.started(id, running(42), t0);

    let (deadline, at) = table.next_deadline().await.unwrap();
    assert_eq!((deadline, at), (Deadline::Term(id), t0 + Duration::from_secs(10)));
    // Handled two seconds late: SIGKILL is still due at deadline + kill timeout.
    tokio::time::advance(Duration::from_secs(2)).await;
    let (signal, task) = table.deadline_passed(deadline, at).unwrap();
    assert_eq!(signal, Signal::SIGTERM);
    assert_eq!(task.stop, Some(StopCause::Timeout(Duration::from_secs(10))));

    let (deadline, at) = table.next_deadline().await.unwrap();
    assert_eq!((deadline, at), (Deadline::Kill(id), t0 + Duration::from_secs(15)));
    let (signal, _) = table.deadline_passed(deadline, at).unwrap();
    assert_eq!(signal, Signal::SIGKILL);
    assert!(!table.has_deadlines());
}

#[tokio::test(start_paused = true)]
async fn a_timeout_beyond_the_timer_wheel_is_armed_at_the_horizon_and_again() {
    let mut table = Table::new();
    let mut task = fetching("far", 1, None);
    // What validation refuses, and what would overflow an Instant.
    task.timeout = Some(Duration::from_secs(3 * 365 * 24 * 3600));
    let id = table.insert(task);
    let t0 = Instant::now();
    table.started(id, running(42), t0);
    let (deadline, at) = table.next_deadline().await.unwrap();
    assert_eq!((deadline, at), (Deadline::Term(id), t0 + HORIZON));
    assert!(
        table.deadline_passed(deadline, at).is_none(),
        "not due yet: armed again"
    );
    assert!(table.has_deadlines());
    let (deadline, at) = table.next_deadline().await.unwrap();
    assert_eq!((deadline, at), (Deadline::Term(id), t0 + 2 * HORIZON));
    assert!(table.deadline_passed(deadline, at).is_none());
    let (deadline, at) = table.next_deadline().await.unwrap();
    assert_eq!(at, t0 + Duration::from_secs(3 * 365 * 24 * 3600));
    let (signal, _) = table.deadline_passed(deadline, at).unwrap();
    assert_eq!(signal, Signal::SIGTERM);

    let mut table = Table::new();
    let mut task = fetching("max", 1, None);
    task.timeout = Some(Duration::MAX);
    task.kill_timeout = Duration::MAX;
    let id = table.insert(task);
    table.started(id, running(43), Instant::now());
    assert!(table.has_deadlines(), "armed, without panicking");
    assert!(matches!(
        table.stop(id, &StopCause::Shutdown, Instant::now()),
        Stop::Escalate
    ));
}

#[tokio::test(start_paused = true)]
async fn a_stop_replaces_the_timeout_and_arms_the_kill_timeout_once() {
    let mut table = Table::new();
    let (id, t0) = started(&mut table, "c", Some("1h"));

    let cancelled = StopCause::Cancelled("deleted".into());
    assert!(matches!(table.stop(id, &cancelled, t0), Stop::Escalate));
    let later = t0 + Duration::from_secs(3);
    assert!(matches!(
        table.stop(id, &StopCause::Shutdown, later),
        Stop::Nothing
    ));
    assert_eq!(table.get_mut(id).unwrap().stop, Some(cancelled));

    let (deadline, at) = table.next_deadline().await.unwrap();
    assert_eq!((deadline, at), (Deadline::Kill(id), t0 + KILL));
    assert!(!table.has_deadlines(), "the one-hour timeout is gone");
}

#[test]
fn a_task_still_fetching_is_stopped_by_aborting_its_download() {
    let mut table = Table::new();
    let id = table.insert(fetching("f", 1, Some("1s")));
    assert!(matches!(
        table.stop(id, &StopCause::Shutdown, Instant::now()),
        Stop::Unstarted(_)
    ));
    assert!(matches!(
        table.stop(id + 1, &StopCause::Shutdown, Instant::now()),
        Stop::Nothing
    ));
}

#[tokio::test(start_paused = true)]
async fn a_removed_task_leaves_no_deadline_and_a_late_one_is_ignored() {
    let mut table = Table::new();
    let (id, now) = started(&mut table, "r", Some("1s"));
    assert!(table.has_deadlines());
    table.remove(id).unwrap();
    assert!(!table.has_deadlines());
    assert!(table.deadline_passed(Deadline::Term(id), now).is_none());
}

#[test]
fn task_groups_are_the_running_and_the_recently_finished() {
    let mut table = Table::new();
    let running_id = table.insert(fetching("r", 1, None));
    table.insert(fetching("f", 1, None));
    table.started(running_id, running(42), Instant::now());
    table.remember_group(7);
    table.remember_pids([99]);
    let (groups, pids) = table.orphan_marks();
    assert!(groups.contains(&42) && groups.contains(&7) && pids.contains(&99));
    assert!(!groups.contains(&8) && !groups.contains(&1));
}

#[test]
fn recent_forgets_its_oldest() {
    let mut recent = Recent::new(2);
    for n in [1, 2, 2, 3] {
        recent.insert(n);
    }
    assert!(!recent.contains(&1));
    assert!(recent.contains(&2) && recent.contains(&3));
}
