//! One robot of the scale fleet: the agent's own protocol core
//! (`k8s4r_agent::session::core`) in a shell of a real MQTT client and
//! simulated tasks that "run" for a drawn duration. Everything the robot
//! decides (registration, heartbeats and their schedule, the fence, which
//! dispatch starts, what it lists as held, when a status goes again) is the
//! agent's code; the shell only carries the commands out, as the agent's
//! session does.

use std::collections::{HashMap, HashSet};
use std::sync::atomic::Ordering;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use k8s4r_agent::inbound::{classify, Inbound};
use k8s4r_agent::session::core::{Command, Core, Memory, Now, Payload, Settings};
use k8s4r_api::backoff::Jitter;
use k8s4r_api::protocol::{encode, Online, Register, StatusUpdate, Topics};
use k8s4r_api::{DeviceInfo, TaskReason, TaskState, Usage};
use k8s4r_service::lock;
use rumqttc::{AsyncClient, Event, EventLoop, LastWill, MqttOptions, Outgoing, Packet, QoS};
use tokio::sync::{mpsc, watch};
use tokio_util::sync::CancellationToken;

use crate::{Counters, End, Ledger, Run, SimConfig};

pub(crate) struct SimRobot {
    pub(crate) index: usize,
    pub(crate) id: String,
    pub(crate) config: Arc<SimConfig>,
    pub(crate) counters: Arc<Counters>,
    pub(crate) online_at: Arc<Mutex<HashMap<usize, Instant>>>,
    pub(crate) ledger: Arc<Ledger>,
    pub(crate) reconnect: watch::Receiver<u64>,
    pub(crate) vanish: watch::Receiver<usize>,
    pub(crate) stop: CancellationToken,
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

/// One robot's memory across its connections.
struct State {
    core: Core,
    /// The outbox (the scale fleet never restarts its robots' processes).
    disk: Memory,
    rng: Rng,
    topics: Topics,
    /// What it runs, each with the index of its run in the ledger.
    held: HashMap<(String, u32), usize>,
    /// Every attempt it started.
    started: HashSet<(String, u32)>,
    /// This robot's figures (an idle robot's: they do not move).
    usage: Usage,
    /// Status publishes, and statuses pushed: the difference is resends.
    statuses_published: u64,
    done_tx: mpsc::UnboundedSender<(String, u32, bool)>,
}

impl SimRobot {
    fn options(&self) -> MqttOptions {
        let url = self.config.broker.trim_start_matches("mqtt://");
        let (host, port) = url.rsplit_once(':').unwrap_or((url, "1883"));
        let mut options = MqttOptions::new(
            k8s4r_agent::mqtt::client_id(&self.id),
            host,
            port.parse().unwrap_or(1883),
        );
        options.set_keep_alive(self.config.keep_alive);
        options.set_clean_session(false);
        options.set_max_packet_size(
            k8s4r_api::protocol::MAX_INCOMING_PACKET_BYTES,
            k8s4r_api::protocol::MAX_PACKET_BYTES,
        );
        options.set_inflight(k8s4r_agent::mqtt::CLIENT_INFLIGHT);
        options.set_last_will(LastWill::new(
            Topics::default().online(&self.id),
            encode(&Online::new(false)),
            QoS::AtLeastOnce,
            true,
        ));
        options
    }

    fn core(&self, rng: &mut Rng) -> Core {
        let template = Register {
            token: Some(self.config.token.clone()),
            drivers: vec!["exec".into(), "raw_exec".into()],
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
        let settings = Settings {
            robot_id: self.id.clone(),
            topic_prefix: Topics::default().prefix().to_owned(),
            session_id: k8s4r_agent::session::session_id(),
            template,
            heartbeat_interval: self.config.heartbeat,
            status_hold: k8s4r_agent::config::DEFAULT_STATUS_HOLD,
            register_retry: (Duration::from_secs(5), Duration::from_secs(60)),
            max_outstanding: k8s4r_agent::mqtt::MAX_OUTSTANDING,
            jitter: Jitter::with_seed(rng.next_f64().to_bits()),
        };
        Core::new(settings, Vec::new(), &[])
    }

    fn now(&self) -> Now {
        Now {
            mono: self.ledger.started.elapsed(),
            wall: jiff::Timestamp::now(),
        }
    }

    /// Carries out what the core asked for, as the agent's session does.
    fn perform(&self, client: &AsyncClient, state: &mut State, commands: Vec<Command>) {
        let mut refused = 0;
        let mut pending: std::collections::VecDeque<Command> = commands.into();
        while let Some(command) = pending.pop_front() {
            match command {
                Command::Publish {
                    topic,
                    payload,
                    retain,
                } => {
                    if refused > 0 {
                        refused += 1;
                        continue;
                    }
                    let payload = match payload {
                        Payload::Bytes(bytes) => {
                            state.statuses_published += u64::from(!retain && !topic.ends_with("/online"));
                            bytes
                        }
                        Payload::Register(register) => encode(&*register),
                        Payload::Heartbeat(mut heartbeat) => {
                            self.counters.heartbeats.fetch_add(1, Ordering::Relaxed);
                            heartbeat.usage = state.core.usage_for(heartbeat.seq, state.usage.clone());
                            encode(&*heartbeat)
                        }
                    };
                    let len = payload.len() as u64;
                    match client.try_publish(topic, QoS::AtLeastOnce, retain, payload) {
                        Ok(()) => {
                            self.counters.bytes_out.fetch_add(len, Ordering::Relaxed);
                        }
                        Err(_) => refused += 1,
                    }
                }
                Command::Subscribe(filters) => {
                    for filter in filters {
                        let _ = client.try_subscribe(filter, QoS::AtLeastOnce);
                    }
                }
                Command::Start(request) => {
                    // "Runs" it: `/bin/false` fails, as it would.
                    let fails = request.spec.command == "/bin/false";
                    let more = self.start(state, request.uid, request.attempt, fails);
                    pending.extend(more);
                }
                Command::Stop { uid, attempt, .. } => {
                    let keys: Vec<(String, u32)> = state
                        .held
                        .keys()
                        .filter(|(u, a)| *u == uid && attempt.is_none_or(|n| n == *a))
                        .cloned()
                        .collect();
                    for (uid, attempt) in keys {
                        pending.extend(self.finish(state, uid, attempt, End::Cancelled));
                    }
                }
                Command::Logs(_)
                | Command::Upgrade(_)
                | Command::Reconfigure(_)
                | Command::OutputAnswer(_)
                | Command::HeartbeatConfirmed { .. } => {}
            }
        }
        for _ in 0..refused {
            state.core.withdraw_last();
        }
        let expired = state
            .disk
            .settled
            .drain(..)
            .filter(|u| u.reason == Some(TaskReason::DispatchTimeout))
            .count();
        self.counters
            .expired_dispatches
            .fetch_add(expired as u64, Ordering::Relaxed);
        let resent = state.statuses_published.saturating_sub(state.disk.next_seq);
        if resent > 0 {
            self.counters.resent_statuses.fetch_add(resent, Ordering::Relaxed);
            state.statuses_published -= resent;
        }
    }

    /// The supervisor "starts" an attempt: it runs for a drawn duration,
    /// and is reported running.
    fn start(&self, state: &mut State, uid: String, attempt: u32, fails: bool) -> Vec<Command> {
        self.counters.dispatches.fetch_add(1, Ordering::Relaxed);
        let wall = jiff::Timestamp::now();
        let run = {
            let mut runs = lock(&self.ledger.runs);
            runs.push(Run {
                uid: uid.clone(),
                attempt,
                robot: self.id.clone(),
                start: wall,
                end: None,
            });
            runs.len() - 1
        };
        state.held.insert((uid.clone(), attempt), run);
        state.started.insert((uid.clone(), attempt));
        let (lo, hi) = self.config.task_duration;
        let length = lo + (hi.saturating_sub(lo)).mul_f64(state.rng.next_f64());
        let failed = fails || state.rng.next_f64() < self.config.fail_fraction;
        let done = state.done_tx.clone();
        let key = (uid.clone(), attempt);
        tokio::spawn(async move {
            tokio::time::sleep(length).await;
            let _ = done.send((key.0, key.1, failed));
        });
        let mut update = StatusUpdate::new(&uid, attempt, 0, TaskState::Running);
        update.start_time = Some(wall);
        state.core.status(update, self.now(), &mut state.disk)
    }

    /// A held attempt ended: its end is reported.
    fn finish(&self, state: &mut State, uid: String, attempt: u32, end: End) -> Vec<Command> {
        let Some(run) = state.held.remove(&(uid.clone(), attempt)) else {
            return Vec::new();
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
        let mut update = StatusUpdate::new(&uid, attempt, 0, state_now);
        update.exit_code = exit;
        update.reason = Some(reason);
        update.finish_time = Some(finished);
        // As the agent's end reports do: the cluster has the start even if
        // the running report was never recorded.
        update.start_time = Some(started);
        if end != End::Cancelled {
            self.counters.finished.fetch_add(1, Ordering::Relaxed);
        }
        state.core.status(update, self.now(), &mut state.disk)
    }

    /// A message from the broker, counted as the fleet counts them.
    fn message(&self, state: &mut State, topic: &str, payload: &[u8], retain: bool) -> Vec<Command> {
        self.counters
            .bytes_in
            .fetch_add(payload.len() as u64, Ordering::Relaxed);
        if let Ok(Inbound::Dispatch(d)) = classify(&state.topics, &self.id, topic, payload) {
            if state.started.contains(&(d.task_uid.clone(), d.attempt)) {
                self.counters.duplicate_dispatches.fetch_add(1, Ordering::Relaxed);
            }
        }
        let approved = state.core.approved();
        let commands = state
            .core
            .message(topic, payload, retain, self.now(), &mut state.disk);
        if !approved && state.core.approved() {
            self.counters.registrations.fetch_add(1, Ordering::Relaxed);
            let mut online = lock(&self.online_at);
            if online.insert(self.index, Instant::now()).is_none() {
                self.counters.online.fetch_add(1, Ordering::Relaxed);
            }
            drop(online);
            let at = self.ledger.started.elapsed().as_millis() as u64 + 1;
            self.ledger.registered[self.index].store(at, Ordering::Relaxed);
        }
        commands
    }

    /// One poll result of the client.
    fn polled(
        &self,
        state: &mut State,
        polled: Result<Event, rumqttc::ConnectionError>,
    ) -> Option<Vec<Command>> {
        let now = self.now();
        Some(match polled {
            Ok(Event::Incoming(Packet::ConnAck(_))) => {
                self.counters.connects.fetch_add(1, Ordering::Relaxed);
                state.core.connected(now, &mut state.disk)
            }
            Ok(Event::Incoming(Packet::Publish(p))) => self.message(state, &p.topic, &p.payload, p.retain),
            Ok(Event::Incoming(Packet::PubAck(ack))) => state.core.puback(ack.pkid, now, &mut state.disk),
            Ok(Event::Outgoing(Outgoing::Publish(pkid))) => {
                state.core.sent(pkid);
                Vec::new()
            }
            Ok(_) => Vec::new(),
            Err(_) => {
                state.core.disconnected();
                return None;
            }
        })
    }

    pub(crate) async fn run(mut self) {
        let (done_tx, mut done_rx) = mpsc::unbounded_channel::<(String, u32, bool)>();
        let mut rng = Rng(0x9E37_79B9_7F4A_7C15
            ^ ((self.config.first + self.index) as u64 + 1).wrapping_mul(0x2545_F491_4F6C_DD1D));
        let usage = idle_usage(&mut rng);
        let mut state = State {
            core: self.core(&mut rng),
            disk: Memory::default(),
            rng,
            topics: Topics::default(),
            held: HashMap::new(),
            started: HashSet::new(),
            usage,
            statuses_published: 0,
            done_tx,
        };
        'connection: loop {
            // As the agent connects, with its default connect timeout.
            let (client, mut eventloop) =
                k8s4r_agent::mqtt::client(self.options(), k8s4r_agent::config::DEFAULT_CONNECT_TIMEOUT);
            loop {
                let wake = state
                    .core
                    .next_wake()
                    .map_or(Duration::from_secs(3600), |at| at.saturating_sub(self.now().mono));
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
                        state.core.disconnected();
                        drop(eventloop);
                        continue 'connection;
                    }
                    Some((uid, attempt, failed)) = done_rx.recv() => {
                        let end = if failed { End::Failed } else { End::Completed };
                        let commands = self.finish(&mut state, uid, attempt, end);
                        self.perform(&client, &mut state, commands);
                    }
                    () = tokio::time::sleep(wake) => {
                        let commands = state.core.tick(self.now(), &mut state.disk);
                        self.perform(&client, &mut state, commands);
                    }
                    polled = eventloop.poll() => match self.polled(&mut state, polled) {
                        Some(commands) => self.perform(&client, &mut state, commands),
                        None => {
                            forget_pending(&mut eventloop);
                            tokio::time::sleep(Duration::from_millis(500 + (state.rng.next_f64() * 1000.0) as u64)).await;
                        }
                    }
                }
            }
        }
    }
}

/// rumqttc keeps what was in flight for a resumed session; the core
/// replays its outbox itself, as the agent's session does.
fn forget_pending(eventloop: &mut EventLoop) {
    eventloop.pending.clear();
}
