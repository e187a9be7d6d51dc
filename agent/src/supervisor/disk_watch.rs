//! The disk watch: measures the disk every 2 s while tasks run (30 s when
//! idle), applies the rules of [`super::disk`] (stop a task over its
//! limit, remove finished directories first, refuse tasks on a full disk),
//! and keeps the directories of the last finished tasks. The measuring and
//! every removal run on the blocking pool; this is the state.

use std::collections::{HashSet, VecDeque};
use std::os::unix::fs::PermissionsExt;
use std::path::{Path, PathBuf};
use std::time::Duration;

use tokio::time::Instant;

use super::disk::{self, Measurement, Reserve, TaskUse};
use super::logs::{self, Stream};
use super::SupervisorConfig;

/// How often the disk is measured while tasks run (or it is full)...
pub(crate) const MEASURE_BUSY: Duration = Duration::from_secs(2);
/// ...and while the robot is idle.
const MEASURE_IDLE: Duration = Duration::from_secs(30);
/// Directories of finished tasks kept (logs, artifacts); older ones go
/// (sooner when the disk budget needs the room).
const KEEP_FINISHED_DIRS: usize = 100;

/// What a measurement asks of the runner.
#[derive(Default)]
pub(crate) struct Actions {
    /// Running tasks to kill at once, with why.
    pub stop: Vec<(u64, String)>,
    /// Blocking work: removing finished directories.
    pub remove: Vec<PathBuf>,
    /// When to measure next.
    pub next: Option<Duration>,
}

/// A task as the watch sees it.
pub(crate) struct Seen {
    pub id: u64,
    pub dir: PathBuf,
    pub running: bool,
    pub limit: Option<u64>,
}

/// The disk's state as last measured.
pub(crate) struct DiskWatch {
    tasks_dir: PathBuf,
    budget: u64,
    reserve: Reserve,
    full: bool,
    /// Free bytes at the last measurement (less a released reserve).
    free: u64,
    /// Bytes all task directories took at the last measurement.
    used: u64,
    measuring: bool,
    /// When the next measurement is due.
    next: Option<Instant>,
    log_max_bytes: u64,
    log_max_files: u32,
    /// Directories of finished tasks, oldest first.
    finished: VecDeque<((String, u32), PathBuf)>,
}

impl DiskWatch {
    /// The watch of `tasks_dir` on the file system whose size is `total`.
    pub(crate) fn new(config: &SupervisorConfig, tasks_dir: PathBuf, total: u64) -> Self {
        let reserve = Reserve {
            path: config.state_dir.join("reserve"),
            bytes: match config.disk_reserve {
                Some(size) => size.of(total),
                None => super::DEFAULT_DISK_RESERVE.min(total / 20),
            },
        };
        DiskWatch {
            finished: existing_task_dirs(&tasks_dir),
            tasks_dir,
            budget: config.disk_budget.of(total),
            reserve,
            full: false,
            free: 0,
            used: 0,
            measuring: false,
            next: None,
            log_max_bytes: config.log_max_bytes,
            log_max_files: config.log_max_files,
        }
    }

    /// The budget of all task directories.
    pub(crate) fn budget(&self) -> u64 {
        self.budget
    }

    /// Whether the disk was full at the last measurement: free bytes then
    /// and the reserve.
    pub(crate) fn full(&self) -> Option<(u64, u64)> {
        self.full.then_some((self.free, self.reserve.bytes))
    }

    /// Bytes all task directories took at the last measurement.
    pub(crate) fn used(&self) -> u64 {
        self.used
    }

    /// Forgets finished directories that `held` tasks use again.
    pub(crate) fn keep_held(&mut self, held: impl Fn(&(String, u32)) -> bool) {
        self.finished.retain(|(key, _)| !held(key));
    }

    /// Whether a measurement should be armed `after` from now (none is due
    /// sooner already).
    pub(crate) fn schedule(&mut self, after: Duration) -> bool {
        let at = Instant::now() + after;
        if self.next.is_some_and(|next| next <= at) {
            return false;
        }
        self.next = Some(at);
        true
    }

    /// The measurement timer fired: the blocking work, if one is due and
    /// none is in flight. `services` are the log files services write
    /// themselves, rotated with it.
    pub(crate) fn measure(
        &mut self,
        services: Vec<PathBuf>,
    ) -> Option<impl FnOnce() -> Measurement + Send + 'static> {
        if self.next.is_none_or(|next| Instant::now() < next) {
            return None; // a timer another, sooner one replaced
        }
        self.next = None;
        if self.measuring {
            return None; // the one in flight schedules the next
        }
        self.measuring = true;
        let tasks_dir = self.tasks_dir.clone();
        let reserve = self.reserve.clone();
        let (max_bytes, max_files) = (self.log_max_bytes, self.log_max_files);
        Some(move || {
            for path in &services {
                if let Err(e) = logs::rotate_shared(path, max_bytes, max_files) {
                    tracing::warn!(path = %path.display(), error = %e, "cannot rotate a service's log");
                }
            }
            disk::measure(&tasks_dir, &reserve)
        })
    }

    /// Applies the disk rules to a measurement of `tasks` (whose use it
    /// records through `used_by`).
    pub(crate) fn measured(&mut self, m: &Measurement, tasks: &[Seen], idle: bool) -> Actions {
        self.measuring = false;
        tracing::debug!(free = m.free, reserve_held = m.reserve_held, dirs = m.dirs.len(), took = ?m.took, "disk measured");
        let running: Vec<TaskUse> = tasks
            .iter()
            .filter(|t| t.running)
            .map(|t| TaskUse {
                id: t.id,
                used: m.dirs.get(&t.dir).copied().unwrap_or(0),
                limit: t.limit,
            })
            .collect();
        let finished: Vec<(PathBuf, u64)> = self
            .finished
            .iter()
            .filter_map(|(_, dir)| Some((dir.clone(), *m.dirs.get(dir)?)))
            .collect();
        let limits = disk::Limits {
            budget: self.budget,
            reserve: self.reserve.bytes,
        };
        // A released reserve is owed: until it is taken back, its share of
        // the free space is not free.
        let free = if m.reserve_held {
            m.free
        } else {
            m.free.saturating_sub(self.reserve.bytes)
        };
        let verdict = disk::assess(free, m.inodes_free, limits, &running, &finished);
        if !verdict.remove.is_empty() {
            tracing::info!(
                dirs = verdict.remove.len(),
                "removing finished task directories to free disk"
            );
            let remove: HashSet<&PathBuf> = verdict.remove.iter().collect();
            self.finished.retain(|(_, dir)| !remove.contains(dir));
        }
        if verdict.full != self.full {
            if verdict.full {
                tracing::error!(
                    free = m.free,
                    reserve = self.reserve.bytes,
                    "disk full: taking no task until space is back"
                );
            } else {
                tracing::info!(free = m.free, "disk space is back: taking tasks again");
            }
        }
        self.full = verdict.full;
        self.free = free;
        self.used = m.dirs.values().sum();
        let next = if idle && !self.full {
            MEASURE_IDLE
        } else {
            MEASURE_BUSY
        };
        Actions {
            stop: verdict.stop,
            remove: verdict.remove,
            next: Some(next),
        }
    }

    /// Keeps the directory of a finished task among the last
    /// [`KEEP_FINISHED_DIRS`]: the blocking work that closes it to everyone
    /// but root (a later task given the same uid must not reach its files),
    /// frees its `work/` if asked, and deletes the oldest beyond the limit
    /// (but those `held` again).
    pub(crate) fn retire(
        &mut self,
        key: (String, u32),
        free_work: bool,
        held: impl Fn(&(String, u32)) -> bool,
    ) -> impl FnOnce() + Send + 'static {
        let dir = super::task_dir(&self.tasks_dir, &key.0, key.1);
        self.finished.push_back((key, dir.clone()));
        let mut remove = Vec::new();
        while self.finished.len() > KEEP_FINISHED_DIRS {
            let Some((key, old)) = self.finished.pop_front() else {
                break;
            };
            // The same attempt dispatched again runs in that directory.
            if !held(&key) {
                remove.push(old);
            }
        }
        move || {
            let _ = std::fs::set_permissions(&dir, std::fs::Permissions::from_mode(0o700));
            if free_work {
                remove_dir(&dir.join("work"));
            }
            for old in remove {
                remove_dir(&old);
            }
        }
    }
}

/// The log files of a service (which writes them itself).
pub(crate) fn service_logs(dir: &Path) -> [PathBuf; 2] {
    [Stream::Stdout, Stream::Stderr].map(|s| dir.join("logs").join(s.file_name()))
}

/// Removes a directory and everything in it (blocking).
pub(crate) fn remove_dir(dir: &Path) {
    if let Err(e) = std::fs::remove_dir_all(dir) {
        if e.kind() != std::io::ErrorKind::NotFound {
            tracing::warn!(path = %dir.display(), error = %e, "cannot remove a finished task's directory");
        }
    }
}

/// Task directories left by earlier runs, oldest first: they count against
/// [`KEEP_FINISHED_DIRS`] too.
fn existing_task_dirs(tasks_dir: &Path) -> VecDeque<((String, u32), PathBuf)> {
    let Ok(entries) = std::fs::read_dir(tasks_dir) else {
        return VecDeque::new();
    };
    let mut dirs: Vec<(std::time::SystemTime, (String, u32), PathBuf)> = entries
        .flatten()
        .filter_map(|entry| {
            let name = entry.file_name().into_string().ok()?;
            let (uid, attempt) = name.rsplit_once('-')?;
            let key = (uid.to_owned(), attempt.parse().ok()?);
            let modified = entry.metadata().ok()?.modified().ok()?;
            Some((modified, key, entry.path()))
        })
        .collect();
    dirs.sort_by_key(|(modified, ..)| *modified);
    dirs.into_iter().map(|(_, key, path)| (key, path)).collect()
}
