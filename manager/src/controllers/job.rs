//! JobController: one TaskGroup per group of a Job, the Job's status, and
//! its deletion once its time after finishing is up ([`crate::expiry`]).

use std::collections::BTreeMap;
use std::sync::Arc;

use jiff::Timestamp;
use k8s4r_api::condition::set_condition;
use k8s4r_api::names::CONDITION_FAILED;
use k8s4r_api::names::{ANNOTATION_CANCEL, LABEL_JOB};
use k8s4r_api::validation::validate_job_spec;
use k8s4r_api::{
    ConditionStatus, GroupMode, Job, JobSpec, JobStatus, TaskGroup, TaskGroupSpec, TaskGroupTemplate,
    WorkState,
};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::OwnerReference;
use kube::api::{DeleteParams, ObjectMeta, Preconditions};
use kube::runtime::controller::Action;
use kube::runtime::events::EventType;
use kube::runtime::reflector::ObjectRef;
use kube::{Api, Resource, ResourceExt};
use tracing::instrument;

use super::context::age_of;
use super::pacing::{awaits_group, job_progress_only};
use super::{condition_at, key_of, Context, Look, Note, Requests};
use crate::aggregate::{gates, job_status, Gate, GroupView};
use crate::deadline::{active_deadline, fail_past_deadline, ActiveDeadline};
use crate::error::{Error, Result};
use crate::expiry::{plan_expiry, Expiry, REASON_EXPIRED};

/// Reconciles one Job.
#[instrument(skip_all, fields(job = %key_of(job.as_ref())))]
pub async fn reconcile(job: Arc<Job>, ctx: Arc<Context>) -> Result<Action> {
    let ctx = ctx.as_ref();
    let look = Look {
        store: Some(&ctx.stores.jobs),
        written: Some(&ctx.written_jobs),
    };
    ctx.instrumented(
        "job",
        job,
        look,
        |job| async move { reconcile_job(&job, ctx).await },
    )
    .await
}

/// Backs off a Job whose reconcile failed.
pub fn error_policy(job: Arc<Job>, error: &Error, ctx: Arc<Context>) -> Action {
    ctx.error_policy("job", &key_of(job.as_ref()), error)
}

/// The TaskGroup name of a Job's group.
pub fn group_name(job: &str, group: &str) -> String {
    format!("{job}-{group}")
}

/// A group with the Job's selector and constraints merged in.
pub fn merged_group(job: &JobSpec, group: &TaskGroupTemplate) -> TaskGroupTemplate {
    let robot_selector = match (&job.robot_selector, &group.robot_selector) {
        (Some(a), Some(b)) => Some(a.and(b)),
        (a, b) => a.clone().or_else(|| b.clone()),
    };
    let mut constraints = job.constraints.clone();
    constraints.extend(group.constraints.iter().cloned());
    TaskGroupTemplate {
        robot_selector,
        constraints,
        ..group.clone()
    }
}

/// The spec of each TaskGroup a Job should have, by name.
pub fn desired_groups(job_name: &str, spec: &JobSpec) -> BTreeMap<String, TaskGroupSpec> {
    spec.task_groups
        .iter()
        .map(|g| {
            (
                group_name(job_name, &g.name),
                TaskGroupSpec {
                    template: merged_group(spec, g),
                    job: job_name.to_owned(),
                    priority: spec.priority,
                    pending_deadline_seconds: spec.pending_deadline_seconds,
                },
            )
        })
        .collect()
}

fn ignore(code: u16, result: Result<()>) -> Result<()> {
    match result {
        Err(Error::Api(e)) if e.code() == Some(code) => Ok(()),
        other => other,
    }
}

async fn reconcile_job(job: &Job, ctx: &Context) -> Result<Action> {
    if job.meta().deletion_timestamp.is_some() {
        return Ok(Action::await_change());
    }
    let ns = job.namespace().unwrap_or_default();
    let name = job.name_any();
    let jobs: Api<Job> = Api::namespaced(ctx.client(), &ns);
    let groups_api: Api<TaskGroup> = Api::namespaced(ctx.client(), &ns);

    if let Err(errors) = validate_job_spec(&job.spec) {
        let message = errors.to_string();
        let mut written = None;
        if let Some(status) = plan_invalid(job, &message, Timestamp::now()) {
            written = Some(write_status(ctx, &jobs, &name, &status).await?);
            ctx.event(job, EventType::Warning, "InvalidSpec", message);
        }
        return expire(ctx, &jobs, written.as_ref().unwrap_or(job)).await;
    }

    let owner = job.controller_owner_ref(&()).ok_or_else(|| Error::Malformed {
        kind: "Job",
        name: name.clone(),
        reason: "no uid to own task groups with".into(),
    })?;

    // A person's cancel or retry of the Job goes to its TaskGroups.
    let before = job.status.clone().unwrap_or_default();
    let uid = job.uid().unwrap_or_default();
    let owned: Vec<Arc<TaskGroup>> = ctx.job_groups.of(&ctx.stores.groups, &uid);
    let (children, retry_to) = requests_to_pass(&owned);
    let mut requests = ctx
        .pass_on_requests(
            job,
            (before.cancellation.as_ref(), before.retry.as_ref()),
            &groups_api,
            &children,
            &retry_to,
            "task groups",
        )
        .await?;
    let deadline = active_deadline(job, requests.retry.as_ref(), Timestamp::now());
    pass_on_deadline(ctx, job, &deadline, &groups_api, &children, &mut requests).await?;
    let owned: Vec<String> = owned.iter().map(|g| g.name_any()).collect();
    let groups = plan_groups(job, &owner, &stored_groups(ctx, job), &owned, requests.cancelled);
    write_groups(ctx, &groups_api, groups.writes, groups.delete).await?;

    // The status counts what the cache shows after those writes.
    let stored = stored_groups(ctx, job);
    let ran_out = deadline.time();
    let plan = plan_job_status(job, &stored, &groups.gates, requests, ran_out, Timestamp::now());
    let mut written = None;
    if let Some(status) = plan.status {
        if let Some(wait) = status_wait(ctx, job, (&stored, &groups.gates), &status) {
            // A deadline that runs out meanwhile is not kept waiting.
            let wait = match deadline {
                ActiveDeadline::Later(left) => wait.min(left),
                _ => wait,
            };
            return Ok(Action::requeue(wait));
        }
        written = Some(write_status(ctx, &jobs, &name, &status).await?);
        if let Some(note) = plan.event {
            ctx.publish(job, note);
        }
    }
    if let ActiveDeadline::Later(left) = deadline {
        return Ok(Action::requeue(left));
    }
    expire(ctx, &jobs, written.as_ref().unwrap_or(job)).await
}

/// How long the Job's new `status` waits for its turn (controllers/pacing.rs),
/// if it does. One that says only `pending` also waits while a group of it
/// has its first status on the way (in the cache, or open by its gate and
/// not there yet; a group that waits for others is not created, so it is
/// not waited for), which would outdate it at once; that status's write
/// brings the Job's turn, and the wait is a backstop.
fn status_wait(
    ctx: &Context,
    job: &Job,
    (stored, gates): (&BTreeMap<String, Arc<TaskGroup>>, &BTreeMap<String, Gate>),
    status: &JobStatus,
) -> Option<std::time::Duration> {
    let progress = job_progress_only(job.status.as_ref(), status);
    let interval = ctx.config.progress_interval;
    if progress && status.state == Some(WorkState::Pending) && !interval.is_zero() {
        let cached = stored.values().any(|g| {
            awaits_group(
                g.status.as_ref().and_then(|s| s.state),
                age_of(g.as_ref()),
                interval,
            )
        });
        let name = job.name_any();
        let open_uncached = job.spec.task_groups.iter().any(|g| {
            gates.get(&g.name).is_none_or(|gate| *gate == Gate::Open)
                && !stored.contains_key(&group_name(&name, &g.name))
        });
        let uncached = open_uncached && awaits_group(None, age_of(job), interval);
        if cached || uncached {
            return Some(interval);
        }
    }
    ctx.progress_due(job, progress)
}

/// The cancel of a Job past its activeDeadlineSeconds goes to its
/// TaskGroups (`children`, with their cancel annotations) that lack it,
/// unless a person's cancel is in force already; an Event says it once.
async fn pass_on_deadline(
    ctx: &Context,
    job: &Job,
    deadline: &ActiveDeadline,
    api: &Api<TaskGroup>,
    children: &[(String, Option<String>)],
    requests: &mut Requests,
) -> Result<()> {
    let (cancel, new) = match deadline {
        ActiveDeadline::Passed { cancel, new, .. } => (cancel, new),
        // Over: nothing more is passed on, and nothing new starts.
        ActiveDeadline::Over(_) => {
            requests.cancelled = true;
            return Ok(());
        }
        _ => return Ok(()),
    };
    if *new {
        let message = crate::deadline::message(job.spec.active_deadline_seconds);
        ctx.event(job, EventType::Warning, crate::deadline::REASON, message);
    }
    if requests.cancelled {
        return Ok(());
    }
    let lacking: Vec<String> = children
        .iter()
        .filter(|(_, value)| value.as_deref() != Some(cancel.as_str()))
        .map(|(name, _)| name.clone())
        .collect();
    let request = crate::manual::Request {
        value: cancel.clone(),
        by: Some(crate::deadline::REQUESTED_BY.to_owned()),
    };
    let patch = crate::manual::passed_on(ANNOTATION_CANCEL, &request);
    ctx.annotate_all(api, &lacking, &patch).await?;
    requests.cancelled = true;
    Ok(())
}

/// Writes a Job's status; the Job as written is what its next reconcile
/// reads until the watch brings it back.
async fn write_status(ctx: &Context, api: &Api<Job>, name: &str, status: &JobStatus) -> Result<Job> {
    let written: Job = ctx.patch_status(api, name, None, status).await?;
    ctx.written_jobs.record(written.clone());
    Ok(written)
}

/// Deletes `job` (as last written) once its time after finishing is up,
/// recording an `Expired` Event first; otherwise asks to be reconciled
/// again at the instant it expires (see [`crate::expiry`]).
async fn expire(ctx: &Context, api: &Api<Job>, job: &Job) -> Result<Action> {
    let default = ctx.config.job_ttl_after_finished;
    let summary = match plan_expiry(job, default, Timestamp::now()) {
        Expiry::Kept => return Ok(Action::await_change()),
        // kube-runtime holds a requeue to six months at most: a longer ttl
        // is decided again then.
        Expiry::Later(after) => return Ok(Action::requeue(after)),
        Expiry::Due(summary) => summary,
    };
    // A reconcile that still sees the Job after it was deleted records the
    // same note again: the recorder counts it on the same Event (a series),
    // and the delete finds nothing.
    ctx.record(job, Note::normal(REASON_EXPIRED, summary)).await?;
    let name = job.name_any();
    // Only the Job the decision was made on: a changed one (a new ttl, or
    // a new Job of the same name) is a conflict, and is decided again.
    let params = DeleteParams {
        preconditions: Some(Preconditions {
            uid: job.uid(),
            resource_version: job.resource_version(),
        }),
        ..DeleteParams::background()
    };
    let deleted = ctx
        .api::<Job, _>("delete", &name, api.delete(&name, &params))
        .await
        .map(|_| tracing::info!(job = %name, "deleted a finished Job past its ttl"));
    ignore(404, deleted)?;
    Ok(Action::await_change())
}

/// The TaskGroups of the Job's groups the cache holds, by name.
fn stored_groups(ctx: &Context, job: &Job) -> BTreeMap<String, Arc<TaskGroup>> {
    let ns = job.namespace().unwrap_or_default();
    let name = job.name_any();
    job.spec
        .task_groups
        .iter()
        .filter_map(|g| {
            let group = group_name(&name, &g.name);
            let tg = ctx.stores.groups.get(&ObjectRef::new(&group).within(&ns))?;
            Some((group, tg))
        })
        .collect()
}

/// What a cancel or retry of the Job is passed to: every TaskGroup (name,
/// its cancel annotation), and the names of those a retry has work for
/// (some of their tasks failed or were cancelled, or they were cancelled).
fn requests_to_pass(owned: &[Arc<TaskGroup>]) -> (Vec<(String, Option<String>)>, Vec<String>) {
    let children = owned
        .iter()
        .map(|g| (g.name_any(), g.annotations().get(ANNOTATION_CANCEL).cloned()))
        .collect();
    let retry_to = owned
        .iter()
        .filter(|g| {
            g.status
                .as_ref()
                .is_some_and(|s| s.counts.failed + s.counts.cancelled > 0 || s.cancellation.is_some())
        })
        .map(|g| g.name_any())
        .collect();
    (children, retry_to)
}

/// Carries out the writes [`plan_groups`] planned, in its order: a create
/// the cache had not seen yet (409) and a delete of what is gone already
/// (404) are not errors.
async fn write_groups(
    ctx: &Context,
    api: &Api<TaskGroup>,
    writes: Vec<GroupWrite>,
    delete: Vec<String>,
) -> Result<()> {
    for write in writes {
        match write {
            GroupWrite::Create(obj) => {
                let group = obj.name_any();
                let created = ctx
                    .api::<TaskGroup, _>("create", &group, api.create(&ctx.kube.post_params(), &obj))
                    .await
                    .map(|_| ());
                ignore(409, created)?;
            }
            GroupWrite::Replace(updated) => {
                let group = updated.name_any();
                ctx.api::<TaskGroup, _>(
                    "update",
                    &group,
                    api.replace(&group, &ctx.kube.post_params(), &updated),
                )
                .await?;
            }
        }
    }
    for group in delete {
        let deleted = ctx
            .api::<TaskGroup, _>("delete", &group, api.delete(&group, &DeleteParams::background()))
            .await
            .map(|_| ());
        ignore(404, deleted)?;
    }
    Ok(())
}

/// The status of a Job whose spec is invalid (`message` says why), or
/// `None` when its status says so already.
pub fn plan_invalid(job: &Job, message: &str, now: Timestamp) -> Option<JobStatus> {
    let previous = job.status.clone().unwrap_or_default();
    let mut status = JobStatus {
        state: Some(WorkState::Failed),
        // When it failed: its ttl after finishing counts from here.
        completion_time: previous.completion_time.or(Some(now)),
        observed_generation: job.meta().generation,
        ..previous.clone()
    };
    set_condition(
        &mut status.conditions,
        condition_at(
            CONDITION_FAILED,
            ConditionStatus::True,
            "InvalidSpec",
            message,
            now,
        ),
    );
    (status != previous).then_some(status)
}

/// A write to one of a Job's TaskGroups.
#[derive(Clone, Debug)]
pub enum GroupWrite {
    /// Create it (the cache does not hold it).
    Create(TaskGroup),
    /// Replace it: its spec no longer says what the Job does.
    Replace(TaskGroup),
}

/// What a Job's reconcile does to its TaskGroups.
#[derive(Clone, Debug)]
pub struct GroupsPlan {
    /// Every group's gate, by its name in the Job. The status is counted
    /// with these.
    pub gates: BTreeMap<String, Gate>,
    /// Creates and replacements, by TaskGroup name.
    pub writes: Vec<GroupWrite>,
    /// TaskGroups the Job owns and no longer has a group for, deleted
    /// after the writes.
    pub delete: Vec<String>,
}

/// Plans the writes to a Job's TaskGroups. `stored` are the TaskGroups of
/// its groups the cache holds (by name), `owned` the names of every
/// TaskGroup it owns, `owner` the reference its TaskGroups carry, and
/// `cancelled` whether the Job stays cancelled.
pub fn plan_groups(
    job: &Job,
    owner: &OwnerReference,
    stored: &BTreeMap<String, Arc<TaskGroup>>,
    owned: &[String],
    cancelled: bool,
) -> GroupsPlan {
    let ns = job.namespace().unwrap_or_default();
    let name = job.name_any();
    let desired = desired_groups(&name, &job.spec);
    let stored_state = |group: &str| -> Option<WorkState> {
        let tg = stored.get(&group_name(&name, group))?;
        Some(
            tg.status
                .as_ref()
                .and_then(|s| s.state)
                .unwrap_or(WorkState::Pending),
        )
    };
    let mut gates = gates(&job.spec, stored_state);
    if cancelled {
        // What has not started never will.
        for (group, gate) in gates.iter_mut() {
            if *gate != Gate::Open || stored_state(group).is_none() {
                *gate = Gate::Skipped("the Job was cancelled".into());
            }
        }
    }
    let mut writes = Vec::new();
    for (group, spec) in &desired {
        let open = gates.get(&spec.template.name) == Some(&Gate::Open);
        match stored.get(group) {
            // It runs after groups that have not completed (or failed).
            None if !open => {}
            None => writes.push(GroupWrite::Create(TaskGroup {
                metadata: ObjectMeta {
                    name: Some(group.clone()),
                    namespace: Some(ns.clone()),
                    labels: Some(BTreeMap::from([(LABEL_JOB.to_owned(), name.clone())])),
                    owner_references: Some(vec![owner.clone()]),
                    ..ObjectMeta::default()
                },
                spec: spec.clone(),
                status: None,
            })),
            Some(existing) if existing.spec != *spec => {
                let mut updated = (**existing).clone();
                updated.spec = spec.clone();
                writes.push(GroupWrite::Replace(updated));
            }
            Some(_) => {}
        }
    }
    let delete = owned
        .iter()
        .filter(|name| !desired.contains_key(*name))
        .cloned()
        .collect();
    GroupsPlan {
        gates,
        writes,
        delete,
    }
}

/// The status a Job's reconcile writes and the Event that goes with it.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct JobStatusPlan {
    /// The new status; `None` when the Job's says the same.
    pub status: Option<JobStatus>,
    /// Completed or Failed, once, when the Job finishes.
    pub event: Option<Note>,
}

/// Plans a Job's status from its groups' TaskGroups (`stored`, by name),
/// their `gates`, what became of a person's cancel and retry, and when its
/// activeDeadlineSeconds ran out (`ran_out`), if it did.
pub fn plan_job_status(
    job: &Job,
    stored: &BTreeMap<String, Arc<TaskGroup>>,
    gates: &BTreeMap<String, Gate>,
    requests: Requests,
    ran_out: Option<Timestamp>,
    now: Timestamp,
) -> JobStatusPlan {
    let name = job.name_any();
    let views: Vec<GroupView<'_>> = job
        .spec
        .task_groups
        .iter()
        .map(|g| {
            let tg = stored.get(&group_name(&name, &g.name));
            let status = tg.and_then(|tg| tg.status.as_ref());
            let count = match g.mode {
                GroupMode::Count => g.count(),
                // Unknown until the group has matched robots: one, so that
                // the Job does not complete without it.
                GroupMode::EveryRobot => status.and_then(|s| s.desired).unwrap_or(1).max(1),
            };
            GroupView {
                name: &g.name,
                task_group: group_name(&name, &g.name),
                count,
                status,
                gate: gates.get(&g.name).cloned().unwrap_or(Gate::Open),
            }
        })
        .collect();
    let previous = job.status.as_ref();
    let mut status = job_status(&views, previous, job.meta().generation, now);
    let skipped = status.groups.iter().any(|g| g.state == Some(WorkState::Skipped));
    if requests.cancelled
        && status.state.is_some_and(WorkState::is_finished)
        && (status.counts.cancelled > 0 || skipped)
    {
        status.state = Some(WorkState::Cancelled);
    }
    status.cancellation = requests.cancellation;
    status.retry = requests.retry;
    status.deadline_time = ran_out;
    let past_deadline = fail_past_deadline(
        &mut status,
        job.spec.active_deadline_seconds,
        job.meta().generation,
    );
    if previous == Some(&status) {
        return JobStatusPlan::default();
    }
    let was_finished = previous.and_then(|p| p.state).is_some_and(WorkState::is_finished);
    let event = match status.state {
        Some(WorkState::Failed) if past_deadline && !was_finished => Some(Note::warning(
            crate::deadline::REASON,
            "the Job was active longer than its activeDeadlineSeconds; it failed",
        )),
        Some(WorkState::Completed) if !was_finished => Some(Note::normal(
            "Completed",
            format!("all {} tasks completed", status.counts.completed),
        )),
        Some(WorkState::Failed) if !was_finished => Some(Note::warning("Failed", failed_message(&status))),
        _ => None,
    };
    JobStatusPlan {
        status: Some(status),
        event,
    }
}

/// The note of a Job's Failed Event: how many tasks failed, and the groups
/// skipped because of it.
fn failed_message(status: &JobStatus) -> String {
    let skipped: Vec<&str> = status
        .groups
        .iter()
        .filter(|g| g.state == Some(WorkState::Skipped))
        .map(|g| g.name.as_str())
        .collect();
    let mut message = format!("{} tasks failed after their retries", status.counts.failed);
    if !skipped.is_empty() {
        message.push_str(&format!(
            "; skipped groups that run after them: {}",
            skipped.join(", ")
        ));
    }
    message
}

#[cfg(test)]
mod tests;
