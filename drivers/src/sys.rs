//! The one place with `unsafe`: the code that runs in the forked child
//! between fork and exec. Only async-signal-safe calls happen there (no
//! allocation): everything it needs is prepared in the parent.

// The workspace denies `unsafe`; `pre_exec` has no safe form.
#![allow(unsafe_code)]

use std::fs::File;

use nix::libc::rlim_t;
use nix::sys::resource::{setrlimit, Resource};
use nix::unistd::{Gid, Uid};

/// The identity the child takes before exec.
pub(crate) struct SwitchUser {
    pub uid: Uid,
    pub gid: Gid,
    /// Exactly these supplementary groups (none inherited from the agent).
    pub groups: Vec<Gid>,
}

/// What the child does to itself before exec.
pub(crate) struct ChildSetup {
    /// `cgroup.procs` of the task's cgroup, opened by the parent; writing
    /// "0" moves the child there before it can fork anything.
    pub cgroup_procs: Option<File>,
    /// Another user to become (the agent is root).
    pub switch_user: Option<SwitchUser>,
    /// Set `no_new_privs` so setuid binaries cannot regain privileges.
    pub no_new_privs: bool,
    /// RLIMIT_AS in bytes (the fallback for a memory limit), already in
    /// the target's `rlim_t` (32 bits on 32-bit glibc targets such as armv7).
    pub address_space: Option<rlim_t>,
    /// RLIMIT_NPROC (the fallback for a pids limit).
    pub processes: Option<rlim_t>,
}

/// Installs the pre-exec hook. In order: a new session (so the child leads
/// its own process group), the ordinary OOM score, the cgroup (while still
/// root), supplementary
/// groups, gid, uid (groups and gid first: they need the privilege the uid
/// change gives up), then no_new_privs and rlimits. std has already moved
/// the child into its working directory; as root that grants nothing,
/// since every later path lookup is checked against the task's own user.
pub(crate) fn install(command: &mut tokio::process::Command, setup: ChildSetup) {
    let hook = move || -> std::io::Result<()> {
        nix::unistd::setsid()?;
        // The agent may run with a low OOM score (its unit sets one): a
        // task takes the ordinary score, so that the kernel kills a task
        // before the agent. Raising one's own score needs no privilege;
        // where /proc is missing, the task keeps the agent's.
        if let Ok(fd) = nix::fcntl::open(
            c"/proc/self/oom_score_adj",
            nix::fcntl::OFlag::O_WRONLY | nix::fcntl::OFlag::O_CLOEXEC,
            nix::sys::stat::Mode::empty(),
        ) {
            let _ = nix::unistd::write(&fd, b"0");
        }
        if let Some(procs) = &setup.cgroup_procs {
            nix::unistd::write(procs, b"0")?;
        }
        if let Some(user) = &setup.switch_user {
            nix::unistd::setgroups(&user.groups)?;
            nix::unistd::setgid(user.gid)?;
            nix::unistd::setuid(user.uid)?;
        }
        if setup.no_new_privs {
            nix::sys::prctl::set_no_new_privs()?;
        }
        if let Some(bytes) = setup.address_space {
            setrlimit(Resource::RLIMIT_AS, bytes, bytes)?;
        }
        if let Some(n) = setup.processes {
            setrlimit(Resource::RLIMIT_NPROC, n, n)?;
        }
        Ok(())
    };
    // SAFETY: the hook only makes raw syscalls on values prepared before the
    // fork (setsid, open of a static C string, write to an fd, close,
    // setgroups on a prepared slice, setgid, setuid, prctl, setrlimit); it
    // neither allocates nor takes locks, so it is safe in the forked child.
    unsafe {
        command.pre_exec(hook);
    }
}

/// A System V IPC object's kind.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Ipc {
    /// Shared memory (`shmget`).
    Shm,
    /// A semaphore set (`semget`).
    Sem,
    /// A message queue (`msgget`).
    Msg,
}

/// Removes the System V IPC object `id` (`IPC_RMID`). nix has no wrapper
/// for these calls.
pub(crate) fn remove_ipc(kind: Ipc, id: i32) -> std::io::Result<()> {
    use nix::libc;
    // SAFETY: IPC_RMID reads nothing through the pointer argument (it may
    // be null), and `id` is a plain integer; a stale or foreign id makes
    // the call fail with EINVAL or EPERM, which is returned.
    let rc = unsafe {
        match kind {
            Ipc::Shm => libc::shmctl(id, libc::IPC_RMID, std::ptr::null_mut()),
            Ipc::Sem => libc::semctl(id, 0, libc::IPC_RMID),
            Ipc::Msg => libc::msgctl(id, libc::IPC_RMID, std::ptr::null_mut()),
        }
    };
    if rc == -1 {
        return Err(std::io::Error::last_os_error());
    }
    Ok(())
}

/// Gives the calling thread the nice value `nice` (negative: more CPU
/// than the robot's other work when the CPU is short), where the agent is
/// allowed to (root, or CAP_SYS_NICE).
pub(crate) fn set_thread_nice(nice: i32) -> std::io::Result<()> {
    use nix::libc;
    let tid = nix::unistd::gettid().as_raw();
    // SAFETY: setpriority takes plain integers and reads no memory; with
    // PRIO_PROCESS and a thread id, Linux sets that thread's nice value.
    let rc = unsafe { libc::setpriority(libc::PRIO_PROCESS, tid as libc::id_t, nice) };
    if rc == -1 {
        return Err(std::io::Error::last_os_error());
    }
    Ok(())
}
