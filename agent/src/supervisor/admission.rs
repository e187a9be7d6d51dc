//! Admission: whether the robot takes a task now (its spec, the robot's
//! capacity and policy), who it runs as (a task uid of its own from the
//! rotation, or the user the policy allows), and what preparing it takes.
//! The preparation itself ([`prepare`]) runs off the supervisor's thread.

use std::collections::HashSet;
use std::io;
use std::ops::RangeInclusive;
use std::os::unix::fs::PermissionsExt;
use std::path::{Path, PathBuf};
use std::sync::{Arc, OnceLock};

use futures::future::AbortHandle;
use k8s4r_api::protocol::TaskConfig;
use k8s4r_api::validation::validate_task_template;
use k8s4r_api::{TaskReason, TaskTemplate};
use k8s4r_drivers::identity::{self, RunAs};
use k8s4r_drivers::{DriverError, Prepared};

use super::artifacts;
use super::disk;
use super::outcome::driver_reason;
use super::policy::{passwd_uids, Plan, Policy, TaskUids};
use super::process::Launcher;
use super::task_config;
use super::SupervisorConfig;

/// The file under the state directory that keeps the task uid rotation's
/// position across agent restarts.
const UID_POSITION_FILE: &str = "task-uid-next";

/// An attempt of the previous run started again from the journal.
#[derive(Clone, Copy, Debug)]
pub(crate) struct Resumed {
    /// Its restarts on the robot so far.
    pub restarts: u32,
    /// The uid it ran as, if it had one of its own.
    pub uid: Option<u32>,
}

/// Why a task could not be admitted or prepared.
pub(crate) struct Failure {
    pub reason: TaskReason,
    pub message: String,
}

impl Failure {
    pub(crate) fn new(reason: TaskReason, message: impl Into<String>) -> Self {
        Failure {
            reason,
            message: message.into(),
        }
    }
}

impl From<DriverError> for Failure {
    fn from(e: DriverError) -> Self {
        Failure::new(driver_reason(&e), e.to_string())
    }
}

/// What the robot holds now, as admission weighs it.
pub(crate) struct Capacity {
    /// Tasks held.
    pub held: usize,
    /// Bytes the tasks held take or may take on disk.
    pub disk_taken: u64,
    /// The disk budget of all task directories.
    pub disk_budget: u64,
    /// The disk is full: (free, reserve) at the last measurement.
    pub disk_full: Option<(u64, u64)>,
}

impl Capacity {
    /// What `table` holds, on the disk `disk` watches.
    pub(crate) fn of(table: &super::table::Table, disk: &super::disk_watch::DiskWatch) -> Self {
        Capacity {
            held: table.len(),
            disk_taken: table
                .tasks()
                .map(|(_, t)| t.disk_used.max(t.disk_limit.unwrap_or(0)))
                .sum(),
            disk_budget: disk.budget(),
            disk_full: disk.full(),
        }
    }
}

/// A task the robot takes.
pub(crate) struct Admitted {
    /// Its launcher's index.
    pub driver: usize,
    /// Who it runs as.
    pub run_as: RunAs,
    /// Its own task uid, when it got one.
    pub own_uid: Option<u32>,
}

/// The admission rules and the task uid rotation.
pub(crate) struct Admission {
    policy: Policy,
    agent_is_root: bool,
    max_tasks: usize,
    uid_range: RangeInclusive<u32>,
    uids: TaskUids,
    uid_file: PathBuf,
    limits: artifacts::Limits,
    /// The HTTP client for artifacts, made once (on the blocking pool: it
    /// reads the robot's CA bundle).
    http: Arc<OnceLock<Result<reqwest::Client, String>>>,
}

impl Admission {
    /// The rules of `config`; `running` are uids processes run as now (left
    /// by an earlier run), never handed out, but for `adopted` ones.
    pub(crate) fn new(
        config: &SupervisorConfig,
        agent_is_root: bool,
        running: HashSet<u32>,
        adopted: &[u32],
    ) -> Self {
        let mut barred = passwd_uids(&config.task_uids);
        barred.extend(running);
        // A re-adopted service's own uid is running: its, not barred.
        for uid in adopted {
            barred.remove(uid);
        }
        let uid_file = config.state_dir.join(UID_POSITION_FILE);
        let kept = std::fs::read_to_string(&uid_file)
            .ok()
            .and_then(|t| t.trim().parse::<u32>().ok());
        Admission {
            policy: config.policy.clone(),
            agent_is_root,
            max_tasks: config.max_tasks,
            uid_range: config.task_uids.clone(),
            uids: TaskUids::new(config.task_uids.clone(), barred).starting_at(kept),
            uid_file,
            limits: config.artifact_limits(),
            http: Arc::default(),
        }
    }

    /// Whether the robot takes `spec` (task `uid`) now: its launcher (of
    /// `drivers`), who it runs as (a resumed task gets its own uid back if
    /// it can: its files are owned by it); or why not.
    pub(crate) fn admit(
        &mut self,
        uid: &str,
        spec: &TaskTemplate,
        resumed: Option<Resumed>,
        drivers: &[&str],
        capacity: &Capacity,
    ) -> Result<Admitted, Failure> {
        if let Err(e) = validate_task_template(spec) {
            return Err(Failure::new(
                TaskReason::InvalidSpec,
                format!("invalid spec: {e}"),
            ));
        }
        if !is_path_component(uid) {
            return Err(Failure::new(
                TaskReason::InvalidSpec,
                "task uid cannot name a directory",
            ));
        }
        if let Some(message) = over_capacity(self.max_tasks, capacity, spec) {
            return Err(Failure::new(TaskReason::OverCapacity, message));
        }
        let plan = self
            .policy
            .decide(spec, self.agent_is_root)
            .map_err(|refusal| Failure::new(refusal.reason, refusal.message))?;
        let Some(driver) = drivers.iter().position(|d| *d == spec.driver) else {
            let message = format!("driver {:?} is not available on this robot", spec.driver);
            return Err(Failure::new(TaskReason::InvalidSpec, message));
        };
        let (run_as, own_uid) = match plan {
            Plan::Run(run_as) => (run_as, None),
            Plan::OwnUid => match resumed
                .and_then(|r| r.uid)
                .filter(|u| self.uids.take_exact(*u))
                .or_else(|| self.uids.take())
            {
                Some(u) => (RunAs::TaskUid(u), Some(u)),
                None => {
                    let message = format!(
                        "every task uid of this robot ({}-{}) is in use",
                        self.uid_range.start(),
                        self.uid_range.end()
                    );
                    return Err(Failure::new(TaskReason::OverCapacity, message));
                }
            },
        };
        Ok(Admitted {
            driver,
            run_as,
            own_uid,
        })
    }

    /// Who a task that restarts on the robot runs as now (None: the
    /// robot's policy no longer allows it).
    pub(crate) fn rerun_as(&self, template: &TaskTemplate, own_uid: Option<u32>) -> Option<RunAs> {
        match self.policy.decide(template, self.agent_is_root) {
            Ok(Plan::Run(run_as)) => Some(run_as),
            Ok(Plan::OwnUid) => own_uid.map(RunAs::TaskUid),
            Err(_) => None,
        }
    }

    /// A uid nothing runs as any more comes back to the rotation.
    pub(crate) fn release(&mut self, uid: Option<u32>) {
        if let Some(uid) = uid {
            self.uids.give_back(uid);
        }
    }

    /// A uid something survived under never comes back.
    pub(crate) fn bar(&mut self, uid: u32) {
        self.uids.bar(uid);
    }

    /// What preparing a task takes. `new_uid`: the task got a uid of its own
    /// new to it (the rotation's position is kept, and what the uid's
    /// earlier tasks left is removed first); `keep_dir`: a directory kept
    /// from an earlier run of it.
    pub(crate) fn prep_input(
        &self,
        dir: PathBuf,
        launcher: Arc<dyn Launcher>,
        template: TaskTemplate,
        run_as: RunAs,
        keep_dir: bool,
        new_uid: bool,
    ) -> PrepInput {
        PrepInput {
            dir,
            launcher,
            template,
            run_as,
            allow_root: self.policy.allow_root,
            keep_dir,
            http: Arc::clone(&self.http),
            limits: self.limits,
            new_uid_position: new_uid.then(|| (self.uid_file.clone(), self.uids.position())),
            config: None,
            abort: None,
        }
    }
}

/// Why the robot cannot take `spec` now, if it cannot.
fn over_capacity(max_tasks: usize, capacity: &Capacity, spec: &TaskTemplate) -> Option<String> {
    if capacity.held >= max_tasks {
        return Some(format!(
            "this robot already holds its maximum of {max_tasks} tasks (max_tasks)"
        ));
    }
    if let Some((free, reserve)) = capacity.disk_full {
        return Some(format!(
            "the robot's disk is full ({} free, {} kept for the agent); it takes no task until space is back",
            disk::mib(free),
            disk::mib(reserve)
        ));
    }
    let wanted = spec.disk_bytes()?;
    if capacity.disk_taken.saturating_add(wanted) > capacity.disk_budget {
        return Some(format!(
            "resources.disk of {} does not fit: its tasks take {} of the robot's disk budget of {}",
            disk::mib(wanted),
            disk::mib(capacity.disk_taken),
            disk::mib(capacity.disk_budget)
        ));
    }
    None
}

fn is_path_component(s: &str) -> bool {
    !s.is_empty() && s.len() <= 200 && s != "." && s != ".." && !s.contains(['/', '\0'])
}

/// What preparing a task needs, moved off the loop.
pub(crate) struct PrepInput {
    dir: PathBuf,
    launcher: Arc<dyn Launcher>,
    template: TaskTemplate,
    run_as: RunAs,
    allow_root: bool,
    keep_dir: bool,
    http: Arc<OnceLock<Result<reqwest::Client, String>>>,
    limits: artifacts::Limits,
    new_uid_position: Option<(PathBuf, u32)>,
    /// What the dispatch carried of the task's ConfigMaps and Secrets;
    /// `None` reads what the task's directory kept, when the spec takes
    /// any.
    config: Option<TaskConfig>,
    /// Aborted when the task is stopped while being prepared: the blocking
    /// work goes on regardless, and must leave no configuration behind.
    abort: Option<AbortHandle>,
}

impl PrepInput {
    /// With the configuration a dispatch carried, for a preparation that
    /// `abort` may abort.
    pub(crate) fn with_config(self, config: Option<TaskConfig>, abort: AbortHandle) -> Self {
        Self {
            config,
            abort: Some(abort),
            ..self
        }
    }
}

/// Makes the task's directory, removes what its new uid's earlier tasks
/// left, resolves its user, lets the driver prepare it, and fetches its
/// artifacts: everything that touches the disk, the user database or the
/// network, off the supervisor's thread.
pub(crate) async fn prepare(input: PrepInput) -> Result<Prepared, Failure> {
    let PrepInput {
        dir,
        launcher,
        template,
        run_as,
        allow_root,
        keep_dir,
        http,
        limits,
        new_uid_position,
        config,
        abort,
    } = input;
    let artifacts = template.artifacts.clone();
    let task_dir = dir.clone();
    let prepared =
        tokio::task::spawn_blocking(move || -> Result<(Prepared, Option<reqwest::Client>), Failure> {
            if let (Some((file, position)), RunAs::TaskUid(uid)) = (&new_uid_position, &run_as) {
                keep_uid_position(file, *position);
                clean_leftovers(*uid)?;
            }
            let made = if keep_dir && task_dir.is_dir() {
                reuse_task_dir(&task_dir)
            } else {
                make_task_dir(&task_dir)
            };
            made.map_err(|e| {
                Failure::new(
                    TaskReason::StartFailed,
                    format!("cannot create task directory {}: {e}", task_dir.display()),
                )
            })?;
            let identity = identity::resolve(&run_as, &template.groups, allow_root)?;
            let mut prepared = launcher.prepare(&template, &task_dir.join("work"), identity)?;
            let aborted = || abort.as_ref().is_some_and(AbortHandle::is_aborted);
            if !aborted() {
                configure(&task_dir, &template, config, &mut prepared)?;
            }
            // Stopped meanwhile: the end of the attempt may have run before
            // the files were written; nothing of them may stay.
            if aborted() {
                task_config::forget(&task_dir);
                return Err(Failure::new(
                    TaskReason::Cancelled,
                    "stopped while being prepared".to_owned(),
                ));
            }
            let client = match template.artifacts.is_empty() {
                true => None,
                false => Some(
                    http.get_or_init(artifacts::client)
                        .clone()
                        .map_err(|message| Failure::new(TaskReason::StartFailed, message))?,
                ),
            };
            Ok((prepared, client))
        })
        .await
        .map_err(|e| Failure::new(TaskReason::StartFailed, format!("cannot prepare the task: {e}")))??;
    let (prepared, client) = prepared;
    if let Some(client) = client {
        let places = artifacts::Places {
            fetch_dir: dir.join("fetch"),
            work_dir: prepared.task_dir.clone(),
            owner: prepared.identity.as_ref().map(|i| (i.uid, i.gid)),
        };
        fetch(client, artifacts, places, limits)
            .await
            .map_err(|message| Failure::new(TaskReason::ArtifactFailed, message))?;
    }
    Ok(prepared)
}

/// Keeps, places and sets the task's configuration from ConfigMaps and
/// Secrets: the dispatch's, or the one its directory kept (an attempt
/// started again without the cluster). Blocking.
fn configure(
    dir: &Path,
    template: &TaskTemplate,
    config: Option<TaskConfig>,
    prepared: &mut Prepared,
) -> Result<(), Failure> {
    let failed = |message: String| Failure::new(TaskReason::StartFailed, message);
    let config = match config {
        Some(config) => {
            task_config::keep(dir, &config)
                .map_err(|e| failed(format!("cannot keep the task's configuration: {e}")))?;
            config
        }
        None if k8s4r_api::config_resolve::has_references(template) => task_config::kept(dir)
            .map_err(|e| failed(format!("cannot read the task's kept configuration: {e}")))?
            .ok_or_else(|| {
                failed(
                    "the task takes ConfigMaps or Secrets, and neither its dispatch nor its directory carries them (a server older than this agent?)"
                        .to_owned(),
                )
            })?,
        None => return Ok(()),
    };
    let places = artifacts::Places {
        fetch_dir: dir.join("fetch"),
        work_dir: prepared.task_dir.clone(),
        owner: prepared.identity.as_ref().map(|i| (i.uid, i.gid)),
    };
    task_config::place(&places, &config).map_err(failed)?;
    prepared.config_env = task_config::env(&config);
    Ok(())
}

/// Fetches artifacts on a runtime of their own, on a thread started at the
/// first task that has any: the TLS and the hashing of up to a GiB must not
/// run on the thread that fires deadlines.
async fn fetch(
    client: reqwest::Client,
    artifacts: Vec<k8s4r_api::Artifact>,
    places: artifacts::Places,
    limits: artifacts::Limits,
) -> Result<(), String> {
    static FETCHER: OnceLock<Option<tokio::runtime::Handle>> = OnceLock::new();
    let fetcher = FETCHER.get_or_init(|| {
        let runtime = tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .build()
            .ok()?;
        let handle = runtime.handle().clone();
        std::thread::Builder::new()
            .name("k8s4r-fetch".to_owned())
            .spawn(move || runtime.block_on(std::future::pending::<()>()))
            .ok()?;
        Some(handle)
    });
    let work = artifacts::fetch_all(client, artifacts, places, limits);
    match fetcher {
        Some(handle) => handle
            .spawn(work)
            .await
            .map_err(|e| format!("the artifact fetch failed: {e}"))?,
        // No thread to be had: fetched here, which still works.
        None => work.await,
    }
}

/// Keeps the uid rotation's position for the next agent run (written
/// whole, then renamed; a failure only means the next run starts the
/// rotation elsewhere, which the clean-up below makes safe).
fn keep_uid_position(file: &Path, position: u32) {
    let tmp = file.with_extension("tmp");
    let written = std::fs::write(&tmp, format!("{position}\n")).and_then(|()| std::fs::rename(&tmp, file));
    if let Err(e) = written {
        tracing::warn!(path = %file.display(), error = %e, "cannot keep the task uid rotation's position");
    }
}

/// Removes what earlier tasks of `uid` left in the shared places before a
/// new task gets it; a leftover that cannot be removed fails the start
/// rather than hand it to another author's task.
fn clean_leftovers(uid: u32) -> Result<(), Failure> {
    let removed = k8s4r_drivers::leftovers::remove(uid);
    if !removed.files.is_empty() || removed.ipc > 0 {
        tracing::info!(
            uid,
            files = removed.files.len(),
            ipc = removed.ipc,
            "removed what earlier tasks of this uid left behind"
        );
    }
    if !removed.errors.is_empty() {
        return Err(Failure::new(
            TaskReason::StartFailed,
            format!(
                "cannot remove what an earlier task of uid {uid} left: {}",
                removed.errors.join("; ")
            ),
        ));
    }
    Ok(())
}

/// `<dir>/work` (the task's own), `<dir>/logs` and `<dir>/fetch` (root's
/// alone: logs, and artifacts until they are handed over), fresh.
fn make_task_dir(dir: &Path) -> io::Result<()> {
    if dir.symlink_metadata().is_ok() {
        std::fs::remove_dir_all(dir)?;
    }
    std::fs::create_dir(dir)?;
    for sub in ["work", "logs", "fetch"] {
        std::fs::create_dir(dir.join(sub))?;
    }
    close_task_dir(dir)
}

/// A task directory kept from the previous run: what is missing of it is
/// made again.
fn reuse_task_dir(dir: &Path) -> io::Result<()> {
    for sub in ["work", "logs", "fetch"] {
        let path = dir.join(sub);
        if !path.is_dir() {
            std::fs::create_dir(&path)?;
        }
    }
    close_task_dir(dir)
}

fn close_task_dir(dir: &Path) -> io::Result<()> {
    std::fs::set_permissions(dir, std::fs::Permissions::from_mode(0o711))?;
    std::fs::set_permissions(dir.join("logs"), std::fs::Permissions::from_mode(0o700))?;
    std::fs::set_permissions(dir.join("fetch"), std::fs::Permissions::from_mode(0o700))
}

#[cfg(test)]
mod tests;
