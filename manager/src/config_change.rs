//! A changed ConfigMap or Secret reaching the services that run with it:
//! whether a running attempt is asked to take its configuration again, and
//! when, decided without I/O.
//!
//! The manager compares the versions of the objects a running service
//! takes, as its cache has them, with those its robot reported it runs
//! with (`status.config`). When they differ, it asks the server, through
//! the annotation `robot.k8s4r.io/config-refresh`, to send the attempt its
//! configuration again, with a generation the robot reports back once it
//! applied it. A group of services with `onConfigChange: restart` has at
//! most `maxParallel` of its attempts asked and not yet reported at once:
//! a rolling restart. `signal` and `none` are not held back: nothing stops.
//!
//! Nothing is asked of an attempt whose robot never reported what it runs
//! with (an agent older than this), and nothing twice for the same
//! versions: the cache may lag behind the versions the server read, and
//! the robot then reports the values unchanged, once.

use std::time::Duration;

use jiff::Timestamp;
use k8s4r_api::config_ref::{ConfigRefresh, OnConfigChange};
use k8s4r_api::{TaskConfigStatus, TaskKind, TaskState, TaskStatus, TaskTemplate};

/// What one decision knows of a Task.
#[derive(Debug, Clone, Copy)]
pub struct Running<'a> {
    /// Its template.
    pub template: &'a TaskTemplate,
    /// Its status.
    pub status: Option<&'a TaskStatus>,
    /// The manager's last request, from its annotation.
    pub asked: Option<&'a ConfigRefresh>,
}

impl Running<'_> {
    fn reported(&self) -> Option<&TaskConfigStatus> {
        self.status?.config.as_ref()
    }

    fn attempt(&self) -> u32 {
        self.status.map_or(0, |s| s.attempt)
    }

    /// A running service that takes ConfigMaps or Secrets, whose robot
    /// reported what it runs with.
    fn takes_changes(&self) -> bool {
        self.template.kind == TaskKind::Service
            && self.status.and_then(|s| s.state) == Some(TaskState::Running)
            && self.reported().is_some()
            && k8s4r_api::config_resolve::has_references(self.template)
    }

    /// Asked for a change its robot has not reported applying yet.
    pub fn in_flight(&self) -> bool {
        let applied = self.reported().map_or(0, |c| c.generation);
        self.takes_changes()
            && self
                .asked
                .is_some_and(|a| a.attempt == self.attempt() && a.generation > applied)
    }

    /// Its request is a restart the group's `maxParallel` bounds.
    pub fn restarting(&self) -> bool {
        self.template.on_config_change == OnConfigChange::Restart && self.in_flight()
    }
}

/// What to do about one running Task.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Refresh {
    /// Nothing (not a running service that takes configuration, or
    /// nothing changed).
    Nothing,
    /// Look again after this long: a change waits for its turn (as many of
    /// its group are restarting as `maxParallel` allows), or a request is
    /// under way and is asked again if still unreported then.
    Wait(Duration),
    /// Write this request.
    Ask(ConfigRefresh),
}

/// How soon a change that waits for its turn in a rolling restart looks
/// again (the group's restarts end in about a kill timeout and a start).
pub const TURN_RECHECK: Duration = Duration::from_secs(1);

/// How long a request may go unreported before it is asked again, one
/// generation up (the robot lost it, or its report, with an agent restart
/// or shutdown; one it applied reports the values `unchanged`).
pub const REASK_AFTER: Duration = Duration::from_secs(60);

/// Decides whether `task` is asked to take its configuration again:
/// `desired` are the versions of its objects as the cache has them now
/// (`ConfigSource::versions`; None when they do not resolve there: the
/// running attempt keeps what it has), `restarting` how many others of
/// its group are restarting for a change, `max_parallel` how many may.
pub fn decide(
    task: Running<'_>,
    desired: Option<&str>,
    restarting: usize,
    max_parallel: usize,
    now: Timestamp,
) -> Refresh {
    let (Some(reported), Some(desired)) = (task.reported(), desired) else {
        return Refresh::Nothing;
    };
    let attempt = task.attempt();
    let asked = task.asked.filter(|a| a.attempt == attempt);
    if let (true, Some(asked)) = (task.in_flight(), asked) {
        let waited = asked
            .at
            .and_then(|at| Duration::try_from(now.duration_since(at)).ok())
            .unwrap_or(Duration::ZERO);
        return match REASK_AFTER.checked_sub(waited).filter(|left| !left.is_zero()) {
            Some(left) => Refresh::Wait(left),
            // Its place in the group is its own already.
            None => Refresh::Ask(ConfigRefresh {
                attempt,
                generation: asked.generation + 1,
                versions: desired.to_owned(),
                at: Some(now),
            }),
        };
    }
    if !task.takes_changes() || reported.versions == desired {
        return Refresh::Nothing;
    }
    if asked.is_some_and(|a| a.versions == desired) {
        // Asked for these versions, and answered: the robot runs with what
        // the server read then (newer than the cache, or unchanged).
        return Refresh::Nothing;
    }
    if task.template.on_config_change == OnConfigChange::Restart && restarting >= max_parallel.max(1) {
        return Refresh::Wait(TURN_RECHECK);
    }
    let generation = asked.map_or(0, |a| a.generation).max(reported.generation) + 1;
    Refresh::Ask(ConfigRefresh {
        attempt,
        generation,
        versions: desired.to_owned(),
        at: Some(now),
    })
}

/// The number of a group's tasks that may restart at once for a change:
/// its `maxParallel`, 1 when it sets none.
pub fn max_parallel(group_max_parallel: Option<i32>) -> usize {
    group_max_parallel
        .and_then(|n| usize::try_from(n).ok())
        .unwrap_or(1)
        .max(1)
}

#[cfg(test)]
mod tests {
    use super::*;
    use k8s4r_api::config_ref::{ConfigFiles, ConfigMapFiles};

    fn template(on_change: OnConfigChange) -> TaskTemplate {
        TaskTemplate {
            driver: "exec".into(),
            command: "sleep".into(),
            kind: TaskKind::Service,
            on_config_change: on_change,
            files: vec![ConfigFiles {
                path: "conf".into(),
                config_map: Some(ConfigMapFiles {
                    name: "calibration".into(),
                    ..Default::default()
                }),
                ..Default::default()
            }],
            ..Default::default()
        }
    }

    fn status(attempt: u32, versions: &str, generation: u64) -> TaskStatus {
        TaskStatus {
            state: Some(TaskState::Running),
            attempt,
            config: Some(TaskConfigStatus {
                versions: versions.into(),
                generation,
                ..Default::default()
            }),
            ..Default::default()
        }
    }

    fn asked(attempt: u32, generation: u64, versions: &str) -> ConfigRefresh {
        ConfigRefresh {
            attempt,
            generation,
            versions: versions.into(),
            at: Some(now()),
        }
    }

    fn now() -> Timestamp {
        "2026-12-03T10:00:00Z".parse().unwrap()
    }

    fn decide(task: Running<'_>, desired: Option<&str>, restarting: usize, max_parallel: usize) -> Refresh {
        super::decide(task, desired, restarting, max_parallel, now())
    }

    const OLD: &str = "ConfigMap/calibration@1";
    const NEW: &str = "ConfigMap/calibration@2";

    #[test]
    fn a_changed_object_asks_the_running_service_once_with_the_next_generation() {
        let t = template(OnConfigChange::Signal);
        let s = status(3, OLD, 0);
        let task = Running {
            template: &t,
            status: Some(&s),
            asked: None,
        };
        assert_eq!(decide(task, Some(OLD), 0, 1), Refresh::Nothing);
        assert_eq!(decide(task, Some(NEW), 0, 1), Refresh::Ask(asked(3, 1, NEW)));
        // Asked and not answered: nothing more, and it counts as under way.
        let a = asked(3, 1, NEW);
        let task = Running {
            asked: Some(&a),
            ..task
        };
        assert!(task.in_flight() && !task.restarting());
        assert_eq!(
            decide(task, Some("ConfigMap/calibration@3"), 0, 1),
            Refresh::Wait(REASK_AFTER)
        );
        // Unreported for too long (lost with an agent restart): asked again,
        // one generation up, whatever its group does.
        let later = now() + REASK_AFTER;
        assert_eq!(
            super::decide(task, Some(NEW), 5, 1, later),
            Refresh::Ask(ConfigRefresh {
                at: Some(later),
                ..asked(3, 2, NEW)
            })
        );
        // Answered at another version than the cache's (the server read a
        // newer one): not asked again for the same versions.
        let s = status(3, "ConfigMap/calibration@3", 1);
        let task = Running {
            status: Some(&s),
            ..task
        };
        assert!(!task.in_flight());
        assert_eq!(decide(task, Some(NEW), 0, 1), Refresh::Nothing);
        // The cache moves on: asked again, one generation up.
        assert_eq!(
            decide(task, Some("ConfigMap/calibration@4"), 0, 1),
            Refresh::Ask(asked(3, 2, "ConfigMap/calibration@4"))
        );
    }

    #[test]
    fn restarts_wait_for_their_turn_and_signals_do_not() {
        let t = template(OnConfigChange::Restart);
        let s = status(1, OLD, 0);
        let task = Running {
            template: &t,
            status: Some(&s),
            asked: None,
        };
        assert_eq!(decide(task, Some(NEW), 1, 1), Refresh::Wait(TURN_RECHECK));
        assert_eq!(decide(task, Some(NEW), 1, 2), Refresh::Ask(asked(1, 1, NEW)));
        let a = asked(1, 1, NEW);
        assert!(Running {
            asked: Some(&a),
            ..task
        }
        .restarting());
        let t = template(OnConfigChange::Signal);
        let task = Running { template: &t, ..task };
        assert_eq!(decide(task, Some(NEW), 5, 1), Refresh::Ask(asked(1, 1, NEW)));
        assert_eq!(max_parallel(None), 1);
        assert_eq!(max_parallel(Some(3)), 3);
        assert_eq!(max_parallel(Some(0)), 1);
    }

    #[test]
    fn only_running_services_whose_robot_reports_their_configuration_are_asked() {
        let t = template(OnConfigChange::None);
        let unreported = TaskStatus {
            config: None,
            ..status(1, OLD, 0)
        };
        let pending = TaskStatus {
            state: Some(TaskState::Pending),
            ..status(1, OLD, 0)
        };
        for s in [&unreported, &pending] {
            let task = Running {
                template: &t,
                status: Some(s),
                asked: None,
            };
            assert_eq!(decide(task, Some(NEW), 0, 1), Refresh::Nothing);
        }
        let batch = TaskTemplate {
            kind: TaskKind::Batch,
            ..template(OnConfigChange::None)
        };
        let s = status(1, OLD, 0);
        let task = Running {
            template: &batch,
            status: Some(&s),
            asked: None,
        };
        assert_eq!(
            decide(task, Some(NEW), 0, 1),
            Refresh::Nothing,
            "batch tasks keep their values"
        );
        // Objects the cache cannot resolve: the attempt keeps what it has.
        let task = Running { template: &t, ..task };
        assert_eq!(decide(task, None, 0, 1), Refresh::Nothing);
        // A request for an earlier attempt is not this one's.
        let a = asked(0, 4, NEW);
        let task = Running {
            asked: Some(&a),
            ..task
        };
        assert!(!task.in_flight());
        assert_eq!(decide(task, Some(NEW), 0, 1), Refresh::Ask(asked(1, 1, NEW)));
    }
}
