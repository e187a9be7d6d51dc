//! Clears retained messages on the robots' topics.
//!
//! The server never retains a message, and since the ACL lets a robot write
//! only its uplink (deploy/mosquitto/k8s4r.acl) no robot can retain a
//! command either. But a retained message lives in the broker until it is
//! replaced: one left by a robot before the ACL was tightened (a retained
//! dispatch, a retained "Online" answer), or by anyone with more rights,
//! would reach a robot at every subscription, however often the robot is
//! re-imaged or its password revoked. The agent ignores retained messages on
//! its command topics; this sweep removes them from the broker.
//!
//! A sweep connects as its own clean session (retained messages are not
//! sent to shared subscriptions, so the server's main connection never sees
//! them), subscribes to every topic under the prefix, and clears each
//! retained message it receives (an empty retained publish) except the
//! robots' `online` presence, which is retained by design. It ends once no
//! retained message has arrived for a moment.
//!
//! The same pass reads that presence: which robots the broker knows as
//! connected. The first sweep's answer is how a server that starts learns
//! which robots are there, rather than believing the `Connected` conditions
//! a previous run left (see [`crate::decide::absent_at_start`]).

use std::collections::HashSet;
use std::time::Duration;

use k8s4r_api::protocol::{decode, Online, Topic, TopicKind, Topics};
use rumqttc::{AsyncClient, Event, Packet, QoS};
use tokio::sync::oneshot;
use tokio_util::sync::CancellationToken;
use tracing::{info, warn};

use crate::config::BrokerConfig;
use crate::error::{Error, Result};
use crate::mqtt::mqtt_options;

/// How long a sweep waits for the next retained message before it ends.
const QUIET: Duration = Duration::from_secs(2);
/// The longest a sweep lasts.
const LONGEST: Duration = Duration::from_secs(120);
/// How soon a failed first sweep is tried again: the server's view of who
/// is connected waits for it.
const FIRST_RETRY: Duration = Duration::from_secs(5);
/// How many first sweeps may fail before the server gives up reading the
/// presence at start (robots' heartbeats then decide, as before).
const FIRST_TRIES: u32 = 12;
/// How often the server sweeps (and once at start).
pub const SWEEP_EVERY: Duration = Duration::from_secs(3600);

/// Whether a retained message on `topic` is one to keep.
fn keep(topics: &Topics, topic: &str) -> bool {
    matches!(
        topics.parse(topic),
        Ok(Topic::Robot {
            kind: TopicKind::Online,
            ..
        })
    )
}

/// The robot whose presence `topic` carries, if it does.
fn presence_of(topics: &Topics, topic: &str) -> Option<String> {
    match topics.parse(topic) {
        Ok(Topic::Robot {
            robot_id,
            kind: TopicKind::Online,
        }) => Some(robot_id),
        _ => None,
    }
}

/// What one sweep did and saw.
#[derive(Debug, Default)]
pub struct Swept {
    /// The topics whose retained message it cleared.
    pub cleared: Vec<String>,
    /// The robots whose presence said `online: true`.
    pub online: HashSet<String>,
}

/// One sweep.
pub async fn sweep(broker: &BrokerConfig, topics: &Topics) -> Result<Swept> {
    let mut options = mqtt_options(broker)?;
    options.set_client_id(format!("{}-sweep", broker.client_id));
    options.set_clean_session(true);
    let (client, mut events) = AsyncClient::new(options, 64);
    let filter = format!("{}/#", topics.prefix());
    let mut swept = Swept::default();
    let mut subscribed = false;
    let started = tokio::time::Instant::now();
    loop {
        let event = tokio::time::timeout(QUIET, events.poll()).await;
        let event = match event {
            // Quiet since the subscription: every retained message came.
            Err(_) if subscribed => break,
            Err(_) => continue,
            Ok(Err(e)) => return Err(Error::Mqtt(format!("sweeping retained messages: {e}"))),
            Ok(Ok(event)) => event,
        };
        match event {
            Event::Incoming(Packet::ConnAck(_)) => {
                client
                    .try_subscribe(filter.clone(), QoS::AtMostOnce)
                    .map_err(|e| Error::Mqtt(e.to_string()))?;
            }
            // Refused (an ACL): nothing is seen, and no presence may be
            // read from that silence.
            Event::Incoming(Packet::SubAck(ack))
                if ack
                    .return_codes
                    .iter()
                    .any(|c| matches!(c, rumqttc::SubscribeReasonCode::Failure)) =>
            {
                let _ = client.try_disconnect();
                return Err(Error::Mqtt(format!(
                    "the broker refused a subscription to {filter}"
                )));
            }
            Event::Incoming(Packet::SubAck(_)) => subscribed = true,
            // Retained, or said live since the subscription: both are the
            // robot's latest word on its connection.
            Event::Incoming(Packet::Publish(p)) if keep(topics, &p.topic) => {
                if let Some(robot) = presence_of(topics, &p.topic) {
                    match decode::<Online>(&p.payload) {
                        Ok(presence) if presence.online => {
                            swept.online.insert(robot);
                        }
                        _ => {
                            swept.online.remove(&robot);
                        }
                    }
                }
            }
            Event::Incoming(Packet::Publish(p))
                if p.retain && !p.payload.is_empty() && !keep(topics, &p.topic) =>
            {
                warn!(topic = %p.topic, bytes = p.payload.len(), "clearing a retained message on a robot topic");
                client
                    .try_publish(p.topic.clone(), QoS::AtLeastOnce, true, Vec::new())
                    .map_err(|e| Error::Mqtt(e.to_string()))?;
                swept.cleared.push(p.topic.clone());
            }
            _ => {}
        }
        if started.elapsed() > LONGEST {
            break;
        }
    }
    // The clearing publishes go out before the DISCONNECT.
    let _ = client.try_disconnect();
    let flush = async {
        while let Ok(event) = events.poll().await {
            if matches!(event, Event::Outgoing(rumqttc::Outgoing::Disconnect)) {
                break;
            }
        }
    };
    let _ = tokio::time::timeout(Duration::from_secs(5), flush).await;
    Ok(swept)
}

/// One sweep of each broker at once, their presence together (a robot is
/// connected to one of them). Fails when any of them failed: a broker not
/// read would make its robots look absent.
pub async fn sweep_all(brokers: &[BrokerConfig], topics: &Topics) -> Result<Swept> {
    let each = futures::future::join_all(brokers.iter().map(|broker| sweep(broker, topics))).await;
    let mut all = Swept::default();
    for swept in each {
        let swept = swept?;
        all.cleared.extend(swept.cleared);
        all.online.extend(swept.online);
    }
    Ok(all)
}

/// Sweeps every broker at start and every [`SWEEP_EVERY`] until
/// `shutdown`; the first successful sweep's presence goes to `presence`.
pub async fn run(
    brokers: Vec<BrokerConfig>,
    topics: Topics,
    presence: oneshot::Sender<HashSet<String>>,
    shutdown: CancellationToken,
) {
    let mut presence = Some(presence);
    let mut tries = 0;
    loop {
        match sweep_all(&brokers, &topics).await {
            Ok(swept) => {
                if !swept.cleared.is_empty() {
                    info!(
                        count = swept.cleared.len(),
                        "cleared retained messages on robot topics"
                    );
                }
                if let Some(tx) = presence.take() {
                    let _ = tx.send(swept.online);
                }
            }
            Err(error) => {
                warn!(%error, "could not sweep retained messages");
                tries += 1;
                if presence.is_some() && tries >= FIRST_TRIES {
                    warn!("gave up reading which robots the broker knows as connected");
                    presence = None;
                }
            }
        }
        tokio::select! {
            () = shutdown.cancelled() => return,
            () = tokio::time::sleep(if presence.is_some() { FIRST_RETRY } else { SWEEP_EVERY }) => {}
        }
    }
}
