//! Robot messages between the broker connection and the workers: one
//! queue per robot, bounded in bytes, served round-robin, behind a
//! per-robot rate limit. A robot that floods its topics fills and overflows
//! only its own queue and spends only its own rate; the others' messages
//! keep their place in the rotation.
//!
//! Robots whose next message is a task's status or a registration take
//! their turns before robots whose next is a heartbeat, three to one: a
//! status that waits behind other robots' Lease renewals past its
//! attempt's dispatch deadline makes the manager run the task again
//! elsewhere (3,837 tasks of 60,000 in a 100,000-robot bench,
//! BENCHMARKS.md), and a registration unanswered for 5 s is sent again.
//! Heartbeats keep one turn in four, so Leases are renewed however much
//! work the fleet reports. One robot's messages stay in order.
//!
//! Nothing a robot must not lose is lost here: a status dropped for
//! overload or rate is not acknowledged to the robot, which sends it again
//! (see [`k8s4r_api::protocol::StatusAck`]); a dropped register is retried
//! by the agent; a dropped heartbeat is replaced by the next one.

use std::collections::{HashMap, VecDeque};
use std::sync::Mutex;
use std::time::Duration;

use k8s4r_service::lock;
use tokio::sync::Notify;
use tokio::time::Instant;

/// A message from a robot.
#[derive(Debug, Clone)]
pub struct Inbound {
    /// The topic.
    pub topic: String,
    /// The body.
    pub payload: Vec<u8>,
    /// When a robot's `online: false` was received, to be held
    /// (`crate::wills`): the robot may have come back on another replica
    /// or broker meanwhile. None for every other message.
    pub held_since: Option<jiff::Timestamp>,
}

impl Inbound {
    fn cost(&self) -> usize {
        self.topic.len() + self.payload.len()
    }
}

/// The limits of one robot's share.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Limits {
    /// Bytes (topics and bodies) one robot may have waiting.
    pub queue_bytes: usize,
    /// Messages per second one robot may send, on average.
    pub rate: f64,
    /// Messages one robot may send at once after being quiet.
    pub burst: f64,
}

impl Default for Limits {
    fn default() -> Self {
        Self {
            // Four full-size messages: a robot's burst of statuses fits,
            // a flood does not grow the server's memory.
            queue_bytes: 4 * k8s4r_api::protocol::MAX_PACKET_BYTES,
            rate: 50.0,
            burst: 200.0,
        }
    }
}

/// Why a message was not queued.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Refusal {
    /// The robot has too many bytes waiting.
    QueueFull,
    /// The robot sends faster than its rate.
    RateLimited,
}

impl Refusal {
    /// The outcome label in the metrics.
    pub fn outcome(self) -> &'static str {
        match self {
            Refusal::QueueFull => "dropped_overload",
            Refusal::RateLimited => "dropped_rate_limited",
        }
    }
}

/// A token bucket: `rate` tokens a second, at most `burst` saved up.
#[derive(Debug, Clone)]
pub(crate) struct Bucket {
    tokens: f64,
    at: Instant,
}

impl Bucket {
    /// A full bucket of `burst` tokens.
    pub(crate) fn full(burst: f64, now: Instant) -> Self {
        Self {
            tokens: burst,
            at: now,
        }
    }

    /// Takes a token if one is there, after adding what `rate` earned since.
    pub(crate) fn take(&mut self, rate: f64, burst: f64, now: Instant) -> bool {
        let earned = now.saturating_duration_since(self.at).as_secs_f64() * rate;
        self.tokens = (self.tokens + earned).min(burst);
        self.at = now;
        if self.tokens >= 1.0 {
            self.tokens -= 1.0;
            true
        } else {
            false
        }
    }

    /// When a token will be there at `rate` (`now` if one is; an hour
    /// on for a rate that never earns one).
    pub(crate) fn ready_at(&self, rate: f64, now: Instant) -> Instant {
        let earned = now.saturating_duration_since(self.at).as_secs_f64() * rate;
        let missing = 1.0 - (self.tokens + earned);
        if missing <= 0.0 {
            return now;
        }
        // A microsecond over, so that the token is there then, whatever
        // the rounding of the float arithmetic.
        let wait = Duration::try_from_secs_f64(missing / rate)
            .map_or(Duration::from_secs(3600), |d| d + Duration::from_micros(1))
            .min(Duration::from_secs(3600));
        now + wait
    }
}

#[derive(Debug)]
struct RobotQueue {
    messages: VecDeque<Inbound>,
    bytes: usize,
    bucket: Bucket,
}

/// Turns taken by robots with a status or registration next before one
/// whose next is routine (a heartbeat, its presence), when both wait.
const URGENT_PER_ROUTINE: u32 = 3;

/// Whether `message` takes its robot into the urgent turns.
fn urgent(message: &Inbound) -> bool {
    message.topic.ends_with("/status") || message.topic.ends_with("/register")
}

/// The queues of the robots one worker serves. Pure state: the clock is
/// passed in.
#[derive(Debug, Default)]
pub struct Queues {
    robots: HashMap<String, RobotQueue>,
    /// Robots with something waiting, in the order they are served: those
    /// whose next message is urgent, then the others.
    turns: [VecDeque<String>; 2],
    /// Urgent turns taken in a row (a routine turn, or an empty lane, ends
    /// the streak).
    streak: u32,
    bytes: usize,
}

impl Queues {
    /// Queues `message` from `robot` unless its share is used up.
    pub fn push(
        &mut self,
        robot: &str,
        message: Inbound,
        limits: &Limits,
        now: Instant,
    ) -> Result<(), Refusal> {
        let queue = self.robots.entry(robot.to_owned()).or_insert_with(|| RobotQueue {
            messages: VecDeque::new(),
            bytes: 0,
            bucket: Bucket::full(limits.burst, now),
        });
        if !queue.bucket.take(limits.rate, limits.burst, now) {
            return Err(Refusal::RateLimited);
        }
        let cost = message.cost();
        // One message always fits an empty queue, whatever its size (the
        // protocol check refuses it later, with a reason).
        if !queue.messages.is_empty() && queue.bytes + cost > limits.queue_bytes {
            return Err(Refusal::QueueFull);
        }
        if queue.messages.is_empty() {
            self.turns[usize::from(!urgent(&message))].push_back(robot.to_owned());
        }
        queue.messages.push_back(message);
        queue.bytes += cost;
        self.bytes += cost;
        Ok(())
    }

    /// The next message, taking turns between robots (urgent ones first,
    /// [`URGENT_PER_ROUTINE`] to one).
    pub fn pop(&mut self) -> Option<Inbound> {
        let [urgent_turns, routine_turns] = &self.turns;
        let routine =
            urgent_turns.is_empty() || (self.streak >= URGENT_PER_ROUTINE && !routine_turns.is_empty());
        self.streak = if routine { 0 } else { self.streak.saturating_add(1) };
        let robot = self.turns[usize::from(routine)].pop_front()?;
        let queue = self.robots.get_mut(&robot)?;
        let message = queue.messages.pop_front()?;
        queue.bytes -= message.cost();
        self.bytes -= message.cost();
        if let Some(next) = queue.messages.front() {
            self.turns[usize::from(!urgent(next))].push_back(robot);
        }
        Some(message)
    }

    /// Bytes waiting, over all robots.
    pub fn bytes(&self) -> usize {
        self.bytes
    }

    /// Forgets robots with nothing waiting whose bucket is full again, so
    /// the map does not keep every robot ever heard from.
    pub fn forget_idle(&mut self, limits: &Limits, now: Instant) {
        let refill = Duration::from_secs_f64(limits.burst / limits.rate.max(f64::MIN_POSITIVE));
        self.robots
            .retain(|_, q| !q.messages.is_empty() || now.saturating_duration_since(q.bucket.at) < refill);
    }
}

/// The queues of one worker, shared between the connection (which pushes)
/// and the worker (which waits for the next message).
#[derive(Debug, Default)]
pub struct Lane {
    queues: Mutex<Queues>,
    ready: Notify,
    closed: std::sync::atomic::AtomicBool,
}

impl Lane {
    /// Queues a message (see [`Queues::push`]) and wakes the worker.
    pub fn push(&self, robot: &str, message: Inbound, limits: &Limits) -> Result<(), Refusal> {
        let now = Instant::now();
        let mut queues = lock(&self.queues);
        queues.push(robot, message, limits, now)?;
        if queues.robots.len() > 4096 {
            queues.forget_idle(limits, now);
        }
        drop(queues);
        self.ready.notify_one();
        Ok(())
    }

    /// No more messages will come; the worker finishes what is queued.
    pub fn close(&self) {
        self.closed.store(true, std::sync::atomic::Ordering::Release);
        self.ready.notify_one();
    }

    /// The next message; `None` once closed and drained.
    pub async fn next(&self) -> Option<Inbound> {
        loop {
            let notified = self.ready.notified();
            if let Some(message) = lock(&self.queues).pop() {
                return Some(message);
            }
            if self.closed.load(std::sync::atomic::Ordering::Acquire) {
                return None;
            }
            notified.await;
        }
    }

    /// Bytes waiting in this lane.
    pub fn bytes(&self) -> usize {
        lock(&self.queues).bytes()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn msg(topic: &str, size: usize) -> Inbound {
        Inbound {
            topic: topic.into(),
            payload: vec![b'x'; size],
            held_since: None,
        }
    }

    fn limits() -> Limits {
        Limits {
            queue_bytes: 1000,
            rate: 10.0,
            burst: 5.0,
        }
    }

    #[test]
    fn robots_take_turns() {
        let (l, now) = (limits(), Instant::now());
        let mut q = Queues::default();
        for i in 0..3 {
            q.push("flood", msg(&format!("f{i}"), 10), &l, now).unwrap();
        }
        q.push("quiet", msg("q0", 10), &l, now).unwrap();
        let order: Vec<String> = std::iter::from_fn(|| q.pop()).map(|m| m.topic).collect();
        assert_eq!(
            order,
            ["f0", "q0", "f1", "f2"],
            "the quiet robot waits one message, not three"
        );
        assert_eq!(q.bytes(), 0);
    }

    #[test]
    fn statuses_and_registrations_go_first_and_heartbeats_keep_a_turn_in_four() {
        let (l, now) = (limits(), Instant::now());
        let mut q = Queues::default();
        for i in 0..3 {
            q.push(
                &format!("idle{i}"),
                msg(&format!("r/idle{i}/heartbeat"), 10),
                &l,
                now,
            )
            .unwrap();
        }
        for i in 0..4 {
            q.push(
                &format!("busy{i}"),
                msg(&format!("r/busy{i}/tasks/u/status"), 10),
                &l,
                now,
            )
            .unwrap();
        }
        q.push("new", msg("r/new/register", 10), &l, now).unwrap();
        // One robot's messages stay in order: its heartbeat after its status.
        q.push("busy0", msg("r/busy0/heartbeat", 10), &l, now).unwrap();
        let order: Vec<String> = std::iter::from_fn(|| q.pop()).map(|m| m.topic).collect();
        assert_eq!(
            order,
            [
                "r/busy0/tasks/u/status",
                "r/busy1/tasks/u/status",
                "r/busy2/tasks/u/status",
                "r/idle0/heartbeat",
                "r/busy3/tasks/u/status",
                "r/new/register",
                "r/idle1/heartbeat",
                "r/idle2/heartbeat",
                "r/busy0/heartbeat",
            ]
        );
        assert_eq!(q.bytes(), 0);
    }

    #[test]
    fn a_robots_bytes_are_bounded_and_others_are_unaffected() {
        let (l, now) = (limits(), Instant::now());
        let mut q = Queues::default();
        q.push("flood", msg("a", 600), &l, now).unwrap();
        assert_eq!(q.push("flood", msg("b", 600), &l, now), Err(Refusal::QueueFull));
        q.push("quiet", msg("c", 600), &l, now).unwrap();
        // One oversized message still gets in alone (and is refused later
        // with a reason), instead of blocking its robot forever.
        q.push("big", msg("d", 5000), &l, now).unwrap();
        assert!(q.bytes() <= 600 + 600 + 5000 + 3);
    }

    #[test]
    fn the_rate_limit_refills_with_time() {
        let l = Limits {
            queue_bytes: usize::MAX,
            ..limits()
        };
        let start = Instant::now();
        let mut q = Queues::default();
        for _ in 0..5 {
            q.push("r", msg("t", 1), &l, start).unwrap();
        }
        assert_eq!(q.push("r", msg("t", 1), &l, start), Err(Refusal::RateLimited));
        q.push("other", msg("t", 1), &l, start).unwrap();
        let later = start + Duration::from_millis(250);
        q.push("r", msg("t", 1), &l, later).unwrap();
        q.push("r", msg("t", 1), &l, later).unwrap();
        assert_eq!(q.push("r", msg("t", 1), &l, later), Err(Refusal::RateLimited));
    }

    #[test]
    fn a_bucket_says_when_its_next_token_comes() {
        let start = Instant::now();
        let mut bucket = Bucket::full(2.0, start);
        assert_eq!(bucket.ready_at(4.0, start), start, "a token is there");
        assert!(bucket.take(4.0, 2.0, start) && bucket.take(4.0, 2.0, start));
        let at = bucket.ready_at(4.0, start);
        assert!(at >= start + Duration::from_millis(250) && at < start + Duration::from_millis(251));
        assert!(!bucket.take(4.0, 2.0, at - Duration::from_millis(1)));
        assert!(bucket.take(4.0, 2.0, at), "the token is there when it says");
        assert_eq!(
            bucket.ready_at(0.0, at),
            at + Duration::from_secs(3600),
            "a rate of nothing"
        );
    }

    #[test]
    fn idle_robots_are_forgotten() {
        let (l, now) = (limits(), Instant::now());
        let mut q = Queues::default();
        q.push("r", msg("t", 1), &l, now).unwrap();
        q.pop();
        q.forget_idle(&l, now + Duration::from_millis(100));
        assert!(q.robots.contains_key("r"), "its bucket is still refilling");
        q.forget_idle(&l, now + Duration::from_secs(60));
        assert!(q.robots.is_empty());
    }

    #[tokio::test]
    async fn a_closed_lane_drains_then_ends() {
        let lane = Lane::default();
        lane.push("r", msg("t", 1), &limits()).unwrap();
        lane.close();
        assert_eq!(lane.next().await.map(|m| m.topic).as_deref(), Some("t"));
        assert!(lane.next().await.is_none());
    }
}
