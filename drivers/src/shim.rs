//! The task shim: a small process between the agent and a task's command,
//! as containerd's shims and Nomad's executor are. The agent starts the
//! shim (the agent's own binary, run with [`FLAG`]) as the leader of the
//! task's session and process group, in the task's cgroup; the shim starts
//! the command as its child (another user, `no_new_privs`, rlimits), waits
//! for it, and writes how it ended to a file only the agent's user can
//! write. So a task outlives the agent (a restart, an upgrade, a crash)
//! and the next agent still learns its exit status, which it could not
//! otherwise: the task is no longer its child.
//!
//! While the agent is there, nothing changes for it: the shim ends the way
//! its command ended (the same exit code, or the same signal), so the
//! agent's own wait sees what it would have seen of the command.
//!
//! The command leads its own process group (in the shim's session), which
//! is the group the agent signals: the shim is not in it, and blocks every
//! signal it can besides. It stays root (or the agent's
//! user) and keeps the agent's OOM score, so the kernel kills the task
//! before it, and the task cannot signal it or write its status file.

use std::ffi::{OsStr, OsString};
use std::io::{self, Write};
use std::os::fd::RawFd;
use std::path::{Path, PathBuf};
use std::time::Duration;

use nix::sys::signal::{SigSet, SigmaskHow};
use nix::unistd::{Gid, Pid, Uid};

use crate::sys::{self, ChildSetup, SwitchUser};

/// The first argument that makes the agent's binary a task shim.
pub const FLAG: &str = "--task-shim";

/// The fd the shim reports on whether the command started (and the
/// logger reads the task's stderr from).
pub const REPORT_FD: RawFd = sys::REPORT_FD;

/// Where a task's shim is, and where it writes the task's end.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Shim {
    /// The shim's program (the agent's binary: `/proc/self/exe`).
    pub program: PathBuf,
    /// The file the shim writes the command's end to (in a directory only
    /// the agent's user may write). The agent's last contact with the
    /// cluster is kept two levels up (`contact`).
    pub status_file: PathBuf,
    /// For a fenced task, `stopAfter` plus its kill timeout: the shim
    /// SIGKILLs the command's group when the agent's kept contact is older
    /// than that, the moment by which the agent would have (see
    /// [`main`]).
    pub fence: Option<std::time::Duration>,
}

/// How a task's command ended, as its shim wrote it.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Ended {
    /// It exited with this code.
    Exited(i32),
    /// A signal ended it.
    Signaled(i32),
}

impl Ended {
    /// The raw wait status (for `ExitStatus::from_raw`).
    pub fn wait_status(self) -> i32 {
        match self {
            Ended::Exited(code) => (code & 0xff) << 8,
            Ended::Signaled(signal) => signal & 0x7f,
        }
    }

    fn line(self) -> String {
        match self {
            Ended::Exited(code) => format!("exited {code}\n"),
            Ended::Signaled(signal) => format!("signaled {signal}\n"),
        }
    }
}

/// Reads what a shim wrote to `status_file`: `None` when it wrote nothing
/// (it was killed with its task, or the file is not one it wrote).
pub fn read_status(status_file: &Path) -> Option<Ended> {
    use std::io::Read;
    use std::os::unix::fs::OpenOptionsExt;
    let mut file = std::fs::OpenOptions::new()
        .read(true)
        .custom_flags(nix::libc::O_NOFOLLOW)
        .open(status_file)
        .ok()?;
    let mut text = String::new();
    Read::by_ref(&mut file).take(64).read_to_string(&mut text).ok()?;
    let (kind, number) = text.trim_end().split_once(' ')?;
    let number: i32 = number.parse().ok()?;
    match kind {
        "exited" => Some(Ended::Exited(number)),
        "signaled" => Some(Ended::Signaled(number)),
        _ => None,
    }
}

/// What the shim is told to do, besides its command.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub(crate) struct Orders {
    pub status_file: PathBuf,
    /// The command's working directory (the shim itself runs in `/`).
    pub cwd: PathBuf,
    /// uid, gid and supplementary gids of the user to become.
    pub user: Option<(u32, u32, Vec<u32>)>,
    pub no_new_privs: bool,
    pub address_space: Option<u64>,
    pub processes: Option<u64>,
    /// The fence, in milliseconds (see [`Shim::fence`]).
    pub fence_ms: Option<u64>,
    /// A pidfile whose process is killed with the command's group when the
    /// fence kills it: a container's PID 1, outside the group (podman).
    pub kill_also: Option<PathBuf>,
}

impl Orders {
    /// The shim's arguments, up to its command.
    pub(crate) fn to_args(&self) -> Vec<OsString> {
        let user = match &self.user {
            Some((uid, gid, groups)) => {
                let groups: Vec<String> = groups.iter().map(u32::to_string).collect();
                format!("{uid}:{gid}:{}", groups.join(","))
            }
            None => "-".to_owned(),
        };
        let number = |n: Option<u64>| n.map_or_else(|| "-".to_owned(), |n| n.to_string());
        let mut args = vec![
            OsString::from(FLAG),
            self.status_file.clone().into_os_string(),
            self.cwd.clone().into_os_string(),
        ];
        args.extend(
            [
                user,
                u8::from(self.no_new_privs).to_string(),
                number(self.address_space),
                number(self.processes),
                number(self.fence_ms),
            ]
            .map(OsString::from),
        );
        args.push(match &self.kill_also {
            Some(path) => path.clone().into_os_string(),
            None => OsString::from("-"),
        });
        args.push(OsString::from("--"));
        args
    }

    /// Reads the orders and the command back from the shim's arguments
    /// (without the program name).
    pub(crate) fn from_args(args: &[OsString]) -> Result<(Orders, OsString, Vec<OsString>), String> {
        const USAGE: &str =
            "usage: --task-shim STATUS CWD USER NNP AS NPROC FENCE KILL_ALSO -- COMMAND [ARGS]";
        let [flag, status_file, cwd, user, nnp, address_space, processes, fence, kill_also, dashes, command, rest @ ..] =
            args
        else {
            return Err(USAGE.to_owned());
        };
        if flag != FLAG || dashes != "--" {
            return Err(USAGE.to_owned());
        }
        let text = |s: &OsStr| {
            s.to_str()
                .map(str::to_owned)
                .ok_or_else(|| format!("not text: {s:?}"))
        };
        let number = |s: &OsStr| -> Result<Option<u64>, String> {
            match text(s)?.as_str() {
                "-" => Ok(None),
                n => n.parse().map(Some).map_err(|_| format!("not a number: {n}")),
            }
        };
        let id = |s: &str| s.parse::<u32>().map_err(|_| format!("not an id: {s}"));
        let user = match text(user)?.as_str() {
            "-" => None,
            u => {
                let mut parts = u.splitn(3, ':');
                let (uid, gid, groups) = (parts.next(), parts.next(), parts.next());
                let (Some(uid), Some(gid), Some(groups)) = (uid, gid, groups) else {
                    return Err(format!("not uid:gid:groups: {u}"));
                };
                let groups = groups
                    .split(',')
                    .filter(|g| !g.is_empty())
                    .map(id)
                    .collect::<Result<_, _>>()?;
                Some((id(uid)?, id(gid)?, groups))
            }
        };
        let orders = Orders {
            status_file: PathBuf::from(status_file),
            cwd: PathBuf::from(cwd),
            user,
            no_new_privs: match text(nnp)?.as_str() {
                "0" => false,
                "1" => true,
                other => return Err(format!("not 0 or 1: {other}")),
            },
            address_space: number(address_space)?,
            processes: number(processes)?,
            fence_ms: number(fence)?,
            kill_also: (kill_also != "-").then(|| PathBuf::from(kill_also)),
        };
        Ok((orders, command.clone(), rest.to_vec()))
    }
}

/// The shim's whole life: `args` are its arguments without the program
/// name. Never returns: it ends the way its command ended.
pub fn main(args: &[OsString]) -> ! {
    let (orders, command, command_args) = match Orders::from_args(args) {
        Ok(parsed) => parsed,
        Err(e) => {
            eprintln!("k8s4r task shim: {e}");
            std::process::exit(127);
        }
    };
    let mut report = sys::report_pipe(REPORT_FD);
    // Every signal that can be is blocked from here on: those sent to the
    // task's group are for the command. The child unblocks them.
    let _ = nix::sys::signal::sigprocmask(SigmaskHow::SIG_SETMASK, Some(&SigSet::all()), None);
    // The command's environment comes on stdin, never in the shim's own:
    // the shim runs as root, and a task's LD_PRELOAD must not reach it.
    let env = match read_env(std::io::stdin().lock()) {
        Ok(env) => env,
        Err(e) => {
            let _ = writeln!(report, "err {}", e.raw_os_error().unwrap_or(0));
            std::process::exit(127);
        }
    };
    let mut child = std::process::Command::new(&command);
    child.args(&command_args);
    child.env_clear().envs(env);
    child.current_dir(&orders.cwd);
    child.stdin(std::process::Stdio::null());
    let limit = |n: Option<u64>| n.and_then(|n| nix::libc::rlim_t::try_from(n).ok());
    sys::install_std(
        &mut child,
        ChildSetup {
            new_session: false,
            // The command leads its own group (its pgid is its pid, as
            // without a shim): the agent signals that group, never the shim.
            new_group: true,
            controlling_terminal: false,
            reset_oom_score: true,
            unblock_signals: true,
            report_fd: None,
            cgroup_procs: None,
            switch_user: orders.user.as_ref().map(|(uid, gid, groups)| SwitchUser {
                uid: Uid::from_raw(*uid),
                gid: Gid::from_raw(*gid),
                groups: groups.iter().map(|g| Gid::from_raw(*g)).collect(),
            }),
            no_new_privs: orders.no_new_privs,
            address_space: limit(orders.address_space),
            processes: limit(orders.processes),
        },
    );
    let pid = match child.spawn() {
        Ok(child) => {
            let _ = writeln!(report, "ok {}", child.id());
            Pid::from_raw(child.id() as i32)
        }
        Err(e) => {
            let _ = writeln!(report, "err {}", e.raw_os_error().unwrap_or(0));
            std::process::exit(127);
        }
    };
    drop(report);
    let ended = match orders.fence_ms {
        Some(ms) => {
            let kill_also = orders
                .kill_also
                .as_deref()
                .map(|pidfile| (pidfile, orders.cwd.as_path()));
            wait_fenced(pid, &orders.status_file, Duration::from_millis(ms), kill_also)
        }
        None => wait(pid),
    };
    let _ = write_status(&orders.status_file, ended);
    end_as(ended)
}

/// Most bytes of environment the shim takes for its command.
const ENV_MAX: u64 = 4 << 20;

/// The command's environment: `NAME=value` entries, each ended by a NUL.
fn read_env(input: impl std::io::Read) -> io::Result<Vec<(OsString, OsString)>> {
    use std::io::Read;
    use std::os::unix::ffi::OsStrExt;
    let mut bytes = Vec::new();
    input.take(ENV_MAX).read_to_end(&mut bytes)?;
    Ok(bytes
        .split(|b| *b == 0)
        .filter(|entry| !entry.is_empty())
        .filter_map(|entry| {
            let at = entry.iter().position(|b| *b == b'=')?;
            let (name, value) = (&entry[..at], &entry[at + 1..]);
            Some((
                OsStr::from_bytes(name).to_owned(),
                OsStr::from_bytes(value).to_owned(),
            ))
        })
        .collect())
}

/// The environment as the shim reads it (see [`read_env`]).
pub(crate) fn encode_env<'a>(vars: impl Iterator<Item = (&'a str, &'a str)>) -> Vec<u8> {
    let mut out = Vec::new();
    for (name, value) in vars {
        out.extend_from_slice(name.as_bytes());
        out.push(b'=');
        out.extend_from_slice(value.as_bytes());
        out.push(0);
    }
    out
}

fn wait(pid: Pid) -> Ended {
    ended(sys::wait_raw(pid.as_raw(), true))
}

fn ended(status: Option<i32>) -> Ended {
    match status {
        Some(status) if nix::libc::WIFEXITED(status) => Ended::Exited(nix::libc::WEXITSTATUS(status)),
        Some(status) if nix::libc::WIFSIGNALED(status) => Ended::Signaled(nix::libc::WTERMSIG(status)),
        // Not ours to wait for any more: nothing is known of its end.
        _ => Ended::Exited(127),
    }
}

/// Waits for a fenced command, as the robot's last line of fencing: the
/// agent stops a fenced attempt once it has had no contact with the
/// cluster for `stopAfter`, and SIGKILLs it a kill timeout later; while no
/// agent runs (a crash loop, a unit stopped while it waited to restart),
/// nothing would. So the shim reads the contact the agent keeps (boot
/// clock, this boot's) every second, and SIGKILLs the command's group once
/// it is older than `fence` (`stopAfter` plus the kill timeout), the moment
/// the agent would have; the cluster replaces the attempt only later
/// (docs/fencing.md). Without a kept contact it counts from its own start.
/// `kill_also` (a pidfile, checked against the task's directory) names a
/// process outside the group that goes with it: a container's PID 1.
fn wait_fenced(pid: Pid, status_file: &Path, fence: Duration, kill_also: Option<(&Path, &Path)>) -> Ended {
    let contact_file = status_file
        .parent()
        .and_then(Path::parent)
        .map(|d| d.join("contact"));
    let boot_id = std::fs::read_to_string("/proc/sys/kernel/random/boot_id").unwrap_or_default();
    let now = || {
        nix::time::clock_gettime(nix::time::ClockId::CLOCK_BOOTTIME)
            .map(Duration::from)
            .ok()
    };
    let started = now().unwrap_or_default();
    let mut killed = false;
    loop {
        if let Some(status) = sys::wait_raw(pid.as_raw(), false) {
            return ended(Some(status));
        }
        if nix::sys::signal::kill(pid, None).is_err() {
            return ended(None); // not this process's child any more
        }
        let contact = contact_file
            .as_deref()
            .and_then(|f| read_contact(f, boot_id.trim()))
            .unwrap_or(started);
        if !killed && now().is_some_and(|now| now > contact + fence) {
            killed = true;
            kill_also_now(kill_also);
            let _ = nix::sys::signal::killpg(pid, nix::sys::signal::Signal::SIGKILL);
            // A container still starting writes its pidfile a moment later.
            for _ in 0..20 {
                sys::wait_for_a_child(Duration::from_millis(100));
                kill_also_now(kill_also);
            }
        }
        sys::wait_for_a_child(Duration::from_secs(1));
    }
}

/// SIGKILL to the process `kill_also` names, if it is the task's.
fn kill_also_now(kill_also: Option<(&Path, &Path)>) {
    if let Some(pid) = kill_also.and_then(|(pidfile, dir)| container_pid(pidfile, dir)) {
        let _ = nix::sys::signal::kill(Pid::from_raw(pid), nix::sys::signal::Signal::SIGKILL);
    }
}

/// The pid in a container's pidfile, if that process is the container's
/// PID 1 for the task in `task_dir` (its environment names the task's
/// directory, `task_dir` or the attempt's directory above it): a stale
/// file must never have the agent kill a stranger.
pub(crate) fn container_pid(pidfile: &Path, task_dir: &Path) -> Option<i32> {
    let pid: i32 = std::fs::read_to_string(pidfile).ok()?.trim().parse().ok()?;
    if pid <= 1 {
        return None;
    }
    let environ = std::fs::read(format!("/proc/{pid}/environ")).ok()?;
    let prefix = format!("{}=", k8s4r_api::names::ENV_TASK_DIR).into_bytes();
    let ours = environ.split(|b| *b == 0).any(|var| {
        var.strip_prefix(prefix.as_slice())
            .map(|dir| Path::new(<OsStr as std::os::unix::ffi::OsStrExt>::from_bytes(dir)))
            .is_some_and(|dir| dir.components().count() > 2 && task_dir.starts_with(dir))
    });
    ours.then_some(pid)
}

/// The agent's last contact as it keeps it for the shims and its next
/// process: `<boot id> <nanoseconds of the boot clock>`.
pub fn contact_line(boot_id: &str, contact: Duration) -> String {
    format!("{boot_id} {}\n", contact.as_nanos())
}

/// The contact kept in `file` ([`contact_line`]), if of boot `boot_id`.
pub fn read_contact(file: &Path, boot_id: &str) -> Option<Duration> {
    let text = std::fs::read_to_string(file).ok()?;
    let (boot, nanos) = text.trim_end().split_once(' ')?;
    (boot == boot_id).then_some(())?;
    Some(Duration::from_nanos(nanos.parse().ok()?))
}

/// Writes the end next to its file and renames it in place, so a reader
/// sees all of it or nothing.
fn write_status(status_file: &Path, ended: Ended) -> io::Result<()> {
    let mut partial = status_file.as_os_str().to_owned();
    partial.push(".partial");
    let partial = PathBuf::from(partial);
    let _ = std::fs::remove_file(&partial);
    std::fs::write(&partial, ended.line().as_bytes())?;
    std::fs::rename(&partial, status_file)
}

/// Ends this process as its command ended.
fn end_as(ended: Ended) -> ! {
    match ended {
        Ended::Exited(code) => std::process::exit(code),
        Ended::Signaled(number) => {
            // No core file of the shim for a command that dumped one.
            let _ = nix::sys::resource::setrlimit(nix::sys::resource::Resource::RLIMIT_CORE, 0, 0);
            sys::raise_default(number);
            std::process::exit(128 + number)
        }
    }
}

/// The first argument that makes the agent's binary a task logger.
pub const LOGGER_FLAG: &str = "--task-logger";

/// Starts a task's logger: `program` with `args` (after [`LOGGER_FLAG`]),
/// reading the task's stdout pipe as its stdin and its stderr pipe as fd
/// 3 ([`take_fd`]), in a session of its own so that nothing the agent
/// sends a task's group reaches it, and it outlives the agent.
pub fn spawn_logger(
    program: &Path,
    args: &[OsString],
    stdout: std::os::fd::OwnedFd,
    stderr: std::os::fd::OwnedFd,
) -> io::Result<tokio::process::Child> {
    use std::os::fd::AsRawFd;
    let mut command = tokio::process::Command::new(program);
    command.arg(LOGGER_FLAG).args(args);
    command.env_clear();
    command.stdin(std::process::Stdio::from(stdout));
    command.kill_on_drop(false);
    sys::install(
        &mut command,
        ChildSetup {
            new_session: true,
            new_group: false,
            controlling_terminal: false,
            reset_oom_score: false,
            unblock_signals: false,
            report_fd: Some(stderr.as_raw_fd()),
            cgroup_procs: None,
            switch_user: None,
            no_new_privs: false,
            address_space: None,
            processes: None,
        },
    );
    let child = command.spawn();
    drop(stderr);
    child
}

/// An fd this process was started with (the task logger's second pipe),
/// closed on exec from now on.
pub fn take_fd(fd: RawFd) -> std::fs::File {
    sys::report_pipe(fd)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn orders_read_back_as_they_were_written() {
        let orders = Orders {
            status_file: PathBuf::from("/run/k8s4r/tasks/a-1.exit"),
            cwd: PathBuf::from("/var/lib/k8s4r/tasks/a-1/work"),
            user: Some((61000, 61000, vec![20, 44])),
            no_new_privs: true,
            address_space: Some(1 << 30),
            processes: None,
            fence_ms: Some(125_000),
            kill_also: Some(PathBuf::from("/var/lib/k8s4r/podman/k8s4r-a-1.pid")),
        };
        let mut args = orders.to_args();
        args.extend(["sh", "-c", "echo hi"].map(OsString::from));
        let (back, command, rest) = Orders::from_args(&args).unwrap();
        assert_eq!(back, orders);
        assert_eq!(command, "sh");
        assert_eq!(rest, ["-c", "echo hi"].map(OsString::from));
        let no_user = Orders {
            user: Some((5, 6, Vec::new())),
            ..Orders::default()
        };
        let mut args = no_user.to_args();
        args.push("true".into());
        assert_eq!(Orders::from_args(&args).unwrap().0, no_user);
    }

    #[test]
    fn arguments_that_are_not_orders_are_refused() {
        assert!(Orders::from_args(&["--task-shim".into()]).is_err());
        let mut args = Orders::default().to_args();
        args[4] = "yes".into();
        args.push("true".into());
        assert!(Orders::from_args(&args).is_err());
    }

    #[test]
    fn the_environment_reads_back_entry_by_entry() {
        let vars = [("PATH", "/usr/bin:/bin"), ("EMPTY", ""), ("EQ", "a=b")];
        let bytes = encode_env(vars.iter().copied());
        let back = read_env(&bytes[..]).unwrap();
        let back: Vec<(String, String)> = back
            .into_iter()
            .map(|(k, v)| (k.into_string().unwrap(), v.into_string().unwrap()))
            .collect();
        assert_eq!(back, vars.map(|(k, v)| (k.to_owned(), v.to_owned())));
    }

    #[test]
    fn a_status_reads_back_and_a_foreign_file_is_nothing() {
        let dir = tempfile::tempdir().unwrap();
        let file = dir.path().join("exit-status");
        for ended in [Ended::Exited(0), Ended::Exited(3), Ended::Signaled(9)] {
            write_status(&file, ended).unwrap();
            assert_eq!(read_status(&file), Some(ended));
        }
        std::fs::write(&file, "root:x:0:0\n").unwrap();
        assert_eq!(read_status(&file), None);
        assert_eq!(read_status(&dir.path().join("missing")), None);
        assert_eq!(Ended::Exited(3).wait_status(), 3 << 8);
        assert_eq!(Ended::Signaled(15).wait_status(), 15);
    }
}
