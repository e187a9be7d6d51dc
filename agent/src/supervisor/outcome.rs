//! How an attempt ended, decided from the exit status and why the
//! supervisor stopped it (if it did). Pure: no processes here.

use std::process::ExitStatus;
use std::time::Duration;

use k8s4r_api::{TaskReason, TaskState};
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
    /// The only stop that `restart` may follow with a restart.
    Unhealthy(String),
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
            TaskReason::Cancelled,
            "agent shutting down".to_owned(),
        ),
        Some(StopCause::DiskLimit(why)) => (
            TaskState::Failed,
            TaskReason::DiskLimit,
            format!("stopped: {why}: {how}"),
        ),
        Some(StopCause::Unhealthy(why)) => {
            (TaskState::Failed, TaskReason::Unhealthy, format!("{why}; {how}"))
        }
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
    fn cancel_and_shutdown_are_cancelled() {
        let stop = StopCause::Cancelled("task deleted".to_owned());
        let v = verdict(signal(Signal::SIGTERM), Some(&stop), KILL);
        assert_eq!((v.reason, v.exit_code), (TaskReason::Cancelled, Some(143)));
        assert!(v.message.contains("task deleted"));
        let v = verdict(signal(Signal::SIGTERM), Some(&StopCause::Shutdown), KILL);
        assert_eq!(
            (v.reason, v.message.as_str()),
            (TaskReason::Cancelled, "agent shutting down")
        );
    }
}
