//! The agent's event loop: owns the MQTT connection, the outbox and the
//! timers, and talks to the supervisor through a worker task.
//!
//! One tokio task runs [`Session::run`]. It never awaits anything but its
//! `select!`: publishes go through `try_publish` (awaiting `publish` in the
//! task that drives rumqttc's event loop deadlocks once its in-flight window
//! is full), supervisor calls go to a worker task in order, and rumqttc's
//! `poll` runs in a future that owns the event loop and is never cancelled
//! half-way (`poll` is not cancel-safe).

use std::collections::VecDeque;
use std::future::Future;
use std::pin::Pin;
use std::time::Duration;

use k8s4r_api::protocol::{encode, Cancel, Dispatch, Heartbeat, Online, Register, StatusUpdate, Topics};
use k8s4r_api::{DeviceInfo, TaskReason, TaskState};
use rumqttc::{AsyncClient, ConnectionError, Event, EventLoop, Outgoing, Packet, QoS};
use tokio::sync::{mpsc, oneshot, watch};
use tokio::time::Instant;
use tokio_util::sync::CancellationToken;

use crate::backoff::{Backoff, Jitter};
use crate::config::Config;
use crate::host::UsageSampler;
use crate::inbound::{classify, Inbound, Refused};
use crate::link::{Link, RegisterAction, Registrar, RunningSet, Tag};
use crate::mqtt;
use crate::outbox::Outbox;
use crate::supervisor::{Submit, SupervisorHandle, TaskEvent, TaskRequest};

/// Dispatches kept while waiting for approval; older ones beyond this are
/// dropped (the server's dispatch timeout sends them again).
const MAX_HELD_DISPATCHES: usize = 256;
/// How long to wait for the PUBACK of `online=false` and for the DISCONNECT
/// to go out when leaving.
const LEAVE_TIMEOUT: Duration = Duration::from_secs(2);
/// During the shutdown flush, how long the update channel must stay quiet
/// before the outbox counts as final.
const QUIET: Duration = Duration::from_millis(100);

/// What the session shows the outside (tests, benchmarks, logs).
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct SessionStatus {
    /// A CONNACK arrived and no error since.
    pub connected: bool,
    /// The server answered Online on this connection.
    pub approved: bool,
    /// Status updates not yet acknowledged by the broker.
    pub outbox_len: usize,
    /// Heartbeats sent since start.
    pub heartbeats: u64,
}

/// Supervisor calls, run in order by the worker task.
enum TaskCommand {
    Submit(Box<TaskRequest>),
    Cancel(Cancel),
    Shutdown(oneshot::Sender<()>),
}

/// Turns a supervisor event into a status update (its seq is set by the
/// outbox).
pub fn status_of(event: TaskEvent) -> StatusUpdate {
    let mut update = StatusUpdate {
        v: 1,
        task_uid: event.uid().to_owned(),
        attempt: event.attempt(),
        seq: 0,
        state: TaskState::Running,
        exit_code: None,
        signal: None,
        reason: None,
        message: None,
        start_time: None,
        finish_time: None,
        output_tail: None,
    };
    match event {
        TaskEvent::Started { at, .. } => update.start_time = Some(at),
        TaskEvent::Finished { outcome, .. } => {
            update.state = outcome.state;
            update.exit_code = outcome.exit_code;
            update.signal = outcome.signal;
            update.reason = Some(outcome.reason);
            update.message = Some(outcome.message).filter(|m| !m.is_empty());
            update.start_time = outcome.started_at;
            update.finish_time = Some(outcome.finished_at);
            update.output_tail = Some(outcome.output_tail).filter(|t| !t.is_empty());
        }
    }
    update
}

/// A `failed` update for an attempt that never reached the supervisor.
pub fn failed_status(uid: &str, attempt: u32, reason: TaskReason, message: String) -> StatusUpdate {
    StatusUpdate {
        v: 1,
        task_uid: uid.to_owned(),
        attempt,
        seq: 0,
        state: TaskState::Failed,
        exit_code: None,
        signal: None,
        reason: Some(reason),
        message: Some(message),
        start_time: None,
        finish_time: Some(jiff::Timestamp::now()),
        output_tail: None,
    }
}

async fn worker(
    supervisor: SupervisorHandle,
    mut commands: mpsc::UnboundedReceiver<TaskCommand>,
    updates: mpsc::UnboundedSender<StatusUpdate>,
) {
    while let Some(command) = commands.recv().await {
        match command {
            TaskCommand::Submit(req) => {
                let (uid, attempt) = (req.uid.clone(), req.attempt);
                match supervisor.submit(*req).await {
                    Ok(Submit::Accepted) => tracing::info!(task = %uid, attempt, "task accepted"),
                    Ok(Submit::Duplicate) => {
                        tracing::info!(task = %uid, attempt, "duplicate dispatch ignored")
                    }
                    Err(e) => {
                        tracing::error!(task = %uid, attempt, error = %e, "supervisor refused the task");
                        let _ = updates.send(failed_status(
                            &uid,
                            attempt,
                            TaskReason::StartFailed,
                            e.to_string(),
                        ));
                    }
                }
            }
            TaskCommand::Cancel(cancel) => {
                let attempt = (cancel.attempt != 0).then_some(cancel.attempt);
                supervisor.cancel(&cancel.task_uid, attempt, cancel.reason).await;
            }
            TaskCommand::Shutdown(done) => {
                supervisor.shutdown().await;
                let _ = done.send(());
            }
        }
    }
}

async fn forward_events(
    mut events: mpsc::UnboundedReceiver<TaskEvent>,
    updates: mpsc::UnboundedSender<StatusUpdate>,
) {
    while let Some(event) = events.recv().await {
        if updates.send(status_of(event)).is_err() {
            break;
        }
    }
}

type PollResult = (EventLoop, Result<Event, ConnectionError>);

/// Polls the event loop once, after `delay`. Owns the event loop so that
/// the future can live across `select!` iterations without being dropped.
async fn poll_once(mut eventloop: EventLoop, delay: Duration) -> PollResult {
    if !delay.is_zero() {
        tokio::time::sleep(delay).await;
    }
    let result = eventloop.poll().await;
    if result.is_err() {
        // rumqttc kept what was in flight for a resumed session; the session
        // replays its outbox itself (see `link`), so drop rumqttc's copy to
        // keep the packet-id bookkeeping exact.
        eventloop.pending.clear();
    }
    (eventloop, result)
}

/// What to do after a poll result.
enum After {
    /// Poll again after this delay.
    Poll(Duration),
    /// The session is over.
    Stop,
}

enum Phase {
    Running,
    StoppingTasks,
    Flushing { deadline: Instant, quiet_since: Instant },
    Leaving { deadline: Instant },
    Disconnecting { deadline: Instant },
}

/// The MQTT session of one agent.
pub struct Session {
    robot_id: String,
    token: Option<String>,
    labels: std::collections::BTreeMap<String, String>,
    topics: Topics,
    client: AsyncClient,
    eventloop: Option<EventLoop>,
    link: Link,
    registrar: Registrar,
    running: RunningSet,
    outbox: Outbox,
    sampler: UsageSampler,
    device: DeviceInfo,
    jitter: Jitter,
    reconnect: Backoff,
    heartbeat_interval: Duration,
    heartbeat_seq: u64,
    next_heartbeat: Option<Instant>,
    held: VecDeque<Dispatch>,
    commands: mpsc::UnboundedSender<TaskCommand>,
    updates: mpsc::UnboundedReceiver<StatusUpdate>,
    updates_tx: mpsc::UnboundedSender<StatusUpdate>,
    status: watch::Sender<SessionStatus>,
    flush_timeout: Duration,
}

impl Session {
    /// Wires a session; spawns the worker and event-forwarding tasks.
    pub fn new(
        config: &Config,
        options: rumqttc::MqttOptions,
        outbox: Outbox,
        supervisor: SupervisorHandle,
        events: mpsc::UnboundedReceiver<TaskEvent>,
    ) -> (Session, watch::Receiver<SessionStatus>) {
        let (client, eventloop) = AsyncClient::new(options, mqtt::REQUEST_CHANNEL);
        let (updates_tx, updates) = mpsc::unbounded_channel();
        let (commands, commands_rx) = mpsc::unbounded_channel();
        tokio::spawn(worker(supervisor, commands_rx, updates_tx.clone()));
        tokio::spawn(forward_events(events, updates_tx.clone()));
        let mut sampler = UsageSampler::new(&config.state_dir);
        let device = sampler.device_info();
        let mut jitter = Jitter::from_entropy();
        let reconnect = Backoff::new(config.reconnect_min, config.reconnect_max, jitter.clone());
        // Advance so the two backoffs do not share a sequence.
        jitter.next_f64();
        let registrar = Registrar::new(Backoff::new(
            config.register_retry_min,
            config.register_retry_max,
            Jitter::with_seed(jitter.next_f64().to_bits()),
        ));
        let (status, status_rx) = watch::channel(SessionStatus {
            outbox_len: outbox.len(),
            ..Default::default()
        });
        let session = Session {
            robot_id: config.robot_id.clone(),
            token: config.token.clone(),
            labels: config.labels.clone(),
            topics: Topics::new(&config.topic_prefix),
            client,
            eventloop: Some(eventloop),
            link: Link::new(mqtt::MAX_OUTSTANDING),
            registrar,
            running: RunningSet::default(),
            outbox,
            sampler,
            device,
            jitter,
            reconnect,
            heartbeat_interval: config.heartbeat_interval,
            heartbeat_seq: 0,
            next_heartbeat: None,
            held: VecDeque::new(),
            commands,
            updates,
            updates_tx,
            status,
            flush_timeout: config.shutdown_flush_timeout,
        };
        (session, status_rx)
    }

    /// Runs until `shutdown` is cancelled and the shutdown sequence is
    /// done: tasks stopped, outbox flushed as far as the broker allows
    /// within the flush timeout, `online=false` published, disconnected.
    pub async fn run(mut self, shutdown: CancellationToken) {
        let Some(eventloop) = self.eventloop.take() else {
            return;
        };
        let mut poll: Pin<Box<dyn Future<Output = PollResult> + Send>> =
            Box::pin(poll_once(eventloop, Duration::ZERO));
        let mut phase = Phase::Running;
        let mut stopping: Option<oneshot::Receiver<()>> = None;
        loop {
            let now = Instant::now();
            let wake = self.next_wake(&phase, now);
            tokio::select! {
                (eventloop, result) = &mut poll => {
                    match self.on_poll(result, &phase) {
                        After::Poll(delay) => poll = Box::pin(poll_once(eventloop, delay)),
                        After::Stop => break,
                    }
                }
                Some(update) = self.updates.recv() => {
                    self.on_update(update);
                    if let Phase::Flushing { quiet_since, .. } = &mut phase {
                        *quiet_since = Instant::now();
                    }
                }
                _ = shutdown.cancelled(), if matches!(phase, Phase::Running) => {
                    tracing::info!("shutting down: stopping tasks");
                    self.next_heartbeat = None;
                    let (tx, rx) = oneshot::channel();
                    let _ = self.commands.send(TaskCommand::Shutdown(tx));
                    stopping = Some(rx);
                    phase = Phase::StoppingTasks;
                }
                _ = async { match stopping.as_mut() { Some(rx) => { let _ = rx.await; } None => std::future::pending().await } } => {
                    stopping = None;
                    tracing::info!(outbox = self.outbox.len(), "tasks stopped; flushing the outbox");
                    let now = Instant::now();
                    phase = Phase::Flushing { deadline: now + self.flush_timeout, quiet_since: now };
                }
                _ = tokio::time::sleep_until(wake) => {
                    self.on_tick(Instant::now(), matches!(phase, Phase::Running));
                }
            }
            phase = self.advance(phase);
            if let Phase::Disconnecting { deadline } = phase {
                if !self.link.is_connected() || Instant::now() >= deadline {
                    break;
                }
            }
            self.publish_status();
        }
        tracing::info!(outbox = self.outbox.len(), "agent stopped");
        self.publish_status();
    }

    /// Moves the shutdown sequence along.
    fn advance(&mut self, phase: Phase) -> Phase {
        let now = Instant::now();
        match phase {
            Phase::Flushing {
                deadline,
                quiet_since,
            } => {
                let drained = self.outbox.is_empty() && now.duration_since(quiet_since) >= QUIET;
                if drained || now >= deadline {
                    if !drained {
                        tracing::warn!(
                            outbox = self.outbox.len(),
                            "flush timeout: undelivered status updates stay in the outbox for the next start"
                        );
                    }
                    if self.link.is_connected() {
                        self.publish_control(
                            &self.topics.online(&self.robot_id),
                            encode(&Online { v: 1, online: false }),
                            true,
                        );
                        return Phase::Leaving {
                            deadline: now + LEAVE_TIMEOUT,
                        };
                    }
                    return Phase::Disconnecting { deadline: now };
                }
                Phase::Flushing {
                    deadline,
                    quiet_since,
                }
            }
            Phase::Leaving { deadline } => {
                if self.link.idle() || now >= deadline || !self.link.is_connected() {
                    if let Err(e) = self.client.try_disconnect() {
                        tracing::warn!(error = %e, "cannot queue the MQTT disconnect");
                    }
                    return Phase::Disconnecting {
                        deadline: now + LEAVE_TIMEOUT,
                    };
                }
                Phase::Leaving { deadline }
            }
            other => other,
        }
    }

    fn next_wake(&self, phase: &Phase, now: Instant) -> Instant {
        let mut wake = now + Duration::from_secs(3600);
        for t in [
            self.next_heartbeat,
            self.registrar.deadline().map(Instant::from_std),
        ]
        .into_iter()
        .flatten()
        {
            wake = wake.min(t);
        }
        match phase {
            Phase::Flushing {
                deadline,
                quiet_since,
            } => wake.min(*deadline).min(*quiet_since + QUIET),
            Phase::Leaving { deadline } | Phase::Disconnecting { deadline } => wake.min(*deadline),
            _ => wake,
        }
    }

    /// Handles one poll result.
    fn on_poll(&mut self, result: Result<Event, ConnectionError>, phase: &Phase) -> After {
        match result {
            Ok(Event::Incoming(Packet::ConnAck(ack))) => {
                tracing::info!(session_present = ack.session_present, "connected to the broker");
                self.reconnect.reset();
                self.on_connected(matches!(phase, Phase::Running));
            }
            Ok(Event::Incoming(Packet::Publish(p))) => self.on_message(&p.topic, &p.payload, phase),
            Ok(Event::Incoming(Packet::PubAck(ack))) => {
                if let Some(Tag::Status(id)) = self.link.acked(ack.pkid) {
                    if let Err(e) = self.outbox.remove(id) {
                        tracing::error!(error = %e, "cannot remove an acknowledged status from the outbox");
                    }
                }
                self.pump();
            }
            Ok(Event::Outgoing(Outgoing::Publish(pkid))) => self.link.sent(pkid),
            Ok(Event::Outgoing(Outgoing::Disconnect)) => return After::Stop,
            Ok(_) => {}
            Err(e) => {
                let was_connected = self.link.is_connected();
                self.link.disconnected();
                self.registrar.disconnected();
                self.next_heartbeat = None;
                if matches!(phase, Phase::Disconnecting { .. }) {
                    return After::Stop;
                }
                let delay = self.reconnect.next_delay();
                if was_connected || self.reconnect.failures() <= 1 {
                    tracing::warn!(error = %e, retry_in = ?delay, "broker connection lost");
                } else {
                    tracing::debug!(error = %e, retry_in = ?delay, failures = self.reconnect.failures(), "broker still unreachable");
                }
                return After::Poll(delay);
            }
        }
        After::Poll(Duration::ZERO)
    }

    fn on_connected(&mut self, running: bool) {
        self.link.connected();
        let subscriptions = self
            .topics
            .agent_subscriptions(&self.robot_id)
            .into_iter()
            .map(|t| rumqttc::SubscribeFilter::new(t, QoS::AtLeastOnce));
        if let Err(e) = self.client.try_subscribe_many(subscriptions) {
            tracing::error!(error = %e, "cannot queue the subscription");
        }
        self.publish_control(
            &self.topics.online(&self.robot_id),
            encode(&Online { v: 1, online: true }),
            true,
        );
        if running && self.registrar.connected(Instant::now().into_std()) == RegisterAction::Register {
            self.register();
        }
        self.pump();
    }

    fn register(&mut self) {
        let register = Register {
            v: 1,
            robot_id: self.robot_id.clone(),
            token: self.token.clone(),
            agent_version: env!("CARGO_PKG_VERSION").to_owned(),
            device: self.device.clone(),
            drivers: k8s4r_api::task::DRIVERS.iter().map(|d| (*d).to_owned()).collect(),
            labels: self.labels.clone(),
            running: self.running.to_vec(),
        };
        tracing::info!(running = self.running.len(), "registering");
        self.publish_control(&self.topics.register(&self.robot_id), encode(&register), false);
    }

    fn publish_control(&mut self, topic: &str, payload: Vec<u8>, retain: bool) {
        if !self.link.is_connected() {
            return;
        }
        match self.client.try_publish(topic, QoS::AtLeastOnce, retain, payload) {
            Ok(()) => self.link.handed_over(Tag::Control),
            Err(e) => tracing::warn!(topic, error = %e, "cannot queue a publish; it will be retried"),
        }
    }

    /// Hands outbox entries to the client, oldest first, while there is room.
    fn pump(&mut self) {
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
    fn on_update(&mut self, update: StatusUpdate) {
        if update.state.is_terminal() {
            self.running.remove(&update.task_uid, update.attempt);
        } else if update.state == TaskState::Running {
            self.running.insert(&update.task_uid, update.attempt);
        }
        tracing::info!(task = %update.task_uid, attempt = update.attempt, state = update.state.as_str(), "status");
        match self.outbox.push(update.clone()) {
            Ok(_) => self.pump(),
            Err(e) => {
                // Without a disk the update can still go out, just not
                // survive a restart.
                tracing::error!(error = %e, "cannot journal a status update; sending it unjournalled");
                let mut update = update;
                update.seq = self.outbox.peek_seq();
                let topic = self.topics.status(&self.robot_id, &update.task_uid);
                self.publish_control(&topic, encode(&update), false);
            }
        }
    }

    #[tracing::instrument(skip_all, fields(topic))]
    fn on_message(&mut self, topic: &str, payload: &[u8], phase: &Phase) {
        match classify(&self.topics, &self.robot_id, topic, payload) {
            Ok(Inbound::Response(response)) => {
                tracing::info!(phase = ?response.phase, message = response.message.as_deref().unwrap_or(""), "registration response");
                if self.registrar.response(response.phase, Instant::now().into_std())
                    == RegisterAction::Approved
                {
                    tracing::info!("registration approved");
                    self.next_heartbeat = matches!(phase, Phase::Running).then(Instant::now);
                    while let Some(d) = self.held.pop_front() {
                        self.on_dispatch(d, phase);
                    }
                }
            }
            Ok(Inbound::Dispatch(dispatch)) => self.on_dispatch(*dispatch, phase),
            Ok(Inbound::Cancel(cancel)) => {
                tracing::info!(task = %cancel.task_uid, attempt = cancel.attempt, reason = %cancel.reason, "cancel");
                self.held.retain(|d| {
                    !(d.task_uid == cancel.task_uid && (cancel.attempt == 0 || d.attempt == cancel.attempt))
                });
                let _ = self.commands.send(TaskCommand::Cancel(cancel));
            }
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

    #[tracing::instrument(skip_all, fields(task = %dispatch.task_uid, attempt = dispatch.attempt))]
    fn on_dispatch(&mut self, dispatch: Dispatch, phase: &Phase) {
        if !matches!(phase, Phase::Running) {
            tracing::warn!(task = %dispatch.task_uid, attempt = dispatch.attempt, "dispatch during shutdown ignored");
            return;
        }
        if !self.registrar.approved() {
            tracing::info!(task = %dispatch.task_uid, attempt = dispatch.attempt, "dispatch held until registration is approved");
            if self.held.len() >= MAX_HELD_DISPATCHES {
                self.held.pop_front();
            }
            self.held.push_back(dispatch);
            return;
        }
        if self.running.contains(&dispatch.task_uid, dispatch.attempt) {
            tracing::info!(task = %dispatch.task_uid, attempt = dispatch.attempt, "duplicate dispatch ignored");
            return;
        }
        tracing::info!(task = %dispatch.task_uid, attempt = dispatch.attempt, name = %dispatch.task_name, "dispatch");
        self.running.insert(&dispatch.task_uid, dispatch.attempt);
        let _ = self.commands.send(TaskCommand::Submit(Box::new(TaskRequest {
            uid: dispatch.task_uid,
            attempt: dispatch.attempt,
            name: dispatch.task_name,
            spec: dispatch.spec,
        })));
    }

    fn on_tick(&mut self, now: Instant, running: bool) {
        if self.registrar.tick(now.into_std()) == RegisterAction::Register {
            tracing::info!(last_phase = ?self.registrar.last_phase(), "no approval yet; registering again");
            self.register();
        }
        if let Some(at) = self.next_heartbeat {
            if now >= at && running {
                self.heartbeat();
                self.next_heartbeat = Some(now + self.jitter.spread(self.heartbeat_interval, 0.1));
            }
        }
        // A full request channel earlier may have left entries behind.
        self.pump();
    }

    fn heartbeat(&mut self) {
        if !self.link.is_connected() {
            return;
        }
        self.heartbeat_seq += 1;
        let heartbeat = Heartbeat {
            v: 1,
            robot_id: self.robot_id.clone(),
            seq: self.heartbeat_seq,
            time: jiff::Timestamp::now(),
            usage: self.sampler.sample(),
            running: self.running.to_vec(),
        };
        let topic = self.topics.heartbeat(&self.robot_id);
        if let Err(e) = self
            .client
            .try_publish(topic, QoS::AtMostOnce, false, encode(&heartbeat))
        {
            tracing::warn!(error = %e, "heartbeat skipped: request channel full");
        }
    }

    fn publish_status(&self) {
        let status = SessionStatus {
            connected: self.link.is_connected(),
            approved: self.registrar.approved(),
            outbox_len: self.outbox.len(),
            heartbeats: self.heartbeat_seq,
        };
        self.status.send_if_modified(|s| {
            let changed = *s != status;
            *s = status;
            changed
        });
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::supervisor::TaskOutcome;

    #[test]
    fn events_become_status_updates() {
        let at: jiff::Timestamp = "2026-11-22T10:00:00Z".parse().unwrap();
        let started = status_of(TaskEvent::Started {
            uid: "u".into(),
            attempt: 2,
            pid: 42,
            at,
        });
        assert_eq!(
            (started.state, started.attempt, started.start_time),
            (TaskState::Running, 2, Some(at))
        );
        let finished = status_of(TaskEvent::Finished {
            uid: "u".into(),
            attempt: 2,
            outcome: TaskOutcome {
                state: TaskState::Failed,
                exit_code: Some(143),
                signal: Some(15),
                reason: TaskReason::Timeout,
                message: "timed out".into(),
                started_at: Some(at),
                finished_at: at,
                output_tail: String::new(),
            },
        });
        assert_eq!(finished.state, TaskState::Failed);
        assert_eq!(finished.reason, Some(TaskReason::Timeout));
        assert_eq!(finished.exit_code, Some(143));
        assert_eq!(finished.output_tail, None);
        assert_eq!(finished.finish_time, Some(at));
    }
}
