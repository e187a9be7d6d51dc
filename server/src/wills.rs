//! A robot's `online: false` held briefly before it is recorded.
//!
//! A broker that stops (restarted, upgraded) publishes the last will of
//! every robot connected to it as it goes, to the server among others,
//! just before it closes the server's own connection. Recorded, each would
//! mark its robot disconnected, and so Offline, until it reconnects: for a
//! fleet, every robot flapping, five API writes a robot (docs/scale.md,
//! "What a reconnect storm costs"), over a fault that was the broker's.
//! So a connection holds each `online: false` it receives for a short
//! while ([`Wills::hold`]) and forgets it when, meanwhile, the connection
//! itself drops (the broker went, not the robot) or the robot says
//! `online: true` again. A robot that does not come back after a broker
//! restart stops renewing its Lease, and the heartbeat timeout marks it
//! Offline, as it would any robot that went quiet.
//!
//! For the same reason, an `online: false` received within the hold after
//! the connection came back is not recorded: a broker that kept the
//! server's session (persistence) delivers then the wills it published
//! as it stopped, queued for the server while it was away.
//!
//! A retained `online: false` is not recorded at all: it is the broker's
//! memory of a disconnect, sent again at every subscription, and after a
//! restart of a broker with persistence it is every robot's last will from
//! the moment the broker stopped. A server that starts learns who is
//! connected from the retained presence it sweeps (`crate::retained`,
//! `crate::decide::absent_at_start`); a server's shared subscriptions
//! never receive retained messages anyway.
//!
//! Pure: each call takes the time, and the connection's task performs what
//! it returns.

use std::collections::{HashMap, VecDeque};
use std::time::{Duration, Instant};

/// What to do with a robot's presence message.
#[derive(Debug, PartialEq, Eq)]
pub enum Offer<M> {
    /// Pass it on now.
    Pass(M),
    /// Held: [`Wills::due`] passes it on in its turn, unless forgotten.
    Held,
    /// A retained `online: false`: not the robot's word now.
    Retained,
    /// An `online: false` that came with the broker's outage: received
    /// within the hold after the connection came back.
    Outage,
}

/// The `online: false` messages one broker connection holds, oldest first.
#[derive(Debug)]
pub struct Wills<M> {
    hold: Duration,
    /// Each robot's latest held message, with the number of its offer: a
    /// robot that says `online: false` again replaces it.
    latest: HashMap<Box<str>, (u64, M)>,
    /// When each offer is due, in the order they came (so by time).
    queue: VecDeque<Due>,
    offers: u64,
    /// Whether the connection was ever lost.
    lost: bool,
    /// Until when an `online: false` counts as the outage's.
    outage_until: Option<Instant>,
}

#[derive(Debug)]
struct Due {
    robot: Box<str>,
    offer: u64,
    until: Instant,
}

impl<M> Wills<M> {
    /// Holds each `online: false` for `hold`; zero: none is held.
    pub fn new(hold: Duration) -> Self {
        Wills {
            hold,
            latest: HashMap::new(),
            queue: VecDeque::new(),
            offers: 0,
            lost: false,
            outage_until: None,
        }
    }

    /// The connection is established, `now`: after it was lost, what
    /// follows for the hold is still the outage's.
    pub fn connected(&mut self, now: Instant) {
        if self.lost {
            self.outage_until = Some(now + self.hold);
        }
    }

    /// Robot `robot` said `online` in `message`, received `now` (as the
    /// broker's `retained` copy, or live). An `online: true` passes, and
    /// forgets a will of the same robot held before it: the robot is back.
    pub fn offer(&mut self, robot: &str, online: bool, retained: bool, message: M, now: Instant) -> Offer<M> {
        if online {
            self.latest.remove(robot);
            return Offer::Pass(message);
        }
        if retained {
            return Offer::Retained;
        }
        if self.outage_until.is_some_and(|until| now < until) {
            return Offer::Outage;
        }
        if self.hold.is_zero() {
            return Offer::Pass(message);
        }
        self.offers += 1;
        self.latest.insert(robot.into(), (self.offers, message));
        self.queue.push_back(Due {
            robot: robot.into(),
            offer: self.offers,
            until: now + self.hold,
        });
        Offer::Held
    }

    /// The held messages whose time has come by `now`, to pass on: each
    /// robot's latest one, unless the robot came back meanwhile.
    pub fn due(&mut self, now: Instant) -> Vec<M> {
        let mut due = Vec::new();
        while self.queue.front().is_some_and(|d| d.until <= now) {
            let Some(next) = self.queue.pop_front() else { break };
            if self
                .latest
                .get(&next.robot)
                .is_some_and(|(offer, _)| *offer == next.offer)
            {
                if let Some((_, message)) = self.latest.remove(&next.robot) {
                    due.push(message);
                }
            }
        }
        due
    }

    /// Every held message, at once: the server stops while the broker
    /// stays, so they are the robots' word.
    pub fn drain(&mut self) -> Vec<M> {
        self.queue.clear();
        self.latest.drain().map(|(_, (_, message))| message).collect()
    }

    /// When the next held message is due, if one is held.
    pub fn next_due(&self) -> Option<Instant> {
        self.queue.front().map(|h| h.until)
    }

    /// The connection dropped: every held message is forgotten (its robots
    /// lost the broker, not the other way round). Returns how many robots'.
    pub fn connection_lost(&mut self) -> usize {
        self.lost = true;
        let robots = self.latest.len();
        self.latest.clear();
        self.queue.clear();
        robots
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const HOLD: Duration = Duration::from_secs(2);
    /// Whether a message came as the broker's retained copy.
    const LIVE: bool = false;
    const RETAINED: bool = true;

    #[test]
    fn a_will_passes_after_the_hold_unless_the_broker_went_first() {
        let t0 = Instant::now();
        let mut wills = Wills::new(HOLD);
        assert_eq!(wills.offer("r1", false, LIVE, "r1 gone", t0), Offer::Held);
        assert_eq!(
            wills.offer("r2", false, LIVE, "r2 gone", t0 + Duration::from_millis(500)),
            Offer::Held
        );
        assert_eq!(wills.next_due(), Some(t0 + HOLD));
        assert!(wills.due(t0 + HOLD - Duration::from_millis(1)).is_empty());
        assert_eq!(wills.due(t0 + HOLD), vec!["r1 gone"]);
        assert_eq!(wills.next_due(), Some(t0 + HOLD + Duration::from_millis(500)));
        // The broker goes before r2's turn: its will is the broker's doing.
        assert_eq!(wills.connection_lost(), 1);
        assert!(wills.due(t0 + 10 * HOLD).is_empty());
        assert_eq!(wills.next_due(), None);
    }

    #[test]
    fn a_robot_back_within_the_hold_forgets_its_will() {
        let t0 = Instant::now();
        let mut wills = Wills::new(HOLD);
        assert_eq!(wills.offer("r1", false, LIVE, 1, t0), Offer::Held);
        assert_eq!(
            wills.offer("r1", true, LIVE, 2, t0 + Duration::from_secs(1)),
            Offer::Pass(2)
        );
        assert!(wills.due(t0 + HOLD).is_empty(), "r1 came back");
        assert_eq!(wills.next_due(), None);
        // Gone again later: that will is held and passes in its turn.
        let t1 = t0 + Duration::from_secs(5);
        assert_eq!(wills.offer("r1", false, LIVE, 3, t1), Offer::Held);
        assert_eq!(wills.due(t1 + HOLD), vec![3]);
    }

    #[test]
    fn a_robot_that_says_offline_twice_passes_once_at_its_latest() {
        let t0 = Instant::now();
        let mut wills = Wills::new(HOLD);
        assert_eq!(wills.offer("r1", false, LIVE, 1, t0), Offer::Held);
        assert_eq!(
            wills.offer("r1", false, LIVE, 2, t0 + Duration::from_secs(1)),
            Offer::Held
        );
        assert!(wills.due(t0 + HOLD).is_empty(), "superseded");
        assert_eq!(wills.due(t0 + HOLD + Duration::from_secs(1)), vec![2]);
        assert_eq!(wills.connection_lost(), 0);
    }

    #[test]
    fn a_retained_will_is_not_the_robots_word_and_a_retained_online_is() {
        let t0 = Instant::now();
        let mut wills = Wills::new(HOLD);
        assert_eq!(wills.offer("r1", false, RETAINED, 1, t0), Offer::Retained);
        assert_eq!(wills.next_due(), None);
        assert_eq!(wills.offer("r1", true, RETAINED, 2, t0), Offer::Pass(2));
        let mut none = Wills::new(Duration::ZERO);
        assert_eq!(none.offer("r1", false, RETAINED, 3, t0), Offer::Retained);
    }

    #[test]
    fn a_will_just_after_the_connection_came_back_is_the_outages() {
        let t0 = Instant::now();
        let mut wills = Wills::new(HOLD);
        wills.connected(t0);
        assert_eq!(
            wills.offer("r1", false, LIVE, 1, t0),
            Offer::Held,
            "a first connection has no outage behind it"
        );
        assert_eq!(wills.connection_lost(), 1);
        let t1 = t0 + Duration::from_secs(10);
        wills.connected(t1);
        assert_eq!(wills.offer("r1", false, LIVE, 2, t1), Offer::Outage);
        assert_eq!(
            wills.offer("r2", false, LIVE, 3, t1 + HOLD - Duration::from_millis(1)),
            Offer::Outage
        );
        assert_eq!(wills.offer("r2", false, LIVE, 4, t1 + HOLD), Offer::Held);
        assert_eq!(wills.due(t1 + 2 * HOLD), vec![4]);
    }

    #[test]
    fn what_is_held_when_the_server_stops_passes_at_once() {
        let t0 = Instant::now();
        let mut wills = Wills::new(HOLD);
        assert_eq!(wills.offer("r1", false, LIVE, 1, t0), Offer::Held);
        assert_eq!(wills.offer("r1", false, LIVE, 2, t0), Offer::Held);
        assert_eq!(wills.drain(), vec![2], "a robot's latest only");
        assert_eq!(wills.next_due(), None);
        assert!(wills.due(t0 + HOLD).is_empty());
    }

    #[test]
    fn with_no_hold_everything_passes_at_once() {
        let t0 = Instant::now();
        let mut wills = Wills::new(Duration::ZERO);
        wills.connection_lost();
        wills.connected(t0);
        assert_eq!(wills.offer("r1", false, LIVE, 1, t0), Offer::Pass(1));
        assert_eq!(wills.next_due(), None);
        assert_eq!(wills.connection_lost(), 0);
    }
}
