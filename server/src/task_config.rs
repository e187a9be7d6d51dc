//! What a Task's references to ConfigMaps and Secrets come to on its robot,
//! read as it is dispatched: each object the template names (the robot's
//! name put in for `$(K8S4R_ROBOT_ID)`) is read from the Task's namespace,
//! and [`k8s4r_api::config_resolve::resolve`] (the same rule the manager's
//! scheduler placed it by) makes the values and files the dispatch carries.
//! Values are never logged: errors name objects and keys only.

use std::collections::BTreeMap;

use k8s4r_api::config_ref::ObjectKind;
use k8s4r_api::config_resolve::{self, expand, Object, Problem};
use k8s4r_api::protocol::{ConfigFile, ConfigSource, ConfigVar, TaskConfig};
use k8s4r_api::Task;
use k8s_openapi::api::core::v1::{ConfigMap, Secret};
use kube::Api;

use crate::bridge::Bridge;
use crate::error::{Error, Result};

/// Why a dispatch cannot carry its task's configuration.
#[derive(Debug)]
pub enum Unresolved {
    /// The objects say no (missing, too large, a value that cannot be a
    /// variable).
    Problem(Problem),
    /// A variable's value is not text without NUL.
    NotText {
        kind: ObjectKind,
        name: String,
        var: String,
    },
}

impl Unresolved {
    /// The Task's reason: the task waits for the objects to change.
    pub fn reason(&self) -> k8s4r_api::TaskReason {
        match self {
            Unresolved::Problem(p) if p.is_missing() => k8s4r_api::TaskReason::ConfigMissing,
            _ => k8s4r_api::TaskReason::ConfigInvalid,
        }
    }
}

impl std::fmt::Display for Unresolved {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Unresolved::Problem(p) => p.fmt(f),
            Unresolved::NotText { kind, name, var } => write!(
                f,
                "variable {var} from {kind} {name:?} is not text (UTF-8 without NUL); use it as a file instead"
            ),
        }
    }
}

/// The configuration `task` takes on `robot`: `Ok(None)` when it takes
/// none, `Ok(Err(_))` when the objects do not allow it.
pub async fn resolve(
    bridge: &Bridge,
    task: &Task,
    robot: &str,
) -> Result<Option<std::result::Result<TaskConfig, Unresolved>>> {
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
        Err(problem) => return Ok(Some(Err(Unresolved::Problem(problem)))),
    };
    let mut env = Vec::with_capacity(resolved.env.len());
    for (name, value, secret) in resolved.env {
        match String::from_utf8(value) {
            Ok(value) if !value.contains('\0') => env.push(ConfigVar { name, value, secret }),
            _ => {
                let (kind, object) = source_of_var(template, &name, robot);
                return Ok(Some(Err(Unresolved::NotText {
                    kind,
                    name: object,
                    var: name,
                })));
            }
        }
    }
    Ok(Some(Ok(TaskConfig {
        env,
        files: resolved
            .files
            .into_iter()
            .map(|f| ConfigFile::new(f.path, f.mode, f.secret, &f.value))
            .collect(),
        sources: resolved
            .sources
            .into_iter()
            .map(|(kind, name, resource_version)| ConfigSource {
                kind,
                name,
                resource_version,
            })
            .collect(),
    })))
}

/// The object a variable named `var` came from, for a message.
fn source_of_var(template: &k8s4r_api::TaskTemplate, var: &str, robot: &str) -> (ObjectKind, String) {
    let direct = template
        .env
        .iter()
        .find(|v| v.name == var)
        .and_then(|v| v.value_from.as_ref());
    if let Some(from) = direct {
        if let Some(r) = &from.config_map_key_ref {
            return (ObjectKind::ConfigMap, expand(&r.name, robot));
        }
        if let Some(r) = &from.secret_key_ref {
            return (ObjectKind::Secret, expand(&r.name, robot));
        }
    }
    for from in &template.env_from {
        let prefix = from.prefix.as_deref().unwrap_or_default();
        if !var.starts_with(prefix) {
            continue;
        }
        if let Some(r) = &from.secret_ref {
            return (ObjectKind::Secret, expand(&r.name, robot));
        }
        if let Some(r) = &from.config_map_ref {
            return (ObjectKind::ConfigMap, expand(&r.name, robot));
        }
    }
    (ObjectKind::ConfigMap, String::new())
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
