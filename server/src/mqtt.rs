//! The broker side: one rumqttc connection, owned by one task.
//!
//! That task polls the event loop and is the only one that talks to the
//! rumqttc client. Everything else publishes through a [`Publisher`] (a
//! channel sender) and awaits the broker's PUBACK; received messages go out
//! on per-robot worker channels. The task never awaits a publish itself, so
//! a full request channel cannot stall the keep-alive.

use std::collections::{HashMap, VecDeque};
use std::hash::{Hash, Hasher};
use std::time::Duration;

use rumqttc::{
    AsyncClient, ConnectionError, Event, EventLoop, MqttOptions, Outgoing, Packet, QoS, SubscribeFilter,
    TlsConfiguration, Transport,
};
use tokio::sync::{mpsc, oneshot};
use tokio_util::sync::CancellationToken;
use tracing::{debug, info, warn};

use crate::config::{parse_broker_url, BrokerConfig};
use crate::decide::backoff;
use crate::error::{Error, Result};
use crate::metrics::Metrics;
use std::sync::Arc;

/// Publishes not yet handed to rumqttc, at most.
const PUBLISH_QUEUE: usize = 1024;
/// Received messages waiting for a worker, per worker.
const INBOUND_QUEUE: usize = 8192;

/// A message from a robot.
#[derive(Debug, Clone)]
pub struct Inbound {
    /// The topic.
    pub topic: String,
    /// The body.
    pub payload: Vec<u8>,
}

struct PublishRequest {
    topic: String,
    payload: Vec<u8>,
    done: oneshot::Sender<Result<(), String>>,
}

/// A cheap, cloneable handle that publishes at QoS 1 and waits for PUBACK.
#[derive(Clone)]
pub struct Publisher {
    tx: mpsc::Sender<PublishRequest>,
    timeout: Duration,
}

impl Publisher {
    /// Publishes `payload` on `topic` (QoS 1, not retained) and returns once
    /// the broker acknowledged it, or fails after the publish timeout.
    pub async fn publish(&self, topic: String, payload: Vec<u8>) -> Result<()> {
        let fail = |reason: String| Error::Publish {
            topic: topic.clone(),
            reason,
        };
        let (done, acked) = oneshot::channel();
        let request = PublishRequest {
            topic: topic.clone(),
            payload,
            done,
        };
        let wait = async {
            self.tx
                .send(request)
                .await
                .map_err(|_| "the MQTT connection task has stopped".to_owned())?;
            acked
                .await
                .map_err(|_| "the MQTT connection task has stopped".to_owned())?
        };
        match tokio::time::timeout(self.timeout, wait).await {
            Ok(Ok(())) => Ok(()),
            Ok(Err(reason)) => Err(fail(reason)),
            Err(_) => Err(fail(format!("no PUBACK within {:?}", self.timeout))),
        }
    }
}

/// Which worker handles a topic: all of one robot's messages go to the same
/// worker, so they are applied in the order they arrived.
pub fn worker_for(topic: &str, workers: usize) -> usize {
    let key = topic
        .split_once("/robots/")
        .map(|(_, rest)| rest.split('/').next().unwrap_or_default())
        .unwrap_or_default();
    let mut hasher = std::collections::hash_map::DefaultHasher::new();
    key.hash(&mut hasher);
    (hasher.finish() % workers.max(1) as u64) as usize
}

/// Builds the rumqttc options from the broker settings.
pub fn mqtt_options(broker: &BrokerConfig) -> Result<MqttOptions> {
    let addr = parse_broker_url(&broker.url)?;
    let mut options = MqttOptions::new(broker.client_id.clone(), addr.host, addr.port);
    options.set_keep_alive(broker.keep_alive);
    // A persistent session: the broker queues robot messages (QoS 1) while
    // the server restarts.
    options.set_clean_session(false);
    let limit = k8s4r_api::protocol::MAX_MESSAGE_BYTES + 4096;
    options.set_max_packet_size(limit, limit);
    options.set_inflight(100);
    if let (Some(user), password) = (&broker.username, &broker.password) {
        options.set_credentials(user.clone(), password.clone().unwrap_or_default());
    }
    if addr.tls {
        let read = |path: &std::path::Path| {
            std::fs::read(path).map_err(|source| Error::ReadFile {
                path: path.display().to_string(),
                source,
            })
        };
        let ca = broker
            .ca_file
            .as_deref()
            .ok_or_else(|| Error::Config("mqtts:// needs --ca-file".into()))?;
        let client_auth = match (&broker.client_cert, &broker.client_key) {
            (Some(cert), Some(key)) => Some((read(cert)?, read(key)?)),
            (None, None) => None,
            _ => return Err(Error::Config("--client-cert and --client-key go together".into())),
        };
        options.set_transport(Transport::tls_with_config(TlsConfiguration::Simple {
            ca: read(ca)?,
            alpn: None,
            client_auth,
        }));
    }
    Ok(options)
}

/// Packet ids of QoS 1 publishes waiting for their PUBACK.
///
/// rumqttc reports `Outgoing::Publish(pkid)` in the order requests were
/// handed to it, so waiters queue up in that order and move to `by_pkid`
/// once their id is known. A retransmission after a reconnect carries an id
/// already in `by_pkid`.
#[derive(Default)]
struct AckWaiters {
    queued: VecDeque<oneshot::Sender<Result<(), String>>>,
    by_pkid: HashMap<u16, oneshot::Sender<Result<(), String>>>,
    collided: Option<oneshot::Sender<Result<(), String>>>,
    /// How many of `queued` were drained into rumqttc's pending list by the
    /// last connection error; lost if the broker has no session for us.
    at_risk: usize,
}

impl AckWaiters {
    fn sent(&mut self, pkid: u16) {
        if pkid == 0 || self.by_pkid.contains_key(&pkid) {
            return;
        }
        let waiter = self.collided.take().or_else(|| {
            self.at_risk = self.at_risk.saturating_sub(1);
            self.queued.pop_front()
        });
        if let Some(waiter) = waiter {
            self.by_pkid.insert(pkid, waiter);
        }
    }

    fn collided(&mut self) {
        if self.collided.is_none() {
            self.at_risk = self.at_risk.saturating_sub(1);
            self.collided = self.queued.pop_front();
        }
    }

    fn acked(&mut self, pkid: u16) {
        if let Some(waiter) = self.by_pkid.remove(&pkid) {
            let _ = waiter.send(Ok(()));
        }
    }

    fn disconnected(&mut self) {
        self.at_risk = self.queued.len();
    }

    /// A new session: everything unacknowledged before the disconnect is gone.
    fn session_lost(&mut self) {
        let reason = || Err("the broker dropped the session before acknowledging".to_owned());
        for (_, waiter) in self.by_pkid.drain() {
            let _ = waiter.send(reason());
        }
        if let Some(waiter) = self.collided.take() {
            let _ = waiter.send(reason());
        }
        for _ in 0..self.at_risk {
            if let Some(waiter) = self.queued.pop_front() {
                let _ = waiter.send(reason());
            }
        }
        self.at_risk = 0;
    }

    fn pending(&self) -> usize {
        self.queued.len() + self.by_pkid.len()
    }
}

/// The connection, before it runs.
pub struct Connection {
    client: AsyncClient,
    eventloop: EventLoop,
    requests: mpsc::Receiver<PublishRequest>,
    subscriptions: Vec<String>,
    workers: Vec<mpsc::Sender<Inbound>>,
    metrics: Arc<Metrics>,
    max_backoff: Duration,
}

/// Opens (lazily) the broker connection. Returns the connection to run, the
/// publisher handle and one receiver per worker.
pub fn connect(
    broker: &BrokerConfig,
    subscriptions: Vec<String>,
    workers: usize,
    publish_timeout: Duration,
    max_backoff: Duration,
    metrics: Arc<Metrics>,
) -> Result<(Connection, Publisher, Vec<mpsc::Receiver<Inbound>>)> {
    let options = mqtt_options(broker)?;
    let (client, eventloop) = AsyncClient::new(options, PUBLISH_QUEUE);
    let (tx, requests) = mpsc::channel(PUBLISH_QUEUE);
    let (senders, receivers) = (0..workers.max(1)).map(|_| mpsc::channel(INBOUND_QUEUE)).unzip();
    Ok((
        Connection {
            client,
            eventloop,
            requests,
            subscriptions,
            workers: senders,
            metrics,
            max_backoff,
        },
        Publisher {
            tx,
            timeout: publish_timeout,
        },
        receivers,
    ))
}

impl Connection {
    /// Polls the event loop until `shutdown`, reconnecting with capped backoff.
    pub async fn run(mut self, shutdown: CancellationToken) {
        let mut waiters = AckWaiters::default();
        let mut failures: u32 = 0;
        let mut connected = false;
        loop {
            tokio::select! {
                _ = shutdown.cancelled() => break,
                event = self.eventloop.poll() => match event {
                    Ok(event) => {
                        if self.handle(event, &mut waiters, &mut connected) {
                            failures = 0;
                        }
                    }
                    Err(error) => {
                        if connected {
                            waiters.disconnected();
                        }
                        connected = false;
                        self.metrics.set_mqtt_connected(false);
                        let delay = backoff(failures, self.max_backoff);
                        failures = failures.saturating_add(1);
                        log_connection_error(&error, delay);
                        tokio::select! {
                            _ = shutdown.cancelled() => break,
                            _ = tokio::time::sleep(delay) => {}
                        }
                    }
                },
                Some(request) = self.requests.recv(), if waiters.pending() < PUBLISH_QUEUE => {
                    match self.client.try_publish(request.topic, QoS::AtLeastOnce, false, request.payload) {
                        Ok(()) => waiters.queued.push_back(request.done),
                        Err(e) => {
                            let _ = request.done.send(Err(format!("not queued: {e}")));
                        }
                    }
                }
            }
        }
        // Flush the DISCONNECT so the broker does not treat us as lost.
        if self.client.try_disconnect().is_ok() {
            let flush = async {
                while let Ok(event) = self.eventloop.poll().await {
                    if matches!(event, Event::Outgoing(Outgoing::Disconnect)) {
                        break;
                    }
                }
            };
            let _ = tokio::time::timeout(Duration::from_secs(2), flush).await;
        }
        self.metrics.set_mqtt_connected(false);
    }

    /// Handles one event; returns true when the connection is (re)established.
    fn handle(&mut self, event: Event, waiters: &mut AckWaiters, connected: &mut bool) -> bool {
        match event {
            Event::Incoming(Packet::ConnAck(ack)) => {
                info!(
                    session_present = ack.session_present,
                    "connected to the MQTT broker"
                );
                *connected = true;
                self.metrics.set_mqtt_connected(true);
                self.metrics.mqtt_connection();
                if !ack.session_present {
                    waiters.session_lost();
                }
                let filters = self
                    .subscriptions
                    .iter()
                    .map(|f| SubscribeFilter::new(f.clone(), QoS::AtLeastOnce));
                if let Err(e) = self.client.try_subscribe_many(filters) {
                    warn!(error = %e, "could not queue the subscriptions");
                }
                return true;
            }
            Event::Incoming(Packet::Publish(publish)) => {
                let topic = publish.topic.clone();
                let worker = worker_for(&topic, self.workers.len());
                let inbound = Inbound {
                    topic,
                    payload: publish.payload.to_vec(),
                };
                if let Err(e) = self.workers[worker].try_send(inbound) {
                    let inbound = match e {
                        mpsc::error::TrySendError::Full(m) | mpsc::error::TrySendError::Closed(m) => m,
                    };
                    warn!(topic = %inbound.topic, "inbound queue full: message dropped");
                    self.metrics.message_in("any", "dropped_overload");
                }
            }
            Event::Incoming(Packet::PubAck(ack)) => waiters.acked(ack.pkid),
            Event::Incoming(Packet::SubAck(ack)) => {
                debug!(codes = ?ack.return_codes, "subscribed");
            }
            Event::Outgoing(Outgoing::Publish(pkid)) => waiters.sent(pkid),
            Event::Outgoing(Outgoing::AwaitAck(_)) => waiters.collided(),
            _ => {}
        }
        false
    }
}

fn log_connection_error(error: &ConnectionError, retry_in: Duration) {
    warn!(error = %error, retry_in = ?retry_in, "MQTT connection lost");
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn tls_needs_a_ca_and_both_halves_of_a_client_certificate() {
        let dir = std::env::temp_dir().join(format!("k8s4r-server-tls-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let pem = dir.join("ca.pem");
        std::fs::write(&pem, "-----BEGIN CERTIFICATE-----\n-----END CERTIFICATE-----\n").unwrap();
        let mut broker = BrokerConfig::new("mqtts://broker:8883", "s");
        assert!(matches!(mqtt_options(&broker), Err(Error::Config(_))));
        broker.ca_file = Some(pem.clone());
        let options = mqtt_options(&broker).unwrap();
        assert_eq!(options.broker_address(), ("broker".to_owned(), 8883));
        assert!(matches!(options.transport(), Transport::Tls(_)));
        broker.client_cert = Some(pem.clone());
        assert!(matches!(mqtt_options(&broker), Err(Error::Config(_))));
        broker.client_key = Some(dir.join("missing.pem"));
        assert!(matches!(mqtt_options(&broker), Err(Error::ReadFile { .. })));
        let plain = mqtt_options(&BrokerConfig::new("mqtt://localhost", "s")).unwrap();
        assert!(
            !plain.clean_session(),
            "a persistent session keeps robot messages"
        );
        let _ = std::fs::remove_dir_all(dir);
    }

    #[test]
    fn a_robot_always_goes_to_the_same_worker() {
        let a = worker_for("k8s4r/robots/rb1/heartbeat", 8);
        assert_eq!(a, worker_for("k8s4r/robots/rb1/tasks/u/status", 8));
        assert_eq!(worker_for("k8s4r/register", 8), worker_for("x", 8));
    }

    #[test]
    fn waiters_follow_packet_ids_and_survive_a_resumed_session() {
        let mut w = AckWaiters::default();
        let (a, mut ra) = oneshot::channel();
        let (b, mut rb) = oneshot::channel();
        let (c, mut rc) = oneshot::channel();
        w.queued.extend([a, b]);
        w.sent(1);
        w.disconnected(); // b was drained into rumqttc's pending list
        w.queued.push_back(c); // c is still in the channel
        w.sent(1); // retransmission of a
        w.sent(2); // b
        w.acked(1);
        assert_eq!(ra.try_recv().unwrap(), Ok(()));
        w.session_lost();
        assert!(rb.try_recv().unwrap().is_err(), "b was in flight");
        assert!(rc.try_recv().is_err(), "c is still to be sent");
        w.sent(3);
        w.acked(3);
        assert_eq!(rc.try_recv().unwrap(), Ok(()));
    }
}
