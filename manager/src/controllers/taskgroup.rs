//! TaskGroupController: `count` Tasks per group, named by index, and the
//! group's status.

use std::collections::BTreeMap;
use std::sync::Arc;

use futures::{stream, TryStreamExt};
use k8s4r_api::names::{LABEL_GROUP, LABEL_INDEX, LABEL_JOB};
use k8s4r_api::{Task, TaskGroup, TaskSpec};
use kube::api::{DeleteParams, ObjectMeta};
use kube::runtime::controller::Action;
use kube::{Api, Resource, ResourceExt};
use tracing::instrument;

use super::{key_of, Context};
use crate::aggregate::{group_status, TaskView};
use crate::error::{Error, Result};
use crate::lifecycle::effective_state;

/// How many Tasks one reconcile creates or deletes at once.
const PARALLEL_WRITES: usize = 16;

/// Reconciles one TaskGroup.
#[instrument(skip_all, fields(taskgroup = %key_of(group.as_ref())))]
pub async fn reconcile(group: Arc<TaskGroup>, ctx: Arc<Context>) -> Result<Action> {
    let key = key_of(group.as_ref());
    ctx.instrumented("taskgroup", key, reconcile_group(&group, &ctx))
        .await
}

/// Backs off a TaskGroup whose reconcile failed.
pub fn error_policy(group: Arc<TaskGroup>, error: &Error, ctx: Arc<Context>) -> Action {
    ctx.error_policy("taskgroup", key_of(group.as_ref()), error)
}

/// The Task at `index` of `group`, as it should be created.
pub fn desired_task(group: &TaskGroup, index: i32) -> Result<Task> {
    let owner = group.controller_owner_ref(&()).ok_or_else(|| Error::Malformed {
        kind: "TaskGroup",
        name: group.name_any(),
        reason: "no uid to own tasks with".into(),
    })?;
    let template = &group.spec.template;
    let labels = BTreeMap::from([
        (LABEL_JOB.to_owned(), group.spec.job.clone()),
        (LABEL_GROUP.to_owned(), template.name.clone()),
        (LABEL_INDEX.to_owned(), index.to_string()),
    ]);
    Ok(Task {
        metadata: ObjectMeta {
            name: Some(format!("{}-{index}", group.name_any())),
            namespace: group.namespace(),
            labels: Some(labels),
            owner_references: Some(vec![owner]),
            ..ObjectMeta::default()
        },
        spec: TaskSpec {
            template: template.task.clone(),
            robot_selector: template.robot_selector.clone(),
            constraints: template.constraints.clone(),
            restart_policy: template.restart_policy.clone(),
            disconnect: template.disconnect.clone(),
            priority: group.spec.priority,
            target_robot: None,
        },
        status: None,
    })
}

fn index_of(task: &Task) -> Option<i32> {
    task.labels().get(LABEL_INDEX)?.parse().ok()
}

async fn reconcile_group(group: &TaskGroup, ctx: &Context) -> Result<Action> {
    if group.meta().deletion_timestamp.is_some() {
        return Ok(Action::await_change());
    }
    let ns = group.namespace().unwrap_or_default();
    let uid = group.uid().unwrap_or_default();
    let count = group.spec.template.count.max(0);
    let owned: Vec<Arc<Task>> = ctx.stores.tasks.state_filter(|t| {
        t.namespace().as_deref() == Some(ns.as_str()) && t.owner_references().iter().any(|o| o.uid == uid)
    });
    let api: Api<Task> = Api::namespaced(ctx.client(), &ns);

    let mut present = vec![false; count as usize];
    let mut extra = Vec::new();
    for task in &owned {
        match index_of(task) {
            Some(i) if (0..count).contains(&i) => present[i as usize] = true,
            _ => extra.push(task.name_any()),
        }
    }
    let missing: Vec<Task> = present
        .iter()
        .enumerate()
        .filter(|(_, here)| !**here)
        .map(|(i, _)| desired_task(group, i as i32))
        .collect::<Result<_>>()?;
    stream::iter(missing.into_iter().map(Ok))
        .try_for_each_concurrent(PARALLEL_WRITES, |task| {
            let api = api.clone();
            async move {
                let name = task.name_any();
                match ctx
                    .api::<Task, _>("create", &name, api.create(&ctx.kube.post_params(), &task))
                    .await
                {
                    Ok(_) => Ok(()),
                    // The cache had not seen it yet.
                    Err(Error::Api(e)) if e.is_conflict() => Ok(()),
                    Err(e) => Err(e),
                }
            }
        })
        .await?;
    stream::iter(extra.into_iter().map(Ok))
        .try_for_each_concurrent(PARALLEL_WRITES, |name| {
            let api = api.clone();
            async move {
                match ctx
                    .api::<Task, _>("delete", &name, api.delete(&name, &DeleteParams::background()))
                    .await
                {
                    Ok(_) => Ok(()),
                    Err(Error::Api(e)) if e.is_not_found() => Ok(()),
                    Err(e) => Err(e),
                }
            }
        })
        .await?;

    let lifecycle = &ctx.config.lifecycle;
    let views: Vec<TaskView<'_>> = owned
        .iter()
        .filter(|t| index_of(t).is_some_and(|i| (0..count).contains(&i)))
        .map(|t| TaskView {
            state: effective_state(&t.spec, t.status.as_ref(), lifecycle),
            robot: t
                .status
                .as_ref()
                .and_then(|s| s.robot.as_deref())
                .or(t.spec.target_robot.as_deref()),
        })
        .collect();
    let status = group_status(count, views, group.status.as_ref(), group.meta().generation);
    if group.status.as_ref() != Some(&status) {
        let groups: Api<TaskGroup> = Api::namespaced(ctx.client(), &ns);
        ctx.patch_status(&groups, &group.name_any(), None, &status)
            .await?;
    }
    Ok(Action::await_change())
}
