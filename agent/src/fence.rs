//! The robot's half of fencing (docs/fencing.md), without I/O.
//!
//! ```text
//!   dispatch ──admit──► held under a lease ──(no recorded heartbeat for stopAfter)──► stopped by the robot
//!      │                    │                                                        (reason Disconnected)
//!      │ expired, or an     └──(ends, cancelled, or the server says so)──► released
//!      ▼ attempt seen before
//!   refused
//! ```
//!
//! **Contact** is the moment the robot sent the newest heartbeat that the
//! server confirmed it recorded (`tasks/acks` with `heartbeat`): the
//! server confirms a heartbeat only once the robot's Lease, the cluster's
//! record of it, is at least that fresh. So the robot's lease on its
//! attempts runs out no later than the manager's fencing arithmetic
//! assumes, whatever failed in between (the robot's uplink or downlink, the
//! broker, the server, the API server). Time is measured on `CLOCK_BOOTTIME`
//! by the caller, so a suspended robot does not stop its clock.
//!
//! Fencing is armed only when the server said, in the answer to a
//! registration this process sent (its nonce), that it confirms statuses
//! and heartbeats; against an older server the agent behaves as before.
//! Contact comes only from confirmations of heartbeats this process sent
//! (the confirmation echoes the process's session id), never from a
//! registration answer.
//!
//! Dispatch deadlines are read on the server's clock, reckoned on
//! `CLOCK_BOOTTIME`, never on the robot's wall clock: each answer or
//! confirmation says the server's clock was at least its time when it
//! arrived, so the offset kept is the largest of those lower bounds. A
//! message that waited in the broker gives a smaller bound and changes
//! nothing, the reckoning never moves backwards, and a wall-clock step
//! (NTP, a wrong RTC) does not move it at all. A fenced attempt is admitted
//! only while contact is fresh (younger than half its `stopAfter`);
//! otherwise the caller asks for a heartbeat and the dispatch waits for its
//! confirmation.

use std::collections::{BTreeMap, HashMap, HashSet, VecDeque};
use std::time::Duration;

use jiff::{SignedDuration, Timestamp};
use k8s4r_api::protocol::Dispatch;

/// How many tasks' highest attempt is remembered.
pub const REMEMBERED_TASKS: usize = 16_384;
/// How many heartbeats' send times are remembered.
const REMEMBERED_HEARTBEATS: usize = 256;

/// Why a dispatch was refused.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Refusal {
    /// It arrived after its deadline (by the server's clock).
    Expired {
        /// The deadline.
        deadline: Timestamp,
        /// The server's time as this robot reckons it.
        server_now: Timestamp,
    },
    /// An attempt of this task at least as new was dispatched already (and
    /// is not running: a redelivery of one that ended, or an older one).
    Seen {
        /// That attempt.
        highest: u32,
    },
}

impl std::fmt::Display for Refusal {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Refusal::Expired { deadline, server_now } => write!(
                f,
                "the dispatch arrived after its deadline {deadline} (server time about {server_now})"
            ),
            Refusal::Seen { highest } => {
                write!(f, "attempt {highest} of this task was dispatched here already")
            }
        }
    }
}

/// Contact with the cluster and the leases of the attempts held. Instants
/// are durations since boot (`CLOCK_BOOTTIME`).
#[derive(Debug)]
pub struct Fence {
    armed: bool,
    /// When this process sent the newest heartbeat the server confirmed
    /// (or, for attempts it adopted, the previous process of this boot).
    contact: Option<Duration>,
    /// Heartbeats sent: seq → when.
    sent: BTreeMap<u64, Duration>,
    /// Held attempts and their `stopAfter`.
    leases: BTreeMap<(String, u32), Duration>,
    /// Attempts this fence asked to stop, until their end is reported.
    stopped: HashSet<(String, u32)>,
    /// Server clock minus the boot clock: the largest lower bound seen.
    offset: Option<SignedDuration>,
    highest: HashMap<String, u32>,
    order: VecDeque<String>,
}

impl Default for Fence {
    fn default() -> Self {
        Self::new()
    }
}

impl Fence {
    /// Not armed, no contact yet.
    pub fn new() -> Self {
        Self {
            armed: false,
            contact: None,
            sent: BTreeMap::new(),
            leases: BTreeMap::new(),
            stopped: HashSet::new(),
            offset: None,
            highest: HashMap::new(),
            order: VecDeque::new(),
        }
    }

    /// A previous agent process of this boot left these fenced attempts
    /// running (each with its `stopAfter`), and had contact at `contact`
    /// as far as it wrote down. They are held from that contact, not from
    /// this process's start, and the fence is armed as the previous
    /// process's was (it wrote a contact only once the server confirmed a
    /// heartbeat, which arms it). Without one (a server that confirms
    /// nothing, or the record was lost) they wait for this process's own
    /// registration answer: a confirming server arms the fence then, and
    /// with no contact yet they are due at once.
    pub fn adopted(&mut self, leases: &[(String, u32, Duration)], contact: Option<Duration>) {
        if leases.is_empty() {
            return;
        }
        self.armed |= contact.is_some();
        self.contact = self.contact.max(contact);
        for (uid, attempt, stop_after) in leases {
            self.remember(uid, *attempt);
            self.leases.insert((uid.clone(), *attempt), *stop_after);
        }
    }

    /// The last contact, if any (boot clock).
    pub fn contact(&self) -> Option<Duration> {
        self.contact
    }

    /// The server answered a registration this process sent (the caller
    /// checked its nonce), at `now`; `confirms`: it confirms heartbeats,
    /// which arms fencing. An answer is not contact: it may have waited in
    /// the broker, and the cluster may not have written anything for it.
    pub fn registered(&mut self, confirms: bool, server_time: Option<Timestamp>, now: Duration) {
        if confirms {
            self.armed = true;
        }
        self.observe_clock(server_time, now);
    }

    /// Heartbeat `seq` is being sent.
    pub fn heartbeat_sent(&mut self, seq: u64, now: Duration) {
        self.sent.insert(seq, now);
        while self.sent.len() > REMEMBERED_HEARTBEATS {
            self.sent.pop_first();
        }
    }

    /// When heartbeat `seq` went out (boot clock), if it is remembered.
    pub fn sent_at(&self, seq: u64) -> Option<Duration> {
        self.sent.get(&seq).copied()
    }

    /// The server recorded heartbeat `seq` of this process (the caller
    /// checked the session) at `server_time`; the confirmation arrived at
    /// `now`.
    pub fn heartbeat_recorded(&mut self, seq: u64, server_time: Option<Timestamp>, now: Duration) {
        let Some(&sent) = self.sent.get(&seq) else {
            return;
        };
        self.contact = Some(self.contact.map_or(sent, |c| c.max(sent)));
        self.observe_clock(server_time, now);
    }

    /// The server's clock read `server_time` no later than `now` (its
    /// message arrived then): a lower bound of the offset.
    fn observe_clock(&mut self, server_time: Option<Timestamp>, now: Duration) {
        let (Some(server), Ok(boot)) = (server_time, SignedDuration::try_from(now)) else {
            return;
        };
        let Some(bound) = server.duration_since(Timestamp::UNIX_EPOCH).checked_sub(boot) else {
            return;
        };
        self.offset = Some(self.offset.map_or(bound, |o| o.max(bound)));
    }

    /// The server's time at `now` (boot clock) as this robot reckons it, if
    /// the server told it.
    pub fn server_now(&self, now: Duration) -> Option<Timestamp> {
        let offset = self.offset?;
        let boot = SignedDuration::try_from(now).ok()?;
        Timestamp::UNIX_EPOCH.checked_add(offset.checked_add(boot)?).ok()
    }

    /// Whether contact is fresh enough to admit an attempt with this
    /// `stopAfter` (younger than half of it): it then keeps running at
    /// least half its lease even if the next heartbeat is lost. Always true
    /// when fencing is not armed.
    pub fn fresh_for(&self, stop_after: Duration, now: Duration) -> bool {
        if !self.armed {
            return true;
        }
        self.contact
            .is_some_and(|c| now.saturating_sub(c) < stop_after / 2)
    }

    /// How long ago the last confirmed heartbeat was sent, if any was.
    pub fn contact_age(&self, now: Duration) -> Option<Duration> {
        self.contact.map(|c| now.saturating_sub(c))
    }

    /// Whether this dispatch may run at `now` (boot clock; `wall` is the
    /// robot's own clock, used only when the server never said its time):
    /// not past its deadline, and newer than any attempt dispatched here
    /// before (the caller drops a redelivery of one still running first).
    /// Remembers the attempt.
    pub fn admit(&mut self, dispatch: &Dispatch, now: Duration, wall: Timestamp) -> Result<(), Refusal> {
        self.check(dispatch, now, wall)?;
        self.remember(&dispatch.task_uid, dispatch.attempt);
        Ok(())
    }

    /// [`Fence::admit`] without remembering: for a dispatch that waits.
    pub fn check(&self, dispatch: &Dispatch, now: Duration, wall: Timestamp) -> Result<(), Refusal> {
        if let Some(&highest) = self.highest.get(&dispatch.task_uid) {
            if dispatch.attempt <= highest {
                return Err(Refusal::Seen { highest });
            }
        }
        if let Some(deadline) = dispatch.expires_at {
            // Without the server's clock, the robot's own is all there is.
            let server_now = self.server_now(now).unwrap_or(wall);
            if server_now >= deadline {
                return Err(Refusal::Expired { deadline, server_now });
            }
        }
        Ok(())
    }

    /// An attempt this robot accepted before (read back from disk after a
    /// restart): it, and any older one of its task, is refused as seen.
    pub fn remember(&mut self, uid: &str, attempt: u32) {
        match self.highest.get_mut(uid) {
            Some(highest) => *highest = (*highest).max(attempt),
            None => {
                self.highest.insert(uid.to_owned(), attempt);
                self.order.push_back(uid.to_owned());
                if self.order.len() > REMEMBERED_TASKS {
                    if let Some(oldest) = self.order.pop_front() {
                        self.highest.remove(&oldest);
                    }
                }
            }
        }
    }

    /// Whether this attempt (or a newer one of its task) was admitted here.
    pub fn seen(&self, uid: &str, attempt: u32) -> bool {
        self.highest.get(uid).is_some_and(|h| *h >= attempt)
    }

    /// An admitted attempt is held until it ends; `stop_after` None: the
    /// server did not ask for fencing (`replace: false`, or an older server).
    pub fn hold(&mut self, uid: &str, attempt: u32, stop_after: Option<Duration>) {
        if let Some(stop_after) = stop_after {
            self.leases.insert((uid.to_owned(), attempt), stop_after);
        }
    }

    /// The attempt ended; returns whether this fence had stopped it.
    pub fn release(&mut self, uid: &str, attempt: u32) -> bool {
        let key = (uid.to_owned(), attempt);
        self.leases.remove(&key);
        self.stopped.remove(&key)
    }

    /// The attempts whose lease ran out at `now`, each with its
    /// `stopAfter`; each is returned once.
    pub fn due(&mut self, now: Duration) -> Vec<(String, u32, Duration)> {
        if !self.armed {
            return Vec::new();
        }
        // No contact at all yet: silent since boot.
        let silent = now.saturating_sub(self.contact.unwrap_or_default());
        let due: Vec<_> = self
            .leases
            .iter()
            .filter(|(key, stop_after)| silent >= **stop_after && !self.stopped.contains(*key))
            .map(|((uid, attempt), stop_after)| (uid.clone(), *attempt, *stop_after))
            .collect();
        for (uid, attempt, _) in &due {
            self.stopped.insert((uid.clone(), *attempt));
        }
        due
    }

    /// When the next lease runs out if nothing is recorded before.
    pub fn next_deadline(&self) -> Option<Duration> {
        if !self.armed {
            return None;
        }
        self.leases
            .iter()
            .filter(|(key, _)| !self.stopped.contains(*key))
            .map(|(_, stop_after)| self.contact.unwrap_or_default().saturating_add(*stop_after))
            .min()
    }

    /// The shortest `stopAfter` held: heartbeats (whose confirmations are
    /// contact) must go several times within it.
    pub fn shortest_lease(&self) -> Option<Duration> {
        self.leases.values().min().copied()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use k8s4r_api::TaskTemplate;

    fn dispatch(uid: &str, attempt: u32, expires: Option<&str>) -> Dispatch {
        Dispatch {
            expires_at: expires.map(|e| e.parse().unwrap()),
            ..Dispatch::new(uid, "default/t", attempt, TaskTemplate::default())
        }
    }

    fn wall(s: &str) -> Timestamp {
        s.parse().unwrap()
    }

    fn secs(s: u64) -> Duration {
        Duration::from_secs(s)
    }

    const NOW: &str = "2026-11-22T10:00:00Z";

    #[test]
    fn an_attempt_is_stopped_once_no_heartbeat_was_recorded_for_its_stop_after() {
        let mut f = Fence::new();
        f.hold("u", 1, Some(secs(10)));
        assert!(f.due(secs(60)).is_empty(), "not armed: an older server");
        f.registered(true, None, secs(100));
        // Heartbeat 1 goes out at 103 and is recorded; heartbeat 2 at 106
        // never is (the uplink, the server or the API server failed).
        f.heartbeat_sent(1, secs(103));
        f.heartbeat_recorded(1, None, secs(103));
        assert_eq!(f.next_deadline(), Some(secs(113)));
        f.heartbeat_sent(2, secs(106));
        assert!(f.due(secs(112)).is_empty());
        assert_eq!(
            f.due(secs(113)),
            vec![("u".into(), 1, secs(10))],
            "10 s after heartbeat 1 was sent"
        );
        assert!(f.due(secs(130)).is_empty(), "asked once");
        assert!(f.release("u", 1), "this fence stopped it");
        assert!(!f.release("u", 1));
    }

    #[test]
    fn a_late_confirmation_of_an_old_heartbeat_does_not_renew_the_lease() {
        let mut f = Fence::new();
        f.registered(true, None, secs(0));
        f.hold("u", 1, Some(secs(10)));
        f.heartbeat_sent(1, secs(1));
        f.heartbeat_sent(2, secs(8));
        f.heartbeat_recorded(2, None, secs(8));
        // Heartbeat 1's confirmation arrives last: contact stays at 8.
        f.heartbeat_recorded(1, None, secs(9));
        assert_eq!(f.next_deadline(), Some(secs(18)));
        f.heartbeat_recorded(99, None, secs(9));
        assert_eq!(
            f.next_deadline(),
            Some(secs(18)),
            "an unknown heartbeat counts for nothing"
        );
        // A second registration answer (it may have waited in the broker)
        // does not renew it either.
        f.registered(true, None, secs(17));
        assert_eq!(f.next_deadline(), Some(secs(18)));
    }

    #[test]
    fn a_registration_answer_is_not_contact() {
        let mut f = Fence::new();
        f.registered(true, Some(wall(NOW)), secs(50));
        assert_eq!(f.contact_age(secs(50)), None);
        assert!(
            !f.fresh_for(secs(5), secs(50)),
            "a fenced attempt waits for a confirmed heartbeat"
        );
        f.heartbeat_sent(1, secs(51));
        f.heartbeat_recorded(1, None, secs(51));
        assert!(f.fresh_for(secs(5), secs(53)));
        assert!(!f.fresh_for(secs(5), secs(54)), "half its stopAfter has gone");
        assert!(Fence::new().fresh_for(secs(5), secs(0)), "not armed: no fencing");
    }

    #[test]
    fn dispatches_are_refused_late_or_seen_before() {
        let mut f = Fence::new();
        // The robot's clock is a year behind; the server said its time.
        let robot_wall = wall("2025-11-22T10:00:00Z");
        f.registered(true, Some(wall(NOW)), secs(0));
        assert_eq!(f.server_now(secs(0)), Some(wall(NOW)));
        assert_eq!(
            f.admit(
                &dispatch("u", 2, Some("2026-11-22T10:01:00Z")),
                secs(0),
                robot_wall
            ),
            Ok(())
        );
        assert!(matches!(
            f.admit(
                &dispatch("v", 1, Some("2026-11-22T09:59:00Z")),
                secs(0),
                robot_wall
            ),
            Err(Refusal::Expired { .. })
        ));
        assert_eq!(
            f.admit(&dispatch("u", 1, None), secs(0), robot_wall),
            Err(Refusal::Seen { highest: 2 })
        );
        assert_eq!(
            f.admit(&dispatch("u", 2, None), secs(0), robot_wall),
            Err(Refusal::Seen { highest: 2 }),
            "a redelivery of an attempt that ended does not run it again"
        );
        assert_eq!(f.admit(&dispatch("u", 3, None), secs(0), robot_wall), Ok(()));
        assert!(f.check(&dispatch("w", 1, None), secs(0), robot_wall).is_ok());
        assert_eq!(
            f.admit(&dispatch("w", 1, None), secs(0), robot_wall),
            Ok(()),
            "check does not remember"
        );
    }

    /// The stale answer of issue 26: the answer to a registration waited in
    /// the broker while the robot was away (its time is 10 minutes old by
    /// the time it arrives), the robot's wall clock is an hour ahead, and a
    /// dispatch whose deadline passed while it was away is delivered after
    /// it. The answer was taken for its own registration's by the caller
    /// (the nonce check is the session's); even so the reckoning keeps the
    /// fresher bound and refuses the dispatch.
    #[test]
    fn a_stale_answer_never_moves_the_clock_back_nor_admits_an_expired_dispatch() {
        let mut f = Fence::new();
        let robot_wall = wall("2026-11-22T11:00:00Z");
        // Boot second 1000: a fresh confirmation says the server reads 10:00.
        f.registered(true, None, secs(1000));
        f.heartbeat_sent(1, secs(1000));
        f.heartbeat_recorded(1, Some(wall(NOW)), secs(1000));
        // The stale answer, sent by the server at 09:50, arrives now.
        f.registered(true, Some(wall("2026-11-22T09:50:00Z")), secs(1001));
        assert_eq!(f.server_now(secs(1001)), Some(wall("2026-11-22T10:00:01Z")));
        // The dispatch expired at 09:51.
        assert!(matches!(
            f.admit(
                &dispatch("u", 1, Some("2026-11-22T09:51:00Z")),
                secs(1001),
                robot_wall
            ),
            Err(Refusal::Expired { .. })
        ));
        // A wall-clock step (NTP) changes nothing: the boot clock reckons.
        assert_eq!(f.server_now(secs(1061)), Some(wall("2026-11-22T10:01:01Z")));
    }

    #[test]
    fn the_server_clock_only_moves_forwards() {
        let mut f = Fence::new();
        f.registered(true, Some(wall(NOW)), secs(10));
        f.heartbeat_sent(1, secs(11));
        // A confirmation that waited 30 s on the way gives an older bound.
        f.heartbeat_recorded(1, Some(wall("2026-11-22T10:00:01Z")), secs(41));
        assert_eq!(f.server_now(secs(41)), Some(wall("2026-11-22T10:00:31Z")));
        f.heartbeat_sent(2, secs(50));
        f.heartbeat_recorded(2, Some(wall("2026-11-22T10:00:45Z")), secs(50));
        assert_eq!(f.server_now(secs(50)), Some(wall("2026-11-22T10:00:45Z")));
    }
}
