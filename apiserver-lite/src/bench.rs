//! The benchmark behind `apiserver-lite bench`: loopback only, bounded in
//! count and time. Prints `BENCH <name> <value> <unit>` lines.

use std::collections::HashMap;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use futures::{StreamExt, TryStreamExt};
use kube::api::{Api, ApiResource, DynamicObject, Patch, PatchParams, PostParams};
use serde_json::{json, Value};

use crate::Config;

#[derive(Debug, Clone)]
pub struct BenchConfig {
    pub objects: usize,
    pub rate: u64,
    pub writes: usize,
    pub watchers: usize,
    /// Tasks stored in the memory phase; the figure is scaled to 10,000.
    pub memory_tasks: usize,
}

#[derive(Debug, Clone)]
pub struct Report {
    pub create_p50_ms: f64,
    pub write_p99_ms: f64,
    pub status_p50_ms: f64,
    pub status_p99_ms: f64,
    pub watch_p99_ms: f64,
    pub writes_per_s: f64,
    pub mib_per_10k_tasks: f64,
}

impl Report {
    pub fn lines(&self) -> Vec<String> {
        vec![
            format!(
                "# create p50 {:.3} ms, status patch p50 {:.3} ms p99 {:.3} ms",
                self.create_p50_ms, self.status_p50_ms, self.status_p99_ms
            ),
            format!("BENCH apiserver_write_p99_ms {:.3} ms", self.write_p99_ms),
            format!("BENCH apiserver_watch_p99_ms {:.3} ms", self.watch_p99_ms),
            format!("BENCH apiserver_writes_per_s {:.0} writes/s", self.writes_per_s),
            format!(
                "BENCH apiserver_mib_per_10k_tasks {:.1} MiB",
                self.mib_per_10k_tasks
            ),
        ]
    }
}

/// A CRD shaped like k8s4r's Task, so the figures mean something for it.
pub fn task_crd() -> Value {
    json!({
        "apiVersion": "apiextensions.k8s.io/v1",
        "kind": "CustomResourceDefinition",
        "metadata": {"name": "tasks.bench.k8s4r.io"},
        "spec": {
            "group": "bench.k8s4r.io",
            "scope": "Namespaced",
            "names": {"plural": "tasks", "singular": "task", "kind": "Task", "shortNames": ["tk"]},
            "versions": [{
                "name": "v1alpha1", "served": true, "storage": true,
                "subresources": {"status": {}},
                "additionalPrinterColumns": [
                    {"name": "State", "type": "string", "jsonPath": ".status.state"},
                    {"name": "Robot", "type": "string", "jsonPath": ".spec.targetRobot"}
                ],
                "schema": {"openAPIV3Schema": {"type": "object", "properties": {
                    "spec": {"type": "object", "x-kubernetes-preserve-unknown-fields": true},
                    "status": {"type": "object", "x-kubernetes-preserve-unknown-fields": true}
                }}}
            }]
        }
    })
}

fn task(name: &str, owner_uid: &str) -> DynamicObject {
    serde_json::from_value(json!({
        "apiVersion": "bench.k8s4r.io/v1alpha1",
        "kind": "Task",
        "metadata": {
            "name": name,
            "labels": {"k8s4r.io/job": "bench", "k8s4r.io/group": "g1"},
            "ownerReferences": [{"apiVersion": "v1", "kind": "ConfigMap", "name": "owner", "uid": owner_uid, "controller": true, "blockOwnerDeletion": true}]
        },
        "spec": {
            "driver": "exec",
            "command": "/usr/bin/python3",
            "args": ["-m", "robot.mission", "--waypoints", "/data/waypoints.json"],
            "env": {"ROS_DOMAIN_ID": "7", "MISSION": "inspect"},
            "workingDir": "/var/lib/k8s4r/tasks",
            "timeout": "10m", "killTimeout": "10s",
            "resources": {"cpu": "500m", "memory": "256Mi"},
            "restartPolicy": {"attempts": 3, "delay": "5s"},
            "targetRobot": "robot-17"
        }
    }))
    .expect("static task is valid")
}

fn percentile(v: &mut [f64], p: f64) -> f64 {
    if v.is_empty() {
        return 0.0;
    }
    v.sort_by(|a, b| a.partial_cmp(b).unwrap_or(std::cmp::Ordering::Equal));
    let idx = ((v.len() as f64 - 1.0) * p).round() as usize;
    v[idx.min(v.len() - 1)]
}

fn rss_bytes() -> u64 {
    std::fs::read_to_string("/proc/self/statm")
        .ok()
        .and_then(|s| s.split_whitespace().nth(1).and_then(|p| p.parse::<u64>().ok()))
        .map(|pages| pages * 4096)
        .unwrap_or(0)
}

async fn create_owner(client: &kube::Client) -> anyhow::Result<String> {
    let cms: Api<k8s_openapi::api::core::v1::ConfigMap> = Api::namespaced(client.clone(), "default");
    let cm = cms
        .create(
            &PostParams::default(),
            &serde_json::from_value(json!({"metadata": {"name": "owner"}}))?,
        )
        .await?;
    cm.metadata.uid.ok_or_else(|| anyhow::anyhow!("owner has no uid"))
}

#[derive(serde::Deserialize)]
struct RawEvent {
    object: RawObject,
}

#[derive(serde::Deserialize)]
struct RawObject {
    metadata: RawMeta,
}

#[derive(serde::Deserialize)]
struct RawMeta {
    #[serde(rename = "resourceVersion")]
    resource_version: Option<String>,
}

type Times = Arc<Mutex<HashMap<String, Instant>>>;

pub async fn run(cfg: BenchConfig) -> anyhow::Result<Report> {
    let ar = ApiResource {
        group: "bench.k8s4r.io".into(),
        version: "v1alpha1".into(),
        api_version: "bench.k8s4r.io/v1alpha1".into(),
        kind: "Task".into(),
        plural: "tasks".into(),
    };
    // Memory first, while the process is fresh: later phases leave freed
    // memory in the allocator that would hide growth. RSS growth of an
    // in-memory server while the Tasks are stored.
    let server = Config::for_tests().start().await?;
    let client = server.client().await?;
    let crds: Api<DynamicObject> = Api::all_with(
        client.clone(),
        &ApiResource::erase::<
            k8s_openapi::apiextensions_apiserver::pkg::apis::apiextensions::v1::CustomResourceDefinition,
        >(&()),
    );
    crds.create(&PostParams::default(), &serde_json::from_value(task_crd())?)
        .await?;
    let api: Api<DynamicObject> = Api::namespaced_with(client.clone(), "default", &ar);
    let owner = create_owner(&client).await?;
    let before = rss_bytes();
    futures::stream::iter(0..cfg.memory_tasks)
        .map(|i| {
            let (api, owner) = (api.clone(), owner.clone());
            async move {
                api.create(&PostParams::default(), &task(&format!("mem-{i}"), &owner))
                    .await
                    .map(|_| ())
            }
        })
        .buffer_unordered(16)
        .try_collect::<Vec<_>>()
        .await?;
    let after = rss_bytes();
    server.shutdown().await?;

    let dir = tempfile::tempdir()?;
    let server = Config::for_tests().data_dir(dir.path()).start().await?;
    let client = server.client().await?;
    let crds: Api<DynamicObject> = Api::all_with(
        client.clone(),
        &ApiResource::erase::<
            k8s_openapi::apiextensions_apiserver::pkg::apis::apiextensions::v1::CustomResourceDefinition,
        >(&()),
    );
    crds.create(&PostParams::default(), &serde_json::from_value(task_crd())?)
        .await?;
    let api: Api<DynamicObject> = Api::namespaced_with(client.clone(), "default", &ar);
    // Tasks are owned, as k8s4r's are; the owner must exist or the collector deletes them.
    let owner = create_owner(&client).await?;

    // Watchers record when each resourceVersion reaches them. They read the
    // raw event stream and decode only the resourceVersion, so the client
    // side (same process, same cores) costs as little as possible.
    let start_rv = api
        .list(&kube::api::ListParams::default().limit(1))
        .await?
        .metadata
        .resource_version
        .unwrap_or_default();
    let received: Arc<Mutex<Vec<(String, Instant)>>> = Arc::new(Mutex::new(Vec::new()));
    let mut watchers = Vec::new();
    for _ in 0..cfg.watchers {
        let client = client.clone();
        let received = received.clone();
        let uri = format!("/apis/bench.k8s4r.io/v1alpha1/namespaces/default/tasks?watch=true&timeoutSeconds=290&resourceVersion={start_rv}");
        watchers.push(tokio::spawn(async move {
            let Ok(req) = http::Request::get(uri).body(Vec::new()) else {
                return;
            };
            let Ok(stream) = client.request_stream(req).await else {
                return;
            };
            let mut lines = futures::io::AsyncBufReadExt::lines(stream);
            while let Some(Ok(line)) = lines.next().await {
                let now = Instant::now();
                if let Ok(ev) = serde_json::from_str::<RawEvent>(&line) {
                    if let Some(rv) = ev.object.metadata.resource_version {
                        received.lock().unwrap_or_else(|e| e.into_inner()).push((rv, now));
                    }
                }
            }
        }));
    }

    // Latency phase: paced creates, each followed by a status patch.
    let acked: Times = Arc::new(Mutex::new(HashMap::new()));
    let create_ms = Arc::new(Mutex::new(Vec::new()));
    let status_ms = Arc::new(Mutex::new(Vec::new()));
    let mut tick = tokio::time::interval(Duration::from_micros(1_000_000 / cfg.rate.max(1)));
    tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Burst);
    let mut ops = Vec::new();
    for i in 0..cfg.objects {
        tick.tick().await;
        let (api, acked, create_ms, status_ms, owner) = (
            api.clone(),
            acked.clone(),
            create_ms.clone(),
            status_ms.clone(),
            owner.clone(),
        );
        ops.push(tokio::spawn(async move {
            let name = format!("lat-{i}");
            let t0 = Instant::now();
            let created = api.create(&PostParams::default(), &task(&name, &owner)).await?;
            let t1 = Instant::now();
            create_ms
                .lock()
                .unwrap_or_else(|e| e.into_inner())
                .push((t1 - t0).as_secs_f64() * 1e3);
            if let Some(rv) = created.metadata.resource_version {
                acked.lock().unwrap_or_else(|e| e.into_inner()).insert(rv, t1);
            }
            let patch =
                json!({"status": {"state": "running", "attempt": 1, "startTime": "2026-01-01T00:00:00Z"}});
            let t2 = Instant::now();
            let patched = api
                .patch_status(&name, &PatchParams::default(), &Patch::Merge(&patch))
                .await?;
            let t3 = Instant::now();
            status_ms
                .lock()
                .unwrap_or_else(|e| e.into_inner())
                .push((t3 - t2).as_secs_f64() * 1e3);
            if let Some(rv) = patched.metadata.resource_version {
                acked.lock().unwrap_or_else(|e| e.into_inner()).insert(rv, t3);
            }
            Ok::<_, kube::Error>(())
        }));
    }
    for op in ops {
        op.await??;
    }
    // Let the watchers catch up, bounded.
    let expected = cfg.objects * 2 * cfg.watchers;
    let deadline = Instant::now() + Duration::from_secs(10);
    while received.lock().unwrap_or_else(|e| e.into_inner()).len() < expected && Instant::now() < deadline {
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    let mut watch_ms: Vec<f64> = {
        let acked = acked.lock().unwrap_or_else(|e| e.into_inner());
        received
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .iter()
            .filter_map(|(rv, at)| {
                acked
                    .get(rv)
                    .map(|ack| at.saturating_duration_since(*ack).as_secs_f64() * 1e3)
            })
            .collect()
    };
    let mut create = create_ms.lock().unwrap_or_else(|e| e.into_inner()).clone();
    let mut status = status_ms.lock().unwrap_or_else(|e| e.into_inner()).clone();
    let mut all: Vec<f64> = create.iter().chain(status.iter()).copied().collect();

    // Throughput phase: concurrent writers, watchers still attached.
    let writers = 32;
    let per = cfg.writes / writers / 2;
    let t0 = Instant::now();
    let mut handles = Vec::new();
    for w in 0..writers {
        let (api, owner) = (api.clone(), owner.clone());
        handles.push(tokio::spawn(async move {
            for i in 0..per {
                let name = format!("tp-{w}-{i}");
                api.create(&PostParams::default(), &task(&name, &owner)).await?;
                let patch = json!({"status": {"state": "completed", "exitCode": 0}});
                api.patch_status(&name, &PatchParams::default(), &Patch::Merge(&patch))
                    .await?;
            }
            Ok::<_, kube::Error>(())
        }));
    }
    for h in handles {
        h.await??;
    }
    let writes_per_s = (writers * per * 2) as f64 / t0.elapsed().as_secs_f64();
    for w in watchers {
        w.abort();
    }
    server.shutdown().await?;

    Ok(Report {
        create_p50_ms: percentile(&mut create, 0.5),
        write_p99_ms: percentile(&mut all, 0.99),
        status_p50_ms: percentile(&mut status, 0.5),
        status_p99_ms: percentile(&mut status, 0.99),
        watch_p99_ms: percentile(&mut watch_ms, 0.99),
        writes_per_s,
        mib_per_10k_tasks: after.saturating_sub(before) as f64 / (1024.0 * 1024.0) * 10_000.0
            / cfg.memory_tasks.max(1) as f64,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The benchmark runs end to end (tiny sizes; the figures mean nothing here).
    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn bench_smoke() {
        let report = run(BenchConfig {
            objects: 20,
            rate: 200,
            writes: 128,
            watchers: 2,
            memory_tasks: 50,
        })
        .await
        .unwrap();
        let lines = report.lines();
        assert!(lines
            .iter()
            .any(|l| l.starts_with("BENCH apiserver_write_p99_ms ") && l.ends_with(" ms")));
        assert!(lines
            .iter()
            .any(|l| l.starts_with("BENCH apiserver_writes_per_s ") && l.ends_with(" writes/s")));
        assert!(report.writes_per_s > 0.0);
    }
}
