//! cgroup v2: one cgroup per task under a writable subtree, used to kill
//! every process of the task at once (`cgroup.kill`, even those that left
//! its process group) and, for `exec`, to apply `memory.max`, `cpu.max` and
//! `pids.max`.

use std::fmt;
use std::fs::{self, File, OpenOptions};
use std::io::{self, Write};
use std::path::{Path, PathBuf};

use nix::sys::signal::{kill, Signal};
use nix::unistd::Pid;

use crate::Limits;

/// The period of `cpu.max`, in microseconds (the kernel's default).
const CPU_PERIOD_US: u64 = 100_000;
/// Rounds of reading `cgroup.procs` and killing what it lists, where the
/// kernel has no `cgroup.kill`; the caller retries later if some are left.
const KILL_ROUNDS: usize = 64;
/// The leaf the agent moves itself into when its own cgroup must hand
/// controllers down to task cgroups.
const AGENT_LEAF: &str = "k8s4r-agent";

/// What enabling controllers came to.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Enable {
    /// Whatever the subtree offers is enabled.
    Done,
    /// Refused because the cgroup holds processes.
    Busy,
}

/// One kind of limit, for reporting what could not be applied.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum LimitKind {
    /// memory.max
    Memory,
    /// cpu.max
    Cpu,
    /// pids.max
    Pids,
}

impl LimitKind {
    fn controller(self) -> &'static str {
        match self {
            LimitKind::Memory => "memory",
            LimitKind::Cpu => "cpu",
            LimitKind::Pids => "pids",
        }
    }
}

impl fmt::Display for LimitKind {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.controller())
    }
}

/// A writable cgroup v2 subtree the agent creates task cgroups in.
#[derive(Clone, Debug)]
pub struct Cgroups {
    root: PathBuf,
    controllers: Vec<LimitKind>,
}

impl Cgroups {
    /// Uses `configured`, or the agent's own cgroup on the cgroup2 mount.
    /// Fails with a sentence saying why no cgroup can be used.
    pub fn detect(configured: Option<&Path>) -> Result<Self, String> {
        let root = match configured {
            Some(path) => path.to_path_buf(),
            None => {
                let own = own_cgroup()?;
                // Already moved into our leaf by an earlier start: the
                // subtree is its parent.
                match (own.file_name(), own.parent()) {
                    (Some(name), Some(parent)) if name == AGENT_LEAF => parent.to_path_buf(),
                    _ => own,
                }
            }
        };
        if !root.join("cgroup.procs").is_file() || !root.join("cgroup.controllers").is_file() {
            return Err(format!("{} is not a cgroup v2 directory", root.display()));
        }
        let probe = root.join(format!("k8s4r-probe-{}", std::process::id()));
        fs::create_dir(&probe)
            .and_then(|()| fs::remove_dir(&probe))
            .map_err(|e| format!("cannot create cgroups under {}: {e}", root.display()))?;
        let mut cgroups = Cgroups {
            root,
            controllers: Vec::new(),
        };
        if cgroups.enable_controllers() == Enable::Busy && configured.is_none() {
            // A cgroup that holds processes (ours) may not hand controllers
            // to its children; move the agent into a leaf and try again, as
            // systemd's Delegate= expects.
            if cgroups.move_self_to_leaf().is_ok() {
                cgroups.enable_controllers();
            }
        }
        Ok(cgroups)
    }

    /// The subtree's directory.
    pub fn root(&self) -> &Path {
        &self.root
    }

    /// The limits task cgroups can carry.
    pub fn controllers(&self) -> &[LimitKind] {
        &self.controllers
    }

    /// The directory of the task cgroup called `name` (which may not exist).
    pub fn path_of(&self, name: &str) -> PathBuf {
        self.root.join(format!("k8s4r-{name}"))
    }

    /// Creates (or reuses) the cgroup of one task.
    pub fn create(&self, name: &str) -> io::Result<TaskCgroup> {
        let path = self.path_of(name);
        match fs::create_dir(&path) {
            Ok(()) => {}
            Err(e) if e.kind() == io::ErrorKind::AlreadyExists => {}
            Err(e) => return Err(e),
        }
        Ok(TaskCgroup {
            path,
            controllers: self.controllers.clone(),
        })
    }

    /// Enables those of memory, cpu and pids the subtree has for its
    /// children.
    fn enable_controllers(&mut self) -> Enable {
        let available = fs::read_to_string(self.root.join("cgroup.controllers")).unwrap_or_default();
        let wanted = [LimitKind::Memory, LimitKind::Cpu, LimitKind::Pids];
        let mut busy = false;
        for kind in wanted {
            if available.split_whitespace().any(|c| c == kind.controller()) {
                let written = write_file(
                    &self.root.join("cgroup.subtree_control"),
                    &format!("+{}", kind.controller()),
                );
                busy |= written.is_err_and(|e| e.raw_os_error() == Some(nix::libc::EBUSY));
            }
        }
        let enabled = fs::read_to_string(self.root.join("cgroup.subtree_control")).unwrap_or_default();
        self.controllers = wanted
            .into_iter()
            .filter(|k| enabled.split_whitespace().any(|c| c == k.controller()))
            .collect();
        if busy {
            Enable::Busy
        } else {
            Enable::Done
        }
    }

    fn move_self_to_leaf(&self) -> io::Result<()> {
        let leaf = self.root.join(AGENT_LEAF);
        match fs::create_dir(&leaf) {
            Ok(()) => {}
            Err(e) if e.kind() == io::ErrorKind::AlreadyExists => {}
            Err(e) => return Err(e),
        }
        write_file(&leaf.join("cgroup.procs"), "0")
    }
}

/// The cgroup of one task.
#[derive(Clone, Debug)]
pub struct TaskCgroup {
    path: PathBuf,
    controllers: Vec<LimitKind>,
}

impl TaskCgroup {
    /// A task cgroup known by its path (e.g. from the agent's journal).
    pub fn at(path: PathBuf) -> Self {
        TaskCgroup {
            path,
            controllers: Vec::new(),
        }
    }

    /// Its directory.
    pub fn path(&self) -> &Path {
        &self.path
    }

    /// Opens `cgroup.procs` for a child to move itself in (close-on-exec).
    pub fn open_procs(&self) -> io::Result<File> {
        OpenOptions::new()
            .write(true)
            .open(self.path.join("cgroup.procs"))
    }

    /// Writes the limits; returns the ones that could not be applied.
    pub fn apply(&self, limits: &Limits) -> Vec<LimitKind> {
        let mut unapplied = Vec::new();
        let mut set = |kind: LimitKind, file: &str, value: String| {
            let ok = self.controllers.contains(&kind) && write_file(&self.path.join(file), &value).is_ok();
            if !ok {
                unapplied.push(kind);
            }
        };
        if let Some(bytes) = limits.memory_bytes {
            set(LimitKind::Memory, "memory.max", bytes.to_string());
        }
        if let Some(millis) = limits.cpu_millis {
            let quota = (millis * CPU_PERIOD_US / 1000).max(1000);
            set(LimitKind::Cpu, "cpu.max", format!("{quota} {CPU_PERIOD_US}"));
        }
        if let Some(pids) = limits.pids {
            set(LimitKind::Pids, "pids.max", pids.to_string());
        }
        unapplied
    }

    /// SIGKILLs every process in the cgroup: `cgroup.kill` (which also
    /// catches what forks meanwhile), or on kernels older than 5.14 one by
    /// one, reading the list again until it is empty (a process forking as
    /// fast as it can is caught within a few rounds, each child being
    /// killed before it runs long).
    pub fn kill(&self) -> io::Result<()> {
        match write_file(&self.path.join("cgroup.kill"), "1") {
            Ok(()) => Ok(()),
            Err(e) if e.kind() == io::ErrorKind::NotFound && self.path.is_dir() => {
                for _ in 0..KILL_ROUNDS {
                    let pids = self.pids()?;
                    if pids.is_empty() {
                        break;
                    }
                    for pid in pids {
                        let _ = kill(Pid::from_raw(pid), Signal::SIGKILL);
                    }
                }
                Ok(())
            }
            Err(e) if e.kind() == io::ErrorKind::NotFound => Ok(()),
            Err(e) => Err(e),
        }
    }

    /// Whether no process is left in the cgroup (a cgroup that is gone is
    /// empty).
    pub fn is_empty(&self) -> bool {
        self.pids().map_or(true, |pids| pids.is_empty())
    }

    /// The pids in the cgroup.
    pub fn pids(&self) -> io::Result<Vec<i32>> {
        let procs = match fs::read_to_string(self.path.join("cgroup.procs")) {
            Ok(procs) => procs,
            Err(e) if e.kind() == io::ErrorKind::NotFound => return Ok(Vec::new()),
            Err(e) => return Err(e),
        };
        Ok(procs.lines().filter_map(|l| l.trim().parse().ok()).collect())
    }

    /// Removes the cgroup; fails while processes are still in it.
    pub fn remove(&self) -> io::Result<()> {
        match fs::remove_dir(&self.path) {
            Err(e) if e.kind() == io::ErrorKind::NotFound => Ok(()),
            other => other,
        }
    }
}

fn write_file(path: &Path, value: &str) -> io::Result<()> {
    let mut file = OpenOptions::new().write(true).open(path)?;
    file.write_all(value.as_bytes())
}

/// `<cgroup2 mount>/<our path>` from /proc/self/mountinfo and /proc/self/cgroup.
fn own_cgroup() -> Result<PathBuf, String> {
    let mountinfo =
        fs::read_to_string("/proc/self/mountinfo").map_err(|e| format!("cannot read mountinfo: {e}"))?;
    let mount = mountinfo
        .lines()
        .find_map(|line| {
            let (left, right) = line.split_once(" - ")?;
            if right.split_whitespace().next()? != "cgroup2" {
                return None;
            }
            left.split_whitespace().nth(4).map(PathBuf::from)
        })
        .ok_or_else(|| "no cgroup2 file system is mounted".to_owned())?;
    let cgroup =
        fs::read_to_string("/proc/self/cgroup").map_err(|e| format!("cannot read /proc/self/cgroup: {e}"))?;
    let own = cgroup
        .lines()
        .find_map(|line| line.strip_prefix("0::"))
        .ok_or_else(|| "the agent is not in a cgroup v2 hierarchy".to_owned())?;
    Ok(mount.join(own.trim().trim_start_matches('/')))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn refuses_a_directory_that_is_not_a_cgroup() {
        let dir = tempfile::tempdir().unwrap();
        let err = Cgroups::detect(Some(dir.path())).unwrap_err();
        assert!(err.contains("not a cgroup v2 directory"), "{err}");
    }

    #[test]
    fn apply_reports_limits_without_controllers() {
        let dir = tempfile::tempdir().unwrap();
        let cgroup = TaskCgroup::at(dir.path().to_path_buf());
        let unapplied = cgroup.apply(&Limits {
            memory_bytes: Some(1 << 20),
            cpu_millis: Some(500),
            pids: None,
        });
        assert_eq!(unapplied, vec![LimitKind::Memory, LimitKind::Cpu]);
    }
}
