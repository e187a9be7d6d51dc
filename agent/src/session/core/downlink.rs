//! What comes down from the server: registration answers, dispatches,
//! cancels, log requests, upgrade orders and confirmations.

use k8s4r_api::protocol::{Cancel, ConfigUpdate, Dispatch, RegisterResponse, StatusAck};
use k8s4r_api::{RobotPhase, TaskReason};

use super::{failed_status, Command, Core, Disk, Now};
use crate::gate::Verdict;
use crate::inbound::{classify, Inbound, Refused};
use crate::link::{RegisterAction, REJECTED_RETRY_MAX};
use crate::supervisor::outcome::StopCause;
use crate::supervisor::TaskRequest;

impl Core {
    /// A message from the broker. Every topic the agent reads is a command
    /// from the server, which never retains one: a `retained` message was
    /// left by someone else (a robot before the ACL was tightened) and
    /// would act again at every start, so it is ignored.
    pub fn message(
        &mut self,
        topic: &str,
        payload: &[u8],
        retained: bool,
        now: Now,
        disk: &mut dyn Disk,
    ) -> Vec<Command> {
        let mut out = Vec::new();
        if retained {
            tracing::warn!(topic, "ignored a retained message on a command topic");
            return out;
        }
        match classify(&self.topics, &self.robot_id, topic, payload) {
            Ok(Inbound::Response(response)) => self.on_response(response, now, disk, &mut out),
            Ok(Inbound::Dispatch(dispatch)) => self.on_dispatch(*dispatch, now, disk, &mut out),
            Ok(Inbound::Cancel(cancel)) => self.on_cancel(cancel, now, disk, &mut out),
            Ok(Inbound::ConfigUpdate(update)) => self.on_config_update(*update, &mut out),
            Ok(Inbound::Upgrade(order)) if !self.leaving => out.push(Command::Upgrade(order)),
            Ok(Inbound::Upgrade(order)) => {
                tracing::warn!(version = %order.version, "upgrade order ignored: shutting down")
            }
            Ok(Inbound::LogRequest(request)) => {
                tracing::debug!(task = %request.task_uid, attempt = request.attempt, follow = request.follow, stop = request.stop, "log request");
                out.push(Command::Logs(request));
            }
            Ok(Inbound::StatusAck(ack)) => self.on_confirmation(ack, now, disk, &mut out),
            Ok(Inbound::OutputAnswer(answer)) => out.push(Command::OutputAnswer(answer)),
            Err(Refused { error, task }) => {
                tracing::error!(topic, error = %error, "refused a message");
                if let Some((uid, attempt)) = task {
                    let failed = failed_status(
                        &uid,
                        attempt,
                        TaskReason::InvalidSpec,
                        error.to_string(),
                        now.wall,
                    );
                    self.status_into(failed, disk, &mut out);
                }
            }
        }
        out
    }

    /// A registration answer: taken only when this process asked for it
    /// (its nonce), or from a server too old to echo nonces.
    fn on_response(
        &mut self,
        response: RegisterResponse,
        now: Now,
        disk: &mut dyn Disk,
        out: &mut Vec<Command>,
    ) {
        // A server too old to echo nonces: its answers are taken as
        // before, without fencing or its clock.
        let ours = response.nonce.as_deref().is_some_and(|n| self.registrar.asked(n));
        if response.nonce.is_some() && !ours {
            tracing::warn!(phase = ?response.phase, nonce = response.nonce.as_deref().unwrap_or(""), "ignored a registration answer this process did not ask for (it waited in the broker)");
            return;
        }
        if response.phase != RobotPhase::Rejected {
            tracing::info!(phase = ?response.phase, message = response.message.as_deref().unwrap_or(""), "registration response");
        }
        let confirms = ours && response.status_acks;
        if !confirms && self.status_acks != Some(false) {
            // A server that confirms nothing: what the broker took is
            // settled, as it would have been at its PUBACK.
            for seq in std::mem::take(&mut self.delivered).into_keys() {
                disk.settle(seq);
            }
        }
        self.status_acks = Some(confirms);
        self.usage.registered(ours && response.usage_when_moved);
        if ours {
            self.fence
                .registered(response.status_acks, response.server_time, now.mono);
        }
        let message = response.message.as_deref();
        match self.registrar.response(response.phase, message, now.mono) {
            RegisterAction::Approved => {
                tracing::info!("registration approved");
                self.next_heartbeat = (!self.leaving).then_some(now.mono);
                self.release_held(now, disk, out);
            }
            RegisterAction::Rejected { news, retry_in } => report_rejection(message, news, retry_in),
            RegisterAction::None | RegisterAction::Register => {}
        }
    }

    /// Statuses the server applied, and the heartbeat it recorded when the
    /// confirmation is meant for this process.
    fn on_confirmation(&mut self, ack: StatusAck, now: Now, disk: &mut dyn Disk, out: &mut Vec<Command>) {
        if let Some(heartbeat) = ack.heartbeat {
            // Seqs restart with every process: a confirmation meant for a
            // previous one must not renew this one's leases.
            if ack.session.as_deref() == Some(self.session_id.as_str()) {
                // How long the round trip took: what a busy link (a session
                // moving data) must not stretch past the interval.
                if let Some(sent) = self.fence.sent_at(heartbeat) {
                    let after_ms = now.mono.saturating_sub(sent).as_millis() as u64;
                    tracing::debug!(heartbeat, after_ms, "heartbeat confirmed");
                }
                self.fence.heartbeat_recorded(heartbeat, ack.time, now.mono);
                self.usage.confirmed(heartbeat);
                out.push(Command::HeartbeatConfirmed {
                    seq: heartbeat,
                    contact: self.fence.contact(),
                });
                self.release_held(now, disk, out);
            } else {
                tracing::debug!(
                    heartbeat,
                    "a heartbeat confirmation for another agent process: ignored"
                );
            }
        }
        for seq in ack.seqs {
            self.settle(seq, disk);
        }
        self.pump(out, disk);
    }

    /// Stops an attempt. One this robot does not hold (never received,
    /// held for approval, refused, or finished) is answered at once with a
    /// terminal status, so a deletion waiting for it never hangs.
    fn on_cancel(&mut self, cancel: Cancel, now: Now, disk: &mut dyn Disk, out: &mut Vec<Command>) {
        tracing::info!(task = %cancel.task_uid, attempt = cancel.attempt, reason = %cancel.reason, "cancel");
        let matches = |uid: &str, attempt: u32| {
            uid == cancel.task_uid && (cancel.attempt == 0 || attempt == cancel.attempt)
        };
        let held_back = self.held.iter().any(|d| matches(&d.task_uid, d.attempt));
        self.held.retain(|d| !matches(&d.task_uid, d.attempt));
        if self.running.to_vec().iter().any(|a| matches(&a.uid, a.attempt)) {
            let cause = if cancel.drain {
                StopCause::Drained(cancel.reason)
            } else {
                StopCause::Cancelled(cancel.reason)
            };
            out.push(Command::Stop {
                uid: cancel.task_uid,
                attempt: (cancel.attempt != 0).then_some(cancel.attempt),
                cause,
            });
            return;
        }
        // One admitted here and over already sent its end (it may wait in
        // the outbox); answering again would only repeat it.
        let ended = !held_back && self.fence.seen(&cancel.task_uid, cancel.attempt);
        if cancel.attempt > 0 && !ended {
            let why = if held_back {
                "cancelled before it started (it was waiting for the registration)"
            } else {
                "cancelled; this robot does not run it"
            };
            let message = format!("{why}: {}", cancel.reason);
            let failed = failed_status(
                &cancel.task_uid,
                cancel.attempt,
                TaskReason::Cancelled,
                message,
                now.wall,
            );
            self.status_into(failed, disk, out);
        }
    }

    /// A running attempt's changed configuration: for the supervisor, when
    /// it runs here; any other is dropped (an attempt over, or one this
    /// robot never ran: its next dispatch carries the configuration).
    fn on_config_update(&mut self, update: ConfigUpdate, out: &mut Vec<Command>) {
        let (uid, attempt) = (update.task_uid.as_str(), update.attempt);
        if self.leaving || !self.running.contains(uid, attempt) {
            tracing::info!(task = %uid, attempt, generation = update.config.generation, "configuration change for an attempt this robot does not run: dropped");
            return;
        }
        tracing::info!(task = %uid, attempt, generation = update.config.generation, config = ?update.config, "configuration change");
        out.push(Command::Reconfigure(Box::new(update)));
    }

    /// A dispatch while the agent shuts down: a copy of an attempt it
    /// accepted before (a new server sends a dispatching attempt again) is
    /// dropped, as it runs, or ran, here and the next agent re-adopts it
    /// (refusing it would fail a running task); any other is refused with
    /// a status, or the cluster would wait for its dispatch deadline (the
    /// task waits for a robot again, using no retry).
    fn while_leaving(&mut self, dispatch: &Dispatch, now: Now, disk: &mut dyn Disk, out: &mut Vec<Command>) {
        let (uid, attempt) = (dispatch.task_uid.as_str(), dispatch.attempt);
        if self.running.contains(uid, attempt) || self.fence.seen(uid, attempt) {
            tracing::info!(task = %uid, attempt, "dispatch of an attempt accepted before, during shutdown: dropped");
            return;
        }
        tracing::warn!(task = %uid, attempt, "dispatch during shutdown refused");
        let message =
            "not started: the agent was shutting down (a restart, an upgrade or a stop of k8s4r-agent)";
        let failed = failed_status(uid, attempt, TaskReason::AgentShutdown, message.into(), now.wall);
        self.status_into(failed, disk, out);
    }

    fn on_dispatch(&mut self, dispatch: Dispatch, now: Now, disk: &mut dyn Disk, out: &mut Vec<Command>) {
        if self.leaving {
            self.while_leaving(&dispatch, now, disk, out);
            return;
        }
        let approved = self.registrar.approved();
        let verdict = crate::gate::decide(
            &dispatch,
            approved,
            &self.running,
            &mut self.fence,
            now.mono,
            now.wall,
        );
        let stop_after = match verdict {
            Verdict::HoldForApproval => {
                tracing::info!(task = %dispatch.task_uid, attempt = dispatch.attempt, "dispatch held until registration is approved");
                self.push_held(dispatch);
                return;
            }
            Verdict::Duplicate => {
                tracing::info!(task = %dispatch.task_uid, attempt = dispatch.attempt, "duplicate dispatch ignored");
                return;
            }
            Verdict::Refused(refusal) => {
                tracing::warn!(task = %dispatch.task_uid, attempt = dispatch.attempt, %refusal, "dispatch refused");
                if matches!(refusal, crate::fence::Refusal::Expired { .. }) {
                    let failed = failed_status(
                        &dispatch.task_uid,
                        dispatch.attempt,
                        TaskReason::DispatchTimeout,
                        refusal.to_string(),
                        now.wall,
                    );
                    self.status_into(failed, disk, out);
                }
                return;
            }
            Verdict::WaitForContact => {
                // Contact is too old for this attempt's stopAfter: a
                // heartbeat now, and the dispatch waits for its
                // confirmation (or its deadline, or a cancel).
                tracing::info!(task = %dispatch.task_uid, attempt = dispatch.attempt, contact_age = ?self.fence.contact_age(now.mono), "dispatch waits for a confirmed heartbeat");
                self.push_held(dispatch);
                self.next_heartbeat = Some(now.mono);
                return;
            }
            Verdict::Start { stop_after } => stop_after,
        };
        // Recorded before it starts: a restarted agent that gets this
        // dispatch again (a lost PUBACK, a server that published it twice)
        // refuses it. Unrecorded, it does not start.
        if let Err(e) = disk.admit(&dispatch.task_uid, dispatch.attempt) {
            tracing::error!(task = %dispatch.task_uid, attempt = dispatch.attempt, error = %e, "cannot record the attempt as accepted; it does not start");
            self.fence.release(&dispatch.task_uid, dispatch.attempt);
            let message =
                format!("the agent could not record that it accepted the attempt ({e}); it did not start it");
            let failed = failed_status(
                &dispatch.task_uid,
                dispatch.attempt,
                TaskReason::StartFailed,
                message,
                now.wall,
            );
            self.status_into(failed, disk, out);
            return;
        }
        tracing::info!(task = %dispatch.task_uid, attempt = dispatch.attempt, name = %dispatch.task_name, "dispatch");
        if let Some(lease) = stop_after {
            self.heartbeat_for(lease, now);
        }
        self.names
            .insert(dispatch.task_uid.clone(), dispatch.task_name.clone());
        self.running.insert(&dispatch.task_uid, dispatch.attempt);
        out.push(Command::Start(Box::new(TaskRequest {
            uid: dispatch.task_uid,
            attempt: dispatch.attempt,
            name: dispatch.task_name,
            spec: dispatch.spec,
            stop_after,
            config: dispatch.config,
        })));
    }

    /// Tries the held dispatches again (approval or contact came); those
    /// still waiting are held again.
    fn release_held(&mut self, now: Now, disk: &mut dyn Disk, out: &mut Vec<Command>) {
        if !self.registrar.approved() {
            return;
        }
        for dispatch in std::mem::take(&mut self.held) {
            self.on_dispatch(dispatch, now, disk, out);
        }
    }
}

/// Says that the cluster rejected this robot: an error when it is news,
/// with what a person must do, and quietly while it goes on (the
/// registrar spaces the retries out meanwhile).
fn report_rejection(message: Option<&str>, news: bool, retry_in: std::time::Duration) {
    use k8s4r_api::names::{DEFAULT_BOOTSTRAP_SECRET, DEFAULT_NAMESPACE};
    let reason = message.unwrap_or("no reason given");
    if news {
        tracing::error!(
            reason,
            ?retry_in,
            "the cluster rejected this robot's registration: the agent's bootstrap token (token_file or \
             token) must be a value of the Secret {DEFAULT_BOOTSTRAP_SECRET} (namespace {DEFAULT_NAMESPACE} \
             by default; `k8s4r up` keeps its own in the file bootstrap-token of its data dir): add it \
             there, or give the agent one of its values and restart it; meanwhile it registers again less \
             and less often, at most every {}s",
            REJECTED_RETRY_MAX.as_secs()
        );
    } else {
        tracing::debug!(reason, ?retry_in, "registration rejected again");
    }
}
