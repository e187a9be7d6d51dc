//! Scheduling throughput: 100 Jobs × 100 Tasks onto 1,000 simulated robots,
//! through apiserver-lite on loopback, in a process of its own (this bench
//! started again with `--apiserver KUBECONFIG`), as the scale benches run
//! it: the figure is the manager's, not the two sharing one process.
//!
//! Timed from the first Job's creation to the moment the watch shows all
//! 10,000 Tasks `dispatching`: fan-out (Job → TaskGroups → Tasks), the
//! scheduling decisions, and the writes of each placement (the status, and
//! the target robot unless the Task was created naming it) included. Bounded: gives up after `--deadline` seconds. API
//! writes per decision count every write in that time (creations too).
//!
//! `cargo bench -p k8s4r-manager --bench schedule`

use std::collections::HashSet;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use futures::{stream, StreamExt, TryStreamExt};
use jiff::Timestamp;
use k8s4r_api::names::MANAGER_SERVER;
use k8s4r_api::{
    DeviceInfo, Job, JobSpec, Quantity, Robot, RobotPhase, RobotResources, RobotSpec, RobotStatus, Task,
    TaskGroup, TaskGroupTemplate, TaskState, TaskTemplate,
};
use k8s4r_manager::{ManagerConfig, Metrics};
use k8s4r_testbed::{bench_arg as arg, resource_version};
use k8s_openapi::api::core::v1::Namespace;
use k8s_openapi::apiextensions_apiserver::pkg::apis::apiextensions::v1::CustomResourceDefinition;
use kube::api::{ObjectMeta, Patch, PatchParams, PostParams, WatchEvent, WatchParams};
use kube::runtime::{watcher, WatchStreamExt};
use kube::{Api, Client, ResourceExt};
use serde::Serialize;
use tokio_util::sync::CancellationToken;

const ROBOTS: usize = 1_000;
const JOBS: usize = 100;
const TASKS_PER_JOB: i32 = 100;
const NS: &str = "bench";

#[derive(Debug, Serialize)]
struct StatusBody<'a> {
    status: &'a RobotStatus,
}

async fn setup(client: &Client) -> anyhow::Result<()> {
    let crds: Api<CustomResourceDefinition> = Api::all(client.clone());
    for (_, crd) in k8s4r_api::crd::crds() {
        crds.create(&PostParams::default(), &crd).await?;
    }
    let namespaces: Api<Namespace> = Api::all(client.clone());
    for ns in [NS, "k8s4r-system", "k8s4r-robot-leases"] {
        let obj = Namespace {
            metadata: ObjectMeta {
                name: Some(ns.into()),
                ..ObjectMeta::default()
            },
            ..Namespace::default()
        };
        namespaces.create(&PostParams::default(), &obj).await?;
    }
    Ok(())
}

async fn create_robots(client: &Client) -> anyhow::Result<()> {
    let api: Api<Robot> = Api::all(client.clone());
    let params = PatchParams {
        field_manager: Some(MANAGER_SERVER.into()),
        ..PatchParams::default()
    };
    stream::iter(0..ROBOTS)
        .map(Ok::<_, anyhow::Error>)
        .try_for_each_concurrent(32, |i| {
            let api = api.clone();
            let params = params.clone();
            async move {
                let name = format!("robot-{i:04}");
                let mut robot = Robot::new(&name, RobotSpec::default());
                robot.labels_mut().insert("zone".into(), format!("z{}", i % 10));
                api.create(&PostParams::default(), &robot).await?;
                let now = Timestamp::now();
                let status = RobotStatus {
                    phase: Some(RobotPhase::Online),
                    last_heartbeat_time: Some(now),
                    last_registration_time: Some(now),
                    device: Some(DeviceInfo {
                        arch: "aarch64".into(),
                        os: "linux".into(),
                        cpus: 4,
                        memory_bytes: 4 << 30,
                        ..DeviceInfo::default()
                    }),
                    capacity: Some(RobotResources {
                        cpu: Some(Quantity::from("4")),
                        memory: Some(Quantity::from("4Gi")),
                        tasks: 0,
                    }),
                    // What the manager would write for an idle robot (with
                    // `schedulable` below), so the start is not 1,000 patches.
                    allocated: Some(RobotResources {
                        cpu: Some(Quantity::from("0")),
                        memory: Some(Quantity::from("0")),
                        tasks: 0,
                    }),
                    drivers: vec!["exec".into(), "raw_exec".into()],
                    schedulable: Some(true),
                    ..RobotStatus::default()
                };
                api.patch_status(&name, &params, &Patch::Merge(&StatusBody { status: &status }))
                    .await?;
                Ok(())
            }
        })
        .await
}

fn job(i: usize) -> Job {
    let task = TaskTemplate {
        driver: "exec".into(),
        command: "/bin/true".into(),
        resources: Some(k8s4r_api::TaskResources {
            cpu: Some(Quantity::from("100m")),
            memory: Some(Quantity::from("64Mi")),
            ..k8s4r_api::TaskResources::default()
        }),
        ..TaskTemplate::default()
    };
    Job::new(
        &format!("job-{i:03}"),
        JobSpec {
            robot_selector: None,
            constraints: vec![],
            task_groups: vec![TaskGroupTemplate {
                name: "work".into(),
                count: Some(TASKS_PER_JOB),
                task,
                ..TaskGroupTemplate::default()
            }],
            priority: 0,
            order: vec![],
            ..JobSpec::default()
        },
    )
}

/// Counts the writes to objects of kind `K` after resourceVersion `from`,
/// one per watch event, until the task is aborted.
fn count_writes<K>(client: &Client, from: u64) -> (Arc<AtomicU64>, tokio::task::JoinHandle<()>)
where
    K: kube::Resource<DynamicType = ()>
        + Clone
        + serde::de::DeserializeOwned
        + std::fmt::Debug
        + Send
        + 'static,
{
    let count = Arc::new(AtomicU64::new(0));
    let api: Api<K> = Api::all(client.clone());
    let counted = count.clone();
    let task = tokio::spawn(async move {
        let Ok(events) = api.watch(&WatchParams::default(), &from.to_string()).await else {
            return;
        };
        futures::pin_mut!(events);
        while let Some(Ok(event)) = events.next().await {
            if matches!(
                event,
                WatchEvent::Added(_) | WatchEvent::Modified(_) | WatchEvent::Deleted(_)
            ) {
                counted.fetch_add(1, Ordering::Relaxed);
            }
        }
    });
    (count, task)
}

/// The child: serves apiserver-lite, writes its kubeconfig to `path`, and
/// stops when its parent closes its stdin.
async fn serve_apiserver(path: &std::path::Path) -> anyhow::Result<()> {
    let server = apiserver_lite::Config::for_tests()
        .history(1_000_000)
        .start()
        .await?;
    let partial = path.with_extension("partial");
    server.write_kubeconfig(&partial)?;
    std::fs::rename(&partial, path)?;
    let _ = tokio::task::spawn_blocking(|| {
        let mut sink = Vec::new();
        std::io::Read::read_to_end(&mut std::io::stdin(), &mut sink)
    })
    .await;
    drop(server);
    Ok(())
}

/// apiserver-lite in a child process, and a client of it.
struct ApiProcess {
    child: std::process::Child,
    _dir: tempfile::TempDir,
}

impl ApiProcess {
    async fn start() -> anyhow::Result<(Self, Client)> {
        let dir = tempfile::tempdir()?;
        let kubeconfig = dir.path().join("kubeconfig");
        let child = std::process::Command::new(std::env::current_exe()?)
            .arg("--apiserver")
            .arg(&kubeconfig)
            .stdin(std::process::Stdio::piped())
            .spawn()?;
        let api = ApiProcess { child, _dir: dir };
        let by = Instant::now() + Duration::from_secs(60);
        let yaml = loop {
            if let Ok(yaml) = std::fs::read_to_string(&kubeconfig) {
                break yaml;
            }
            anyhow::ensure!(Instant::now() < by, "apiserver-lite did not start within 60 s");
            tokio::time::sleep(Duration::from_millis(20)).await;
        };
        let client = apiserver_lite::server::client_for(&yaml).await?;
        Ok((api, client))
    }
}

impl Drop for ApiProcess {
    fn drop(&mut self) {
        drop(self.child.stdin.take());
        let _ = self.child.wait();
    }
}

#[tokio::main(flavor = "multi_thread")]
async fn main() -> anyhow::Result<()> {
    let args: Vec<String> = std::env::args().collect();
    if let Some(i) = args.iter().position(|a| a == "--apiserver") {
        let path = args
            .get(i + 1)
            .ok_or_else(|| anyhow::anyhow!("--apiserver KUBECONFIG"))?;
        return serve_apiserver(std::path::Path::new(path)).await;
    }
    // The manager's own logs, for whoever tunes this: RUST_LOG=warn.
    if std::env::var_os("RUST_LOG").is_some() {
        tracing_subscriber::fmt()
            .with_env_filter(tracing_subscriber::EnvFilter::from_default_env())
            .with_writer(std::io::stderr)
            .init();
    }
    let deadline = Duration::from_secs(arg("--deadline", 300));
    let (server, client) = ApiProcess::start().await?;
    setup(&client).await?;
    create_robots(&client).await?;

    let config = ManagerConfig {
        auto_approve: true,
        ..ManagerConfig::default()
    };
    let metrics = Arc::new(Metrics::default());
    let shutdown = CancellationToken::new();
    let manager = tokio::spawn(k8s4r_manager::run_with_metrics(
        config,
        client.clone(),
        metrics.clone(),
        shutdown.clone(),
    ));
    let ready_by = Instant::now() + Duration::from_secs(60);
    while !metrics.is_ready() {
        anyhow::ensure!(Instant::now() < ready_by, "manager not ready within 60 s");
        tokio::time::sleep(Duration::from_millis(10)).await;
    }

    let total = JOBS * TASKS_PER_JOB as usize;
    let tasks: Api<Task> = Api::namespaced(client.clone(), NS);
    let watch = tokio::spawn(async move {
        let mut dispatched = HashSet::with_capacity(total);
        let stream = watcher(tasks, watcher::Config::default()).applied_objects();
        futures::pin_mut!(stream);
        while let Some(task) = stream.next().await {
            let Ok(task) = task else { continue };
            let state = task.status.as_ref().and_then(|s| s.state);
            if state == Some(TaskState::Dispatching) {
                dispatched.insert(task.name_any());
                if dispatched.len() == total {
                    return Instant::now();
                }
            }
        }
        Instant::now()
    });

    let writes_before = resource_version(&client).await;
    let by_kind = [
        ("Robot", count_writes::<Robot>(&client, writes_before)),
        ("TaskGroup", count_writes::<TaskGroup>(&client, writes_before)),
        ("Job", count_writes::<Job>(&client, writes_before)),
    ];
    let start = Instant::now();
    let jobs: Api<Job> = Api::namespaced(client.clone(), NS);
    stream::iter(0..JOBS)
        .map(Ok::<_, anyhow::Error>)
        .try_for_each_concurrent(16, |i| {
            let jobs = jobs.clone();
            async move {
                jobs.create(&PostParams::default(), &job(i)).await?;
                Ok(())
            }
        })
        .await?;
    let done = tokio::time::timeout(deadline, watch).await;
    let decisions = metrics.decisions.get();
    // Every write moves the store's resourceVersion: Job, TaskGroup and
    // Task creations, placements, Events, Robot and status patches.
    let writes = resource_version(&client).await.saturating_sub(writes_before);
    shutdown.cancel();
    let _ = tokio::time::timeout(Duration::from_secs(10), manager).await;
    let finished = match done {
        Ok(Ok(at)) => at,
        _ => anyhow::bail!("not every task dispatched within {deadline:?} ({decisions} decisions made)"),
    };
    let secs = finished.duration_since(start).as_secs_f64();
    // Where the time went, for whoever tunes this next (not a BENCH line).
    for c in k8s4r_manager::metrics::CONTROLLERS {
        let m = metrics.controller(c);
        eprintln!(
            "{c}: {} reconciles, {} errors",
            m.reconciles.get(),
            m.errors.get()
        );
    }
    println!("BENCH schedule_10k_tasks_s {secs:.2} s");
    println!(
        "BENCH schedule_decisions_per_s {:.0} decisions/s",
        decisions as f64 / secs
    );
    println!(
        "BENCH api_writes_per_decision {:.2} writes",
        writes as f64 / decisions.max(1) as f64
    );
    // Where the writes went: creations are known, and a placement is its
    // status patch plus a `spec.targetRobot` patch unless the Task was
    // created naming its robot; Events are counted; the rest is Robot
    // `allocated` and group and Job status.
    let events: Api<k8s_openapi::api::events::v1::Event> = Api::namespaced(client.clone(), NS);
    let event_count = events.list_metadata(&Default::default()).await?.items.len() as u64;
    let created = (JOBS * 2) as u64 + total as u64;
    let placement = decisions + metrics.target_patches.get();
    eprintln!(
        "{writes} API writes for {decisions} decisions: {created} creations, {placement} placement patches ({} of spec.targetRobot), {event_count} Events ({} routine ones not published, --event-qps), {} others",
        metrics.target_patches.get(),
        metrics.events_dropped.get(),
        writes.saturating_sub(created + placement + event_count)
    );
    // Counted until the manager stopped (a few writes past `writes`).
    let kinds: Vec<String> = by_kind
        .iter()
        .map(|(kind, (count, task))| {
            task.abort();
            format!("{kind} {}", count.load(Ordering::Relaxed))
        })
        .collect();
    eprintln!("writes per kind (creations included): {}", kinds.join(", "));
    drop(server);
    Ok(())
}
