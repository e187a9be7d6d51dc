//! k8s4r task drivers, after Nomad's: a [`Driver`] turns a task template into
//! a running process in its own session and process group.
//!
//! - [`RawExecDriver`] runs the command as the agent's user.
//! - [`ExecDriver`] adds isolation: another user, `no_new_privs`, a private
//!   working directory and resource limits (cgroup v2, rlimits otherwise).
//!
//! Both only start processes. Waiting for them, deadlines and killing belong
//! to the agent's supervisor, which owns every running task.

use std::os::fd::OwnedFd;
use std::path::{Path, PathBuf};

use k8s4r_api::TaskTemplate;

pub mod cgroup;
mod exec;
mod launch;
mod raw_exec;
mod sys;

pub use cgroup::{Cgroups, LimitKind, TaskCgroup};
pub use exec::ExecDriver;
pub use raw_exec::RawExecDriver;

/// The identity a task runs as when it is not the agent's own.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Identity {
    /// The user name.
    pub name: String,
    /// Its uid.
    pub uid: u32,
    /// Its primary gid.
    pub gid: u32,
}

/// Resource limits taken from the task's `resources`.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct Limits {
    /// Memory in bytes.
    pub memory_bytes: Option<u64>,
    /// CPU in millicores.
    pub cpu_millis: Option<u64>,
    /// Most processes (and threads) the task may have.
    pub pids: Option<u64>,
}

/// What a driver decided before anything is downloaded or started: who the
/// task runs as, where, and with which limits.
#[derive(Clone, Debug)]
pub struct Prepared {
    /// Set when the task runs as another user than the agent's.
    pub identity: Option<Identity>,
    /// The task's own directory (artifacts go there; the default cwd).
    pub task_dir: PathBuf,
    /// The working directory the process starts in.
    pub cwd: PathBuf,
    /// Limits to apply (exec only; empty for raw_exec).
    pub limits: Limits,
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
}

/// A started process: the leader of its own session and process group.
#[derive(Debug)]
pub struct Launched {
    /// The process; the supervisor waits on it.
    pub child: tokio::process::Child,
    /// Its pid.
    pub pid: u32,
    /// Its process group (equal to the pid: it called setsid).
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
    /// The agent is not root and the task wants another user.
    #[error("the agent runs as uid {agent_uid} and cannot switch to user {user:?}")]
    CannotSwitchUser {
        /// The requested user.
        user: String,
        /// The agent's uid.
        agent_uid: u32,
    },
    /// The working directory does not exist or is not a directory.
    #[error("working directory {} does not exist or is not a directory", path.display())]
    MissingWorkingDir {
        /// The resolved path.
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
    /// The resources could not be turned into limits.
    #[error("invalid resources: {0}")]
    InvalidResources(String),
}

impl DriverError {
    /// True when the spec itself is at fault (reported as InvalidSpec rather
    /// than StartFailed).
    pub fn is_invalid_spec(&self) -> bool {
        matches!(self, DriverError::InvalidResources(_))
    }
}

/// A way of running a task's command.
pub trait Driver: Send + Sync {
    /// The name tasks use in `spec.driver`.
    fn name(&self) -> &'static str;

    /// Resolves the user, limits and working directory and prepares the
    /// task directory (which must exist). Nothing is started.
    fn prepare(&self, template: &TaskTemplate, task_dir: &Path) -> Result<Prepared, DriverError>;

    /// Starts the process in its own session (and process group), inside
    /// the cgroup when there is one. Must be called within a tokio runtime.
    fn start(&self, launch: Launch<'_>) -> Result<Launched, DriverError>;
}

/// The working directory a task asks for, resolved against its directory.
pub(crate) fn resolve_cwd(template: &TaskTemplate, task_dir: &Path) -> Result<PathBuf, DriverError> {
    let cwd = match &template.working_dir {
        Some(dir) => task_dir.join(dir),
        None => task_dir.to_path_buf(),
    };
    if cwd.is_dir() {
        Ok(cwd)
    } else {
        Err(DriverError::MissingWorkingDir { path: cwd })
    }
}
