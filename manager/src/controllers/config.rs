//! What Tasks take from ConfigMaps and Secrets, as the scheduler sees it:
//! the objects are cached with their keys, the size of each value and
//! whether it is text, never the values (the server reads those at dispatch), and a task's references
//! must resolve on a robot for it to go there.

use std::collections::BTreeMap;

use k8s4r_api::config_ref::{ConfigSource, ObjectKind};
use k8s4r_api::config_resolve::{self, expand, KeyInfo, Problem};
use k8s4r_api::TaskTemplate;
use k8s_openapi::api::core::v1::{ConfigMap, Secret};
use kube::runtime::reflector::ObjectRef;
use kube::runtime::watcher;
use kube::ResourceExt;

use super::context::{Context, Stores};
use crate::scheduler::ConfigLookup;

/// The annotation the manager's cache keeps what it knows of each key in,
/// as JSON (`{"key": {"bytes": 8, "text": true}}`); only in memory, never
/// written.
const SIZES: &str = "k8s4r.io/cached-sizes";

/// Shapes a ConfigMap for the cache: keys and sizes, no values.
pub(super) fn keys_of_config_map(cm: &mut ConfigMap) {
    let mut sizes: BTreeMap<String, KeyInfo> = BTreeMap::new();
    for (key, value) in cm.data.take().unwrap_or_default() {
        sizes.insert(key, KeyInfo::of(value.as_bytes()));
    }
    for (key, value) in cm.binary_data.take().unwrap_or_default() {
        sizes.insert(key, KeyInfo::of(&value.0));
    }
    cached(&mut cm.metadata, &sizes);
}

/// Shapes a Secret for the cache: keys and sizes, no values.
pub(super) fn keys_of_secret(secret: &mut Secret) {
    let mut sizes: BTreeMap<String, KeyInfo> = BTreeMap::new();
    for (key, value) in secret.data.take().unwrap_or_default() {
        sizes.insert(key, KeyInfo::of(&value.0));
    }
    for (key, value) in secret.string_data.take().unwrap_or_default() {
        sizes.insert(key, KeyInfo::of(value.as_bytes()));
    }
    cached(&mut secret.metadata, &sizes);
}

fn cached(meta: &mut kube::api::ObjectMeta, sizes: &BTreeMap<String, KeyInfo>) {
    meta.managed_fields = None;
    let annotations = meta.annotations.get_or_insert_with(BTreeMap::new);
    annotations.clear();
    annotations.insert(SIZES.to_owned(), serde_json::to_string(sizes).unwrap_or_default());
}

fn sizes_of(meta: &kube::api::ObjectMeta) -> config_resolve::Object<KeyInfo> {
    let data = meta
        .annotations
        .as_ref()
        .and_then(|a| a.get(SIZES))
        .and_then(|s| serde_json::from_str(s).ok())
        .unwrap_or_default();
    config_resolve::Object {
        data,
        resource_version: meta.resource_version.clone().unwrap_or_default(),
    }
}

/// A task's references, checked against the cache. One decision looks at
/// many robots: each object is read off the cache once per decision.
pub(super) struct Cached<'a> {
    template: &'a TaskTemplate,
    namespace: &'a str,
    stores: &'a Stores,
    read: std::sync::Mutex<Read>,
}

/// The objects one decision read: keys and sizes, `None` when missing.
type Read = BTreeMap<(ObjectKind, String), Option<config_resolve::Object<KeyInfo>>>;

impl std::fmt::Debug for Cached<'_> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Cached")
            .field("namespace", &self.namespace)
            .finish()
    }
}

impl<'a> Cached<'a> {
    /// The lookup for `template` in `namespace`; `None` when it takes
    /// nothing from ConfigMaps or Secrets.
    pub(super) fn of(template: &'a TaskTemplate, namespace: &'a str, stores: &'a Stores) -> Option<Self> {
        config_resolve::has_references(template).then(|| Self {
            template,
            namespace,
            stores,
            read: std::sync::Mutex::default(),
        })
    }
}

impl Cached<'_> {
    /// The objects the task takes on `robot` as the cache has them, each
    /// at its version; None when they do not resolve there.
    pub(super) fn sources(&self, robot: &str) -> Option<Vec<ConfigSource>> {
        let read = self.read_for(robot);
        let resolved = config_resolve::resolve(self.template, robot, |kind, name| {
            read.get(&(kind, name.to_owned())).and_then(Option::as_ref)
        })
        .ok()?;
        Some(resolved.sources)
    }

    /// The objects the template names on `robot`, read off the cache once
    /// per decision.
    fn read_for(&self, robot: &str) -> std::sync::MutexGuard<'_, Read> {
        let mut read = k8s4r_service::lock(&self.read);
        for (kind, name) in config_resolve::objects_named(self.template) {
            let name = expand(name, robot);
            if read.contains_key(&(kind, name.clone())) {
                continue;
            }
            let meta = match kind {
                ObjectKind::ConfigMap => self
                    .stores
                    .config_maps
                    .get(&ObjectRef::new(&name).within(self.namespace))
                    .map(|o| o.metadata.clone()),
                ObjectKind::Secret => self
                    .stores
                    .secrets
                    .get(&ObjectRef::new(&name).within(self.namespace))
                    .map(|o| o.metadata.clone()),
            };
            read.insert((kind, name), meta.as_ref().map(sizes_of));
        }
        read
    }
}

impl ConfigLookup for Cached<'_> {
    fn problem(&self, robot: &str) -> Option<Problem> {
        let read = self.read_for(robot);
        let read = &*read;
        config_resolve::resolve(self.template, robot, |kind, name| {
            read.get(&(kind, name.to_owned())).and_then(Option::as_ref)
        })
        .err()
    }
}

impl Context {
    /// A ConfigMap or Secret appeared or changed: the tasks waiting in its
    /// namespace look again (one may wait for it).
    fn wake_in(&self, namespace: Option<String>) {
        let sched = self.sched();
        for waiting in sched.waiting_by_priority() {
            if waiting.namespace == namespace {
                self.triggers.task(waiting);
            }
        }
    }

    /// A ConfigMap or Secret changed: the running services that take it
    /// look again (their robots may take the change).
    fn wake_users(&self, kind: ObjectKind, namespace: Option<String>, name: &str) {
        for task in self.stores.tasks.state() {
            let template = &task.spec.template;
            let running = task.status.as_ref().and_then(|s| s.state) == Some(k8s4r_api::TaskState::Running);
            if template.kind != k8s4r_api::TaskKind::Service
                || !running
                || task.metadata.namespace != namespace
                || !config_resolve::has_references(template)
            {
                continue;
            }
            let robot = task
                .status
                .as_ref()
                .and_then(|s| s.robot.clone())
                .unwrap_or_default();
            let takes = config_resolve::objects_named(template)
                .into_iter()
                .any(|(k, n)| k == kind && expand(n, &robot) == name);
            if takes {
                self.triggers.task(ObjectRef::from_obj(task.as_ref()));
            }
        }
    }

    // A relist after a watch gap brings what changed meanwhile as
    // InitApply: it may be what a task waits for.
    pub(super) fn on_config_map(&self, event: &watcher::Event<ConfigMap>) {
        if let watcher::Event::Apply(o) | watcher::Event::InitApply(o) = event {
            self.wake_in(o.namespace());
            self.wake_users(ObjectKind::ConfigMap, o.namespace(), &o.name_any());
        }
    }

    pub(super) fn on_secret(&self, event: &watcher::Event<Secret>) {
        if let watcher::Event::Apply(o) | watcher::Event::InitApply(o) = event {
            self.wake_in(o.namespace());
            self.wake_users(ObjectKind::Secret, o.namespace(), &o.name_any());
        }
    }
}
