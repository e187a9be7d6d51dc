//! The shell of [`crate::config_change`]: reads what a running service's
//! configuration is now (the cache's objects) and how many of its group
//! restart for a change, and writes the request for the server
//! (`robot.k8s4r.io/config-refresh`).

use std::time::Duration;

use k8s4r_api::config_ref::{ConfigRefresh, ConfigSource, OnConfigChange};
use k8s4r_api::names::ANNOTATION_CONFIG_REFRESH;
use k8s4r_api::{Task, TaskGroup, TaskKind};
use k8s4r_service::patch::Guarded;
use kube::runtime::reflector::ObjectRef;
use kube::{Api, Resource, ResourceExt};

use super::{names, Context};
use crate::config_change::{self, Refresh, Running};
use crate::controllers::config::Cached;
use crate::error::Result;

/// Asks for `task`'s configuration to be sent again when an object it
/// takes changed; `Some(after)`: look again then (a change waits for its
/// turn, or a request is under way).
pub(super) async fn refresh_config(task: &Task, ctx: &Context) -> Result<Option<Duration>> {
    let template = &task.spec.template;
    if template.kind != TaskKind::Service || !k8s4r_api::config_resolve::has_references(template) {
        return Ok(None);
    }
    let Some(robot) = task.status.as_ref().and_then(|s| s.robot.as_deref()) else {
        return Ok(None);
    };
    let (ns, name) = names(task)?;
    let uid = task.metadata.uid.clone().unwrap_or_default();
    let desired = Cached::of(template, &ns, &ctx.stores)
        .and_then(|cached| cached.sources(robot))
        .map(|sources| ConfigSource::versions(&sources));
    // A restart is decided and asked for one task at a time, so that the
    // group's count includes what was just asked.
    let restart = template.on_config_change == OnConfigChange::Restart;
    let _turn = match restart {
        true => Some(ctx.config_turns.lock().await),
        false => None,
    };
    let asked = ctx.newest_asked(task);
    let running = Running {
        template,
        status: task.status.as_ref(),
        asked: asked.as_ref(),
    };
    let (restarting, max_parallel) = match restart {
        true => group_restarts(task, ctx),
        false => (0, 1),
    };
    let now = jiff::Timestamp::now();
    let refresh = match config_change::decide(running, desired.as_deref(), restarting, max_parallel, now) {
        Refresh::Nothing => return Ok(None),
        Refresh::Wait(after) => return Ok(Some(after)),
        Refresh::Ask(refresh) => refresh,
    };
    let value = serde_json::to_string(&refresh).unwrap_or_default();
    let body = Guarded::metadata(
        task.metadata.resource_version.as_deref(),
        serde_json::json!({ "annotations": { ANNOTATION_CONFIG_REFRESH: value } }),
    );
    let api: Api<Task> = Api::namespaced(ctx.client(), &ns);
    let params = ctx.kube.patch_params();
    let merge = kube::api::Patch::Merge(&body);
    let call = api.patch(&name, &params, &merge);
    ctx.api::<Task, _>("annotate", &name, call).await?;
    tracing::info!(task = %name, attempt = refresh.attempt, generation = refresh.generation, versions = %refresh.versions, "asked for the task's changed configuration to be sent");
    k8s4r_service::lock(&ctx.config_asked).insert(uid, refresh);
    Ok(None)
}

/// How many of `task`'s group (but itself) restart for a change now, and
/// how many may: its TaskGroup's `maxParallel` (1 without one).
fn group_restarts(task: &Task, ctx: &Context) -> (usize, usize) {
    let own = task.metadata.uid.as_deref();
    let Some(owner) = task
        .owner_references()
        .iter()
        .find(|o| o.kind == TaskGroup::kind(&()))
    else {
        return (0, 1);
    };
    let group = ctx
        .stores
        .groups
        .get(&ObjectRef::new(&owner.name).within(task.metadata.namespace.as_deref().unwrap_or_default()));
    let max = config_change::max_parallel(group.and_then(|g| g.spec.template.max_parallel));
    let restarting = ctx
        .group_tasks
        .of(&ctx.stores.tasks, &owner.uid)
        .iter()
        .filter(|t| t.metadata.uid.as_deref() != own)
        .filter(|t| {
            let asked = ctx.newest_asked(t);
            Running {
                template: &t.spec.template,
                status: t.status.as_ref(),
                asked: asked.as_ref(),
            }
            .restarting()
        })
        .count();
    (restarting, max)
}

impl Context {
    /// The newest of the request `task`'s annotation carries and the one
    /// this manager asked for and its cache does not show yet.
    fn newest_asked(&self, task: &Task) -> Option<ConfigRefresh> {
        let annotated = ConfigRefresh::of(task.metadata.annotations.as_ref());
        let uid = task.metadata.uid.as_deref()?;
        let mut asked = k8s4r_service::lock(&self.config_asked);
        let remembered = asked.get(uid).cloned();
        let key = |r: &ConfigRefresh| (r.attempt, r.generation);
        match (annotated, remembered) {
            (Some(a), Some(r)) if key(&a) >= key(&r) => {
                asked.remove(uid);
                Some(a)
            }
            (Some(_), Some(r)) | (None, Some(r)) => Some(r),
            (a, None) => a,
        }
    }
}
