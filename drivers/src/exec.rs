//! `exec`: the command isolated. Another user (when the agent is root: a
//! uid of the task's own, or a user the robot allows), `no_new_privs`, a
//! private task directory, a clean environment and resource limits: cgroup
//! v2 where the agent has a writable subtree with the controllers, rlimits
//! otherwise.

use std::os::unix::fs::PermissionsExt;
use std::path::Path;
use std::sync::atomic::{AtomicBool, Ordering};

use k8s4r_api::task::DRIVER_EXEC;
use k8s4r_api::TaskTemplate;

use crate::launch::{self, Isolation};
use crate::{
    base_env, resolve_cwd, user_name, Driver, DriverError, Identity, Launch, Launched, LimitKind, Limits,
    Prepared,
};

/// The `pids.max` of an exec task when the agent sets none.
pub const DEFAULT_PIDS_MAX: u64 = 4096;

/// Runs tasks as an unprivileged user with limits.
#[derive(Debug)]
pub struct ExecDriver {
    pids_max: Option<u64>,
    warned: AtomicBool,
}

impl Default for ExecDriver {
    fn default() -> Self {
        ExecDriver {
            pids_max: Some(DEFAULT_PIDS_MAX),
            warned: AtomicBool::new(false),
        }
    }
}

impl ExecDriver {
    /// An exec driver with the default `pids.max`.
    pub fn new() -> Self {
        Self::default()
    }

    /// The `pids.max` of every exec task (None: no limit).
    pub fn with_pids_max(mut self, pids_max: Option<u64>) -> Self {
        self.pids_max = pids_max;
        self
    }
}

/// The limits of a task from its `resources`, with `pids` as the robot
/// sets it.
pub(crate) fn limits_of(template: &TaskTemplate, pids: Option<u64>) -> Result<Limits, DriverError> {
    let mut limits = Limits {
        pids,
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

impl Driver for ExecDriver {
    fn name(&self) -> &'static str {
        DRIVER_EXEC
    }

    fn prepare(
        &self,
        template: &TaskTemplate,
        task_dir: &Path,
        identity: Option<Identity>,
    ) -> Result<Prepared, DriverError> {
        let limits = limits_of(template, self.pids_max)?;
        let dir_error = |source| DriverError::TaskDir {
            path: task_dir.to_path_buf(),
            source,
        };
        if let Some(identity) = &identity {
            std::os::unix::fs::chown(task_dir, Some(identity.uid), Some(identity.gid)).map_err(dir_error)?;
        }
        std::fs::set_permissions(task_dir, std::fs::Permissions::from_mode(0o700)).map_err(dir_error)?;
        Ok(Prepared {
            user: user_name(identity.as_ref()),
            identity,
            task_dir: task_dir.to_path_buf(),
            cwd: resolve_cwd(template, task_dir)?,
            limits,
            config_env: Default::default(),
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
        let address_space = match unapplied.contains(&LimitKind::Memory) {
            true => rlimit("resources.memory", limits.memory_bytes)?,
            false => None,
        };
        // Without pids.max, RLIMIT_NPROC bounds the processes of the task's
        // uid: exactly the task's when the uid is its own. (Root ignores it.)
        let processes = match unapplied.contains(&LimitKind::Pids) {
            true => rlimit("task_pids_max", limits.pids)?,
            false => None,
        };
        if !unapplied.is_empty() && !self.warned.swap(true, Ordering::Relaxed) {
            let names: Vec<String> = unapplied.iter().map(ToString::to_string).collect();
            tracing::warn!(
                limits = %names.join(","),
                "exec: no writable cgroup v2 subtree with these controllers; memory falls back to \
                 RLIMIT_AS (address space, not resident memory), pids to RLIMIT_NPROC of the task's \
                 uid, cpu is NOT enforced (reported once)"
            );
        }
        let env = base_env(&launch.prepared.user, &launch.prepared.task_dir);
        let mut launched = launch::spawn(
            launch,
            Isolation {
                base_env: env,
                no_new_privs: true,
                address_space,
                processes,
                kill_also: None,
            },
        )?;
        launched.unapplied_limits = unapplied;
        Ok(launched)
    }
}

/// A limit as the target's `rlim_t`, which is 32 bits on 32-bit glibc
/// targets (armv7): a value that does not fit is refused with the field
/// that asked for it, never wrapped into a smaller limit.
// On 64-bit targets `rlim_t` is `u64` and both conversions are identities.
#[allow(clippy::unnecessary_fallible_conversions, clippy::useless_conversion)]
fn rlimit(field: &'static str, value: Option<u64>) -> Result<Option<nix::libc::rlim_t>, DriverError> {
    value
        .map(|value| {
            nix::libc::rlim_t::try_from(value).map_err(|_| DriverError::LimitTooLarge {
                field,
                value,
                max: u64::from(nix::libc::rlim_t::MAX),
            })
        })
        .transpose()
}

#[cfg(test)]
mod rlimit_tests {
    use super::*;

    #[test]
    fn an_rlimit_that_fits_passes_and_none_stays_none() {
        assert_eq!(rlimit("resources.memory", None).unwrap(), None);
        assert_eq!(
            rlimit("resources.memory", Some(64 << 20)).unwrap(),
            Some(64 << 20)
        );
    }

    #[test]
    #[allow(clippy::useless_conversion)] // u64 to u64 on 64-bit targets
    fn an_rlimit_past_the_targets_rlim_t_is_refused_with_its_field() {
        let too_big = u64::from(u32::MAX) + 1;
        match rlimit("resources.memory", Some(too_big)) {
            // 64-bit targets hold it whole.
            Ok(limit) if size_of::<nix::libc::rlim_t>() == 8 => {
                assert_eq!(limit.map(u64::from), Some(too_big))
            }
            Ok(limit) => panic!("{too_big} wrapped to {limit:?} on a 32-bit rlim_t"),
            Err(e) => {
                assert!(e.is_invalid_spec());
                assert!(e.to_string().starts_with("resources.memory is 4294967296"), "{e}");
            }
        }
    }
}
