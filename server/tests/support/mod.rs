//! Real parts for the integration tests: the embedded API server, a
//! Mosquitto on a free port, the server under test, and a scripted robot.
#![allow(dead_code)]

use std::future::Future;

use std::time::{Duration, Instant};

use apiserver_lite::{Config, RunningServer};
use k8s4r_api::protocol::{encode, Message, Topics};
use k8s4r_api::{DeviceInfo, Task, TaskSpec, TaskState, TaskStatus, TaskTemplate, Usage};
use k8s4r_server::{Metrics, Server, ServerConfig};
use k8s_openapi::api::core::v1::Namespace;
use k8s_openapi::api::rbac::v1::PolicyRule;
use kube::api::{Patch, PatchParams, PostParams};
use kube::{Api, Client};
use rumqttc::{AsyncClient, Event, LastWill, MqttOptions, Packet, QoS};
use serde::Serialize;
use std::sync::Arc;
use tokio::sync::mpsc;
use tokio::task::JoinHandle;
use tokio_util::sync::CancellationToken;

/// How long any condition may take before a test fails.
pub const DEADLINE: Duration = Duration::from_secs(20);

/// Polls `check` until it returns Some, or panics with `what` at the deadline.
pub async fn eventually<T, F, Fut>(what: &str, check: F) -> T
where
    F: FnMut() -> Fut,
    Fut: Future<Output = Option<T>>,
{
    k8s4r_testbed::eventually(DEADLINE, what, check).await
}

pub use k8s4r_testbed::Mosquitto;

/// The API server with the CRDs and the Lease namespace, and a broker.
pub struct Env {
    pub api: RunningServer,
    pub client: Client,
    pub broker: Mosquitto,
}

pub const LEASES: &str = "k8s4r-robot-leases";

impl Env {
    pub async fn start() -> Self {
        k8s4r_mqtt::install_crypto_provider();
        let _ = tracing_subscriber::fmt()
            .with_env_filter(tracing_subscriber::EnvFilter::from_default_env())
            .with_test_writer()
            .try_init();
        let broker = Mosquitto::start();
        let api = Config::for_tests().start().await.expect("apiserver-lite starts");
        let client = api.client().await.expect("kube client");
        k8s4r_api::crd::apply(&client, "tests")
            .await
            .expect("CRDs applied");
        let namespaces: Api<Namespace> = Api::all(client.clone());
        let ns = Namespace {
            metadata: kube::api::ObjectMeta {
                name: Some(LEASES.into()),
                ..Default::default()
            },
            ..Default::default()
        };
        namespaces
            .create(&PostParams::default(), &ns)
            .await
            .expect("lease namespace");
        Self { api, client, broker }
    }

    /// ServiceAccount `default/<name>` with the token `<name>-token`,
    /// bound to a ClusterRole `<name>` of `rules`; its token.
    pub async fn service_account(&self, name: &str, rules: Vec<PolicyRule>) -> String {
        k8s4r_testbed::rbac::service_account(&self.api, &self.client, name, rules).await
    }

    /// A client presenting `token` to the API server at `addr` (its own,
    /// or a proxy's before it).
    pub async fn client_via(&self, addr: std::net::SocketAddr, token: &str) -> Client {
        k8s4r_testbed::rbac::client_via(&self.api, addr, token).await
    }

    pub fn config(&self) -> ServerConfig {
        let mut config = ServerConfig::new(self.broker.url());
        config.lease_namespace = LEASES.into();
        config.api_timeout = Duration::from_secs(5);
        config.publish_timeout = Duration::from_secs(5);
        config.max_backoff = Duration::from_secs(2);
        config.workers = 4;
        config
    }

    pub async fn server(&self) -> Running {
        self.server_with(self.config()).await
    }

    pub async fn server_with(&self, config: ServerConfig) -> Running {
        self.server_using(config, self.client.clone()).await
    }

    /// A server that reaches the API server with `client`.
    pub async fn server_using(&self, config: ServerConfig, client: Client) -> Running {
        let server = Server::new(config, client);
        let metrics = server.metrics();
        let shutdown = CancellationToken::new();
        let task = tokio::spawn(server.run(shutdown.clone()));
        let m = metrics.clone();
        eventually("the server is ready", || {
            let m = m.clone();
            async move { m.ready().then_some(()) }
        })
        .await;
        Running {
            metrics,
            shutdown,
            task,
        }
    }

    pub fn tasks(&self) -> Api<Task> {
        Api::namespaced(self.client.clone(), "default")
    }

    pub fn robots(&self) -> Api<k8s4r_api::Robot> {
        Api::all(self.client.clone())
    }

    /// Plays the manager: creates a Task and moves it to dispatching for
    /// `robot`, attempt `attempt`. Returns its uid.
    pub async fn dispatch_task(&self, name: &str, robot: &str, attempt: u32) -> String {
        let tasks = self.tasks();
        let task = Task::new(
            name,
            TaskSpec {
                template: TaskTemplate {
                    driver: "raw_exec".into(),
                    command: "sleep".into(),
                    args: vec!["1".into()],
                    outputs: vec![k8s4r_api::output::Output {
                        path: "out/*.bag".into(),
                        ..Default::default()
                    }],
                    ..Default::default()
                },
                ..Default::default()
            },
        );
        let created = tasks
            .create(&PostParams::default(), &task)
            .await
            .expect("task created");
        self.move_task(name, robot, TaskState::Dispatching, attempt).await;
        created.metadata.uid.expect("uid")
    }

    /// `robot` online (registered, approved) and attempt 1 of Task `task`
    /// dispatched to it, as it received it; returns the robot and the
    /// Task's uid. A server must run.
    pub async fn dispatched_to(&self, robot: &str, task: &str) -> (FakeRobot, String) {
        let mut fake = FakeRobot::connect(&self.broker, robot).await;
        fake.registered(self).await;
        self.set_phase(robot, k8s4r_api::RobotPhase::Online).await;
        let uid = self.dispatch_task(task, robot, 1).await;
        fake.expect("/tasks/dispatch").await;
        (fake, uid)
    }

    /// A server, and `rb1` online (registered, approved) running attempt 1
    /// of Task `job-a-0`, which the server dispatched and saw running;
    /// returns the server, the robot and the Task's uid.
    pub async fn running_on_rb1(&self) -> (Running, FakeRobot, String) {
        let server = self.server().await;
        let (robot, uid) = self.dispatched_to("rb1", "job-a-0").await;
        eventually("dispatch recorded", || async {
            self.task("job-a-0")
                .await
                .filter(|t| k8s4r_server::decide::sent_attempt(t) == 1)
        })
        .await;
        let topic = robot.topics.status("rb1", &uid);
        robot
            .send(topic, &robot.status(&uid, 1, 1, TaskState::Running))
            .await;
        server.wait_in("status", "applied", 1).await;
        (server, robot, uid)
    }

    /// Plays the manager: sets targetRobot, state and attempt.
    pub async fn move_task(&self, name: &str, robot: &str, state: TaskState, attempt: u32) {
        #[derive(Debug, Serialize)]
        #[serde(rename_all = "camelCase")]
        struct SpecPatch<'a> {
            spec: Target<'a>,
        }
        #[derive(Debug, Serialize)]
        #[serde(rename_all = "camelCase")]
        struct Target<'a> {
            target_robot: &'a str,
        }
        #[derive(Debug, Serialize)]
        struct StatusPatch {
            status: TaskStatus,
        }
        let tasks = self.tasks();
        let pp = PatchParams::default();
        tasks
            .patch(
                name,
                &pp,
                &Patch::Merge(&SpecPatch {
                    spec: Target { target_robot: robot },
                }),
            )
            .await
            .expect("targetRobot set");
        let status = TaskStatus {
            state: Some(state),
            attempt,
            robot: Some(robot.into()),
            ..Default::default()
        };
        tasks
            .patch_status(name, &pp, &Patch::Merge(&StatusPatch { status }))
            .await
            .expect("task status set");
    }

    /// Plays the manager: sets a Robot's phase.
    pub async fn set_phase(&self, robot: &str, phase: k8s4r_api::RobotPhase) {
        #[derive(Debug, Serialize)]
        struct Body {
            status: Phase,
        }
        #[derive(Debug, Serialize)]
        struct Phase {
            phase: k8s4r_api::RobotPhase,
        }
        self.robots()
            .patch_status(
                robot,
                &PatchParams::default(),
                &Patch::Merge(&Body {
                    status: Phase { phase },
                }),
            )
            .await
            .expect("phase set");
    }

    pub async fn task(&self, name: &str) -> Option<Task> {
        self.tasks().get_opt(name).await.expect("task read")
    }

    pub async fn robot(&self, name: &str) -> Option<k8s4r_api::Robot> {
        self.robots().get_opt(name).await.expect("robot read")
    }
}

/// The server under test.
pub struct Running {
    pub metrics: Arc<Metrics>,
    shutdown: CancellationToken,
    task: JoinHandle<k8s4r_server::Result<()>>,
}

impl Running {
    /// Waits until the server connected to its broker a second time (after
    /// a restart of the broker) and is ready again.
    pub async fn connected_again(&self) {
        let metrics = self.metrics.clone();
        eventually("the server is connected again", || {
            let m = metrics.clone();
            async move { (m.mqtt_connections() >= 2 && m.ready()).then_some(()) }
        })
        .await;
    }

    pub async fn stop(self) {
        self.shutdown.cancel();
        self.task
            .await
            .expect("server task")
            .expect("server stopped cleanly");
    }

    /// Waits until `n` messages of `kind` ended with `outcome`.
    pub async fn wait_in(&self, kind: &str, outcome: &str, n: u64) {
        let m = self.metrics.clone();
        eventually(&format!("{n} {kind} messages {outcome}"), || {
            let m = m.clone();
            async move { (m.messages_in(kind, outcome) >= n).then_some(()) }
        })
        .await;
    }
}

/// The embedded S3 store on a free port, bucket `outputs`, key `k8s4r`
/// with `secret`, keeping objects under `dir`: where it is and the key to
/// it, and what stops it.
pub async fn s3_store(
    dir: &std::path::Path,
    secret: &str,
) -> (k8s4r_server::bucket::BucketConfig, CancellationToken) {
    let stop = CancellationToken::new();
    let served = k8s4r_store::serve(
        k8s4r_store::StoreConfig {
            root: dir.to_owned(),
            listen: "127.0.0.1:0".parse().expect("an address"),
            bucket: "outputs".into(),
            access_key: "k8s4r".into(),
            secret_key: secret.into(),
        },
        stop.clone(),
    )
    .await
    .expect("the store serves");
    let config = k8s4r_server::bucket::BucketConfig {
        endpoint: served.endpoint,
        bucket: "outputs".into(),
        region: "us-east-1".into(),
        access_key: "k8s4r".into(),
        secret_key: secret.into(),
    };
    (config, stop)
}

/// A scripted robot: a plain MQTT client speaking the protocol by hand.
pub struct FakeRobot {
    pub id: String,
    pub topics: Topics,
    pub client: AsyncClient,
    received: mpsc::UnboundedReceiver<(String, Vec<u8>)>,
    /// The QoS each message arrived at, by topic, in order.
    qos: Arc<std::sync::Mutex<Vec<(String, QoS)>>>,
    poller: JoinHandle<()>,
}

impl FakeRobot {
    /// Connects, subscribes to its server topics, and sets its last will.
    pub async fn connect(broker: &Mosquitto, id: &str) -> Self {
        let topics = Topics::default();
        let mut options = MqttOptions::new(format!("robot-{id}"), "127.0.0.1", broker.port);
        options.set_keep_alive(Duration::from_secs(5));
        options.set_max_packet_size(1 << 20, 1 << 20);
        options.set_last_will(LastWill::new(
            topics.online(id),
            encode(&k8s4r_api::protocol::Online::new(false)),
            QoS::AtLeastOnce,
            true,
        ));
        let (client, mut eventloop) = AsyncClient::new(options, 64);
        let (tx, received) = mpsc::unbounded_channel();
        let (subscribed_tx, mut subscribed) = mpsc::unbounded_channel();
        let qos = Arc::new(std::sync::Mutex::new(Vec::new()));
        let seen = Arc::clone(&qos);
        let poller = tokio::spawn(async move {
            loop {
                match eventloop.poll().await {
                    Ok(Event::Incoming(Packet::Publish(p))) => {
                        seen.lock().unwrap().push((p.topic.clone(), p.qos));
                        let _ = tx.send((p.topic.clone(), p.payload.to_vec()));
                    }
                    Ok(Event::Incoming(Packet::SubAck(_))) => {
                        let _ = subscribed_tx.send(());
                    }
                    Ok(_) => {}
                    Err(_) => tokio::time::sleep(Duration::from_millis(50)).await,
                }
            }
        });
        for topic in topics.agent_subscriptions(id) {
            client
                .subscribe(topic, QoS::AtLeastOnce)
                .await
                .expect("subscribe queued");
        }
        for _ in 0..3 {
            tokio::time::timeout(DEADLINE, subscribed.recv())
                .await
                .expect("SUBACK in time");
        }
        Self {
            id: id.into(),
            topics,
            client,
            received,
            qos,
            poller,
        }
    }

    /// The QoS at which every message so far on a topic ending in `suffix`
    /// arrived (it subscribes at QoS 1, so this is the server's).
    pub fn qos_on(&self, suffix: &str) -> Vec<QoS> {
        self.qos
            .lock()
            .unwrap()
            .iter()
            .filter(|(topic, _)| topic.ends_with(suffix))
            .map(|(_, qos)| *qos)
            .collect()
    }

    pub async fn send<M: Message>(&self, topic: String, message: &M) {
        self.send_raw(topic, encode(message)).await;
    }

    pub async fn send_raw(&self, topic: String, body: Vec<u8>) {
        self.client
            .publish(topic, QoS::AtLeastOnce, false, body)
            .await
            .expect("publish queued");
    }

    /// The next message on a topic ending in `suffix`; others are skipped.
    pub async fn expect(&mut self, suffix: &str) -> Vec<u8> {
        let until = Instant::now() + DEADLINE;
        loop {
            let left = until.saturating_duration_since(Instant::now());
            match tokio::time::timeout(left, self.received.recv()).await {
                Ok(Some((topic, body))) if topic.ends_with(suffix) => return body,
                Ok(Some(_)) => {}
                _ => panic!("robot {} got nothing on *{suffix} in time", self.id),
            }
        }
    }

    /// Everything received so far, without waiting.
    pub fn drain(&mut self) -> Vec<(String, Vec<u8>)> {
        let mut out = Vec::new();
        while let Ok(m) = self.received.try_recv() {
            out.push(m);
        }
        out
    }

    /// Drops the connection without DISCONNECT, so the broker sends the will.
    pub fn crash(self) {
        self.poller.abort();
    }

    pub fn register(&self) -> k8s4r_api::protocol::Register {
        let device = DeviceInfo {
            arch: "aarch64".into(),
            os: "linux".into(),
            cpus: 4,
            memory_bytes: 4 << 30,
            disk_bytes: 32 << 30,
            ..Default::default()
        };
        k8s4r_api::protocol::Register {
            token: Some("bootstrap-token".into()),
            drivers: vec!["exec".into(), "raw_exec".into()],
            labels: [("site".to_string(), "lab".to_string())].into(),
            ..k8s4r_api::protocol::Register::new(self.id.clone(), "0.1.0", device)
        }
    }

    pub fn heartbeat(&self, seq: u64, cpu: f64) -> k8s4r_api::protocol::Heartbeat {
        let usage = Usage {
            cpu_percent: cpu,
            memory_used_bytes: 1 << 30,
            memory_total_bytes: 4 << 30,
            disk_free_bytes: 10 << 30,
            ..Default::default()
        };
        k8s4r_api::protocol::Heartbeat::new(self.id.clone(), seq, jiff::Timestamp::now(), usage)
    }

    pub fn status(
        &self,
        uid: &str,
        attempt: u32,
        seq: u64,
        state: TaskState,
    ) -> k8s4r_api::protocol::StatusUpdate {
        k8s4r_api::protocol::StatusUpdate {
            exit_code: state.is_terminal().then_some(0),
            start_time: Some(jiff::Timestamp::now()),
            finish_time: state.is_terminal().then(jiff::Timestamp::now),
            ..k8s4r_api::protocol::StatusUpdate::new(uid, attempt, seq, state)
        }
    }

    /// Registers and waits until the server has applied it.
    pub async fn registered(&self, env: &Env) {
        self.send(self.topics.register(&self.id), &self.register()).await;
        let id = self.id.clone();
        eventually("the robot exists", || async {
            env.robot(&id).await.filter(|r| r.status.is_some())
        })
        .await;
    }
}
