//! `log_follow_latency_p99_ms` (issue 18): on `k8s4r up` (embedded API
//! server, broker, server, manager and local agent in one process), a task
//! writes a line stamped with the time every 50 ms for 15 s; `k8s4r logs
//! -f`'s reading function follows it through the API server's aggregation,
//! the server and MQTT, and each line's latency is the time it is read
//! minus the time it was written (same machine, same clock).
//!
//! `cargo bench -p k8s4r --bench logs` (loopback only).

mod common;
use common::{free_port, percentile};
use std::time::{Duration, Instant};

use futures::StreamExt;
use k8s4r::up::{Stack, UpArgs};
use k8s4r_api::{Job, JobSpec, Robot, RobotPhase, Task, TaskGroupTemplate, TaskState, TaskTemplate};
use kube::api::PostParams;
use kube::Api;
use tokio_util::sync::CancellationToken;

const LINES: usize = 300;

async fn wait_for(what: &str, mut check: impl AsyncFnMut() -> bool) {
    let deadline = Instant::now() + Duration::from_secs(60);
    while !check().await {
        assert!(Instant::now() < deadline, "{what} did not happen in 60 s");
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
}

async fn measure() -> Vec<f64> {
    let dir = tempfile::tempdir().unwrap();
    let (api, mqtt) = (
        format!("127.0.0.1:{}", free_port()),
        format!("127.0.0.1:{}", free_port()),
    );
    let args = UpArgs::from_flags(&[
        "--api-bind",
        &api,
        "--mqtt-bind",
        &mqtt,
        "--local-agent",
        "true",
        "--robot-id",
        "bench-robot",
        "--in-memory",
        "--no-dashboard",
        "--store-listen",
        "127.0.0.1:0",
    ])
    .expect("the flags of up");
    let shutdown = CancellationToken::new();
    let stack = Stack::start(&args, dir.path(), shutdown.clone())
        .await
        .expect("start the stack");
    let robots: Api<Robot> = Api::all(stack.client.clone());
    wait_for("the local robot Online", async || {
        robots
            .get_opt("bench-robot")
            .await
            .ok()
            .flatten()
            .and_then(|r| r.status?.phase)
            == Some(RobotPhase::Online)
    })
    .await;
    let script = format!("for i in $(seq 1 {LINES}); do echo \"$(date +%s%6N) $i\"; sleep 0.05; done");
    let job = Job::new(
        "talker",
        JobSpec {
            task_groups: vec![TaskGroupTemplate {
                name: "t".to_owned(),
                count: Some(1),
                task: TaskTemplate {
                    driver: "raw_exec".to_owned(),
                    command: "/bin/sh".to_owned(),
                    args: vec!["-c".to_owned(), script],
                    ..Default::default()
                },
                ..Default::default()
            }],
            ..Default::default()
        },
    );
    Api::<Job>::namespaced(stack.client.clone(), "default")
        .create(&PostParams::default(), &job)
        .await
        .expect("create the job");
    let tasks: Api<Task> = Api::namespaced(stack.client.clone(), "default");
    wait_for("the task running", async || {
        tasks
            .get_opt("talker-t-0")
            .await
            .ok()
            .flatten()
            .and_then(|t| t.status?.state)
            == Some(TaskState::Running)
    })
    .await;
    // Lines on disk before the follow began are history, not latency.
    let opened = jiff::Timestamp::now().as_microsecond();
    let mut reading = k8s4r::logs::open(&stack.client, "default", "talker-t-0", "follow=true")
        .await
        .expect("follow the task");
    let mut partial = String::new();
    let mut latencies = Vec::with_capacity(LINES);
    while let Some(chunk) = reading.body.next().await {
        partial.push_str(&String::from_utf8_lossy(&chunk.expect("the stream holds")));
        let now = jiff::Timestamp::now().as_microsecond();
        while let Some(end) = partial.find('\n') {
            let line: String = partial.drain(..=end).collect();
            let written = line.split_whitespace().next().and_then(|t| t.parse::<i64>().ok());
            if let Some(written) = written.filter(|w| *w >= opened) {
                latencies.push((now - written) as f64 / 1000.0);
            }
        }
    }
    shutdown.cancel();
    stack.stop().await.expect("stop the stack");
    latencies
}

fn main() {
    if !common::start() {
        return;
    }
    let runtime = tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .build()
        .unwrap();
    let mut latencies = runtime.block_on(measure());
    latencies.sort_by(f64::total_cmp);
    println!(
        "INFO {} lines followed; p50 {:.1} ms, max {:.1} ms",
        latencies.len(),
        percentile(&latencies, 50.0),
        latencies[latencies.len() - 1]
    );
    println!(
        "BENCH log_follow_latency_p99_ms {:.1} ms",
        percentile(&latencies, 99.0)
    );
}
