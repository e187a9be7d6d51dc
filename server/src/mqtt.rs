//! The broker side: one rumqttc connection, owned by one task.
//!
//! That task polls the event loop and is the only one that talks to the
//! rumqttc client. Everything else publishes through a [`Publisher`] (a
//! channel sender) and awaits the broker's PUBACK, or hands a message over
//! without waiting ([`Publisher::send`]); received messages go into the
//! per-robot queues of [`crate::ingress`]. The task never awaits a publish
//! itself, so a full request channel cannot stall the keep-alive.

use std::collections::HashMap;
use std::hash::{Hash, Hasher};
use std::time::{Duration, Instant};

use k8s4r_api::backoff::exponential;
use k8s4r_api::protocol::{decode, Online, MAX_INCOMING_PACKET_BYTES, MAX_PACKET_BYTES};
use k8s4r_mqtt::{BrokerUrl, PacketIds, TlsFiles};
use rumqttc::{AsyncClient, Event, EventLoop, MqttOptions, Outgoing, Packet, QoS, SubscribeFilter};
use tokio::sync::{mpsc, oneshot};
use tokio_util::sync::CancellationToken;
use tracing::{debug, info, warn};

use crate::config::BrokerConfig;
use crate::error::{Error, Result};
use crate::ingress::{Lane, Limits};
use crate::log_hub::LogHub;
use crate::metrics::Metrics;
use crate::wills::{Offer, Wills};
use std::sync::Arc;

/// Publishes not yet handed to rumqttc, at most.
const PUBLISH_QUEUE: usize = 1024;
/// Bulk publishes (cancels the robots' own lists call for) waiting, at
/// most: beyond this they are dropped and counted, and the robot's next
/// heartbeat calls for them again.
const BULK_QUEUE: usize = 256;
/// Bulk publishes are handed to rumqttc only while fewer than this many
/// publishes are outstanding, so confirmations, answers and dispatches
/// always find room.
const BULK_OUTSTANDING: usize = PUBLISH_QUEUE / 4;
/// QoS 1 publishes sent and waiting for the broker's PUBACK, at most:
/// dispatches, cancels of Tasks and log requests, each with somebody
/// waiting on it. This over the PUBACK's round trip bounds what the server
/// can send; with 100 and the confirmations at QoS 1 too, a 100,000-robot
/// reconnect storm dropped 554,958 confirmations and 223,121 registration
/// answers (the confirmations now go at QoS 0, see [`Publisher::send`]).
const INFLIGHT: u16 = 1000;
/// The first reconnect delay; doubled per failure up to the configured cap.
const RECONNECT_BASE: Duration = Duration::from_millis(500);
pub use crate::ingress::Inbound;

struct PublishRequest {
    topic: String,
    payload: Vec<u8>,
    /// Who waits for the PUBACK. `None` for [`Publisher::send`] and
    /// [`Publisher::send_bulk`]: those go at QoS 0 and take no packet id.
    done: Option<oneshot::Sender<Result<(), String>>>,
}

/// One broker connection's two queues: the control queue (dispatches,
/// cancels of Tasks, answers, confirmations) is always served first; the
/// bulk queue (cancels that robots' own lists call for) only when the
/// control queue is empty and the connection has room, so that no robot's
/// list can starve another robot's confirmations.
struct Route {
    tx: mpsc::Sender<PublishRequest>,
    bulk: mpsc::Sender<PublishRequest>,
}

/// Which broker connection each robot was last heard on, when the server
/// holds several: what it publishes to a robot goes there.
#[derive(Default)]
struct Homes {
    by_robot: std::sync::Mutex<HashMap<Box<str>, usize>>,
}

/// Robots [`Homes`] remembers, at most: beyond it (ids nobody registered,
/// on a broker without an ACL) a robot not yet known is sent to every
/// broker, as one not heard yet is.
const MAX_HOMES: usize = 1 << 21;

impl Homes {
    /// The robot spoke on connection `connection`; returns the connection
    /// it had spoken on before, when that was another.
    fn heard(&self, robot: &str, connection: usize) -> Option<usize> {
        let mut homes = self
            .by_robot
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner);
        match homes.get_mut(robot) {
            Some(home) if *home == connection => None,
            Some(home) => Some(std::mem::replace(home, connection)),
            None => {
                if homes.len() < MAX_HOMES {
                    homes.insert(robot.into(), connection);
                }
                None
            }
        }
    }

    fn of(&self, robot: &str) -> Option<usize> {
        let homes = self
            .by_robot
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner);
        homes.get(robot).copied()
    }
}

/// Whether a message shows where its robot is connected now: not a
/// retained message (sent again at every subscription, however old) and
/// not its presence (a broker publishes a robot's last will after the
/// robot left it for another).
fn shows_home(topic: &str, retained: bool) -> bool {
    !retained && !topic.ends_with("/online")
}

/// What a robot's presence message says (`online`), or None for any other
/// message (and a presence that does not parse, which the bridge refuses).
fn presence(topic: &str, payload: &[u8]) -> Option<bool> {
    if !topic.ends_with("/online") {
        return None;
    }
    decode::<Online>(payload).ok().map(|m| m.online)
}

/// Sleeps until `at`, or for ever when there is no `at`.
async fn sleep_until_some(at: Option<tokio::time::Instant>) {
    match at {
        Some(at) => tokio::time::sleep_until(at).await,
        None => std::future::pending().await,
    }
}

/// A cheap, cloneable handle that publishes at QoS 1 and waits for PUBACK,
/// or hands a message over without waiting.
///
/// With several brokers, a message for a robot goes to the broker the
/// robot was last heard on, and to every broker while the robot has not
/// been heard since the server started (it is subscribed on one of them).
#[derive(Clone)]
pub struct Publisher {
    routes: Arc<[Route]>,
    homes: Arc<Homes>,
    timeout: Duration,
}

impl Publisher {
    /// The connections a message on `topic` goes out on.
    fn routes_for(&self, topic: &str) -> &[Route] {
        if self.routes.len() > 1 {
            if let Some(home) = self.homes.of(robot_of(topic)) {
                return &self.routes[home..=home];
            }
        }
        &self.routes
    }

    /// Publishes `payload` on `topic` (QoS 1, not retained) and returns once
    /// the broker acknowledged it, or fails after the publish timeout. Sent
    /// to several brokers (a robot not heard yet), it succeeds when one of
    /// them acknowledged it.
    pub async fn publish(&self, topic: String, payload: Vec<u8>) -> Result<()> {
        match self.routes_for(&topic) {
            [] => Err(Error::Publish {
                topic,
                reason: "no broker connection".to_owned(),
            }),
            [route] => self.publish_on(route, topic, payload).await,
            routes => {
                // The first acknowledgement: a broker that is down does
                // not hold the others up.
                let each = routes
                    .iter()
                    .map(|route| Box::pin(self.publish_on(route, topic.clone(), payload.clone())));
                futures::future::select_ok(each).await.map(|_| ())
            }
        }
    }

    async fn publish_on(&self, route: &Route, topic: String, payload: Vec<u8>) -> Result<()> {
        let fail = |reason: String| Error::Publish {
            topic: topic.clone(),
            reason,
        };
        let (done, acked) = oneshot::channel();
        let request = PublishRequest {
            topic: topic.clone(),
            payload,
            done: Some(done),
        };
        let wait = async {
            route
                .tx
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

    /// Hands `payload` for `topic` to the connection without waiting for
    /// anything; false when the request queue is full or the connection
    /// has stopped. For messages whose loss the protocol repairs (status
    /// and heartbeat confirmations, registration answers: the robot sends
    /// the status, heartbeat or registration again), so they go at QoS 0:
    /// no PUBACK in either hop, no packet id held while the broker is slow.
    /// At 100,000 robots these are 3,333 confirmations a second; at QoS 1
    /// they filled the window of publishes awaiting PUBACK in a reconnect
    /// storm and crowded out the dispatches.
    pub fn send(&self, topic: String, payload: Vec<u8>) -> bool {
        self.hand(topic, payload, |route| &route.tx)
    }

    /// Like [`Publisher::send`], on the bulk queue: for messages the
    /// robot's next report calls for again.
    pub fn send_bulk(&self, topic: String, payload: Vec<u8>) -> bool {
        self.hand(topic, payload, |route| &route.bulk)
    }

    /// Queues a QoS 0 publish on the bulk queue of each of the topic's
    /// routes, waiting for room (a session's frames: lost, one would end
    /// the session; they wait behind dispatches and confirmations). True
    /// when one took it.
    pub async fn queue_bulk(&self, topic: String, payload: Vec<u8>) -> bool {
        let mut taken = false;
        for route in self.routes_for(&topic) {
            let request = PublishRequest {
                topic: topic.clone(),
                payload: payload.clone(),
                done: None,
            };
            taken |= route.bulk.send(request).await.is_ok();
        }
        taken
    }

    /// Queues a QoS 0 publish on the chosen queue of each of the topic's
    /// routes; true when one took it.
    fn hand(
        &self,
        topic: String,
        payload: Vec<u8>,
        queue: fn(&Route) -> &mpsc::Sender<PublishRequest>,
    ) -> bool {
        let Some((last, others)) = self.routes_for(&topic).split_last() else {
            return false;
        };
        let request = |topic, payload| PublishRequest {
            topic,
            payload,
            done: None,
        };
        let mut taken = false;
        for route in others {
            taken |= queue(route)
                .try_send(request(topic.clone(), payload.clone()))
                .is_ok();
        }
        queue(last).try_send(request(topic, payload)).is_ok() || taken
    }
}

/// The robot a topic speaks for (empty for the shared legacy topics).
pub fn robot_of(topic: &str) -> &str {
    topic
        .split_once("/robots/")
        .map(|(_, rest)| rest.split('/').next().unwrap_or_default())
        .unwrap_or_default()
}

/// Which worker handles a topic: all of one robot's messages go to the same
/// worker, so they are applied in the order they arrived.
pub fn worker_for(topic: &str, workers: usize) -> usize {
    let mut hasher = std::collections::hash_map::DefaultHasher::new();
    robot_of(topic).hash(&mut hasher);
    (hasher.finish() % workers.max(1) as u64) as usize
}

/// Builds the rumqttc options from the broker settings.
pub fn mqtt_options(broker: &BrokerConfig) -> Result<MqttOptions> {
    let url = BrokerUrl::parse(&broker.url).map_err(|e| Error::Mqtt(format!("broker URL {e}")))?;
    let tls = TlsFiles::resolve(
        &url,
        broker.ca_file.clone(),
        broker.client_cert.clone(),
        broker.client_key.clone(),
    )
    .map_err(|e| Error::Mqtt(e.to_string()))?;
    let mut options = MqttOptions::new(broker.client_id.clone(), url.host, url.port);
    options.set_keep_alive(broker.keep_alive);
    // A persistent session: the broker queues robot messages (QoS 1) while
    // the server restarts.
    options.set_clean_session(false);
    options.set_max_packet_size(MAX_INCOMING_PACKET_BYTES, MAX_PACKET_BYTES);
    options.set_inflight(INFLIGHT);
    if let (Some(user), password) = (&broker.username, &broker.password) {
        options.set_credentials(user.clone(), password.clone().unwrap_or_default());
    }
    if let Some(tls) = tls {
        options.set_transport(tls.transport().map_err(|e| Error::Mqtt(e.to_string()))?);
    }
    Ok(options)
}

type Waiter = Option<oneshot::Sender<Result<(), String>>>;

/// One broker connection, before it runs.
pub struct Connection {
    /// The broker's URL, for the logs.
    url: String,
    /// This connection's place among the server's broker connections.
    index: usize,
    /// Where each robot was last heard; `None` with one broker.
    homes: Option<Arc<Homes>>,
    client: AsyncClient,
    eventloop: EventLoop,
    requests: mpsc::Receiver<PublishRequest>,
    bulk: mpsc::Receiver<PublishRequest>,
    subscriptions: Vec<String>,
    lanes: Vec<Arc<Lane>>,
    limits: Limits,
    metrics: Arc<Metrics>,
    max_backoff: Duration,
    /// Log chunks go straight to their readers, not through the lanes.
    log_hub: Arc<LogHub>,
    /// QoS 0 publishes handed to rumqttc and not yet written: with the QoS 1
    /// ones waiting for a packet id, what fills rumqttc's request queue.
    unsent_qos0: usize,
    /// Robots' `online: false` held until it is clear the broker is not
    /// going away with them.
    wills: Wills<Inbound>,
}

/// Opens (lazily) a connection to each broker. Returns the connections to
/// run, the publisher handle and one lane of robot queues per worker, which
/// every connection feeds. Each connection holds a robot's `online: false`
/// for `will_hold` (see [`crate::wills`]).
#[allow(clippy::too_many_arguments)]
pub fn connect(
    brokers: &[BrokerConfig],
    subscriptions: Vec<String>,
    workers: usize,
    limits: Limits,
    publish_timeout: Duration,
    max_backoff: Duration,
    will_hold: Duration,
    metrics: Arc<Metrics>,
    log_hub: Arc<LogHub>,
) -> Result<(Vec<Connection>, Publisher, Vec<Arc<Lane>>)> {
    if brokers.is_empty() {
        return Err(Error::Mqtt("no broker to connect to".to_owned()));
    }
    let mut seen = Vec::with_capacity(brokers.len());
    for broker in brokers {
        let url = BrokerUrl::parse(&broker.url).map_err(|e| Error::Mqtt(format!("broker URL {e}")))?;
        let at = (url.host.to_ascii_lowercase(), url.port);
        if seen.contains(&at) {
            // One client id twice on one broker: each connection would
            // take the session from the other.
            return Err(Error::Mqtt(format!("broker {} is listed twice", broker.url)));
        }
        seen.push(at);
    }
    let lanes: Vec<Arc<Lane>> = (0..workers.max(1)).map(|_| Arc::new(Lane::default())).collect();
    // With one broker there is nowhere else to send: no map of robots.
    let homes = Arc::new(Homes::default());
    let shared_homes = (brokers.len() > 1).then(|| homes.clone());
    let mut connections = Vec::with_capacity(brokers.len());
    let mut routes = Vec::with_capacity(brokers.len());
    for (index, broker) in brokers.iter().enumerate() {
        let options = mqtt_options(broker)?;
        let (client, mut eventloop) = AsyncClient::new(options, PUBLISH_QUEUE);
        k8s4r_mqtt::send_at_once(&mut eventloop);
        let (tx, requests) = mpsc::channel(PUBLISH_QUEUE);
        let (bulk_tx, bulk) = mpsc::channel(BULK_QUEUE);
        connections.push(Connection {
            url: broker.url.clone(),
            index,
            homes: shared_homes.clone(),
            client,
            eventloop,
            requests,
            bulk,
            subscriptions: subscriptions.clone(),
            lanes: lanes.clone(),
            limits,
            metrics: metrics.clone(),
            max_backoff,
            log_hub: log_hub.clone(),
            unsent_qos0: 0,
            wills: Wills::new(will_hold),
        });
        routes.push(Route { tx, bulk: bulk_tx });
    }
    metrics.set_mqtt_brokers(brokers.len());
    let publisher = Publisher {
        routes: routes.into(),
        homes,
        timeout: publish_timeout,
    };
    Ok((connections, publisher, lanes))
}

impl Connection {
    /// Polls the event loop until `shutdown`, reconnecting with capped backoff.
    pub async fn run(mut self, shutdown: CancellationToken) {
        let mut waiters = PacketIds::<Waiter>::default();
        let mut failures: u32 = 0;
        let mut connected = false;
        loop {
            let wills_due = self.wills.next_due().map(tokio::time::Instant::from_std);
            tokio::select! {
                _ = shutdown.cancelled() => {
                    for will in self.wills.drain() {
                        self.pass_on(will);
                    }
                    break;
                }
                event = self.eventloop.poll() => match event {
                    Ok(event) => {
                        if self.handle(event, &mut waiters, &mut connected) {
                            failures = 0;
                        }
                    }
                    Err(error) => {
                        if connected {
                            waiters.disconnected();
                            self.metrics.mqtt_connected(false);
                        }
                        connected = false;
                        self.forget_wills();
                        let delay = exponential(RECONNECT_BASE, self.max_backoff, failures);
                        failures = failures.saturating_add(1);
                        warn!(broker = %self.url, %error, retry_in = ?delay, "MQTT connection lost");
                        tokio::select! {
                            _ = shutdown.cancelled() => break,
                            _ = tokio::time::sleep(delay) => {}
                        }
                    }
                },
                _ = sleep_until_some(wills_due) => {
                    for will in self.wills.due(Instant::now()) {
                        if !self.left(robot_of(&will.topic)) {
                            self.pass_on(will);
                        }
                    }
                }
                Some(request) = self.requests.recv(), if self.queued(&waiters) < PUBLISH_QUEUE => {
                    self.hand_over(request, &mut waiters);
                }
                // Bulk only when no control publish waits: a robot's cancels
                // never delay another robot's confirmation.
                Some(request) = self.bulk.recv(), if self.queued(&waiters) < BULK_OUTSTANDING && self.requests.is_empty() => {
                    self.hand_over(request, &mut waiters);
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
        if connected {
            self.metrics.mqtt_connected(false);
        }
    }

    /// Publishes handed to rumqttc and not yet acknowledged (QoS 1) or
    /// written (QoS 0).
    fn queued(&self, waiters: &PacketIds<Waiter>) -> usize {
        waiters.outstanding() + self.unsent_qos0
    }

    /// Hands one publish to rumqttc: QoS 1 for one somebody waits on, whose
    /// PUBACK [`PacketIds`] matches to its waiter; QoS 0 otherwise (id 0,
    /// which `PacketIds` does not track).
    fn hand_over(&mut self, request: PublishRequest, waiters: &mut PacketIds<Waiter>) {
        let qos = if request.done.is_some() {
            QoS::AtLeastOnce
        } else {
            QoS::AtMostOnce
        };
        match self
            .client
            .try_publish(request.topic, qos, false, request.payload)
        {
            Ok(()) if qos == QoS::AtLeastOnce => waiters.handed_over(request.done),
            Ok(()) => self.unsent_qos0 += 1,
            Err(e) => match request.done {
                Some(done) => {
                    let _ = done.send(Err(format!("not queued: {e}")));
                }
                None => self.metrics.message_out("fire_and_forget", "failed"),
            },
        }
    }

    /// Hands a robot's message to its worker's lane.
    fn pass_on(&self, inbound: Inbound) {
        let robot = robot_of(&inbound.topic).to_owned();
        let lane = &self.lanes[worker_for(&inbound.topic, self.lanes.len())];
        if let Err(refusal) = lane.push(&robot, inbound, &self.limits) {
            debug!(robot, ?refusal, "robot message dropped");
            self.metrics.message_in("any", refusal.outcome());
        }
    }

    /// Whether `robot` was last heard on another of the server's brokers:
    /// then the presence this one holds (its last will there, or a retained
    /// one) is not the robot's word on where it is connected.
    fn left(&self, robot: &str) -> bool {
        let left = self
            .homes
            .as_ref()
            .is_some_and(|homes| homes.of(robot).is_some_and(|home| home != self.index));
        if left {
            debug!(robot, broker = %self.url, "presence from a broker the robot left");
            self.metrics.message_in("online", "stale_broker");
        }
        left
    }

    /// The broker connection dropped: the robots' last wills it held came
    /// from a broker going away, not from the robots.
    fn forget_wills(&mut self) {
        let robots = self.wills.connection_lost();
        if robots > 0 {
            info!(broker = %self.url, robots, "the broker went away: its robots' last wills held are not recorded");
            self.metrics
                .add_messages_in("online", "broker_went_away", robots as u64);
        }
    }

    /// A message from the broker: a log chunk to its reader, a robot's
    /// presence to the hold (`crate::wills`), the rest to its robot's lane.
    fn received(&mut self, publish: &rumqttc::Publish) {
        if (publish.topic.ends_with("/log") || publish.topic.ends_with("/out"))
            && self.log_hub.offer(&publish.topic, &publish.payload)
        {
            return;
        }
        let topic = publish.topic.clone();
        let robot = robot_of(&topic);
        if let Some(homes) = self.homes.as_ref().filter(|_| !robot.is_empty()) {
            if shows_home(&topic, publish.retain) {
                if let Some(before) = homes.heard(robot, self.index) {
                    info!(robot, broker = %self.url, before, "robot now on another broker");
                }
            } else if self.left(robot) {
                return;
            }
        }
        let said = presence(&topic, &publish.payload);
        let inbound = Inbound {
            topic: topic.clone(),
            payload: publish.payload.to_vec(),
            held_since: (said == Some(false)).then(jiff::Timestamp::now),
        };
        let offer = match said {
            Some(online) => self
                .wills
                .offer(robot, online, publish.retain, inbound, Instant::now()),
            None => Offer::Pass(inbound),
        };
        match offer {
            Offer::Pass(inbound) => self.pass_on(inbound),
            Offer::Held => {}
            Offer::Retained => {
                debug!(robot, broker = %self.url, "a retained last will: not recorded");
                self.metrics.message_in("online", "retained_offline");
            }
            Offer::Outage => {
                debug!(robot, broker = %self.url, "a last will of the broker's outage: not recorded");
                self.metrics.message_in("online", "broker_went_away");
            }
        }
    }

    /// Handles one event; returns true when the connection is (re)established.
    fn handle(&mut self, event: Event, waiters: &mut PacketIds<Waiter>, connected: &mut bool) -> bool {
        match event {
            Event::Incoming(Packet::ConnAck(ack)) => {
                info!(
                    broker = %self.url,
                    session_present = ack.session_present,
                    "connected to the MQTT broker"
                );
                if !*connected {
                    self.metrics.mqtt_connected(true);
                }
                *connected = true;
                self.wills.connected(Instant::now());
                self.metrics.mqtt_connection();
                if !ack.session_present {
                    for waiter in waiters.session_lost().into_iter().flatten() {
                        let _ = waiter.send(Err(
                            "the broker dropped the session before acknowledging".to_owned()
                        ));
                    }
                }
                let filters = self
                    .subscriptions
                    .iter()
                    .map(|f| SubscribeFilter::new(f.clone(), QoS::AtLeastOnce));
                if let Err(e) = self.client.try_subscribe_many(filters) {
                    warn!(broker = %self.url, error = %e, "could not queue the subscriptions");
                }
                return true;
            }
            Event::Incoming(Packet::Publish(publish)) => self.received(&publish),
            Event::Incoming(Packet::PubAck(ack)) => {
                if let Some(Some(waiter)) = waiters.acked(ack.pkid) {
                    let _ = waiter.send(Ok(()));
                }
            }
            Event::Incoming(Packet::SubAck(ack)) => {
                debug!(codes = ?ack.return_codes, "subscribed");
            }
            Event::Outgoing(Outgoing::Publish(0)) => self.unsent_qos0 = self.unsent_qos0.saturating_sub(1),
            Event::Outgoing(Outgoing::Publish(pkid)) => waiters.sent(pkid),
            Event::Outgoing(Outgoing::AwaitAck(_)) => waiters.collided(),
            _ => {}
        }
        false
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn tls_settings_are_checked_before_connecting() {
        let mut broker = BrokerConfig::new("mqtts://broker:8883", "s");
        let err = |b: &BrokerConfig| match mqtt_options(b) {
            Err(Error::Mqtt(reason)) => reason,
            other => panic!("{:?}", other.map(|_| ())),
        };
        assert!(err(&broker).contains("CA file"));
        broker.ca_file = Some("/nonexistent/ca.pem".into());
        assert!(err(&broker).contains("/nonexistent/ca.pem"));
        broker.client_cert = Some("/nonexistent/cert.pem".into());
        assert!(err(&broker).contains("client_key"));
        assert!(err(&BrokerConfig::new("tcp://broker", "s")).contains("mqtt://"));
        let plain = mqtt_options(&BrokerConfig::new("mqtt://localhost", "s")).unwrap();
        assert_eq!(plain.broker_address(), ("localhost".to_owned(), 1883));
        assert!(
            !plain.clean_session(),
            "a persistent session keeps robot messages"
        );
    }

    /// One broker's control and bulk queue, as its connection reads them.
    type Queues = (mpsc::Receiver<PublishRequest>, mpsc::Receiver<PublishRequest>);

    /// A publisher over `n` brokers, and each broker's queues.
    fn spread(n: usize) -> (Publisher, Vec<Queues>) {
        let (routes, queues): (Vec<_>, Vec<_>) = (0..n)
            .map(|_| {
                let (tx, rx) = mpsc::channel(4);
                let (bulk, bulk_rx) = mpsc::channel(4);
                (Route { tx, bulk }, (rx, bulk_rx))
            })
            .unzip();
        let publisher = Publisher {
            routes: routes.into(),
            homes: Arc::default(),
            timeout: Duration::from_secs(5),
        };
        (publisher, queues)
    }

    #[test]
    fn a_robot_is_sent_to_where_it_was_heard_and_everywhere_before() {
        let (publisher, mut queues) = spread(2);
        assert!(publisher.send("k8s4r/robots/rb1/response".into(), b"a".to_vec()));
        for (control, _) in &mut queues {
            assert_eq!(
                control.try_recv().unwrap().payload,
                b"a",
                "not heard yet: every broker"
            );
        }
        publisher.homes.heard("rb1", 1);
        assert!(publisher.send_bulk("k8s4r/robots/rb1/tasks/cancel".into(), b"b".to_vec()));
        assert!(queues[0].1.try_recv().is_err(), "not to the broker rb1 is not on");
        assert_eq!(queues[1].1.try_recv().unwrap().payload, b"b");
        assert!(publisher.send("k8s4r/robots/rb2/response".into(), b"c".to_vec()));
        assert!(
            queues.iter_mut().all(|(control, _)| control.try_recv().is_ok()),
            "rb2: everywhere"
        );
    }

    #[test]
    fn only_live_messages_other_than_presence_say_where_a_robot_is() {
        assert!(shows_home("k8s4r/robots/rb1/heartbeat", false));
        assert!(!shows_home("k8s4r/robots/rb1/heartbeat", true), "retained");
        assert!(!shows_home("k8s4r/robots/rb1/online", false), "a last will");
        let homes = Homes::default();
        assert_eq!(homes.heard("rb1", 0), None);
        assert_eq!(homes.heard("rb1", 0), None);
        assert_eq!(homes.heard("rb1", 1), Some(0), "moved");
        assert_eq!(homes.of("rb1"), Some(1));
    }

    #[tokio::test]
    async fn a_publish_to_every_broker_succeeds_when_one_acknowledged() {
        let (publisher, mut queues) = spread(2);
        let publish = tokio::spawn(async move {
            publisher
                .publish("k8s4r/robots/rb1/tasks/dispatch".into(), b"d".to_vec())
                .await
        });
        let _down = queues[0].0.recv().await.unwrap();
        let second = queues[1].0.recv().await.unwrap();
        let _ = second.done.unwrap().send(Ok(()));
        // The first broker never answers: the publish does not wait for it.
        let done = tokio::time::timeout(Duration::from_secs(1), publish).await;
        done.expect("not held up by a broker that does not answer")
            .unwrap()
            .expect("one broker acknowledged");
    }

    #[test]
    fn a_robot_always_goes_to_the_same_worker() {
        let a = worker_for("k8s4r/robots/rb1/heartbeat", 8);
        assert_eq!(a, worker_for("k8s4r/robots/rb1/tasks/u/status", 8));
        assert_eq!(worker_for("k8s4r/register", 8), worker_for("x", 8));
    }
}
