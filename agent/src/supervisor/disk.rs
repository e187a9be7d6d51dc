//! The disk the tasks take: a budget for task directories (downloads, the
//! files tasks write, their logs), a reserve kept free for the agent's own
//! bookkeeping (outbox, journal), and what to do when either runs out.
//!
//! Measuring walks the task directories and so runs off the supervisor's
//! thread ([`measure`]); deciding is pure ([`assess`]). The reserve is a
//! real file of the reserve's size: no task, root or not, can write into
//! it; when the disk is full anyway, it is released so that status
//! updates can still be written, and taken again once space is back.

use std::collections::HashMap;
use std::fmt;
use std::io;
use std::os::unix::fs::MetadataExt;
use std::path::{Path, PathBuf};
use std::str::FromStr;
use std::time::{Duration, Instant};

/// Entries looked at per task directory; a directory with more is counted
/// as far as the walk got (a task making millions of files is caught by
/// the file system's free inodes instead).
const MAX_ENTRIES_PER_DIR: usize = 200_000;
/// Free inodes below which the disk counts as full.
const MIN_FREE_INODES: u64 = 1000;

/// A size in the agent's configuration: bytes, or a share of the file
/// system holding the state directory.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum DiskSize {
    /// That many bytes.
    Bytes(u64),
    /// That percentage of the file system's size.
    Percent(u8),
}

impl DiskSize {
    /// The bytes this means on a file system of `total` bytes.
    pub fn of(self, total: u64) -> u64 {
        match self {
            DiskSize::Bytes(bytes) => bytes,
            DiskSize::Percent(p) => total / 100 * u64::from(p) + total % 100 * u64::from(p) / 100,
        }
    }
}

impl FromStr for DiskSize {
    type Err = String;

    /// `"2Gi"`, `"500M"`, `"1073741824"` (Kubernetes quantities) or `"50%"`.
    fn from_str(text: &str) -> Result<Self, String> {
        let text = text.trim();
        if let Some(p) = text.strip_suffix('%') {
            return match p.trim().parse::<u8>() {
                Ok(p) if p <= 100 => Ok(DiskSize::Percent(p)),
                _ => Err(format!("{text:?} is not a percentage from 0% to 100%")),
            };
        }
        k8s4r_api::Quantity::from(text)
            .to_units()
            .map(DiskSize::Bytes)
            .map_err(|e| format!("{text:?} is neither a size (\"2Gi\", \"500M\") nor a percentage: {e}"))
    }
}

impl fmt::Display for DiskSize {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            DiskSize::Bytes(b) => write!(f, "{}", mib(*b)),
            DiskSize::Percent(p) => write!(f, "{p}%"),
        }
    }
}

/// Bytes for a person: `12.0 MiB`.
pub(crate) fn mib(bytes: u64) -> String {
    format!("{:.1} MiB", bytes as f64 / (1024.0 * 1024.0))
}

/// Total and available bytes and available inodes of the file system
/// holding `path` (inodes None where the file system does not count them).
pub(crate) fn space(path: &Path) -> io::Result<(u64, u64, Option<u64>)> {
    let stat = nix::sys::statvfs::statvfs(path).map_err(io::Error::from)?;
    let frag = stat.fragment_size() as u64;
    let inodes = (stat.files() > 0).then_some(stat.files_available() as u64);
    Ok((
        (stat.blocks() as u64).saturating_mul(frag),
        (stat.blocks_available() as u64).saturating_mul(frag),
        inodes,
    ))
}

/// What a measurement was asked to do about the reserve.
#[derive(Clone, Debug)]
pub(crate) struct Reserve {
    /// The reserve file.
    pub path: PathBuf,
    /// Its size.
    pub bytes: u64,
}

/// One look at the disk.
#[derive(Clone, Debug, Default)]
pub(crate) struct Measurement {
    /// Size of the file system.
    pub total: u64,
    /// Available bytes (outside the reserve while it is held).
    pub free: u64,
    /// Available inodes, where counted.
    pub inodes_free: Option<u64>,
    /// Bytes each directory under `tasks/` takes.
    pub dirs: HashMap<PathBuf, u64>,
    /// Whether the reserve file is in place.
    pub reserve_held: bool,
    /// How long the walk took.
    pub took: Duration,
}

/// Measures the file system and every task directory, and takes or
/// releases the reserve: released when less than half of it is free
/// besides it, taken again once twice of it is free. Blocking.
pub(crate) fn measure(tasks_dir: &Path, reserve: &Reserve) -> Measurement {
    let started = Instant::now();
    let mut m = Measurement::default();
    if let Ok((total, free, inodes)) = space(tasks_dir) {
        (m.total, m.free, m.inodes_free) = (total, free, inodes);
    }
    let held = reserve_size(&reserve.path);
    m.reserve_held = held >= reserve.bytes;
    if m.reserve_held && m.free < reserve.bytes / 2 {
        match std::fs::remove_file(&reserve.path) {
            Ok(()) => {
                tracing::warn!(
                    free = m.free,
                    reserve = reserve.bytes,
                    "disk full: released the reserve for the agent's own records"
                );
                m.reserve_held = false;
            }
            Err(e) => {
                tracing::warn!(path = %reserve.path.display(), error = %e, "cannot release the disk reserve")
            }
        }
    } else if !m.reserve_held && m.free.saturating_add(held) >= reserve.bytes.saturating_mul(2) {
        match take_reserve(&reserve.path, reserve.bytes) {
            Ok(()) => m.reserve_held = true,
            Err(e) => {
                tracing::warn!(path = %reserve.path.display(), error = %e, "cannot take the disk reserve")
            }
        }
    }
    if let Ok((_, free, inodes)) = space(tasks_dir) {
        (m.free, m.inodes_free) = (free, inodes);
    }
    if let Ok(entries) = std::fs::read_dir(tasks_dir) {
        for entry in entries.flatten() {
            let path = entry.path();
            m.dirs.insert(path.clone(), usage(&path));
        }
    }
    m.took = started.elapsed();
    m
}

fn reserve_size(path: &Path) -> u64 {
    std::fs::symlink_metadata(path)
        .ok()
        .filter(|m| m.is_file())
        .map_or(0, |m| m.blocks() * 512)
}

/// Creates the reserve file with its blocks allocated (not a sparse file:
/// that would reserve nothing).
pub(crate) fn take_reserve(path: &Path, bytes: u64) -> io::Result<()> {
    use nix::fcntl::{fallocate, FallocateFlags};
    let file = std::fs::OpenOptions::new()
        .write(true)
        .create(true)
        .truncate(false)
        .open(path)?;
    // `off_t` is 32 bits on 32-bit targets (armv7): a reserve it cannot
    // hold is refused, never wrapped into a smaller one.
    let Ok(len) = nix::libc::off_t::try_from(bytes) else {
        let _ = std::fs::remove_file(path);
        return Err(io::Error::new(
            io::ErrorKind::InvalidInput,
            format!("a disk reserve of {bytes} bytes is more than this target's fallocate takes at once"),
        ));
    };
    if let Err(e) = fallocate(&file, FallocateFlags::empty(), 0, len) {
        let _ = std::fs::remove_file(path);
        return Err(e.into());
    }
    file.sync_all()
}

/// Bytes a directory tree takes (allocated blocks), without following
/// symbolic links or crossing into other file systems.
pub(crate) fn usage(dir: &Path) -> u64 {
    let Ok(top) = std::fs::symlink_metadata(dir) else {
        return 0;
    };
    let device = top.dev();
    let mut total = top.blocks() * 512;
    let mut stack = vec![dir.to_path_buf()];
    let mut seen = 0usize;
    while let Some(dir) = stack.pop() {
        let Ok(entries) = std::fs::read_dir(&dir) else {
            continue;
        };
        for entry in entries.flatten() {
            seen += 1;
            if seen > MAX_ENTRIES_PER_DIR {
                return total;
            }
            let Ok(meta) = entry.metadata() else { continue };
            if meta.dev() != device {
                continue;
            }
            total = total.saturating_add(meta.blocks() * 512);
            if meta.is_dir() {
                stack.push(entry.path());
            }
        }
    }
    total
}

/// A running task as the disk rules see it.
#[derive(Clone, Debug, PartialEq, Eq)]
pub(crate) struct TaskUse {
    /// The supervisor's id of it.
    pub id: u64,
    /// Bytes its directory takes.
    pub used: u64,
    /// Its `resources.disk`, if any.
    pub limit: Option<u64>,
}

/// What to do about the disk.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub(crate) struct Verdict {
    /// Running tasks to stop, with why.
    pub stop: Vec<(u64, String)>,
    /// Directories of finished tasks to delete now, oldest first.
    pub remove: Vec<PathBuf>,
    /// The disk is full: no new task until it is not.
    pub full: bool,
}

/// The disk's state and the limits, for [`assess`].
#[derive(Clone, Copy, Debug)]
pub(crate) struct Limits {
    /// The budget of all task directories.
    pub budget: u64,
    /// The reserve.
    pub reserve: u64,
}

/// Decides from a measurement: tasks over their own `resources.disk` are
/// stopped; over the budget, finished tasks' directories go first (oldest
/// first), then the largest running task; on a full disk (less than the
/// reserve free, or too few inodes), every finished directory may go and
/// then the largest running task.
pub(crate) fn assess(
    free: u64,
    inodes_free: Option<u64>,
    limits: Limits,
    running: &[TaskUse],
    finished: &[(PathBuf, u64)],
) -> Verdict {
    let mut v = Verdict {
        stop: over_own_limits(running),
        ..Verdict::default()
    };
    let mut stopped: std::collections::HashSet<u64> = v.stop.iter().map(|(id, _)| *id).collect();
    let largest = |stopped: &std::collections::HashSet<u64>| {
        running
            .iter()
            .filter(|t| !stopped.contains(&t.id) && t.used > 0)
            .max_by_key(|t| (t.used, std::cmp::Reverse(t.id)))
            .cloned()
    };
    let running_total: u64 = running
        .iter()
        .filter(|t| !stopped.contains(&t.id))
        .map(|t| t.used)
        .sum();
    let mut finished_left: Vec<&(PathBuf, u64)> = finished.iter().collect();
    let finished_total = |left: &[&(PathBuf, u64)]| left.iter().map(|(_, b)| *b).sum::<u64>();
    // Over the budget: finished directories first, oldest first.
    while running_total + finished_total(&finished_left) > limits.budget && !finished_left.is_empty() {
        let (dir, _) = finished_left.remove(0);
        v.remove.push(dir.clone());
    }
    if running_total > limits.budget {
        if let Some(task) = largest(&stopped) {
            v.stop.push((
                task.id,
                format!(
                    "the task directories reached {}, over the robot's disk budget of {}; this task's was the largest ({})",
                    mib(running_total),
                    mib(limits.budget),
                    mib(task.used)
                ),
            ));
            stopped.insert(task.id);
        }
    }
    let short_of_inodes = inodes_free.is_some_and(|n| n < MIN_FREE_INODES);
    if free < limits.reserve || short_of_inodes {
        // What deleting finished directories brings back, until twice the
        // reserve is free.
        let mut expected = free.saturating_add(v.remove_bytes(finished));
        while (expected < limits.reserve.saturating_mul(2) || short_of_inodes) && !finished_left.is_empty() {
            let (dir, bytes) = finished_left.remove(0);
            v.remove.push(dir.clone());
            expected = expected.saturating_add(*bytes);
        }
        if expected < limits.reserve || short_of_inodes {
            v.full = true;
            if let Some(task) = largest(&stopped) {
                v.stop.push((
                    task.id,
                    format!(
                        "the robot's disk is full ({} free, {} kept for the agent); this task's directory was the largest ({})",
                        mib(free),
                        mib(limits.reserve),
                        mib(task.used)
                    ),
                ));
            }
        }
    }
    v
}

/// The running tasks whose directory grew over their own
/// `resources.disk`, each with why it stops.
fn over_own_limits(running: &[TaskUse]) -> Vec<(u64, String)> {
    running
        .iter()
        .filter_map(|task| {
            let limit = task.limit.filter(|l| task.used > *l)?;
            Some((
                task.id,
                format!(
                    "its directory grew to {}, over its resources.disk of {}",
                    mib(task.used),
                    mib(limit)
                ),
            ))
        })
        .collect()
}

impl Verdict {
    fn remove_bytes(&self, finished: &[(PathBuf, u64)]) -> u64 {
        finished
            .iter()
            .filter(|(dir, _)| self.remove.contains(dir))
            .map(|(_, b)| *b)
            .sum()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const MIB: u64 = 1 << 20;

    fn task(id: u64, used_mib: u64, limit_mib: Option<u64>) -> TaskUse {
        TaskUse {
            id,
            used: used_mib * MIB,
            limit: limit_mib.map(|l| l * MIB),
        }
    }

    fn finished(names: &[(&str, u64)]) -> Vec<(PathBuf, u64)> {
        names
            .iter()
            .map(|(n, mib)| (PathBuf::from(n), mib * MIB))
            .collect()
    }

    /// The verdict stops exactly task `id`, saying `why`.
    fn assert_stops(v: &Verdict, id: u64, why: &str) {
        assert_eq!(v.stop.len(), 1, "{v:?}");
        assert_eq!(v.stop[0].0, id, "{v:?}");
        assert!(v.stop[0].1.contains(why), "{}", v.stop[0].1);
    }

    const LIMITS: Limits = Limits {
        budget: 100 * MIB,
        reserve: 10 * MIB,
    };

    #[test]
    fn sizes_parse_as_bytes_quantities_or_percentages() {
        assert_eq!("2Gi".parse(), Ok(DiskSize::Bytes(2 << 30)));
        assert_eq!("1000".parse(), Ok(DiskSize::Bytes(1000)));
        assert_eq!(" 50% ".parse(), Ok(DiskSize::Percent(50)));
        assert!("101%".parse::<DiskSize>().is_err());
        assert!("lots".parse::<DiskSize>().is_err());
        assert_eq!(DiskSize::Percent(50).of(1001), 500);
        assert_eq!(DiskSize::Percent(100).of(u64::MAX), u64::MAX);
        assert_eq!(DiskSize::Bytes(7).of(1), 7);
    }

    #[test]
    fn within_every_limit_nothing_happens() {
        let v = assess(
            500 * MIB,
            Some(10_000),
            LIMITS,
            &[task(1, 40, Some(50))],
            &finished(&[("a", 10)]),
        );
        assert_eq!(v, Verdict::default());
    }

    #[test]
    fn a_task_over_its_own_request_is_stopped() {
        let v = assess(
            500 * MIB,
            None,
            LIMITS,
            &[task(1, 60, Some(50)), task(2, 30, None)],
            &[],
        );
        assert_stops(&v, 1, "over its resources.disk of 50.0 MiB");
        assert!(!v.full);
    }

    #[test]
    fn over_the_budget_old_finished_directories_go_first() {
        let v = assess(
            500 * MIB,
            None,
            LIMITS,
            &[task(1, 50, None)],
            &finished(&[("old", 30), ("mid", 30), ("new", 30)]),
        );
        assert_eq!(v.remove, vec![PathBuf::from("old"), PathBuf::from("mid")]);
        assert!(v.stop.is_empty());
    }

    #[test]
    fn running_tasks_alone_over_the_budget_lose_the_largest() {
        let v = assess(
            500 * MIB,
            None,
            LIMITS,
            &[task(1, 70, None), task(2, 40, None)],
            &finished(&[("old", 5)]),
        );
        assert_eq!(v.remove, vec![PathBuf::from("old")]);
        assert_stops(&v, 1, "disk budget of 100.0 MiB");
    }

    #[test]
    fn a_full_disk_frees_finished_directories_then_stops_the_largest_task() {
        // 4 MiB free with a 10 MiB reserve: 16 more are needed to reach 20.
        let v = assess(
            4 * MIB,
            None,
            LIMITS,
            &[task(1, 5, None), task(2, 30, None)],
            &finished(&[("a", 10), ("b", 10), ("c", 10)]),
        );
        assert_eq!(v.remove, vec![PathBuf::from("a"), PathBuf::from("b")]);
        assert!(v.stop.is_empty() && !v.full, "{v:?}");

        let v = assess(
            MIB,
            None,
            LIMITS,
            &[task(1, 5, None), task(2, 30, None)],
            &finished(&[("a", 2)]),
        );
        assert_eq!(v.remove, vec![PathBuf::from("a")]);
        assert!(v.full);
        assert_stops(&v, 2, "disk is full");

        let v = assess(500 * MIB, Some(10), LIMITS, &[], &[]);
        assert!(v.full, "out of inodes is full too");
    }

    #[test]
    fn usage_counts_blocks_and_does_not_follow_links() {
        let dir = tempfile::tempdir().unwrap();
        std::fs::create_dir(dir.path().join("sub")).unwrap();
        std::fs::write(dir.path().join("sub/data"), vec![1u8; 64 * 1024]).unwrap();
        std::os::unix::fs::symlink("/usr", dir.path().join("usr")).unwrap();
        let used = usage(dir.path());
        assert!((64 * 1024..1024 * 1024).contains(&used), "{used}");
    }

    #[test]
    fn the_reserve_is_taken_released_and_taken_again() {
        let dir = tempfile::tempdir().unwrap();
        let tasks = dir.path().join("tasks");
        std::fs::create_dir(&tasks).unwrap();
        let reserve = Reserve {
            path: dir.path().join("reserve"),
            bytes: MIB,
        };
        let m = measure(&tasks, &reserve);
        assert!(m.reserve_held && m.total > 0, "{m:?}");
        assert!(reserve_size(&reserve.path) >= MIB);
        assert!(measure(&tasks, &reserve).reserve_held, "kept while space lasts");
        // A reserve the disk cannot hold twice over is not taken.
        let huge = Reserve {
            path: reserve.path.clone(),
            bytes: m.free.saturating_mul(4),
        };
        std::fs::remove_file(&huge.path).unwrap();
        let m = measure(&tasks, &huge);
        assert!(!m.reserve_held && !huge.path.exists());
    }
}
