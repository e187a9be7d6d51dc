//! What every reconcile gets: the API client and its timeouts, the shared
//! caches, the scheduler's state, the triggers into the other controllers,
//! Events, and the per-object error backoff.

use std::collections::{BTreeMap, HashMap};
use std::future::Future;
use std::sync::{Arc, Mutex, MutexGuard};
use std::time::Instant;

use tokio::sync::Semaphore;

use futures::channel::mpsc::UnboundedSender;
use k8s4r_api::backoff::exponential;
use k8s4r_api::{AgentRollout, Job, ManualAction, PeriodicJob, Robot, Task, TaskGroup, TaskState};
use k8s4r_service::backoff::Failures;
use k8s4r_service::events::{Recorder, RoutineBudget};
use k8s4r_service::written::Written;
use k8s4r_service::Kube;
use k8s_openapi::api::coordination::v1::Lease;
use k8s_openapi::api::core::v1::ObjectReference;
use kube::runtime::controller::Action;
use kube::runtime::events::{Event, EventType};
use kube::runtime::reflector::{ObjectRef, Store};
use kube::{Api, Resource, ResourceExt};
use serde::Serialize;

use super::facts::key_of;
use super::pacing::Pacer;
use crate::config::ManagerConfig;
use crate::error::{Error, Result};
use crate::ledger::{Ledger, Placement};
use crate::metrics::Metrics;
use crate::scheduler::RobotFacts;

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
    /// Every Job.
    pub jobs: Store<Job>,
    /// Every AgentRollout.
    pub rollouts: Store<AgentRollout>,
    /// Every ConfigMap, keys and sizes only (see [`super::config`]).
    pub config_maps: Store<k8s_openapi::api::core::v1::ConfigMap>,
    /// Every Secret, keys and sizes only.
    pub secrets: Store<k8s_openapi::api::core::v1::Secret>,
}

/// The scheduler's state: one lock, held only for in-memory work.
#[derive(Debug, Default)]
pub struct SchedState {
    /// What is assigned where.
    pub ledger: Ledger,
    /// What the scheduler knows of each robot, by name.
    pub robots: BTreeMap<String, RobotFacts>,
    /// Tasks that found no robot, with their priority; reconsidered when
    /// robots or capacity change.
    pub waiting: HashMap<ObjectRef<Task>, i32>,
    /// Per waiting task, the tasks of lower priority that left it a robot
    /// and wait: woken when it is placed or gone.
    pub yielded: HashMap<ObjectRef<Task>, Vec<ObjectRef<Task>>>,
    /// The robot chosen last: the next decision looks at robots from there.
    pub cursor: String,
}

impl SchedState {
    /// The waiting tasks, highest priority first (the order they are woken
    /// in, so that the first to look at freed room is the most important).
    pub fn waiting_by_priority(&self) -> Vec<ObjectRef<Task>> {
        let mut waiting: Vec<(&ObjectRef<Task>, i32)> = self.waiting.iter().map(|(r, p)| (r, *p)).collect();
        waiting.sort_by_key(|w| std::cmp::Reverse(w.1));
        waiting.into_iter().map(|(r, _)| r.clone()).collect()
    }

    /// Forgets that `task` waits for a robot (it was placed, cancelled or
    /// is gone) and hands back the tasks of lower priority that left it a
    /// robot: they should look again.
    pub fn stop_waiting(&mut self, task: &ObjectRef<Task>) -> Vec<ObjectRef<Task>> {
        self.waiting.remove(task);
        self.yielded.remove(task).unwrap_or_default()
    }

    /// Records that `attempt` of `task` (key `key`) goes where `placement`
    /// says before the Task says so, so that the next decision counts it
    /// and looks on from its robot. Hands back the tasks to wake, as
    /// [`SchedState::stop_waiting`] does.
    pub fn placed(
        &mut self,
        key: &str,
        task: &ObjectRef<Task>,
        attempt: u32,
        placement: Placement,
    ) -> Vec<ObjectRef<Task>> {
        self.cursor.clone_from(&placement.robot);
        self.ledger.reserve(key, attempt, placement);
        self.stop_waiting(task)
    }

    /// Records that `task` (of `priority`) found no robot, and that it left
    /// robots to `outranked_by`: each of them wakes it once placed or gone.
    pub fn unplaced(&mut self, task: &ObjectRef<Task>, priority: i32, outranked_by: &[ObjectRef<Task>]) {
        self.waiting.insert(task.clone(), priority);
        for higher in outranked_by {
            self.yielded.entry(higher.clone()).or_default().push(task.clone());
        }
    }
}

/// An Event a plan asks for; the controller publishes it once the write it
/// goes with succeeded.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Note {
    /// Normal or Warning.
    pub type_: EventType,
    /// The reason `kubectl describe` shows (`Completed`, `Rejected`, ...).
    pub reason: &'static str,
    /// For a person.
    pub message: String,
}

impl Note {
    /// A Normal Event.
    pub fn normal(reason: &'static str, message: impl Into<String>) -> Self {
        Note {
            type_: EventType::Normal,
            reason,
            message: message.into(),
        }
    }

    /// A Warning Event.
    pub fn warning(reason: &'static str, message: impl Into<String>) -> Self {
        Note {
            type_: EventType::Warning,
            reason,
            message: message.into(),
        }
    }
}

/// What became of a person's cancel and retry of a Job or TaskGroup (see
/// [`Context::pass_on_requests`]).
#[derive(Clone, Debug, Default, PartialEq)]
pub struct Requests {
    /// The cancel to record in the owner's status.
    pub cancellation: Option<ManualAction>,
    /// The retry to record in the owner's status.
    pub retry: Option<ManualAction>,
    /// The owner stays cancelled: nothing new starts.
    pub cancelled: bool,
}

/// Where triggers for each controller go.
#[derive(Clone)]
pub(crate) struct Triggers {
    pub(super) task: UnboundedSender<ObjectRef<Task>>,
    pub(super) group: UnboundedSender<ObjectRef<TaskGroup>>,
    pub(super) job: UnboundedSender<ObjectRef<Job>>,
    pub(super) robot: UnboundedSender<ObjectRef<Robot>>,
    pub(super) periodic: UnboundedSender<ObjectRef<PeriodicJob>>,
    pub(super) rollout: UnboundedSender<ObjectRef<AgentRollout>>,
}

impl Triggers {
    pub(super) fn task(&self, r: ObjectRef<Task>) {
        // A closed channel means the controller stopped: shutting down.
        let _ = self.task.unbounded_send(r);
    }
    pub(super) fn group(&self, r: ObjectRef<TaskGroup>) {
        let _ = self.group.unbounded_send(r);
    }
    pub(super) fn job(&self, r: ObjectRef<Job>) {
        let _ = self.job.unbounded_send(r);
    }
    pub(super) fn periodic(&self, r: ObjectRef<PeriodicJob>) {
        let _ = self.periodic.unbounded_send(r);
    }
    pub(super) fn rollout(&self, r: ObjectRef<AgentRollout>) {
        let _ = self.rollout.unbounded_send(r);
    }
    pub(crate) fn robot(&self, name: &str) {
        let _ = self.robot.unbounded_send(ObjectRef::new(name));
    }
}

/// A task's attempt and state.
/// (attempt, state, restarts on the robot) of a task.
pub(super) type Progress = (u32, Option<TaskState>, u32, u64);

/// What every reconcile gets.
pub struct Context {
    /// The API client, the timeout of every call, the field manager.
    pub kube: Kube,
    /// The configuration.
    pub config: ManagerConfig,
    /// The metrics.
    pub metrics: Arc<Metrics>,
    /// The shared caches.
    pub stores: Stores,
    pub(super) sched: Mutex<SchedState>,
    pub(crate) triggers: Triggers,
    pub(super) events: Option<EventSink>,
    pub(super) failures: Failures<String>,
    /// Per task: the (attempt, state) last seen, to publish an
    /// Event once per transition.
    pub(super) seen: Mutex<HashMap<String, Progress>>,
    /// The everyRobot TaskGroups, woken when robots come, go or change
    /// (kept apart so that a robot's change costs nothing when there are
    /// none, however many other groups there are).
    pub(super) every_robot_groups: Mutex<std::collections::HashSet<ObjectRef<TaskGroup>>>,
    /// Each robot Lease's `leaseDurationSeconds` as last watched: a change
    /// (an idle robot took work, or went idle) wakes the robot.
    pub(super) lease_durations: Mutex<HashMap<String, Option<i32>>>,
    /// Paces each Robot's `allocated` (`allocation_interval`).
    pub(super) allocations: Pacer,
    /// Paces TaskGroup and Job status writes that only move their counts
    /// (`progress_interval`).
    pub(super) progress: Pacer,
    /// Per task: what its TaskGroup last read of it (a change wakes the
    /// group).
    pub(super) group_views: Mutex<HashMap<String, super::facts::SeenByGroup>>,
    /// The Jobs and TaskGroups whose status this manager wrote, until the
    /// watch brings them back: the next reconcile reads the newer, and the
    /// write coming back does not wake the object itself (it still wakes
    /// its owner: see [`Written`]).
    pub(super) written_jobs: Written<Job>,
    pub(super) written_groups: Written<TaskGroup>,
    /// Each controller's reconcile slots, `concurrency` of them (see
    /// [`Context::instrumented`] and [`reconcile_slots`]).
    pub(super) slots: HashMap<&'static str, Semaphore>,
    /// Tasks by the uid of their TaskGroup.
    pub(super) group_tasks: Children<Task>,
    /// Per task uid: the configuration refresh this manager last asked
    /// for, until its cache shows it (controllers/task/refresh.rs).
    pub(super) config_asked: Mutex<HashMap<String, k8s4r_api::config_ref::ConfigRefresh>>,
    /// Held while a restart for a configuration change is decided and
    /// asked for, so that a group never has more under way than its
    /// `maxParallel`.
    pub(super) config_turns: tokio::sync::Mutex<()>,
    /// TaskGroups by the uid of their Job.
    pub(super) job_groups: Children<TaskGroup>,
}

/// Cached objects by the uids of their owners, kept by the watch handlers:
/// a reconcile finds its children without looking at every cached object
/// (with 10,000 Jobs, scanning the whole cache per reconcile was most of
/// the manager's time).
pub(super) struct Children<K: Resource<DynamicType = ()>> {
    by_owner: Mutex<HashMap<String, std::collections::HashSet<ObjectRef<K>>>>,
}

impl<K: Resource<DynamicType = ()> + Clone> Default for Children<K> {
    fn default() -> Self {
        Children {
            by_owner: Mutex::default(),
        }
    }
}

impl<K: Resource<DynamicType = ()> + Clone> Children<K> {
    /// Takes in a change of `obj`, as the cache did.
    pub(super) fn observe(&self, obj: &K, deleted: bool) {
        let me = ObjectRef::from_obj(obj);
        let mut by_owner = lock(&self.by_owner);
        for owner in obj.owner_references() {
            if deleted {
                if let Some(set) = by_owner.get_mut(&owner.uid) {
                    set.remove(&me);
                    if set.is_empty() {
                        by_owner.remove(&owner.uid);
                    }
                }
            } else {
                by_owner.entry(owner.uid.clone()).or_default().insert(me.clone());
            }
        }
    }

    /// The cached objects `owner` (a uid) owns now.
    pub(super) fn of(&self, store: &Store<K>, owner: &str) -> Vec<Arc<K>> {
        let refs: Vec<ObjectRef<K>> = lock(&self.by_owner)
            .get(owner)
            .map(|set| set.iter().cloned().collect())
            .unwrap_or_default();
        refs.iter()
            .filter_map(|r| store.get(r))
            .filter(|o| o.owner_references().iter().any(|ref_| ref_.uid == owner))
            .collect()
    }
}

pub(super) use k8s4r_service::lock;

/// The kind of `K`, for messages.
fn kind_of<K: Resource<DynamicType = ()>>() -> std::borrow::Cow<'static, str> {
    K::kind(&())
}

impl Context {
    /// `None` when `obj`'s status may be written now (and then it is taken
    /// as written); else how long until it may: a write that is only
    /// progress waits for its turn, the first one counted from `obj`'s
    /// creation, or from the first ask for a young one
    /// (controllers/pacing.rs). Keyed by kind too, as a TaskGroup
    /// may share a Job's name.
    pub(super) fn progress_due<K: Resource<DynamicType = ()>>(
        &self,
        obj: &K,
        progress: bool,
    ) -> Option<std::time::Duration> {
        let key = format!("{}/{}", kind_of::<K>(), key_of(obj));
        self.progress.due(&key, !progress, age_of(obj))
    }

    /// The API client.
    pub fn client(&self) -> kube::Client {
        self.kube.client().clone()
    }

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
        let Some(sink) = &self.events else {
            return;
        };
        if !sink.routine.admits(type_) {
            if !sink.routine.is_off() {
                self.metrics.events_dropped.inc();
            }
            return;
        }
        if sink.tx.try_send(queued(obj, type_, reason, note)).is_err() {
            tracing::debug!(reason, "event queue full, dropping event");
        }
    }

    /// Publishes the Event a plan asked for (see [`Context::event`]).
    pub fn publish<K: Resource<DynamicType = ()>>(&self, obj: &K, note: Note) {
        self.event(obj, note.type_, note.reason, note.message);
    }

    /// Queues the Event that is the last record of `obj`, about to be
    /// deleted. Unlike [`Context::event`], the routine budget never holds
    /// it back (there is one per deleted object, and the deletion saves
    /// more writes than the Event costs), and a full queue is waited for,
    /// up to the API timeout, instead of dropping it: past that it is an
    /// error, so that the deletion waits too.
    pub async fn record<K: Resource<DynamicType = ()>>(&self, obj: &K, note: Note) -> Result<()> {
        let Some(sink) = &self.events else {
            return Ok(());
        };
        let reason = note.reason;
        let event = queued(obj, note.type_, reason, note.message);
        let why = match tokio::time::timeout(self.config.api_timeout, sink.tx.send(event)).await {
            Ok(Ok(())) => return Ok(()),
            // The publisher stops only at shutdown.
            Ok(Err(_)) => "the event publisher stopped".to_owned(),
            Err(_) => format!("the event queue stayed full for {:?}", self.config.api_timeout),
        };
        let meta = obj.meta();
        Err(Error::EventNotRecorded {
            reason,
            object: format!(
                "{} {}/{}",
                kind_of::<K>(),
                meta.namespace.as_deref().unwrap_or_default(),
                meta.name.as_deref().unwrap_or_default()
            ),
            why,
        })
    }

    /// Runs an API call about the `K` named `name` under the configured
    /// timeout; `action` ("create", "delete", ...) names it in the error.
    pub async fn api<K: Resource<DynamicType = ()>, T>(
        &self,
        action: &'static str,
        name: &str,
        call: impl Future<Output = kube::Result<T>>,
    ) -> Result<T> {
        let what = || format!("{action} {} {name}", kind_of::<K>());
        Ok(self.kube.write(action, what, call).await?)
    }

    /// Merge-patches the status of `name` under the manager's field manager.
    /// With `resource_version`, the patch applies only to that version (a
    /// 409 otherwise), for decisions that depend on what was read.
    pub async fn patch_status<K, S>(
        &self,
        api: &Api<K>,
        name: &str,
        resource_version: Option<String>,
        status: S,
    ) -> Result<K>
    where
        K: Resource<DynamicType = ()> + Clone + serde::de::DeserializeOwned + std::fmt::Debug,
        S: Serialize + std::fmt::Debug,
    {
        let what = || format!("patch status of {} {name}", kind_of::<K>());
        let rv = resource_version.as_deref();
        Ok(self
            .kube
            .patch_status("patch status of", api, name, rv, &status, what)
            .await?)
    }

    /// Merge-patches `patch` (annotations) onto each of `names`, a few at a
    /// time; one already gone is skipped.
    pub async fn annotate_all<K>(
        &self,
        api: &Api<K>,
        names: &[String],
        patch: &serde_json::Value,
    ) -> Result<()>
    where
        K: Resource<DynamicType = ()> + Clone + serde::de::DeserializeOwned + std::fmt::Debug,
    {
        use futures::{stream, TryStreamExt};
        stream::iter(names.iter().map(Ok))
            .try_for_each_concurrent(16, |name| async move {
                let params = self.kube.patch_params();
                let merge = kube::api::Patch::Merge(patch);
                let call = api.patch(name, &params, &merge);
                match self.api::<K, _>("annotate", name, call).await {
                    Ok(_) => Ok(()),
                    Err(Error::Api(e)) if e.is_not_found() => Ok(()),
                    Err(e) => Err(e),
                }
            })
            .await
    }

    /// Acts on a person's cancel and retry of a Job or TaskGroup (`owner`,
    /// whose status last recorded `previous`): records a new request with
    /// an Event, passes a new retry to the children named `retry_to`, and
    /// passes a cancel that holds to every child lacking it (also those
    /// the cache showed late). `children` are the owner's children (name,
    /// their cancel annotation) and `what` names them ("tasks").
    /// Returns the records to keep and whether the owner stays cancelled.
    #[allow(clippy::too_many_arguments)]
    pub async fn pass_on_requests<O, C>(
        &self,
        owner: &O,
        previous: (Option<&ManualAction>, Option<&ManualAction>),
        api: &Api<C>,
        children: &[(String, Option<String>)],
        retry_to: &[String],
        what: &str,
    ) -> Result<Requests>
    where
        O: Resource<DynamicType = ()>,
        C: Resource<DynamicType = ()> + Clone + serde::de::DeserializeOwned + std::fmt::Debug,
    {
        use crate::manual;
        use k8s4r_api::names::{ANNOTATION_CANCEL, ANNOTATION_RETRY};
        let now = jiff::Timestamp::now();
        let asked = manual::decide_owner(owner.meta(), previous.0, previous.1);
        let mut cancellation = previous.0.cloned();
        let mut retry = previous.1.cloned();
        if let Some(cancel) = asked.cancel {
            let action = cancel.acted(now, 0, format!("cancel passed to {} {what}", children.len()));
            self.event(
                owner,
                EventType::Normal,
                "Cancelled",
                action.message.clone().unwrap_or_default(),
            );
            cancellation = Some(action);
        }
        if let Some(again) = asked.retry {
            self.annotate_all(api, retry_to, &manual::passed_on(ANNOTATION_RETRY, &again))
                .await?;
            let action = again.acted(now, 0, format!("retry passed to {} {what}", retry_to.len()));
            self.event(
                owner,
                EventType::Normal,
                "Retried",
                action.message.clone().unwrap_or_default(),
            );
            retry = Some(action);
        }
        let cancelled = manual::still_cancelled(cancellation.as_ref(), retry.as_ref());
        if let Some(cancel) = cancellation.as_ref().filter(|_| cancelled) {
            let lacking: Vec<String> = children
                .iter()
                .filter(|(_, value)| value.as_deref() != Some(cancel.value.as_str()))
                .map(|(name, _)| name.clone())
                .collect();
            let request = manual::Request {
                value: cancel.value.clone(),
                by: cancel.by.clone(),
            };
            self.annotate_all(api, &lacking, &manual::passed_on(ANNOTATION_CANCEL, &request))
                .await?;
        }
        Ok(Requests {
            cancellation,
            retry,
            cancelled,
        })
    }

    /// Wraps a reconcile of `obj`: it waits for one of the controller's
    /// `concurrency` slots, first come first served, then reconciles the
    /// object as `look` finds it now (it may have changed while it waited;
    /// one gone from the cache is not reconciled, as kube-runtime does), and
    /// counts the metrics and the errors for the backoff.
    ///
    /// The controllers run with kube-runtime's own limit off: at its limit
    /// kube-runtime parks due objects in a hash set and serves them in the
    /// set's order, so under a steady backlog some waited minutes while
    /// later ones went first (100,000 robots: Tasks created 520 s after
    /// their TaskGroup). Here they wait in a fair queue instead.
    pub async fn instrumented<K, F>(
        &self,
        controller: &'static str,
        obj: Arc<K>,
        look: Look<'_, K>,
        reconcile: impl FnOnce(Arc<K>) -> F,
    ) -> Result<Action>
    where
        K: Resource<DynamicType = ()> + Clone + 'static,
        F: Future<Output = Result<Action>>,
    {
        let m = self.metrics.controller(controller);
        let Some(obj) = look.current(obj) else {
            return Ok(Action::await_change());
        };
        let slots = &self.slots[controller];
        m.waiting.inc();
        let slot = slots.acquire().await;
        m.waiting.dec();
        let Ok(_slot) = slot else {
            return Ok(Action::await_change());
        };
        let Some(obj) = look.current(obj) else {
            return Ok(Action::await_change());
        };
        let key = failure_key(controller, &key_of(obj.as_ref()));
        m.in_flight.inc();
        let start = Instant::now();
        let result = reconcile(obj).await;
        m.in_flight.dec();
        k8s4r_service::metrics::observe(&m.duration, start.elapsed());
        m.reconciles.inc();
        match &result {
            Ok(_) => {
                if self.failures.succeeded(&key) {
                    m.backing_off.dec();
                }
            }
            Err(e) => {
                m.errors.inc();
                if e.is_conflict() {
                    tracing::debug!(controller, object = %key, error = %e, "conflict, re-reading");
                } else {
                    tracing::warn!(controller, object = %key, error = %e, "reconcile failed");
                }
            }
        }
        result
    }

    /// Shutting down: reconciles still waiting for a slot give up (those
    /// running finish), and none waits again.
    pub(super) fn close_slots(&self) {
        for slots in self.slots.values() {
            slots.close();
        }
    }

    /// The requeue after a failed reconcile: exponential per object, capped.
    pub fn error_policy(&self, controller: &'static str, key: &str, error: &Error) -> Action {
        let n = self.failures.failed(failure_key(controller, key));
        if n == 1 {
            self.metrics.controller(controller).backing_off.inc();
        }
        // Someone else wrote first: re-read soon, that is not a fault.
        let base = if error.is_conflict() && n <= 3 {
            self.config.error_backoff / 10
        } else {
            self.config.error_backoff
        };
        Action::requeue(exponential(base, self.config.error_backoff_max, n - 1))
    }
}

/// `concurrency` reconcile slots for each of [`crate::metrics::CONTROLLERS`].
pub(super) fn reconcile_slots(concurrency: u16) -> HashMap<&'static str, Semaphore> {
    let n = usize::from(concurrency.max(1));
    crate::metrics::CONTROLLERS
        .iter()
        .map(|c| (*c, Semaphore::new(n)))
        .collect()
}

/// Where a reconcile finds its object once it has a slot.
pub struct Look<'a, K: Resource<DynamicType = ()> + 'static> {
    /// The cache to read it from (`None`: the object as triggered).
    pub store: Option<&'a Store<K>>,
    /// This manager's own last writes of the kind: the newer of the cache
    /// and its last write is reconciled.
    pub written: Option<&'a Written<K>>,
}

impl<'a, K: Resource<DynamicType = ()> + Clone + 'static> Look<'a, K> {
    /// Read from `store`.
    pub fn cached(store: &'a Store<K>) -> Self {
        Look {
            store: Some(store),
            written: None,
        }
    }

    /// The object as it stands now; `None` when the cache no longer holds
    /// it.
    fn current(&self, obj: Arc<K>) -> Option<Arc<K>> {
        let Some(store) = self.store else {
            return Some(obj);
        };
        let cached = store.get(&ObjectRef::from_obj(obj.as_ref()))?;
        Some(match self.written {
            Some(written) => written.newest(cached),
            None => cached,
        })
    }
}

/// The key of an object's failures in `controller` (a Task and a TaskGroup
/// may share a name).
fn failure_key(controller: &str, key: &str) -> String {
    format!("{controller}:{key}")
}

/// An Event about `obj` as the publisher's queue takes it.
fn queued<K: Resource<DynamicType = ()>>(
    obj: &K,
    type_: EventType,
    reason: &str,
    note: String,
) -> (ObjectReference, Event) {
    let event = Event {
        type_,
        reason: reason.to_owned(),
        note: Some(note),
        action: reason.to_owned(),
        secondary: None,
    };
    (obj.object_ref(&()), event)
}

/// Where Events go: the publisher's queue, and the limit on routine ones.
pub(super) struct EventSink {
    pub(super) tx: tokio::sync::mpsc::Sender<(ObjectReference, Event)>,
    /// The budget of routine (Normal) Events.
    pub(super) routine: RoutineBudget,
}

impl EventSink {
    /// A sink into `tx` that lets routine Events through as `routine`
    /// allows.
    pub(super) fn new(
        tx: tokio::sync::mpsc::Sender<(ObjectReference, Event)>,
        routine: RoutineBudget,
    ) -> Self {
        EventSink { tx, routine }
    }
}

/// Publishes queued Events until the queue closes.
pub(super) async fn publish_events(
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

/// How long ago `obj` was created (by its creation time, in whole seconds;
/// none if that is ahead of this clock); the longest time if it says none.
pub(super) fn age_of<K: Resource>(obj: &K) -> std::time::Duration {
    match obj.meta().creation_timestamp.as_ref() {
        Some(created) => std::time::Duration::try_from(jiff::Timestamp::now().duration_since(created.0))
            .unwrap_or(std::time::Duration::ZERO),
        None => std::time::Duration::MAX,
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use k8s_openapi::apimachinery::pkg::apis::meta::v1::OwnerReference;
    use kube::runtime::{reflector, watcher};

    fn owned(name: &str, owner: &str) -> k8s_openapi::api::core::v1::ConfigMap {
        let mut m = k8s_openapi::api::core::v1::ConfigMap::default();
        m.metadata.name = Some(name.into());
        m.metadata.namespace = Some("ns".into());
        m.metadata.owner_references = Some(vec![OwnerReference {
            uid: owner.into(),
            ..OwnerReference::default()
        }]);
        m
    }

    #[test]
    fn children_follow_the_cache() {
        let (store, mut writer) = reflector::store();
        let children = Children::default();
        let apply = |writer: &mut reflector::store::Writer<_>,
                     obj: &k8s_openapi::api::core::v1::ConfigMap,
                     deleted| {
            let event = if deleted {
                watcher::Event::Delete(obj.clone())
            } else {
                watcher::Event::Apply(obj.clone())
            };
            writer.apply_watcher_event(&event);
            children.observe(obj, deleted);
        };
        let (a, b, c) = (owned("a", "u1"), owned("b", "u1"), owned("c", "u2"));
        for o in [&a, &b, &c] {
            apply(&mut writer, o, false);
        }
        let names = |owner: &str| {
            let mut n: Vec<String> = children.of(&store, owner).iter().map(|o| o.name_any()).collect();
            n.sort();
            n
        };
        assert_eq!(names("u1"), ["a", "b"]);
        assert_eq!(names("u2"), ["c"]);
        apply(&mut writer, &a, true);
        assert_eq!(names("u1"), ["b"]);
        // Given to another owner: no longer the first one's.
        apply(&mut writer, &owned("b", "u2"), false);
        assert!(names("u1").is_empty());
        assert_eq!(names("u2"), ["b", "c"]);
    }

    fn task_ref(name: &str) -> ObjectRef<Task> {
        ObjectRef::new(name).within("ns")
    }

    #[test]
    fn a_task_placed_wakes_the_tasks_that_yielded_to_it() {
        let mut sched = SchedState::default();
        let (hi, lo) = (task_ref("hi"), task_ref("lo"));
        sched.unplaced(&hi, 10, &[]);
        sched.unplaced(&lo, 1, std::slice::from_ref(&hi));
        assert_eq!(sched.waiting_by_priority(), [hi.clone(), lo.clone()]);
        let placement = Placement {
            robot: "r1".into(),
            group: "ns/j-g".into(),
            demand: Default::default(),
        };
        assert_eq!(sched.placed("ns/hi", &hi, 1, placement), vec![lo.clone()]);
        assert_eq!(sched.cursor, "r1");
        assert_eq!(sched.ledger.attempt_of("ns/hi"), Some(1));
        assert_eq!(sched.ledger.usage("r1").map(|u| u.tasks), Some(1));
        assert_eq!(sched.waiting_by_priority(), vec![lo.clone()]);
        assert!(sched.stop_waiting(&lo).is_empty());
        assert!(sched.waiting.is_empty());
    }
}
