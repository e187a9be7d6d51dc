//! Heartbeats: how often they reach the API server (the robot's Lease and
//! `status.lastHeartbeatTime`), for robots that hold work and idle ones.

use std::time::Duration;

use jiff::Timestamp;
use k8s4r_api::condition::find_condition;
use k8s4r_api::robot::AgentHealth;
use k8s4r_api::{ConditionStatus, Robot, Usage};

use super::{accepting, connected, stale, RobotStatusPatch, CONDITION_CONNECTED};

/// How often heartbeats reach the API server.
///
/// A robot that holds work (its heartbeat lists an attempt, or it reports
/// one running) is renewed at the short interval, which bounds how long the
/// manager waits before it replaces a silent robot's attempt; a robot that
/// holds none at the long one, which is most of a fleet most of the time.
/// The interval a Lease was written with travels in it
/// (`leaseDurationSeconds` is three times it), so the manager's fencing and
/// heartbeat timeout read what was promised, and a robot that takes work
/// is renewed at once at the short interval.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Coalescing {
    /// Renew the Lease of a robot that holds work at most this often.
    pub lease_interval: Duration,
    /// Renew the Lease of a robot that holds none at most this often
    /// (never more often than `lease_interval`).
    pub idle_lease_interval: Duration,
    /// Write `status.lastHeartbeatTime` of a robot that holds work when the
    /// written one is older than this.
    pub status_refresh: Duration,
    /// The same for a robot that holds none.
    pub idle_status_refresh: Duration,
}

impl Default for Coalescing {
    /// With the agent's 30 s heartbeats, a 10 s lease interval would renew
    /// on every heartbeat and save nothing. 60 s and 240 s while a robot
    /// holds work keep the manager's fence time short; 600 s and 1800 s
    /// while it holds none keep an idle fleet near 0.07 writes per
    /// heartbeat (docs/scale.md), and the manager's heartbeat timeout of
    /// such a robot follows its Lease (30 minutes). A robot that goes away
    /// says so through its last will at once either way.
    fn default() -> Self {
        Self {
            lease_interval: Duration::from_secs(60),
            idle_lease_interval: Duration::from_secs(600),
            status_refresh: Duration::from_secs(240),
            idle_status_refresh: Duration::from_secs(1800),
        }
    }
}

impl Coalescing {
    /// The Lease renewal interval for a robot that holds work (`busy`) or not.
    pub fn lease_interval(&self, busy: bool) -> Duration {
        if busy {
            self.lease_interval
        } else {
            self.idle_lease_interval.max(self.lease_interval)
        }
    }

    /// How old `status.lastHeartbeatTime` may be before it is written again.
    pub fn status_refresh(&self, busy: bool) -> Duration {
        if busy {
            self.status_refresh
        } else {
            self.idle_status_refresh.max(self.status_refresh)
        }
    }
}

/// A robot's Lease as the server wrote or read it: when it was renewed,
/// and the renewal interval it promised (`leaseDurationSeconds / 3`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct LeaseRecord {
    /// `spec.renewTime`.
    pub renewed: Timestamp,
    /// The longest the server lets pass before it renews again while it
    /// hears the robot.
    pub interval: Duration,
}

impl LeaseRecord {
    /// Three missed renewals, as node leases allow.
    pub const DURATION_PER_INTERVAL: u64 = 3;

    /// The record of a Lease's renewal time and `leaseDurationSeconds`.
    pub fn read(renewed: Timestamp, duration_seconds: Option<i32>) -> Self {
        let seconds = duration_seconds.and_then(|s| u64::try_from(s).ok()).unwrap_or(0);
        Self {
            renewed,
            interval: Duration::from_secs(seconds / Self::DURATION_PER_INTERVAL),
        }
    }

    /// Whether the renewal's promise still holds at `now`: a heartbeat heard
    /// now may be confirmed without a write, since the manager allows for
    /// the whole interval after `renewed`.
    pub fn covers(&self, now: Timestamp) -> bool {
        !stale(Some(self.renewed), self.interval, now)
    }

    /// `leaseDurationSeconds` for a renewal at `interval`.
    pub fn duration_seconds(interval: Duration) -> i32 {
        let seconds = interval
            .as_secs()
            .max(1)
            .saturating_mul(Self::DURATION_PER_INTERVAL);
        i32::try_from(seconds).unwrap_or(i32::MAX)
    }
}

/// Whether a robot heard now, holding work (`busy`) or not, needs its Lease
/// renewed, and at which interval; updates `memory` as if the renewal
/// succeeds. `cached` is the Lease as the watch shows it (another replica
/// may have renewed it more recently than this one remembers).
///
/// It is renewed when the interval it promised has passed, and at once when
/// it promised a longer interval than the robot's work allows: the
/// manager's fence time of an attempt runs from the Lease, so the promise
/// must shrink as soon as the robot is heard holding work.
pub fn plan_lease(
    memory: &mut Option<LeaseRecord>,
    cached: Option<LeaseRecord>,
    busy: bool,
    now: Timestamp,
    limits: Coalescing,
) -> Option<Duration> {
    if cached.map(|c| c.renewed) > memory.map(|m| m.renewed) {
        *memory = cached;
    }
    let want = limits.lease_interval(busy);
    let renew = memory.is_none_or(|l| l.interval > want || stale(Some(l.renewed), l.interval, now));
    renew.then(|| {
        *memory = Some(LeaseRecord {
            renewed: now,
            interval: want,
        });
        want
    })
}

/// What the server last wrote for one robot's heartbeats.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct HeartbeatMemory {
    /// The Lease as this server last renewed (or read) it.
    pub lease: Option<LeaseRecord>,
    /// `status.lastHeartbeatTime` as last written (or read).
    pub status_written: Option<Timestamp>,
    /// `status.usage` as last written (or read).
    pub usage_written: Option<Usage>,
}

/// The writes one heartbeat needs.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct HeartbeatPlan {
    /// Renew the Lease, promising this interval.
    pub renew_lease: Option<Duration>,
    /// Patch the Robot's status (time, usage and maybe `Connected`).
    pub status: Option<RobotStatusPatch>,
}

impl HeartbeatPlan {
    /// Whether nothing is written.
    pub fn is_empty(&self) -> bool {
        self.renew_lease.is_none() && self.status.is_none()
    }
}

/// Plans the writes for one heartbeat and updates `memory` as if they
/// succeed (the caller forgets the memory when a write fails). `busy`: the
/// heartbeat lists an attempt the robot runs or holds.
#[allow(clippy::too_many_arguments)]
pub fn plan_heartbeat(
    memory: &mut HeartbeatMemory,
    robot: &Robot,
    lease: Option<LeaseRecord>,
    busy: bool,
    usage: Option<&Usage>,
    health: Option<&AgentHealth>,
    now: Timestamp,
    limits: Coalescing,
) -> HeartbeatPlan {
    let status = robot.status.as_ref();
    let stale = |at: Option<Timestamp>, every: Duration| stale(at, every, now);
    // Another replica (shared subscriptions spread a robot's heartbeats)
    // may have written more recently than this one remembers: the caches
    // show it, so the budget does not grow with the number of replicas.
    let written = status.and_then(|s| s.last_heartbeat_time);
    if written > memory.status_written {
        memory.status_written = written;
        memory.usage_written = status.and_then(|s| s.usage.clone());
    }
    let renew_lease = plan_lease(&mut memory.lease, lease, busy, now, limits);
    let conditions = status.map(|s| s.conditions.as_slice()).unwrap_or_default();
    // Only flip Connected back to True when something said False: a robot
    // that never disconnected costs no extra write.
    let reconnect =
        find_condition(conditions, CONDITION_CONNECTED).is_some_and(|c| c.status != ConditionStatus::True);
    // A heartbeat without usage: the robot's figures have not moved
    // materially from those it knows the cluster has.
    let usage_moved = usage.is_some_and(|new| {
        memory
            .usage_written
            .as_ref()
            .is_none_or(|old| old.moved_materially(new))
    });
    let mut list = None;
    if reconnect {
        list = connected(conditions, true, now);
    }
    if let Some(changed) = accepting(list.as_deref().unwrap_or(conditions), health, now) {
        list = Some(changed);
    }
    let write = stale(memory.status_written, limits.status_refresh(busy)) || usage_moved || list.is_some();
    let status = write.then(|| {
        memory.status_written = Some(now);
        if let Some(usage) = usage {
            memory.usage_written = Some(usage.clone());
        }
        RobotStatusPatch {
            last_heartbeat_time: Some(now),
            heartbeat_refresh: Some(k8s4r_api::duration::format_duration(limits.status_refresh(busy))),
            usage: usage.cloned(),
            conditions: list,
            ..Default::default()
        }
    });
    HeartbeatPlan { renew_lease, status }
}
