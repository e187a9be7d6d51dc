//! Robot messages about Tasks: status updates, and the attempts a robot
//! says it holds compared with what the Tasks want of it.

use std::collections::{HashMap, HashSet};
use std::sync::Arc;
use std::time::{Duration, Instant};

use jiff::Timestamp;
use k8s4r_api::protocol::{encode, HeldList, StatusUpdate};
use k8s4r_api::validation::{validate_dns_label, validate_robot_id};
use k8s4r_api::{Task, TaskAttempt};
use k8s4r_service::lock;
use kube::runtime::reflector::ObjectRef;
use kube::Api;
use tracing::{info, instrument, warn};

use super::{not_approved, Bridge, Outcome, CONFLICT_TRIES};
use crate::decide::{self, LeaseRecord, StatusDecision, Stop, TaskStatusPatch};
use crate::error::Result;
use crate::held::{HeldMemory, Permit};

/// What a look-up of a uid the cache lacks found.
enum Lookup {
    /// The Task exists (the cache lags).
    Found(Arc<Task>),
    /// No Task has this uid: it was deleted (uids are never reused).
    Gone,
    /// Not known now; nothing may be concluded (why, and the counter's label).
    Deferred(String, &'static str),
}

/// Where each Task lives, by uid and by robot.
#[derive(Default)]
pub(super) struct UidIndex {
    refs: HashMap<String, ObjectRef<Task>>,
    rebuilt: Option<Instant>,
    /// The Tasks targeting each robot, as last seen (deleted ones linger
    /// until looked up: the cache no longer has them).
    by_robot: HashMap<String, HashSet<ObjectRef<Task>>>,
    robot_of: HashMap<ObjectRef<Task>, String>,
}

impl Bridge {
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

    /// Looks up a uid the cache lacks in the API server, by the Task's
    /// name (from the robot's message, else from what this server saw),
    /// when the robot's budget and the uid's interval allow and the Task
    /// watch is in sync. `wait`: only after the uid has been missing for a
    /// while (see [`crate::held`]).
    async fn look_up(
        &self,
        uid: &str,
        name: Option<&str>,
        wait: bool,
        held: &mut HeldMemory,
    ) -> Result<Lookup> {
        if !self.task_sync.is_synced() {
            return Ok(Lookup::Deferred(
                "this server's Task watch is not in sync".into(),
                "deferred_unsynced",
            ));
        }
        let indexed = || {
            lock(&self.uid_index)
                .refs
                .get(uid)
                .map(|r| format!("{}/{}", r.namespace.clone().unwrap_or_default(), r.name))
        };
        let Some((namespace, task)) = name
            .map(str::to_owned)
            .or_else(indexed)
            .and_then(|n| split_task_name(&n))
        else {
            return Ok(Lookup::Deferred(
                "the robot did not name the Task, and this server never saw it".into(),
                "deferred_no_name",
            ));
        };
        let permit = held.may_check(uid, wait, tokio::time::Instant::now());
        if permit != Permit::Granted {
            self.metrics.message_out("task_read", permit.outcome());
            return Ok(Lookup::Deferred(
                format!("not read now ({})", permit.outcome()),
                "deferred_unknown_task",
            ));
        }
        let api: Api<Task> = Api::namespaced(self.kube.client().clone(), &namespace);
        let read = self
            .kube
            .read(|| format!("reading task {namespace}/{task}"), api.get_opt(&task))
            .await?;
        self.metrics.message_out("task_read", "read");
        match read {
            Some(found) if found.metadata.uid.as_deref() == Some(uid) => {
                held.known(uid);
                Ok(Lookup::Found(Arc::new(found)))
            }
            _ => {
                held.gone(uid);
                Ok(Lookup::Gone)
            }
        }
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
    /// "reconcile"), `sent_at` being the server's time as the robot
    /// reckoned it when it built the list. What this costs is bounded per
    /// robot by `held`.
    pub(super) async fn reconcile(
        &self,
        robot: &str,
        report: &HeldList,
        sent_at: Option<Timestamp>,
        held: &mut HeldMemory,
    ) -> Result<()> {
        // A uid listed twice counts once.
        let mut seen = HashSet::new();
        let listed: Vec<TaskAttempt> = report
            .running
            .iter()
            .filter(|a| seen.insert((a.uid.as_str(), a.attempt)))
            .cloned()
            .collect();
        if report.reconcile {
            held.retain_listed(&listed);
        }
        let holding = decide::Holding {
            held: &listed,
            complete: report.reconcile,
            last_seq: report.last_seq,
            sent_at,
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
        for (attempt, why) in &plan.cancel {
            held.known(&attempt.uid);
            self.cancel_held(robot, attempt, why, held);
        }
        for attempt in &plan.unknown {
            match self
                .look_up(&attempt.uid, attempt.name.as_deref(), true, held)
                .await?
            {
                Lookup::Found(task) => {
                    if let Some(why) = decide::unwanted(attempt, robot, &task) {
                        self.cancel_held(robot, attempt, &why, held);
                    }
                }
                Lookup::Gone => {
                    let gone = Stop::cancel("the Task no longer exists");
                    self.cancel_held(robot, attempt, &gone, held);
                }
                Lookup::Deferred(_, outcome) => self.metrics.message_out("cancel", outcome),
            }
        }
        for (uid, patch) in &plan.lost {
            let Some(task) = assigned
                .iter()
                .find(|t| t.metadata.uid.as_deref() == Some(uid.as_str()))
            else {
                continue;
            };
            let written = self
                .patch_task_status(task, patch, || {
                    format!("failing task {} (not on its robot)", decide::task_name(task))
                })
                .await;
            match written {
                Ok(_) => failed_as_lost(task, robot, patch),
                // Changed meanwhile (a status arrived): the next report decides.
                Err(e) if e.is_conflict() || e.is_not_found() => {}
                Err(e) => return Err(e.into()),
            }
        }
        Ok(())
    }

    /// Cancels an attempt the robot lists and should not hold (or drains
    /// it, for `k8s4r drain`): on the bulk queue, at most once per uid per
    /// interval and within the robot's budget (the robot's next report
    /// calls for it again).
    fn cancel_held(&self, robot: &str, attempt: &TaskAttempt, stop: &Stop, held: &mut HeldMemory) {
        let permit = held.may_cancel(&attempt.uid, tokio::time::Instant::now());
        if permit != Permit::Granted {
            self.metrics.message_out("cancel", permit.outcome());
            return;
        }
        let body = encode(&stop.message(&attempt.uid, attempt.attempt));
        let sent = self.publisher.send_bulk(self.topics.cancel(robot), body);
        info!(task_uid = %attempt.uid, attempt = attempt.attempt, reason = %stop.reason, drain = stop.drain, sent, "cancelling an attempt no Task wants");
        self.metrics
            .message_out("cancel", if sent { "queued" } else { "failed" });
    }

    pub(super) fn task_by_uid(&self, uid: &str) -> Option<Arc<Task>> {
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
    pub(super) async fn status(
        &self,
        msg: &StatusUpdate,
        uid: &str,
        robot: &str,
        held: &mut HeldMemory,
        lease: &mut Option<LeaseRecord>,
    ) -> Result<Outcome> {
        if let Some(robot) = self.robot_cache.get(&ObjectRef::new(robot)) {
            if let Some(refusal) = not_approved(&robot) {
                return Ok(refusal);
            }
        }
        let mut task = self.task_by_uid(uid).map(|t| self.written.newest(t));
        let mut fresh = false;
        if task.is_none() {
            // Gone, or not in this replica's cache yet: only the API server
            // can say which.
            match self.look_up(uid, msg.task_name.as_deref(), false, held).await? {
                Lookup::Found(found) => {
                    task = Some(found);
                    fresh = true;
                }
                Lookup::Gone => {}
                Lookup::Deferred(why, outcome) => return Ok(Outcome::Deferred(why, outcome)),
            }
        }
        for tries in 1.. {
            let decision = decide::decide_status(msg, uid, robot, task.as_deref(), Timestamp::now());
            let written = match decision {
                Ok(StatusDecision::Apply(patch)) => {
                    let current = task.as_deref().expect("an applied decision has a task");
                    self.apply_status(current, msg, robot, &patch, lease).await
                }
                Ok(StatusDecision::Record(record)) => {
                    let current = task.as_deref().expect("a recorded decision has a task");
                    self.write_status(current, &record)
                        .await
                        .map(|()| Outcome::Done("recorded"))
                }
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
            match written {
                Err(e) if e.is_conflict() && tries < CONFLICT_TRIES => {
                    task = self.fresh_task(task.as_deref()).await?;
                    fresh = true;
                }
                written => return written,
            }
        }
        unreachable!("the loop returns")
    }

    /// Writes a status the robot reported (a `Running` one only once the
    /// robot's Lease promises the short interval).
    async fn apply_status(
        &self,
        task: &Task,
        msg: &StatusUpdate,
        robot: &str,
        patch: &TaskStatusPatch,
        lease: &mut Option<LeaseRecord>,
    ) -> Result<Outcome> {
        if !patch.state.is_terminal() {
            // Heard holding work: the Lease promises the short interval
            // before anyone reads the attempt as running.
            self.renew_for_work(robot, lease).await?;
        }
        self.write_status(task, patch).await?;
        info!(
            state = patch.state.as_str(),
            attempt = msg.attempt,
            seq = msg.seq,
            "task status applied"
        );
        Ok(Outcome::Done("applied"))
    }

    /// Patches `task`'s status, guarded by the version it was decided on,
    /// and keeps what was written.
    pub(crate) async fn write_status<S: serde::Serialize + std::fmt::Debug>(
        &self,
        task: &Task,
        patch: &S,
    ) -> Result<()> {
        let written = self
            .patch_task_status(task, patch, || {
                format!("patching status of task {}", decide::task_name(task))
            })
            .await?;
        self.record_written(written);
        Ok(())
    }

    /// Patches `task`'s status, guarded by its resourceVersion; `action`
    /// names the write in an error.
    async fn patch_task_status<S: serde::Serialize + std::fmt::Debug>(
        &self,
        task: &Task,
        patch: &S,
        action: impl FnOnce() -> String,
    ) -> std::result::Result<Task, k8s4r_service::call::ApiError> {
        let api: Api<Task> = Api::namespaced(
            self.kube.client().clone(),
            task.metadata.namespace.as_deref().unwrap_or_default(),
        );
        let name = task.metadata.name.clone().unwrap_or_default();
        self.kube
            .patch_status(
                "task_status",
                &api,
                &name,
                task.metadata.resource_version.as_deref(),
                patch,
                action,
            )
            .await
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
        let fresh = fresh.filter(|f| f.metadata.uid == task.metadata.uid);
        if let Some(fresh) = &fresh {
            self.record_written(fresh.clone());
        }
        Ok(fresh.map(Arc::new))
    }
}

/// `namespace/name` split and checked (it comes from a robot).
fn split_task_name(name: &str) -> Option<(String, String)> {
    let (namespace, task) = name.split_once('/')?;
    validate_dns_label(namespace).ok()?;
    // A Task's name is a DNS-1123 subdomain, as a robot id is.
    validate_robot_id(task).ok()?;
    Some((namespace.to_owned(), task.to_owned()))
}

/// Says that a Task's attempt its robot does not hold was failed: it ran,
/// or its dispatch was past its deadline (the patch says which).
fn failed_as_lost(task: &Task, robot: &str, patch: &decide::TaskStatusPatch) {
    warn!(
        task = %decide::task_name(task),
        robot,
        reason = ?patch.reason,
        why = patch.message.as_deref().unwrap_or_default(),
        "the robot does not hold the Task's attempt: failed it"
    );
}
