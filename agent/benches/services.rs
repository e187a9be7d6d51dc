//! Figures of services on a robot with no broker, with the release agent
//! binary and a real Mosquitto (stopped for the measurements):
//!
//! - `service_restart_offline_ms`: a service exits (code 1) while the
//!   broker is down; time from its exit to the new process running (the
//!   service writes both times itself, from the same clock). Its `restart`
//!   asks for no delay (`delay: 0s`), so the figure is the agent's own
//!   cost; median of 20 restarts, the slowest printed beside it.
//! - `cold_boot_offline_s`: the agent and the service were SIGKILLed (as
//!   in a power cut) and the agent starts again with no broker; time from
//!   starting the agent binary to the service running again. Median of 5.
//!
//! Run: `cargo bench -p k8s4r-agent --bench services`

#[path = "../tests/support/mod.rs"]
mod support;

use std::path::Path;
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use k8s4r_api::protocol::{encode, StatusUpdate};
use k8s4r_api::{DurationString, LocalRestart, LocalRestartMode, TaskKind, TaskState};
use support::{eventually, shell_dispatch, Agent, Broker, Server};

const LONG: Duration = Duration::from_secs(30);
const RESTARTS: usize = 20;
const BOOTS: usize = 5;

fn main() {
    let runtime = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .expect("runtime");
    runtime.block_on(async {
        let mut restarts = restart_offline().await;
        restarts.sort_by(f64::total_cmp);
        let slowest = restarts.last().copied().unwrap_or_default();
        eprintln!("restart offline (ms): {restarts:?}");
        println!(
            "BENCH service_restart_offline_ms {:.1} ms",
            restarts[restarts.len() / 2]
        );
        println!("# slowest of {RESTARTS}: {slowest:.1} ms");
        let mut boots = Vec::new();
        for run in 0..BOOTS {
            boots.push(cold_boot(run).await);
        }
        boots.sort_by(f64::total_cmp);
        eprintln!("cold boot offline (s): {boots:?}");
        println!("BENCH cold_boot_offline_s {:.3} s", boots[boots.len() / 2]);
        println!(
            "# slowest of {BOOTS}: {:.3} s",
            boots.last().copied().unwrap_or_default()
        );
    });
}

fn now_ns() -> u128 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .expect("clock")
        .as_nanos()
}

/// `(event, nanoseconds)` lines the service wrote.
fn marks(log: &Path, event: &str) -> Vec<u128> {
    let text = std::fs::read_to_string(log).unwrap_or_default();
    text.lines()
        .filter_map(|l| l.strip_prefix(event)?.trim().parse().ok())
        .collect()
}

/// A service that logs `start <ns>`, and logs `exit <ns>` and exits 1
/// whenever `crash` appears (which it removes).
fn service(uid: &str, dir: &Path) -> k8s4r_api::protocol::Dispatch {
    let log = dir.join("marks");
    let crash = dir.join("crash");
    let script = format!(
        "echo $$ > {pid}; echo start $(date +%s%N) >> {log}; \
         while [ ! -e {crash} ]; do sleep 0.005; done; \
         rm -f {crash}; echo exit $(date +%s%N) >> {log}; exit 1",
        log = log.display(),
        pid = dir.join("pid").display(),
        crash = crash.display()
    );
    let mut dispatch = shell_dispatch(uid, 1, &script);
    dispatch.spec.kind = TaskKind::Service;
    dispatch.spec.restart = Some(LocalRestart {
        attempts: 1000,
        interval: Some(DurationString::from("1h")),
        delay: Some(DurationString::from("0s")),
        max_delay: Some(DurationString::from("0s")),
        mode: LocalRestartMode::Fail,
    });
    dispatch
}

/// Starts the stack of one measurement: broker, agent, the service
/// running; then stops the broker.
async fn running_offline(robot: &str, tmp: &Path) -> (Broker, Agent) {
    let mut broker = Broker::start();
    let mut server = Server::connect(&broker, robot).await;
    let agent = Agent::start(&broker, robot, &tmp.join("state"), &[]);
    server.approve(robot).await;
    server
        .publish(server.topics.dispatch(robot), encode(&service("u-bench", tmp)))
        .await;
    let running: StatusUpdate = server.next("/tasks/u-bench/status", LONG).await.decode();
    assert_eq!(running.state, TaskState::Running);
    let log = tmp.join("marks");
    eventually("the service's first start", LONG, || {
        marks(&log, "start").first().copied()
    })
    .await;
    broker.stop();
    (broker, agent)
}

async fn restart_offline() -> Vec<f64> {
    let tmp = tempfile::tempdir().expect("tempdir");
    let (_broker, _agent) = running_offline("bench-restart", tmp.path()).await;
    let log = tmp.path().join("marks");
    let mut out = Vec::new();
    for n in 1..=RESTARTS {
        std::fs::write(tmp.path().join("crash"), b"").expect("crash file");
        let starts = eventually("the service running again", LONG, || {
            let starts = marks(&log, "start");
            (starts.len() > n).then_some(starts)
        })
        .await;
        let exits = marks(&log, "exit");
        out.push((starts[n] - exits[n - 1]) as f64 / 1e6);
    }
    out
}

async fn cold_boot(run: usize) -> f64 {
    let tmp = tempfile::tempdir().expect("tempdir");
    let robot = format!("bench-boot-{run}");
    let (broker, mut agent) = running_offline(&robot, tmp.path()).await;
    agent.kill();
    // The service dies with the power too (an agent restart alone would
    // leave it running, re-adopted).
    let log = tmp.path().join("marks");
    let pid = std::fs::read_to_string(tmp.path().join("pid")).expect("the service's pid");
    let pid: i32 = pid.trim().parse().expect("a pid");
    let _ = nix::sys::signal::killpg(nix::unistd::Pid::from_raw(pid), nix::sys::signal::Signal::SIGKILL);
    let before = now_ns();
    let _agent = Agent::start(&broker, &robot, &tmp.path().join("state"), &[]);
    let started = eventually("the service running after the agent's start", LONG, || {
        marks(&log, "start").get(1).copied()
    })
    .await;
    (started.saturating_sub(before)) as f64 / 1e9
}
