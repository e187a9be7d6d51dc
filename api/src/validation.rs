//! Spec validation shared by the manager (before scheduling) and the agent
//! (before running). Every problem is reported, each with its field path.

use std::collections::BTreeSet;
use std::fmt;
use std::time::Duration;

use crate::duration::DurationString;
use crate::job::JobSpec;
use crate::selector::{
    Constraint, ConstraintOperator, LabelSelector, SelectorOperator, CONSTRAINT_ATTRIBUTES,
};
use crate::task::{RestartPolicy, TaskResources, TaskSpec, TaskTemplate, DRIVERS};

/// The kill timeout when a task does not set one (Nomad's default).
pub const DEFAULT_KILL_TIMEOUT: Duration = Duration::from_secs(5);
/// The longest kill timeout a task may ask for. The agent's systemd unit
/// waits longer than this before it kills the agent itself.
pub const MAX_KILL_TIMEOUT: Duration = Duration::from_secs(300);
/// The first retry's delay when a restart policy does not set one.
pub const DEFAULT_RESTART_DELAY: Duration = Duration::from_secs(15);
/// The cap of the retry delay when a restart policy does not set one.
pub const DEFAULT_RESTART_MAX_DELAY: Duration = Duration::from_secs(300);

/// One problem with one field.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct FieldError {
    /// Where, e.g. `spec.taskGroups[1].task.timeout`.
    pub path: String,
    /// What is wrong.
    pub message: String,
}

impl fmt::Display for FieldError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}: {}", self.path, self.message)
    }
}

/// Every problem found in a spec.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
pub struct ValidationErrors(pub Vec<FieldError>);

impl fmt::Display for ValidationErrors {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        for (i, e) in self.0.iter().enumerate() {
            if i > 0 {
                f.write_str("; ")?;
            }
            write!(f, "{e}")?;
        }
        Ok(())
    }
}

/// Collects field errors while walking a spec.
#[derive(Default)]
struct Report(Vec<FieldError>);

impl Report {
    fn error(&mut self, path: impl Into<String>, message: impl Into<String>) {
        self.0.push(FieldError {
            path: path.into(),
            message: message.into(),
        });
    }

    fn finish(self) -> Result<(), ValidationErrors> {
        if self.0.is_empty() {
            Ok(())
        } else {
            Err(ValidationErrors(self.0))
        }
    }
}

/// Validates what a robot needs to run a task.
pub fn validate_task_template(template: &TaskTemplate) -> Result<(), ValidationErrors> {
    let mut report = Report::default();
    check_template(&mut report, "spec", template);
    report.finish()
}

/// Validates a whole Task spec.
pub fn validate_task_spec(spec: &TaskSpec) -> Result<(), ValidationErrors> {
    let mut report = Report::default();
    check_template(&mut report, "spec", &spec.template);
    if let Some(selector) = &spec.robot_selector {
        check_selector(&mut report, "spec.robotSelector", selector);
    }
    check_constraints(&mut report, "spec.constraints", &spec.constraints);
    if let Some(policy) = &spec.restart_policy {
        check_restart_policy(&mut report, "spec.restartPolicy", policy);
    }
    if let Some(robot) = &spec.target_robot {
        if let Err(e) = validate_robot_id(robot) {
            report.error("spec.targetRobot", e);
        }
    }
    report.finish()
}

/// Validates a Job spec, every group included.
pub fn validate_job_spec(spec: &JobSpec) -> Result<(), ValidationErrors> {
    let mut report = Report::default();
    if let Some(selector) = &spec.robot_selector {
        check_selector(&mut report, "spec.robotSelector", selector);
    }
    check_constraints(&mut report, "spec.constraints", &spec.constraints);
    if spec.task_groups.is_empty() {
        report.error("spec.taskGroups", "at least one group is required");
    }
    let mut names = BTreeSet::new();
    for (i, group) in spec.task_groups.iter().enumerate() {
        let path = format!("spec.taskGroups[{i}]");
        if let Err(e) = validate_dns_label(&group.name) {
            report.error(format!("{path}.name"), e);
        } else if !names.insert(group.name.as_str()) {
            report.error(
                format!("{path}.name"),
                format!("duplicate group name {:?}", group.name),
            );
        }
        if group.count < 0 {
            report.error(
                format!("{path}.count"),
                format!("must be >= 0, got {}", group.count),
            );
        }
        check_template(&mut report, &format!("{path}.task"), &group.task);
        if let Some(selector) = &group.robot_selector {
            check_selector(&mut report, &format!("{path}.robotSelector"), selector);
        }
        check_constraints(&mut report, &format!("{path}.constraints"), &group.constraints);
        if let Some(policy) = &group.restart_policy {
            check_restart_policy(&mut report, &format!("{path}.restartPolicy"), policy);
        }
    }
    report.finish()
}

/// Validates a label selector on its own.
pub fn validate_selector(selector: &LabelSelector) -> Result<(), ValidationErrors> {
    let mut report = Report::default();
    check_selector(&mut report, "selector", selector);
    report.finish()
}

/// The task's timeout, if it sets a valid one.
pub fn timeout_of(template: &TaskTemplate) -> Option<Duration> {
    template.timeout.as_ref().and_then(|t| t.parse().ok())
}

/// The task's kill timeout, defaulted and capped.
pub fn kill_timeout_of(template: &TaskTemplate) -> Duration {
    template
        .kill_timeout
        .as_ref()
        .and_then(|t| t.parse().ok())
        .unwrap_or(DEFAULT_KILL_TIMEOUT)
        .min(MAX_KILL_TIMEOUT)
}

fn check_template(report: &mut Report, path: &str, t: &TaskTemplate) {
    if !DRIVERS.contains(&t.driver.as_str()) {
        report.error(
            format!("{path}.driver"),
            format!(
                "unknown driver {:?}: expected one of {}",
                t.driver,
                DRIVERS.join(", ")
            ),
        );
    }
    if t.command.trim().is_empty() {
        report.error(format!("{path}.command"), "required");
    } else if t.command.contains('\0') {
        report.error(format!("{path}.command"), "must not contain NUL");
    }
    for (i, arg) in t.args.iter().enumerate() {
        if arg.contains('\0') {
            report.error(format!("{path}.args[{i}]"), "must not contain NUL");
        }
    }
    let mut env_names = BTreeSet::new();
    for (i, var) in t.env.iter().enumerate() {
        if var.name.is_empty() || var.name.contains(['=', '\0']) {
            report.error(
                format!("{path}.env[{i}].name"),
                format!("invalid variable name {:?}", var.name),
            );
        } else if !env_names.insert(var.name.as_str()) {
            report.error(
                format!("{path}.env[{i}].name"),
                format!("duplicate variable {:?}", var.name),
            );
        }
        if var.value.contains('\0') {
            report.error(format!("{path}.env[{i}].value"), "must not contain NUL");
        }
    }
    if let Some(dir) = &t.working_dir {
        if dir.is_empty() || dir.contains('\0') {
            report.error(format!("{path}.workingDir"), "must be a non-empty path");
        }
    }
    if let Some(user) = &t.user {
        if user.is_empty() || user.contains([':', '/', '\0']) || user.chars().any(char::is_whitespace) {
            report.error(format!("{path}.user"), format!("invalid user name {user:?}"));
        }
    }
    for (i, artifact) in t.artifacts.iter().enumerate() {
        let apath = format!("{path}.artifacts[{i}]");
        let url = artifact.url.to_ascii_lowercase();
        let host = url
            .strip_prefix("http://")
            .or_else(|| url.strip_prefix("https://"));
        match host {
            None => report.error(
                format!("{apath}.url"),
                format!("must be an http:// or https:// URL, got {:?}", artifact.url),
            ),
            Some(rest) if rest.is_empty() || rest.starts_with('/') => {
                report.error(format!("{apath}.url"), "has no host")
            }
            Some(_) => {}
        }
        if artifact.sha256.len() != 64 || !artifact.sha256.chars().all(|c| c.is_ascii_hexdigit()) {
            report.error(
                format!("{apath}.sha256"),
                format!("must be 64 hex digits, got {:?}", artifact.sha256),
            );
        }
        let dest = std::path::Path::new(&artifact.destination);
        if artifact.destination.is_empty()
            || dest.is_absolute()
            || dest
                .components()
                .any(|c| matches!(c, std::path::Component::ParentDir))
        {
            report.error(
                format!("{apath}.destination"),
                format!(
                    "must be a relative path inside the task directory, got {:?}",
                    artifact.destination
                ),
            );
        }
    }
    if let Some(timeout) = &t.timeout {
        match timeout.parse() {
            Ok(d) if d.is_zero() => report.error(format!("{path}.timeout"), "must be > 0"),
            Ok(_) => {}
            Err(e) => report.error(format!("{path}.timeout"), e.to_string()),
        }
    }
    if let Some(kill) = &t.kill_timeout {
        check_duration_within(report, &format!("{path}.killTimeout"), kill, MAX_KILL_TIMEOUT);
    }
    if let Some(resources) = &t.resources {
        check_resources(report, &format!("{path}.resources"), resources);
    }
}

fn check_duration_within(report: &mut Report, path: &str, value: &DurationString, cap: Duration) {
    match value.parse() {
        Ok(d) if d > cap => report.error(
            path,
            format!(
                "{} exceeds the cap of {}",
                value,
                crate::duration::format_duration(cap)
            ),
        ),
        Ok(_) => {}
        Err(e) => report.error(path, e.to_string()),
    }
}

fn check_resources(report: &mut Report, path: &str, r: &TaskResources) {
    if let Some(cpu) = &r.cpu {
        if let Err(e) = cpu.to_milli() {
            report.error(format!("{path}.cpu"), e.to_string());
        }
    }
    if let Some(memory) = &r.memory {
        match memory.to_units() {
            Ok(0) => report.error(format!("{path}.memory"), "must be > 0"),
            Ok(_) => {}
            Err(e) => report.error(format!("{path}.memory"), e.to_string()),
        }
    }
}

fn check_restart_policy(report: &mut Report, path: &str, p: &RestartPolicy) {
    if let Some(delay) = &p.delay {
        if let Err(e) = delay.parse() {
            report.error(format!("{path}.delay"), e.to_string());
        }
    }
    if let Some(max) = &p.max_delay {
        if let Err(e) = max.parse() {
            report.error(format!("{path}.maxDelay"), e.to_string());
        }
    }
}

fn check_selector(report: &mut Report, path: &str, s: &LabelSelector) {
    for (key, value) in &s.match_labels {
        if let Err(e) = validate_label_key(key) {
            report.error(format!("{path}.matchLabels[{key}]"), e);
        }
        if let Err(e) = validate_label_value(value) {
            report.error(format!("{path}.matchLabels[{key}]"), e);
        }
    }
    for (i, r) in s.match_expressions.iter().enumerate() {
        let rpath = format!("{path}.matchExpressions[{i}]");
        if let Err(e) = validate_label_key(&r.key) {
            report.error(format!("{rpath}.key"), e);
        }
        match r.operator {
            SelectorOperator::In | SelectorOperator::NotIn if r.values.is_empty() => {
                report.error(format!("{rpath}.values"), "must be non-empty for In and NotIn")
            }
            SelectorOperator::Exists | SelectorOperator::DoesNotExist if !r.values.is_empty() => report
                .error(
                    format!("{rpath}.values"),
                    "must be empty for Exists and DoesNotExist",
                ),
            _ => {}
        }
        for (j, v) in r.values.iter().enumerate() {
            if let Err(e) = validate_label_value(v) {
                report.error(format!("{rpath}.values[{j}]"), e);
            }
        }
    }
}

fn check_constraints(report: &mut Report, path: &str, constraints: &[Constraint]) {
    for (i, c) in constraints.iter().enumerate() {
        let cpath = format!("{path}[{i}]");
        let known = CONSTRAINT_ATTRIBUTES.contains(&c.attribute.as_str())
            || c.attribute
                .strip_prefix("label.")
                .is_some_and(|k| validate_label_key(k).is_ok());
        if !known {
            report.error(
                format!("{cpath}.attribute"),
                format!(
                    "unknown attribute {:?}: expected label.<key> or one of {}",
                    c.attribute,
                    CONSTRAINT_ATTRIBUTES.join(", ")
                ),
            );
        }
        let needs_value = !matches!(
            c.operator,
            ConstraintOperator::Exists | ConstraintOperator::NotExists
        );
        if needs_value && c.value.is_empty() {
            report.error(format!("{cpath}.value"), "required for this operator");
        }
    }
}

/// Checks a DNS-1123 label (group names): lower-case alphanumerics and '-',
/// at most 63 characters, starting and ending alphanumeric.
pub fn validate_dns_label(name: &str) -> Result<(), String> {
    if name.is_empty() || name.len() > 63 {
        return Err(format!("{name:?} must be 1-63 characters"));
    }
    let ok_chars = name
        .chars()
        .all(|c| c.is_ascii_lowercase() || c.is_ascii_digit() || c == '-');
    let ok_ends = !name.starts_with('-') && !name.ends_with('-');
    if ok_chars && ok_ends {
        Ok(())
    } else {
        Err(format!(
            "{name:?} must consist of lower-case letters, digits and '-', and start and end with a letter or digit"
        ))
    }
}

/// Checks a robot id: it becomes the Robot's name and an MQTT topic level,
/// so it must be a DNS-1123 subdomain (lower-case alphanumerics, '-', '.').
pub fn validate_robot_id(id: &str) -> Result<(), String> {
    if id.is_empty() || id.len() > 253 {
        return Err(format!("robot id {id:?} must be 1-253 characters"));
    }
    for part in id.split('.') {
        validate_dns_label(part).map_err(|_| {
            format!(
                "robot id {id:?} must be lower-case letters, digits, '-' and '.', each part starting and ending with a letter or digit"
            )
        })?;
    }
    Ok(())
}

/// Checks a label key: an optional DNS-subdomain prefix and '/', then a name
/// of at most 63 alphanumerics, '-', '_' or '.'.
pub fn validate_label_key(key: &str) -> Result<(), String> {
    let (prefix, name) = match key.rsplit_once('/') {
        Some((p, n)) => (Some(p), n),
        None => (None, key),
    };
    if let Some(prefix) = prefix {
        if prefix.is_empty()
            || prefix.len() > 253
            || prefix.split('.').any(|p| validate_dns_label(p).is_err())
        {
            return Err(format!("label key {key:?} has an invalid prefix"));
        }
    }
    if name.is_empty() {
        return Err(format!("label key {key:?} has an empty name"));
    }
    validate_label_value(name).map_err(|_| format!("label key {key:?} has an invalid name"))
}

/// Checks a label value: empty, or at most 63 alphanumerics, '-', '_' or
/// '.', starting and ending alphanumeric.
pub fn validate_label_value(value: &str) -> Result<(), String> {
    if value.is_empty() {
        return Ok(());
    }
    let ok = value.len() <= 63
        && value
            .chars()
            .all(|c| c.is_ascii_alphanumeric() || matches!(c, '-' | '_' | '.'))
        && value.starts_with(|c: char| c.is_ascii_alphanumeric())
        && value.ends_with(|c: char| c.is_ascii_alphanumeric());
    if ok {
        Ok(())
    } else {
        Err(format!(
            "label value {value:?} is invalid (at most 63 of [A-Za-z0-9-_.], alphanumeric at both ends)"
        ))
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::job::TaskGroupTemplate;
    use crate::selector::LabelSelectorRequirement;
    use crate::task::{Artifact, EnvVar};

    fn template() -> TaskTemplate {
        TaskTemplate {
            driver: "raw_exec".into(),
            command: "/bin/true".into(),
            ..Default::default()
        }
    }

    fn paths(err: ValidationErrors) -> Vec<String> {
        err.0.into_iter().map(|e| e.path).collect()
    }

    #[test]
    fn a_minimal_task_is_valid() {
        validate_task_template(&template()).unwrap();
    }

    #[test]
    fn reports_every_problem_with_its_path() {
        let t = TaskTemplate {
            driver: "docker".into(),
            command: " ".into(),
            timeout: Some("0s".into()),
            kill_timeout: Some("10m".into()),
            env: vec![EnvVar {
                name: "A=B".into(),
                value: String::new(),
            }],
            artifacts: vec![Artifact {
                url: "ftp://x/y".into(),
                destination: "../etc/passwd".into(),
                sha256: "abc".into(),
            }],
            ..template()
        };
        let err = validate_task_template(&t).unwrap_err();
        let msg = err.to_string();
        assert!(msg.contains("unknown driver \"docker\""), "{msg}");
        assert!(msg.contains("exceeds the cap"), "{msg}");
        assert_eq!(
            paths(err),
            vec![
                "spec.driver",
                "spec.command",
                "spec.env[0].name",
                "spec.artifacts[0].url",
                "spec.artifacts[0].sha256",
                "spec.artifacts[0].destination",
                "spec.timeout",
                "spec.killTimeout",
            ]
        );
    }

    #[test]
    fn bad_durations_and_quantities_are_field_errors() {
        let t = TaskTemplate {
            timeout: Some("soon".into()),
            resources: Some(TaskResources {
                cpu: Some("lots".into()),
                memory: Some("0".into()),
            }),
            ..template()
        };
        assert_eq!(
            paths(validate_task_template(&t).unwrap_err()),
            vec!["spec.timeout", "spec.resources.cpu", "spec.resources.memory"]
        );
    }

    #[test]
    fn job_groups_are_checked_with_indexed_paths() {
        let job = JobSpec {
            robot_selector: Some(LabelSelector {
                match_expressions: vec![LabelSelectorRequirement {
                    key: "zone".into(),
                    operator: SelectorOperator::In,
                    values: vec![],
                }],
                ..Default::default()
            }),
            task_groups: vec![
                TaskGroupTemplate {
                    name: "a".into(),
                    count: 1,
                    task: template(),
                    ..Default::default()
                },
                TaskGroupTemplate {
                    name: "a".into(),
                    count: -1,
                    task: template(),
                    ..Default::default()
                },
                TaskGroupTemplate {
                    name: "Bad_Name".into(),
                    count: 1,
                    task: TaskTemplate {
                        command: String::new(),
                        ..template()
                    },
                    constraints: vec![Constraint {
                        attribute: "colour".into(),
                        operator: ConstraintOperator::Equal,
                        value: String::new(),
                    }],
                    ..Default::default()
                },
            ],
            ..Default::default()
        };
        assert_eq!(
            paths(validate_job_spec(&job).unwrap_err()),
            vec![
                "spec.robotSelector.matchExpressions[0].values",
                "spec.taskGroups[1].name",
                "spec.taskGroups[1].count",
                "spec.taskGroups[2].name",
                "spec.taskGroups[2].task.command",
                "spec.taskGroups[2].constraints[0].attribute",
                "spec.taskGroups[2].constraints[0].value",
            ]
        );
    }

    #[test]
    fn robot_ids_and_label_keys() {
        assert!(validate_robot_id("robot-01.lab").is_ok());
        for bad in ["", "Robot", "a/b", "+", "#", "a..b", "-a"] {
            assert!(validate_robot_id(bad).is_err(), "{bad}");
        }
        assert!(validate_label_key("robot.k8s4r.io/site").is_ok());
        assert!(validate_label_key("site").is_ok());
        assert!(validate_label_key("/site").is_err());
        assert!(validate_label_value("a b").is_err());
    }

    #[test]
    fn kill_timeout_defaults_and_caps() {
        assert_eq!(kill_timeout_of(&template()), DEFAULT_KILL_TIMEOUT);
        let t = TaskTemplate {
            kill_timeout: Some("2s".into()),
            ..template()
        };
        assert_eq!(kill_timeout_of(&t), Duration::from_secs(2));
    }
}
