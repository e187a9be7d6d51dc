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
//! Fencing is armed only when the server said at registration that it
//! confirms statuses and heartbeats; against an older server the agent
//! behaves as before. Dispatch deadlines are read on the server's clock, as
//! the server last said it in a confirmation of a heartbeat sent on the
//! current connection (never from a message that may have waited in the
//! broker), so a robot whose own clock is wrong neither refuses every
//! dispatch nor accepts late ones.

use std::collections::{BTreeMap, HashMap, HashSet, VecDeque};
use std::time::Duration;

use jiff::{SignedDuration, Timestamp};
use k8s4r_api::protocol::Dispatch;

/// How many tasks' highest attempt is remembered.
const REMEMBERED_TASKS: usize = 16_384;
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
    contact: Duration,
    /// Heartbeats sent: seq → when.
    sent: BTreeMap<u64, Duration>,
    /// Heartbeats below this seq were sent on an earlier connection.
    connection_first: u64,
    /// Held attempts and their `stopAfter`.
    leases: BTreeMap<(String, u32), Duration>,
    /// Attempts this fence asked to stop, until their end is reported.
    stopped: HashSet<(String, u32)>,
    /// Server clock minus this robot's clock.
    offset: Option<SignedDuration>,
    highest: HashMap<String, u32>,
    order: VecDeque<String>,
}

impl Fence {
    /// Not armed, no contact yet.
    pub fn new(now: Duration) -> Self {
        Self {
            armed: false,
            contact: now,
            sent: BTreeMap::new(),
            connection_first: 0,
            leases: BTreeMap::new(),
            stopped: HashSet::new(),
            offset: None,
            highest: HashMap::new(),
            order: VecDeque::new(),
        }
    }

    /// The server answered a registration; `confirms`: it confirms
    /// heartbeats. The first answer arms fencing and counts as contact
    /// (nothing is held yet); later ones change nothing: an answer may have
    /// waited in the broker.
    pub fn registered(
        &mut self,
        confirms: bool,
        server_time: Option<Timestamp>,
        now: Duration,
        wall: Timestamp,
    ) {
        if confirms && !self.armed {
            self.armed = true;
            self.contact = now;
            if let Some(server) = server_time {
                self.offset = Some(server.duration_since(wall));
            }
        }
    }

    /// A new connection: heartbeats from `next_seq` on are sent on it.
    pub fn connected(&mut self, next_seq: u64) {
        self.connection_first = next_seq;
    }

    /// Heartbeat `seq` is being sent.
    pub fn heartbeat_sent(&mut self, seq: u64, now: Duration) {
        self.sent.insert(seq, now);
        while self.sent.len() > REMEMBERED_HEARTBEATS {
            self.sent.pop_first();
        }
    }

    /// The server recorded heartbeat `seq` at `server_time`.
    pub fn heartbeat_recorded(&mut self, seq: u64, server_time: Option<Timestamp>, wall: Timestamp) {
        let Some(&sent) = self.sent.get(&seq) else {
            return;
        };
        self.contact = self.contact.max(sent);
        if seq >= self.connection_first {
            if let Some(server) = server_time {
                self.offset = Some(server.duration_since(wall));
            }
        }
    }

    /// The server's time as this robot reckons it, if the server told it.
    pub fn server_now(&self, wall: Timestamp) -> Option<Timestamp> {
        self.offset.map(|offset| wall.checked_add(offset).unwrap_or(wall))
    }

    /// Whether this dispatch may run: not past its deadline, and newer than
    /// any attempt dispatched here before (the caller drops a redelivery of
    /// one still running first). Remembers the attempt.
    pub fn admit(&mut self, dispatch: &Dispatch, wall: Timestamp) -> Result<(), Refusal> {
        if let Some(&highest) = self.highest.get(&dispatch.task_uid) {
            if dispatch.attempt <= highest {
                return Err(Refusal::Seen { highest });
            }
        }
        if let Some(deadline) = dispatch.expires_at {
            // Without the server's clock, the robot's own is all there is.
            let server_now = self.server_now(wall).unwrap_or(wall);
            if server_now >= deadline {
                return Err(Refusal::Expired { deadline, server_now });
            }
        }
        self.remember(&dispatch.task_uid, dispatch.attempt);
        Ok(())
    }

    fn remember(&mut self, uid: &str, attempt: u32) {
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
        let silent = now.saturating_sub(self.contact);
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
            .map(|(_, stop_after)| self.contact.saturating_add(*stop_after))
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
        let mut f = Fence::new(secs(0));
        f.hold("u", 1, Some(secs(10)));
        assert!(f.due(secs(60)).is_empty(), "not armed: an older server");
        f.registered(true, None, secs(100), wall(NOW));
        assert_eq!(f.next_deadline(), Some(secs(110)));
        // Heartbeat 1 goes out at 103 and is recorded; heartbeat 2 at 106
        // never is (the uplink, the server or the API server failed).
        f.heartbeat_sent(1, secs(103));
        f.heartbeat_recorded(1, None, wall(NOW));
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
        let mut f = Fence::new(secs(0));
        f.registered(true, None, secs(0), wall(NOW));
        f.hold("u", 1, Some(secs(10)));
        f.heartbeat_sent(1, secs(1));
        f.heartbeat_sent(2, secs(8));
        f.heartbeat_recorded(2, None, wall(NOW));
        // Heartbeat 1's confirmation arrives last: contact stays at 8.
        f.heartbeat_recorded(1, None, wall(NOW));
        assert_eq!(f.next_deadline(), Some(secs(18)));
        f.heartbeat_recorded(99, None, wall(NOW));
        assert_eq!(
            f.next_deadline(),
            Some(secs(18)),
            "an unknown heartbeat counts for nothing"
        );
        // A second registration answer (it may have waited in the broker)
        // does not renew it either.
        f.registered(true, None, secs(17), wall(NOW));
        assert_eq!(f.next_deadline(), Some(secs(18)));
    }

    #[test]
    fn dispatches_are_refused_late_or_seen_before() {
        let mut f = Fence::new(secs(0));
        // The robot's clock is a year behind; the server said its time.
        let robot_wall = wall("2025-11-22T10:00:00Z");
        f.registered(true, Some(wall(NOW)), secs(0), robot_wall);
        assert_eq!(f.server_now(robot_wall), Some(wall(NOW)));
        assert_eq!(
            f.admit(&dispatch("u", 2, Some("2026-11-22T10:01:00Z")), robot_wall),
            Ok(())
        );
        assert!(matches!(
            f.admit(&dispatch("v", 1, Some("2026-11-22T09:59:00Z")), robot_wall),
            Err(Refusal::Expired { .. })
        ));
        assert_eq!(
            f.admit(&dispatch("u", 1, None), robot_wall),
            Err(Refusal::Seen { highest: 2 })
        );
        assert_eq!(
            f.admit(&dispatch("u", 2, None), robot_wall),
            Err(Refusal::Seen { highest: 2 }),
            "a redelivery of an attempt that ended does not run it again"
        );
        assert_eq!(f.admit(&dispatch("u", 3, None), robot_wall), Ok(()));
    }

    #[test]
    fn the_clock_is_taken_only_from_confirmations_on_this_connection() {
        let mut f = Fence::new(secs(0));
        let robot_wall = wall(NOW);
        f.registered(true, Some(wall(NOW)), secs(0), robot_wall);
        f.heartbeat_sent(1, secs(1));
        f.connected(2);
        // A confirmation from before the reconnect, with a stale time.
        f.heartbeat_recorded(1, Some(wall("2026-11-22T09:50:00Z")), robot_wall);
        assert_eq!(f.server_now(robot_wall), Some(wall(NOW)));
        f.heartbeat_sent(2, secs(2));
        f.heartbeat_recorded(2, Some(wall("2026-11-22T10:00:05Z")), robot_wall);
        assert_eq!(f.server_now(robot_wall), Some(wall("2026-11-22T10:00:05Z")));
    }
}
