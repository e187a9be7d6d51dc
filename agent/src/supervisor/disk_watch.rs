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
use super::logs::Stream;
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
    /// Directories of finished tasks, oldest first.
    finished: VecDeque<((String, u32), PathBuf)>,
}

impl DiskWatch {
    /// The watch of `tasks_dir` on the file system whose size is `total`.
    pub(crate) fn new(config: &SupervisorConfig, tasks_dir: PathBuf, total: u64) -> Self {
        let reserve = Reserve {
            path: config.reserve_file(),
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
    /// none is in flight. `rotate` runs with it (the rotation of the log
    /// files tasks write themselves).
    pub(crate) fn measure(
        &mut self,
        rotate: impl FnOnce() + Send + 'static,
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
        Some(move || {
            rotate();
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
    /// removes its configuration's files, frees its `work/` if asked, and deletes the oldest beyond the limit
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
            // Its ConfigMaps' and Secrets' files, and the kept copy, go
            // with the attempt.
            super::task_config::remove(&dir, &dir.join("work"));
            if free_work {
                remove_dir(&dir.join("work"));
            }
            for old in remove {
                remove_dir(&old);
            }
        }
    }
}

/// The log files of a task (which writes them itself).
pub(crate) fn task_logs(dir: &Path) -> [PathBuf; 2] {
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

#[cfg(test)]
mod tests {
    use std::time::SystemTime;

    use tempfile::TempDir;

    use super::*;
    use crate::supervisor::disk::DiskSize;

    const MIB: u64 = 1 << 20;

    /// A watch of `<tempdir>/tasks` with this budget and reserve.
    fn watch(budget: u64, reserve: u64) -> (DiskWatch, TempDir) {
        let state = tempfile::tempdir().unwrap();
        std::fs::create_dir(state.path().join("tasks")).unwrap();
        let w = watch_of(
            state.path(),
            DiskSize::Bytes(budget),
            Some(DiskSize::Bytes(reserve)),
            1 << 40,
        );
        (w, state)
    }

    fn watch_of(state_dir: &Path, budget: DiskSize, reserve: Option<DiskSize>, total: u64) -> DiskWatch {
        let config = SupervisorConfig {
            state_dir: state_dir.to_path_buf(),
            disk_budget: budget,
            disk_reserve: reserve,
            ..SupervisorConfig::default()
        };
        DiskWatch::new(&config, state_dir.join("tasks"), total)
    }

    fn dir(w: &DiskWatch, uid: &str) -> PathBuf {
        crate::supervisor::task_dir(&w.tasks_dir, uid, 1)
    }

    fn key(uid: &str) -> (String, u32) {
        (uid.to_owned(), 1)
    }

    /// A look at the disk: `free` bytes (the reserve held) and the task
    /// directories under the watch's, in MiB.
    fn measurement(w: &DiskWatch, free: u64, dirs: &[(&str, u64)]) -> Measurement {
        Measurement {
            free,
            reserve_held: true,
            dirs: dirs.iter().map(|(uid, mib)| (dir(w, uid), mib * MIB)).collect(),
            ..Measurement::default()
        }
    }

    fn running(w: &DiskWatch, id: u64, uid: &str, limit_mib: Option<u64>) -> Seen {
        Seen {
            id,
            dir: dir(w, uid),
            running: true,
            limit: limit_mib.map(|l| l * MIB),
        }
    }

    fn retire(w: &mut DiskWatch, uid: &str) {
        // The blocking work is left undone: these directories do not exist.
        drop(w.retire(key(uid), false, |_| false));
    }

    #[test]
    fn the_budget_and_the_default_reserve_follow_the_disk() {
        let state = tempfile::tempdir().unwrap();
        let mut small = watch_of(state.path(), DiskSize::Percent(50), None, 100 * MIB);
        assert_eq!(small.budget(), 50 * MIB);
        small.measured(&Measurement::default(), &[], true);
        assert_eq!(small.full(), Some((0, 5 * MIB)), "5% of a small disk");

        let mut large = watch_of(state.path(), DiskSize::Percent(50), None, 10 << 30);
        large.measured(&Measurement::default(), &[], true);
        assert_eq!(large.full(), Some((0, 32 * MIB)), "the default reserve");

        let mut set = watch_of(
            state.path(),
            DiskSize::Bytes(MIB),
            Some(DiskSize::Percent(1)),
            100 * MIB,
        );
        assert_eq!(set.budget(), MIB);
        set.measured(&Measurement::default(), &[], true);
        assert_eq!(set.full(), Some((0, MIB)));
    }

    #[test]
    fn a_running_task_over_its_own_limit_is_stopped() {
        let (mut w, _state) = watch(100 * MIB, MIB);
        let mut preparing = running(&w, 3, "c", Some(1));
        preparing.running = false;
        let tasks = [
            running(&w, 1, "a", Some(10)),
            running(&w, 2, "b", None),
            preparing,
        ];
        let m = measurement(&w, 500 * MIB, &[("a", 11), ("b", 50), ("c", 5), ("other", 1)]);
        let actions = w.measured(&m, &tasks, false);
        assert_eq!(
            actions.stop,
            vec![(
                1,
                "its directory grew to 11.0 MiB, over its resources.disk of 10.0 MiB".to_owned()
            )]
        );
        assert!(actions.remove.is_empty());
        assert_eq!(w.used(), 67 * MIB, "every directory counts, known or not");
        assert_eq!(w.full(), None);
    }

    #[test]
    fn the_next_look_is_soon_while_tasks_run_or_the_disk_is_full() {
        let (mut w, _state) = watch(100 * MIB, 10 * MIB);
        let roomy = measurement(&w, 500 * MIB, &[]);
        assert_eq!(w.measured(&roomy, &[], false).next, Some(MEASURE_BUSY));
        assert_eq!(w.measured(&roomy, &[], true).next, Some(MEASURE_IDLE));
        let full = measurement(&w, MIB, &[]);
        assert_eq!(w.measured(&full, &[], true).next, Some(MEASURE_BUSY));
    }

    #[test]
    fn a_full_disk_stops_the_largest_task_and_refuses_tasks_until_space_is_back() {
        let (mut w, _state) = watch(100 * MIB, 10 * MIB);
        let tasks = [running(&w, 1, "a", None), running(&w, 2, "b", None)];
        let m = measurement(&w, 4 * MIB, &[("a", 20), ("b", 30)]);
        let actions = w.measured(&m, &tasks, false);
        assert_eq!(actions.stop.len(), 1);
        assert_eq!(actions.stop[0].0, 2);
        assert!(
            actions.stop[0].1.contains("disk is full"),
            "{}",
            actions.stop[0].1
        );
        assert_eq!(w.full(), Some((4 * MIB, 10 * MIB)));

        let back = measurement(&w, 20 * MIB, &[("a", 20)]);
        assert!(w.measured(&back, &tasks, false).stop.is_empty());
        assert_eq!(w.full(), None);
    }

    #[test]
    fn a_released_reserve_is_owed_out_of_the_free_space() {
        let (mut w, _state) = watch(100 * MIB, 10 * MIB);
        let released = Measurement {
            reserve_held: false,
            ..measurement(&w, 15 * MIB, &[])
        };
        w.measured(&released, &[], true);
        assert_eq!(w.full(), Some((5 * MIB, 10 * MIB)));
        w.measured(&measurement(&w, 15 * MIB, &[]), &[], true);
        assert_eq!(w.full(), None, "held, all 15 MiB are free");
    }

    #[test]
    fn over_the_budget_finished_directories_go_oldest_first_and_once() {
        let (mut w, _state) = watch(100 * MIB, MIB);
        for uid in ["a", "b", "c", "gone"] {
            retire(&mut w, uid);
        }
        let tasks = [running(&w, 1, "d", None)];
        // "gone" is no longer on the disk: it neither counts nor goes.
        let m = measurement(&w, 500 * MIB, &[("a", 40), ("b", 40), ("c", 40), ("d", 10)]);
        let actions = w.measured(&m, &tasks, false);
        assert_eq!(actions.remove, vec![dir(&w, "a")]);
        assert!(actions.stop.is_empty());
        // Its removal has not happened yet: it is not finished any more.
        assert!(w.measured(&m, &tasks, false).remove.is_empty());
    }

    #[test]
    fn a_finished_directory_held_again_is_not_removed() {
        let (mut w, _state) = watch(50 * MIB, MIB);
        retire(&mut w, "b");
        retire(&mut w, "a");
        w.keep_held(|k| *k == key("b"));
        let m = measurement(&w, 500 * MIB, &[("a", 60), ("b", 60)]);
        assert_eq!(w.measured(&m, &[], false).remove, vec![dir(&w, "a")]);
    }

    #[test]
    fn directories_left_by_an_earlier_run_count_as_finished_oldest_first() {
        let state = tempfile::tempdir().unwrap();
        let tasks_dir = state.path().join("tasks");
        let epoch = SystemTime::UNIX_EPOCH;
        for (name, age) in [("y-2", 200), ("x-1", 100), ("notes", 0), ("z-abc", 0)] {
            let path = tasks_dir.join(name);
            std::fs::create_dir_all(&path).unwrap();
            let modified = epoch + Duration::from_secs(1_000_000 + age);
            std::fs::File::open(&path)
                .unwrap()
                .set_modified(modified)
                .unwrap();
        }
        let mut w = watch_of(
            state.path(),
            DiskSize::Bytes(10 * MIB),
            Some(DiskSize::Bytes(MIB)),
            1 << 40,
        );
        let m = Measurement {
            free: 500 * MIB,
            reserve_held: true,
            dirs: ["y-2", "x-1", "notes", "z-abc"]
                .iter()
                .map(|name| (tasks_dir.join(name), 60 * MIB))
                .collect(),
            ..Measurement::default()
        };
        let actions = w.measured(&m, &[], true);
        assert_eq!(actions.remove, vec![tasks_dir.join("x-1"), tasks_dir.join("y-2")]);
    }

    #[test]
    fn a_retired_directory_is_closed_and_the_oldest_beyond_a_hundred_goes() {
        let (mut w, _state) = watch(100 * MIB, MIB);
        for uid in ["a", "b"] {
            std::fs::create_dir_all(dir(&w, uid).join("work")).unwrap();
            std::fs::write(dir(&w, uid).join("work/out"), "x").unwrap();
        }
        let mode = |path: &Path| std::fs::metadata(path).unwrap().permissions().mode() & 0o777;

        w.retire(key("a"), true, |_| false)();
        assert_eq!(mode(&dir(&w, "a")), 0o700);
        assert!(!dir(&w, "a").join("work").exists(), "its work/ freed as asked");
        w.retire(key("b"), false, |_| false)();
        assert_eq!(mode(&dir(&w, "b")), 0o700);
        assert!(dir(&w, "b").join("work/out").exists());

        for i in 2..KEEP_FINISHED_DIRS {
            retire(&mut w, &format!("k{i}"));
        }
        assert!(dir(&w, "a").exists(), "a hundred are kept");
        w.retire(key("last"), false, |_| false)();
        assert!(!dir(&w, "a").exists(), "the oldest beyond a hundred goes");
        // The next oldest is held again (the same attempt dispatched again):
        // forgotten, not removed.
        w.retire(key("later"), false, |k| *k == key("b"))();
        assert!(dir(&w, "b").join("work/out").exists());
        let m = measurement(&w, 500 * MIB, &[("b", 500)]);
        assert!(w.measured(&m, &[], true).remove.is_empty());
    }

    #[tokio::test(start_paused = true)]
    async fn a_sooner_measurement_replaces_a_later_one_and_one_runs_at_a_time() {
        let (mut w, _state) = watch(100 * MIB, 0);
        std::fs::create_dir(dir(&w, "t")).unwrap();
        std::fs::write(dir(&w, "t").join("file"), vec![b'x'; 64 * 1024]).unwrap();
        assert!(w.measure(|| {}).is_none(), "nothing is due");

        assert!(w.schedule(MEASURE_IDLE));
        assert!(w.schedule(MEASURE_BUSY), "sooner: armed");
        assert!(!w.schedule(MEASURE_IDLE), "later than the one due");
        assert!(!w.schedule(MEASURE_BUSY), "no sooner than the one due");

        tokio::time::advance(MEASURE_BUSY - Duration::from_millis(1)).await;
        assert!(w.measure(|| {}).is_none(), "not due yet");
        tokio::time::advance(Duration::from_millis(1)).await;
        let work = w.measure(|| {}).expect("due");
        assert!(w.measure(|| {}).is_none(), "the one due is taken");

        // Due again while the first is in flight: that one schedules the next.
        assert!(w.schedule(Duration::ZERO));
        assert!(w.measure(|| {}).is_none());

        let m = work();
        assert_eq!(m.dirs.keys().collect::<Vec<_>>(), vec![&dir(&w, "t")]);
        assert!(m.dirs[&dir(&w, "t")] > 0);
        assert!(w.measured(&m, &[], true).next.is_some());
        assert!(w.schedule(Duration::ZERO), "the one in flight consumed the last");
        assert!(w.measure(|| {}).is_some());
        w.measured(&m, &[], true);

        // The 30 s timer replaced at the start fires: nothing is due.
        tokio::time::advance(MEASURE_IDLE).await;
        assert!(w.measure(|| {}).is_none());
    }

    #[test]
    fn a_tasks_log_files_are_under_its_logs() {
        assert_eq!(
            task_logs(Path::new("/t/a-1")),
            [
                PathBuf::from("/t/a-1/logs/stdout.log"),
                PathBuf::from("/t/a-1/logs/stderr.log")
            ]
        );
    }
}
