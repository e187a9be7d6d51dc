//! Starting a prepared task, off the supervisor's thread: its cgroup, its
//! output, and the fork and exec of its process. A spawn returns only once
//! the child has run its pre-exec set-up and exec'd, which took 4.5 ms at
//! the median and up to 407 ms under load when the runner did it itself
//! (BENCHMARKS.md): every deadline due meanwhile waited.

use std::path::{Path, PathBuf};
use std::sync::Arc;

use k8s4r_api::{names, TaskReason, TaskTemplate};
use k8s4r_drivers::{Cgroups, Launch, Prepared, TaskCgroup};

use super::containment::Lineage;
use super::journal;
use super::logs::Stream;
use super::outcome::driver_reason;
use super::output::{self, PipeFd};
use super::process::{BoxFuture, Launcher, Process};
use super::reaper::OwnedPids;
use super::table::{Running, Task};
use super::{procfs, Restarted};

/// Everything a start takes, owned.
pub(crate) struct LaunchJob {
    /// Its cgroup's name (a restart gets a new one).
    pub cgroup_name: String,
    pub cgroups: Option<Cgroups>,
    /// A service writes to its log files itself.
    pub service: bool,
    pub logs_dir: PathBuf,
    pub launcher: Arc<dyn Launcher>,
    pub template: TaskTemplate,
    pub prepared: Prepared,
    pub env: Vec<(String, String)>,
    pub owned: OwnedPids,
}

/// A started process and what was set up for it.
pub(crate) struct Launched {
    pub process: Process,
    pub cgroup: Option<TaskCgroup>,
    /// The read ends of its pipes (none for a service).
    pub piped: Option<(PipeFd, PipeFd)>,
    /// The leader's start time in clock ticks.
    pub pid_start: u64,
    pub prepared: Prepared,
    pub at: jiff::Timestamp,
    pub now: tokio::time::Instant,
}

/// Why a start failed.
pub(crate) type Refused = (TaskReason, String);

/// Starts the task of `job` (blocking: on the blocking pool).
pub(crate) fn launch(job: LaunchJob) -> Result<Launched, Refused> {
    let cgroup = job.cgroups.as_ref().and_then(|c| match c.create(&job.cgroup_name) {
        Ok(cgroup) => Some(cgroup),
        Err(e) => {
            tracing::warn!(task = %job.cgroup_name, error = %e, "cannot create the task's cgroup; its processes are found through /proc");
            None
        }
    });
    // A service writes to its log files itself, so that its output reaches
    // the disk while no agent runs (an agent restart leaves it running);
    // other tasks' output passes through the agent.
    let outputs = if job.service {
        open_log_files(&job.logs_dir).map(|(out, err)| (None, out, err))
    } else {
        output::pipe()
            .and_then(|out| Ok((out, output::pipe()?)))
            .map(|((out, out_w), (err, err_w))| (Some((out, err)), out_w, err_w))
    };
    let (piped, stdout, stderr) = match outputs {
        Ok(outputs) => outputs,
        Err(e) => {
            remove_cgroup(cgroup.as_ref());
            return Err((
                TaskReason::StartFailed,
                format!("cannot set up the task's output: {e}"),
            ));
        }
    };
    let launched = job.launcher.start(Launch {
        template: &job.template,
        prepared: &job.prepared,
        extra_env: &job.env,
        stdout,
        stderr,
        cgroup: cgroup.as_ref(),
    });
    let process = match launched {
        Ok(process) => process,
        Err(e) => {
            remove_cgroup(cgroup.as_ref());
            return Err((driver_reason(&e), e.to_string()));
        }
    };
    let now = tokio::time::Instant::now();
    let at = jiff::Timestamp::now();
    let pid = process.pid as i32;
    job.owned.insert(pid);
    let pid_start = procfs::stat(pid).map(|s| s.start_time).unwrap_or(0);
    Ok(Launched {
        process,
        cgroup,
        piped,
        pid_start,
        prepared: job.prepared,
        at,
        now,
    })
}

/// A started process, handed to its task.
pub(crate) struct HandedOver {
    /// What the journal records of it.
    pub record: journal::Started,
    /// What the table holds of it.
    pub running: Running,
    /// Resolves when it has exited and is reaped.
    pub exit: BoxFuture<std::io::Result<std::process::ExitStatus>>,
    /// Its pipes, to read (none for a service).
    pub piped: Option<(PipeFd, PipeFd)>,
    /// When it started, for its timeout.
    pub now: tokio::time::Instant,
    /// The restart on the robot it is, if it is one.
    pub restarted: Option<Restarted>,
    pub pid: u32,
    pub at: jiff::Timestamp,
}

/// Gives `task` what it keeps of its process (`restarting`: a restart on
/// the robot): its cgroup, pipes and preparation, and what the journal and
/// the table record of it.
pub(crate) fn hand_over(task: &mut Task, restarting: bool, boot_id: &str, launched: Launched) -> HandedOver {
    let Launched {
        process,
        cgroup,
        piped,
        pid_start,
        prepared,
        at,
        now,
    } = launched;
    let pid = process.pid as i32;
    let record = journal::Started {
        pid,
        pgid: process.pgid,
        pid_start,
        boot_id: boot_id.to_owned(),
        cgroup: cgroup.as_ref().map(|c| c.path().to_path_buf()),
        task_uid: task.own_uid,
        started_at: at,
        restarts: task
            .restarts
            .as_ref()
            .map_or(0, |b| b.count + u32::from(restarting)),
    };
    let lineage = cgroup
        .is_none()
        .then(|| Lineage::new(pid, pid_start, task.own_uid, &task.uid, task.attempt));
    task.cgroup = cgroup;
    task.stdout = piped.as_ref().map(|(out, _)| out.clone());
    task.stderr = piped.as_ref().map(|(_, err)| err.clone());
    task.resumed = false;
    let restarted = task
        .restarts
        .as_mut()
        .filter(|_| restarting)
        .map(|budget| budget.restarted(at));
    if task.restarts.is_some() || !task.checks.is_empty() {
        task.prepared = Some(prepared);
    }
    HandedOver {
        running: Running {
            pid,
            pgid: process.pgid,
            started: record.clone(),
            group: process.group,
            lineage,
        },
        record,
        exit: process.exit,
        piped,
        now,
        restarted,
        pid: process.pid,
        at,
    }
}

/// The variables the agent adds to a task's environment (and its exec
/// checks').
pub(crate) fn task_env(
    uid: &str,
    attempt: u32,
    name: &str,
    task_dir: &Path,
    robot_id: &str,
) -> Vec<(String, String)> {
    let mut env = vec![
        (names::ENV_TASK_UID.to_owned(), uid.to_owned()),
        (names::ENV_TASK_ATTEMPT.to_owned(), attempt.to_string()),
        (names::ENV_TASK_NAME.to_owned(), name.to_owned()),
        (names::ENV_TASK_DIR.to_owned(), task_dir.display().to_string()),
    ];
    if !robot_id.is_empty() {
        env.push((names::ENV_ROBOT_ID.to_owned(), robot_id.to_owned()));
    }
    env
}

fn remove_cgroup(cgroup: Option<&TaskCgroup>) {
    if let Some(cgroup) = cgroup {
        let _ = cgroup.remove();
    }
}

/// A service's log files, opened for it to append to.
fn open_log_files(logs_dir: &Path) -> std::io::Result<(std::os::fd::OwnedFd, std::os::fd::OwnedFd)> {
    use std::os::unix::fs::OpenOptionsExt;
    let open = |stream: Stream| {
        std::fs::OpenOptions::new()
            .create(true)
            .append(true)
            .mode(0o600)
            .custom_flags(nix::libc::O_NOFOLLOW)
            .open(logs_dir.join(stream.file_name()))
            .map(std::os::fd::OwnedFd::from)
    };
    Ok((open(Stream::Stdout)?, open(Stream::Stderr)?))
}
