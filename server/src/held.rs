//! What the server remembers of the attempts one robot lists, so that what
//! one message costs it is bounded whatever the robot sends: pure state,
//! the clock passed in, one [`HeldMemory`] per robot in the worker that
//! serves the robot (no lock shared between robots).
//!
//! - A cancel for an attempt the robot should not hold goes out at most
//!   once per uid per [`CANCEL_INTERVAL`], and at most [`CANCEL_BURST`] at
//!   once per robot (then [`CANCEL_RATE`] a second); the rest are counted.
//! - A uid the server's cache does not know is read from the API server
//!   (by the Task's name) before the server cancels its attempt or settles
//!   its status: at most once per uid per [`CHECK_INTERVAL`] and within the
//!   robot's read budget ([`CHECK_BURST`], then [`CHECK_RATE`] a second),
//!   and only once the cache has lacked it for [`UNKNOWN_GRACE`] when a
//!   heartbeat (not a status) mentions it.
//! - At most [`MAX_HELD_ATTEMPTS`] uids per robot are remembered;
//!   duplicates in a list count once, and a complete list forgets the uids
//!   it no longer names.

use std::collections::{HashMap, HashSet};
use std::time::Duration;

use k8s4r_api::protocol::MAX_HELD_ATTEMPTS;
use k8s4r_api::TaskAttempt;
use tokio::time::Instant;

use crate::ingress::Bucket;

/// How long a uid a heartbeat lists must stay out of the cache before the
/// server reads the Task (a replica's cache may lag the dispatch).
pub const UNKNOWN_GRACE: Duration = Duration::from_secs(10);
/// At most one cancel per uid this often.
pub const CANCEL_INTERVAL: Duration = Duration::from_secs(10);
/// At most one read of an unknown uid this often.
pub const CHECK_INTERVAL: Duration = Duration::from_secs(30);
/// Cancels one robot may cost at once.
pub const CANCEL_BURST: f64 = 256.0;
/// Cancels one robot may cost a second, after its burst.
pub const CANCEL_RATE: f64 = 25.0;
/// Reads of unknown uids one robot may cost at once.
pub const CHECK_BURST: f64 = 16.0;
/// Reads of unknown uids one robot may cost a second, after its burst.
pub const CHECK_RATE: f64 = 0.5;

#[derive(Debug, Clone)]
struct Entry {
    /// Since when the cache has lacked the uid (None: it has it).
    unknown_since: Option<Instant>,
    cancelled: Option<Instant>,
    checked: Option<Instant>,
    seen: Instant,
}

/// Whether something may be done now, or why not.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Permit {
    /// Go ahead.
    Granted,
    /// Done for this uid within its interval already.
    Recent,
    /// The robot's budget is spent.
    OverBudget,
    /// The cache has not lacked the uid for long enough yet.
    Young,
}

impl Permit {
    /// The outcome label of the counter, for what was not done.
    pub fn outcome(self) -> &'static str {
        match self {
            Permit::Granted => "granted",
            Permit::Recent => "suppressed_recent",
            Permit::OverBudget => "suppressed_budget",
            Permit::Young => "suppressed_young",
        }
    }
}

/// One robot's share.
#[derive(Debug, Clone)]
pub struct HeldMemory {
    entries: HashMap<String, Entry>,
    cancels: Bucket,
    checks: Bucket,
}

impl HeldMemory {
    /// Nothing remembered, full budgets.
    pub fn new(now: Instant) -> Self {
        Self {
            entries: HashMap::new(),
            cancels: Bucket::full(CANCEL_BURST, now),
            checks: Bucket::full(CHECK_BURST, now),
        }
    }

    /// How many uids are remembered.
    pub fn len(&self) -> usize {
        self.entries.len()
    }

    /// Whether none.
    pub fn is_empty(&self) -> bool {
        self.entries.is_empty()
    }

    /// The robot's complete list: uids it no longer names are forgotten.
    pub fn retain_listed(&mut self, held: &[TaskAttempt]) {
        let listed: HashSet<&str> = held.iter().map(|a| a.uid.as_str()).collect();
        self.entries.retain(|uid, _| listed.contains(uid.as_str()));
    }

    fn entry(&mut self, uid: &str, now: Instant) -> &mut Entry {
        if !self.entries.contains_key(uid) && self.entries.len() >= MAX_HELD_ATTEMPTS {
            // The list bound makes this rare: a robot cycling through uids
            // across messages. The oldest goes; the budgets still hold.
            if let Some(oldest) = self
                .entries
                .iter()
                .min_by_key(|(_, e)| e.seen)
                .map(|(uid, _)| uid.clone())
            {
                self.entries.remove(&oldest);
            }
        }
        let entry = self.entries.entry(uid.to_owned()).or_insert(Entry {
            unknown_since: None,
            cancelled: None,
            checked: None,
            seen: now,
        });
        entry.seen = now;
        entry
    }

    /// The cache knows `uid`.
    pub fn known(&mut self, uid: &str) {
        if let Some(entry) = self.entries.get_mut(uid) {
            entry.unknown_since = None;
        }
    }

    /// Whether a cancel of `uid`'s attempt may go out now; remembers it
    /// when it may.
    pub fn may_cancel(&mut self, uid: &str, now: Instant) -> Permit {
        let entry = self.entry(uid, now);
        if entry
            .cancelled
            .is_some_and(|at| now.saturating_duration_since(at) < CANCEL_INTERVAL)
        {
            return Permit::Recent;
        }
        if !self.cancels.take(CANCEL_RATE, CANCEL_BURST, now) {
            return Permit::OverBudget;
        }
        self.entry(uid, now).cancelled = Some(now);
        Permit::Granted
    }

    /// The cache lacks `uid`: whether the server may read the Task from the
    /// API server now. `wait` asks for [`UNKNOWN_GRACE`] first (a heartbeat
    /// lists the uid again; a status is not sent again until confirmed).
    pub fn may_check(&mut self, uid: &str, wait: bool, now: Instant) -> Permit {
        let entry = self.entry(uid, now);
        let since = *entry.unknown_since.get_or_insert(now);
        if wait && now.saturating_duration_since(since) < UNKNOWN_GRACE {
            return Permit::Young;
        }
        if entry
            .checked
            .is_some_and(|at| now.saturating_duration_since(at) < CHECK_INTERVAL)
        {
            return Permit::Recent;
        }
        if !self.checks.take(CHECK_RATE, CHECK_BURST, now) {
            return Permit::OverBudget;
        }
        self.entry(uid, now).checked = Some(now);
        Permit::Granted
    }

    /// The read found the Task gone: it may be cancelled (and its statuses
    /// settled) at once, without waiting for another read.
    pub fn gone(&mut self, uid: &str) {
        if let Some(entry) = self.entries.get_mut(uid) {
            entry.cancelled = None;
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn attempts(uids: &[&str]) -> Vec<TaskAttempt> {
        uids.iter().map(|u| TaskAttempt::new(*u, 1)).collect()
    }

    #[test]
    fn a_cancel_goes_out_once_per_uid_per_interval() {
        let now = Instant::now();
        let mut m = HeldMemory::new(now);
        assert_eq!(m.may_cancel("u", now), Permit::Granted);
        for _ in 0..1000 {
            assert_eq!(m.may_cancel("u", now), Permit::Recent);
        }
        assert_eq!(m.len(), 1, "duplicates count once");
        assert_eq!(m.may_cancel("u", now + CANCEL_INTERVAL), Permit::Granted);
    }

    #[test]
    fn a_robots_cancels_are_bounded_whatever_it_lists() {
        let now = Instant::now();
        let mut m = HeldMemory::new(now);
        let granted = (0..10_000)
            .filter(|i| m.may_cancel(&format!("u{i}"), now) == Permit::Granted)
            .count();
        assert_eq!(granted, CANCEL_BURST as usize);
        assert!(m.len() <= MAX_HELD_ATTEMPTS, "{}", m.len());
        let later = now + Duration::from_secs(1);
        let more = (0..10_000)
            .filter(|i| m.may_cancel(&format!("v{i}"), later) == Permit::Granted)
            .count();
        assert_eq!(more, CANCEL_RATE as usize);
    }

    #[test]
    fn an_unknown_uid_is_read_after_its_grace_then_once_per_interval() {
        let now = Instant::now();
        let mut m = HeldMemory::new(now);
        assert_eq!(m.may_check("u", true, now), Permit::Young);
        assert_eq!(
            m.may_check("u", true, now + UNKNOWN_GRACE - Duration::from_millis(1)),
            Permit::Young
        );
        let t = now + UNKNOWN_GRACE;
        assert_eq!(m.may_check("u", true, t), Permit::Granted);
        assert_eq!(m.may_check("u", true, t + Duration::from_secs(1)), Permit::Recent);
        assert_eq!(m.may_check("u", true, t + CHECK_INTERVAL), Permit::Granted);
        // A status is read at once: the robot does not send it again
        // until it is settled.
        assert_eq!(m.may_check("s", false, now), Permit::Granted);
        m.known("u");
        assert_eq!(m.may_check("u", true, t + CHECK_INTERVAL * 2), Permit::Young);
    }

    #[test]
    fn reads_are_bounded_per_robot() {
        let now = Instant::now();
        let mut m = HeldMemory::new(now);
        let granted = (0..1000)
            .filter(|i| m.may_check(&format!("u{i}"), false, now) == Permit::Granted)
            .count();
        assert_eq!(granted, CHECK_BURST as usize);
    }

    #[test]
    fn a_complete_list_forgets_what_it_no_longer_names() {
        let now = Instant::now();
        let mut m = HeldMemory::new(now);
        m.may_cancel("a", now);
        m.may_cancel("b", now);
        m.retain_listed(&attempts(&["b", "c"]));
        assert_eq!(m.len(), 1);
        assert_eq!(m.may_cancel("a", now), Permit::Granted, "forgotten");
    }
}
