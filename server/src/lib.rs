//! k8s4r-server: the protocol bridge between the robots' MQTT and the
//! Kubernetes API. It decides nothing: the manager schedules and judges
//! liveness; this crate translates, idempotently, both ways.
//!
//! - MQTT → Kubernetes ([`bridge`]): register creates or updates a Robot,
//!   heartbeats renew a per-robot Lease and (coalesced) the Robot's status,
//!   status updates patch Task status, the last will sets `Connected=False`.
//! - Kubernetes → MQTT ([`dispatch`]): a Task controller publishes
//!   dispatches and cancels and holds the cancel finalizer.
//! - Every rule is a pure function in [`decide`].
//!
//! [`run`] is the entry point; the binary and `k8s4r up` both call it.

pub mod bridge;
pub mod bucket;
pub mod cli;
pub mod config;
pub mod decide;
pub mod dispatch;
pub mod error;
pub mod facts;
pub mod held;
pub mod ingress;
pub mod leader;
pub mod log_hub;
pub mod logs;
pub mod metrics;
pub mod mqtt;
pub mod outputs;
pub mod retained;
pub mod task_config;
pub mod wills;

use std::net::SocketAddr;
use std::sync::Arc;

use futures::stream::BoxStream;
use futures::StreamExt;
use k8s4r_api::protocol::Topics;
use k8s4r_api::{Robot, Task};
use k8s4r_service::watch::trim;
use k8s_openapi::api::coordination::v1::Lease;
use k8s_openapi::api::core::v1::Namespace;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::ObjectMeta;
use kube::api::PostParams;
use kube::runtime::controller::Controller;
use kube::runtime::{reflector, watcher, WatchStreamExt};
use kube::{Api, Client};
use tokio::sync::oneshot;
use tokio::task::JoinHandle;
use tokio_util::sync::CancellationToken;
use tracing::{info, warn};

use crate::bridge::Bridge;

pub use config::{BrokerConfig, ServerConfig};
pub use error::{Error, Result};
pub use metrics::Metrics;

/// Runs the bridge until `shutdown` is cancelled, then finishes what is in
/// flight (reconciles, queued messages) and disconnects from the broker.
pub async fn run(config: ServerConfig, client: Client, shutdown: CancellationToken) -> Result<()> {
    Server::new(config, client).run(shutdown).await
}

/// The bridge before it runs; lets a caller read the metrics and learn the
/// metrics address.
pub struct Server {
    config: ServerConfig,
    client: Client,
    metrics: Arc<Metrics>,
    bound: Option<oneshot::Sender<SocketAddr>>,
    logs_bound: Option<oneshot::Sender<SocketAddr>>,
}

/// The MQTT topic filters the server subscribes to.
pub fn subscriptions(config: &ServerConfig) -> Vec<String> {
    let topics = Topics::new(&config.topic_prefix);
    let mut filters = topics.server_subscriptions();
    if config.legacy_topics {
        filters.push(topics.legacy_register());
        filters.push(topics.legacy_heartbeat());
    }
    // Log chunks and session frames go to every replica: only the one that
    // asked for them has the reader or the session waiting.
    let logs = topics.log_chunk("+", "+");
    let sessions = topics.session_out("+", "+");
    match &config.shared_group {
        Some(group) => filters
            .into_iter()
            .map(|f| {
                if f == logs || f == sessions {
                    f
                } else {
                    format!("$share/{group}/{f}")
                }
            })
            .collect(),
        None => filters,
    }
}

impl Server {
    /// A server for `config`, talking to the API server through `client`.
    pub fn new(config: ServerConfig, client: Client) -> Self {
        Self {
            config,
            client,
            metrics: Arc::new(Metrics::default()),
            bound: None,
            logs_bound: None,
        }
    }

    /// The counters this server keeps.
    pub fn metrics(&self) -> Arc<Metrics> {
        self.metrics.clone()
    }

    /// Resolves to the address `/metrics` is served on once it is bound
    /// (useful with port 0).
    pub fn metrics_addr(&mut self) -> oneshot::Receiver<SocketAddr> {
        let (tx, rx) = oneshot::channel();
        self.bound = Some(tx);
        rx
    }

    /// Resolves to the address the logs API is served on once it is bound.
    pub fn logs_addr(&mut self) -> oneshot::Receiver<SocketAddr> {
        let (tx, rx) = oneshot::channel();
        self.logs_bound = Some(tx);
        rx
    }

    /// Runs until `shutdown`: builds every part, starts them, and on
    /// shutdown stops them in the order that loses nothing.
    pub async fn run(self, shutdown: CancellationToken) -> Result<()> {
        k8s4r_mqtt::install_crypto_provider();
        if self.config.workers == 0 {
            return Err(Error::Config("at least one worker is needed".into()));
        }
        ensure_namespace(
            &self.client,
            &self.config.lease_namespace,
            self.config.api_timeout,
        )
        .await;
        if let Some(addr) = self.config.metrics_addr {
            let health = self.metrics.clone();
            let (addr, serve) = k8s4r_service::health::bind(addr, health, shutdown.clone())
                .await
                .map_err(|source| Error::Http {
                    addr: addr.to_string(),
                    source,
                })?;
            info!(%addr, "serving /metrics, /healthz and /readyz");
            if let Some(tx) = self.bound {
                let _ = tx.send(addr);
            }
            tokio::spawn(serve);
        }
        let parts = Parts::build(self.config, self.client, self.metrics)?;
        if let Some(logs) = parts.logs_api() {
            serve_logs(logs, self.logs_bound, &shutdown).await;
        }
        parts.start(&shutdown).stop_when(shutdown).await;
        Ok(())
    }
}

/// Every part of a server, built and connected, none of them running yet.
struct Parts {
    config: ServerConfig,
    client: Client,
    metrics: Arc<Metrics>,
    connections: Vec<mqtt::Connection>,
    inbound: Vec<Arc<ingress::Lane>>,
    bridge: Arc<Bridge>,
    dispatcher: Controller<Task>,
    robot_cache: reflector::Store<Robot>,
    task_cache: reflector::Store<Task>,
    robot_events: BoxStream<'static, std::result::Result<Robot, watcher::Error>>,
    lease_events: BoxStream<'static, std::result::Result<watcher::Event<Lease>, watcher::Error>>,
    log_hub: Arc<log_hub::LogHub>,
}

/// The parts the logs API is made of.
struct LogsApi {
    config: config::LogsConfig,
    hub: Arc<log_hub::LogHub>,
    client: Client,
    publisher: mqtt::Publisher,
    topics: Topics,
    robots: reflector::Store<Robot>,
    tasks: reflector::Store<Task>,
    bucket: Option<Arc<bucket::Bucket>>,
}

/// Starts the logs API (it reads the request-header CA first; without it,
/// it is not served, and says why).
async fn serve_logs(api: LogsApi, bound: Option<oneshot::Sender<SocketAddr>>, shutdown: &CancellationToken) {
    let served = logs::bind(
        &api.config,
        api.hub,
        api.client,
        api.publisher,
        api.topics,
        api.robots,
        api.tasks,
        api.bucket,
        shutdown.clone(),
    )
    .await;
    match served {
        Ok((addr, serve)) => {
            if let Some(tx) = bound {
                let _ = tx.send(addr);
            }
            tokio::spawn(serve);
        }
        Err(e) => warn!(error = %e, "not serving the logs API"),
    }
}

/// The running parts, in the order they stop.
struct Running {
    metrics: Arc<Metrics>,
    dispatcher: JoinHandle<()>,
    responder: JoinHandle<()>,
    campaign: Option<JoinHandle<()>>,
    mqtt_stop: CancellationToken,
    /// One per broker.
    mqtt: Vec<JoinHandle<()>>,
    lanes: Vec<Arc<ingress::Lane>>,
    workers: Vec<JoinHandle<()>>,
}

impl Parts {
    fn build(config: ServerConfig, client: Client, metrics: Arc<Metrics>) -> Result<Self> {
        let log_hub = Arc::new(log_hub::LogHub::new(Topics::new(&config.topic_prefix)));
        let (connections, publisher, inbound) = mqtt::connect(
            &config.brokers(),
            subscriptions(&config),
            config.workers,
            config.ingress,
            config.publish_timeout,
            config.max_backoff,
            config.will_hold,
            metrics.clone(),
            log_hub.clone(),
        )?;
        // Robots: one cache for every lookup, and its stream answers robots
        // waiting for their registration's outcome.
        let (robot_cache, robot_writer) = reflector::store::<Robot>();
        // Robots, Leases and Tasks are cached without managedFields (no
        // lookup here reads them): about half of each object.
        let robot_events = reflector(
            robot_writer,
            watcher(Api::<Robot>::all(client.clone()), watcher::Config::default()).modify(trim),
        )
        .default_backoff()
        .applied_objects()
        .boxed();
        // Leases: what other replicas renewed, so a robot whose heartbeats
        // are spread over replicas is not renewed by each of them.
        let (lease_cache, lease_writer) = reflector::store::<Lease>();
        let leases = Api::<Lease>::namespaced(client.clone(), &config.lease_namespace);
        let lease_events = reflector(
            lease_writer,
            watcher(leases, watcher::Config::default()).modify(trim),
        )
        .default_backoff()
        .boxed();
        let (dispatcher, task_sync) = dispatch::controller(client.clone());
        let task_cache = dispatcher.store();
        let bridge = Arc::new(Bridge::new(
            client.clone(),
            robot_cache.clone(),
            task_cache.clone(),
            task_sync,
            lease_cache,
            publisher,
            metrics.clone(),
            config.clone(),
        ));
        Ok(Self {
            config,
            client,
            metrics,
            connections,
            inbound,
            bridge,
            dispatcher,
            robot_cache,
            task_cache,
            robot_events,
            lease_events,
            log_hub,
        })
    }

    /// What the logs API needs, when it is configured.
    fn logs_api(&self) -> Option<LogsApi> {
        Some(LogsApi {
            config: self.config.logs.clone()?,
            hub: self.log_hub.clone(),
            client: self.client.clone(),
            publisher: self.bridge.publisher().clone(),
            topics: Topics::new(&self.config.topic_prefix),
            robots: self.robot_cache.clone(),
            tasks: self.task_cache.clone(),
            bucket: self
                .config
                .outputs
                .as_ref()
                .and_then(|c| bucket::Bucket::new(c).ok())
                .map(Arc::new),
        })
    }

    /// Who leads the dispatch: this replica alone, or whoever wins the
    /// campaign started here.
    fn campaign(&self, shutdown: &CancellationToken) -> (leader::Leadership, Option<JoinHandle<()>>) {
        let leadership = match &self.config.leader {
            Some(_) => leader::Leadership::follower(),
            None => leader::Leadership::always(),
        };
        let campaign = self.config.leader.clone().map(|leader| {
            tokio::spawn(leader::campaign(
                self.client.clone(),
                self.config.lease_namespace.clone(),
                leader,
                leadership.clone(),
                self.config.api_timeout,
                shutdown.clone(),
            ))
        });
        (leadership, campaign)
    }

    fn start(self, shutdown: &CancellationToken) -> Running {
        let (leadership, campaign) = self.campaign(shutdown);
        tokio::spawn(log_errors(
            self.lease_events,
            "watching robot leases",
            shutdown.clone(),
        ));
        let started = jiff::Timestamp::now();
        let (presence_tx, presence_rx) = oneshot::channel();
        tokio::spawn(retained::run(
            self.config.brokers(),
            Topics::new(&self.config.topic_prefix),
            presence_tx,
            shutdown.clone(),
        ));
        let responder = tokio::spawn(answer_robot_changes(
            self.bridge.clone(),
            self.robot_events,
            shutdown.clone(),
        ));
        let synced = Synced::watch(self.robot_cache, self.task_cache, self.metrics.clone());
        // What the broker knows of robots replaces what a previous run left
        // in their conditions.
        tokio::spawn(forget_absent_at_start(
            self.bridge.clone(),
            presence_rx,
            synced.robots.clone(),
            started,
            shutdown.clone(),
        ));
        let dispatcher = {
            let (bridge, shutdown, robots) = (self.bridge.clone(), shutdown.clone(), synced.robots.clone());
            let controller = self.dispatcher;
            tokio::spawn(async move {
                // The controller reads robot phases: it starts once robots are listed.
                tokio::select! {
                    _ = shutdown.cancelled() => return,
                    _ = robots.cancelled() => {}
                }
                dispatch::run(controller, bridge, leadership, shutdown).await;
            })
        };
        let lanes = self.inbound.clone();
        let workers = self
            .inbound
            .into_iter()
            .map(|lane| {
                let synced = synced.all.clone();
                tokio::spawn(work_once_synced(
                    self.bridge.clone(),
                    lane,
                    synced,
                    shutdown.clone(),
                ))
            })
            .collect();
        let mqtt_stop = CancellationToken::new();
        let mqtt = self
            .connections
            .into_iter()
            .map(|connection| tokio::spawn(connection.run(mqtt_stop.clone())))
            .collect();
        Running {
            metrics: self.metrics,
            dispatcher,
            responder,
            campaign,
            mqtt_stop,
            mqtt,
            lanes,
            workers,
        }
    }
}

/// Writes of `status.shownFacts` that follow a Robot's label or phase at
/// once, at most; the others wait their turn, one per Robot, and write
/// what the Robot then shows (after an upgrade every Robot may want one).
const SHOWN_FACTS_WRITES: usize = 8;

/// Answers the registrations that waited for the manager, as the Robots
/// it decided on come by, and makes their shown facts follow their label
/// and phase off this loop, so that no answer waits behind those writes.
async fn answer_robot_changes(
    bridge: Arc<Bridge>,
    robot_events: BoxStream<'static, std::result::Result<Robot, watcher::Error>>,
    shutdown: CancellationToken,
) {
    let writes = Arc::new(tokio::sync::Semaphore::new(SHOWN_FACTS_WRITES));
    let waiting: Arc<std::sync::Mutex<std::collections::HashSet<String>>> = Arc::default();
    let mut events = std::pin::pin!(robot_events.take_until(shutdown.cancelled_owned()));
    while let Some(event) = events.next().await {
        match event {
            Ok(robot) => {
                bridge.robot_changed(&robot).await;
                let name = robot.metadata.name.clone().unwrap_or_default();
                let stale = crate::facts::shown_facts_stale(&robot).is_some();
                if stale && k8s4r_service::lock(&waiting).insert(name.clone()) {
                    let (bridge, writes, waiting) =
                        (Arc::clone(&bridge), Arc::clone(&writes), Arc::clone(&waiting));
                    tokio::spawn(async move {
                        let Ok(_turn) = writes.acquire_owned().await else {
                            return;
                        };
                        k8s4r_service::lock(&waiting).remove(&name);
                        bridge.follow_show_facts_of(&name).await;
                    });
                }
            }
            Err(error) => warn!(%error, "watching robots"),
        }
    }
}

/// Once the broker said who is present and the Robots are listed, marks
/// not connected the robots a previous run left connected.
async fn forget_absent_at_start(
    bridge: Arc<Bridge>,
    presence: oneshot::Receiver<std::collections::HashSet<String>>,
    robots_listed: CancellationToken,
    started: jiff::Timestamp,
    shutdown: CancellationToken,
) {
    let present = tokio::select! {
        () = shutdown.cancelled() => return,
        present = presence => present,
    };
    let Ok(present) = present else { return };
    tokio::select! {
        () = shutdown.cancelled() => return,
        () = robots_listed.cancelled() => {}
    }
    bridge.forget_absent(&present, started).await;
}

/// Runs one inbound worker once every cache is in sync.
async fn work_once_synced(
    bridge: Arc<Bridge>,
    lane: Arc<ingress::Lane>,
    synced: CancellationToken,
    shutdown: CancellationToken,
) {
    tokio::select! {
        _ = synced.cancelled() => {}
        // Stopped before the caches filled: the broker keeps the messages
        // for the next run.
        _ = shutdown.cancelled() => return,
    }
    bridge::worker(bridge, lane).await;
}

impl Running {
    /// Waits for `shutdown`, then finishes what is in flight: reconciles
    /// first, then the broker connection, then the queued robot messages.
    async fn stop_when(self, shutdown: CancellationToken) {
        shutdown.cancelled().await;
        info!("shutting down: finishing reconciles in flight");
        let deadline = tokio::time::Instant::now() + FINISH_IN_FLIGHT;
        finish_by("the task dispatcher", self.dispatcher, deadline).await;
        finish_by("the robot watch", self.responder, deadline).await;
        if let Some(campaign) = self.campaign {
            finish_by("the leader election", campaign, deadline).await;
        }
        self.mqtt_stop.cancel();
        for connection in self.mqtt {
            let _ = connection.await;
        }
        // Nothing more comes in: the workers finish their queues, then stop.
        for lane in &self.lanes {
            lane.close();
        }
        for worker in self.workers {
            let _ = worker.await;
        }
        self.metrics.set_kube_synced(false);
        info!("stopped");
    }
}

/// How long the reconciles in flight may take to finish at shutdown. A
/// reconcile cut short is no worse than one a SIGKILL of the server cuts:
/// what it did not record, the next run (or another replica) does again.
const FINISH_IN_FLIGHT: std::time::Duration = std::time::Duration::from_secs(20);

/// Waits for `part` until `deadline`, then abandons it, saying so: a stop
/// of the server ends, whatever one part waits for.
async fn finish_by(part: &str, mut handle: JoinHandle<()>, deadline: tokio::time::Instant) {
    if tokio::time::timeout_at(deadline, &mut handle).await.is_err() {
        warn!(
            part,
            "did not finish within {FINISH_IN_FLIGHT:?} of the shutdown; abandoned"
        );
        handle.abort();
        let _ = handle.await;
    }
}

/// When the caches have their first lists, as tokens many can wait on: a
/// kube-runtime Store wakes only one of several concurrent
/// `wait_until_ready` callers.
struct Synced {
    /// Robots are listed.
    robots: CancellationToken,
    /// Robots and Tasks are listed: robot messages may be handled.
    all: CancellationToken,
}

impl Synced {
    fn watch(robots: reflector::Store<Robot>, tasks: reflector::Store<Task>, metrics: Arc<Metrics>) -> Self {
        let synced = Self {
            robots: CancellationToken::new(),
            all: CancellationToken::new(),
        };
        let (robots_synced, all_synced) = (synced.robots.clone(), synced.all.clone());
        tokio::spawn(async move {
            if !until_ready(&robots).await {
                return;
            }
            robots_synced.cancel();
            if !until_ready(&tasks).await {
                return;
            }
            info!("robot and task caches are filled");
            metrics.set_kube_synced(true);
            all_synced.cancel();
        });
        synced
    }
}

/// Drives a watch whose cache others read, logging its errors, until `shutdown`.
async fn log_errors<T>(
    events: BoxStream<'static, std::result::Result<T, watcher::Error>>,
    what: &'static str,
    shutdown: CancellationToken,
) {
    let mut events = std::pin::pin!(events.take_until(shutdown.cancelled_owned()));
    while let Some(event) = events.next().await {
        if let Err(error) = event {
            warn!(%error, "{what}");
        }
    }
}

/// Waits until `store` has its first list; false when its writer is gone.
///
/// Asks again every 50 ms: a Store wakes only one of several concurrent
/// waiters, and the Task controller waits on the same store.
async fn until_ready<K>(store: &reflector::Store<K>) -> bool
where
    K: kube::runtime::reflector::Lookup + Clone + 'static,
    K::DynamicType: Eq + std::hash::Hash + Clone,
{
    loop {
        let wait = tokio::time::timeout(std::time::Duration::from_millis(50), store.wait_until_ready()).await;
        match wait {
            Ok(result) => return result.is_ok(),
            Err(_) => continue,
        }
    }
}

/// Creates the Lease namespace when it is missing. In a cluster it was
/// created with the manifests, and the server may only read it.
async fn ensure_namespace(client: &Client, name: &str, timeout: std::time::Duration) {
    let api: Api<Namespace> = Api::all(client.clone());
    match tokio::time::timeout(timeout, api.get_opt(name)).await {
        Ok(Ok(Some(_))) => return,
        Ok(Ok(None)) => {}
        Ok(Err(error)) => {
            warn!(namespace = name, %error, "could not read the lease namespace");
            return;
        }
        Err(_) => {
            warn!(namespace = name, "reading the lease namespace timed out");
            return;
        }
    }
    let ns = Namespace {
        metadata: ObjectMeta {
            name: Some(name.to_owned()),
            ..Default::default()
        },
        ..Default::default()
    };
    let pp = PostParams::default();
    let create = api.create(&pp, &ns);
    match tokio::time::timeout(timeout, create).await {
        Ok(Ok(_)) => info!(namespace = name, "created the lease namespace"),
        Ok(Err(kube::Error::Api(s))) if s.code == 409 => {}
        Ok(Err(error)) => warn!(namespace = name, %error, "could not create the lease namespace"),
        Err(_) => warn!(namespace = name, "creating the lease namespace timed out"),
    }
}
