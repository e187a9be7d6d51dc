//! Issue 28's fault scenario (l): a robot blackholed while its task runs,
//! the task stopping the way robot software does (a `preStop` that parks
//! for a while, then `SIGINT`, then a shutdown that takes its time). The
//! robot stops the attempt itself once it has heard nothing for the
//! group's `stopAfter`; the `preStop` and the graceful shutdown fit in the
//! kill timeout the manager's replacement arithmetic counts, so the
//! replacement starts only once the first attempt has fully stopped: the
//! marks of the two attempts (the `preStop`'s included) never overlap.

use k8s4r_api::TaskState;
use k8s4r_testbed::{eventually, Fault};

use crate::faults::{Binaries, Options, Report, Stack, DEADLINE, STOP_AFTER};

/// The task: marks every 100 ms; on SIGINT it marks for another 0.5 s (a
/// node shutting down), then exits; SIGTERM is ignored, as `ros2 launch`
/// ignores it.
fn graceful_script(marks: &str, seconds: f64) -> String {
    format!(
        "m={marks}; mark() {{ echo \"$K8S4R_TASK_UID $K8S4R_TASK_ATTEMPT $(date +%s%N)\" >> $m; }}; \
         trap 'echo \"$K8S4R_TASK_UID $K8S4R_TASK_ATTEMPT sigint\" >> $m; for i in 1 2 3 4 5; do mark; sleep 0.1; done; exit 130' INT; trap '' TERM; \
         end=$(( $(date +%s%N) + {} )); \
         while [ $(date +%s%N) -lt $end ]; do mark; sleep 0.1; done; \
         echo \"$K8S4R_TASK_UID $K8S4R_TASK_ATTEMPT done\" >> $m",
        (seconds * 1e9) as u64
    )
}

/// The `preStop`: parks the arm for 0.8 s, marking as it goes (it is the
/// attempt running too).
fn parking_script(marks: &str) -> String {
    format!(
        "for i in 1 2 3 4 5 6 7 8; do echo \"$K8S4R_TASK_UID $K8S4R_TASK_ATTEMPT $(date +%s%N)\" >> {marks}; sleep 0.1; done"
    )
}

/// l. A blackholed robot's attempt runs its `preStop` and stops on SIGINT
/// before the manager's replacement starts.
pub async fn fenced_attempt_stops_gracefully_before_its_replacement(bins: &Binaries) -> Report {
    let stack = Stack::start(bins, Options::default()).await;
    let marks = stack.marks_file().display().to_string();
    let shape = serde_json::json!({
        "count": 1,
        "task": {
            "driver": "exec",
            "command": "/bin/sh",
            "args": ["-c", graceful_script(&marks, 12.0)],
            "timeout": "10m",
            "killTimeout": "3s",
            "stopSignal": "SIGINT",
            "preStop": { "command": "/bin/sh", "args": ["-c", parking_script(&marks)], "timeout": "1s" },
        },
    });
    let disconnect = serde_json::json!({ "stopAfter": STOP_AFTER, "replace": true });
    stack.submit_group("parked", shape, 12.0, disconnect).await;
    let (_, robot) = stack.wait_running("parked").await;
    stack.link(&robot).set(Fault::Blackhole);
    eventually(DEADLINE, "the task runs on another robot", || async {
        let s = stack.tasks("parked").await.into_iter().next()?.status?;
        (s.state == Some(TaskState::Running) && s.robot.as_deref() != Some(robot.as_str())).then_some(())
    })
    .await;
    stack.link(&robot).heal();
    stack.wait_all("parked", 1, TaskState::Completed).await;
    let mut report = stack
        .report(
            "l_a_fenced_attempt_stops_gracefully_before_its_replacement",
            "parked",
        )
        .await;
    let log = crate::faults::strip_ansi(&stack.robots[&robot].0.log());
    if !log.contains("preStop done") {
        report
            .problems
            .push(format!("robot {robot} never logged its preStop"));
    }
    let status = stack.tasks("parked").await.remove(0).status.unwrap_or_default();
    if status.attempt < 2 {
        report
            .problems
            .push(format!("expected a replacement attempt: {status:?}"));
    }
    let marks_text = std::fs::read_to_string(stack.marks_file()).unwrap_or_default();
    if !marks_text.lines().any(|l| l.ends_with(" 1 sigint")) {
        report
            .problems
            .push("attempt 1 never got its stop signal (SIGINT) before it ended".to_owned());
    }
    report.notes.push(format!(
        "blackholed {robot}; history {:?}",
        status
            .attempts
            .iter()
            .map(|a| (a.attempt, a.robot.clone(), a.reason, a.exit_code))
            .collect::<Vec<_>>()
    ));
    report
}

/// The measured task of [`fact_latencies`]: notes when it starts (in
/// `argv[2]`) and when SIGTERM reaches it (in `argv[1]`), in unix nanos.
const NOTING_TASK: &str = r#"
import signal, sys, time
def stopped(*_):
    with open(sys.argv[1], "w") as f:
        f.write(str(time.time_ns()))
    sys.exit(0)
signal.signal(signal.SIGTERM, stopped)
with open(sys.argv[2], "w") as f:
    f.write(str(time.time_ns()))
while True:
    time.sleep(1)
"#;

fn unix_nanos() -> u128 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .expect("after 1970")
        .as_nanos()
}

/// A unix-nanos time a task wrote to `path`, once it has.
async fn noted(path: &std::path::Path) -> u128 {
    eventually(DEADLINE, &format!("{} is written", path.display()), || async {
        std::fs::read_to_string(path).ok()?.trim().parse::<u128>().ok()
    })
    .await
}

/// A Job of one task that runs [`NOTING_TASK`] under `when`.
async fn noting_job(
    stack: &Stack,
    name: &str,
    when: serde_json::Value,
) -> (std::path::PathBuf, std::path::PathBuf) {
    let dir = stack.marks_file().parent().expect("the marks dir").to_path_buf();
    let script = dir.join("noting.py");
    if !script.exists() {
        std::fs::write(&script, NOTING_TASK).expect("write the task's script");
    }
    let (stop, start) = (
        dir.join(format!("{name}.stop")),
        dir.join(format!("{name}.start")),
    );
    let shape = serde_json::json!({
        "count": 1,
        "task": {
            "driver": "exec",
            "command": "python3",
            "args": [script, stop, start],
            "timeout": "10m",
            "killTimeout": "2s",
            "when": when,
        },
    });
    stack.submit_group(name, shape, 0.0, serde_json::json!({})).await;
    (stop, start)
}

/// Waits until the scheduler says why the Job's task waits (it names the
/// unmet condition).
async fn waiting_for(stack: &Stack, job: &str, rule: &str) {
    eventually(DEADLINE, &format!("{job} waits for {rule}"), || async {
        let task = stack.tasks(job).await.into_iter().next()?;
        serde_json::to_string(&task.status?)
            .ok()?
            .contains(rule)
            .then_some(())
    })
    .await;
}

/// `rounds` of: a task waits for `battery Gt 30` on a robot at 10, the
/// robot's file goes to 80, and the task starts (from the write to the
/// task's own start); then a task runs under `estop In [false]` with
/// `whileRunning: stop`, the file says `estop: true`, and SIGTERM reaches
/// it (from the write to the task's handler). Returns (to start, to stop).
pub async fn fact_latencies(
    bins: &Binaries,
    rounds: usize,
) -> (Vec<std::time::Duration>, Vec<std::time::Duration>) {
    let stack = Stack::start(
        bins,
        Options {
            facts: true,
            ..Options::robots(&["r1"])
        },
    )
    .await;
    let (mut to_start, mut to_stop) = (Vec::new(), Vec::new());
    for round in 0..rounds {
        stack.write_facts("r1", serde_json::json!({ "battery": 10, "estop": false }));
        // The cluster knows the robot is low before the task comes: the
        // figure is the facts' way to a start, not a stale view's bounce.
        robot_shows(&stack, "r1", "battery", 10.0).await;
        let job = format!("charge-{round}");
        let when = serde_json::json!([{ "key": "battery", "operator": "Gt", "values": ["30"] }]);
        let (_, start) = noting_job(&stack, &job, when).await;
        waiting_for(&stack, &job, "battery Gt 30").await;
        let written = unix_nanos();
        stack.write_facts("r1", serde_json::json!({ "battery": 80, "estop": false }));
        to_start.push(nanos(noted(&start).await.saturating_sub(written)));

        let job = format!("motion-{round}");
        let when = serde_json::json!([{ "key": "estop", "operator": "In", "values": ["false"], "whileRunning": "stop" }]);
        let (stop, start) = noting_job(&stack, &job, when).await;
        noted(&start).await;
        let written = unix_nanos();
        stack.write_facts("r1", serde_json::json!({ "battery": 80, "estop": true }));
        to_stop.push(nanos(noted(&stop).await.saturating_sub(written)));
        eventually(
            DEADLINE,
            &format!("{job}'s attempt ends ConditionLost"),
            || async {
                let s = stack.tasks(&job).await.into_iter().next()?.status?;
                let lost = Some(k8s4r_api::TaskReason::ConditionLost);
                (s.reason == lost || s.attempts.iter().any(|a| a.reason == lost)).then_some(())
            },
        )
        .await;
        stack.delete_job(&format!("charge-{round}")).await;
        stack.delete_job(&job).await;
    }
    (to_start, to_stop)
}

/// Waits until Robot `robot` shows `fact` at `value`.
async fn robot_shows(stack: &Stack, robot: &str, fact: &str, value: f64) {
    let robots: kube::Api<k8s4r_api::Robot> = kube::Api::all(stack.client.clone());
    eventually(
        DEADLINE,
        &format!("robot {robot} shows {fact} {value}"),
        || async {
            let facts = robots.get(robot).await.ok()?.status?.facts;
            (facts.get(fact)?.as_number()? == value).then_some(())
        },
    )
    .await;
}

fn nanos(n: u128) -> std::time::Duration {
    std::time::Duration::from_nanos(u64::try_from(n).unwrap_or(u64::MAX))
}
