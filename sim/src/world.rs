//! A deterministic simulation of a whole fleet in one process, on a virtual
//! clock: robots (the agent's protocol core, simulated task processes,
//! restarts that keep the state directory), a server (the bridge's real
//! decisions: `decide_status`, `decide_task`, `plan_reconcile`), two
//! manager replicas with leader election (the real lifecycle:
//! `decide_step`, `plan_dispatch`, `plan_fail`, `plan_retry`) and an
//! in-memory API store
//! with guarded merge patches, wired through the broker state machine of
//! [`crate::broker`]. One seed draws everything (message delays, the fault
//! schedule, task lengths) and gives the same history, byte for byte; the
//! checker in [`check`] reads that history.
//!
//! Why not turmoil or madsim: the programs' I/O layers (rumqttc, kube's
//! client, tokio timers) are not what is simulated here; the decisions
//! are, and they are pure functions of (event, now). A single-threaded
//! event queue over those functions is deterministic without a runtime,
//! a seed costs milliseconds, and nothing hashes in random order (every
//! map is a `BTreeMap`). The I/O shells around the decisions are tested
//! against real processes (`tests/tests/faults.rs`).
//!
//! What stands in for real code still (docs/simulation.md): the agent's
//! supervisor and link, the server's write paths around its decisions,
//! the managers' election (kube-lease-manager's rules) and placement (a
//! robot drawn by the seed).

pub mod agent;
pub mod check;
pub mod cluster;
pub mod history;

use std::collections::BTreeMap;
use std::fmt::Write as _;
use std::time::Duration;

use jiff::Timestamp;

use crate::broker::{self, Broker};
use agent::Agent;
use cluster::Cluster;
use history::{Entry, What};

/// Virtual milliseconds since the simulation began.
pub type Ms = u64;

/// The shape of one run.
#[derive(Clone, Debug)]
pub struct WorldConfig {
    /// Robots in the fleet.
    pub robots: usize,
    /// Tasks created over the fault period.
    pub tasks: usize,
    /// How long faults are injected.
    pub fault_minutes: u64,
    /// How many faults (at least).
    pub faults: usize,
    /// After the last fault, every Task must be over within this.
    pub settle_minutes: u64,
    /// The robots record each accepted attempt before they start it, as
    /// the agent does. Off only to show that the simulation finds what
    /// the record prevents.
    pub record_admissions: bool,
}

impl Default for WorldConfig {
    fn default() -> Self {
        Self {
            robots: 4,
            tasks: 24,
            fault_minutes: 30,
            faults: 24,
            settle_minutes: 15,
            record_admissions: true,
        }
    }
}

/// A fault the seed scheduled.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Fault {
    /// The robot's link is cut for a while (both ways; it reconnects).
    Partition { robot: usize, secs: u64 },
    /// The robot's link is cut right after the broker delivers its next
    /// dispatch, before the PUBACK leaves; the agent restarts then if
    /// `restart` (the Wi-Fi and an upgrade at once).
    CutAtDelivery { robot: usize, restart: bool, secs: u64 },
    /// The agent is SIGKILLed and starts again (its state directory kept).
    AgentRestart { robot: usize, secs: u64 },
    /// Server replica `replica` is SIGKILLed (or, if `at_publish`, the
    /// replica whose next dispatch reached the broker, right after) and
    /// starts again.
    ServerKill {
        replica: usize,
        at_publish: bool,
        secs: u64,
    },
    /// The manager's Lease watch stalls (a relist at scale, a dropped
    /// watch).
    LeaseWatchStall { secs: u64 },
    /// Every API write takes `delay_ms` for a while (an overloaded API).
    SlowApi { secs: u64, delay_ms: u64 },
    /// The broker stops and starts again after `secs`: every connection
    /// drops at once. A `crash` restarts from its last autosave (what came
    /// in the 30 s before is lost, PUBACKed or not); a clean stop saves
    /// everything first.
    BrokerRestart { crash: bool, secs: u64 },
    /// The robot's wall clock steps by `secs` (NTP, a wrong RTC, a person);
    /// its boot clock runs on.
    RobotClockStep { robot: usize, secs: i64 },
    /// A manager's clock is `secs` from the server's for a while (within
    /// `--robot-lost-grace`, the skew docs/fencing.md allows; more than
    /// the leader Lease, so both managers may think they lead).
    ManagerClockSkew {
        manager: usize,
        secs: i64,
        for_secs: u64,
    },
    /// A manager stops for `secs` (SIGSTOP, a long pause, starved of CPU)
    /// and wakes on its old caches, acting once as the leader it was
    /// before its election notices that another took over.
    ManagerPause { manager: usize, secs: u64 },
}

/// Who runs.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord)]
pub enum Node {
    Agent(usize),
    Server(usize),
    Manager(usize),
}

/// A packet from a client to the broker.
#[derive(Clone, Debug)]
pub enum Up {
    Connect {
        clean: bool,
    },
    Subscribe(String),
    Publish {
        message: broker::Message,
        tag: Option<(String, u32)>,
    },
    Ack(u16),
}

/// A packet from the broker to a client.
#[derive(Clone, Debug)]
pub enum Down {
    Broker(broker::Output),
    /// The broker has the tagged publish (its PUBACK).
    PubAck((String, u32)),
}

#[derive(Clone, Debug)]
enum Ev {
    Up {
        node: Node,
        conn: u64,
        packet: Up,
    },
    Down {
        node: Node,
        conn: u64,
        packet: Down,
    },
    Tick(Node),
    Exit {
        robot: usize,
        uid: String,
        attempt: u32,
    },
    ApiDone(u64),
    Fault(usize),
    Heal(Node),
    LinkDown(usize),
    Start(Node),
    CreateTask(usize),
    StallOver,
    SlowOver,
    SkewOver(usize),
    /// The broker writes its persistence file.
    Autosave,
}

/// The network and the clock, shared by every node.
pub struct Net {
    now: Ms,
    seq: u64,
    queue: BTreeMap<(Ms, u64), Ev>,
    rng: fastrand::Rng,
    /// Each client's live connection (0: none).
    conns: BTreeMap<Node, u64>,
    next_conn: u64,
    /// The last delivery time on each client's link, each way (TCP keeps
    /// order).
    last_up: BTreeMap<Node, Ms>,
    last_down: BTreeMap<Node, Ms>,
    /// Clients whose link is down until then.
    cut_until: BTreeMap<Node, Ms>,
    history: Vec<Entry>,
}

impl Net {
    /// The simulation's epoch on the cluster's clock.
    pub fn base() -> Timestamp {
        Timestamp::from_second(1_780_000_000).expect("a valid instant")
    }

    /// Now on the cluster's clock.
    pub fn wall(&self) -> Timestamp {
        Self::wall_at(self.now)
    }

    /// `at` on the cluster's clock.
    pub fn wall_at(at: Ms) -> Timestamp {
        Self::base() + Duration::from_millis(at)
    }

    /// Now, virtual.
    pub fn now(&self) -> Ms {
        self.now
    }

    /// The seed's generator.
    pub fn rng(&mut self) -> &mut fastrand::Rng {
        &mut self.rng
    }

    fn at(&mut self, at: Ms, ev: Ev) {
        self.seq += 1;
        self.queue.insert((at, self.seq), ev);
    }

    fn after(&mut self, ms: Ms, ev: Ev) {
        self.at(self.now + ms, ev);
    }

    /// Records what happened.
    pub fn log(&mut self, what: What) {
        self.history.push(Entry { at: self.now, what });
    }

    /// Whether `node` has a live connection.
    pub fn connected(&self, node: Node) -> bool {
        self.conns.get(&node).is_some_and(|c| *c != 0)
    }

    /// Sends a packet to the broker over `node`'s live connection (lost
    /// when there is none).
    pub fn up(&mut self, node: Node, packet: Up) {
        let Some(&conn) = self.conns.get(&node).filter(|c| **c != 0) else {
            return;
        };
        let at = self.link_time(node, true);
        self.at(at, Ev::Up { node, conn, packet });
    }

    fn down(&mut self, node: Node, packet: Down) {
        let Some(&conn) = self.conns.get(&node).filter(|c| **c != 0) else {
            return;
        };
        let at = self.link_time(node, false);
        self.at(at, Ev::Down { node, conn, packet });
    }

    fn link_time(&mut self, node: Node, up: bool) -> Ms {
        let latency = self.rng.u64(2..60);
        let last = if up {
            &mut self.last_up
        } else {
            &mut self.last_down
        };
        let at = (self.now + latency).max(*last.get(&node).unwrap_or(&0));
        last.insert(node, at);
        at
    }

    /// Opens a new connection for `node` (None while its link is cut) and
    /// sends CONNECT on it.
    pub fn connect(&mut self, node: Node, clean: bool) -> bool {
        if self.cut_until.get(&node).is_some_and(|t| *t > self.now) {
            return false;
        }
        self.next_conn += 1;
        self.conns.insert(node, self.next_conn);
        self.up(node, Up::Connect { clean });
        true
    }

    /// Schedules a timer for `node`.
    pub fn tick(&mut self, node: Node, ms: Ms) {
        self.after(ms, Ev::Tick(node));
    }

    /// A task process of `robot` ends at `at`.
    pub fn exit_at(&mut self, at: Ms, robot: usize, uid: &str, attempt: u32) {
        self.at(
            at,
            Ev::Exit {
                robot,
                uid: uid.to_owned(),
                attempt,
            },
        );
    }

    /// An API write completes after `ms`.
    pub fn api_done(&mut self, ms: Ms, id: u64) {
        self.after(ms, Ev::ApiDone(id));
    }
}

/// What one run found.
#[derive(Debug)]
pub struct Report {
    pub seed: u64,
    pub faults: Vec<Fault>,
    pub violations: Vec<check::Violation>,
    pub history: Vec<Entry>,
    /// Virtual time simulated.
    pub virtual_ms: Ms,
    /// Task processes started.
    pub starts: usize,
}

impl Report {
    /// The history of what a violation concerns (its Task), one line per
    /// entry, with the faults of the run first.
    pub fn story(&self, violation: &check::Violation) -> String {
        let mut out = String::new();
        let _ = writeln!(out, "seed {}: {violation}", self.seed);
        for fault in &self.faults {
            let _ = writeln!(out, "  fault {fault:?}");
        }
        for entry in self.history.iter().filter(|e| e.concerns(&violation.task)) {
            let _ = writeln!(out, "  {entry}");
        }
        out
    }
}

/// Mosquitto's `autosave_interval` in deploy/mosquitto/mosquitto.conf.
const AUTOSAVE: Ms = 30_000;

/// The world: the broker, the nodes, the clock.
struct World {
    net: Net,
    broker: Broker,
    /// The broker's persistence file: its state at the last autosave.
    saved: Broker,
    agents: Vec<Agent>,
    cluster: Cluster,
    faults: Vec<Fault>,
    /// A cut armed for a robot's next dispatch: restart after, for how long.
    armed_cuts: BTreeMap<usize, (bool, u64)>,
    /// A server kill armed for its next dispatch publish.
    armed_kill: Option<u64>,
}

/// Draws the fault schedule of a seed.
fn schedule(rng: &mut fastrand::Rng, config: &WorldConfig) -> Vec<(Ms, Fault)> {
    let span = config.fault_minutes * 60_000;
    let mut out: Vec<(Ms, Fault)> = (0..config.faults)
        .map(|_| {
            let at = rng.u64(30_000..span.max(30_001));
            let robot = rng.usize(0..config.robots);
            let manager = rng.usize(0..2);
            let fault = match rng.u32(0..16) {
                0..=2 => Fault::Partition {
                    robot,
                    secs: rng.u64(5..150),
                },
                3..=4 => Fault::CutAtDelivery {
                    robot,
                    restart: rng.bool(),
                    secs: rng.u64(1..40),
                },
                5..=6 => Fault::AgentRestart {
                    robot,
                    secs: rng.u64(1..30),
                },
                7..=8 => Fault::ServerKill {
                    replica: rng.usize(0..2),
                    at_publish: rng.bool(),
                    secs: rng.u64(1..15),
                },
                9 => Fault::LeaseWatchStall {
                    secs: rng.u64(30..300),
                },
                10 => Fault::BrokerRestart {
                    crash: rng.bool(),
                    secs: rng.u64(1..60),
                },
                11 => Fault::RobotClockStep {
                    robot,
                    secs: rng.i64(-7_200..7_200),
                },
                12 => Fault::ManagerClockSkew {
                    manager,
                    secs: rng.i64(-20..20),
                    for_secs: rng.u64(30..600),
                },
                13 => Fault::ManagerPause {
                    manager,
                    secs: rng.u64(5..120),
                },
                _ => Fault::SlowApi {
                    secs: rng.u64(20..180),
                    delay_ms: rng.u64(500..8_000),
                },
            };
            (at, fault)
        })
        .collect();
    out.sort_by_key(|(at, _)| *at);
    out
}

/// Runs one seed.
pub fn run(seed: u64, config: &WorldConfig) -> Report {
    run_with(seed, config, None)
}

/// Runs one seed with only the faults whose indexes `keep` lists (for
/// shrinking a failing history).
pub fn run_with(seed: u64, config: &WorldConfig, keep: Option<&[usize]>) -> Report {
    let mut rng = fastrand::Rng::with_seed(seed);
    let planned = schedule(&mut rng, config);
    let planned: Vec<(Ms, Fault)> = match keep {
        Some(keep) => planned
            .into_iter()
            .enumerate()
            .filter(|(i, _)| keep.contains(i))
            .map(|(_, f)| f)
            .collect(),
        None => planned,
    };
    let mut world = World {
        net: Net {
            now: 0,
            seq: 0,
            queue: BTreeMap::new(),
            rng,
            conns: BTreeMap::new(),
            next_conn: 0,
            last_up: BTreeMap::new(),
            last_down: BTreeMap::new(),
            cut_until: BTreeMap::new(),
            history: Vec::new(),
        },
        broker: Broker::default(),
        saved: Broker::default(),
        agents: Vec::new(),
        cluster: Cluster::new(config.robots),
        faults: planned.iter().map(|(_, f)| f.clone()).collect(),
        armed_cuts: BTreeMap::new(),
        armed_kill: None,
    };
    for robot in 0..config.robots {
        let boot = world.net.rng.u64(0..3_600_000);
        world
            .agents
            .push(Agent::new(robot, boot, config.record_admissions));
        world.net.at(0, Ev::Start(Node::Agent(robot)));
    }
    world.net.at(0, Ev::Start(Node::Server(0)));
    world.net.at(200, Ev::Start(Node::Server(1)));
    world.net.at(AUTOSAVE, Ev::Autosave);
    world.net.at(0, Ev::Tick(Node::Manager(0)));
    world.net.at(500, Ev::Tick(Node::Manager(1)));
    let span = config.fault_minutes * 60_000;
    for task in 0..config.tasks {
        let at = (span / config.tasks.max(1) as u64) * task as u64;
        world.net.at(at, Ev::CreateTask(task));
    }
    let mut last_fault = 0;
    for (i, (at, _)) in planned.iter().enumerate() {
        world.net.at(*at, Ev::Fault(i));
        last_fault = last_fault.max(*at);
    }
    let end = last_fault.max(span) + config.settle_minutes * 60_000;
    while let Some(((at, _), ev)) = world.net.queue.pop_first() {
        if at > end {
            break;
        }
        world.net.now = at;
        world.handle(ev);
    }
    world.net.now = end;
    let violations = check::check(&world.net.history, &world.cluster, end);
    let starts = world
        .net
        .history
        .iter()
        .filter(|e| matches!(e.what, What::Start { .. }))
        .count();
    Report {
        seed,
        faults: world.faults,
        violations,
        history: world.net.history,
        virtual_ms: end,
        starts,
    }
}

/// Runs a failing seed again with fewer faults while it still breaks the
/// rule `kind`: the shortest history that shows the violation.
pub fn shrink(seed: u64, config: &WorldConfig, report: &Report, kind: check::Kind) -> Report {
    let mut keep: Vec<usize> = (0..report.faults.len()).collect();
    let mut best = None;
    let mut i = 0;
    while i < keep.len() {
        let mut fewer = keep.clone();
        fewer.remove(i);
        let again = run_with(seed, config, Some(&fewer));
        if again.violations.iter().any(|v| v.kind == kind) {
            keep = fewer;
            best = Some(again);
        } else {
            i += 1;
        }
    }
    best.unwrap_or_else(|| run_with(seed, config, Some(&keep)))
}

impl World {
    fn handle(&mut self, ev: Ev) {
        match ev {
            Ev::Up { node, conn, packet } => {
                if self.net.conns.get(&node) != Some(&conn) {
                    return;
                }
                self.at_broker(node, packet);
            }
            Ev::Down { node, conn, packet } => {
                if self.net.conns.get(&node) != Some(&conn) {
                    return;
                }
                match node {
                    Node::Agent(i) => {
                        let dispatch = matches!(&packet, Down::Broker(broker::Output::Deliver { message, .. }) if message.topic.ends_with("/tasks/dispatch"));
                        // An armed cut falls between the delivery and its
                        // PUBACK.
                        let cut = dispatch.then(|| self.armed_cuts.remove(&i)).flatten();
                        match cut {
                            Some((restart, secs)) => {
                                self.agents[i].receive(&mut self.net, packet, false);
                                self.cut(Node::Agent(i), secs * 1000);
                                if restart {
                                    self.restart_agent(i, secs * 1000);
                                }
                            }
                            None => self.agents[i].receive(&mut self.net, packet, true),
                        }
                    }
                    Node::Server(r) => {
                        let killed =
                            self.cluster
                                .server_receive(&mut self.net, r, packet, &mut self.armed_kill);
                        if let Some(secs) = killed {
                            self.kill_server(r, secs);
                        }
                    }
                    Node::Manager(_) => {}
                }
            }
            Ev::Tick(Node::Agent(i)) => self.agents[i].tick(&mut self.net),
            Ev::Tick(Node::Server(r)) => self.cluster.server_tick(&mut self.net, r),
            Ev::Tick(Node::Manager(m)) => self.cluster.manager_tick(&mut self.net, m),
            Ev::Exit { robot, uid, attempt } => self.agents[robot].exit(&mut self.net, &uid, attempt),
            Ev::ApiDone(id) => self.cluster.api_done(&mut self.net, id),
            Ev::Fault(i) => self.fault(i),
            Ev::Heal(node) => {
                // A longer cut of the same link may still hold.
                if self.net.cut_until.get(&node).is_some_and(|t| *t <= self.net.now) {
                    self.net.cut_until.remove(&node);
                }
            }
            Ev::LinkDown(i) => self.agents[i].link_down(&mut self.net),
            Ev::Start(Node::Agent(i)) => self.agents[i].start(&mut self.net),
            Ev::Start(Node::Server(r)) => self.cluster.server_start(&mut self.net, r),
            Ev::Start(Node::Manager(_)) => {}
            Ev::CreateTask(n) => self.cluster.create_task(&mut self.net, n),
            Ev::StallOver => self.cluster.stall_lease_watch(false),
            Ev::SlowOver => self.cluster.slow_api(0),
            Ev::SkewOver(m) => self.cluster.skew_manager_clock(m, 0),
            Ev::Autosave => {
                self.saved = self.broker.clone();
                self.net.after(AUTOSAVE, Ev::Autosave);
            }
        }
    }

    fn at_broker(&mut self, node: Node, packet: Up) {
        let client = client_id(node);
        let (input, tag) = match packet {
            Up::Connect { clean } => (
                broker::Input::Connect {
                    client: client.clone(),
                    clean_session: clean,
                    will: None,
                },
                None,
            ),
            Up::Subscribe(filter) => (
                broker::Input::Subscribe {
                    client: client.clone(),
                    filter,
                    qos: 1,
                },
                None,
            ),
            Up::Publish { message, tag } => (
                broker::Input::Publish {
                    client: client.clone(),
                    message,
                },
                tag,
            ),
            Up::Ack(packet_id) => (
                broker::Input::Ack {
                    client: client.clone(),
                    packet_id,
                },
                None,
            ),
        };
        for out in self.broker.handle(input) {
            let to = match &out {
                broker::Output::ConnAck { client, .. }
                | broker::Output::Deliver { client, .. }
                | broker::Output::Closed { client } => node_of(client),
            };
            if let Some(to) = to {
                self.net.down(to, Down::Broker(out));
            }
        }
        if let Some(tag) = tag {
            self.net.down(node, Down::PubAck(tag));
        }
    }

    /// Cuts `node`'s link for `ms`: the broker sees the connection end
    /// without a DISCONNECT, packets on the way are lost, and the client
    /// notices some seconds later (its keep-alive).
    fn cut(&mut self, node: Node, ms: Ms) {
        self.drop_connection(node);
        self.cut_until(node, ms);
        if let Node::Agent(i) = node {
            let notice = self.net.rng.u64(0..15_000);
            self.net.after(notice, Ev::LinkDown(i));
        }
    }

    /// `node` cannot connect for `ms` (or longer, if it already could not).
    fn cut_until(&mut self, node: Node, ms: Ms) {
        let until = self.net.now + ms;
        let until = until.max(self.net.cut_until.get(&node).copied().unwrap_or(0));
        self.net.cut_until.insert(node, until);
        self.net.after(until - self.net.now, Ev::Heal(node));
    }

    fn drop_connection(&mut self, node: Node) {
        if self.net.conns.insert(node, 0).is_some_and(|c| c != 0) {
            let outs = self.broker.handle(broker::Input::Disconnect {
                client: client_id(node),
                graceful: false,
            });
            debug_assert!(outs.iter().all(|o| !matches!(o, broker::Output::Deliver { .. })));
        }
    }

    fn restart_agent(&mut self, i: usize, ms: Ms) {
        self.drop_connection(Node::Agent(i));
        self.agents[i].kill(&mut self.net);
        self.net.after(ms, Ev::Start(Node::Agent(i)));
    }

    /// The broker stops for `ms` and starts from its persistence file
    /// (`crash`: the last autosave; else saved as it stops). Every client
    /// sees its connection end at once (the socket closes) and cannot
    /// connect again until the broker is back.
    fn restart_broker(&mut self, crash: bool, ms: Ms) {
        let saved = if crash { &self.saved } else { &self.broker };
        self.broker = Broker::restarted(saved);
        self.saved = self.broker.clone();
        let nodes: Vec<Node> = self.net.conns.keys().copied().collect();
        for node in nodes {
            self.net.conns.insert(node, 0);
            self.cut_until(node, ms);
            if let Node::Agent(i) = node {
                let notice = self.net.rng.u64(0..1_000);
                self.net.after(notice, Ev::LinkDown(i));
            }
        }
    }

    fn kill_server(&mut self, replica: usize, secs: u64) {
        self.drop_connection(Node::Server(replica));
        self.cluster.server_kill(&mut self.net, replica);
        self.net.after(secs * 1000, Ev::Start(Node::Server(replica)));
    }

    fn fault(&mut self, i: usize) {
        let fault = self.faults[i].clone();
        self.net.log(What::Fault(fault.clone()));
        match fault {
            Fault::Partition { robot, secs } => self.cut(Node::Agent(robot), secs * 1000),
            Fault::CutAtDelivery { robot, restart, secs } => {
                self.armed_cuts.insert(robot, (restart, secs));
            }
            Fault::AgentRestart { robot, secs } => self.restart_agent(robot, secs * 1000),
            Fault::ServerKill {
                at_publish: true,
                secs,
                ..
            } => self.armed_kill = Some(secs),
            Fault::ServerKill {
                replica,
                at_publish: false,
                secs,
            } => self.kill_server(replica, secs),
            Fault::LeaseWatchStall { secs } => {
                self.cluster.stall_lease_watch(true);
                self.net.after(secs * 1000, Ev::StallOver);
            }
            Fault::SlowApi { secs, delay_ms } => {
                self.cluster.slow_api(delay_ms);
                self.net.after(secs * 1000, Ev::SlowOver);
            }
            Fault::BrokerRestart { crash, secs } => self.restart_broker(crash, secs * 1000),
            Fault::RobotClockStep { robot, secs } => self.agents[robot].step_clock(secs * 1000),
            Fault::ManagerClockSkew {
                manager,
                secs,
                for_secs,
            } => {
                self.cluster.skew_manager_clock(manager, secs * 1000);
                self.net.after(for_secs * 1000, Ev::SkewOver(manager));
            }
            Fault::ManagerPause { manager, secs } => {
                self.cluster.pause_manager(&self.net, manager, secs * 1000)
            }
        }
    }
}

/// The topic prefix of the simulation.
pub const PREFIX: &str = "k8s4r";

/// A robot's id.
pub fn robot_name(i: usize) -> String {
    format!("rb{i}")
}

/// The MQTT client id of a node.
pub fn client_id(node: Node) -> String {
    match node {
        Node::Agent(i) => robot_name(i),
        Node::Server(r) => format!("server-{r}"),
        Node::Manager(m) => format!("manager-{m}"),
    }
}

fn node_of(client: &str) -> Option<Node> {
    if let Some(r) = client.strip_prefix("server-") {
        return r.parse().ok().map(Node::Server);
    }
    client.strip_prefix("rb")?.parse().ok().map(Node::Agent)
}

#[cfg(test)]
mod tests;
