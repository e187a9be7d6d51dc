//! The simulated cluster: an API store with guarded merge patches and
//! writes that take time, a server that bridges MQTT to it through the
//! server's own decisions, and a manager that runs the real lifecycle over
//! a Lease cache that can go stale.

use std::collections::{BTreeMap, BTreeSet};
use std::time::Duration;

use jiff::Timestamp;
use k8s4r_api::protocol::{
    decode, encode, Cancel, Dispatch, Heartbeat, Register, RegisterResponse, StatusAck, StatusUpdate,
    TopicKind, Topics,
};
use k8s4r_api::{
    DisconnectPolicy, DurationString, Reconcile, RobotPhase, Task, TaskSpec, TaskState, TaskTemplate,
};
use k8s4r_manager::controllers::task::{
    decide_step, plan_dispatch, plan_fail, plan_retry, plan_return, replaces_a_silent_robots_attempt,
};
use k8s4r_manager::lifecycle::{record_lag, LifecycleConfig, RobotHealth, Step};
use k8s4r_server::decide::{decide_status, decide_task, plan_reconcile, Holding, StatusDecision, TaskAction};
use serde_json::{json, Value};

use super::history::What;
use super::{robot_name, Down, Ms, Net, Node, Up, PREFIX};
use crate::broker::{Message, Output};

/// How long an API write takes normally.
const WRITE_MS: std::ops::Range<Ms> = 2..40;
/// The robots' Lease duration while they hold work (the record lag the
/// manager allows is a third of it).
const LEASE_SECONDS: u64 = 60;
const SERVER_TICK: Ms = 500;
const MANAGER_TICK: Ms = 1_000;

enum Then {
    AckStatus {
        robot: String,
        update: Box<StatusUpdate>,
    },
    AckHeartbeat {
        robot: String,
        seq: u64,
        session: Option<String>,
    },
    Publish {
        uid: String,
        attempt: u32,
    },
    Failed {
        uid: String,
        attempt: u32,
        reason: k8s4r_api::TaskReason,
    },
    Placed {
        uid: String,
        attempt: u32,
        robot: usize,
    },
    /// The manager's write about this Task is done.
    Done {
        uid: String,
    },
    /// A write to the leader Lease is done.
    Lead,
}

enum Op {
    Patch {
        uid: String,
        guard: Option<String>,
        patch: Value,
    },
    Renew {
        robot: String,
    },
    /// A replica takes or renews its kind's leader Lease (`MANAGERS`,
    /// `SERVERS`), guarded by the version of it that it read.
    Lead {
        kind: usize,
        who: usize,
        seen: u64,
        renew: Timestamp,
    },
}

struct Pending {
    op: Op,
    /// The server replica and process that wrote it (None: a manager).
    server: Option<(usize, u64)>,
    /// The manager that wrote it.
    manager: usize,
    then: Then,
}

/// The leader Leases: the managers' and the servers'.
const MANAGERS: usize = 0;
const SERVERS: usize = 1;

/// A leader Lease, as the API store has it.
#[derive(Clone, Copy, Debug)]
struct LeaderLease {
    holder: usize,
    /// On the holder's clock, as kube-lease-manager writes it.
    renew: Timestamp,
    version: u64,
}

/// The leader Lease's duration and how long before its end the holder
/// renews it (the manager's defaults, `LeaderConfig`).
const LEADER_LEASE: Duration = Duration::from_secs(15);
const LEADER_GRACE: Duration = Duration::from_secs(5);

/// What a replica believes of its leadership.
#[derive(Default)]
struct Election {
    /// It leads until then, on its clock (its last renewal that landed,
    /// plus the Lease's duration); None: it follows.
    leads_until: Option<Timestamp>,
    /// A write to the leader Lease in flight.
    campaigning: bool,
}

impl Election {
    /// Whether it leads at `now` (`anyway`: as it did, whatever the time).
    fn leads(&self, now: Timestamp, anyway: bool) -> bool {
        self.leads_until.is_some_and(|until| anyway || now < until)
    }
}

/// One manager replica: its caches, its clock, its writes in flight and
/// what it believes of its leadership.
#[derive(Default)]
struct ManagerMem {
    /// While it is paused, the Tasks as its cache held them when it
    /// stopped; None: its cache keeps up with the store, which is read.
    paused_tasks: Option<BTreeMap<String, Task>>,
    /// The robots' Leases as its watch last delivered them.
    leases: BTreeMap<String, Timestamp>,
    /// Tasks with a write of its in flight.
    busy: BTreeSet<String>,
    /// Its clock against the server's, in ms.
    skew: i64,
    election: Election,
    /// Stopped (SIGSTOP, a long GC pause, starved of CPU) until then.
    paused_until: Option<Ms>,
}

struct ServerMem {
    generation: u64,
    /// Dispatches this process published or is publishing.
    sending: BTreeSet<(String, u32)>,
    /// Dispatches published whose PUBACK has not come: published again on
    /// the next connection (the server's publish fails with its
    /// connection, and the reconcile sends it again).
    unacked: BTreeSet<(String, u32)>,
    /// Only the leader dispatches.
    election: Election,
    tick_at: Ms,
}

/// The API store, the server and the manager.
pub struct Cluster {
    topics: Topics,
    robots: usize,
    tasks: BTreeMap<String, Task>,
    version: u64,
    leases: BTreeMap<String, Timestamp>,
    registered: BTreeMap<String, Timestamp>,
    pending: BTreeMap<u64, Pending>,
    next_write: u64,
    /// Extra time every write takes (an overloaded API), 0 normally.
    slow: Ms,
    servers: [Option<ServerMem>; 2],
    generations: u64,
    /// The manager replicas.
    managers: [ManagerMem; 2],
    /// The leader Leases, by kind.
    leaders: [Option<LeaderLease>; 2],
    /// The managers' Lease watches are stalled.
    stalled: bool,
    lifecycle: LifecycleConfig,
}

impl Cluster {
    /// A cluster for `robots` robots, with no Tasks yet.
    pub fn new(robots: usize) -> Self {
        Self {
            topics: Topics::new(PREFIX),
            robots,
            tasks: BTreeMap::new(),
            version: 0,
            leases: BTreeMap::new(),
            registered: BTreeMap::new(),
            pending: BTreeMap::new(),
            next_write: 0,
            slow: 0,
            servers: [None, None],
            generations: 0,
            managers: Default::default(),
            leaders: [None, None],
            stalled: false,
            lifecycle: LifecycleConfig {
                // The simulated server renews a Lease every third of it.
                lease_interval: Duration::from_secs(LEASE_SECONDS / 3),
                ..LifecycleConfig::default()
            },
        }
    }

    /// The Tasks, by uid.
    pub fn tasks(&self) -> &BTreeMap<String, Task> {
        &self.tasks
    }

    /// One Task.
    pub fn task(&self, uid: &str) -> Option<&Task> {
        self.tasks.get(uid)
    }

    /// Whether the manager is done with a Task.
    pub fn settled(&self, task: &Task) -> bool {
        let health = RobotHealth::Known {
            last_heard: None,
            record_lag: Duration::ZERO,
        };
        let state = task.status.as_ref().and_then(|s| s.state);
        state.is_some_and(TaskState::is_terminal)
            && decide_step(task, health, Timestamp::UNIX_EPOCH, &self.lifecycle) == Step::Done
    }

    /// Freezes (or thaws) the manager's Lease cache.
    pub fn stall_lease_watch(&mut self, stalled: bool) {
        self.stalled = stalled;
    }

    /// Sets the manager's clock `ms` from the server's (NTP stepping one
    /// of them; 0: in step again).
    pub fn skew_manager_clock(&mut self, manager: usize, ms: i64) {
        self.managers[manager].skew = ms;
    }

    /// Manager `manager` stops for `ms` (its writes in flight land
    /// meanwhile); it wakes on its old caches.
    pub fn pause_manager(&mut self, net: &Net, manager: usize, ms: Ms) {
        let m = &mut self.managers[manager];
        m.paused_until = Some(net.now() + ms);
        if m.paused_tasks.is_none() {
            m.paused_tasks = Some(self.tasks.clone());
        }
    }

    /// Every API write takes `ms` more (0: back to normal).
    pub fn slow_api(&mut self, ms: Ms) {
        self.slow = ms;
    }

    /// Task number `n` is created (a batch task, fenced, its reconcile
    /// policy drawn).
    pub fn create_task(&mut self, net: &mut Net, n: usize) {
        let uid = format!("u{n}");
        let stop_after = Duration::from_secs(net.rng().u64(20..60));
        let reconcile = if net.rng().bool() {
            Reconcile::KeepOriginal
        } else {
            Reconcile::KeepReplacement
        };
        let mut task = Task::new(
            &format!("t{n}"),
            TaskSpec {
                template: TaskTemplate {
                    driver: "raw_exec".to_owned(),
                    command: "/bin/true".to_owned(),
                    ..TaskTemplate::default()
                },
                disconnect: Some(DisconnectPolicy {
                    stop_after: Some(DurationString::from(stop_after)),
                    replace: Some(true),
                    reconcile: Some(reconcile),
                }),
                ..TaskSpec::default()
            },
        );
        task.metadata.namespace = Some("default".to_owned());
        task.metadata.uid = Some(uid.clone());
        self.version += 1;
        task.metadata.resource_version = Some(self.version.to_string());
        self.tasks.insert(uid, task);
    }

    /// A write by server replica `replica` (its current process).
    fn write(&mut self, net: &mut Net, replica: usize, op: Op, then: Then) {
        let server = self.servers[replica].as_ref().map(|s| (replica, s.generation));
        self.enqueue(net, op, server, 0, then);
    }

    fn write_as(&mut self, net: &mut Net, op: Op, manager: usize, then: Then) {
        self.enqueue(net, op, None, manager, then);
    }

    fn enqueue(&mut self, net: &mut Net, op: Op, server: Option<(usize, u64)>, manager: usize, then: Then) {
        self.next_write += 1;
        let id = self.next_write;
        self.pending.insert(
            id,
            Pending {
                op,
                server,
                manager,
                then,
            },
        );
        let ms = net.rng().u64(WRITE_MS) + self.slow;
        net.api_done(ms, id);
    }

    /// An API write completes: applied (or refused for its guard), then
    /// its writer carries on, if it still runs.
    pub fn api_done(&mut self, net: &mut Net, id: u64) {
        let Some(pending) = self.pending.remove(&id) else {
            return;
        };
        let applied = match pending.op {
            Op::Patch { uid, guard, patch } => self.apply(&uid, guard.as_deref(), &patch),
            Op::Renew { robot } => {
                self.leases.insert(robot, net.wall());
                true
            }
            Op::Lead {
                kind,
                who,
                seen,
                renew,
            } => self.lead(net, kind, who, seen, renew),
        };
        let alive = match pending.server {
            Some((replica, generation)) => self.servers[replica]
                .as_ref()
                .is_some_and(|s| s.generation == generation),
            None => true,
        };
        let replica = pending.server.map_or(0, |(r, _)| r);
        match pending.then {
            Then::Done { uid } => {
                self.managers[pending.manager].busy.remove(&uid);
            }
            Then::Failed { uid, attempt, reason } => {
                if pending.server.is_none() {
                    self.managers[pending.manager].busy.remove(&uid);
                }
                if applied {
                    net.log(What::Failed { uid, attempt, reason });
                }
            }
            Then::Placed { uid, attempt, robot } => {
                self.managers[pending.manager].busy.remove(&uid);
                if applied {
                    net.log(What::Placed { uid, attempt, robot });
                }
            }
            Then::AckStatus { robot, update } if alive => {
                if applied {
                    net.log(What::Status {
                        uid: update.task_uid.clone(),
                        attempt: update.attempt,
                        state: update.state,
                        outcome: "applied",
                    });
                    self.ack(net, replica, &robot, StatusAck::new(vec![update.seq]));
                } else {
                    // A conflict: read again and decide again.
                    self.on_status(net, replica, &robot, *update);
                }
            }
            Then::AckHeartbeat { robot, seq, session } if alive => {
                let ack = StatusAck::heartbeat(seq, session, net.wall());
                self.ack(net, replica, &robot, ack);
            }
            Then::Publish { uid, attempt } if alive => {
                if applied {
                    self.publish_dispatch(net, replica, &uid, attempt);
                } else if let Some(server) = &mut self.servers[replica] {
                    server.sending.remove(&(uid, attempt));
                }
            }
            _ => {}
        }
    }

    fn apply(&mut self, uid: &str, guard: Option<&str>, patch: &Value) -> bool {
        let Some(task) = self.tasks.get(uid) else {
            return false;
        };
        if guard.is_some_and(|g| task.metadata.resource_version.as_deref() != Some(g)) {
            return false;
        }
        let mut value = serde_json::to_value(task).expect("a Task serializes");
        json_patch::merge(&mut value, patch);
        let mut task: Task = serde_json::from_value(value).expect("a merged Task reads back");
        self.version += 1;
        task.metadata.resource_version = Some(self.version.to_string());
        self.tasks.insert(uid.to_owned(), task);
        true
    }

    // ------------------------------------------------------------ server

    /// Server replica `replica`'s process starts.
    pub fn server_start(&mut self, net: &mut Net, replica: usize) {
        self.generations += 1;
        net.log(What::Server { replica, up: true });
        self.servers[replica] = Some(ServerMem {
            generation: self.generations,
            sending: BTreeSet::new(),
            unacked: BTreeSet::new(),
            election: Election::default(),
            tick_at: net.now(),
        });
        net.connect(Node::Server(replica), false);
        self.server_tick(net, replica);
    }

    /// Server replica `replica` is SIGKILLed.
    pub fn server_kill(&mut self, net: &mut Net, replica: usize) {
        if self.servers[replica].take().is_some() {
            net.log(What::Server { replica, up: false });
        }
    }

    /// A packet for server replica `replica`; returns the seconds it stays
    /// down when an armed kill takes it now.
    pub fn server_receive(
        &mut self,
        net: &mut Net,
        replica: usize,
        packet: Down,
        armed: &mut Option<u64>,
    ) -> Option<u64> {
        let node = Node::Server(replica);
        let server = self.servers[replica].as_mut()?;
        match packet {
            Down::Broker(Output::ConnAck { .. }) => {
                // The replicas share the robots' messages, as
                // `--shared-group` makes them (src/lib.rs `subscriptions`).
                for filter in self.topics.server_subscriptions() {
                    net.up(node, Up::Subscribe(format!("$share/servers/{filter}")));
                }
                for (uid, attempt) in std::mem::take(&mut server.unacked) {
                    self.publish_dispatch(net, replica, &uid, attempt);
                }
            }
            Down::Broker(Output::Deliver {
                packet_id, message, ..
            }) => {
                if message.qos == 1 {
                    net.up(node, Up::Ack(packet_id));
                }
                self.on_message(net, replica, &message);
            }
            // The server keeps the broker's PUBACK in memory only (what it
            // sent this generation, `sending`); an armed kill takes it here,
            // after the broker took the dispatch.
            Down::PubAck(tag) => {
                server.unacked.remove(&tag);
                if let Some(secs) = armed.take() {
                    return Some(secs);
                }
            }
            Down::Broker(Output::Closed { .. }) => {}
        }
        None
    }

    /// Server replica `replica`'s timer: it campaigns for the servers'
    /// leader Lease and, leading, dispatches what waits to be sent.
    pub fn server_tick(&mut self, net: &mut Net, replica: usize) {
        let now = net.wall();
        let node = Node::Server(replica);
        let Some(server) = &mut self.servers[replica] else {
            return;
        };
        if server.tick_at != net.now() {
            return;
        }
        server.tick_at = net.now() + SERVER_TICK;
        net.tick(node, SERVER_TICK);
        if !net.connected(node) {
            net.connect(node, false);
            return;
        }
        let leads = server.election.leads(now, false);
        self.campaign(net, SERVERS, replica, now);
        if !leads {
            return;
        }
        let Some(server) = &mut self.servers[replica] else {
            return;
        };
        let mut sends = Vec::new();
        let mut again = Vec::new();
        for (uid, task) in &self.tasks {
            if let TaskAction::Dispatch { attempt, .. } =
                decide_task(task, Some(RobotPhase::Online), None, now)
            {
                if server.sending.insert((uid.clone(), attempt)) {
                    // Recorded as being sent by an earlier generation: sent
                    // again without a write, as the server does.
                    match k8s4r_server::decide::sent_attempt(task) >= attempt {
                        true => again.push((uid.clone(), attempt)),
                        false => sends.push((uid.clone(), attempt, task.metadata.resource_version.clone())),
                    }
                }
            }
        }
        for (uid, attempt) in again {
            self.publish_dispatch(net, replica, &uid, attempt);
        }
        for (uid, attempt, guard) in sends {
            let patch = json!({"metadata": {"annotations": {
                k8s4r_api::names::ANNOTATION_SENDING_ATTEMPT: attempt.to_string()
            }}});
            let then = Then::Publish {
                uid: uid.clone(),
                attempt,
            };
            self.write(net, replica, Op::Patch { uid, guard, patch }, then);
        }
    }

    fn publish_dispatch(&mut self, net: &mut Net, replica: usize, uid: &str, attempt: u32) {
        let Some(task) = self.tasks.get(uid) else {
            return;
        };
        let status = task.status.clone().unwrap_or_default();
        let Some(robot) = task.spec.target_robot.clone() else {
            return;
        };
        if status.attempt != attempt || status.state != Some(TaskState::Dispatching) {
            return;
        }
        let name = format!("default/{}", task.metadata.name.as_deref().unwrap_or_default());
        let mut dispatch = Dispatch::new(uid, name, attempt, task.spec.template.clone());
        dispatch.expires_at = status.dispatch_deadline;
        dispatch.stop_after = task.spec.disconnect.as_ref().and_then(|d| d.stop_after.clone());
        let message = Message {
            topic: self.topics.dispatch(&robot),
            payload: encode(&dispatch),
            qos: 1,
            retain: false,
        };
        if let Some(server) = &mut self.servers[replica] {
            server.unacked.insert((uid.to_owned(), attempt));
        }
        net.up(
            Node::Server(replica),
            Up::Publish {
                message,
                tag: Some((uid.to_owned(), attempt)),
            },
        );
    }

    fn send(&self, net: &mut Net, replica: usize, topic: String, payload: Vec<u8>) {
        let message = Message {
            topic,
            payload,
            qos: 1,
            retain: false,
        };
        net.up(Node::Server(replica), Up::Publish { message, tag: None });
    }

    fn ack(&self, net: &mut Net, replica: usize, robot: &str, ack: StatusAck) {
        self.send(net, replica, self.topics.status_ack(robot), encode(&ack));
    }

    fn on_message(&mut self, net: &mut Net, replica: usize, message: &Message) {
        let Ok(k8s4r_api::protocol::Topic::Robot { robot_id, kind }) = self.topics.parse(&message.topic)
        else {
            return;
        };
        match kind {
            TopicKind::Register => {
                let Ok(register) = decode::<Register>(&message.payload) else {
                    return;
                };
                self.registered.insert(robot_id.clone(), net.wall());
                let mut response = RegisterResponse::new(RobotPhase::Online, None);
                response.nonce = register.nonce;
                response.status_acks = true;
                response.server_time = Some(net.wall());
                self.send(net, replica, self.topics.response(&robot_id), encode(&response));
            }
            TopicKind::Heartbeat => {
                let Ok(heartbeat) = decode::<Heartbeat>(&message.payload) else {
                    return;
                };
                self.on_heartbeat(net, replica, &robot_id, heartbeat);
            }
            TopicKind::Status { task_uid } => {
                let Ok(update) = decode::<StatusUpdate>(&message.payload) else {
                    return;
                };
                if update.task_uid == task_uid {
                    self.on_status(net, replica, &robot_id, update);
                }
            }
            _ => {}
        }
    }

    fn on_heartbeat(&mut self, net: &mut Net, replica: usize, robot: &str, heartbeat: Heartbeat) {
        let now = net.wall();
        let holding = Holding {
            held: &heartbeat.held.running,
            complete: heartbeat.held.reconcile,
            last_seq: heartbeat.held.last_seq,
            sent_at: heartbeat.server_time,
        };
        let tasks = &self.tasks;
        let lookup = |uid: &str| tasks.get(uid).cloned().map(std::sync::Arc::new);
        let assigned = tasks
            .values()
            .filter(|t| t.spec.target_robot.as_deref() == Some(robot));
        let plan = plan_reconcile(robot, holding, lookup, assigned, now);
        for (attempt, stop) in plan.cancel {
            let cancel = Cancel::new(&attempt.uid, attempt.attempt, stop.reason);
            self.send(net, replica, self.topics.cancel(robot), encode(&cancel));
        }
        for (uid, patch) in plan.lost {
            let task = self.tasks.get(&uid);
            let guard = task.and_then(|t| t.metadata.resource_version.clone());
            let then = Then::Failed {
                uid: uid.clone(),
                attempt: task.and_then(|t| t.status.as_ref()).map_or(0, |s| s.attempt),
                reason: patch.reason.unwrap_or(k8s4r_api::TaskReason::NotOnRobot),
            };
            let patch = json!({ "status": patch });
            self.write(net, replica, Op::Patch { uid, guard, patch }, then);
        }
        let then = Then::AckHeartbeat {
            robot: robot.to_owned(),
            seq: heartbeat.seq,
            session: heartbeat.session.clone(),
        };
        let op = Op::Renew {
            robot: robot.to_owned(),
        };
        self.write(net, replica, op, then);
    }

    fn on_status(&mut self, net: &mut Net, replica: usize, robot: &str, update: StatusUpdate) {
        if self.servers[replica].is_none() {
            return;
        }
        let uid = update.task_uid.clone();
        let task = self.tasks.get(&uid);
        let guard = task.and_then(|t| t.metadata.resource_version.clone());
        match decide_status(&update, &uid, robot, task, net.wall()) {
            Ok(decision @ (StatusDecision::Apply(_) | StatusDecision::Record(_))) => {
                let patch = match decision {
                    StatusDecision::Apply(patch) => json!({ "status": patch }),
                    StatusDecision::Record(record) => json!({ "status": record }),
                    StatusDecision::Ignore(_) => unreachable!("matched above"),
                };
                let then = Then::AckStatus {
                    robot: robot.to_owned(),
                    update: Box::new(update),
                };
                self.write(net, replica, Op::Patch { uid, guard, patch }, then);
            }
            Ok(StatusDecision::Ignore(ignored)) => {
                net.log(What::Status {
                    uid,
                    attempt: update.attempt,
                    state: update.state,
                    outcome: ignored.outcome(),
                });
                self.ack(net, replica, robot, StatusAck::new(vec![update.seq]));
            }
            Err(_) => {}
        }
    }

    // ----------------------------------------------------------- manager

    /// What replica `who` of `kind` believes of its leadership (None: a
    /// server replica that is down).
    fn election(&mut self, kind: usize, who: usize) -> Option<&mut Election> {
        match kind {
            MANAGERS => Some(&mut self.managers[who].election),
            _ => self.servers[who].as_mut().map(|s| &mut s.election),
        }
    }

    /// The leader Lease write of replica `who` of `kind` lands, unless
    /// someone wrote the Lease since it read it.
    fn lead(&mut self, net: &mut Net, kind: usize, who: usize, seen: u64, renew: Timestamp) -> bool {
        let current = self.leaders[kind];
        if current.map_or(0, |l| l.version) != seen {
            // kube-lease-manager steps down when its renewal conflicts.
            if let Some(e) = self.election(kind, who) {
                e.campaigning = false;
                if e.leads_until.take().is_some() {
                    net.log(What::Leader {
                        kind,
                        who,
                        leads: false,
                    });
                }
            }
            return false;
        }
        if current.map(|l| l.holder) != Some(who) {
            net.log(What::Leader {
                kind,
                who,
                leads: true,
            });
        }
        self.leaders[kind] = Some(LeaderLease {
            holder: who,
            renew,
            version: seen + 1,
        });
        if let Some(e) = self.election(kind, who) {
            e.campaigning = false;
            e.leads_until = Some(renew + LEADER_LEASE);
        }
        true
    }

    /// Replica `who` of `kind` campaigns for its leader Lease or renews
    /// it, as kube-lease-manager does: on its own clock, it takes a Lease
    /// that is free, its own, or not renewed for the Lease's duration, and
    /// renews its own the grace before it ends.
    fn campaign(&mut self, net: &mut Net, kind: usize, who: usize, now: Timestamp) {
        let lease = self.leaders[kind];
        let Some(e) = self.election(kind, who) else {
            return;
        };
        if e.campaigning {
            return;
        }
        let due = match lease {
            None => true,
            Some(l) if l.holder == who => now >= l.renew + (LEADER_LEASE - LEADER_GRACE),
            Some(l) => now >= l.renew + LEADER_LEASE,
        };
        if !due {
            return;
        }
        e.campaigning = true;
        let op = Op::Lead {
            kind,
            who,
            seen: lease.map_or(0, |l| l.version),
            renew: now,
        };
        match kind {
            MANAGERS => self.write_as(net, op, who, Then::Lead),
            _ => self.write(net, who, op, Then::Lead),
        }
    }

    /// Manager `manager`'s second: its caches catch up with the store
    /// (unless its Lease watch is stalled), it campaigns, and, leading, it
    /// makes its pass over the Tasks. Woken from a pause, its first pass
    /// runs on the caches and the leadership of before it, as reconciles
    /// queued before the pause run before the election notices anything.
    pub fn manager_tick(&mut self, net: &mut Net, manager: usize) {
        net.tick(Node::Manager(manager), MANAGER_TICK);
        let m = &mut self.managers[manager];
        if m.paused_until.is_some_and(|until| net.now() < until) {
            return;
        }
        m.paused_until = None;
        let woken = m.paused_tasks.take();
        if woken.is_none() && !self.stalled {
            m.leases = self.leases.clone();
        }
        let now = net.wall() + jiff::SignedDuration::from_millis(m.skew);
        let leads = m.election.leads(now, woken.is_some());
        self.campaign(net, MANAGERS, manager, now);
        if leads {
            self.manager_pass(net, manager, woken.as_ref(), now);
        }
    }

    /// The Task controller's pass over the Tasks as manager `manager`'s
    /// cache has them (the store's, or `stale` ones), deciding with the
    /// real lifecycle; each write is guarded by the version it decided on.
    fn manager_pass(
        &mut self,
        net: &mut Net,
        manager: usize,
        stale: Option<&BTreeMap<String, Task>>,
        now: Timestamp,
    ) {
        let m = &self.managers[manager];
        let mut writes = Vec::new();
        for (uid, task) in stale.unwrap_or(&self.tasks) {
            if m.busy.contains(uid) {
                continue;
            }
            let status = task.status.clone().unwrap_or_default();
            let robot = status.robot.as_deref().or(task.spec.target_robot.as_deref());
            let health = |leases: &BTreeMap<String, Timestamp>| match robot {
                None => RobotHealth::Missing,
                Some(robot) => RobotHealth::Known {
                    last_heard: leases
                        .get(robot)
                        .copied()
                        .max(self.registered.get(robot).copied()),
                    record_lag: record_lag(Some(LEASE_SECONDS as i32), &self.lifecycle),
                },
            };
            let mut step = decide_step(task, health(&m.leases), now, &self.lifecycle);
            if replaces_a_silent_robots_attempt(&step) {
                // As the Task controller does: read the Lease afresh.
                step = decide_step(task, health(&self.leases), now, &self.lifecycle);
            }
            let guard = task.metadata.resource_version.clone();
            let attempt = status.attempt;
            let (patch, then) = match step {
                Step::Schedule => {
                    let robot = net.rng().usize(0..self.robots);
                    let patch = plan_dispatch(
                        &status,
                        attempt + 1,
                        &robot_name(robot),
                        now,
                        self.lifecycle.dispatch_timeout,
                    );
                    let patch = json!({"spec": {"targetRobot": robot_name(robot)}, "status": patch});
                    let then = Then::Placed {
                        uid: uid.clone(),
                        attempt: attempt + 1,
                        robot,
                    };
                    (patch, then)
                }
                Step::Fail { reason, message } => {
                    let patch = json!({ "status": plan_fail(reason, &message, now) });
                    let then = Then::Failed {
                        uid: uid.clone(),
                        attempt,
                        reason,
                    };
                    (patch, then)
                }
                Step::Retry { delay } => {
                    let patch = json!({ "status": plan_retry(&status, delay, now).0 });
                    (patch, Then::Done { uid: uid.clone() })
                }
                Step::Return { reason, delay } => {
                    let patch = json!({ "status": plan_return(&status, reason, delay, now).0 });
                    (patch, Then::Done { uid: uid.clone() })
                }
                Step::Wait(_) | Step::Done => continue,
            };
            writes.push((uid.clone(), guard, patch, then));
        }
        for (uid, guard, patch, then) in writes {
            self.managers[manager].busy.insert(uid.clone());
            self.write_as(net, Op::Patch { uid, guard, patch }, manager, then);
        }
    }
}
