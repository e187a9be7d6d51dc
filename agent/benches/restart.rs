//! `agent_restart_task_gap_ms`: how long an agent restart leaves the
//! robot's running tasks without their timeouts enforced, with the release
//! agent binary and a real Mosquitto.
//!
//! Each round runs `TASKS` batch tasks (raw_exec `sleep`, timeout 6 s) on
//! one agent, SIGTERMs it 1 s in (as `systemctl restart` does), waits until
//! every deadline has passed with no agent, then starts the next agent.
//! The gap is the old agent's SIGTERM-to-exit plus the new agent's
//! start-to-enforcement: the time until it has re-adopted the tasks and
//! killed every one for its (overdue) timeout. systemd's `RestartSec` (5 s
//! after a crash; none for `systemctl restart`) is not counted: it is the
//! unit's setting, not the agent's cost. The slowest of `ROUNDS` is
//! printed as the figure, the others beside it.
//!
//! Run: `cargo bench -p k8s4r-agent --bench restart`

#[path = "../tests/support/mod.rs"]
mod support;

use std::time::{Duration, Instant};

use k8s4r_api::protocol::encode;
use k8s4r_api::DurationString;
use support::{eventually, shell_dispatch, Agent, Broker, Server};

const LONG: Duration = Duration::from_secs(30);
const ROUNDS: usize = 5;
const TASKS: usize = 20;
const TIMEOUT: Duration = Duration::from_secs(6);

fn main() {
    let runtime = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .expect("runtime");
    runtime.block_on(async {
        let mut gaps = Vec::new();
        for round in 0..ROUNDS {
            gaps.push(round_gap(round).await);
        }
        eprintln!("restart gaps (ms): {gaps:?}");
        gaps.sort_by(f64::total_cmp);
        println!(
            "BENCH agent_restart_task_gap_ms {:.1} ms",
            gaps.last().copied().unwrap_or_default()
        );
        println!(
            "# median of {ROUNDS}: {:.1} ms, {TASKS} tasks each",
            gaps[gaps.len() / 2]
        );
    });
}

/// Whether `pid` runs (not gone, not a zombie).
fn alive(pid: i32) -> bool {
    std::fs::read_to_string(format!("/proc/{pid}/stat")).is_ok_and(|s| {
        s.rsplit(')')
            .next()
            .is_some_and(|r| !r.trim_start().starts_with('Z'))
    })
}

/// One round: the gap in milliseconds.
async fn round_gap(round: usize) -> f64 {
    let robot = format!("rr{round}");
    let broker = Broker::start();
    let mut server = Server::connect(&broker, &robot).await;
    let tmp = tempfile::tempdir().unwrap();
    let state = tmp.path().join("state");
    let run = tmp.path().join("run");
    std::fs::create_dir(&run).unwrap();
    let env = [("RUNTIME_DIRECTORY", run.to_str().unwrap())];
    let mut agent = Agent::start_with_env(&broker, &robot, &state, &[], &env);
    server.approve(&robot).await;
    let mut pid_files = Vec::new();
    for i in 0..TASKS {
        let pid_file = tmp.path().join(format!("task-{i}.pid"));
        let mut dispatch = shell_dispatch(
            &format!("u-{round}-{i}"),
            1,
            &format!("echo $$ > {}; exec sleep 1000", pid_file.display()),
        );
        dispatch.spec.timeout = Some(DurationString::from_duration(TIMEOUT));
        server
            .publish(server.topics.dispatch(&robot), encode(&dispatch))
            .await;
        pid_files.push(pid_file);
    }
    let started = Instant::now();
    let pids: Vec<i32> = eventually("every task running", LONG, || {
        let pids: Vec<i32> = pid_files
            .iter()
            .filter_map(|f| std::fs::read_to_string(f).ok()?.trim().parse().ok())
            .collect();
        (pids.len() == TASKS).then_some(pids)
    })
    .await;
    // Each start is in the journal well before the SIGTERM.
    tokio::time::sleep(Duration::from_secs(1).saturating_sub(started.elapsed())).await;

    let sigterm = Instant::now();
    agent.signal(nix::sys::signal::Signal::SIGTERM);
    eventually("the agent to exit", LONG, || {
        agent.child.try_wait().ok().flatten()
    })
    .await;
    let exit = sigterm.elapsed();
    // Every deadline passes while no agent runs.
    tokio::time::sleep(TIMEOUT + Duration::from_millis(500)).await;
    assert!(pids.iter().all(|p| alive(*p)), "a task did not outlive its agent");

    let start = Instant::now();
    let _next = Agent::start_with_env(&broker, &robot, &state, &[], &env);
    eventually("every overdue task killed", LONG, || {
        pids.iter().all(|p| !alive(*p)).then_some(())
    })
    .await;
    let enforced = start.elapsed();
    (exit + enforced).as_secs_f64() * 1000.0
}
