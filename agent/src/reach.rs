//! Sessions that reach into this robot from the cluster (`k8s4r exec`,
//! `port-forward`, `cp`), over the robot's own MQTT connection
//! ([`k8s4r_api::protocol::reach`]).
//!
//! The cluster decides who may open one (RBAC, checked by the server); the
//! robot decides what it allows at all ([`ReachConfig`], read by
//! [`admit`], a pure decision): sessions `off`, inside `tasks` only (the
//! default), or on the `robot` too, as a configured user, to configured
//! ports. A refusal names the setting that would allow it.
//!
//! Each session is a tokio task of its own ([`exec`], [`forward`]); the
//! event loop only hands it the frames that arrive ([`Reach::offer`]).
//! What a session sends goes at QoS 0 and only within the credits the
//! server grants, so at most a window per session is ever queued ahead of
//! a heartbeat or a status on the robot's connection; all sessions
//! together send at most [`ReachConfig::bytes_per_second`].

use std::collections::HashMap;
use std::ops::RangeInclusive;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use k8s4r_api::protocol::reach::{Frame, SessionEnd, SessionKind, SessionOpen, DEFAULT_SESSION_WINDOW};
use k8s4r_api::protocol::{Topic, TopicKind, Topics};
use rumqttc::AsyncClient;
use tokio::sync::mpsc;
use tokio_util::sync::CancellationToken;

use crate::supervisor::SupervisorHandle;

mod exec;
mod forward;
mod link;
mod rate;

pub use rate::Rate;

/// What sessions a robot allows (`sessions`).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, PartialOrd, Ord)]
pub enum SessionsMode {
    /// None at all.
    Off,
    /// Inside running tasks only (as the task runs): the default.
    #[default]
    Tasks,
    /// Inside tasks, and on the robot itself as `session_user`, to the
    /// ports in `forward_ports`.
    Robot,
}

impl std::str::FromStr for SessionsMode {
    type Err = String;

    fn from_str(s: &str) -> Result<Self, String> {
        match s {
            "off" => Ok(SessionsMode::Off),
            "tasks" => Ok(SessionsMode::Tasks),
            "robot" => Ok(SessionsMode::Robot),
            other => Err(format!("{other:?} is not one of off, tasks, robot")),
        }
    }
}

impl SessionsMode {
    /// The setting's value as written.
    pub fn as_str(self) -> &'static str {
        match self {
            SessionsMode::Off => "off",
            SessionsMode::Tasks => "tasks",
            SessionsMode::Robot => "robot",
        }
    }
}

/// The robot's settings for sessions.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ReachConfig {
    /// `sessions`.
    pub mode: SessionsMode,
    /// `session_user`: who robot sessions run as (none: refused).
    pub user: Option<String>,
    /// `forward_ports`: the ports a robot port-forward may reach.
    pub ports: Vec<RangeInclusive<u16>>,
    /// `max_sessions`: sessions open at once.
    pub max_sessions: usize,
    /// `session_bytes_per_second`: what all sessions together send, at
    /// most (0: no limit beyond the credits).
    pub bytes_per_second: u64,
    /// `max_copy_bytes`: the largest file `k8s4r cp` moves either way.
    pub max_copy_bytes: u64,
    /// How long a process of a session that ended has after SIGHUP before
    /// SIGKILL, when it is not inside a task (which has its own).
    pub hangup_grace: Duration,
    /// Where pushed images go (`k8s4r image push`): set when the robot
    /// offers the podman driver.
    pub images: Option<ImageLoads>,
}

/// How the robot takes pushed container images.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ImageLoads {
    /// Where archives are kept while they arrive (a cut push resumes).
    pub dir: std::path::PathBuf,
    /// podman and its options, as the driver calls it.
    pub podman: Vec<String>,
    /// Where a loaded image is marked as the agent's, so that it is
    /// removed once unused like a pulled one.
    pub marks: std::path::PathBuf,
}

impl Default for ReachConfig {
    fn default() -> Self {
        ReachConfig {
            mode: SessionsMode::Tasks,
            user: None,
            ports: Vec::new(),
            max_sessions: 8,
            bytes_per_second: 8 << 20,
            max_copy_bytes: 256 << 20,
            hangup_grace: Duration::from_secs(10),
            images: None,
        }
    }
}

/// Reads `8080`, `9000-9100`, or a list of them separated by commas.
pub fn parse_ports(text: &str) -> Result<Vec<RangeInclusive<u16>>, String> {
    text.split(',')
        .map(str::trim)
        .filter(|p| !p.is_empty())
        .map(|part| {
            let port = |p: &str| {
                p.trim()
                    .parse::<u16>()
                    .ok()
                    .filter(|p| *p > 0)
                    .ok_or_else(|| format!("{p:?} is not a port (1 to 65535)"))
            };
            match part.split_once('-') {
                Some((a, b)) => {
                    let (a, b) = (port(a)?, port(b)?);
                    if a > b {
                        return Err(format!("{part:?}: the range runs backwards"));
                    }
                    Ok(a..=b)
                }
                None => port(part).map(|p| p..=p),
            }
        })
        .collect()
}

/// Where a session runs, as [`admit`] decided.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Place {
    /// Inside a running attempt of this task.
    Task {
        /// The Task's uid.
        uid: String,
        /// The attempt, when the server named one.
        attempt: Option<u32>,
    },
    /// On the robot, as this user.
    Robot {
        /// The session user.
        user: String,
    },
    /// Into the robot's podman store, as the agent (an image push).
    Images,
}

/// Whether this robot takes `open` with `open_now` sessions already open,
/// and where it runs: a refusal names the robot and the setting.
pub fn admit(
    open: &SessionOpen,
    config: &ReachConfig,
    robot: &str,
    open_now: usize,
) -> Result<Place, SessionEnd> {
    if config.mode == SessionsMode::Off {
        return Err(SessionEnd::refused(
            format!("robot {robot} takes no sessions (its agent setting sessions = \"off\"; \"tasks\" or \"robot\" allow them)"),
            "sessions",
        ));
    }
    if open_now >= config.max_sessions {
        return Err(SessionEnd::refused(
            format!(
                "robot {robot} has {open_now} sessions open, as many as its agent setting max_sessions allows"
            ),
            "max_sessions",
        ));
    }
    if let (SessionKind::Upload, Some(length)) = (open.kind, open.length) {
        if length > config.max_copy_bytes {
            return Err(SessionEnd::refused(
                format!(
                    "robot {robot} takes files of at most {} bytes (its agent setting max_copy_bytes); this one has {length}",
                    config.max_copy_bytes
                ),
                "max_copy_bytes",
            ));
        }
    }
    if open.kind == SessionKind::LoadImage {
        return match &config.images {
            Some(_) => Ok(Place::Images),
            None => Err(SessionEnd::refused(
                format!("robot {robot} does not run container images (its agent setting podman = false)"),
                "podman",
            )),
        };
    }
    if let Some(uid) = &open.task_uid {
        return Ok(Place::Task {
            uid: uid.clone(),
            attempt: open.attempt,
        });
    }
    if config.mode != SessionsMode::Robot {
        return Err(SessionEnd::refused(
            format!(
                "robot {robot} takes sessions inside tasks only (its agent setting sessions = \"{}\"; \"robot\" allows {} on the robot itself)",
                config.mode.as_str(),
                open.kind.as_str()
            ),
            "sessions",
        ));
    }
    if open.kind == SessionKind::Forward {
        let port = open.port.unwrap_or(0);
        if !config.ports.iter().any(|r| r.contains(&port)) {
            return Err(SessionEnd::refused(
                format!("robot {robot} does not forward port {port} (its agent setting forward_ports)"),
                "forward_ports",
            ));
        }
    }
    match &config.user {
        Some(user) => Ok(Place::Robot { user: user.clone() }),
        None if open.kind == SessionKind::Forward => Ok(Place::Robot { user: String::new() }),
        None => Err(SessionEnd::refused(
            format!("robot {robot} names no user for sessions on the robot (its agent setting session_user)"),
            "session_user",
        )),
    }
}

/// Frames waiting for a session beyond its window (credits, keepalives,
/// resizes): more means the server does not keep to the window.
const CONTROL_SLACK: usize = 64;

/// The sessions of this agent: takes their frames off the event loop.
pub struct Reach {
    config: Arc<ReachConfig>,
    client: AsyncClient,
    topics: Topics,
    robot_id: String,
    supervisor: SupervisorHandle,
    sessions: Arc<Mutex<HashMap<String, mpsc::Sender<Vec<u8>>>>>,
    rate: Arc<Rate>,
    stop: CancellationToken,
}

impl Reach {
    /// Sessions for `robot_id`, publishing on `client`.
    pub fn new(
        config: ReachConfig,
        client: AsyncClient,
        topics: Topics,
        robot_id: String,
        supervisor: SupervisorHandle,
    ) -> Self {
        Reach {
            rate: Arc::new(Rate::new(config.bytes_per_second)),
            config: Arc::new(config),
            client,
            topics,
            robot_id,
            supervisor,
            sessions: Arc::default(),
            stop: CancellationToken::new(),
        }
    }

    /// Takes a message if it is a session's frame (true), else leaves it.
    pub fn offer(&self, topic: &str, payload: &[u8]) -> bool {
        let Ok(Topic::Robot {
            robot_id,
            kind: TopicKind::SessionIn { session },
        }) = self.topics.parse(topic)
        else {
            return false;
        };
        if robot_id != self.robot_id {
            return true;
        }
        let mut sessions = lock(&self.sessions);
        if let Some(tx) = sessions.get(&session) {
            if tx.try_send(payload.to_vec()).is_err() {
                // Full: the server sends beyond the window; the session
                // sees its channel closed and ends.
                tracing::warn!(session, "session frames beyond its window; ending it");
                sessions.remove(&session);
            }
            return true;
        }
        let open = match Frame::decode(payload) {
            Ok((0, Frame::Open(open))) => open,
            // A late frame of a session that has ended.
            Ok(_) => return true,
            Err(e) => {
                tracing::warn!(session, error = %e, "a session's first frame is not an open; ignored");
                return true;
            }
        };
        let out = self.topics.session_out(&self.robot_id, &session);
        match admit(&open, &self.config, &self.robot_id, sessions.len()) {
            Err(refusal) => {
                tracing::warn!(session, user = %open.user, kind = open.kind.as_str(), why = refusal.error.as_deref().unwrap_or_default(), "session refused");
                let _ = self.client.try_publish(
                    out,
                    rumqttc::QoS::AtMostOnce,
                    false,
                    Frame::End(refusal).encode(0),
                );
            }
            Ok(place) => {
                let window = usize::try_from(DEFAULT_SESSION_WINDOW).unwrap_or(8);
                let (tx, rx) = mpsc::channel(window + CONTROL_SLACK);
                sessions.insert(session.clone(), tx);
                let link = link::Link::new(self.client.clone(), out, rx, Arc::clone(&self.rate), &open);
                let run = Run {
                    id: session,
                    open: *open,
                    place,
                    link,
                    config: Arc::clone(&self.config),
                    supervisor: self.supervisor.clone(),
                    sessions: Arc::clone(&self.sessions),
                    stop: self.stop.child_token(),
                };
                tokio::spawn(run.run());
            }
        }
        true
    }

    /// Sessions open now.
    pub fn open_now(&self) -> usize {
        lock(&self.sessions).len()
    }

    /// Ends every session (the agent is leaving): their processes get
    /// SIGHUP, as when the connection is lost.
    pub fn stop_all(&self) {
        self.stop.cancel();
    }
}

fn lock<T>(m: &Mutex<T>) -> std::sync::MutexGuard<'_, T> {
    m.lock().unwrap_or_else(|e| e.into_inner())
}

/// One session, admitted.
struct Run {
    id: String,
    open: SessionOpen,
    place: Place,
    link: link::Link,
    config: Arc<ReachConfig>,
    supervisor: SupervisorHandle,
    sessions: Arc<Mutex<HashMap<String, mpsc::Sender<Vec<u8>>>>>,
    stop: CancellationToken,
}

impl Run {
    async fn run(self) {
        let Run {
            id,
            open,
            place,
            link,
            config,
            supervisor,
            sessions,
            stop,
        } = self;
        let at = match &place {
            Place::Task { uid, .. } => format!("task {uid}"),
            Place::Robot { user } => format!("the robot as {user}"),
            Place::Images => "the robot's podman store".to_owned(),
        };
        let what = match open.kind {
            SessionKind::Forward => format!("port {}", open.port.unwrap_or(0)),
            SessionKind::Exec => open.command.join(" "),
            SessionKind::Download | SessionKind::Upload => open.path.clone().unwrap_or_default(),
            SessionKind::LoadImage => format!("sha256:{}", open.sha256.as_deref().unwrap_or_default()),
        };
        // The robot's own record of who reached into it.
        tracing::info!(session = %id, user = %open.user, kind = open.kind.as_str(), %what, %at, "session opened");
        let end = match open.kind {
            SessionKind::Forward => forward::run(link, &open, stop).await,
            _ => exec::run(link, &open, &place, &config, &supervisor, stop).await,
        };
        tracing::info!(
            session = %id,
            user = %open.user,
            kind = open.kind.as_str(),
            %what,
            exit_code = ?end.exit_code,
            signal = ?end.signal,
            error = end.error.as_deref().unwrap_or_default(),
            bytes_in = end.bytes_in,
            bytes_out = end.bytes_out,
            "session ended"
        );
        lock(&sessions).remove(&id);
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use k8s4r_api::protocol::reach::DEFAULT_SESSION_WINDOW;

    fn open(kind: SessionKind, task: bool) -> SessionOpen {
        SessionOpen {
            kind,
            user: "ana".into(),
            task_uid: task.then(|| "u1".to_owned()),
            attempt: Some(2).filter(|_| task),
            command: vec!["sh".into()],
            tty: false,
            stdin: false,
            size: None,
            port: Some(8080),
            path: Some("f".into()),
            length: Some(10),
            mode: None,
            sha256: None,
            image: None,
            window: DEFAULT_SESSION_WINDOW,
            lease_ms: 30_000,
        }
    }

    fn refused_setting(r: Result<Place, SessionEnd>) -> String {
        r.unwrap_err().refused_by_setting.unwrap()
    }

    #[test]
    fn the_default_takes_task_sessions_and_refuses_the_robot_naming_the_setting() {
        let config = ReachConfig::default();
        assert_eq!(
            admit(&open(SessionKind::Exec, true), &config, "rb1", 0),
            Ok(Place::Task {
                uid: "u1".into(),
                attempt: Some(2)
            })
        );
        let refusal = admit(&open(SessionKind::Exec, false), &config, "rb1", 0).unwrap_err();
        assert_eq!(refusal.refused_by_setting.as_deref(), Some("sessions"));
        assert!(refusal
            .error
            .unwrap()
            .contains("robot rb1 takes sessions inside tasks only"));
        assert_eq!(
            refused_setting(admit(&open(SessionKind::Forward, false), &config, "rb1", 0)),
            "sessions"
        );
    }

    #[test]
    fn off_refuses_everything_and_the_limit_counts() {
        let off = ReachConfig {
            mode: SessionsMode::Off,
            ..ReachConfig::default()
        };
        assert_eq!(
            refused_setting(admit(&open(SessionKind::Exec, true), &off, "rb1", 0)),
            "sessions"
        );
        let config = ReachConfig {
            max_sessions: 2,
            ..ReachConfig::default()
        };
        assert!(admit(&open(SessionKind::Exec, true), &config, "rb1", 1).is_ok());
        assert_eq!(
            refused_setting(admit(&open(SessionKind::Exec, true), &config, "rb1", 2)),
            "max_sessions"
        );
    }

    #[test]
    fn robot_sessions_need_a_user_and_robot_ports_must_be_listed() {
        let mut config = ReachConfig {
            mode: SessionsMode::Robot,
            ..ReachConfig::default()
        };
        assert_eq!(
            refused_setting(admit(&open(SessionKind::Exec, false), &config, "rb1", 0)),
            "session_user"
        );
        assert_eq!(
            refused_setting(admit(&open(SessionKind::Forward, false), &config, "rb1", 0)),
            "forward_ports"
        );
        config.user = Some("ops".into());
        config.ports = parse_ports("22, 8000-8100").unwrap();
        assert_eq!(
            admit(&open(SessionKind::Exec, false), &config, "rb1", 0),
            Ok(Place::Robot { user: "ops".into() })
        );
        assert!(admit(&open(SessionKind::Forward, false), &config, "rb1", 0).is_ok());
        let mut ssh = open(SessionKind::Forward, false);
        ssh.port = Some(23);
        assert_eq!(refused_setting(admit(&ssh, &config, "rb1", 0)), "forward_ports");
    }

    #[test]
    fn a_copy_over_the_limit_is_refused_before_a_byte_moves() {
        let config = ReachConfig {
            max_copy_bytes: 5,
            ..ReachConfig::default()
        };
        assert_eq!(
            refused_setting(admit(&open(SessionKind::Upload, true), &config, "rb1", 0)),
            "max_copy_bytes"
        );
    }

    #[test]
    fn ports_read_as_lists_and_ranges() {
        assert_eq!(parse_ports("22").unwrap(), vec![22..=22]);
        assert_eq!(parse_ports("22,8000-8002").unwrap(), vec![22..=22, 8000..=8002]);
        assert_eq!(parse_ports("").unwrap(), vec![]);
        assert!(parse_ports("0").is_err());
        assert!(parse_ports("9-3").is_err());
        assert!(parse_ports("http").is_err());
    }
}
