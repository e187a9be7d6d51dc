//! What happens to a task's attempt when its robot loses the cluster: the
//! `disconnect` block of a task group (in the spirit of Nomad's), and the
//! fencing arithmetic both sides of the network use.
//!
//! The robot holds each running attempt under a lease: when it has heard
//! nothing from the cluster for `stopAfter`, it stops the attempt itself
//! (SIGTERM, then SIGKILL after the kill timeout) and reports it failed with
//! reason `Disconnected` once it is back. The manager starts a replacement
//! only when the old robot confirmed the attempt over, or when
//! [`fence_after`] has passed since the cluster last heard from the robot,
//! by which time the robot has stopped the attempt by construction. See
//! docs/fencing.md.

use std::time::Duration;

use schemars::JsonSchema;
use serde::{Deserialize, Serialize};

use crate::duration::DurationString;
use crate::task_kind::TaskKind;

/// How long a robot keeps an attempt running without the cluster, unless
/// the group says otherwise: long enough for a Wi-Fi hand-over or a broker
/// restart, short enough that a lost robot's work moves within minutes.
pub const DEFAULT_STOP_AFTER: Duration = Duration::from_secs(120);
/// The shortest `stopAfter` accepted: below it, ordinary heartbeat gaps
/// would stop healthy attempts.
pub const MIN_STOP_AFTER: Duration = Duration::from_secs(5);
/// The longest `stopAfter` accepted.
pub const MAX_STOP_AFTER: Duration = Duration::from_secs(7 * 24 * 3600);

/// What to do with a task whose robot lost the cluster.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct DisconnectPolicy {
    /// How long the robot keeps running the attempt without hearing from
    /// the cluster before it stops it itself (default 2m; 5s to 7d).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub stop_after: Option<DurationString>,
    /// Whether the manager starts a replacement attempt (on any robot that
    /// fits) once the lost attempt is fenced; `false` waits for the robot to
    /// come back and report, and the robot keeps the attempt running
    /// meanwhile (default true for batch tasks, false for services: a
    /// robot's services keep running while it is offline).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub replace: Option<bool>,
    /// Which result counts when the original robot reports, after a
    /// replacement started, that the original attempt completed while it
    /// was cut off: `keepOriginal` (default) completes the task with it and
    /// stops the replacement; `keepReplacement` records it in the history
    /// and lets the replacement run.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub reconcile: Option<Reconcile>,
}

/// Which result counts when a robot that was cut off reports that the
/// original attempt completed after a replacement started.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub enum Reconcile {
    /// The original attempt's completion wins.
    #[default]
    KeepOriginal,
    /// The replacement wins.
    KeepReplacement,
}

impl DisconnectPolicy {
    /// `stopAfter`, or the default when unset or unparsable (validation
    /// refuses the latter before it gets this far).
    pub fn stop_after(policy: Option<&Self>) -> Duration {
        policy
            .and_then(|p| p.stop_after.as_ref())
            .and_then(|d| d.parse().ok())
            .unwrap_or(DEFAULT_STOP_AFTER)
    }

    /// `replace`, default true for batch tasks and false for services.
    pub fn replace(policy: Option<&Self>, kind: TaskKind) -> bool {
        policy.and_then(|p| p.replace).unwrap_or(kind == TaskKind::Batch)
    }

    /// `reconcile`, default keepOriginal.
    pub fn reconcile(policy: Option<&Self>) -> Reconcile {
        policy.and_then(|p| p.reconcile).unwrap_or_default()
    }

    /// Problems with the policy at `path`, for validation.
    pub fn problems(&self, path: &str) -> Vec<(String, String)> {
        let mut out = Vec::new();
        if let Some(d) = &self.stop_after {
            match d.parse() {
                Ok(d) if !(MIN_STOP_AFTER..=MAX_STOP_AFTER).contains(&d) => out.push((
                    format!("{path}.stopAfter"),
                    format!(
                        "must be between {}s and {}d",
                        MIN_STOP_AFTER.as_secs(),
                        MAX_STOP_AFTER.as_secs() / 86400
                    ),
                )),
                Ok(_) => {}
                Err(e) => out.push((format!("{path}.stopAfter"), e.to_string())),
            }
        }
        out
    }
}

/// How long after the cluster last heard from a robot its attempt is
/// certainly stopped: the robot's own `stop_after`, then its kill timeout,
/// plus `margin` for what lies between the robot's clock and the cluster's
/// record of contact (heartbeat and lease intervals, delivery). Saturates
/// instead of overflowing.
pub fn fence_after(stop_after: Duration, kill_timeout: Duration, margin: Duration) -> Duration {
    stop_after.saturating_add(kill_timeout).saturating_add(margin)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn defaults_are_safe_for_physical_work() {
        assert_eq!(DisconnectPolicy::stop_after(None), Duration::from_secs(120));
        assert!(DisconnectPolicy::replace(None, TaskKind::Batch));
        assert!(
            !DisconnectPolicy::replace(None, TaskKind::Service),
            "services ride out outages"
        );
        assert_eq!(DisconnectPolicy::reconcile(None), Reconcile::KeepOriginal);
        let p = DisconnectPolicy {
            stop_after: Some("30s".into()),
            replace: Some(false),
            reconcile: Some(Reconcile::KeepReplacement),
        };
        assert_eq!(DisconnectPolicy::stop_after(Some(&p)), Duration::from_secs(30));
        assert!(!DisconnectPolicy::replace(Some(&p), TaskKind::Batch));
        let replaced = DisconnectPolicy {
            replace: Some(true),
            ..p.clone()
        };
        assert!(DisconnectPolicy::replace(Some(&replaced), TaskKind::Service));
        assert!(p.problems("spec.disconnect").is_empty());
    }

    #[test]
    fn stop_after_is_bounded() {
        for bad in ["1s", "8d", "soon"] {
            let p = DisconnectPolicy {
                stop_after: Some(bad.into()),
                ..Default::default()
            };
            let problems = p.problems("spec.disconnect");
            assert_eq!(problems.len(), 1, "{bad}");
            assert_eq!(problems[0].0, "spec.disconnect.stopAfter");
        }
    }

    #[test]
    fn fencing_adds_up_without_overflow() {
        let s = Duration::from_secs;
        assert_eq!(fence_after(s(120), s(5), s(30)), s(155));
        assert_eq!(fence_after(Duration::MAX, s(5), s(30)), Duration::MAX);
    }
}
