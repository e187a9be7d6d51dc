//! k8s4r task drivers, after Nomad's: a [`Driver`] turns a task template into
//! a running process in its own session and process group.
//!
//! - [`RawExecDriver`] runs the command as the agent's user.
//! - [`ExecDriver`] adds isolation: another user (the task's own, or one
//!   the robot allows), `no_new_privs`, a private working directory and
//!   resource limits (cgroup v2, rlimits otherwise).
//! - [`PodmanDriver`] runs it in a container from an image pinned by
//!   digest, under the same identity, limits and stop rules.
//!
//! Both start the process with only the task's declared environment plus
//! a few basics (`PATH`, `HOME`, `USER`, `LOGNAME`, `TMPDIR`) and the
//! agent's `K8S4R_TASK_*`, never the agent's own environment, and in a
//! working directory inside the task's directory.
//!
//! Who a task runs as is decided before a driver sees it ([`identity`]);
//! drivers only start processes. Waiting for them, deadlines and killing
//! belong to the agent's supervisor, which owns every running task.

use std::os::fd::OwnedFd;
use std::path::{Path, PathBuf};

use k8s4r_api::TaskTemplate;

pub mod cgroup;
mod exec;
pub mod identity;
mod launch;
pub mod leftovers;
pub mod podman;
pub mod pty;
mod raw_exec;
pub mod shim;
mod sys;

pub use cgroup::{Cgroups, LimitKind, TaskCgroup};
pub use exec::{ExecDriver, DEFAULT_PIDS_MAX};
pub use podman::{PodmanConfig, PodmanDriver};
pub use raw_exec::RawExecDriver;

/// The identity a task runs as when it is not the agent's own.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Identity {
    /// The user name (`USER` of the task; `k8s4r-<uid>` for a task uid).
    pub name: String,
    /// Its uid.
    pub uid: u32,
    /// Its primary gid.
    pub gid: u32,
    /// Supplementary gids: exactly these, nothing inherited from the agent.
    pub groups: Vec<u32>,
}

/// Resource limits taken from the task's `resources`.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct Limits {
    /// Memory in bytes.
    pub memory_bytes: Option<u64>,
    /// CPU in millicores.
    pub cpu_millis: Option<u64>,
    /// Most processes (and threads) the task may have: `pids.max` in its
    /// cgroup; without one, RLIMIT_NPROC of its own uid.
    pub pids: Option<u64>,
}

/// What a driver decided before anything is downloaded or started: who the
/// task runs as, where, and with which limits.
#[derive(Clone, Debug)]
pub struct Prepared {
    /// Set when the task runs as another user than the agent's.
    pub identity: Option<Identity>,
    /// The name of the user it runs as (its `USER`).
    pub user: String,
    /// The task's own directory (artifacts go there; the default cwd).
    pub task_dir: PathBuf,
    /// The working directory the process starts in.
    pub cwd: PathBuf,
    /// Limits to apply (exec only; empty for raw_exec).
    pub limits: Limits,
    /// Variables from the task's ConfigMaps and Secrets, set after the
    /// agent's and before the template's literal ones.
    pub config_env: ConfigEnv,
}

/// Variables from ConfigMaps and Secrets: their `Debug` names them only
/// (values may be secret).
#[derive(Clone, Default, PartialEq, Eq)]
pub struct ConfigEnv(pub Vec<(String, String)>);

impl std::fmt::Debug for ConfigEnv {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_list()
            .entries(self.0.iter().map(|(name, _)| name))
            .finish()
    }
}

/// Everything needed to start one prepared task.
pub struct Launch<'a> {
    /// The task's template.
    pub template: &'a TaskTemplate,
    /// What [`Driver::prepare`] returned.
    pub prepared: &'a Prepared,
    /// Variables the agent adds (task uid, attempt, directory).
    pub extra_env: &'a [(String, String)],
    /// Write end of the stdout pipe.
    pub stdout: OwnedFd,
    /// Write end of the stderr pipe.
    pub stderr: OwnedFd,
    /// The task's cgroup, when the agent has a writable cgroup v2 subtree.
    pub cgroup: Option<&'a TaskCgroup>,
    /// Start the command under this shim (so that it outlives the agent
    /// with its exit status kept); `None`: as the agent's own child.
    pub shim: Option<&'a shim::Shim>,
    /// The command's stdin (a session's pipe or pty); `None`: empty. Not
    /// used under a shim (tasks have no stdin).
    pub stdin: Option<OwnedFd>,
    /// Make stdin the command's controlling terminal (a pty's slave), as a
    /// login does.
    pub terminal: bool,
    /// A command beside the running task (a health check, a `preStop`, a
    /// session), not the task's own process: a container driver runs it
    /// inside the task's container.
    pub beside_task: bool,
}

/// A started process: the leader of its own session and process group.
#[derive(Debug)]
pub struct Launched {
    /// The process; the supervisor waits on it.
    pub child: tokio::process::Child,
    /// Its pid (the shim's, when it runs under one: the process the
    /// supervisor waits for).
    pub pid: u32,
    /// Its process group: the command's pid (it leads its own group; under
    /// a shim, the shim is not in it).
    pub pgid: i32,
    /// Limits that could not be applied, if any.
    pub unapplied_limits: Vec<LimitKind>,
}

/// Why a driver could not prepare or start a task.
#[derive(Debug, thiserror::Error)]
pub enum DriverError {
    /// The task's `user` does not exist on this robot.
    #[error("unknown user {user:?}")]
    UnknownUser {
        /// The user name.
        user: String,
    },
    /// The user database could not be read.
    #[error("cannot look up user {user:?}: {source}")]
    UserLookup {
        /// The user name.
        user: String,
        /// The lookup error.
        source: nix::Error,
    },
    /// The task's group does not exist on this robot.
    #[error("unknown group {group:?}")]
    UnknownGroup {
        /// The group name.
        group: String,
    },
    /// The agent is not root and the task wants another user.
    #[error("the agent runs as uid {agent_uid} and cannot switch to user {user:?}")]
    CannotSwitchUser {
        /// The requested user.
        user: String,
        /// The agent's uid.
        agent_uid: u32,
    },
    /// The agent is not root and cannot give the task supplementary groups.
    #[error("the agent runs as uid {agent_uid} and cannot grant supplementary groups")]
    CannotGrantGroups {
        /// The agent's uid.
        agent_uid: u32,
    },
    /// The task would run as root and the robot does not allow that.
    #[error("user {user:?} is root (uid 0); the robot does not run tasks as root (allow_root = false)")]
    RootNotAllowed {
        /// The user name.
        user: String,
    },
    /// The working directory does not exist or is not a directory.
    #[error("working directory {} does not exist or is not a directory", path.display())]
    MissingWorkingDir {
        /// The resolved path.
        path: PathBuf,
    },
    /// The working directory leads out of the task's directory (through a
    /// symbolic link).
    #[error("working directory {} leads out of the task directory", path.display())]
    WorkingDirOutside {
        /// The path as the task gave it, joined to its directory.
        path: PathBuf,
    },
    /// The command is not a file (nor found in PATH).
    #[error("command {command:?} not found")]
    CommandNotFound {
        /// The command.
        command: String,
    },
    /// The command exists but may not be executed by the task's user.
    #[error("command {command:?} cannot be executed: permission denied")]
    PermissionDenied {
        /// The command.
        command: String,
    },
    /// Any other failure of fork/exec.
    #[error("cannot start {command:?}: {source}")]
    Spawn {
        /// The command.
        command: String,
        /// The error.
        source: std::io::Error,
    },
    /// The task directory could not be prepared.
    #[error("cannot prepare task directory {}: {source}", path.display())]
    TaskDir {
        /// The directory.
        path: PathBuf,
        /// The error.
        source: std::io::Error,
    },
    /// The image is not on the robot and could not be pulled.
    #[error("image {image} is unavailable: {why}")]
    ImageUnavailable {
        /// The image, by digest.
        image: String,
        /// Why (the pull's last message).
        why: String,
    },
    /// The task names a device the robot's configuration does not allow.
    #[error("device {device:?} is not one this robot gives containers (podman_devices)")]
    DeviceNotAllowed {
        /// The device as the task names it.
        device: String,
    },
    /// The resources could not be turned into limits.
    #[error("invalid resources: {0}")]
    InvalidResources(String),
    /// A limit this robot can only apply as an rlimit (no cgroup for it)
    /// is larger than the target's `rlim_t` holds (32 bits on armv7).
    #[error("{field} is {value}, more than this robot can set as a resource limit without a cgroup (at most {max})")]
    LimitTooLarge {
        /// The field (or agent setting) that asked for the limit.
        field: &'static str,
        /// The limit asked for.
        value: u64,
        /// The largest limit the target can hold.
        max: u64,
    },
}

impl DriverError {
    /// True when the spec itself is at fault (reported as InvalidSpec rather
    /// than StartFailed).
    pub fn is_invalid_spec(&self) -> bool {
        matches!(
            self,
            DriverError::InvalidResources(_)
                | DriverError::LimitTooLarge {
                    field: "resources.memory",
                    ..
                }
        )
    }

    /// True when the robot's policy refuses the task (reported as
    /// NotPermitted).
    pub fn is_not_permitted(&self) -> bool {
        matches!(
            self,
            DriverError::RootNotAllowed { .. }
                | DriverError::WorkingDirOutside { .. }
                | DriverError::DeviceNotAllowed { .. }
        )
    }
}

/// A way of running a task's command.
pub trait Driver: Send + Sync {
    /// The name tasks use in `spec.driver`.
    fn name(&self) -> &'static str;

    /// Takes the identity decided for the task (None: the agent's own),
    /// resolves limits and the working directory and prepares the task
    /// directory (which must exist). Nothing is started.
    fn prepare(
        &self,
        template: &TaskTemplate,
        task_dir: &Path,
        identity: Option<Identity>,
    ) -> Result<Prepared, DriverError>;

    /// Starts the process in its own session (and process group), inside
    /// the cgroup when there is one. Must be called within a tokio runtime.
    fn start(&self, launch: Launch<'_>) -> Result<Launched, DriverError>;

    /// Called as the task's process group is sent SIGKILL (on a kill, and
    /// once its process has ended), for what the group does not hold (a
    /// container's processes, the container itself). Must not block: it
    /// runs on the supervisor's thread.
    fn kill_beyond_group(&self, _task_dir: &Path) {}
}

/// The working directory a task asks for, resolved against its directory:
/// it must stay inside it, also through symbolic links. (The spec's
/// validation already refuses absolute paths and `..`.)
pub(crate) fn resolve_cwd(template: &TaskTemplate, task_dir: &Path) -> Result<PathBuf, DriverError> {
    let Some(dir) = &template.working_dir else {
        return Ok(task_dir.to_path_buf());
    };
    let cwd = task_dir.join(dir);
    if !k8s4r_api::validation::is_inside_task_dir(dir) {
        return Err(DriverError::WorkingDirOutside { path: cwd });
    }
    let (Ok(real), Ok(base)) = (cwd.canonicalize(), task_dir.canonicalize()) else {
        return Err(DriverError::MissingWorkingDir { path: cwd });
    };
    if !real.starts_with(&base) {
        return Err(DriverError::WorkingDirOutside { path: cwd });
    }
    if real.is_dir() {
        Ok(real)
    } else {
        Err(DriverError::MissingWorkingDir { path: cwd })
    }
}

/// The environment every task starts from (the agent's own is never
/// passed on): a fixed PATH, the user's names, HOME and TMPDIR in its
/// directory.
pub(crate) fn base_env(user: &str, task_dir: &Path) -> Vec<(String, String)> {
    let dir = task_dir.display().to_string();
    vec![
        ("PATH".to_owned(), DEFAULT_PATH.to_owned()),
        ("HOME".to_owned(), dir.clone()),
        ("TMPDIR".to_owned(), dir),
        ("USER".to_owned(), user.to_owned()),
        ("LOGNAME".to_owned(), user.to_owned()),
    ]
}

/// The name of the user a task runs as: its identity's, else the agent's
/// (looked up; the uid as text when it has no name).
pub(crate) fn user_name(identity: Option<&Identity>) -> String {
    match identity {
        Some(identity) => identity.name.clone(),
        None => {
            let uid = nix::unistd::geteuid();
            nix::unistd::User::from_uid(uid)
                .ok()
                .flatten()
                .map_or_else(|| uid.to_string(), |u| u.name)
        }
    }
}

/// PATH of a task that does not set its own.
pub const DEFAULT_PATH: &str = "/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin";

/// The nice value of the agent's deadline thread: the robot's own software
/// and the tasks (at 0) never keep a SIGTERM or SIGKILL waiting for the
/// CPU, while a busy robot still runs them.
pub const SUPERVISOR_NICE: i32 = -5;

/// Gives the calling thread [`SUPERVISOR_NICE`], where the agent may (as
/// root); says why not otherwise, at debug level.
pub fn favour_current_thread() {
    if let Err(e) = sys::set_thread_nice(SUPERVISOR_NICE) {
        tracing::debug!(error = %e, "the supervisor's thread keeps the default priority");
    }
}
