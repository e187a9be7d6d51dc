//! End-to-end figures of the whole stack on one machine (issue 8):
//!
//! - `up_ready_s`: the `k8s4r` binary started on a fresh data dir until it
//!   prints "k8s4r is up" (API server serving the CRDs, broker accepting,
//!   server, manager and local agent running);
//! - `dispatch_latency_p50_ms` / `_p99_ms`: 200 single-task Jobs, one after
//!   another, from the create call until the process runs on the robot
//!   (the Task's `status.startTime`, stamped by the agent when it spawned the
//!   process; same machine, same clock).
//!
//! `cargo bench -p k8s4r --bench e2e` (loopback only, bounded: gives up
//! after 10 minutes).

mod common;
use common::{free_port, percentile};
use std::io::{BufRead, BufReader};
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use k8s4r::up::{Stack, UpArgs};
use k8s4r_api::{Job, JobSpec, Robot, RobotPhase, Task, TaskGroupTemplate, TaskTemplate};
use kube::api::{ListParams, PostParams};
use kube::Api;
use tokio_util::sync::CancellationToken;

const JOBS: usize = 200;

fn up_args() -> UpArgs {
    let (api, mqtt) = (
        format!("127.0.0.1:{}", free_port()),
        format!("127.0.0.1:{}", free_port()),
    );
    UpArgs::from_flags(&[
        "--api-bind",
        &api,
        "--mqtt-bind",
        &mqtt,
        "--local-agent",
        "true",
        "--robot-id",
        "bench-robot",
        "--no-dashboard",
        "--store-listen",
        "127.0.0.1:0",
    ])
    .expect("the flags of up")
}

fn measure_up_ready() -> f64 {
    let dir = tempfile::tempdir().unwrap();
    let args = up_args();
    let started = Instant::now();
    let mut child = Command::new(env!("CARGO_BIN_EXE_k8s4r"))
        .arg("--data-dir")
        .arg(dir.path())
        .args([
            "--log",
            "warn",
            "up",
            "--local-agent",
            "--store-listen",
            "127.0.0.1:0",
            "--api-bind",
        ])
        .arg(args.api_bind.to_string())
        .arg("--mqtt-bind")
        .arg(args.mqtt_bind.to_string())
        .stdout(Stdio::piped())
        .stderr(Stdio::null())
        .spawn()
        .expect("start k8s4r up");
    let stdout = child.stdout.take().unwrap();
    let mut ready = None;
    for line in BufReader::new(stdout).lines().map_while(Result::ok) {
        if line.contains("k8s4r is up") {
            ready = Some(started.elapsed().as_secs_f64());
            break;
        }
    }
    let _ = child.kill();
    let _ = child.wait();
    ready.expect("k8s4r up never printed that it is up")
}

async fn measure_dispatch() -> Vec<f64> {
    let dir = tempfile::tempdir().unwrap();
    let shutdown = CancellationToken::new();
    let stack = Stack::start(&up_args(), dir.path(), shutdown.clone())
        .await
        .expect("start the stack");
    let robots: Api<Robot> = Api::all(stack.client.clone());
    let deadline = Instant::now() + Duration::from_secs(60);
    loop {
        let online = robots
            .get_opt("bench-robot")
            .await
            .ok()
            .flatten()
            .and_then(|r| r.status)
            .and_then(|s| s.phase)
            == Some(RobotPhase::Online);
        if online {
            break;
        }
        assert!(Instant::now() < deadline, "the local robot did not come Online");
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    let jobs: Api<Job> = Api::namespaced(stack.client.clone(), "default");
    let tasks: Api<Task> = Api::namespaced(stack.client.clone(), "default");
    let bench_deadline = Instant::now() + Duration::from_secs(600);
    let mut latencies = Vec::with_capacity(JOBS);
    for i in 0..JOBS {
        let name = format!("latency-{i}");
        let job = Job::new(
            &name,
            JobSpec {
                task_groups: vec![TaskGroupTemplate {
                    name: "one".to_owned(),
                    count: Some(1),
                    task: TaskTemplate {
                        driver: "raw_exec".to_owned(),
                        command: "/bin/true".to_owned(),
                        ..Default::default()
                    },
                    ..Default::default()
                }],
                ..Default::default()
            },
        );
        let created = jiff::Timestamp::now();
        jobs.create(&PostParams::default(), &job)
            .await
            .expect("create job");
        let selector = format!("{}={name}", k8s4r_api::names::LABEL_JOB);
        let started = loop {
            let list = tasks
                .list(&ListParams::default().labels(&selector))
                .await
                .expect("list tasks");
            if let Some(at) = list
                .items
                .iter()
                .find_map(|t| t.status.as_ref().and_then(|s| s.start_time))
            {
                break at;
            }
            assert!(
                Instant::now() < bench_deadline,
                "job {name} never started within the bench's bound"
            );
            tokio::time::sleep(Duration::from_millis(5)).await;
        };
        let ms = started.duration_since(created).as_secs_f64() * 1000.0;
        latencies.push(ms);
    }
    shutdown.cancel();
    stack.stop().await.expect("stop the stack");
    latencies
}

fn main() {
    if !common::start() {
        return;
    }
    let mut ready: Vec<f64> = (0..3).map(|_| measure_up_ready()).collect();
    ready.sort_by(f64::total_cmp);
    println!("INFO up ready over 3 starts: {ready:.3?} s");
    println!("BENCH up_ready_s {:.3} s", ready[1]);

    let runtime = tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .build()
        .unwrap();
    let mut latencies = runtime.block_on(measure_dispatch());
    latencies.sort_by(f64::total_cmp);
    println!(
        "INFO dispatch latency over {JOBS} jobs: min {:.1} ms, max {:.1} ms",
        latencies[0],
        latencies[latencies.len() - 1]
    );
    println!(
        "BENCH dispatch_latency_p50_ms {:.1} ms",
        percentile(&latencies, 50.0)
    );
    println!(
        "BENCH dispatch_latency_p99_ms {:.1} ms",
        percentile(&latencies, 99.0)
    );
}
