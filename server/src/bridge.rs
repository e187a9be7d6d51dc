//! MQTT → Kubernetes: one handler per message kind. Each reads the current
//! object (from a watch cache, or fresh after a conflict), asks [`decide`]
//! what to write, and writes it under the field manager `k8s4r-server`.

use std::collections::{HashMap, HashSet};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use jiff::Timestamp;
use k8s4r_api::backoff::exponential;
use k8s4r_api::names::MANAGER_SERVER;
use k8s4r_api::protocol::{
    check_robot_id, decode, encode, Cancel, Heartbeat, Message, Online, ProtocolError, Register,
    RegisterResponse, StatusAck, StatusUpdate, Topic, TopicKind, Topics,
};
use k8s4r_api::validation::validate_robot_id;
use k8s4r_api::{Robot, RobotPhase, Task, TaskAttempt};
use k8s4r_service::patch::Guarded;
use k8s4r_service::Kube;
use k8s_openapi::api::coordination::v1::{Lease, LeaseSpec};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::{MicroTime, ObjectMeta};
use kube::api::{Patch, PatchParams};
use kube::runtime::reflector::{ObjectRef, Store};
use kube::{Api, Client};
use tracing::{debug, info, instrument, warn};

use crate::config::ServerConfig;
use crate::decide::{
    self, connected, plan_heartbeat, plan_register, HeartbeatMemory, RobotStatusPatch, StatusDecision,
};
use crate::error::{Error, Result};
use crate::ingress::{Inbound, Lane};
use crate::metrics::Metrics;
use crate::mqtt::Publisher;

/// How often a guarded write is re-read and retried after a 409.
const CONFLICT_TRIES: u32 = 5;
/// How often a write that failed for another reason is retried.
const ERROR_TRIES: u32 = 4;
/// How long a Task uid a robot mentions must stay unknown before the server
/// treats the Task as gone (cancels its attempt, settles its statuses).
const UNKNOWN_GRACE: Duration = Duration::from_secs(30);
/// The first retry delay of such a write; doubled per try.
const RETRY_BASE: Duration = Duration::from_millis(500);

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
    awaiting_response: Mutex<HashSet<String>>,
    /// Task uids robots mention that this server does not know, and since when.
    unknown_since: Mutex<HashMap<String, Instant>>,
}

#[derive(Default)]
struct UidIndex {
    refs: HashMap<String, ObjectRef<Task>>,
    rebuilt: Option<Instant>,
    /// The Tasks targeting each robot, as last seen (deleted ones linger
    /// until looked up: the cache no longer has them).
    by_robot: HashMap<String, HashSet<ObjectRef<Task>>>,
    robot_of: HashMap<ObjectRef<Task>, String>,
}

/// What became of one message, for the counter and the log.
enum Outcome {
    Done(&'static str),
    Rejected(String, &'static str),
}

impl Bridge {
    /// A bridge over caches that the caller keeps filled.
    pub fn new(
        client: Client,
        robot_cache: Store<Robot>,
        task_cache: Store<Task>,
        lease_cache: Store<Lease>,
        publisher: Publisher,
        metrics: Arc<Metrics>,
        config: ServerConfig,
    ) -> Self {
        Self {
            robots: Api::all(client.clone()),
            leases: Api::namespaced(client.clone(), &config.lease_namespace),
            kube: Kube::new(client, config.api_timeout, MANAGER_SERVER).with_metrics(metrics.api()),
            robot_cache,
            task_cache,
            lease_cache,
            uid_index: Mutex::default(),
            publisher,
            topics: Topics::new(&config.topic_prefix),
            metrics,
            config,
            awaiting_response: Mutex::default(),
            unknown_since: Mutex::default(),
        }
    }

    /// The way to the API server: timeouts, field manager, write metrics.
    pub fn kube(&self) -> &Kube {
        &self.kube
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
    pub async fn handle(&self, inbound: Inbound, heartbeats: &mut HashMap<String, HeartbeatMemory>) {
        let kind = self.kind_label(&inbound.topic);
        let mut tries = 0;
        let outcome = loop {
            tries += 1;
            match self.dispatch_message(&inbound, heartbeats).await {
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
                warn!(topic = %inbound.topic, %reason, "message rejected");
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
                TopicKind::Response
                | TopicKind::Dispatch
                | TopicKind::Cancel
                | TopicKind::StatusAck
                | TopicKind::LogRequest => "server_topic",
            },
            Ok(Topic::LegacyRegister) => "legacy_register",
            Ok(Topic::LegacyHeartbeat) => "legacy_heartbeat",
            Err(_) => "unknown",
        }
    }

    async fn dispatch_message(
        &self,
        inbound: &Inbound,
        heartbeats: &mut HashMap<String, HeartbeatMemory>,
    ) -> Result<Outcome> {
        let topic = match self.topics.parse(&inbound.topic) {
            Ok(topic) => topic,
            Err(e) => return Ok(rejected(e)),
        };
        let body = &inbound.payload;
        match topic {
            Topic::Robot { robot_id, kind } => match kind {
                TopicKind::Register => match decode_for::<Register>(body, &robot_id, |m| &m.robot_id) {
                    Ok(msg) => {
                        let outcome = self.register(&msg).await?;
                        if matches!(outcome, Outcome::Done(_)) {
                            self.reconcile(
                                &robot_id,
                                &Heartbeat {
                                    running: msg.running.clone(),
                                    reconcile: msg.reconcile,
                                    last_seq: msg.last_seq,
                                    ..Heartbeat::new(&robot_id, 0, Timestamp::now(), Default::default())
                                },
                            )
                            .await?;
                        }
                        Ok(outcome)
                    }
                    Err(e) => Ok(rejected(e)),
                },
                TopicKind::Heartbeat => match decode_for::<Heartbeat>(body, &robot_id, |m| &m.robot_id) {
                    Ok(msg) => {
                        let outcome = self.heartbeat(&msg, heartbeats).await?;
                        if matches!(&outcome, Outcome::Rejected(_, "rejected_unknown_robot")) {
                            // A deleted Robot's agent may still run attempts
                            // that moved elsewhere: stop those, fail nothing.
                            let partial = Heartbeat {
                                reconcile: false,
                                ..msg.clone()
                            };
                            self.reconcile(&robot_id, &partial).await?;
                        }
                        if matches!(outcome, Outcome::Done(_)) {
                            // The Lease is fresh (renewed now, or recently
                            // enough to coalesce): the robot's lease on its
                            // attempts may run from this heartbeat.
                            self.acknowledge(&robot_id, StatusAck::heartbeat(msg.seq, Timestamp::now()));
                            self.reconcile(&robot_id, &msg).await?;
                        }
                        Ok(outcome)
                    }
                    Err(e) => Ok(rejected(e)),
                },
                TopicKind::Status { task_uid } => match decode::<StatusUpdate>(body) {
                    Ok(msg) => {
                        let outcome = self.status(&msg, &task_uid, &robot_id).await?;
                        // Applied, or refused for good: the robot may forget
                        // it. An error (the API away) is not acknowledged,
                        // and the robot sends the status again; nor is a
                        // status of a Task this server has not known for
                        // long (its cache may lag).
                        let young = matches!(&outcome, Outcome::Rejected(_, "rejected_unknown_task"))
                            && self
                                .long_unknown(&[TaskAttempt {
                                    uid: task_uid.clone(),
                                    attempt: msg.attempt,
                                }])
                                .is_empty();
                        if !young {
                            self.settle(&robot_id, msg.seq);
                        }
                        Ok(outcome)
                    }
                    Err(e) => Ok(rejected(e)),
                },
                TopicKind::Online => match decode::<Online>(body) {
                    Ok(msg) => self.online(&robot_id, msg.online).await,
                    Err(e) => Ok(rejected(e)),
                },
                // Taken by the log hub before the lanes.
                TopicKind::LogChunk { .. } => Ok(Outcome::Done("log")),
                TopicKind::Response
                | TopicKind::Dispatch
                | TopicKind::Cancel
                | TopicKind::StatusAck
                | TopicKind::LogRequest => Ok(Outcome::Rejected(
                    "a server-to-robot topic".into(),
                    "rejected_topic",
                )),
            },
            Topic::LegacyRegister | Topic::LegacyHeartbeat if !self.config.legacy_topics => Ok(
                Outcome::Rejected("legacy topics are disabled".into(), "rejected_topic"),
            ),
            Topic::LegacyRegister => match decode_legacy::<Register>(body, |m| &m.robot_id) {
                Ok(msg) => self.register(&msg).await,
                Err(reason) => Ok(Outcome::Rejected(reason, "rejected_body")),
            },
            Topic::LegacyHeartbeat => match decode_legacy::<Heartbeat>(body, |m| &m.robot_id) {
                Ok(msg) => self.heartbeat(&msg, heartbeats).await,
                Err(reason) => Ok(Outcome::Rejected(reason, "rejected_body")),
            },
        }
    }

    // ------------------------------------------------------------ register

    #[instrument(skip_all, fields(robot = %msg.robot_id))]
    async fn register(&self, msg: &Register) -> Result<Outcome> {
        let name = msg.robot_id.as_str();
        let mut tries = 0;
        let respond = loop {
            tries += 1;
            let existing = self.get_robot(name).await?;
            let plan = match plan_register(msg, existing.as_ref(), Timestamp::now()) {
                Ok(plan) => plan,
                Err(rejection) => return Ok(Outcome::Rejected(rejection.to_string(), rejection.outcome())),
            };
            match self.apply_register(name, existing, &plan).await {
                Ok(()) => break plan.respond,
                Err(e) if (e.is_conflict() || e.is_not_found()) && tries < CONFLICT_TRIES => {
                    debug!(error = %e, "robot changed meanwhile; reading it again");
                }
                Err(e) => return Err(e),
            }
        };
        info!(respond = ?respond, "robot registered");
        match respond {
            Some(phase) => {
                let message = self
                    .robot_cache
                    .get(&ObjectRef::new(name))
                    .and_then(|r| r.status.as_ref().and_then(|s| s.message.clone()));
                self.respond(name, phase, message).await;
            }
            None => self.await_decision(name).await,
        }
        Ok(Outcome::Done("applied"))
    }

    async fn apply_register(
        &self,
        name: &str,
        existing: Option<Robot>,
        plan: &decide::RegisterPlan,
    ) -> Result<()> {
        let mut rv = existing.and_then(|r| r.metadata.resource_version);
        if plan.create {
            let mut robot = Robot::new(name, Default::default());
            robot.metadata = ObjectMeta {
                name: Some(name.to_owned()),
                labels: Some(set_values(&plan.metadata.labels)),
                annotations: Some(set_values(&plan.metadata.annotations)),
                ..Default::default()
            };
            let created = self
                .kube
                .write(
                    "robot_create",
                    || format!("creating robot {name}"),
                    self.robots.create(&self.kube.post_params(), &robot),
                )
                .await?;
            rv = created.metadata.resource_version;
        } else if !plan.metadata.is_empty() {
            let body = Guarded::metadata(rv.as_deref(), &plan.metadata);
            let patched = self
                .kube
                .patch("robot_metadata", &self.robots, name, &body, || {
                    format!("patching labels of robot {name}")
                })
                .await?;
            rv = patched.metadata.resource_version;
        }
        if !plan.write_status {
            return Ok(());
        }
        self.patch_robot_status(name, &plan.status, rv.as_deref(), "robot_register")
            .await
    }

    async fn patch_robot_status(
        &self,
        name: &str,
        status: &RobotStatusPatch,
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

    /// Remembers that `name` waits for the manager's decision; answers at
    /// once if the cache already shows it (the watch may have gone by).
    async fn await_decision(&self, name: &str) {
        lock(&self.awaiting_response).insert(name.to_owned());
        if let Some(robot) = self.robot_cache.get(&ObjectRef::new(name)) {
            self.robot_changed(&robot).await;
        }
    }

    /// Called for every Robot the watch sees: answers a waiting robot once
    /// its phase is decided.
    pub async fn robot_changed(&self, robot: &Robot) {
        let Some(status) = robot.status.as_ref() else {
            return;
        };
        let Some(phase @ (RobotPhase::Online | RobotPhase::Rejected)) = status.phase else {
            return;
        };
        let name = robot.metadata.name.clone().unwrap_or_default();
        if !lock(&self.awaiting_response).remove(&name) {
            return;
        }
        self.respond(&name, phase, status.message.clone()).await;
    }

    async fn respond(&self, name: &str, phase: RobotPhase, message: Option<String>) {
        let body = encode(&RegisterResponse {
            server_time: Some(Timestamp::now()),
            status_acks: true,
            ..RegisterResponse::new(phase, message)
        });
        match self.publisher.publish(self.topics.response(name), body).await {
            Ok(()) => {
                info!(robot = name, ?phase, "registration answered");
                self.metrics.message_out("response", "acked");
            }
            Err(error) => {
                warn!(robot = name, %error, "registration answer not delivered; the robot's next register retries");
                self.metrics.message_out("response", "failed");
            }
        }
    }

    /// Tells `robot` that its status `seq` is settled, without waiting: a
    /// lost acknowledgement only makes the robot send the status again,
    /// which is then a duplicate and acknowledged again.
    fn settle(&self, robot: &str, seq: u64) {
        self.acknowledge(robot, StatusAck::new(vec![seq]));
    }

    /// Publishes an acknowledgement without waiting for its PUBACK.
    fn acknowledge(&self, robot: &str, ack: StatusAck) {
        let sent = self.publisher.send(self.topics.status_ack(robot), encode(&ack));
        self.metrics
            .message_out("ack", if sent { "queued" } else { "failed" });
    }

    // ------------------------------------------------------------ heartbeat

    #[instrument(skip_all, fields(robot = %msg.robot_id))]
    async fn heartbeat(
        &self,
        msg: &Heartbeat,
        memory: &mut HashMap<String, HeartbeatMemory>,
    ) -> Result<Outcome> {
        let name = msg.robot_id.as_str();
        let Some(robot) = self.robot(name).await? else {
            let r = decide::Rejection::UnknownRobot {
                robot: name.to_owned(),
            };
            return Ok(Outcome::Rejected(r.to_string(), r.outcome()));
        };
        let now = Timestamp::now();
        let entry = memory.entry(name.to_owned()).or_default();
        let lease_renewed = self
            .lease_cache
            .get(&ObjectRef::new(name).within(&self.config.lease_namespace))
            .and_then(|l| l.spec.as_ref()?.renew_time.as_ref().map(|t| t.0));
        let plan = plan_heartbeat(
            entry,
            &robot,
            lease_renewed,
            &msg.usage,
            msg.health.as_ref(),
            now,
            self.config.coalescing,
        );
        if plan.is_empty() {
            return Ok(Outcome::Done("coalesced"));
        }
        let result = async {
            if plan.renew_lease {
                self.renew_lease(name, now).await?;
            }
            if let Some(status) = &plan.status {
                // Only a Connected flip rewrites the shared conditions list
                // and needs the guard; time and usage are the server's alone.
                let rv = status
                    .conditions
                    .as_ref()
                    .and(robot.metadata.resource_version.as_deref());
                self.patch_robot_status(name, status, rv, "robot_heartbeat")
                    .await?;
            }
            Ok::<_, Error>(())
        }
        .await;
        if let Err(e) = result {
            // Forget what was planned so the next heartbeat tries again.
            memory.remove(name);
            return Err(e);
        }
        Ok(Outcome::Done("applied"))
    }

    async fn renew_lease(&self, name: &str, now: Timestamp) -> Result<()> {
        let refresh = self.config.coalescing.lease_interval.as_secs().max(1);
        let lease = Lease {
            metadata: ObjectMeta {
                name: Some(name.to_owned()),
                namespace: Some(self.config.lease_namespace.clone()),
                ..Default::default()
            },
            spec: Some(LeaseSpec {
                holder_identity: Some(name.to_owned()),
                renew_time: Some(MicroTime(now)),
                // Three missed renewals, as node leases allow.
                lease_duration_seconds: Some(i32::try_from(refresh * 3).unwrap_or(i32::MAX)),
                ..Default::default()
            }),
        };
        let pp = PatchParams::apply(MANAGER_SERVER).force();
        self.kube
            .write(
                "lease",
                || format!("renewing lease {}/{name}", self.config.lease_namespace),
                self.leases.patch(name, &pp, &Patch::Apply(&lease)),
            )
            .await?;
        Ok(())
    }

    // ------------------------------------------------------------ online

    #[instrument(skip(self))]
    async fn online(&self, name: &str, online: bool) -> Result<Outcome> {
        let mut robot = match self.robot(name).await? {
            Some(robot) => robot,
            // An agent announces itself online as it connects, just before it
            // registers, and the registration records the connection; so this
            // is the normal first message of a new robot, not a bad one.
            None => return Ok(Outcome::Done("ignored_unregistered")),
        };
        for tries in 1.. {
            let conditions = robot
                .status
                .as_ref()
                .map(|s| s.conditions.as_slice())
                .unwrap_or_default();
            let Some(conditions) = connected(conditions, online, Timestamp::now()) else {
                return Ok(Outcome::Done("unchanged"));
            };
            let status = RobotStatusPatch {
                conditions: Some(conditions),
                ..Default::default()
            };
            let rv = robot.metadata.resource_version.as_deref();
            match self
                .patch_robot_status(name, &status, rv, "robot_connected")
                .await
            {
                Ok(()) => {
                    info!(online, "robot connection recorded");
                    return Ok(Outcome::Done("applied"));
                }
                Err(e) if e.is_conflict() && tries < CONFLICT_TRIES => match self.get_robot(name).await? {
                    Some(fresh) => robot = Arc::new(fresh),
                    None => return Ok(Outcome::Done("unchanged")),
                },
                Err(e) => return Err(e),
            }
        }
        unreachable!("the loop returns")
    }

    // ------------------------------------------------------------ task status

    /// Records where the Task with this uid lives; the Task controller calls
    /// it for every Task it sees, so a Task is indexed before its dispatch.
    pub(crate) fn index_task(&self, task: &Task) {
        let Some(uid) = task.metadata.uid.clone() else {
            return;
        };
        let reference = ObjectRef::from_obj(task);
        let mut index = lock(&self.uid_index);
        index.refs.entry(uid).or_insert_with(|| reference.clone());
        let robot = task.spec.target_robot.clone().filter(|r| !r.is_empty());
        let before = match &robot {
            Some(robot) => index.robot_of.insert(reference.clone(), robot.clone()),
            None => index.robot_of.remove(&reference),
        };
        if before != robot {
            if let Some(old) = before {
                if let Some(set) = index.by_robot.get_mut(&old) {
                    set.remove(&reference);
                }
            }
            if let Some(robot) = robot {
                index.by_robot.entry(robot).or_default().insert(reference);
            }
        }
    }

    /// Of these attempts of uids this server does not know, the ones it has
    /// not known for [`UNKNOWN_GRACE`]: a replica whose cache lags must not
    /// cancel an attempt that was just dispatched, or settle its status.
    fn long_unknown(&self, attempts: &[TaskAttempt]) -> Vec<TaskAttempt> {
        let now = Instant::now();
        let mut unknown = lock(&self.unknown_since);
        if unknown.len() > 65_536 {
            unknown.retain(|_, since| now.duration_since(*since) < UNKNOWN_GRACE * 10);
        }
        attempts
            .iter()
            .filter(|a| {
                let since = *unknown.entry(a.uid.clone()).or_insert(now);
                now.duration_since(since) >= UNKNOWN_GRACE
            })
            .cloned()
            .collect()
    }

    /// The Tasks targeting `robot`, from the cache.
    fn tasks_on(&self, robot: &str) -> Vec<Arc<Task>> {
        let mut index = lock(&self.uid_index);
        let Some(refs) = index.by_robot.get(robot) else {
            return Vec::new();
        };
        let mut gone = Vec::new();
        let mut tasks = Vec::new();
        for r in refs {
            match self.task_cache.get(r) {
                Some(task) => tasks.push(task),
                None => gone.push(r.clone()),
            }
        }
        for r in gone {
            index.robot_of.remove(&r);
            if let Some(set) = index.by_robot.get_mut(robot) {
                set.remove(&r);
            }
        }
        tasks
    }

    /// Compares what `robot` says it holds with what the Tasks want of it:
    /// cancels what no Task wants, and fails at once a Task whose attempt
    /// the robot's complete list shows it will never run (docs/fencing.md,
    /// "reconcile").
    async fn reconcile(&self, robot: &str, report: &Heartbeat) -> Result<()> {
        let holding = decide::Holding {
            held: &report.running,
            complete: report.reconcile,
            last_seq: report.last_seq,
            sent_at: report.server_time,
        };
        let assigned = if holding.complete {
            self.tasks_on(robot)
        } else {
            Vec::new()
        };
        let plan = decide::plan_reconcile(
            robot,
            holding,
            |uid| self.task_by_uid(uid),
            assigned.iter().map(|t| t.as_ref()),
            Timestamp::now(),
        );
        let mut cancels = plan.cancel.clone();
        cancels.extend(
            self.long_unknown(&plan.unknown)
                .into_iter()
                .map(|a| (a, "the Task no longer exists".to_owned())),
        );
        for (attempt, why) in &cancels {
            let body = encode(&Cancel::new(&attempt.uid, attempt.attempt, why.clone()));
            let sent = self.publisher.send(self.topics.cancel(robot), body);
            info!(task_uid = %attempt.uid, attempt = attempt.attempt, reason = %why, sent, "cancelling an attempt no Task wants");
            self.metrics
                .message_out("cancel", if sent { "queued" } else { "failed" });
        }
        for (uid, patch) in &plan.lost {
            let Some(task) = assigned
                .iter()
                .find(|t| t.metadata.uid.as_deref() == Some(uid.as_str()))
            else {
                continue;
            };
            let api: Api<Task> = Api::namespaced(
                self.kube.client().clone(),
                task.metadata.namespace.as_deref().unwrap_or_default(),
            );
            let name = task.metadata.name.clone().unwrap_or_default();
            let written = self
                .kube
                .patch_status(
                    "task_status",
                    &api,
                    &name,
                    task.metadata.resource_version.as_deref(),
                    patch,
                    || format!("failing task {} (not on its robot)", decide::task_name(task)),
                )
                .await;
            match written {
                Ok(_) => {
                    warn!(task = %decide::task_name(task), robot, "the robot does not hold the attempt the Task shows running: failed it")
                }
                // Changed meanwhile (a status arrived): the next report decides.
                Err(e) if e.is_conflict() || e.is_not_found() => {}
                Err(e) => return Err(e.into()),
            }
        }
        Ok(())
    }

    fn task_by_uid(&self, uid: &str) -> Option<Arc<Task>> {
        let mut index = lock(&self.uid_index);
        // Entries of deleted Tasks are dropped by a rebuild now and then.
        let age = index.rebuilt.map(|at| at.elapsed());
        if age.is_some_and(|a| a < Duration::from_secs(600)) {
            if let Some(task) = index.refs.get(uid).and_then(|r| self.task_cache.get(r)) {
                if task.metadata.uid.as_deref() == Some(uid) {
                    return Some(task);
                }
            }
            // Rebuild at most once a second, so unknown uids cannot make
            // every message scan the whole cache.
            if age.is_some_and(|a| a < Duration::from_secs(1)) {
                return None;
            }
        }
        index.refs = self
            .task_cache
            .state()
            .iter()
            .filter_map(|t| Some((t.metadata.uid.clone()?, ObjectRef::from_obj(t.as_ref()))))
            .collect();
        index.rebuilt = Some(Instant::now());
        index
            .refs
            .get(uid)
            .and_then(|r| self.task_cache.get(r))
            .filter(|t| t.metadata.uid.as_deref() == Some(uid))
    }

    #[instrument(skip_all, fields(robot = robot, task_uid = uid))]
    async fn status(&self, msg: &StatusUpdate, uid: &str, robot: &str) -> Result<Outcome> {
        let mut task = self.task_by_uid(uid);
        let mut fresh = false;
        for tries in 1.. {
            let decision = decide::decide_status(msg, uid, robot, task.as_deref(), Timestamp::now());
            let patch = match decision {
                Ok(StatusDecision::Apply(patch)) => patch,
                Ok(StatusDecision::Ignore(why)) => return Ok(Outcome::Done(why.outcome())),
                // The cache may lag behind the manager's dispatch: look once
                // at the API server before refusing.
                Err(decide::Rejection::FutureAttempt { .. } | decide::Rejection::NotAssigned { .. })
                    if !fresh =>
                {
                    task = self.fresh_task(task.as_deref()).await?;
                    fresh = true;
                    continue;
                }
                Err(rejection) => return Ok(Outcome::Rejected(rejection.to_string(), rejection.outcome())),
            };
            let Some(current) = task.as_deref() else {
                unreachable!("an applied decision has a task")
            };
            let api: Api<Task> = Api::namespaced(
                self.kube.client().clone(),
                current.metadata.namespace.as_deref().unwrap_or_default(),
            );
            let name = current.metadata.name.clone().unwrap_or_default();
            let result = self
                .kube
                .patch_status(
                    "task_status",
                    &api,
                    &name,
                    current.metadata.resource_version.as_deref(),
                    &patch,
                    || format!("patching status of task {}", decide::task_name(current)),
                )
                .await
                .map_err(Error::from);
            match result {
                Ok(_) => {
                    info!(
                        state = patch.state.as_str(),
                        attempt = msg.attempt,
                        seq = msg.seq,
                        "task status applied"
                    );
                    return Ok(Outcome::Done("applied"));
                }
                Err(e) if e.is_conflict() && tries < CONFLICT_TRIES => {
                    task = self.fresh_task(task.as_deref()).await?;
                    fresh = true;
                }
                Err(e) => return Err(e),
            }
        }
        unreachable!("the loop returns")
    }

    async fn fresh_task(&self, task: Option<&Task>) -> Result<Option<Arc<Task>>> {
        let Some(task) = task else { return Ok(None) };
        let api: Api<Task> = Api::namespaced(
            self.kube.client().clone(),
            task.metadata.namespace.as_deref().unwrap_or_default(),
        );
        let name = task.metadata.name.clone().unwrap_or_default();
        let fresh = self
            .kube
            .read(|| format!("reading task {name}"), api.get_opt(&name))
            .await?;
        Ok(fresh
            .filter(|f| f.metadata.uid == task.metadata.uid)
            .map(Arc::new))
    }
}

/// Runs one inbound worker until its channel closes. A write that failed
/// for a reason other than a conflict is retried with capped backoff; the
/// robot's messages wait meanwhile, which keeps them in order.
pub async fn worker(bridge: Arc<Bridge>, lane: Arc<Lane>) {
    let mut heartbeats = HashMap::new();
    while let Some(message) = lane.next().await {
        bridge.handle(message, &mut heartbeats).await;
    }
}

fn rejected(e: ProtocolError) -> Outcome {
    let outcome = match e {
        ProtocolError::TooLarge { .. } => "rejected_too_large",
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

pub(crate) fn lock<T>(m: &Mutex<T>) -> std::sync::MutexGuard<'_, T> {
    m.lock().unwrap_or_else(|e| e.into_inner())
}
