//! Settling the tasks a previous run of the agent left behind: kill what
//! survives of them and report each as failed with reason AgentRestarted.

use k8s4r_api::{TaskReason, TaskState};
use k8s4r_drivers::TaskCgroup;
use nix::sys::signal::{killpg, Signal};
use nix::unistd::Pid;

use super::containment::Lineage;
use super::journal::Unfinished;
use super::logs::files_tail;
use super::output::lossy_tail;
use super::{procfs, TaskOutcome};

/// Kills what is left of `task` and says how it ended.
pub(crate) fn settle(task: &Unfinished, boot_id: &str, tail_bytes: usize) -> TaskOutcome {
    let message = kill_leftovers(task, boot_id);
    let tail = files_tail(&task.task_dir.join("logs"), tail_bytes);
    TaskOutcome {
        state: TaskState::Failed,
        exit_code: None,
        signal: None,
        reason: TaskReason::AgentRestarted,
        message,
        started_at: task.started.as_ref().map(|s| s.started_at),
        finished_at: jiff::Timestamp::now(),
        output_tail: lossy_tail(&tail),
    }
}

/// Asks what is left of `task` to stop as it asked to be stopped: its
/// stop signal to its process group, then up to its kill timeout for the
/// group (and its cgroup) to empty. [`kill_leftovers`] does the rest.
/// Blocking: for `--stop-left-tasks`, which systemd runs after the agent.
pub(crate) fn ask_leftovers_to_stop(task: &Unfinished, boot_id: &str) {
    let Some(started) = task.started.as_ref().filter(|s| s.boot_id == boot_id) else {
        return;
    };
    let ours = procfs::stat(started.pid).is_some_and(|s| s.start_time == started.pid_start);
    if !ours {
        return;
    }
    let ask = started.asks.unwrap_or(super::journal::StopAsk {
        signal: Signal::SIGTERM as i32,
        kill_timeout_ms: 5_000,
    });
    let signal = Signal::try_from(ask.signal).unwrap_or(Signal::SIGTERM);
    let group = Pid::from_raw(started.pgid);
    if killpg(group, signal).is_err() {
        return;
    }
    let cgroup = started.cgroup.clone().map(TaskCgroup::at);
    let deadline = std::time::Instant::now() + std::time::Duration::from_millis(ask.kill_timeout_ms);
    // Polled with a deadline: nothing tells a process outside our children
    // that another has exited.
    while std::time::Instant::now() < deadline {
        let group_alive = killpg(group, None).is_ok();
        let cgroup_alive = cgroup
            .as_ref()
            .is_some_and(|c| c.pids().is_ok_and(|p| !p.is_empty()));
        if !group_alive && !cgroup_alive {
            return;
        }
        std::thread::sleep(std::time::Duration::from_millis(50));
    }
}

/// Kills what is left of `task`'s processes; says what it found.
pub(crate) fn kill_leftovers(task: &Unfinished, boot_id: &str) -> String {
    match &task.started {
        None => "the agent restarted before the task started".to_owned(),
        Some(started) if started.boot_id != boot_id => "the robot rebooted while the task ran".to_owned(),
        Some(started) => {
            if let Some(path) = &started.cgroup {
                let cgroup = TaskCgroup::at(path.clone());
                if let Err(e) = cgroup.kill() {
                    tracing::warn!(cgroup = %path.display(), error = %e, "cannot kill a leftover task cgroup");
                }
                let _ = cgroup.remove();
            }
            // The pid cannot be reused while its process group has members,
            // so a missing leader means any member of the group is ours; a
            // leader with another start time means the group is someone
            // else's now.
            let ours = procfs::stat(started.pid).is_none_or(|s| s.start_time == started.pid_start);
            let mut killed = ours && killpg(Pid::from_raw(started.pgid), Signal::SIGKILL).is_ok();
            // What left the group: its session, children, its own uid,
            // orphans (now init's) whose environment names the task.
            if ours {
                let mut lineage = Lineage::new(
                    started.pid,
                    started.pid_start,
                    started.task_uid,
                    &task.uid,
                    task.attempt,
                );
                let members = lineage.members(&procfs::snapshot(), 1, procfs::real_uid, procfs::environ_has);
                for pid in members {
                    killed |= nix::sys::signal::kill(Pid::from_raw(pid), Signal::SIGKILL).is_ok();
                }
            }
            if killed {
                format!(
                    "the agent restarted while the task ran; its process group {} was killed",
                    started.pgid
                )
            } else {
                "the agent restarted while the task ran; its processes had already exited".to_owned()
            }
        }
    }
}
