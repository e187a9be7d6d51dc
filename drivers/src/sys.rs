//! The one place with `unsafe`: the code that runs in the forked child
//! between fork and exec. Only async-signal-safe calls happen there (no
//! allocation): everything it needs is prepared in the parent.

use std::fs::File;

use nix::sys::resource::{setrlimit, Resource};

/// What the child does to itself before exec.
pub(crate) struct ChildSetup {
    /// `cgroup.procs` of the task's cgroup, opened by the parent; writing
    /// "0" moves the child there before it can fork anything.
    pub cgroup_procs: Option<File>,
    /// Set `no_new_privs` so setuid binaries cannot regain privileges.
    pub no_new_privs: bool,
    /// RLIMIT_AS in bytes (the fallback for a memory limit).
    pub address_space: Option<u64>,
}

/// Installs the pre-exec hook: new session (so the child leads its own
/// process group), cgroup, no_new_privs, rlimits. std applies uid/gid before
/// this runs; the cgroup write is still allowed because the kernel checks
/// the credentials of whoever opened `cgroup.procs`.
pub(crate) fn install(command: &mut tokio::process::Command, setup: ChildSetup) {
    let hook = move || -> std::io::Result<()> {
        nix::unistd::setsid()?;
        if let Some(procs) = &setup.cgroup_procs {
            nix::unistd::write(procs, b"0")?;
        }
        if setup.no_new_privs {
            nix::sys::prctl::set_no_new_privs()?;
        }
        if let Some(bytes) = setup.address_space {
            setrlimit(Resource::RLIMIT_AS, bytes, bytes)?;
        }
        Ok(())
    };
    // SAFETY: the hook only makes raw syscalls on values prepared before the
    // fork (setsid, write to an open fd, prctl, setrlimit); it neither
    // allocates nor takes locks, so it is safe in the forked child.
    unsafe {
        command.pre_exec(hook);
    }
}
