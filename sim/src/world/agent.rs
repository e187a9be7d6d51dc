//! A simulated robot: the agent's own dispatch gate and fence, with a
//! session around them (connect, register, heartbeat, outbox) and task
//! processes that end when the seed says. What survives a restart is the
//! state directory: the outbox and the processes' ends.

use std::collections::{BTreeMap, VecDeque};
use std::time::Duration;

use k8s4r_agent::fence::{Fence, Refusal};
use k8s4r_agent::gate::{self, Verdict};
use k8s4r_agent::inbound::{classify, Inbound};
use k8s4r_agent::link::RunningSet;
use k8s4r_api::protocol::{encode, Cancel, Dispatch, Heartbeat, HeldList, Register, StatusUpdate, Topics};
use k8s4r_api::{DeviceInfo, RobotPhase, TaskAttempt, TaskReason, TaskState, Usage};

use super::history::What;
use super::{robot_name, Down, Ms, Net, Node, Up, PREFIX};
use crate::broker::{Message, Output};

/// The agent's heartbeat interval (its default).
const HEARTBEAT: Ms = 30_000;
/// How long a delivered status waits for its confirmation before it is
/// sent again.
const CONFIRM_TIMEOUT: Ms = 20_000;
const TICK: Ms = 500;

#[derive(Debug)]
struct Proc {
    end: Ms,
    stop: Option<TaskReason>,
    exited: bool,
}

/// What the state directory keeps across agent restarts.
#[derive(Debug, Default)]
struct Disk {
    outbox: BTreeMap<u64, StatusUpdate>,
    next_seq: u64,
    procs: BTreeMap<(String, u32), Proc>,
    restarts: u64,
    /// The agent's record of accepted attempts (`k8s4r_agent::admitted`).
    admitted: Vec<(String, u32)>,
}

/// One agent process's memory.
#[derive(Debug)]
struct Mem {
    session: String,
    nonces: u64,
    approved: bool,
    fence: Fence,
    running: RunningSet,
    held: VecDeque<Dispatch>,
    names: BTreeMap<String, String>,
    heartbeat_seq: u64,
    next_heartbeat: Ms,
    online: bool,
    reconnect_at: Ms,
    /// Outbox entries sent, and when.
    sent: BTreeMap<u64, Ms>,
    tick_at: Ms,
}

/// A simulated robot.
#[derive(Debug)]
pub struct Agent {
    robot: usize,
    name: String,
    /// The boot clock at the simulation's start.
    boot: Ms,
    topics: Topics,
    disk: Disk,
    mem: Option<Mem>,
}

impl Agent {
    /// Robot `robot`, booted `boot` before the simulation began.
    pub fn new(robot: usize, boot: Ms) -> Self {
        Self {
            robot,
            name: robot_name(robot),
            boot,
            topics: Topics::new(PREFIX),
            disk: Disk::default(),
            mem: None,
        }
    }

    fn node(&self) -> Node {
        Node::Agent(self.robot)
    }

    fn boot_clock(&self, net: &Net) -> Duration {
        Duration::from_millis(self.boot + net.now())
    }

    /// The agent process starts (first boot or after a restart).
    pub fn start(&mut self, net: &mut Net) {
        if self.mem.is_some() {
            // Two restarts overlapped: the first start already ran.
            return;
        }
        self.disk.restarts += 1;
        net.log(What::Agent {
            robot: self.robot,
            up: true,
        });
        let mut fence = Fence::new();
        for (uid, attempt) in &self.disk.admitted {
            fence.remember(uid, *attempt);
        }
        self.mem = Some(Mem {
            session: format!("{}-p{}", self.name, self.disk.restarts),
            nonces: 0,
            approved: false,
            fence,
            running: RunningSet::default(),
            held: VecDeque::new(),
            names: BTreeMap::new(),
            heartbeat_seq: 0,
            next_heartbeat: net.now(),
            online: false,
            reconnect_at: net.now(),
            sent: BTreeMap::new(),
            tick_at: net.now(),
        });
        self.tick(net);
    }

    /// SIGKILL: the memory is gone; the unit's ExecStopPost stops the batch
    /// tasks it left (`stop_left_tasks`), which the next process reports.
    /// systemd starts the next process only after ExecStopPost is done: the
    /// world restarts it no sooner than a second later, and the tasks are
    /// gone within that.
    pub fn kill(&mut self, net: &mut Net) {
        if self.mem.take().is_none() {
            return;
        }
        net.log(What::Agent {
            robot: self.robot,
            up: false,
        });
        let keys: Vec<_> = self.disk.procs.keys().cloned().collect();
        for (uid, attempt) in keys {
            self.stop_within(net, &uid, attempt, TaskReason::AgentRestarted, 900);
        }
    }

    /// The agent noticed its connection is gone (keep-alive).
    pub fn link_down(&mut self, net: &mut Net) {
        if let Some(mem) = &mut self.mem {
            mem.online = false;
            mem.reconnect_at = net.now() + net.rng().u64(1_000..5_000);
        }
    }

    /// A timer of this process.
    pub fn tick(&mut self, net: &mut Net) {
        let boot = self.boot_clock(net);
        let node = self.node();
        let Some(mem) = &mut self.mem else {
            return;
        };
        if mem.tick_at != net.now() {
            return;
        }
        mem.tick_at = net.now() + TICK;
        net.tick(node, TICK);
        if !mem.online && net.now() >= mem.reconnect_at {
            if net.connect(node, false) {
                mem.online = true;
            } else {
                mem.reconnect_at = net.now() + net.rng().u64(1_000..5_000);
            }
        }
        for (uid, attempt, _) in mem.fence.due(boot) {
            self.stop(net, &uid, attempt, TaskReason::Disconnected);
        }
        let Some(mem) = &mut self.mem else {
            return;
        };
        if mem.approved && mem.online && net.now() >= mem.next_heartbeat {
            self.heartbeat(net);
        }
        self.resend(net, Some(CONFIRM_TIMEOUT));
        self.release_held(net);
    }

    /// A packet from the broker. `ack`: the PUBACK of a QoS 1 delivery
    /// leaves (rumqttc acknowledges as it reads); false when the link is
    /// cut right after the delivery.
    pub fn receive(&mut self, net: &mut Net, packet: Down, ack: bool) {
        if self.mem.is_none() {
            return;
        }
        match packet {
            Down::Broker(Output::ConnAck { .. }) => self.connected(net),
            Down::Broker(Output::Deliver {
                packet_id, message, ..
            }) => {
                if ack && message.qos == 1 {
                    net.up(self.node(), Up::Ack(packet_id));
                }
                self.message(net, &message);
            }
            Down::Broker(Output::Closed { .. }) | Down::PubAck(_) => {}
        }
    }

    fn connected(&mut self, net: &mut Net) {
        let node = self.node();
        for filter in self.topics.agent_subscriptions(&self.name) {
            net.up(node, Up::Subscribe(filter));
        }
        let held = self.holding();
        let last_seq = self.disk.next_seq.checked_sub(1);
        let Some(mem) = &mut self.mem else {
            return;
        };
        mem.nonces += 1;
        let mut register = Register::new(&self.name, "sim", DeviceInfo::default());
        register.nonce = Some(format!("{}:{}", mem.session, mem.nonces));
        register.held = HeldList {
            running: held,
            reconcile: true,
            last_seq,
        };
        let topic = self.topics.register(&self.name);
        publish(net, node, topic, encode(&register));
        self.resend(net, None);
    }

    fn message(&mut self, net: &mut Net, message: &Message) {
        let boot = self.boot_clock(net);
        let Ok(inbound) = classify(&self.topics, &self.name, &message.topic, &message.payload) else {
            return;
        };
        let Some(mem) = &mut self.mem else {
            return;
        };
        match inbound {
            Inbound::Response(response) => {
                let ours = response
                    .nonce
                    .as_deref()
                    .is_some_and(|n| n == format!("{}:{}", mem.session, mem.nonces));
                if !ours {
                    return;
                }
                mem.fence
                    .registered(response.status_acks, response.server_time, boot);
                mem.approved = response.phase != RobotPhase::Rejected;
                mem.next_heartbeat = net.now();
                self.release_held(net);
            }
            Inbound::StatusAck(ack) => {
                if let Some(seq) = ack.heartbeat {
                    if ack.session.as_deref() == Some(mem.session.as_str()) {
                        mem.fence.heartbeat_recorded(seq, ack.time, boot);
                    }
                }
                for seq in ack.seqs {
                    self.settled(net, seq);
                }
                self.release_held(net);
            }
            Inbound::Dispatch(dispatch) => self.dispatch(net, *dispatch),
            Inbound::Cancel(cancel) => self.cancel(net, cancel),
            Inbound::LogRequest(_) | Inbound::Upgrade(_) => {}
        }
    }

    /// The server applied status `seq`.
    fn settled(&mut self, net: &mut Net, seq: u64) {
        let Some(update) = self.disk.outbox.remove(&seq) else {
            return;
        };
        if let Some(mem) = &mut self.mem {
            mem.sent.remove(&seq);
            if update.state.is_terminal() {
                mem.running.remove(&update.task_uid, update.attempt);
            }
        }
        if update.state.is_terminal() {
            net.log(What::Recorded {
                robot: self.robot,
                uid: update.task_uid,
                attempt: update.attempt,
                state: update.state,
            });
        }
    }

    fn dispatch(&mut self, net: &mut Net, dispatch: Dispatch) {
        let boot = self.boot_clock(net);
        let wall = net.wall();
        let Some(mem) = &mut self.mem else {
            return;
        };
        let verdict = gate::decide(&dispatch, mem.approved, &mem.running, &mut mem.fence, boot, wall);
        match verdict {
            Verdict::HoldForApproval => mem.held.push_back(dispatch),
            Verdict::WaitForContact => {
                mem.held.push_back(dispatch);
                mem.next_heartbeat = net.now();
            }
            Verdict::Duplicate | Verdict::Refused(Refusal::Seen { .. }) => {}
            Verdict::Refused(refusal @ Refusal::Expired { .. }) => {
                let mut update = self.update(&dispatch.task_uid, dispatch.attempt, TaskState::Failed);
                update.reason = Some(TaskReason::DispatchTimeout);
                update.message = Some(refusal.to_string());
                self.send(net, update);
            }
            Verdict::Start { stop_after } => {
                // Recorded on disk before it starts, as the agent does.
                self.disk
                    .admitted
                    .push((dispatch.task_uid.clone(), dispatch.attempt));
                if let Some(lease) = stop_after {
                    if mem.fence.contact_age(boot).is_none_or(|age| age > lease / 4) {
                        mem.next_heartbeat = net.now();
                    }
                }
                mem.running.insert(&dispatch.task_uid, dispatch.attempt);
                mem.names
                    .insert(dispatch.task_uid.clone(), dispatch.task_name.clone());
                let length = net.rng().u64(10_000..120_000);
                let end = net.now() + length;
                self.disk.procs.insert(
                    (dispatch.task_uid.clone(), dispatch.attempt),
                    Proc {
                        end,
                        stop: None,
                        exited: false,
                    },
                );
                net.exit_at(end, self.robot, &dispatch.task_uid, dispatch.attempt);
                net.log(What::Start {
                    robot: self.robot,
                    uid: dispatch.task_uid.clone(),
                    attempt: dispatch.attempt,
                });
                let mut update = self.update(&dispatch.task_uid, dispatch.attempt, TaskState::Running);
                update.start_time = Some(wall);
                self.send(net, update);
            }
        }
    }

    fn cancel(&mut self, net: &mut Net, cancel: Cancel) {
        let Some(mem) = &mut self.mem else {
            return;
        };
        let matches = |uid: &str, attempt: u32| {
            uid == cancel.task_uid && (cancel.attempt == 0 || attempt == cancel.attempt)
        };
        let held_back = mem.held.iter().any(|d| matches(&d.task_uid, d.attempt));
        mem.held.retain(|d| !matches(&d.task_uid, d.attempt));
        let live: Vec<_> = self
            .disk
            .procs
            .iter()
            .filter(|((uid, attempt), p)| !p.exited && matches(uid, *attempt))
            .map(|(key, _)| key.clone())
            .collect();
        if !live.is_empty() {
            for (uid, attempt) in live {
                self.stop(net, &uid, attempt, TaskReason::Cancelled);
            }
            return;
        }
        let ended = !held_back && mem.fence.seen(&cancel.task_uid, cancel.attempt);
        if cancel.attempt > 0 && !ended {
            let mut update = self.update(&cancel.task_uid, cancel.attempt, TaskState::Failed);
            update.reason = Some(TaskReason::Cancelled);
            self.send(net, update);
        }
    }

    /// Stops a process: SIGTERM, SIGKILL within its kill timeout.
    fn stop(&mut self, net: &mut Net, uid: &str, attempt: u32, reason: TaskReason) {
        self.stop_within(net, uid, attempt, reason, 5_000);
    }

    fn stop_within(&mut self, net: &mut Net, uid: &str, attempt: u32, reason: TaskReason, most: Ms) {
        let now = net.now();
        let within = net.rng().u64(50..most);
        let Some(proc) = self.disk.procs.get_mut(&(uid.to_owned(), attempt)) else {
            return;
        };
        if proc.exited {
            return;
        }
        proc.stop = proc.stop.or(Some(reason));
        if now + within < proc.end {
            proc.end = now + within;
            net.exit_at(proc.end, self.robot, uid, attempt);
        }
    }

    /// A process ended (when `now` is its end; an earlier schedule of its
    /// end is stale).
    pub fn exit(&mut self, net: &mut Net, uid: &str, attempt: u32) {
        let key = (uid.to_owned(), attempt);
        let Some(proc) = self.disk.procs.get_mut(&key) else {
            return;
        };
        if proc.exited || proc.end != net.now() {
            return;
        }
        proc.exited = true;
        let stop = proc.stop;
        self.disk.procs.remove(&key);
        let how = match stop {
            Some(reason) => format!("stopped ({reason:?})"),
            None => "exit 0".to_owned(),
        };
        net.log(What::Exit {
            robot: self.robot,
            uid: uid.to_owned(),
            attempt,
            how,
        });
        let mut update = match stop {
            Some(reason) => {
                let mut update = self.update(uid, attempt, TaskState::Failed);
                update.reason = Some(reason);
                update.signal = Some(15);
                update
            }
            None => {
                let mut update = self.update(uid, attempt, TaskState::Completed);
                update.exit_code = Some(0);
                update.reason = Some(TaskReason::Completed);
                update
            }
        };
        update.finish_time = Some(net.wall());
        if let Some(mem) = &mut self.mem {
            mem.fence.release(uid, attempt);
        }
        self.send(net, update);
    }

    fn update(&mut self, uid: &str, attempt: u32, state: TaskState) -> StatusUpdate {
        self.disk.next_seq += 1;
        let mut update = StatusUpdate::new(uid, attempt, self.disk.next_seq, state);
        update.task_name = self.mem.as_ref().and_then(|m| m.names.get(uid).cloned());
        update
    }

    /// Keeps a status in the outbox and sends it when the agent runs.
    fn send(&mut self, net: &mut Net, update: StatusUpdate) {
        let seq = update.seq;
        self.disk.outbox.insert(seq, update);
        if self.mem.is_some() {
            self.publish_status(net, seq);
        }
    }

    fn publish_status(&mut self, net: &mut Net, seq: u64) {
        let node = self.node();
        let Some(update) = self.disk.outbox.get(&seq) else {
            return;
        };
        let Some(mem) = &mut self.mem else {
            return;
        };
        if !mem.online {
            return;
        }
        mem.sent.insert(seq, net.now());
        let topic = self.topics.status(&self.name, &update.task_uid);
        publish(net, node, topic, encode(update));
    }

    /// Sends again what waits for a confirmation longer than `older`
    /// (everything, for None).
    fn resend(&mut self, net: &mut Net, older: Option<Ms>) {
        let Some(mem) = &self.mem else {
            return;
        };
        let now = net.now();
        let due: Vec<u64> = self
            .disk
            .outbox
            .keys()
            .filter(|seq| match (older, mem.sent.get(seq)) {
                (None, _) | (_, None) => true,
                (Some(older), Some(at)) => now.saturating_sub(*at) >= older,
            })
            .copied()
            .collect();
        for seq in due {
            self.publish_status(net, seq);
        }
    }

    fn release_held(&mut self, net: &mut Net) {
        let Some(mem) = &mut self.mem else {
            return;
        };
        if !mem.approved {
            return;
        }
        for dispatch in std::mem::take(&mut mem.held) {
            self.dispatch(net, dispatch);
        }
    }

    /// What it lists as held: running, or its end not yet confirmed.
    fn holding(&self) -> Vec<TaskAttempt> {
        let mut held: Vec<TaskAttempt> = self.mem.as_ref().map(|m| m.running.to_vec()).unwrap_or_default();
        for update in self.disk.outbox.values() {
            if !held
                .iter()
                .any(|h| h.uid == update.task_uid && h.attempt == update.attempt)
            {
                held.push(TaskAttempt::new(update.task_uid.clone(), update.attempt));
            }
        }
        held
    }

    fn heartbeat(&mut self, net: &mut Net) {
        let boot = self.boot_clock(net);
        let node = self.node();
        let held = self.holding();
        let last_seq = Some(self.disk.next_seq);
        let Some(mem) = &mut self.mem else {
            return;
        };
        mem.heartbeat_seq += 1;
        let seq = mem.heartbeat_seq;
        mem.fence.heartbeat_sent(seq, boot);
        let interval = mem
            .fence
            .shortest_lease()
            .map_or(HEARTBEAT, |l| (l.as_millis() as u64 / 4).min(HEARTBEAT));
        mem.next_heartbeat = net.now() + interval;
        let mut heartbeat = Heartbeat::new(&self.name, seq, net.wall(), Usage::default());
        heartbeat.session = Some(mem.session.clone());
        heartbeat.server_time = mem.fence.server_now(boot);
        heartbeat.held = HeldList {
            running: held,
            reconcile: true,
            last_seq,
        };
        let topic = self.topics.heartbeat(&self.name);
        publish(net, node, topic, encode(&heartbeat));
    }
}

fn publish(net: &mut Net, node: Node, topic: String, payload: Vec<u8>) {
    net.up(
        node,
        Up::Publish {
            message: Message {
                topic,
                payload,
                qos: 1,
                retain: false,
            },
            tag: None,
        },
    );
}
