//! The MQTT protocol between agents and the server (version 1).
//!
//! Every robot-originated topic sits under the robot's own id so that one
//! broker ACL line (`pattern readwrite k8s4r/robots/%u/#`) keeps a robot from
//! speaking for another. Bodies are JSON with a `v` field.

use std::collections::BTreeMap;

use jiff::Timestamp;
use serde::de::DeserializeOwned;
use serde::{Deserialize, Serialize};

use crate::robot::{DeviceInfo, RobotPhase, Usage};
use crate::task::{TaskAttempt, TaskReason, TaskState, TaskTemplate};
use crate::validation::validate_robot_id;

/// The protocol version this build speaks.
pub const PROTOCOL_VERSION: u32 = 1;
/// The largest body accepted or sent. A dispatch carries a whole task spec;
/// 256 KiB leaves room for long argument lists and environments.
pub const MAX_MESSAGE_BYTES: usize = 256 * 1024;
/// The default topic prefix.
pub const DEFAULT_PREFIX: &str = "k8s4r";

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
    /// `robots/{id}/tasks/{uid}/status`: robot → server.
    Status {
        /// The Task's uid.
        task_uid: String,
    },
    /// `robots/{id}/online`: robot (and its last will), retained.
    Online,
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
    /// `{prefix}/robots/{id}/tasks/{uid}/status`
    pub fn status(&self, id: &str, task_uid: &str) -> String {
        self.robot(id, &format!("tasks/{task_uid}/status"))
    }
    /// `{prefix}/robots/{id}/online`
    pub fn online(&self, id: &str) -> String {
        self.robot(id, "online")
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
        ]
    }

    /// The filters an agent subscribes to for what the server sends it.
    pub fn agent_subscriptions(&self, id: &str) -> Vec<String> {
        vec![self.response(id), self.dispatch(id), self.cancel(id)]
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

/// A protocol message: knows its name for error messages.
pub trait Message: Serialize + DeserializeOwned {
    /// The message type, as errors name it.
    const KIND: &'static str;
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
    serde_json::from_slice(body).map_err(malformed)
}

fn version() -> u32 {
    PROTOCOL_VERSION
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
    /// Tasks the agent is running now, so the cloud can reconcile.
    #[serde(default)]
    pub running: Vec<TaskAttempt>,
}

impl Message for Register {
    const KIND: &'static str = "register";
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
    /// Usage figures.
    pub usage: Usage,
    /// Tasks running now.
    #[serde(default)]
    pub running: Vec<TaskAttempt>,
}

impl Message for Heartbeat {
    const KIND: &'static str = "heartbeat";
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
}

impl Message for RegisterResponse {
    const KIND: &'static str = "response";
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
}

impl Message for Dispatch {
    const KIND: &'static str = "dispatch";
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
}

impl Message for Cancel {
    const KIND: &'static str = "cancel";
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
}

impl Message for StatusUpdate {
    const KIND: &'static str = "status";
}

impl StatusUpdate {
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

    #[test]
    fn every_message_round_trips() {
        let running = vec![TaskAttempt {
            uid: "u1".into(),
            attempt: 2,
        }];
        round_trip(Register {
            v: 1,
            robot_id: "rb1".into(),
            token: Some("s3cret".into()),
            agent_version: "0.1.0".into(),
            device: device(),
            drivers: vec!["exec".into(), "raw_exec".into()],
            labels: [("site".to_string(), "lab".to_string())].into(),
            running: running.clone(),
        });
        round_trip(Heartbeat {
            v: 1,
            robot_id: "rb1".into(),
            seq: 7,
            time: "2026-11-22T10:00:00Z".parse().unwrap(),
            usage: Usage {
                cpu_percent: 12.5,
                memory_used_bytes: 1 << 30,
                memory_total_bytes: 4 << 30,
                disk_free_bytes: 10 << 30,
                load1: 0.5,
                load5: 0.25,
                load15: 0.125,
            },
            running,
        });
        round_trip(RegisterResponse {
            v: 1,
            phase: RobotPhase::Online,
            message: Some("approved".into()),
        });
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
                }],
                timeout: Some("30s".into()),
                ..Default::default()
            },
        });
        round_trip(Cancel {
            v: 1,
            task_uid: "u1".into(),
            attempt: 1,
            reason: "Task deleted".into(),
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
    fn status_updates_are_ordered_by_attempt_then_seq_and_terminal_sticks() {
        let update = |attempt, seq, state| StatusUpdate {
            v: 1,
            task_uid: "u".into(),
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
        };
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
