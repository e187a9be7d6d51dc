//! Supervisor figures (issue 3), on real processes, loopback only:
//!
//! - `sigterm_late_p99_ms`: 500 tasks with staggered timeouts; how long
//!   after its deadline SIGTERM had been sent to each task's group, p99
//!   (measured by the supervisor, `SupervisorHandle::stats`). An INFO line
//!   adds the end as observed from outside (signal, death, reaping, event).
//! - `sigkill_late_p99_ms`: 500 tasks that ignore SIGTERM; the same for
//!   SIGKILL after deadline + killTimeout.
//! - `sigterm_late_max_ms`: 2,000 tasks with staggered timeouts; the
//!   latest SIGTERM after its deadline (the worst stall of the loop while
//!   2,000 processes run and end).
//!
//! After each lateness run an INFO line per branch of the supervisor's
//! loop says how long one handling took (count, p50, p99, max): a late
//! signal waited for the slowest of them.
//! - `agent_rss_{0,100,1000}_tasks_mib`: this process's RSS (the agent:
//!   runtime + supervisor; the children, shims and loggers included, are
//!   not counted) with that many `sleep` tasks running.
//!
//! Every task runs under its shim with its logger, as under the agent's
//! binary.
//! - `task_start_p99_ms`: submit() called -> Started event received, for
//!   1,000 tasks dispatched one after the other, without artifacts.
//! - `tokio_alive_tasks_*`: tokio tasks alive at 0, 100 and 1,000 running
//!   tasks; it does not grow, since the one supervisor task drives them all.
//!
//! Run: `cargo bench -p k8s4r-agent --bench supervisor`

use std::collections::HashMap;
use std::time::{Duration, Instant};

use k8s4r_agent::supervisor::{
    self, Policy, Submit, SupervisorConfig, SupervisorHandle, TaskEvent, TaskRequest,
};
use k8s4r_api::{DurationString, TaskReason, TaskTemplate};
use tokio::sync::mpsc::UnboundedReceiver;

const LATENESS_TASKS: usize = 500;
const MANY_TASKS: usize = 2000;
const FIRST_DEADLINE_MS: u64 = 3000;
const STAGGER_MS: u64 = 7;
const KILL_TIMEOUT_MS: u64 = 500;
const PATIENCE: Duration = Duration::from_secs(60);

fn main() {
    let runtime = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .expect("runtime");
    runtime.block_on(bench());
}

async fn bench() {
    println!("INFO load average at start: {}", load_average());
    start_latency_and_rss().await;
    let sigterm = lateness(LATENESS_TASKS, false).await;
    println!("BENCH sigterm_late_p99_ms {:.2} ms", sigterm.p99);
    let sigkill = lateness(LATENESS_TASKS, true).await;
    println!("BENCH sigkill_late_p99_ms {:.2} ms", sigkill.p99);
    let many = lateness(MANY_TASKS, false).await;
    println!("INFO sigterm at {MANY_TASKS} tasks: p99 {:.2} ms", many.p99);
    println!("BENCH sigterm_late_max_ms {:.2} ms", many.max);
    println!("INFO load average at end: {}", load_average());
}

/// The machine's load: the figures are only as quiet as the machine.
fn load_average() -> String {
    let loadavg = std::fs::read_to_string("/proc/loadavg").unwrap_or_default();
    let cpus = std::thread::available_parallelism().map_or(0, |n| n.get());
    format!(
        "{} on {cpus} cpus",
        loadavg.split_whitespace().take(3).collect::<Vec<_>>().join(" ")
    )
}

fn quantile(samples: &[f64], q: f64) -> f64 {
    let mut sorted = samples.to_vec();
    sorted.sort_by(f64::total_cmp);
    let rank = ((sorted.len() as f64) * q).ceil() as usize;
    sorted[rank.saturating_sub(1).min(sorted.len() - 1)]
}

fn state_dir() -> tempfile::TempDir {
    tempfile::tempdir().expect("tempdir")
}

fn start(dir: &std::path::Path) -> (SupervisorHandle, UnboundedReceiver<TaskEvent>) {
    supervisor::spawn(SupervisorConfig {
        state_dir: dir.to_path_buf(),
        // The bench runs shell scripts through raw_exec, as root or not.
        policy: Policy {
            raw_exec: true,
            allow_root: true,
            ..SupervisorConfig::default().policy
        },
        max_tasks: 2000,
        // As the agent's binary runs tasks: each under its shim, its
        // output written by its logger (two more processes a task).
        shim_program: Some(std::path::PathBuf::from(env!("CARGO_BIN_EXE_k8s4r-agent"))),
        ..SupervisorConfig::default()
    })
    .expect("supervisor")
}

fn template(script: &str) -> TaskTemplate {
    TaskTemplate {
        driver: "raw_exec".to_owned(),
        command: "/bin/sh".to_owned(),
        args: vec!["-c".to_owned(), script.to_owned()],
        ..TaskTemplate::default()
    }
}

fn request(uid: String, spec: TaskTemplate) -> TaskRequest {
    TaskRequest {
        name: uid.clone(),
        uid,
        attempt: 1,
        spec,
        stop_after: None,
        config: None,
    }
}

async fn next_event(events: &mut UnboundedReceiver<TaskEvent>) -> TaskEvent {
    tokio::time::timeout(PATIENCE, events.recv())
        .await
        .expect("no event in time")
        .expect("supervisor gone")
}

fn rss_mib() -> f64 {
    let status = std::fs::read_to_string("/proc/self/status").unwrap_or_default();
    let kib: f64 = status
        .lines()
        .find_map(|l| l.strip_prefix("VmRSS:"))
        .and_then(|v| v.split_whitespace().next()?.parse().ok())
        .unwrap_or(0.0);
    kib / 1024.0
}

fn alive_tasks() -> usize {
    tokio::runtime::Handle::current().metrics().num_alive_tasks()
}

fn p99(samples: Vec<f64>) -> f64 {
    quantile(&samples, 0.99)
}

async fn start_latency_and_rss() {
    let dir = state_dir();
    let (handle, mut events) = start(dir.path());
    let mut latencies = Vec::with_capacity(1000);
    println!("BENCH agent_rss_0_tasks_mib {:.2} MiB", rss_mib());
    println!("BENCH tokio_alive_tasks_0 {} tasks", alive_tasks());
    for i in 0..1000 {
        let begin = Instant::now();
        let submitted = handle
            .submit(request(format!("start-{i}"), template("exec sleep 1000")))
            .await
            .expect("submit");
        assert_eq!(submitted, Submit::Accepted);
        match next_event(&mut events).await {
            TaskEvent::Started { .. } => latencies.push(begin.elapsed().as_secs_f64() * 1000.0),
            other => panic!("expected Started, got {other:?}"),
        }
        if i + 1 == 100 {
            println!("BENCH agent_rss_100_tasks_mib {:.2} MiB", rss_mib());
            println!("BENCH tokio_alive_tasks_100 {} tasks", alive_tasks());
        }
    }
    assert_eq!(handle.running().await.len(), 1000);
    println!("BENCH agent_rss_1000_tasks_mib {:.2} MiB", rss_mib());
    println!("BENCH tokio_alive_tasks_1000 {} tasks", alive_tasks());
    println!(
        "INFO task start: p50 {:.2} ms, p90 {:.2} ms, max {:.2} ms",
        quantile(&latencies, 0.5),
        quantile(&latencies, 0.9),
        quantile(&latencies, 1.0)
    );
    println!("BENCH task_start_p99_ms {:.2} ms", p99(latencies));
    handle.shutdown().await;
}

/// How late the signals were (ms).
struct Lateness {
    p99: f64,
    max: f64,
}

/// Lateness of the signal after each of `tasks` tasks' deadline, as the
/// supervisor measured it right after `killpg` returned. Also prints the
/// lateness of the end as observed from outside (signal sent, process
/// dead, reaped, event received), a looser upper bound, and how long the
/// loop's handlers took.
async fn lateness(tasks: usize, ignore_sigterm: bool) -> Lateness {
    let dir = state_dir();
    let (handle, mut events) = start(dir.path());
    let script = if ignore_sigterm {
        "trap '' TERM; exec sleep 1000"
    } else {
        "exec sleep 1000"
    };
    let mut due: HashMap<String, jiff::Timestamp> = HashMap::new();
    let mut timeouts = HashMap::new();
    for i in 0..tasks {
        let timeout = Duration::from_millis(FIRST_DEADLINE_MS + i as u64 * STAGGER_MS);
        let mut spec = template(script);
        spec.timeout = Some(DurationString::from(
            format!("{}ms", timeout.as_millis()).as_str(),
        ));
        spec.kill_timeout = Some(DurationString::from(format!("{KILL_TIMEOUT_MS}ms").as_str()));
        let uid = format!("late-{i}");
        timeouts.insert(uid.clone(), timeout);
        handle.submit(request(uid, spec)).await.expect("submit");
    }
    let mut late = Vec::with_capacity(tasks);
    while late.len() < tasks {
        match next_event(&mut events).await {
            TaskEvent::Started { uid, at, .. } => {
                let mut after = timeouts[&uid];
                if ignore_sigterm {
                    after += Duration::from_millis(KILL_TIMEOUT_MS);
                }
                due.insert(uid, at + after);
            }
            TaskEvent::Finished { uid, outcome, .. } => {
                assert_eq!(outcome.reason, TaskReason::Timeout, "{uid}: {}", outcome.message);
                let expected = if ignore_sigterm { 137 } else { 143 };
                assert_eq!(outcome.exit_code, Some(expected), "{uid}: {}", outcome.message);
                let span = outcome.finished_at.duration_since(due[&uid]);
                late.push(span.as_secs_f64() * 1000.0);
            }
            TaskEvent::Output { .. } | TaskEvent::Reconfigured { .. } => {}
        }
    }
    let max = late.iter().copied().fold(f64::MIN, f64::max);
    let which = if ignore_sigterm { "sigkill" } else { "sigterm" };
    println!(
        "INFO {which} ({tasks} tasks): end observed after the deadline: p99 {:.2} ms, max {max:.2} ms",
        p99(late)
    );
    let stats = handle.stats().await;
    let signals = if ignore_sigterm {
        &stats.sigkill_late
    } else {
        &stats.sigterm_late
    };
    assert_eq!(signals.count(), tasks as u64);
    let ms = |d: Duration| d.as_secs_f64() * 1000.0;
    println!(
        "INFO {which} ({tasks} tasks): signal sent after the deadline: p50 {:.2} ms, max {:.2} ms",
        ms(signals.quantile(0.5).unwrap_or_default()),
        ms(signals.max())
    );
    for (branch, took) in &stats.handlers {
        println!(
            "INFO {which} ({tasks} tasks): loop branch {branch}: {} handled, p50 {:.3} ms, p99 {:.3} ms, max {:.3} ms",
            took.count(),
            ms(took.quantile(0.5).unwrap_or_default()),
            ms(took.quantile(0.99).unwrap_or_default()),
            ms(took.max())
        );
    }
    let result = Lateness {
        p99: ms(signals.quantile(0.99).unwrap_or_default()),
        max: ms(signals.max()),
    };
    handle.shutdown().await;
    result
}
