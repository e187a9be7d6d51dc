//! MQTT → Kubernetes: one handler per message kind. Each reads the current
//! object (from a watch cache, or fresh after a conflict), asks [`decide`]
//! what to write, and writes it under the field manager `k8s4r-server`.
//! Robots' heartbeats and connections are handled here, their
//! registrations in `register`, their messages about Tasks in `tasks`,
//! their facts in `facts`.

use std::collections::{HashMap, HashSet};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use jiff::Timestamp;
use k8s4r_api::backoff::exponential;
use k8s4r_api::names::MANAGER_SERVER;
use k8s4r_api::protocol::{
    check_robot_id, decode, encode, Heartbeat, HeldList, Message, Online, ProtocolError, Register, StatusAck,
    StatusUpdate, Topic, TopicKind, Topics,
};
use k8s4r_api::validation::validate_robot_id;
use k8s4r_api::{Robot, RobotPhase, Task};
use k8s4r_service::watch::InSync;
use k8s4r_service::{lock, Kube};
use k8s_openapi::api::coordination::v1::Lease;
use kube::runtime::reflector::{ObjectRef, Store};
use kube::{Api, Client};
use tracing::{debug, warn};

use crate::config::ServerConfig;
use crate::decide::{self, HeartbeatMemory};
use crate::error::Result;
use crate::facts::FactsMemory;
use crate::held::HeldMemory;
use crate::ingress::{Inbound, Lane};
use crate::metrics::Metrics;
use crate::mqtt::Publisher;

/// How often a guarded write is re-read and retried after a 409.
const CONFLICT_TRIES: u32 = 5;
/// How often a write that failed for another reason is retried.
const ERROR_TRIES: u32 = 4;
/// The first retry delay of such a write; doubled per try.
const RETRY_BASE: Duration = Duration::from_millis(500);

mod facts;
mod heartbeat;
mod register;
mod tasks;
mod upgrade;

use k8s4r_service::written::Written;
use tasks::UidIndex;

/// State shared by every handler.
pub struct Bridge {
    kube: Kube,
    robots: Api<Robot>,
    leases: Api<Lease>,
    robot_cache: Store<Robot>,
    task_cache: Store<Task>,
    lease_cache: Store<Lease>,
    uid_index: Mutex<UidIndex>,
    publisher: Publisher,
    topics: Topics,
    metrics: Arc<Metrics>,
    config: ServerConfig,
    /// Robots whose registration waits for the manager's decision, with
    /// the nonce of the registration to answer.
    awaiting_response: Mutex<HashMap<String, Option<String>>>,
    /// Whether the Task watch is in sync: a uid the cache lacks is taken
    /// for gone only then (and only after reading it from the API server).
    task_sync: InSync,
    /// Per robot, the AgentRollout it was last seen marked for: a new mark
    /// sends the order at once, not at the robot's next heartbeat.
    marks_seen: Mutex<HashMap<String, String>>,
    /// The Tasks this server wrote, until the watch brings them back.
    written: Written<Task>,
    /// Task outputs: asks answered off the lanes.
    outputs: Arc<crate::outputs::Outputs>,
}

/// What one worker remembers of one robot. All of a robot's messages go to
/// the same worker, so none of it is shared between workers.
pub struct RobotMemory {
    heartbeat: HeartbeatMemory,
    held: HeldMemory,
    facts: FactsMemory,
    /// When a refused message of this robot was last logged, and how many
    /// were not logged since: one line per robot per [`REJECTION_LOG_EVERY`].
    rejections: (Option<tokio::time::Instant>, u64),
    /// When this robot was last sent an agent upgrade order.
    upgrade_ordered: Option<tokio::time::Instant>,
}

/// A robot's refused messages are logged at most this often (the rest are
/// counted, and logged at debug level).
const REJECTION_LOG_EVERY: Duration = Duration::from_secs(10);

impl Default for RobotMemory {
    fn default() -> Self {
        Self {
            heartbeat: HeartbeatMemory::default(),
            held: HeldMemory::new(tokio::time::Instant::now()),
            facts: FactsMemory::default(),
            rejections: (None, 0),
            upgrade_ordered: None,
        }
    }
}

impl RobotMemory {
    /// Whether a refusal may be logged now; if so, how many were not
    /// logged since the last one.
    fn log_rejection(&mut self) -> Option<u64> {
        let now = tokio::time::Instant::now();
        let (last, quiet) = &mut self.rejections;
        if last.is_some_and(|at| now.saturating_duration_since(at) < REJECTION_LOG_EVERY) {
            *quiet += 1;
            return None;
        }
        *last = Some(now);
        Some(std::mem::take(quiet))
    }
}

/// One worker's memory of the robots it serves.
#[derive(Default)]
pub struct Memory {
    robots: HashMap<String, RobotMemory>,
    /// The robots whose newest facts wait for their write.
    facts_waiting: HashSet<String>,
}

impl Memory {
    /// What is remembered of `robot` (nothing yet, at first).
    fn robot(&mut self, robot: &str) -> &mut RobotMemory {
        self.robots.entry(robot.to_owned()).or_default()
    }
}

/// What became of one message, for the counter and the log.
enum Outcome {
    Done(&'static str),
    /// Refused for good: a status is confirmed all the same, so the robot
    /// forgets it.
    Rejected(String, &'static str),
    /// Not applied now and not confirmed: the robot sends it again.
    Deferred(String, &'static str),
}

impl Bridge {
    /// A bridge over caches that the caller keeps filled; `task_sync`
    /// says whether the Task cache's watch is in sync.
    #[allow(clippy::too_many_arguments)]
    pub fn new(
        client: Client,
        robot_cache: Store<Robot>,
        task_cache: Store<Task>,
        task_sync: InSync,
        lease_cache: Store<Lease>,
        publisher: Publisher,
        metrics: Arc<Metrics>,
        config: ServerConfig,
    ) -> Self {
        let kube = Kube::new(client.clone(), config.api_timeout, MANAGER_SERVER).with_metrics(metrics.api());
        let topics = Topics::new(&config.topic_prefix);
        let outputs = crate::outputs::Outputs::new(
            config.outputs.as_ref(),
            kube.clone(),
            publisher.clone(),
            topics.clone(),
        );
        Self {
            robots: Api::all(client.clone()),
            leases: Api::namespaced(client, &config.lease_namespace),
            kube,
            outputs: Arc::new(outputs),
            robot_cache,
            task_cache,
            lease_cache,
            uid_index: Mutex::default(),
            publisher,
            topics,
            metrics,
            config,
            awaiting_response: Mutex::default(),
            marks_seen: Mutex::default(),
            written: Written::default(),
            task_sync,
        }
    }

    /// The way to the API server: timeouts, field manager, write metrics.
    pub fn kube(&self) -> &Kube {
        &self.kube
    }

    /// Keeps `task` (as a write returned it, or a fresh read found it)
    /// until the watch brings it back: a robot's next report about it is
    /// decided on the newer of the two (see [`Written`]).
    pub fn record_written(&self, mut task: Task) {
        k8s4r_service::watch::trim(&mut task);
        self.written.record(task);
    }

    /// The Robots, cluster-wide.
    pub fn robots(&self) -> &Api<Robot> {
        &self.robots
    }

    /// The Robots as last watched.
    pub fn robot_cache(&self) -> &Store<Robot> {
        &self.robot_cache
    }

    /// Publishes to robots.
    pub fn publisher(&self) -> &Publisher {
        &self.publisher
    }

    /// The topic names.
    pub fn topics(&self) -> &Topics {
        &self.topics
    }

    /// The counters.
    pub fn metrics(&self) -> &Metrics {
        &self.metrics
    }

    /// The settings.
    pub fn config(&self) -> &ServerConfig {
        &self.config
    }

    async fn get_robot(&self, name: &str) -> Result<Option<Robot>> {
        Ok(self
            .kube
            .read(|| format!("reading robot {name}"), self.robots.get_opt(name))
            .await?)
    }

    /// The Robot from the cache, or fresh when the cache has not seen it yet.
    async fn robot(&self, name: &str) -> Result<Option<Arc<Robot>>> {
        if let Some(robot) = self.robot_cache.get(&ObjectRef::new(name)) {
            return Ok(Some(robot));
        }
        Ok(self.get_robot(name).await?.map(Arc::new))
    }

    /// Handles one received message; never fails: problems are logged and counted.
    pub async fn handle(&self, inbound: Inbound, memory: &mut Memory) {
        let kind = self.kind_label(&inbound.topic);
        let mut tries = 0;
        let outcome = loop {
            tries += 1;
            match self.dispatch_message(&inbound, memory).await {
                Err(error) if tries < ERROR_TRIES && error.is_transient() => {
                    let delay = exponential(RETRY_BASE, self.config.max_backoff, tries);
                    debug!(topic = %inbound.topic, %error, retry_in = ?delay, "retrying");
                    tokio::time::sleep(delay).await;
                }
                outcome => break outcome,
            }
        };
        match outcome {
            Ok(Outcome::Done(outcome)) => {
                debug!(topic = %inbound.topic, outcome, "message handled");
                self.metrics.message_in(kind, outcome);
            }
            Ok(Outcome::Rejected(reason, outcome)) => {
                let robot = crate::mqtt::robot_of(&inbound.topic).to_owned();
                match memory.robot(&robot).log_rejection() {
                    Some(not_logged) => {
                        warn!(topic = %inbound.topic, %reason, not_logged, "message rejected");
                    }
                    None => debug!(topic = %inbound.topic, %reason, "message rejected"),
                }
                self.metrics.message_in(kind, outcome);
            }
            Ok(Outcome::Deferred(reason, outcome)) => {
                debug!(topic = %inbound.topic, %reason, "message not applied now");
                self.metrics.message_in(kind, outcome);
            }
            Err(error) => {
                warn!(topic = %inbound.topic, %error, "message could not be applied");
                self.metrics.message_in(kind, "error");
            }
        }
    }

    fn kind_label(&self, topic: &str) -> &'static str {
        match self.topics.parse(topic) {
            Ok(Topic::Robot { kind, .. }) => match kind {
                TopicKind::Register => "register",
                TopicKind::Heartbeat => "heartbeat",
                TopicKind::Status { .. } => "status",
                TopicKind::Online => "online",
                TopicKind::LogChunk { .. } => "log",
                TopicKind::SessionOut { .. } => "session",
                TopicKind::OutputAsk => "output",
                TopicKind::Response
                | TopicKind::SessionIn { .. }
                | TopicKind::Dispatch
                | TopicKind::Cancel
                | TopicKind::ConfigUpdate
                | TopicKind::StatusAck
                | TopicKind::LogRequest
                | TopicKind::OutputAnswer
                | TopicKind::AgentUpgrade => "server_topic",
            },
            Ok(Topic::LegacyRegister) => "legacy_register",
            Ok(Topic::LegacyHeartbeat) => "legacy_heartbeat",
            Err(_) => "unknown",
        }
    }

    async fn dispatch_message(&self, inbound: &Inbound, memory: &mut Memory) -> Result<Outcome> {
        let topic = match self.topics.parse(&inbound.topic) {
            Ok(topic) => topic,
            Err(e) => return Ok(rejected(e)),
        };
        let body = &inbound.payload;
        match topic {
            Topic::Robot { robot_id, kind } => {
                self.robot_message(&robot_id, kind, body, inbound.held_since, memory)
                    .await
            }
            Topic::LegacyRegister | Topic::LegacyHeartbeat if !self.config.legacy_topics => Ok(
                Outcome::Rejected("legacy topics are disabled".into(), "rejected_topic"),
            ),
            Topic::LegacyRegister => match decode_legacy::<Register>(body, |m| &m.robot_id) {
                Ok(msg) => self.register(&msg).await,
                Err(reason) => Ok(Outcome::Rejected(reason, "rejected_body")),
            },
            Topic::LegacyHeartbeat => match decode_legacy::<Heartbeat>(body, |m| &m.robot_id) {
                Ok(msg) => {
                    // A shared topic does not say which robot sent it:
                    // facts, which decide where tasks start, come only
                    // from a robot's own topic.
                    let msg = Heartbeat { facts: None, ..msg };
                    self.heartbeat(&msg, memory).await
                }
                Err(reason) => Ok(Outcome::Rejected(reason, "rejected_body")),
            },
        }
    }

    /// A message on one robot's own topic (`held_since`: see
    /// [`Inbound::held_since`]).
    async fn robot_message(
        &self,
        robot_id: &str,
        kind: TopicKind,
        body: &[u8],
        held_since: Option<Timestamp>,
        memory: &mut Memory,
    ) -> Result<Outcome> {
        match kind {
            TopicKind::Register => match decode_for::<Register>(body, robot_id, |m| &m.robot_id) {
                Ok(msg) => self.take_register(&msg, memory).await,
                Err(e) => Ok(rejected(e)),
            },
            TopicKind::Heartbeat => match decode_for::<Heartbeat>(body, robot_id, |m| &m.robot_id) {
                Ok(msg) => self.take_heartbeat(&msg, memory).await,
                Err(e) => Ok(rejected(e)),
            },
            TopicKind::Status { task_uid } => match decode::<StatusUpdate>(body) {
                Ok(msg) => self.take_status(&msg, &task_uid, robot_id, memory).await,
                Err(e) => Ok(rejected(e)),
            },
            TopicKind::Online => match decode::<Online>(body) {
                Ok(msg) => self.online(robot_id, msg.online, held_since).await,
                Err(e) => Ok(rejected(e)),
            },
            // Taken by the log hub before the lanes.
            TopicKind::LogChunk { .. } => Ok(Outcome::Done("log")),
            TopicKind::SessionOut { .. } => Ok(Outcome::Done("session")),
            TopicKind::OutputAsk => {
                match decode_for::<k8s4r_api::protocol::outputs::OutputAsk>(body, robot_id, |m| &m.robot_id) {
                    Ok(ask) => {
                        let task = self.task_by_uid(&ask.task_uid);
                        Ok(Outcome::Done(self.outputs.offer(robot_id, ask, task)))
                    }
                    Err(e) => Ok(rejected(e)),
                }
            }
            TopicKind::Response
            | TopicKind::SessionIn { .. }
            | TopicKind::Dispatch
            | TopicKind::Cancel
            | TopicKind::ConfigUpdate
            | TopicKind::StatusAck
            | TopicKind::LogRequest
            | TopicKind::OutputAnswer
            | TopicKind::AgentUpgrade => Ok(Outcome::Rejected(
                "a server-to-robot topic".into(),
                "rejected_topic",
            )),
        }
    }

    /// A registration, then the reconcile of what the new agent process
    /// holds.
    async fn take_register(&self, msg: &Register, memory: &mut Memory) -> Result<Outcome> {
        let outcome = self.register(msg).await?;
        // A new agent process: an order it should get is sent at its first
        // heartbeat, not up to 30 s on.
        let mine = memory.robot(&msg.robot_id);
        mine.upgrade_ordered = None;
        if matches!(outcome, Outcome::Done(_)) {
            self.reconcile(&msg.robot_id, &msg.held, None, &mut mine.held)
                .await?;
        }
        Ok(outcome)
    }

    /// A heartbeat, its confirmation, and the reconcile of what it lists.
    async fn take_heartbeat(&self, msg: &Heartbeat, memory: &mut Memory) -> Result<Outcome> {
        let outcome = self.heartbeat(msg, memory).await?;
        let robot_id = msg.robot_id.as_str();
        let mine = memory.robot(robot_id);
        if matches!(&outcome, Outcome::Rejected(_, "rejected_unknown_robot")) {
            // A deleted Robot's agent may still run attempts that moved
            // elsewhere: stop those, fail nothing.
            let partial = HeldList {
                reconcile: false,
                ..msg.held.clone()
            };
            self.reconcile(robot_id, &partial, msg.server_time, &mut mine.held)
                .await?;
        }
        if matches!(outcome, Outcome::Done(_)) {
            // The Lease is fresh (renewed now, or recently enough to
            // coalesce): the robot's lease on its attempts may run from this
            // heartbeat.
            let ack = StatusAck::heartbeat(msg.seq, msg.session.clone(), Timestamp::now());
            self.acknowledge(robot_id, ack, "heartbeat_ack");
            self.reconcile(robot_id, &msg.held, msg.server_time, &mut mine.held)
                .await?;
        }
        Ok(outcome)
    }

    /// A status of a task, confirmed to the robot unless it must come again.
    async fn take_status(
        &self,
        msg: &StatusUpdate,
        task_uid: &str,
        robot_id: &str,
        memory: &mut Memory,
    ) -> Result<Outcome> {
        let mine = memory.robot(robot_id);
        let outcome = self
            .status(msg, task_uid, robot_id, &mut mine.held, &mut mine.heartbeat.lease)
            .await?;
        // Applied, or refused for good: the robot may forget it. An error
        // (the API away) is not confirmed, and the robot sends the status
        // again; nor is a status this server could not judge now (a Task
        // its cache lacks and it could not read).
        if !matches!(outcome, Outcome::Deferred(..)) {
            self.settle(robot_id, msg.seq);
        }
        Ok(outcome)
    }

    async fn patch_robot_status(
        &self,
        name: &str,
        status: &(impl serde::Serialize + std::fmt::Debug),
        rv: Option<&str>,
        write: &'static str,
    ) -> Result<()> {
        self.kube
            .patch_status(write, &self.robots, name, rv, status, || {
                format!("patching status of robot {name}")
            })
            .await?;
        Ok(())
    }

    /// Tells `robot` that its status `seq` is settled, without waiting: a
    /// lost acknowledgement only makes the robot send the status again,
    /// which is then a duplicate and acknowledged again.
    fn settle(&self, robot: &str, seq: u64) {
        self.acknowledge(robot, StatusAck::new(vec![seq]), "status_ack");
    }

    /// Publishes a confirmation without waiting for its PUBACK; `kind`
    /// labels it in the counter (`status_ack`, `heartbeat_ack`).
    fn acknowledge(&self, robot: &str, ack: StatusAck, kind: &str) {
        let sent = self.publisher.send(self.topics.status_ack(robot), encode(&ack));
        self.metrics
            .message_out(kind, if sent { "queued" } else { "failed" });
    }
}

/// Runs one inbound worker until its channel closes. A write that failed
/// for a reason other than a conflict is retried with capped backoff; the
/// robot's messages wait meanwhile, which keeps them in order. Facts that
/// wait for their robot's write budget are written when it allows, also
/// after the channel closed (within a second).
pub async fn worker(bridge: Arc<Bridge>, lane: Arc<Lane>) {
    let mut memory = Memory::default();
    loop {
        let due = memory.facts_due();
        let message = tokio::select! {
            // Deadlines first: the lane is never so busy that waiting
            // facts are starved.
            biased;
            () = sleep_until_due(due) => {
                bridge.write_due_facts(&mut memory).await;
                continue;
            }
            message = lane.next() => message,
        };
        let Some(message) = message else { break };
        bridge.handle(message, &mut memory).await;
    }
    // A retry after a failed write is left to the robot's next heartbeat.
    let until = tokio::time::Instant::now() + Duration::from_secs(1);
    while let Some(due) = memory.facts_due().filter(|d| *d <= until) {
        tokio::time::sleep_until(due).await;
        bridge.write_due_facts(&mut memory).await;
    }
}

/// Sleeps until `due`, or forever without one.
async fn sleep_until_due(due: Option<tokio::time::Instant>) {
    match due {
        Some(at) => tokio::time::sleep_until(at).await,
        None => std::future::pending().await,
    }
}

/// A robot that is not approved (Pending, Rejected) costs nothing: its
/// heartbeats and statuses are dropped and counted.
fn not_approved(robot: &Robot) -> Option<Outcome> {
    let phase = decide::phase_of(robot);
    match phase {
        RobotPhase::Online | RobotPhase::Offline => None,
        RobotPhase::Pending | RobotPhase::Rejected => Some(Outcome::Deferred(
            format!(
                "robot {} is {phase:?}, not approved",
                robot.metadata.name.as_deref().unwrap_or_default()
            ),
            "rejected_not_approved",
        )),
    }
}

fn rejected(e: ProtocolError) -> Outcome {
    let outcome = match e {
        ProtocolError::TooLarge { .. } => "rejected_too_large",
        ProtocolError::TooMany { .. } => "rejected_too_many",
        ProtocolError::Malformed { .. } => "rejected_malformed",
        ProtocolError::MissingVersion { .. } | ProtocolError::UnsupportedVersion { .. } => "rejected_version",
        ProtocolError::UnknownTopic { .. } | ProtocolError::InvalidTopicId { .. } => "rejected_topic",
        ProtocolError::RobotMismatch { .. } => "rejected_robot_mismatch",
    };
    Outcome::Rejected(e.to_string(), outcome)
}

fn decode_for<M: Message>(
    body: &[u8],
    topic_robot: &str,
    id: impl Fn(&M) -> &String,
) -> Result<M, ProtocolError> {
    let msg = decode::<M>(body)?;
    check_robot_id(id(&msg), topic_robot)?;
    Ok(msg)
}

fn decode_legacy<M: Message>(body: &[u8], id: impl Fn(&M) -> &String) -> Result<M, String> {
    let msg = decode::<M>(body).map_err(|e| e.to_string())?;
    validate_robot_id(id(&msg)).map_err(|reason| format!("robot id {:?}: {reason}", id(&msg)))?;
    Ok(msg)
}

fn set_values(
    map: &std::collections::BTreeMap<String, Option<String>>,
) -> std::collections::BTreeMap<String, String> {
    map.iter()
        .filter_map(|(k, v)| Some((k.clone(), v.clone()?)))
        .collect()
}
