//! Which QoS 1 publish a PUBACK acknowledges.
//!
//! rumqttc tells its user only the packet id of each outgoing publish
//! (`Outgoing::Publish(pkid)`), in the order it takes requests off its
//! channel, and later `PubAck(pkid)`. A program that hands every QoS 1
//! publish over from one task can therefore match the n-th
//! `Outgoing::Publish` to the n-th publish handed over, and follow it by
//! packet id from then on. [`PacketIds`] keeps that matching, with a tag of
//! the caller's choosing per publish (an outbox id, a waiter to wake).
//!
//! Two rumqttc habits are covered: when all packet ids are in use it
//! reports `Outgoing::AwaitAck` and sends that publish later ([`collided`]);
//! after a connection error it retransmits what was in flight under the
//! same ids, and what was still queued is lost with the session if the
//! broker kept none ([`disconnected`], [`session_lost`]).
//!
//! [`collided`]: PacketIds::collided
//! [`disconnected`]: PacketIds::disconnected
//! [`session_lost`]: PacketIds::session_lost

use std::collections::{HashMap, VecDeque};

/// QoS 1 publishes between hand-over and PUBACK, each with its tag.
#[derive(Debug)]
pub struct PacketIds<T> {
    /// Handed to the client, waiting for their packet id, oldest first.
    handed: VecDeque<T>,
    /// Sent, waiting for PUBACK.
    inflight: HashMap<u16, T>,
    /// Handed over, but held back by the client until a packet id frees up.
    collided: Option<T>,
    /// How many of `handed` were queued in the client when the connection
    /// failed: the client keeps them for the next connection, where they are
    /// lost if the broker has no session for us.
    at_risk: usize,
}

impl<T> Default for PacketIds<T> {
    fn default() -> Self {
        Self {
            handed: VecDeque::new(),
            inflight: HashMap::new(),
            collided: None,
            at_risk: 0,
        }
    }
}

impl<T> PacketIds<T> {
    /// A publish tagged `tag` was handed to the client.
    pub fn handed_over(&mut self, tag: T) {
        self.handed.push_back(tag);
    }

    /// The client refused the publish handed over last (its request
    /// channel was full): it will never get a packet id.
    pub fn withdraw_last(&mut self) -> Option<T> {
        self.handed.pop_back()
    }

    /// The client sent a publish with this packet id. Id 0 (QoS 0) and the
    /// retransmission of an id already in flight change nothing.
    pub fn sent(&mut self, pkid: u16) {
        if pkid == 0 || self.inflight.contains_key(&pkid) {
            return;
        }
        let tag = self.collided.take().or_else(|| {
            self.at_risk = self.at_risk.saturating_sub(1);
            self.handed.pop_front()
        });
        match tag {
            Some(tag) => {
                self.inflight.insert(pkid, tag);
            }
            None => tracing::warn!(pkid, "an outgoing publish that nobody handed over"),
        }
    }

    /// The client holds the next publish back until a packet id frees up.
    pub fn collided(&mut self) {
        if self.collided.is_none() {
            self.at_risk = self.at_risk.saturating_sub(1);
            self.collided = self.handed.pop_front();
        }
    }

    /// The broker acknowledged this packet id: the tag it was sent with.
    pub fn acked(&mut self, pkid: u16) -> Option<T> {
        self.inflight.remove(&pkid)
    }

    /// The connection failed; the client keeps what it held for the next one.
    pub fn disconnected(&mut self) {
        self.at_risk = self.handed.len();
    }

    /// The broker answered a reconnect without our session: what was in
    /// flight, and what was queued when the connection failed, is gone.
    /// Returns those tags, oldest first where the order is known.
    pub fn session_lost(&mut self) -> Vec<T> {
        let mut lost: Vec<T> = self.inflight.drain().map(|(_, tag)| tag).collect();
        lost.extend(self.collided.take());
        let queued = self.at_risk.min(self.handed.len());
        lost.extend(self.handed.drain(..queued));
        self.at_risk = 0;
        lost
    }

    /// Forgets everything (the caller will send it all again).
    pub fn clear(&mut self) {
        self.handed.clear();
        self.inflight.clear();
        self.collided = None;
        self.at_risk = 0;
    }

    /// Publishes handed over or sent and not yet acknowledged.
    pub fn outstanding(&self) -> usize {
        self.handed.len() + self.inflight.len() + usize::from(self.collided.is_some())
    }

    /// Whether nothing waits for the broker.
    pub fn is_empty(&self) -> bool {
        self.outstanding() == 0
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn acks_find_their_publish_by_packet_id() {
        let mut ids = PacketIds::default();
        ids.handed_over("a");
        ids.handed_over("b");
        ids.sent(0); // QoS 0: not ours
        ids.sent(7);
        ids.sent(8);
        assert_eq!(ids.acked(8), Some("b"));
        assert_eq!(ids.acked(8), None, "one ack per publish");
        assert_eq!(ids.acked(7), Some("a"));
        assert!(ids.is_empty());
    }

    #[test]
    fn a_collision_is_sent_once_an_id_frees_up() {
        let mut ids = PacketIds::default();
        ids.handed_over("a");
        ids.handed_over("b");
        ids.collided();
        ids.sent(1);
        assert_eq!(ids.acked(1), Some("a"), "the held-back publish goes first");
        ids.sent(2);
        assert_eq!(ids.acked(2), Some("b"));
    }

    #[test]
    fn a_resumed_session_keeps_everything_a_new_one_loses_what_was_sent() {
        let mut ids = PacketIds::default();
        ids.handed_over("a");
        ids.handed_over("b");
        ids.sent(1);
        ids.disconnected(); // b was queued in the client
        ids.handed_over("c"); // c is still on its way to the client
        ids.sent(1); // retransmission of a
        ids.sent(2); // b
        assert_eq!(ids.acked(1), Some("a"));
        let mut lost = ids.session_lost();
        lost.sort();
        assert_eq!(lost, vec!["b"], "c is still to be sent");
        ids.sent(3);
        assert_eq!(ids.acked(3), Some("c"));
    }
}
