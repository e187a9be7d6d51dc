//! Checks of a template's references to ConfigMaps and Secrets.

use std::collections::BTreeSet;

use super::{is_inside_task_dir, Report};
use crate::config_ref::{is_env_name, ConfigFiles, KeyToPath, OnConfigChange, ROBOT_PLACEHOLDER};
use crate::task::{StopSignal, TaskTemplate};
use crate::task_kind::TaskKind;

/// At most this many `envFrom` sources and `files` entries each.
pub const MAX_SOURCES: usize = 16;
/// At most this many items in one `files` entry.
const MAX_ITEMS: usize = 64;

pub(super) fn check(report: &mut Report, path: &str, t: &TaskTemplate) {
    for (i, var) in t.env.iter().enumerate() {
        let Some(from) = &var.value_from else {
            continue;
        };
        let at = format!("{path}.env[{i}].valueFrom");
        if !var.value.is_empty() {
            report.error(
                format!("{path}.env[{i}].value"),
                "must be empty when valueFrom is set",
            );
        }
        match (&from.config_map_key_ref, &from.secret_key_ref) {
            (Some(r), None) => key_ref(report, &format!("{at}.configMapKeyRef"), &r.name, &r.key),
            (None, Some(r)) => key_ref(report, &format!("{at}.secretKeyRef"), &r.name, &r.key),
            _ => report.error(at, "exactly one of configMapKeyRef and secretKeyRef"),
        }
    }
    if t.env_from.len() > MAX_SOURCES {
        report.error(
            format!("{path}.envFrom"),
            format!("at most {MAX_SOURCES} sources"),
        );
    }
    for (i, from) in t.env_from.iter().enumerate() {
        let at = format!("{path}.envFrom[{i}]");
        match (&from.config_map_ref, &from.secret_ref) {
            (Some(r), None) => object_name(report, &format!("{at}.configMapRef.name"), &r.name),
            (None, Some(r)) => object_name(report, &format!("{at}.secretRef.name"), &r.name),
            _ => report.error(at.clone(), "exactly one of configMapRef and secretRef"),
        }
        if let Some(prefix) = &from.prefix {
            if !prefix.is_empty() && !is_env_name(prefix) {
                report.error(
                    format!("{at}.prefix"),
                    format!("invalid variable name prefix {prefix:?}"),
                );
            }
        }
    }
    if t.files.len() > MAX_SOURCES {
        report.error(format!("{path}.files"), format!("at most {MAX_SOURCES} entries"));
    }
    let mut dirs = BTreeSet::new();
    for (i, files) in t.files.iter().enumerate() {
        let at = format!("{path}.files[{i}]");
        if !is_inside_task_dir(&files.path) {
            report.error(
                format!("{at}.path"),
                format!(
                    "must be a relative path inside the task directory (no '..'), got {:?}",
                    files.path
                ),
            );
        } else if !dirs.insert(files.path.trim_end_matches('/')) {
            report.error(
                format!("{at}.path"),
                format!("duplicate directory {:?}", files.path),
            );
        }
        file_source(report, &at, files);
    }
    on_change(report, path, t);
}

/// `onConfigChange` and `configChangeSignal`: for services that take
/// something from ConfigMaps or Secrets; the signal with `signal` only.
fn on_change(report: &mut Report, path: &str, t: &TaskTemplate) {
    if !t.on_config_change.is_none() {
        let at = format!("{path}.onConfigChange");
        if t.kind != TaskKind::Service {
            report.error(
                at,
                "only a service takes configuration changes (kind: service); a batch task keeps the values it started with",
            );
        } else if !crate::config_resolve::has_references(t) {
            report.error(
                at,
                "the task takes nothing from ConfigMaps or Secrets (env valueFrom, envFrom or files)",
            );
        }
    }
    if t.config_change_signal.is_some() && t.on_config_change != OnConfigChange::Signal {
        report.error(
            format!("{path}.configChangeSignal"),
            "only with onConfigChange: signal",
        );
    }
    // A signal that ends the process is a restart the group's maxParallel
    // would not bound, taken from the task's restart budget.
    if let Some(signal) = t
        .config_change_signal
        .filter(|s| !matches!(s, StopSignal::Hup | StopSignal::Usr1 | StopSignal::Usr2))
    {
        report.error(
            format!("{path}.configChangeSignal"),
            format!(
                "{} stops the process: use SIGHUP, SIGUSR1 or SIGUSR2 for software that reloads, or onConfigChange: restart",
                signal.name()
            ),
        );
    }
}

fn file_source(report: &mut Report, at: &str, files: &ConfigFiles) {
    let (field, name, items, mode) = match (&files.config_map, &files.secret) {
        (Some(c), None) => ("configMap", &c.name, &c.items, c.default_mode),
        (None, Some(s)) => ("secret", &s.secret_name, &s.items, s.default_mode),
        _ => return report.error(at, "exactly one of configMap and secret"),
    };
    let name_field = if field == "secret" { "secretName" } else { "name" };
    object_name(report, &format!("{at}.{field}.{name_field}"), name);
    file_mode(report, &format!("{at}.{field}.defaultMode"), mode);
    if items.len() > MAX_ITEMS {
        report.error(
            format!("{at}.{field}.items"),
            format!("at most {MAX_ITEMS} items"),
        );
    }
    let mut paths = BTreeSet::new();
    for (j, KeyToPath { key, path, mode }) in items.iter().enumerate() {
        let it = format!("{at}.{field}.items[{j}]");
        object_key(report, &format!("{it}.key"), key);
        if !is_inside_task_dir(path) || path.ends_with('/') {
            report.error(
                format!("{it}.path"),
                format!("must be a relative file path (no '..'), got {path:?}"),
            );
        } else if !paths.insert(path.as_str()) {
            report.error(format!("{it}.path"), format!("duplicate path {path:?}"));
        }
        file_mode(report, &format!("{it}.mode"), *mode);
    }
}

fn file_mode(report: &mut Report, at: &str, mode: Option<u32>) {
    if let Some(mode) = mode {
        if mode > 0o777 {
            report.error(
                at,
                format!("must be a file mode from 0 to 0777 (511), got {mode}"),
            );
        }
    }
}

fn key_ref(report: &mut Report, at: &str, name: &str, key: &str) {
    object_name(report, &format!("{at}.name"), name);
    object_key(report, &format!("{at}.key"), key);
}

/// A DNS subdomain, once the robot placeholder stands for a robot name.
fn object_name(report: &mut Report, at: &str, name: &str) {
    let sample = name.replace(ROBOT_PLACEHOLDER, "robot");
    let ok = !sample.is_empty()
        && sample.len() <= 253
        && sample.split('.').all(|part| {
            !part.is_empty()
                && part
                    .bytes()
                    .all(|b| b.is_ascii_lowercase() || b.is_ascii_digit() || b == b'-')
                && !part.starts_with('-')
                && !part.ends_with('-')
        });
    if !ok {
        report.error(
            at,
            format!("{name:?} must be a lower-case DNS name (letters, digits, '-', '.'), {ROBOT_PLACEHOLDER} allowed"),
        );
    }
}

/// What Kubernetes allows as a ConfigMap or Secret key, once the robot
/// placeholder stands for a robot name.
fn object_key(report: &mut Report, at: &str, key: &str) {
    let sample = key.replace(ROBOT_PLACEHOLDER, "robot");
    let ok = !sample.is_empty()
        && sample.len() <= 253
        && sample
            .bytes()
            .all(|b| b.is_ascii_alphanumeric() || matches!(b, b'-' | b'_' | b'.'))
        && sample != "."
        && sample != "..";
    if !ok {
        report.error(
            at,
            format!("{key:?} must be letters, digits, '-', '_' or '.', {ROBOT_PLACEHOLDER} allowed"),
        );
    }
}
