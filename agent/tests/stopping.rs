//! How the supervisor stops tasks the way robot software needs, against
//! real processes: the task's stop signal (a launcher that, like `ros2
//! launch`, ignores SIGTERM and shuts its nodes down on SIGINT), its
//! `preStop` (once per stop, before the signal, in the task's sandbox, cut
//! at its timeout), and the robot's facts (`when` at admission,
//! `whileRunning: stop` while it runs). No sleeps to wait for anything:
//! every wait polls a condition with a deadline.

use std::path::Path;
use std::time::{Duration, Instant};

use k8s4r_agent::supervisor::outcome::StopCause;
use k8s4r_api::{
    FactOperator, FactRequirement, Facts, PreStop, StopSignal, TaskReason, TaskTemplate, WhileRunning,
};

mod supervising;
use supervising::*;

/// A launcher like `ros2 launch`: it ignores SIGTERM, starts two nodes
/// (which ignore it too), and on SIGINT passes it on to them and waits for
/// them; each node logs a clean shutdown to `$MARKS` on SIGINT.
const LAUNCHER: &str = r#"
import os, signal, subprocess, sys, time
marks = os.environ["MARKS"]
if len(sys.argv) > 1:
    name = sys.argv[1]
    def down(*_):
        with open(marks, "a") as f:
            f.write("node %s: clean shutdown\n" % name)
        sys.exit(0)
    signal.signal(signal.SIGTERM, signal.SIG_IGN)
    signal.signal(signal.SIGINT, down)
    with open(marks, "a") as f:
        f.write("node %s: up\n" % name)
    while True:
        time.sleep(0.05)
signal.signal(signal.SIGTERM, signal.SIG_IGN)
nodes = [subprocess.Popen([sys.executable, __file__, n]) for n in ("talker", "listener")]
def forward(*_):
    for node in nodes:
        node.send_signal(signal.SIGINT)
    for node in nodes:
        node.wait()
    with open(marks, "a") as f:
        f.write("launcher: all nodes down\n")
    sys.exit(0)
signal.signal(signal.SIGINT, forward)
while True:
    time.sleep(0.05)
"#;

/// The launcher's task, its marks in `dir/marks`.
fn launcher(dir: &Path) -> TaskTemplate {
    let script = dir.join("launch.py");
    std::fs::write(&script, LAUNCHER).unwrap();
    let mut t = task("python3", &[script.to_str().unwrap()]);
    t.env.push(k8s4r_api::EnvVar {
        name: "MARKS".into(),
        value: dir.join("marks").display().to_string(),
        value_from: None,
    });
    t.with_kill_timeout("5s")
}

fn marks(dir: &Path) -> String {
    std::fs::read_to_string(dir.join("marks")).unwrap_or_default()
}

async fn both_nodes_up(dir: &Path) {
    poll_until("both nodes are up", || marks(dir).matches(": up").count() == 2).await;
}

fn scratch() -> tempfile::TempDir {
    let dir = tempfile::tempdir().unwrap();
    use std::os::unix::fs::PermissionsExt;
    std::fs::set_permissions(dir.path(), std::fs::Permissions::from_mode(0o777)).unwrap();
    dir
}

/// How a stop reaches the launcher.
#[derive(Clone, Copy, Debug)]
enum Path_ {
    Timeout,
    Cancel,
    Fence,
    Shutdown,
}

async fn stop_launcher(
    signal: Option<StopSignal>,
    path: Path_,
) -> (String, k8s4r_agent::supervisor::TaskOutcome, Duration) {
    let mut h = Harness::new();
    let dir = scratch();
    let mut spec = launcher(dir.path());
    spec.stop_signal = signal;
    // Each test's own uid: the tests' supervisors share one cgroup root.
    let uid = format!(
        "ros-{}",
        signal.map_or("default", StopSignal::name).to_lowercase()
    );
    if matches!(path, Path_::Timeout) {
        spec = spec.with_timeout("2s");
    }
    h.submit(&uid, spec).await;
    both_nodes_up(dir.path()).await;
    let began = Instant::now();
    match path {
        Path_::Timeout => {}
        Path_::Cancel => h.handle.cancel(&uid, Some(1), "job deleted".into()).await,
        Path_::Fence => {
            let why = "stopped by the robot: no contact with the cluster for 10s (disconnect.stopAfter)";
            h.handle
                .stop(&uid, Some(1), StopCause::Disconnected(why.into()))
                .await
        }
        Path_::Shutdown => {
            let handle = h.handle.clone();
            tokio::spawn(async move { handle.shutdown().await });
        }
    }
    let outcome = h.finished(&uid).await;
    (marks(dir.path()), outcome, began.elapsed())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn with_stop_signal_sigint_a_ros_like_launch_shuts_its_nodes_down_cleanly_on_every_path() {
    for path in [Path_::Timeout, Path_::Cancel, Path_::Fence, Path_::Shutdown] {
        let (marks, outcome, _) = stop_launcher(Some(StopSignal::Int), path).await;
        assert!(
            marks.contains("node talker: clean shutdown")
                && marks.contains("node listener: clean shutdown")
                && marks.contains("launcher: all nodes down"),
            "{path:?}: {marks}"
        );
        assert_ne!(
            outcome.signal,
            Some(9),
            "{path:?}: nothing is SIGKILLed: {outcome:?}"
        );
        assert!(
            !outcome.message.contains("SIGKILL"),
            "{path:?}: {}",
            outcome.message
        );
        let reason = match path {
            Path_::Timeout => TaskReason::Timeout,
            Path_::Fence => TaskReason::Disconnected,
            Path_::Cancel => TaskReason::Cancelled,
            Path_::Shutdown => TaskReason::AgentShutdown,
        };
        assert_eq!(outcome.reason, reason, "{path:?}: {outcome:?}");
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn with_the_default_signal_a_launcher_that_ignores_sigterm_is_sigkilled_after_its_kill_timeout() {
    let (marks, outcome, took) = stop_launcher(None, Path_::Cancel).await;
    assert!(!marks.contains("clean shutdown"), "{marks}");
    assert_eq!(outcome.signal, Some(9), "{outcome:?}");
    assert!(
        outcome
            .message
            .contains("killed by SIGKILL after the kill timeout of 5s"),
        "{}",
        outcome.message
    );
    assert!(
        took >= Duration::from_secs(5),
        "SIGKILL only after killTimeout: {took:?}"
    );
}

/// A task that notes SIGTERM and exits, and a `preStop` that notes its
/// reason, its directory and its task's uid, and says hello to the log.
fn with_pre_stop(dir: &Path, pre_stop_script: &str, timeout: Option<&str>) -> TaskTemplate {
    let marks = dir.join("marks").display().to_string();
    let mut t = sh(&format!(
        "trap 'echo \"task: TERM\" >> {marks}; exit 0' TERM; echo up >> {marks}; while :; do sleep 0.05; done"
    ))
    .with_kill_timeout("3s");
    t.pre_stop = Some(PreStop {
        command: "/bin/sh".into(),
        args: vec!["-c".into(), pre_stop_script.replace("MARKS", &marks)],
        timeout: timeout.map(Into::into),
    });
    t
}

const NOTE_PRE_STOP: &str =
    "echo \"prestop: $K8S4R_STOP_REASON $K8S4R_TASK_UID $(pwd)\" >> MARKS; echo 'parking the arm'";

async fn pre_stop_on(
    cause: Option<StopCause>,
    timeout: bool,
) -> (String, String, k8s4r_agent::supervisor::TaskOutcome) {
    let mut h = Harness::new();
    let dir = scratch();
    let mut spec = with_pre_stop(dir.path(), NOTE_PRE_STOP, None);
    if timeout {
        spec = spec.with_timeout("1s");
    }
    h.submit("park", spec).await;
    poll_until("the task is up", || marks(dir.path()).contains("up")).await;
    if let Some(cause) = cause {
        h.handle.stop("park", Some(1), cause).await;
    }
    let outcome = h.finished("park").await;
    h.handle.shutdown().await; // flushes the logs
    let task_dir = h.dir.path().join("tasks/park-1");
    let marks = marks(dir.path()).replace(&task_dir.display().to_string(), "TASKDIR");
    (marks, h.log("park", "stdout.log"), outcome)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn pre_stop_runs_once_in_the_tasks_sandbox_before_the_signal_with_the_reason() {
    let cases = [
        (None, true, "Timeout"),
        (
            Some(StopCause::Cancelled("job deleted".into())),
            false,
            "Cancelled",
        ),
        (
            Some(StopCause::Disconnected("no contact".into())),
            false,
            "Disconnected",
        ),
        (Some(StopCause::Drained("robot drained".into())), false, "Drained"),
        (
            Some(StopCause::Unhealthy("check failed".into())),
            false,
            "Unhealthy",
        ),
        (
            Some(StopCause::ConditionLost(
                "estop In [false] no longer holds".into(),
            )),
            false,
            "ConditionLost",
        ),
    ];
    for (cause, timeout, reason) in cases {
        let (marks, stdout, outcome) = pre_stop_on(cause, timeout).await;
        assert_eq!(
            marks,
            format!("up\nprestop: {reason} park TASKDIR/work\ntask: TERM\n"),
            "once, before the signal, in the task's directory with its env: {outcome:?}"
        );
        assert!(
            stdout.contains("parking the arm"),
            "its output is in the task's log: {stdout:?}"
        );
        assert!(
            !outcome.message.contains("preStop"),
            "a preStop that worked is not news: {}",
            outcome.message
        );
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_pre_stop_that_hangs_is_cut_at_its_timeout_and_the_stop_goes_on() {
    let mut h = Harness::new();
    let dir = scratch();
    h.submit(
        "hang",
        with_pre_stop(
            dir.path(),
            "echo 'prestop: hanging' >> MARKS; sleep 1000",
            Some("500ms"),
        ),
    )
    .await;
    poll_until("the task is up", || marks(dir.path()).contains("up")).await;
    let began = Instant::now();
    h.handle.cancel("hang", Some(1), "job deleted".into()).await;
    let outcome = h.finished("hang").await;
    let took = began.elapsed();
    assert_eq!(marks(dir.path()), "up\nprestop: hanging\ntask: TERM\n");
    assert!(
        outcome
            .message
            .contains("its preStop did not finish within 500ms"),
        "{}",
        outcome.message
    );
    assert!(
        took < Duration::from_secs(3),
        "the signal came at the preStop's timeout, not the kill: {took:?}"
    );
    poll_until("the hanging preStop is gone", || !sleepers_of(&dir)).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_failing_pre_stop_is_recorded_and_the_stop_goes_on() {
    let mut h = Harness::new();
    let dir = scratch();
    h.submit(
        "fail",
        with_pre_stop(dir.path(), "echo 'prestop: failing' >> MARKS; exit 3", None),
    )
    .await;
    poll_until("the task is up", || marks(dir.path()).contains("up")).await;
    h.handle.cancel("fail", Some(1), "job deleted".into()).await;
    let outcome = h.finished("fail").await;
    assert_eq!(marks(dir.path()), "up\nprestop: failing\ntask: TERM\n");
    assert!(
        outcome.message.contains("its preStop exited with code 3"),
        "{}",
        outcome.message
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_kill_timeout_counts_from_the_stop_whatever_the_pre_stop_takes() {
    // A preStop that takes its whole timeout (the kill timeout) and a task
    // that ignores SIGTERM: SIGKILL comes killTimeout after the stop
    // began, not later.
    let mut h = Harness::new();
    let dir = scratch();
    let mut spec = with_pre_stop(dir.path(), "sleep 1000", Some("2s"));
    spec.args = vec![
        "-c".into(),
        format!(
            "trap '' TERM; echo up >> {}; while :; do sleep 0.05; done",
            dir.path().join("marks").display()
        ),
    ];
    spec.kill_timeout = Some("2s".into());
    h.submit("slow", spec).await;
    poll_until("the task is up", || marks(dir.path()).contains("up")).await;
    let began = Instant::now();
    h.handle.cancel("slow", Some(1), "job deleted".into()).await;
    let outcome = h.finished("slow").await;
    let took = began.elapsed();
    assert_eq!(outcome.signal, Some(9), "{outcome:?}");
    assert!(
        took < Duration::from_millis(2_900),
        "SIGKILL 2s after the stop began: {took:?}"
    );
}

/// Whether a `sleep 1000` that a test's preStop started still runs.
fn sleepers_of(_dir: &tempfile::TempDir) -> bool {
    std::fs::read_dir("/proc").unwrap().flatten().any(|e| {
        let cmdline = std::fs::read(e.path().join("cmdline")).unwrap_or_default();
        cmdline == b"sleep\x001000\x00"
            && std::fs::read_to_string(e.path().join("stat")).is_ok_and(|s| !s.contains(") Z "))
            && std::fs::read_to_string(e.path().join("environ"))
                .map(|env| env.contains("K8S4R_TASK_UID=hang"))
                .unwrap_or(false)
    })
}

// ------------------------------------------------------------------ facts

fn facts(json: &str) -> Facts {
    serde_json::from_str(json).unwrap()
}

fn condition(
    key: &str,
    operator: FactOperator,
    values: &[&str],
    while_running: WhileRunning,
) -> FactRequirement {
    FactRequirement {
        key: key.into(),
        operator,
        values: values.iter().map(|v| v.to_string()).collect(),
        while_running,
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_task_starts_only_when_the_robots_facts_meet_its_conditions() {
    let mut h = Harness::new();
    let mut spec = sh("echo ran");
    spec.when = vec![condition(
        "battery",
        FactOperator::Gt,
        &["30"],
        WhileRunning::Ignore,
    )];
    h.submit_attempt("charge", 1, spec.clone()).await;
    let refused = h.finished_attempt("charge", 1).await;
    assert_eq!(refused.reason, TaskReason::NotReady, "{refused:?}");
    assert!(refused.message.contains("no facts yet"), "{}", refused.message);

    h.handle.set_facts(facts(r#"{"battery": 10}"#));
    h.submit_attempt("charge", 2, spec.clone()).await;
    let refused = h.finished_attempt("charge", 2).await;
    assert_eq!(refused.reason, TaskReason::NotReady);
    assert_eq!(refused.started_at, None, "never started");
    assert!(
        refused.message.contains("battery Gt 30 (battery is 10)"),
        "the rule and the fact are named: {}",
        refused.message
    );

    h.handle.set_facts(facts(r#"{"battery": 80}"#));
    h.submit_attempt("charge", 3, spec).await;
    let ran = h.finished_attempt("charge", 3).await;
    assert_eq!(ran.reason, TaskReason::Completed, "{ran:?}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_condition_that_stops_holding_stops_the_task_through_its_escalation() {
    let mut h = Harness::new();
    let dir = scratch();
    h.handle.set_facts(facts(r#"{"estop": false, "battery": 90}"#));
    let mut spec = with_pre_stop(dir.path(), NOTE_PRE_STOP, None);
    spec.stop_signal = Some(StopSignal::Term);
    spec.when = vec![
        condition("estop", FactOperator::In, &["false"], WhileRunning::Stop),
        condition("battery", FactOperator::Gt, &["20"], WhileRunning::Ignore),
    ];
    h.submit("motion", spec).await;
    poll_until("the task is up", || marks(dir.path()).contains("up")).await;
    // A condition without whileRunning: stop is not watched.
    h.handle.set_facts(facts(r#"{"estop": false, "battery": 5}"#));
    h.handle.set_facts(facts(r#"{"estop": true, "battery": 5}"#));
    let pressed = Instant::now();
    let outcome = h.finished("motion").await;
    assert_eq!(outcome.reason, TaskReason::ConditionLost, "{outcome:?}");
    assert!(
        outcome
            .message
            .contains("estop In [false] no longer holds (estop is true)"),
        "{}",
        outcome.message
    );
    assert!(
        marks(dir.path()).contains("prestop: ConditionLost"),
        "{}",
        marks(dir.path())
    );
    assert!(
        pressed.elapsed() < Duration::from_secs(2),
        "{:?}",
        pressed.elapsed()
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_exec_tasks_pre_stop_runs_as_the_task_user() {
    let mut h = Harness::new();
    let dir = scratch();
    let marks_path = dir.path().join("marks").display().to_string();
    let mut spec = sh(&format!(
        "trap 'exit 0' TERM; echo \"task $(id -u)\" >> {marks_path}; while :; do sleep 0.05; done"
    ))
    .with_driver("exec");
    spec.pre_stop = Some(PreStop {
        command: "/bin/sh".into(),
        args: vec!["-c".into(), format!("echo \"prestop $(id -u)\" >> {marks_path}")],
        timeout: None,
    });
    h.submit("exec-park", spec).await;
    poll_until("the task is up", || marks(dir.path()).contains("task")).await;
    h.handle.cancel("exec-park", Some(1), "job deleted".into()).await;
    h.finished("exec-park").await;
    let marks = marks(dir.path());
    let uid_of = |who: &str| {
        marks
            .lines()
            .find_map(|l| l.strip_prefix(who))
            .map(|u| u.trim().to_owned())
            .unwrap_or_default()
    };
    assert_eq!(uid_of("prestop "), uid_of("task "), "{marks}");
    assert_ne!(
        uid_of("task "),
        "0",
        "an exec task runs as a uid of its own: {marks}"
    );
}
