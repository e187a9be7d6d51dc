//! Scale benchmarks with the fleet simulator (`k8s4r-sim`):
//! every cluster program a process of its own (API server, server, manager,
//! a real Mosquitto), and N simulated robots in this process, each a real
//! MQTT client speaking the agent's protocol; above 15,000 robots in
//! simulator processes of their own, each with its edge broker, which the
//! server connects to each of (`scale/shards.rs`; with `--bridged`, the
//! edges are bridged to one central broker the server connects to). Every
//! scenario runs either way; the reconnect storm then restarts every
//! broker.
//!
//!     cargo bench -p k8s4r-e2e --bench scale -- register-storm [--robots 10000]
//!     cargo bench -p k8s4r-e2e --bench scale -- heartbeats [--robots 10000] [--seconds 120]
//!     cargo bench -p k8s4r-e2e --bench scale -- dispatch [--robots 10000] [--jobs 10000] [--rate 200]
//!     cargo bench -p k8s4r-e2e --bench scale -- sustain [--robots 10000] [--rates 10,20,30] [--minutes 10]
//!     cargo bench -p k8s4r-e2e --bench scale -- reconnect-storm [--robots 5000] [--jobs 2000] [--rate 50] [--settle 70]
//!     cargo bench -p k8s4r-e2e --bench scale -- dashboard [--robots 10000] [--updates 100]
//!     cargo bench -p k8s4r-e2e --bench scale -- cost [--robots 100] [--jobs 100] [--rate 5]
//!
//! Each prints `BENCH <name> <value> <unit>` lines (BENCHMARKS.md) and a
//! short summary. The server and manager run with their production
//! defaults (Lease renewals at most every 60 s, lastHeartbeatTime every
//! 240 s, no disconnect grace).

use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

use k8s4r_api::{Robot, RobotPhase};
use k8s4r_sim::SimConfig;
use k8s4r_testbed::{bench_arg as arg, free_port, resource_version, Mosquitto, Program};
use kube::api::{ListParams, Patch, PatchParams};
use kube::{Api, Client};

const TOKEN: &str = "sim-bootstrap-token";

#[path = "scale/cost.rs"]
mod cost;
#[path = "scale/dashboard.rs"]
mod dashboard;
#[path = "scale/phases.rs"]
mod phases;
#[path = "scale/runs.rs"]
mod runs;
#[path = "scale/shards.rs"]
mod shards;
#[path = "scale/sims.rs"]
mod sims;
#[path = "scale/storms.rs"]
mod storms;
#[path = "scale/sustain.rs"]
mod sustain;

use phases::Phases;
use runs::{Latencies, Twice};
use sims::{Behaviour, Sims};

/// CPU time (user + system) of a process so far, in seconds.
fn cpu_seconds(pid: u32) -> f64 {
    let stat = std::fs::read_to_string(format!("/proc/{pid}/stat")).unwrap_or_default();
    let rest = stat.rsplit_once(')').map(|(_, r)| r).unwrap_or_default();
    let fields: Vec<&str> = rest.split_whitespace().collect();
    let ticks = |i: usize| fields.get(i).and_then(|v| v.parse::<f64>().ok()).unwrap_or(0.0);
    // utime and stime are fields 14 and 15 of stat: 11 and 12 after ')'.
    (ticks(11) + ticks(12)) / 100.0
}

/// A field of `/proc/<pid>/status` (`pid` "self" for this process) in
/// KiB: `VmRSS` (resident now) or `VmHWM` (its peak); 0 when unreadable.
pub fn status_kib(pid: &str, field: &str) -> f64 {
    std::fs::read_to_string(format!("/proc/{pid}/status"))
        .unwrap_or_default()
        .lines()
        .find_map(|l| l.strip_prefix(field)?.strip_prefix(':'))
        .and_then(|v| v.trim().trim_end_matches("kB").trim().parse::<f64>().ok())
        .unwrap_or(0.0)
}

/// CPU seconds so far of the product's programs (API server, server,
/// manager) and of what stands in for the fleet (brokers, simulators),
/// each by name.
fn cpu_by_part(cluster: &Cluster, fleet: &Sims) -> Vec<(&'static str, f64)> {
    let of = |pids: &mut dyn Iterator<Item = Option<u32>>| pids.flatten().map(cpu_seconds).sum::<f64>();
    let brokers = cluster
        .broker
        .iter()
        .chain(cluster.edges.iter().map(|(edge, _, _)| edge));
    vec![
        ("apiserver", of(&mut std::iter::once(cluster._api.pid()))),
        ("server", of(&mut std::iter::once(cluster.server.pid()))),
        ("manager", of(&mut std::iter::once(cluster.manager.pid()))),
        ("brokers", of(&mut brokers.map(|b| b.pid()))),
        ("simulator", of(&mut fleet.pids().into_iter().map(Some))),
    ]
}

/// What each part spent between two [`cpu_by_part`] readings over
/// `seconds`, as a line (cores), and the product's CPU-seconds.
fn cpu_spent(before: &[(&str, f64)], after: &[(&str, f64)], seconds: f64) -> (String, f64) {
    let mut product = 0.0;
    let parts: Vec<String> = before
        .iter()
        .zip(after)
        .map(|((name, b), (_, a))| {
            if !matches!(*name, "brokers" | "simulator") {
                product += a - b;
            }
            format!("{name} {:.2}", (a - b) / seconds.max(1e-9))
        })
        .collect();
    (parts.join(", "), product)
}

/// A process's peak resident memory, MiB.
fn peak_rss_mib(pid: u32) -> f64 {
    status_kib(&pid.to_string(), "VmHWM") / 1024.0
}

struct Cluster {
    _dir: tempfile::TempDir,
    /// The one broker, or the central one with `--bridged`.
    broker: Option<Mosquitto>,
    /// Above [`shards::per_process`] robots: the edge brokers, each with
    /// its block of robots (`first`, `count`).
    edges: Vec<(Mosquitto, usize, usize)>,
    _api: Program,
    server: Program,
    manager: Program,
    client: Client,
    kubeconfig: PathBuf,
    phases: Phases,
    _watch: AbortOnDrop,
    /// The server's and the manager's /metrics addresses.
    metrics: [String; 2],
}

impl Cluster {
    /// Every broker stops (SIGTERM, no persistence: every session and
    /// retained message is gone), then each starts again on its port.
    fn restart_brokers(&mut self) {
        if let Some(broker) = &mut self.broker {
            broker.stop();
        }
        for (edge, _, _) in &mut self.edges {
            edge.stop();
        }
        if let Some(broker) = &mut self.broker {
            broker.resume();
        }
        for (edge, _, _) in &mut self.edges {
            edge.resume();
        }
    }
}

/// Aborts its task when dropped.
struct AbortOnDrop(tokio::task::JoinHandle<()>);

impl Drop for AbortOnDrop {
    fn drop(&mut self) {
        self.0.abort();
    }
}

fn args(list: &[&str]) -> Vec<String> {
    list.iter().map(|s| (*s).to_owned()).collect()
}

/// The cluster's programs as processes, and the brokers for `robots`: one
/// Mosquitto, or above [`shards::per_process`] robots an edge per shard of
/// the simulator, the server connected to each (with `--bridged`, to a
/// central one they are bridged to).
async fn start_cluster(robots: usize) -> Cluster {
    // Every robot is a socket here and one in Mosquitto (which inherits
    // the limit).
    let _ = apiserver_lite::limits::raise_open_files_limit();
    let mut dir = tempfile::tempdir().expect("scratch dir");
    // K8S4R_SCALE_KEEP=1 keeps the programs' logs for a look.
    if std::env::var_os("K8S4R_SCALE_KEEP").is_some() {
        dir.disable_cleanup(true);
        println!("INFO cluster in {}", dir.path().display());
    }
    let path = |p: &str| -> PathBuf { dir.path().join(p) };
    let (broker, edges) = if robots > shards::per_process() {
        let bridged = std::env::args().any(|a| a == "--bridged");
        let brokers = shards::Brokers::start(robots, bridged);
        (brokers.central, brokers.edges)
    } else {
        let broker = Mosquitto::start_with(|port, _| {
            format!(
                "listener {port} 127.0.0.1\nallow_anonymous true\npersistence false\n\
                 max_queued_messages 10000\nmax_packet_size {}\n",
                k8s4r_api::protocol::MAX_PACKET_BYTES
            )
        });
        (Some(broker), Vec::new())
    };
    let broker_urls = match &broker {
        Some(broker) => broker.url(),
        None => edges
            .iter()
            .map(|(edge, _, _)| edge.url())
            .collect::<Vec<_>>()
            .join(","),
    };
    let (api, client, kubeconfig) =
        k8s4r_e2e::faults::start_api(Path::new(env!("CARGO_BIN_EXE_e2e-apiserver")), dir.path()).await;
    k8s4r::up::install_crds(&client).await.expect("CRDs");
    k8s4r::up::apply_cluster_rbac(&client).await.expect("RBAC");
    let secrets: Api<k8s_openapi::api::core::v1::Secret> = Api::namespaced(client.clone(), "k8s4r-system");
    let secret: k8s_openapi::api::core::v1::Secret = serde_json::from_value(serde_json::json!({
        "apiVersion": "v1", "kind": "Secret",
        "metadata": {"name": "k8s4r-bootstrap-tokens"},
        "stringData": {"sim": TOKEN},
    }))
    .unwrap();
    secrets
        .patch(
            "k8s4r-bootstrap-tokens",
            &PatchParams::apply("bench").force(),
            &Patch::Apply(&secret),
        )
        .await
        .expect("bootstrap token");
    let kc = kubeconfig.display().to_string();
    let metrics = [free_port(), free_port()].map(|port| format!("127.0.0.1:{port}"));
    let server = Program::start(
        "server",
        Path::new(env!("CARGO_BIN_EXE_e2e-server")),
        args(&[
            "--kubeconfig",
            &kc,
            "--broker-url",
            &broker_urls,
            "--metrics-addr",
            &metrics[0],
            "--log",
            "warn",
        ]),
        &path("server.log"),
    );
    let manager = Program::start(
        "manager",
        Path::new(env!("CARGO_BIN_EXE_e2e-manager")),
        args(&[
            "--kubeconfig",
            &kc,
            "--metrics-addr",
            &metrics[1],
            "--log",
            "warn",
        ]),
        &path("manager.log"),
    );
    let (phases, watch) = Phases::start(&client);
    Cluster {
        _dir: dir,
        broker,
        edges,
        _api: api,
        server,
        manager,
        client,
        kubeconfig,
        phases,
        _watch: AbortOnDrop(watch),
        metrics,
    }
}

/// The API writes the server and the manager counted so far, by program
/// and kind (`server lease ok`...), from their /metrics.
async fn writes_by_kind(cluster: &Cluster) -> std::collections::BTreeMap<String, f64> {
    let mut writes = std::collections::BTreeMap::new();
    for (program, addr) in ["server", "manager"].iter().zip(&cluster.metrics) {
        let text = k8s4r_e2e::faults::http_get(addr, "/metrics")
            .await
            .unwrap_or_default();
        for line in text.lines() {
            let Some((name, value)) = line.rsplit_once(' ') else {
                continue;
            };
            let Some(labels) = name
                .split_once("_api_writes_total{")
                .map(|(_, l)| l.trim_end_matches('}'))
            else {
                continue;
            };
            let kind: Vec<&str> = labels
                .split(',')
                .filter_map(|kv| Some(kv.split_once('=')?.1.trim_matches('"')))
                .collect();
            let value: f64 = value.parse().unwrap_or(0.0);
            *writes
                .entry(format!("{program} {}", kind.join(" ")))
                .or_insert(0.0) += value;
        }
    }
    writes
}

/// What each kind of write added between two readings of
/// [`writes_by_kind`], the kinds that added nothing left out.
fn writes_between(
    before: &std::collections::BTreeMap<String, f64>,
    after: &std::collections::BTreeMap<String, f64>,
) -> String {
    after
        .iter()
        .filter_map(|(kind, n)| {
            let added = n - before.get(kind).copied().unwrap_or(0.0);
            (added > 0.0).then(|| format!("{kind}: {added}"))
        })
        .collect::<Vec<_>>()
        .join(", ")
}

/// Waits (up to `--online-deadline`, 10 minutes) until every robot is
/// Online; otherwise says why the others are not, and gives up.
async fn all_online(cluster: &Cluster, robots: usize) {
    let started = Instant::now();
    let deadline = started + Duration::from_secs(arg("--online-deadline", 600));
    let mut said = Instant::now();
    while cluster.phases.online() < robots {
        if Instant::now() >= deadline {
            println!(
                "INFO not Online at the deadline: {:?}",
                not_online_reasons(&cluster.client).await
            );
            panic!("not every robot came Online");
        }
        if said.elapsed() >= Duration::from_secs(60) {
            said = Instant::now();
            println!(
                "INFO {} of {robots} Online after {:.0} s",
                cluster.phases.online(),
                started.elapsed().as_secs_f64()
            );
        }
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
}

/// How many robots are in each (phase, Ready reason) other than Online.
async fn not_online_reasons(client: &Client) -> std::collections::BTreeMap<String, usize> {
    let robots: Api<Robot> = Api::all(client.clone());
    let mut reasons = std::collections::BTreeMap::new();
    let mut params = ListParams::default().limit(2000);
    loop {
        let Ok(page) = robots.list(&params).await else {
            return reasons;
        };
        for robot in &page.items {
            let status = robot.status.clone().unwrap_or_default();
            if status.phase == Some(RobotPhase::Online) {
                continue;
            }
            let conditions: Vec<String> = status
                .conditions
                .iter()
                .map(|c| format!("{}={:?}/{}", c.type_, c.status, c.reason.as_deref().unwrap_or("")))
                .collect();
            let key = format!("{:?} {}", status.phase, conditions.join(","));
            *reasons.entry(key).or_insert(0) += 1;
        }
        match page.metadata.continue_ {
            Some(token) if !token.is_empty() => params = params.continue_token(&token),
            _ => return reasons,
        }
    }
}

/// Creates single-task Jobs `<prefix>0`... at a steady rate (job i at
/// i / rate seconds after `started`), each running `/bin/true`: their
/// names and when each was created.
async fn create_jobs(
    client: &Client,
    prefix: &str,
    jobs: usize,
    rate: u64,
    started: Instant,
) -> std::collections::HashMap<String, jiff::Timestamp> {
    use futures::StreamExt;
    let jobs_api: Api<k8s4r_api::Job> = Api::namespaced(client.clone(), "default");
    futures::stream::iter(0..jobs)
        .map(|i| {
            let jobs_api = jobs_api.clone();
            async move {
                let at = started + Duration::from_secs_f64(i as f64 / rate as f64);
                tokio::time::sleep_until(at.into()).await;
                let name = format!("{prefix}{i}");
                let job: k8s4r_api::Job = serde_json::from_value(serde_json::json!({
                    "apiVersion": "robot.k8s4r.io/v1alpha1", "kind": "Job",
                    "metadata": {"name": name, "namespace": "default"},
                    "spec": {"taskGroups": [{"name": "t", "count": 1,
                        "task": {"driver": "raw_exec", "command": "/bin/true"}}]},
                }))
                .unwrap();
                let at = jiff::Timestamp::now();
                jobs_api
                    .create(&kube::api::PostParams::default(), &job)
                    .await
                    .expect("create job");
                (name, at)
            }
        })
        .buffer_unordered(64)
        .collect()
        .await
}

/// Every Task in `default`, page by page.
async fn all_tasks(client: &Client) -> Vec<k8s4r_api::Task> {
    let tasks_api: Api<k8s4r_api::Task> = Api::namespaced(client.clone(), "default");
    let mut tasks = Vec::new();
    let mut params = ListParams::default().limit(2000);
    loop {
        let page = tasks_api.list(&params).await.expect("list tasks");
        tasks.extend(page.items);
        match page.metadata.continue_ {
            Some(token) if !token.is_empty() => params = params.continue_token(&token),
            _ => return tasks,
        }
    }
}

fn sim(cluster: &Cluster, robots: usize, heartbeat: Duration) -> SimConfig {
    SimConfig {
        broker: cluster
            .broker
            .as_ref()
            .map(Mosquitto::url)
            .expect("one broker for the fleet: at most 15,000 robots in this process, or --bridged"),
        token: TOKEN.into(),
        robots,
        heartbeat,
        ..SimConfig::default()
    }
}

/// All robots connect and register at once: time until every Robot is
/// Online, and how many never were.
async fn register_storm(robots: usize) {
    let cluster = start_cluster(robots).await;
    let started = Instant::now();
    let fleet = Sims::start(&cluster, robots, Behaviour::heartbeat(Duration::from_secs(30)));
    let deadline = Duration::from_secs(arg("--deadline", 300));
    let mut online = 0;
    while started.elapsed() < deadline {
        online = cluster.phases.online();
        if online >= robots {
            break;
        }
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
    let took = started.elapsed().as_secs_f64();
    println!(
        "INFO {online}/{robots} Online after {took:.1} s; {} connects, {} registrations answered Online",
        fleet.connects(),
        fleet.online()
    );
    println!("BENCH register_storm_{}_s {took:.1} s", label(robots));
    println!("BENCH register_storm_lost {} robots", robots - online);
    fleet.stop().await;
}

fn label(robots: usize) -> String {
    if robots.is_multiple_of(1000) {
        format!("{}k", robots / 1000)
    } else {
        robots.to_string()
    }
}

/// Robots heartbeating for a while once all are Online: the server's and
/// the manager's CPU and memory, API writes per heartbeat, MQTT bytes per
/// idle robot; then 100 robots vanish and the time until they are Offline.
async fn heartbeats(robots: usize, seconds: u64) {
    let cluster = start_cluster(robots).await;
    let fleet = Sims::start(
        &cluster,
        robots,
        Behaviour::heartbeat(Duration::from_secs(arg("--interval", 30))),
    );
    all_online(&cluster, robots).await;
    // Let the registration burst settle before measuring.
    tokio::time::sleep(Duration::from_secs(arg("--settle", 30))).await;
    let server_pid = cluster.server.pid().expect("server pid");
    let manager_pid = cluster.manager.pid().expect("manager pid");
    // Every robot keeps heartbeating: any seen Offline is a false one.
    cluster.phases.mark();
    let (s0, m0) = (cpu_seconds(server_pid), cpu_seconds(manager_pid));
    let rv0 = resource_version(&cluster.client).await;
    let kinds0 = writes_by_kind(&cluster).await;
    let hb0 = fleet.heartbeats();
    let bytes0 = fleet.bytes();
    let window = Instant::now();
    tokio::time::sleep(Duration::from_secs(seconds)).await;
    let secs = window.elapsed().as_secs_f64();
    let server_cores = (cpu_seconds(server_pid) - s0) / secs;
    let manager_cores = (cpu_seconds(manager_pid) - m0) / secs;
    let writes = resource_version(&cluster.client).await.saturating_sub(rv0);
    let kinds = writes_between(&kinds0, &writes_by_kind(&cluster).await);
    let beats = fleet.heartbeats() - hb0;
    let bytes = fleet.bytes() - bytes0;
    let kbit = bytes as f64 * 8.0 / 1000.0 / secs / robots as f64;
    let false_offline = cluster.phases.offline_since_mark();
    println!(
        "INFO {robots} robots, {beats} heartbeats in {secs:.0} s; {writes} API writes; server {server_cores:.3} cores, manager {manager_cores:.3} cores"
    );
    println!("INFO the programs' writes meanwhile, by kind and outcome (Events not counted): {kinds}");
    println!(
        "BENCH api_writes_per_heartbeat {:.3} writes",
        writes as f64 / beats.max(1) as f64
    );
    println!("BENCH server_cpu_cores_{} {server_cores:.3} cores", label(robots));
    println!(
        "BENCH manager_cpu_cores_{} {manager_cores:.3} cores",
        label(robots)
    );
    println!(
        "BENCH server_rss_mib_{} {:.1} MiB",
        label(robots),
        peak_rss_mib(server_pid)
    );
    println!(
        "BENCH manager_rss_mib_{} {:.1} MiB",
        label(robots),
        peak_rss_mib(manager_pid)
    );
    println!("BENCH idle_robot_kbit_per_s {kbit:.3} kbit/s");
    println!("BENCH false_offline_{} {false_offline} robots", label(robots));
    let (rss, processes) = match &fleet {
        Sims::Here(_) => (status_kib("self", "VmRSS"), 1),
        Sims::Shards(s) => (s.rss_kib(), cluster.edges.len()),
    };
    println!(
        "INFO the simulator: {:.1} KiB resident per robot ({robots} robots, {processes} process(es))",
        rss / robots as f64
    );

    offline_detection(&cluster, &fleet, 100.min(robots)).await;
    fleet.stop().await;
}

/// `vanished` robots lose power (their connections drop without a
/// goodbye): the time until all of them are Offline.
async fn offline_detection(cluster: &Cluster, fleet: &Sims, vanished: usize) {
    let gone = Instant::now();
    fleet.vanish(vanished);
    let deadline = Instant::now() + Duration::from_secs(300);
    loop {
        let offline = (0..vanished)
            .filter(|i| cluster.phases.phase(&format!("sim-{i}")) == Some(RobotPhase::Offline))
            .count();
        if offline == vanished {
            break;
        }
        assert!(
            Instant::now() < deadline,
            "{offline}/{vanished} vanished robots Offline after 300 s"
        );
        tokio::time::sleep(Duration::from_millis(250)).await;
    }
    println!("BENCH offline_detection_s {:.1} s", gone.elapsed().as_secs_f64());
}

/// Single-task Jobs created at a steady rate onto a connected fleet:
/// created → running (the robot's start of the Job's first run, which its
/// status reports as `startTime`) p50 and p99, tasks completed per second,
/// and tasks that ran twice (from every robot's runs, across simulator
/// processes).
async fn dispatch(robots: usize, jobs: usize, rate: u64) {
    let cluster = start_cluster(robots).await;
    let fleet = Sims::start(&cluster, robots, Behaviour::heartbeat(Duration::from_secs(30)));
    all_online(&cluster, robots).await;
    tokio::time::sleep(Duration::from_secs(arg("--settle", 10))).await;
    let started = Instant::now();
    let cpu_before = cpu_by_part(&cluster, &fleet);
    let created = create_jobs(&cluster.client, "d-", jobs, rate, started).await;
    let all_created = started.elapsed().as_secs_f64();
    // What was measured is printed even when not every task finished in
    // time (the figures are then over the tasks that started).
    let deadline = Instant::now() + Duration::from_secs(arg("--deadline", 900));
    // Finished runs count a task that ran twice twice: once they add up to
    // the Jobs, the tasks are counted from the runs themselves.
    while Instant::now() < deadline {
        if (fleet.finished() as usize) < jobs {
            tokio::time::sleep(Duration::from_millis(100)).await;
            continue;
        }
        if runs::finished_tasks(&fleet.runs()) >= jobs {
            break;
        }
        tokio::time::sleep(Duration::from_secs(2)).await;
    }
    let all_done = started.elapsed().as_secs_f64();
    let (cores, product_cpu) = cpu_spent(&cpu_before, &cpu_by_part(&cluster, &fleet), all_done);
    let tasks = all_tasks(&cluster.client).await;
    // Read again after the Tasks: a run that began since counts too.
    let runs = fleet.runs();
    let unfinished = jobs.saturating_sub(runs::finished_tasks(&runs));
    println!("BENCH dispatch_unfinished {unfinished} tasks");
    let retried = tasks
        .iter()
        .filter(|t| t.status.as_ref().is_some_and(|s| s.attempt > 1))
        .count();
    let with_start_time = tasks
        .iter()
        .filter(|t| t.status.as_ref().is_some_and(|s| s.start_time.is_some()))
        .count();
    let latencies = Latencies::of(&tasks, &runs, &created, jiff::Timestamp::now());
    println!("INFO {}", Latencies::stages(&tasks, &runs, &created));
    let twice = Twice::of(&runs);
    println!(
        "INFO {jobs} jobs at {rate}/s onto {robots} robots: created in {all_created:.1} s, all finished after {all_done:.1} s; {} dispatches, {retried} tasks retried",
        fleet.dispatches(),
    );
    println!(
        "INFO {} tasks ran on two robots (or two attempts) at once, {} were completed twice one after the other; {} dispatches of an attempt already taken were refused by the robot's fence, {} as come after their deadline",
        twice.at_once,
        twice.completed,
        fleet.resent_dispatches(),
        fleet.expired_dispatches(),
    );
    println!("BENCH dispatch_duplicates {} tasks", twice.tasks);
    // The fleet's heartbeats are in these too: the product's cost per task
    // at this fleet size, not of the task alone (the cost bench's is).
    println!(
        "INFO cores used from the first Job to the last task's end, by part: {cores}; the product's CPU {:.2} ms a task, the idle fleet's included",
        product_cpu * 1000.0 / runs::finished_tasks(&runs).max(1) as f64
    );
    println!(
        "BENCH dispatch_p50_ms_{}_robots {:.1} ms",
        label(robots),
        latencies.pct(50.0)
    );
    println!(
        "BENCH dispatch_p99_ms_{}_robots {:.1} ms",
        label(robots),
        latencies.pct(99.0)
    );
    println!(
        "INFO {} of {jobs} Jobs' tasks started on a robot; {} Tasks listed, {with_start_time} of them show a startTime",
        latencies.started,
        tasks.len()
    );
    println!(
        "BENCH tasks_completed_per_s {:.1} tasks/s",
        (jobs - unfinished) as f64 / all_done
    );
    fleet.stop().await;
}

fn main() {
    let all: Vec<String> = std::env::args().collect();
    if let Some(i) = all.iter().position(|a| a == "--sim-shard") {
        shards::shard_main(&all[i + 1..]);
        return;
    }
    if !all.iter().any(|a| a == "--bench") {
        return;
    }
    let load = std::fs::read_to_string("/proc/loadavg").unwrap_or_default();
    println!(
        "INFO load average at start: {}",
        load.split_whitespace().take(3).collect::<Vec<_>>().join(" ")
    );
    let scenario = std::env::args()
        .skip(1)
        .find(|a| !a.starts_with('-') && a.parse::<u64>().is_err())
        .unwrap_or_default();
    let robots = usize::try_from(arg("--robots", 10_000)).unwrap_or(10_000);
    let runtime = tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .build()
        .unwrap();
    match scenario.as_str() {
        "register-storm" => runtime.block_on(register_storm(robots)),
        "heartbeats" => runtime.block_on(heartbeats(robots, arg("--seconds", 120))),
        "dispatch" => runtime.block_on(dispatch(
            robots,
            usize::try_from(arg("--jobs", 10_000)).unwrap_or(10_000),
            arg("--rate", 200),
        )),
        "reconnect-storm" => runtime.block_on(storms::reconnect_storm(
            robots,
            usize::try_from(arg("--jobs", 2_000)).unwrap_or(2_000),
            arg("--rate", 50),
        )),
        "sustain" => runtime.block_on(sustain::run(robots)),
        "cost" => runtime.block_on(cost::run(usize::try_from(arg("--robots", 100)).unwrap_or(100))),
        "dashboard" => runtime.block_on(dashboard::run(
            start_cluster(robots),
            robots,
            usize::try_from(arg("--updates", 100)).unwrap_or(100),
        )),
        other => {
            eprintln!(
                "unknown scenario {other:?}: register-storm, heartbeats, dispatch, sustain, reconnect-storm, dashboard or cost"
            )
        }
    }
}
