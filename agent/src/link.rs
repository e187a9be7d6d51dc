//! The session's state, without I/O: which QoS 1 publishes the MQTT client
//! holds, which packet id each got, which outbox entries are in flight, and
//! where registration stands.
//!
//! The session hands every QoS 1 publish over from one task, so
//! [`PacketIds`] matches each PUBACK to its publish exactly (see
//! [`k8s4r_mqtt::acks`]). On a connection error rumqttc moves what
//! it held (sent and unsent) into its `pending` queue; the session clears
//! that queue and [`Link::disconnected`] forgets everything in flight, so the
//! outbox is replayed from its oldest entry on the next connection.

use std::collections::BTreeMap;
use std::time::Duration;

use k8s4r_api::RobotPhase;
use k8s4r_mqtt::PacketIds;

use k8s4r_api::backoff::{exponential, Backoff};

/// What a QoS 1 publish handed to the client was.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Tag {
    /// The outbox entry with this id.
    Status(u64),
    /// Registration or presence: nothing to remove when acknowledged.
    Control,
}

/// Publish bookkeeping for one connection.
#[derive(Debug)]
pub struct Link {
    connected: bool,
    /// Handed to the client or sent, waiting for PUBACK.
    acks: PacketIds<Tag>,
    /// Outbox entries below this id were handed over on this connection.
    cursor: u64,
    max_outstanding: usize,
}

impl Link {
    /// At most `max_outstanding` QoS 1 publishes between hand-over and
    /// PUBACK. Keep it below the client's in-flight limit: rumqttc then
    /// never has to reuse a packet id that is still unacknowledged.
    pub fn new(max_outstanding: usize) -> Self {
        Self {
            connected: false,
            acks: PacketIds::default(),
            cursor: 0,
            max_outstanding: max_outstanding.max(1),
        }
    }

    /// A CONNACK arrived.
    pub fn connected(&mut self) {
        self.connected = true;
        self.acks.clear();
        self.cursor = 0;
    }

    /// The connection failed; everything in flight will be sent again.
    pub fn disconnected(&mut self) {
        self.connected = false;
        self.acks.clear();
        self.cursor = 0;
    }

    /// Whether a CONNACK arrived since the last error.
    pub fn is_connected(&self) -> bool {
        self.connected
    }

    /// Publishes handed over or sent and not yet acknowledged.
    pub fn outstanding(&self) -> usize {
        self.acks.outstanding()
    }

    /// Whether another QoS 1 publish may be handed over now.
    pub fn has_room(&self) -> bool {
        self.connected && self.outstanding() < self.max_outstanding
    }

    /// The first outbox id not yet handed over on this connection.
    pub fn cursor(&self) -> u64 {
        self.cursor
    }

    /// Hands the outbox over again from its oldest entry (statuses the
    /// server has not confirmed in time are sent again; it drops
    /// duplicates by seq).
    pub fn rewind(&mut self) {
        self.cursor = 0;
    }

    /// A QoS 1 publish was handed to the client.
    pub fn handed_over(&mut self, tag: Tag) {
        if let Tag::Status(id) = tag {
            self.cursor = self.cursor.max(id + 1);
        }
        self.acks.handed_over(tag);
    }

    /// The client refused the publish handed over last (its request
    /// channel was full): a status goes out again from its entry on.
    pub fn withdraw_last(&mut self) {
        if let Some(Tag::Status(id)) = self.acks.withdraw_last() {
            self.cursor = self.cursor.min(id);
        }
    }

    /// The client sent a publish with this packet id (0: QoS 0, ignored).
    pub fn sent(&mut self, pkid: u16) {
        self.acks.sent(pkid);
    }

    /// The broker acknowledged this packet id.
    pub fn acked(&mut self, pkid: u16) -> Option<Tag> {
        self.acks.acked(pkid)
    }

    /// Whether nothing is waiting for the broker.
    pub fn idle(&self) -> bool {
        self.acks.is_empty()
    }
}

/// Where registration stands on the current connection.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Registration {
    /// Not connected.
    Offline,
    /// Register sent; the next one goes at `retry_at` unless approved.
    Waiting {
        /// When to register again.
        retry_at: Duration,
    },
    /// The server answered Online.
    Approved,
}

/// Registration's state machine: register on every connect, again with
/// backoff until the server answers Online. A Rejected answer (the
/// bootstrap token was refused) spaces the next tries far wider, from
/// [`REJECTED_RETRY_MIN`] doubling to [`REJECTED_RETRY_MAX`]: a person has
/// to act before one can succeed.
#[derive(Debug)]
pub struct Registrar {
    state: Registration,
    backoff: Backoff,
    last_phase: Option<RobotPhase>,
    /// This process's session id: every nonce starts with it.
    session: String,
    /// Registrations sent so far by this process.
    sent: u64,
    /// Rejected answers since the last Online one.
    rejections: u32,
    /// The message of the rejection last reported, while rejections go on.
    rejected_for: Option<String>,
}

/// Registrations whose answers are still taken: older ones are stale.
const ANSWERED_REGISTRATIONS: u64 = 16;

/// The wait after a first rejection before registering again.
pub const REJECTED_RETRY_MIN: Duration = Duration::from_secs(10);
/// The longest wait between registrations while they are rejected.
pub const REJECTED_RETRY_MAX: Duration = Duration::from_secs(300);

/// What the registrar wants done.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum RegisterAction {
    /// Nothing.
    None,
    /// Publish a register message.
    Register,
    /// Approval arrived: run held dispatches, start heartbeats.
    Approved,
    /// The server rejected the robot; the next registration goes in
    /// `retry_in`.
    Rejected {
        /// Whether this rejection is news (the first, or its message
        /// changed): worth an error a person reads; repeats are not.
        news: bool,
        /// The wait before registering again.
        retry_in: Duration,
    },
}

impl Registrar {
    /// Retries spaced by `backoff`.
    pub fn new(backoff: Backoff, session: impl Into<String>) -> Self {
        Self {
            state: Registration::Offline,
            backoff,
            last_phase: None,
            session: session.into(),
            sent: 0,
            rejections: 0,
            rejected_for: None,
        }
    }

    /// The nonce of the next registration sent.
    pub fn next_nonce(&mut self) -> String {
        self.sent += 1;
        format!("{}-{}", self.session, self.sent)
    }

    /// Whether an answer carrying `nonce` answers one of this process's
    /// last registrations. An answer to a registration of a previous
    /// process (it waited in the broker while the robot restarted) is not.
    pub fn asked(&self, nonce: &str) -> bool {
        let Some(n) = nonce
            .strip_prefix(self.session.as_str())
            .and_then(|rest| rest.strip_prefix('-'))
            .and_then(|n| n.parse::<u64>().ok())
        else {
            return false;
        };
        n >= 1 && n <= self.sent && self.sent - n < ANSWERED_REGISTRATIONS
    }

    /// The current state.
    pub fn state(&self) -> Registration {
        self.state
    }

    /// Whether the server approved the robot on this connection.
    pub fn approved(&self) -> bool {
        self.state == Registration::Approved
    }

    /// The phase of the last response.
    pub fn last_phase(&self) -> Option<RobotPhase> {
        self.last_phase
    }

    /// Connected: register now.
    pub fn connected(&mut self, now: Duration) -> RegisterAction {
        self.state = Registration::Waiting {
            retry_at: now + self.backoff.next_delay(),
        };
        RegisterAction::Register
    }

    /// Disconnected.
    pub fn disconnected(&mut self) {
        self.state = Registration::Offline;
    }

    /// When the next retry is due, if one is.
    pub fn deadline(&self) -> Option<Duration> {
        match self.state {
            Registration::Waiting { retry_at } => Some(retry_at),
            _ => None,
        }
    }

    /// Time passed: register again if the retry is due.
    pub fn tick(&mut self, now: Duration) -> RegisterAction {
        match self.state {
            Registration::Waiting { retry_at } if now >= retry_at => {
                self.state = Registration::Waiting {
                    retry_at: now + self.backoff.next_delay(),
                };
                RegisterAction::Register
            }
            _ => RegisterAction::None,
        }
    }

    /// The server answered with `phase` and, perhaps, a message saying why.
    pub fn response(&mut self, phase: RobotPhase, message: Option<&str>, now: Duration) -> RegisterAction {
        self.last_phase = Some(phase);
        if phase != RobotPhase::Rejected {
            self.rejected_for = None;
        }
        match (self.state, phase) {
            (Registration::Offline, _) => RegisterAction::None,
            (_, RobotPhase::Rejected) => self.rejected(message.unwrap_or_default(), now),
            (Registration::Approved, RobotPhase::Online) => RegisterAction::None,
            (_, RobotPhase::Online) => {
                self.state = Registration::Approved;
                self.backoff.reset();
                self.rejections = 0;
                RegisterAction::Approved
            }
            // Pending, Offline: keep waiting; the retry already scheduled
            // stays (a response must not speed retries up).
            (Registration::Approved, _) => {
                self.state = Registration::Waiting {
                    retry_at: now + self.backoff.next_delay(),
                };
                RegisterAction::None
            }
            (Registration::Waiting { .. }, _) => RegisterAction::None,
        }
    }

    /// A rejection: the next registration waits the longer of the retry
    /// already due and the rejections' own backoff, which doubles per
    /// rejection since the last approval, capped.
    fn rejected(&mut self, message: &str, now: Duration) -> RegisterAction {
        let wait = exponential(REJECTED_RETRY_MIN, REJECTED_RETRY_MAX, self.rejections);
        self.rejections = self.rejections.saturating_add(1);
        let retry_at = match self.state {
            Registration::Waiting { retry_at } => retry_at.max(now + wait),
            _ => now + wait,
        };
        self.state = Registration::Waiting { retry_at };
        let news = self.rejected_for.as_deref() != Some(message);
        self.rejected_for = Some(message.to_owned());
        RegisterAction::Rejected {
            news,
            retry_in: until(retry_at, now),
        }
    }
}

/// Attempts the agent believes are running: reported at registration and in
/// heartbeats.
#[derive(Debug, Default)]
pub struct RunningSet {
    attempts: BTreeMap<String, u32>,
}

impl RunningSet {
    /// Records an attempt as started (or handed to the supervisor).
    pub fn insert(&mut self, uid: &str, attempt: u32) {
        self.attempts.insert(uid.to_owned(), attempt);
    }

    /// Whether this exact attempt is known to be running.
    pub fn contains(&self, uid: &str, attempt: u32) -> bool {
        self.attempts.get(uid) == Some(&attempt)
    }

    /// The attempt of `uid` ended.
    pub fn remove(&mut self, uid: &str, attempt: u32) {
        if self.attempts.get(uid).is_some_and(|a| *a <= attempt) {
            self.attempts.remove(uid);
        }
    }

    /// As protocol values.
    pub fn to_vec(&self) -> Vec<k8s4r_api::TaskAttempt> {
        self.attempts
            .iter()
            .map(|(uid, attempt)| k8s4r_api::TaskAttempt::new(uid.clone(), *attempt))
            .collect()
    }

    /// How many.
    pub fn len(&self) -> usize {
        self.attempts.len()
    }

    /// Whether none.
    pub fn is_empty(&self) -> bool {
        self.attempts.is_empty()
    }
}

/// The delay until `deadline`, zero if it passed.
pub fn until(deadline: Duration, now: Duration) -> Duration {
    deadline.saturating_sub(now)
}

#[cfg(test)]
mod tests {
    use super::*;
    use k8s4r_api::backoff::Jitter;

    #[test]
    fn packet_ids_map_to_what_was_handed_over_in_order() {
        let mut l = Link::new(4);
        assert!(!l.has_room(), "nothing goes out before CONNACK");
        l.connected();
        l.handed_over(Tag::Control);
        l.handed_over(Tag::Status(7));
        l.handed_over(Tag::Status(9));
        assert_eq!(l.cursor(), 10);
        l.sent(0); // a QoS 0 heartbeat in between
        l.sent(1);
        l.sent(2);
        l.sent(3);
        assert_eq!(l.acked(2), Some(Tag::Status(7)));
        assert_eq!(l.acked(2), None, "a duplicate ack is ignored");
        assert_eq!(l.acked(1), Some(Tag::Control));
        assert_eq!(l.outstanding(), 1);
        assert_eq!(l.acked(3), Some(Tag::Status(9)));
        assert!(l.idle());
    }

    #[test]
    fn room_is_bounded_and_a_disconnect_rewinds() {
        let mut l = Link::new(2);
        l.connected();
        l.handed_over(Tag::Status(1));
        l.handed_over(Tag::Status(2));
        assert!(!l.has_room());
        l.sent(5);
        assert!(!l.has_room());
        l.disconnected();
        assert!(!l.has_room() && l.idle() && l.cursor() == 0);
        l.connected();
        assert!(l.has_room());
        assert_eq!(l.acked(5), None, "acks of an old connection are not ours");
    }

    fn registrar() -> Registrar {
        Registrar::new(
            Backoff::new(
                Duration::from_secs(1),
                Duration::from_secs(8),
                Jitter::with_seed(1),
            ),
            "s1",
        )
    }

    #[test]
    fn only_answers_to_this_processs_recent_registrations_are_taken() {
        let mut r = registrar();
        assert!(!r.asked("s1-1"), "nothing sent yet");
        let first = r.next_nonce();
        assert!(r.asked(&first));
        assert!(!r.asked("s0-1"), "a previous process's registration");
        assert!(!r.asked("s1-2") && !r.asked("s1-0") && !r.asked("s1") && !r.asked("s1-x"));
        for _ in 0..ANSWERED_REGISTRATIONS {
            r.next_nonce();
        }
        assert!(!r.asked(&first), "too old");
    }

    #[test]
    fn registration_retries_until_online() {
        let t0 = Duration::from_secs(1000);
        let mut r = registrar();
        assert_eq!(
            r.response(RobotPhase::Online, None, t0),
            RegisterAction::None,
            "not connected"
        );
        assert_eq!(r.connected(t0), RegisterAction::Register);
        assert_eq!(r.tick(t0), RegisterAction::None);
        let first = r.deadline().unwrap();
        assert_eq!(r.response(RobotPhase::Pending, None, t0), RegisterAction::None);
        assert_eq!(r.deadline(), Some(first), "a Pending answer keeps the schedule");
        assert_eq!(r.tick(first), RegisterAction::Register);
        let second = r.deadline().unwrap();
        assert!(second - first >= Duration::from_secs(1), "backoff grows");
        assert_eq!(
            r.response(RobotPhase::Online, None, first),
            RegisterAction::Approved
        );
        assert!(r.approved() && r.deadline().is_none());
        assert_eq!(r.response(RobotPhase::Online, None, first), RegisterAction::None);
        r.disconnected();
        assert!(!r.approved());
        assert_eq!(r.connected(first), RegisterAction::Register);
    }

    #[test]
    fn a_rejection_after_approval_stops_dispatches() {
        let t0 = Duration::from_secs(1000);
        let mut r = registrar();
        r.connected(t0);
        r.response(RobotPhase::Online, None, t0);
        assert_eq!(
            r.response(RobotPhase::Rejected, Some("bootstrap token not recognised"), t0),
            RegisterAction::Rejected {
                news: true,
                retry_in: REJECTED_RETRY_MIN
            }
        );
        assert!(!r.approved());
        assert_eq!(r.deadline(), Some(t0 + REJECTED_RETRY_MIN));
    }

    /// Registers (the retry due) and is rejected with `message`; returns
    /// the time of the retry after that.
    fn rejected_again(r: &mut Registrar, message: &str, news: bool) -> Duration {
        let at = r.deadline().expect("a retry is due");
        assert_eq!(r.tick(at), RegisterAction::Register);
        match r.response(RobotPhase::Rejected, Some(message), at) {
            RegisterAction::Rejected { news: n, retry_in } => {
                assert_eq!(n, news, "{message}");
                at + retry_in
            }
            other => panic!("{other:?}"),
        }
    }

    #[test]
    fn rejections_back_off_exponentially_to_a_cap_and_are_news_once_per_message() {
        let t0 = Duration::from_secs(1000);
        let mut r = registrar();
        r.connected(t0);
        let action = r.response(RobotPhase::Rejected, Some("unknown token"), t0);
        assert_eq!(
            action,
            RegisterAction::Rejected {
                news: true,
                retry_in: REJECTED_RETRY_MIN
            },
            "far beyond the ordinary retry (1s here)"
        );
        let mut waits = Vec::new();
        for _ in 0..8 {
            let at = r.deadline().unwrap();
            let next = rejected_again(&mut r, "unknown token", false);
            waits.push((next - at).as_secs());
        }
        assert_eq!(waits, [20, 40, 80, 160, 300, 300, 300, 300]);
        rejected_again(&mut r, "the robot presented no bootstrap token", true);
        rejected_again(&mut r, "the robot presented no bootstrap token", false);
    }

    #[test]
    fn an_approval_ends_the_rejections_backoff() {
        let t0 = Duration::from_secs(1000);
        let mut r = registrar();
        r.connected(t0);
        r.response(RobotPhase::Rejected, Some("unknown token"), t0);
        for _ in 0..5 {
            rejected_again(&mut r, "unknown token", false);
        }
        let at = r.deadline().unwrap();
        r.tick(at);
        assert_eq!(r.response(RobotPhase::Online, None, at), RegisterAction::Approved);
        assert_eq!(
            r.response(RobotPhase::Rejected, Some("unknown token"), at),
            RegisterAction::Rejected {
                news: true,
                retry_in: REJECTED_RETRY_MIN
            },
            "a new rejection is news and starts from the shortest wait"
        );
    }

    #[test]
    fn a_rejection_never_brings_a_later_retry_forward() {
        let t0 = Duration::from_secs(1000);
        let mut r = Registrar::new(
            Backoff::new(
                Duration::from_secs(1000),
                Duration::from_secs(1000),
                Jitter::with_seed(1),
            ),
            "s1",
        );
        r.connected(t0);
        let due = r.deadline().unwrap();
        assert!(due - t0 >= Duration::from_secs(500));
        assert_eq!(
            r.response(RobotPhase::Rejected, None, t0),
            RegisterAction::Rejected {
                news: true,
                retry_in: due - t0
            }
        );
        assert_eq!(r.deadline(), Some(due));
        r.disconnected();
        assert_eq!(
            r.response(RobotPhase::Rejected, None, t0),
            RegisterAction::None,
            "not connected"
        );
    }

    #[test]
    fn running_set_tracks_attempts() {
        let mut s = RunningSet::default();
        s.insert("a", 1);
        s.insert("b", 2);
        s.remove("b", 1); // an older attempt's end does not remove the newer
        assert!(s.contains("b", 2));
        s.remove("a", 1);
        assert_eq!(s.to_vec().len(), 1);
    }
}
