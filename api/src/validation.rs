//! Spec validation shared by the manager (before scheduling) and the agent
//! (before running). Every problem is reported, each with its field path.

use std::collections::BTreeSet;
use std::fmt;
use std::time::Duration;

use crate::duration::DurationString;
use crate::job::{GroupMode, JobSpec};
use crate::periodic::PeriodicJobSpec;
use crate::selector::{
    AntiAffinity, Constraint, ConstraintOperator, LabelSelector, SelectorOperator, WeightedAffinity,
    CONSTRAINT_ATTRIBUTES,
};
use crate::task::{
    HealthCheck, LocalRestart, LocalRestartMode, RestartPolicy, TaskResources, TaskSpec, TaskTemplate,
    DRIVERS, DRIVER_PODMAN,
};
use crate::task_kind::TaskKind;

/// The kill timeout when a task does not set one (Nomad's default).
pub const DEFAULT_KILL_TIMEOUT: Duration = Duration::from_secs(5);
/// The longest kill timeout a task may ask for. The agent's systemd unit
/// waits longer than this before it kills the agent itself.
pub const MAX_KILL_TIMEOUT: Duration = Duration::from_secs(300);
/// The longest `timeout` a task may ask for. Beyond it a robot's timer
/// would be a promise nobody keeps; a task that must run longer runs
/// without a timeout.
pub const MAX_TIMEOUT: Duration = Duration::from_secs(30 * 24 * 3600);
/// The longest restart `delay` and `maxDelay`.
pub const MAX_RESTART_DELAY: Duration = Duration::from_secs(24 * 3600);
/// Most artifacts one task may download.
pub const MAX_ARTIFACTS: usize = 64;
/// Most groups one Job may have (an ordered Job's checks walk them).
pub const MAX_TASK_GROUPS: usize = 64;
/// The longest `startingDeadline` of a PeriodicJob.
pub const MAX_STARTING_DEADLINE: Duration = Duration::from_secs(30 * 24 * 3600);
/// The longest PeriodicJob name: its runs are named `<name>-<10 digits>`
/// and carry it in a label (Kubernetes holds CronJobs to 52 as well).
pub const MAX_PERIODIC_JOB_NAME: usize = 52;
/// Most supplementary groups one task may ask for.
pub const MAX_GROUPS: usize = 32;
/// The first retry's delay when a restart policy does not set one.
pub const DEFAULT_RESTART_DELAY: Duration = Duration::from_secs(15);
/// The cap of the retry delay when a restart policy does not set one.
pub const DEFAULT_RESTART_MAX_DELAY: Duration = Duration::from_secs(300);
/// The window of a robot's restarts when `restart.interval` is not set.
pub const DEFAULT_RESTART_INTERVAL: Duration = Duration::from_secs(30 * 60);
/// The longest `restart.interval`.
pub const MAX_RESTART_INTERVAL: Duration = Duration::from_secs(30 * 24 * 3600);
/// Most restarts one interval may allow.
pub const MAX_RESTART_ATTEMPTS: u32 = 10_000;

/// Most health checks one task may have.
pub const MAX_CHECKS: usize = 8;
/// The shortest and longest health check interval.
pub const MIN_CHECK_INTERVAL: Duration = Duration::from_millis(100);
pub const MAX_CHECK_INTERVAL: Duration = Duration::from_secs(3600);
/// Most failures in a row a health check may wait for.
pub const MAX_FAILURE_THRESHOLD: u32 = 100;

/// A health check's timing, defaulted and capped: what the agent applies.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct CheckTiming {
    /// Time between checks.
    pub interval: Duration,
    /// Time one check may take.
    pub timeout: Duration,
    /// Failures in a row that make the task unhealthy.
    pub failure_threshold: u32,
    /// Wait after a start before the first check.
    pub initial_delay: Duration,
}

/// The timing of `check`: its own, defaulted (10s, 2s, 3, the interval)
/// and capped.
pub fn check_timing(check: &HealthCheck) -> CheckTiming {
    let parse = |d: &Option<crate::duration::DurationString>| d.as_ref().and_then(|d| d.parse().ok());
    let interval = parse(&check.interval)
        .unwrap_or(Duration::from_secs(10))
        .clamp(MIN_CHECK_INTERVAL, MAX_CHECK_INTERVAL);
    CheckTiming {
        interval,
        timeout: parse(&check.timeout)
            .unwrap_or(Duration::from_secs(2))
            .clamp(Duration::from_millis(1), interval),
        failure_threshold: check
            .failure_threshold
            .unwrap_or(3)
            .clamp(1, MAX_FAILURE_THRESHOLD),
        initial_delay: parse(&check.initial_delay)
            .unwrap_or(interval)
            .min(MAX_CHECK_INTERVAL),
    }
}

/// A task's restarts on the robot, defaulted and capped: what the agent
/// applies.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Restarts {
    /// Restarts allowed within `interval`.
    pub attempts: u32,
    /// The window they count in.
    pub interval: Duration,
    /// The first restart's wait.
    pub delay: Duration,
    /// The cap of the wait.
    pub max_delay: Duration,
    /// When they are used up.
    pub mode: LocalRestartMode,
}

/// The restarts on the robot a task gets: its `restart`, a service's
/// default, or none (a batch task that sets none).
pub fn restarts_of(template: &TaskTemplate) -> Option<Restarts> {
    let restart = match (&template.restart, template.kind) {
        (Some(r), _) => r.clone(),
        (None, TaskKind::Service) => LocalRestart::service_default(),
        (None, TaskKind::Batch) => return None,
    };
    let parse = |d: &Option<crate::duration::DurationString>, default: Duration, max: Duration| {
        d.as_ref()
            .and_then(|d| d.parse().ok())
            .unwrap_or(default)
            .min(max)
    };
    Some(Restarts {
        attempts: restart.attempts.min(MAX_RESTART_ATTEMPTS),
        interval: parse(&restart.interval, DEFAULT_RESTART_INTERVAL, MAX_RESTART_INTERVAL),
        delay: parse(&restart.delay, DEFAULT_RESTART_DELAY, MAX_RESTART_DELAY),
        max_delay: parse(&restart.max_delay, DEFAULT_RESTART_MAX_DELAY, MAX_RESTART_DELAY),
        mode: restart.mode,
    })
}

mod config_refs;
mod container;
mod outputs;

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
    if let Some(policy) = &spec.disconnect {
        for (field, problem) in policy.problems("spec.disconnect") {
            report.error(field, problem);
        }
    }
    if let Some(robot) = &spec.target_robot {
        if let Err(e) = validate_robot_id(robot) {
            report.error("spec.targetRobot", e);
        }
    }
    if let Some(robot) = &spec.robot_name {
        if let Err(e) = validate_robot_id(robot) {
            report.error("spec.robotName", e);
        }
    }
    check_affinity(&mut report, "spec", spec.anti_affinity.as_ref(), &spec.affinity);
    report.finish()
}

fn check_affinity(
    report: &mut Report,
    path: &str,
    anti: Option<&AntiAffinity>,
    affinity: &[WeightedAffinity],
) {
    if let Some(key) = anti.and_then(|a| a.topology_key.as_deref()) {
        if let Err(e) = validate_label_key(key) {
            report.error(format!("{path}.antiAffinity.topologyKey"), e);
        }
    }
    for (i, rule) in affinity.iter().enumerate() {
        let at = format!("{path}.affinity[{i}]");
        if !(1..=100).contains(&rule.weight) {
            report.error(
                format!("{at}.weight"),
                format!("must be between 1 and 100, got {}", rule.weight),
            );
        }
        check_selector(report, &format!("{at}.selector"), &rule.selector);
    }
}

/// Checks a Job's ordering: `after` and `order` name groups of the Job, and
/// the groups do not wait for each other in a circle.
fn check_ordering(report: &mut Report, spec: &JobSpec) {
    let names: BTreeSet<&str> = spec.task_groups.iter().map(|g| g.name.as_str()).collect();
    let mut listed = BTreeSet::new();
    let mut known = true;
    if spec.order.len() > MAX_TASK_GROUPS {
        report.error(
            "spec.order",
            format!("at most {MAX_TASK_GROUPS} groups, got {}", spec.order.len()),
        );
        return;
    }
    for (i, name) in spec.order.iter().enumerate() {
        if !names.contains(name.as_str()) {
            report.error(format!("spec.order[{i}]"), format!("no group is named {name:?}"));
            known = false;
        } else if !listed.insert(name.as_str()) {
            report.error(format!("spec.order[{i}]"), format!("{name:?} is listed twice"));
            known = false;
        }
    }
    for (i, group) in spec.task_groups.iter().enumerate() {
        if group.after.len() > MAX_TASK_GROUPS {
            report.error(
                format!("spec.taskGroups[{i}].after"),
                format!("at most {MAX_TASK_GROUPS} groups, got {}", group.after.len()),
            );
            known = false;
            continue;
        }
        for (j, dep) in group.after.iter().enumerate() {
            let at = format!("spec.taskGroups[{i}].after[{j}]");
            if *dep == group.name {
                report.error(at, format!("group {dep:?} cannot run after itself"));
                known = false;
            } else if !names.contains(dep.as_str()) {
                report.error(at, format!("no group is named {dep:?}"));
                known = false;
            }
        }
    }
    if !known {
        return;
    }
    if let Some(cycle) = find_cycle(spec) {
        report.error(
            "spec.taskGroups",
            format!(
                "the groups wait for each other in a circle: {}",
                cycle.join(" -> ")
            ),
        );
    }
}

/// A circle of groups each waiting for the next, if there is one (as the
/// list of names, the first repeated at the end).
pub fn find_cycle(spec: &JobSpec) -> Option<Vec<String>> {
    #[derive(Clone, Copy, PartialEq)]
    enum Mark {
        New,
        Open,
        Done,
    }
    fn visit(spec: &JobSpec, at: usize, marks: &mut [Mark], path: &mut Vec<usize>) -> Option<Vec<String>> {
        marks[at] = Mark::Open;
        path.push(at);
        for dep in spec.dependencies_of(&spec.task_groups[at]) {
            let Some(next) = spec.task_groups.iter().position(|g| g.name == dep) else {
                continue;
            };
            match marks[next] {
                Mark::Open => {
                    let from = path.iter().position(|&p| p == next).unwrap_or(0);
                    let mut cycle: Vec<String> = path[from..]
                        .iter()
                        .map(|&p| spec.task_groups[p].name.clone())
                        .collect();
                    cycle.push(spec.task_groups[next].name.clone());
                    return Some(cycle);
                }
                Mark::New => {
                    if let Some(cycle) = visit(spec, next, marks, path) {
                        return Some(cycle);
                    }
                }
                Mark::Done => {}
            }
        }
        path.pop();
        marks[at] = Mark::Done;
        None
    }
    let mut marks = vec![Mark::New; spec.task_groups.len()];
    for start in 0..spec.task_groups.len() {
        if marks[start] == Mark::New {
            if let Some(cycle) = visit(spec, start, &mut marks, &mut Vec::new()) {
                return Some(cycle);
            }
        }
    }
    None
}

/// Checks a PeriodicJob's name: its runs' names and labels are made of it.
pub fn validate_periodic_job_name(name: &str) -> Result<(), String> {
    if name.len() > MAX_PERIODIC_JOB_NAME {
        return Err(format!(
            "at most {MAX_PERIODIC_JOB_NAME} characters (its runs are named <name>-<10 digits>), got {}",
            name.len()
        ));
    }
    Ok(())
}

/// Validates a PeriodicJob's spec, except its schedule and time zone (the
/// manager parses those).
pub fn validate_periodic_job_spec(spec: &PeriodicJobSpec) -> Result<(), ValidationErrors> {
    let mut report = Report::default();
    if spec.schedule.trim().is_empty() {
        report.error("spec.schedule", "a cron schedule is required");
    }
    if let Some(deadline) = &spec.starting_deadline {
        match crate::duration::parse_spec_duration(deadline) {
            Err(e) => report.error("spec.startingDeadline", e.to_string()),
            Ok(d) if d > MAX_STARTING_DEADLINE => report.error(
                "spec.startingDeadline",
                format!(
                    "at most {}s, got {}s",
                    MAX_STARTING_DEADLINE.as_secs(),
                    d.as_secs()
                ),
            ),
            Ok(_) => {}
        }
    }
    for (field, limit) in [
        (
            "spec.successfulJobsHistoryLimit",
            spec.successful_jobs_history_limit,
        ),
        ("spec.failedJobsHistoryLimit", spec.failed_jobs_history_limit),
    ] {
        if limit.is_some_and(|l| l < 0) {
            report.error(field, "must be >= 0");
        }
    }
    if let Err(errors) = validate_job_spec(&spec.job_template.spec) {
        for e in errors.0 {
            let path = e.path.strip_prefix("spec.").unwrap_or(&e.path);
            report.error(format!("spec.jobTemplate.spec.{path}"), e.message);
        }
    }
    report.finish()
}

/// The longest `activeDeadlineSeconds` or `pendingDeadlineSeconds` (a
/// year): a longer one is a mistake, and a year's seconds fit any timer.
pub const MAX_DEADLINE_SECONDS: i64 = 365 * 24 * 3600;

/// Validates a Job spec, every group included.
pub fn validate_job_spec(spec: &JobSpec) -> Result<(), ValidationErrors> {
    let mut report = Report::default();
    if let Some(selector) = &spec.robot_selector {
        check_selector(&mut report, "spec.robotSelector", selector);
    }
    check_constraints(&mut report, "spec.constraints", &spec.constraints);
    if let Some(ttl) = spec.ttl_seconds_after_finished.filter(|t| *t < 0) {
        report.error("spec.ttlSecondsAfterFinished", format!("must be >= 0, got {ttl}"));
    }
    for (field, value) in [
        ("spec.activeDeadlineSeconds", spec.active_deadline_seconds),
        ("spec.pendingDeadlineSeconds", spec.pending_deadline_seconds),
    ] {
        if let Some(v) = value.filter(|v| !(1..=MAX_DEADLINE_SECONDS).contains(v)) {
            report.error(
                field,
                format!("must be between 1 and {MAX_DEADLINE_SECONDS}, got {v}"),
            );
        }
    }
    if spec.task_groups.is_empty() {
        report.error("spec.taskGroups", "at least one group is required");
    }
    if spec.task_groups.len() > MAX_TASK_GROUPS {
        report.error(
            "spec.taskGroups",
            format!("at most {MAX_TASK_GROUPS} groups, got {}", spec.task_groups.len()),
        );
        // Too many to walk for order: the count is the problem.
        return report.finish();
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
        if let Some(count) = group.count.filter(|c| *c < 0) {
            report.error(format!("{path}.count"), format!("must be >= 0, got {count}"));
        }
        match group.mode {
            GroupMode::Count => {
                if group.count.is_none() {
                    report.error(format!("{path}.count"), "required (or mode: everyRobot)");
                }
                // A group of services rolls a configuration change out
                // maxParallel at a time, whatever its mode.
                let rolls = group.task.kind == crate::task_kind::TaskKind::Service;
                for (field, set, why) in [
                    (
                        "maxParallel",
                        group.max_parallel.is_some() && !rolls,
                        "only applies to mode everyRobot, or to a group of services (their restarts for a configuration change)",
                    ),
                    ("maxFailed", group.max_failed.is_some(), "only applies to mode everyRobot"),
                ] {
                    if set {
                        report.error(format!("{path}.{field}"), why);
                    }
                }
                if let Some(n) = group.max_parallel.filter(|n| *n < 1 && rolls) {
                    report.error(format!("{path}.maxParallel"), format!("must be >= 1, got {n}"));
                }
            }
            GroupMode::EveryRobot => {
                if group.count.is_some_and(|c| c != 0) {
                    report.error(
                        format!("{path}.count"),
                        "mode everyRobot runs one task per matching robot: leave count out",
                    );
                }
                if let Some(n) = group.max_parallel.filter(|n| *n < 1) {
                    report.error(format!("{path}.maxParallel"), format!("must be >= 1, got {n}"));
                }
                if let Some(max) = &group.max_failed {
                    if max.of(100).is_none() {
                        report.error(
                            format!("{path}.maxFailed"),
                            format!("must be a count >= 0 or a percentage from 0% to 100%, got {max:?}"),
                        );
                    }
                }
            }
        }
        check_affinity(&mut report, &path, group.anti_affinity.as_ref(), &group.affinity);
        check_template(&mut report, &format!("{path}.task"), &group.task);
        if let Some(selector) = &group.robot_selector {
            check_selector(&mut report, &format!("{path}.robotSelector"), selector);
        }
        check_constraints(&mut report, &format!("{path}.constraints"), &group.constraints);
        if let Some(policy) = &group.restart_policy {
            check_restart_policy(&mut report, &format!("{path}.restartPolicy"), policy);
        }
        if let Some(policy) = &group.disconnect {
            for (field, problem) in policy.problems(&format!("{path}.disconnect")) {
                report.error(field, problem);
            }
        }
    }
    check_ordering(&mut report, spec);
    report.finish()
}

/// Validates a label selector on its own.
pub fn validate_selector(selector: &LabelSelector) -> Result<(), ValidationErrors> {
    let mut report = Report::default();
    check_selector(&mut report, "selector", selector);
    report.finish()
}

/// The task's timeout, if it sets a valid one, capped at [`MAX_TIMEOUT`]
/// (validation refuses a larger one; the cap keeps every caller's arithmetic
/// finite even for a spec that skipped validation).
pub fn timeout_of(template: &TaskTemplate) -> Option<Duration> {
    template
        .timeout
        .as_ref()
        .and_then(|t| t.parse().ok())
        .map(|t| t.min(MAX_TIMEOUT))
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

/// How long the task's `preStop` may take: its `timeout`, or half the
/// kill timeout, never more than the kill timeout. None without one.
pub fn pre_stop_timeout_of(template: &TaskTemplate) -> Option<Duration> {
    let pre_stop = template.pre_stop.as_ref()?;
    let kill = kill_timeout_of(template);
    Some(
        pre_stop
            .timeout
            .as_ref()
            .and_then(|t| t.parse().ok())
            .unwrap_or(kill / 2)
            .min(kill),
    )
}

/// The signal the task is asked to stop with.
pub fn stop_signal_of(template: &TaskTemplate) -> crate::task::StopSignal {
    template.stop_signal.unwrap_or_default()
}

fn check_stopping(report: &mut Report, path: &str, t: &TaskTemplate) {
    if let Some(pre_stop) = &t.pre_stop {
        let ppath = format!("{path}.preStop");
        if pre_stop.command.trim().is_empty() {
            report.error(format!("{ppath}.command"), "must not be empty");
        }
        if pre_stop.command.contains('\0') || pre_stop.args.iter().any(|a| a.contains('\0')) {
            report.error(ppath.clone(), "must not contain NUL");
        }
        if let Some(timeout) = &pre_stop.timeout {
            let kill = kill_timeout_of(t);
            match timeout.parse_strict() {
                Ok(d) if d.is_zero() => report.error(format!("{ppath}.timeout"), "must be > 0"),
                Ok(d) if d > kill => report.error(
                    format!("{ppath}.timeout"),
                    format!(
                        "{timeout} exceeds the task's killTimeout of {} (the preStop's time counts in it)",
                        crate::duration::format_duration(kill)
                    ),
                ),
                Ok(_) => {}
                Err(e) => report.error(format!("{ppath}.timeout"), e.to_string()),
            }
        }
    }
    if t.when.len() > crate::facts::MAX_START_CONDITIONS {
        report.error(
            format!("{path}.when"),
            format!("at most {} start conditions", crate::facts::MAX_START_CONDITIONS),
        );
    }
    for (i, condition) in t.when.iter().enumerate() {
        if let Some(problem) = condition.problem() {
            report.error(format!("{path}.when[{i}]"), problem);
        }
    }
}

fn check_template(report: &mut Report, path: &str, t: &TaskTemplate) {
    if let Some(restart) = &t.restart {
        check_local_restart(report, &format!("{path}.restart"), restart);
    }
    check_stopping(report, path, t);
    if t.checks.len() > MAX_CHECKS {
        report.error(
            format!("{path}.checks"),
            format!("at most {MAX_CHECKS} health checks"),
        );
    }
    for (i, check) in t.checks.iter().enumerate() {
        check_health_check(report, &format!("{path}.checks[{i}]"), check);
    }
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
    container::check(report, path, t);
    if t.driver == DRIVER_PODMAN {
        // An empty command runs the image's own entrypoint.
    } else if t.command.trim().is_empty() {
        report.error(format!("{path}.command"), "required");
    } else if t.command.contains('\0') {
        report.error(format!("{path}.command"), "must not contain NUL");
    }
    for (i, arg) in t.args.iter().enumerate() {
        if arg.contains('\0') {
            report.error(format!("{path}.args[{i}]"), "must not contain NUL");
        }
    }
    config_refs::check(report, path, t);
    outputs::check(report, path, t);
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
        if !is_inside_task_dir(dir) {
            report.error(
                format!("{path}.workingDir"),
                format!("must be a relative path inside the task directory (no '..'), got {dir:?}"),
            );
        }
    }
    if let Some(user) = &t.user {
        if let Err(e) = validate_account_name(user) {
            report.error(format!("{path}.user"), format!("invalid user name: {e}"));
        }
    }
    if t.groups.len() > MAX_GROUPS {
        report.error(
            format!("{path}.groups"),
            format!("at most {MAX_GROUPS} groups, got {}", t.groups.len()),
        );
    }
    let mut groups = BTreeSet::new();
    for (i, group) in t.groups.iter().enumerate() {
        if let Err(e) = validate_account_name(group) {
            report.error(format!("{path}.groups[{i}]"), format!("invalid group name: {e}"));
        } else if !groups.insert(group.as_str()) {
            report.error(
                format!("{path}.groups[{i}]"),
                format!("duplicate group {group:?}"),
            );
        }
    }
    if t.artifacts.len() > MAX_ARTIFACTS {
        report.error(
            format!("{path}.artifacts"),
            format!("at most {MAX_ARTIFACTS} artifacts, got {}", t.artifacts.len()),
        );
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
        let names_a_file = std::path::Path::new(&artifact.destination).file_name().is_some()
            && !artifact.destination.ends_with('/');
        if !is_inside_task_dir(&artifact.destination) || !names_a_file {
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
        match timeout.parse_strict() {
            Ok(d) if d.is_zero() => report.error(format!("{path}.timeout"), "must be > 0"),
            Ok(_) => check_duration_within(report, &format!("{path}.timeout"), timeout, MAX_TIMEOUT),
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
    match value.parse_strict() {
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

/// Whether `path` names something inside a task's directory: relative, not
/// empty, with no `..` (and no NUL). Symbolic links inside the directory
/// are the task's own business: the agent never follows them as root.
pub fn is_inside_task_dir(path: &str) -> bool {
    use std::path::{Component, Path};
    !path.is_empty()
        && !path.contains('\0')
        && Path::new(path)
            .components()
            .all(|c| matches!(c, Component::Normal(_) | Component::CurDir))
}

/// Checks a user or group name as a spec may give it: what useradd accepts
/// (letters, digits, `_`, `-`, `.`, not starting with `-`, at most 32).
pub fn validate_account_name(name: &str) -> Result<(), String> {
    let ok = !name.is_empty()
        && name.len() <= 32
        && !name.starts_with('-')
        && name
            .chars()
            .all(|c| c.is_ascii_alphanumeric() || matches!(c, '_' | '-' | '.'))
        && name != "."
        && name != "..";
    if ok {
        Ok(())
    } else {
        Err(format!(
            "{name:?} must be 1-32 letters, digits, '_', '-' or '.', not starting with '-'"
        ))
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
    if let Some(disk) = &r.disk {
        match disk.to_units() {
            Ok(0) => report.error(format!("{path}.disk"), "must be > 0"),
            Ok(_) => {}
            Err(e) => report.error(format!("{path}.disk"), e.to_string()),
        }
    }
}

fn check_local_restart(report: &mut Report, path: &str, r: &LocalRestart) {
    if r.attempts > MAX_RESTART_ATTEMPTS {
        report.error(
            format!("{path}.attempts"),
            format!("must be at most {MAX_RESTART_ATTEMPTS}"),
        );
    }
    if let Some(interval) = &r.interval {
        if interval.parse().is_ok_and(|d: Duration| d.is_zero()) {
            report.error(format!("{path}.interval"), "must be > 0");
        }
        check_duration_within(
            report,
            &format!("{path}.interval"),
            interval,
            MAX_RESTART_INTERVAL,
        );
    }
    if let Some(delay) = &r.delay {
        check_duration_within(report, &format!("{path}.delay"), delay, MAX_RESTART_DELAY);
    }
    if let Some(max) = &r.max_delay {
        check_duration_within(report, &format!("{path}.maxDelay"), max, MAX_RESTART_DELAY);
    }
}

fn check_health_check(report: &mut Report, path: &str, c: &HealthCheck) {
    let kinds = usize::from(c.exec.is_some()) + usize::from(c.tcp.is_some()) + usize::from(c.http.is_some());
    if kinds != 1 {
        report.error(path, "needs exactly one of exec, tcp and http");
    }
    if c.name
        .as_ref()
        .is_some_and(|n| n.is_empty() || n.len() > 63 || n.chars().any(char::is_control))
    {
        report.error(format!("{path}.name"), "must be 1 to 63 printable characters");
    }
    if let Some(exec) = &c.exec {
        if exec.command.trim().is_empty() {
            report.error(format!("{path}.exec.command"), "required");
        }
    }
    let endpoints = [
        c.tcp.as_ref().map(|t| ("tcp", t.port, t.host.as_ref())),
        c.http.as_ref().map(|h| ("http", h.port, h.host.as_ref())),
    ];
    for (kind, port, host) in endpoints.into_iter().flatten() {
        if port == 0 {
            report.error(format!("{path}.{kind}.port"), "must be 1 to 65535");
        }
        let bad_host = |h: &String| {
            h.is_empty()
                || h.len() > 253
                || h.chars()
                    .any(|ch| ch.is_whitespace() || ch.is_control() || "/@?#".contains(ch))
        };
        if host.is_some_and(bad_host) {
            report.error(
                format!("{path}.{kind}.host"),
                "must be a host name or an IP address",
            );
        }
    }
    if let Some(p) = c.http.as_ref().and_then(|h| h.path.as_ref()) {
        if !p.starts_with('/') || p.len() > 1024 || p.chars().any(|ch| ch.is_whitespace() || ch.is_control())
        {
            report.error(
                format!("{path}.http.path"),
                "must start with / and hold no spaces or control characters (at most 1024)",
            );
        }
    }
    let interval = c.interval.as_ref().and_then(|d| d.parse().ok());
    if let Some(d) = &c.interval {
        check_duration_within(report, &format!("{path}.interval"), d, MAX_CHECK_INTERVAL);
        if interval.is_some_and(|i: Duration| i < MIN_CHECK_INTERVAL) {
            report.error(format!("{path}.interval"), "must be at least 100ms");
        }
    }
    if let Some(d) = &c.timeout {
        check_duration_within(
            report,
            &format!("{path}.timeout"),
            d,
            interval.unwrap_or(MAX_CHECK_INTERVAL),
        );
        if d.parse().is_ok_and(|t: Duration| t.is_zero()) {
            report.error(format!("{path}.timeout"), "must be > 0");
        }
    }
    if let Some(d) = &c.initial_delay {
        check_duration_within(report, &format!("{path}.initialDelay"), d, MAX_CHECK_INTERVAL);
    }
    if c.failure_threshold
        .is_some_and(|n| n == 0 || n > MAX_FAILURE_THRESHOLD)
    {
        report.error(
            format!("{path}.failureThreshold"),
            format!("must be 1 to {MAX_FAILURE_THRESHOLD}"),
        );
    }
}

fn check_restart_policy(report: &mut Report, path: &str, p: &RestartPolicy) {
    for (field, value) in [
        ("attempts", Some(p.attempts)),
        ("lostRetries", p.lost_retries),
        ("conditionRestarts", p.condition_restarts),
    ] {
        if value.is_some_and(|v| v > MAX_RESTART_ATTEMPTS) {
            report.error(
                format!("{path}.{field}"),
                format!("must be at most {MAX_RESTART_ATTEMPTS}"),
            );
        }
    }
    if let Some(delay) = &p.delay {
        check_duration_within(report, &format!("{path}.delay"), delay, MAX_RESTART_DELAY);
    }
    if let Some(max) = &p.max_delay {
        check_duration_within(report, &format!("{path}.maxDelay"), max, MAX_RESTART_DELAY);
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

/// A host name made into a robot id, if it can be: lower-cased, every
/// character other than letters, digits and '.' made '-', and each part
/// trimmed of '-' (`My_Robot.local` becomes `my-robot.local`).
pub fn robot_id_from_hostname(host: &str) -> Option<String> {
    let mapped: String = host
        .trim()
        .to_ascii_lowercase()
        .chars()
        .map(|c| {
            if c.is_ascii_alphanumeric() || c == '.' {
                c
            } else {
                '-'
            }
        })
        .collect();
    let id = mapped
        .split('.')
        .map(|part| part.trim_matches('-'))
        .filter(|part| !part.is_empty())
        .collect::<Vec<_>>()
        .join(".");
    validate_robot_id(&id).ok().map(|()| id)
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

    #[test]
    fn host_names_become_robot_ids() {
        assert_eq!(
            robot_id_from_hostname("My_Robot.local").as_deref(),
            Some("my-robot.local")
        );
        assert_eq!(robot_id_from_hostname(" lab-7\n").as_deref(), Some("lab-7"));
        assert_eq!(robot_id_from_hostname("___"), None);
        assert_eq!(robot_id_from_hostname(""), None);
    }

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
    fn pre_stop_fits_in_the_kill_timeout_and_conditions_are_well_formed() {
        use crate::facts::{FactOperator, FactRequirement};
        let mut t = template();
        t.kill_timeout = Some("10s".into());
        t.pre_stop = Some(crate::task::PreStop {
            command: "/usr/bin/park".into(),
            args: vec![],
            timeout: Some("15s".into()),
        });
        t.when = vec![FactRequirement {
            key: "battery".into(),
            operator: FactOperator::Gt,
            values: vec!["thirty".into()],
            ..Default::default()
        }];
        let err = validate_task_template(&t).unwrap_err();
        assert!(
            err.to_string().contains("exceeds the task's killTimeout of 10s"),
            "{err}"
        );
        assert_eq!(paths(err), ["spec.preStop.timeout", "spec.when[0]"]);
        t.pre_stop.as_mut().unwrap().timeout = Some("4s".into());
        t.when[0].values = vec!["30".into()];
        assert!(validate_task_template(&t).is_ok());
        assert_eq!(pre_stop_timeout_of(&t), Some(Duration::from_secs(4)));
        t.pre_stop.as_mut().unwrap().timeout = None;
        assert_eq!(
            pre_stop_timeout_of(&t),
            Some(Duration::from_secs(5)),
            "half the kill timeout"
        );
        t.pre_stop.as_mut().unwrap().command = " ".into();
        assert_eq!(
            paths(validate_task_template(&t).unwrap_err()),
            ["spec.preStop.command"]
        );
    }

    #[test]
    fn a_podman_task_needs_an_image_by_digest_and_may_leave_its_command_to_the_image() {
        let digest = format!("sha256:{}", "a".repeat(64));
        let podman = |image: Option<&str>| TaskTemplate {
            driver: "podman".into(),
            command: String::new(),
            image: image.map(str::to_owned),
            devices: vec!["/dev/video0".into(), "nvidia.com/gpu=all".into()],
            ..template()
        };
        validate_task_template(&podman(Some(&format!("localhost:5000/nav@{digest}")))).unwrap();
        let err = validate_task_template(&podman(Some("ros:humble"))).unwrap_err();
        assert!(err.to_string().contains("by digest"), "{err}");
        assert_eq!(paths(err), vec!["spec.image"]);
        assert_eq!(
            paths(validate_task_template(&podman(None)).unwrap_err()),
            vec!["spec.image"]
        );
        let bad_device = TaskTemplate {
            devices: vec!["/etc/shadow".into()],
            ..podman(Some(&format!("nav@{digest}")))
        };
        assert_eq!(
            paths(validate_task_template(&bad_device).unwrap_err()),
            vec!["spec.devices[0]"]
        );
    }

    #[test]
    fn container_fields_are_refused_on_other_drivers() {
        let t = TaskTemplate {
            image: Some(format!("nav@sha256:{}", "a".repeat(64))),
            network: Some(crate::container::ContainerNetwork::None),
            devices: vec!["/dev/video0".into()],
            ..template()
        };
        assert_eq!(
            paths(validate_task_template(&t).unwrap_err()),
            vec!["spec.image", "spec.network", "spec.devices"]
        );
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
                value_from: None,
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
                disk: Some("0".into()),
            }),
            ..template()
        };
        assert_eq!(
            paths(validate_task_template(&t).unwrap_err()),
            vec![
                "spec.timeout",
                "spec.resources.cpu",
                "spec.resources.memory",
                "spec.resources.disk"
            ]
        );
    }

    #[test]
    fn a_fractional_duration_is_refused_naming_the_field() {
        let t = TaskTemplate {
            timeout: Some("1.5s".into()),
            ..template()
        };
        let err = validate_task_template(&t).unwrap_err();
        assert_eq!(paths(err.clone()), vec!["spec.timeout"]);
        assert!(err.to_string().contains("fractions are not accepted"), "{err}");
    }

    #[test]
    fn every_duration_has_a_cap() {
        let t = TaskTemplate {
            timeout: Some("31d".into()),
            kill_timeout: Some("100000000000000000000s".into()),
            ..template()
        };
        let err = validate_task_template(&t).unwrap_err();
        assert_eq!(paths(err.clone()), vec!["spec.timeout", "spec.killTimeout"]);
        assert!(err.to_string().contains("31d exceeds the cap of 30days"), "{err}");
        // Units outside the documented ones are refused as a real API
        // server's schema refuses them, not read by the lenient parser.
        for written in ["3y", "5 min", "1hour"] {
            let t = TaskTemplate {
                timeout: Some(written.into()),
                ..template()
            };
            let err = validate_task_template(&t).unwrap_err();
            assert!(
                err.to_string().contains("with the units d, h, m, s and ms"),
                "{written}: {err}"
            );
        }
        let at_cap = TaskTemplate {
            timeout: Some("30d".into()),
            kill_timeout: Some("5m".into()),
            ..template()
        };
        validate_task_template(&at_cap).unwrap();
        assert_eq!(timeout_of(&at_cap), Some(MAX_TIMEOUT));
        // timeout_of caps what validation would refuse, so that callers that
        // skipped validation still add finite durations.
        let huge = TaskTemplate {
            timeout: Some("100000d".into()),
            ..template()
        };
        assert_eq!(timeout_of(&huge), Some(MAX_TIMEOUT));

        let policy = RestartPolicy {
            attempts: 3,
            delay: Some("2d".into()),
            max_delay: Some("9999999h".into()),
            mode: Default::default(),
            lost_retries: None,
            condition_restarts: Some(MAX_RESTART_ATTEMPTS + 1),
        };
        let spec = TaskSpec {
            template: template(),
            restart_policy: Some(policy),
            ..Default::default()
        };
        assert_eq!(
            paths(validate_task_spec(&spec).unwrap_err()),
            vec![
                "spec.restartPolicy.conditionRestarts",
                "spec.restartPolicy.delay",
                "spec.restartPolicy.maxDelay"
            ]
        );
    }

    #[test]
    fn restarts_on_the_robot_are_bounded_and_defaulted() {
        let t = TaskTemplate {
            restart: Some(LocalRestart {
                attempts: MAX_RESTART_ATTEMPTS + 1,
                interval: Some("0s".into()),
                delay: Some("2d".into()),
                max_delay: Some("soon".into()),
                mode: LocalRestartMode::Delay,
            }),
            ..template()
        };
        assert_eq!(
            paths(validate_task_template(&t).unwrap_err()),
            vec![
                "spec.restart.attempts",
                "spec.restart.interval",
                "spec.restart.delay",
                "spec.restart.maxDelay"
            ]
        );
        assert_eq!(
            restarts_of(&template()),
            None,
            "a batch task gets none unless it asks"
        );
        let service = TaskTemplate {
            kind: TaskKind::Service,
            ..template()
        };
        assert!(validate_task_template(&service).is_ok());
        assert_eq!(
            restarts_of(&service),
            Some(Restarts {
                attempts: 2,
                interval: Duration::from_secs(1800),
                delay: Duration::from_secs(15),
                max_delay: DEFAULT_RESTART_MAX_DELAY,
                mode: LocalRestartMode::Fail,
            })
        );
    }

    #[test]
    fn health_checks_name_one_probe_and_stay_bounded() {
        use crate::task::{ExecCheck, HealthCheck, HttpCheck, TcpCheck};
        let bad = TaskTemplate {
            checks: vec![
                HealthCheck::default(),
                HealthCheck {
                    tcp: Some(TcpCheck {
                        port: 0,
                        host: Some("a b".into()),
                    }),
                    interval: Some("10ms".into()),
                    failure_threshold: Some(0),
                    ..HealthCheck::default()
                },
                HealthCheck {
                    http: Some(HttpCheck {
                        port: 80,
                        path: Some("healthz".into()),
                        host: None,
                    }),
                    interval: Some("1s".into()),
                    timeout: Some("2s".into()),
                    ..HealthCheck::default()
                },
                HealthCheck {
                    exec: Some(ExecCheck {
                        command: " ".into(),
                        args: vec![],
                    }),
                    tcp: Some(TcpCheck { port: 1, host: None }),
                    ..HealthCheck::default()
                },
            ],
            ..template()
        };
        assert_eq!(
            paths(validate_task_template(&bad).unwrap_err()),
            vec![
                "spec.checks[0]",
                "spec.checks[1].tcp.port",
                "spec.checks[1].tcp.host",
                "spec.checks[1].interval",
                "spec.checks[1].failureThreshold",
                "spec.checks[2].http.path",
                "spec.checks[2].timeout",
                "spec.checks[3]",
                "spec.checks[3].exec.command",
            ]
        );
        let good = HealthCheck {
            http: Some(HttpCheck {
                port: 8080,
                path: Some("/healthz".into()),
                host: Some("::1".into()),
            }),
            ..HealthCheck::default()
        };
        let t = TaskTemplate {
            checks: vec![good.clone()],
            ..template()
        };
        assert!(validate_task_template(&t).is_ok());
        assert_eq!(
            check_timing(&good),
            CheckTiming {
                interval: Duration::from_secs(10),
                timeout: Duration::from_secs(2),
                failure_threshold: 3,
                initial_delay: Duration::from_secs(10),
            }
        );
    }

    #[test]
    fn paths_stay_inside_the_task_directory() {
        for ok in ["data", "./data/run", "a/b/c", "."] {
            let t = TaskTemplate {
                working_dir: Some(ok.into()),
                ..template()
            };
            assert!(validate_task_template(&t).is_ok(), "{ok}");
        }
        for bad in ["/tmp", "..", "a/../../etc", "../x", "", "a\0b"] {
            let t = TaskTemplate {
                working_dir: Some(bad.into()),
                ..template()
            };
            assert_eq!(
                paths(validate_task_template(&t).unwrap_err()),
                vec!["spec.workingDir"],
                "{bad}"
            );
        }
        for bad in ["/etc/passwd", "a/../../x", ".", "dir/"] {
            let t = TaskTemplate {
                artifacts: vec![Artifact {
                    url: "https://example.com/f".into(),
                    destination: bad.into(),
                    sha256: "0".repeat(64),
                }],
                ..template()
            };
            assert_eq!(
                paths(validate_task_template(&t).unwrap_err()),
                vec!["spec.artifacts[0].destination"],
                "{bad}"
            );
        }
    }

    #[test]
    fn users_groups_and_counts_are_bounded() {
        let t = TaskTemplate {
            user: Some("-rf".into()),
            groups: vec!["dialout".into(), "video".into(), "dialout".into(), "a b".into()],
            artifacts: vec![
                Artifact {
                    url: "https://example.com/f".into(),
                    destination: "f".into(),
                    sha256: "0".repeat(64),
                };
                MAX_ARTIFACTS + 1
            ],
            ..template()
        };
        assert_eq!(
            paths(validate_task_template(&t).unwrap_err()),
            vec!["spec.user", "spec.groups[2]", "spec.groups[3]", "spec.artifacts"]
        );
        let t = TaskTemplate {
            user: Some("robot".into()),
            groups: vec!["dialout".into(), "gpio".into()],
            ..template()
        };
        validate_task_template(&t).unwrap();
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
                    count: Some(1),
                    task: template(),
                    ..Default::default()
                },
                TaskGroupTemplate {
                    name: "a".into(),
                    count: Some(-1),
                    task: template(),
                    ..Default::default()
                },
                TaskGroupTemplate {
                    name: "Bad_Name".into(),
                    count: Some(1),
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
    fn group(name: &str, after: &[&str]) -> crate::job::TaskGroupTemplate {
        crate::job::TaskGroupTemplate {
            name: name.into(),
            count: Some(1),
            task: template(),
            after: after.iter().map(|a| (*a).to_owned()).collect(),
            ..Default::default()
        }
    }

    #[test]
    fn ordering_names_existing_groups_without_a_circle() {
        let ok = JobSpec {
            task_groups: vec![group("map", &[]), group("drive", &["map"]), group("report", &[])],
            order: vec!["drive".into(), "report".into()],
            ..JobSpec::default()
        };
        validate_job_spec(&ok).unwrap();
        assert_eq!(ok.dependencies_of(&ok.task_groups[2]), vec!["drive"]);
        let unknown = JobSpec {
            task_groups: vec![group("a", &["nope", "a"])],
            order: vec!["a".into(), "ghost".into(), "a".into()],
            ..JobSpec::default()
        };
        let err = validate_job_spec(&unknown).unwrap_err();
        assert_eq!(
            paths(err.clone()),
            vec![
                "spec.order[1]",
                "spec.order[2]",
                "spec.taskGroups[0].after[0]",
                "spec.taskGroups[0].after[1]"
            ]
        );
        assert!(err.to_string().contains("no group is named \"ghost\""), "{err}");
        let cycle = JobSpec {
            task_groups: vec![group("a", &["c"]), group("b", &["a"]), group("c", &[])],
            order: vec!["b".into(), "c".into()],
            ..JobSpec::default()
        };
        let err = validate_job_spec(&cycle).unwrap_err().to_string();
        assert_eq!(
            err,
            "spec.taskGroups: the groups wait for each other in a circle: a -> c -> b -> a"
        );
    }

    #[test]
    fn every_robot_groups_take_no_count_and_bounded_rollout_limits() {
        use crate::job::{CountOrPercent, GroupMode, TaskGroupTemplate};
        let fleet = |count, max_parallel, max_failed| JobSpec {
            task_groups: vec![TaskGroupTemplate {
                mode: GroupMode::EveryRobot,
                count,
                max_parallel,
                max_failed,
                ..group("update", &[])
            }],
            ..JobSpec::default()
        };
        let ok = fleet(None, Some(2), Some(CountOrPercent::Percent("10%".into())));
        validate_job_spec(&ok).unwrap();
        let bad = fleet(Some(3), Some(0), Some(CountOrPercent::Percent("150%".into())));
        assert_eq!(
            paths(validate_job_spec(&bad).unwrap_err()),
            vec![
                "spec.taskGroups[0].count",
                "spec.taskGroups[0].maxParallel",
                "spec.taskGroups[0].maxFailed"
            ]
        );
        let counted = JobSpec {
            task_groups: vec![TaskGroupTemplate {
                max_parallel: Some(1),
                ..group("g", &[])
            }],
            ..JobSpec::default()
        };
        assert_eq!(
            paths(validate_job_spec(&counted).unwrap_err()),
            vec!["spec.taskGroups[0].maxParallel"]
        );
        assert_eq!(CountOrPercent::Percent("25%".into()).of(10), Some(2));
        assert_eq!(CountOrPercent::Count(-1).of(10), None);
    }

    #[test]
    fn affinity_weights_and_topology_keys_are_checked() {
        use crate::selector::{AntiAffinity, WeightedAffinity};
        let spec = JobSpec {
            task_groups: vec![crate::job::TaskGroupTemplate {
                anti_affinity: Some(AntiAffinity {
                    topology_key: Some("bad key!".into()),
                }),
                affinity: vec![WeightedAffinity {
                    weight: 0,
                    selector: LabelSelector::from_labels([("dock", "yes")]),
                }],
                ..group("g", &[])
            }],
            ..JobSpec::default()
        };
        assert_eq!(
            paths(validate_job_spec(&spec).unwrap_err()),
            vec![
                "spec.taskGroups[0].antiAffinity.topologyKey",
                "spec.taskGroups[0].affinity[0].weight"
            ]
        );
    }

    #[test]
    fn a_negative_ttl_after_finished_is_refused() {
        let spec = |ttl| JobSpec {
            task_groups: vec![group("g", &[])],
            ttl_seconds_after_finished: Some(ttl),
            ..JobSpec::default()
        };
        assert!(validate_job_spec(&spec(0)).is_ok());
        assert!(validate_job_spec(&spec(3600)).is_ok());
        let err = validate_job_spec(&spec(-1)).unwrap_err();
        assert_eq!(
            err.to_string(),
            "spec.ttlSecondsAfterFinished: must be >= 0, got -1"
        );
    }

    #[test]
    fn a_periodic_jobs_template_and_deadline_are_checked() {
        let spec = PeriodicJobSpec {
            schedule: " ".into(),
            starting_deadline: Some("soon".into()),
            failed_jobs_history_limit: Some(-1),
            job_template: crate::periodic::JobTemplate {
                spec: JobSpec {
                    task_groups: vec![group("a", &["b"])],
                    ttl_seconds_after_finished: Some(-5),
                    ..JobSpec::default()
                },
                ..Default::default()
            },
            ..PeriodicJobSpec::default()
        };
        assert_eq!(
            paths(validate_periodic_job_spec(&spec).unwrap_err()),
            vec![
                "spec.schedule",
                "spec.startingDeadline",
                "spec.failedJobsHistoryLimit",
                "spec.jobTemplate.spec.ttlSecondsAfterFinished",
                "spec.jobTemplate.spec.taskGroups[0].after[0]"
            ]
        );
    }

    #[test]
    fn references_to_config_maps_and_secrets_are_checked_field_by_field() {
        use crate::config_ref::*;
        let key = |name: &str, key: &str| KeySelector {
            name: name.into(),
            key: key.into(),
            optional: None,
        };
        let t = TaskTemplate {
            env: vec![
                EnvVar {
                    name: "OK".into(),
                    value: String::new(),
                    value_from: Some(EnvVarSource {
                        config_map_key_ref: Some(key("calibration", "$(K8S4R_ROBOT_ID)")),
                        secret_key_ref: None,
                    }),
                },
                EnvVar {
                    name: "BOTH".into(),
                    value: "literal".into(),
                    value_from: Some(EnvVarSource {
                        config_map_key_ref: Some(key("a", "k")),
                        secret_key_ref: Some(key("b", "k")),
                    }),
                },
                EnvVar {
                    name: "BAD".into(),
                    value: String::new(),
                    value_from: Some(EnvVarSource {
                        config_map_key_ref: None,
                        secret_key_ref: Some(key("Not_A_Name", "a/b")),
                    }),
                },
            ],
            env_from: vec![EnvFromSource::default()],
            files: vec![
                ConfigFiles {
                    path: "../etc".into(),
                    config_map: Some(ConfigMapFiles {
                        name: "params".into(),
                        default_mode: Some(0o1777),
                        ..ConfigMapFiles::default()
                    }),
                    secret: None,
                },
                ConfigFiles {
                    path: "certs".into(),
                    config_map: None,
                    secret: Some(SecretFiles {
                        secret_name: "cert-$(K8S4R_ROBOT_ID)".into(),
                        items: vec![KeyToPath {
                            key: "tls.key".into(),
                            path: "/abs".into(),
                            mode: None,
                        }],
                        ..SecretFiles::default()
                    }),
                },
            ],
            ..template()
        };
        assert_eq!(
            paths(validate_task_template(&t).unwrap_err()),
            vec![
                "spec.env[1].value",
                "spec.env[1].valueFrom",
                "spec.env[2].valueFrom.secretKeyRef.name",
                "spec.env[2].valueFrom.secretKeyRef.key",
                "spec.envFrom[0]",
                "spec.files[0].path",
                "spec.files[0].configMap.defaultMode",
                "spec.files[1].secret.items[0].path",
            ]
        );
    }
}
