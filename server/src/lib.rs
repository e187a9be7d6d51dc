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
pub mod cli;
pub mod config;
pub mod decide;
pub mod dispatch;
pub mod error;
pub mod http;
pub mod leader;
pub mod metrics;
pub mod mqtt;

use std::net::SocketAddr;
use std::sync::Arc;

use futures::StreamExt;
use k8s4r_api::protocol::Topics;
use k8s4r_api::Robot;
use k8s_openapi::api::coordination::v1::Lease;
use k8s_openapi::api::core::v1::Namespace;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::ObjectMeta;
use kube::api::PostParams;
use kube::runtime::{reflector, watcher, WatchStreamExt};
use kube::{Api, Client};
use tokio::sync::oneshot;
use tokio_util::sync::CancellationToken;
use tracing::{info, warn};

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
}

/// The MQTT topic filters the server subscribes to.
pub fn subscriptions(config: &ServerConfig) -> Vec<String> {
    let topics = Topics::new(&config.topic_prefix);
    let mut filters = topics.server_subscriptions();
    if config.legacy_topics {
        filters.push(topics.legacy_register());
        filters.push(topics.legacy_heartbeat());
    }
    match &config.shared_group {
        Some(group) => filters
            .into_iter()
            .map(|f| format!("$share/{group}/{f}"))
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

    /// Runs until `shutdown`.
    pub async fn run(self, shutdown: CancellationToken) -> Result<()> {
        let Server {
            config,
            client,
            metrics,
            bound,
        } = self;
        // rumqttc is built without a crypto provider; installing ring's is a
        // no-op when the embedding program already chose one.
        let _ = rustls::crypto::ring::default_provider().install_default();
        if config.workers == 0 {
            return Err(Error::Config("at least one worker is needed".into()));
        }
        ensure_namespace(&client, &config.lease_namespace, config.api_timeout).await;

        let mqtt_stop = CancellationToken::new();
        let (connection, publisher, receivers) = mqtt::connect(
            &config.broker,
            subscriptions(&config),
            config.workers,
            config.publish_timeout,
            config.max_backoff,
            metrics.clone(),
        )?;

        if let Some(addr) = config.metrics_addr {
            let (addr, serve) = http::bind(addr, metrics.clone(), shutdown.clone()).await?;
            info!(%addr, "serving /metrics, /healthz and /readyz");
            if let Some(tx) = bound {
                let _ = tx.send(addr);
            }
            tokio::spawn(serve);
        }

        // Robots: one cache for every lookup, and its stream answers robots
        // waiting for their registration's outcome.
        let (robot_cache, robot_writer) = reflector::store::<Robot>();
        let robot_events = reflector(
            robot_writer,
            watcher(Api::<Robot>::all(client.clone()), watcher::Config::default()),
        )
        .default_backoff()
        .applied_objects();

        // Leases: what other replicas renewed, so a robot whose heartbeats
        // are spread over replicas is not renewed by each of them.
        let (lease_cache, lease_writer) = reflector::store::<Lease>();
        let lease_events = reflector(
            lease_writer,
            watcher(
                Api::<Lease>::namespaced(client.clone(), &config.lease_namespace),
                watcher::Config::default(),
            ),
        )
        .default_backoff();
        {
            let shutdown = shutdown.clone();
            tokio::spawn(async move {
                let mut events = std::pin::pin!(lease_events.take_until(shutdown.cancelled_owned()));
                while let Some(event) = events.next().await {
                    if let Err(error) = event {
                        warn!(%error, "watching robot leases");
                    }
                }
            });
        }

        let controller = dispatch::controller(client.clone());
        let task_cache = controller.store();
        let bridge = Arc::new(bridge::Bridge::new(
            client.clone(),
            robot_cache.clone(),
            task_cache.clone(),
            lease_cache,
            publisher,
            metrics.clone(),
            config.clone(),
        ));

        let responder = {
            let bridge = bridge.clone();
            let shutdown = shutdown.clone();
            tokio::spawn(async move {
                let mut events = std::pin::pin!(robot_events.take_until(shutdown.cancelled_owned()));
                while let Some(event) = events.next().await {
                    match event {
                        Ok(robot) => bridge.robot_changed(&robot).await,
                        Err(error) => warn!(%error, "watching robots"),
                    }
                }
            })
        };

        let mut campaign = None;
        let leadership = if config.leader_election {
            let leadership = leader::Leadership::follower();
            campaign = Some(tokio::spawn(leader::campaign(
                Api::<Lease>::namespaced(client.clone(), &config.lease_namespace),
                config.identity.clone(),
                leadership.clone(),
                config.api_timeout,
                shutdown.clone(),
            )));
            leadership
        } else {
            leader::Leadership::always()
        };

        // The controller reads robot phases, so it starts once robots are
        // listed; robot messages wait for both lists. One task waits on the
        // caches and fans the news out through tokens: a kube-runtime Store
        // wakes only one of several concurrent `wait_until_ready` callers.
        let robots_synced = CancellationToken::new();
        let all_synced = CancellationToken::new();
        {
            let metrics = metrics.clone();
            let (robots, tasks) = (robot_cache.clone(), task_cache.clone());
            let (robots_synced, all_synced) = (robots_synced.clone(), all_synced.clone());
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
        }
        let controller_task = {
            let bridge = bridge.clone();
            let shutdown = shutdown.clone();
            tokio::spawn(async move {
                tokio::select! {
                    _ = shutdown.cancelled() => return,
                    _ = robots_synced.cancelled() => {}
                }
                dispatch::run(controller, bridge, leadership, shutdown).await;
            })
        };
        let workers: Vec<_> = receivers
            .into_iter()
            .map(|rx| {
                let bridge = bridge.clone();
                let all_synced = all_synced.clone();
                let shutdown = shutdown.clone();
                tokio::spawn(async move {
                    tokio::select! {
                        _ = all_synced.cancelled() => {}
                        // Stopped before the caches filled: the broker
                        // keeps the messages for the next run.
                        _ = shutdown.cancelled() => return,
                    }
                    bridge::worker(bridge, rx).await;
                })
            })
            .collect();
        let mqtt_task = tokio::spawn(connection.run(mqtt_stop.clone()));

        shutdown.cancelled().await;
        info!("shutting down: finishing reconciles in flight");
        let _ = controller_task.await;
        let _ = responder.await;
        if let Some(campaign) = campaign {
            let _ = campaign.await;
        }
        mqtt_stop.cancel();
        let _ = mqtt_task.await;
        // The connection dropped the workers' senders: they finish their queues.
        for worker in workers {
            let _ = worker.await;
        }
        metrics.set_kube_synced(false);
        info!("stopped");
        Ok(())
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
