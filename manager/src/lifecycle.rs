//! The Task lifecycle as the manager sees it: what to do next with a Task,
//! given its status, the health of its robot and the clock.
//!
//! Pure functions; the Task controller carries the decisions out.

use std::time::Duration;

use jiff::{SignedDuration, Timestamp};
use k8s4r_api::disconnect::fence_after;
use k8s4r_api::validation::{kill_timeout_of, timeout_of, DEFAULT_RESTART_DELAY, DEFAULT_RESTART_MAX_DELAY};
use k8s4r_api::{
    AttemptRecord, DisconnectPolicy, RestartPolicy, TaskReason, TaskSpec, TaskState, TaskStatus,
};

/// The timing rules of the lifecycle.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct LifecycleConfig {
    /// The deadline a dispatch is given: the robot refuses it later, and
    /// the server then fails the attempt (DispatchTimeout) from the robot's
    /// list of what it holds.
    pub dispatch_timeout: Duration,
    /// Slack added to the fencing time of a silent robot's attempt (its
    /// `stopAfter` plus kill timeout plus the server's lease interval), for
    /// clock skew between cluster machines and delivery.
    pub robot_lost_grace: Duration,
    /// How stale the record of a robot's last contact may be when it has no
    /// Lease to tell (its `lastHeartbeatTime`, which the server refreshes at
    /// most every `--idle-heartbeat-refresh` for an idle robot, 1800 s).
    pub unleased_record_lag: Duration,
    /// The servers' `--lease-interval`: how often they renew the Lease of a
    /// robot that holds work. A Lease is never read as renewed more often
    /// than this, whatever its `leaseDurationSeconds` says: a Lease someone
    /// else shortened does not bring a replacement earlier.
    pub lease_interval: Duration,
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
            unleased_record_lag: Duration::from_secs(1800),
            lease_interval: Duration::from_secs(60),
            backstop_grace: Duration::from_secs(60),
            lost_retries: 3,
        }
    }
}

/// How stale the record of a robot's last contact may be, from its Lease's
/// `leaseDurationSeconds` (None: no Lease): the server renews a Lease at
/// most every third of its duration, and never more often than at its
/// `lease_interval`, which is where this takes the floor from: a duration
/// another writer shortened moves no fence earlier.
pub fn record_lag(lease_duration_seconds: Option<i32>, cfg: &LifecycleConfig) -> Duration {
    lease_duration_seconds.map_or(cfg.unleased_record_lag, |s| {
        Duration::from_secs(u64::try_from(s).unwrap_or(0) / 3).max(cfg.lease_interval)
    })
}

/// What the manager knows about the robot a task is assigned to.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum RobotHealth {
    /// The Robot exists.
    Known {
        /// When the cluster last heard from it (heartbeat, Lease renewal or
        /// registration), by the cluster's clock; None: never.
        last_heard: Option<Timestamp>,
        /// How stale that record may be while the robot is fine: the
        /// server renews a robot's Lease at most this often.
        record_lag: Duration,
    },
    /// No such Robot: an administrator deleted it, saying it is gone.
    Missing,
}

impl RobotHealth {
    /// A robot heard from at `at`, recorded without lag (tests, mostly).
    pub fn heard_at(at: Timestamp) -> Self {
        RobotHealth::Known {
            last_heard: Some(at),
            record_lag: Duration::ZERO,
        }
    }
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
    /// The attempt ended without failing: its robot was not ready for it
    /// or was drained. Back to pending after `delay`, no retry used.
    Return {
        /// How it ended, as its record keeps it: `NotReady` or `Drained`.
        reason: TaskReason,
        /// The wait before the next attempt.
        delay: Duration,
    },
    /// Completed, or failed for good.
    Done,
}

/// Failures that are not the task's fault: they do not use up its restart
/// policy (they have their own budget, [`LifecycleConfig::lost_retries`],
/// or the template's `lostRetries`). `ConditionLost` is one: the robot's
/// state changed under the task (its e-stop pressed, its battery low), and
/// the robot stopped it; it has a budget of its own, `conditionRestarts`.
pub fn is_infrastructure(reason: Option<TaskReason>) -> bool {
    matches!(
        reason,
        Some(
            TaskReason::RobotLost
                | TaskReason::DispatchTimeout
                | TaskReason::Disconnected
                | TaskReason::NotOnRobot
                | TaskReason::OverCapacity
                | TaskReason::ConditionLost
        )
    )
}

/// Ends that are no failure at all: the robot was not ready for the task
/// (at admission its fresher facts failed a start condition), it was
/// drained, its agent stopped the attempt as it shut down (a restart, an
/// upgrade), or a ConfigMap or Secret (or key) it takes was gone as it was
/// dispatched, after it was placed (never sent). The task waits for a robot
/// again as a new attempt, using no retry of either budget. So does one
/// whose robot could not have its container image: it backs off as a
/// `NotReady` end does, preferring other robots, until the image can be
/// had.
pub fn is_returned(reason: Option<TaskReason>) -> bool {
    matches!(
        reason,
        Some(
            TaskReason::NotReady
                | TaskReason::Drained
                | TaskReason::AgentShutdown
                | TaskReason::ConfigMissing
                | TaskReason::ImageUnavailable
        )
    )
}

/// How the current attempt ended, as the budgets count it: one that was
/// being evicted (`k8s4r drain`) ended `Drained` whatever its end says (an
/// agent before drains answers a draining cancel with `Cancelled`; a robot
/// that went silent is fenced `RobotLost`; neither is the task's doing).
pub fn ended_as(status: &TaskStatus) -> Option<TaskReason> {
    if status.eviction_requested() {
        Some(TaskReason::Drained)
    } else {
        status.reason
    }
}

/// The wait after a robot refused an attempt as not ready, when it did so
/// fewer than [`NOT_READY_FREE`] times in a row: its facts as the cluster
/// knows them lag its own view, and the update is on its way (the agent
/// sends a change within 200 ms, and the server writes it at once).
pub const NOT_READY_DELAY: Duration = Duration::from_millis(250);
/// How many `NotReady` ends in a row wait only [`NOT_READY_DELAY`]; each
/// one after doubles the wait, up to [`NOT_READY_MAX_DELAY`], so that a
/// robot whose reported facts never catch up with its admission check does
/// not bounce the task once a second for ever (each bounce is an attempt).
pub const NOT_READY_FREE: u32 = 4;
/// The longest wait after a `NotReady` end.
pub const NOT_READY_MAX_DELAY: Duration = Duration::from_secs(60);

/// The wait before the next attempt of a task whose current attempt ended
/// `reason` ([`is_returned`]): none after a drain (the task goes elsewhere
/// at once); after `NotReady`, see [`NOT_READY_DELAY`].
fn return_delay(status: &TaskStatus, reason: Option<TaskReason>) -> Duration {
    // A robot whose agent is shutting down refuses the dispatches it still
    // gets as `AgentShutdown`: the same backoff keeps a long shutdown from
    // costing an attempt every quarter second; a configuration the server
    // could not resolve while the scheduler's cache still could backs off
    // alike until the cache has caught up.
    if !matches!(
        reason,
        Some(
            TaskReason::NotReady
                | TaskReason::AgentShutdown
                | TaskReason::ConfigMissing
                | TaskReason::ImageUnavailable
        )
    ) {
        return Duration::ZERO;
    }
    let in_a_row = status
        .attempts
        .iter()
        .rev()
        .take_while(|a| a.reason == reason)
        .count() as u32;
    let doublings = in_a_row.saturating_sub(NOT_READY_FREE - 1).min(31);
    NOT_READY_DELAY
        .checked_mul(1 << doublings)
        .unwrap_or(NOT_READY_MAX_DELAY)
        .min(NOT_READY_MAX_DELAY)
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

/// Whether the failed current attempt is retried (or, [`is_returned`],
/// goes back to pending without a retry), and after what delay.
pub fn retry_delay(
    status: &TaskStatus,
    policy: Option<&RestartPolicy>,
    cfg: &LifecycleConfig,
) -> Option<Duration> {
    if status.cancel_requested() {
        return None;
    }
    let ended = ended_as(status);
    if is_returned(ended) {
        return Some(return_delay(status, ended));
    }
    // A task that waited past its pending deadline fails for good: a retry
    // would only wait again. So does one whose configuration could not be
    // given to it as it was dispatched (too large for a dispatch, a value
    // that cannot be a variable): it would only be refused again.
    if matches!(
        ended,
        Some(
            TaskReason::InvalidSpec
                | TaskReason::Cancelled
                | TaskReason::Unschedulable
                | TaskReason::ConfigInvalid
        )
    ) {
        return None;
    }
    // A person's retry counts the budget afresh from the attempt it acted at;
    // attempts that returned use neither budget.
    let base = crate::manual::retry_base(status);
    let counted = || {
        status
            .attempts
            .iter()
            .filter(|a| a.attempt > base && !is_returned(a.reason))
    };
    let used = Used::count(counted());
    if ended == Some(TaskReason::ConditionLost) {
        // The robot did its job (an e-stop, a low battery): the next
        // attempt waits for the condition to hold again.
        return (used.condition < condition_restarts(policy)).then_some(Duration::ZERO);
    }
    if is_infrastructure(ended) {
        return (used.lost < lost_retries(policy, cfg)).then_some(Duration::ZERO);
    }
    let policy = policy?;
    (used.own < policy.attempts).then(|| backoff(policy, used.own))
}

/// The attempts each budget has paid for.
struct Used {
    own: u32,
    lost: u32,
    condition: u32,
}

impl Used {
    fn count<'a>(attempts: impl Iterator<Item = &'a AttemptRecord>) -> Used {
        let mut used = Used {
            own: 0,
            lost: 0,
            condition: 0,
        };
        for attempt in attempts {
            match attempt.reason {
                Some(TaskReason::ConditionLost) => used.condition += 1,
                reason if is_infrastructure(reason) => used.lost += 1,
                _ => used.own += 1,
            }
        }
        used
    }
}

/// The retries for attempts lost through no fault of the task: the
/// template's `restartPolicy.lostRetries`, else the manager's.
fn lost_retries(policy: Option<&RestartPolicy>, cfg: &LifecycleConfig) -> u32 {
    policy.and_then(|p| p.lost_retries).unwrap_or(cfg.lost_retries)
}

/// The new attempts after lost start conditions the template allows.
fn condition_restarts(policy: Option<&RestartPolicy>) -> u32 {
    policy
        .and_then(|p| p.condition_restarts)
        .unwrap_or(k8s4r_api::task::DEFAULT_CONDITION_RESTARTS)
}

/// When the failed current attempt is not retried because a budget ran
/// out, which one, in a sentence for an Event; None when it is retried, or
/// ends for another reason (a cancel, an invalid spec).
pub fn exhausted(
    status: &TaskStatus,
    policy: Option<&RestartPolicy>,
    cfg: &LifecycleConfig,
) -> Option<String> {
    if status.state != Some(TaskState::Failed) || retry_delay(status, policy, cfg).is_some() {
        return None;
    }
    let ended = ended_as(status);
    Some(match ended {
        Some(
            TaskReason::InvalidSpec
            | TaskReason::Cancelled
            | TaskReason::Unschedulable
            | TaskReason::ConfigInvalid,
        ) => return None,
        _ if status.cancel_requested() => return None,
        Some(TaskReason::ConditionLost) => format!(
            "its start conditions stopped holding {} times, its restartPolicy.conditionRestarts; the task fails",
            condition_restarts(policy) + 1
        ),
        reason if is_infrastructure(reason) => format!(
            "its {} retries for attempts lost with their robot are used up (restartPolicy.lostRetries, or the manager's --lost-retries); the task fails",
            lost_retries(policy, cfg)
        ),
        _ => format!(
            "its {} retries are used up (restartPolicy.attempts); the task fails",
            policy.map_or(0, |p| p.attempts)
        ),
    })
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

/// `t + d`, saturating at the end of time instead of overflowing.
pub fn plus(t: Timestamp, d: Duration) -> Timestamp {
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
        Some(TaskState::Completed | TaskState::Cancelled) => Step::Done,
        Some(TaskState::Failed) => match retry_delay(status, spec.restart_policy.as_ref(), cfg) {
            Some(delay) => match ended_as(status) {
                Some(reason) if is_returned(Some(reason)) => Step::Return { reason, delay },
                _ => Step::Retry { delay },
            },
            None => Step::Done,
        },
        Some(state @ (TaskState::Dispatching | TaskState::Running)) => {
            active_step(spec, status, state, robot, now, cfg)
        }
    }
}

/// When the attempt a silent robot holds is certainly stopped: the robot
/// stops it `stopAfter` after it last heard from the cluster (docs/fencing.md),
/// SIGKILL follows within the kill timeout, and the cluster's record of the
/// last contact may lag the real one by `record_lag` ([`record_lag`]); `robot_lost_grace`
/// covers clock skew between cluster machines.
fn fence_time(spec: &TaskSpec, heard: Timestamp, record_lag: Duration, cfg: &LifecycleConfig) -> Timestamp {
    let stop_after = DisconnectPolicy::stop_after(spec.disconnect.as_ref());
    let margin = record_lag.saturating_add(cfg.robot_lost_grace);
    plus(
        heard,
        fence_after(stop_after, kill_timeout_of(&spec.template), margin),
    )
}

/// The next step for an attempt that is dispatching or running.
fn active_step(
    spec: &TaskSpec,
    status: &TaskStatus,
    state: TaskState,
    robot: RobotHealth,
    now: Timestamp,
    cfg: &LifecycleConfig,
) -> Step {
    let robot_name = status
        .robot
        .as_deref()
        .or(spec.target_robot.as_deref())
        .unwrap_or("?");
    let (last_heard, record_lag) = match robot {
        RobotHealth::Missing => {
            return Step::Fail {
                reason: TaskReason::RobotLost,
                message: format!("robot {robot_name} no longer exists"),
            }
        }
        RobotHealth::Known {
            last_heard,
            record_lag,
        } => (last_heard, record_lag),
    };
    let heard = counted_from(last_heard, status, now);
    let fenced = attempt_fenced(spec, status, state, heard, record_lag, cfg);
    let replace = DisconnectPolicy::replace(spec.disconnect.as_ref(), spec.template.kind);
    if state == TaskState::Dispatching {
        // Only once the attempt is fenced: a robot that seemed silent may
        // have taken the dispatch while its contact was not yet recorded
        // (a server restarted in between), and failing the attempt early
        // would run it twice.
        if let Some(fail) = dispatch_expired(status, robot_name, last_heard, now, cfg) {
            if replace && fenced <= now {
                return fail;
            }
        }
    }
    let mut recheck = None;
    if replace {
        if fenced <= now {
            return Step::Fail {
                reason: TaskReason::RobotLost,
                message: format!(
                    "robot {robot_name} silent since {heard}; it stopped attempt {} itself after the group's disconnect.stopAfter",
                    status.attempt
                ),
            };
        }
        recheck = Some(until(now, fenced));
    }
    // A dispatch the robot never takes is failed by the server, from the
    // robot's own list (it refuses a dispatch after its deadline); a robot
    // that went quiet may have taken it in time, and is fenced above.
    let own = if state == TaskState::Dispatching {
        None
    } else {
        match backstop(spec, status, robot_name, now, cfg) {
            Ok(left) => left,
            Err(fail) => return fail,
        }
    };
    // Without replacement the attempt waits for its robot, however long.
    let idle = (!replace).then_some(Duration::from_secs(60));
    let expiry = dispatch_expiry(state, status, now, cfg);
    Step::Wait(earliest(earliest(earliest(recheck, own), idle), expiry))
}

/// When a silent robot's hold on an attempt is counted from: the later of
/// its last contact and this attempt's dispatch. The robot holds the
/// attempt no longer than stopAfter past its last contact, so this only
/// errs late. Counting from the contact alone would fail a fresh dispatch
/// to a robot quiet for longer than stopAfter at once, and burn every
/// retry in a burst.
fn counted_from(last_heard: Option<Timestamp>, status: &TaskStatus, now: Timestamp) -> Timestamp {
    match (last_heard, status.dispatch_time) {
        (Some(h), Some(d)) => Some(h.max(d)),
        (h, d) => h.or(d),
    }
    .unwrap_or(now)
}

/// How long until a dispatching attempt's deadline (plus the grace for
/// the robot's reckoning of the cluster's clock) passes: a fenced robot's
/// dispatch fails then (see dispatch_expired).
fn dispatch_expiry(
    state: TaskState,
    status: &TaskStatus,
    now: Timestamp,
    cfg: &LifecycleConfig,
) -> Option<Duration> {
    match (state, status.dispatch_deadline) {
        (TaskState::Dispatching, Some(d)) => {
            Some(until(now, plus(d, cfg.robot_lost_grace))).filter(|d| !d.is_zero())
        }
        _ => None,
    }
}

/// The `DispatchTimeout` of a dispatching attempt once the robot would
/// refuse it (its deadline plus `robot_lost_grace` for the robot's reckoning
/// of the cluster's clock), None before. The robot never said it took the
/// attempt: the message says so, not that the robot stopped it.
fn dispatch_expired(
    status: &TaskStatus,
    robot_name: &str,
    last_heard: Option<Timestamp>,
    now: Timestamp,
    cfg: &LifecycleConfig,
) -> Option<Step> {
    let deadline = status.dispatch_deadline?;
    if plus(deadline, cfg.robot_lost_grace) > now {
        return None;
    }
    let heard = match last_heard {
        Some(h) => format!("last heard from at {h}"),
        None => "never heard from".to_owned(),
    };
    Some(Step::Fail {
        reason: TaskReason::DispatchTimeout,
        message: format!(
            "robot {robot_name} did not acknowledge attempt {} before its dispatch deadline {deadline} ({heard})",
            status.attempt
        ),
    })
}

/// The `DispatchTimeout` of a dispatching attempt that no server began to
/// send (`sent`: the highest attempt a server recorded on the Task as being
/// sent, [`k8s4r_api::task::sent_attempt`]) once its deadline plus
/// `robot_lost_grace` has passed, whatever the health of its robot: a
/// server writes that record before it publishes, so no robot holds the
/// attempt, and after the deadline none would take it. Without this the
/// attempt would wait for a server to fail it from its robot's list of what
/// it holds, which a server reads only for the Tasks its cache shows on the
/// robot: a server behind its Task watch (a burst at 100,000 robots left
/// thousands so) never would. The write is guarded by the Task's version,
/// so a server that records the sending meanwhile makes it fail.
pub fn never_sent(
    status: Option<&TaskStatus>,
    sent: u32,
    now: Timestamp,
    cfg: &LifecycleConfig,
) -> Option<Step> {
    let status = status?;
    let deadline = status.dispatch_deadline?;
    let unsent = status.state == Some(TaskState::Dispatching) && status.attempt >= 1 && sent < status.attempt;
    if !unsent || plus(deadline, cfg.robot_lost_grace) > now {
        return None;
    }
    let robot = status.robot.as_deref().unwrap_or("?");
    Some(Step::Fail {
        reason: TaskReason::DispatchTimeout,
        message: format!(
            "attempt {} was never sent to robot {robot}: its dispatch deadline {deadline} passed first (the server was behind)",
            status.attempt
        ),
    })
}

/// When the attempt of a robot last `heard` from is certainly stopped (see
/// [`fence_time`]).
fn attempt_fenced(
    spec: &TaskSpec,
    status: &TaskStatus,
    state: TaskState,
    heard: Timestamp,
    record_lag: Duration,
    cfg: &LifecycleConfig,
) -> Timestamp {
    let fenced = fence_time(spec, heard, record_lag, cfg);
    // A dispatch the robot has not taken may still be waiting for it (in
    // its broker session while it was cut off): the robot takes it, with
    // fresh contact, whenever it comes back before the deadline, so a
    // silent robot's dispatch is fenced only once the deadline has passed
    // too (robot_lost_grace covers the robot's reckoning of the server's
    // clock, which errs early by the delay of its freshest answer).
    match (state, status.dispatch_deadline) {
        (TaskState::Dispatching, Some(deadline)) => fenced.max(plus(deadline, cfg.robot_lost_grace)),
        _ => fenced,
    }
}

/// The backstop for a running attempt whose robot never reports its end:
/// how long until it applies (`None`: the task has no timeout, or has not
/// started), or the failure once it does.
fn backstop(
    spec: &TaskSpec,
    status: &TaskStatus,
    robot_name: &str,
    now: Timestamp,
    cfg: &LifecycleConfig,
) -> Result<Option<Duration>, Step> {
    let since = status.observed_running_time.or(status.start_time);
    let (Some(timeout), Some(since)) = (timeout_of(&spec.template), since) else {
        return Ok(None);
    };
    let limit = timeout
        .saturating_add(kill_timeout_of(&spec.template))
        .saturating_add(cfg.backstop_grace);
    let deadline = plus(since, limit);
    if deadline <= now {
        return Err(Step::Fail {
            reason: TaskReason::TimeoutBackstop,
            message: format!(
                "robot {robot_name} reported no end {}s after the {}s timeout",
                limit.saturating_sub(timeout).as_secs(),
                timeout.as_secs()
            ),
        });
    }
    Ok(Some(until(now, deadline)))
}

#[cfg(test)]
mod tests;
