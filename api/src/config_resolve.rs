//! How a task template's references to ConfigMaps and Secrets resolve for
//! one robot: a pure function of the template, the robot's name and what the
//! objects hold, so the manager (which knows only the keys and sizes) and the
//! server (which reads the values) decide alike.

use std::collections::BTreeMap;
use std::fmt;

use crate::config_ref::{
    is_env_name, ConfigFiles, EnvFromSource, KeySelector, ObjectKind, CONFIG_MAP_FILE_MODE,
    MAX_TASK_CONFIG_BYTES, ROBOT_PLACEHOLDER, SECRET_FILE_MODE,
};
use crate::task::{TaskReason, TaskTemplate};

/// Whether `template` takes anything from ConfigMaps or Secrets.
pub fn has_references(template: &TaskTemplate) -> bool {
    !template.env_from.is_empty()
        || !template.files.is_empty()
        || template.env.iter().any(|v| v.value_from.is_some())
}

/// Every object `template` names, with the placeholder left in.
pub fn objects_named(template: &TaskTemplate) -> Vec<(ObjectKind, &str)> {
    let mut named = Vec::new();
    for var in &template.env {
        if let Some(from) = &var.value_from {
            if let Some(r) = &from.config_map_key_ref {
                named.push((ObjectKind::ConfigMap, r.name.as_str()));
            }
            if let Some(r) = &from.secret_key_ref {
                named.push((ObjectKind::Secret, r.name.as_str()));
            }
        }
    }
    for from in &template.env_from {
        if let Some(r) = &from.config_map_ref {
            named.push((ObjectKind::ConfigMap, r.name.as_str()));
        }
        if let Some(r) = &from.secret_ref {
            named.push((ObjectKind::Secret, r.name.as_str()));
        }
    }
    for files in &template.files {
        if let Some(c) = &files.config_map {
            named.push((ObjectKind::ConfigMap, c.name.as_str()));
        }
        if let Some(s) = &files.secret {
            named.push((ObjectKind::Secret, s.secret_name.as_str()));
        }
    }
    named.sort();
    named.dedup();
    named
}

/// `text` with the robot placeholder replaced by `robot`.
pub fn expand(text: &str, robot: &str) -> String {
    text.replace(ROBOT_PLACEHOLDER, robot)
}

/// What a ConfigMap's or Secret's key holds, as far as the resolver needs
/// it: the manager knows only its size and whether it is text, the server
/// the bytes.
pub trait Value: Clone {
    /// Its size in bytes.
    fn size(&self) -> usize;
    /// Whether it may be a variable's value: UTF-8 without NUL.
    fn is_text(&self) -> bool;
}

/// What the manager keeps of a key: no value.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
pub struct KeyInfo {
    pub bytes: usize,
    pub text: bool,
}

impl KeyInfo {
    /// What `value` is.
    pub fn of(value: &[u8]) -> Self {
        Self {
            bytes: value.len(),
            text: is_text(value),
        }
    }
}

impl Value for KeyInfo {
    fn size(&self) -> usize {
        self.bytes
    }
    fn is_text(&self) -> bool {
        self.text
    }
}

impl Value for Vec<u8> {
    fn size(&self) -> usize {
        self.len()
    }
    fn is_text(&self) -> bool {
        is_text(self)
    }
}

/// Whether `bytes` may be a variable's value: UTF-8 without NUL.
pub fn is_text(bytes: &[u8]) -> bool {
    std::str::from_utf8(bytes).is_ok() && !bytes.contains(&0)
}

/// One object as the resolver sees it: its keys and what each holds, and
/// its resourceVersion.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Object<V> {
    pub data: BTreeMap<String, V>,
    pub resource_version: String,
}

/// Why a template's references do not resolve on a robot.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Problem {
    /// A required object does not exist.
    NoObject { kind: ObjectKind, name: String },
    /// A required key is not in its object.
    NoKey {
        kind: ObjectKind,
        name: String,
        key: String,
    },
    /// A key a variable takes is not text.
    NotText {
        kind: ObjectKind,
        name: String,
        key: String,
    },
    /// All together it is more than a task may take.
    TooLarge {
        bytes: usize,
        largest: (ObjectKind, String),
    },
}

impl Problem {
    /// Whether the task should wait for it (an object or key that may
    /// appear), rather than be refused.
    pub fn is_missing(&self) -> bool {
        matches!(self, Problem::NoObject { .. } | Problem::NoKey { .. })
    }

    /// The Task's reason for it: `ConfigMissing` or `ConfigInvalid`.
    pub fn reason(&self) -> TaskReason {
        if self.is_missing() {
            TaskReason::ConfigMissing
        } else {
            TaskReason::ConfigInvalid
        }
    }
}

impl fmt::Display for Problem {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Problem::NoObject { kind, name } => write!(f, "{kind} {name:?} not found"),
            Problem::NoKey { kind, name, key } => write!(f, "{kind} {name:?} has no key {key:?}"),
            Problem::NotText { kind, name, key } => write!(
                f,
                "key {key:?} of {kind} {name:?} is not text (UTF-8 without NUL) and cannot be a variable; take it as a file"
            ),
            Problem::TooLarge {
                bytes,
                largest: (kind, name),
            } => write!(
                f,
                "configuration of {} KiB is over the {} KiB a task may take (largest: {kind} {name:?})",
                bytes.div_ceil(1024),
                MAX_TASK_CONFIG_BYTES / 1024
            ),
        }
    }
}

/// A file the task gets.
#[derive(Clone, PartialEq, Eq)]
pub struct File<V> {
    /// Relative to the task's directory.
    pub path: String,
    pub mode: u32,
    /// From a Secret.
    pub secret: bool,
    pub value: V,
}

/// What a template's references come to on one robot.
#[derive(Clone, PartialEq, Eq)]
pub struct Resolved<V> {
    /// Variables in the order they are set (a later one of the same name
    /// wins): `envFrom`'s, then `env`'s.
    pub env: Vec<(String, V, bool)>,
    pub files: Vec<File<V>>,
    /// The objects read, each with its resourceVersion.
    pub sources: Vec<crate::config_ref::ConfigSource>,
    /// Keys `envFrom` skipped because they are not variable names.
    pub skipped_keys: Vec<String>,
}

impl<V> Default for Resolved<V> {
    fn default() -> Self {
        Self {
            env: Vec::new(),
            files: Vec::new(),
            sources: Vec::new(),
            skipped_keys: Vec::new(),
        }
    }
}

impl<V> fmt::Debug for Resolved<V> {
    /// Names and paths only: values may be secret.
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Resolved")
            .field("env", &self.env.iter().map(|(n, _, _)| n).collect::<Vec<_>>())
            .field("files", &self.files.iter().map(|x| &x.path).collect::<Vec<_>>())
            .field("sources", &self.sources)
            .finish()
    }
}

impl<V: Value> Resolved<V> {
    /// Bytes of values and file contents together, as the dispatch carries
    /// them (a file's content in base64).
    pub fn bytes(&self) -> usize {
        self.env.iter().map(|(n, v, _)| n.len() + v.size()).sum::<usize>()
            + self
                .files
                .iter()
                .map(|f| f.path.len() + f.value.size().div_ceil(3) * 4)
                .sum::<usize>()
    }
}

struct Resolver<'r, V, L> {
    robot: &'r str,
    lookup: L,
    out: Resolved<V>,
    sizes: BTreeMap<(ObjectKind, String), usize>,
}

impl<'r, 'a, V: Value + 'a, L> Resolver<'r, V, L>
where
    L: FnMut(ObjectKind, &str) -> Option<&'a Object<V>>,
{
    /// The object `name` names, `None` when it is optional and missing.
    fn object(
        &mut self,
        kind: ObjectKind,
        name: &str,
        optional: bool,
    ) -> Result<Option<&'a Object<V>>, Problem> {
        let name = expand(name, self.robot);
        match (self.lookup)(kind, &name) {
            Some(object) => {
                if !self.out.sources.iter().any(|s| s.kind == kind && s.name == name) {
                    self.out.sources.push(crate::config_ref::ConfigSource {
                        kind,
                        name: name.clone(),
                        resource_version: object.resource_version.clone(),
                    });
                }
                Ok(Some(object))
            }
            None if optional => Ok(None),
            None => Err(Problem::NoObject { kind, name }),
        }
    }

    fn key(&mut self, kind: ObjectKind, selector: &KeySelector) -> Result<Option<V>, Problem> {
        let optional = selector.optional == Some(true);
        let Some(object) = self.object(kind, &selector.name, optional)? else {
            return Ok(None);
        };
        let key = expand(&selector.key, self.robot);
        match object.data.get(&key) {
            Some(value) if !value.is_text() => Err(Problem::NotText {
                kind,
                name: expand(&selector.name, self.robot),
                key,
            }),
            Some(value) => {
                self.count(kind, &selector.name, value.size());
                Ok(Some(value.clone()))
            }
            None if optional => Ok(None),
            None => Err(Problem::NoKey {
                kind,
                name: expand(&selector.name, self.robot),
                key,
            }),
        }
    }

    fn count(&mut self, kind: ObjectKind, name: &str, bytes: usize) {
        *self.sizes.entry((kind, expand(name, self.robot))).or_default() += bytes;
    }

    fn env_from(&mut self, from: &EnvFromSource) -> Result<(), Problem> {
        let (kind, selector) = match (&from.config_map_ref, &from.secret_ref) {
            (Some(c), _) => (ObjectKind::ConfigMap, c),
            (None, Some(s)) => (ObjectKind::Secret, s),
            (None, None) => return Ok(()),
        };
        let Some(object) = self.object(kind, &selector.name, selector.optional == Some(true))? else {
            return Ok(());
        };
        let prefix = from.prefix.as_deref().unwrap_or_default();
        for (key, value) in &object.data {
            let name = format!("{prefix}{key}");
            if !is_env_name(&name) {
                self.out.skipped_keys.push(name);
                continue;
            }
            if !value.is_text() {
                return Err(Problem::NotText {
                    kind,
                    name: expand(&selector.name, self.robot),
                    key: key.clone(),
                });
            }
            self.count(kind, &selector.name, value.size());
            self.out
                .env
                .push((name, value.clone(), kind == ObjectKind::Secret));
        }
        Ok(())
    }

    fn files(&mut self, files: &ConfigFiles) -> Result<(), Problem> {
        let (kind, name, items, default_mode, optional) = match (&files.config_map, &files.secret) {
            (Some(c), _) => (
                ObjectKind::ConfigMap,
                &c.name,
                &c.items,
                c.default_mode.unwrap_or(CONFIG_MAP_FILE_MODE),
                c.optional == Some(true),
            ),
            (None, Some(s)) => (
                ObjectKind::Secret,
                &s.secret_name,
                &s.items,
                s.default_mode.unwrap_or(SECRET_FILE_MODE),
                s.optional == Some(true),
            ),
            (None, None) => return Ok(()),
        };
        let Some(object) = self.object(kind, name, optional)? else {
            return Ok(());
        };
        let secret = kind == ObjectKind::Secret;
        let dir = files.path.trim_end_matches('/');
        if items.is_empty() {
            for (key, value) in &object.data {
                self.count(kind, name, value.size());
                self.out.files.push(File {
                    path: format!("{dir}/{key}"),
                    mode: default_mode,
                    secret,
                    value: value.clone(),
                });
            }
            return Ok(());
        }
        for item in items {
            let key = expand(&item.key, self.robot);
            let Some(value) = object.data.get(&key) else {
                if optional {
                    continue;
                }
                return Err(Problem::NoKey {
                    kind,
                    name: expand(name, self.robot),
                    key,
                });
            };
            self.count(kind, name, value.size());
            self.out.files.push(File {
                path: format!("{dir}/{}", expand(&item.path, self.robot)),
                mode: item.mode.unwrap_or(default_mode),
                secret,
                value: value.clone(),
            });
        }
        Ok(())
    }
}

/// What `template`'s references come to on the robot `robot`, reading
/// objects of the task's namespace through `lookup`; the first problem
/// otherwise.
pub fn resolve<'a, V: Value + 'a>(
    template: &TaskTemplate,
    robot: &str,
    lookup: impl FnMut(ObjectKind, &str) -> Option<&'a Object<V>>,
) -> Result<Resolved<V>, Problem> {
    let mut r = Resolver {
        robot,
        lookup,
        out: Resolved::default(),
        sizes: BTreeMap::new(),
    };
    for from in &template.env_from {
        r.env_from(from)?;
    }
    for var in &template.env {
        let Some(from) = &var.value_from else {
            continue;
        };
        let found = match (&from.config_map_key_ref, &from.secret_key_ref) {
            (Some(k), _) => r.key(ObjectKind::ConfigMap, k)?.map(|v| (v, false)),
            (None, Some(k)) => r.key(ObjectKind::Secret, k)?.map(|v| (v, true)),
            (None, None) => None,
        };
        if let Some((value, secret)) = found {
            r.out.env.push((var.name.clone(), value, secret));
        }
    }
    for files in &template.files {
        r.files(files)?;
    }
    let bytes = r.out.bytes();
    if bytes > MAX_TASK_CONFIG_BYTES {
        let largest = r
            .sizes
            .iter()
            .max_by_key(|(_, n)| **n)
            .map(|(k, _)| k.clone())
            .unwrap_or((ObjectKind::ConfigMap, String::new()));
        return Err(Problem::TooLarge { bytes, largest });
    }
    Ok(r.out)
}

#[cfg(test)]
mod tests;
