//! Building and spawning the command, shared by both drivers.

use std::io::ErrorKind;
use std::os::fd::AsRawFd;
use std::process::Stdio;

use nix::fcntl::OFlag;
use nix::unistd::{Gid, Uid};

use crate::shim::{Orders, Shim};
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
    /// A pidfile whose process the shim's fence kills with the group (a
    /// container's PID 1).
    pub kill_also: Option<std::path::PathBuf>,
}

pub(crate) fn spawn(launch: Launch<'_>, isolation: Isolation) -> Result<Launched, DriverError> {
    let template = launch.template;
    let prepared = launch.prepared;
    let vars = || {
        let base = isolation
            .base_env
            .iter()
            .chain(launch.extra_env.iter())
            .chain(prepared.config_env.0.iter());
        // A variable from a ConfigMap or Secret has its value in
        // `config_env`, not in the template.
        base.map(|(k, v)| (k.as_str(), v.as_str())).chain(
            template
                .env
                .iter()
                .filter(|var| var.value_from.is_none())
                .map(|var| (var.name.as_str(), var.value.as_str())),
        )
    };
    let spawn_error = |source| DriverError::Spawn {
        command: template.command.clone(),
        source,
    };
    let mut command = tokio::process::Command::new(match launch.shim {
        Some(shim) => shim.program.as_path(),
        None => std::path::Path::new(&template.command),
    });
    command.env_clear();
    // The shim runs as the agent's user: nothing of the task's (its
    // environment, its directory) may reach it. It gets the command's
    // environment on its stdin and starts the command in its directory.
    let env_pipe = match launch.shim {
        Some(shim) => {
            command.args(shim_orders(shim, prepared, &isolation).to_args());
            command.arg(&template.command);
            command.current_dir("/");
            let (read, write) = nix::unistd::pipe2(OFlag::O_CLOEXEC).map_err(|e| spawn_error(e.into()))?;
            command.stdin(Stdio::from(read));
            Some(write)
        }
        None => {
            command.envs(vars());
            command.current_dir(&prepared.cwd);
            command.stdin(match launch.stdin {
                Some(fd) => Stdio::from(fd),
                None => Stdio::null(),
            });
            None
        }
    };
    command.args(&template.args);
    command.stdout(Stdio::from(launch.stdout));
    command.stderr(Stdio::from(launch.stderr));
    // The supervisor kills the whole group itself; a dropped handle (agent
    // crash, runtime teardown) must not kill the task behind its back.
    command.kill_on_drop(false);
    let cgroup_procs = match launch.cgroup {
        Some(cgroup) => Some(cgroup.open_procs().map_err(spawn_error)?),
        None => None,
    };
    let report = match launch.shim {
        Some(_) => Some(nix::unistd::pipe2(OFlag::O_CLOEXEC).map_err(|e| spawn_error(e.into()))?),
        None => None,
    };
    let report_fd = report.as_ref().map(|(_, write)| write.as_raw_fd());
    sys::install(
        &mut command,
        child_setup(
            launch.shim.is_none(),
            launch.terminal && launch.shim.is_none(),
            prepared,
            &isolation,
            report_fd,
            cgroup_procs,
        ),
    );
    let child = command.spawn().map_err(|source| start_error(template, source))?;
    drop(command);
    let pid = child.id().ok_or_else(|| DriverError::Spawn {
        command: template.command.clone(),
        source: std::io::Error::other("process exited before its pid was read"),
    })?;
    // The command's group: the shim's child leads its own.
    let pgid = match (env_pipe, report) {
        (Some(env), Some(report)) => shim_handover(env, &crate::shim::encode_env(vars()), report)
            .map_err(|source| start_error(template, source))?,
        _ => pid as i32,
    };
    Ok(Launched {
        child,
        pid,
        pgid,
        unapplied_limits: Vec::new(),
    })
}

/// What the child of `spawn` does before exec: all of it when it is the
/// command (`direct`); only its session, cgroup and report pipe when it is
/// the shim, whose own child switches user and takes the limits (the shim
/// stays the agent's user, with its OOM score).
fn child_setup(
    direct: bool,
    terminal: bool,
    prepared: &crate::Prepared,
    isolation: &Isolation,
    report_fd: Option<std::os::fd::RawFd>,
    cgroup_procs: Option<std::fs::File>,
) -> ChildSetup {
    // The user is switched in the pre-exec hook rather than by
    // `Command::uid`, which can only drop every supplementary group.
    let switch_user = prepared.identity.as_ref().map(|identity| SwitchUser {
        uid: Uid::from_raw(identity.uid),
        gid: Gid::from_raw(identity.gid),
        groups: identity.groups.iter().map(|g| Gid::from_raw(*g)).collect(),
    });
    ChildSetup {
        new_session: true,
        new_group: false,
        controlling_terminal: terminal,
        reset_oom_score: direct,
        // A task started without a shim gets its signals as one under a
        // shim does (the shim resets them for its command).
        unblock_signals: direct,
        report_fd,
        cgroup_procs,
        switch_user: switch_user.filter(|_| direct),
        no_new_privs: isolation.no_new_privs && direct,
        address_space: isolation.address_space.filter(|_| direct),
        processes: isolation.processes.filter(|_| direct),
    }
}

/// Gives a started shim the command's environment, then reads whether it
/// started the command: the command's pid (its group's id).
fn shim_handover(
    env_pipe: std::os::fd::OwnedFd,
    env: &[u8],
    (read, write): (std::os::fd::OwnedFd, std::os::fd::OwnedFd),
) -> std::io::Result<i32> {
    // The shim reads it all before it starts the command; a shim that died
    // first makes this fail, and its report says why.
    let _ = std::io::Write::write_all(&mut std::fs::File::from(env_pipe), env);
    drop(write);
    // A shim that could not start the command ends at once (127); its
    // zombie is reaped with the other orphans of the supervisor.
    shim_started(read)
}

fn start_error(template: &k8s4r_api::TaskTemplate, source: std::io::Error) -> DriverError {
    match source.kind() {
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
    }
}

/// What the shim is to do besides starting the command.
// `rlim_t` is `u64` on 64-bit targets, where the conversion is an identity.
#[allow(clippy::useless_conversion)]
fn shim_orders(shim: &Shim, prepared: &crate::Prepared, isolation: &Isolation) -> Orders {
    Orders {
        status_file: shim.status_file.clone(),
        cwd: prepared.cwd.clone(),
        user: prepared
            .identity
            .as_ref()
            .map(|i| (i.uid, i.gid, i.groups.clone())),
        no_new_privs: isolation.no_new_privs,
        address_space: isolation.address_space.map(u64::from),
        processes: isolation.processes.map(u64::from),
        fence_ms: shim
            .fence
            .map(|d| u64::try_from(d.as_millis()).unwrap_or(u64::MAX)),
        kill_also: isolation.kill_also.clone(),
    }
}

/// Reads the shim's report: the command's pid if it started (the error of
/// its exec when not).
fn shim_started(read: std::os::fd::OwnedFd) -> std::io::Result<i32> {
    use std::io::Read;
    let mut report = String::new();
    std::fs::File::from(read).take(64).read_to_string(&mut report)?;
    match report.trim_end().split_once(' ') {
        Some(("ok", pid)) => pid
            .parse::<i32>()
            .ok()
            .filter(|pid| *pid > 1)
            .ok_or_else(|| std::io::Error::other("the task shim reported no pid")),
        Some(("err", errno)) => match errno.parse::<i32>() {
            Ok(errno) if errno != 0 => Err(std::io::Error::from_raw_os_error(errno)),
            _ => Err(std::io::Error::other("the task shim could not start the command")),
        },
        _ => Err(std::io::Error::other(
            "the task shim ended before it started the command",
        )),
    }
}
