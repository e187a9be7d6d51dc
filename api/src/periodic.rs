//! The PeriodicJob resource: a Job created on a cron schedule, as a
//! Kubernetes CronJob creates batch Jobs.
//!
//! A kind of its own rather than a field on Job: each run is an ordinary
//! Job (its own status, history and Events, deletable on its own), and the
//! schedule's state (last run, active runs) has a home that is not one of
//! the runs. It is not called CronJob so that `kubectl get cronjobs` on a
//! real cluster keeps meaning batch/v1.

use jiff::Timestamp;
use schemars::JsonSchema;
use serde::{Deserialize, Serialize};
use std::collections::BTreeMap;

use crate::condition::Condition;
use crate::job::JobSpec;

/// A Job created on a schedule.
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize, JsonSchema)]
#[cfg_attr(
    feature = "kube",
    derive(kube::CustomResource),
    kube(
        group = "robot.k8s4r.io",
        version = "v1alpha1",
        kind = "PeriodicJob",
        plural = "periodicjobs",
        shortname = "rpj",
        category = "k8s4r",
        namespaced,
        status = "PeriodicJobStatus",
        doc = "A Job created on a cron schedule, like a Kubernetes CronJob.",
        printcolumn(name = "Schedule", type_ = "string", json_path = ".spec.schedule"),
        printcolumn(name = "Timezone", type_ = "string", json_path = ".spec.timeZone"),
        printcolumn(name = "Suspend", type_ = "boolean", json_path = ".spec.suspend"),
        printcolumn(name = "Active", type_ = "integer", json_path = ".status.activeCount"),
        printcolumn(
            name = "Last Schedule",
            type_ = "date",
            json_path = ".status.lastScheduleTime"
        ),
        printcolumn(name = "Age", type_ = "date", json_path = ".metadata.creationTimestamp")
    )
)]
#[serde(rename_all = "camelCase")]
pub struct PeriodicJobSpec {
    /// Cron syntax: five fields (minute hour day-of-month month day-of-week),
    /// or six with seconds first; also `@hourly`, `@daily` and the like.
    pub schedule: String,
    /// An IANA time zone such as "Europe/Berlin" the schedule is read in;
    /// UTC when unset.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub time_zone: Option<String>,
    /// What to do when a run is due while an earlier one still runs.
    #[serde(default)]
    pub concurrency_policy: ConcurrencyPolicy,
    /// A run that could not start within this long of its scheduled time
    /// ("5m") is skipped. Unset: a late run starts whenever it can.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub starting_deadline: Option<String>,
    /// No new runs while true (runs already started go on).
    #[serde(default)]
    pub suspend: bool,
    /// Completed runs kept (default 3).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub successful_jobs_history_limit: Option<i32>,
    /// Failed runs kept (default 1).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub failed_jobs_history_limit: Option<i32>,
    /// The Job each run creates.
    pub job_template: JobTemplate,
}

/// What each run's Job looks like.
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct JobTemplate {
    /// Labels each run's Job carries.
    #[serde(default, skip_serializing_if = "BTreeMap::is_empty")]
    pub labels: BTreeMap<String, String>,
    /// The Job's spec.
    pub spec: JobSpec,
}

/// Whether runs may overlap, as Kubernetes' CronJob `concurrencyPolicy`.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
pub enum ConcurrencyPolicy {
    /// Runs may overlap.
    #[default]
    Allow,
    /// A run due while another is active waits for it (and is skipped if
    /// its starting deadline passes meanwhile).
    Forbid,
    /// A run due while another is active deletes that one and starts.
    Replace,
}

/// What the schedule has done.
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct PeriodicJobStatus {
    /// The runs' Jobs that have not finished.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub active: Vec<String>,
    /// How many runs are active.
    #[serde(default)]
    pub active_count: i32,
    /// The scheduled time of the last run started.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub last_schedule_time: Option<Timestamp>,
    /// When the last run that completed did so.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub last_successful_time: Option<Timestamp>,
    /// When the next run is due.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub next_schedule_time: Option<Timestamp>,
    /// `Valid` (False with the reason when the schedule or template is
    /// wrong).
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub conditions: Vec<Condition>,
}
