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

use k8s4r_api::validation::validate_task_template;
use k8s4r_api::{TaskReason, TaskTemplate};
use k8s4r_drivers::identity::{self, RunAs};
use k8s4r_drivers::{DriverError, Prepared};

use super::artifacts;
use super::disk;
use super::outcome::driver_reason;
use super::policy::{passwd_uids, Plan, Policy, TaskUids};
use super::process::Launcher;
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
            limits: artifacts::Limits {
                max_bytes: config.artifact_max_bytes,
                timeout: config.artifact_timeout,
                retries: config.artifact_retries,
            },
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
            let prepared = launcher.prepare(&template, &task_dir.join("work"), identity)?;
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
mod tests {
    use futures::future::AbortHandle;
    use k8s4r_api::{Quantity, TaskResources};
    use tempfile::TempDir;

    use super::*;
    use crate::supervisor::disk::DiskSize;
    use crate::supervisor::disk_watch::DiskWatch;
    use crate::supervisor::fake::FakeDriver;
    use crate::supervisor::table::{NewTask, Table, Task};

    const MIB: u64 = 1 << 20;
    /// The robot's task uids: three, far above any user of the machine the
    /// tests run on (Admission bars the uids /etc/passwd has).
    const FIRST: u32 = 3_900_000_000;
    /// The launchers the robot offers, in order.
    const DRIVERS: &[&str] = &["raw_exec", "exec"];

    /// The admission of a robot whose agent is root or not, with the
    /// default (locked) policy, at most 4 tasks and 3 task uids.
    fn admission(agent_is_root: bool) -> (Admission, TempDir) {
        admission_with(agent_is_root, |_| {})
    }

    fn admission_with(
        agent_is_root: bool,
        adjust: impl FnOnce(&mut SupervisorConfig),
    ) -> (Admission, TempDir) {
        let state = tempfile::tempdir().unwrap();
        let mut config = config(state.path());
        adjust(&mut config);
        (Admission::new(&config, agent_is_root, HashSet::new(), &[]), state)
    }

    fn config(state_dir: &Path) -> SupervisorConfig {
        SupervisorConfig {
            state_dir: state_dir.to_path_buf(),
            task_uids: FIRST..=FIRST + 2,
            max_tasks: 4,
            ..SupervisorConfig::default()
        }
    }

    /// An exec task that names no user: a uid of its own under a root agent.
    fn exec() -> TaskTemplate {
        TaskTemplate {
            driver: "exec".into(),
            command: "true".into(),
            ..TaskTemplate::default()
        }
    }

    fn with_disk(template: TaskTemplate, disk: &str) -> TaskTemplate {
        TaskTemplate {
            resources: Some(TaskResources {
                disk: Some(Quantity::from(disk)),
                ..TaskResources::default()
            }),
            ..template
        }
    }

    /// Room for anything: no task held, an empty disk budget of 100 MiB.
    fn room() -> Capacity {
        Capacity {
            held: 0,
            disk_taken: 0,
            disk_budget: 100 * MIB,
            disk_full: None,
        }
    }

    fn admitted(result: Result<Admitted, Failure>) -> Admitted {
        match result {
            Ok(admitted) => admitted,
            Err(f) => panic!("refused ({:?}): {}", f.reason, f.message),
        }
    }

    fn refused(result: Result<Admitted, Failure>) -> Failure {
        match result {
            Ok(a) => panic!("admitted as {:?}", a.run_as),
            Err(f) => f,
        }
    }

    /// The own uid a new task `uid` (or a resumed one) gets.
    fn own_uid(a: &mut Admission, uid: &str, resumed: Option<Resumed>) -> Option<u32> {
        admitted(a.admit(uid, &exec(), resumed, DRIVERS, &room())).own_uid
    }

    fn resumed(uid: Option<u32>) -> Option<Resumed> {
        Some(Resumed { restarts: 2, uid })
    }

    #[test]
    fn an_invalid_spec_is_refused_with_what_is_wrong() {
        let (mut a, _state) = admission(true);
        let no_command = TaskTemplate {
            command: String::new(),
            ..exec()
        };
        let f = refused(a.admit("t", &no_command, None, DRIVERS, &room()));
        assert_eq!(f.reason, TaskReason::InvalidSpec);
        assert!(
            f.message.starts_with("invalid spec: ") && f.message.contains("spec.command"),
            "{}",
            f.message
        );
        assert_eq!(
            own_uid(&mut a, "next", None),
            Some(FIRST),
            "a refusal takes no uid"
        );
    }

    #[test]
    fn a_uid_that_cannot_name_a_directory_is_refused() {
        let (mut a, _state) = admission(true);
        let too_long = "x".repeat(201);
        for uid in ["", ".", "..", "a/b", "/", "a\0b", too_long.as_str()] {
            let f = refused(a.admit(uid, &exec(), None, DRIVERS, &room()));
            assert_eq!(f.reason, TaskReason::InvalidSpec, "{uid:?}");
            assert_eq!(f.message, "task uid cannot name a directory", "{uid:?}");
        }
        // Dots within a name, and the longest name, are fine.
        assert_eq!(own_uid(&mut a, "...", None), Some(FIRST));
        assert_eq!(own_uid(&mut a, &"x".repeat(200), None), Some(FIRST + 1));
    }

    #[test]
    fn over_capacity_counts_the_tasks_then_a_full_disk_then_the_disk_budget() {
        let ten_mib = with_disk(exec(), "10Mi");
        let nearly_full = Capacity {
            held: 3,
            disk_taken: 90 * MIB,
            ..room()
        };
        assert_eq!(
            over_capacity(4, &nearly_full, &ten_mib),
            None,
            "exactly the budget fits"
        );
        let at_max = Capacity { held: 4, ..room() };
        assert_eq!(
            over_capacity(4, &at_max, &exec()).as_deref(),
            Some("this robot already holds its maximum of 4 tasks (max_tasks)")
        );
        let disk_full = Capacity {
            disk_full: Some((MIB, 2 * MIB)),
            ..room()
        };
        assert_eq!(
            over_capacity(4, &disk_full, &exec()).as_deref(),
            Some("the robot's disk is full (1.0 MiB free, 2.0 MiB kept for the agent); it takes no task until space is back")
        );
        let a_byte_more = Capacity {
            disk_taken: 90 * MIB + 1,
            ..nearly_full
        };
        assert_eq!(
            over_capacity(4, &a_byte_more, &ten_mib).as_deref(),
            Some("resources.disk of 10.0 MiB does not fit: its tasks take 90.0 MiB of the robot's disk budget of 100.0 MiB")
        );
        // A task that asks for no disk is not weighed against the budget,
        // and what is taken never overflows.
        let over_budget = Capacity {
            disk_taken: u64::MAX,
            ..room()
        };
        assert_eq!(over_capacity(4, &over_budget, &exec()), None);
        assert!(over_capacity(4, &over_budget, &ten_mib).is_some());
    }

    #[test]
    fn a_robot_at_its_maximum_or_on_a_full_disk_refuses_as_over_capacity() {
        let (mut a, _state) = admission(true);
        let at_max = Capacity { held: 4, ..room() };
        let f = refused(a.admit("t", &exec(), None, DRIVERS, &at_max));
        assert_eq!(f.reason, TaskReason::OverCapacity);
        assert!(f.message.contains("maximum of 4 tasks"), "{}", f.message);
        let disk_full = Capacity {
            disk_full: Some((0, MIB)),
            ..room()
        };
        let f = refused(a.admit("t", &exec(), None, DRIVERS, &disk_full));
        assert_eq!(f.reason, TaskReason::OverCapacity);
        assert!(f.message.contains("disk is full"), "{}", f.message);
        assert_eq!(
            own_uid(&mut a, "next", None),
            Some(FIRST),
            "a refusal takes no uid"
        );
    }

    #[test]
    fn a_driver_the_robot_does_not_offer_is_an_invalid_spec() {
        let (mut a, _state) = admission(false);
        let f = refused(a.admit("t", &exec(), None, &["raw_exec"], &room()));
        assert_eq!(f.reason, TaskReason::InvalidSpec);
        assert_eq!(f.message, "driver \"exec\" is not available on this robot");
        // The launcher is the offered one of that name.
        let ok = admitted(a.admit("t", &exec(), None, DRIVERS, &room()));
        assert_eq!(ok.driver, 1);
    }

    #[test]
    fn a_policy_refusal_keeps_the_policys_reason_and_takes_no_uid() {
        let (mut a, _state) = admission(true);
        let raw = TaskTemplate {
            driver: "raw_exec".into(),
            ..exec()
        };
        let f = refused(a.admit("t", &raw, None, DRIVERS, &room()));
        assert_eq!(f.reason, TaskReason::NotPermitted);
        assert!(f.message.contains("raw_exec driver is off"), "{}", f.message);
        let root = TaskTemplate {
            user: Some("root".into()),
            ..exec()
        };
        assert_eq!(
            refused(a.admit("t", &root, None, DRIVERS, &room())).reason,
            TaskReason::NotPermitted
        );

        let (mut open, _state) = admission_with(true, |c| c.policy.raw_exec = true);
        let raw_with_user = TaskTemplate {
            user: Some("robot".into()),
            ..raw
        };
        let f = refused(open.admit("t", &raw_with_user, None, DRIVERS, &room()));
        assert_eq!(f.reason, TaskReason::InvalidSpec, "{}", f.message);
        assert_eq!(own_uid(&mut a, "next", None), Some(FIRST));
    }

    #[test]
    fn a_task_that_runs_as_the_agent_or_a_named_user_takes_no_uid() {
        let (mut a, _state) = admission(false);
        let ok = admitted(a.admit("t", &exec(), None, DRIVERS, &room()));
        assert_eq!((ok.run_as, ok.own_uid), (RunAs::Agent, None));

        let (mut a, _state) = admission_with(true, |c| c.policy.allowed_users = vec!["robot".into()]);
        let named = TaskTemplate {
            user: Some("robot".into()),
            ..exec()
        };
        let ok = admitted(a.admit("t", &named, resumed(Some(FIRST + 1)), DRIVERS, &room()));
        assert_eq!((ok.run_as, ok.own_uid), (RunAs::Named("robot".into()), None));
        assert_eq!(
            own_uid(&mut a, "next", None),
            Some(FIRST),
            "the rotation did not move"
        );
    }

    #[test]
    fn own_uids_come_from_the_rotation_until_every_one_is_in_use() {
        let (mut a, _state) = admission(true);
        let ok = admitted(a.admit("a", &exec(), None, DRIVERS, &room()));
        assert_eq!((ok.run_as, ok.own_uid), (RunAs::TaskUid(FIRST), Some(FIRST)));
        assert_eq!(own_uid(&mut a, "b", None), Some(FIRST + 1));
        assert_eq!(own_uid(&mut a, "c", None), Some(FIRST + 2));

        let f = refused(a.admit("d", &exec(), None, DRIVERS, &room()));
        assert_eq!(f.reason, TaskReason::OverCapacity);
        assert_eq!(
            f.message,
            format!("every task uid of this robot ({FIRST}-{}) is in use", FIRST + 2)
        );

        a.release(None);
        assert!(
            a.admit("d", &exec(), None, DRIVERS, &room()).is_err(),
            "nothing released"
        );
        a.release(Some(FIRST + 1));
        assert_eq!(own_uid(&mut a, "d", None), Some(FIRST + 1));
    }

    #[test]
    fn a_resumed_task_gets_its_own_uid_back_when_it_is_free() {
        let (mut a, _state) = admission(true);
        assert_eq!(own_uid(&mut a, "old", resumed(Some(FIRST + 2))), Some(FIRST + 2));
        assert_eq!(
            own_uid(&mut a, "new", None),
            Some(FIRST),
            "the rotation did not move"
        );
        // Its uid is another task's now, or outside the range: the next in turn.
        assert_eq!(own_uid(&mut a, "old2", resumed(Some(FIRST))), Some(FIRST + 1));
        a.release(Some(FIRST + 1));
        assert_eq!(own_uid(&mut a, "old3", resumed(Some(7))), Some(FIRST + 1));
        a.release(Some(FIRST + 1));
        assert_eq!(own_uid(&mut a, "old4", resumed(None)), Some(FIRST + 1));
    }

    #[test]
    fn a_barred_uid_never_comes_back() {
        let (mut a, _state) = admission(true);
        assert_eq!(own_uid(&mut a, "a", None), Some(FIRST));
        a.bar(FIRST);
        a.release(Some(FIRST));
        assert_eq!(own_uid(&mut a, "b", None), Some(FIRST + 1));
        assert_eq!(own_uid(&mut a, "c", None), Some(FIRST + 2));
        assert!(a.admit("d", &exec(), None, DRIVERS, &room()).is_err());
        a.release(Some(FIRST + 2));
        assert_eq!(
            own_uid(&mut a, "e", resumed(Some(FIRST))),
            Some(FIRST + 2),
            "not even to the task that had it"
        );
    }

    #[test]
    fn uids_running_at_start_are_barred_but_a_readopted_tasks_own() {
        let state = tempfile::tempdir().unwrap();
        let running = HashSet::from([FIRST, FIRST + 1]);
        let mut a = Admission::new(&config(state.path()), true, running, &[FIRST + 1]);
        assert_eq!(
            own_uid(&mut a, "adopted", resumed(Some(FIRST + 1))),
            Some(FIRST + 1)
        );
        assert_eq!(own_uid(&mut a, "new", None), Some(FIRST + 2));
        assert!(a.admit("more", &exec(), None, DRIVERS, &room()).is_err());
    }

    #[test]
    fn the_rotation_goes_on_from_the_position_kept_in_the_state_dir() {
        let state = tempfile::tempdir().unwrap();
        std::fs::write(state.path().join(UID_POSITION_FILE), format!("{}\n", FIRST + 1)).unwrap();
        let mut a = Admission::new(&config(state.path()), true, HashSet::new(), &[]);
        assert_eq!(own_uid(&mut a, "a", None), Some(FIRST + 1));

        // A position outside the range (the range changed) is ignored.
        std::fs::write(state.path().join(UID_POSITION_FILE), "12\n").unwrap();
        let mut a = Admission::new(&config(state.path()), true, HashSet::new(), &[]);
        assert_eq!(own_uid(&mut a, "a", None), Some(FIRST));
    }

    #[test]
    fn a_restart_runs_as_the_policy_says_now() {
        let (a, _state) = admission(true);
        assert_eq!(a.rerun_as(&exec(), Some(FIRST)), Some(RunAs::TaskUid(FIRST)));
        assert_eq!(a.rerun_as(&exec(), None), None, "no uid of its own to run as");
        let raw = TaskTemplate {
            driver: "raw_exec".into(),
            ..exec()
        };
        assert_eq!(a.rerun_as(&raw, None), None, "the policy refuses it now");
        let (a, _state) = admission(false);
        assert_eq!(a.rerun_as(&exec(), Some(FIRST)), Some(RunAs::Agent));
    }

    #[test]
    fn prep_input_keeps_the_rotations_position_only_for_a_new_uid() {
        let (mut a, state) = admission_with(true, |c| c.policy.allow_root = true);
        assert_eq!(own_uid(&mut a, "a", None), Some(FIRST));
        let input = |new_uid| {
            a.prep_input(
                PathBuf::from("/t/a-1"),
                Arc::new(FakeDriver::default()),
                exec(),
                RunAs::TaskUid(FIRST),
                true,
                new_uid,
            )
        };
        let new = input(true);
        assert_eq!(
            new.new_uid_position,
            Some((state.path().join(UID_POSITION_FILE), FIRST + 1))
        );
        assert!(new.allow_root && new.keep_dir);
        assert_eq!(
            (new.dir.as_path(), &new.run_as),
            (Path::new("/t/a-1"), &RunAs::TaskUid(FIRST))
        );
        assert_eq!(input(false).new_uid_position, None);
    }

    #[tokio::test]
    async fn preparing_makes_a_fresh_closed_task_dir_or_completes_a_kept_one() {
        let tasks = tempfile::tempdir().unwrap();
        let dir = tasks.path().join("t-1");
        let (a, _state) = admission(false);
        let input = |keep_dir| {
            a.prep_input(
                dir.clone(),
                Arc::new(FakeDriver::default()),
                exec(),
                RunAs::Agent,
                keep_dir,
                false,
            )
        };
        let mode = |sub: &str| {
            let meta = std::fs::metadata(dir.join(sub)).unwrap();
            meta.permissions().mode() & 0o777
        };

        let prepared = prepare(input(false))
            .await
            .unwrap_or_else(|f| panic!("{}", f.message));
        assert_eq!(prepared.task_dir, dir.join("work"));
        assert!(prepared.identity.is_none(), "the agent's own user");
        // Others may pass through to work/ (the task's own), never into
        // logs/ or fetch/.
        assert_eq!((mode(""), mode("logs"), mode("fetch")), (0o711, 0o700, 0o700));

        std::fs::write(dir.join("work/kept"), "x").unwrap();
        std::fs::remove_dir(dir.join("fetch")).unwrap();
        std::fs::set_permissions(&dir, std::fs::Permissions::from_mode(0o755)).unwrap();
        prepare(input(true))
            .await
            .unwrap_or_else(|f| panic!("{}", f.message));
        assert!(dir.join("work/kept").exists(), "a kept directory keeps its files");
        assert!(dir.join("fetch").is_dir(), "what it lacks is made again");
        assert_eq!((mode(""), mode("fetch")), (0o711, 0o700));

        prepare(input(false))
            .await
            .unwrap_or_else(|f| panic!("{}", f.message));
        assert!(!dir.join("work/kept").exists(), "a new attempt starts afresh");
    }

    #[test]
    fn capacity_counts_what_each_held_task_takes_or_may_take() {
        let state = tempfile::tempdir().unwrap();
        let config = SupervisorConfig {
            disk_budget: DiskSize::Bytes(500 * MIB),
            ..config(state.path())
        };
        let disk = DiskWatch::new(&config, state.path().join("tasks"), 1 << 40);
        let mut table = Table::new();
        for (uid, limit, used) in [
            ("a", Some("10Mi"), 3 * MIB),
            ("b", Some("10Mi"), 12 * MIB),
            ("c", None, 5 * MIB),
        ] {
            let template = match limit {
                Some(limit) => with_disk(exec(), limit),
                None => exec(),
            };
            let new = NewTask {
                uid: uid.into(),
                attempt: 1,
                name: uid.into(),
                dir: PathBuf::from("/t"),
                template,
                driver: 0,
                own_uid: None,
            };
            let mut task = Task::preparing(new, AbortHandle::new_pair().0, 64);
            task.disk_used = used;
            table.insert(task);
        }
        let c = Capacity::of(&table, &disk);
        assert_eq!(c.held, 3);
        assert_eq!(c.disk_taken, (10 + 12 + 5) * MIB);
        assert_eq!(c.disk_budget, 500 * MIB);
        assert_eq!(c.disk_full, None);
    }
}
