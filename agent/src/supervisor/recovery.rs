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
