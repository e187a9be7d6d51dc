//! How the runner starts: the state directory, the previous run settled
//! from the journal (its running tasks re-adopted, what restarts on the robot
//! started again, the rest reported over), and each component made. This
//! runs on the caller's thread, before the loop has one of its own.

use std::collections::HashSet;
use std::io;
use std::os::unix::fs::PermissionsExt;
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::Duration;

use futures::stream::FuturesUnordered;
use k8s4r_api::task::DRIVER_RAW_EXEC;
use k8s4r_api::{AgentHealth, TaskPolicy};
use k8s4r_drivers::{Cgroups, ExecDriver, RawExecDriver, TaskCgroup};
use tokio::sync::{mpsc, watch};
use tokio::time::Instant;

use super::admission::{Admission, Resumed};
use super::checks;
use super::cleanup::Containment;
use super::containment::Lineage;
use super::disk;
use super::disk_watch::DiskWatch;
use super::health::Health;
use super::journal::{self, JournalStart, Record, Unfinished};
use super::process::{self, Launcher};
use super::reaper::OwnedPids;
use super::runner::Runner;
use super::stats::SupervisorStats;
use super::table::{Running, Table};
use super::{procfs, reaper, recovery, Offer, SupervisorConfig, SupervisorError, TaskEvent, TaskRequest};

/// What the runner is started with besides its config: its drivers, its
/// cgroup subtree, and the seam its unit tests fill (a journal written in
/// line).
pub(crate) struct Parts {
    pub launchers: Vec<Arc<dyn Launcher>>,
    pub cgroups: Option<Cgroups>,
    pub journal: JournalStart,
}

/// What the journal of the previous run leaves to this one.
struct Recovered {
    table: Table,
    to_remove: Vec<(TaskCgroup, Option<u32>)>,
    settled: Vec<TaskEvent>,
    resumed: Vec<(TaskRequest, Resumed)>,
    adopted: Vec<(Unfinished, journal::Resume, journal::Started)>,
    /// What is taken over: the journal starts over holding it, so that a
    /// crash before their new records are written loses none of them.
    kept: Vec<Unfinished>,
    /// Attempts settled (ended while no agent ran), with their templates:
    /// their outputs are taken.
    ended: Vec<(String, u32, PathBuf, k8s4r_api::TaskTemplate)>,
}

impl Runner {
    /// The supervisor of this machine's processes: the exec driver (and
    /// raw_exec when the configuration offers it), task cgroups where the
    /// agent has a writable cgroup v2 subtree, and the agent as the
    /// subreaper of what its tasks leave.
    pub(crate) fn on_this_machine(
        config: SupervisorConfig,
        events: mpsc::UnboundedSender<TaskEvent>,
    ) -> Result<(Self, watch::Receiver<AgentHealth>, Offer), SupervisorError> {
        raise_fd_limit();
        reaper::become_subreaper();
        let cgroups = match Cgroups::detect(config.cgroup_root.as_deref()) {
            Ok(cgroups) => {
                tracing::info!(root = %cgroups.root().display(), controllers = ?cgroups.controllers(), "task cgroups enabled");
                Some(cgroups)
            }
            Err(why) => {
                tracing::info!(%why, "no task cgroups: a task's processes are found through /proc to be killed");
                None
            }
        };
        let mut launchers: Vec<Arc<dyn Launcher>> =
            vec![Arc::new(ExecDriver::new().with_pids_max(config.task_pids_max))];
        if config.policy.raw_exec {
            launchers.push(Arc::new(RawExecDriver::with_pids_max(config.task_pids_max)));
        }
        if let Some(podman) = &config.podman {
            launchers.push(Arc::new(k8s4r_drivers::PodmanDriver::new(podman.clone())));
        }
        let parts = Parts {
            launchers,
            cgroups,
            journal: journal::on_its_thread(),
        };
        Runner::new(config, events, parts)
    }

    /// Prepares the state dir, settles the previous run (its events go out
    /// first) and everything the loop needs.
    pub(crate) fn new(
        config: SupervisorConfig,
        events: mpsc::UnboundedSender<TaskEvent>,
        parts: Parts,
    ) -> Result<(Self, watch::Receiver<AgentHealth>, Offer), SupervisorError> {
        let tasks_dir = config.tasks_dir();
        prepare_state_dir(&config.state_dir, &tasks_dir)?;
        let runtime_tasks = config.runtime_dir().join("tasks");
        std::fs::create_dir_all(&runtime_tasks)
            .and_then(|()| std::fs::set_permissions(&runtime_tasks, std::fs::Permissions::from_mode(0o700)))
            .map_err(state_error(&runtime_tasks))?;
        let journal_error = |source| SupervisorError::Journal {
            path: config.journal_file(),
            source,
        };
        let unfinished = journal::replay(&config.state_dir).map_err(journal_error)?;
        let boot_id = procfs::boot_id();
        let recovered = recover(
            &unfinished,
            &boot_id,
            &config.runtime_dir(),
            config.output_tail_bytes,
        );
        let journal = (parts.journal)(&config.state_dir, events, &recovered.kept).map_err(journal_error)?;
        for event in recovered.settled {
            journal.event(event);
        }
        let (total, _, _) = disk::space(&config.state_dir).map_err(state_error(&config.state_dir))?;
        let agent_is_root = nix::unistd::geteuid().is_root();
        let adopted_uids: Vec<u32> = recovered
            .adopted
            .iter()
            .filter_map(|(_, _, s)| s.task_uid)
            .collect();
        let admission = Admission::new(
            &config,
            agent_is_root,
            uids_running(&config.task_uids),
            &adopted_uids,
        );
        let disk = DiskWatch::new(&config, tasks_dir.clone(), total);
        let offer = offer(&config, &parts.launchers, agent_is_root, disk.budget());
        let (health, health_rx) = Health::new(config.state_dir.clone());
        let outputs = crate::outputs::Spool::open(&config.state_dir, config.outputs.clone())
            .map_err(state_error(&crate::outputs::take::spool_dir(&config.state_dir)))?;
        let containment = Containment::new(
            parts.cgroups,
            config.reap_all_orphans,
            OwnedPids::default(),
            recovered.to_remove,
        );
        let mut runner = Runner {
            config,
            launchers: parts.launchers,
            table: recovered.table,
            admission,
            containment,
            disk,
            journal,
            health,
            http_checks: checks::HttpClient::default(),
            boot_id,
            tasks_dir,
            waits: FuturesUnordered::new(),
            preparing: FuturesUnordered::new(),
            housework: FuturesUnordered::new(),
            stats: SupervisorStats::default(),
            shutting_down: false,
            shutdown_waiters: Vec::new(),
            facts: None,
            tails: Default::default(),
            images: Default::default(),
            outputs: Arc::new(outputs),
        };
        runner.take_over(recovered.adopted, recovered.resumed);
        runner.take_outputs_of_settled(recovered.ended);
        Ok((runner, health_rx, offer))
    }

    /// What the previous run left: leftover cgroups go once their
    /// processes do, running tasks are re-adopted (first: their uids are theirs
    /// before anything takes one), what restarts on the robot starts again.
    fn take_over(
        &mut self,
        adopted: Vec<(Unfinished, journal::Resume, journal::Started)>,
        resumed: Vec<(TaskRequest, Resumed)>,
    ) {
        let wants = self.containment.remove_cgroups();
        self.apply_startup(wants);
        for (task, resume, started) in adopted {
            self.adopt(task, resume, started);
        }
        for (request, how) in resumed {
            self.begin(request, Some(how));
        }
        // Their directories are in use, not finished ones to clean up.
        let table = &self.table;
        self.disk.keep_held(|key| table.holds(key));
        // The first measurement takes the disk reserve.
        self.schedule_measure(Duration::ZERO);
        self.schedule_images(Duration::ZERO);
    }

    fn apply_startup(&mut self, wants: super::cleanup::Wants) {
        // Containment's first jobs run once the loop does: the blocking pool
        // is its runtime's.
        for job in wants.jobs {
            self.housework.push(Box::pin(async move {
                let done = tokio::task::spawn_blocking(move || job.run()).await;
                match done {
                    Ok(done) => super::runner::Housework::Contained(done),
                    Err(_) => super::runner::Housework::Done,
                }
            }));
        }
    }

    /// Takes back a task the previous agent left running: the same
    /// process, its timeout counted from its start, its checks, its fence
    /// (the session fences it from the last contact of that agent); its
    /// driver prepares it again (kept directory) for checks and restarts.
    fn adopt(&mut self, task: Unfinished, resume: journal::Resume, started: journal::Started) {
        let request = TaskRequest {
            uid: task.uid.clone(),
            attempt: task.attempt,
            name: resume.name,
            spec: resume.spec,
            stop_after: resume.stop_after_ms.map(Duration::from_millis),
            config: None,
        };
        let how = Resumed {
            restarts: started.restarts,
            uid: started.task_uid,
        };
        let Some(id) = self.begin(request, Some(how)) else {
            // Refused now (its spec or the robot's policy): stop what runs.
            let message = recovery::kill_leftovers(&task, &self.boot_id);
            super::task_config::forget(&task.task_dir);
            tracing::warn!(uid = %task.uid, attempt = task.attempt, %message, "a re-adopted task was refused");
            return;
        };
        let lineage = started.cgroup.is_none().then(|| {
            Lineage::new(
                started.pid,
                started.pid_start,
                started.task_uid,
                &task.uid,
                task.attempt,
            )
        });
        let (pid, pid_start) = (started.pid, started.pid_start);
        let status_file = super::exit_status_file(&self.config.runtime_dir(), &task.uid, task.attempt);
        let ran_for = jiff::Timestamp::now()
            .duration_since(started.started_at)
            .try_into()
            .unwrap_or(Duration::ZERO);
        if let Some(t) = self.table.get_mut(id) {
            t.cgroup = started.cgroup.clone().map(TaskCgroup::at);
            t.own_logs = !started.logger;
            t.resumed = false;
        }
        let record = Record::Started {
            uid: task.uid.clone(),
            attempt: task.attempt,
            at: started.clone(),
        };
        // Its start is reported again: the previous process may have died
        // before its report left (the session holds a start for
        // `status_hold`, and a SIGKILL loses what it holds), and without it
        // the Task would show `dispatching` until its end. The cluster
        // already holding it costs one status write.
        let again = TaskEvent::Started {
            uid: task.uid.clone(),
            attempt: task.attempt,
            // The command's, as at its start: it leads its group.
            pid: u32::try_from(started.pgid).unwrap_or_default(),
            at: started.started_at,
            restarted: None,
            config: None,
        };
        let running = Running {
            pid,
            pgid: started.pgid,
            group: process::group(started.pgid),
            started,
            lineage,
        };
        self.table.adopted(id, running, Instant::now(), ran_for);
        self.watch_outputs(id);
        self.waits.push(Box::pin(async move {
            (id, adopted_exit(pid, pid_start, status_file).await)
        }));
        self.journal.write(Some(record), vec![again]);
        self.schedule_first_checks(id);
    }
}

/// Sorts the previous run's unfinished tasks: a task still running is
/// re-adopted, what restarts on the robot starts again, the rest is
/// settled (its leftovers killed, a `Finished` event: how it ended, when
/// its shim wrote that down while no agent ran).
fn recover(unfinished: &[Unfinished], boot_id: &str, runtime_dir: &Path, tail_bytes: usize) -> Recovered {
    let mut r = Recovered {
        table: Table::new(),
        to_remove: Vec::new(),
        settled: Vec::new(),
        resumed: Vec::new(),
        adopted: Vec::new(),
        kept: Vec::new(),
        ended: Vec::new(),
    };
    for task in unfinished {
        // What the last agent left running is re-adopted as it runs.
        if let (Some(resume), Some(started)) = (&task.resume, &task.started) {
            let alive = started.boot_id == boot_id
                && procfs::stat(started.pid)
                    .is_some_and(|s| s.start_time == started.pid_start && s.is_live());
            if alive {
                let kind = match resume.spec.kind {
                    k8s4r_api::TaskKind::Service => "service",
                    k8s4r_api::TaskKind::Batch => "batch task",
                };
                tracing::info!(uid = %task.uid, attempt = task.attempt, pid = started.pgid, "re-adopting a {kind} of the previous run");
                recovery::clear_stop_mark(task);
                r.adopted
                    .push((task.clone(), (**resume).clone(), started.clone()));
                r.kept.push(task.clone());
                continue;
            }
        }
        if let Some(path) = task.started.as_ref().and_then(|s| s.cgroup.clone()) {
            r.to_remove.push((TaskCgroup::at(path), None));
        }
        // Killed members re-parented to us (a subreaper) get reaped.
        if let Some(started) = &task.started {
            r.table.remember_group(started.pgid);
        }
        // What restarts on the robot starts again, cluster or not; but a
        // batch task that ended while no agent ran is over (its shim kept
        // how), and is reported as it ended.
        let ended = || recovery::ended_while_no_agent_ran(task, boot_id, runtime_dir).is_some();
        let restarts =
            |r: &journal::Resume| r.restart && (r.spec.kind == k8s4r_api::TaskKind::Service || !ended());
        if let Some(resume) = task.resume.as_ref().filter(|r| restarts(r)) {
            recovery::clear_stop_mark(task);
            let message = recovery::kill_leftovers(task, boot_id);
            tracing::warn!(uid = %task.uid, attempt = task.attempt, %message, "task of the previous run started again");
            let request = TaskRequest {
                uid: task.uid.clone(),
                attempt: task.attempt,
                name: resume.name.clone(),
                spec: resume.spec.clone(),
                stop_after: None,
                config: None,
            };
            let how = Resumed {
                restarts: task.started.as_ref().map_or(0, |s| s.restarts),
                uid: task.started.as_ref().and_then(|s| s.task_uid),
            };
            r.resumed.push((request, how));
            r.kept.push(task.clone());
            continue;
        }
        let outcome = recovery::settle(task, boot_id, runtime_dir, tail_bytes);
        super::task_config::forget(&task.task_dir);
        tracing::warn!(uid = %task.uid, attempt = task.attempt, message = %outcome.message, "task of the previous run settled");
        r.table.remember_finished(task.uid.clone(), task.attempt);
        if let Some(resume) = &task.resume {
            r.ended.push((
                task.uid.clone(),
                task.attempt,
                task.task_dir.clone(),
                resume.spec.clone(),
            ));
        }
        r.settled.push(TaskEvent::Finished {
            uid: task.uid.clone(),
            attempt: task.attempt,
            outcome,
        });
    }
    r
}

/// What the robot offers tasks: raw_exec only when it can run something
/// (it is on, and the agent is not root or root is allowed). The agent's
/// configuration refuses raw_exec without allow_root under root at start
/// (`config::Config::resolve`); this keeps a supervisor configured some
/// other way from offering what it would refuse.
fn offer(
    config: &SupervisorConfig,
    launchers: &[Arc<dyn Launcher>],
    agent_is_root: bool,
    budget: u64,
) -> Offer {
    let (max_tasks, disk_budget) = super::limits_report(config.max_tasks, budget);
    let raw_exec = config.policy.raw_exec && (!agent_is_root || config.policy.allow_root);
    if config.policy.raw_exec && !raw_exec {
        tracing::warn!("raw_exec is not offered: it would run tasks as root, and allow_root is false");
    }
    Offer {
        drivers: launchers
            .iter()
            .map(|l| l.name().to_owned())
            .filter(|name| name != DRIVER_RAW_EXEC || raw_exec)
            .collect(),
        policy: TaskPolicy {
            max_tasks,
            disk_budget,
            ..config.policy.report()
        },
    }
}

fn state_error(path: &Path) -> impl FnOnce(io::Error) -> SupervisorError {
    let path = path.to_path_buf();
    move |source| SupervisorError::StateDir { path, source }
}

/// The state dir and its `tasks/`: exec tasks run as other users and must
/// be able to walk down to their own directory; the listing stays private.
fn prepare_state_dir(state_dir: &Path, tasks_dir: &Path) -> Result<(), SupervisorError> {
    std::fs::create_dir_all(tasks_dir).map_err(state_error(tasks_dir))?;
    allow_traversal(state_dir).map_err(state_error(state_dir))?;
    std::fs::set_permissions(tasks_dir, std::fs::Permissions::from_mode(0o711))
        .map_err(state_error(tasks_dir))?;
    warn_if_unreachable(tasks_dir);
    Ok(())
}

/// Waits for a re-adopted process to end. It is not the agent's child: it
/// is watched through /proc, and its exit status is what its shim wrote
/// (unknown without a shim, or when the shim was killed with its task).
async fn adopted_exit(
    pid: i32,
    pid_start: u64,
    status_file: PathBuf,
) -> io::Result<std::process::ExitStatus> {
    use std::os::unix::process::ExitStatusExt;
    const POLL: Duration = Duration::from_millis(100);
    while procfs::stat(pid).is_some_and(|s| s.start_time == pid_start && s.is_live()) {
        tokio::time::sleep(POLL).await;
    }
    match k8s4r_drivers::shim::read_status(&status_file) {
        Some(ended) => Ok(std::process::ExitStatus::from_raw(ended.wait_status())),
        None => Err(io::Error::other(
            "it ended after an agent restart re-adopted it, and its shim left no exit status",
        )),
    }
}

/// Task uids that processes run as now (left by an earlier run that could
/// not be settled): never handed out.
fn uids_running(range: &std::ops::RangeInclusive<u32>) -> HashSet<u32> {
    procfs::snapshot()
        .into_iter()
        .filter_map(|(pid, _)| procfs::real_uid(pid))
        .filter(|uid| range.contains(uid))
        .collect()
}

/// exec tasks run as other users and must walk down to their directories:
/// says so at start when a directory above the state dir stops them (else
/// each task would fail with a bare "Permission denied").
fn warn_if_unreachable(tasks_dir: &Path) {
    if !nix::unistd::geteuid().is_root() {
        return; // exec tasks run as the agent's user
    }
    for dir in tasks_dir.ancestors().skip(1) {
        let Ok(meta) = std::fs::metadata(dir) else {
            continue;
        };
        if meta.permissions().mode() & 0o001 == 0 {
            tracing::warn!(
                dir = %dir.display(),
                "exec tasks run as users of their own and cannot reach their directories: this directory is not searchable by others (chmod o+x it, or choose another state_dir)"
            );
            return;
        }
    }
}

/// exec tasks run as another user and must be able to walk through the
/// state dir to their own directory: add the search bits (not read).
fn allow_traversal(dir: &Path) -> io::Result<()> {
    let mode = std::fs::metadata(dir)?.permissions().mode();
    if mode & 0o011 != 0o011 {
        std::fs::set_permissions(dir, std::fs::Permissions::from_mode(mode | 0o011))?;
    }
    Ok(())
}

/// Each task holds a few fds (pipes, pidfd, logs): lift the soft limit to
/// the hard one so a thousand tasks fit.
fn raise_fd_limit() {
    use nix::sys::resource::{getrlimit, setrlimit, Resource};
    if let Ok((soft, hard)) = getrlimit(Resource::RLIMIT_NOFILE) {
        if soft < hard {
            let _ = setrlimit(Resource::RLIMIT_NOFILE, hard, hard);
        }
    }
}
