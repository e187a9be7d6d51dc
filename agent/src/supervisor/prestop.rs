//! A task's `preStop` action: its command run as the task runs (its
//! driver, user, directory, environment and cgroup), with the stop's
//! reason in `K8S4R_STOP_REASON`, its output appended to the task's log
//! files, and cut at its timeout. The runner runs it once per stop, before
//! the stop signal; whatever it did, the stop goes on.

use std::path::PathBuf;
use std::time::Duration;

use k8s4r_api::TaskTemplate;

use super::checks::{launch_as_task, AsTask};
use super::launching::open_log_files;
use super::outcome::{verdict, Exit};
use super::process::{wait_at_most, Process, Waited};

/// The variable that tells a `preStop` why its task is stopping.
pub(crate) const ENV_STOP_REASON: &str = "K8S4R_STOP_REASON";

/// What a `preStop` runs: the task's own spec with the action's command.
pub(crate) fn template_of(task: &TaskTemplate) -> Option<TaskTemplate> {
    let pre_stop = task.pre_stop.as_ref()?;
    Some(TaskTemplate {
        command: pre_stop.command.clone(),
        args: pre_stop.args.clone(),
        ..task.clone()
    })
}

/// Runs a `preStop` to its end or its `timeout`: the pid it ran as (now
/// reaped), and how it went (Err says what went wrong, for the task's
/// status).
pub(crate) async fn run(
    task: AsTask,
    logs_dir: PathBuf,
    timeout: Duration,
) -> (Option<i32>, Result<(), String>) {
    let start = move || {
        let outputs =
            open_log_files(&logs_dir).map_err(|e| format!("cannot open the task's log files: {e}"))?;
        launch_as_task(task, outputs)
    };
    // Its fork and exec wait on the blocking pool, not on the loop.
    match tokio::task::spawn_blocking(start).await {
        Ok(Ok(process)) => {
            let pid = process.pid as i32;
            (Some(pid), wait(process, timeout).await)
        }
        Ok(Err(why)) => (None, Err(format!("could not start: {why}"))),
        Err(e) => (None, Err(format!("could not start: {e}"))),
    }
}

/// Waits for a `preStop`'s process; kills (and reaps) it at `timeout`.
async fn wait(process: Process, timeout: Duration) -> Result<(), String> {
    match wait_at_most(process, timeout).await {
        Waited::Exited(status) if status.success() => Ok(()),
        Waited::Exited(status) => Err(verdict(Exit::from(status), None, Duration::ZERO).message),
        Waited::Failed(e) => Err(format!("cannot wait for it: {e}")),
        Waited::TimedOut => Err(format!(
            "did not finish within {}",
            k8s4r_api::duration::format_duration(timeout)
        )),
    }
}
