//! Building and spawning the command, shared by both drivers.

use std::io::ErrorKind;
use std::process::Stdio;

use crate::sys::{self, ChildSetup};
use crate::{DriverError, Launch, Launched};

/// How a driver wants the process set up.
pub(crate) struct Isolation {
    /// Start from an empty environment plus these defaults (exec), or
    /// inherit the agent's (raw_exec).
    pub clean_env: Option<Vec<(String, String)>>,
    pub no_new_privs: bool,
    pub address_space: Option<u64>,
}

pub(crate) fn spawn(launch: Launch<'_>, isolation: Isolation) -> Result<Launched, DriverError> {
    let template = launch.template;
    let prepared = launch.prepared;
    let mut command = tokio::process::Command::new(&template.command);
    command.args(&template.args);
    if let Some(defaults) = &isolation.clean_env {
        command.env_clear();
        command.envs(defaults.iter().map(|(k, v)| (k, v)));
    }
    command.envs(launch.extra_env.iter().map(|(k, v)| (k, v)));
    command.envs(template.env.iter().map(|var| (&var.name, &var.value)));
    command.current_dir(&prepared.cwd);
    command.stdin(Stdio::null());
    command.stdout(Stdio::from(launch.stdout));
    command.stderr(Stdio::from(launch.stderr));
    // The supervisor kills the whole group itself; a dropped handle (agent
    // crash, runtime teardown) must not kill the task behind its back.
    command.kill_on_drop(false);
    if let Some(identity) = &prepared.identity {
        command.uid(identity.uid);
        command.gid(identity.gid);
    }
    let cgroup_procs = match launch.cgroup {
        Some(cgroup) => Some(cgroup.open_procs().map_err(|source| DriverError::Spawn {
            command: template.command.clone(),
            source,
        })?),
        None => None,
    };
    sys::install(
        &mut command,
        ChildSetup {
            cgroup_procs,
            no_new_privs: isolation.no_new_privs,
            address_space: isolation.address_space,
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
