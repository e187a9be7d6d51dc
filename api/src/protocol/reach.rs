//! Sessions that reach into a robot: `exec` (a process, with a pty or
//! pipes), `forward` (a TCP connection to a port on the robot's loopback)
//! and `download`/`upload` (a file), carried over the robot's own MQTT
//! connection, as the issue about reaching robots asks (no inbound port on
//! the robot).
//!
//! Each session has two topics under its robot's id:
//! `robots/{id}/sessions/{sid}/in` (server → robot) and
//! `robots/{id}/sessions/{sid}/out` (robot → server), both QoS 0: no packet
//! ids held, nothing queued for a robot that is away (a session does not
//! outlive its connection). Every frame is numbered per direction, so a
//! frame lost on the way ends the session with "lost in transit" instead of
//! corrupting what it carries.
//!
//! A frame is binary: one byte of [`FrameKind`], the sequence number (u32,
//! big-endian), then the body. Data goes raw (no JSON, no base64: a port
//! forward moves tens of MiB a second); the few control frames that carry
//! structure carry JSON.
//!
//! Flow control is by credits, counted in frames of at most
//! [`MAX_SESSION_DATA`] bytes: each side says in its first frame how many
//! data frames it takes ahead of what it has consumed (its window), and
//! grants more ([`FrameKind::Credit`]) as it consumes them. Neither side
//! ever holds more than a window per direction, whatever the other side's
//! pace. [`Flow`] is that bookkeeping, without I/O.

use std::time::Duration;

use serde::{Deserialize, Serialize};

/// Most data bytes one frame carries.
pub const MAX_SESSION_DATA: usize = 32 * 1024;
/// The window each side offers by default, in data frames (256 KiB).
pub const DEFAULT_SESSION_WINDOW: u32 = 8;
/// The largest window either side may ask for.
pub const MAX_SESSION_WINDOW: u32 = 64;
/// Silence after which either side ends a session: the server renews it
/// and the robot answers every [`SESSION_KEEPALIVE`].
pub const DEFAULT_SESSION_LEASE: Duration = Duration::from_secs(30);
/// The shortest lease a robot accepts (tests use it).
pub const MIN_SESSION_LEASE: Duration = Duration::from_secs(2);
/// The longest lease a robot accepts.
pub const MAX_SESSION_LEASE: Duration = Duration::from_secs(600);
/// Longest session id, in bytes.
pub const MAX_SESSION_ID_BYTES: usize = 64;
/// Most words of an exec command.
pub const MAX_COMMAND_WORDS: usize = 256;
/// Longest file path a copy names.
pub const MAX_PATH_BYTES: usize = 4096;

/// Stream numbers of [`FrameKind::Data`] and [`FrameKind::Eof`], as
/// Kubernetes' channel protocol numbers them: in → process, out and err
/// ← process. A forward or a copy uses [`STDIN`] towards the robot and
/// [`STDOUT`] from it.
pub const STDIN: u8 = 0;
/// What the process (or the port, or the file) sends.
pub const STDOUT: u8 = 1;
/// The process's error output.
pub const STDERR: u8 = 2;

/// What a frame is.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[repr(u8)]
pub enum FrameKind {
    /// Server → robot, first: [`SessionOpen`] (JSON).
    Open = 1,
    /// Robot → server, first: [`SessionOpened`] (JSON).
    Opened = 2,
    /// Either way: one stream byte, then data.
    Data = 3,
    /// Either way: u32 more data frames the sender takes.
    Credit = 4,
    /// Either way: one stream byte; that stream has ended.
    Eof = 5,
    /// Server → robot: the terminal's size, u16 columns and u16 rows.
    Resize = 6,
    /// Either way, last: [`SessionEnd`] (JSON).
    End = 7,
    /// Either way, empty: still here (renews the lease).
    Alive = 8,
}

impl FrameKind {
    fn from_byte(b: u8) -> Option<Self> {
        Some(match b {
            1 => FrameKind::Open,
            2 => FrameKind::Opened,
            3 => FrameKind::Data,
            4 => FrameKind::Credit,
            5 => FrameKind::Eof,
            6 => FrameKind::Resize,
            7 => FrameKind::End,
            8 => FrameKind::Alive,
            _ => return None,
        })
    }
}

/// A frame, decoded.
#[derive(Debug, Clone, PartialEq)]
pub enum Frame {
    /// The session's request.
    Open(Box<SessionOpen>),
    /// The robot took it.
    Opened(SessionOpened),
    /// Bytes of one stream.
    Data(u8, Vec<u8>),
    /// More data frames the sender takes.
    Credit(u32),
    /// A stream ended.
    Eof(u8),
    /// The terminal's new size (columns, rows).
    Resize(u16, u16),
    /// The session is over.
    End(SessionEnd),
    /// Still here.
    Alive,
}

/// Why a frame could not be read.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum FrameError {
    /// Shorter than its header or its fixed body.
    #[error("session frame too short ({0} bytes)")]
    Short(usize),
    /// An unknown kind byte.
    #[error("unknown session frame kind {0}")]
    UnknownKind(u8),
    /// Data longer than [`MAX_SESSION_DATA`].
    #[error("session data frame of {0} bytes (at most {MAX_SESSION_DATA})")]
    TooLarge(usize),
    /// A JSON body that does not parse or breaks a bound.
    #[error("session frame body: {0}")]
    Body(String),
}

impl Frame {
    /// The frame's kind.
    pub fn kind(&self) -> FrameKind {
        match self {
            Frame::Open(_) => FrameKind::Open,
            Frame::Opened(_) => FrameKind::Opened,
            Frame::Data(..) => FrameKind::Data,
            Frame::Credit(_) => FrameKind::Credit,
            Frame::Eof(_) => FrameKind::Eof,
            Frame::Resize(..) => FrameKind::Resize,
            Frame::End(_) => FrameKind::End,
            Frame::Alive => FrameKind::Alive,
        }
    }

    /// The frame as it goes on the wire, numbered `seq`.
    pub fn encode(&self, seq: u32) -> Vec<u8> {
        let mut out = Vec::with_capacity(16);
        out.push(self.kind() as u8);
        out.extend_from_slice(&seq.to_be_bytes());
        match self {
            Frame::Open(open) => out.extend(serde_json::to_vec(open).unwrap_or_default()),
            Frame::Opened(opened) => out.extend(serde_json::to_vec(opened).unwrap_or_default()),
            Frame::End(end) => out.extend(serde_json::to_vec(end).unwrap_or_default()),
            Frame::Data(stream, data) => {
                out.reserve(data.len() + 1);
                out.push(*stream);
                out.extend_from_slice(data);
            }
            Frame::Credit(n) => out.extend_from_slice(&n.to_be_bytes()),
            Frame::Eof(stream) => out.push(*stream),
            Frame::Resize(cols, rows) => {
                out.extend_from_slice(&cols.to_be_bytes());
                out.extend_from_slice(&rows.to_be_bytes());
            }
            Frame::Alive => {}
        }
        out
    }

    /// Reads a frame and its sequence number.
    pub fn decode(bytes: &[u8]) -> Result<(u32, Frame), FrameError> {
        let short = || FrameError::Short(bytes.len());
        let (&kind, rest) = bytes.split_first().ok_or_else(short)?;
        let kind = FrameKind::from_byte(kind).ok_or(FrameError::UnknownKind(kind))?;
        let seq = rest.get(..4).ok_or_else(short)?;
        let seq = u32::from_be_bytes([seq[0], seq[1], seq[2], seq[3]]);
        let body = &rest[4..];
        fn json(body: &[u8]) -> Result<&[u8], FrameError> {
            if body.len() > super::MAX_MESSAGE_BYTES {
                return Err(FrameError::Body("larger than a protocol message".into()));
            }
            Ok(body)
        }
        let frame = match kind {
            FrameKind::Open => {
                let open: SessionOpen =
                    serde_json::from_slice(json(body)?).map_err(|e| FrameError::Body(e.to_string()))?;
                open.check().map_err(FrameError::Body)?;
                Frame::Open(Box::new(open))
            }
            FrameKind::Opened => Frame::Opened(
                serde_json::from_slice(json(body)?).map_err(|e| FrameError::Body(e.to_string()))?,
            ),
            FrameKind::End => {
                Frame::End(serde_json::from_slice(json(body)?).map_err(|e| FrameError::Body(e.to_string()))?)
            }
            FrameKind::Data => {
                let (&stream, data) = body.split_first().ok_or_else(short)?;
                if data.len() > MAX_SESSION_DATA {
                    return Err(FrameError::TooLarge(data.len()));
                }
                Frame::Data(stream, data.to_vec())
            }
            FrameKind::Credit => {
                let n = body.get(..4).ok_or_else(short)?;
                Frame::Credit(u32::from_be_bytes([n[0], n[1], n[2], n[3]]))
            }
            FrameKind::Eof => Frame::Eof(*body.first().ok_or_else(short)?),
            FrameKind::Resize => {
                let b = body.get(..4).ok_or_else(short)?;
                Frame::Resize(u16::from_be_bytes([b[0], b[1]]), u16::from_be_bytes([b[2], b[3]]))
            }
            FrameKind::Alive => Frame::Alive,
        };
        Ok((seq, frame))
    }
}

/// The largest image archive a push announces.
pub const MAX_IMAGE_ARCHIVE_BYTES: u64 = 64 << 30;

/// What a session does.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub enum SessionKind {
    /// Runs a command.
    Exec,
    /// Connects to a TCP port on the robot's loopback.
    Forward,
    /// Sends a file from the robot.
    Download,
    /// Writes a file on the robot.
    Upload,
    /// Takes a container image (an OCI archive) into the robot's podman
    /// store: resumable, the robot first says how much of it it has.
    LoadImage,
}

impl SessionKind {
    /// The word people and logs use.
    pub fn as_str(self) -> &'static str {
        match self {
            SessionKind::Exec => "exec",
            SessionKind::Forward => "port-forward",
            SessionKind::Download => "copy from",
            SessionKind::Upload => "copy to",
            SessionKind::LoadImage => "image push",
        }
    }
}

/// `Open`: what the session is to do, for whom.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct SessionOpen {
    /// What it does.
    pub kind: SessionKind,
    /// Who asked (the cluster user), for the robot's own log.
    pub user: String,
    /// Inside this running task (its uid); none: on the robot itself.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub task_uid: Option<String>,
    /// The task's attempt that must be running.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub attempt: Option<u32>,
    /// Exec: the command and its arguments.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub command: Vec<String>,
    /// Exec: a pty for the process (stdout and stderr then are one).
    #[serde(default)]
    pub tty: bool,
    /// Exec: stdin comes from the client (else it is empty).
    #[serde(default)]
    pub stdin: bool,
    /// Exec with a tty: the terminal's first size (columns, rows).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub size: Option<(u16, u16)>,
    /// Forward: the port on the robot's loopback.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub port: Option<u16>,
    /// Download and upload: the file (relative paths start at the task's
    /// directory, or the session user's home).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub path: Option<String>,
    /// Upload: the file's size in bytes (the robot refuses it before a
    /// byte is sent when it is over its limit).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub length: Option<u64>,
    /// Upload: the file's mode.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub mode: Option<u32>,
    /// LoadImage: the archive's sha256, 64 lowercase hex digits (with
    /// `length`, how the robot knows what it has of it).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub sha256: Option<String>,
    /// LoadImage: the image, by digest, the archive must hold once loaded.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub image: Option<String>,
    /// Data frames the server takes ahead.
    pub window: u32,
    /// Silence after which the robot ends the session, in milliseconds.
    pub lease_ms: u64,
}

impl SessionOpen {
    /// Refuses what no robot should act on.
    pub fn check(&self) -> Result<(), String> {
        if self.user.len() > 256 {
            return Err("user longer than 256 bytes".into());
        }
        if self.command.len() > MAX_COMMAND_WORDS {
            return Err(format!(
                "command of {} words (at most {MAX_COMMAND_WORDS})",
                self.command.len()
            ));
        }
        if self.command.iter().any(|w| w.contains('\0')) {
            return Err("command with a NUL byte".into());
        }
        if let Some(path) = &self.path {
            if path.len() > MAX_PATH_BYTES || path.contains('\0') || path.is_empty() {
                return Err("path empty, too long or with a NUL byte".into());
            }
        }
        if self.window == 0 || self.window > MAX_SESSION_WINDOW {
            return Err(format!("window {} (1 to {MAX_SESSION_WINDOW})", self.window));
        }
        let (kind, missing) = match self.kind {
            SessionKind::Exec => ("exec", self.command.is_empty().then_some("a command")),
            SessionKind::Forward => (
                "port-forward",
                self.port.is_none_or(|p| p == 0).then_some("a port"),
            ),
            SessionKind::Download | SessionKind::Upload => ("copy", self.path.is_none().then_some("a path")),
            SessionKind::LoadImage => {
                let sha_ok = self
                    .sha256
                    .as_deref()
                    .is_some_and(crate::container::is_sha256_hex);
                if self.task_uid.is_some() {
                    return Err("an image push goes to a robot, not into a task".into());
                }
                if let Some(image) = &self.image {
                    crate::container::ImageRef::parse(image)
                        .map_err(|why| format!("image push: image {why}"))?;
                }
                let missing = if !sha_ok {
                    Some("the archive's sha256 (64 lowercase hex digits)")
                } else if self.length.is_none_or(|l| l == 0 || l > MAX_IMAGE_ARCHIVE_BYTES) {
                    Some("the archive's length (at most 64 GiB)")
                } else {
                    None
                };
                ("image push", missing)
            }
        };
        match missing {
            Some(what) => Err(format!("{kind} without {what}")),
            None => Ok(()),
        }
    }

    /// The lease, within what a robot accepts.
    pub fn lease(&self) -> Duration {
        Duration::from_millis(self.lease_ms).clamp(MIN_SESSION_LEASE, MAX_SESSION_LEASE)
    }
}

/// `Opened`: the robot took the session.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct SessionOpened {
    /// Data frames the robot takes ahead.
    pub window: u32,
    /// Download: the file's size.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub length: Option<u64>,
    /// The user the process runs as (exec).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub run_as: Option<String>,
}

/// `End`: how the session ended.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct SessionEnd {
    /// Exec: the command's exit code.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub exit_code: Option<i32>,
    /// Exec: the signal that ended the command.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub signal: Option<i32>,
    /// What went wrong, if anything.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub error: Option<String>,
    /// The robot refused the session: the agent setting that would allow
    /// it.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub refused_by_setting: Option<String>,
    /// Bytes the robot took from the client.
    #[serde(default)]
    pub bytes_in: u64,
    /// Bytes the robot sent to the client.
    #[serde(default)]
    pub bytes_out: u64,
}

impl SessionEnd {
    /// An end that says what went wrong.
    pub fn error(why: impl Into<String>) -> Self {
        SessionEnd {
            error: Some(why.into()),
            ..SessionEnd::default()
        }
    }

    /// A refusal naming the setting that would allow the session.
    pub fn refused(why: impl Into<String>, setting: &str) -> Self {
        SessionEnd {
            error: Some(why.into()),
            refused_by_setting: Some(setting.to_owned()),
            ..SessionEnd::default()
        }
    }
}

/// A frame came out of order: one before it was lost.
#[derive(Debug, Clone, Copy, PartialEq, Eq, thiserror::Error)]
#[error("session frame {got} arrived where {expected} was due: a frame was lost in transit")]
pub struct Gap {
    /// The number due.
    pub expected: u32,
    /// The number that came.
    pub got: u32,
}

/// One side's bookkeeping of a session: numbering, credits both ways and
/// the lease. No I/O and no clock of its own: the caller passes `now`.
#[derive(Debug, Clone)]
pub struct Flow {
    next_out: u32,
    next_in: u32,
    /// Data frames this side may still send.
    credit: u32,
    /// This side's window (what it offered).
    window: u32,
    /// Data frames consumed since the last grant.
    consumed: u32,
    lease: Duration,
    heard: Duration,
    said: Duration,
}

impl Flow {
    /// A side that offers `window` and ends the session after `lease` of
    /// silence, started at `now`. It may send nothing until the other
    /// side's window is known ([`Flow::peer_window`]).
    pub fn new(window: u32, lease: Duration, now: Duration) -> Self {
        Flow {
            next_out: 0,
            next_in: 0,
            credit: 0,
            window,
            consumed: 0,
            lease,
            heard: now,
            said: now,
        }
    }

    /// The window this side offered.
    pub fn window(&self) -> u32 {
        self.window
    }

    /// The other side said its window.
    pub fn peer_window(&mut self, window: u32) {
        self.credit = window.min(MAX_SESSION_WINDOW);
    }

    /// Numbers the next frame out (and counts a data frame against the
    /// credit). Callers check [`Flow::can_send`] before data.
    pub fn send(&mut self, frame: &Frame, now: Duration) -> Vec<u8> {
        if matches!(frame, Frame::Data(..)) {
            self.credit = self.credit.saturating_sub(1);
        }
        self.said = now;
        let seq = self.next_out;
        self.next_out = self.next_out.wrapping_add(1);
        frame.encode(seq)
    }

    /// Whether a data frame may go now.
    pub fn can_send(&self) -> bool {
        self.credit > 0
    }

    /// Takes a frame that arrived at `now`: it must be the next in order.
    /// A credit is counted here.
    pub fn receive(&mut self, seq: u32, frame: &Frame, now: Duration) -> Result<(), Gap> {
        if seq != self.next_in {
            return Err(Gap {
                expected: self.next_in,
                got: seq,
            });
        }
        self.next_in = self.next_in.wrapping_add(1);
        self.heard = now;
        if let Frame::Credit(n) = frame {
            self.credit = self.credit.saturating_add(*n).min(MAX_SESSION_WINDOW * 2);
        }
        Ok(())
    }

    /// A data frame that arrived was consumed (written to the process, the
    /// socket or the client): the credit to grant back, once half the
    /// window is consumed (so grants do not double the frames).
    pub fn consumed(&mut self) -> Option<u32> {
        self.consumed += 1;
        if self.consumed * 2 >= self.window {
            let grant = self.consumed;
            self.consumed = 0;
            return Some(grant);
        }
        None
    }

    /// Whether the other side has been silent for the whole lease.
    pub fn lapsed(&self, now: Duration) -> bool {
        now.saturating_sub(self.heard) >= self.lease
    }

    /// Whether this side should say it is still here (a third of the
    /// lease since it last sent anything).
    pub fn keepalive_due(&self, now: Duration) -> bool {
        now.saturating_sub(self.said) >= self.lease / 3
    }

    /// When this side next has something to check (the lease or a
    /// keepalive), from `now`.
    pub fn next_check(&self, now: Duration) -> Duration {
        let lapse = (self.heard + self.lease).saturating_sub(now);
        let keepalive = (self.said + self.lease / 3).saturating_sub(now);
        lapse.min(keepalive)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn open() -> SessionOpen {
        SessionOpen {
            kind: SessionKind::Exec,
            user: "ana".into(),
            task_uid: Some("u1".into()),
            attempt: Some(1),
            command: vec!["sh".into()],
            tty: true,
            stdin: true,
            size: Some((80, 24)),
            port: None,
            path: None,
            length: None,
            mode: None,
            sha256: None,
            image: None,
            window: DEFAULT_SESSION_WINDOW,
            lease_ms: 30_000,
        }
    }

    #[test]
    fn every_frame_reads_back_as_it_was_written() {
        let frames = [
            Frame::Open(Box::new(open())),
            Frame::Opened(SessionOpened {
                window: 8,
                length: Some(3),
                run_as: Some("k8s4r-1000".into()),
            }),
            Frame::Data(STDOUT, b"hello".to_vec()),
            Frame::Data(STDIN, vec![]),
            Frame::Credit(7),
            Frame::Eof(STDIN),
            Frame::Resize(120, 40),
            Frame::End(SessionEnd {
                exit_code: Some(3),
                bytes_out: 10,
                ..SessionEnd::default()
            }),
            Frame::Alive,
        ];
        for (seq, frame) in frames.into_iter().enumerate() {
            let bytes = frame.encode(seq as u32 + 1000);
            assert_eq!(Frame::decode(&bytes), Ok((seq as u32 + 1000, frame)));
        }
    }

    #[test]
    fn garbage_is_refused_not_read() {
        assert_eq!(Frame::decode(&[]), Err(FrameError::Short(0)));
        assert_eq!(Frame::decode(&[3, 0, 0]), Err(FrameError::Short(3)));
        assert_eq!(Frame::decode(&[99, 0, 0, 0, 0]), Err(FrameError::UnknownKind(99)));
        assert!(matches!(
            Frame::decode(&[1, 0, 0, 0, 0, b'{']),
            Err(FrameError::Body(_))
        ));
        let mut big = Frame::Data(STDOUT, vec![0; MAX_SESSION_DATA]).encode(0);
        big.push(0);
        assert_eq!(
            Frame::decode(&big),
            Err(FrameError::TooLarge(MAX_SESSION_DATA + 1))
        );
        let mut no_command = open();
        no_command.command.clear();
        let err = Frame::decode(&Frame::Open(Box::new(no_command)).encode(0)).unwrap_err();
        assert_eq!(err, FrameError::Body("exec without a command".into()));
        let mut wide = open();
        wide.window = MAX_SESSION_WINDOW + 1;
        assert!(Frame::decode(&Frame::Open(Box::new(wide)).encode(0)).is_err());
    }

    #[test]
    fn a_lost_frame_is_a_gap() {
        let now = Duration::ZERO;
        let mut flow = Flow::new(8, DEFAULT_SESSION_LEASE, now);
        assert_eq!(flow.receive(0, &Frame::Alive, now), Ok(()));
        assert_eq!(
            flow.receive(2, &Frame::Alive, now),
            Err(Gap { expected: 1, got: 2 })
        );
    }

    #[test]
    fn data_waits_for_credit_and_grants_come_every_half_window() {
        let now = Duration::ZERO;
        let mut flow = Flow::new(4, DEFAULT_SESSION_LEASE, now);
        assert!(!flow.can_send(), "nothing before the peer's window is known");
        flow.peer_window(2);
        let data = Frame::Data(STDOUT, b"x".to_vec());
        flow.send(&data, now);
        assert!(flow.can_send());
        flow.send(&data, now);
        assert!(!flow.can_send());
        flow.receive(0, &Frame::Credit(1), now).unwrap();
        assert!(flow.can_send());
        // Half of a window of 4 consumed: 2 granted back.
        assert_eq!(flow.consumed(), None);
        assert_eq!(flow.consumed(), Some(2));
        assert_eq!(flow.consumed(), None);
    }

    #[test]
    fn silence_for_the_lease_lapses_and_keepalives_come_at_a_third() {
        let lease = Duration::from_secs(30);
        let mut flow = Flow::new(8, lease, Duration::ZERO);
        assert!(!flow.keepalive_due(Duration::from_secs(9)));
        assert!(flow.keepalive_due(Duration::from_secs(10)));
        assert_eq!(flow.next_check(Duration::from_secs(4)), Duration::from_secs(6));
        flow.receive(0, &Frame::Alive, Duration::from_secs(20)).unwrap();
        assert!(!flow.lapsed(Duration::from_secs(49)));
        assert!(flow.lapsed(Duration::from_secs(50)));
    }
}
