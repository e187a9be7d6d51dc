//! `exec`: the command isolated. Another user (when the agent is root),
//! `no_new_privs`, a private task directory, a clean environment and
//! resource limits: cgroup v2 where the agent has a writable subtree with
//! the controllers, rlimits otherwise.

use std::os::unix::fs::PermissionsExt;
use std::path::Path;
use std::sync::atomic::{AtomicBool, Ordering};

use k8s4r_api::task::DRIVER_EXEC;
use k8s4r_api::TaskTemplate;
use nix::unistd::{geteuid, User};

use crate::launch::{self, Isolation};
use crate::{resolve_cwd, Driver, DriverError, Identity, Launch, Launched, LimitKind, Limits, Prepared};

/// PATH of an exec task that does not set its own.
const DEFAULT_PATH: &str = "/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin";

/// Runs tasks as an unprivileged user with limits.
#[derive(Debug)]
pub struct ExecDriver {
    default_user: String,
    pids_max: Option<u64>,
    warned: AtomicBool,
}

impl ExecDriver {
    /// `default_user` is used when the agent is root and the task names no
    /// user.
    pub fn new(default_user: impl Into<String>) -> Self {
        ExecDriver {
            default_user: default_user.into(),
            pids_max: Some(4096),
            warned: AtomicBool::new(false),
        }
    }

    /// The `pids.max` of every exec task (None: no limit).
    pub fn with_pids_max(mut self, pids_max: Option<u64>) -> Self {
        self.pids_max = pids_max;
        self
    }

    fn identity(&self, template: &TaskTemplate) -> Result<Option<Identity>, DriverError> {
        let agent = geteuid();
        let name = match (&template.user, agent.is_root()) {
            (Some(user), _) => user.clone(),
            (None, true) => self.default_user.clone(),
            (None, false) => return Ok(None),
        };
        let user = User::from_name(&name)
            .map_err(|source| DriverError::UserLookup {
                user: name.clone(),
                source,
            })?
            .ok_or_else(|| DriverError::UnknownUser { user: name.clone() })?;
        if agent.is_root() {
            Ok(Some(Identity {
                name,
                uid: user.uid.as_raw(),
                gid: user.gid.as_raw(),
            }))
        } else if user.uid == agent {
            Ok(None)
        } else {
            Err(DriverError::CannotSwitchUser {
                user: name,
                agent_uid: agent.as_raw(),
            })
        }
    }

    fn limits(&self, template: &TaskTemplate) -> Result<Limits, DriverError> {
        let mut limits = Limits {
            pids: self.pids_max,
            ..Limits::default()
        };
        if let Some(resources) = &template.resources {
            if let Some(memory) = &resources.memory {
                limits.memory_bytes = Some(
                    memory
                        .to_units()
                        .map_err(|e| DriverError::InvalidResources(e.to_string()))?,
                );
            }
            if let Some(cpu) = &resources.cpu {
                limits.cpu_millis = Some(
                    cpu.to_milli()
                        .map_err(|e| DriverError::InvalidResources(e.to_string()))?,
                );
            }
        }
        Ok(limits)
    }
}

impl Driver for ExecDriver {
    fn name(&self) -> &'static str {
        DRIVER_EXEC
    }

    fn prepare(&self, template: &TaskTemplate, task_dir: &Path) -> Result<Prepared, DriverError> {
        let identity = self.identity(template)?;
        let limits = self.limits(template)?;
        let dir_error = |source| DriverError::TaskDir {
            path: task_dir.to_path_buf(),
            source,
        };
        if let Some(identity) = &identity {
            std::os::unix::fs::chown(task_dir, Some(identity.uid), Some(identity.gid)).map_err(dir_error)?;
        }
        std::fs::set_permissions(task_dir, std::fs::Permissions::from_mode(0o700)).map_err(dir_error)?;
        Ok(Prepared {
            identity,
            task_dir: task_dir.to_path_buf(),
            cwd: resolve_cwd(template, task_dir)?,
            limits,
        })
    }

    fn start(&self, launch: Launch<'_>) -> Result<Launched, DriverError> {
        let limits = launch.prepared.limits;
        let unapplied = match launch.cgroup {
            Some(cgroup) => cgroup.apply(&limits),
            None => [
                (LimitKind::Memory, limits.memory_bytes.is_some()),
                (LimitKind::Cpu, limits.cpu_millis.is_some()),
                (LimitKind::Pids, limits.pids.is_some()),
            ]
            .into_iter()
            .filter_map(|(kind, set)| set.then_some(kind))
            .collect(),
        };
        let address_space = if unapplied.contains(&LimitKind::Memory) {
            limits.memory_bytes
        } else {
            None
        };
        if !unapplied.is_empty() && !self.warned.swap(true, Ordering::Relaxed) {
            let names: Vec<String> = unapplied.iter().map(ToString::to_string).collect();
            tracing::warn!(
                limits = %names.join(","),
                "exec: no writable cgroup v2 subtree with these controllers; memory falls back to \
                 RLIMIT_AS (address space, not resident memory), cpu and pids limits are NOT enforced \
                 (reported once)"
            );
        }
        let (user, home) = match &launch.prepared.identity {
            Some(identity) => (identity.name.clone(), launch.prepared.task_dir.clone()),
            None => (
                std::env::var("USER").unwrap_or_else(|_| "root".to_owned()),
                launch.prepared.task_dir.clone(),
            ),
        };
        let clean_env = vec![
            ("PATH".to_owned(), DEFAULT_PATH.to_owned()),
            ("HOME".to_owned(), home.display().to_string()),
            ("USER".to_owned(), user.clone()),
            ("LOGNAME".to_owned(), user),
        ];
        let mut launched = launch::spawn(
            launch,
            Isolation {
                clean_env: Some(clean_env),
                no_new_privs: true,
                address_space,
            },
        )?;
        launched.unapplied_limits = unapplied;
        Ok(launched)
    }
}
