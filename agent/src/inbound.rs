//! Classifies what arrives from the broker: a registration response, a
//! dispatch or a cancel for this robot, or something refused with a reason.
//! Pure: no I/O, so every bad message has a unit test.

use k8s4r_api::config_ref::is_env_name;
use k8s4r_api::protocol::{
    self, outputs::OutputAnswer, Cancel, ConfigUpdate, Dispatch, LogRequest, ProtocolError, RegisterResponse,
    StatusAck, Topic, TopicKind, Topics, UpgradeOrder,
};
use k8s4r_api::validation::{is_inside_task_dir, validate_task_template, ValidationErrors};

/// A message the agent acts on.
#[derive(Debug, Clone, PartialEq)]
pub enum Inbound {
    /// The registration's outcome.
    Response(RegisterResponse),
    /// Run an attempt (its spec already validated).
    Dispatch(Box<Dispatch>),
    /// Stop an attempt.
    Cancel(Cancel),
    /// A running attempt's configuration changed.
    ConfigUpdate(Box<ConfigUpdate>),
    /// The server applied these statuses, or recorded a heartbeat.
    StatusAck(StatusAck),
    /// Read, follow, renew or stop reading a task's output.
    LogRequest(LogRequest),
    /// Run another version of the agent.
    Upgrade(UpgradeOrder),
    /// The server's answer about an output's upload.
    OutputAnswer(OutputAnswer),
}

/// Why a message was refused.
#[derive(Debug, Clone, PartialEq, thiserror::Error)]
pub enum InboundError {
    /// Bad topic or body (size, JSON, version, shape).
    #[error(transparent)]
    Protocol(#[from] ProtocolError),
    /// A topic under another robot's id.
    #[error("message on {topic:?} is for robot {robot_id:?}, not this one")]
    OtherRobot {
        /// The topic.
        topic: String,
        /// Its robot id.
        robot_id: String,
    },
    /// One of the protocol's topics that the agent does not consume.
    #[error("topic {topic:?} is not one the agent consumes")]
    NotForAgent {
        /// The topic.
        topic: String,
    },
    /// The dispatch's spec failed validation.
    #[error("invalid spec of task {task_uid} attempt {attempt}: {errors}")]
    InvalidSpec {
        /// The task.
        task_uid: String,
        /// The attempt.
        attempt: u32,
        /// Every problem found.
        errors: ValidationErrors,
    },
}

/// A refused message, with the task it was about when that is known.
#[derive(Debug, Clone, PartialEq)]
pub struct Refused {
    /// Why.
    pub error: InboundError,
    /// The task uid and attempt of a refused dispatch, when they could be
    /// read: the agent then reports the attempt `failed` (InvalidSpec).
    pub task: Option<(String, u32)>,
}

/// A configuration change's files must stay inside the task's directory
/// and its variables be names (the server's bug or forgery must not write
/// elsewhere), and its task uid must be one a dispatch could carry.
fn check_config_paths(update: &ConfigUpdate) -> Result<(), InboundError> {
    let config = &update.config;
    let bad = config
        .files
        .iter()
        .find(|f| !is_inside_task_dir(&f.path))
        .map(|f| {
            format!(
                "file path {:?} is not a relative path inside the task's directory",
                f.path
            )
        })
        .or_else(|| {
            config
                .env
                .iter()
                .find(|v| !is_env_name(&v.name))
                .map(|v| format!("invalid variable name {:?}", v.name))
        })
        .or_else(|| {
            (!usable_uid(&update.task_uid)).then(|| format!("task uid {:?} is not usable", update.task_uid))
        });
    match bad {
        None => Ok(()),
        Some(reason) => Err(ProtocolError::Malformed {
            kind: "config",
            reason,
        }
        .into()),
    }
}

/// Classifies one message received on `topic`.
pub fn classify(topics: &Topics, robot_id: &str, topic: &str, payload: &[u8]) -> Result<Inbound, Refused> {
    let refuse = |error: InboundError| Refused { error, task: None };
    let kind = match topics.parse(topic).map_err(|e| refuse(e.into()))? {
        Topic::Robot { robot_id: id, kind } => {
            if id != robot_id {
                return Err(refuse(InboundError::OtherRobot {
                    topic: topic.to_owned(),
                    robot_id: id,
                }));
            }
            kind
        }
        Topic::LegacyRegister | Topic::LegacyHeartbeat => {
            return Err(refuse(InboundError::NotForAgent {
                topic: topic.to_owned(),
            }))
        }
    };
    match kind {
        TopicKind::Response => protocol::decode(payload)
            .map(Inbound::Response)
            .map_err(|e| refuse(e.into())),
        TopicKind::Cancel => protocol::decode(payload)
            .map(Inbound::Cancel)
            .map_err(|e| refuse(e.into())),
        TopicKind::ConfigUpdate => protocol::decode::<ConfigUpdate>(payload)
            .map_err(|e| refuse(e.into()))
            .and_then(|update| match check_config_paths(&update) {
                Ok(()) => Ok(Inbound::ConfigUpdate(Box::new(update))),
                Err(error) => Err(refuse(error)),
            }),
        TopicKind::LogRequest => protocol::decode(payload)
            .map(Inbound::LogRequest)
            .map_err(|e| refuse(e.into())),
        TopicKind::StatusAck => protocol::decode(payload)
            .map(Inbound::StatusAck)
            .map_err(|e| refuse(e.into())),
        TopicKind::AgentUpgrade => protocol::decode(payload)
            .map(Inbound::Upgrade)
            .map_err(|e| refuse(e.into())),
        TopicKind::OutputAnswer => protocol::decode(payload)
            .map(Inbound::OutputAnswer)
            .map_err(|e| refuse(e.into())),
        TopicKind::Dispatch => match protocol::decode::<Dispatch>(payload) {
            Ok(dispatch) => {
                if let Err(errors) = validate_task_template(&dispatch.spec) {
                    let task = Some((dispatch.task_uid.clone(), dispatch.attempt));
                    return Err(Refused {
                        error: InboundError::InvalidSpec {
                            task_uid: dispatch.task_uid,
                            attempt: dispatch.attempt,
                            errors,
                        },
                        task: task.filter(|(uid, _)| usable_uid(uid)),
                    });
                }
                if !usable_uid(&dispatch.task_uid) {
                    return Err(refuse(ProtocolError::Malformed {
                        kind: "dispatch",
                        reason: format!(
                            "task uid {:?} cannot be a topic level (empty, '/', '+', '#' or control characters)",
                            dispatch.task_uid
                        ),
                    }
                    .into()));
                }
                Ok(Inbound::Dispatch(Box::new(dispatch)))
            }
            Err(error) => {
                let task = match error {
                    // Too big to be worth parsing a second time.
                    ProtocolError::TooLarge { .. } => None,
                    _ => task_of(payload),
                };
                Err(Refused {
                    error: error.into(),
                    task,
                })
            }
        },
        TopicKind::Register
        | TopicKind::Heartbeat
        | TopicKind::Status { .. }
        | TopicKind::Online
        | TopicKind::LogChunk { .. }
        | TopicKind::OutputAsk
        // Session frames go to the sessions before this (`reach`).
        | TopicKind::SessionIn { .. }
        | TopicKind::SessionOut { .. } => Err(refuse(InboundError::NotForAgent {
            topic: topic.to_owned(),
        })),
    }
}

/// The `taskUid` and `attempt` of a dispatch body that did not decode, if
/// it is JSON enough to have them.
fn task_of(payload: &[u8]) -> Option<(String, u32)> {
    let value: serde_json::Value = serde_json::from_slice(payload).ok()?;
    let uid = value.get("taskUid")?.as_str()?.to_owned();
    let attempt = value
        .get("attempt")
        .and_then(serde_json::Value::as_u64)
        .and_then(|a| u32::try_from(a).ok())
        .unwrap_or(0);
    usable_uid(&uid).then_some((uid, attempt))
}

/// Whether a task uid can be a topic level of the status topic.
pub fn usable_uid(uid: &str) -> bool {
    !uid.is_empty()
        && uid.len() <= 256
        && !uid.contains(['/', '+', '#'])
        && !uid.chars().any(char::is_control)
}

#[cfg(test)]
mod tests {
    use super::*;
    use k8s4r_api::protocol::{encode, MAX_MESSAGE_BYTES};
    use k8s4r_api::{RobotPhase, TaskTemplate};

    fn topics() -> Topics {
        Topics::default()
    }

    fn dispatch(uid: &str, driver: &str) -> Dispatch {
        let spec = TaskTemplate {
            driver: driver.into(),
            command: "true".into(),
            ..Default::default()
        };
        Dispatch::new(uid, "default/t", 2, spec)
    }

    #[test]
    fn good_messages_are_classified() {
        let t = topics();
        let d = dispatch("u1", "raw_exec");
        assert_eq!(
            classify(&t, "rb1", &t.dispatch("rb1"), &encode(&d)),
            Ok(Inbound::Dispatch(Box::new(d)))
        );
        let r = RegisterResponse::new(RobotPhase::Online, None);
        assert_eq!(
            classify(&t, "rb1", &t.response("rb1"), &encode(&r)),
            Ok(Inbound::Response(r))
        );
        let c = Cancel::new("u1", 0, "deleted");
        let ack = k8s4r_api::protocol::StatusAck::new(vec![7]);
        assert_eq!(
            classify(&t, "rb1", &t.status_ack("rb1"), &encode(&ack)),
            Ok(Inbound::StatusAck(ack))
        );
        let recorded =
            k8s4r_api::protocol::StatusAck::heartbeat(3, None, "2026-11-22T10:00:00Z".parse().unwrap());
        assert_eq!(
            classify(&t, "rb1", &t.status_ack("rb1"), &encode(&recorded)),
            Ok(Inbound::StatusAck(recorded))
        );
        assert_eq!(
            classify(&t, "rb1", &t.cancel("rb1"), &encode(&c)),
            Ok(Inbound::Cancel(c))
        );
    }

    fn config_update(path: &str, var: &str) -> ConfigUpdate {
        use k8s4r_api::protocol::{ConfigFile, ConfigVar, TaskConfig};
        ConfigUpdate {
            v: 1,
            task_uid: "u1".into(),
            attempt: 1,
            config: TaskConfig {
                env: vec![ConfigVar {
                    name: var.into(),
                    value: "v".into(),
                    secret: false,
                }],
                files: vec![ConfigFile::new(path.into(), 0o644, false, b"x")],
                generation: 2,
                ..Default::default()
            },
        }
    }

    #[test]
    fn a_config_change_is_taken_only_with_paths_inside_the_task_and_variable_names() {
        let t = topics();
        let good = config_update("conf/params.yaml", "MAP");
        assert_eq!(
            classify(&t, "rb1", &t.config_update("rb1"), &encode(&good)),
            Ok(Inbound::ConfigUpdate(Box::new(good)))
        );
        for (path, var) in [
            ("../escape", "MAP"),
            ("/etc/passwd", "MAP"),
            ("conf/../../x", "MAP"),
            ("", "MAP"),
            ("conf/a", "A=B"),
            ("conf/a", ""),
        ] {
            let bad = config_update(path, var);
            let refused = classify(&t, "rb1", &t.config_update("rb1"), &encode(&bad)).unwrap_err();
            assert!(
                matches!(
                    refused.error,
                    InboundError::Protocol(ProtocolError::Malformed { kind: "config", .. })
                ),
                "{path:?} {var:?}: {refused:?}"
            );
        }
    }

    #[test]
    fn malformed_json_is_refused() {
        let t = topics();
        let r = classify(&t, "rb1", &t.dispatch("rb1"), b"{\"v\":1,").unwrap_err();
        assert!(
            matches!(r.error, InboundError::Protocol(ProtocolError::Malformed { .. })),
            "{r:?}"
        );
        assert_eq!(r.task, None);
    }

    #[test]
    fn a_dispatch_missing_fields_names_its_task() {
        let t = topics();
        let r = classify(
            &t,
            "rb1",
            &t.dispatch("rb1"),
            br#"{"v":1,"taskUid":"u9","attempt":3}"#,
        )
        .unwrap_err();
        assert!(r.error.to_string().contains("missing field"), "{}", r.error);
        assert_eq!(r.task, Some(("u9".into(), 3)));
    }

    #[test]
    fn unknown_versions_are_refused() {
        let t = topics();
        let mut body = serde_json::to_value(dispatch("u1", "exec")).unwrap();
        body["v"] = 7.into();
        let r = classify(&t, "rb1", &t.dispatch("rb1"), body.to_string().as_bytes()).unwrap_err();
        assert!(
            matches!(
                r.error,
                InboundError::Protocol(ProtocolError::UnsupportedVersion { got: 7, .. })
            ),
            "{r:?}"
        );
        assert_eq!(r.task, Some(("u1".into(), 2)));
    }

    #[test]
    fn oversized_messages_are_refused() {
        let t = topics();
        let big = vec![b' '; MAX_MESSAGE_BYTES + 1];
        let r = classify(&t, "rb1", &t.dispatch("rb1"), &big).unwrap_err();
        assert!(matches!(
            r.error,
            InboundError::Protocol(ProtocolError::TooLarge { .. })
        ));
        assert_eq!(r.task, None);
    }

    #[test]
    fn other_robots_topics_are_refused() {
        let t = topics();
        let r = classify(&t, "rb1", &t.dispatch("rb2"), &encode(&dispatch("u1", "exec"))).unwrap_err();
        assert!(matches!(r.error, InboundError::OtherRobot { ref robot_id, .. } if robot_id == "rb2"));
        assert_eq!(r.task, None, "never answer for another robot's task");
        let r = classify(&t, "rb1", &t.heartbeat("rb1"), b"{}").unwrap_err();
        assert!(matches!(r.error, InboundError::NotForAgent { .. }));
        let r = classify(&t, "rb1", "elsewhere/x", b"{}").unwrap_err();
        assert!(matches!(
            r.error,
            InboundError::Protocol(ProtocolError::UnknownTopic { .. })
        ));
    }

    #[test]
    fn invalid_specs_are_refused_with_their_task() {
        let t = topics();
        let r = classify(&t, "rb1", &t.dispatch("rb1"), &encode(&dispatch("u1", "docker"))).unwrap_err();
        assert!(matches!(r.error, InboundError::InvalidSpec { .. }), "{r:?}");
        assert!(r.error.to_string().contains("spec.driver"), "{}", r.error);
        assert_eq!(r.task, Some(("u1".into(), 2)));
    }

    #[test]
    fn uids_that_cannot_be_topic_levels_are_refused() {
        let t = topics();
        for uid in ["", "a/b", "a+", "#"] {
            let r = classify(&t, "rb1", &t.dispatch("rb1"), &encode(&dispatch(uid, "exec"))).unwrap_err();
            assert_eq!(r.task, None, "{uid:?}");
        }
    }
}
