//! The four controllers, the caches they share and the plumbing between them.
//!
//! One watch per kind fills one shared cache; the controllers subscribe to
//! it, so a Task change is read off the wire once however many controllers
//! care. The informer loops also carry what kube-runtime's subscriptions
//! leave out: deletions (a deleted Task must free its robot and make its
//! group re-count) and the scheduler's own state (robot facts and the
//! allocation ledger), which they update before the controllers hear of the
//! change. What the informers learn that should reconcile another object
//! enters that object's controller through a channel (`reconcile_on`).

pub mod job;
pub mod robot;
pub mod task;
pub mod taskgroup;

use std::collections::{BTreeMap, HashMap, HashSet};
use std::future::Future;
use std::sync::{Arc, Mutex, MutexGuard};
use std::time::{Duration, Instant};

use futures::channel::mpsc::{unbounded, UnboundedSender};
use futures::StreamExt;
use k8s4r_api::names::{LABEL_GROUP, LABEL_JOB, MANAGER_CONTROLLERS};
use k8s4r_api::{Job, Robot, RobotPhase, Task, TaskGroup, TaskState};
use k8s_openapi::api::coordination::v1::Lease;
use k8s_openapi::api::core::v1::ObjectReference;
use kube::api::{Patch, PatchParams};
use kube::runtime::controller::Action;
use kube::runtime::events::{Event, EventType, Recorder, Reporter};
use kube::runtime::reflector::{self, ObjectRef, Store};
use kube::runtime::{watcher, Controller, WatchStreamExt};
use kube::{Api, Client, Resource, ResourceExt};
use serde::Serialize;
use tokio_util::sync::CancellationToken;

use crate::config::{error_backoff, ManagerConfig};
use crate::error::{Error, Result};
use crate::ledger::{Ledger, Placement};
use crate::metrics::Metrics;
use crate::scheduler::{Demand, RobotFacts};

/// The caches the controllers read instead of asking the API server.
#[derive(Clone)]
pub struct Stores {
    /// Every Task.
    pub tasks: Store<Task>,
    /// Every TaskGroup.
    pub groups: Store<TaskGroup>,
    /// Every Robot.
    pub robots: Store<Robot>,
    /// The robots' Leases.
    pub leases: Store<Lease>,
}

/// The scheduler's state: one lock, held only for in-memory work.
#[derive(Debug, Default)]
pub struct SchedState {
    /// What is assigned where.
    pub ledger: Ledger,
    /// What the scheduler knows of each robot, by name.
    pub robots: BTreeMap<String, RobotFacts>,
    /// Tasks that found no robot; reconsidered when robots or capacity change.
    pub waiting: HashSet<ObjectRef<Task>>,
}

/// Where triggers for each controller go.
#[derive(Clone)]
pub(crate) struct Triggers {
    task: UnboundedSender<ObjectRef<Task>>,
    group: UnboundedSender<ObjectRef<TaskGroup>>,
    job: UnboundedSender<ObjectRef<Job>>,
    robot: UnboundedSender<ObjectRef<Robot>>,
}

impl Triggers {
    fn task(&self, r: ObjectRef<Task>) {
        // A closed channel means the controller stopped: shutting down.
        let _ = self.task.unbounded_send(r);
    }
    fn group(&self, r: ObjectRef<TaskGroup>) {
        let _ = self.group.unbounded_send(r);
    }
    fn job(&self, r: ObjectRef<Job>) {
        let _ = self.job.unbounded_send(r);
    }
    pub(crate) fn robot(&self, name: &str) {
        let _ = self.robot.unbounded_send(ObjectRef::new(name));
    }
}

/// The owners of `obj` of kind `O`, in its namespace.
fn owners_of<O, K>(obj: &K) -> impl Iterator<Item = ObjectRef<O>> + '_
where
    O: Resource<DynamicType = ()>,
    K: Resource,
{
    let ns = obj.meta().namespace.clone();
    obj.owner_references()
        .iter()
        .filter(|o| o.kind == O::kind(&()) && o.api_version == O::api_version(&()))
        .map(move |o| {
            let r = ObjectRef::new(&o.name);
            match &ns {
                Some(ns) => r.within(ns),
                None => r,
            }
        })
}

/// The object an event shows, and whether it is gone (`None` for the
/// markers around a relist).
fn event_object<K>(event: &watcher::Event<K>) -> Option<(&K, bool)> {
    match event {
        watcher::Event::Apply(o) | watcher::Event::InitApply(o) => Some((o, false)),
        watcher::Event::Delete(o) => Some((o, true)),
        watcher::Event::Init | watcher::Event::InitDone => None,
    }
}

/// What every reconcile gets.
pub struct Context {
    /// The API client.
    pub client: Client,
    /// The configuration.
    pub config: ManagerConfig,
    /// The metrics.
    pub metrics: Arc<Metrics>,
    /// The shared caches.
    pub stores: Stores,
    sched: Mutex<SchedState>,
    pub(crate) triggers: Triggers,
    events: Option<tokio::sync::mpsc::Sender<(ObjectReference, Event)>>,
    failures: Mutex<HashMap<String, u32>>,
    /// Per task: the (attempt, state) last seen, to publish an
    /// Event once per transition.
    seen: Mutex<HashMap<String, Progress>>,
}

/// A task's attempt and state.
type Progress = (u32, Option<TaskState>);

fn lock<T>(m: &Mutex<T>) -> MutexGuard<'_, T> {
    // A panic while holding the lock leaves plain data behind; keep going.
    m.lock().unwrap_or_else(|p| p.into_inner())
}

impl Context {
    /// The scheduler's state, locked.
    pub fn sched(&self) -> MutexGuard<'_, SchedState> {
        lock(&self.sched)
    }

    /// Publishes an Event about `obj` in the background (best effort: a
    /// full queue drops it rather than slow a reconcile down).
    pub fn event<K: Resource<DynamicType = ()>>(
        &self,
        obj: &K,
        type_: EventType,
        reason: &str,
        note: String,
    ) {
        let Some(tx) = &self.events else {
            return;
        };
        let event = Event {
            type_,
            reason: reason.to_owned(),
            note: Some(note),
            action: reason.to_owned(),
            secondary: None,
        };
        if tx.try_send((obj.object_ref(&()), event)).is_err() {
            tracing::debug!(reason, "event queue full, dropping event");
        }
    }

    /// Runs an API call under the configured timeout.
    pub async fn api<T>(
        &self,
        action: &'static str,
        kind: &'static str,
        name: &str,
        call: impl Future<Output = kube::Result<T>>,
    ) -> Result<T> {
        match tokio::time::timeout(self.config.api_timeout, call).await {
            Ok(Ok(v)) => Ok(v),
            Ok(Err(source)) => Err(Error::Kube {
                action,
                kind,
                name: name.to_owned(),
                source,
            }),
            Err(_) => Err(Error::ApiTimeout {
                action,
                kind,
                name: name.to_owned(),
                after: self.config.api_timeout,
            }),
        }
    }

    /// Merge-patches the status of `name` under the manager's field manager.
    /// With `resource_version`, the patch applies only to that version (a
    /// 409 otherwise), for decisions that depend on what was read.
    pub async fn patch_status<K, S>(
        &self,
        api: &Api<K>,
        kind: &'static str,
        name: &str,
        resource_version: Option<String>,
        status: S,
    ) -> Result<K>
    where
        K: Clone + serde::de::DeserializeOwned + std::fmt::Debug,
        S: Serialize + std::fmt::Debug,
    {
        let body = StatusPatch {
            metadata: resource_version.map(|resource_version| Versioned { resource_version }),
            status,
        };
        self.api(
            "patch status of",
            kind,
            name,
            api.patch_status(name, &patch_params(), &Patch::Merge(&body)),
        )
        .await
    }

    /// Wraps a reconcile: metrics, and the error count for the backoff.
    pub async fn instrumented(
        &self,
        controller: &'static str,
        key: String,
        reconcile: impl Future<Output = Result<Action>>,
    ) -> Result<Action> {
        let m = self.metrics.controller(controller);
        m.in_flight.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
        let start = Instant::now();
        let result = reconcile.await;
        m.in_flight.fetch_sub(1, std::sync::atomic::Ordering::Relaxed);
        m.duration.observe(start.elapsed());
        m.reconciles.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
        match &result {
            Ok(_) => {
                if lock(&self.failures).remove(&key).is_some() {
                    m.backing_off.fetch_sub(1, std::sync::atomic::Ordering::Relaxed);
                }
            }
            Err(e) => {
                m.errors.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
                if e.is_conflict() {
                    tracing::debug!(controller, object = %key, error = %e, "conflict, re-reading");
                } else {
                    tracing::warn!(controller, object = %key, error = %e, "reconcile failed");
                }
            }
        }
        result
    }

    /// The requeue after a failed reconcile: exponential per object, capped.
    pub fn error_policy(&self, controller: &'static str, key: String, error: &Error) -> Action {
        let mut failures = lock(&self.failures);
        let n = failures.entry(key).or_insert(0);
        *n += 1;
        if *n == 1 {
            self.metrics
                .controller(controller)
                .backing_off
                .fetch_add(1, std::sync::atomic::Ordering::Relaxed);
        }
        // Someone else wrote first: re-read soon, that is not a fault.
        let base = if error.is_conflict() && *n <= 3 {
            self.config.error_backoff / 10
        } else {
            self.config.error_backoff
        };
        Action::requeue(error_backoff(base, self.config.error_backoff_max, *n))
    }
}

#[derive(Debug, Serialize)]
struct StatusPatch<S> {
    #[serde(skip_serializing_if = "Option::is_none")]
    metadata: Option<Versioned>,
    status: S,
}

#[derive(Debug, Serialize)]
#[serde(rename_all = "camelCase")]
struct Versioned {
    resource_version: String,
}

/// Patch parameters: the manager's field manager.
pub fn patch_params() -> PatchParams {
    PatchParams {
        field_manager: Some(MANAGER_CONTROLLERS.to_owned()),
        ..PatchParams::default()
    }
}

/// `namespace/name` of a namespaced object.
pub fn key_of<K: Resource>(obj: &K) -> String {
    format!("{}/{}", obj.namespace().unwrap_or_default(), obj.name_any())
}

/// The spread group of a task: its TaskGroup (by label, else by owner).
pub fn group_of(task: &Task) -> String {
    let ns = task.namespace().unwrap_or_default();
    let labels = task.labels();
    match (labels.get(LABEL_JOB), labels.get(LABEL_GROUP)) {
        (Some(job), Some(group)) => format!("{ns}/{job}-{group}"),
        _ => match task.owner_references().first() {
            Some(owner) => format!("{ns}/{}", owner.name),
            None => key_of(task),
        },
    }
}

/// What a task requests; unparsable quantities count as nothing (the spec
/// is validated before scheduling, so they never get that far).
pub fn demand_of(task: &Task) -> Demand {
    let resources = task.spec.template.resources.as_ref();
    Demand {
        cpu_milli: resources
            .and_then(|r| r.cpu.as_ref())
            .and_then(|q| q.to_milli().ok())
            .unwrap_or(0),
        memory_bytes: resources
            .and_then(|r| r.memory.as_ref())
            .and_then(|q| q.to_units().ok())
            .unwrap_or(0),
    }
}

/// Where a Task's current attempt sits, if it occupies a robot.
pub fn placement_of(task: &Task) -> Option<Placement> {
    let status = task.status.as_ref()?;
    if !matches!(status.state, Some(TaskState::Dispatching | TaskState::Running)) {
        return None;
    }
    let robot = status.robot.clone().or_else(|| task.spec.target_robot.clone())?;
    Some(Placement {
        robot,
        group: group_of(task),
        demand: demand_of(task),
    })
}

/// What the scheduler needs to know about a Robot.
pub fn facts_of(robot: &Robot) -> RobotFacts {
    let status = robot.status.clone().unwrap_or_default();
    let mut attributes = BTreeMap::new();
    if let Some(d) = &status.device {
        attributes.insert("arch".to_owned(), d.arch.clone());
        attributes.insert("os".to_owned(), d.os.clone());
        attributes.insert("cpus".to_owned(), d.cpus.to_string());
        attributes.insert("memory".to_owned(), d.memory_bytes.to_string());
        for (k, v) in [
            ("osVersion", &d.os_version),
            ("kernel", &d.kernel),
            ("hostname", &d.hostname),
        ] {
            if let Some(v) = v {
                attributes.insert(k.to_owned(), v.clone());
            }
        }
    }
    if let Some(v) = &status.agent_version {
        attributes.insert("agentVersion".to_owned(), v.clone());
    }
    let capacity = status.capacity.as_ref();
    RobotFacts {
        name: robot.name_any(),
        phase: status.phase,
        unschedulable: robot.spec.unschedulable,
        labels: robot.labels().clone(),
        attributes,
        drivers: status.drivers.clone(),
        cpu_milli: capacity
            .and_then(|c| c.cpu.as_ref())
            .and_then(|q| q.to_milli().ok()),
        memory_bytes: capacity
            .and_then(|c| c.memory.as_ref())
            .and_then(|q| q.to_units().ok()),
    }
}

impl Context {
    // The watch handlers below also trigger the controllers: every Task,
    // TaskGroup, Job and Robot the cache takes in is reconciled, and so is
    // its owner. (kube-runtime's shared-store subscriptions would do this,
    // but a subscriber that finds an object already deleted from the cache
    // stops waking up, and a Task recreated under that name then waited
    // forever.)

    fn on_task(&self, event: &watcher::Event<Task>) {
        let Some((task, deleted)) = event_object(event) else {
            return;
        };
        if !deleted {
            self.triggers.task(ObjectRef::from_obj(task));
        }
        for group in owners_of::<TaskGroup, _>(task) {
            self.triggers.group(group);
        }
        let key = key_of(task);
        let mut sched = self.sched();
        let before = sched.ledger.robot_of(&key).map(str::to_owned);
        if deleted {
            sched.ledger.remove(&key);
            sched.waiting.remove(&ObjectRef::from_obj(task));
            self.metrics
                .waiting
                .store(sched.waiting.len() as i64, std::sync::atomic::Ordering::Relaxed);
        } else {
            let attempt = task.status.as_ref().map_or(0, |s| s.attempt);
            sched.ledger.observe(&key, attempt, placement_of(task));
        }
        let after = sched.ledger.robot_of(&key).map(str::to_owned);
        if before != after {
            for robot in before.iter().chain(after.iter()) {
                self.triggers.robot(robot);
            }
            if before.is_some() {
                // Room on a robot: tasks that found none may fit now.
                for waiting in &sched.waiting {
                    self.triggers.task(waiting.clone());
                }
            }
        }
        drop(sched);
        if deleted {
            lock(&self.seen).remove(&key);
        }
    }

    fn on_robot(&self, event: &watcher::Event<Robot>) {
        let mut sched = self.sched();
        match event {
            watcher::Event::Apply(r) | watcher::Event::InitApply(r) => {
                self.triggers.robot(&r.name_any());
                let facts = facts_of(r);
                let name = facts.name.clone();
                let phase = facts.phase;
                let old = sched.robots.insert(name.clone(), facts);
                let changed = old.as_ref() != sched.robots.get(&name);
                if changed {
                    for waiting in &sched.waiting {
                        self.triggers.task(waiting.clone());
                    }
                }
                if old.map(|o| o.phase) != Some(phase) {
                    for key in sched.ledger.tasks_on(&name) {
                        self.triggers.task(task_ref(&key));
                    }
                }
            }
            watcher::Event::Delete(r) => {
                let name = r.name_any();
                sched.robots.remove(&name);
                for key in sched.ledger.tasks_on(&name) {
                    self.triggers.task(task_ref(&key));
                }
            }
            watcher::Event::Init | watcher::Event::InitDone => {}
        }
    }

    fn on_lease(&self, event: &watcher::Event<Lease>) {
        if let watcher::Event::Apply(lease) = event {
            // A renewed Lease only matters to a robot that is Offline now;
            // Online robots look at their Lease when their requeue comes.
            let name = lease.name_any();
            let offline = self
                .sched()
                .robots
                .get(&name)
                .is_some_and(|r| r.phase == Some(RobotPhase::Offline));
            if offline {
                self.triggers.robot(&name);
            }
        }
    }

    fn on_group(&self, event: &watcher::Event<TaskGroup>) {
        let Some((group, deleted)) = event_object(event) else {
            return;
        };
        if !deleted {
            self.triggers.group(ObjectRef::from_obj(group));
        }
        for job in owners_of::<Job, _>(group) {
            self.triggers.job(job);
        }
    }

    fn on_job(&self, event: &watcher::Event<Job>) {
        if let Some((job, false)) = event_object(event) {
            self.triggers.job(ObjectRef::from_obj(job));
        }
    }

    /// Records the task's progress and says which Event, if any, it earns.
    /// (Dispatched is the server's Event: it published the dispatch and saw
    /// the broker accept it.)
    fn progress(&self, task: &Task) -> Option<(u32, TaskState)> {
        let status = task.status.as_ref();
        let now = (status.map_or(0, |s| s.attempt), status.and_then(|s| s.state));
        let previous = lock(&self.seen).insert(key_of(task), now);
        match (previous, now) {
            (Some(p), (attempt, Some(state))) if p != now => Some((attempt, state)),
            _ => None,
        }
    }
}

fn task_ref(key: &str) -> ObjectRef<Task> {
    match key.split_once('/') {
        Some((ns, name)) => ObjectRef::new(name).within(ns),
        None => ObjectRef::new(key),
    }
}

/// Publishes queued Events until the queue closes.
async fn publish_events(
    recorder: Recorder,
    mut rx: tokio::sync::mpsc::Receiver<(ObjectReference, Event)>,
    timeout: std::time::Duration,
) {
    while let Some((reference, event)) = rx.recv().await {
        match tokio::time::timeout(timeout, recorder.publish(&event, &reference)).await {
            Ok(Ok(())) => {}
            Ok(Err(e)) => tracing::debug!(error = %e, reason = %event.reason, "publishing an event failed"),
            Err(_) => tracing::debug!(reason = %event.reason, "publishing an event timed out"),
        }
    }
}

/// Starts the caches and the four controllers; returns when `shutdown` is
/// cancelled and the controllers have drained.
pub async fn run(
    client: Client,
    config: ManagerConfig,
    metrics: Arc<Metrics>,
    identity: String,
    shutdown: CancellationToken,
) -> Result<()> {
    let (task_tx, task_rx) = unbounded();
    let (group_tx, group_rx) = unbounded();
    let (job_tx, job_rx) = unbounded();
    let (robot_tx, robot_rx) = unbounded();

    let (tasks, task_writer) = reflector::store::<Task>();
    let (groups, group_writer) = reflector::store::<TaskGroup>();
    let (robots, robot_writer) = reflector::store::<Robot>();
    let (jobs, job_writer) = reflector::store::<Job>();
    let (leases, lease_writer) = reflector::store::<Lease>();

    let (events_tx, events_rx) = tokio::sync::mpsc::channel(4096);
    let events = config.events.then_some(events_tx);
    if events.is_some() {
        let recorder = Recorder::new(
            client.clone(),
            Reporter {
                controller: MANAGER_CONTROLLERS.to_owned(),
                instance: Some(identity),
            },
        );
        tokio::spawn(publish_events(recorder, events_rx, config.api_timeout));
    }

    let ctx = Arc::new(Context {
        client: client.clone(),
        metrics: metrics.clone(),
        stores: Stores {
            tasks: tasks.clone(),
            groups: groups.clone(),
            robots: robots.clone(),
            leases: leases.clone(),
        },
        sched: Mutex::default(),
        triggers: Triggers {
            task: task_tx,
            group: group_tx,
            job: job_tx,
            robot: robot_tx,
        },
        events,
        failures: Mutex::default(),
        seen: Mutex::default(),
        config,
    });

    let wc = watcher::Config::default();
    let informers = {
        let c1 = ctx.clone();
        let task_informer = watcher(Api::<Task>::all(client.clone()), wc.clone())
            .default_backoff()
            .reflect(task_writer)
            .for_each(move |ev| {
                match ev {
                    Ok(ev) => c1.on_task(&ev),
                    Err(e) => tracing::warn!(error = %e, "task watch"),
                }
                futures::future::ready(())
            });
        let c2 = ctx.clone();
        let robot_informer = watcher(Api::<Robot>::all(client.clone()), wc.clone())
            .default_backoff()
            .reflect(robot_writer)
            .for_each(move |ev| {
                match ev {
                    Ok(ev) => c2.on_robot(&ev),
                    Err(e) => tracing::warn!(error = %e, "robot watch"),
                }
                futures::future::ready(())
            });
        let c3 = ctx.clone();
        let group_informer = watcher(Api::<TaskGroup>::all(client.clone()), wc.clone())
            .default_backoff()
            .reflect(group_writer)
            .for_each(move |ev| {
                match ev {
                    Ok(ev) => c3.on_group(&ev),
                    Err(e) => tracing::warn!(error = %e, "taskgroup watch"),
                }
                futures::future::ready(())
            });
        let c4 = ctx.clone();
        let lease_api = Api::<Lease>::namespaced(client.clone(), &ctx.config.robot_lease_namespace);
        let lease_informer = watcher(lease_api, wc.clone())
            .default_backoff()
            .reflect(lease_writer)
            .for_each(move |ev| {
                match ev {
                    Ok(ev) => c4.on_lease(&ev),
                    Err(e) => tracing::warn!(error = %e, "robot lease watch"),
                }
                futures::future::ready(())
            });
        // The Job cache is filled before its controller starts, like the
        // others (a controller with a cache of its own waits for it even
        // while shutting down).
        let c5 = ctx.clone();
        let job_informer = watcher(Api::<Job>::all(client.clone()), wc.clone())
            .default_backoff()
            .reflect(job_writer)
            .for_each(move |ev| {
                match ev {
                    Ok(ev) => c5.on_job(&ev),
                    Err(e) => tracing::warn!(error = %e, "job watch"),
                }
                futures::future::ready(())
            });
        async move {
            tokio::join!(
                task_informer,
                robot_informer,
                group_informer,
                lease_informer,
                job_informer
            );
        }
    };
    let informers = tokio::spawn(informers);

    // Scheduling before every robot and every assignment is known would
    // double-book robots: wait for the caches first.
    let ready = async {
        let _ = tokio::join!(
            tasks.wait_until_ready(),
            groups.wait_until_ready(),
            robots.wait_until_ready(),
            leases.wait_until_ready(),
            jobs.wait_until_ready()
        );
    };
    tokio::select! {
        _ = ready => {}
        _ = shutdown.cancelled() => {
            informers.abort();
            return Ok(());
        }
    }
    tracing::info!("caches filled, starting controllers");
    metrics.ready.store(true, std::sync::atomic::Ordering::Relaxed);

    let stop = || shutdown.clone().cancelled_owned();
    // Every trigger comes from the watch handlers through `reconcile_on`.
    let task_ctrl = Controller::for_stream(futures::stream::pending(), tasks)
        .reconcile_on(task_rx)
        .graceful_shutdown_on(stop())
        .run(task::reconcile, task::error_policy, ctx.clone())
        .for_each(|_| futures::future::ready(()));
    let status_config = || kube::runtime::controller::Config::default().debounce(ctx.config.status_debounce);
    let group_ctrl = Controller::for_stream(futures::stream::pending(), groups)
        .with_config(status_config())
        .reconcile_on(group_rx)
        .graceful_shutdown_on(stop())
        .run(taskgroup::reconcile, taskgroup::error_policy, ctx.clone())
        .for_each(|_| futures::future::ready(()));
    let job_ctrl = Controller::for_stream(futures::stream::pending(), jobs)
        .with_config(status_config())
        .reconcile_on(job_rx)
        .graceful_shutdown_on(stop())
        .run(job::reconcile, job::error_policy, ctx.clone())
        .for_each(|_| futures::future::ready(()));
    let robot_ctrl = Controller::for_stream(futures::stream::pending(), robots)
        .with_config(kube::runtime::controller::Config::default().debounce(ctx.config.robot_debounce))
        .reconcile_on(robot_rx)
        .graceful_shutdown_on(stop())
        .run(robot::reconcile, robot::error_policy, ctx.clone())
        .for_each(|_| futures::future::ready(()));
    let drained = async {
        tokio::join!(task_ctrl, group_ctrl, job_ctrl, robot_ctrl);
    };
    // Reconciles in flight finish (each API call is bounded by the API
    // timeout); past the grace period the controllers are dropped, so that
    // a stop or a lost Lease always ends.
    let grace = ctx.config.api_timeout + Duration::from_secs(5);
    tokio::select! {
        () = drained => {}
        () = async { shutdown.cancelled().await; tokio::time::sleep(grace).await } => {
            tracing::warn!(?grace, "controllers did not drain in time; stopping them");
        }
    }
    informers.abort();
    metrics.ready.store(false, std::sync::atomic::Ordering::Relaxed);
    tracing::info!("controllers stopped");
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;
    use k8s4r_api::{
        DeviceInfo, Quantity, RobotResources, RobotSpec, RobotStatus, TaskResources, TaskSpec, TaskStatus,
        TaskTemplate,
    };

    fn task(state: Option<TaskState>) -> Task {
        let mut t = Task::new(
            "j-g-0",
            TaskSpec {
                template: TaskTemplate {
                    driver: "exec".into(),
                    command: "true".into(),
                    resources: Some(TaskResources {
                        cpu: Some(Quantity::from("250m")),
                        memory: Some(Quantity::from("64Mi")),
                    }),
                    ..TaskTemplate::default()
                },
                target_robot: Some("r1".into()),
                ..TaskSpec::default()
            },
        );
        t.metadata.namespace = Some("ns".into());
        t.labels_mut().insert(LABEL_JOB.into(), "j".into());
        t.labels_mut().insert(LABEL_GROUP.into(), "g".into());
        t.status = Some(TaskStatus {
            state,
            attempt: 1,
            ..TaskStatus::default()
        });
        t
    }

    #[test]
    fn only_dispatching_and_running_tasks_occupy_a_robot() {
        let running = placement_of(&task(Some(TaskState::Running))).unwrap();
        assert_eq!(running.robot, "r1");
        assert_eq!(running.group, "ns/j-g");
        assert_eq!(
            running.demand,
            Demand {
                cpu_milli: 250,
                memory_bytes: 64 << 20
            }
        );
        assert!(placement_of(&task(Some(TaskState::Dispatching))).is_some());
        for state in [
            None,
            Some(TaskState::Pending),
            Some(TaskState::Completed),
            Some(TaskState::Failed),
        ] {
            assert!(placement_of(&task(state)).is_none(), "{state:?}");
        }
    }

    #[test]
    fn robot_facts_come_from_labels_device_and_capacity() {
        let mut robot = Robot::new("r1", RobotSpec { unschedulable: true });
        robot.labels_mut().insert("site".into(), "lab".into());
        robot.status = Some(RobotStatus {
            phase: Some(RobotPhase::Online),
            device: Some(DeviceInfo {
                arch: "aarch64".into(),
                os: "linux".into(),
                cpus: 4,
                memory_bytes: 1024,
                kernel: Some("6.1".into()),
                ..DeviceInfo::default()
            }),
            capacity: Some(RobotResources {
                cpu: Some(Quantity::from("4")),
                memory: Some(Quantity::from("1Gi")),
                tasks: 0,
            }),
            agent_version: Some("0.1.0".into()),
            drivers: vec!["exec".into()],
            ..RobotStatus::default()
        });
        let f = facts_of(&robot);
        assert!(f.unschedulable);
        assert_eq!(f.attribute("arch"), Some("aarch64"));
        assert_eq!(f.attribute("kernel"), Some("6.1"));
        assert_eq!(f.attribute("cpus"), Some("4"));
        assert_eq!(f.attribute("agentVersion"), Some("0.1.0"));
        assert_eq!(f.attribute("label.site"), Some("lab"));
        assert_eq!(f.attribute("hostname"), None);
        assert_eq!((f.cpu_milli, f.memory_bytes), (Some(4000), Some(1 << 30)));
    }
}
