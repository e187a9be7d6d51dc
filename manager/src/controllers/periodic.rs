//! PeriodicJobController: a Job per scheduled run, concurrency policy,
//! starting deadline and kept history, as Kubernetes' CronJob controller.

use std::collections::BTreeMap;
use std::sync::Arc;
use std::time::Duration;

use jiff::Timestamp;
use k8s4r_api::condition::set_condition;
use k8s4r_api::names::{ANNOTATION_SCHEDULED_AT, LABEL_PERIODIC_JOB};
use k8s4r_api::{
    parse_duration, ConcurrencyPolicy, ConditionStatus, Job, PeriodicJob, PeriodicJobStatus, WorkState,
};
use kube::api::{DeleteParams, ObjectMeta};
use kube::runtime::controller::Action;
use kube::runtime::events::EventType;
use kube::runtime::reflector::ObjectRef;
use kube::{Api, Resource, ResourceExt};
use tracing::instrument;

use super::{condition_at, key_of, Context, Look, Note};
use crate::error::{Error, Result};
use crate::periodic::{decide, schedule_of, Decision, Schedule};

/// Condition on a PeriodicJob: its schedule and template are valid.
const CONDITION_VALID: &str = "Valid";
/// Completed runs kept when the spec does not say.
const DEFAULT_SUCCESSFUL_KEPT: i32 = 3;
/// Failed runs kept when the spec does not say.
const DEFAULT_FAILED_KEPT: i32 = 1;

/// Reconciles one PeriodicJob.
#[instrument(skip_all, fields(periodicjob = %key_of(pj.as_ref())))]
pub async fn reconcile(pj: Arc<PeriodicJob>, ctx: Arc<Context>) -> Result<Action> {
    let ctx = ctx.as_ref();
    // Its cache is its controller's own: reconciled as triggered.
    let look = Look {
        store: None,
        written: None,
    };
    ctx.instrumented("periodicjob", pj, look, |pj| async move {
        reconcile_periodic(&pj, ctx).await
    })
    .await
}

/// Backs off a PeriodicJob whose reconcile failed.
pub fn error_policy(pj: Arc<PeriodicJob>, error: &Error, ctx: Arc<Context>) -> Action {
    ctx.error_policy("periodicjob", &key_of(pj.as_ref()), error)
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

    let schedule = match schedule_of(&name, &pj.spec) {
        Ok(s) => s,
        Err(message) => {
            if let Some(status) = plan_invalid(pj, &message, Timestamp::now()) {
                ctx.patch_status(&api, &name, None, &status).await?;
                ctx.event(pj, EventType::Warning, "InvalidSpec", message);
            }
            return Ok(Action::await_change());
        }
    };

    let runs = runs_of(ctx, pj);
    let history = plan_history(pj, &runs.done);
    for job in &history.delete {
        delete_run(ctx, &jobs, job, "history limit").await?;
    }

    let plan = plan_periodic(pj, &schedule, &runs, &history, Timestamp::now());
    if let Some(note) = plan.event {
        ctx.publish(pj, note);
    }
    if let Some(due) = plan.start {
        for job in &plan.replace {
            delete_run(ctx, &jobs, job, "replaced by a newer run").await?;
        }
        start_run(ctx, &jobs, pj, due).await?;
    }
    if let Some(status) = plan.status {
        ctx.patch_status(&api, &name, None, &status).await?;
    }
    Ok(match plan.requeue {
        Some(after) => Action::requeue(after),
        None => Action::await_change(),
    })
}

/// A PeriodicJob's runs as the cache shows them, oldest first (by
/// creation, then by name: the scheduled second).
#[derive(Clone, Debug, Default)]
pub struct Runs {
    /// The runs not finished.
    pub active: Vec<Arc<Job>>,
    /// The runs that completed or failed.
    pub done: Vec<Arc<Job>>,
}

/// Reads the runs of `pj` from the cache.
fn runs_of(ctx: &Context, pj: &PeriodicJob) -> Runs {
    let ns = pj.namespace().unwrap_or_default();
    let uid = pj.uid().unwrap_or_default();
    let mut runs: Vec<Arc<Job>> = ctx.stores.jobs.state_filter(|j| {
        j.namespace().as_deref() == Some(ns.as_str()) && j.owner_references().iter().any(|o| o.uid == uid)
    });
    runs.sort_by_key(|j| (j.creation_timestamp().map(|t| t.0), j.name_any()));
    let (done, active) = runs.into_iter().partition(|j| finished(j).is_some());
    Runs { active, done }
}

/// When `job` (in `ns`) is a run of a PeriodicJob that forbids overlapping
/// runs, another run of it that is active now: a person's retry of one of
/// `job`'s Tasks would run beside it, and is refused. None otherwise.
pub(super) async fn forbidding_run(ctx: &Context, ns: &str, job: &str) -> Result<Option<String>> {
    let Some(run) = ctx.stores.jobs.get(&ObjectRef::new(job).within(ns)) else {
        return Ok(None);
    };
    let Some(periodic) = run.labels().get(LABEL_PERIODIC_JOB).cloned() else {
        return Ok(None);
    };
    let api: Api<PeriodicJob> = Api::namespaced(ctx.client(), ns);
    let Some(pj) = ctx
        .api::<PeriodicJob, _>("read", &periodic, api.get_opt(&periodic))
        .await?
    else {
        return Ok(None);
    };
    if pj.spec.concurrency_policy != ConcurrencyPolicy::Forbid
        || !run
            .owner_references()
            .iter()
            .any(|o| Some(&o.uid) == pj.uid().as_ref())
    {
        return Ok(None);
    }
    Ok(other_active_run(job, &runs_of(ctx, &pj).active))
}

/// The first of `active` that is not `job`.
pub fn other_active_run(job: &str, active: &[Arc<Job>]) -> Option<String> {
    active.iter().map(|j| j.name_any()).find(|name| name != job)
}

/// The status of a PeriodicJob whose schedule or template is invalid
/// (`message` says why), or `None` when its status says so already.
pub fn plan_invalid(pj: &PeriodicJob, message: &str, now: Timestamp) -> Option<PeriodicJobStatus> {
    let previous = pj.status.clone().unwrap_or_default();
    let mut status = previous.clone();
    status.next_schedule_time = None;
    set_condition(
        &mut status.conditions,
        condition_at(
            CONDITION_VALID,
            ConditionStatus::False,
            "InvalidSpec",
            message,
            now,
        ),
    );
    (status != previous).then_some(status)
}

/// What a PeriodicJob's history limits ask.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct History {
    /// The finished runs to delete, by name, oldest first.
    pub delete: Vec<String>,
    /// When the newest completed run completed, if any did.
    pub last_successful: Option<Timestamp>,
}

/// Plans the history of `pj` from its finished runs (`done`, oldest
/// first): the newest completed and failed runs are kept.
pub fn plan_history(pj: &PeriodicJob, done: &[Arc<Job>]) -> History {
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
    let last_successful = ok.iter().filter_map(|j| j.status.as_ref()?.completion_time).max();
    // Only runs the status already records as started are deleted: a run
    // deleted before its start was recorded would look not started.
    let last_schedule = pj.status.as_ref().and_then(|s| s.last_schedule_time);
    let recorded = |j: &Job| {
        let at = j
            .annotations()
            .get(ANNOTATION_SCHEDULED_AT)
            .and_then(|a| a.parse::<Timestamp>().ok());
        at.zip(last_schedule).is_some_and(|(at, last)| at <= last)
    };
    let mut delete = Vec::new();
    for (list, keep) in [(&ok, keep_ok), (&failed, keep_failed)] {
        let excess = list.len().saturating_sub(usize::try_from(keep).unwrap_or(0));
        delete.extend(
            list.iter()
                .take(excess)
                .filter(|j| recorded(j))
                .map(|j| j.name_any()),
        );
    }
    History {
        delete,
        last_successful,
    }
}

/// What a PeriodicJob's reconcile does about its runs, after the history.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct PeriodicPlan {
    /// MissedSchedule or JobAlreadyActive, published before any write.
    pub event: Option<Note>,
    /// Active runs to delete, by name, before the new run starts: it
    /// replaces them.
    pub replace: Vec<String>,
    /// The scheduled time of the run to start now.
    pub start: Option<Timestamp>,
    /// The new status; `None` when the PeriodicJob's says the same.
    pub status: Option<PeriodicJobStatus>,
    /// When to look again: the next run, or a waiting run's deadline;
    /// `None`: on a change only.
    pub requeue: Option<Duration>,
}

/// Plans a PeriodicJob's runs at `now` from its valid `schedule`, its
/// `runs` and what its `history` found.
pub fn plan_periodic(
    pj: &PeriodicJob,
    schedule: &Schedule,
    runs: &Runs,
    history: &History,
    now: Timestamp,
) -> PeriodicPlan {
    let previous = pj.status.clone().unwrap_or_default();
    let mut status = previous.clone();
    set_condition(
        &mut status.conditions,
        condition_at(
            CONDITION_VALID,
            ConditionStatus::True,
            "Valid",
            "schedule and template are valid",
            now,
        ),
    );
    if let Some(last) = history.last_successful {
        status.last_successful_time = Some(last);
    }
    let mut plan = PeriodicPlan::default();
    let mut active: Vec<String> = runs.active.iter().map(|j| j.name_any()).collect();
    let mut requeue = None;
    let decision = (!pj.spec.suspend).then(|| decide_run(pj, schedule, runs, now));
    match decision.unwrap_or(Decision::Nothing) {
        Decision::Nothing => {}
        Decision::Started(due) => status.last_schedule_time = Some(due),
        Decision::Missed(due) => {
            plan.event = Some(Note::warning(
                "MissedSchedule",
                format!("the run scheduled at {due} could not start within its startingDeadline"),
            ));
            status.last_schedule_time = Some(due);
        }
        Decision::Wait { due, until_too_late } => {
            plan.event = Some(Note::normal(
                "JobAlreadyActive",
                format!(
                    "the run scheduled at {due} waits: {} still runs and concurrencyPolicy is Forbid",
                    active.join(", ")
                ),
            ));
            // The active run's end wakes this up; else its deadline.
            requeue = until_too_late.map(|d| d.saturating_add(Duration::from_secs(1)));
        }
        Decision::Start { due, replace } => {
            if replace {
                plan.replace = std::mem::take(&mut active);
            }
            active.push(run_name(&pj.name_any(), due));
            plan.start = Some(due);
            status.last_schedule_time = Some(due);
        }
    }
    status.active = active;
    status.active_count = i32::try_from(status.active.len()).unwrap_or(i32::MAX);
    let next = if pj.spec.suspend {
        None
    } else {
        let from = status.last_schedule_time.unwrap_or(now).max(now);
        schedule.next_after(from)
    };
    status.next_schedule_time = next;
    plan.status = (status != previous).then_some(status);
    let until_next = next
        .and_then(|n| Duration::try_from(n.duration_since(now)).ok())
        .map(|d| d + Duration::from_millis(50));
    plan.requeue = match (until_next, requeue) {
        (Some(a), Some(b)) => Some(a.min(b)),
        (a, b) => a.or(b),
    };
    plan
}

/// Decides about the run of `pj` due last, as [`decide`] does.
fn decide_run(pj: &PeriodicJob, schedule: &Schedule, runs: &Runs, now: Timestamp) -> Decision {
    let name = pj.name_any();
    let since = pj
        .status
        .as_ref()
        .and_then(|s| s.last_schedule_time)
        .or_else(|| pj.creation_timestamp().map(|t| t.0))
        .unwrap_or(now);
    let deadline = pj
        .spec
        .starting_deadline
        .as_deref()
        .and_then(|d| parse_duration(d).ok());
    let exists = |due: Timestamp| {
        let run = run_name(&name, due);
        runs.active.iter().chain(&runs.done).any(|j| j.name_any() == run)
    };
    decide(
        schedule,
        since,
        now,
        pj.spec.concurrency_policy,
        deadline,
        runs.active.len(),
        exists,
    )
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

async fn delete_run(ctx: &Context, jobs: &Api<Job>, name: &str, why: &str) -> Result<()> {
    match ctx
        .api::<Job, _>("delete", name, jobs.delete(name, &DeleteParams::background()))
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

#[cfg(test)]
mod tests {
    use super::*;
    use k8s4r_api::{ConcurrencyPolicy, JobStatus, PeriodicJobSpec};
    use k8s_openapi::apimachinery::pkg::apis::meta::v1::Time;

    fn t(s: &str) -> Timestamp {
        format!("2026-11-25T{s}Z").parse().unwrap()
    }

    fn every_ten_minutes() -> Schedule {
        Schedule::parse("*/10 * * * *", None).unwrap()
    }

    /// PeriodicJob `nightly`, every ten minutes, created at 09:00, that
    /// last started the run due at `last`.
    fn periodic(policy: ConcurrencyPolicy, last: Option<&str>) -> PeriodicJob {
        let mut pj = PeriodicJob::new(
            "nightly",
            PeriodicJobSpec {
                schedule: "*/10 * * * *".into(),
                concurrency_policy: policy,
                ..PeriodicJobSpec::default()
            },
        );
        pj.metadata.namespace = Some("ns".into());
        pj.metadata.creation_timestamp = Some(Time(t("09:00:00")));
        pj.status = Some(PeriodicJobStatus {
            last_schedule_time: last.map(t),
            ..PeriodicJobStatus::default()
        });
        pj
    }

    /// The run due at `at`, in `state` (completed at `at` when finished).
    fn run(at: &str, state: Option<WorkState>) -> Arc<Job> {
        let mut job = Job::new(&run_name("nightly", t(at)), Default::default());
        job.annotations_mut()
            .insert(ANNOTATION_SCHEDULED_AT.into(), t(at).to_string());
        job.status = state.map(|state| JobStatus {
            state: Some(state),
            completion_time: state.is_finished().then(|| t(at)),
            ..JobStatus::default()
        });
        Arc::new(job)
    }

    #[test]
    fn an_invalid_schedule_is_said_once() {
        let mut pj = periodic(ConcurrencyPolicy::Allow, None);
        pj.status.as_mut().unwrap().next_schedule_time = Some(t("10:00:00"));
        let status = plan_invalid(&pj, "spec.schedule: bad", t("10:00:00")).unwrap();
        assert_eq!(status.next_schedule_time, None);
        assert_eq!(status.conditions[0].status, ConditionStatus::False);
        pj.status = Some(status);
        assert_eq!(plan_invalid(&pj, "spec.schedule: bad", t("10:00:00")), None);
    }

    #[test]
    fn history_keeps_the_newest_runs_and_only_deletes_recorded_ones() {
        let mut pj = periodic(ConcurrencyPolicy::Allow, Some("10:10:00"));
        pj.spec.successful_jobs_history_limit = Some(1);
        let done = [
            run("09:50:00", Some(WorkState::Completed)),
            run("10:00:00", Some(WorkState::Failed)),
            run("10:10:00", Some(WorkState::Completed)),
            // Not recorded as started yet.
            run("10:20:00", Some(WorkState::Completed)),
        ];
        let history = plan_history(&pj, &done);
        assert_eq!(
            history.delete,
            [
                run_name("nightly", t("09:50:00")),
                run_name("nightly", t("10:10:00"))
            ]
        );
        assert_eq!(history.last_successful, Some(t("10:20:00")));
    }

    #[test]
    fn a_due_run_starts_and_the_next_is_awaited() {
        let pj = periodic(ConcurrencyPolicy::Allow, Some("10:00:00"));
        let runs = Runs {
            active: vec![run("10:00:00", None)],
            done: Vec::new(),
        };
        let plan = plan_periodic(
            &pj,
            &every_ten_minutes(),
            &runs,
            &History::default(),
            t("10:10:30"),
        );
        assert_eq!(plan.start, Some(t("10:10:00")));
        assert!(plan.replace.is_empty());
        assert_eq!(plan.event, None);
        let status = plan.status.unwrap();
        assert_eq!(status.last_schedule_time, Some(t("10:10:00")));
        assert_eq!(
            status.active,
            [
                run_name("nightly", t("10:00:00")),
                run_name("nightly", t("10:10:00"))
            ]
        );
        assert_eq!(status.active_count, 2);
        assert_eq!(status.next_schedule_time, Some(t("10:20:00")));
        assert_eq!(status.conditions[0].type_, CONDITION_VALID);
        assert_eq!(plan.requeue, Some(Duration::from_millis(570_050)));
    }

    #[test]
    fn replace_deletes_the_active_runs_first() {
        let pj = periodic(ConcurrencyPolicy::Replace, Some("10:00:00"));
        let runs = Runs {
            active: vec![run("10:00:00", None)],
            done: Vec::new(),
        };
        let plan = plan_periodic(
            &pj,
            &every_ten_minutes(),
            &runs,
            &History::default(),
            t("10:10:30"),
        );
        assert_eq!(plan.replace, [run_name("nightly", t("10:00:00"))]);
        assert_eq!(plan.start, Some(t("10:10:00")));
        assert_eq!(plan.status.unwrap().active, [run_name("nightly", t("10:10:00"))]);
    }

    #[test]
    fn forbid_waits_for_the_active_run_until_its_deadline() {
        let mut pj = periodic(ConcurrencyPolicy::Forbid, Some("10:00:00"));
        pj.spec.starting_deadline = Some("60s".into());
        let runs = Runs {
            active: vec![run("10:00:00", None)],
            done: Vec::new(),
        };
        let plan = plan_periodic(
            &pj,
            &every_ten_minutes(),
            &runs,
            &History::default(),
            t("10:10:30"),
        );
        assert_eq!(plan.start, None);
        let event = plan.event.unwrap();
        assert_eq!(event.reason, "JobAlreadyActive");
        assert!(event.message.contains(&run_name("nightly", t("10:00:00"))));
        // 30 s of the deadline left, and a second.
        assert_eq!(plan.requeue, Some(Duration::from_secs(31)));
        let status = plan.status.unwrap();
        assert_eq!(status.last_schedule_time, Some(t("10:00:00")));
    }

    #[test]
    fn a_run_past_its_starting_deadline_is_missed() {
        let mut pj = periodic(ConcurrencyPolicy::Allow, Some("10:00:00"));
        pj.spec.starting_deadline = Some("10s".into());
        let plan = plan_periodic(
            &pj,
            &every_ten_minutes(),
            &Runs::default(),
            &History::default(),
            t("10:10:30"),
        );
        assert_eq!(plan.start, None);
        assert_eq!(plan.event.unwrap().reason, "MissedSchedule");
        assert_eq!(plan.status.unwrap().last_schedule_time, Some(t("10:10:00")));
    }

    #[test]
    fn a_run_that_exists_is_recorded_and_a_suspended_job_waits_for_a_change() {
        let pj = periodic(ConcurrencyPolicy::Allow, Some("10:00:00"));
        let runs = Runs {
            active: Vec::new(),
            done: vec![run("10:10:00", Some(WorkState::Completed))],
        };
        let history = History {
            delete: Vec::new(),
            last_successful: Some(t("10:10:00")),
        };
        let plan = plan_periodic(&pj, &every_ten_minutes(), &runs, &history, t("10:10:30"));
        assert_eq!(plan.start, None);
        let status = plan.status.unwrap();
        assert_eq!(status.last_schedule_time, Some(t("10:10:00")));
        assert_eq!(status.last_successful_time, Some(t("10:10:00")));

        let mut pj = periodic(ConcurrencyPolicy::Allow, Some("10:00:00"));
        pj.spec.suspend = true;
        let plan = plan_periodic(&pj, &every_ten_minutes(), &runs, &history, t("10:10:30"));
        assert_eq!(plan.start, None);
        assert_eq!(plan.requeue, None);
        assert_eq!(plan.status.unwrap().next_schedule_time, None);
    }

    #[test]
    fn a_retry_of_a_run_is_forbidden_by_any_other_active_run() {
        let old = run_name("nightly", t("09:10:00"));
        let active = vec![run("09:10:00", None), run("09:20:00", None)];
        assert_eq!(
            other_active_run(&old, &active),
            Some(run_name("nightly", t("09:20:00")))
        );
        assert_eq!(other_active_run(&old, &active[..1]), None, "only itself");
        assert_eq!(other_active_run(&old, &[]), None);
    }
}
