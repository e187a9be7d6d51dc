//! What comes down from the server: registration answers, dispatches,
//! cancels, log requests and confirmations, each handled by the session.

use k8s4r_api::protocol::{Cancel, Dispatch, RegisterResponse, StatusAck};
use k8s4r_api::{RobotPhase, TaskReason};
use tokio::time::Instant;

use super::{boot_clock, failed_status, report_rejection, Phase, Session, TaskCommand, MAX_HELD_DISPATCHES};
use crate::gate::Verdict;
use crate::inbound::{classify, Inbound, Refused};
use crate::link::RegisterAction;
use crate::supervisor::outcome::StopCause;
use crate::supervisor::TaskRequest;

impl Session {
    #[tracing::instrument(skip_all, fields(topic))]
    pub(super) fn on_message(&mut self, topic: &str, payload: &[u8], phase: &Phase) {
        match classify(&self.topics, &self.robot_id, topic, payload) {
            Ok(Inbound::Response(response)) => self.on_response(response, phase),
            Ok(Inbound::Dispatch(dispatch)) => self.on_dispatch(*dispatch, phase),
            Ok(Inbound::Cancel(cancel)) => self.on_cancel(cancel),
            Ok(Inbound::Upgrade(order)) => match &self.upgrades {
                Some(hooks) if matches!(phase, Phase::Running) => crate::upgrade::start(
                    &hooks.upgrades,
                    order,
                    hooks.limits,
                    std::sync::Arc::clone(&hooks.news),
                    hooks.restart.clone(),
                    self.facts.clone(),
                ),
                _ => tracing::warn!(version = %order.version, "upgrade order ignored: shutting down"),
            },
            Ok(Inbound::LogRequest(request)) => {
                tracing::debug!(task = %request.task_uid, attempt = request.attempt, follow = request.follow, stop = request.stop, "log request");
                self.log_readers.handle(request);
            }
            Ok(Inbound::StatusAck(ack)) => self.on_confirmation(ack, phase),
            Err(Refused { error, task }) => {
                tracing::error!(topic, error = %error, "refused a message");
                if let Some((uid, attempt)) = task {
                    let _ = self.updates_tx.send(failed_status(
                        &uid,
                        attempt,
                        TaskReason::InvalidSpec,
                        error.to_string(),
                    ));
                }
            }
        }
    }

    /// A registration answer: taken only when this process asked for it
    /// (its nonce), or from a server too old to echo nonces.
    fn on_response(&mut self, response: RegisterResponse, phase: &Phase) {
        let ours = match &response.nonce {
            Some(nonce) => self.registrar.asked(nonce),
            // A server too old to echo nonces: its answers are
            // taken as before, without fencing or its clock.
            None => false,
        };
        if response.nonce.is_some() && !ours {
            tracing::warn!(phase = ?response.phase, nonce = response.nonce.as_deref().unwrap_or(""), "ignored a registration answer this process did not ask for (it waited in the broker)");
            return;
        }
        if response.phase != RobotPhase::Rejected {
            tracing::info!(phase = ?response.phase, message = response.message.as_deref().unwrap_or(""), "registration response");
        }
        self.status_acks = ours && response.status_acks;
        self.usage.registered(ours && response.usage_when_moved);
        if ours {
            self.fence
                .registered(response.status_acks, response.server_time, boot_clock());
        }
        let message = response.message.as_deref();
        match self
            .registrar
            .response(response.phase, message, Instant::now().into_std())
        {
            RegisterAction::Approved => {
                tracing::info!("registration approved");
                self.next_heartbeat = matches!(phase, Phase::Running).then(Instant::now);
                self.release_held(phase);
            }
            RegisterAction::Rejected { news, retry_in } => report_rejection(message, news, retry_in),
            RegisterAction::None | RegisterAction::Register => {}
        }
    }

    /// Statuses the server applied, and the heartbeat it recorded when the
    /// confirmation is meant for this process.
    fn on_confirmation(&mut self, ack: StatusAck, phase: &Phase) {
        if let Some(heartbeat) = ack.heartbeat {
            // Seqs restart with every process: a confirmation meant
            // for a previous one must not renew this one's leases.
            if ack.session.as_deref() == Some(self.session_id.as_str()) {
                self.fence.heartbeat_recorded(heartbeat, ack.time, boot_clock());
                self.usage.confirmed(heartbeat);
                if let Some(hooks) = &self.upgrades {
                    crate::upgrade::lock(&hooks.upgrades).heartbeat_confirmed(heartbeat);
                }
                self.release_held(phase);
            } else {
                tracing::debug!(
                    heartbeat,
                    "a heartbeat confirmation for another agent process: ignored"
                );
            }
        }
        for seq in ack.seqs {
            self.forget(seq);
        }
        self.pump();
    }

    /// Stops an attempt. One this robot does not hold (never received,
    /// held for approval, refused, or finished) is answered at once with a
    /// terminal status, so a deletion waiting for it never hangs.
    pub(super) fn on_cancel(&mut self, cancel: Cancel) {
        tracing::info!(task = %cancel.task_uid, attempt = cancel.attempt, reason = %cancel.reason, "cancel");
        let matches = |uid: &str, attempt: u32| {
            uid == cancel.task_uid && (cancel.attempt == 0 || attempt == cancel.attempt)
        };
        let held_back = self.held.iter().any(|d| matches(&d.task_uid, d.attempt));
        self.held.retain(|d| !matches(&d.task_uid, d.attempt));
        let runs = self.running.to_vec().iter().any(|a| matches(&a.uid, a.attempt));
        if runs {
            let attempt = (cancel.attempt != 0).then_some(cancel.attempt);
            let cause = if cancel.drain {
                StopCause::Drained(cancel.reason)
            } else {
                StopCause::Cancelled(cancel.reason)
            };
            let _ = self.commands.send(TaskCommand::Stop {
                uid: cancel.task_uid,
                attempt,
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
            let _ = self.updates_tx.send(failed_status(
                &cancel.task_uid,
                cancel.attempt,
                TaskReason::Cancelled,
                format!("{why}: {}", cancel.reason),
            ));
        }
    }

    #[tracing::instrument(skip_all, fields(task = %dispatch.task_uid, attempt = dispatch.attempt))]
    pub(super) fn on_dispatch(&mut self, dispatch: Dispatch, phase: &Phase) {
        if !matches!(phase, Phase::Running) {
            // Taken from the broker (and acknowledged) but never started:
            // said so, or the cluster would wait for its dispatch deadline.
            // The task waits for a robot again, using no retry.
            tracing::warn!(task = %dispatch.task_uid, attempt = dispatch.attempt, "dispatch during shutdown refused");
            let _ = self.updates_tx.send(failed_status(
                &dispatch.task_uid,
                dispatch.attempt,
                TaskReason::AgentShutdown,
                "not started: the agent was shutting down (a restart, an upgrade or a stop of k8s4r-agent)"
                    .into(),
            ));
            return;
        }
        let now = boot_clock();
        let verdict = crate::gate::decide(
            &dispatch,
            self.registrar.approved(),
            &self.running,
            &mut self.fence,
            now,
            jiff::Timestamp::now(),
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
                    let _ = self.updates_tx.send(failed_status(
                        &dispatch.task_uid,
                        dispatch.attempt,
                        TaskReason::DispatchTimeout,
                        refusal.to_string(),
                    ));
                }
                return;
            }
            Verdict::WaitForContact => {
                // Contact is too old for this attempt's stopAfter: a
                // heartbeat now, and the dispatch waits for its
                // confirmation (or its deadline, or a cancel).
                tracing::info!(task = %dispatch.task_uid, attempt = dispatch.attempt, contact_age = ?self.fence.contact_age(now), "dispatch waits for a confirmed heartbeat");
                self.push_held(dispatch);
                self.next_heartbeat = Some(Instant::now());
                return;
            }
            Verdict::Start { stop_after } => stop_after,
        };
        // Recorded before it starts: a restarted agent that gets this
        // dispatch again (a lost PUBACK, a server that published it twice)
        // refuses it. Unrecorded, it does not start.
        if let Some(admitted) = &mut self.admitted {
            if let Err(e) = admitted.record(&dispatch.task_uid, dispatch.attempt) {
                tracing::error!(task = %dispatch.task_uid, attempt = dispatch.attempt, error = %e, path = %admitted.path().display(), "cannot record the attempt as accepted; it does not start");
                self.fence.release(&dispatch.task_uid, dispatch.attempt);
                let _ = self.updates_tx.send(failed_status(
                    &dispatch.task_uid,
                    dispatch.attempt,
                    TaskReason::StartFailed,
                    format!(
                        "the agent could not record that it accepted the attempt ({e}); it did not start it"
                    ),
                ));
                return;
            }
        }
        tracing::info!(task = %dispatch.task_uid, attempt = dispatch.attempt, name = %dispatch.task_name, "dispatch");
        if let Some(lease) = stop_after {
            self.heartbeat_for(lease, now);
        }
        self.names
            .insert(dispatch.task_uid.clone(), dispatch.task_name.clone());
        self.running.insert(&dispatch.task_uid, dispatch.attempt);
        let _ = self.commands.send(TaskCommand::Submit(Box::new(TaskRequest {
            uid: dispatch.task_uid,
            attempt: dispatch.attempt,
            name: dispatch.task_name,
            spec: dispatch.spec,
            fenced: stop_after.is_some(),
        })));
    }

    pub(super) fn push_held(&mut self, dispatch: Dispatch) {
        if self.held.len() >= MAX_HELD_DISPATCHES {
            self.held.pop_front();
        }
        self.held.push_back(dispatch);
    }

    /// Tries the held dispatches again (approval or contact came); those
    /// still waiting are held again.
    pub(super) fn release_held(&mut self, phase: &Phase) {
        if !self.registrar.approved() {
            return;
        }
        for dispatch in std::mem::take(&mut self.held) {
            self.on_dispatch(dispatch, phase);
        }
    }
}
