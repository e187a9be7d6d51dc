//! The MQTT protocol between agents and the server (version 1).
//!
//! Every robot-originated topic sits under the robot's own id so that one
//! broker ACL line (`pattern readwrite k8s4r/robots/%u/#`) keeps a robot from
//! speaking for another. Bodies are JSON with a `v` field.

use std::collections::BTreeMap;

use jiff::Timestamp;
use serde::de::DeserializeOwned;
use serde::{Deserialize, Serialize};

use crate::duration::DurationString;
use crate::robot::{AgentHealth, DeviceInfo, RobotPhase, TaskPolicy, Usage};
use crate::task::{RestartStatus, TaskAttempt, TaskReason, TaskState, TaskTemplate};
use crate::validation::validate_robot_id;

pub mod outputs;
pub mod reach;
mod upgrade;
pub use upgrade::{UpgradeOrder, UpgradeReport};

/// The protocol version this build speaks.
pub const PROTOCOL_VERSION: u32 = 1;
/// The largest body accepted or sent. A dispatch carries a whole task spec;
/// 256 KiB leaves room for long argument lists and environments.
pub const MAX_MESSAGE_BYTES: usize = 256 * 1024;
/// The largest MQTT packet a body of [`MAX_MESSAGE_BYTES`] makes: the body,
/// a topic of up to 1 KiB and the fixed and variable headers. Broker, server
/// and agent all use this one limit (Mosquitto's `max_packet_size`,
/// rumqttd's `max_payload_size`, rumqttc's packet limits), so a packet one
/// of them accepts the others accept too.
pub const MAX_PACKET_BYTES: usize = MAX_MESSAGE_BYTES + 4096;
/// The largest packet the server and agents read. Well above what the broker
/// forwards: a bigger packet makes rumqttc drop the connection, and a QoS 1
/// message in a persistent session would then come back on every reconnect.
/// Anything between [`MAX_MESSAGE_BYTES`] and this is read, refused by
/// [`decode`] as [`ProtocolError::TooLarge`] and counted.
pub const MAX_INCOMING_PACKET_BYTES: usize = 16 * MAX_PACKET_BYTES;
/// The default topic prefix.
pub const DEFAULT_PREFIX: &str = "k8s4r";

/// Most attempts a `running` list (register, heartbeat) names. Far above
/// what a robot runs at once; an agent holding more (statuses of many
/// finished attempts waiting for confirmation) sends the first this many
/// and says the list is not complete.
pub const MAX_HELD_ATTEMPTS: usize = 1024;
/// Most drivers a registration names.
pub const MAX_DRIVERS: usize = 16;
/// Most labels a registration reports.
pub const MAX_LABELS: usize = 64;
/// Most users, and most groups, a task policy names.
pub const MAX_POLICY_NAMES: usize = 64;
/// Most status seqs one acknowledgement settles.
pub const MAX_ACK_SEQS: usize = 1024;
/// Longest registration nonce or agent session id, in bytes.
pub const MAX_NONCE_BYTES: usize = 64;

/// What went wrong with a topic or a body.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum ProtocolError {
    /// The body is bigger than [`MAX_MESSAGE_BYTES`].
    #[error("message of {size} bytes exceeds the limit of {limit} bytes")]
    TooLarge {
        /// The body's size.
        size: usize,
        /// The limit.
        limit: usize,
    },
    /// Not JSON, or not the expected shape.
    #[error("malformed {kind} message: {reason}")]
    Malformed {
        /// The message type expected.
        kind: &'static str,
        /// The JSON parser's complaint, with line and column.
        reason: String,
    },
    /// The body has no `v` field.
    #[error("{kind} message has no protocol version field \"v\"")]
    MissingVersion {
        /// The message type expected.
        kind: &'static str,
    },
    /// The body's `v` is not one this build speaks.
    #[error("{kind} message has protocol version {got}, this build speaks {supported}")]
    UnsupportedVersion {
        /// The message type expected.
        kind: &'static str,
        /// The version in the body.
        got: u64,
        /// The version spoken here.
        supported: u32,
    },
    /// The topic is not one of the protocol's.
    #[error("unknown topic {topic:?}")]
    UnknownTopic {
        /// The topic.
        topic: String,
    },
    /// The topic's robot id (or task uid) is empty, a wildcard, or invalid.
    #[error("invalid {what} {value:?} in topic {topic:?}: {reason}")]
    InvalidTopicId {
        /// `robot id` or `task uid`.
        what: &'static str,
        /// The offending level.
        value: String,
        /// The whole topic.
        topic: String,
        /// Why it was refused.
        reason: String,
    },
    /// A list, or a string the server echoes, is longer than the protocol
    /// allows (see the `MAX_*` constants of this module).
    #[error("{kind} message: {field} has {count} entries or bytes, the limit is {limit}")]
    TooMany {
        /// The message type.
        kind: &'static str,
        /// The field.
        field: &'static str,
        /// How many it has.
        count: usize,
        /// The most allowed.
        limit: usize,
    },
    /// The robot id in the body differs from the topic's.
    #[error("robot id {body:?} in the body does not match {topic:?} in the topic")]
    RobotMismatch {
        /// The id in the body.
        body: String,
        /// The id in the topic.
        topic: String,
    },
}

/// Which message a topic carries.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum TopicKind {
    /// `robots/{id}/register`: robot → server.
    Register,
    /// `robots/{id}/heartbeat`: robot → server.
    Heartbeat,
    /// `robots/{id}/response`: server → robot.
    Response,
    /// `robots/{id}/tasks/dispatch`: server → robot.
    Dispatch,
    /// `robots/{id}/tasks/cancel`: server → robot.
    Cancel,
    /// `robots/{id}/tasks/config`: server → robot, a running attempt's
    /// changed configuration.
    ConfigUpdate,
    /// `robots/{id}/tasks/{uid}/status`: robot → server.
    Status {
        /// The Task's uid.
        task_uid: String,
    },
    /// `robots/{id}/online`: robot (and its last will), retained.
    Online,
    /// `robots/{id}/tasks/acks`: server → robot, the statuses it applied.
    StatusAck,
    /// `robots/{id}/logs/request`: server → robot, read or follow a task's
    /// output.
    LogRequest,
    /// `robots/{id}/agent/upgrade`: server → robot, run another agent
    /// version.
    AgentUpgrade,
    /// `robots/{id}/tasks/{uid}/log`: robot → server, a piece of it (QoS 0).
    LogChunk {
        /// The Task's uid.
        task_uid: String,
    },
    /// `robots/{id}/sessions/{sid}/in`: server → robot, a session's frames
    /// ([`reach`]; QoS 0, binary).
    SessionIn {
        /// The session's id.
        session: String,
    },
    /// `robots/{id}/sessions/{sid}/out`: robot → server, a session's
    /// frames.
    SessionOut {
        /// The session's id.
        session: String,
    },
    /// `robots/{id}/outputs/ask`: robot → server, what an output's upload
    /// needs ([`outputs`]).
    OutputAsk,
    /// `robots/{id}/outputs/answer`: server → robot.
    OutputAnswer,
}

/// A parsed topic.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Topic {
    /// A per-robot topic.
    Robot {
        /// The robot id in the topic.
        robot_id: String,
        /// Which message it carries.
        kind: TopicKind,
    },
    /// The seed protocol's shared `{prefix}/register` (id in the body).
    LegacyRegister,
    /// The seed protocol's shared `{prefix}/heartbeat` (id in the body).
    LegacyHeartbeat,
}

/// Topic builder and parser for one prefix.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Topics {
    prefix: String,
}

impl Default for Topics {
    fn default() -> Self {
        Self::new(DEFAULT_PREFIX)
    }
}

impl Topics {
    /// Topics under `prefix` (without a trailing '/').
    pub fn new(prefix: &str) -> Self {
        Self {
            prefix: prefix.trim_end_matches('/').to_owned(),
        }
    }

    /// The prefix.
    pub fn prefix(&self) -> &str {
        &self.prefix
    }

    fn robot(&self, id: &str, rest: &str) -> String {
        format!("{}/robots/{id}/{rest}", self.prefix)
    }

    /// `{prefix}/robots/{id}/register`
    pub fn register(&self, id: &str) -> String {
        self.robot(id, "register")
    }
    /// `{prefix}/robots/{id}/heartbeat`
    pub fn heartbeat(&self, id: &str) -> String {
        self.robot(id, "heartbeat")
    }
    /// `{prefix}/robots/{id}/response`
    pub fn response(&self, id: &str) -> String {
        self.robot(id, "response")
    }
    /// `{prefix}/robots/{id}/tasks/dispatch`
    pub fn dispatch(&self, id: &str) -> String {
        self.robot(id, "tasks/dispatch")
    }
    /// `{prefix}/robots/{id}/tasks/cancel`
    pub fn cancel(&self, id: &str) -> String {
        self.robot(id, "tasks/cancel")
    }

    /// `{prefix}/robots/{id}/tasks/config`
    pub fn config_update(&self, id: &str) -> String {
        self.robot(id, "tasks/config")
    }
    /// `{prefix}/robots/{id}/tasks/{uid}/status`
    pub fn status(&self, id: &str, task_uid: &str) -> String {
        self.robot(id, &format!("tasks/{task_uid}/status"))
    }
    /// `{prefix}/robots/{id}/online`
    pub fn online(&self, id: &str) -> String {
        self.robot(id, "online")
    }
    /// `{prefix}/robots/{id}/tasks/acks`
    pub fn status_ack(&self, id: &str) -> String {
        self.robot(id, "tasks/acks")
    }
    /// `{prefix}/robots/{id}/logs/request`
    pub fn log_request(&self, id: &str) -> String {
        self.robot(id, "logs/request")
    }
    /// `{prefix}/robots/{id}/tasks/{uid}/log`
    pub fn agent_upgrade(&self, id: &str) -> String {
        self.robot(id, "agent/upgrade")
    }

    pub fn log_chunk(&self, id: &str, task_uid: &str) -> String {
        self.robot(id, &format!("tasks/{task_uid}/log"))
    }
    /// `{prefix}/robots/{id}/sessions/{sid}/in`
    pub fn session_in(&self, id: &str, session: &str) -> String {
        self.robot(id, &format!("sessions/{session}/in"))
    }
    /// `{prefix}/robots/{id}/sessions/{sid}/out`
    pub fn session_out(&self, id: &str, session: &str) -> String {
        self.robot(id, &format!("sessions/{session}/out"))
    }
    /// `{prefix}/robots/{id}/outputs/ask`
    pub fn output_ask(&self, id: &str) -> String {
        self.robot(id, "outputs/ask")
    }
    /// `{prefix}/robots/{id}/outputs/answer`
    pub fn output_answer(&self, id: &str) -> String {
        self.robot(id, "outputs/answer")
    }
    /// The seed protocol's `{prefix}/register`.
    pub fn legacy_register(&self) -> String {
        format!("{}/register", self.prefix)
    }
    /// The seed protocol's `{prefix}/heartbeat`.
    pub fn legacy_heartbeat(&self) -> String {
        format!("{}/heartbeat", self.prefix)
    }

    /// The filters a server subscribes to for everything robots send.
    pub fn server_subscriptions(&self) -> Vec<String> {
        vec![
            self.robot("+", "register"),
            self.robot("+", "heartbeat"),
            self.robot("+", "tasks/+/status"),
            self.robot("+", "online"),
            self.robot("+", "tasks/+/log"),
            self.robot("+", "sessions/+/out"),
            self.robot("+", "outputs/ask"),
        ]
    }

    /// The filters an agent subscribes to for what the server sends it.
    pub fn agent_subscriptions(&self, id: &str) -> Vec<String> {
        vec![
            self.response(id),
            self.dispatch(id),
            self.cancel(id),
            self.config_update(id),
            self.status_ack(id),
            self.log_request(id),
            self.agent_upgrade(id),
            self.session_in(id, "+"),
            self.output_answer(id),
        ]
    }

    /// Parses a topic of this prefix.
    pub fn parse(&self, topic: &str) -> Result<Topic, ProtocolError> {
        let unknown = || ProtocolError::UnknownTopic {
            topic: topic.to_owned(),
        };
        let rest = topic
            .strip_prefix(self.prefix.as_str())
            .and_then(|r| r.strip_prefix('/'))
            .ok_or_else(unknown)?;
        match rest {
            "register" => return Ok(Topic::LegacyRegister),
            "heartbeat" => return Ok(Topic::LegacyHeartbeat),
            _ => {}
        }
        let levels: Vec<&str> = rest.split('/').collect();
        let (robot_id, tail) = match levels.as_slice() {
            ["robots", id, tail @ ..] => (*id, tail),
            _ => return Err(unknown()),
        };
        let kind = match tail {
            ["register"] => TopicKind::Register,
            ["heartbeat"] => TopicKind::Heartbeat,
            ["response"] => TopicKind::Response,
            ["online"] => TopicKind::Online,
            ["tasks", "dispatch"] => TopicKind::Dispatch,
            ["tasks", "cancel"] => TopicKind::Cancel,
            ["tasks", "config"] => TopicKind::ConfigUpdate,
            ["tasks", "acks"] => TopicKind::StatusAck,
            ["logs", "request"] => TopicKind::LogRequest,
            ["agent", "upgrade"] => TopicKind::AgentUpgrade,
            ["outputs", "ask"] => TopicKind::OutputAsk,
            ["outputs", "answer"] => TopicKind::OutputAnswer,
            ["tasks", uid, "log"] => {
                check_topic_level("task uid", uid, topic)?;
                TopicKind::LogChunk {
                    task_uid: (*uid).to_owned(),
                }
            }
            ["sessions", sid, dir @ ("in" | "out")] => {
                check_topic_level("session id", sid, topic)?;
                if sid.len() > reach::MAX_SESSION_ID_BYTES {
                    return Err(unknown());
                }
                let session = (*sid).to_owned();
                if *dir == "in" {
                    TopicKind::SessionIn { session }
                } else {
                    TopicKind::SessionOut { session }
                }
            }
            ["tasks", uid, "status"] => {
                check_topic_level("task uid", uid, topic)?;
                TopicKind::Status {
                    task_uid: (*uid).to_owned(),
                }
            }
            _ => return Err(unknown()),
        };
        check_topic_level("robot id", robot_id, topic)?;
        validate_robot_id(robot_id).map_err(|reason| ProtocolError::InvalidTopicId {
            what: "robot id",
            value: robot_id.to_owned(),
            topic: topic.to_owned(),
            reason,
        })?;
        Ok(Topic::Robot {
            robot_id: robot_id.to_owned(),
            kind,
        })
    }
}

fn check_topic_level(what: &'static str, value: &str, topic: &str) -> Result<(), ProtocolError> {
    let reason = if value.is_empty() {
        "empty"
    } else if value.contains(['+', '#']) {
        "wildcard characters are not allowed"
    } else if value.chars().any(char::is_control) {
        "control characters are not allowed"
    } else {
        return Ok(());
    };
    Err(ProtocolError::InvalidTopicId {
        what,
        value: value.to_owned(),
        topic: topic.to_owned(),
        reason: reason.to_owned(),
    })
}

/// A protocol message: knows its name for error messages, and the bounds
/// of its lists.
pub trait Message: Serialize + DeserializeOwned {
    /// The message type, as errors name it.
    const KIND: &'static str;

    /// Refuses a message whose lists are longer than the protocol allows;
    /// [`decode`] calls it, so no handler ever sees one.
    fn check_limits(&self) -> Result<(), ProtocolError> {
        Ok(())
    }
}

/// `Err(TooMany)` when `count` exceeds `limit`.
fn bound(kind: &'static str, field: &'static str, count: usize, limit: usize) -> Result<(), ProtocolError> {
    if count > limit {
        return Err(ProtocolError::TooMany {
            kind,
            field,
            count,
            limit,
        });
    }
    Ok(())
}

fn bound_nonce(kind: &'static str, field: &'static str, nonce: Option<&String>) -> Result<(), ProtocolError> {
    bound(kind, field, nonce.map_or(0, String::len), MAX_NONCE_BYTES)
}

/// Encodes a message as JSON (its `v` field included).
pub fn encode<M: Message>(message: &M) -> Vec<u8> {
    // Serialising these plain structs cannot fail: no maps with non-string
    // keys, no custom serialisers that error.
    serde_json::to_vec(message).unwrap_or_default()
}

/// Decodes a message: checks the size, then the version, then the shape.
pub fn decode<M: Message>(body: &[u8]) -> Result<M, ProtocolError> {
    if body.len() > MAX_MESSAGE_BYTES {
        return Err(ProtocolError::TooLarge {
            size: body.len(),
            limit: MAX_MESSAGE_BYTES,
        });
    }
    #[derive(Deserialize)]
    struct Envelope {
        v: Option<serde_json::Value>,
    }
    let malformed = |e: serde_json::Error| ProtocolError::Malformed {
        kind: M::KIND,
        reason: e.to_string(),
    };
    let envelope: Envelope = serde_json::from_slice(body).map_err(malformed)?;
    match envelope.v {
        None => return Err(ProtocolError::MissingVersion { kind: M::KIND }),
        Some(serde_json::Value::Number(n)) if n.as_u64() == Some(u64::from(PROTOCOL_VERSION)) => {}
        Some(serde_json::Value::Number(n)) => {
            return Err(ProtocolError::UnsupportedVersion {
                kind: M::KIND,
                got: n.as_u64().unwrap_or(0),
                supported: PROTOCOL_VERSION,
            })
        }
        Some(other) => {
            return Err(ProtocolError::Malformed {
                kind: M::KIND,
                reason: format!("\"v\" must be a number, got {other}"),
            })
        }
    }
    let message: M = serde_json::from_slice(body).map_err(malformed)?;
    message.check_limits()?;
    Ok(message)
}

fn version() -> u32 {
    PROTOCOL_VERSION
}

/// What a robot holds, as [`Register`] and [`Heartbeat`] both report it:
/// the attempts it runs, holds, or has not had the final status of
/// confirmed. Its fields sit on the message itself on the wire (flattened),
/// between the same neighbours as before it was one type.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct HeldList {
    /// The attempts, at most [`MAX_HELD_ATTEMPTS`].
    #[serde(default)]
    pub running: Vec<TaskAttempt>,
    /// `running` is complete: every attempt the robot runs, holds, or has
    /// not had its final status confirmed. The server then fails Tasks that
    /// show an attempt running here that the list lacks.
    #[serde(default)]
    pub reconcile: bool,
    /// The highest status `seq` the robot had assigned when it built
    /// `running`: the list speaks for every status up to it.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub last_seq: Option<u64>,
}

impl HeldList {
    fn check_limits(&self, kind: &'static str) -> Result<(), ProtocolError> {
        bound(kind, "running", self.running.len(), MAX_HELD_ATTEMPTS)
    }
}

/// `register`: a robot introduces itself, on every connect.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct Register {
    /// Protocol version.
    #[serde(default = "version")]
    pub v: u32,
    /// The robot's id (must equal the topic's).
    pub robot_id: String,
    /// The bootstrap token, checked by the manager.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub token: Option<String>,
    /// The agent's version.
    pub agent_version: String,
    /// Hardware and operating system.
    pub device: DeviceInfo,
    /// Drivers the agent offers.
    pub drivers: Vec<String>,
    /// Labels the robot reports about itself.
    #[serde(default)]
    pub labels: BTreeMap<String, String>,
    /// What the robot holds, so the cloud can reconcile.
    #[serde(flatten)]
    pub held: HeldList,
    /// Who tasks may run as and how much the robot takes (its own config):
    /// the scheduler respects it.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub task_policy: Option<TaskPolicy>,
    /// Whether the agent can take tasks now, and why not.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub health: Option<AgentHealth>,
    /// Fresh for each registration sent; the answer carries it back, so an
    /// answer that waited in the broker for an earlier registration (of
    /// this process or a previous one) is known for what it is.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub nonce: Option<String>,
    /// Where this agent's last upgrade stands, until reported.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub upgrade: Option<UpgradeReport>,
}

impl Message for Register {
    const KIND: &'static str = "register";

    fn check_limits(&self) -> Result<(), ProtocolError> {
        self.held.check_limits(Self::KIND)?;
        bound(Self::KIND, "drivers", self.drivers.len(), MAX_DRIVERS)?;
        bound(Self::KIND, "labels", self.labels.len(), MAX_LABELS)?;
        if let Some(policy) = &self.task_policy {
            bound(
                Self::KIND,
                "taskPolicy.allowedUsers",
                policy.allowed_users.len(),
                MAX_POLICY_NAMES,
            )?;
            bound(
                Self::KIND,
                "taskPolicy.allowedGroups",
                policy.allowed_groups.len(),
                MAX_POLICY_NAMES,
            )?;
        }
        if let Some(upgrade) = &self.upgrade {
            upgrade.check_limits(Self::KIND)?;
        }
        bound_nonce(Self::KIND, "nonce", self.nonce.as_ref())
    }
}

impl Register {
    /// A registration of `robot_id` with no token, labels or running tasks.
    pub fn new(robot_id: impl Into<String>, agent_version: impl Into<String>, device: DeviceInfo) -> Self {
        Self {
            v: PROTOCOL_VERSION,
            robot_id: robot_id.into(),
            token: None,
            agent_version: agent_version.into(),
            device,
            drivers: Vec::new(),
            labels: BTreeMap::new(),
            held: HeldList::default(),
            task_policy: None,
            health: None,
            nonce: None,
            upgrade: None,
        }
    }
}

/// `heartbeat`: liveness and usage, every N seconds.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct Heartbeat {
    /// Protocol version.
    #[serde(default = "version")]
    pub v: u32,
    /// The robot's id (must equal the topic's).
    pub robot_id: String,
    /// Increases by one per heartbeat since the agent started.
    pub seq: u64,
    /// When the agent sent it.
    pub time: Timestamp,
    /// Usage figures. Left out (None) when they have not moved materially
    /// ([`Usage::moved_materially`]) since the last confirmed heartbeat
    /// that carried them, to a server whose registration answer allowed it
    /// ([`RegisterResponse::usage_when_moved`]); the Robot then keeps the
    /// figures it has.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub usage: Option<Usage>,
    /// What the robot holds now.
    #[serde(flatten)]
    pub held: HeldList,
    /// The server's clock as the robot reckoned it when it built `held`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub server_time: Option<Timestamp>,
    /// Whether the agent can take tasks now, and why not: the server keeps
    /// the Robot's `AcceptingTasks` condition from it.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub health: Option<AgentHealth>,
    /// Names the agent process that sent it (random, fresh at each start):
    /// `seq` restarts with every process, so the confirmation echoes this
    /// and a process never takes contact from one meant for another.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub session: Option<String>,
    /// The robot's facts, all of them, from an agent that reads some
    /// (`[facts]` in agent.toml); None from one that reads none.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub facts: Option<crate::facts::Facts>,
    /// Where this agent's upgrade stands, while one is under way and until
    /// a confirmed heartbeat carried its outcome.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub upgrade: Option<UpgradeReport>,
}

impl Message for Heartbeat {
    const KIND: &'static str = "heartbeat";

    fn check_limits(&self) -> Result<(), ProtocolError> {
        self.held.check_limits(Self::KIND)?;
        if let Some(facts) = &self.facts {
            crate::facts::check_facts(facts).map_err(|why| ProtocolError::Malformed {
                kind: Self::KIND,
                reason: format!("facts: {why}"),
            })?;
        }
        if let Some(upgrade) = &self.upgrade {
            upgrade.check_limits(Self::KIND)?;
        }
        bound_nonce(Self::KIND, "session", self.session.as_ref())
    }
}

impl Heartbeat {
    /// Heartbeat number `seq` of `robot_id`, sent at `time`.
    pub fn new(robot_id: impl Into<String>, seq: u64, time: Timestamp, usage: Usage) -> Self {
        Self {
            v: PROTOCOL_VERSION,
            robot_id: robot_id.into(),
            seq,
            time,
            usage: Some(usage),
            held: HeldList::default(),
            server_time: None,
            health: None,
            session: None,
            facts: None,
            upgrade: None,
        }
    }
}

/// Which usage figures a robot's heartbeats carry: all of them until the
/// server says it keeps the Robot's figures
/// ([`RegisterResponse::usage_when_moved`]), then only figures that moved
/// materially from the last ones a confirmed heartbeat carried. Each
/// registration starts it again, so the first heartbeats of a session
/// always carry usage.
#[derive(Debug, Clone, Default)]
pub struct UsageReports {
    /// The server takes heartbeats without usage.
    allowed: bool,
    /// The figures the cluster has: a heartbeat that carried them was
    /// confirmed.
    confirmed: Option<Usage>,
    /// The figures sent since, by heartbeat `seq`, oldest first.
    sent: Vec<(u64, Usage)>,
}

impl UsageReports {
    /// A registration was answered: `allowed` is what the server said.
    pub fn registered(&mut self, allowed: bool) {
        *self = UsageReports {
            allowed,
            ..UsageReports::default()
        };
    }

    /// The usage heartbeat `seq` carries, given the figures `now`.
    pub fn for_heartbeat(&mut self, seq: u64, now: Usage) -> Option<Usage> {
        let needed = !self.allowed
            || self
                .confirmed
                .as_ref()
                .is_none_or(|had| had.moved_materially(&now));
        if !needed {
            return None;
        }
        // A few unconfirmed heartbeats at most are remembered; an older
        // one's confirmation then only comes later, with a newer one's.
        if self.sent.len() >= 8 {
            self.sent.remove(0);
        }
        self.sent.push((seq, now.clone()));
        Some(now)
    }

    /// The server recorded heartbeat `seq`: the newest figures sent with it
    /// or before it are the cluster's now.
    pub fn confirmed(&mut self, seq: u64) {
        let settled = self.sent.iter().rposition(|(sent, _)| *sent <= seq);
        if let Some(i) = settled {
            self.confirmed = Some(self.sent[i].1.clone());
            self.sent.drain(..=i);
        }
    }
}

/// `response`: the registration's outcome.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct RegisterResponse {
    /// Protocol version.
    #[serde(default = "version")]
    pub v: u32,
    /// The robot's phase: Online means approved.
    pub phase: RobotPhase,
    /// Why, for a person.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub message: Option<String>,
    /// The server's clock when it answered: the agent reads dispatch
    /// deadlines on this clock, whatever its own says.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub server_time: Option<Timestamp>,
    /// The server confirms on `tasks/acks` each status it applied and each
    /// heartbeat it recorded; the agent then keeps a status until confirmed
    /// (not only until the broker's PUBACK) and holds its attempts under a
    /// lease renewed by those confirmations. Servers that do not say so get
    /// the old behaviour.
    #[serde(default)]
    pub status_acks: bool,
    /// The server takes heartbeats without usage and keeps the Robot's
    /// figures: the agent sends usage only when it moved materially (an
    /// idle robot's heartbeat is then a third smaller). Servers that do not
    /// say so get usage in every heartbeat.
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub usage_when_moved: bool,
    /// The nonce of the registration this answers.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub nonce: Option<String>,
}

impl Message for RegisterResponse {
    const KIND: &'static str = "response";

    fn check_limits(&self) -> Result<(), ProtocolError> {
        bound_nonce(Self::KIND, "nonce", self.nonce.as_ref())
    }
}

impl RegisterResponse {
    /// The registration's outcome.
    pub fn new(phase: RobotPhase, message: Option<String>) -> Self {
        Self {
            v: PROTOCOL_VERSION,
            phase,
            message,
            server_time: None,
            status_acks: false,
            usage_when_moved: false,
            nonce: None,
        }
    }
}

/// `tasks/dispatch`: run one attempt of a task.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct Dispatch {
    /// Protocol version.
    #[serde(default = "version")]
    pub v: u32,
    /// The Task's uid.
    pub task_uid: String,
    /// The Task's namespace and name, for logs.
    pub task_name: String,
    /// The attempt number.
    pub attempt: u32,
    /// What to run.
    pub spec: TaskTemplate,
    /// After this instant (server clock) the dispatch is void: the agent
    /// refuses it, since the manager has given up on this attempt.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub expires_at: Option<Timestamp>,
    /// How long the robot keeps this attempt running without hearing
    /// from the cluster (the group's `disconnect.stopAfter`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub stop_after: Option<DurationString>,
    /// What the spec's references to ConfigMaps and Secrets came to for
    /// this robot, read by the server as it dispatched (values and file
    /// contents: never logged). Absent when the spec makes none.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub config: Option<TaskConfig>,
}

/// A task's configuration from ConfigMaps and Secrets, resolved for its
/// robot. Its `Debug` shows names and paths, never values.
#[derive(Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct TaskConfig {
    /// Variables, in the order they are set (a later one of the same name
    /// wins; the spec's literal `env` values win over all of them).
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub env: Vec<ConfigVar>,
    /// Files, each relative to the task's directory.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub files: Vec<ConfigFile>,
    /// The objects read, each at the version read.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub sources: Vec<ConfigSource>,
    /// 0 for the dispatch's; a [`ConfigUpdate`]'s generation after it.
    #[serde(default, skip_serializing_if = "is_zero_u64")]
    pub generation: u64,
}

impl std::fmt::Debug for TaskConfig {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("TaskConfig")
            .field("env", &self.env.iter().map(|v| &v.name).collect::<Vec<_>>())
            .field("files", &self.files.iter().map(|x| &x.path).collect::<Vec<_>>())
            .field("sources", &self.sources)
            .field("generation", &self.generation)
            .finish()
    }
}

/// One variable from a ConfigMap or Secret.
#[derive(Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct ConfigVar {
    pub name: String,
    pub value: String,
    /// From a Secret.
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub secret: bool,
}

/// One file from a ConfigMap or Secret.
#[derive(Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct ConfigFile {
    /// Relative to the task's directory.
    pub path: String,
    /// Its mode (permission bits).
    pub mode: u32,
    /// From a Secret.
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub secret: bool,
    /// Its content, base64.
    pub data: String,
}

impl ConfigFile {
    /// Its content.
    pub fn content(&self) -> Result<Vec<u8>, base64::DecodeError> {
        use base64::Engine as _;
        base64::engine::general_purpose::STANDARD.decode(&self.data)
    }

    /// A file of `content`.
    pub fn new(path: String, mode: u32, secret: bool, content: &[u8]) -> Self {
        use base64::Engine as _;
        Self {
            path,
            mode,
            secret,
            data: base64::engine::general_purpose::STANDARD.encode(content),
        }
    }
}

pub use crate::config_ref::ConfigSource;

impl Message for Dispatch {
    const KIND: &'static str = "dispatch";
}

impl Dispatch {
    /// Run `attempt` of the Task `task_uid` (`task_name` for logs).
    pub fn new(
        task_uid: impl Into<String>,
        task_name: impl Into<String>,
        attempt: u32,
        spec: TaskTemplate,
    ) -> Self {
        Self {
            v: PROTOCOL_VERSION,
            task_uid: task_uid.into(),
            task_name: task_name.into(),
            attempt,
            spec,
            expires_at: None,
            stop_after: None,
            config: None,
        }
    }
}

/// `tasks/config`: a running attempt's configuration from ConfigMaps and
/// Secrets changed. The robot rewrites its files, then does what the
/// spec's `onConfigChange` says, and reports the generation it applied
/// in a status ([`ConfigReport`]).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct ConfigUpdate {
    /// Protocol version.
    #[serde(default = "version")]
    pub v: u32,
    /// The Task's uid.
    pub task_uid: String,
    /// The attempt it is for (another attempt ignores it).
    pub attempt: u32,
    /// The whole configuration, as a dispatch carries it; its
    /// `generation` orders updates (an older one than applied is ignored).
    pub config: TaskConfig,
}

impl Message for ConfigUpdate {
    const KIND: &'static str = "config";

    fn check_limits(&self) -> Result<(), ProtocolError> {
        bound(
            Self::KIND,
            "config.sources",
            self.config.sources.len(),
            MAX_CONFIG_SOURCES,
        )
    }
}

/// What configuration a running attempt runs with, in a status: the
/// dispatch's (generation 0) from its first start, and each update the
/// robot applied.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct ConfigReport {
    /// The update applied (0: the dispatch's configuration).
    #[serde(default)]
    pub generation: u64,
    /// The objects, each at the version it was read.
    #[serde(default)]
    pub sources: Vec<ConfigSource>,
    /// What the robot did, for a person ("restarted", "sent SIGHUP",
    /// "files rewritten", "unchanged: ..."); none for the dispatch's.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub message: Option<String>,
}

/// `tasks/cancel`: stop an attempt (SIGTERM, then SIGKILL after its kill timeout).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct Cancel {
    /// Protocol version.
    #[serde(default = "version")]
    pub v: u32,
    /// The Task's uid.
    pub task_uid: String,
    /// The attempt to stop; 0 stops whatever attempt runs.
    pub attempt: u32,
    /// Why, for the task's status message.
    #[serde(default)]
    pub reason: String,
    /// True when the robot is being drained: the attempt ends `Drained`
    /// (the task waits for another robot) rather than `Cancelled`.
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub drain: bool,
}

impl Message for Cancel {
    const KIND: &'static str = "cancel";
}

impl Cancel {
    /// Stop `attempt` of the Task `task_uid`, saying why.
    pub fn new(task_uid: impl Into<String>, attempt: u32, reason: impl Into<String>) -> Self {
        Self {
            v: PROTOCOL_VERSION,
            task_uid: task_uid.into(),
            attempt,
            reason: reason.into(),
            drain: false,
        }
    }
}

/// Which output of a task.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub enum LogStream {
    /// Its standard output.
    #[default]
    Stdout,
    /// Its standard error.
    Stderr,
    /// Both (interleaved as they are read while following; stdout, then
    /// stderr, when reading what is on disk).
    All,
}

/// Most bytes of output one chunk carries.
pub const MAX_LOG_CHUNK_BYTES: usize = 16 * 1024;
/// Longest a reader (a follow, or a read of what is on disk) lasts
/// without the server asking again: the robot stops sending once nobody
/// reads.
pub const LOG_FOLLOW_LEASE: std::time::Duration = std::time::Duration::from_secs(30);

/// `logs/request`: send (part of) a task's output on `tasks/{uid}/log`,
/// and with `follow` go on sending what it writes until told to stop or
/// [`LOG_FOLLOW_LEASE`] passes without the same request again.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct LogRequest {
    /// Protocol version.
    #[serde(default = "version")]
    pub v: u32,
    /// Names the reader; every chunk answering it carries it. The same id
    /// again renews a follow.
    pub request_id: String,
    /// The Task's uid.
    pub task_uid: String,
    /// Its attempt.
    pub attempt: u32,
    /// Which output.
    #[serde(default)]
    pub stream: LogStream,
    /// Only the last lines of what is on disk.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub tail_lines: Option<u32>,
    /// Only what was written since (to the precision of the log files'
    /// modification times).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub since: Option<Timestamp>,
    /// Go on sending what the task writes.
    #[serde(default)]
    pub follow: bool,
    /// Stop the reader with this id.
    #[serde(default)]
    pub stop: bool,
    /// Only renew the reader with this id: one the robot does not have
    /// (it restarted, or the follow lapsed) is answered with an error, not
    /// started again from the beginning.
    #[serde(default)]
    pub renew: bool,
    /// Flow control: the reader keeps at most this many chunks beyond the
    /// last acknowledged one on the way, and then waits (set by a server
    /// that acknowledges; without it the robot paces itself by rate).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub window: Option<u32>,
    /// With `renew`: every chunk numbered below this has reached the
    /// reader's client.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub acked: Option<u64>,
}

impl Message for LogRequest {
    const KIND: &'static str = "log request";
}

/// `tasks/{uid}/log`: a piece of a task's output, for one reader.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct LogChunk {
    /// Protocol version.
    #[serde(default = "version")]
    pub v: u32,
    /// The request it answers.
    pub request_id: String,
    /// Counts the reader's chunks from 0: a missing number is a chunk lost
    /// on the way (QoS 0).
    pub seq: u64,
    /// The output, as text (invalid UTF-8 replaced); at most
    /// [`MAX_LOG_CHUNK_BYTES`].
    #[serde(default, skip_serializing_if = "String::is_empty")]
    pub data: String,
    /// Bytes of output skipped before this chunk (over the rate limit, or
    /// lost to a rotation).
    #[serde(default, skip_serializing_if = "is_zero_u64")]
    pub skipped: u64,
    /// The reader has sent everything and stopped.
    #[serde(default)]
    pub eof: bool,
    /// Everything written before the request is sent (set once, on the
    /// chunk that ends the history); what follows is live.
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub caught_up: bool,
    /// Why the reader could not (go on) read.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub error: Option<String>,
}

fn is_zero_u64(n: &u64) -> bool {
    *n == 0
}

impl Message for LogChunk {
    const KIND: &'static str = "log chunk";
}

/// `tasks/{uid}/status`: where an attempt is.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct StatusUpdate {
    /// Protocol version.
    #[serde(default = "version")]
    pub v: u32,
    /// The Task's uid (must equal the topic's).
    pub task_uid: String,
    /// The attempt this is about.
    pub attempt: u32,
    /// Increases within an attempt; orders updates.
    pub seq: u64,
    /// running, completed or failed.
    pub state: TaskState,
    /// The exit code, once exited.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub exit_code: Option<i32>,
    /// The signal that ended the process, if one did.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub signal: Option<i32>,
    /// Why it ended.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub reason: Option<TaskReason>,
    /// Details for a person.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub message: Option<String>,
    /// When the process started.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub start_time: Option<Timestamp>,
    /// When it ended.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub finish_time: Option<Timestamp>,
    /// The last few KiB of output.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub output_tail: Option<String>,
    /// The robot's restarts of this attempt's process (`restart`).
    #[serde(flatten)]
    pub restarts: RestartStatus,
    /// The Task's `namespace/name`, as its dispatch gave it: a server whose
    /// cache lacks the uid reads the Task by this name.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub task_name: Option<String>,
    /// The configuration from ConfigMaps and Secrets the attempt runs with,
    /// when this report says (its first start, and each update applied).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub config: Option<ConfigReport>,
}

impl Message for StatusUpdate {
    const KIND: &'static str = "status";

    fn check_limits(&self) -> Result<(), ProtocolError> {
        if let Some(config) = &self.config {
            bound(
                Self::KIND,
                "config.sources",
                config.sources.len(),
                MAX_CONFIG_SOURCES,
            )?;
        }
        Ok(())
    }
}

/// The most objects one task's configuration names: 16 each of `env`,
/// `envFrom` and `files`, with room for `$(K8S4R_ROBOT_ID)` variants.
pub const MAX_CONFIG_SOURCES: usize = 64;

impl StatusUpdate {
    /// Update `seq` of `attempt` of the Task `task_uid`: now in `state`,
    /// with nothing else said (set the other fields on the result).
    pub fn new(task_uid: impl Into<String>, attempt: u32, seq: u64, state: TaskState) -> Self {
        Self {
            v: PROTOCOL_VERSION,
            task_uid: task_uid.into(),
            attempt,
            seq,
            state,
            exit_code: None,
            signal: None,
            reason: None,
            message: None,
            start_time: None,
            finish_time: None,
            output_tail: None,
            restarts: RestartStatus::default(),
            task_name: None,
            config: None,
        }
    }

    /// Whether this update should replace what a Task shows for
    /// (`attempt`, `seq`, `state`): newer attempt, or same attempt and newer
    /// seq, and never a non-terminal state over a terminal one.
    pub fn supersedes(&self, attempt: u32, seq: u64, state: Option<TaskState>) -> bool {
        if self.attempt != attempt {
            return self.attempt > attempt;
        }
        if state.is_some_and(TaskState::is_terminal) {
            return false;
        }
        self.seq > seq
    }
}

/// `online`: retained presence; the last will publishes `online: false`.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct Online {
    /// Protocol version.
    #[serde(default = "version")]
    pub v: u32,
    /// Whether the robot is connected.
    pub online: bool,
}

impl Message for Online {
    const KIND: &'static str = "online";
}

impl Online {
    /// Presence: connected or not.
    pub fn new(online: bool) -> Self {
        Self {
            v: PROTOCOL_VERSION,
            online,
        }
    }
}

/// `tasks/acks`: what the server has recorded of this robot. The `seq` of
/// each status update it applied (or refused for good): the agent may
/// forget those. And the heartbeat it last recorded, with the server's
/// clock: the agent's lease on its attempts runs from when it sent that
/// heartbeat (docs/fencing.md), and it reads dispatch deadlines on that
/// clock.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct StatusAck {
    /// Protocol version.
    #[serde(default = "version")]
    pub v: u32,
    /// The `seq` of each update settled.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub seqs: Vec<u64>,
    /// The `seq` of the heartbeat recorded in the robot's Lease: the
    /// cluster's record of this robot is at least as new as that heartbeat.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub heartbeat: Option<u64>,
    /// The server's clock when it answered.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub time: Option<Timestamp>,
    /// The `session` of the heartbeat confirmed: only the process that
    /// sent it takes contact from the confirmation.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub session: Option<String>,
}

impl Message for StatusAck {
    const KIND: &'static str = "ack";

    fn check_limits(&self) -> Result<(), ProtocolError> {
        bound(Self::KIND, "seqs", self.seqs.len(), MAX_ACK_SEQS)?;
        bound_nonce(Self::KIND, "session", self.session.as_ref())
    }
}

impl StatusAck {
    /// Settles the updates with these seqs.
    pub fn new(seqs: Vec<u64>) -> Self {
        Self {
            v: PROTOCOL_VERSION,
            seqs,
            heartbeat: None,
            time: None,
            session: None,
        }
    }

    /// Says heartbeat `seq` of the agent process `session` is recorded, at
    /// `time` on the server's clock.
    pub fn heartbeat(seq: u64, session: Option<String>, time: Timestamp) -> Self {
        Self {
            heartbeat: Some(seq),
            time: Some(time),
            session,
            ..Self::new(Vec::new())
        }
    }
}

/// Checks that a body's robot id is the topic's.
pub fn check_robot_id(body_id: &str, topic_id: &str) -> Result<(), ProtocolError> {
    if body_id == topic_id {
        Ok(())
    } else {
        Err(ProtocolError::RobotMismatch {
            body: body_id.to_owned(),
            topic: topic_id.to_owned(),
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::task::EnvVar;

    fn device() -> DeviceInfo {
        DeviceInfo {
            arch: "aarch64".into(),
            os: "linux".into(),
            os_version: Some("Debian GNU/Linux 12".into()),
            kernel: Some("6.1.0".into()),
            hostname: Some("rb1".into()),
            cpus: 4,
            memory_bytes: 4 << 30,
            disk_bytes: 32 << 30,
        }
    }

    fn round_trip<M: Message + PartialEq + std::fmt::Debug>(m: M) {
        let bytes = encode(&m);
        let text = String::from_utf8(bytes.clone()).unwrap();
        assert!(text.contains("\"v\":1"), "{text}");
        assert_eq!(decode::<M>(&bytes).unwrap(), m);
    }

    /// A registration with every field set (the nested ones too).
    fn full_register() -> Register {
        Register {
            v: 1,
            robot_id: "rb1".into(),
            token: Some("s3cret".into()),
            agent_version: "0.1.0".into(),
            device: device(),
            drivers: vec!["exec".into(), "raw_exec".into()],
            labels: [("site".to_string(), "lab".to_string())].into(),
            held: HeldList {
                running: vec![TaskAttempt::new("u1", 2).named(Some("default/job-a-0".into()))],
                reconcile: true,
                last_seq: Some(40),
            },
            task_policy: Some(TaskPolicy {
                max_tasks: 8,
                disk_budget: Some("10Gi".into()),
                allow_root: true,
                allowed_users: vec!["robot".into()],
                allowed_groups: vec!["dialout".into()],
            }),
            health: Some(full_health()),
            nonce: Some("5f1c".into()),
            upgrade: Some(full_upgrade()),
        }
    }

    fn full_upgrade() -> UpgradeReport {
        UpgradeReport {
            rollout: "agent-0-2".into(),
            version: "0.2.0".into(),
            phase: crate::agent_rollout::RobotUpgradePhase::RolledBack,
            reason: Some("it exited 3 times before the cluster confirmed it".into()),
        }
    }

    /// A heartbeat with every field set (the nested ones too).
    fn full_heartbeat() -> Heartbeat {
        Heartbeat {
            v: 1,
            robot_id: "rb1".into(),
            seq: 7,
            time: "2026-11-22T10:00:00Z".parse().unwrap(),
            usage: Some(Usage {
                cpu_percent: 12.5,
                memory_used_bytes: 1 << 30,
                memory_total_bytes: 4 << 30,
                disk_free_bytes: 10 << 30,
                load1: 0.5,
                load5: 0.25,
                load15: 0.125,
            }),
            held: HeldList {
                running: vec![
                    TaskAttempt::new("u1", 2).named(Some("default/job-a-0".into())),
                    TaskAttempt::new("u2", 1),
                ],
                reconcile: true,
                last_seq: Some(41),
            },
            server_time: Some("2026-11-22T10:00:01Z".parse().unwrap()),
            health: Some(full_health()),
            session: Some("a1b2".into()),
            facts: Some(crate::facts::Facts::from([
                ("battery".to_owned(), crate::facts::FactValue::Number(80.0)),
                ("docked".to_owned(), crate::facts::FactValue::Bool(true)),
            ])),
            upgrade: Some(full_upgrade()),
        }
    }

    fn full_health() -> AgentHealth {
        AgentHealth {
            accepting_tasks: false,
            reason: Some(AgentHealth::REASON_DISK_FULL.into()),
            message: Some("the task disk is full".into()),
            tasks: 3,
            disk_used_bytes: 5 << 30,
            dropped_output_bytes: 1024,
        }
    }

    /// The JSON of a registration and a heartbeat, byte for byte as this
    /// build's predecessors sent it (before `HeldList` was one type), with
    /// the optional fields added since at the end: what robots and servers
    /// of either age read.
    #[test]
    fn register_and_heartbeat_keep_their_wire_form() {
        let json = |bytes: Vec<u8>| String::from_utf8(bytes).unwrap();
        assert_eq!(
            json(encode(&full_register())),
            r#"{"v":1,"robotId":"rb1","token":"s3cret","agentVersion":"0.1.0","device":{"arch":"aarch64","os":"linux","osVersion":"Debian GNU/Linux 12","kernel":"6.1.0","hostname":"rb1","cpus":4,"memoryBytes":4294967296,"diskBytes":34359738368},"drivers":["exec","raw_exec"],"labels":{"site":"lab"},"running":[{"uid":"u1","attempt":2,"name":"default/job-a-0"}],"reconcile":true,"lastSeq":40,"taskPolicy":{"maxTasks":8,"diskBudget":"10Gi","allowRoot":true,"allowedUsers":["robot"],"allowedGroups":["dialout"]},"health":{"acceptingTasks":false,"reason":"DiskFull","message":"the task disk is full","tasks":3,"diskUsedBytes":5368709120,"droppedOutputBytes":1024},"nonce":"5f1c","upgrade":{"rollout":"agent-0-2","version":"0.2.0","phase":"RolledBack","reason":"it exited 3 times before the cluster confirmed it"}}"#
        );
        assert_eq!(
            json(encode(&full_heartbeat())),
            r#"{"v":1,"robotId":"rb1","seq":7,"time":"2026-11-22T10:00:00Z","usage":{"cpuPercent":12.5,"memoryUsedBytes":1073741824,"memoryTotalBytes":4294967296,"diskFreeBytes":10737418240,"load1":0.5,"load5":0.25,"load15":0.125},"running":[{"uid":"u1","attempt":2,"name":"default/job-a-0"},{"uid":"u2","attempt":1}],"reconcile":true,"lastSeq":41,"serverTime":"2026-11-22T10:00:01Z","health":{"acceptingTasks":false,"reason":"DiskFull","message":"the task disk is full","tasks":3,"diskUsedBytes":5368709120,"droppedOutputBytes":1024},"session":"a1b2","facts":{"battery":80.0,"docked":true},"upgrade":{"rollout":"agent-0-2","version":"0.2.0","phase":"RolledBack","reason":"it exited 3 times before the cluster confirmed it"}}"#
        );
        assert_eq!(
            json(encode(&Register::new("rb1", "0.1.0", DeviceInfo::default()))),
            r#"{"v":1,"robotId":"rb1","agentVersion":"0.1.0","device":{"arch":"","os":"","cpus":0,"memoryBytes":0,"diskBytes":0},"drivers":[],"labels":{},"running":[],"reconcile":false}"#
        );
        let time = "2026-11-22T10:00:00Z".parse().unwrap();
        assert_eq!(
            json(encode(&Heartbeat::new("rb1", 1, time, Usage::default()))),
            r#"{"v":1,"robotId":"rb1","seq":1,"time":"2026-11-22T10:00:00Z","usage":{"cpuPercent":0.0,"memoryUsedBytes":0,"memoryTotalBytes":0,"diskFreeBytes":0,"load1":0.0,"load5":0.0,"load15":0.0},"running":[],"reconcile":false}"#
        );
        assert_eq!(
            decode::<Register>(&encode(&full_register())).unwrap(),
            full_register()
        );
        assert_eq!(
            decode::<Heartbeat>(&encode(&full_heartbeat())).unwrap(),
            full_heartbeat()
        );
    }

    fn usage(cpu: f64) -> Usage {
        Usage {
            cpu_percent: cpu,
            memory_used_bytes: 1 << 30,
            memory_total_bytes: 4 << 30,
            disk_free_bytes: 10 << 30,
            ..Usage::default()
        }
    }

    #[test]
    fn usage_is_left_out_only_once_confirmed_and_only_where_allowed() {
        let mut old_server = UsageReports::default();
        old_server.registered(false);
        old_server.confirmed(1);
        assert!(old_server.for_heartbeat(2, usage(5.0)).is_some());
        assert!(
            old_server.for_heartbeat(3, usage(5.0)).is_some(),
            "every heartbeat to a server that needs it"
        );

        let mut reports = UsageReports::default();
        reports.registered(true);
        assert!(
            reports.for_heartbeat(1, usage(5.0)).is_some(),
            "the first of a session"
        );
        assert!(
            reports.for_heartbeat(2, usage(6.0)).is_some(),
            "still unconfirmed"
        );
        reports.confirmed(1);
        assert!(
            reports.for_heartbeat(3, usage(7.0)).is_none(),
            "confirmed, and moved little"
        );
        assert!(
            reports.for_heartbeat(4, usage(60.0)).is_some(),
            "moved materially"
        );
        assert!(
            reports.for_heartbeat(5, usage(61.0)).is_some(),
            "the move not yet confirmed"
        );
        reports.confirmed(4);
        assert!(reports.for_heartbeat(6, usage(62.0)).is_none());
        assert!(
            reports.for_heartbeat(7, usage(5.0)).is_some(),
            "judged against what the cluster has"
        );
        reports.registered(true);
        assert!(
            reports.for_heartbeat(1, usage(5.0)).is_some(),
            "a new registration starts again"
        );
    }

    #[test]
    fn every_message_round_trips() {
        round_trip(full_register());
        // The optional parts unset, as a robot's first messages send them.
        round_trip(Register {
            task_policy: None,
            health: None,
            nonce: None,
            ..full_register()
        });
        round_trip(full_heartbeat());
        round_trip(Heartbeat {
            health: None,
            server_time: None,
            ..full_heartbeat()
        });
        // Usage left out, as to a server that allows it.
        round_trip(Heartbeat {
            usage: None,
            ..full_heartbeat()
        });
        round_trip(RegisterResponse {
            v: 1,
            phase: RobotPhase::Online,
            message: Some("approved".into()),
            server_time: Some("2026-11-22T10:00:00Z".parse().unwrap()),
            status_acks: true,
            usage_when_moved: true,
            nonce: Some("5f1c".into()),
        });
        round_trip(StatusAck::new(vec![3, 4]));
        round_trip(StatusAck::heartbeat(
            9,
            Some("a1b2".into()),
            "2026-11-22T10:00:00Z".parse().unwrap(),
        ));
        round_trip(Dispatch {
            v: 1,
            task_uid: "u1".into(),
            task_name: "default/job-a-0".into(),
            attempt: 1,
            spec: TaskTemplate {
                driver: "exec".into(),
                command: "echo".into(),
                args: vec!["hi".into()],
                env: vec![EnvVar {
                    name: "A".into(),
                    value: "b".into(),
                    value_from: None,
                }],
                timeout: Some("30s".into()),
                ..Default::default()
            },
            expires_at: Some("2026-11-22T10:01:00Z".parse().unwrap()),
            stop_after: Some("2m".into()),
            config: Some(TaskConfig {
                env: vec![ConfigVar {
                    name: "TOKEN".into(),
                    value: "t".into(),
                    secret: true,
                }],
                files: vec![ConfigFile::new("conf/a.yaml".into(), 0o644, false, b"a: 1\n")],
                sources: vec![ConfigSource {
                    kind: crate::config_ref::ObjectKind::Secret,
                    name: "api".into(),
                    resource_version: "7".into(),
                }],
                generation: 0,
            }),
        });
        round_trip(ConfigUpdate {
            v: 1,
            task_uid: "u1".into(),
            attempt: 2,
            config: TaskConfig {
                files: vec![ConfigFile::new("conf/a.yaml".into(), 0o644, false, b"a: 2\n")],
                sources: vec![ConfigSource {
                    kind: crate::config_ref::ObjectKind::ConfigMap,
                    name: "calibration".into(),
                    resource_version: "9".into(),
                }],
                generation: 3,
                ..Default::default()
            },
        });
        let mut applied = StatusUpdate::new("u1", 2, 4, TaskState::Running);
        applied.config = Some(ConfigReport {
            generation: 3,
            sources: vec![ConfigSource {
                kind: crate::config_ref::ObjectKind::ConfigMap,
                name: "calibration".into(),
                resource_version: "9".into(),
            }],
            message: Some("sent SIGHUP".into()),
        });
        round_trip(applied);
        round_trip(Cancel {
            v: 1,
            task_uid: "u1".into(),
            attempt: 1,
            reason: "Task deleted".into(),
            drain: true,
        });
        round_trip(StatusUpdate {
            v: 1,
            task_uid: "u1".into(),
            attempt: 1,
            seq: 3,
            state: TaskState::Failed,
            exit_code: Some(143),
            signal: Some(15),
            reason: Some(TaskReason::Timeout),
            message: Some("timed out after 30s".into()),
            start_time: Some("2026-11-22T10:00:00Z".parse().unwrap()),
            finish_time: Some("2026-11-22T10:00:30Z".parse().unwrap()),
            output_tail: Some("bye\n".into()),
            restarts: RestartStatus {
                restart_count: 3,
                last_exit_code: Some(1),
                last_restart_time: Some("2026-11-22T10:00:20Z".parse().unwrap()),
            },
            task_name: Some("default/job-a-0".into()),
            config: None,
        });
        round_trip(Online { v: 1, online: false });
    }

    #[test]
    fn every_topic_builds_and_parses() {
        let t = Topics::new("fleet/");
        let robot = |kind| Topic::Robot {
            robot_id: "rb1".into(),
            kind,
        };
        let cases = [
            (t.register("rb1"), robot(TopicKind::Register)),
            (t.heartbeat("rb1"), robot(TopicKind::Heartbeat)),
            (t.response("rb1"), robot(TopicKind::Response)),
            (t.dispatch("rb1"), robot(TopicKind::Dispatch)),
            (t.cancel("rb1"), robot(TopicKind::Cancel)),
            (t.config_update("rb1"), robot(TopicKind::ConfigUpdate)),
            (
                t.status("rb1", "u-1"),
                robot(TopicKind::Status {
                    task_uid: "u-1".into(),
                }),
            ),
            (t.online("rb1"), robot(TopicKind::Online)),
            (t.legacy_register(), Topic::LegacyRegister),
            (t.legacy_heartbeat(), Topic::LegacyHeartbeat),
        ];
        for (topic, expected) in cases {
            assert!(topic.starts_with("fleet/"), "{topic}");
            assert_eq!(t.parse(&topic).unwrap(), expected, "{topic}");
        }
        assert_eq!(t.status("rb1", "u"), "fleet/robots/rb1/tasks/u/status");
    }

    #[test]
    fn bad_topics_get_typed_errors() {
        let t = Topics::default();
        for topic in [
            "k8s4r/robots//register",
            "k8s4r/robots/+/register",
            "k8s4r/robots/#/heartbeat",
        ] {
            assert!(
                matches!(
                    t.parse(topic),
                    Err(ProtocolError::InvalidTopicId { what: "robot id", .. })
                ),
                "{topic}: {:?}",
                t.parse(topic)
            );
        }
        assert!(matches!(
            t.parse("k8s4r/robots/Robot_1/register"),
            Err(ProtocolError::InvalidTopicId { .. })
        ));
        assert!(matches!(
            t.parse("k8s4r/robots/rb1/tasks/+/status"),
            Err(ProtocolError::InvalidTopicId { what: "task uid", .. })
        ));
        for topic in [
            "other/robots/rb1/register",
            "k8s4r/robots/rb1/reboot",
            "k8s4r/robots/rb1",
            "k8s4r",
        ] {
            assert!(
                matches!(t.parse(topic), Err(ProtocolError::UnknownTopic { .. })),
                "{topic}"
            );
        }
    }

    #[test]
    fn bad_bodies_get_typed_errors() {
        let big = vec![b' '; MAX_MESSAGE_BYTES + 1];
        assert!(matches!(
            decode::<Online>(&big),
            Err(ProtocolError::TooLarge { .. })
        ));
        assert!(matches!(
            decode::<Online>(b"{not json"),
            Err(ProtocolError::Malformed { kind: "online", .. })
        ));
        assert!(matches!(
            decode::<Online>(b"{\"online\":true}"),
            Err(ProtocolError::MissingVersion { .. })
        ));
        assert_eq!(
            decode::<Online>(b"{\"v\":2,\"online\":true}"),
            Err(ProtocolError::UnsupportedVersion {
                kind: "online",
                got: 2,
                supported: 1
            })
        );
        assert!(matches!(
            decode::<Online>(b"{\"v\":\"1\",\"online\":true}"),
            Err(ProtocolError::Malformed { .. })
        ));
        let err = decode::<Online>(b"{\"v\":1}").unwrap_err();
        assert!(err.to_string().contains("missing field `online`"), "{err}");
        assert!(check_robot_id("rb2", "rb1").is_err());
    }

    #[test]
    fn lists_longer_than_the_protocol_allows_are_refused_at_decode() {
        let mut heartbeat = Heartbeat::new(
            "rb1",
            1,
            "2026-11-22T10:00:00Z".parse().unwrap(),
            Usage::default(),
        );
        // One uid repeated is as long a list as distinct ones.
        heartbeat.held.running = vec![TaskAttempt::new("u", 1); MAX_HELD_ATTEMPTS];
        assert!(decode::<Heartbeat>(&encode(&heartbeat)).is_ok());
        heartbeat.held.running.push(TaskAttempt::new("u", 1));
        assert_eq!(
            decode::<Heartbeat>(&encode(&heartbeat)),
            Err(ProtocolError::TooMany {
                kind: "heartbeat",
                field: "running",
                count: MAX_HELD_ATTEMPTS + 1,
                limit: MAX_HELD_ATTEMPTS,
            })
        );
        let mut register = Register::new("rb1", "0.1.0", device());
        register.drivers = vec!["exec".into(); MAX_DRIVERS + 1];
        assert!(matches!(
            decode::<Register>(&encode(&register)),
            Err(ProtocolError::TooMany { field: "drivers", .. })
        ));
        register.drivers.clear();
        register.labels = (0..=MAX_LABELS)
            .map(|i| (format!("l{i}"), "v".to_owned()))
            .collect();
        assert!(matches!(
            decode::<Register>(&encode(&register)),
            Err(ProtocolError::TooMany { field: "labels", .. })
        ));
        register.labels.clear();
        register.nonce = Some("x".repeat(MAX_NONCE_BYTES + 1));
        assert!(matches!(
            decode::<Register>(&encode(&register)),
            Err(ProtocolError::TooMany { field: "nonce", .. })
        ));
        let ack = StatusAck::new(vec![1; MAX_ACK_SEQS + 1]);
        assert!(matches!(
            decode::<StatusAck>(&encode(&ack)),
            Err(ProtocolError::TooMany { field: "seqs", .. })
        ));
    }

    #[test]
    fn status_updates_are_ordered_by_attempt_then_seq_and_terminal_sticks() {
        let update = |attempt, seq, state| StatusUpdate::new("u", attempt, seq, state);
        let running = Some(TaskState::Running);
        assert!(update(1, 2, TaskState::Completed).supersedes(1, 1, running));
        assert!(
            !update(1, 1, TaskState::Completed).supersedes(1, 1, running),
            "same seq is a duplicate"
        );
        assert!(
            !update(1, 5, TaskState::Running).supersedes(2, 1, running),
            "older attempt"
        );
        assert!(
            update(2, 1, TaskState::Running).supersedes(1, 9, Some(TaskState::Failed)),
            "newer attempt"
        );
        assert!(
            !update(1, 9, TaskState::Running).supersedes(1, 2, Some(TaskState::Completed)),
            "terminal sticks"
        );
    }
}
