//! A fleet simulator: N robots in one process, each a real MQTT client that
//! speaks the agent's protocol through the agent's own code (the protocol
//! types and topics of `k8s4r_api::protocol`, incoming messages read by the
//! agent's `inbound::classify`): it registers with a bootstrap token,
//! heartbeats with jitter, takes dispatches (admitted by the agent's own
//! fence: the server's clock, dispatch deadlines, attempts seen; held until
//! the registration is answered), "runs" each for a drawn duration, reports
//! running then completed (or failed, for a chosen fraction), answers
//! cancels, and disconnects and reconnects on request.
//! Like the agent, it keeps each status update until the server says it
//! recorded it (`tasks/acks`), lists the attempt as held until then, and
//! sends what is unconfirmed again after every registration and when a
//! confirmation is overdue. The server and the manager cannot tell it from
//! agents. (The deterministic simulation of the protocol is [`world`].)
//!
//! What it does not do: run processes, keep its outbox on disk across its
//! own restarts, stop attempts when its lease on them runs out (it never
//! loses the cluster for that long in the benchmarks), or read logs.

pub mod broker;
mod outbox;
pub mod world;

use std::collections::{HashMap, HashSet};
use std::sync::atomic::{AtomicU64, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use k8s4r_agent::fence::{Fence, Refusal};
use k8s4r_agent::inbound::{classify, Inbound};
use k8s4r_api::protocol::{
    encode, Dispatch, Heartbeat, HeldList, Online, Register, StatusUpdate, Topics, UsageReports,
};
use k8s4r_api::{DeviceInfo, RobotPhase, TaskReason, TaskState, Usage};
use k8s4r_service::lock;
use outbox::{holding, Outbox};
use rumqttc::{AsyncClient, Event, LastWill, MqttOptions, Packet, QoS};
use tokio::sync::watch;
use tokio_util::sync::CancellationToken;

/// How the simulated robots behave.
#[derive(Clone, Debug)]
pub struct SimConfig {
    /// `mqtt://host:port`.
    pub broker: String,
    /// The bootstrap token they register with.
    pub token: String,
    /// How many robots.
    pub robots: usize,
    /// Robot ids are `<prefix>-<n>`, n from `first` on.
    pub prefix: String,
    /// The number of the first robot (a fleet spread over processes gives
    /// each its own block).
    pub first: usize,
    /// Heartbeat interval (each robot ±10%, and starting at a random point
    /// of it).
    pub heartbeat: Duration,
    /// How long a task "runs": uniformly between these.
    pub task_duration: (Duration, Duration),
    /// The fraction of tasks that fail (exit code 1).
    pub fail_fraction: f64,
    /// Robots connecting per second at most (0: all at once).
    pub connect_rate: u32,
    /// The MQTT keep-alive.
    pub keep_alive: Duration,
    /// How long a status update may wait for the server's confirmation
    /// before it is sent again.
    pub confirm_timeout: Duration,
}

impl Default for SimConfig {
    fn default() -> Self {
        SimConfig {
            broker: "mqtt://127.0.0.1:1883".into(),
            token: String::new(),
            robots: 100,
            prefix: "sim".into(),
            first: 0,
            heartbeat: Duration::from_secs(30),
            task_duration: (Duration::from_millis(100), Duration::from_millis(500)),
            fail_fraction: 0.0,
            connect_rate: 0,
            keep_alive: Duration::from_secs(60),
            confirm_timeout: Duration::from_secs(30),
        }
    }
}

/// What the fleet saw, in counters.
#[derive(Debug, Default)]
pub struct Counters {
    /// Connections made (reconnects included).
    pub connects: AtomicUsize,
    /// Robots whose registration was answered Online (at least once).
    pub online: AtomicUsize,
    /// Registrations answered Online, every time (a reconnect registers
    /// again).
    pub registrations: AtomicUsize,
    /// Heartbeats sent.
    pub heartbeats: AtomicU64,
    /// Dispatches taken (duplicates of one attempt not counted).
    pub dispatches: AtomicU64,
    /// The same attempt dispatched again while held or after it ended, or
    /// refused by the fence as seen already: a re-sent dispatch, not run
    /// again. (A task run twice shows in [`Fleet::runs`].)
    pub duplicate_dispatches: AtomicU64,
    /// Dispatches refused for arriving after their deadline (reported
    /// failed, as the agent does).
    pub expired_dispatches: AtomicU64,
    /// Status updates sent again because the server had not confirmed
    /// them.
    pub resent_statuses: AtomicU64,
    /// Tasks finished (completed or failed).
    pub finished: AtomicU64,
    /// Bytes published by the robots (MQTT payloads).
    pub bytes_out: AtomicU64,
    /// Bytes received by the robots (MQTT payloads).
    pub bytes_in: AtomicU64,
}

/// How a run of an attempt ended.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum End {
    /// Exit code 0.
    Completed,
    /// Exit code 1 (the chosen fraction).
    Failed,
    /// Stopped by the server's cancel.
    Cancelled,
}

impl End {
    fn as_str(self) -> &'static str {
        match self {
            End::Completed => "completed",
            End::Failed => "failed",
            End::Cancelled => "cancelled",
        }
    }
}

/// One run of a task's attempt on one robot, as that robot saw it: what a
/// check that no task ran twice at once reads.
#[derive(Debug, Clone, PartialEq)]
pub struct Run {
    /// The Task's uid.
    pub uid: String,
    /// The attempt.
    pub attempt: u32,
    /// The robot that ran it.
    pub robot: String,
    /// When the robot started it (its status's `startTime`).
    pub start: jiff::Timestamp,
    /// When and how it ended; `None` while the robot holds it.
    pub end: Option<(jiff::Timestamp, End)>,
}

impl Run {
    /// One line, for a run read by another process:
    /// `uid attempt robot start_ms end_ms how` (`-` for both while held).
    pub fn to_line(&self) -> String {
        let (end, how) = match self.end {
            Some((at, how)) => (at.as_millisecond().to_string(), how.as_str()),
            None => ("-".to_owned(), "-"),
        };
        format!(
            "{} {} {} {} {end} {how}",
            self.uid,
            self.attempt,
            self.robot,
            self.start.as_millisecond()
        )
    }

    /// Reads what [`Run::to_line`] wrote.
    pub fn parse(line: &str) -> Option<Run> {
        let [uid, attempt, robot, start, end, how] = line.split(' ').collect::<Vec<_>>()[..] else {
            return None;
        };
        let at = |ms: &str| {
            ms.parse()
                .ok()
                .and_then(|ms| jiff::Timestamp::from_millisecond(ms).ok())
        };
        let end = match how {
            "-" => None,
            how => {
                let how = [End::Completed, End::Failed, End::Cancelled]
                    .into_iter()
                    .find(|e| e.as_str() == how)?;
                Some((at(end)?, how))
            }
        };
        Some(Run {
            uid: uid.to_owned(),
            attempt: attempt.parse().ok()?,
            robot: robot.to_owned(),
            start: at(start)?,
            end,
        })
    }

    /// Whether this run and another one of the same task were under way at
    /// the same moment (on two robots, or two attempts on one): the task
    /// ran twice at once. A run still held counts as under way until now.
    pub fn overlaps(&self, other: &Run) -> bool {
        let until = |r: &Run| r.end.map_or(jiff::Timestamp::MAX, |(at, _)| at);
        self.uid == other.uid && self.start < until(other) && other.start < until(self)
    }
}

/// The fleet's shared record: every run of an attempt, and each robot's
/// latest registration.
struct Ledger {
    started: Instant,
    /// Each robot holds the index of its runs in here.
    runs: Mutex<Vec<Run>>,
    /// Milliseconds after `started` (plus one; 0: never) of each robot's
    /// latest registration answered Online.
    registered: Vec<AtomicU64>,
}

/// The running fleet.
pub struct Fleet {
    /// Counters.
    pub counters: Arc<Counters>,
    /// When each robot was first answered Online, by robot index.
    pub online_at: Arc<Mutex<HashMap<usize, Instant>>>,
    /// What the fleet holds and has finished, and when each robot was last
    /// answered Online.
    ledger: Arc<Ledger>,
    /// Increments to make every robot drop its connection and reconnect.
    reconnect: watch::Sender<u64>,
    /// Robots with a lower index vanish: their connection drops without a
    /// goodbye, as a robot that loses power.
    vanish: watch::Sender<usize>,
    stop: CancellationToken,
    tasks: Vec<tokio::task::JoinHandle<()>>,
}

impl Fleet {
    /// Starts every robot (at `connect_rate` per second, or all at once).
    pub fn start(config: SimConfig) -> Fleet {
        let counters = Arc::new(Counters::default());
        let online_at = Arc::new(Mutex::new(HashMap::new()));
        let ledger = Arc::new(Ledger {
            started: Instant::now(),
            runs: Mutex::new(Vec::new()),
            registered: (0..config.robots).map(|_| AtomicU64::new(0)).collect(),
        });
        let (reconnect, reconnect_rx) = watch::channel(0u64);
        let (vanish, vanish_rx) = watch::channel(0usize);
        let stop = CancellationToken::new();
        let config = Arc::new(config);
        let mut tasks = Vec::with_capacity(config.robots);
        for i in 0..config.robots {
            let robot = SimRobot {
                index: i,
                id: format!("{}-{}", config.prefix, config.first + i),
                config: Arc::clone(&config),
                counters: Arc::clone(&counters),
                online_at: Arc::clone(&online_at),
                ledger: Arc::clone(&ledger),
                reconnect: reconnect_rx.clone(),
                vanish: vanish_rx.clone(),
                stop: stop.clone(),
            };
            let delay = match config.connect_rate {
                0 => Duration::ZERO,
                rate => Duration::from_secs_f64(i as f64 / f64::from(rate)),
            };
            tasks.push(tokio::spawn(async move {
                tokio::time::sleep(delay).await;
                robot.run().await;
            }));
        }
        Fleet {
            counters,
            online_at,
            ledger,
            reconnect,
            vanish,
            stop,
            tasks,
        }
    }

    /// How many robots were answered Online at or after `since`.
    pub fn registered_since(&self, since: Instant) -> usize {
        let mark = since.saturating_duration_since(self.ledger.started).as_millis() as u64 + 1;
        self.ledger
            .registered
            .iter()
            .filter(|r| r.load(Ordering::Relaxed) >= mark)
            .count()
    }

    /// Every run of an attempt so far, held ones included.
    pub fn runs(&self) -> Vec<Run> {
        lock(&self.ledger.runs).clone()
    }

    /// Makes every robot drop its connection and connect again.
    pub fn reconnect_all(&self) {
        self.reconnect.send_modify(|n| *n += 1);
    }

    /// Makes the first `n` robots vanish (`<prefix>-0` ...): their
    /// connections drop without a DISCONNECT, so the broker publishes their
    /// last will, as for a robot that lost power.
    pub fn vanish(&self, n: usize) {
        self.vanish.send_replace(n);
    }

    /// Stops every robot (without a clean disconnect: as if they vanished).
    pub async fn stop(self) {
        self.stop.cancel();
        for t in self.tasks {
            let _ = t.await;
        }
    }
}

struct SimRobot {
    index: usize,
    id: String,
    config: Arc<SimConfig>,
    counters: Arc<Counters>,
    online_at: Arc<Mutex<HashMap<usize, Instant>>>,
    ledger: Arc<Ledger>,
    reconnect: watch::Receiver<u64>,
    vanish: watch::Receiver<usize>,
    stop: CancellationToken,
}

/// A small xorshift: jitter and durations need no cryptography.
struct Rng(u64);

impl Rng {
    fn next_f64(&mut self) -> f64 {
        self.0 ^= self.0 << 13;
        self.0 ^= self.0 >> 7;
        self.0 ^= self.0 << 17;
        (self.0 >> 11) as f64 / (1u64 << 53) as f64
    }

    /// A number between `low` and `high`, to `places` decimals.
    fn between(&mut self, low: f64, high: f64, places: i32) -> f64 {
        let scale = 10f64.powi(places);
        ((low + (high - low) * self.next_f64()) * scale).round() / scale
    }
}

/// Figures such as an idle robot's computer shows (8 GiB, a mostly empty
/// disk), in the form the agent sends them, so that a heartbeat that
/// carries usage is as long as a real one.
fn idle_usage(rng: &mut Rng) -> Usage {
    const GIB: f64 = (1u64 << 30) as f64;
    Usage {
        cpu_percent: rng.between(1.0, 12.0, 1),
        memory_used_bytes: (rng.between(1.2, 3.0, 3) * GIB) as u64,
        memory_total_bytes: 8_214_155_264,
        disk_free_bytes: (rng.between(20.0, 90.0, 3) * GIB) as u64,
        load1: rng.between(0.05, 1.2, 2),
        load5: rng.between(0.05, 1.0, 2),
        load15: rng.between(0.05, 0.8, 2),
    }
}

impl SimRobot {
    fn options(&self) -> MqttOptions {
        let url = self.config.broker.trim_start_matches("mqtt://");
        let (host, port) = url.rsplit_once(':').unwrap_or((url, "1883"));
        let mut options = MqttOptions::new(
            format!("k8s4r-agent-{}", self.id),
            host,
            port.parse().unwrap_or(1883),
        );
        options.set_keep_alive(self.config.keep_alive);
        options.set_clean_session(false);
        options.set_max_packet_size(
            k8s4r_api::protocol::MAX_INCOMING_PACKET_BYTES,
            k8s4r_api::protocol::MAX_PACKET_BYTES,
        );
        let topics = Topics::default();
        options.set_last_will(LastWill::new(
            topics.online(&self.id),
            encode(&Online {
                v: k8s4r_api::protocol::PROTOCOL_VERSION,
                online: false,
            }),
            QoS::AtLeastOnce,
            true,
        ));
        options
    }

    fn publish(&self, client: &AsyncClient, topic: String, payload: Vec<u8>, retain: bool) {
        self.counters
            .bytes_out
            .fetch_add(payload.len() as u64, Ordering::Relaxed);
        let _ = client.try_publish(topic, QoS::AtLeastOnce, retain, payload);
    }

    /// Sends a status update and keeps it until the server confirms it.
    fn send_status(&self, client: &AsyncClient, outbox: &mut Outbox, update: &StatusUpdate) {
        let topic = Topics::default().status(&self.id, &update.task_uid);
        let payload = encode(update);
        self.publish(client, topic.clone(), payload.clone(), false);
        outbox
            .unconfirmed
            .insert(update.seq, (topic, payload, tokio::time::Instant::now()));
        outbox
            .attempts
            .insert(update.seq, (update.task_uid.clone(), update.attempt));
    }

    /// Sends again the updates unconfirmed since `before` (all: `None`),
    /// oldest first.
    fn resend(&self, client: &AsyncClient, outbox: &mut Outbox, before: Option<tokio::time::Instant>) {
        let now = tokio::time::Instant::now();
        for (topic, payload, sent) in outbox.unconfirmed.values_mut() {
            if before.is_some_and(|b| *sent > b) {
                continue;
            }
            self.counters.resent_statuses.fetch_add(1, Ordering::Relaxed);
            self.publish(client, topic.clone(), payload.clone(), false);
            *sent = now;
        }
    }

    fn register(&self, client: &AsyncClient, state: &mut State) {
        state.registrations += 1;
        let register = Register {
            token: Some(self.config.token.clone()),
            drivers: vec!["exec".into(), "raw_exec".into()],
            held: HeldList {
                running: holding(&state.held, &state.outbox),
                reconcile: true,
                last_seq: None,
            },
            nonce: Some(format!("{}-{}", state.session, state.registrations)),
            ..Register::new(
                &self.id,
                "sim",
                DeviceInfo {
                    arch: "x86_64".into(),
                    os: "linux".into(),
                    cpus: 4,
                    memory_bytes: 4 << 30,
                    ..DeviceInfo::default()
                },
            )
        };
        self.publish(
            client,
            Topics::default().register(&self.id),
            encode(&register),
            false,
        );
    }

    fn now(&self) -> Duration {
        self.ledger.started.elapsed()
    }

    /// A dispatch the registration allows: refused as the agent refuses it
    /// (after its deadline by the server's clock, or an attempt seen
    /// already), else "run" for a drawn duration.
    fn take(&self, client: &AsyncClient, state: &mut State, d: Dispatch) {
        let key = (d.task_uid.clone(), d.attempt);
        if state.held.contains_key(&key) || state.finished.contains(&key) {
            self.counters.duplicate_dispatches.fetch_add(1, Ordering::Relaxed);
            return;
        }
        let wall = jiff::Timestamp::now();
        if let Err(refusal) = state.fence.admit(&d, self.now(), wall) {
            if matches!(refusal, Refusal::Expired { .. }) {
                self.counters.expired_dispatches.fetch_add(1, Ordering::Relaxed);
                let mut update =
                    StatusUpdate::new(&d.task_uid, d.attempt, state.outbox.seq(), TaskState::Failed);
                update.reason = Some(TaskReason::DispatchTimeout);
                update.message = Some(refusal.to_string());
                update.finish_time = Some(wall);
                self.send_status(client, &mut state.outbox, &update);
            } else {
                self.counters.duplicate_dispatches.fetch_add(1, Ordering::Relaxed);
            }
            return;
        }
        self.counters.dispatches.fetch_add(1, Ordering::Relaxed);
        let run = {
            let mut runs = lock(&self.ledger.runs);
            runs.push(Run {
                uid: d.task_uid.clone(),
                attempt: d.attempt,
                robot: self.id.clone(),
                start: wall,
                end: None,
            });
            runs.len() - 1
        };
        let mut update = StatusUpdate::new(&d.task_uid, d.attempt, state.outbox.seq(), TaskState::Running);
        update.start_time = Some(wall);
        self.send_status(client, &mut state.outbox, &update);
        state.held.insert(key.clone(), run);
        let (lo, hi) = self.config.task_duration;
        let run = lo + (hi.saturating_sub(lo)).mul_f64(state.rng.next_f64());
        let failed = state.rng.next_f64() < self.config.fail_fraction;
        let done = state.done_tx.clone();
        tokio::spawn(async move {
            tokio::time::sleep(run).await;
            let _ = done.send((key.0, key.1, failed));
        });
    }

    /// A held attempt ended: its end is reported.
    fn finish(&self, client: &AsyncClient, state: &mut State, uid: String, attempt: u32, end: End) {
        let Some(run) = state.held.remove(&(uid.clone(), attempt)) else {
            return;
        };
        let finished = jiff::Timestamp::now();
        let started = {
            let mut runs = lock(&self.ledger.runs);
            runs[run].end = Some((finished, end));
            runs[run].start
        };
        let (state_now, reason, exit) = match end {
            End::Completed => (TaskState::Completed, TaskReason::Completed, Some(0)),
            End::Failed => (TaskState::Failed, TaskReason::Error, Some(1)),
            End::Cancelled => (TaskState::Failed, TaskReason::Cancelled, None),
        };
        let mut update = StatusUpdate::new(&uid, attempt, state.outbox.seq(), state_now);
        update.exit_code = exit;
        update.reason = Some(reason);
        update.finish_time = Some(finished);
        // As the agent's end reports do: the cluster has the start even if
        // the running report was never recorded.
        update.start_time = Some(started);
        self.send_status(client, &mut state.outbox, &update);
        state.finished.insert((uid, attempt));
        if end != End::Cancelled {
            self.counters.finished.fetch_add(1, Ordering::Relaxed);
        }
    }

    fn heartbeat(&self, client: &AsyncClient, state: &mut State) {
        state.heartbeat_seq += 1;
        let wall = jiff::Timestamp::now();
        state.fence.heartbeat_sent(state.heartbeat_seq, self.now());
        let heartbeat = Heartbeat {
            held: HeldList {
                running: holding(&state.held, &state.outbox),
                reconcile: true,
                // The list speaks for every status assigned so far.
                last_seq: (state.outbox.next_seq > 0).then_some(state.outbox.next_seq),
            },
            server_time: state.fence.server_now(self.now()),
            session: Some(state.session.clone()),
            usage: state
                .usage_reports
                .for_heartbeat(state.heartbeat_seq, state.usage.clone()),
            ..Heartbeat::new(&self.id, state.heartbeat_seq, wall, Usage::default())
        };
        self.publish(
            client,
            Topics::default().heartbeat(&self.id),
            encode(&heartbeat),
            false,
        );
        self.counters.heartbeats.fetch_add(1, Ordering::Relaxed);
    }

    async fn run(mut self) {
        let topics = Topics::default();
        let (done_tx, mut done_rx) = tokio::sync::mpsc::unbounded_channel::<(String, u32, bool)>();
        let mut state = State {
            rng: Rng(0x9E37_79B9_7F4A_7C15
                ^ ((self.config.first + self.index) as u64 + 1).wrapping_mul(0x2545_F491_4F6C_DD1D)),
            held: HashMap::new(),
            finished: HashSet::new(),
            outbox: Outbox::default(),
            fence: Fence::new(),
            session: k8s4r_agent::session::session_id(),
            registrations: 0,
            heartbeat_seq: 0,
            usage: Usage::default(),
            usage_reports: UsageReports::default(),
            waiting: Vec::new(),
            done_tx,
        };
        state.usage = idle_usage(&mut state.rng);
        'connection: loop {
            let (client, mut eventloop) = AsyncClient::new(self.options(), 64);
            let mut approved = false;
            let first = self.config.heartbeat.mul_f64(state.rng.next_f64());
            let mut next_heartbeat = tokio::time::Instant::now() + first;
            // Registration is sent again until answered, backing off, as the
            // agent's registrar does (a server not yet subscribed drops it).
            let mut register_retry = Duration::from_secs(5);
            let mut next_register: Option<tokio::time::Instant> = None;
            loop {
                tokio::select! {
                    () = self.stop.cancelled() => return,
                    changed = self.vanish.changed() => {
                        if changed.is_err() || self.index < *self.vanish.borrow() {
                            return;
                        }
                    }
                    changed = self.reconnect.changed() => {
                        if changed.is_err() {
                            return;
                        }
                        drop(eventloop);
                        continue 'connection;
                    }
                    Some((uid, attempt, failed)) = done_rx.recv() => {
                        let end = if failed { End::Failed } else { End::Completed };
                        self.finish(&client, &mut state, uid, attempt, end);
                    }
                    () = async {
                        match state.outbox.unconfirmed.values().map(|(_, _, sent)| *sent).min() {
                            Some(oldest) => tokio::time::sleep_until(oldest + self.config.confirm_timeout).await,
                            None => std::future::pending().await,
                        }
                    }, if approved => {
                        let overdue = tokio::time::Instant::now().checked_sub(self.config.confirm_timeout);
                        self.resend(&client, &mut state.outbox, overdue);
                    }
                    () = async { if let Some(at) = next_register { tokio::time::sleep_until(at).await } }, if next_register.is_some() && !approved => {
                        self.register(&client, &mut state);
                        let jitter = 0.8 + 0.4 * state.rng.next_f64();
                        next_register = Some(tokio::time::Instant::now() + register_retry.mul_f64(jitter));
                        register_retry = (register_retry * 2).min(Duration::from_secs(60));
                    }
                    () = tokio::time::sleep_until(next_heartbeat), if approved => {
                        self.heartbeat(&client, &mut state);
                        let jitter = 0.9 + 0.2 * state.rng.next_f64();
                        next_heartbeat = tokio::time::Instant::now() + self.config.heartbeat.mul_f64(jitter);
                    }
                    polled = eventloop.poll() => match polled {
                        Ok(Event::Incoming(Packet::ConnAck(_))) => {
                            self.counters.connects.fetch_add(1, Ordering::Relaxed);
                            for filter in topics.agent_subscriptions(&self.id) {
                                let _ = client.try_subscribe(filter, QoS::AtLeastOnce);
                            }
                            self.publish(&client, topics.online(&self.id), encode(&Online { v: k8s4r_api::protocol::PROTOCOL_VERSION, online: true }), true);
                            self.register(&client, &mut state);
                            next_register = Some(tokio::time::Instant::now() + register_retry);
                        }
                        Ok(Event::Incoming(Packet::Publish(p))) => {
                            self.counters.bytes_in.fetch_add(p.payload.len() as u64, Ordering::Relaxed);
                            match classify(&topics, &self.id, &p.topic, &p.payload) {
                                Ok(Inbound::Response(r)) => {
                                    // Only answers to this process's own registrations, as the agent.
                                    if !r.nonce.as_deref().is_some_and(|n| n.starts_with(state.session.as_str())) {
                                        continue;
                                    }
                                    state.fence.registered(r.status_acks, r.server_time, self.now());
                                    state.usage_reports.registered(r.usage_when_moved);
                                    if r.phase != RobotPhase::Online || approved {
                                        continue;
                                    }
                                    approved = true;
                                    self.counters.registrations.fetch_add(1, Ordering::Relaxed);
                                    let mut online = lock(&self.online_at);
                                    if online.insert(self.index, Instant::now()).is_none() {
                                        self.counters.online.fetch_add(1, Ordering::Relaxed);
                                    }
                                    drop(online);
                                    let at = self.ledger.started.elapsed().as_millis() as u64 + 1;
                                    self.ledger.registered[self.index].store(at, Ordering::Relaxed);
                                    // What the server may not have recorded goes again;
                                    // dispatches held until now are taken.
                                    self.resend(&client, &mut state.outbox, None);
                                    for d in std::mem::take(&mut state.waiting) {
                                        self.take(&client, &mut state, d);
                                    }
                                }
                                Ok(Inbound::StatusAck(ack)) => {
                                    if let Some(seq) = ack.heartbeat.filter(|_| ack.session.as_ref() == Some(&state.session)) {
                                        state.fence.heartbeat_recorded(seq, ack.time, self.now());
                                        state.usage_reports.confirmed(seq);
                                    }
                                    for seq in ack.seqs {
                                        state.outbox.unconfirmed.remove(&seq);
                                        state.outbox.attempts.remove(&seq);
                                    }
                                }
                                // Held until the registration is answered, as the agent holds them.
                                Ok(Inbound::Dispatch(d)) if !approved => state.waiting.push(*d),
                                Ok(Inbound::Dispatch(d)) => self.take(&client, &mut state, *d),
                                Ok(Inbound::Cancel(c)) => {
                                    let keys: Vec<(String, u32)> = state
                                        .held
                                        .keys()
                                        .filter(|(uid, attempt)| *uid == c.task_uid && (c.attempt == 0 || *attempt == c.attempt))
                                        .cloned()
                                        .collect();
                                    for (uid, attempt) in keys {
                                        self.finish(&client, &mut state, uid, attempt, End::Cancelled);
                                    }
                                }
                                _ => {}
                            }
                        }
                        Ok(_) => {}
                        Err(_) => {
                            approved = false;
                            tokio::time::sleep(Duration::from_millis(500 + (state.rng.next_f64() * 1000.0) as u64)).await;
                        }
                    }
                }
            }
        }
    }
}

/// One robot's memory across its connections.
struct State {
    rng: Rng,
    /// What it holds, each with the index of its run in the ledger.
    held: HashMap<(String, u32), usize>,
    finished: HashSet<(String, u32)>,
    outbox: Outbox,
    /// The agent's own fencing: the server's clock (dispatch deadlines,
    /// the heartbeat's `serverTime`) and the attempts seen.
    fence: Fence,
    /// This simulated process's id (heartbeats carry it, nonces start with it).
    session: String,
    /// Registrations sent.
    registrations: u64,
    heartbeat_seq: u64,
    /// This robot's figures (an idle robot's: they do not move).
    usage: Usage,
    /// Which of them the heartbeats carry, as the agent decides it.
    usage_reports: UsageReports,
    /// Dispatches that came before the registration was answered.
    waiting: Vec<Dispatch>,
    done_tx: tokio::sync::mpsc::UnboundedSender<(String, u32, bool)>,
}

#[cfg(test)]
mod tests {
    use super::*;

    fn run(robot: &str, attempt: u32, start: i64, end: Option<i64>) -> Run {
        let at = |ms| jiff::Timestamp::from_millisecond(ms).unwrap();
        Run {
            uid: "u1".into(),
            attempt,
            robot: robot.into(),
            start: at(start),
            end: end.map(|ms| (at(ms), End::Completed)),
        }
    }

    #[test]
    fn a_run_reads_back_from_its_line() {
        for r in [run("sim-3", 2, 1_000, Some(1_500)), run("sim-3", 1, 1_000, None)] {
            assert_eq!(Run::parse(&r.to_line()), Some(r));
        }
        assert_eq!(Run::parse("u1 1 sim-3 1000 1500 exploded"), None);
        assert_eq!(Run::parse("u1 1 sim-3"), None);
    }

    #[test]
    fn runs_overlap_only_while_both_are_under_way() {
        let first = run("sim-1", 1, 1_000, Some(2_000));
        assert!(first.overlaps(&run("sim-2", 2, 1_999, Some(3_000))));
        assert!(
            !first.overlaps(&run("sim-2", 2, 2_000, Some(3_000))),
            "one after the other"
        );
        assert!(
            first.overlaps(&run("sim-1", 2, 1_500, None)),
            "two attempts on one robot"
        );
        assert!(run("sim-2", 2, 500, None).overlaps(&first), "a run still held");
        let mut other_task = run("sim-2", 1, 1_500, None);
        other_task.uid = "u2".into();
        assert!(!first.overlaps(&other_task));
    }
}
