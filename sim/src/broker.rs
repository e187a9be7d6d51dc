//! An MQTT broker as a state machine, for the deterministic simulation of
//! the fleet: it takes one input (a client connects, publishes,
//! acknowledges, goes away) and returns what the broker sends, with no
//! sockets, no clock and no randomness, so that one seed gives one history.
//!
//! It keeps the rules of MQTT 3.1.1 that the protocol's safety leans on,
//! as Mosquitto applies them:
//!
//! - **QoS 1 is at least once.** A delivery stays in flight until the
//!   client's PUBACK; a client that reconnects to its persistent session
//!   gets every unacknowledged one again, marked DUP, before anything new.
//! - **Persistent sessions** (`clean_session = false`) keep their
//!   subscriptions and queue QoS 1 messages while the client is away; a
//!   clean session starts empty and is dropped at disconnect. A new
//!   connection with a client id already connected takes the session over:
//!   the old connection is closed without a DISCONNECT, so its will is
//!   published first (MQTT 3.1.1, 3.1.2.5 and 3.1.4; Mosquitto does so).
//! - **Order.** Each client receives the messages of one publisher in the
//!   order they were published (the broker never reorders within a
//!   session); redeliveries come first, in their original order.
//! - **Retained messages**: the last retained message on a topic goes to
//!   every new subscription that matches it; an empty retained payload
//!   clears it.
//! - **The last will** is published when a connection ends without a
//!   DISCONNECT.
//! - **Shared subscriptions** (`$share/group/filter`): each message goes to
//!   one connected member of the group, in turn.
//!
//! What it leaves out: QoS 2, topic aliases and other MQTT 5 features, and
//! ACLs (the simulation's clients only speak on their own topics).

use std::collections::{BTreeMap, VecDeque};

/// A client's id, as in CONNECT.
pub type ClientId = String;

/// A message as published.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Message {
    pub topic: String,
    pub payload: Vec<u8>,
    /// 0 or 1 (2 is not modelled).
    pub qos: u8,
    pub retain: bool,
}

/// What happens to the broker.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Input {
    /// A client's CONNECT.
    Connect {
        client: ClientId,
        clean_session: bool,
        will: Option<Message>,
    },
    /// The connection ended: with a DISCONNECT (`graceful`) or not (a cut
    /// link, a killed process, a keep-alive that ran out).
    Disconnect { client: ClientId, graceful: bool },
    /// SUBSCRIBE to one filter, at most at `qos`.
    Subscribe {
        client: ClientId,
        filter: String,
        qos: u8,
    },
    /// PUBLISH from a client (its PUBACK is not modelled: the broker has it
    /// once this input is taken).
    Publish { client: ClientId, message: Message },
    /// The client's PUBACK of a delivery.
    Ack { client: ClientId, packet_id: u16 },
}

/// What the broker sends.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Output {
    /// CONNACK; `session_present` when a persistent session was resumed.
    ConnAck { client: ClientId, session_present: bool },
    /// A PUBLISH to a client (`packet_id` 0 for QoS 0).
    Deliver {
        client: ClientId,
        packet_id: u16,
        dup: bool,
        message: Message,
    },
    /// The broker closed a client's older connection (taken over).
    Closed { client: ClientId },
}

#[derive(Clone, Debug, Default)]
struct Session {
    connected: bool,
    persistent: bool,
    will: Option<Message>,
    subscriptions: BTreeMap<String, u8>,
    /// Sent and not yet acknowledged, by packet id, in the order sent.
    in_flight: VecDeque<(u16, Message)>,
    /// QoS 1 messages that arrived while the client was away.
    queued: VecDeque<Message>,
    next_packet_id: u16,
}

impl Session {
    /// Sends `message` to this session's connected client: a QoS 1 one with
    /// a fresh packet id, kept in flight until its PUBACK.
    fn send(&mut self, client: &str, message: Message, out: &mut Vec<Output>) {
        let packet_id = match message.qos {
            0 => 0,
            _ => {
                let id = self.packet_id();
                self.in_flight.push_back((id, message.clone()));
                id
            }
        };
        out.push(Output::Deliver {
            client: client.to_owned(),
            packet_id,
            dup: false,
            message,
        });
    }

    fn packet_id(&mut self) -> u16 {
        // 1..=65535, skipping ids still in flight (MQTT forbids reusing one).
        loop {
            self.next_packet_id = self.next_packet_id.checked_add(1).unwrap_or(1);
            let id = self.next_packet_id;
            if !self.in_flight.iter().any(|(p, _)| *p == id) {
                return id;
            }
        }
    }
}

/// The broker's whole state.
#[derive(Clone, Debug, Default)]
pub struct Broker {
    sessions: BTreeMap<ClientId, Session>,
    retained: BTreeMap<String, Message>,
    /// The next member of each shared group to receive, by `$share` filter.
    turns: BTreeMap<String, usize>,
}

impl Broker {
    /// Takes one input and returns what the broker sends, in order.
    pub fn handle(&mut self, input: Input) -> Vec<Output> {
        let mut out = Vec::new();
        match input {
            Input::Connect {
                client,
                clean_session,
                will,
            } => self.connect(client, clean_session, will, &mut out),
            Input::Disconnect { client, graceful } => self.disconnect(&client, graceful, &mut out),
            Input::Subscribe { client, filter, qos } => self.subscribe(client, filter, qos, &mut out),
            Input::Publish { client: _, message } => self.publish(message, &mut out),
            Input::Ack { client, packet_id } => {
                if let Some(session) = self.sessions.get_mut(&client) {
                    session.in_flight.retain(|(p, _)| *p != packet_id);
                }
            }
        }
        out
    }

    /// The broker started again from `saved`, what its persistence file
    /// held (Mosquitto's `persistence true`: written at each
    /// `autosave_interval` and at a clean stop, so a crash loses what came
    /// since the last save). Persistent sessions come back with their
    /// subscriptions, the deliveries not yet acknowledged (sent again, as
    /// DUP, when the client reconnects) and the messages queued for them,
    /// and so do retained messages; no client is connected, clean
    /// sessions are gone, and no will is published: a broker that stops
    /// sends none.
    pub fn restarted(saved: &Broker) -> Broker {
        let mut broker = saved.clone();
        broker.sessions.retain(|_, s| s.persistent);
        for session in broker.sessions.values_mut() {
            session.connected = false;
            session.will = None;
        }
        broker.turns.clear();
        broker
    }

    /// Whether `client` is connected now.
    pub fn is_connected(&self, client: &str) -> bool {
        self.sessions.get(client).is_some_and(|s| s.connected)
    }

    /// Messages held for `client`: in flight and queued.
    pub fn pending(&self, client: &str) -> usize {
        self.sessions
            .get(client)
            .map_or(0, |s| s.in_flight.len() + s.queued.len())
    }

    fn connect(&mut self, client: ClientId, clean: bool, will: Option<Message>, out: &mut Vec<Output>) {
        if self.sessions.get(&client).is_some_and(|s| s.connected) {
            out.push(Output::Closed {
                client: client.clone(),
            });
            let will = self.sessions.get_mut(&client).and_then(|s| s.will.take());
            if let Some(will) = will {
                self.publish(will, out);
            }
        }
        if clean {
            self.sessions.remove(&client);
        }
        let present = !clean && self.sessions.contains_key(&client);
        let session = self.sessions.entry(client.clone()).or_default();
        session.connected = true;
        session.persistent = !clean;
        session.will = will;
        out.push(Output::ConnAck {
            client: client.clone(),
            session_present: present,
        });
        // Unacknowledged deliveries again, in their order, then what waited.
        for (packet_id, message) in &session.in_flight {
            out.push(Output::Deliver {
                client: client.clone(),
                packet_id: *packet_id,
                dup: true,
                message: message.clone(),
            });
        }
        while let Some(message) = session.queued.pop_front() {
            session.send(&client, message, out);
        }
    }

    fn disconnect(&mut self, client: &str, graceful: bool, out: &mut Vec<Output>) {
        let Some(session) = self.sessions.get_mut(client) else {
            return;
        };
        if !session.connected {
            return;
        }
        session.connected = false;
        let will = session.will.take();
        if !session.persistent {
            self.sessions.remove(client);
        }
        if let Some(will) = will.filter(|_| !graceful) {
            self.publish(will, out);
        }
    }

    fn subscribe(&mut self, client: ClientId, filter: String, qos: u8, out: &mut Vec<Output>) {
        let Some(session) = self.sessions.get_mut(&client) else {
            return;
        };
        session.subscriptions.insert(filter.clone(), qos.min(1));
        // Retained messages go to a new subscription (not to a shared one,
        // as MQTT 5 says and Mosquitto does).
        if shared(&filter).is_some() {
            return;
        }
        let retained: Vec<Message> = self
            .retained
            .values()
            .filter(|m| matches(&filter, &m.topic))
            .cloned()
            .collect();
        for message in retained {
            self.deliver(&client, message, qos.min(1), out);
        }
    }

    fn publish(&mut self, message: Message, out: &mut Vec<Output>) {
        if message.retain {
            if message.payload.is_empty() {
                self.retained.remove(&message.topic);
            } else {
                self.retained.insert(message.topic.clone(), message.clone());
            }
        }
        // Each plain subscriber once (at the highest QoS of its matching
        // filters); each shared group once, to its next connected member.
        let mut plain: BTreeMap<ClientId, u8> = BTreeMap::new();
        let mut groups: BTreeMap<String, Vec<(ClientId, u8)>> = BTreeMap::new();
        for (client, session) in &self.sessions {
            for (filter, qos) in &session.subscriptions {
                match shared(filter) {
                    Some(inner) if matches(inner, &message.topic) && session.connected => {
                        groups
                            .entry(filter.clone())
                            .or_default()
                            .push((client.clone(), *qos));
                    }
                    Some(_) => {}
                    None if matches(filter, &message.topic) => {
                        let best = plain.entry(client.clone()).or_insert(0);
                        *best = (*best).max(*qos);
                    }
                    None => {}
                }
            }
        }
        let delivery = Message {
            retain: false,
            ..message
        };
        for (client, qos) in plain {
            self.deliver(&client, delivery.clone(), qos, out);
        }
        for (filter, members) in groups {
            let turn = self.turns.entry(filter).or_insert(0);
            let (client, qos) = members[*turn % members.len()].clone();
            *turn = turn.wrapping_add(1);
            self.deliver(&client, delivery.clone(), qos, out);
        }
    }

    fn deliver(&mut self, client: &str, message: Message, subscribed: u8, out: &mut Vec<Output>) {
        let Some(session) = self.sessions.get_mut(client) else {
            return;
        };
        let qos = message.qos.min(subscribed);
        let message = Message { qos, ..message };
        if !session.connected {
            // QoS 0 is dropped for an absent client; QoS 1 waits for it.
            if qos == 1 && session.persistent {
                session.queued.push_back(message);
            }
            return;
        }
        session.send(client, message, out);
    }
}

/// The filter inside `$share/<group>/<filter>`.
fn shared(filter: &str) -> Option<&str> {
    let rest = filter.strip_prefix("$share/")?;
    rest.split_once('/').map(|(_, inner)| inner)
}

/// Whether `topic` matches `filter` (`+` one level, `#` the rest, which
/// includes the parent level); `$`-topics match only filters that name
/// their first level.
pub fn matches(filter: &str, topic: &str) -> bool {
    if topic.starts_with('$') && !filter.starts_with('$') {
        return false;
    }
    let mut levels = topic.split('/');
    for part in filter.split('/') {
        match part {
            "#" => return true,
            "+" => {
                if levels.next().is_none() {
                    return false;
                }
            }
            name => {
                if levels.next() != Some(name) {
                    return false;
                }
            }
        }
    }
    levels.next().is_none()
}

#[cfg(test)]
mod tests;
