//! MQTT → Kubernetes: one handler per message kind. Each reads the current
//! object (from a watch cache, or fresh after a conflict), asks [`decide`]
//! what to write, and writes it under the field manager `k8s4r-server`.

use std::collections::{HashMap, HashSet};
use std::future::Future;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use jiff::Timestamp;
use k8s4r_api::names::MANAGER_SERVER;
use k8s4r_api::protocol::{
    check_robot_id, decode, encode, Heartbeat, Message, Online, ProtocolError, Register, RegisterResponse,
    StatusUpdate, Topic, TopicKind, Topics, PROTOCOL_VERSION,
};
use k8s4r_api::validation::validate_robot_id;
use k8s4r_api::{Robot, RobotPhase, Task};
use k8s_openapi::api::coordination::v1::{Lease, LeaseSpec};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::{MicroTime, ObjectMeta};
use kube::api::{Patch, PatchParams, PostParams};
use kube::runtime::reflector::{ObjectRef, Store};
use kube::{Api, Client};
use serde::Serialize;
use tokio::sync::mpsc;
use tracing::{debug, info, instrument, warn};

use crate::config::ServerConfig;
use crate::decide::{
    self, connected, plan_heartbeat, plan_register, HeartbeatMemory, MetadataPatch, RobotStatusPatch,
    StatusDecision,
};
use crate::error::{Error, Result};
use crate::metrics::Metrics;
use crate::mqtt::{Inbound, Publisher};

/// How often a guarded write is re-read and retried after a 409.
const CONFLICT_TRIES: u32 = 5;
/// How often a write that failed for another reason is retried.
const ERROR_TRIES: u32 = 4;

/// State shared by every handler.
pub struct Bridge {
    pub(crate) robots: Api<Robot>,
    pub(crate) leases: Api<Lease>,
    pub(crate) client: Client,
    pub(crate) robot_cache: Store<Robot>,
    pub(crate) task_cache: Store<Task>,
    lease_cache: Store<Lease>,
    uid_index: Mutex<UidIndex>,
    pub(crate) publisher: Publisher,
    pub(crate) topics: Topics,
    pub(crate) metrics: Arc<Metrics>,
    pub(crate) config: ServerConfig,
    awaiting_response: Mutex<HashSet<String>>,
}

#[derive(Default)]
struct UidIndex {
    refs: HashMap<String, ObjectRef<Task>>,
    rebuilt: Option<Instant>,
}

/// The body of a merge patch guarded by a resourceVersion.
#[derive(Debug, Serialize)]
struct Guarded<'a, S: Serialize> {
    metadata: RvOnly<'a>,
    status: &'a S,
}

#[derive(Debug, Serialize)]
#[serde(rename_all = "camelCase")]
struct RvOnly<'a> {
    #[serde(skip_serializing_if = "Option::is_none")]
    resource_version: Option<&'a str>,
}

#[derive(Debug, Serialize)]
#[serde(rename_all = "camelCase")]
struct MetadataOnly<'a> {
    metadata: GuardedMetadata<'a>,
}

#[derive(Debug, Serialize)]
#[serde(rename_all = "camelCase")]
struct GuardedMetadata<'a> {
    resource_version: Option<&'a str>,
    #[serde(flatten)]
    patch: &'a MetadataPatch,
}

fn params() -> PatchParams {
    PatchParams {
        field_manager: Some(MANAGER_SERVER.to_owned()),
        ..Default::default()
    }
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
            client,
            robot_cache,
            task_cache,
            lease_cache,
            uid_index: Mutex::default(),
            publisher,
            topics: Topics::new(&config.topic_prefix),
            metrics,
            config,
            awaiting_response: Mutex::default(),
        }
    }

    /// Runs one API call with the timeout and records its latency.
    pub(crate) async fn call<T>(
        &self,
        write: &'static str,
        action: impl FnOnce() -> String,
        fut: impl Future<Output = kube::Result<T>>,
    ) -> Result<T> {
        let started = Instant::now();
        let result = tokio::time::timeout(self.config.api_timeout, fut).await;
        let outcome = match &result {
            Ok(Ok(_)) => "ok",
            Ok(Err(kube::Error::Api(s))) if s.code == 409 => "conflict",
            Ok(Err(kube::Error::Api(s))) if s.code == 404 => "not_found",
            Ok(Err(_)) => "error",
            Err(_) => "timeout",
        };
        if write != "read" {
            self.metrics.api_write(write, outcome, started.elapsed());
        }
        match result {
            Ok(Ok(v)) => Ok(v),
            Ok(Err(source)) => Err(Error::Kube {
                action: action(),
                source,
            }),
            Err(_) => Err(Error::KubeTimeout {
                action: action(),
                after: self.config.api_timeout,
            }),
        }
    }

    async fn get_robot(&self, name: &str) -> Result<Option<Robot>> {
        self.call(
            "read",
            || format!("reading robot {name}"),
            self.robots.get_opt(name),
        )
        .await
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
                    let delay = decide::backoff(tries, self.config.max_backoff);
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
                TopicKind::Response | TopicKind::Dispatch | TopicKind::Cancel => "server_topic",
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
                    Ok(msg) => self.register(&msg).await,
                    Err(e) => Ok(rejected(e)),
                },
                TopicKind::Heartbeat => match decode_for::<Heartbeat>(body, &robot_id, |m| &m.robot_id) {
                    Ok(msg) => self.heartbeat(&msg, heartbeats).await,
                    Err(e) => Ok(rejected(e)),
                },
                TopicKind::Status { task_uid } => match decode::<StatusUpdate>(body) {
                    Ok(msg) => self.status(&msg, &task_uid, &robot_id).await,
                    Err(e) => Ok(rejected(e)),
                },
                TopicKind::Online => match decode::<Online>(body) {
                    Ok(msg) => self.online(&robot_id, msg.online).await,
                    Err(e) => Ok(rejected(e)),
                },
                TopicKind::Response | TopicKind::Dispatch | TopicKind::Cancel => Ok(Outcome::Rejected(
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
            let pp = PostParams {
                field_manager: Some(MANAGER_SERVER.to_owned()),
                ..Default::default()
            };
            let created = self
                .call(
                    "robot_create",
                    || format!("creating robot {name}"),
                    self.robots.create(&pp, &robot),
                )
                .await?;
            rv = created.metadata.resource_version;
        } else if !plan.metadata.is_empty() {
            let body = MetadataOnly {
                metadata: GuardedMetadata {
                    resource_version: rv.as_deref(),
                    patch: &plan.metadata,
                },
            };
            let patched = self
                .call(
                    "robot_metadata",
                    || format!("patching labels of robot {name}"),
                    self.robots.patch(name, &params(), &Patch::Merge(&body)),
                )
                .await?;
            rv = patched.metadata.resource_version;
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
        let body = Guarded {
            metadata: RvOnly { resource_version: rv },
            status,
        };
        self.call(
            write,
            || format!("patching status of robot {name}"),
            self.robots.patch_status(name, &params(), &Patch::Merge(&body)),
        )
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
            v: PROTOCOL_VERSION,
            phase,
            message,
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
        self.call(
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
        if let Some(uid) = task.metadata.uid.clone() {
            lock(&self.uid_index)
                .refs
                .entry(uid)
                .or_insert_with(|| ObjectRef::from_obj(task));
        }
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
            let decision = decide::decide_status(msg, uid, robot, task.as_deref());
            let patch = match decision {
                Ok(StatusDecision::Apply(patch)) => patch,
                Ok(StatusDecision::Ignore(why)) => return Ok(Outcome::Done(why.outcome())),
                // The cache may lag behind the manager's dispatch: look once
                // at the API server before refusing.
                Err(decide::Rejection::FutureAttempt { .. }) if !fresh => {
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
                self.client.clone(),
                current.metadata.namespace.as_deref().unwrap_or_default(),
            );
            let name = current.metadata.name.clone().unwrap_or_default();
            let body = Guarded {
                metadata: RvOnly {
                    resource_version: current.metadata.resource_version.as_deref(),
                },
                status: &patch,
            };
            let result = self
                .call(
                    "task_status",
                    || format!("patching status of task {}", decide::task_name(current)),
                    api.patch_status(&name, &params(), &Patch::Merge(&body)),
                )
                .await;
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
            self.client.clone(),
            task.metadata.namespace.as_deref().unwrap_or_default(),
        );
        let name = task.metadata.name.clone().unwrap_or_default();
        let fresh = self
            .call("read", || format!("reading task {name}"), api.get_opt(&name))
            .await?;
        Ok(fresh
            .filter(|f| f.metadata.uid == task.metadata.uid)
            .map(Arc::new))
    }
}

/// Runs one inbound worker until its channel closes. A write that failed
/// for a reason other than a conflict is retried with capped backoff; the
/// robot's messages wait meanwhile, which keeps them in order.
pub async fn worker(bridge: Arc<Bridge>, mut inbound: mpsc::Receiver<Inbound>) {
    let mut heartbeats = HashMap::new();
    while let Some(message) = inbound.recv().await {
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

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn guarded_patch_bodies_carry_the_resource_version() {
        let status = RobotStatusPatch {
            last_heartbeat_time: Some("2026-11-22T10:00:00Z".parse().unwrap()),
            ..Default::default()
        };
        let body = Guarded {
            metadata: RvOnly {
                resource_version: Some("42"),
            },
            status: &status,
        };
        assert_eq!(
            serde_json::to_string(&body).unwrap(),
            r#"{"metadata":{"resourceVersion":"42"},"status":{"lastHeartbeatTime":"2026-11-22T10:00:00Z"}}"#
        );
        let mut labels = MetadataPatch::default();
        labels.labels.insert("gone".into(), None);
        let body = MetadataOnly {
            metadata: GuardedMetadata {
                resource_version: Some("7"),
                patch: &labels,
            },
        };
        assert_eq!(
            serde_json::to_string(&body).unwrap(),
            r#"{"metadata":{"resourceVersion":"7","labels":{"gone":null}}}"#
        );
    }
}
