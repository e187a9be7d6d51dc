//! The agent's event loop: owns the MQTT connection, the outbox and the
//! timers, and talks to the supervisor through a worker task.
//!
//! One tokio task runs [`Session::run`]. It never awaits anything but its
//! `select!`: publishes go through `try_publish` (awaiting `publish` in the
//! task that drives rumqttc's event loop deadlocks once its in-flight window
//! is full), supervisor calls go to a worker task in order, and rumqttc's
//! `poll` runs in a future that owns the event loop and is never cancelled
//! half-way (`poll` is not cancel-safe).

use std::collections::{BTreeMap, HashMap, VecDeque};
use std::future::Future;
use std::pin::Pin;
use std::time::Duration;

use k8s4r_api::backoff::{Backoff, Jitter};
use k8s4r_api::names::{DEFAULT_BOOTSTRAP_SECRET, DEFAULT_NAMESPACE};
use k8s4r_api::protocol::{encode, Dispatch, Online, StatusUpdate, Topics, UsageReports};
use k8s4r_api::DeviceInfo;
use rumqttc::{AsyncClient, ConnectionError, Event, EventLoop, Outgoing, Packet, QoS};
use tokio::sync::{mpsc, oneshot, watch};
use tokio::time::Instant;
use tokio_util::sync::CancellationToken;

use crate::config::Config;
use crate::facts::FactsNow;
use crate::fence::Fence;
use crate::host::UsageSampler;
use crate::link::{Link, RegisterAction, Registrar, RunningSet, Tag, REJECTED_RETRY_MAX};
use crate::log_reader::LogReaders;
use crate::mqtt;
use crate::outbox::Outbox;
use crate::supervisor::{SupervisorHandle, TaskEvent};

mod downlink;
mod upgrades;
mod uplink;
mod worker;

use upgrades::UpgradeHooks;
pub use worker::{failed_status, status_of};
use worker::{forward_events, worker, TaskCommand};

/// Dispatches kept while waiting for approval; older ones beyond this are
/// dropped (the server's dispatch timeout sends them again).
const MAX_HELD_DISPATCHES: usize = 256;
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

/// Now, on the clock that keeps running while the robot is suspended
/// (`CLOCK_BOOTTIME`): fencing counts silence on it, so a robot that slept
/// through a replacement does not think it was silent for a moment only.
pub fn boot_clock() -> Duration {
    nix::time::clock_gettime(nix::time::ClockId::CLOCK_BOOTTIME)
        .map(Duration::from)
        // Linux has it since 2.6.39; a monotonic fallback for anything else.
        .unwrap_or_else(|_| START.get_or_init(std::time::Instant::now).elapsed())
}

static START: std::sync::OnceLock<std::time::Instant> = std::sync::OnceLock::new();

/// Says that the cluster rejected this robot: an error when it is news,
/// with what a person must do, and quietly while it goes on (the
/// registrar spaces the retries out meanwhile).
fn report_rejection(message: Option<&str>, news: bool, retry_in: Duration) {
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
    /// Dispatches waiting for the registration's approval, or for fresh
    /// contact (a fenced attempt is admitted only while contact is fresh).
    held: VecDeque<Dispatch>,
    /// This process's id: heartbeats carry it and their confirmations
    /// echo it; registration nonces start with it.
    session_id: String,
    /// The `namespace/name` of each Task uid held, from its dispatch: sent
    /// with what the robot holds and with its statuses, so that a server
    /// whose cache lacks the uid can read the Task.
    names: HashMap<String, String>,
    /// Contact with the cluster and the leases of the attempts held.
    fence: Fence,
    /// The server confirms statuses it applied (it said so at
    /// registration): outbox entries wait for that, not for the PUBACK.
    status_acks: bool,
    /// Which usage figures the heartbeats carry.
    usage: UsageReports,
    /// Outbox entries the broker acknowledged, waiting for the server's
    /// confirmation, and when the broker did.
    delivered: BTreeMap<u64, Instant>,
    /// How long a delivered status may wait for the server's confirmation
    /// before the outbox is sent again.
    confirm_timeout: Duration,
    commands: mpsc::UnboundedSender<TaskCommand>,
    /// What the supervisor offers (drivers, task policy) and its health,
    /// reported at registration and in every heartbeat.
    offer: crate::supervisor::Offer,
    health: watch::Receiver<k8s4r_api::AgentHealth>,
    updates: mpsc::UnboundedReceiver<StatusUpdate>,
    updates_tx: mpsc::UnboundedSender<StatusUpdate>,
    status: watch::Sender<SessionStatus>,
    flush_timeout: Duration,
    /// Readers of task output the server asked for.
    log_readers: LogReaders,
    /// The robot's facts, when the agent reads some.
    facts: Option<watch::Receiver<FactsNow>>,
    /// When a change of facts last sent a heartbeat early.
    facts_sent: Option<Instant>,
    /// systemd's watchdog, told from this loop that the agent is alive.
    watchdog: Option<crate::watchdog::Watchdog>,
    /// Upgrades of this agent: a binary on trial is confirmed by its first
    /// confirmed heartbeat.
    upgrades: Option<UpgradeHooks>,
    /// The attempts accepted, on disk: each is recorded before it starts,
    /// and a restarted agent refuses them again.
    admitted: Option<crate::admitted::Admitted>,
}

/// What the previous run left running (re-adopted) or is starting again,
/// held from the first registration so that its Tasks are not "not on
/// robot"; and the Task names the supervisor kept for them.
fn held_at_start(supervisor: &SupervisorHandle) -> (RunningSet, HashMap<String, String>) {
    let mut running = RunningSet::default();
    let mut names = HashMap::new();
    for held in supervisor.held_at_start() {
        running.insert(&held.uid, held.attempt);
        if let Some(name) = &held.name {
            names.insert(held.uid.clone(), name.clone());
        }
    }
    (running, names)
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
        let offer = supervisor.offer().clone();
        let health = supervisor.health();
        let (running, names) = held_at_start(&supervisor);
        let session_id = session_id();
        tokio::spawn(worker(supervisor, commands_rx, updates_tx.clone()));
        tokio::spawn(forward_events(events, updates_tx.clone()));
        let mut sampler = UsageSampler::new(&config.state_dir);
        let device = sampler.device_info();
        let mut jitter = Jitter::from_entropy();
        let reconnect = Backoff::new(config.reconnect_min, config.reconnect_max, jitter.clone());
        // Advance so the two backoffs do not share a sequence.
        jitter.next_f64();
        let register_backoff = Backoff::new(
            config.register_retry_min,
            config.register_retry_max,
            Jitter::with_seed(jitter.next_f64().to_bits()),
        );
        let registrar = Registrar::new(register_backoff, session_id.clone());
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
            robot_id: config.robot_id.clone(),
            token: config.token.clone(),
            labels: config.labels.clone(),
            topics: Topics::new(&config.topic_prefix),
            client,
            eventloop: Some(eventloop),
            link: Link::new(mqtt::MAX_OUTSTANDING),
            registrar,
            running,
            outbox,
            sampler,
            device,
            jitter,
            reconnect,
            heartbeat_interval: config.heartbeat_interval,
            heartbeat_seq: 0,
            next_heartbeat: None,
            held: VecDeque::new(),
            session_id,
            names,
            fence: Fence::new(),
            status_acks: false,
            usage: UsageReports::default(),
            delivered: BTreeMap::new(),
            confirm_timeout: (config.heartbeat_interval * 2)
                .clamp(Duration::from_secs(5), Duration::from_secs(60)),
            commands,
            offer,
            health,
            updates,
            updates_tx,
            status,
            flush_timeout: config.shutdown_flush_timeout,
            log_readers,
            facts: None,
            facts_sent: None,
            watchdog: None,
            upgrades: None,
            admitted: None,
        };
        (session, status_rx)
    }

    /// Records accepted attempts in `admitted` before they start; `seen`,
    /// what it held at start, is refused as already run.
    pub fn with_admitted(mut self, admitted: crate::admitted::Admitted, seen: Vec<(String, u32)>) -> Self {
        for (uid, attempt) in &seen {
            self.fence.remember(uid, *attempt);
        }
        if !seen.is_empty() {
            tracing::info!(tasks = seen.len(), path = %admitted.path().display(), "attempts accepted before this start are refused if delivered again");
        }
        self.admitted = Some(admitted);
        self
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
                Some(()) = uplink::facts_changed(&mut self.facts) => self.on_facts(Instant::now()),
                () = upgrades::news(self.upgrades.as_ref()) => self.on_upgrade_news(),
                Some(update) = self.updates.recv() => {
                    self.on_update(update);
                    if let Phase::Flushing { quiet_since, .. } = &mut phase {
                        *quiet_since = Instant::now();
                    }
                }
                _ = shutdown.cancelled(), if matches!(phase, Phase::Running) => {
                    tracing::info!("shutting down: stopping tasks");
                    self.next_heartbeat = None;
                    self.log_readers.stop_all();
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
                () = watchdog_due(self.watchdog.as_ref()) => {
                    if let Some(dog) = self.watchdog.as_mut() {
                        dog.ping(Instant::now());
                    }
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
                            encode(&Online::new(false)),
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
            self.fence
                .next_deadline()
                .map(|at| now + at.saturating_sub(boot_clock())),
            self.delivered.values().min().map(|at| *at + self.confirm_timeout),
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
            // Every topic the agent reads is a command from the server, which
            // never retains one: a retained message was left by someone
            // else (a robot before the ACL was tightened) and would act
            // again at every start.
            Ok(Event::Incoming(Packet::Publish(p))) if p.retain => {
                tracing::warn!(topic = %p.topic, "ignored a retained message on a command topic");
            }
            Ok(Event::Incoming(Packet::Publish(p))) => self.on_message(&p.topic, &p.payload, phase),
            Ok(Event::Incoming(Packet::PubAck(ack))) => {
                if let Some(Tag::Status(id)) = self.link.acked(ack.pkid) {
                    if self.status_acks {
                        // The broker has it; the server has not said it applied it.
                        if self.outbox.contains(id) {
                            self.delivered.insert(id, Instant::now());
                        }
                    } else {
                        self.forget(id);
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
        // Everything unconfirmed goes out again on this connection.
        self.delivered.clear();
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
            encode(&Online::new(true)),
            true,
        );
        if running && self.registrar.connected(Instant::now().into_std()) == RegisterAction::Register {
            self.register();
        }
        self.pump();
    }

    /// Drops a settled status from the outbox.
    fn forget(&mut self, id: u64) {
        self.delivered.remove(&id);
        if let Err(e) = self.outbox.remove(id) {
            tracing::error!(error = %e, "cannot remove a settled status from the outbox");
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
