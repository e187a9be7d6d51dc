//! The podman driver's figures, on real parts: Debian's podman (vfs, runc)
//! on a store of the bench's own, an image built with buildah and pulled by
//! digest from a real registry on loopback, the supervisor with its shims.
//!
//! - `podman_task_start_p99_ms`: the image on the robot already; from
//!   submit() (the dispatch handed to the supervisor) to the task's
//!   process running inside its container (it writes a file as its first
//!   act), for 40 tasks one after the other.
//! - `podman_sigterm_late_p99_ms`: 40 containers with staggered timeouts;
//!   how long after each deadline the supervisor had sent the stop signal
//!   (to the podman client, which passes it into the container), p99, as
//!   the supervisor measures it for `exec`. An INFO line adds the end as
//!   observed from outside (the container's exit and the client's).
//!
//! Run: `cargo bench -p k8s4r-agent --bench podman`

use std::path::Path;
use std::time::{Duration, Instant};

use k8s4r_agent::supervisor::{self, Policy, SupervisorConfig, SupervisorHandle, TaskEvent, TaskRequest};
use k8s4r_api::{DurationString, TaskReason, TaskTemplate};
use k8s4r_drivers::PodmanConfig;
use k8s4r_testbed::registry::{PodmanStore, Registry};
use tokio::sync::mpsc::UnboundedReceiver;

const TASKS: usize = 40;
const PATIENCE: Duration = Duration::from_secs(120);

fn main() {
    let runtime = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .expect("runtime");
    runtime.block_on(bench());
}

fn load_average() -> String {
    let loadavg = std::fs::read_to_string("/proc/loadavg").unwrap_or_default();
    loadavg.split_whitespace().take(3).collect::<Vec<_>>().join(" ")
}

fn quantile(samples: &[f64], q: f64) -> f64 {
    let mut sorted = samples.to_vec();
    sorted.sort_by(f64::total_cmp);
    let rank = ((sorted.len() as f64) * q).ceil() as usize;
    sorted[rank.saturating_sub(1).min(sorted.len() - 1)]
}

fn start(dir: &Path, store: &PodmanStore) -> (SupervisorHandle, UnboundedReceiver<TaskEvent>) {
    supervisor::spawn(SupervisorConfig {
        state_dir: dir.to_path_buf(),
        policy: Policy {
            raw_exec: false,
            allow_root: false,
            ..SupervisorConfig::default().policy
        },
        max_tasks: 200,
        shim_program: Some(std::path::PathBuf::from(env!("CARGO_BIN_EXE_k8s4r-agent"))),
        podman: Some(PodmanConfig {
            global_args: store.args(),
            tls_verify: false,
            run_dir: dir.join("podman"),
            ..PodmanConfig::default()
        }),
        ..SupervisorConfig::default()
    })
    .expect("supervisor")
}

fn container(image: &str, script: &str) -> TaskTemplate {
    TaskTemplate {
        driver: "podman".into(),
        command: "/bin/sh".into(),
        args: vec!["-c".into(), script.into()],
        image: Some(image.into()),
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

async fn finished(
    events: &mut UnboundedReceiver<TaskEvent>,
    uid: &str,
) -> k8s4r_agent::supervisor::TaskOutcome {
    let deadline = tokio::time::Instant::now() + PATIENCE;
    loop {
        let event = tokio::time::timeout_at(deadline, events.recv())
            .await
            .expect("no end in time")
            .expect("supervisor gone");
        if let TaskEvent::Finished { uid: u, outcome, .. } = event {
            if u == uid {
                return outcome;
            }
        }
    }
}

async fn bench() {
    println!("INFO load average at start: {}", load_average());
    let registry = Registry::start();
    let image = registry.push_test_image("bench");
    let store = PodmanStore::new();
    let dir = tempfile::tempdir().expect("tempdir");
    let (handle, mut events) = start(dir.path(), &store);

    // The first task pulls the image; it is not counted.
    handle
        .submit(request("pull".into(), container(&image, "true")))
        .await
        .expect("submit");
    let first = finished(&mut events, "pull").await;
    assert_eq!(first.reason, TaskReason::Completed, "{}", first.message);

    let mut starts = Vec::with_capacity(TASKS);
    for i in 0..TASKS {
        let uid = format!("start-{i}");
        let up = dir.path().join(format!("tasks/{uid}-1/work/up"));
        let began = Instant::now();
        handle
            .submit(request(uid.clone(), container(&image, ": > up; exec sleep 1000")))
            .await
            .expect("submit");
        while !up.exists() {
            assert!(began.elapsed() < PATIENCE, "{uid} did not start");
            tokio::time::sleep(Duration::from_millis(2)).await;
        }
        starts.push(began.elapsed().as_secs_f64() * 1000.0);
        handle.cancel(&uid, Some(1), "measured".into()).await;
        let _ = finished(&mut events, &uid).await;
    }
    println!(
        "INFO podman task start: p50 {:.1} ms, max {:.1} ms",
        quantile(&starts, 0.5),
        quantile(&starts, 1.0)
    );
    println!("BENCH podman_task_start_p99_ms {:.1} ms", quantile(&starts, 0.99));

    // Lateness: containers that end on their stop signal, timeouts 150 ms
    // apart from 4 s on (the starts above take about that long each).
    let mut ends = Vec::with_capacity(TASKS);
    let mut due = std::collections::HashMap::new();
    for i in 0..TASKS {
        let uid = format!("late-{i}");
        let mut spec = container(&image, "exec sleep 1000");
        let timeout = Duration::from_millis(4000 + 150 * i as u64);
        spec.timeout = Some(DurationString::from(
            format!("{}ms", timeout.as_millis()).as_str(),
        ));
        handle.submit(request(uid.clone(), spec)).await.expect("submit");
        due.insert(uid, timeout);
    }
    let mut started = std::collections::HashMap::new();
    while ends.len() < TASKS {
        let event = tokio::time::timeout(PATIENCE, events.recv())
            .await
            .expect("an event")
            .expect("supervisor");
        match event {
            TaskEvent::Started { uid, at, .. } => {
                started.insert(uid, at);
            }
            TaskEvent::Finished { uid, outcome, .. } if uid.starts_with("late-") => {
                assert_eq!(outcome.reason, TaskReason::Timeout, "{uid}: {}", outcome.message);
                let deadline = started[&uid] + due[&uid];
                let span = outcome.finished_at.duration_since(deadline);
                ends.push(span.as_secs_f64() * 1000.0);
            }
            _ => {}
        }
    }
    let stats = handle.stats().await;
    let ms = |d: Duration| d.as_secs_f64() * 1000.0;
    println!(
        "INFO podman end observed after the deadline (stop signal into the container, its exit, the client's): p50 {:.1} ms, p99 {:.1} ms",
        quantile(&ends, 0.5),
        quantile(&ends, 0.99)
    );
    println!(
        "BENCH podman_sigterm_late_p99_ms {:.2} ms",
        ms(stats.sigterm_late.quantile(0.99).unwrap_or_default())
    );
    handle.shutdown().await;
    println!("INFO load average at end: {}", load_average());
}
