//! What the robot tells the cluster: registrations and heartbeats with the
//! attempts it holds, its status updates through the outbox, and the
//! timers that send them (heartbeats within every fenced attempt's
//! `stopAfter`, statuses again when their confirmation is late), with the
//! robot's own fence stopping attempts whose contact ran out.

use std::collections::BTreeSet;
use std::time::Duration;

use k8s4r_api::protocol::{encode, Heartbeat, HeldList, Register, StatusUpdate, MAX_HELD_ATTEMPTS};
use k8s4r_api::{RestartStatus, TaskAttempt, TaskReason, TaskState};

use super::{Command, Core, Disk, Now, Payload};
use crate::link::{RegisterAction, Tag};
use crate::supervisor::outcome::StopCause;

impl Core {
    /// A status update of an attempt (from the supervisor, or the core's
    /// own for an attempt that never started): journaled, then sent.
    ///
    /// A report that an attempt runs (its start, a restart, a change of
    /// configuration) waits `status_hold` first, and what the attempt
    /// reports meanwhile is merged into it: an attempt that ends within
    /// the hold is reported once, with its end, which costs the cluster
    /// one status write instead of two and no Lease renewal (the robot no
    /// longer holds work when the cluster hears of it). The robot lists
    /// the attempt as held all along. A held report is no promise anyone
    /// waits for: to the cluster it is a report the network delayed, which
    /// the protocol allows for anyway (docs/fencing.md). Only the latest
    /// output of a running attempt is never held.
    pub fn status(&mut self, update: StatusUpdate, now: Now, disk: &mut dyn Disk) -> Vec<Command> {
        let mut out = Vec::new();
        if update.state == TaskState::Running {
            let key = (update.task_uid.clone(), update.attempt);
            if let Some((held, due)) = self.held_reports.remove(&key) {
                self.held_reports.insert(key, (merged(update, held), due));
                return out;
            }
            if !output_only(&update) && !self.status_hold.is_zero() && !self.leaving {
                self.running.insert(&update.task_uid, update.attempt);
                self.held_reports
                    .insert(key, (update, now.mono + self.status_hold));
                return out;
            }
        }
        self.status_into(update, disk, &mut out);
        out
    }

    pub(super) fn status_into(&mut self, update: StatusUpdate, disk: &mut dyn Disk, out: &mut Vec<Command>) {
        // A running attempt's latest output is for the cluster to show
        // while the robot cannot be asked: made while the link is down,
        // only the latest of each attempt is kept, in memory, and goes
        // when the link is back (the supervisor sends a tail only when it
        // changed), not a burst of them behind what matters.
        if output_only(&update) && !self.link.is_connected() {
            let key = (update.task_uid.clone(), update.attempt);
            self.unsent_output.insert(key, update);
            return;
        }
        self.record(update, disk, out);
    }

    /// Journals a status and sends what the link has room for. A held
    /// report comes here straight: it may carry output merged into it, but
    /// it is an attempt's start and must not be kept only in memory.
    pub(super) fn record(&mut self, mut update: StatusUpdate, disk: &mut dyn Disk, out: &mut Vec<Command>) {
        if update.state.is_terminal() {
            let key = (update.task_uid.clone(), update.attempt);
            if let Some((start, _)) = self.held_reports.remove(&key) {
                update = merged(update, start);
            }
            if !self.unsent_output.is_empty() {
                self.unsent_output
                    .remove(&(update.task_uid.clone(), update.attempt));
            }
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
        disk.push(update);
        self.pump(out, disk);
    }

    /// The attempts this robot holds, for register and heartbeat: those it
    /// runs or was given, and those whose final status is not settled yet
    /// (so the server never fails a Task whose result is on its way); and
    /// whether that is all of them (the protocol bounds the list).
    fn holding(&mut self, disk: &dyn Disk) -> HeldList {
        let mut held: Vec<TaskAttempt> = self.running.to_vec();
        let mut listed: BTreeSet<(String, u32)> = held.iter().map(|a| (a.uid.clone(), a.attempt)).collect();
        for (uid, attempt) in disk.waiting() {
            if listed.insert((uid.clone(), attempt)) {
                held.push(TaskAttempt::new(uid, attempt));
            }
        }
        // Names of uids no longer held are forgotten.
        let uids: BTreeSet<&str> = listed.iter().map(|(u, _)| u.as_str()).collect();
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
        HeldList {
            running: held,
            reconcile: complete,
            last_seq: disk.next_seq().checked_sub(1),
        }
    }

    pub(super) fn register(&mut self, out: &mut Vec<Command>, disk: &dyn Disk) {
        let register = Register {
            held: self.holding(disk),
            nonce: Some(self.registrar.next_nonce()),
            ..self.template.clone()
        };
        tracing::info!(running = self.running.len(), "registering");
        let topic = self.topics.register(&self.robot_id);
        self.publish_control(out, topic, Payload::Register(Box::new(register)), false);
    }

    /// Hands outbox entries to the client, oldest first, while there is room.
    pub(super) fn pump(&mut self, out: &mut Vec<Command>, disk: &dyn Disk) {
        while self.link.has_room() {
            let Some((id, update)) = disk.first_from(self.link.cursor()) else {
                break;
            };
            let topic = self.topics.status(&self.robot_id, &update.task_uid);
            let payload = Payload::Bytes(encode(update));
            self.link.handed_over(Tag::Status(id));
            out.push(Command::Publish {
                topic,
                payload,
                retain: false,
            });
        }
    }

    /// A fenced attempt with this `stopAfter` was admitted: heartbeats go
    /// several times within it from now on, the first at once when contact
    /// is older than a quarter of it, so that one lost heartbeat never
    /// stops it.
    pub(super) fn heartbeat_for(&mut self, lease: Duration, now: Now) {
        let every = self.heartbeat_interval.min(lease / 4);
        let soon = if self.fence.contact_age(now.mono).is_none_or(|age| age > lease / 4) {
            now.mono
        } else {
            now.mono + every
        };
        self.next_heartbeat = Some(self.next_heartbeat.map_or(soon, |at| at.min(soon)));
    }

    /// Time passed: registration retries, heartbeats, attempts whose
    /// contact ran out, statuses whose confirmation is late.
    pub fn tick(&mut self, now: Now, disk: &mut dyn Disk) -> Vec<Command> {
        let mut out = Vec::new();
        if !self.leaving && self.registrar.tick(now.mono) == RegisterAction::Register {
            tracing::info!(last_phase = ?self.registrar.last_phase(), "no approval yet; registering again");
            self.register(&mut out, disk);
        }
        if self.next_heartbeat.is_some_and(|at| now.mono >= at) && !self.leaving {
            self.heartbeat(now, disk, &mut out);
            // Confirmed heartbeats are the contact that keeps attempts
            // running (and lets waiting ones start): several per shortest
            // stopAfter.
            let waiting = self
                .held
                .iter()
                .filter_map(|d| d.stop_after.as_ref()?.parse().ok());
            let every = match self.fence.shortest_lease().into_iter().chain(waiting).min() {
                Some(lease) => self.heartbeat_interval.min(lease / 4),
                None => self.heartbeat_interval,
            };
            self.next_heartbeat = Some(now.mono + self.jitter.spread(every, 0.1));
        }
        for (uid, attempt, stop_after) in self.fence.due(now.mono) {
            tracing::warn!(task = %uid, attempt, ?stop_after, "no contact with the cluster for the attempt's stopAfter: stopping it");
            let reason = format!(
                "stopped by the robot: no contact with the cluster for {}s (disconnect.stopAfter)",
                stop_after.as_secs()
            );
            out.push(Command::Stop {
                uid,
                attempt: Some(attempt),
                cause: StopCause::Disconnected(reason),
            });
        }
        let stale = self
            .delivered
            .values()
            .any(|at| now.mono.saturating_sub(*at) >= self.confirm_timeout);
        if stale && self.link.is_connected() {
            tracing::info!(
                unconfirmed = self.delivered.len(),
                "the server did not confirm statuses in time; sending them again"
            );
            self.delivered.clear();
            self.link.rewind();
        }
        let due: Vec<_> = self
            .held_reports
            .iter()
            .filter(|(_, (_, at))| now.mono >= *at)
            .map(|(key, _)| key.clone())
            .collect();
        for key in due {
            if let Some((update, _)) = self.held_reports.remove(&key) {
                self.record(update, disk, &mut out);
            }
        }
        // A full request channel earlier may have left entries behind.
        self.pump(&mut out, disk);
        out
    }

    fn heartbeat(&mut self, now: Now, disk: &dyn Disk, out: &mut Vec<Command>) {
        if !self.link.is_connected() {
            return;
        }
        self.heartbeat_seq += 1;
        let heartbeat = Heartbeat {
            held: self.holding(disk),
            server_time: self.fence.server_now(now.mono),
            session: Some(self.session_id.clone()),
            // The shell adds what the robot measures (`Core::usage_for`).
            usage: None,
            ..Heartbeat::new(&self.robot_id, self.heartbeat_seq, now.wall, Default::default())
        };
        self.fence.heartbeat_sent(self.heartbeat_seq, now.mono);
        self.facts_sent = Some(now.mono);
        let topic = self.topics.heartbeat(&self.robot_id);
        self.publish_control(out, topic, Payload::Heartbeat(Box::new(heartbeat)), false);
    }
}

/// `newer`, with what it does not say taken from `older`, a report of the
/// same attempt that never went out.
fn merged(mut newer: StatusUpdate, older: StatusUpdate) -> StatusUpdate {
    newer.start_time = newer.start_time.or(older.start_time);
    newer.message = newer.message.or(older.message);
    newer.output_tail = newer.output_tail.or(older.output_tail);
    newer.task_name = newer.task_name.or(older.task_name);
    newer.config = newer.config.or(older.config);
    if newer.restarts == RestartStatus::default() {
        newer.restarts = older.restarts;
    }
    newer
}

/// A status that only carries a running attempt's latest output (the
/// supervisor's `TaskEvent::Output`): its start has a status of its own.
fn output_only(update: &StatusUpdate) -> bool {
    update.state == TaskState::Running && update.output_tail.is_some()
}
