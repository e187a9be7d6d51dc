//! The agent's event loop: the shell around the protocol's [`core`]. It
//! owns the MQTT connection, the outbox and the timers, feeds the core
//! every event with the time, and carries out the commands it returns;
//! supervisor calls go to a worker task.
//!
//! One tokio task runs [`Session::run`]. It never awaits anything but its
//! `select!`: publishes go through `try_publish` (awaiting `publish` in the
//! task that drives rumqttc's event loop deadlocks once its in-flight window
//! is full), supervisor calls go to a worker task in order, and rumqttc's
//! `poll` runs in a future that owns the event loop and is never cancelled
//! half-way (`poll` is not cancel-safe).

use std::future::Future;
use std::pin::Pin;
use std::time::Duration;

use k8s4r_api::backoff::{Backoff, Jitter};
use k8s4r_api::protocol::{encode, Register, StatusUpdate, Topics};
use rumqttc::{AsyncClient, ConnectionError, Event, EventLoop, Outgoing, Packet, QoS};
use tokio::sync::{mpsc, oneshot, watch};
use tokio::time::Instant;
use tokio_util::sync::CancellationToken;

use crate::config::Config;
use crate::facts::FactsNow;
use crate::host::UsageSampler;
use crate::log_reader::LogReaders;
use crate::mqtt;
use crate::outbox::Outbox;
use crate::supervisor::{SupervisorHandle, TaskEvent};

mod clock;
mod contact;
pub mod core;
mod disk;
mod upgrades;
mod worker;

pub use self::clock::boot_clock;
use self::clock::now;
use self::contact::fence_adopted;
use self::core::{Command, Core, Disk, Payload, Settings};
use disk::Files;
use upgrades::UpgradeHooks;
pub use worker::status_of;
use worker::{forward_events, worker, TaskCommand};

/// How long to wait for the PUBACK of `online=false` and for the DISCONNECT
/// to go out when leaving.
const LEAVE_TIMEOUT: Duration = Duration::from_secs(2);
/// During the shutdown flush, how long the update channel must stay quiet
/// before the outbox counts as final.
const QUIET: Duration = Duration::from_millis(100);
/// Resolves when systemd's watchdog is to be told again; never without one.
async fn watchdog_due(watchdog: Option<&crate::watchdog::Watchdog>) {
    match watchdog {
        Some(dog) => tokio::time::sleep_until(dog.due()).await,
        None => std::future::pending().await,
    }
}

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

/// A random id for this agent process (hex), from the kernel's random
/// source; the clock and pid if it cannot be read.
pub fn session_id() -> String {
    use std::io::Read;
    let mut bytes = [0u8; 8];
    let random = std::fs::File::open("/dev/urandom")
        .and_then(|mut f| f.read_exact(&mut bytes))
        .map(|()| u64::from_le_bytes(bytes));
    let id = random.unwrap_or_else(|_| Jitter::from_entropy().next_f64().to_bits());
    format!("{id:016x}")
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
    core: Core,
    disk: Files,
    /// The last contact, kept for the next process of this boot.
    contact: contact::ContactFile,
    client: AsyncClient,
    eventloop: Option<EventLoop>,
    sampler: UsageSampler,
    reconnect: Backoff,
    commands: mpsc::UnboundedSender<TaskCommand>,
    health: watch::Receiver<k8s4r_api::AgentHealth>,
    updates: mpsc::UnboundedReceiver<StatusUpdate>,
    status: watch::Sender<SessionStatus>,
    flush_timeout: Duration,
    /// Readers of task output the server asked for.
    log_readers: LogReaders,
    /// Sessions from the cluster (exec, port-forward, copies).
    reach: crate::reach::Reach,
    /// Task outputs waiting for their upload; the uploader stops with the
    /// session.
    outputs: std::sync::Arc<crate::outputs::Spool>,
    _uploads: tokio_util::sync::DropGuard,
    /// The robot's facts, when the agent reads some.
    facts: Option<watch::Receiver<FactsNow>>,
    /// systemd's watchdog, told from this loop that the agent is alive.
    watchdog: Option<crate::watchdog::Watchdog>,
    /// Upgrades of this agent: a binary on trial is confirmed by its first
    /// confirmed heartbeat.
    upgrades: Option<UpgradeHooks>,
}

impl Session {
    /// Wires a session; spawns the worker and event-forwarding tasks.
    /// `admitted` records the attempts accepted; those it held at start
    /// (`seen`) are refused as already run.
    pub fn new(
        config: &Config,
        options: rumqttc::MqttOptions,
        outbox: Outbox,
        (admitted, seen): (crate::admitted::Admitted, Vec<(String, u32)>),
        supervisor: SupervisorHandle,
        events: mpsc::UnboundedReceiver<TaskEvent>,
    ) -> (Session, watch::Receiver<SessionStatus>) {
        let (client, eventloop) = mqtt::client(options, config.broker.connect_timeout);
        let (updates_tx, updates) = mpsc::unbounded_channel();
        let (commands, commands_rx) = mpsc::unbounded_channel();
        let offer = supervisor.offer().clone();
        let health = supervisor.health();
        // What the previous run left running (re-adopted) or is starting
        // again, held from the first registration so that its Tasks are
        // not "not on robot".
        let running = supervisor
            .held_at_start()
            .iter()
            .map(|held| (held.uid.clone(), held.attempt, held.name.clone()))
            .collect();
        let leases = supervisor.leases_at_start().to_vec();
        let reach = crate::reach::Reach::new(
            config.reach.clone(),
            client.clone(),
            Topics::new(&config.topic_prefix),
            config.robot_id.clone(),
            supervisor.clone(),
        );
        let outputs = supervisor.outputs().clone();
        let uploads = CancellationToken::new();
        crate::outputs::uploader::spawn(
            outputs.clone(),
            crate::outputs::uploader::Asking {
                client: client.clone(),
                topics: Topics::new(&config.topic_prefix),
                robot_id: config.robot_id.clone(),
            },
            uploads.clone(),
        );
        outputs.clone().look_while_running(uploads.clone());
        tokio::spawn(worker(supervisor, commands_rx, updates_tx.clone()));
        tokio::spawn(forward_events(events, updates_tx));
        let mut sampler = UsageSampler::new(&config.state_dir);
        let template = Register {
            token: config.token.clone(),
            drivers: offer.drivers.clone(),
            labels: config.labels.clone(),
            task_policy: Some(offer.policy.clone()),
            ..Register::new(&config.robot_id, crate::version(), sampler.device_info())
        };
        let mut jitter = Jitter::from_entropy();
        let reconnect = Backoff::new(config.reconnect_min, config.reconnect_max, jitter.clone());
        // Advance so the two backoffs do not share a sequence.
        jitter.next_f64();
        if !seen.is_empty() {
            tracing::info!(tasks = seen.len(), path = %admitted.path().display(), "attempts accepted before this start are refused if delivered again");
        }
        let mut core = Core::new(
            Settings {
                robot_id: config.robot_id.clone(),
                topic_prefix: config.topic_prefix.clone(),
                session_id: session_id(),
                template,
                heartbeat_interval: config.heartbeat_interval,
                status_hold: config.status_hold,
                register_retry: (config.register_retry_min, config.register_retry_max),
                max_outstanding: mqtt::MAX_OUTSTANDING,
                jitter,
            },
            running,
            &seen,
        );
        let contact = fence_adopted(&mut core, &leases, config);
        let (status, status_rx) = watch::channel(SessionStatus {
            outbox_len: outbox.len(),
            ..Default::default()
        });
        let log_readers = LogReaders::new(
            client.clone(),
            Topics::new(&config.topic_prefix),
            config.robot_id.clone(),
            config.supervisor.tasks_dir(),
        );
        let session = Session {
            core,
            disk: Files { outbox, admitted },
            contact,
            client,
            eventloop: Some(eventloop),
            sampler,
            reconnect,
            commands,
            health,
            updates,
            status,
            flush_timeout: config.shutdown_flush_timeout,
            log_readers,
            reach,
            outputs,
            _uploads: uploads.drop_guard(),
            facts: None,
            watchdog: None,
            upgrades: None,
        };
        (session, status_rx)
    }

    /// Reads the robot's facts from `facts`: they go to the supervisor and
    /// with every heartbeat, and a change sends one at once.
    pub fn with_facts(mut self, facts: watch::Receiver<FactsNow>) -> Self {
        self.facts = Some(facts);
        self
    }

    /// Tells systemd's watchdog from the event loop that the agent is
    /// alive, through every phase of its shutdown too.
    pub fn with_watchdog(mut self, watchdog: Option<crate::watchdog::Watchdog>) -> Self {
        self.watchdog = watchdog;
        self
    }

    /// The health the robot reports: the supervisor's, with a refused
    /// facts file or command named while nothing worse is wrong.
    fn current_health(&self) -> k8s4r_api::AgentHealth {
        let mut health = self.health.borrow().clone();
        let error = self.facts.as_ref().and_then(|rx| rx.borrow().error.clone());
        if let (Some(error), true) = (error, health.accepting_tasks) {
            health.reason = Some(k8s4r_api::AgentHealth::REASON_FACTS_REFUSED.to_owned());
            health.message = Some(format!(
                "{error}; the robot's facts are unknown until it is fixed"
            ));
        }
        health
    }

    /// Carries out what the core asked for, in order.
    fn perform(&mut self, commands: Vec<Command>) {
        let mut refused = 0;
        for command in commands {
            match command {
                Command::Publish {
                    topic,
                    payload,
                    retain,
                } => {
                    // Once the client refused one, the rest of the batch
                    // would not fit either; all go back to the core.
                    if refused > 0 {
                        refused += 1;
                        continue;
                    }
                    let payload = self.encode(payload);
                    if let Err(e) = self.client.try_publish(&topic, QoS::AtLeastOnce, retain, payload) {
                        tracing::warn!(topic, error = %e, "cannot queue a publish; it will be retried");
                        refused += 1;
                    }
                }
                Command::Subscribe(topics) => {
                    let filters = topics
                        .into_iter()
                        .map(|t| rumqttc::SubscribeFilter::new(t, QoS::AtLeastOnce));
                    if let Err(e) = self.client.try_subscribe_many(filters) {
                        tracing::error!(error = %e, "cannot queue the subscription");
                    }
                }
                Command::Start(request) => {
                    let _ = self.commands.send(TaskCommand::Submit(request));
                }
                Command::Stop { uid, attempt, cause } => {
                    let _ = self.commands.send(TaskCommand::Stop { uid, attempt, cause });
                }
                Command::Reconfigure(update) => {
                    let _ = self.commands.send(TaskCommand::Reconfigure(update));
                }
                Command::Logs(request) => self.log_readers.handle(request),
                Command::OutputAnswer(answer) => self.outputs.answer(answer),
                Command::Upgrade(order) => {
                    if let Some(hooks) = &self.upgrades {
                        crate::upgrade::start(
                            &hooks.upgrades,
                            order,
                            hooks.limits,
                            std::sync::Arc::clone(&hooks.news),
                            hooks.restart.clone(),
                            self.facts.clone(),
                        );
                    }
                }
                Command::HeartbeatConfirmed { seq, contact } => {
                    if let Some(contact) = contact {
                        self.contact.save(contact);
                    }
                    if let Some(hooks) = &self.upgrades {
                        crate::upgrade::lock(&hooks.upgrades).heartbeat_confirmed(seq);
                    }
                }
            }
        }
        for _ in 0..refused {
            self.core.withdraw_last();
        }
    }

    /// A payload as it goes out: registrations and heartbeats with the
    /// robot's health, facts, upgrade report and usage.
    fn encode(&mut self, payload: Payload) -> Vec<u8> {
        match payload {
            Payload::Bytes(bytes) => bytes,
            Payload::Register(mut register) => {
                register.health = Some(self.current_health());
                register.upgrade = self.upgrades.as_ref().and_then(UpgradeHooks::report);
                encode(&*register)
            }
            Payload::Heartbeat(mut heartbeat) => {
                let seq = heartbeat.seq;
                heartbeat.health = Some(self.current_health());
                heartbeat.facts = self.facts.as_ref().map(|rx| rx.borrow().facts.clone());
                heartbeat.upgrade = self.upgrades.as_ref().and_then(|h| h.report_in_heartbeat(seq));
                heartbeat.usage = self.core.usage_for(seq, self.sampler.sample());
                encode(&*heartbeat)
            }
        }
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
            let wake = self.next_wake(&phase, Instant::now());
            tokio::select! {
                (eventloop, result) = &mut poll => {
                    match self.on_poll(result, &phase) {
                        After::Poll(delay) => poll = Box::pin(poll_once(eventloop, delay)),
                        After::Stop => break,
                    }
                }
                Some(()) = facts_changed(&mut self.facts) => self.on_facts(),
                () = upgrades::news(self.upgrades.as_ref()) => self.core.news(now()),
                Some(update) = self.updates.recv() => {
                    let commands = self.core.status(update, now(), &mut self.disk);
                    self.perform(commands);
                    if let Phase::Flushing { quiet_since, .. } = &mut phase {
                        *quiet_since = Instant::now();
                    }
                }
                _ = shutdown.cancelled(), if matches!(phase, Phase::Running) => {
                    tracing::info!("shutting down: stopping tasks");
                    let commands = self.core.leave(&mut self.disk);
                    self.perform(commands);
                    self.log_readers.stop_all();
                    self.reach.stop_all();
                    let (tx, rx) = oneshot::channel();
                    let _ = self.commands.send(TaskCommand::Shutdown(tx));
                    stopping = Some(rx);
                    phase = Phase::StoppingTasks;
                }
                _ = async { match stopping.as_mut() { Some(rx) => { let _ = rx.await; } None => std::future::pending().await } } => {
                    stopping = None;
                    tracing::info!(outbox = self.disk.len(), "tasks stopped; flushing the outbox");
                    let now = Instant::now();
                    phase = Phase::Flushing { deadline: now + self.flush_timeout, quiet_since: now };
                }
                _ = tokio::time::sleep_until(wake) => {
                    let commands = self.core.tick(now(), &mut self.disk);
                    self.perform(commands);
                }
                () = watchdog_due(self.watchdog.as_ref()) => {
                    if let Some(dog) = self.watchdog.as_mut() {
                        dog.ping(Instant::now());
                    }
                }
            }
            phase = self.advance(phase);
            if let Phase::Disconnecting { deadline } = phase {
                if !self.core.is_connected() || Instant::now() >= deadline {
                    break;
                }
            }
            self.publish_status();
        }
        tracing::info!(outbox = self.disk.len(), "agent stopped");
        self.publish_status();
    }

    /// The facts changed: the supervisor checks tasks against them, and
    /// the core sends a heartbeat with them.
    fn on_facts(&mut self) {
        let Some(rx) = self.facts.as_mut() else {
            return;
        };
        let facts = rx.borrow_and_update().facts.clone();
        let _ = self.commands.send(TaskCommand::Facts(facts));
        self.core.facts_changed(now());
    }

    /// Moves the shutdown sequence along.
    fn advance(&mut self, phase: Phase) -> Phase {
        let now = Instant::now();
        match phase {
            Phase::Flushing {
                deadline,
                quiet_since,
            } => {
                let drained = self.disk.is_empty() && now.duration_since(quiet_since) >= QUIET;
                if drained || now >= deadline {
                    if !drained {
                        tracing::warn!(
                            outbox = self.disk.len(),
                            "flush timeout: undelivered status updates stay in the outbox for the next start"
                        );
                    }
                    if self.core.is_connected() {
                        let commands = self.core.say_offline();
                        self.perform(commands);
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
                if self.core.idle() || now >= deadline || !self.core.is_connected() {
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
        let wake = match self.core.next_wake() {
            Some(at) => now + at.saturating_sub(boot_clock()),
            None => now + Duration::from_secs(3600),
        };
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
        let commands = match result {
            Ok(Event::Incoming(Packet::ConnAck(ack))) => {
                tracing::info!(session_present = ack.session_present, "connected to the broker");
                self.reconnect.reset();
                self.core.connected(now(), &mut self.disk)
            }
            Ok(Event::Incoming(Packet::Publish(p))) if self.reach.offer(&p.topic, &p.payload) => Vec::new(),
            Ok(Event::Incoming(Packet::Publish(p))) => {
                let span = tracing::info_span!("message", topic = %p.topic);
                let _entered = span.enter();
                self.core
                    .message(&p.topic, &p.payload, p.retain, now(), &mut self.disk)
            }
            Ok(Event::Incoming(Packet::PubAck(ack))) => self.core.puback(ack.pkid, now(), &mut self.disk),
            Ok(Event::Outgoing(Outgoing::Publish(pkid))) => {
                self.core.sent(pkid);
                Vec::new()
            }
            Ok(Event::Outgoing(Outgoing::Disconnect)) => return After::Stop,
            Ok(_) => Vec::new(),
            Err(e) => {
                let was_connected = self.core.is_connected();
                self.core.disconnected();
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
        };
        self.perform(commands);
        After::Poll(Duration::ZERO)
    }

    fn publish_status(&self) {
        let status = SessionStatus {
            connected: self.core.is_connected(),
            approved: self.core.approved(),
            outbox_len: self.disk.len(),
            heartbeats: self.core.heartbeats(),
        };
        self.status.send_if_modified(|s| {
            let changed = *s != status;
            *s = status;
            changed
        });
    }
}

/// Resolves when the facts changed; pending forever without facts (or once
/// their reader is gone).
async fn facts_changed(facts: &mut Option<watch::Receiver<FactsNow>>) -> Option<()> {
    match facts {
        Some(rx) => match rx.changed().await {
            Ok(()) => Some(()),
            Err(_) => std::future::pending().await,
        },
        None => std::future::pending().await,
    }
}
