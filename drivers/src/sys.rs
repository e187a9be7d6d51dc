//! The one place with `unsafe`: the code that runs in the forked child
//! between fork and exec. Only async-signal-safe calls happen there (no
//! allocation): everything it needs is prepared in the parent.

// The workspace denies `unsafe`; `pre_exec` has no safe form.
#![allow(unsafe_code)]

use std::fs::File;
use std::os::fd::RawFd;

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

/// The fd a task shim reports on whether its command started (and the
/// fd a task logger reads the task's stderr from).
pub(crate) const REPORT_FD: RawFd = 3;

/// What the child does to itself before exec.
pub(crate) struct ChildSetup {
    /// Lead a new session (and process group).
    pub new_session: bool,
    /// Lead a new process group in the same session.
    pub new_group: bool,
    /// Take stdin (a pty's slave) as the new session's controlling
    /// terminal.
    pub controlling_terminal: bool,
    /// Take the ordinary OOM score (the agent runs with a low one).
    pub reset_oom_score: bool,
    /// Unblock every signal (the shim blocks them all for itself).
    pub unblock_signals: bool,
    /// The write end of the shim's report pipe, to pass as fd 3.
    pub report_fd: Option<RawFd>,
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

/// The pre-exec hook. In order: a new session or process group (so the
/// child leads its own process group), the ordinary OOM score, the cgroup (while still root),
/// the report pipe, signals, supplementary groups, gid, uid (groups and gid
/// first: they need the privilege the uid change gives up), then
/// no_new_privs and rlimits. std has already moved the child into its
/// working directory; as root that grants nothing, since every later path
/// lookup is checked against the task's own user.
fn hook(setup: ChildSetup) -> impl FnMut() -> std::io::Result<()> + Send + Sync + 'static {
    move || -> std::io::Result<()> {
        if setup.new_session {
            nix::unistd::setsid()?;
        }
        if setup.controlling_terminal {
            // SAFETY: an ioctl on fd 0, which std has already made the
            // pty's slave; it takes an int argument and touches no memory.
            if unsafe { nix::libc::ioctl(0, nix::libc::TIOCSCTTY, 0) } == -1 {
                return Err(std::io::Error::last_os_error());
            }
        }
        if setup.new_group {
            nix::unistd::setpgid(nix::unistd::Pid::from_raw(0), nix::unistd::Pid::from_raw(0))?;
        }
        // Raising one's own score needs no privilege; where /proc is
        // missing, the task keeps the agent's.
        if setup.reset_oom_score {
            if let Ok(fd) = nix::fcntl::open(
                c"/proc/self/oom_score_adj",
                nix::fcntl::OFlag::O_WRONLY | nix::fcntl::OFlag::O_CLOEXEC,
                nix::sys::stat::Mode::empty(),
            ) {
                let _ = nix::unistd::write(&fd, b"0");
            }
        }
        if let Some(procs) = &setup.cgroup_procs {
            nix::unistd::write(procs, b"0")?;
        }
        if let Some(fd) = setup.report_fd {
            // SAFETY: plain syscalls on an fd the parent kept open for the
            // child; fd 3 is closed on exec otherwise, so replacing it
            // loses nothing the shim needs.
            let rc = unsafe {
                if fd == REPORT_FD {
                    nix::libc::fcntl(fd, nix::libc::F_SETFD, 0)
                } else {
                    nix::libc::dup2(fd, REPORT_FD)
                }
            };
            if rc == -1 {
                return Err(std::io::Error::last_os_error());
            }
        }
        if setup.unblock_signals {
            // Every signal at its default, as systemd starts a service: an
            // ignored one is inherited across exec, and a shell cannot trap
            // a signal ignored on entry (an agent started under `nohup`
            // made tasks deaf to SIGHUP, `onConfigChange: signal`'s).
            for signal in 1..=SIGNALS {
                // SAFETY: signal() is async-signal-safe; SIG_DFL runs no
                // code of ours; SIGKILL and SIGSTOP refuse it, harmlessly.
                unsafe { nix::libc::signal(signal, nix::libc::SIG_DFL) };
            }
            nix::sys::signal::sigprocmask(
                nix::sys::signal::SigmaskHow::SIG_SETMASK,
                Some(&nix::sys::signal::SigSet::empty()),
                None,
            )?;
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
    }
}

/// The highest signal number on Linux (real-time ones included).
const SIGNALS: i32 = 64;

/// Installs the pre-exec hook on a command the agent starts.
pub(crate) fn install(command: &mut tokio::process::Command, setup: ChildSetup) {
    // SAFETY: the hook only makes raw syscalls on values prepared before the
    // fork (setsid, setpgid, open of a static C string, write to an fd, fcntl, dup2,
    // signal, sigprocmask, setgroups on a prepared slice, setgid, setuid, prctl,
    // setrlimit); it neither allocates nor takes locks, so it is safe in
    // the forked child.
    unsafe {
        command.pre_exec(hook(setup));
    }
}

/// Installs the pre-exec hook on the command a task shim starts.
pub(crate) fn install_std(command: &mut std::process::Command, setup: ChildSetup) {
    use std::os::unix::process::CommandExt;
    // SAFETY: as for `install`; the shim is single-threaded besides.
    unsafe {
        command.pre_exec(hook(setup));
    }
}

/// An fd this process was started with (the shim's report pipe, the
/// logger's second pipe), closed on exec from now on.
pub(crate) fn report_pipe(fd: RawFd) -> File {
    use std::os::fd::FromRawFd;
    // SAFETY: F_SETFD on an fd number; a closed one makes it fail (EBADF).
    unsafe { nix::libc::fcntl(fd, nix::libc::F_SETFD, nix::libc::FD_CLOEXEC) };
    // SAFETY: the agent passed the report pipe as this fd (the shim's
    // pre-exec hook put it there) and nothing else in the shim owns it; if
    // it is not open, writes to it fail and are ignored.
    unsafe { File::from_raw_fd(fd) }
}

/// Waits for child `pid` to end; its raw wait status (None when it is not
/// this process's child). Real-time signals included, which nix's
/// `waitpid` cannot name.
/// `block`: wait for it; else None while it runs.
pub(crate) fn wait_raw(pid: i32, block: bool) -> Option<i32> {
    let flags = if block { 0 } else { nix::libc::WNOHANG };
    loop {
        let mut status = 0;
        // SAFETY: waitpid writes one int through a valid pointer.
        let rc = unsafe { nix::libc::waitpid(pid, &mut status, flags) };
        if rc == pid {
            return Some(status);
        }
        if rc == -1 && std::io::Error::last_os_error().raw_os_error() == Some(nix::libc::EINTR) {
            continue;
        }
        return None;
    }
}

/// Sleeps until a child of this process changes state (SIGCHLD, which the
/// caller blocks) or `most` passes.
pub(crate) fn wait_for_a_child(most: std::time::Duration) {
    use nix::libc;
    let timeout = libc::timespec {
        tv_sec: most.as_secs() as libc::time_t,
        tv_nsec: most.subsec_nanos() as libc::c_long,
    };
    // SAFETY: a sigset and a timespec on the stack, valid for the call; the
    // signal is taken from the pending set, no handler runs.
    unsafe {
        let mut chld: libc::sigset_t = std::mem::zeroed();
        libc::sigemptyset(&mut chld);
        libc::sigaddset(&mut chld, libc::SIGCHLD);
        libc::sigtimedwait(&chld, std::ptr::null_mut(), &timeout);
    }
}

/// Ends this process by `signal` (any number, real-time ones included):
/// its default action, unblocked, raised. Returns if it did not end it.
pub(crate) fn raise_default(signal: i32) {
    use nix::libc;
    // SAFETY: plain calls with integers and a sigset on the stack;
    // SIG_DFL runs no code of ours.
    unsafe {
        libc::signal(signal, libc::SIG_DFL);
        let mut only: libc::sigset_t = std::mem::zeroed();
        libc::sigemptyset(&mut only);
        libc::sigaddset(&mut only, signal);
        libc::sigprocmask(libc::SIG_UNBLOCK, &only, std::ptr::null_mut());
        libc::kill(libc::getpid(), signal);
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

/// Sets the window size of the terminal `fd` (a pty's master): the kernel
/// sends SIGWINCH to its foreground process group.
pub(crate) fn set_window_size(fd: std::os::fd::BorrowedFd<'_>, cols: u16, rows: u16) -> std::io::Result<()> {
    use std::os::fd::AsRawFd;
    let size = nix::libc::winsize {
        ws_row: rows,
        ws_col: cols,
        ws_xpixel: 0,
        ws_ypixel: 0,
    };
    // SAFETY: TIOCSWINSZ reads one winsize from the pointer, which lives
    // through the call.
    if unsafe { nix::libc::ioctl(fd.as_raw_fd(), nix::libc::TIOCSWINSZ, &size) } == -1 {
        return Err(std::io::Error::last_os_error());
    }
    Ok(())
}
