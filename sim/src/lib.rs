//! A fleet simulator: N robots in one process, each a real MQTT client
//! around the agent's own protocol core (`k8s4r_agent::session::core`):
//! it registers with a bootstrap token, heartbeats on the agent's schedule,
//! takes dispatches as the agent's gate and fence decide, "runs" each for
//! a drawn duration, reports running then completed (or failed, for a
//! chosen fraction), answers cancels, keeps each status until the server
//! confirms it (listing the attempt as held until then), and disconnects
//! and reconnects on request. The server and the manager cannot tell it
//! from agents, and it cannot drift from the agent's protocol: it is the
//! agent's code. (The deterministic simulation of the protocol is
//! [`world`], on the same core.)
//!
//! What it does not do: run processes, keep its outbox on disk across its
//! own restarts, or read logs.

pub mod broker;
mod robot;
pub mod world;

use std::collections::HashMap;
use std::sync::atomic::{AtomicU64, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use k8s4r_service::lock;
use robot::SimRobot;
use tokio::sync::watch;
use tokio_util::sync::CancellationToken;

/// How the simulated robots behave.
#[derive(Clone, Debug)]
pub struct SimConfig {
    /// `mqtt://host:port`.
    pub broker: String,
    /// The bootstrap token they register with.
    pub token: String,
    /// How many robots.
    pub robots: usize,
    /// Robot ids are `<prefix>-<n>`, n from `first` on.
    pub prefix: String,
    /// The number of the first robot (a fleet spread over processes gives
    /// each its own block).
    pub first: usize,
    /// Heartbeat interval (each robot ±10%, and starting at a random point
    /// of it).
    pub heartbeat: Duration,
    /// How long a task "runs": uniformly between these.
    pub task_duration: (Duration, Duration),
    /// The fraction of tasks that fail (exit code 1); a task whose command
    /// is `/bin/false` always does.
    pub fail_fraction: f64,
    /// Robots connecting per second at most (0: all at once).
    pub connect_rate: u32,
    /// The MQTT keep-alive.
    pub keep_alive: Duration,
}

impl Default for SimConfig {
    fn default() -> Self {
        SimConfig {
            broker: "mqtt://127.0.0.1:1883".into(),
            token: String::new(),
            robots: 100,
            prefix: "sim".into(),
            first: 0,
            heartbeat: Duration::from_secs(30),
            task_duration: (Duration::from_millis(100), Duration::from_millis(500)),
            fail_fraction: 0.0,
            connect_rate: 0,
            keep_alive: Duration::from_secs(60),
        }
    }
}

/// What the fleet saw, in counters.
#[derive(Debug, Default)]
pub struct Counters {
    /// Connections made (reconnects included).
    pub connects: AtomicUsize,
    /// Robots whose registration was answered Online (at least once).
    pub online: AtomicUsize,
    /// Registrations answered Online, every time (a reconnect registers
    /// again).
    pub registrations: AtomicUsize,
    /// Heartbeats sent.
    pub heartbeats: AtomicU64,
    /// Dispatches taken (duplicates of one attempt not counted).
    pub dispatches: AtomicU64,
    /// The same attempt dispatched again while held or after it ended, or
    /// refused by the fence as seen already: a re-sent dispatch, not run
    /// again. (A task run twice shows in [`Fleet::runs`].)
    pub duplicate_dispatches: AtomicU64,
    /// Dispatches refused for arriving after their deadline (reported
    /// failed, as the agent does), counted once the server confirmed the
    /// report.
    pub expired_dispatches: AtomicU64,
    /// Status updates sent again because the server had not confirmed
    /// them.
    pub resent_statuses: AtomicU64,
    /// Tasks finished (completed or failed).
    pub finished: AtomicU64,
    /// Bytes published by the robots (MQTT payloads).
    pub bytes_out: AtomicU64,
    /// Bytes received by the robots (MQTT payloads).
    pub bytes_in: AtomicU64,
}

/// How a run of an attempt ended.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum End {
    /// Exit code 0.
    Completed,
    /// Exit code 1 (the chosen fraction).
    Failed,
    /// Stopped by the server's cancel.
    Cancelled,
}

impl End {
    fn as_str(self) -> &'static str {
        match self {
            End::Completed => "completed",
            End::Failed => "failed",
            End::Cancelled => "cancelled",
        }
    }
}

/// One run of a task's attempt on one robot, as that robot saw it: what a
/// check that no task ran twice at once reads.
#[derive(Debug, Clone, PartialEq)]
pub struct Run {
    /// The Task's uid.
    pub uid: String,
    /// The attempt.
    pub attempt: u32,
    /// The robot that ran it.
    pub robot: String,
    /// When the robot started it (its status's `startTime`).
    pub start: jiff::Timestamp,
    /// When and how it ended; `None` while the robot holds it.
    pub end: Option<(jiff::Timestamp, End)>,
}

impl Run {
    /// One line, for a run read by another process:
    /// `uid attempt robot start_ms end_ms how` (`-` for both while held).
    pub fn to_line(&self) -> String {
        let (end, how) = match self.end {
            Some((at, how)) => (at.as_millisecond().to_string(), how.as_str()),
            None => ("-".to_owned(), "-"),
        };
        format!(
            "{} {} {} {} {end} {how}",
            self.uid,
            self.attempt,
            self.robot,
            self.start.as_millisecond()
        )
    }

    /// Reads what [`Run::to_line`] wrote.
    pub fn parse(line: &str) -> Option<Run> {
        let [uid, attempt, robot, start, end, how] = line.split(' ').collect::<Vec<_>>()[..] else {
            return None;
        };
        let at = |ms: &str| {
            ms.parse()
                .ok()
                .and_then(|ms| jiff::Timestamp::from_millisecond(ms).ok())
        };
        let end = match how {
            "-" => None,
            how => {
                let how = [End::Completed, End::Failed, End::Cancelled]
                    .into_iter()
                    .find(|e| e.as_str() == how)?;
                Some((at(end)?, how))
            }
        };
        Some(Run {
            uid: uid.to_owned(),
            attempt: attempt.parse().ok()?,
            robot: robot.to_owned(),
            start: at(start)?,
            end,
        })
    }

    /// Whether this run and another one of the same task were under way at
    /// the same moment (on two robots, or two attempts on one): the task
    /// ran twice at once. A run still held counts as under way until now.
    pub fn overlaps(&self, other: &Run) -> bool {
        let until = |r: &Run| r.end.map_or(jiff::Timestamp::MAX, |(at, _)| at);
        self.uid == other.uid && self.start < until(other) && other.start < until(self)
    }
}

/// The fleet's shared record: every run of an attempt, and each robot's
/// latest registration.
pub(crate) struct Ledger {
    pub(crate) started: Instant,
    /// Each robot holds the index of its runs in here.
    pub(crate) runs: Mutex<Vec<Run>>,
    /// Milliseconds after `started` (plus one; 0: never) of each robot's
    /// latest registration answered Online.
    pub(crate) registered: Vec<AtomicU64>,
}

/// The running fleet.
pub struct Fleet {
    /// Counters.
    pub counters: Arc<Counters>,
    /// When each robot was first answered Online, by robot index.
    pub online_at: Arc<Mutex<HashMap<usize, Instant>>>,
    /// What the fleet holds and has finished, and when each robot was last
    /// answered Online.
    ledger: Arc<Ledger>,
    /// Increments to make every robot drop its connection and reconnect.
    reconnect: watch::Sender<u64>,
    /// Robots with a lower index vanish: their connection drops without a
    /// goodbye, as a robot that loses power.
    vanish: watch::Sender<usize>,
    stop: CancellationToken,
    tasks: Vec<tokio::task::JoinHandle<()>>,
}

impl Fleet {
    /// Starts every robot (at `connect_rate` per second, or all at once).
    pub fn start(config: SimConfig) -> Fleet {
        let counters = Arc::new(Counters::default());
        let online_at = Arc::new(Mutex::new(HashMap::new()));
        let ledger = Arc::new(Ledger {
            started: Instant::now(),
            runs: Mutex::new(Vec::new()),
            registered: (0..config.robots).map(|_| AtomicU64::new(0)).collect(),
        });
        let (reconnect, reconnect_rx) = watch::channel(0u64);
        let (vanish, vanish_rx) = watch::channel(0usize);
        let stop = CancellationToken::new();
        let config = Arc::new(config);
        let mut tasks = Vec::with_capacity(config.robots);
        for i in 0..config.robots {
            let robot = SimRobot {
                index: i,
                id: format!("{}-{}", config.prefix, config.first + i),
                config: Arc::clone(&config),
                counters: Arc::clone(&counters),
                online_at: Arc::clone(&online_at),
                ledger: Arc::clone(&ledger),
                reconnect: reconnect_rx.clone(),
                vanish: vanish_rx.clone(),
                stop: stop.clone(),
            };
            let delay = match config.connect_rate {
                0 => Duration::ZERO,
                rate => Duration::from_secs_f64(i as f64 / f64::from(rate)),
            };
            tasks.push(tokio::spawn(async move {
                tokio::time::sleep(delay).await;
                robot.run().await;
            }));
        }
        Fleet {
            counters,
            online_at,
            ledger,
            reconnect,
            vanish,
            stop,
            tasks,
        }
    }

    /// How many robots were answered Online at or after `since`.
    pub fn registered_since(&self, since: Instant) -> usize {
        let mark = since.saturating_duration_since(self.ledger.started).as_millis() as u64 + 1;
        self.ledger
            .registered
            .iter()
            .filter(|r| r.load(Ordering::Relaxed) >= mark)
            .count()
    }

    /// Every run of an attempt so far, held ones included.
    pub fn runs(&self) -> Vec<Run> {
        lock(&self.ledger.runs).clone()
    }

    /// Makes every robot drop its connection and connect again.
    pub fn reconnect_all(&self) {
        self.reconnect.send_modify(|n| *n += 1);
    }

    /// Makes the first `n` robots vanish (`<prefix>-0` ...): their
    /// connections drop without a DISCONNECT, so the broker publishes their
    /// last will, as for a robot that lost power.
    pub fn vanish(&self, n: usize) {
        self.vanish.send_replace(n);
    }

    /// Stops every robot (without a clean disconnect: as if they vanished).
    pub async fn stop(self) {
        self.stop.cancel();
        for t in self.tasks {
            let _ = t.await;
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn run(robot: &str, attempt: u32, start: i64, end: Option<i64>) -> Run {
        let at = |ms| jiff::Timestamp::from_millisecond(ms).unwrap();
        Run {
            uid: "u1".into(),
            attempt,
            robot: robot.into(),
            start: at(start),
            end: end.map(|ms| (at(ms), End::Completed)),
        }
    }

    #[test]
    fn a_run_reads_back_from_its_line() {
        for r in [run("sim-3", 2, 1_000, Some(1_500)), run("sim-3", 1, 1_000, None)] {
            assert_eq!(Run::parse(&r.to_line()), Some(r));
        }
        assert_eq!(Run::parse("u1 1 sim-3 1000 1500 exploded"), None);
        assert_eq!(Run::parse("u1 1 sim-3"), None);
    }

    #[test]
    fn runs_overlap_only_while_both_are_under_way() {
        let first = run("sim-1", 1, 1_000, Some(2_000));
        assert!(first.overlaps(&run("sim-2", 2, 1_999, Some(3_000))));
        assert!(
            !first.overlaps(&run("sim-2", 2, 2_000, Some(3_000))),
            "one after the other"
        );
        assert!(
            first.overlaps(&run("sim-1", 2, 1_500, None)),
            "two attempts on one robot"
        );
        assert!(run("sim-2", 2, 500, None).overlaps(&first), "a run still held");
        let mut other_task = run("sim-2", 1, 1_500, None);
        other_task.uid = "u2".into();
        assert!(!first.overlaps(&other_task));
    }
}
