//! The runner driven through its handle with the fake driver, on tokio's
//! paused clock: deadlines fire the moment everything else is idle, so the
//! signal times below are exact and no test waits in real time.

use std::time::Duration;

use std::sync::Arc;

use k8s4r_api::{
    DurationString, LocalRestart, LocalRestartMode, TaskAttempt, TaskKind, TaskReason, TaskResources,
    TaskState, TaskTemplate,
};
use nix::sys::signal::Signal;
use tokio::sync::mpsc;
use tokio::time::Instant;

use super::Runner;
use crate::supervisor::disk::DiskSize;
use crate::supervisor::fake::{self, FakeDriver};
use crate::supervisor::startup::Parts;
use crate::supervisor::{
    Policy, Restarted, Submit, SupervisorConfig, SupervisorHandle, TaskEvent, TaskOutcome, TaskRequest,
};

/// How long (on the paused clock) an awaited event may take.
const PATIENCE: Duration = Duration::from_secs(3600);

fn task(command: &str) -> TaskTemplate {
    TaskTemplate {
        driver: fake::DRIVER.to_owned(),
        command: command.to_owned(),
        ..TaskTemplate::default()
    }
}

trait TemplateExt {
    fn with_args(self, args: &[&str]) -> Self;
    fn with_timeout(self, timeout: &str) -> Self;
    fn with_kill_timeout(self, kill_timeout: &str) -> Self;
}

impl TemplateExt for TaskTemplate {
    fn with_args(mut self, args: &[&str]) -> Self {
        self.args = args.iter().map(|a| (*a).to_owned()).collect();
        self
    }
    fn with_timeout(mut self, timeout: &str) -> Self {
        self.timeout = Some(DurationString::from(timeout));
        self
    }
    fn with_kill_timeout(mut self, kill_timeout: &str) -> Self {
        self.kill_timeout = Some(DurationString::from(kill_timeout));
        self
    }
}

/// A runner on a fresh state dir with only the fake driver.
struct Harness {
    handle: SupervisorHandle,
    events: mpsc::UnboundedReceiver<TaskEvent>,
    fake: FakeDriver,
    _state_dir: tempfile::TempDir,
}

impl Harness {
    fn start() -> Self {
        Self::with(|_| {})
    }

    /// A runner whose config `adjust` changes.
    fn with(adjust: impl FnOnce(&mut SupervisorConfig)) -> Self {
        Self::with_runner(adjust, |_| {})
    }

    fn with_runner(
        adjust: impl FnOnce(&mut SupervisorConfig),
        before_run: impl FnOnce(&std::sync::atomic::AtomicBool),
    ) -> Self {
        let state_dir = tempfile::tempdir().unwrap();
        let mut config = SupervisorConfig {
            state_dir: state_dir.path().to_path_buf(),
            // The fake answers to raw_exec, and these tests may run as root.
            policy: Policy {
                raw_exec: true,
                allow_root: true,
                ..SupervisorConfig::default().policy
            },
            disk_reserve: Some(DiskSize::Bytes(1 << 20)),
            ..SupervisorConfig::default()
        };
        adjust(&mut config);
        let fake = FakeDriver::default();
        let (events_tx, events) = mpsc::unbounded_channel();
        let (commands, commands_rx) = mpsc::unbounded_channel();
        let journal_alive = Arc::new(std::sync::atomic::AtomicBool::new(true));
        let parts = Parts {
            launchers: vec![Arc::new(fake.clone())],
            cgroups: None,
            journal: crate::supervisor::journal::inline::start(Arc::clone(&journal_alive)),
        };
        let (runner, health, offer) = Runner::new(config, events_tx, parts).unwrap();
        let outputs = runner.outputs.clone();
        before_run(&journal_alive);
        tokio::spawn(runner.run(commands_rx));
        Harness {
            handle: SupervisorHandle {
                commands,
                health,
                offer,
                held_at_start: Vec::new(),
                leases_at_start: Vec::new(),
                outputs,
            },
            events,
            fake,
            _state_dir: state_dir,
        }
    }

    async fn submit(&self, uid: &str, attempt: u32, spec: TaskTemplate) -> Submit {
        let req = TaskRequest {
            uid: uid.to_owned(),
            attempt,
            name: uid.to_owned(),
            spec,
            stop_after: None,
            config: None,
        };
        self.handle.submit(req).await.unwrap()
    }

    /// Submits attempt 1 of `uid` and waits for it to start; returns when
    /// its fake process started.
    async fn run(&mut self, uid: &str, spec: TaskTemplate) -> Instant {
        assert_eq!(self.submit(uid, 1, spec).await, Submit::Accepted);
        self.started(uid).await;
        self.fake.started(uid, 1).expect("a fake process").0
    }

    async fn next_event(&mut self) -> TaskEvent {
        tokio::time::timeout(PATIENCE, self.events.recv())
            .await
            .expect("no event came")
            .expect("the runner stopped")
    }

    /// The next event, which must be `uid`'s Started; returns its pid.
    async fn started(&mut self, uid: &str) -> u32 {
        match self.next_event().await {
            TaskEvent::Started { uid: u, pid, .. } if u == uid => pid,
            other => panic!("expected {uid} to start, got {other:?}"),
        }
    }

    /// The next event, which must be `uid`'s Started again by a restart on
    /// the robot; returns what the restart says.
    async fn restarted(&mut self, uid: &str) -> Restarted {
        match self.next_event().await {
            TaskEvent::Started {
                uid: u,
                restarted: Some(r),
                ..
            } if u == uid => r,
            other => panic!("expected {uid} to restart, got {other:?}"),
        }
    }

    /// The next event, which must be `uid`'s Finished.
    async fn finished(&mut self, uid: &str) -> TaskOutcome {
        match self.next_event().await {
            TaskEvent::Finished { uid: u, outcome, .. } if u == uid => outcome,
            other => panic!("expected {uid} to finish, got {other:?}"),
        }
    }
}

/// An attempt as the supervisor lists it (the test requests are named
/// after their uid).
fn attempt(uid: &str, attempt: u32) -> TaskAttempt {
    TaskAttempt::new(uid, attempt).named(Some(uid.to_owned()))
}

#[tokio::test(start_paused = true)]
async fn a_task_runs_until_its_process_exits() {
    let mut s = Harness::start();
    let spec = task("sleep").with_args(&["hello", "robot"]);
    assert_eq!(s.submit("a", 1, spec).await, Submit::Accepted);
    let pid = s.started("a").await;
    assert_eq!(s.fake.started("a", 1).map(|(_, pid)| pid), Some(pid));
    assert_eq!(s.handle.running().await, vec![attempt("a", 1)]);

    s.fake.exit("a", 1, 0);
    let outcome = s.finished("a").await;
    assert_eq!(
        (outcome.state, outcome.reason, outcome.exit_code, outcome.signal),
        (TaskState::Completed, TaskReason::Completed, Some(0), None)
    );
    assert!(outcome.started_at.is_some());
    assert_eq!(outcome.output_tail, "hello robot\n");
    assert!(s.handle.running().await.is_empty());
}

#[tokio::test(start_paused = true)]
async fn a_timeout_sends_sigterm_then_sigkill_after_the_kill_timeout() {
    let mut s = Harness::start();
    let t0 = s
        .run("t", task("stubborn").with_timeout("10s").with_kill_timeout("5s"))
        .await;

    let outcome = s.finished("t").await;
    assert_eq!(
        s.fake.signals_while_alive("t", 1),
        vec![
            (Signal::SIGTERM, t0 + Duration::from_secs(10)),
            (Signal::SIGKILL, t0 + Duration::from_secs(15)),
        ]
    );
    assert_eq!(
        (outcome.state, outcome.reason, outcome.exit_code, outcome.signal),
        (TaskState::Failed, TaskReason::Timeout, Some(137), Some(9))
    );
    assert_eq!(
        outcome.message,
        "timed out after 10s: killed by SIGKILL after the kill timeout of 5s"
    );
    let stats = s.handle.stats().await;
    assert_eq!((stats.sigterm_late.count(), stats.sigkill_late.count()), (1, 1));
    assert_eq!(
        stats.sigterm_late.max(),
        Duration::ZERO,
        "the paused clock is never late"
    );
}

#[tokio::test(start_paused = true)]
async fn a_timeout_obeyed_at_sigterm_is_143() {
    let mut s = Harness::start();
    let t0 = s.run("t", task("sleep").with_timeout("2s")).await;

    let outcome = s.finished("t").await;
    assert_eq!(
        s.fake.signals_while_alive("t", 1),
        vec![(Signal::SIGTERM, t0 + Duration::from_secs(2))]
    );
    assert_eq!(
        (outcome.reason, outcome.exit_code, outcome.signal),
        (TaskReason::Timeout, Some(143), Some(15))
    );
}

#[tokio::test(start_paused = true)]
async fn cancel_terminates_a_running_task() {
    let mut s = Harness::start();
    s.run("c", task("sleep").with_timeout("1h")).await;

    let cancelled_at = Instant::now();
    s.handle.cancel("c", Some(1), "task deleted".to_owned()).await;
    let outcome = s.finished("c").await;
    assert_eq!(
        s.fake.signals_while_alive("c", 1),
        vec![(Signal::SIGTERM, cancelled_at)]
    );
    assert_eq!(
        (outcome.reason, outcome.exit_code, outcome.signal),
        (TaskReason::Cancelled, Some(143), Some(15))
    );
    assert!(outcome.message.contains("task deleted"), "{}", outcome.message);
}

#[tokio::test(start_paused = true)]
async fn a_cancel_escalates_once_from_the_first_request() {
    let mut s = Harness::start();
    s.run("c", task("stubborn").with_kill_timeout("5s")).await;

    let cancelled_at = Instant::now();
    s.handle.cancel("c", None, "first".to_owned()).await;
    tokio::time::advance(Duration::from_secs(3)).await;
    // A second request neither restarts the kill timeout nor changes why.
    s.handle.cancel("c", None, "second".to_owned()).await;
    let outcome = s.finished("c").await;
    assert_eq!(
        s.fake.signals_while_alive("c", 1),
        vec![
            (Signal::SIGTERM, cancelled_at),
            (Signal::SIGKILL, cancelled_at + Duration::from_secs(5)),
        ]
    );
    assert_eq!(
        (outcome.reason, outcome.exit_code),
        (TaskReason::Cancelled, Some(137))
    );
    assert!(
        outcome.message.starts_with("cancelled (first)"),
        "{}",
        outcome.message
    );
}

#[tokio::test(start_paused = true)]
async fn a_redelivered_dispatch_is_ignored() {
    let mut s = Harness::start();
    assert_eq!(s.submit("d", 1, task("sleep")).await, Submit::Accepted);
    s.started("d").await;
    assert_eq!(
        s.submit("d", 1, task("sleep")).await,
        Submit::Duplicate,
        "while it runs"
    );

    s.fake.exit("d", 1, 0);
    s.finished("d").await;
    assert_eq!(
        s.submit("d", 1, task("sleep")).await,
        Submit::Duplicate,
        "once it is over"
    );
    assert_eq!(s.fake.starts(), 1);

    assert_eq!(
        s.submit("d", 2, task("sleep")).await,
        Submit::Accepted,
        "a new attempt"
    );
    s.started("d").await;
    assert_eq!(s.fake.starts(), 2);
}

#[tokio::test(start_paused = true)]
async fn a_start_error_fails_only_that_task() {
    let mut s = Harness::start();
    s.run("ok", task("sleep")).await;

    assert_eq!(s.submit("bad", 1, task("missing")).await, Submit::Accepted);
    let outcome = s.finished("bad").await;
    assert_eq!(
        (outcome.state, outcome.reason, outcome.started_at),
        (TaskState::Failed, TaskReason::StartFailed, None)
    );
    assert_eq!(outcome.message, "command \"missing\" not found");
    assert_eq!(s.handle.running().await, vec![attempt("ok", 1)]);

    s.fake.exit("ok", 1, 3);
    let outcome = s.finished("ok").await;
    assert_eq!((outcome.reason, outcome.exit_code), (TaskReason::Error, Some(3)));
}

#[tokio::test(start_paused = true)]
async fn a_huge_timeout_fails_its_task_and_the_supervisor_runs_on() {
    let mut s = Harness::start();
    for (uid, timeout) in [
        ("years", "3y"),
        ("overflow", "18446744073709551615s"),
        ("huge", "100000d"),
    ] {
        assert_eq!(
            s.submit(uid, 1, task("sleep").with_timeout(timeout)).await,
            Submit::Accepted
        );
        let outcome = s.finished(uid).await;
        assert_eq!(
            (outcome.state, outcome.reason),
            (TaskState::Failed, TaskReason::InvalidSpec),
            "{uid}"
        );
        assert!(
            outcome.message.contains("spec.timeout"),
            "{uid}: {}",
            outcome.message
        );
    }
    // The longest timeout allowed is armed, and the same supervisor still
    // enforces an ordinary one to the tick.
    s.run("month", task("sleep").with_timeout("30d")).await;
    let t0 = s.run("ok", task("sleep").with_timeout("10s")).await;
    let outcome = s.finished("ok").await;
    assert_eq!(outcome.reason, TaskReason::Timeout);
    assert_eq!(
        s.fake.signals_while_alive("ok", 1),
        vec![(Signal::SIGTERM, t0 + Duration::from_secs(10))]
    );
    assert_eq!(s.handle.running().await, vec![attempt("month", 1)]);
}

#[tokio::test(start_paused = true)]
async fn beyond_max_tasks_a_dispatch_is_refused_and_the_rest_run_on() {
    let mut s = Harness::with(|c| c.max_tasks = 2);
    s.run("one", task("sleep")).await;
    s.run("two", task("sleep")).await;
    assert_eq!(s.submit("three", 1, task("sleep")).await, Submit::Accepted);
    let outcome = s.finished("three").await;
    assert_eq!(
        (outcome.state, outcome.reason),
        (TaskState::Failed, TaskReason::OverCapacity)
    );
    assert_eq!(
        outcome.message,
        "this robot already holds its maximum of 2 tasks (max_tasks)"
    );
    assert_eq!(s.handle.health().borrow().tasks, 2);
    s.fake.exit("one", 1, 0);
    s.finished("one").await;
    s.run("four", task("sleep")).await;
    assert_eq!(
        s.handle.running().await,
        vec![attempt("four", 1), attempt("two", 1)]
    );
}

#[tokio::test(start_paused = true)]
async fn a_disk_request_beyond_the_budget_is_refused() {
    let mut s = Harness::with(|c| c.disk_budget = DiskSize::Bytes(100 << 20));
    let wants = |q: &str| TaskTemplate {
        resources: Some(TaskResources {
            disk: Some(q.into()),
            ..TaskResources::default()
        }),
        ..task("sleep")
    };
    s.run("sixty", wants("60Mi")).await;
    assert_eq!(s.submit("fifty", 1, wants("50Mi")).await, Submit::Accepted);
    let outcome = s.finished("fifty").await;
    assert_eq!(outcome.reason, TaskReason::OverCapacity);
    assert!(
        outcome
            .message
            .contains("does not fit: its tasks take 60.0 MiB of the robot's disk budget of 100.0 MiB"),
        "{}",
        outcome.message
    );
    s.run("forty", wants("40Mi")).await;
}

#[tokio::test(start_paused = true)]
async fn the_robots_policy_refuses_what_it_does_not_allow() {
    let mut s = Harness::with(|c| c.policy.raw_exec = false);
    assert_eq!(s.submit("raw", 1, task("sleep")).await, Submit::Accepted);
    let outcome = s.finished("raw").await;
    assert_eq!(outcome.reason, TaskReason::NotPermitted);
    assert!(
        outcome.message.contains("raw_exec driver is off"),
        "{}",
        outcome.message
    );
    assert_eq!(s.fake.starts(), 0);
    assert_eq!(
        s.handle.offer().drivers,
        Vec::<String>::new(),
        "only the fake, and it is raw_exec"
    );
}

#[tokio::test(start_paused = true)]
async fn a_dead_helper_thread_ends_the_supervisor_visibly() {
    let s = Harness::with_runner(
        |_| {},
        |journal_alive| journal_alive.store(false, std::sync::atomic::Ordering::Relaxed),
    );
    let mut health = s.handle.health();
    // The health channel closes: what the agent watches to exit non-zero.
    while health.changed().await.is_ok() {}
    let req = TaskRequest {
        uid: "late".to_owned(),
        attempt: 1,
        name: "late".to_owned(),
        spec: task("sleep"),
        stop_after: None,
        config: None,
    };
    assert!(s.handle.submit(req).await.is_err());
}

/// `spec` as a task of `kind` restarted on the robot `attempts` times
/// within an hour, 1s after the first exit, doubling up to 10s.
fn restarting(mut spec: TaskTemplate, kind: TaskKind, attempts: u32, mode: LocalRestartMode) -> TaskTemplate {
    spec.kind = kind;
    spec.restart = Some(LocalRestart {
        attempts,
        interval: Some(DurationString::from("1h")),
        delay: Some(DurationString::from("1s")),
        max_delay: Some(DurationString::from("10s")),
        mode,
    });
    spec
}

#[tokio::test(start_paused = true)]
async fn a_service_restarts_on_the_robot_with_backoff_until_its_restarts_are_used_up() {
    let mut s = Harness::start();
    let spec = restarting(task("sleep"), TaskKind::Service, 2, LocalRestartMode::Fail);
    s.run("svc", spec).await;

    // A service that exits 0 is restarted all the same, after `delay`.
    let exited = Instant::now();
    s.fake.exit("svc", 1, 0);
    let r = s.restarted("svc").await;
    assert_eq!((r.count, r.last_exit_code), (1, Some(0)));
    assert_eq!(
        s.fake.started("svc", 1).unwrap().0,
        exited + Duration::from_secs(1)
    );
    assert_eq!(s.handle.running().await, vec![attempt("svc", 1)]);

    // The next wait is doubled.
    let exited = Instant::now();
    s.fake.exit("svc", 1, 3);
    let r = s.restarted("svc").await;
    assert_eq!((r.count, r.last_exit_code), (2, Some(3)));
    assert_eq!(
        s.fake.started("svc", 1).unwrap().0,
        exited + Duration::from_secs(2)
    );

    // Two restarts within the hour are all it gets: the attempt fails.
    s.fake.exit("svc", 1, 4);
    let outcome = s.finished("svc").await;
    assert_eq!(
        (outcome.state, outcome.reason, outcome.exit_code),
        (TaskState::Failed, TaskReason::Error, Some(4))
    );
    assert!(
        outcome
            .message
            .contains("restarts on the robot are used up (2 so far)"),
        "{}",
        outcome.message
    );
    assert_eq!(s.fake.starts(), 3);
}

#[tokio::test(start_paused = true)]
async fn a_batch_task_is_restarted_after_failures_only() {
    let mut s = Harness::start();
    let spec = restarting(task("sleep"), TaskKind::Batch, 3, LocalRestartMode::Fail);
    s.run("b", spec).await;
    s.fake.exit("b", 1, 1);
    assert_eq!(s.restarted("b").await.last_exit_code, Some(1));
    s.fake.exit("b", 1, 0);
    let outcome = s.finished("b").await;
    assert_eq!(
        (outcome.state, outcome.exit_code),
        (TaskState::Completed, Some(0))
    );
    assert_eq!(s.fake.starts(), 2);
}

#[tokio::test(start_paused = true)]
async fn a_task_waiting_to_restart_is_cancelled_at_once_and_never_starts_again() {
    let mut s = Harness::start();
    let spec = restarting(task("sleep"), TaskKind::Service, 5, LocalRestartMode::Delay);
    s.run("w", spec).await;
    s.fake.exit("w", 1, 1);
    // Let the runner see the exit; the restart is a second away.
    tokio::time::sleep(Duration::from_millis(100)).await;
    let cancelled = Instant::now();
    s.handle.cancel("w", Some(1), "job deleted".to_owned()).await;
    let outcome = s.finished("w").await;
    assert_eq!(
        Instant::now(),
        cancelled,
        "a cancel does not wait for the restart timer"
    );
    assert_eq!(
        (outcome.state, outcome.reason),
        (TaskState::Failed, TaskReason::Cancelled)
    );
    assert!(outcome.message.contains("job deleted"), "{}", outcome.message);
    tokio::time::sleep(Duration::from_secs(10)).await;
    assert_eq!(s.fake.starts(), 1, "started again after its cancel");
    assert!(s.handle.running().await.is_empty());
}

#[tokio::test(start_paused = true)]
async fn a_timed_out_service_is_not_restarted() {
    let mut s = Harness::start();
    let spec = restarting(
        task("sleep").with_timeout("5s"),
        TaskKind::Service,
        5,
        LocalRestartMode::Fail,
    );
    s.run("t", spec).await;
    let outcome = s.finished("t").await;
    assert_eq!(outcome.reason, TaskReason::Timeout);
    assert_eq!(s.fake.starts(), 1);
}

/// A journal left by a run that ended without settling `attempt` 1 of
/// `uid`, which ran (in another boot) with `restarts` so far; `resume`
/// says whether the run recorded it as one to start again.
fn leave_journal(state_dir: &std::path::Path, uid: &str, spec: &TaskTemplate, restarts: u32, resume: bool) {
    use crate::supervisor::journal::{Record, Resume, Started};
    let task_dir = state_dir.join("tasks").join(format!("{uid}-1"));
    std::fs::create_dir_all(task_dir.join("work")).unwrap();
    std::fs::write(task_dir.join("work").join("kept"), b"state of the last run").unwrap();
    let records = [
        Record::Accepted {
            uid: uid.to_owned(),
            attempt: 1,
            task_dir,
            resume: resume.then(|| {
                Box::new(Resume {
                    name: uid.to_owned(),
                    spec: spec.clone(),
                    restart: true,
                    stop_after_ms: None,
                })
            }),
            adopt: None,
        },
        Record::Started {
            uid: uid.to_owned(),
            attempt: 1,
            at: Started {
                pid: 1 << 22,
                pgid: 1 << 22,
                pid_start: 1,
                pgid_start: 0,
                logger: false,
                boot_id: "a boot long gone".to_owned(),
                cgroup: None,
                task_uid: None,
                started_at: jiff::Timestamp::UNIX_EPOCH,
                restarts,
                asks: None,
            },
        },
    ];
    let lines: Vec<String> = records
        .iter()
        .map(|r| serde_json::to_string(r).unwrap())
        .collect();
    std::fs::write(state_dir.join("journal.jsonl"), lines.join("\n") + "\n").unwrap();
}

#[tokio::test(start_paused = true)]
async fn a_service_of_the_previous_run_starts_again_from_the_journal_with_its_directory() {
    let spec = restarting(task("sleep"), TaskKind::Service, 2, LocalRestartMode::Fail);
    let journal_spec = spec.clone();
    let mut s = Harness::with(move |config| leave_journal(&config.state_dir, "svc", &journal_spec, 4, true));
    let r = s.restarted("svc").await;
    assert_eq!(
        (r.count, r.last_exit_code),
        (5, None),
        "counts on from the journal"
    );
    assert_eq!(s.handle.running().await, vec![attempt("svc", 1)]);
    let kept = s._state_dir.path().join("tasks/svc-1/work/kept");
    assert_eq!(std::fs::read(kept).unwrap(), b"state of the last run");
    // The restart budget applies from here on: an exit restarts it.
    s.fake.exit("svc", 1, 1);
    assert_eq!(s.restarted("svc").await.count, 6);
}

#[tokio::test(start_paused = true)]
async fn an_attempt_not_recorded_to_resume_is_settled_as_before() {
    let spec = task("sleep");
    let mut s = Harness::with(move |config| leave_journal(&config.state_dir, "b", &spec, 0, false));
    let outcome = s.finished("b").await;
    assert_eq!(outcome.reason, TaskReason::AgentRestarted);
    assert_eq!(s.fake.starts(), 0);
}

#[tokio::test(start_paused = true)]
async fn a_fenced_service_is_recorded_to_be_re_adopted_never_to_start_again() {
    let mut s = Harness::start();
    let spec = restarting(task("sleep"), TaskKind::Service, 2, LocalRestartMode::Fail);
    let req = TaskRequest {
        uid: "f".to_owned(),
        attempt: 1,
        name: "f".to_owned(),
        spec: spec.clone(),
        stop_after: Some(Duration::from_secs(120)),
        config: None,
    };
    assert_eq!(s.handle.submit(req).await.unwrap(), Submit::Accepted);
    s.started("f").await;
    assert_eq!(s.submit("u", 1, spec).await, Submit::Accepted);
    s.started("u").await;
    let journal = std::fs::read_to_string(s._state_dir.path().join("journal.jsonl")).unwrap();
    let accepted = |uid: &str| {
        journal
            .lines()
            .map(|l| serde_json::from_str::<serde_json::Value>(l).unwrap())
            .find(|r| r["op"] == "accepted" && r["uid"] == uid)
            .unwrap()
    };
    // Re-adopted if it still runs, fenced from the last contact; never
    // started again from the journal (it may have been replaced): not a
    // `resume`, which an older agent rolled back to would start again.
    assert!(accepted("f").get("resume").is_none(), "{journal}");
    assert_eq!(accepted("f")["adopt"]["stopAfterMs"], 120_000, "{journal}");
    assert_eq!(accepted("u")["resume"]["spec"]["kind"], "service", "{journal}");
    assert!(accepted("u").get("adopt").is_none(), "{journal}");
}

/// `spec` with one TCP health check on `port` every second, unhealthy at
/// the second failure in a row.
fn tcp_checked(mut spec: TaskTemplate, port: u16) -> TaskTemplate {
    spec.checks = vec![k8s4r_api::HealthCheck {
        tcp: Some(k8s4r_api::TcpCheck { port, host: None }),
        interval: Some(DurationString::from("1s")),
        failure_threshold: Some(2),
        ..k8s4r_api::HealthCheck::default()
    }];
    spec
}

#[tokio::test(start_paused = true)]
async fn a_failing_health_check_stops_the_service_and_it_is_restarted() {
    let mut s = Harness::start();
    // A port nothing listens on.
    let port = {
        let listener = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
        listener.local_addr().unwrap().port()
    };
    let spec = tcp_checked(
        restarting(task("sleep"), TaskKind::Service, 1, LocalRestartMode::Fail),
        port,
    );
    let t0 = s.run("hc", spec).await;
    let r = s.restarted("hc").await;
    // First check at 1s, second at 2s: unhealthy, SIGTERM; restart 1s later.
    assert_eq!(
        s.fake.signals_while_alive("hc", 1).first().map(|(sig, _)| *sig),
        Some(Signal::SIGTERM)
    );
    assert!(
        Instant::now() >= t0 + Duration::from_secs(3),
        "restarted too early"
    );
    assert!(
        r.cause.contains(&format!(
            "health check tcp 127.0.0.1:{port} failed 2 times in a row"
        )),
        "{}",
        r.cause
    );
    // Still failing: its one restart is used up, and the attempt fails as unhealthy.
    let outcome = s.finished("hc").await;
    assert_eq!(
        (outcome.state, outcome.reason),
        (TaskState::Failed, TaskReason::Unhealthy)
    );
    assert!(outcome.message.contains("health check"), "{}", outcome.message);
}

#[tokio::test(start_paused = true)]
async fn a_passing_health_check_leaves_the_service_alone() {
    let mut s = Harness::start();
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let port = listener.local_addr().unwrap().port();
    let spec = tcp_checked(
        restarting(task("sleep"), TaskKind::Service, 1, LocalRestartMode::Fail),
        port,
    );
    s.run("ok", spec).await;
    for _ in 0..10 {
        let (conn, _) = tokio::time::timeout(Duration::from_secs(5), listener.accept())
            .await
            .expect("a check")
            .unwrap();
        drop(conn);
    }
    assert!(s.fake.signals_while_alive("ok", 1).is_empty());
    assert_eq!(s.fake.starts(), 1);
}

#[tokio::test(start_paused = true)]
async fn on_shutdown_running_tasks_are_left_running_for_the_next_agent() {
    let mut s = Harness::with(|c| c.leave_tasks_running = true);
    let service = restarting(task("sleep"), TaskKind::Service, 2, LocalRestartMode::Fail);
    s.run("svc", service).await;
    s.run("batch", task("sleep")).await;
    s.handle.shutdown().await;
    for uid in ["svc", "batch"] {
        assert!(
            s.fake.signals_while_alive(uid, 1).is_empty(),
            "{uid} was signalled"
        );
    }
    let journal = std::fs::read_to_string(s._state_dir.path().join("journal.jsonl")).unwrap();
    for uid in ["svc", "batch"] {
        assert!(
            !journal
                .lines()
                .any(|l| l.contains("\"ended\"") && l.contains(&format!("\"{uid}\""))),
            "{uid}'s attempt was ended: {journal}"
        );
    }
}

/// The agent stops while a task's process is being started: once started,
/// it is left running for the next agent like the tasks already running,
/// not stopped (its process may be running already: a real-process test
/// saw a batch task's script write its pid and then die with the agent).
#[tokio::test(start_paused = true)]
async fn on_shutdown_a_task_being_started_is_left_running_once_it_runs() {
    let s = Harness::with(|c| c.leave_tasks_running = true);
    assert_eq!(s.submit("late", 1, task("gated")).await, Submit::Accepted);
    // Wait (on the real clock: the start blocks a real thread) until its
    // start is under way.
    let until = std::time::Instant::now() + Duration::from_secs(10);
    while s.fake.at_gate() == 0 {
        assert!(std::time::Instant::now() < until, "the start never began");
        tokio::task::yield_now().await;
        std::thread::sleep(Duration::from_millis(5));
    }
    let handle = s.handle.clone();
    let shutdown = handle.shutdown();
    tokio::pin!(shutdown);
    // Polled once, it has sent its command (a zero timeout polls first).
    assert!(tokio::time::timeout(Duration::ZERO, &mut shutdown).await.is_err());
    // Commands are taken in order: a task submitted after it is refused,
    // so the shutdown began while the task was still being started.
    let probe = TaskRequest {
        uid: "probe".to_owned(),
        attempt: 1,
        name: "probe".to_owned(),
        spec: task("sleep"),
        stop_after: None,
        config: None,
    };
    assert!(matches!(
        s.handle.submit(probe).await,
        Err(crate::supervisor::SupervisorError::ShuttingDown)
    ));
    assert_eq!(s.fake.at_gate(), 1, "still being started");
    s.fake.open_gate();
    tokio::time::timeout(PATIENCE, shutdown)
        .await
        .expect("the shutdown ended");
    assert_eq!(s.fake.starts(), 1);
    assert!(
        s.fake.signals_while_alive("late", 1).is_empty(),
        "stopped with the agent"
    );
    let journal = std::fs::read_to_string(s._state_dir.path().join("journal.jsonl")).unwrap();
    assert!(
        !journal
            .lines()
            .any(|l| l.contains("\"ended\"") && l.contains("\"late\"")),
        "its attempt was ended: {journal}"
    );
    assert!(
        journal
            .lines()
            .any(|l| l.contains("\"started\"") && l.contains("\"late\"")),
        "its start is in the journal for the next agent to re-adopt it: {journal}"
    );
}

#[tokio::test(start_paused = true)]
async fn where_the_process_ends_for_good_shutdown_stops_services_too() {
    let mut s = Harness::start();
    let service = restarting(task("sleep"), TaskKind::Service, 2, LocalRestartMode::Fail);
    s.run("svc", service).await;
    s.handle.shutdown().await;
    assert_eq!(s.finished("svc").await.reason, TaskReason::AgentShutdown);
}

#[tokio::test(start_paused = true)]
async fn a_cancel_during_an_unhealthy_stop_ends_the_task_without_a_restart() {
    let mut s = Harness::start();
    let port = {
        let listener = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
        listener.local_addr().unwrap().port()
    };
    // It ignores SIGTERM, so the unhealthy stop waits out its kill timeout.
    let spec = tcp_checked(
        restarting(
            task("stubborn").with_kill_timeout("30s"),
            TaskKind::Service,
            5,
            LocalRestartMode::Fail,
        ),
        port,
    );
    s.run("hc", spec).await;
    // Unhealthy at 2s: SIGTERM, SIGKILL armed for 32s.
    tokio::time::sleep(Duration::from_secs(5)).await;
    assert_eq!(
        s.fake.signals_while_alive("hc", 1).len(),
        1,
        "not stopped as unhealthy"
    );
    s.handle.cancel("hc", Some(1), "job deleted".to_owned()).await;
    let outcome = s.finished("hc").await;
    assert_eq!(outcome.reason, TaskReason::Cancelled, "{}", outcome.message);
    assert_eq!(s.fake.starts(), 1, "restarted after a cancel");
}

#[tokio::test(start_paused = true)]
async fn on_shutdown_a_fenced_service_is_left_running_too() {
    let mut s = Harness::with(|c| c.leave_tasks_running = true);
    let req = TaskRequest {
        uid: "fenced".to_owned(),
        attempt: 1,
        name: "fenced".to_owned(),
        spec: restarting(task("sleep"), TaskKind::Service, 2, LocalRestartMode::Fail),
        stop_after: Some(Duration::from_secs(120)),
        config: None,
    };
    assert_eq!(s.handle.submit(req).await.unwrap(), Submit::Accepted);
    s.started("fenced").await;
    s.handle.shutdown().await;
    // The next agent fences it from this one's last contact.
    assert!(s.fake.signals_while_alive("fenced", 1).is_empty());
}

#[tokio::test(start_paused = true)]
async fn a_running_task_sends_its_latest_output_when_it_changed() {
    let mut s = Harness::with(|c| c.output_tail_every = Duration::from_secs(5));
    s.run("t", task("sleep").with_timeout("1h")).await;
    let logs = crate::supervisor::task_dir(&s._state_dir.path().join("tasks"), "t", 1).join("logs");
    std::fs::create_dir_all(&logs).unwrap();
    std::fs::write(logs.join("stdout.log"), "leaving the dock\n").unwrap();
    let tail = |event: TaskEvent| match event {
        TaskEvent::Output {
            uid, attempt, tail, ..
        } => {
            assert_eq!((uid.as_str(), attempt), ("t", 1));
            tail
        }
        other => panic!("expected an output tail, got {other:?}"),
    };
    assert_eq!(tail(s.next_event().await), "leaving the dock\n");
    // Unchanged: nothing; changed: the new tail, at the next round.
    std::fs::write(logs.join("stdout.log"), "leaving the dock\nat waypoint 3\n").unwrap();
    assert_eq!(tail(s.next_event().await), "leaving the dock\nat waypoint 3\n");
    s.handle.cancel("t", Some(1), "done".to_owned()).await;
    assert!(matches!(s.next_event().await, TaskEvent::Finished { .. }));
}
