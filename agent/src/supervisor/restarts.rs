//! Restarts on the robot (a task's `restart`, Nomad's `restart` block):
//! whether an attempt whose process exited runs again here, and after how
//! long. Decided by the agent alone, so a robot cut off from the cluster
//! keeps its services running.
//!
//! At most `attempts` restarts fall within any `interval`; the wait before
//! a restart doubles with each restart already in the interval, from
//! `delay` up to `maxDelay`. When the interval holds no more, mode `fail`
//! ends the attempt (reported failed, and the cluster's `restartPolicy`
//! may retry it elsewhere) and mode `delay` waits until it holds one.

use std::collections::VecDeque;
use std::time::Duration;

use k8s4r_api::validation::Restarts;
use k8s4r_api::{LocalRestartMode, TaskKind, TaskTemplate};
use tokio::time::Instant;

/// One attempt's restarts: its policy and what it has used.
#[derive(Debug)]
pub(crate) struct Budget {
    policy: Restarts,
    kind: TaskKind,
    /// When each restart still within the interval is (or was) due.
    recent: VecDeque<Instant>,
    /// Restarts of this attempt so far.
    pub count: u32,
    /// The exit code of the process the last restart replaced.
    pub last_exit_code: Option<i32>,
    /// When the last restart started the process again.
    pub last_restart: Option<jiff::Timestamp>,
    /// Why the process was last restarted, for a person.
    pub last_cause: Option<String>,
}

impl Budget {
    /// The budget of a task, or None for one that is never restarted here.
    pub(crate) fn of(template: &TaskTemplate) -> Option<Budget> {
        let policy = k8s4r_api::validation::restarts_of(template)?;
        Some(Budget {
            policy,
            kind: template.kind,
            recent: VecDeque::new(),
            count: 0,
            last_exit_code: None,
            last_restart: None,
            last_cause: None,
        })
    }

    /// The process exited by itself at `now` (`succeeded`: exit 0): how
    /// long until it runs again, or None when the attempt ends. A batch
    /// task that succeeded is done; anything else is restarted while the
    /// interval allows.
    pub(crate) fn after_exit(
        &mut self,
        succeeded: bool,
        exit_code: Option<i32>,
        now: Instant,
    ) -> Option<Duration> {
        if succeeded && self.kind == TaskKind::Batch {
            return None;
        }
        let interval = self.policy.interval;
        while self
            .recent
            .front()
            .is_some_and(|due| now.saturating_duration_since(*due) >= interval)
        {
            self.recent.pop_front();
        }
        let in_window = u32::try_from(self.recent.len()).unwrap_or(u32::MAX);
        let wait = if in_window < self.policy.attempts {
            self.backoff(in_window)
        } else {
            match self.policy.mode {
                LocalRestartMode::Fail => return None,
                // The oldest restart leaves the interval then; never sooner
                // than the full backoff.
                LocalRestartMode::Delay => {
                    let oldest = self.recent.front().copied().unwrap_or(now);
                    let frees = (oldest + interval).saturating_duration_since(now);
                    frees.max(self.backoff(in_window))
                }
            }
        };
        self.recent.push_back(now + wait);
        self.last_exit_code = exit_code;
        Some(wait)
    }

    /// The process was stopped on purpose to start again (its configuration
    /// changed): at once, counted as a restart, not against the interval.
    pub(crate) fn requested(&mut self, exit_code: Option<i32>, cause: String) -> Duration {
        self.last_exit_code = exit_code;
        self.last_cause = Some(cause);
        Duration::ZERO
    }

    /// The process was started again at `at`.
    pub(crate) fn restarted(&mut self, at: jiff::Timestamp) -> super::Restarted {
        self.count = self.count.saturating_add(1);
        self.last_restart = Some(at);
        super::Restarted {
            count: self.count,
            last_exit_code: self.last_exit_code,
            cause: self.last_cause.clone().unwrap_or_else(|| {
                "the process had stopped while the agent or the robot restarted".to_owned()
            }),
            at,
        }
    }

    /// `delay` doubled `n` times, at most `maxDelay`.
    fn backoff(&self, n: u32) -> Duration {
        let factor = 1u32.checked_shl(n.min(31)).unwrap_or(u32::MAX);
        self.policy
            .delay
            .checked_mul(factor)
            .unwrap_or(Duration::MAX)
            .min(self.policy.max_delay.max(self.policy.delay))
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use k8s4r_api::{DurationString, LocalRestart};

    fn budget(kind: TaskKind, attempts: u32, mode: LocalRestartMode) -> Budget {
        let template = TaskTemplate {
            kind,
            restart: Some(LocalRestart {
                attempts,
                interval: Some(DurationString("1m".into())),
                delay: Some(DurationString("1s".into())),
                max_delay: Some(DurationString("3s".into())),
                mode,
            }),
            ..TaskTemplate::default()
        };
        Budget::of(&template).unwrap()
    }

    #[test]
    fn waits_double_up_to_the_cap_and_fail_mode_ends_when_the_interval_is_full() {
        let mut b = budget(TaskKind::Service, 4, LocalRestartMode::Fail);
        let t0 = Instant::now();
        let waits: Vec<Option<Duration>> = (0..5)
            .map(|i| b.after_exit(false, Some(1), t0 + Duration::from_secs(i)))
            .collect();
        let s = Duration::from_secs;
        assert_eq!(waits, vec![Some(s(1)), Some(s(2)), Some(s(3)), Some(s(3)), None]);
        assert_eq!(b.last_exit_code, Some(1));
    }

    #[test]
    fn restarts_leave_the_interval_and_count_again() {
        let mut b = budget(TaskKind::Service, 1, LocalRestartMode::Fail);
        let t0 = Instant::now();
        assert!(b.after_exit(false, Some(2), t0).is_some());
        assert_eq!(b.after_exit(false, Some(2), t0 + Duration::from_secs(30)), None);
        // A minute after the first restart was due, the interval has room again.
        let later = t0 + Duration::from_secs(62);
        assert_eq!(b.after_exit(false, Some(2), later), Some(Duration::from_secs(1)));
    }

    #[test]
    fn delay_mode_waits_for_the_interval_instead_of_failing() {
        let mut b = budget(TaskKind::Service, 1, LocalRestartMode::Delay);
        let t0 = Instant::now();
        assert_eq!(b.after_exit(false, None, t0), Some(Duration::from_secs(1)));
        // The restart was due at t0+1s; it leaves the interval at t0+61s.
        let wait = b.after_exit(false, None, t0 + Duration::from_secs(11)).unwrap();
        assert_eq!(wait, Duration::from_secs(50));
    }

    #[test]
    fn a_batch_task_that_succeeded_ends_and_a_service_that_exited_0_restarts() {
        let now = Instant::now();
        assert_eq!(
            budget(TaskKind::Batch, 3, LocalRestartMode::Fail).after_exit(true, Some(0), now),
            None
        );
        assert!(budget(TaskKind::Batch, 3, LocalRestartMode::Fail)
            .after_exit(false, Some(1), now)
            .is_some());
        assert!(budget(TaskKind::Service, 3, LocalRestartMode::Fail)
            .after_exit(true, Some(0), now)
            .is_some());
    }

    #[test]
    fn only_services_and_tasks_that_ask_get_a_budget() {
        assert!(Budget::of(&TaskTemplate::default()).is_none());
        let service = TaskTemplate {
            kind: TaskKind::Service,
            ..TaskTemplate::default()
        };
        let b = Budget::of(&service).unwrap();
        assert_eq!(b.policy.attempts, 2);
        assert_eq!(b.policy.delay, Duration::from_secs(15));
    }

    #[test]
    fn no_attempts_in_fail_mode_never_restarts() {
        let mut b = budget(TaskKind::Service, 0, LocalRestartMode::Fail);
        assert_eq!(b.after_exit(false, Some(1), Instant::now()), None);
    }
}
