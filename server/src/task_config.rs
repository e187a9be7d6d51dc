//! What a Task's references to ConfigMaps and Secrets come to on its robot,
//! read as it is dispatched: each object the template names (the robot's
//! name put in for `$(K8S4R_ROBOT_ID)`) is read from the Task's namespace,
//! and [`k8s4r_api::config_resolve::resolve`] (the same rule the manager's
//! scheduler placed it by) makes the values and files the dispatch carries.
//! Values are never logged: errors name objects and keys only.

use std::collections::BTreeMap;

use k8s4r_api::config_ref::ObjectKind;
use k8s4r_api::config_resolve::{self, expand, Object, Problem};
use k8s4r_api::protocol::{ConfigFile, ConfigVar, TaskConfig};
use k8s4r_api::Task;
use k8s_openapi::api::core::v1::{ConfigMap, Secret};
use kube::Api;

use crate::bridge::Bridge;
use crate::error::{Error, Result};

/// The configuration `task` takes on `robot`: `Ok(None)` when it takes
/// none, `Ok(Err(_))` when the objects do not allow it.
pub async fn resolve(
    bridge: &Bridge,
    task: &Task,
    robot: &str,
) -> Result<Option<std::result::Result<TaskConfig, Problem>>> {
    let template = &task.spec.template;
    if !config_resolve::has_references(template) {
        return Ok(None);
    }
    let namespace = task.metadata.namespace.as_deref().unwrap_or_default();
    let mut objects: BTreeMap<(ObjectKind, String), Object<Vec<u8>>> = BTreeMap::new();
    for (kind, name) in config_resolve::objects_named(template) {
        let name = expand(name, robot);
        if let Some(object) = read(bridge, namespace, kind, &name).await? {
            objects.insert((kind, name), object);
        }
    }
    let resolved = match config_resolve::resolve(template, robot, |kind, name| {
        objects.get(&(kind, name.to_owned()))
    }) {
        Ok(r) => r,
        Err(problem) => return Ok(Some(Err(problem))),
    };
    // Every variable's value is text: the resolution refuses others.
    let env = resolved
        .env
        .into_iter()
        .map(|(name, value, secret)| ConfigVar {
            name,
            value: String::from_utf8_lossy(&value).into_owned(),
            secret,
        })
        .collect();
    Ok(Some(Ok(TaskConfig {
        env,
        files: resolved
            .files
            .into_iter()
            .map(|f| ConfigFile::new(f.path, f.mode, f.secret, &f.value))
            .collect(),
        sources: resolved.sources,
        generation: 0,
    })))
}

/// One object's data, `None` when it does not exist.
async fn read(
    bridge: &Bridge,
    namespace: &str,
    kind: ObjectKind,
    name: &str,
) -> Result<Option<Object<Vec<u8>>>> {
    let client = bridge.kube().client().clone();
    let action = || format!("reading {kind} {namespace}/{name} for a dispatch");
    match kind {
        ObjectKind::ConfigMap => {
            let api: Api<ConfigMap> = Api::namespaced(client, namespace);
            let found = bridge
                .kube()
                .read(action, api.get_opt(name))
                .await
                .map_err(Error::from)?;
            Ok(found.map(|cm| {
                let mut data: BTreeMap<String, Vec<u8>> = cm
                    .data
                    .unwrap_or_default()
                    .into_iter()
                    .map(|(k, v)| (k, v.into_bytes()))
                    .collect();
                for (k, v) in cm.binary_data.unwrap_or_default() {
                    data.insert(k, v.0);
                }
                Object {
                    data,
                    resource_version: cm.metadata.resource_version.unwrap_or_default(),
                }
            }))
        }
        ObjectKind::Secret => {
            let api: Api<Secret> = Api::namespaced(client, namespace);
            let found = bridge
                .kube()
                .read(action, api.get_opt(name))
                .await
                .map_err(Error::from)?;
            Ok(found.map(|s| {
                let mut data: BTreeMap<String, Vec<u8>> = s
                    .data
                    .unwrap_or_default()
                    .into_iter()
                    .map(|(k, v)| (k, v.0))
                    .collect();
                for (k, v) in s.string_data.unwrap_or_default() {
                    data.insert(k, v.into_bytes());
                }
                Object {
                    data,
                    resource_version: s.metadata.resource_version.unwrap_or_default(),
                }
            }))
        }
    }
}
