//! A fleet larger than one process may hold: this machine allows 20,000
//! open files per process and no one may raise it (the container has no
//! `CAP_SYS_RESOURCE`), and every simulated robot is a socket in the
//! simulator and one in its broker. So above [`per_process`] robots the
//! bench runs several simulator processes (this bench started again with
//! `--sim-shard`), each with its block of robots and a Mosquitto of its
//! own, as a fleet too large for one broker would be run. The server
//! connects to every such "edge" broker (`--broker-url` with each) and
//! answers a robot on the broker it heard it on.
//!
//! With `--bridged` the server connects instead to one "central" broker
//! every edge is bridged to (a clustered broker does the same inside
//! itself). Each edge's bridge forwards everything its robots publish to
//! the central broker (`k8s4r/# out`) and subscribes there to its own
//! robots' topics only (`k8s4r/robots/<id>/# in`, one line per robot), so
//! what the server publishes to one robot crosses one bridge, not all of
//! them. The central broker is told it is a bridge (`try_private`), and no
//! message goes back over the bridge it came from.
//!
//! A shard prints its counters once a second on stdout (`SIM connects
//! online heartbeats bytes_out bytes_in dispatches resent_dispatches
//! finished registered_since_mark resent_statuses`). On its stdin, a line
//! `vanish N` makes its first N robots vanish, `mark MS` counts the robots
//! answered Online from MS (milliseconds since the Unix epoch) on,
//! `runs PATH` writes every run of an attempt its robots made to PATH, one
//! a line ([`Run::to_line`]), and the end of its stdin stops it.

use std::io::{BufRead, BufReader, Write};
use std::path::Path;
use std::process::{Child, ChildStdin, Command, Stdio};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

use k8s4r_sim::{Fleet, Run, SimConfig};
use k8s4r_testbed::Mosquitto;

/// Robots per simulator process and per edge broker: under the 20,000 open
/// files a process may have, with room for the rest
/// (`K8S4R_SIM_PER_PROCESS` sets another, to try the shards on a small
/// fleet).
pub fn per_process() -> usize {
    std::env::var("K8S4R_SIM_PER_PROCESS")
        .ok()
        .and_then(|n| n.parse().ok())
        .filter(|n| *n > 0)
        .unwrap_or(15_000)
}

/// The broker settings every broker of the bench shares. No limit on QoS 1
/// messages in flight to one client (Mosquitto's default is 20): an edge's
/// bridge is one client of the central broker carrying every message to
/// 15,000 robots, and at 20 unacknowledged at a time, with both ends
/// starved of CPU, the hop is suspected of holding back registration
/// answers, which robots then asked for again (a 100,000-robot storm: 3.8
/// registrations per robot). A clustered broker, which the bridges stand
/// in for, has no such hop.
fn common() -> String {
    format!(
        "allow_anonymous true\npersistence false\nmax_connections -1\n\
         max_inflight_messages 0\nmax_queued_messages 100000\nmax_packet_size {}\n",
        k8s4r_api::protocol::MAX_PACKET_BYTES
    )
}

/// The edges and, bridged, the central broker: robots `first..first +
/// count` of edge `i` connect to `edges[i]`.
pub struct Brokers {
    /// With `--bridged`: what the server connects to.
    pub central: Option<Mosquitto>,
    /// The edges, each with its block of robots.
    pub edges: Vec<(Mosquitto, usize, usize)>,
}

impl Brokers {
    /// One edge per [`per_process`] of `robots` named `sim-<n>`, and when
    /// `bridged` a central broker they are bridged to.
    pub fn start(robots: usize, bridged: bool) -> Brokers {
        let central = bridged
            .then(|| Mosquitto::start_with(|port, _| format!("listener {port} 127.0.0.1\n{}", common())));
        let per_process = per_process();
        let edges = (0..robots.div_ceil(per_process))
            .map(|i| {
                let first = i * per_process;
                let count = per_process.min(robots - first);
                let edge = Mosquitto::start_with(|port, _| {
                    let Some(central) = &central else {
                        return format!("listener {port} 127.0.0.1\n{}", common());
                    };
                    let mut conf = format!(
                        "listener {port} 127.0.0.1\n{}\nconnection central\naddress 127.0.0.1:{}\n\
                         remote_clientid k8s4r-edge-{i}\n\
                         bridge_protocol_version mqttv311\ntry_private true\ncleansession true\n\
                         notifications false\nbridge_max_packet_size {}\ntopic k8s4r/# out 1\n",
                        common(),
                        central.port,
                        k8s4r_api::protocol::MAX_PACKET_BYTES
                    );
                    for n in first..first + count {
                        conf.push_str(&format!("topic k8s4r/robots/sim-{n}/# in 1\n"));
                    }
                    conf
                });
                (edge, first, count)
            })
            .collect();
        Brokers { central, edges }
    }
}

/// One shard's latest counters.
#[derive(Default)]
struct Seen {
    connects: AtomicU64,
    online: AtomicU64,
    heartbeats: AtomicU64,
    bytes: AtomicU64,
    dispatches: AtomicU64,
    resent_dispatches: AtomicU64,
    finished: AtomicU64,
    registered_since_mark: AtomicU64,
    resent_statuses: AtomicU64,
    expired_dispatches: AtomicU64,
}

/// The simulator processes.
pub struct Shards {
    children: Vec<(Child, Mutex<Option<ChildStdin>>)>,
    seen: Vec<Arc<Seen>>,
    /// The mark last sent.
    mark: Mutex<Option<Instant>>,
}

impl Shards {
    /// One simulator process per edge broker (with its block of robots).
    /// Robots connect `connect_rate` per second at most, all shards
    /// together (0: all at once).
    pub fn start(
        edges: &[(Mosquitto, usize, usize)],
        behaviour: &crate::sims::Behaviour,
        token: &str,
        connect_rate: u32,
    ) -> Shards {
        let rate = connect_rate.div_ceil(u32::try_from(edges.len().max(1)).unwrap_or(1));
        let exe = std::env::current_exe().expect("this bench's path");
        let mut children = Vec::new();
        let mut seen = Vec::new();
        for (edge, first, count) in edges {
            let mut child = Command::new(&exe)
                .args([
                    "--sim-shard".to_owned(),
                    edge.url(),
                    first.to_string(),
                    count.to_string(),
                    behaviour.heartbeat.as_secs().to_string(),
                    token.to_owned(),
                    rate.to_string(),
                    behaviour.tasks.0.as_millis().to_string(),
                    behaviour.tasks.1.as_millis().to_string(),
                ])
                .stdin(Stdio::piped())
                .stdout(Stdio::piped())
                .spawn()
                .expect("start a simulator shard");
            let stdout = child.stdout.take().expect("its stdout");
            let counters = Arc::new(Seen::default());
            let into = counters.clone();
            std::thread::spawn(move || {
                for line in BufReader::new(stdout).lines() {
                    let Ok(line) = line else { break };
                    let fields: Vec<u64> = line
                        .strip_prefix("SIM ")
                        .map(|rest| rest.split(' ').filter_map(|f| f.parse().ok()).collect())
                        .unwrap_or_default();
                    if let [connects, online, heartbeats, bytes_out, bytes_in, dispatches, resent_dispatches, finished, since_mark, resent, expired] =
                        fields[..]
                    {
                        into.expired_dispatches.store(expired, Ordering::Relaxed);
                        into.registered_since_mark.store(since_mark, Ordering::Relaxed);
                        into.resent_statuses.store(resent, Ordering::Relaxed);
                        into.connects.store(connects, Ordering::Relaxed);
                        into.online.store(online, Ordering::Relaxed);
                        into.heartbeats.store(heartbeats, Ordering::Relaxed);
                        into.bytes.store(bytes_out + bytes_in, Ordering::Relaxed);
                        into.dispatches.store(dispatches, Ordering::Relaxed);
                        into.resent_dispatches.store(resent_dispatches, Ordering::Relaxed);
                        into.finished.store(finished, Ordering::Relaxed);
                    }
                }
            });
            let stdin = Mutex::new(child.stdin.take());
            children.push((child, stdin));
            seen.push(counters);
        }
        Shards {
            children,
            seen,
            mark: Mutex::new(None),
        }
    }

    /// Sends `line` to every shard.
    fn tell(&self, line: &str) {
        for (_, stdin) in &self.children {
            if let Some(stdin) = stdin.lock().unwrap().as_mut() {
                let _ = writeln!(stdin, "{line}");
            }
        }
    }

    fn sum(&self, field: impl Fn(&Seen) -> &AtomicU64) -> u64 {
        self.seen.iter().map(|s| field(s).load(Ordering::Relaxed)).sum()
    }

    /// Connections made, all shards.
    pub fn connects(&self) -> u64 {
        self.sum(|s| &s.connects)
    }

    /// Robots answered Online at least once, all shards.
    pub fn online(&self) -> u64 {
        self.sum(|s| &s.online)
    }

    /// Heartbeats sent, all shards (as of their last report, at most a
    /// second old).
    pub fn heartbeats(&self) -> u64 {
        self.sum(|s| &s.heartbeats)
    }

    /// MQTT payload bytes sent and received, all shards.
    pub fn bytes(&self) -> u64 {
        self.sum(|s| &s.bytes)
    }

    /// Dispatches taken, all shards.
    pub fn dispatches(&self) -> u64 {
        self.sum(|s| &s.dispatches)
    }

    /// Dispatches of an attempt a robot had already taken, refused by its
    /// fence, all shards.
    pub fn resent_dispatches(&self) -> u64 {
        self.sum(|s| &s.resent_dispatches)
    }

    /// Tasks finished, all shards.
    pub fn finished(&self) -> u64 {
        self.sum(|s| &s.finished)
    }

    /// Status updates sent again, all shards.
    pub fn resent_statuses(&self) -> u64 {
        self.sum(|s| &s.resent_statuses)
    }

    /// Robots answered Online at or after `since`, all shards: the first
    /// call with a new `since` tells the shards to count from it, and until
    /// each has read that, it counts as none.
    pub fn registered_since(&self, since: Instant) -> usize {
        let mut mark = self.mark.lock().unwrap();
        if *mark != Some(since) {
            for s in &self.seen {
                s.registered_since_mark.store(0, Ordering::Relaxed);
            }
            self.tell(&format!("mark {}", unix_ms() - since.elapsed().as_millis()));
            *mark = Some(since);
        }
        usize::try_from(self.sum(|s| &s.registered_since_mark)).unwrap_or(usize::MAX)
    }

    /// Every run of an attempt, all shards (each writes its own into a
    /// file; this waits up to a minute for them).
    pub fn runs(&self) -> Vec<Run> {
        let dir = tempfile::tempdir().expect("a directory for the shards' lists");
        let path = |i: usize| dir.path().join(format!("runs-{i}"));
        for (i, (_, stdin)) in self.children.iter().enumerate() {
            if let Some(stdin) = stdin.lock().unwrap().as_mut() {
                let _ = writeln!(stdin, "runs {}", path(i).display());
            }
        }
        let deadline = Instant::now() + Duration::from_secs(60);
        let mut runs = Vec::new();
        for i in 0..self.children.len() {
            let text = loop {
                if let Ok(text) = std::fs::read_to_string(path(i)) {
                    break text;
                }
                assert!(Instant::now() < deadline, "shard {i} did not list its runs");
                std::thread::sleep(Duration::from_millis(100));
            };
            runs.extend(text.lines().map(|line| Run::parse(line).expect("a shard's run")));
        }
        runs
    }

    /// The shards' resident memory, KiB, all together.
    pub fn rss_kib(&self) -> f64 {
        self.children
            .iter()
            .map(|(child, _)| crate::status_kib(&child.id().to_string(), "VmRSS"))
            .sum()
    }

    /// Dispatches refused as come after their deadline, all shards.
    pub fn expired_dispatches(&self) -> u64 {
        self.sum(|s| &s.expired_dispatches)
    }

    /// The shards' process ids.
    pub fn pids(&self) -> Vec<u32> {
        self.children.iter().map(|(child, _)| child.id()).collect()
    }

    /// Makes robots `sim-0` .. `sim-<n-1>` vanish (they are the first shard's).
    pub fn vanish(&self, n: usize) {
        if let Some((_, stdin)) = self.children.first() {
            if let Some(stdin) = stdin.lock().unwrap().as_mut() {
                let _ = writeln!(stdin, "vanish {n}");
            }
        }
    }

    /// Stops every shard and waits for it.
    pub fn stop(self) {
        for (mut child, stdin) in self.children {
            drop(stdin.lock().unwrap().take());
            let _ = child.wait();
        }
    }
}

fn unix_ms() -> u128 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map(|d| d.as_millis())
        .unwrap_or(0)
}

/// Writes `runs` to `path` whole (a file beside it renamed into place), so
/// that a reader never sees part of the list.
fn write_list(path: &Path, runs: &[Run]) {
    let partial = path.with_extension("partial");
    let text: String = runs.iter().map(|r| r.to_line() + "\n").collect();
    if std::fs::write(&partial, text).is_ok() {
        let _ = std::fs::rename(&partial, path);
    }
}

/// The shard's side: `--sim-shard BROKER FIRST COUNT HEARTBEAT_SECS TOKEN
/// CONNECT_RATE TASK_MIN_MS TASK_MAX_MS`.
pub fn shard_main(args: &[String]) {
    let [broker, first, count, heartbeat, token, rate, task_min, task_max, ..] = args else {
        eprintln!("--sim-shard BROKER FIRST COUNT HEARTBEAT_SECS TOKEN CONNECT_RATE TASK_MIN_MS TASK_MAX_MS");
        std::process::exit(2);
    };
    let millis = |s: &str| Duration::from_millis(s.parse().expect("milliseconds"));
    let number = |s: &str| s.parse::<usize>().expect("a number");
    let runtime = tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .build()
        .expect("a runtime");
    runtime.block_on(async {
        let fleet = Fleet::start(SimConfig {
            broker: broker.clone(),
            token: token.clone(),
            robots: number(count),
            first: number(first),
            heartbeat: Duration::from_secs(u64::try_from(number(heartbeat)).unwrap_or(30)),
            connect_rate: u32::try_from(number(rate)).unwrap_or(0),
            task_duration: (millis(task_min), millis(task_max)),
            ..SimConfig::default()
        });
        let (tx, mut rx) = tokio::sync::mpsc::unbounded_channel();
        std::thread::spawn(move || {
            for line in std::io::stdin().lines() {
                let Ok(line) = line else { break };
                if tx.send(line).is_err() {
                    break;
                }
            }
        });
        let mut report = tokio::time::interval(Duration::from_secs(1));
        let mut mark: Option<Instant> = None;
        loop {
            tokio::select! {
                _ = report.tick() => {
                    let c = &fleet.counters;
                    println!(
                        "SIM {} {} {} {} {} {} {} {} {} {} {}",
                        c.connects.load(Ordering::Relaxed),
                        c.online.load(Ordering::Relaxed),
                        c.heartbeats.load(Ordering::Relaxed),
                        c.bytes_out.load(Ordering::Relaxed),
                        c.bytes_in.load(Ordering::Relaxed),
                        c.dispatches.load(Ordering::Relaxed),
                        c.duplicate_dispatches.load(Ordering::Relaxed),
                        c.finished.load(Ordering::Relaxed),
                        mark.map_or(0, |m| fleet.registered_since(m)),
                        c.resent_statuses.load(Ordering::Relaxed),
                        c.expired_dispatches.load(Ordering::Relaxed),
                    );
                }
                line = rx.recv() => match line {
                    Some(line) => {
                        if let Some(n) = line.strip_prefix("vanish ").and_then(|n| n.trim().parse().ok()) {
                            fleet.vanish(n);
                        } else if let Some(ms) = line.strip_prefix("mark ").and_then(|n| n.trim().parse::<u128>().ok()) {
                            let ago = unix_ms().saturating_sub(ms);
                            let ago = Duration::from_millis(u64::try_from(ago).unwrap_or(u64::MAX));
                            mark = Instant::now().checked_sub(ago);
                        } else if let Some(path) = line.strip_prefix("runs ") {
                            write_list(Path::new(path.trim()), &fleet.runs());
                        }
                    }
                    None => break,
                },
            }
        }
        fleet.stop().await;
    });
}
