//! How an attempt ended, decided from the exit status and why the
//! supervisor stopped it (if it did), with every rule of the message a
//! person reads: a service that ends is a failure, restarts used up, output
//! not logged, a full disk. Pure: no processes, no files, no clock.

use std::process::ExitStatus;
use std::time::Duration;

use k8s4r_api::{TaskKind, TaskReason, TaskState};
use k8s4r_drivers::DriverError;
use nix::sys::signal::Signal;

/// The end of one attempt, as reported in `TaskEvent::Finished`.
#[derive(Clone, Debug, PartialEq)]
pub struct TaskOutcome {
    /// Completed or Failed.
    pub state: TaskState,
    /// The exit code; 128 + signal when a signal ended the process.
    pub exit_code: Option<i32>,
    /// The signal that ended the process, if one did.
    pub signal: Option<i32>,
    /// Why it ended.
    pub reason: TaskReason,
    /// Details for a person.
    pub message: String,
    /// When the process started (None if it never did).
    pub started_at: Option<jiff::Timestamp>,
    /// When the attempt ended.
    pub finished_at: jiff::Timestamp,
    /// The last bytes of stdout and stderr.
    pub output_tail: String,
}

/// Why the supervisor is stopping a task.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum StopCause {
    /// The task ran past its timeout.
    Timeout(Duration),
    /// Someone cancelled it.
    Cancelled(String),
    /// The agent is shutting down.
    Shutdown,
    /// Its directory outgrew what it may take on disk (the reason says how).
    DiskLimit(String),
    /// A health check failed too often in a row (the reason says which).
    /// `restart` may follow it with a restart, as after any failure.
    Unhealthy(String),
    /// The robot heard nothing from the cluster for the attempt's
    /// `disconnect.stopAfter` (the reason says how long).
    Disconnected(String),
    /// The robot is being drained (`k8s4r drain`): the task runs elsewhere.
    Drained(String),
    /// A `whileRunning: stop` condition no longer holds (the reason names
    /// it and the fact).
    ConditionLost(String),
    /// Its configuration changed and its `onConfigChange` is `restart`
    /// (the reason names the objects): it starts again at once, using
    /// none of its restarts.
    ConfigChanged(String),
}

impl StopCause {
    /// What a `preStop` action finds in `K8S4R_STOP_REASON`.
    pub(crate) fn env_name(&self) -> &'static str {
        match self {
            StopCause::Timeout(_) => "Timeout",
            StopCause::Cancelled(_) => "Cancelled",
            StopCause::Shutdown => "Shutdown",
            StopCause::DiskLimit(_) => "DiskLimit",
            StopCause::Unhealthy(_) => "Unhealthy",
            StopCause::Disconnected(_) => "Disconnected",
            StopCause::Drained(_) => "Drained",
            StopCause::ConditionLost(_) => "ConditionLost",
            StopCause::ConfigChanged(_) => "ConfigChanged",
        }
    }
}

/// How the process ended.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Exit {
    /// Its exit code, when it exited.
    pub code: Option<i32>,
    /// The signal that killed it, when one did.
    pub signal: Option<i32>,
}

impl From<ExitStatus> for Exit {
    fn from(status: ExitStatus) -> Self {
        use std::os::unix::process::ExitStatusExt;
        Exit {
            code: status.code(),
            signal: status.signal(),
        }
    }
}

/// The result part of an outcome (everything but times and output).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Verdict {
    /// Completed or Failed.
    pub state: TaskState,
    /// Why.
    pub reason: TaskReason,
    /// Exit code (128 + signal when signalled).
    pub exit_code: Option<i32>,
    /// The signal, when one ended the process.
    pub signal: Option<i32>,
    /// For a person.
    pub message: String,
}

/// Decides how an attempt ended. A task the supervisor stopped is Failed
/// with the stop's reason whatever its exit code: a process that exits 0
/// on SIGTERM after its deadline still timed out.
pub fn verdict(exit: Exit, stop: Option<&StopCause>, kill_timeout: Duration) -> Verdict {
    let exit_code = match (exit.code, exit.signal) {
        (Some(code), _) => Some(code),
        (None, Some(signal)) => Some(128 + signal),
        (None, None) => None,
    };
    let how = match (exit.code, exit.signal) {
        (_, Some(signal)) if signal == Signal::SIGKILL as i32 && stop.is_some() => format!(
            "killed by SIGKILL after the kill timeout of {}",
            k8s4r_api::duration::format_duration(kill_timeout)
        ),
        (_, Some(signal)) => format!("killed by signal {}", signal_name(signal)),
        (Some(code), None) => format!("exited with code {code}"),
        (None, None) => "ended with an unknown status".to_owned(),
    };
    let (state, reason, message) = match stop {
        Some(StopCause::Timeout(after)) => (
            TaskState::Failed,
            TaskReason::Timeout,
            format!(
                "timed out after {}: {how}",
                k8s4r_api::duration::format_duration(*after)
            ),
        ),
        Some(StopCause::Cancelled(why)) => (
            TaskState::Failed,
            TaskReason::Cancelled,
            format!("cancelled ({why}): {how}"),
        ),
        Some(StopCause::Shutdown) => (
            TaskState::Failed,
            TaskReason::AgentShutdown,
            format!("stopped by the agent as it shut down (a restart, an upgrade or a stop of k8s4r-agent): {how}"),
        ),
        Some(StopCause::DiskLimit(why)) => (
            TaskState::Failed,
            TaskReason::DiskLimit,
            format!("stopped: {why}: {how}"),
        ),
        Some(StopCause::Unhealthy(why)) => {
            (TaskState::Failed, TaskReason::Unhealthy, format!("{why}; {how}"))
        }
        Some(StopCause::Disconnected(why)) => (
            TaskState::Failed,
            TaskReason::Disconnected,
            format!("{why}: {how}"),
        ),
        Some(StopCause::Drained(why)) => (
            TaskState::Failed,
            TaskReason::Drained,
            format!("stopped: {why}: {how}"),
        ),
        Some(StopCause::ConditionLost(why)) => (
            TaskState::Failed,
            TaskReason::ConditionLost,
            format!("stopped: {why}: {how}"),
        ),
        // It ends only when the agent shuts down before starting it again.
        Some(StopCause::ConfigChanged(why)) => (
            TaskState::Failed,
            TaskReason::AgentShutdown,
            format!("stopped to restart with its new configuration ({why}), and the agent shut down: {how}"),
        ),
        None => match (exit.code, exit.signal) {
            (Some(0), None) => (TaskState::Completed, TaskReason::Completed, how),
            (_, Some(_)) => (TaskState::Failed, TaskReason::Signaled, how),
            _ => (TaskState::Failed, TaskReason::Error, how),
        },
    };
    Verdict {
        state,
        reason,
        exit_code,
        signal: exit.signal,
        message,
    }
}

/// What the runner knows of an attempt that will not run again, beyond its
/// exit: what the message rules read.
#[derive(Clone, Debug, Default)]
pub(crate) struct Ending<'a> {
    /// Why the supervisor stopped it, if it did.
    pub stop: Option<&'a StopCause>,
    /// Batch or service.
    pub kind: TaskKind,
    /// Its restarts on the robot so far.
    pub restarts: u32,
    /// The robot's disk was full (below the agent's reserve) at the last
    /// measurement: the free bytes then.
    pub disk_full: Option<u64>,
}

/// The final verdict of an attempt: [`verdict`], then the rules that only
/// apply once it will not run again.
pub(crate) fn final_verdict(exit: Exit, kill_timeout: Duration, ending: &Ending<'_>) -> Verdict {
    let mut v = verdict(exit, ending.stop, kill_timeout);
    let restarted = ending.restarts;
    if ending.stop.is_none() && ending.kind == TaskKind::Service {
        // A service that ends is a failure, however it exited.
        if v.state == TaskState::Completed {
            v.state = TaskState::Failed;
            v.reason = TaskReason::Error;
        }
        v.message.push_str(&format!(
            "; the service's restarts on the robot are used up ({restarted} so far)"
        ));
    } else if restarted > 0 && ending.stop.is_none() && v.state != TaskState::Completed {
        v.message.push_str(&format!(
            "; its restarts on the robot are used up ({restarted} so far)"
        ));
    }
    // A task that failed on a full disk should say so: it most likely
    // failed because of it.
    let disk_stop = matches!(ending.stop, Some(StopCause::DiskLimit(_)));
    if let (false, Some(free), false) = (v.state == TaskState::Completed, ending.disk_full, disk_stop) {
        v.message.push_str(&format!(
            "; the robot's disk was full when it ended ({} free)",
            super::disk::mib(free)
        ));
    }
    v
}

/// Whether the supervisor may start an attempt again on the robot after
/// this exit: it was not stopped on purpose (a failed health check is a
/// failure like any other), and the agent is not stopping.
pub(crate) fn may_restart(stop: Option<&StopCause>, shutting_down: bool) -> bool {
    matches!(
        stop,
        None | Some(StopCause::Unhealthy(_) | StopCause::ConfigChanged(_))
    ) && !shutting_down
}

/// When a stop found the attempt with no process (`waiting`: between two
/// runs on the robot; else still being prepared).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Unstarted {
    /// Being prepared or launched.
    Preparing,
    /// Waiting to be started again.
    Waiting,
}

/// The reason and message of an attempt stopped before (or between) its
/// runs.
pub(crate) fn unstarted(cause: &StopCause, when: Unstarted) -> (TaskReason, String) {
    let (before, stopped) = match when {
        Unstarted::Preparing => ("before it started", "stopped before it started"),
        Unstarted::Waiting => ("while waiting to restart", "stopped while waiting to restart"),
    };
    let message = match cause {
        StopCause::Cancelled(why) => format!("cancelled ({why}) {before}"),
        StopCause::Shutdown => {
            format!("{stopped}: the agent shut down (a restart, an upgrade or a stop of k8s4r-agent)")
        }
        StopCause::Timeout(_) => "timed out".to_owned(),
        StopCause::DiskLimit(why)
        | StopCause::Unhealthy(why)
        | StopCause::Disconnected(why)
        | StopCause::Drained(why)
        | StopCause::ConditionLost(why)
        | StopCause::ConfigChanged(why) => format!("{stopped}: {why}"),
    };
    let reason = match (cause, when) {
        (StopCause::DiskLimit(_), Unstarted::Waiting) => TaskReason::DiskLimit,
        (StopCause::Disconnected(_), _) => TaskReason::Disconnected,
        (StopCause::Drained(_), _) => TaskReason::Drained,
        (StopCause::Shutdown, _) => TaskReason::AgentShutdown,
        // It had not run yet: it waits for the robot to be ready again.
        (StopCause::ConditionLost(_), Unstarted::Preparing) => TaskReason::NotReady,
        (StopCause::ConditionLost(_), Unstarted::Waiting) => TaskReason::ConditionLost,
        _ => TaskReason::Cancelled,
    };
    (reason, message)
}

/// The reason of a start the driver refused.
pub(crate) fn driver_reason(e: &DriverError) -> TaskReason {
    if matches!(e, DriverError::ImageUnavailable { .. }) {
        TaskReason::ImageUnavailable
    } else if e.is_invalid_spec() {
        TaskReason::InvalidSpec
    } else if e.is_not_permitted() {
        TaskReason::NotPermitted
    } else {
        TaskReason::StartFailed
    }
}

/// A task that ended before it could run: bad spec, start failure, ...
pub(crate) fn failed_outcome(reason: TaskReason, message: String, tail: String) -> TaskOutcome {
    TaskOutcome {
        state: TaskState::Failed,
        exit_code: None,
        signal: None,
        reason,
        message,
        started_at: None,
        finished_at: jiff::Timestamp::now(),
        output_tail: tail,
    }
}

fn signal_name(signal: i32) -> String {
    match Signal::try_from(signal) {
        Ok(s) => format!("{} ({signal})", s.as_str()),
        Err(_) => signal.to_string(),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const KILL: Duration = Duration::from_secs(5);

    fn code(code: i32) -> Exit {
        Exit {
            code: Some(code),
            signal: None,
        }
    }

    fn signal(signal: Signal) -> Exit {
        Exit {
            code: None,
            signal: Some(signal as i32),
        }
    }

    #[test]
    fn exit_zero_completes() {
        let v = verdict(code(0), None, KILL);
        assert_eq!(
            (v.state, v.reason, v.exit_code),
            (TaskState::Completed, TaskReason::Completed, Some(0))
        );
    }

    #[test]
    fn non_zero_is_an_error() {
        let v = verdict(code(3), None, KILL);
        assert_eq!(
            (v.state, v.reason, v.exit_code),
            (TaskState::Failed, TaskReason::Error, Some(3))
        );
        assert_eq!(v.message, "exited with code 3");
    }

    #[test]
    fn unexpected_signal_is_signaled_with_128_plus() {
        let v = verdict(signal(Signal::SIGSEGV), None, KILL);
        assert_eq!(
            (v.reason, v.exit_code, v.signal),
            (TaskReason::Signaled, Some(139), Some(11))
        );
        assert!(v.message.contains("SIGSEGV"), "{}", v.message);
    }

    #[test]
    fn timeout_by_sigterm_is_143() {
        let stop = StopCause::Timeout(Duration::from_secs(2));
        let v = verdict(signal(Signal::SIGTERM), Some(&stop), KILL);
        assert_eq!(
            (v.reason, v.exit_code, v.signal),
            (TaskReason::Timeout, Some(143), Some(15))
        );
        assert_eq!(v.message, "timed out after 2s: killed by signal SIGTERM (15)");
    }

    #[test]
    fn timeout_by_sigkill_is_137() {
        let stop = StopCause::Timeout(Duration::from_secs(2));
        let v = verdict(signal(Signal::SIGKILL), Some(&stop), KILL);
        assert_eq!(
            (v.reason, v.exit_code, v.signal),
            (TaskReason::Timeout, Some(137), Some(9))
        );
        assert!(v.message.contains("kill timeout of 5s"), "{}", v.message);
    }

    #[test]
    fn clean_exit_after_sigterm_still_timed_out() {
        let stop = StopCause::Timeout(Duration::from_secs(1));
        let v = verdict(code(0), Some(&stop), KILL);
        assert_eq!(
            (v.state, v.reason, v.exit_code),
            (TaskState::Failed, TaskReason::Timeout, Some(0))
        );
    }

    #[test]
    fn a_disk_stop_says_why() {
        let stop = StopCause::DiskLimit("its directory grew to 9.0 MiB".to_owned());
        let v = verdict(signal(Signal::SIGKILL), Some(&stop), KILL);
        assert_eq!((v.reason, v.exit_code), (TaskReason::DiskLimit, Some(137)));
        assert!(
            v.message
                .starts_with("stopped: its directory grew to 9.0 MiB: killed"),
            "{}",
            v.message
        );
    }

    #[test]
    fn a_service_that_ends_has_failed_and_used_up_restarts_are_said() {
        let service = Ending {
            kind: TaskKind::Service,
            restarts: 2,
            ..Ending::default()
        };
        let v = final_verdict(code(0), KILL, &service);
        assert_eq!((v.state, v.reason), (TaskState::Failed, TaskReason::Error));
        assert!(
            v.message
                .ends_with("the service's restarts on the robot are used up (2 so far)"),
            "{}",
            v.message
        );
        let batch = Ending {
            restarts: 3,
            ..Ending::default()
        };
        let v = final_verdict(code(1), KILL, &batch);
        assert!(
            v.message
                .ends_with("its restarts on the robot are used up (3 so far)"),
            "{}",
            v.message
        );
        let v = final_verdict(code(0), KILL, &batch);
        assert_eq!(
            v.message, "exited with code 0",
            "a completed task says nothing more"
        );
    }

    #[test]
    fn a_full_disk_is_said() {
        let ending = Ending {
            disk_full: Some(1 << 20),
            ..Ending::default()
        };
        let v = final_verdict(code(2), KILL, &ending);
        assert!(
            v.message
                .ends_with("; the robot's disk was full when it ended (1.0 MiB free)"),
            "{}",
            v.message
        );
        let disk = StopCause::DiskLimit("too big".to_owned());
        let stopped = Ending {
            stop: Some(&disk),
            disk_full: Some(1 << 20),
            ..Ending::default()
        };
        let v = final_verdict(signal(Signal::SIGKILL), KILL, &stopped);
        assert!(
            !v.message.contains("disk was full"),
            "a disk stop says it already"
        );
    }

    #[test]
    fn unstarted_stops_say_when() {
        let cancelled = StopCause::Cancelled("deleted".to_owned());
        assert_eq!(
            unstarted(&cancelled, Unstarted::Preparing),
            (
                TaskReason::Cancelled,
                "cancelled (deleted) before it started".to_owned()
            )
        );
        let disk = StopCause::DiskLimit("too big".to_owned());
        assert_eq!(
            unstarted(&disk, Unstarted::Waiting),
            (
                TaskReason::DiskLimit,
                "stopped while waiting to restart: too big".to_owned()
            )
        );
        assert_eq!(unstarted(&disk, Unstarted::Preparing).0, TaskReason::Cancelled);
        assert!(may_restart(None, false) && !may_restart(None, true));
        assert!(!may_restart(Some(&cancelled), false));
    }

    #[test]
    fn a_cancel_says_cancelled_and_a_shutdown_says_the_agent_stopped_it() {
        let stop = StopCause::Cancelled("task deleted".to_owned());
        let v = verdict(signal(Signal::SIGTERM), Some(&stop), KILL);
        assert_eq!((v.reason, v.exit_code), (TaskReason::Cancelled, Some(143)));
        assert!(v.message.contains("task deleted"));
        let v = verdict(signal(Signal::SIGTERM), Some(&StopCause::Shutdown), KILL);
        assert_eq!(v.reason, TaskReason::AgentShutdown, "not a person's cancel");
        assert!(
            v.message.starts_with("stopped by the agent as it shut down"),
            "{}",
            v.message
        );
        let (reason, message) = unstarted(&StopCause::Shutdown, Unstarted::Preparing);
        assert_eq!(reason, TaskReason::AgentShutdown);
        assert!(message.contains("the agent shut down"), "{message}");
    }
}
