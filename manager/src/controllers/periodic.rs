//! PeriodicJobController: a Job per scheduled run, concurrency policy,
//! starting deadline and kept history, as Kubernetes' CronJob controller.

use std::collections::BTreeMap;
use std::sync::Arc;
use std::time::Duration;

use jiff::Timestamp;
use k8s4r_api::condition::set_condition;
use k8s4r_api::names::{ANNOTATION_SCHEDULED_AT, LABEL_PERIODIC_JOB};
use k8s4r_api::{parse_duration, Condition, ConditionStatus, Job, PeriodicJob, WorkState};
use kube::api::{DeleteParams, ObjectMeta};
use kube::runtime::controller::Action;
use kube::runtime::events::EventType;
use kube::{Api, Resource, ResourceExt};
use tracing::instrument;

use super::{key_of, Context};
use crate::error::{Error, Result};
use crate::periodic::{decide, schedule_of, Decision};

/// Condition on a PeriodicJob: its schedule and template are valid.
const CONDITION_VALID: &str = "Valid";
/// Completed runs kept when the spec does not say.
const DEFAULT_SUCCESSFUL_KEPT: i32 = 3;
/// Failed runs kept when the spec does not say.
const DEFAULT_FAILED_KEPT: i32 = 1;

/// Reconciles one PeriodicJob.
#[instrument(skip_all, fields(periodicjob = %key_of(pj.as_ref())))]
pub async fn reconcile(pj: Arc<PeriodicJob>, ctx: Arc<Context>) -> Result<Action> {
    let key = key_of(pj.as_ref());
    ctx.instrumented("periodicjob", key, reconcile_periodic(&pj, &ctx))
        .await
}

/// Backs off a PeriodicJob whose reconcile failed.
pub fn error_policy(pj: Arc<PeriodicJob>, error: &Error, ctx: Arc<Context>) -> Action {
    ctx.error_policy("periodicjob", key_of(pj.as_ref()), error)
}

/// The name of the run scheduled at `at`: unique per scheduled second.
pub fn run_name(periodic: &str, at: Timestamp) -> String {
    format!("{periodic}-{}", at.as_second())
}

fn finished(job: &Job) -> Option<WorkState> {
    job.status.as_ref()?.state.filter(|s| s.is_finished())
}

async fn reconcile_periodic(pj: &PeriodicJob, ctx: &Context) -> Result<Action> {
    if pj.meta().deletion_timestamp.is_some() {
        return Ok(Action::await_change());
    }
    let ns = pj.namespace().unwrap_or_default();
    let name = pj.name_any();
    let api: Api<PeriodicJob> = Api::namespaced(ctx.client(), &ns);
    let jobs: Api<Job> = Api::namespaced(ctx.client(), &ns);
    let previous = pj.status.clone().unwrap_or_default();
    let mut status = previous.clone();

    let schedule = match schedule_of(&name, &pj.spec) {
        Ok(s) => s,
        Err(message) => {
            status.next_schedule_time = None;
            set_condition(
                &mut status.conditions,
                Condition::new(
                    CONDITION_VALID,
                    ConditionStatus::False,
                    "InvalidSpec",
                    message.clone(),
                ),
            );
            if status != previous {
                ctx.patch_status(&api, &name, None, &status).await?;
                ctx.event(pj, EventType::Warning, "InvalidSpec", message);
            }
            return Ok(Action::await_change());
        }
    };
    set_condition(
        &mut status.conditions,
        Condition::new(
            CONDITION_VALID,
            ConditionStatus::True,
            "Valid",
            "schedule and template are valid",
        ),
    );

    let uid = pj.uid().unwrap_or_default();
    let mut runs: Vec<Arc<Job>> = ctx.stores.jobs.state_filter(|j| {
        j.namespace().as_deref() == Some(ns.as_str()) && j.owner_references().iter().any(|o| o.uid == uid)
    });
    // Oldest first: by creation, then by name (the scheduled second).
    runs.sort_by_key(|j| (j.creation_timestamp().map(|t| t.0), j.name_any()));
    let (done, mut active): (Vec<Arc<Job>>, Vec<Arc<Job>>) =
        runs.into_iter().partition(|j| finished(j).is_some());

    // History: the newest completed and failed runs are kept.
    let keep_ok = pj
        .spec
        .successful_jobs_history_limit
        .unwrap_or(DEFAULT_SUCCESSFUL_KEPT)
        .max(0);
    let keep_failed = pj
        .spec
        .failed_jobs_history_limit
        .unwrap_or(DEFAULT_FAILED_KEPT)
        .max(0);
    let (ok, failed): (Vec<&Arc<Job>>, Vec<&Arc<Job>>) = done
        .iter()
        .partition(|j| finished(j) == Some(WorkState::Completed));
    if let Some(last) = ok.iter().filter_map(|j| j.status.as_ref()?.completion_time).max() {
        status.last_successful_time = Some(last);
    }
    // Only runs the status already records as started are deleted: a run
    // deleted before its start was recorded would look not started.
    let recorded = |j: &Job| {
        let at = j
            .annotations()
            .get(ANNOTATION_SCHEDULED_AT)
            .and_then(|a| a.parse::<Timestamp>().ok());
        at.zip(previous.last_schedule_time)
            .is_some_and(|(at, last)| at <= last)
    };
    for (list, keep) in [(&ok, keep_ok), (&failed, keep_failed)] {
        let excess = list.len().saturating_sub(usize::try_from(keep).unwrap_or(0));
        for job in list.iter().take(excess).filter(|j| recorded(j)) {
            delete_run(ctx, &jobs, job, "history limit").await?;
        }
    }

    let now = Timestamp::now();
    let mut requeue = None;
    if !pj.spec.suspend {
        let since = previous
            .last_schedule_time
            .or_else(|| pj.creation_timestamp().map(|t| t.0))
            .unwrap_or(now);
        let deadline = pj
            .spec
            .starting_deadline
            .as_deref()
            .and_then(|d| parse_duration(d).ok());
        let exists = |due: Timestamp| {
            let run = run_name(&name, due);
            active.iter().chain(&done).any(|j| j.name_any() == run)
        };
        let decision = decide(
            &schedule,
            since,
            now,
            pj.spec.concurrency_policy,
            deadline,
            active.len(),
            exists,
        );
        match decision {
            Decision::Nothing => {}
            Decision::Started(due) => status.last_schedule_time = Some(due),
            Decision::Missed(due) => {
                ctx.event(
                    pj,
                    EventType::Warning,
                    "MissedSchedule",
                    format!("the run scheduled at {due} could not start within its startingDeadline"),
                );
                status.last_schedule_time = Some(due);
            }
            Decision::Wait { due, until_too_late } => {
                ctx.event(
                    pj,
                    EventType::Normal,
                    "JobAlreadyActive",
                    format!(
                        "the run scheduled at {due} waits: {} still runs and concurrencyPolicy is Forbid",
                        active.iter().map(|j| j.name_any()).collect::<Vec<_>>().join(", ")
                    ),
                );
                // The active run's end wakes this up; else its deadline.
                requeue = until_too_late.map(|d| d.saturating_add(Duration::from_secs(1)));
            }
            Decision::Start { due, replace } => {
                if replace {
                    for job in active.drain(..) {
                        delete_run(ctx, &jobs, &job, "replaced by a newer run").await?;
                    }
                }
                let job = start_run(ctx, &jobs, pj, due).await?;
                active.push(Arc::new(job));
                status.last_schedule_time = Some(due);
            }
        }
    }
    status.active = active.iter().map(|j| j.name_any()).collect();
    status.active_count = i32::try_from(status.active.len()).unwrap_or(i32::MAX);
    let next = if pj.spec.suspend {
        None
    } else {
        let from = status.last_schedule_time.unwrap_or(now).max(now);
        schedule.next_after(from)
    };
    status.next_schedule_time = next;
    if status != previous {
        ctx.patch_status(&api, &name, None, &status).await?;
    }
    let until_next = next
        .and_then(|n| Duration::try_from(n.duration_since(now)).ok())
        .map(|d| d + Duration::from_millis(50));
    Ok(match (until_next, requeue) {
        (Some(a), Some(b)) => Action::requeue(a.min(b)),
        (Some(a), None) | (None, Some(a)) => Action::requeue(a),
        (None, None) => Action::await_change(),
    })
}

async fn start_run(ctx: &Context, jobs: &Api<Job>, pj: &PeriodicJob, due: Timestamp) -> Result<Job> {
    let name = run_name(&pj.name_any(), due);
    let owner = pj.controller_owner_ref(&()).ok_or_else(|| Error::Malformed {
        kind: "PeriodicJob",
        name: pj.name_any(),
        reason: "no uid to own jobs with".into(),
    })?;
    let mut labels = pj.spec.job_template.labels.clone();
    labels.insert(LABEL_PERIODIC_JOB.to_owned(), pj.name_any());
    let job = Job {
        metadata: ObjectMeta {
            name: Some(name.clone()),
            namespace: pj.namespace(),
            labels: Some(labels),
            annotations: Some(BTreeMap::from([(
                ANNOTATION_SCHEDULED_AT.to_owned(),
                due.to_string(),
            )])),
            owner_references: Some(vec![owner]),
            ..ObjectMeta::default()
        },
        spec: pj.spec.job_template.spec.clone(),
        status: None,
    };
    match ctx
        .api::<Job, _>("create", &name, jobs.create(&ctx.kube.post_params(), &job))
        .await
    {
        Ok(created) => {
            ctx.event(
                pj,
                EventType::Normal,
                "SuccessfulCreate",
                format!("created job {name} for the run scheduled at {due}"),
            );
            Ok(created)
        }
        // Created before; the cache had not shown it.
        Err(Error::Api(e)) if e.is_conflict() => Ok(job),
        Err(e) => Err(e),
    }
}

async fn delete_run(ctx: &Context, jobs: &Api<Job>, job: &Job, why: &str) -> Result<()> {
    let name = job.name_any();
    match ctx
        .api::<Job, _>("delete", &name, jobs.delete(&name, &DeleteParams::background()))
        .await
    {
        Ok(_) => {
            tracing::info!(job = %name, why, "deleted a periodic run");
            Ok(())
        }
        Err(Error::Api(e)) if e.is_not_found() => Ok(()),
        Err(e) => Err(e),
    }
}
