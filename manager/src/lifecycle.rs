//! The Task lifecycle as the manager sees it: what to do next with a Task,
//! given its status, the health of its robot and the clock.
//!
//! Pure functions; the Task controller carries the decisions out.

use std::time::Duration;

use jiff::{SignedDuration, Timestamp};
use k8s4r_api::validation::{kill_timeout_of, timeout_of, DEFAULT_RESTART_DELAY, DEFAULT_RESTART_MAX_DELAY};
use k8s4r_api::{RestartPolicy, TaskReason, TaskSpec, TaskState, TaskStatus};

/// The timing rules of the lifecycle.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct LifecycleConfig {
    /// How long a dispatched attempt may wait for the robot's `running`.
    pub dispatch_timeout: Duration,
    /// How long a robot may be Offline before its tasks are lost.
    pub robot_lost_grace: Duration,
    /// Slack after `startTime + timeout + killTimeout` before the manager
    /// fails a task whose robot never reported the end.
    pub backstop_grace: Duration,
    /// Retries granted for failures that are not the task's own (robot lost,
    /// dispatch not acknowledged), on top of the restart policy.
    pub lost_retries: u32,
}

impl Default for LifecycleConfig {
    fn default() -> Self {
        Self {
            dispatch_timeout: Duration::from_secs(60),
            robot_lost_grace: Duration::from_secs(30),
            backstop_grace: Duration::from_secs(60),
            lost_retries: 3,
        }
    }
}

/// What the manager knows about the robot a task is assigned to.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum RobotHealth {
    /// Online (or Pending: not lost, just not approved again yet).
    Up,
    /// Offline since the given time, if known.
    Offline(Option<Timestamp>),
    /// No such Robot.
    Missing,
}

/// The next step for one Task.
#[derive(Clone, Debug, PartialEq)]
pub enum Step {
    /// Nothing to do now; look again after the duration (or on a change).
    Wait(Option<Duration>),
    /// Pick a robot and dispatch the next attempt.
    Schedule,
    /// The manager fails the current attempt.
    Fail {
        /// `RobotLost`, `DispatchTimeout` or `TimeoutBackstop`.
        reason: TaskReason,
        /// For a person.
        message: String,
    },
    /// The failed attempt is retried: back to pending after `delay`.
    Retry {
        /// The backoff before the next attempt.
        delay: Duration,
    },
    /// Completed, or failed for good.
    Done,
}

/// Failures that are not the task's fault: they do not use up its restart
/// policy (they have their own budget, [`LifecycleConfig::lost_retries`]).
pub fn is_infrastructure(reason: Option<TaskReason>) -> bool {
    matches!(reason, Some(TaskReason::RobotLost | TaskReason::DispatchTimeout))
}

/// The delay before retry number `retry` (0 for the first), doubling from
/// the policy's delay up to its cap.
pub fn backoff(policy: &RestartPolicy, retry: u32) -> Duration {
    let base = policy
        .delay
        .as_ref()
        .and_then(|d| d.parse().ok())
        .unwrap_or(DEFAULT_RESTART_DELAY);
    let cap = policy
        .max_delay
        .as_ref()
        .and_then(|d| d.parse().ok())
        .unwrap_or(DEFAULT_RESTART_MAX_DELAY);
    let factor = 1u32.checked_shl(retry.min(31)).unwrap_or(u32::MAX);
    base.checked_mul(factor).unwrap_or(cap).min(cap)
}

/// Whether the failed current attempt is retried, and after what delay.
pub fn retry_delay(
    status: &TaskStatus,
    policy: Option<&RestartPolicy>,
    cfg: &LifecycleConfig,
) -> Option<Duration> {
    if matches!(
        status.reason,
        Some(TaskReason::InvalidSpec | TaskReason::Cancelled)
    ) {
        return None;
    }
    let infra_used = status
        .attempts
        .iter()
        .filter(|a| is_infrastructure(a.reason))
        .count() as u32;
    let own_used = status.attempts.len() as u32 - infra_used;
    if is_infrastructure(status.reason) {
        return (infra_used < cfg.lost_retries).then_some(Duration::ZERO);
    }
    let policy = policy?;
    (own_used < policy.attempts).then(|| backoff(policy, own_used))
}

/// The state a Task counts as in its group's status: a failed attempt that
/// will be retried is pending, not failed.
pub fn effective_state(spec: &TaskSpec, status: Option<&TaskStatus>, cfg: &LifecycleConfig) -> TaskState {
    let Some(status) = status else {
        return TaskState::Pending;
    };
    match status.state {
        None => TaskState::Pending,
        Some(TaskState::Failed) if retry_delay(status, spec.restart_policy.as_ref(), cfg).is_some() => {
            TaskState::Pending
        }
        Some(state) => state,
    }
}

fn until(now: Timestamp, deadline: Timestamp) -> Duration {
    let left: SignedDuration = deadline.duration_since(now);
    Duration::try_from(left).unwrap_or(Duration::ZERO)
}

fn plus(t: Timestamp, d: Duration) -> Timestamp {
    SignedDuration::try_from(d)
        .ok()
        .and_then(|d| t.checked_add(d).ok())
        .unwrap_or(Timestamp::MAX)
}

fn earliest(a: Option<Duration>, b: Option<Duration>) -> Option<Duration> {
    match (a, b) {
        (Some(a), Some(b)) => Some(a.min(b)),
        (a, b) => a.or(b),
    }
}

/// Decides the next step for a Task.
pub fn next_step(
    spec: &TaskSpec,
    status: Option<&TaskStatus>,
    robot: RobotHealth,
    now: Timestamp,
    cfg: &LifecycleConfig,
) -> Step {
    let default = TaskStatus::default();
    let status = status.unwrap_or(&default);
    match status.state {
        None | Some(TaskState::Pending) => match status.next_attempt_time {
            Some(at) if at > now => Step::Wait(Some(until(now, at))),
            _ => Step::Schedule,
        },
        Some(TaskState::Completed) => Step::Done,
        Some(TaskState::Failed) => match retry_delay(status, spec.restart_policy.as_ref(), cfg) {
            Some(delay) => Step::Retry { delay },
            None => Step::Done,
        },
        Some(state @ (TaskState::Dispatching | TaskState::Running)) => {
            let robot_name = status
                .robot
                .as_deref()
                .or(spec.target_robot.as_deref())
                .unwrap_or("?");
            let lost_recheck = match robot {
                RobotHealth::Up => None,
                RobotHealth::Missing => {
                    return Step::Fail {
                        reason: TaskReason::RobotLost,
                        message: format!("robot {robot_name} no longer exists"),
                    }
                }
                RobotHealth::Offline(since) => {
                    let since = since.unwrap_or(now);
                    let deadline = plus(since, cfg.robot_lost_grace);
                    if deadline <= now {
                        return Step::Fail {
                            reason: TaskReason::RobotLost,
                            message: format!(
                                "robot {robot_name} offline for more than {}s",
                                cfg.robot_lost_grace.as_secs()
                            ),
                        };
                    }
                    Some(until(now, deadline))
                }
            };
            let own_recheck = if state == TaskState::Dispatching {
                let sent = status.dispatch_time.unwrap_or(now);
                let deadline = plus(sent, cfg.dispatch_timeout);
                if deadline <= now {
                    return Step::Fail {
                        reason: TaskReason::DispatchTimeout,
                        message: format!(
                            "robot {robot_name} did not start attempt {} within {}s",
                            status.attempt,
                            cfg.dispatch_timeout.as_secs()
                        ),
                    };
                }
                Some(until(now, deadline))
            } else {
                match (timeout_of(&spec.template), status.start_time) {
                    (Some(timeout), Some(start)) => {
                        let limit = timeout + kill_timeout_of(&spec.template) + cfg.backstop_grace;
                        let deadline = plus(start, limit);
                        if deadline <= now {
                            return Step::Fail {
                                reason: TaskReason::TimeoutBackstop,
                                message: format!(
                                    "robot {robot_name} reported no end {}s after the {}s timeout",
                                    (limit - timeout).as_secs(),
                                    timeout.as_secs()
                                ),
                            };
                        }
                        Some(until(now, deadline))
                    }
                    _ => None,
                }
            };
            Step::Wait(earliest(lost_recheck, own_recheck))
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use k8s4r_api::{AttemptRecord, DurationString, RestartMode, TaskTemplate};

    fn t(secs: i64) -> Timestamp {
        Timestamp::from_second(1_700_000_000 + secs).unwrap()
    }

    fn policy(attempts: u32, delay: &str, max: &str) -> RestartPolicy {
        RestartPolicy {
            attempts,
            delay: Some(DurationString::from(delay)),
            max_delay: Some(DurationString::from(max)),
            mode: RestartMode::Fail,
        }
    }

    fn spec() -> TaskSpec {
        TaskSpec {
            template: TaskTemplate {
                driver: "exec".into(),
                command: "true".into(),
                ..TaskTemplate::default()
            },
            ..TaskSpec::default()
        }
    }

    fn status(state: TaskState) -> TaskStatus {
        TaskStatus {
            state: Some(state),
            attempt: 1,
            robot: Some("r1".into()),
            dispatch_time: Some(t(0)),
            ..TaskStatus::default()
        }
    }

    fn record(attempt: u32, reason: TaskReason) -> AttemptRecord {
        AttemptRecord {
            attempt,
            robot: Some("r1".into()),
            state: TaskState::Failed,
            exit_code: None,
            reason: Some(reason),
            finish_time: None,
        }
    }

    fn cfg() -> LifecycleConfig {
        LifecycleConfig {
            dispatch_timeout: Duration::from_secs(30),
            robot_lost_grace: Duration::from_secs(10),
            backstop_grace: Duration::from_secs(5),
            lost_retries: 2,
        }
    }

    #[test]
    fn backoff_doubles_up_to_the_cap() {
        let p = policy(10, "1s", "5s");
        let got: Vec<u64> = (0..5).map(|i| backoff(&p, i).as_secs()).collect();
        assert_eq!(got, vec![1, 2, 4, 5, 5]);
        assert_eq!(backoff(&p, 200), Duration::from_secs(5), "no overflow");
        let defaults = RestartPolicy {
            attempts: 1,
            delay: None,
            max_delay: None,
            mode: RestartMode::Fail,
        };
        assert_eq!(backoff(&defaults, 0), DEFAULT_RESTART_DELAY);
        assert_eq!(backoff(&defaults, 30), DEFAULT_RESTART_MAX_DELAY);
    }

    #[test]
    fn retries_count_against_the_policy() {
        let p = policy(2, "1s", "1m");
        let mut s = status(TaskState::Failed);
        s.reason = Some(TaskReason::Error);
        assert_eq!(retry_delay(&s, Some(&p), &cfg()), Some(Duration::from_secs(1)));
        s.attempts.push(record(1, TaskReason::Error));
        assert_eq!(retry_delay(&s, Some(&p), &cfg()), Some(Duration::from_secs(2)));
        s.attempts.push(record(2, TaskReason::Timeout));
        assert_eq!(retry_delay(&s, Some(&p), &cfg()), None, "two retries used");
        assert_eq!(
            retry_delay(&status(TaskState::Failed), None, &cfg()),
            None,
            "no policy"
        );
    }

    #[test]
    fn lost_robots_do_not_use_up_the_policy() {
        let mut s = status(TaskState::Failed);
        s.reason = Some(TaskReason::RobotLost);
        assert_eq!(retry_delay(&s, None, &cfg()), Some(Duration::ZERO));
        s.attempts.push(record(1, TaskReason::DispatchTimeout));
        assert_eq!(retry_delay(&s, None, &cfg()), Some(Duration::ZERO));
        s.attempts.push(record(2, TaskReason::RobotLost));
        assert_eq!(retry_delay(&s, None, &cfg()), None, "lost budget used");
        s.reason = Some(TaskReason::Error);
        let p = policy(1, "3s", "1m");
        assert_eq!(
            retry_delay(&s, Some(&p), &cfg()),
            Some(Duration::from_secs(3)),
            "own failures are counted apart"
        );
    }

    #[test]
    fn invalid_or_cancelled_attempts_are_not_retried() {
        let p = policy(5, "1s", "1m");
        for reason in [TaskReason::InvalidSpec, TaskReason::Cancelled] {
            let mut s = status(TaskState::Failed);
            s.reason = Some(reason);
            assert_eq!(retry_delay(&s, Some(&p), &cfg()), None);
        }
    }

    #[test]
    fn pending_waits_for_its_backoff() {
        let mut s = status(TaskState::Pending);
        assert_eq!(
            next_step(&spec(), Some(&s), RobotHealth::Up, t(0), &cfg()),
            Step::Schedule
        );
        s.next_attempt_time = Some(t(10));
        assert_eq!(
            next_step(&spec(), Some(&s), RobotHealth::Up, t(4), &cfg()),
            Step::Wait(Some(Duration::from_secs(6)))
        );
        assert_eq!(
            next_step(&spec(), Some(&s), RobotHealth::Up, t(10), &cfg()),
            Step::Schedule
        );
        assert_eq!(
            next_step(&spec(), None, RobotHealth::Missing, t(0), &cfg()),
            Step::Schedule
        );
    }

    #[test]
    fn unacknowledged_dispatch_times_out() {
        let s = status(TaskState::Dispatching);
        assert_eq!(
            next_step(&spec(), Some(&s), RobotHealth::Up, t(20), &cfg()),
            Step::Wait(Some(Duration::from_secs(10)))
        );
        let step = next_step(&spec(), Some(&s), RobotHealth::Up, t(30), &cfg());
        assert!(
            matches!(
                step,
                Step::Fail {
                    reason: TaskReason::DispatchTimeout,
                    ..
                }
            ),
            "{step:?}"
        );
    }

    #[test]
    fn offline_robot_loses_its_tasks_after_the_grace() {
        let s = status(TaskState::Running);
        let health = RobotHealth::Offline(Some(t(100)));
        assert_eq!(
            next_step(&spec(), Some(&s), health, t(104), &cfg()),
            Step::Wait(Some(Duration::from_secs(6)))
        );
        let step = next_step(&spec(), Some(&s), health, t(110), &cfg());
        assert!(
            matches!(
                step,
                Step::Fail {
                    reason: TaskReason::RobotLost,
                    ..
                }
            ),
            "{step:?}"
        );
        let step = next_step(&spec(), Some(&s), RobotHealth::Missing, t(0), &cfg());
        assert!(matches!(
            step,
            Step::Fail {
                reason: TaskReason::RobotLost,
                ..
            }
        ));
    }

    #[test]
    fn timeout_backstop_fires_after_timeout_kill_timeout_and_grace() {
        let mut sp = spec();
        sp.template.timeout = Some("10s".into());
        sp.template.kill_timeout = Some("2s".into());
        let mut s = status(TaskState::Running);
        s.start_time = Some(t(0));
        assert_eq!(
            next_step(&sp, Some(&s), RobotHealth::Up, t(10), &cfg()),
            Step::Wait(Some(Duration::from_secs(7)))
        );
        let step = next_step(&sp, Some(&s), RobotHealth::Up, t(17), &cfg());
        assert!(
            matches!(
                step,
                Step::Fail {
                    reason: TaskReason::TimeoutBackstop,
                    ..
                }
            ),
            "{step:?}"
        );
        assert_eq!(
            next_step(&spec(), Some(&s), RobotHealth::Up, t(1000), &cfg()),
            Step::Wait(None),
            "no timeout, no backstop"
        );
    }

    #[test]
    fn failed_tasks_retry_or_finish() {
        let mut sp = spec();
        sp.restart_policy = Some(policy(1, "2s", "1m"));
        let mut s = status(TaskState::Failed);
        s.reason = Some(TaskReason::Error);
        assert_eq!(
            next_step(&sp, Some(&s), RobotHealth::Up, t(0), &cfg()),
            Step::Retry {
                delay: Duration::from_secs(2)
            }
        );
        assert_eq!(effective_state(&sp, Some(&s), &cfg()), TaskState::Pending);
        s.attempts.push(record(1, TaskReason::Error));
        assert_eq!(
            next_step(&sp, Some(&s), RobotHealth::Up, t(0), &cfg()),
            Step::Done
        );
        assert_eq!(effective_state(&sp, Some(&s), &cfg()), TaskState::Failed);
        let done = status(TaskState::Completed);
        assert_eq!(
            next_step(&sp, Some(&done), RobotHealth::Missing, t(0), &cfg()),
            Step::Done
        );
    }
}
