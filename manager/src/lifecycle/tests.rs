use super::*;
use k8s4r_api::{AttemptRecord, DurationString, RestartMode, TaskTemplate};

fn t(secs: i64) -> Timestamp {
    Timestamp::from_second(1_700_000_000 + secs).unwrap()
}

fn policy(attempts: u32, delay: &str, max: &str) -> RestartPolicy {
    RestartPolicy {
        attempts,
        delay: Some(DurationString::from(delay)),
        max_delay: Some(DurationString::from(max)),
        mode: RestartMode::Fail,
        lost_retries: None,
        condition_restarts: None,
    }
}

fn spec() -> TaskSpec {
    TaskSpec {
        template: TaskTemplate {
            driver: "exec".into(),
            command: "true".into(),
            ..TaskTemplate::default()
        },
        ..TaskSpec::default()
    }
}

fn status(state: TaskState) -> TaskStatus {
    TaskStatus {
        state: Some(state),
        attempt: 1,
        robot: Some("r1".into()),
        dispatch_time: Some(t(0)),
        ..TaskStatus::default()
    }
}

fn record(attempt: u32, reason: TaskReason) -> AttemptRecord {
    AttemptRecord {
        start_time: None,
        attempt,
        robot: Some("r1".into()),
        state: TaskState::Failed,
        exit_code: None,
        reason: Some(reason),
        message: None,
        finish_time: None,
    }
}

fn up(at: i64) -> RobotHealth {
    RobotHealth::heard_at(t(at))
}

fn is_fail(step: &Step, want: TaskReason) -> bool {
    matches!(step, Step::Fail { reason, .. } if *reason == want)
}

fn cfg() -> LifecycleConfig {
    LifecycleConfig {
        dispatch_timeout: Duration::from_secs(30),
        robot_lost_grace: Duration::from_secs(10),
        unleased_record_lag: Duration::ZERO,
        lease_interval: Duration::ZERO,
        backstop_grace: Duration::from_secs(5),
        lost_retries: 2,
    }
}

#[test]
fn backoff_doubles_up_to_the_cap() {
    let p = policy(10, "1s", "5s");
    let got: Vec<u64> = (0..5).map(|i| backoff(&p, i).as_secs()).collect();
    assert_eq!(got, vec![1, 2, 4, 5, 5]);
    assert_eq!(backoff(&p, 200), Duration::from_secs(5), "no overflow");
    let defaults = RestartPolicy {
        attempts: 1,
        delay: None,
        max_delay: None,
        mode: RestartMode::Fail,
        lost_retries: None,
        condition_restarts: None,
    };
    assert_eq!(backoff(&defaults, 0), DEFAULT_RESTART_DELAY);
    assert_eq!(backoff(&defaults, 30), DEFAULT_RESTART_MAX_DELAY);
}

#[test]
fn retries_count_against_the_policy() {
    let p = policy(2, "1s", "1m");
    let mut s = status(TaskState::Failed);
    s.reason = Some(TaskReason::Error);
    assert_eq!(retry_delay(&s, Some(&p), &cfg()), Some(Duration::from_secs(1)));
    s.attempts.push(record(1, TaskReason::Error));
    assert_eq!(retry_delay(&s, Some(&p), &cfg()), Some(Duration::from_secs(2)));
    s.attempts.push(record(2, TaskReason::Timeout));
    assert_eq!(retry_delay(&s, Some(&p), &cfg()), None, "two retries used");
    assert_eq!(
        retry_delay(&status(TaskState::Failed), None, &cfg()),
        None,
        "no policy"
    );
}

#[test]
fn lost_robots_do_not_use_up_the_policy() {
    let mut s = status(TaskState::Failed);
    s.reason = Some(TaskReason::RobotLost);
    assert_eq!(retry_delay(&s, None, &cfg()), Some(Duration::ZERO));
    s.attempts.push(record(1, TaskReason::DispatchTimeout));
    assert_eq!(retry_delay(&s, None, &cfg()), Some(Duration::ZERO));
    s.reason = Some(TaskReason::Disconnected);
    assert_eq!(
        retry_delay(&s, None, &cfg()),
        Some(Duration::ZERO),
        "an attempt its robot fenced is not the task's fault"
    );
    s.attempts.push(record(2, TaskReason::NotOnRobot));
    assert_eq!(retry_delay(&s, None, &cfg()), None, "lost budget used");
    s.reason = Some(TaskReason::Error);
    let p = policy(1, "3s", "1m");
    assert_eq!(
        retry_delay(&s, Some(&p), &cfg()),
        Some(Duration::from_secs(3)),
        "own failures are counted apart"
    );
}

#[test]
fn a_lost_start_condition_uses_no_retry_up_to_its_own_limit() {
    let mut s = status(TaskState::Failed);
    s.reason = Some(TaskReason::ConditionLost);
    // Four e-stop presses: each next attempt waits for the condition, and
    // neither the lost budget (2 here) nor the policy's retries are used.
    for attempt in 1..=4 {
        assert_eq!(
            retry_delay(&s, None, &cfg()),
            Some(Duration::ZERO),
            "press {attempt}"
        );
        assert_eq!(exhausted(&s, None, &cfg()), None);
        s.attempts.push(record(attempt, TaskReason::ConditionLost));
    }
    s.reason = Some(TaskReason::RobotLost);
    assert_eq!(
        retry_delay(&s, None, &cfg()),
        Some(Duration::ZERO),
        "the lost budget is untouched by the presses"
    );
    s.reason = Some(TaskReason::Error);
    let p = policy(1, "3s", "1m");
    assert_eq!(retry_delay(&s, Some(&p), &cfg()), Some(Duration::from_secs(3)));
    // The template sets the limit; past it the task fails, and says why.
    s.reason = Some(TaskReason::ConditionLost);
    let limited = RestartPolicy {
        condition_restarts: Some(4),
        ..policy(0, "1s", "1m")
    };
    assert_eq!(retry_delay(&s, Some(&limited), &cfg()), None);
    let note = exhausted(&s, Some(&limited), &cfg()).unwrap();
    assert!(note.contains("conditionRestarts"), "{note}");
    assert!(note.contains("5 times"), "{note}");
}

#[test]
fn an_agent_shutdown_uses_no_retry_and_backs_off_when_it_repeats() {
    let mut s = status(TaskState::Failed);
    s.reason = Some(TaskReason::AgentShutdown);
    // No policy, the lost budget (2) spent: still a new attempt, at once.
    s.attempts.push(record(1, TaskReason::RobotLost));
    s.attempts.push(record(2, TaskReason::RobotLost));
    assert_eq!(retry_delay(&s, None, &cfg()), Some(NOT_READY_DELAY));
    assert_eq!(exhausted(&s, None, &cfg()), None);
    // A shutting-down agent refusing dispatch after dispatch: the wait grows.
    for attempt in 3..12 {
        s.attempts.push(record(attempt, TaskReason::AgentShutdown));
    }
    let long = retry_delay(&s, None, &cfg()).unwrap();
    assert!(
        long > Duration::from_secs(10) && long <= NOT_READY_MAX_DELAY,
        "{long:?}"
    );
}

#[test]
fn a_job_sets_its_own_lost_budget_and_an_exhausted_one_is_named() {
    let mut s = status(TaskState::Failed);
    s.reason = Some(TaskReason::RobotLost);
    s.attempts.push(record(1, TaskReason::RobotLost));
    s.attempts.push(record(2, TaskReason::DispatchTimeout));
    assert_eq!(retry_delay(&s, None, &cfg()), None, "the manager's 2");
    let note = exhausted(&s, None, &cfg()).unwrap();
    assert!(note.contains("lostRetries"), "{note}");
    let generous = RestartPolicy {
        lost_retries: Some(5),
        ..policy(0, "1s", "1m")
    };
    assert_eq!(retry_delay(&s, Some(&generous), &cfg()), Some(Duration::ZERO));
    assert_eq!(exhausted(&s, Some(&generous), &cfg()), None);
    let strict = RestartPolicy {
        lost_retries: Some(0),
        ..policy(0, "1s", "1m")
    };
    s.attempts.clear();
    assert_eq!(retry_delay(&s, Some(&strict), &cfg()), None);
    // A cancel is no budget running out.
    s.reason = Some(TaskReason::Cancelled);
    assert_eq!(exhausted(&s, Some(&strict), &cfg()), None);
}

#[test]
fn a_robot_not_ready_or_drained_uses_no_retry() {
    let p = policy(1, "1s", "1m");
    let mut s = status(TaskState::Failed);
    s.attempt = 5;
    // Both budgets used up: one own failure, two lost robots.
    s.attempts = vec![
        record(1, TaskReason::Error),
        record(2, TaskReason::RobotLost),
        record(3, TaskReason::DispatchTimeout),
        record(4, TaskReason::Drained),
    ];
    s.reason = Some(TaskReason::NotReady);
    assert_eq!(retry_delay(&s, Some(&p), &cfg()), Some(NOT_READY_DELAY));
    assert_eq!(retry_delay(&s, None, &cfg()), Some(NOT_READY_DELAY), "no policy");
    assert_eq!(
        next_step(&spec(), Some(&s), up(0), t(0), &cfg()),
        Step::Return {
            reason: TaskReason::NotReady,
            delay: NOT_READY_DELAY
        }
    );
    assert_eq!(effective_state(&spec(), Some(&s), &cfg()), TaskState::Pending);
    s.reason = Some(TaskReason::Drained);
    assert_eq!(
        next_step(&spec(), Some(&s), up(0), t(0), &cfg()),
        Step::Return {
            reason: TaskReason::Drained,
            delay: Duration::ZERO
        },
        "a drained task goes elsewhere at once"
    );
    // Ends that returned count in neither budget.
    s.attempts = vec![record(1, TaskReason::NotReady), record(2, TaskReason::Drained)];
    s.reason = Some(TaskReason::Error);
    assert_eq!(retry_delay(&s, Some(&p), &cfg()), Some(Duration::from_secs(1)));
    s.reason = Some(TaskReason::RobotLost);
    assert_eq!(retry_delay(&s, None, &cfg()), Some(Duration::ZERO));
}

#[test]
fn a_robot_that_keeps_refusing_as_not_ready_is_waited_for_longer() {
    let mut s = status(TaskState::Failed);
    s.reason = Some(TaskReason::NotReady);
    let after = |n: u32, s: &mut TaskStatus| {
        s.attempts = (1..=n).map(|a| record(a, TaskReason::NotReady)).collect();
        retry_delay(s, None, &cfg()).unwrap().as_millis()
    };
    let waits: Vec<u128> = [0, 3, 4, 5, 6, 100].iter().map(|n| after(*n, &mut s)).collect();
    assert_eq!(waits, [250, 250, 500, 1000, 2000, 60_000]);
    s.attempts.push(record(101, TaskReason::Error));
    assert_eq!(
        retry_delay(&s, None, &cfg()),
        Some(NOT_READY_DELAY),
        "only ends in a row"
    );
}

#[test]
fn an_evicted_attempt_ends_drained_whatever_its_robot_says() {
    let p = policy(0, "1s", "1m");
    let mut s = status(TaskState::Running);
    s.eviction = Some(k8s4r_api::ManualAction {
        value: "drain-1".into(),
        attempt: 1,
        at: t(0),
        ..Default::default()
    });
    assert!(
        matches!(next_step(&spec(), Some(&s), up(0), t(1), &cfg()), Step::Wait(_)),
        "it runs until its robot reports its end"
    );
    for said in [
        TaskReason::Drained,
        TaskReason::Cancelled,
        TaskReason::Error,
        TaskReason::RobotLost,
    ] {
        s.state = Some(TaskState::Failed);
        s.reason = Some(said);
        assert_eq!(
            next_step(&spec(), Some(&s), up(0), t(1), &cfg()),
            Step::Return {
                reason: TaskReason::Drained,
                delay: Duration::ZERO
            },
            "{said:?}"
        );
        assert_eq!(retry_delay(&s, Some(&p), &cfg()), Some(Duration::ZERO));
    }
    s.state = Some(TaskState::Completed);
    assert_eq!(
        next_step(&spec(), Some(&s), up(0), t(1), &cfg()),
        Step::Done,
        "it finished first"
    );
    // An eviction of an earlier attempt says nothing about this one.
    s.attempt = 2;
    s.state = Some(TaskState::Failed);
    s.reason = Some(TaskReason::Cancelled);
    assert_eq!(next_step(&spec(), Some(&s), up(0), t(1), &cfg()), Step::Done);
    // A person's cancel wins over a drain.
    s.attempt = 1;
    s.cancellation = s.eviction.clone();
    assert_eq!(retry_delay(&s, Some(&p), &cfg()), None);
}

#[test]
fn a_lost_condition_is_not_the_tasks_fault() {
    let mut s = status(TaskState::Failed);
    s.reason = Some(TaskReason::ConditionLost);
    assert_eq!(
        retry_delay(&s, None, &cfg()),
        Some(Duration::ZERO),
        "no policy needed"
    );
    s.attempts = vec![
        record(1, TaskReason::ConditionLost),
        record(2, TaskReason::RobotLost),
    ];
    assert_eq!(
        retry_delay(&s, None, &cfg()),
        Some(Duration::ZERO),
        "a lost condition has its own budget: one of the lost budget's 2 is used"
    );
    s.attempts.push(record(3, TaskReason::NotOnRobot));
    assert_eq!(
        retry_delay(&s, None, &cfg()),
        Some(Duration::ZERO),
        "conditions are counted apart"
    );
    s.reason = Some(TaskReason::Error);
    let p = policy(1, "3s", "1m");
    assert_eq!(retry_delay(&s, Some(&p), &cfg()), Some(Duration::from_secs(3)));
}

#[test]
fn invalid_or_cancelled_attempts_are_not_retried() {
    let p = policy(5, "1s", "1m");
    for reason in [TaskReason::InvalidSpec, TaskReason::Cancelled] {
        let mut s = status(TaskState::Failed);
        s.reason = Some(reason);
        assert_eq!(retry_delay(&s, Some(&p), &cfg()), None);
    }
}

#[test]
fn pending_waits_for_its_backoff() {
    let mut s = status(TaskState::Pending);
    assert_eq!(next_step(&spec(), Some(&s), up(0), t(0), &cfg()), Step::Schedule);
    s.next_attempt_time = Some(t(10));
    assert_eq!(
        next_step(&spec(), Some(&s), up(0), t(4), &cfg()),
        Step::Wait(Some(Duration::from_secs(6)))
    );
    assert_eq!(next_step(&spec(), Some(&s), up(0), t(10), &cfg()), Step::Schedule);
    assert_eq!(
        next_step(&spec(), None, RobotHealth::Missing, t(0), &cfg()),
        Step::Schedule
    );
}

#[test]
fn a_dispatch_the_robot_may_have_taken_is_fenced_like_a_running_attempt() {
    let s = status(TaskState::Dispatching);
    // A robot heard from keeps its dispatch: the server fails it from
    // the robot's own list if it refused it.
    assert_eq!(
        next_step(&spec(), Some(&s), up(1000), t(1000), &cfg()),
        Step::Wait(Some(Duration::from_secs(135))),
        "only the fencing recheck: 120 + 5 + 10"
    );
    // A quiet robot may have started it just in time: fenced at
    // 20 + 120 + 5 + 10.
    assert_eq!(
        next_step(&spec(), Some(&s), up(20), t(40), &cfg()),
        Step::Wait(Some(Duration::from_secs(115)))
    );
    let step = next_step(&spec(), Some(&s), up(20), t(155), &cfg());
    assert!(is_fail(&step, TaskReason::RobotLost), "{step:?}");
}

#[test]
fn a_dispatch_still_waiting_for_its_robot_is_fenced_only_after_its_deadline() {
    // Dispatched at t(20) with a deadline at t(400); the robot was last
    // heard at t(20) and cut off: the dispatch waits in its broker
    // session, and the robot takes it, with fresh contact, if it comes
    // back before t(400). The fence (t(155)) alone is not enough.
    let mut s = status(TaskState::Dispatching);
    s.dispatch_time = Some(t(20));
    s.dispatch_deadline = Some(t(400));
    assert_eq!(
        next_step(&spec(), Some(&s), up(20), t(155), &cfg()),
        Step::Wait(Some(Duration::from_secs(255))),
        "the deadline plus the grace: 400 + 10"
    );
    let step = next_step(&spec(), Some(&s), up(20), t(410), &cfg());
    assert!(is_fail(&step, TaskReason::DispatchTimeout), "{step:?}");
    // Once it runs, the deadline no longer matters.
    s.state = Some(TaskState::Running);
    let step = next_step(&spec(), Some(&s), up(20), t(155), &cfg());
    assert!(is_fail(&step, TaskReason::RobotLost), "{step:?}");
}

#[test]
fn a_dispatch_past_its_deadline_fails_as_a_dispatch_timeout_that_says_so() {
    // Last heard at t(-300), before the cluster side restarted; dispatched
    // at t(0) with a deadline at t(60): the robot never connected since, so
    // it never had the dispatch. It fails once fenced, and the message does
    // not claim the robot stopped an attempt it never took.
    let mut s = status(TaskState::Dispatching);
    s.dispatch_deadline = Some(t(60));
    assert_eq!(
        next_step(&spec(), Some(&s), up(-300), t(30), &cfg()),
        Step::Wait(Some(Duration::from_secs(40)))
    );
    // Past the deadline it still waits for the fence (dispatch plus the
    // fencing time): the robot may have taken it unrecorded.
    let step = next_step(&spec(), Some(&s), up(-300), t(70), &cfg());
    assert!(matches!(step, Step::Wait(_)), "{step:?}");
    match next_step(&spec(), Some(&s), up(-300), t(140), &cfg()) {
        Step::Fail { reason, message } => {
            assert_eq!(reason, TaskReason::DispatchTimeout);
            assert!(
                message.contains("did not acknowledge attempt 1 before its dispatch deadline"),
                "{message}"
            );
            assert!(!message.contains("stopped"), "{message}");
        }
        step => panic!("{step:?}"),
    }
    // Without replacement the attempt waits for its robot: a robot that
    // seemed silent may have taken it while its contact went unrecorded
    // (a server restart), and failing it would run it twice.
    let mut keep = spec();
    keep.disconnect = Some(DisconnectPolicy {
        replace: Some(false),
        ..Default::default()
    });
    let step = next_step(&keep, Some(&s), up(-300), t(70), &cfg());
    assert!(matches!(step, Step::Wait(_)), "{step:?}");
    // A robot heard from since the dispatch may have taken it: the
    // server's reading of its list decides, or the fence.
    let step = next_step(&spec(), Some(&s), up(5), t(70), &cfg());
    assert!(matches!(step, Step::Wait(_)), "{step:?}");
}

#[test]
fn a_silent_robots_attempt_is_replaced_only_once_it_is_fenced() {
    let s = status(TaskState::Running);
    // Heard at t(100); stopAfter 120 s (default), kill timeout 5 s
    // (default), grace 10 s: the robot has stopped it by t(235).
    assert_eq!(
        next_step(&spec(), Some(&s), up(100), t(200), &cfg()),
        Step::Wait(Some(Duration::from_secs(35)))
    );
    let step = next_step(&spec(), Some(&s), up(100), t(235), &cfg());
    assert!(is_fail(&step, TaskReason::RobotLost), "{step:?}");
    // The server renews Leases only every 60 s: the fence moves by that.
    let lagging = RobotHealth::Known {
        last_heard: Some(t(100)),
        record_lag: Duration::from_secs(60),
    };
    assert_eq!(
        next_step(&spec(), Some(&s), lagging, t(235), &cfg()),
        Step::Wait(Some(Duration::from_secs(60)))
    );
    let mut short = spec();
    short.disconnect = Some(DisconnectPolicy {
        stop_after: Some("10s".into()),
        ..Default::default()
    });
    short.template.kill_timeout = Some("2s".into());
    let step = next_step(&short, Some(&s), up(100), t(122), &cfg());
    assert!(is_fail(&step, TaskReason::RobotLost), "10 + 2 + 10 after t(100)");
    let step = next_step(&spec(), Some(&s), RobotHealth::Missing, t(0), &cfg());
    assert!(is_fail(&step, TaskReason::RobotLost), "{step:?}");
}

#[test]
fn a_fresh_dispatch_to_a_long_quiet_robot_is_not_failed_at_once() {
    // Heard at t(100), dispatched at t(300): fenced 135 s after the
    // dispatch, not at once (which would burn every retry in a burst).
    let mut s = status(TaskState::Dispatching);
    s.dispatch_time = Some(t(300));
    assert_eq!(
        next_step(&spec(), Some(&s), up(100), t(301), &cfg()),
        Step::Wait(Some(Duration::from_secs(134)))
    );
    let step = next_step(&spec(), Some(&s), up(100), t(435), &cfg());
    assert!(is_fail(&step, TaskReason::RobotLost), "{step:?}");
}

#[test]
fn without_replacement_an_attempt_waits_for_its_robot() {
    let mut sp = spec();
    sp.disconnect = Some(DisconnectPolicy {
        replace: Some(false),
        ..Default::default()
    });
    let s = status(TaskState::Running);
    assert_eq!(
        next_step(&sp, Some(&s), up(100), t(10_000), &cfg()),
        Step::Wait(Some(Duration::from_secs(60)))
    );
}

#[test]
fn timeout_backstop_counts_from_when_the_cluster_saw_the_attempt_run() {
    let mut sp = spec();
    sp.template.timeout = Some("10s".into());
    sp.template.kill_timeout = Some("2s".into());
    let mut s = status(TaskState::Running);
    // The robot's clock says it started an hour ago; the server saw it
    // running at t(0).
    s.start_time = Some(t(-3600));
    s.observed_running_time = Some(t(0));
    assert_eq!(
        next_step(&sp, Some(&s), up(10), t(10), &cfg()),
        Step::Wait(Some(Duration::from_secs(7)))
    );
    let step = next_step(&sp, Some(&s), up(17), t(17), &cfg());
    assert!(is_fail(&step, TaskReason::TimeoutBackstop), "{step:?}");
    assert_eq!(
        next_step(&spec(), Some(&s), up(1000), t(1000), &cfg()),
        Step::Wait(Some(Duration::from_secs(135))),
        "no timeout, no backstop: only the fencing recheck"
    );
    sp.template.timeout = Some("100000d".into());
    assert!(
        matches!(next_step(&sp, Some(&s), up(17), t(17), &cfg()), Step::Wait(_)),
        "a huge timeout saturates instead of overflowing"
    );
}

#[test]
fn failed_tasks_retry_or_finish() {
    let mut sp = spec();
    sp.restart_policy = Some(policy(1, "2s", "1m"));
    let mut s = status(TaskState::Failed);
    s.reason = Some(TaskReason::Error);
    assert_eq!(
        next_step(&sp, Some(&s), up(0), t(0), &cfg()),
        Step::Retry {
            delay: Duration::from_secs(2)
        }
    );
    assert_eq!(effective_state(&sp, Some(&s), &cfg()), TaskState::Pending);
    s.attempts.push(record(1, TaskReason::Error));
    assert_eq!(next_step(&sp, Some(&s), up(0), t(0), &cfg()), Step::Done);
    assert_eq!(effective_state(&sp, Some(&s), &cfg()), TaskState::Failed);
    let done = status(TaskState::Completed);
    assert_eq!(
        next_step(&sp, Some(&done), RobotHealth::Missing, t(0), &cfg()),
        Step::Done
    );
}

#[test]
fn a_dispatch_no_server_began_to_send_fails_after_its_deadline_whatever_the_robot() {
    // Dispatched at t(0), deadline t(60), grace 10 s; the robot is heard
    // all along, so the fence never fails it: only the record of sending
    // (none yet: 0) tells that no robot can hold it.
    let mut s = status(TaskState::Dispatching);
    s.dispatch_deadline = Some(t(60));
    assert_eq!(
        never_sent(Some(&s), 0, t(69), &cfg()),
        None,
        "before deadline + grace"
    );
    match never_sent(Some(&s), 0, t(70), &cfg()) {
        Some(Step::Fail { reason, message }) => {
            assert_eq!(reason, TaskReason::DispatchTimeout);
            assert!(
                message.contains("attempt 1 was never sent to robot r1"),
                "{message}"
            );
        }
        step => panic!("{step:?}"),
    }
    // The robot's own health plays no part: next_step alone waits.
    assert!(matches!(
        next_step(&spec(), Some(&s), up(69), t(70), &cfg()),
        Step::Wait(_)
    ));
    // A server recorded it as being sent: the robot may hold it, and the
    // usual rules (its list, or its silence) decide.
    assert_eq!(never_sent(Some(&s), 1, t(500), &cfg()), None);
    // An earlier attempt's record does not count for this one.
    s.attempt = 2;
    assert!(never_sent(Some(&s), 1, t(500), &cfg()).is_some());
    // Only a dispatching attempt: one running was sent.
    s.state = Some(TaskState::Running);
    assert_eq!(never_sent(Some(&s), 0, t(500), &cfg()), None);
    assert_eq!(never_sent(None, 0, t(500), &cfg()), None);
}

#[test]
fn a_lease_shortened_by_another_writer_moves_no_fence_earlier() {
    let cfg = LifecycleConfig::default();
    // The server's own Lease of a robot at work: 180 s, renewed every 60 s.
    assert_eq!(record_lag(Some(180), &cfg), Duration::from_secs(60));
    // Someone set 3 s: read as the server's interval all the same.
    assert_eq!(record_lag(Some(3), &cfg), record_lag(Some(180), &cfg));
    assert_eq!(record_lag(Some(-5), &cfg), cfg.lease_interval);
    // An idle robot's long promise is honoured.
    assert_eq!(record_lag(Some(1800), &cfg), Duration::from_secs(600));
    assert_eq!(record_lag(None, &cfg), cfg.unleased_record_lag);
}

#[test]
fn an_attempt_never_sent_for_its_configuration_waits_again_or_fails_for_good() {
    let p = policy(3, "1s", "1m");
    let mut s = status(TaskState::Failed);
    // An object gone between placement and dispatch: back to waiting, no
    // retry used, backing off as a robot that is not ready does.
    s.reason = Some(TaskReason::ConfigMissing);
    assert_eq!(retry_delay(&s, Some(&p), &cfg()), Some(NOT_READY_DELAY));
    assert_eq!(retry_delay(&s, None, &cfg()), Some(NOT_READY_DELAY), "no policy");
    assert_eq!(exhausted(&s, None, &cfg()), None);
    // A configuration that cannot be given: retrying would be refused
    // again, whatever the policy.
    s.reason = Some(TaskReason::ConfigInvalid);
    assert_eq!(retry_delay(&s, Some(&p), &cfg()), None);
    assert_eq!(exhausted(&s, Some(&p), &cfg()), None, "not a budget used up");
}
