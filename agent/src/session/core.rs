//! The agent's side of the protocol, without I/O: it takes an event and the
//! time, and returns what to do ([`Command`]s) for a shell to carry out.
//!
//! The agent's [`Session`](super::Session) is one shell: rumqttc, the
//! supervisor, tokio's timers. The deterministic simulation of the fleet
//! (`k8s4r-sim`'s `world`) is another: a simulated broker, simulated task
//! processes, a virtual clock. Both run this code, so a simulated robot
//! speaks exactly the agent's protocol.
//!
//! What the core keeps on the robot's disk, the outbox of statuses and the
//! record of accepted attempts, it reaches through [`Disk`] rather than
//! through commands: a status's seq and whether an acceptance was recorded
//! must be known before the next decision (an attempt starts only once its
//! acceptance is on disk), and a command carried out later could not say.

use std::collections::{BTreeMap, VecDeque};
use std::time::Duration;

use jiff::Timestamp;
use k8s4r_api::backoff::{Backoff, Jitter};
use k8s4r_api::protocol::{
    encode, ConfigUpdate, Dispatch, Heartbeat, LogRequest, Online, Register, StatusUpdate, Topics,
    UpgradeOrder, UsageReports,
};

use crate::fence::Fence;
use crate::link::{Link, RegisterAction, Registrar, RunningSet, Tag};
use crate::supervisor::outcome::StopCause;
use crate::supervisor::TaskRequest;

mod downlink;
mod memory;
mod uplink;

pub use memory::{Admissions, Memory};

/// Dispatches kept while waiting for approval; older ones beyond this are
/// dropped (the server's dispatch timeout sends them again).
const MAX_HELD_DISPATCHES: usize = 256;
/// The shortest time between two heartbeats a change of facts sends early:
/// a robot whose facts flap costs the cluster at most five a second.
const FACTS_EVERY: Duration = Duration::from_millis(200);

/// The time of an event: `mono` on the clock that keeps running while the
/// robot is suspended (the agent's `CLOCK_BOOTTIME`), `wall` the robot's
/// own clock (for timestamps, and a server that never said its time).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Now {
    /// Since boot.
    pub mono: Duration,
    /// The wall clock.
    pub wall: Timestamp,
}

/// What the core keeps on the robot's disk; it survives a restart of the
/// agent.
pub trait Disk {
    /// Gives `update` the next seq and keeps it until [`Disk::settle`]; an
    /// update that cannot be written is kept in memory (and said so): it is
    /// still sent, it just would not survive a restart.
    fn push(&mut self, update: StatusUpdate) -> u64;
    /// Drops the update `seq` (confirmed by the server, or by the broker for
    /// a server that does not confirm).
    fn settle(&mut self, seq: u64);
    /// The update `seq`, if it still waits.
    fn get(&self, seq: u64) -> Option<&StatusUpdate>;
    /// The first waiting update with a seq of at least `from`.
    fn first_from(&self, from: u64) -> Option<(u64, &StatusUpdate)>;
    /// The (task uid, attempt) of every waiting update, oldest first.
    fn waiting(&self) -> Vec<(String, u32)>;
    /// How many updates wait.
    fn len(&self) -> usize;
    /// Whether none waits.
    fn is_empty(&self) -> bool {
        self.len() == 0
    }
    /// The seq the next update will get.
    fn next_seq(&self) -> u64;
    /// Records that this attempt was accepted, durably, before it starts.
    fn admit(&mut self, uid: &str, attempt: u32) -> std::io::Result<()>;
}

/// What a publish carries. Registrations and heartbeats leave room for
/// what only the shell knows (the robot's health, facts, upgrade report,
/// usage); the shell fills it in and encodes them.
#[derive(Debug, Clone, PartialEq)]
pub enum Payload {
    /// Encoded already.
    Bytes(Vec<u8>),
    /// A registration.
    Register(Box<Register>),
    /// A heartbeat.
    Heartbeat(Box<Heartbeat>),
}

/// What the core asks its shell to do, in order.
#[derive(Debug)]
pub enum Command {
    /// Subscribe to these topics (QoS 1).
    Subscribe(Vec<String>),
    /// Hand a QoS 1 publish to the client; counted as handed over. One the
    /// client refuses (its request channel full) goes back through
    /// [`Core::withdraw_last`].
    Publish {
        /// The topic.
        topic: String,
        /// What it carries.
        payload: Payload,
        /// Whether the broker keeps it.
        retain: bool,
    },
    /// Give this attempt to the supervisor (its acceptance is on disk).
    Start(Box<TaskRequest>),
    /// Stop an attempt (None: whatever attempt of the task runs).
    Stop {
        /// The Task.
        uid: String,
        /// The attempt.
        attempt: Option<u32>,
        /// Why.
        cause: StopCause,
    },
    /// A running attempt's configuration changed.
    Reconfigure(Box<ConfigUpdate>),
    /// The server asked for a task's output.
    Logs(LogRequest),
    /// The server answered the uploader.
    OutputAnswer(k8s4r_api::protocol::outputs::OutputAnswer),
    /// An upgrade of the agent was ordered.
    Upgrade(UpgradeOrder),
    /// The server recorded this process's heartbeat `seq` (an upgrade on
    /// trial is confirmed by it); `contact` is the fence's contact now
    /// (boot clock), which the shell keeps for the next process of this
    /// boot.
    HeartbeatConfirmed { seq: u64, contact: Option<Duration> },
}

/// The agent's protocol state: registration, the connection's publishes,
/// the heartbeat schedule, the fence, and the dispatches it holds.
#[derive(Debug)]
pub struct Core {
    robot_id: String,
    topics: Topics,
    /// The registration's fixed parts (token, drivers, labels, device).
    template: Register,
    link: Link,
    registrar: Registrar,
    running: RunningSet,
    jitter: Jitter,
    heartbeat_interval: Duration,
    heartbeat_seq: u64,
    next_heartbeat: Option<Duration>,
    /// Dispatches waiting for the registration's approval, or for fresh
    /// contact (a fenced attempt is admitted only while contact is fresh).
    held: VecDeque<Dispatch>,
    /// This process's id: heartbeats carry it and their confirmations
    /// echo it; registration nonces start with it.
    session_id: String,
    /// The `namespace/name` of each Task uid held, from its dispatch: sent
    /// with what the robot holds and with its statuses, so that a server
    /// whose cache lacks the uid can read the Task.
    names: BTreeMap<String, String>,
    /// Contact with the cluster and the leases of the attempts held.
    fence: Fence,
    /// The server confirms statuses it applied (it said so at
    /// registration): outbox entries wait for that, not for the PUBACK.
    /// None until this process's first answer: a status the broker takes
    /// before it waits too, or a restarted agent would forget a status
    /// the server had not applied yet (the server's own acknowledgement
    /// to the broker comes before its write).
    status_acks: Option<bool>,
    /// Which usage figures the heartbeats carry.
    usage: UsageReports,
    /// Outbox entries the broker acknowledged, waiting for the server's
    /// confirmation, and when the broker did.
    delivered: BTreeMap<u64, Duration>,
    /// How long a delivered status may wait for the server's confirmation
    /// before the outbox is sent again.
    confirm_timeout: Duration,
    /// When a change of facts last sent a heartbeat early.
    facts_sent: Option<Duration>,
    /// The latest output of each running attempt made while the link was
    /// down: it goes when the link is back (unless the attempt ended).
    unsent_output: BTreeMap<(String, u32), StatusUpdate>,
    /// How long an attempt's report that it runs waits before it is
    /// journaled and sent (see [`Core::status`]).
    status_hold: Duration,
    /// Reports that an attempt runs, held until the time given (boot
    /// clock): one that ends meanwhile is reported once, with its end.
    held_reports: BTreeMap<(String, u32), (StatusUpdate, Duration)>,
    /// The agent is shutting down: no heartbeats, registrations or new
    /// work; statuses still go out.
    leaving: bool,
}

/// How a core is set up.
#[derive(Debug, Clone)]
pub struct Settings {
    /// The robot's id.
    pub robot_id: String,
    /// The MQTT topic prefix.
    pub topic_prefix: String,
    /// This process's id.
    pub session_id: String,
    /// The registration's fixed parts.
    pub template: Register,
    /// The heartbeat interval with no fenced attempt held.
    pub heartbeat_interval: Duration,
    /// How long an attempt's report that it runs waits (0: not at all).
    pub status_hold: Duration,
    /// Registration retries.
    pub register_retry: (Duration, Duration),
    /// At most this many QoS 1 publishes between hand-over and PUBACK.
    pub max_outstanding: usize,
    /// Seeds the heartbeat spread and the registration backoff.
    pub jitter: Jitter,
}

impl Core {
    /// A core for a new agent process that still holds `running` (what the
    /// previous process left running or is starting again, with the Task
    /// names it kept) and refuses the attempts in `seen` (accepted by an
    /// earlier process).
    pub fn new(
        settings: Settings,
        running: Vec<(String, u32, Option<String>)>,
        seen: &[(String, u32)],
    ) -> Self {
        let Settings {
            robot_id,
            topic_prefix,
            session_id,
            template,
            heartbeat_interval,
            status_hold,
            register_retry,
            max_outstanding,
            mut jitter,
        } = settings;
        let backoff = Backoff::new(
            register_retry.0,
            register_retry.1,
            Jitter::with_seed(jitter.next_f64().to_bits()),
        );
        let mut set = RunningSet::default();
        let mut names = BTreeMap::new();
        for (uid, attempt, name) in running {
            set.insert(&uid, attempt);
            if let Some(name) = name {
                names.insert(uid, name);
            }
        }
        let mut fence = Fence::new();
        for (uid, attempt) in seen {
            fence.remember(uid, *attempt);
        }
        Core {
            topics: Topics::new(&topic_prefix),
            registrar: Registrar::new(backoff, session_id.clone()),
            robot_id,
            template,
            link: Link::new(max_outstanding),
            running: set,
            jitter,
            heartbeat_interval,
            heartbeat_seq: 0,
            next_heartbeat: None,
            held: VecDeque::new(),
            session_id,
            names,
            fence,
            status_acks: None,
            usage: UsageReports::default(),
            delivered: BTreeMap::new(),
            confirm_timeout: (heartbeat_interval * 2).clamp(Duration::from_secs(5), Duration::from_secs(60)),
            facts_sent: None,
            unsent_output: BTreeMap::new(),
            status_hold,
            held_reports: BTreeMap::new(),
            leaving: false,
        }
    }

    /// A CONNACK arrived: subscribe, say online, register, and send
    /// everything unconfirmed again.
    pub fn connected(&mut self, now: Now, disk: &mut dyn Disk) -> Vec<Command> {
        let mut out = vec![Command::Subscribe(
            self.topics.agent_subscriptions(&self.robot_id),
        )];
        self.link.connected();
        self.delivered.clear();
        let online = self.topics.online(&self.robot_id);
        self.publish_control(&mut out, online, Payload::Bytes(encode(&Online::new(true))), true);
        if !self.leaving && self.registrar.connected(now.mono) == RegisterAction::Register {
            self.register(&mut out, disk);
        }
        for (_, update) in std::mem::take(&mut self.unsent_output) {
            self.status_into(update, disk, &mut out);
        }
        self.pump(&mut out, disk);
        out
    }

    /// The connection failed: everything in flight goes again on the next.
    pub fn disconnected(&mut self) {
        self.link.disconnected();
        self.registrar.disconnected();
        self.next_heartbeat = None;
    }

    /// The client sent a publish with this packet id.
    pub fn sent(&mut self, pkid: u16) {
        self.link.sent(pkid);
    }

    /// The client refused the publish last handed over.
    pub fn withdraw_last(&mut self) {
        self.link.withdraw_last();
    }

    /// The broker acknowledged packet `pkid`.
    pub fn puback(&mut self, pkid: u16, now: Now, disk: &mut dyn Disk) -> Vec<Command> {
        let mut out = Vec::new();
        if let Some(Tag::Status(id)) = self.link.acked(pkid) {
            if self.status_acks != Some(false) {
                // The broker has it; the server has not said it applied it.
                if disk.get(id).is_some() {
                    self.delivered.insert(id, now.mono);
                }
            } else {
                self.settle(id, disk);
            }
        }
        self.pump(&mut out, disk);
        out
    }

    /// The agent begins to shut down: no more heartbeats or new work; the
    /// reports it held go now (into the outbox, which the next process
    /// sends if this one cannot).
    pub fn leave(&mut self, disk: &mut dyn Disk) -> Vec<Command> {
        self.leaving = true;
        self.next_heartbeat = None;
        let mut out = Vec::new();
        for (_, (update, _)) in std::mem::take(&mut self.held_reports) {
            self.record(update, disk, &mut out);
        }
        out
    }

    /// The last word on a connection: `online=false`, retained.
    pub fn say_offline(&mut self) -> Vec<Command> {
        let mut out = Vec::new();
        let topic = self.topics.online(&self.robot_id);
        self.publish_control(&mut out, topic, Payload::Bytes(encode(&Online::new(false))), true);
        out
    }

    /// The robot's facts changed: a heartbeat carries them now (at most one
    /// per [`FACTS_EVERY`]).
    pub fn facts_changed(&mut self, now: Now) {
        let Some(next) = self.next_heartbeat else {
            // Not registered yet: the first heartbeat carries them.
            return;
        };
        let soonest = self
            .facts_sent
            .map_or(now.mono, |sent| (sent + FACTS_EVERY).max(now.mono));
        self.next_heartbeat = Some(next.min(soonest));
    }

    /// The previous process of this boot left these fenced attempts
    /// running (re-adopted by the supervisor), and had contact at
    /// `contact` (boot clock) as far as it wrote down: they are fenced from
    /// then on, as if this process had held them all along.
    pub fn adopted(&mut self, leases: &[(String, u32, Duration)], contact: Option<Duration>, now: Now) {
        self.fence.adopted(leases, contact);
        if let Some(shortest) = leases.iter().map(|(_, _, d)| *d).min() {
            self.heartbeat_for(shortest, now);
        }
    }

    /// Something the heartbeats report moved on (an upgrade): a registered
    /// agent says so at once.
    pub fn news(&mut self, now: Now) {
        if self.next_heartbeat.is_some() {
            self.next_heartbeat = Some(now.mono);
        }
    }

    /// When [`Core::tick`] has something to do next.
    pub fn next_wake(&self) -> Option<Duration> {
        [
            self.next_heartbeat,
            self.registrar.deadline(),
            self.fence.next_deadline(),
            self.delivered.values().min().map(|at| *at + self.confirm_timeout),
            self.held_reports.values().map(|(_, due)| *due).min(),
        ]
        .into_iter()
        .flatten()
        .min()
    }

    /// Whether a CONNACK arrived since the last error.
    pub fn is_connected(&self) -> bool {
        self.link.is_connected()
    }

    /// Whether nothing waits for the broker.
    pub fn idle(&self) -> bool {
        self.link.idle()
    }

    /// Whether the server answered Online on this connection.
    pub fn approved(&self) -> bool {
        self.registrar.approved()
    }

    /// Heartbeats sent by this process.
    pub fn heartbeats(&self) -> u64 {
        self.heartbeat_seq
    }

    /// Attempts it runs or was given.
    pub fn running(&self) -> &RunningSet {
        &self.running
    }

    /// The usage figures heartbeat `seq` carries, from what the robot
    /// measures now.
    pub fn usage_for(&mut self, seq: u64, now: k8s4r_api::Usage) -> Option<k8s4r_api::Usage> {
        self.usage.for_heartbeat(seq, now)
    }

    /// Hands a control publish (registration, presence, heartbeat) over.
    fn publish_control(&mut self, out: &mut Vec<Command>, topic: String, payload: Payload, retain: bool) {
        if !self.link.is_connected() {
            return;
        }
        self.link.handed_over(Tag::Control);
        out.push(Command::Publish {
            topic,
            payload,
            retain,
        });
    }

    /// Drops a settled status.
    fn settle(&mut self, seq: u64, disk: &mut dyn Disk) {
        self.delivered.remove(&seq);
        disk.settle(seq);
    }

    fn push_held(&mut self, dispatch: Dispatch) {
        if self.held.len() >= MAX_HELD_DISPATCHES {
            self.held.pop_front();
        }
        self.held.push_back(dispatch);
    }
}

/// A `failed` update for an attempt that never reached the supervisor.
pub fn failed_status(
    uid: &str,
    attempt: u32,
    reason: k8s4r_api::TaskReason,
    message: String,
    wall: Timestamp,
) -> StatusUpdate {
    StatusUpdate {
        reason: Some(reason),
        message: Some(message),
        finish_time: Some(wall),
        ..StatusUpdate::new(uid, attempt, 0, k8s4r_api::TaskState::Failed)
    }
}

#[cfg(test)]
mod tests;
