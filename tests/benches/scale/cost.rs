//! What a Job costs the cluster: for each common shape of Job, the API
//! writes by kind of object (every write the API server made, as watches
//! of each kind see them; the server's own by kind of write from its
//! metrics, the manager's the rest), and the
//! CPU-milliseconds of the API server, the server, the manager and the
//! broker, per completed task. CPU comes from each process's own
//! accounting (`/proc/<pid>/stat`), not wall time, so the figures carry to
//! another machine; the cost of the idle fleet (heartbeats, Lease
//! renewals), measured over a window of the same length just before, is
//! taken off. The user's creates are not counted (they are the bench's).
//!
//!     cargo bench -p k8s4r-e2e --bench scale -- cost [--robots 100] [--jobs 100] [--rate 5] [--shapes single,group10,every_robot,retries3]
//!
//! With `K8S4R_ROUTINE_EVENTS=false` in its environment (which the
//! cluster's programs inherit, as their `--routine-events=false`) it
//! measures a cluster that writes no routine Events, and its figures are
//! named `..._no_routine_events`.

use std::collections::BTreeMap;
use std::time::{Duration, Instant};

use k8s4r_api::{Job, WorkState};
use k8s4r_testbed::bench_arg as arg;
use kube::api::PostParams;
use kube::Api;
use serde_json::{json, Value};

use super::sims::{Behaviour, Sims};
use super::{all_online, cpu_seconds, start_cluster, writes_by_kind, Cluster};

/// One shape of Job.
struct Shape {
    name: &'static str,
    jobs: usize,
    /// Tasks each Job completes (or fails for good).
    tasks_per_job: usize,
    group: Value,
}

fn task(command: &str) -> Value {
    json!({"driver": "raw_exec", "command": command})
}

fn shapes(robots: usize, jobs: usize) -> Vec<Shape> {
    vec![
        Shape {
            name: "single",
            jobs,
            tasks_per_job: 1,
            group: json!({"name": "t", "count": 1, "task": task("/bin/true")}),
        },
        Shape {
            name: "group10",
            jobs: (jobs / 10).max(1),
            tasks_per_job: 10,
            group: json!({"name": "t", "count": 10, "task": task("/bin/true")}),
        },
        Shape {
            name: "every_robot",
            jobs: 2,
            tasks_per_job: robots,
            group: json!({"name": "t", "mode": "everyRobot", "task": task("/bin/true")}),
        },
        // The simulated robots fail `/bin/false`: four attempts, then the
        // task fails for good.
        Shape {
            name: "retries3",
            jobs: (jobs / 4).max(1),
            tasks_per_job: 1,
            group: json!({"name": "t", "count": 1, "task": task("/bin/false"),
                "restartPolicy": {"attempts": 3, "delay": "1s"}}),
        },
    ]
}

/// Writes the API server made so far, by kind of object: a watch of each
/// kind counts every object created, changed or deleted after its first
/// list. (A watch that fell behind lists again; what that list brings is
/// not counted, so the counts can only be short, never double.) The Job
/// watch also notes the Jobs that are over, so that waiting for them
/// costs the API server no lists of its own.
#[derive(Clone, Default)]
pub(super) struct Written {
    counts: std::sync::Arc<std::sync::Mutex<BTreeMap<&'static str, f64>>>,
    over: std::sync::Arc<std::sync::Mutex<std::collections::BTreeSet<String>>>,
}

impl Written {
    /// Counts `kind`'s writes; `done` names an object that is over.
    fn watch<K>(
        &self,
        api: Api<K>,
        kind: &'static str,
        done: fn(&K) -> Option<String>,
    ) -> tokio::task::JoinHandle<()>
    where
        K: kube::Resource + Clone + std::fmt::Debug + serde::de::DeserializeOwned + Send + 'static,
    {
        use futures::StreamExt;
        use kube::runtime::watcher::{self, Event};
        let written = self.clone();
        tokio::spawn(async move {
            let mut events = std::pin::pin!(watcher::watcher(api, watcher::Config::default()));
            while let Some(event) = events.next().await {
                // What the watch lists when it starts (or starts again) is
                // not a write.
                let (object, write) = match &event {
                    Ok(Event::Apply(o)) => (Some(o), true),
                    Ok(Event::InitApply(o)) => (Some(o), false),
                    Ok(Event::Delete(_)) => (None, true),
                    _ => (None, false),
                };
                if let Some(name) = object.and_then(done) {
                    written.over.lock().unwrap().insert(name);
                }
                if !write {
                    continue;
                }
                *written.counts.lock().unwrap().entry(kind).or_insert(0.0) += 1.0;
            }
        })
    }

    pub(super) fn start(client: &kube::Client) -> (Self, Vec<tokio::task::JoinHandle<()>>) {
        use k8s_openapi::api::coordination::v1::Lease;
        use k8s_openapi::api::events::v1::Event;
        let written = Self::default();
        let c = client.clone();
        fn never<K>(_: &K) -> Option<String> {
            None
        }
        let tasks = vec![
            written.watch(Api::<Job>::all(c.clone()), "Job", job_over),
            written.watch(Api::<k8s4r_api::TaskGroup>::all(c.clone()), "TaskGroup", never),
            written.watch(Api::<k8s4r_api::Task>::all(c.clone()), "Task", never),
            written.watch(Api::<k8s4r_api::Robot>::all(c.clone()), "Robot", never),
            written.watch(Api::<Lease>::all(c.clone()), "Lease", never),
            written.watch(Api::<Event>::all(c), "Event", never),
        ];
        (written, tasks)
    }

    pub(super) fn now(&self) -> BTreeMap<String, f64> {
        self.counts
            .lock()
            .unwrap()
            .iter()
            .map(|(k, v)| ((*k).to_owned(), *v))
            .collect()
    }
}

/// What the cluster spent so far: CPU seconds by program, API writes by
/// kind of object, and the server's by kind of write.
struct Spent {
    cpu: BTreeMap<&'static str, f64>,
    writes: BTreeMap<String, f64>,
    server: BTreeMap<String, f64>,
    at: Instant,
}

async fn spent(cluster: &Cluster, written: &Written) -> Spent {
    let mut cpu = BTreeMap::new();
    let pids = [
        ("apiserver", cluster._api.pid()),
        ("server", cluster.server.pid()),
        ("manager", cluster.manager.pid()),
        ("broker", cluster.broker.as_ref().and_then(|b| b.pid())),
        ("bench process (the simulated robots)", Some(std::process::id())),
    ];
    for (name, pid) in pids {
        cpu.insert(name, pid.map_or(0.0, cpu_seconds));
    }
    let server = writes_by_kind(cluster)
        .await
        .into_iter()
        .filter(|(kind, _)| kind.starts_with("server ") && kind.ends_with(" ok"))
        .collect();
    Spent {
        cpu,
        writes: written.now(),
        server,
        at: Instant::now(),
    }
}

/// `after - before`, less the idle rate over the same time.
fn less_idle(before: f64, after: f64, idle_per_s: f64, seconds: f64) -> f64 {
    (after - before - idle_per_s * seconds).max(0.0)
}

async fn create(jobs_api: &Api<Job>, shape: &Shape, rate: u64) -> Vec<String> {
    let started = Instant::now();
    let mut names = Vec::new();
    for i in 0..shape.jobs {
        let at = started + Duration::from_secs_f64(i as f64 / rate as f64);
        tokio::time::sleep_until(at.into()).await;
        let name = format!("cost-{}-{i}", shape.name.replace('_', "-"));
        let job: Job = serde_json::from_value(json!({
            "apiVersion": "robot.k8s4r.io/v1alpha1", "kind": "Job",
            "metadata": {"name": name, "namespace": "default"},
            "spec": {"taskGroups": [shape.group.clone()]},
        }))
        .expect("a Job");
        jobs_api
            .create(&PostParams::default(), &job)
            .await
            .expect("create job");
        names.push(name);
    }
    names
}

/// A Job's name once it has completed or failed.
fn job_over(job: &Job) -> Option<String> {
    let state = job.status.as_ref()?.state?;
    matches!(state, WorkState::Completed | WorkState::Failed).then(|| job.metadata.name.clone())?
}

/// Waits until every Job named is over, as the Job watch saw them, up to
/// `deadline`; how many are.
async fn over(written: &Written, names: &[String], deadline: Instant) -> usize {
    loop {
        let done = {
            let over = written.over.lock().unwrap();
            names.iter().filter(|n| over.contains(*n)).count()
        };
        if done == names.len() || Instant::now() >= deadline {
            return done;
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
}

/// Runs each shape in turn on one cluster and prints its cost per task.
pub async fn run(robots: usize) {
    let jobs = usize::try_from(arg("--jobs", 100)).unwrap_or(100);
    let rate = arg("--rate", 5).max(1);
    let cluster = start_cluster(robots).await;
    let fleet = Sims::start(&cluster, robots, Behaviour::heartbeat(Duration::from_secs(30)));
    all_online(&cluster, robots).await;
    tokio::time::sleep(Duration::from_secs(arg("--settle", 10))).await;
    let jobs_api: Api<Job> = Api::namespaced(cluster.client.clone(), "default");
    let (written, watches) = Written::start(&cluster.client);
    tokio::time::sleep(Duration::from_secs(5)).await;
    // `--shapes single,group10`: the shapes to run (all when not given).
    let only = k8s4r_testbed::bench_list("--shapes");
    for shape in shapes(robots, jobs)
        .into_iter()
        .filter(|s| only.as_ref().is_none_or(|o| o.iter().any(|n| n == s.name)))
    {
        // The idle fleet's cost, over a window as long as the last shape's
        // (at least 20 s).
        let idle_from = spent(&cluster, &written).await;
        tokio::time::sleep(Duration::from_secs(arg("--idle", 20))).await;
        let idle_to = spent(&cluster, &written).await;
        let idle_s = idle_to.at.duration_since(idle_from.at).as_secs_f64();
        let before = spent(&cluster, &written).await;
        let names = create(&jobs_api, &shape, rate).await;
        let deadline = Instant::now() + Duration::from_secs(arg("--deadline", 600));
        let done = over(&written, &names, deadline).await;
        // The Jobs' last writes (their final status) are in by now; the
        // metrics are read after them.
        let after = spent(&cluster, &written).await;
        let seconds = after.at.duration_since(before.at).as_secs_f64();
        let tasks = (done * shape.tasks_per_job).max(1) as f64;
        report(
            &shape,
            done,
            tasks,
            seconds,
            [&idle_from, &idle_to, &before, &after],
            idle_s,
        );
    }
    println!("INFO the fleet finished {} tasks in all", fleet.finished());
    for watch in watches {
        watch.abort();
    }
    fleet.stop().await;
}

/// What the figures' names end with: the cluster's Event setting.
fn variant() -> &'static str {
    match std::env::var("K8S4R_ROUTINE_EVENTS") {
        Ok(v) if v == "false" => "_no_routine_events",
        _ => "",
    }
}

fn report(
    shape: &Shape,
    done: usize,
    tasks: f64,
    seconds: f64,
    [idle_from, idle_to, before, after]: [&Spent; 4],
    idle_s: f64,
) {
    let name = format!("{}{}", shape.name, variant());
    println!(
        "INFO {name}: {done} of {} Jobs over ({tasks} tasks) in {seconds:.1} s; the idle fleet's cost over {idle_s:.1} s taken off",
        shape.jobs
    );
    let added = |from: &BTreeMap<String, f64>,
                 to: &BTreeMap<String, f64>,
                 idle_from: &BTreeMap<String, f64>,
                 idle_to: &BTreeMap<String, f64>| {
        let mut out = BTreeMap::new();
        for (kind, n) in to {
            let get = |m: &BTreeMap<String, f64>| m.get(kind).copied().unwrap_or(0.0);
            let idle = get(idle_to) - get(idle_from);
            let more = less_idle(get(from), *n, idle / idle_s, seconds);
            if more > 0.0 {
                out.insert(kind.clone(), more);
            }
        }
        out
    };
    let mut by_kind = added(&before.writes, &after.writes, &idle_from.writes, &idle_to.writes);
    // The bench's own creates are the user's, not the cluster's.
    if let Some(jobs) = by_kind.get_mut("Job") {
        *jobs = (*jobs - done as f64).max(0.0);
    }
    let writes: f64 = by_kind.values().sum();
    let server = added(&before.server, &after.server, &idle_from.server, &idle_to.server);
    let server_total: f64 = server.values().sum();
    let per = |m: &BTreeMap<String, f64>| {
        m.iter()
            .map(|(k, n)| format!("{k} {:.2}", n / tasks))
            .collect::<Vec<_>>()
            .join(", ")
    };
    println!(
        "INFO {name}: API writes per task by kind of object: {}",
        per(&by_kind)
    );
    println!(
        "INFO {name}: the server's {:.2} per task ({}), the manager's the other {:.2}",
        server_total / tasks,
        per(&server),
        (writes - server_total).max(0.0) / tasks
    );
    println!("BENCH api_writes_per_task_{name} {:.2} writes", writes / tasks);
    let mut cluster_ms = 0.0;
    let mut parts = Vec::new();
    for (program, cpu) in &after.cpu {
        let idle = idle_to.cpu[program] - idle_from.cpu[program];
        let ms = less_idle(before.cpu[program], *cpu, idle / idle_s, seconds) * 1000.0 / tasks;
        if !program.starts_with("bench process") {
            cluster_ms += ms;
        }
        parts.push(format!("{program} {ms:.2}"));
    }
    println!("INFO {name}: CPU-ms per task by program: {}", parts.join(", "));
    println!("BENCH cluster_cpu_ms_per_task_{name} {cluster_ms:.2} ms");
}
