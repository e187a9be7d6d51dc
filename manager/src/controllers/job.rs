//! JobController: one TaskGroup per group of a Job, and the Job's status.

use std::collections::BTreeMap;
use std::sync::Arc;

use jiff::Timestamp;
use k8s4r_api::condition::set_condition;
use k8s4r_api::names::CONDITION_FAILED;
use k8s4r_api::names::{ANNOTATION_CANCEL, LABEL_JOB};
use k8s4r_api::validation::validate_job_spec;
use k8s4r_api::{
    Condition, ConditionStatus, GroupMode, Job, JobSpec, JobStatus, TaskGroup, TaskGroupSpec,
    TaskGroupTemplate, WorkState,
};
use kube::api::{DeleteParams, ObjectMeta};
use kube::runtime::controller::Action;
use kube::runtime::events::EventType;
use kube::runtime::reflector::ObjectRef;
use kube::{Api, Resource, ResourceExt};
use tracing::instrument;

use super::{key_of, Context};
use crate::aggregate::{gates, job_status, Gate, GroupView};
use crate::error::{Error, Result};

/// Reconciles one Job.
#[instrument(skip_all, fields(job = %key_of(job.as_ref())))]
pub async fn reconcile(job: Arc<Job>, ctx: Arc<Context>) -> Result<Action> {
    let key = key_of(job.as_ref());
    ctx.instrumented("job", key, reconcile_job(&job, &ctx)).await
}

/// Backs off a Job whose reconcile failed.
pub fn error_policy(job: Arc<Job>, error: &Error, ctx: Arc<Context>) -> Action {
    ctx.error_policy("job", key_of(job.as_ref()), error)
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
        let previous = job.status.clone().unwrap_or_default();
        let mut status = JobStatus {
            state: Some(WorkState::Failed),
            observed_generation: job.meta().generation,
            ..previous.clone()
        };
        set_condition(
            &mut status.conditions,
            Condition::new(
                CONDITION_FAILED,
                ConditionStatus::True,
                "InvalidSpec",
                errors.to_string(),
            ),
        );
        if status != previous {
            ctx.patch_status(&jobs, &name, None, &status).await?;
            ctx.event(job, EventType::Warning, "InvalidSpec", errors.to_string());
        }
        return Ok(Action::await_change());
    }

    let owner = job.controller_owner_ref(&()).ok_or_else(|| Error::Malformed {
        kind: "Job",
        name: name.clone(),
        reason: "no uid to own task groups with".into(),
    })?;
    let desired = desired_groups(&name, &job.spec);

    // A person's cancel or retry of the Job goes to its TaskGroups.
    let before = job.status.clone().unwrap_or_default();
    let uid = job.uid().unwrap_or_default();
    let owned: Vec<Arc<TaskGroup>> = ctx.job_groups.of(&ctx.stores.groups, &uid);
    let children: Vec<(String, Option<String>)> = owned
        .iter()
        .map(|g| (g.name_any(), g.annotations().get(ANNOTATION_CANCEL).cloned()))
        .collect();
    let retry_to: Vec<String> = owned
        .iter()
        .filter(|g| {
            g.status
                .as_ref()
                .is_some_and(|s| s.counts.failed + s.counts.cancelled > 0 || s.cancellation.is_some())
        })
        .map(|g| g.name_any())
        .collect();
    let (cancellation, retry, cancelled) = ctx
        .pass_on_requests(
            job,
            (before.cancellation.as_ref(), before.retry.as_ref()),
            &groups_api,
            &children,
            &retry_to,
            "task groups",
        )
        .await?;

    let stored_state = |group: &str| -> Option<WorkState> {
        let tg = ctx
            .stores
            .groups
            .get(&ObjectRef::new(&group_name(&name, group)).within(&ns))?;
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
    for (group, spec) in &desired {
        let existing = ctx.stores.groups.get(&ObjectRef::new(group).within(&ns));
        let open = gates.get(&spec.template.name) == Some(&Gate::Open);
        match existing {
            // It runs after groups that have not completed (or failed).
            None if !open => {}
            None => {
                let obj = TaskGroup {
                    metadata: ObjectMeta {
                        name: Some(group.clone()),
                        namespace: Some(ns.clone()),
                        labels: Some(BTreeMap::from([(LABEL_JOB.to_owned(), name.clone())])),
                        owner_references: Some(vec![owner.clone()]),
                        ..ObjectMeta::default()
                    },
                    spec: spec.clone(),
                    status: None,
                };
                let created = ctx
                    .api::<TaskGroup, _>("create", group, groups_api.create(&ctx.kube.post_params(), &obj))
                    .await
                    .map(|_| ());
                ignore(409, created)?;
            }
            Some(existing) if existing.spec != *spec => {
                let mut updated = (*existing).clone();
                updated.spec = spec.clone();
                ctx.api::<TaskGroup, _>(
                    "update",
                    group,
                    groups_api.replace(group, &ctx.kube.post_params(), &updated),
                )
                .await?;
            }
            Some(_) => {}
        }
    }
    let stale: Vec<String> = owned
        .iter()
        .map(|g| g.name_any())
        .filter(|name| !desired.contains_key(name))
        .collect();
    for group in stale {
        let deleted = ctx
            .api::<TaskGroup, _>(
                "delete",
                &group,
                groups_api.delete(&group, &DeleteParams::background()),
            )
            .await
            .map(|_| ());
        ignore(404, deleted)?;
    }

    let stored: Vec<Option<Arc<TaskGroup>>> = job
        .spec
        .task_groups
        .iter()
        .map(|g| {
            ctx.stores
                .groups
                .get(&ObjectRef::new(&group_name(&name, &g.name)).within(&ns))
        })
        .collect();
    let views: Vec<GroupView<'_>> = job
        .spec
        .task_groups
        .iter()
        .zip(&stored)
        .map(|(g, tg)| {
            let status = tg.as_ref().and_then(|tg| tg.status.as_ref());
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
    let mut status = job_status(&views, previous, job.meta().generation, Timestamp::now());
    let skipped = status.groups.iter().any(|g| g.state == Some(WorkState::Skipped));
    if cancelled
        && status.state.is_some_and(WorkState::is_finished)
        && (status.counts.cancelled > 0 || skipped)
    {
        status.state = Some(WorkState::Cancelled);
    }
    status.cancellation = cancellation;
    status.retry = retry;
    if previous != Some(&status) {
        ctx.patch_status(&jobs, &name, None, &status).await?;
        let was_finished = previous.and_then(|p| p.state).is_some_and(WorkState::is_finished);
        match status.state {
            Some(WorkState::Completed) if !was_finished => ctx.event(
                job,
                EventType::Normal,
                "Completed",
                format!("all {} tasks completed", status.counts.completed),
            ),
            Some(WorkState::Failed) if !was_finished => {
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
                ctx.event(job, EventType::Warning, "Failed", message)
            }
            _ => {}
        }
    }
    Ok(Action::await_change())
}

#[cfg(test)]
mod tests {
    use super::*;
    use k8s4r_api::{Constraint, ConstraintOperator, LabelSelector};

    fn constraint(attr: &str) -> Constraint {
        Constraint {
            attribute: attr.into(),
            operator: ConstraintOperator::Exists,
            value: String::new(),
        }
    }

    #[test]
    fn groups_inherit_the_jobs_selector_and_constraints() {
        let job = JobSpec {
            robot_selector: Some(LabelSelector::from_labels([("site", "lab")])),
            constraints: vec![constraint("arch")],
            task_groups: vec![
                TaskGroupTemplate {
                    name: "a".into(),
                    count: Some(2),
                    robot_selector: Some(LabelSelector::from_labels([("tier", "gold")])),
                    constraints: vec![constraint("os")],
                    ..TaskGroupTemplate::default()
                },
                TaskGroupTemplate {
                    name: "b".into(),
                    count: Some(1),
                    ..TaskGroupTemplate::default()
                },
            ],
            priority: 7,
            order: Vec::new(),
        };
        let groups = desired_groups("j", &job);
        let a = &groups["j-a"];
        assert_eq!(a.job, "j");
        assert_eq!(a.priority, 7);
        let selector = a.template.robot_selector.as_ref().unwrap();
        assert_eq!(selector.match_labels.len(), 2);
        assert_eq!(a.template.constraints.len(), 2);
        let b = &groups["j-b"];
        assert_eq!(b.template.robot_selector, job.robot_selector);
        assert_eq!(b.template.constraints, vec![constraint("arch")]);
    }
}
