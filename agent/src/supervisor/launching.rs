//! Starting a prepared task, off the supervisor's thread: its cgroup, its
//! output, and the fork and exec of its process. A spawn returns only once
//! the child has run its pre-exec set-up and exec'd, which took 4.5 ms at
//! the median and up to 407 ms under load when the runner did it itself
//! (BENCHMARKS.md): every deadline due meanwhile waited.

use std::os::fd::OwnedFd;
use std::path::{Path, PathBuf};
use std::sync::Arc;

use k8s4r_api::{names, TaskReason, TaskTemplate};
use k8s4r_drivers::{Cgroups, Launch, Prepared, TaskCgroup};

use super::containment::Lineage;
use super::journal;
use super::logs::Stream;
use super::outcome::driver_reason;
use super::process::{BoxFuture, Launcher, Process};
use super::reaper::OwnedPids;
use super::table::{Running, Task};
use super::{procfs, Restarted};

/// Everything a start takes, owned.
pub(crate) struct LaunchJob {
    /// Its cgroup's name (a restart gets a new one).
    pub cgroup_name: String,
    pub cgroups: Option<Cgroups>,
    pub logs_dir: PathBuf,
    pub launcher: Arc<dyn Launcher>,
    pub template: TaskTemplate,
    pub prepared: Prepared,
    pub env: Vec<(String, String)>,
    pub owned: OwnedPids,
    /// The shim to start the command under, if any; its program is the
    /// task's logger too.
    pub shim: Option<k8s4r_drivers::shim::Shim>,
    /// The caps of each log file: bytes, and files kept.
    pub log_caps: (u64, u32),
}

/// A started process and what was set up for it.
pub(crate) struct Launched {
    pub process: Process,
    pub cgroup: Option<TaskCgroup>,
    /// The task's logger, when it has one.
    pub logger: Option<tokio::process::Child>,
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
    // A run before this one (a restart on the robot) may have left its end.
    if let Some(shim) = &job.shim {
        let _ = std::fs::remove_file(&shim.status_file);
    }
    // The task's output never passes through the agent: its logger writes
    // it (or, without one, the task itself), so that it reaches the disk
    // while no agent runs (an agent restart leaves it running).
    let outputs = match &job.shim {
        Some(shim) => logged(&shim.program, &job.logs_dir, job.log_caps, &job.owned),
        None => open_log_files(&job.logs_dir).map(|(out, err)| (out, err, None)),
    };
    let (stdout, stderr, logger) = match outputs {
        Ok(outputs) => outputs,
        Err(e) => {
            remove_cgroup(cgroup.as_ref());
            return Err((
                TaskReason::StartFailed,
                format!("cannot set up the task's output: {e}"),
            ));
        }
    };
    let launched = job.owned.spawn(
        || {
            job.launcher.start(Launch {
                template: &job.template,
                prepared: &job.prepared,
                extra_env: &job.env,
                stdout,
                stderr,
                cgroup: cgroup.as_ref(),
                shim: job.shim.as_ref(),
                stdin: None,
                terminal: false,
                beside_task: false,
            })
        },
        |process| process.pid as i32,
    );
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
    let pid_start = procfs::stat(pid).map(|s| s.start_time).unwrap_or(0);
    Ok(Launched {
        process,
        cgroup,
        logger,
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
    /// When it started, for its timeout.
    pub now: tokio::time::Instant,
    /// The restart on the robot it is, if it is one.
    pub restarted: Option<Restarted>,
    pub pid: u32,
    pub at: jiff::Timestamp,
}

/// Gives `task` what it keeps of its process (`restarting`: a restart on
/// the robot): its cgroup and preparation, and what the journal and
/// the table record of it.
pub(crate) fn hand_over(task: &mut Task, restarting: bool, boot_id: &str, launched: Launched) -> HandedOver {
    let Launched {
        process,
        cgroup,
        logger,
        pid_start,
        prepared,
        at,
        now,
    } = launched;
    let pid = process.pid as i32;
    let pgid_start = match process.pgid == pid {
        true => pid_start,
        false => procfs::stat(process.pgid).map_or(0, |s| s.start_time),
    };
    let record = journal::Started {
        pid,
        pgid: process.pgid,
        pid_start,
        pgid_start,
        logger: logger.is_some(),
        boot_id: boot_id.to_owned(),
        cgroup: cgroup.as_ref().map(|c| c.path().to_path_buf()),
        task_uid: task.own_uid,
        started_at: at,
        restarts: task
            .restarts
            .as_ref()
            .map_or(0, |b| b.count + u32::from(restarting)),
        asks: journal::StopAsk::of(task.stop_signal, task.kill_timeout),
    };
    let lineage = cgroup
        .is_none()
        .then(|| Lineage::new(pid, pid_start, task.own_uid, &task.uid, task.attempt));
    task.cgroup = cgroup;
    task.own_logs = logger.is_none();
    task.logger = logger;
    task.resumed = false;
    let restarted = task
        .restarts
        .as_mut()
        .filter(|_| restarting)
        .map(|budget| budget.restarted(at));
    // Kept for what runs again as the task: a restart, exec checks, its
    // preStop, an exec session from the cluster.
    task.prepared = Some(prepared);
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
        now,
        restarted,
        // The command's: it leads its group (its shim, if any, does not).
        pid: process.pgid as u32,
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

/// Pipes for a task's output and its logger, which reads them: the write
/// ends, for the task, and the logger.
/// The logger's pid is the supervisor's (`owned`) until its end is waited
/// for: the orphan reaper must not take it.
fn logged(
    program: &Path,
    logs_dir: &Path,
    (max_bytes, max_files): (u64, u32),
    owned: &OwnedPids,
) -> std::io::Result<(OwnedFd, OwnedFd, Option<tokio::process::Child>)> {
    let (out_r, out_w) = nix::unistd::pipe2(nix::fcntl::OFlag::O_CLOEXEC)?;
    let (err_r, err_w) = nix::unistd::pipe2(nix::fcntl::OFlag::O_CLOEXEC)?;
    let args = crate::logger::args(logs_dir, max_bytes, max_files);
    let logger = owned.spawn(
        || k8s4r_drivers::shim::spawn_logger(program, &args, out_r, err_r),
        |child| child.id().map_or(0, |pid| pid as i32),
    )?;
    Ok((out_w, err_w, Some(logger)))
}

/// A task's log files, opened for it to append to (a task with no logger).
pub(crate) fn open_log_files(logs_dir: &Path) -> std::io::Result<(OwnedFd, OwnedFd)> {
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

#[cfg(test)]
mod tests {
    use std::os::unix::fs::PermissionsExt;

    use futures::future::AbortHandle;
    use k8s4r_api::TaskKind;
    use k8s4r_drivers::DriverError;

    use super::*;
    use crate::supervisor::fake::{self, FakeDriver};
    use crate::supervisor::procfs::Stat;
    use crate::supervisor::table::NewTask;

    const UID: &str = "launch-test";

    fn template(command: &str, kind: TaskKind) -> TaskTemplate {
        TaskTemplate {
            driver: fake::DRIVER.into(),
            command: command.into(),
            args: vec!["hello".into(), "robot".into()],
            kind,
            ..TaskTemplate::default()
        }
    }

    /// The task, being prepared, that a start is handed to.
    fn task(template: TaskTemplate, own_uid: Option<u32>) -> Task {
        let new = NewTask {
            uid: UID.into(),
            attempt: 1,
            name: "nav".into(),
            dir: PathBuf::from("/t"),
            template,
            driver: 0,
            own_uid,
        };
        Task::preparing(new, AbortHandle::new_pair().0)
    }

    /// A start of `template` by the fake driver, without a cgroup.
    fn job(fake: &FakeDriver, template: TaskTemplate, logs_dir: &Path) -> LaunchJob {
        let prepared = fake.prepare(&template, Path::new("/t/work"), None).unwrap();
        LaunchJob {
            cgroup_name: format!("{UID}-1"),
            cgroups: None,
            logs_dir: logs_dir.to_path_buf(),
            launcher: Arc::new(fake.clone()),
            template,
            prepared,
            env: task_env(UID, 1, "nav", Path::new("/t"), ""),
            owned: OwnedPids::default(),
            shim: None,
            log_caps: (1 << 20, 2),
        }
    }

    fn launched(job: LaunchJob) -> Launched {
        launch(job).unwrap_or_else(|(reason, message)| panic!("refused ({reason:?}): {message}"))
    }

    #[test]
    fn the_task_env_names_the_task_and_the_robot() {
        let pairs =
            |env: Vec<(String, String)>| env.iter().map(|(k, v)| format!("{k}={v}")).collect::<Vec<_>>();
        assert_eq!(
            pairs(task_env(
                "u-1",
                3,
                "nav",
                Path::new("/state/tasks/u-1-3"),
                "robot-7"
            )),
            vec![
                "K8S4R_TASK_UID=u-1",
                "K8S4R_TASK_ATTEMPT=3",
                "K8S4R_TASK_NAME=nav",
                "K8S4R_TASK_DIR=/state/tasks/u-1-3",
                "K8S4R_ROBOT_ID=robot-7",
            ]
        );
        let without_robot = pairs(task_env("u-1", 3, "nav", Path::new("/t"), ""));
        assert_eq!(without_robot.len(), 4);
        assert!(!without_robot.iter().any(|v| v.starts_with("K8S4R_ROBOT_ID=")));
    }

    #[tokio::test]
    async fn a_started_process_is_handed_to_its_task_with_its_lineage() {
        let fake = FakeDriver::default();
        let logs = tempfile::tempdir().unwrap();
        let job = job(&fake, template("sleep", TaskKind::Batch), logs.path());
        let owned = job.owned.clone();
        let started = launched(job);
        let (_, pid) = fake.started(UID, 1).expect("the fake process started");
        assert_eq!(started.process.pid, pid);
        assert!(
            owned.contains(pid as i32),
            "tokio waits for it: the reaper must not"
        );
        assert!(started.cgroup.is_none());
        assert_eq!(started.pid_start, 0, "a fake pid is in no /proc");

        let mut task = task(template("sleep", TaskKind::Batch), Some(70_001));
        task.resumed = true;
        let at = started.at;
        let handed = hand_over(&mut task, false, "boot-1", started);
        assert_eq!(
            handed.record,
            journal::Started {
                pid: pid as i32,
                pgid: pid as i32,
                pid_start: 0,
                pgid_start: 0,
                logger: false,
                boot_id: "boot-1".into(),
                cgroup: None,
                task_uid: Some(70_001),
                started_at: at,
                restarts: 0,
                asks: None,
            }
        );
        assert_eq!((handed.pid, handed.at), (pid, at));
        assert_eq!(handed.running.started, handed.record);
        assert_eq!(
            (handed.running.pid, handed.running.pgid),
            (pid as i32, pid as i32)
        );
        let lineage = handed.running.lineage.as_ref().expect("no cgroup: a lineage");
        let leader = Stat {
            state: 'S',
            ppid: 1,
            pgrp: pid as i32,
            session: pid as i32,
            start_time: 0,
        };
        assert!(lineage.knows(pid as i32, &leader));
        assert!(handed.restarted.is_none());
        assert!(!task.resumed, "it runs in this run now");
        assert!(task.prepared.is_some(), "an exec session runs as it runs");

        fake.exit(UID, 1, 3);
        assert_eq!(handed.exit.await.unwrap().code(), Some(3));
    }

    #[tokio::test]
    async fn a_restart_counts_in_its_record_and_the_task_keeps_its_preparation() {
        let fake = FakeDriver::default();
        let logs = tempfile::tempdir().unwrap();
        let mut restarting = task(template("sleep", TaskKind::Service), None);
        restarting.restarts.as_mut().unwrap().last_exit_code = Some(2);
        let started = launched(job(&fake, template("sleep", TaskKind::Service), logs.path()));
        let at = started.at;
        let handed = hand_over(&mut restarting, true, "boot-1", started);
        assert_eq!(handed.record.restarts, 1);
        let restarted = handed.restarted.expect("a restart");
        assert_eq!(
            (restarted.count, restarted.last_exit_code, restarted.at),
            (1, Some(2), at)
        );
        assert_eq!(restarting.restarts.as_ref().unwrap().count, 1);
        assert!(restarting.prepared.is_some(), "it may start again");

        // Its first start is no restart, and counts none.
        let mut first = task(template("sleep", TaskKind::Service), None);
        let started = launched(job(&fake, template("sleep", TaskKind::Service), logs.path()));
        let handed = hand_over(&mut first, false, "boot-1", started);
        assert_eq!(handed.record.restarts, 0);
        assert!(handed.restarted.is_none());
        assert_eq!(first.restarts.as_ref().unwrap().count, 0);
        assert!(first.prepared.is_some());
    }

    #[tokio::test]
    async fn a_task_writes_its_output_to_its_log_files_itself() {
        let fake = FakeDriver::default();
        let logs = tempfile::tempdir().unwrap();
        launched(job(&fake, template("sleep", TaskKind::Batch), logs.path()));
        let stdout = logs.path().join("stdout.log");
        assert_eq!(std::fs::read_to_string(&stdout).unwrap(), "hello robot\n");
        let mode = |path: &Path| std::fs::metadata(path).unwrap().permissions().mode() & 0o777;
        assert_eq!(
            (mode(&stdout), mode(&logs.path().join("stderr.log"))),
            (0o600, 0o600)
        );
    }

    #[tokio::test]
    async fn a_task_whose_log_files_cannot_be_opened_is_not_started() {
        let fake = FakeDriver::default();
        let logs = tempfile::tempdir().unwrap();
        let missing = logs.path().join("missing");
        let refused = launch(job(&fake, template("sleep", TaskKind::Service), &missing));
        let Err((reason, message)) = refused else {
            panic!("started");
        };
        assert_eq!(reason, TaskReason::StartFailed);
        assert!(
            message.starts_with("cannot set up the task's output: "),
            "{message}"
        );
        assert_eq!(fake.starts(), 0);
    }

    #[tokio::test]
    async fn a_command_the_driver_cannot_start_is_refused() {
        let fake = FakeDriver::default();
        let logs = tempfile::tempdir().unwrap();
        let job = job(&fake, template("missing", TaskKind::Batch), logs.path());
        let Err((reason, message)) = launch(job) else {
            panic!("started");
        };
        let expected = DriverError::CommandNotFound {
            command: "missing".into(),
        };
        assert_eq!((reason, message), (TaskReason::StartFailed, expected.to_string()));
        assert_eq!(fake.starts(), 0);
    }

    #[tokio::test]
    async fn a_process_in_a_cgroup_needs_no_lineage() {
        let fake = FakeDriver::default();
        let logs = tempfile::tempdir().unwrap();
        let mut started = launched(job(&fake, template("sleep", TaskKind::Batch), logs.path()));
        let path = PathBuf::from("/sys/fs/cgroup/k8s4r/launch-test-1");
        started.cgroup = Some(TaskCgroup::at(path.clone()));
        let mut task = task(template("sleep", TaskKind::Batch), None);
        let handed = hand_over(&mut task, false, "boot-1", started);
        assert_eq!(handed.record.cgroup, Some(path.clone()));
        assert!(handed.running.lineage.is_none());
        assert_eq!(task.cgroup.as_ref().map(|c| c.path().to_path_buf()), Some(path));
    }
}
