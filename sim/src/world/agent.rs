//! A simulated robot: the agent's own protocol core
//! (`k8s4r_agent::session::core`) in a shell of simulated parts: the
//! broker link, task processes that end when the seed says, and a state
//! directory (the outbox, the record of accepted attempts, the task
//! processes) that survives a restart of the agent.

use std::collections::BTreeMap;
use std::time::Duration;

use k8s4r_agent::session::core::{Admissions, Command, Core, Disk, Memory, Now, Payload, Settings};
use k8s4r_agent::supervisor::outcome::StopCause;
use k8s4r_api::backoff::Jitter;
use k8s4r_api::protocol::{encode, Register, StatusUpdate};
use k8s4r_api::{DeviceInfo, TaskReason, TaskState};

use super::history::What;
use super::{robot_name, Down, Ms, Net, Node, Up, PREFIX};
use crate::broker::{Message, Output};

/// The agent's heartbeat interval (its default).
const HEARTBEAT: Duration = Duration::from_secs(30);
/// The agent's registration retries (its defaults).
const REGISTER_RETRY: (Duration, Duration) = (Duration::from_secs(5), Duration::from_secs(60));
const TICK: Ms = 500;

#[derive(Debug)]
struct Proc {
    /// When it started, by the robot's wall clock (what its report says).
    started: jiff::Timestamp,
    end: Ms,
    stop: Option<TaskReason>,
    /// Its `stopAfter`, when the robot fences it.
    stop_after: Option<Duration>,
}

/// One agent process's memory.
#[derive(Debug)]
struct Mem {
    core: Core,
    online: bool,
    reconnect_at: Ms,
    tick_at: Ms,
    /// The packet id of the next publish (rumqttc counts from 1).
    next_pkid: u16,
}

/// A simulated robot.
#[derive(Debug)]
pub struct Agent {
    robot: usize,
    name: String,
    /// The boot clock at the simulation's start.
    boot: Ms,
    /// How far the robot's wall clock is from the cluster's, in ms (a
    /// wrong RTC, NTP stepping it).
    wall_offset: i64,
    /// The state directory: the outbox and the record of accepted attempts.
    files: Memory,
    procs: BTreeMap<(String, u32), Proc>,
    /// The last contact a process kept in the runtime directory (boot
    /// clock), for the next one.
    contact: Option<Duration>,
    restarts: u64,
    mem: Option<Mem>,
}

impl Agent {
    /// Robot `robot`, booted `boot` before the simulation began; its
    /// agent records accepted attempts on disk when `records`.
    pub fn new(robot: usize, boot: Ms, records: bool) -> Self {
        Self {
            robot,
            name: robot_name(robot),
            boot,
            wall_offset: 0,
            files: Memory {
                admissions: if records {
                    Admissions::Record
                } else {
                    Admissions::Forget
                },
                ..Memory::default()
            },
            procs: BTreeMap::new(),
            contact: None,
            restarts: 0,
            mem: None,
        }
    }

    fn node(&self) -> Node {
        Node::Agent(self.robot)
    }

    fn now(&self, net: &Net) -> Now {
        Now {
            mono: Duration::from_millis(self.boot + net.now()),
            wall: net.wall() + jiff::SignedDuration::from_millis(self.wall_offset),
        }
    }

    /// The robot's wall clock steps by `ms` (its boot clock does not).
    pub fn step_clock(&mut self, ms: i64) {
        self.wall_offset += ms;
    }

    /// The agent process starts (first boot or after a restart).
    pub fn start(&mut self, net: &mut Net) {
        if self.mem.is_some() {
            // Two restarts overlapped: the first start already ran.
            return;
        }
        self.restarts += 1;
        net.log(What::Agent {
            robot: self.robot,
            up: true,
        });
        let settings = Settings {
            robot_id: self.name.clone(),
            topic_prefix: PREFIX.to_owned(),
            session_id: format!("{}-p{}", self.name, self.restarts),
            template: Register::new(&self.name, "sim", DeviceInfo::default()),
            heartbeat_interval: HEARTBEAT,
            status_hold: k8s4r_agent::config::DEFAULT_STATUS_HOLD,
            register_retry: REGISTER_RETRY,
            max_outstanding: k8s4r_agent::mqtt::MAX_OUTSTANDING,
            jitter: Jitter::with_seed(net.rng().u64(..)),
        };
        // What the previous process left running, as the supervisor reports
        // it at start (re-adopted), and the leases of those it fences.
        let running = self
            .procs
            .keys()
            .map(|(uid, attempt)| (uid.clone(), *attempt, None))
            .collect();
        let leases: Vec<_> = self
            .procs
            .iter()
            .filter_map(|((uid, attempt), p)| Some((uid.clone(), *attempt, p.stop_after?)))
            .collect();
        let mut core = Core::new(settings, running, &self.files.admitted);
        core.adopted(&leases, self.contact, self.now(net));
        self.mem = Some(Mem {
            core,
            online: false,
            reconnect_at: net.now(),
            tick_at: net.now(),
            next_pkid: 1,
        });
        // The supervisor reports each re-adopted attempt's start again
        // (the killed process may have held it unsent).
        let starts: Vec<_> = self
            .procs
            .iter()
            .map(|((uid, attempt), p)| (uid.clone(), *attempt, p.started))
            .collect();
        for (uid, attempt, started) in starts {
            let mut update = StatusUpdate::new(&uid, attempt, 0, TaskState::Running);
            update.start_time = Some(started);
            self.report(net, update);
        }
        self.tick(net);
    }

    /// SIGKILL (or the SIGTERM of a restart): the memory is gone; the
    /// tasks run on under their shims, and the unit restarts (its
    /// ExecStopPost leaves them: no stop job). The next process re-adopts
    /// them, fencing them from the contact this one kept.
    pub fn kill(&mut self, net: &mut Net) {
        if self.mem.take().is_none() {
            return;
        }
        net.log(What::Agent {
            robot: self.robot,
            up: false,
        });
    }

    /// The agent noticed its connection is gone (keep-alive).
    pub fn link_down(&mut self, net: &mut Net) {
        if let Some(mem) = &mut self.mem {
            mem.core.disconnected();
            mem.online = false;
            mem.reconnect_at = net.now() + net.rng().u64(1_000..5_000);
        }
    }

    /// A timer of this process.
    pub fn tick(&mut self, net: &mut Net) {
        let now = self.now(net);
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
        let commands = mem.core.tick(now, &mut self.files);
        self.perform(net, commands);
    }

    /// A packet from the broker. `ack`: the PUBACK of a QoS 1 delivery
    /// leaves (rumqttc acknowledges as it reads); false when the link is
    /// cut right after the delivery.
    pub fn receive(&mut self, net: &mut Net, packet: Down, ack: bool) {
        let now = self.now(net);
        let node = self.node();
        let Some(mem) = &mut self.mem else {
            return;
        };
        let commands = match packet {
            Down::Broker(Output::ConnAck { .. }) => mem.core.connected(now, &mut self.files),
            Down::Broker(Output::Deliver {
                packet_id, message, ..
            }) => {
                if ack && message.qos == 1 {
                    net.up(node, Up::Ack(packet_id));
                }
                mem.core.message(
                    &message.topic,
                    &message.payload,
                    message.retain,
                    now,
                    &mut self.files,
                )
            }
            Down::PubAck((_, pkid)) => match u16::try_from(pkid) {
                Ok(pkid) => mem.core.puback(pkid, now, &mut self.files),
                Err(_) => Vec::new(),
            },
            Down::Broker(Output::Closed { .. }) => Vec::new(),
        };
        self.perform(net, commands);
    }

    /// Carries out what the core asked for, as the agent's session does.
    fn perform(&mut self, net: &mut Net, commands: Vec<Command>) {
        for command in commands {
            match command {
                Command::Subscribe(filters) => {
                    for filter in filters {
                        net.up(self.node(), Up::Subscribe(filter));
                    }
                }
                Command::Publish {
                    topic,
                    payload,
                    retain,
                } => self.publish(net, topic, payload, retain),
                Command::Start(request) => self.spawn(net, &request.uid, request.attempt, request.stop_after),
                Command::Stop { uid, attempt, cause } => {
                    let reason = match cause {
                        StopCause::Disconnected(_) => TaskReason::Disconnected,
                        StopCause::Drained(_) => TaskReason::Drained,
                        _ => TaskReason::Cancelled,
                    };
                    let live: Vec<_> = self
                        .procs
                        .keys()
                        .filter(|(u, a)| *u == uid && attempt.is_none_or(|n| n == *a))
                        .cloned()
                        .collect();
                    for (uid, attempt) in live {
                        self.stop_within(net, &uid, attempt, reason, 5_000);
                    }
                }
                Command::HeartbeatConfirmed { contact, .. } => self.contact = self.contact.max(contact),
                Command::Logs(_)
                | Command::Upgrade(_)
                | Command::Reconfigure(_)
                | Command::OutputAnswer(_) => {}
            }
        }
        for update in std::mem::take(&mut self.files.settled) {
            net.log(What::Recorded {
                robot: self.robot,
                uid: update.task_uid,
                attempt: update.attempt,
                state: update.state,
            });
        }
    }

    /// Hands a QoS 1 publish to the link, as rumqttc does: a packet id the
    /// core learns, and the broker's PUBACK comes back tagged with it.
    fn publish(&mut self, net: &mut Net, topic: String, payload: Payload, retain: bool) {
        let node = self.node();
        let Some(mem) = &mut self.mem else {
            return;
        };
        let pkid = mem.next_pkid;
        mem.next_pkid = mem.next_pkid.checked_add(1).unwrap_or(1);
        mem.core.sent(pkid);
        let payload = match payload {
            Payload::Bytes(bytes) => bytes,
            Payload::Register(register) => encode(&*register),
            Payload::Heartbeat(heartbeat) => encode(&*heartbeat),
        };
        let message = Message {
            topic,
            payload,
            qos: 1,
            retain,
        };
        net.up(
            node,
            Up::Publish {
                message,
                tag: Some((self.name.clone(), u32::from(pkid))),
            },
        );
    }

    /// The supervisor starts the attempt's process and reports it running.
    fn spawn(&mut self, net: &mut Net, uid: &str, attempt: u32, stop_after: Option<Duration>) {
        let now = self.now(net);
        let end = net.now() + net.rng().u64(10_000..120_000);
        let proc = Proc {
            started: now.wall,
            end,
            stop: None,
            stop_after,
        };
        self.procs.insert((uid.to_owned(), attempt), proc);
        net.exit_at(end, self.robot, uid, attempt);
        net.log(What::Start {
            robot: self.robot,
            uid: uid.to_owned(),
            attempt,
        });
        let mut update = StatusUpdate::new(uid, attempt, 0, TaskState::Running);
        update.start_time = Some(now.wall);
        self.report(net, update);
    }

    /// Stops a process: SIGTERM, then SIGKILL within `most` ms.
    fn stop_within(&mut self, net: &mut Net, uid: &str, attempt: u32, reason: TaskReason, most: Ms) {
        let now = net.now();
        let within = net.rng().u64(50..most);
        let Some(proc) = self.procs.get_mut(&(uid.to_owned(), attempt)) else {
            return;
        };
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
        let Some(proc) = self.procs.get(&key) else {
            return;
        };
        if proc.end != net.now() {
            return;
        }
        let stop = proc.stop;
        self.procs.remove(&key);
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
                let mut update = StatusUpdate::new(uid, attempt, 0, TaskState::Failed);
                update.reason = Some(reason);
                update.signal = Some(15);
                update
            }
            None => {
                let mut update = StatusUpdate::new(uid, attempt, 0, TaskState::Completed);
                update.exit_code = Some(0);
                update.reason = Some(TaskReason::Completed);
                update
            }
        };
        update.finish_time = Some(self.now(net).wall);
        self.report(net, update);
    }

    /// A status from the supervisor: through the core when the agent runs;
    /// into its journal for the next process otherwise (the supervisor's
    /// journal keeps the ends of tasks the unit stopped).
    fn report(&mut self, net: &mut Net, update: StatusUpdate) {
        let now = self.now(net);
        match &mut self.mem {
            Some(mem) => {
                let commands = mem.core.status(update, now, &mut self.files);
                self.perform(net, commands);
            }
            None => {
                self.files.push(update);
            }
        }
    }
}
