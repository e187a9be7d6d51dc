//! Figures of the agent's connectivity, on loopback against a real
//! Mosquitto, with the release binary:
//!
//! - `agent_idle_rss_mib`: resident memory (VmRSS) of the agent connected,
//!   approved and heartbeating with no task.
//! - `outbox_drain_100_s`: 100 status updates wait in the outbox while the
//!   broker is down; time from the broker accepting connections again until
//!   the test server has received all 100 and the agent's outbox is empty
//!   (every one PUBACKed). Includes the agent's reconnect delay, capped at
//!   500ms here (`--reconnect-max 500ms`), and the median of 3 runs.
//!
//! Run: `cargo bench -p k8s4r-agent --bench connectivity --profile robot`
//! (the agent as shipped to robots; under the default bench profile it is
//! the cluster's `--release` build, a larger binary with more pages to touch).

#[path = "../tests/support/mod.rs"]
mod support;

use std::collections::BTreeSet;
use std::time::{Duration, Instant};

use k8s4r_agent::outbox::Outbox;
use k8s4r_api::protocol::{decode, StatusUpdate};
use k8s4r_api::{TaskReason, TaskState};
use support::{Agent, Broker, Server};

const PENDING: usize = 100;

fn main() {
    let runtime = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .expect("runtime");
    runtime.block_on(async {
        let rss = idle_rss_mib().await;
        println!("BENCH agent_idle_rss_mib {rss:.2} MiB");
        let mut drains = Vec::new();
        for run in 0..3 {
            drains.push(outbox_drain(run).await);
        }
        drains.sort_by(f64::total_cmp);
        eprintln!("outbox drain runs: {drains:?}");
        println!("BENCH outbox_drain_100_s {:.3} s", drains[1]);
    });
}

fn vm_rss_kib(pid: i32) -> u64 {
    let status = std::fs::read_to_string(format!("/proc/{pid}/status")).expect("read /proc/<pid>/status");
    status
        .lines()
        .find_map(|l| l.strip_prefix("VmRSS:"))
        .and_then(|v| v.trim().trim_end_matches("kB").trim().parse().ok())
        .expect("VmRSS in /proc/<pid>/status")
}

async fn idle_rss_mib() -> f64 {
    let broker = Broker::start();
    let mut server = Server::connect(&broker, "bench-rss").await;
    let tmp = tempfile::tempdir().expect("tempdir");
    let mut agent = Agent::start(
        &broker,
        "bench-rss",
        &tmp.path().join("state"),
        &["--log", "warn"],
    );
    server.approve("bench-rss").await;
    // Heartbeats every 200ms (the fixture's cadence): wait for 15 of them so
    // that every periodic path (usage sampling included) has run.
    for _ in 0..15 {
        server.next("/heartbeat", Duration::from_secs(10)).await;
    }
    assert!(agent.is_running());
    let kib = vm_rss_kib(agent.pid());
    kib as f64 / 1024.0
}

fn update(i: usize) -> StatusUpdate {
    StatusUpdate {
        exit_code: Some(0),
        reason: Some(TaskReason::Completed),
        start_time: Some(jiff::Timestamp::now()),
        finish_time: Some(jiff::Timestamp::now()),
        output_tail: Some("ok\n".repeat(20)),
        ..StatusUpdate::new(format!("bench-{i:03}"), 1, 0, TaskState::Completed)
    }
}

async fn outbox_drain(run: usize) -> f64 {
    let robot = format!("bench-drain-{run}");
    let mut broker = Broker::start();
    let mut server = Server::connect(&broker, &robot).await;
    broker.stop();

    let tmp = tempfile::tempdir().expect("tempdir");
    let state = tmp.path().join("state");
    {
        let mut outbox = Outbox::open(&state.join("outbox"), 10_000).expect("outbox");
        for i in 0..PENDING {
            outbox.push(update(i)).expect("push");
        }
    }
    let agent = Agent::start(
        &broker,
        &robot,
        &state,
        &[
            "--log",
            "warn",
            "--reconnect-min",
            "100ms",
            "--reconnect-max",
            "500ms",
        ],
    );
    // Let the agent fail to connect a few times, as after a real outage.
    tokio::time::sleep(Duration::from_secs(2)).await;
    assert_eq!(agent.outbox_files().len(), PENDING);

    broker.restart();
    let back = Instant::now();
    let mut seen = BTreeSet::new();
    let deadline = back + Duration::from_secs(30);
    loop {
        for m in server.drain(Duration::from_millis(5)).await {
            if m.topic.ends_with("/status") {
                if let Ok(u) = decode::<StatusUpdate>(&m.payload) {
                    seen.insert(u.task_uid);
                }
            }
        }
        if seen.len() == PENDING && agent.outbox_files().is_empty() {
            break;
        }
        assert!(
            Instant::now() < deadline,
            "outbox not drained in 30 s: {} received, {} left",
            seen.len(),
            agent.outbox_files().len()
        );
    }
    back.elapsed().as_secs_f64()
}
