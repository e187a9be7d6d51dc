//! What the robot tells the cluster: registrations and heartbeats with the
//! attempts it holds, its status updates through the outbox, and the
//! timers that send them (heartbeats within every fenced attempt's
//! `stopAfter`, statuses again when their confirmation is late), with the
//! robot's own fence stopping attempts whose contact ran out.

use std::time::Duration;

use k8s4r_api::protocol::{encode, Heartbeat, HeldList, Register, StatusUpdate, MAX_HELD_ATTEMPTS};
use k8s4r_api::{TaskReason, TaskState};
use rumqttc::QoS;
use tokio::sync::watch;
use tokio::time::Instant;

use super::upgrades::UpgradeHooks;
use super::worker::TaskCommand;
use super::{boot_clock, Session};
use crate::facts::FactsNow;
use crate::link::{RegisterAction, Tag};
use crate::supervisor::outcome::StopCause;

/// The shortest time between two heartbeats a change of facts sends early:
/// a robot whose facts flap costs the cluster at most five a second.
const FACTS_EVERY: Duration = Duration::from_millis(200);

/// Resolves when the facts changed; pending forever without facts (or once
/// their reader is gone).
pub(super) async fn facts_changed(facts: &mut Option<watch::Receiver<FactsNow>>) -> Option<()> {
    match facts {
        Some(rx) => match rx.changed().await {
            Ok(()) => Some(()),
            Err(_) => std::future::pending().await,
        },
        None => std::future::pending().await,
    }
}

impl Session {
    /// The facts changed: the supervisor checks tasks against them, and a
    /// heartbeat carries them now (at most one per [`FACTS_EVERY`]).
    pub(super) fn on_facts(&mut self, now: Instant) {
        let Some(rx) = self.facts.as_mut() else {
            return;
        };
        let facts = rx.borrow_and_update().facts.clone();
        let _ = self.commands.send(TaskCommand::Facts(facts));
        let Some(next) = self.next_heartbeat else {
            // Not registered yet: the first heartbeat carries them.
            return;
        };
        let soonest = self.facts_sent.map_or(now, |sent| (sent + FACTS_EVERY).max(now));
        self.next_heartbeat = Some(next.min(soonest));
    }

    /// The attempts this robot holds, for register and heartbeat: those it
    /// runs or was given, and those whose final status is not settled yet
    /// (so the server never fails a Task whose result is on its way); and
    /// whether that is all of them (the protocol bounds the list).
    pub(super) fn holding(&mut self) -> (Vec<k8s4r_api::TaskAttempt>, bool) {
        let mut held: Vec<k8s4r_api::TaskAttempt> = self.running.to_vec();
        let mut listed: std::collections::HashSet<(String, u32)> =
            held.iter().map(|a| (a.uid.clone(), a.attempt)).collect();
        for (_, update) in self.outbox.iter() {
            if listed.insert((update.task_uid.clone(), update.attempt)) {
                held.push(k8s4r_api::TaskAttempt::new(
                    update.task_uid.clone(),
                    update.attempt,
                ));
            }
        }
        // Names of uids no longer held are forgotten.
        let uids: std::collections::HashSet<&str> = listed.iter().map(|(u, _)| u.as_str()).collect();
        self.names.retain(|uid, _| uids.contains(uid.as_str()));
        for attempt in &mut held {
            attempt.name = self.names.get(&attempt.uid).cloned();
        }
        let complete = held.len() <= MAX_HELD_ATTEMPTS;
        if !complete {
            tracing::warn!(
                held = held.len(),
                limit = MAX_HELD_ATTEMPTS,
                "holding more attempts than one message lists; reporting the first ones as incomplete"
            );
            held.truncate(MAX_HELD_ATTEMPTS);
        }
        (held, complete)
    }

    pub(super) fn register(&mut self) {
        let (running, complete) = self.holding();
        let register = Register {
            token: self.token.clone(),
            drivers: self.offer.drivers.clone(),
            labels: self.labels.clone(),
            held: HeldList {
                running,
                reconcile: complete,
                last_seq: self.outbox.peek_seq().checked_sub(1),
            },
            nonce: Some(self.registrar.next_nonce()),
            task_policy: Some(self.offer.policy.clone()),
            health: Some(self.current_health()),
            upgrade: self.upgrades.as_ref().and_then(UpgradeHooks::report),
            ..Register::new(&self.robot_id, crate::version(), self.device.clone())
        };
        tracing::info!(running = self.running.len(), "registering");
        self.publish_control(&self.topics.register(&self.robot_id), encode(&register), false);
    }

    pub(super) fn publish_control(&mut self, topic: &str, payload: Vec<u8>, retain: bool) {
        if !self.link.is_connected() {
            return;
        }
        match self.client.try_publish(topic, QoS::AtLeastOnce, retain, payload) {
            Ok(()) => self.link.handed_over(Tag::Control),
            Err(e) => tracing::warn!(topic, error = %e, "cannot queue a publish; it will be retried"),
        }
    }

    /// Hands outbox entries to the client, oldest first, while there is room.
    pub(super) fn pump(&mut self) {
        while self.link.has_room() {
            let Some((id, update)) = self.outbox.first_from(self.link.cursor()) else {
                break;
            };
            let topic = self.topics.status(&self.robot_id, &update.task_uid);
            match self
                .client
                .try_publish(topic, QoS::AtLeastOnce, false, encode(update))
            {
                Ok(()) => self.link.handed_over(Tag::Status(id)),
                // The request channel is full; PUBACKs will make room.
                Err(_) => break,
            }
        }
    }

    #[tracing::instrument(skip_all, fields(task = %update.task_uid, attempt = update.attempt))]
    pub(super) fn on_update(&mut self, mut update: StatusUpdate) {
        if update.state.is_terminal() {
            self.running.remove(&update.task_uid, update.attempt);
            if self.fence.release(&update.task_uid, update.attempt)
                && update.reason == Some(TaskReason::Cancelled)
            {
                update.reason = Some(TaskReason::Disconnected);
            }
        } else if update.state == TaskState::Running {
            self.running.insert(&update.task_uid, update.attempt);
        }
        tracing::info!(task = %update.task_uid, attempt = update.attempt, state = update.state.as_str(), "status");
        if update.task_name.is_none() {
            update.task_name = self.names.get(&update.task_uid).cloned();
        }
        match self.outbox.push(update.clone()) {
            Ok(_) => self.pump(),
            Err(e) => {
                // Without a disk the update still goes out and waits for the
                // server's confirmation in memory; it just would not survive
                // a restart. Its seq is its own, never reused.
                tracing::error!(error = %e, seq = e.seq, "cannot journal a status update; keeping it in memory");
                self.pump();
            }
        }
    }

    /// A fenced attempt with this `stopAfter` was admitted: heartbeats go
    /// several times within it from now on, the first at once when contact
    /// is older than a quarter of it, so that one lost heartbeat never
    /// stops it.
    pub(super) fn heartbeat_for(&mut self, lease: Duration, now: Duration) {
        let every = self.heartbeat_interval.min(lease / 4);
        let soon = if self.fence.contact_age(now).is_none_or(|age| age > lease / 4) {
            Instant::now()
        } else {
            Instant::now() + every
        };
        self.next_heartbeat = Some(self.next_heartbeat.map_or(soon, |at| at.min(soon)));
    }

    pub(super) fn on_tick(&mut self, now: Instant, running: bool) {
        if self.registrar.tick(now.into_std()) == RegisterAction::Register {
            tracing::info!(last_phase = ?self.registrar.last_phase(), "no approval yet; registering again");
            self.register();
        }
        if let Some(at) = self.next_heartbeat {
            if now >= at && running {
                self.heartbeat();
                // Confirmed heartbeats are the contact that keeps attempts
                // running (and lets waiting ones start): several per
                // shortest stopAfter.
                let waiting = self
                    .held
                    .iter()
                    .filter_map(|d| d.stop_after.as_ref()?.parse().ok());
                let every = match self.fence.shortest_lease().into_iter().chain(waiting).min() {
                    Some(lease) => self.heartbeat_interval.min(lease / 4),
                    None => self.heartbeat_interval,
                };
                self.next_heartbeat = Some(now + self.jitter.spread(every, 0.1));
            }
        }
        for (uid, attempt, stop_after) in self.fence.due(boot_clock()) {
            tracing::warn!(task = %uid, attempt, ?stop_after, "no contact with the cluster for the attempt's stopAfter: stopping it");
            let reason = format!(
                "stopped by the robot: no contact with the cluster for {}s (disconnect.stopAfter)",
                stop_after.as_secs()
            );
            let _ = self.commands.send(TaskCommand::Stop {
                uid,
                attempt: Some(attempt),
                cause: StopCause::Disconnected(reason),
            });
        }
        let stale = self
            .delivered
            .values()
            .any(|at| now.saturating_duration_since(*at) >= self.confirm_timeout);
        if stale && self.link.is_connected() {
            tracing::info!(
                unconfirmed = self.delivered.len(),
                "the server did not confirm statuses in time; sending them again"
            );
            self.delivered.clear();
            self.link.rewind();
        }
        // A full request channel earlier may have left entries behind.
        self.pump();
    }

    pub(super) fn heartbeat(&mut self) {
        if !self.link.is_connected() {
            return;
        }
        self.heartbeat_seq += 1;
        let (running, complete) = self.holding();
        let usage = self
            .usage
            .for_heartbeat(self.heartbeat_seq, self.sampler.sample());
        let heartbeat = Heartbeat {
            held: HeldList {
                running,
                reconcile: complete,
                last_seq: self.outbox.peek_seq().checked_sub(1),
            },
            server_time: self.fence.server_now(boot_clock()),
            health: Some(self.current_health()),
            session: Some(self.session_id.clone()),
            facts: self.facts.as_ref().map(|rx| rx.borrow().facts.clone()),
            upgrade: self
                .upgrades
                .as_ref()
                .and_then(|h| h.report_in_heartbeat(self.heartbeat_seq)),
            usage,
            ..Heartbeat::new(
                &self.robot_id,
                self.heartbeat_seq,
                jiff::Timestamp::now(),
                Default::default(),
            )
        };
        self.fence.heartbeat_sent(self.heartbeat_seq, boot_clock());
        if self.facts.is_some() {
            self.facts_sent = Some(Instant::now());
        }
        let topic = self.topics.heartbeat(&self.robot_id);
        self.publish_control(&topic, encode(&heartbeat), false);
    }
}
