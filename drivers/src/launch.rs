//! Building and spawning the command, shared by both drivers.

use std::io::ErrorKind;
use std::process::Stdio;

use nix::unistd::{Gid, Uid};

use crate::sys::{self, ChildSetup, SwitchUser};
use crate::{DriverError, Launch, Launched};

/// How a driver wants the process set up.
pub(crate) struct Isolation {
    /// The environment the task starts from, before the agent's
    /// `K8S4R_TASK_*` and the task's own variables: never the agent's.
    pub base_env: Vec<(String, String)>,
    pub no_new_privs: bool,
    /// RLIMIT_AS, for a task without a memory-limited cgroup.
    pub address_space: Option<nix::libc::rlim_t>,
    /// RLIMIT_NPROC, for a task without a pids-limited cgroup.
    pub processes: Option<nix::libc::rlim_t>,
}

pub(crate) fn spawn(launch: Launch<'_>, isolation: Isolation) -> Result<Launched, DriverError> {
    let template = launch.template;
    let prepared = launch.prepared;
    let mut command = tokio::process::Command::new(&template.command);
    command.args(&template.args);
    command.env_clear();
    command.envs(isolation.base_env.iter().map(|(k, v)| (k, v)));
    command.envs(launch.extra_env.iter().map(|(k, v)| (k, v)));
    command.envs(template.env.iter().map(|var| (&var.name, &var.value)));
    command.current_dir(&prepared.cwd);
    command.stdin(Stdio::null());
    command.stdout(Stdio::from(launch.stdout));
    command.stderr(Stdio::from(launch.stderr));
    // The supervisor kills the whole group itself; a dropped handle (agent
    // crash, runtime teardown) must not kill the task behind its back.
    command.kill_on_drop(false);
    let cgroup_procs = match launch.cgroup {
        Some(cgroup) => Some(cgroup.open_procs().map_err(|source| DriverError::Spawn {
            command: template.command.clone(),
            source,
        })?),
        None => None,
    };
    // The user is switched in the pre-exec hook rather than by
    // `Command::uid`, which can only drop every supplementary group.
    let switch_user = prepared.identity.as_ref().map(|identity| SwitchUser {
        uid: Uid::from_raw(identity.uid),
        gid: Gid::from_raw(identity.gid),
        groups: identity.groups.iter().map(|g| Gid::from_raw(*g)).collect(),
    });
    sys::install(
        &mut command,
        ChildSetup {
            cgroup_procs,
            switch_user,
            no_new_privs: isolation.no_new_privs,
            address_space: isolation.address_space,
            processes: isolation.processes,
        },
    );
    let child = command.spawn().map_err(|source| match source.kind() {
        ErrorKind::NotFound => DriverError::CommandNotFound {
            command: template.command.clone(),
        },
        ErrorKind::PermissionDenied => DriverError::PermissionDenied {
            command: template.command.clone(),
        },
        _ => DriverError::Spawn {
            command: template.command.clone(),
            source,
        },
    })?;
    let pid = child.id().ok_or_else(|| DriverError::Spawn {
        command: template.command.clone(),
        source: std::io::Error::other("process exited before its pid was read"),
    })?;
    Ok(Launched {
        child,
        pid,
        pgid: pid as i32,
        unapplied_limits: Vec::new(),
    })
}
