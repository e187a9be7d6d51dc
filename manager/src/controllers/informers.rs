//! The informers: one watch per kind fills one shared cache, and the
//! handlers here see every change before the controllers do. They keep the
//! scheduler's state (what it knows of robots, the allocation ledger) current, carry
//! deletions (a deleted Task must free its robot and make its group
//! re-count), and trigger the controllers that should look: the object
//! itself and its owner.

use futures::StreamExt;
use k8s4r_api::{
    AgentRollout, Facts, GroupMode, Job, PeriodicJob, Robot, RobotPhase, Task, TaskGroup, TaskState,
};
use k8s4r_service::written::Written;
use k8s_openapi::api::coordination::v1::Lease;
use kube::runtime::reflector::{self, ObjectRef};
use kube::runtime::{watcher, WatchStreamExt};
use kube::{Api, Resource, ResourceExt};
use serde::de::DeserializeOwned;
use std::fmt::Debug;
use std::hash::Hash;

use super::context::{lock, Context, SchedState};
use super::facts::{facts_of, key_of, placement_of, SeenByGroup};
use crate::scheduler::{newly_met, robot_change, RobotChange};

/// Watches `api` into `writer`, each object changed by `shape` first (see
/// [`keep`] and [`k8s4r_service::watch::trim`]), handing every event to
/// `handle` after the cache took it in; errors are logged as `what` and the
/// watch backs off.
pub(super) async fn informer<K>(
    api: Api<K>,
    writer: reflector::store::Writer<K>,
    shape: fn(&mut K),
    what: &'static str,
    handle: impl Fn(&watcher::Event<K>),
) where
    K: Resource + Clone + DeserializeOwned + Debug + Send + Sync + 'static,
    K::DynamicType: Eq + Hash + Clone + Default,
{
    let reader = writer.as_reader();
    let events = watcher(api, watcher::Config::default())
        .modify(shape)
        .default_backoff()
        .reflect(writer);
    // A relist reaches the handlers only once the cache holds it.
    k8s4r_service::watch::settle_relists(events, reader)
        .for_each(|event| {
            match event {
                Ok(event) => handle(&event),
                Err(error) => tracing::warn!(%error, "{what}"),
            }
            futures::future::ready(())
        })
        .await;
}

/// Caches the object whole: the kinds whose `managedFields` say who asked
/// for a cancel or a retry (Tasks, TaskGroups, Jobs, AgentRollouts).
pub(super) fn keep<K>(_: &mut K) {}

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

impl Context {
    // The watch handlers below also trigger the controllers: every Task,
    // TaskGroup, Job and Robot the cache takes in is reconciled, and so is
    // its owner. (kube-runtime's shared-store subscriptions would do this,
    // but a subscriber that finds an object already deleted from the cache
    // stops waking up, and a Task recreated under that name then waited
    // forever.)

    pub(super) fn on_task(&self, event: &watcher::Event<Task>) {
        let Some((task, deleted)) = event_object(event) else {
            return;
        };
        self.group_tasks.observe(task, deleted);
        if !deleted {
            self.triggers.task(ObjectRef::from_obj(task));
        }
        if self.group_view_changed(task, deleted) {
            for group in owners_of::<TaskGroup, _>(task) {
                self.triggers.group(group);
            }
        }
        let key = key_of(task);
        let mut sched = self.sched();
        let before = sched.ledger.robot_of(&key).map(str::to_owned);
        if deleted {
            sched.ledger.remove(&key);
            sched.waiting.remove(&ObjectRef::from_obj(task));
            for lower in sched
                .yielded
                .remove(&ObjectRef::from_obj(task))
                .into_iter()
                .flatten()
            {
                self.triggers.task(lower);
            }
            self.metrics.set_waiting(sched.waiting.len());
        } else {
            let status = task.status.as_ref();
            let attempt = status.map_or(0, |s| s.attempt);
            let moved_on = status
                .and_then(|s| s.state)
                .is_some_and(|s| s != TaskState::Pending);
            if moved_on && sched.ledger.owed(&key).is_some_and(|(owed, _)| attempt < owed) {
                // Cancelled or failed before the placement made at its
                // creation was written: the robot's room is free again.
                sched.ledger.drop_owed(&key);
            }
            sched.ledger.observe(&key, attempt, placement_of(task));
        }
        let after = sched.ledger.robot_of(&key).map(str::to_owned);
        if before != after {
            for robot in before.iter().chain(after.iter()) {
                self.triggers.robot(robot);
            }
            if before.is_some() {
                // Room on a robot: tasks that found none may fit now, and
                // a rollout waiting for the robot's tasks may go on.
                for waiting in sched.waiting_by_priority() {
                    self.triggers.task(waiting);
                }
                self.trigger_rollouts();
            }
        }
        drop(sched);
        if deleted {
            lock(&self.seen).remove(&key);
            if let Some(uid) = task.metadata.uid.as_deref() {
                lock(&self.config_asked).remove(uid);
            }
        }
    }

    /// Whether what its TaskGroup reads of `task` changed (always, for a
    /// Task new or gone), remembering what it reads now.
    fn group_view_changed(&self, task: &Task, deleted: bool) -> bool {
        let key = key_of(task);
        let mut views = lock(&self.group_views);
        if deleted {
            views.remove(&key);
            return true;
        }
        let view = SeenByGroup::of(task, &self.config.lifecycle);
        views.insert(key, view.clone()) != Some(view)
    }

    pub(super) fn on_robot(&self, event: &watcher::Event<Robot>) {
        let mut sched = self.sched();
        match event {
            watcher::Event::Apply(r) | watcher::Event::InitApply(r) => {
                self.triggers.robot(&r.name_any());
                self.trigger_rollouts();
                let facts = facts_of(r);
                let name = facts.name.clone();
                let phase = facts.phase;
                let old = sched.robots.insert(name.clone(), facts);
                let new = &sched.robots[&name];
                match (robot_change(old.as_ref(), new), &old) {
                    (RobotChange::None, _) => {}
                    (RobotChange::Facts, Some(old)) => self.wake_for_facts(&sched, &old.facts, &new.facts),
                    _ => {
                        self.trigger_every_robot_groups();
                        for waiting in sched.waiting_by_priority() {
                            self.triggers.task(waiting);
                        }
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
                self.trigger_rollouts();
                sched.robots.remove(&name);
                self.trigger_every_robot_groups();
                for key in sched.ledger.tasks_on(&name) {
                    self.triggers.task(task_ref(&key));
                }
            }
            watcher::Event::Init | watcher::Event::InitDone => {}
        }
    }

    /// A robot's facts changed from `old` to `new`, and nothing else: the
    /// waiting tasks whose start conditions they meet now and did not
    /// before look again (at once: a task waiting for a battery level
    /// starts as soon as the robot reports it).
    fn wake_for_facts(&self, sched: &SchedState, old: &Facts, new: &Facts) {
        for waiting in sched.waiting_by_priority() {
            let wakes = self
                .stores
                .tasks
                .get(&waiting)
                .is_none_or(|t| newly_met(&t.spec.template.when, old, new));
            if wakes {
                self.triggers.task(waiting);
            }
        }
    }

    /// A robot came, went or changed: everyRobot groups look whether it is
    /// one of theirs now.
    fn trigger_every_robot_groups(&self) {
        for group in lock(&self.every_robot_groups).iter() {
            self.triggers.group(group.clone());
        }
    }

    pub(super) fn on_lease(&self, event: &watcher::Event<Lease>) {
        if let watcher::Event::Apply(lease) = event {
            // A renewed Lease only matters to a robot that is Offline now,
            // or whose Lease changed its promise (an idle robot took work:
            // its timeout shrinks from the idle Lease's to the configured
            // one, and its requeue must come sooner); other Online robots
            // look at their Lease when their requeue comes.
            let name = lease.name_any();
            let duration = lease.spec.as_ref().and_then(|s| s.lease_duration_seconds);
            let changed = lock(&self.lease_durations).insert(name.clone(), duration) != Some(duration);
            let offline = self
                .sched()
                .robots
                .get(&name)
                .is_some_and(|r| r.phase == Some(RobotPhase::Offline));
            if offline || changed {
                self.triggers.robot(&name);
            }
        }
    }

    pub(super) fn on_group(&self, event: &watcher::Event<TaskGroup>) {
        let Some((group, deleted)) = event_object(event) else {
            return;
        };
        self.job_groups.observe(group, deleted);
        let every_robot = !deleted && group.spec.template.mode == GroupMode::EveryRobot;
        let mut fleet = lock(&self.every_robot_groups);
        if every_robot {
            fleet.insert(ObjectRef::from_obj(group));
        } else {
            fleet.remove(&ObjectRef::from_obj(group));
        }
        drop(fleet);
        if wakes_itself(&self.written_groups, event, group, deleted) {
            self.triggers.group(ObjectRef::from_obj(group));
        }
        for job in owners_of::<Job, _>(group) {
            self.triggers.job(job);
        }
    }

    pub(super) fn on_job(&self, event: &watcher::Event<Job>) {
        let Some((job, deleted)) = event_object(event) else {
            return;
        };
        if wakes_itself(&self.written_jobs, event, job, deleted) {
            self.triggers.job(ObjectRef::from_obj(job));
        }
        for periodic in owners_of::<PeriodicJob, _>(job) {
            self.triggers.periodic(periodic);
        }
    }

    /// Every AgentRollout looks again (a robot came, went or changed;
    /// there are few rollouts, and their controller is debounced).
    fn trigger_rollouts(&self) {
        for rollout in self.stores.rollouts.state() {
            self.triggers.rollout(ObjectRef::from_obj(rollout.as_ref()));
        }
    }

    /// A rollout changed: it looks again. One deleted lets its robots go
    /// (the RobotController unmarks them).
    pub(super) fn on_rollout(&self, event: &watcher::Event<AgentRollout>) {
        match event_object(event) {
            Some((rollout, false)) => self.triggers.rollout(ObjectRef::from_obj(rollout)),
            Some((rollout, true)) => {
                let name = rollout.name_any();
                for robot in self.stores.robots.state() {
                    let marked = robot
                        .annotations()
                        .get(k8s4r_api::names::ANNOTATION_AGENT_ROLLOUT);
                    if marked == Some(&name) {
                        self.triggers.robot(&robot.name_any());
                    }
                }
            }
            None => {}
        }
    }

    pub(super) fn on_periodic(&self, event: &watcher::Event<PeriodicJob>) {
        if let Some((pj, false)) = event_object(event) {
            self.triggers.periodic(ObjectRef::from_obj(pj));
        }
    }

    /// Records the task's progress and says which Event, if any, it earns.
    /// (Dispatched is the server's Event: it published the dispatch and saw
    /// the broker accept it.)
    /// Also says whether the attempt was last seen running (a reconcile
    /// reads the newest object, so a short attempt may be seen dispatching,
    /// then already over).
    pub(super) fn progress(&self, task: &Task) -> Option<Progressed> {
        let status = task.status.as_ref();
        let now = (
            status.map_or(0, |s| s.attempt),
            status.and_then(|s| s.state),
            status.map_or(0, |s| s.restarts.restart_count),
            status.and_then(|s| s.config.as_ref()).map_or(0, |c| c.generation),
        );
        let previous = lock(&self.seen).insert(key_of(task), now);
        match (previous, now) {
            (Some(p), (attempt, Some(state), restarts, config)) if p != now => {
                let same_run = p.0 == attempt && p.1 == Some(state);
                Some(Progressed {
                    attempt,
                    state,
                    seen_running: p.0 == attempt && p.1 == Some(TaskState::Running),
                    restarted: (p.0 == attempt && restarts > p.2).then_some(restarts),
                    reconfigured: p.0 == attempt && config > p.3,
                    moved: !same_run,
                })
            }
            _ => None,
        }
    }
}

/// How a task moved since it was last seen.
pub(super) struct Progressed {
    pub attempt: u32,
    pub state: TaskState,
    /// The attempt was last seen running.
    pub seen_running: bool,
    /// The robot restarted the attempt since (its restart count now).
    pub restarted: Option<u32>,
    /// The robot reported taking a change of its configuration since.
    pub reconfigured: bool,
    /// The attempt or its state changed (not only its restarts).
    pub moved: bool,
}

/// Whether a Job's or TaskGroup's event asks for its own reconcile: not
/// when it is gone (its record of this manager's writes is dropped), nor
/// when it is the object's own status write coming back (its reconcile knew
/// all of it; at 100 Jobs a second those were a fifth of the group
/// controller's work). A relist's objects are always reconciled (a new
/// leader's first look).
fn wakes_itself<K: Resource>(
    written: &Written<K>,
    event: &watcher::Event<K>,
    obj: &K,
    deleted: bool,
) -> bool {
    if deleted {
        written.forget(&obj.uid().unwrap_or_default());
        return false;
    }
    matches!(event, watcher::Event::InitApply(_)) || !written.echo(obj)
}

fn task_ref(key: &str) -> ObjectRef<Task> {
    match key.split_once('/') {
        Some((ns, name)) => ObjectRef::new(name).within(ns),
        None => ObjectRef::new(key),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::lifecycle::LifecycleConfig;
    use k8s4r_api::names::{ANNOTATION_CANCEL, ANNOTATION_DISPATCHED_ATTEMPT, ANNOTATION_SENDING_ATTEMPT};
    use k8s4r_api::{TaskSpec, TaskStatus};

    fn task(state: TaskState) -> Task {
        let mut t = Task::new("j-g-0", TaskSpec::default());
        t.metadata.namespace = Some("ns".into());
        t.status = Some(TaskStatus {
            state: Some(state),
            attempt: 1,
            robot: Some("r1".into()),
            ..TaskStatus::default()
        });
        t
    }

    #[test]
    fn a_group_is_woken_only_by_what_it_reads_of_its_tasks() {
        let lifecycle = LifecycleConfig::default();
        let view = |t: &Task| SeenByGroup::of(t, &lifecycle);
        let dispatching = task(TaskState::Dispatching);

        // The server's records of sending a dispatch, a finalizer, a
        // restart on the robot: the group's counts stay as they were.
        let mut recorded = dispatching.clone();
        for record in [ANNOTATION_SENDING_ATTEMPT, ANNOTATION_DISPATCHED_ATTEMPT] {
            recorded.annotations_mut().insert(record.into(), "1".into());
        }
        recorded.finalizers_mut().push("robot.k8s4r.io/dispatch".into());
        if let Some(s) = recorded.status.as_mut() {
            s.restarts.restart_count = 2;
        }
        assert_eq!(view(&dispatching), view(&recorded));

        // A new state, another robot, a person's cancel, a deletion: it looks.
        let running = task(TaskState::Running);
        assert_ne!(view(&dispatching), view(&running));
        let mut moved = dispatching.clone();
        if let Some(s) = moved.status.as_mut() {
            s.robot = Some("r2".into());
        }
        assert_ne!(view(&dispatching), view(&moved));
        let mut cancelled = dispatching.clone();
        cancelled
            .annotations_mut()
            .insert(ANNOTATION_CANCEL.into(), "true".into());
        assert_ne!(view(&dispatching), view(&cancelled));
        let mut deleting = dispatching.clone();
        deleting.metadata.deletion_timestamp = Some(k8s_openapi::apimachinery::pkg::apis::meta::v1::Time(
            k8s_openapi::jiff::Timestamp::now(),
        ));
        assert_ne!(view(&dispatching), view(&deleting));
    }
}
