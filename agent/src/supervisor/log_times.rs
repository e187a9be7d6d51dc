//! When each part of a task's log was written: an index beside each log
//! file (`logs/.times/stdout.log` for `logs/stdout.log`, rotated with it),
//! one line `UNIX_MS OFFSET WINDOW_MS` when the file is written, at most
//! once a `WINDOW_MS`: a second, or 10 s once the index holds a sixteenth
//! of the file's cap (so that a task printing a line a second for days
//! keeps it small). A mark says that the file was `OFFSET` long at
//! `UNIX_MS`, and that what follows, up to the next mark, was written
//! within `WINDOW_MS` of it (a later write would have made a mark). The
//! task logger writes it as it writes the output; a log a task writes
//! itself (no logger) has none. An index that reaches an eighth of its
//! file's cap (a task that prints a few bytes a second for days) ends
//! with a mark whose window has no end: what follows is read whole.
//!
//! `k8s4r logs --since` reads each file from the first mark whose window
//! reaches the time asked for: it prints at most a window of output more
//! than asked for, where without an index it can only pick whole files.

use std::fs::{self, File, OpenOptions};
use std::io::Write;
use std::path::{Path, PathBuf};

/// The directory of the indexes, in the logs directory.
pub(crate) const DIR: &str = ".times";
/// Marks at most this often while the index is small.
const EVERY_MS: u64 = 1_000;
/// Marks at most this often once it is not.
const SPARSE_EVERY_MS: u64 = 10_000;
/// The window of an index's last mark, once it is full.
const FOREVER_MS: u64 = u64::MAX / 2;

/// A log file or its index opened to append to, created (owner only)
/// when missing.
pub(crate) fn open_appending(path: &Path) -> std::io::Result<File> {
    use std::os::unix::fs::OpenOptionsExt;
    OpenOptions::new()
        .create(true)
        .append(true)
        .mode(0o600)
        .open(path)
}

/// The index of the log at `log`.
pub(crate) fn index_path(log: &Path) -> Option<PathBuf> {
    Some(log.parent()?.join(DIR).join(log.file_name()?))
}

/// The marks of one log file being written.
pub(crate) struct Marks {
    path: PathBuf,
    file: Option<File>,
    last_ms: Option<u64>,
    written: u64,
    sparse_after: u64,
    /// Writing the index failed once: it is given up (the output is not).
    failed: bool,
}

impl Marks {
    /// The marks of `log`, whose files are cut at `max_bytes`.
    pub(crate) fn new(log: &Path, max_bytes: u64) -> Option<Marks> {
        Some(Marks {
            path: index_path(log)?,
            file: None,
            last_ms: None,
            written: 0,
            sparse_after: max_bytes / 16,
            failed: false,
        })
    }

    /// Notes that the log, `offset` bytes long, is written to at `now_ms`
    /// (ms since the epoch). Best effort: an index that cannot be written
    /// only makes `--since` coarser.
    pub(crate) fn mark(&mut self, offset: u64, now_ms: u64) {
        let every = if self.written > self.sparse_after {
            SPARSE_EVERY_MS
        } else {
            EVERY_MS
        };
        if self.failed
            || self
                .last_ms
                .is_some_and(|last| now_ms < last.saturating_add(every))
        {
            return;
        }
        let full = self.written > self.sparse_after.saturating_mul(2);
        let window = if full { FOREVER_MS } else { every };
        let line = format!("{now_ms} {offset} {window}\n");
        let written = self.open().and_then(|f| f.write_all(line.as_bytes()));
        match written {
            Ok(()) => {
                // A full index marks no more until its file rotates.
                self.last_ms = Some(if full { u64::MAX } else { now_ms });
                self.written += line.len() as u64;
            }
            Err(_) => self.failed = true,
        }
    }

    fn open(&mut self) -> std::io::Result<&mut File> {
        if self.file.is_none() {
            if let Some(dir) = self.path.parent() {
                fs::create_dir_all(dir)?;
            }
            let file = open_appending(&self.path)?;
            self.written = file.metadata()?.len();
            self.file = Some(file);
        }
        Ok(self.file.as_mut().expect("opened above"))
    }

    /// The log was rotated (its index with it): the next write starts a
    /// new index.
    pub(crate) fn rotated(&mut self) {
        self.file = None;
        self.last_ms = None;
        self.written = 0;
    }

    /// Where the index is, for the rotation.
    pub(crate) fn path(&self) -> &Path {
        &self.path
    }
}

/// The offset in `log` from which what was written at or after `since_ms`
/// begins, read from its index: the first mark whose window reaches that
/// time; past every window, the end (`u64::MAX`, for the caller to bound
/// by the file's length). None without an index.
pub(crate) fn start_of(log: &Path, since_ms: u64) -> Option<u64> {
    let text = fs::read_to_string(index_path(log)?).ok()?;
    let mut any = false;
    for line in text.lines() {
        let fields: Vec<u64> = line.split_whitespace().filter_map(|f| f.parse().ok()).collect();
        let [at, offset, window] = fields[..] else {
            continue;
        };
        any = true;
        if at.saturating_add(window) > since_ms {
            return Some(offset);
        }
    }
    any.then_some(u64::MAX)
}

/// Milliseconds since the epoch, now.
pub(crate) fn now_ms() -> u64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map(|d| u64::try_from(d.as_millis()).unwrap_or(u64::MAX))
        .unwrap_or(0)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn since_starts_at_the_last_mark_before_the_time_asked_for() {
        let dir = tempfile::tempdir().unwrap();
        let log = dir.path().join("stdout.log");
        assert_eq!(start_of(&log, 0), None, "no index");
        let mut marks = Marks::new(&log, 1 << 20).unwrap();
        marks.mark(0, 10_000);
        marks.mark(50, 10_400); // within the second: no mark
        marks.mark(100, 11_000);
        marks.mark(300, 15_000);
        let index = fs::read_to_string(index_path(&log).unwrap()).unwrap();
        assert_eq!(index, "10000 0 1000\n11000 100 1000\n15000 300 1000\n");
        assert_eq!(start_of(&log, 9_000), Some(0), "all of it is newer");
        assert_eq!(start_of(&log, 10_999), Some(0), "within the first window");
        assert_eq!(start_of(&log, 11_500), Some(100));
        assert_eq!(start_of(&log, 13_000), Some(300), "nothing written in between");
        assert_eq!(start_of(&log, 15_000), Some(300));
        assert_eq!(start_of(&log, 99_000), Some(u64::MAX), "nothing since");
    }

    #[test]
    fn a_large_index_marks_less_often() {
        let dir = tempfile::tempdir().unwrap();
        let log = dir.path().join("stdout.log");
        let mut marks = Marks::new(&log, 16 * 40).unwrap();
        let mut t = 1_000_000;
        for i in 0..10 {
            marks.mark(i * 10, t);
            t += 1_000;
        }
        let index = fs::read_to_string(index_path(&log).unwrap()).unwrap();
        assert!(
            index.lines().count() < 10,
            "sparser past a sixteenth of the cap: {index}"
        );
        // Past an eighth it ends, with a mark that reaches every time after.
        for i in 0..100 {
            marks.mark(100 + i, t);
            t += 10_000;
        }
        let index = fs::read_to_string(index_path(&log).unwrap()).unwrap();
        assert!(index.len() < 16 * 40 / 8 + 40, "bounded: {index}");
        let last = index.lines().last().unwrap();
        let offset: u64 = last.split_whitespace().nth(1).unwrap().parse().unwrap();
        assert_eq!(start_of(&log, t), Some(offset), "read whole after the last mark");
    }
}
