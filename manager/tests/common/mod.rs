//! A manager running against the embedded API server, and builders for the
//! objects the tests need. Robots are simulated by writing their status the
//! way the server would.
#![allow(dead_code)]

use std::collections::BTreeMap;
use std::sync::Arc;
use std::time::Duration;

use apiserver_lite::RunningServer;
use jiff::Timestamp;
use k8s4r_api::names::MANAGER_SERVER;
use k8s4r_api::{
    Condition, ConditionStatus, DeviceInfo, Job, JobSpec, LabelSelector, Quantity, RestartPolicy, Robot,
    RobotPhase, RobotResources, RobotSpec, RobotStatus, Task, TaskGroupTemplate, TaskReason, TaskResources,
    TaskState, TaskTemplate,
};
use k8s4r_manager::{ManagerConfig, Metrics};
use k8s_openapi::api::core::v1::Namespace;
use kube::api::{ObjectMeta, Patch, PatchParams, PostParams};
use kube::{Api, Client};
use serde_json::json;
use tokio_util::sync::CancellationToken;

pub const NS: &str = "default";

/// A config with every timer short enough for a test.
pub fn config() -> ManagerConfig {
    let mut c = ManagerConfig {
        auto_approve: true,
        api_timeout: Duration::from_secs(5),
        error_backoff: Duration::from_millis(50),
        error_backoff_max: Duration::from_secs(1),
        robot_debounce: Duration::ZERO,
        ..ManagerConfig::default()
    };
    c.liveness.heartbeat_timeout = Duration::from_secs(120);
    c.liveness.disconnect_grace = Duration::from_millis(200);
    c.lifecycle.dispatch_timeout = Duration::from_secs(120);
    c.lifecycle.robot_lost_grace = Duration::from_millis(200);
    // The tests write robots' heartbeat times themselves, without lag.
    c.lifecycle.unleased_record_lag = Duration::ZERO;
    c.lifecycle.backstop_grace = Duration::from_millis(200);
    c
}

pub struct Manager {
    pub shutdown: CancellationToken,
    pub metrics: Arc<Metrics>,
    pub handle: tokio::task::JoinHandle<k8s4r_manager::Result<()>>,
}

impl Manager {
    pub fn start(client: &Client, config: ManagerConfig) -> Manager {
        // RUST_LOG=k8s4r_manager=debug shows what the manager did.
        let _ = tracing_subscriber::fmt()
            .with_env_filter(tracing_subscriber::EnvFilter::from_default_env())
            .with_test_writer()
            .try_init();
        let shutdown = CancellationToken::new();
        let metrics = Arc::new(Metrics::default());
        let handle = tokio::spawn(k8s4r_manager::run_with_metrics(
            config,
            client.clone(),
            metrics.clone(),
            shutdown.clone(),
        ));
        Manager {
            shutdown,
            metrics,
            handle,
        }
    }

    pub async fn stop(self) {
        self.shutdown.cancel();
        let _ = tokio::time::timeout(Duration::from_secs(10), self.handle).await;
    }
}

pub struct Env {
    pub server: RunningServer,
    pub client: Client,
}

/// An API server with the CRDs and namespaces the manager needs.
pub async fn api_server() -> Env {
    let server = apiserver_lite::Config::for_tests()
        .start()
        .await
        .expect("API server starts");
    let client = server.client().await.expect("client");
    k8s4r_api::crd::apply(&client, "tests")
        .await
        .expect("CRDs applied");
    let namespaces: Api<Namespace> = Api::all(client.clone());
    for ns in ["k8s4r-system", "k8s4r-robot-leases"] {
        let obj = Namespace {
            metadata: ObjectMeta {
                name: Some(ns.into()),
                ..ObjectMeta::default()
            },
            ..Namespace::default()
        };
        namespaces
            .create(&PostParams::default(), &obj)
            .await
            .expect("namespace");
    }
    Env { server, client }
}

/// Starts an API server and a manager with `config`.
pub async fn start(config: ManagerConfig) -> (Env, Manager) {
    let env = api_server().await;
    let manager = Manager::start(&env.client, config);
    (env, manager)
}

pub fn server_params() -> PatchParams {
    PatchParams {
        field_manager: Some(MANAGER_SERVER.into()),
        ..PatchParams::default()
    }
}

/// A robot as the server registers it: 4 CPUs, 8 GiB, both drivers.
pub struct RobotBuilder {
    pub name: String,
    pub labels: BTreeMap<String, String>,
    pub annotations: BTreeMap<String, String>,
    pub phase: Option<RobotPhase>,
    pub cpu: &'static str,
    pub arch: &'static str,
}

pub fn robot(name: &str) -> RobotBuilder {
    RobotBuilder {
        name: name.into(),
        labels: BTreeMap::new(),
        annotations: BTreeMap::new(),
        phase: Some(RobotPhase::Online),
        cpu: "4",
        arch: "x86_64",
    }
}

impl RobotBuilder {
    pub fn label(mut self, k: &str, v: &str) -> Self {
        self.labels.insert(k.into(), v.into());
        self
    }
    pub fn phase(mut self, phase: Option<RobotPhase>) -> Self {
        self.phase = phase;
        self
    }
    pub fn cpu(mut self, cpu: &'static str) -> Self {
        self.cpu = cpu;
        self
    }
    pub fn token_hash(mut self, hash: &str) -> Self {
        self.annotations
            .insert(k8s4r_api::names::ANNOTATION_TOKEN_SHA256.into(), hash.into());
        self
    }

    pub async fn create(self, client: &Client) -> Robot {
        let api: Api<Robot> = Api::all(client.clone());
        let obj = Robot {
            metadata: ObjectMeta {
                name: Some(self.name.clone()),
                labels: Some(self.labels),
                annotations: Some(self.annotations),
                ..ObjectMeta::default()
            },
            spec: RobotSpec::default(),
            status: None,
        };
        api.create(&PostParams::default(), &obj)
            .await
            .expect("robot created");
        // An Offline robot with a fresh heartbeat would rightly come back
        // Online: its liveness has to be stale too.
        let now = match self.phase {
            Some(RobotPhase::Offline) => Timestamp::now() - jiff::SignedDuration::from_hours(1),
            _ => Timestamp::now(),
        };
        let status = RobotStatus {
            phase: self.phase,
            last_heartbeat_time: Some(now),
            last_registration_time: Some(now),
            device: Some(DeviceInfo {
                arch: self.arch.into(),
                os: "linux".into(),
                cpus: 4,
                memory_bytes: 8 << 30,
                ..DeviceInfo::default()
            }),
            capacity: Some(RobotResources {
                cpu: Some(Quantity::from(self.cpu)),
                memory: Some(Quantity::from("8Gi")),
                tasks: 0,
            }),
            drivers: vec!["exec".into(), "raw_exec".into()],
            agent_version: Some("0.1.0".into()),
            ..RobotStatus::default()
        };
        api.patch_status(
            &self.name,
            &server_params(),
            &Patch::Merge(&json!({ "status": status })),
        )
        .await
        .expect("robot status")
    }
}

/// Marks a robot disconnected, as the server does on its last will.
/// What the server does on a heartbeat: records the robot alive now.
pub async fn heartbeat(client: &Client, name: &str) {
    let api: Api<Robot> = Api::all(client.clone());
    let patch = json!({ "status": { "lastHeartbeatTime": Timestamp::now() } });
    api.patch_status(name, &server_params(), &Patch::Merge(&patch))
        .await
        .expect("heartbeat recorded");
}

pub async fn disconnect(client: &Client, name: &str) {
    let api: Api<Robot> = Api::all(client.clone());
    let robot = api.get(name).await.expect("robot");
    let mut conditions = robot.status.unwrap_or_default().conditions;
    conditions.retain(|c| c.type_ != "Connected");
    conditions.push(Condition::new(
        "Connected",
        ConditionStatus::False,
        "Disconnected",
        "last will",
    ));
    api.patch_status(
        name,
        &server_params(),
        &Patch::Merge(&json!({ "status": { "conditions": conditions } })),
    )
    .await
    .expect("disconnect");
}

/// What the server does when a robot's facts change: writes them.
pub async fn set_facts(client: &Client, name: &str, facts: serde_json::Value) {
    let api: Api<Robot> = Api::all(client.clone());
    let patch = json!({ "status": { "facts": facts } });
    api.patch_status(name, &server_params(), &Patch::Merge(&patch))
        .await
        .expect("facts recorded");
}

/// Sets annotation `key` of task `name` to `value`, as kubectl or k8s4r do.
pub async fn annotate_task(client: &Client, name: &str, key: &str, value: &str) {
    let api: Api<Task> = Api::namespaced(client.clone(), NS);
    let patch = json!({ "metadata": { "annotations": { key: value } } });
    api.patch(name, &PatchParams::default(), &Patch::Merge(&patch))
        .await
        .expect("task annotated");
}

pub fn template() -> TaskTemplate {
    TaskTemplate {
        driver: "exec".into(),
        command: "/bin/true".into(),
        ..TaskTemplate::default()
    }
}

pub fn group(name: &str, count: i32) -> TaskGroupTemplate {
    TaskGroupTemplate {
        name: name.into(),
        count: Some(count),
        task: template(),
        ..TaskGroupTemplate::default()
    }
}

pub trait GroupExt {
    fn cpu(self, cpu: &str) -> Self;
    fn retries(self, attempts: u32, delay: &str) -> Self;
    fn timeout(self, timeout: &str, kill: &str) -> Self;
}

impl GroupExt for TaskGroupTemplate {
    fn cpu(mut self, cpu: &str) -> Self {
        self.task.resources = Some(TaskResources {
            cpu: Some(Quantity::from(cpu)),
            ..TaskResources::default()
        });
        self
    }
    fn retries(mut self, attempts: u32, delay: &str) -> Self {
        self.restart_policy = Some(RestartPolicy {
            attempts,
            delay: Some(delay.into()),
            max_delay: Some("10s".into()),
            mode: Default::default(),
            lost_retries: None,
            condition_restarts: None,
        });
        self
    }
    fn timeout(mut self, timeout: &str, kill: &str) -> Self {
        self.task.timeout = Some(timeout.into());
        self.task.kill_timeout = Some(kill.into());
        self
    }
}

pub async fn create_job(
    client: &Client,
    name: &str,
    selector: Option<LabelSelector>,
    groups: Vec<TaskGroupTemplate>,
) -> Job {
    let api: Api<Job> = Api::namespaced(client.clone(), NS);
    let job = Job::new(
        name,
        JobSpec {
            robot_selector: selector,
            constraints: vec![],
            task_groups: groups,
            priority: 0,
            order: vec![],
            ..JobSpec::default()
        },
    );
    api.create(&PostParams::default(), &job)
        .await
        .expect("job created")
}

/// Writes a task's state the way the server does from a robot's update.
pub async fn report(
    client: &Client,
    task: &str,
    state: TaskState,
    reason: Option<TaskReason>,
    exit_code: Option<i32>,
) {
    let api: Api<Task> = Api::namespaced(client.clone(), NS);
    let now = Timestamp::now();
    let current = api.get(task).await.expect("task");
    let seq = current.status.as_ref().map_or(0, |s| s.seq) + 1;
    let mut body = json!({ "status": { "state": state, "seq": seq } });
    let status = &mut body["status"];
    match state {
        TaskState::Running => status["startTime"] = json!(now),
        TaskState::Completed | TaskState::Failed => {
            status["finishTime"] = json!(now);
            status["reason"] = json!(reason.unwrap_or(TaskReason::Completed));
            status["exitCode"] = json!(exit_code.unwrap_or(0));
        }
        _ => {}
    }
    api.patch_status(task, &server_params(), &Patch::Merge(&body))
        .await
        .expect("task status");
}

pub async fn task(client: &Client, name: &str) -> Option<Task> {
    let api: Api<Task> = Api::namespaced(client.clone(), NS);
    api.get_opt(name).await.expect("get task")
}

pub fn state_of(task: &Task) -> Option<TaskState> {
    task.status.as_ref().and_then(|s| s.state)
}

pub use k8s4r_testbed::eventually;

/// Waits until task `name` satisfies `pred`, and returns it.
pub async fn task_where(client: &Client, name: &str, what: &str, pred: impl Fn(&Task) -> bool) -> Task {
    eventually(Duration::from_secs(15), what, || async {
        task(client, name).await.filter(|t| pred(t))
    })
    .await
}

pub fn dispatching_on(task: &Task) -> Option<&str> {
    let s = task.status.as_ref()?;
    if s.state == Some(TaskState::Dispatching) {
        s.robot.as_deref()
    } else {
        None
    }
}

/// Group `name` of one task, fenced: its robot stops it 5 s (stopAfter)
/// + 1 s (kill timeout) after the cluster last heard from it.
pub fn fenced_group(name: &str) -> TaskGroupTemplate {
    let mut fenced = group(name, 1);
    fenced.disconnect = Some(k8s4r_api::DisconnectPolicy {
        stop_after: Some("5s".into()),
        ..Default::default()
    });
    fenced.task.kill_timeout = Some("1s".into());
    fenced
}

/// What the server does while robot `name` stays in contact: applies its
/// Lease, renewed now and lasting `seconds`.
pub async fn renew_lease(client: &Client, name: &str, seconds: i32) {
    use k8s_openapi::api::coordination::v1::{Lease, LeaseSpec};
    use k8s_openapi::apimachinery::pkg::apis::meta::v1::MicroTime;
    let api: Api<Lease> = Api::namespaced(client.clone(), "k8s4r-robot-leases");
    let lease = Lease {
        metadata: ObjectMeta {
            name: Some(name.into()),
            ..ObjectMeta::default()
        },
        spec: Some(LeaseSpec {
            holder_identity: Some(name.into()),
            lease_duration_seconds: Some(seconds),
            renew_time: Some(MicroTime(Timestamp::now())),
            ..LeaseSpec::default()
        }),
    };
    api.patch(
        name,
        &PatchParams::apply(MANAGER_SERVER).force(),
        &Patch::Apply(&lease),
    )
    .await
    .expect("the Lease renewed");
}
