//! Settling the tasks a previous run of the agent left behind: kill what
//! survives of them and report how each ended: as its shim wrote it down
//! when it ended while no agent ran, else failed with reason
//! AgentRestarted (or AgentShutdown, when the unit's stop stopped it).

use k8s4r_api::{TaskReason, TaskState};
use k8s4r_drivers::TaskCgroup;
use nix::sys::signal::{killpg, Signal};
use nix::unistd::Pid;

use super::containment::Lineage;
use super::journal::Unfinished;
use super::logs::{files_tail, lossy_tail};
use super::outcome::{final_verdict, Ending, Exit};
use super::{procfs, TaskOutcome};
use k8s4r_api::TaskKind;
use std::os::unix::process::ExitStatusExt;
use std::time::Duration;

/// Kills what is left of `task` and says how it ended.
pub(crate) fn settle(
    task: &Unfinished,
    boot_id: &str,
    runtime_dir: &std::path::Path,
    tail_bytes: usize,
) -> TaskOutcome {
    let ended = ended_while_no_agent_ran(task, boot_id, runtime_dir);
    let message = kill_leftovers(task, boot_id);
    let tail = lossy_tail(&files_tail(&task.task_dir.join("logs"), tail_bytes));
    let started_at = task.started.as_ref().map(|s| s.started_at);
    let stopped_by_unit = read_stop_mark(&task.task_dir);
    match ended {
        // Its own end, unless the unit's stop ended it.
        Some(ended) if !stopped_by_unit => {
            let kind = task.resume.as_ref().map_or(TaskKind::Batch, |r| r.spec.kind);
            let ending = Ending {
                kind,
                ..Ending::default()
            };
            let exit = Exit::from(std::process::ExitStatus::from_raw(ended.wait_status()));
            let v = final_verdict(exit, Duration::ZERO, &ending);
            TaskOutcome {
                state: v.state,
                exit_code: v.exit_code,
                signal: v.signal,
                reason: v.reason,
                message: format!("{} while no agent ran", v.message),
                started_at,
                finished_at: jiff::Timestamp::now(),
                output_tail: tail,
            }
        }
        _ => TaskOutcome {
            state: TaskState::Failed,
            exit_code: None,
            signal: None,
            reason: match stopped_by_unit {
                true => TaskReason::AgentShutdown,
                false => TaskReason::AgentRestarted,
            },
            message: match stopped_by_unit {
                true => "stopped as the agent's unit stopped for good".to_owned(),
                false => message,
            },
            started_at,
            finished_at: jiff::Timestamp::now(),
            output_tail: tail,
        },
    }
}

/// How `task` ended, as its shim wrote it down, if it ended in this boot.
pub(crate) fn ended_while_no_agent_ran(
    task: &Unfinished,
    boot_id: &str,
    runtime_dir: &std::path::Path,
) -> Option<k8s4r_drivers::shim::Ended> {
    task.started.as_ref().filter(|s| s.boot_id == boot_id)?;
    k8s4r_drivers::shim::read_status(&super::exit_status_file(runtime_dir, &task.uid, task.attempt))
}

/// The mark `--stop-left-tasks` leaves on a task it stopped.
fn stop_mark(task_dir: &std::path::Path) -> std::path::PathBuf {
    task_dir.join("stopped-by-unit")
}

fn read_stop_mark(task_dir: &std::path::Path) -> bool {
    stop_mark(task_dir).exists()
}

/// Marks `task` as stopped by the unit's stop (its next report says
/// `AgentShutdown`, which uses no retry).
pub(crate) fn mark_stopped(task: &Unfinished) {
    if let Err(e) = std::fs::write(stop_mark(&task.task_dir), b"") {
        tracing::warn!(uid = %task.uid, attempt = task.attempt, error = %e, "cannot mark a task stopped by the unit");
    }
}

/// It runs (re-adopted, or started again): no stop of the unit ended it.
pub(crate) fn clear_stop_mark(task: &Unfinished) {
    let _ = std::fs::remove_file(stop_mark(&task.task_dir));
}

/// A leftover task asked to stop: its group and cgroup, and until when it
/// may take.
pub(crate) struct Asked {
    group: Pid,
    cgroup: Option<TaskCgroup>,
    until: std::time::Instant,
}

/// Asks what is left of `task` to stop as it asked to be stopped: its
/// stop signal to its process group; [`wait_for`] then gives it its kill
/// timeout and [`kill_leftovers`] does the rest. For `--stop-left-tasks`,
/// which systemd runs after the agent.
pub(crate) fn ask_to_stop(task: &Unfinished, boot_id: &str) -> Option<Asked> {
    let started = task.started.as_ref().filter(|s| s.boot_id == boot_id)?;
    let ours = procfs::stat(started.pid).is_some_and(|s| s.start_time == started.pid_start);
    if !ours {
        return None;
    }
    let ask = started.asks.unwrap_or_else(super::journal::StopAsk::default_ask);
    let signal = Signal::try_from(ask.signal).unwrap_or(Signal::SIGTERM);
    let group = Pid::from_raw(started.pgid);
    killpg(group, signal).ok()?;
    Some(Asked {
        group,
        cgroup: started.cgroup.clone().map(TaskCgroup::at),
        until: std::time::Instant::now() + std::time::Duration::from_millis(ask.kill_timeout_ms),
    })
}

/// Waits until every asked task's group and cgroup are empty, or its kill
/// timeout passed, all at once (the unit's stop timeout covers the longest
/// kill timeout, not their sum). Blocking; polled with a deadline, since
/// nothing tells a process outside our children that another has exited.
pub(crate) fn wait_for(mut asked: Vec<Asked>) {
    loop {
        let now = std::time::Instant::now();
        asked.retain(|a| {
            let group_alive = killpg(a.group, None).is_ok();
            let cgroup_alive = a
                .cgroup
                .as_ref()
                .is_some_and(|c| c.pids().is_ok_and(|p| !p.is_empty()));
            now < a.until && (group_alive || cgroup_alive)
        });
        if asked.is_empty() {
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
            // Under a shim the group is the command's: its leader, if any
            // is left, must be the command, not a process that took its pid.
            let group_ours = ours
                && (started.pgid == started.pid
                    || started.pgid_start == 0
                    || procfs::stat(started.pgid).is_none_or(|s| s.start_time == started.pgid_start));
            let mut killed = group_ours && killpg(Pid::from_raw(started.pgid), Signal::SIGKILL).is_ok();
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
