//! The attempts this robot has accepted, on disk: one line per attempt
//! (`uid attempt`), appended and synced before the attempt starts, read
//! back into the fence when the agent starts. A dispatch the broker
//! delivers again after an agent restart (its PUBACK was lost with the
//! link; a new server process sent a still-dispatching attempt again) is
//! then refused as seen, instead of running the attempt a second time.
//!
//! The file is the agent's own (root's, mode 0600, in the state
//! directory). A line it cannot read is skipped with a warning; a line cut
//! short by a crash is the last one and names an attempt that never
//! started. The file is compacted when it opens once it holds more than
//! twice the tasks the fence remembers.

use std::collections::BTreeMap;
use std::fs::{self, File, OpenOptions};
use std::io::{self, Write};
use std::os::unix::fs::OpenOptionsExt;
use std::path::{Path, PathBuf};

use crate::fence::REMEMBERED_TASKS;

/// The file's name in the state directory.
pub const FILE: &str = "admitted";

/// The record of accepted attempts.
#[derive(Debug)]
pub struct Admitted {
    path: PathBuf,
    file: File,
}

impl Admitted {
    /// Opens (creating if needed) the record in `state_dir`; returns it and
    /// the highest attempt accepted of each task, oldest task first.
    pub fn open(state_dir: &Path) -> io::Result<(Admitted, Vec<(String, u32)>)> {
        let path = state_dir.join(FILE);
        let text = match fs::read_to_string(&path) {
            Ok(text) => text,
            Err(e) if e.kind() == io::ErrorKind::NotFound => String::new(),
            Err(e) => return Err(e),
        };
        let (seen, lines) = parse(&text, &path);
        if lines > 2 * REMEMBERED_TASKS {
            let keep = &seen[seen.len().saturating_sub(REMEMBERED_TASKS)..];
            let body: String = keep.iter().map(|(uid, a)| format!("{uid} {a}\n")).collect();
            let tmp = state_dir.join(format!(".tmp-{FILE}"));
            {
                let mut f = OpenOptions::new()
                    .write(true)
                    .create(true)
                    .truncate(true)
                    .mode(0o600)
                    .open(&tmp)?;
                f.write_all(body.as_bytes())?;
                f.sync_all()?;
            }
            fs::rename(&tmp, &path)?;
            File::open(state_dir)?.sync_all()?;
        }
        let file = OpenOptions::new()
            .append(true)
            .create(true)
            .mode(0o600)
            .open(&path)?;
        Ok((Admitted { path, file }, seen))
    }

    /// Records that `attempt` of `uid` was accepted, durably, before it
    /// starts.
    pub fn record(&mut self, uid: &str, attempt: u32) -> io::Result<()> {
        self.file.write_all(format!("{uid} {attempt}\n").as_bytes())?;
        self.file.sync_data()
    }

    /// Where the record is.
    pub fn path(&self) -> &Path {
        &self.path
    }
}

/// The highest attempt of each task, in the order tasks first appear, and
/// how many lines there were.
fn parse(text: &str, path: &Path) -> (Vec<(String, u32)>, usize) {
    let mut highest: BTreeMap<&str, (usize, u32)> = BTreeMap::new();
    let mut lines = 0;
    for line in text.lines() {
        lines += 1;
        let parsed = line
            .split_once(' ')
            .and_then(|(uid, a)| Some((uid, a.parse::<u32>().ok()?)))
            .filter(|(uid, _)| !uid.is_empty() && uid.len() <= 128);
        let Some((uid, attempt)) = parsed else {
            tracing::warn!(path = %path.display(), line, "unreadable line in the record of accepted attempts: skipped");
            continue;
        };
        let order = highest.len();
        let entry = highest.entry(uid).or_insert((order, attempt));
        entry.1 = entry.1.max(attempt);
    }
    let mut seen: Vec<(usize, String, u32)> = highest
        .into_iter()
        .map(|(uid, (order, attempt))| (order, uid.to_owned(), attempt))
        .collect();
    seen.sort();
    (seen.into_iter().map(|(_, uid, a)| (uid, a)).collect(), lines)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn what_was_recorded_comes_back_after_a_restart() {
        let dir = tempfile::tempdir().unwrap();
        let (mut record, seen) = Admitted::open(dir.path()).unwrap();
        assert!(seen.is_empty());
        record.record("u1", 1).unwrap();
        record.record("u2", 4).unwrap();
        record.record("u1", 3).unwrap();
        drop(record);
        let (_, seen) = Admitted::open(dir.path()).unwrap();
        assert_eq!(seen, vec![("u1".to_owned(), 3), ("u2".to_owned(), 4)]);
    }

    #[test]
    fn a_torn_or_garbage_line_is_skipped() {
        let dir = tempfile::tempdir().unwrap();
        fs::write(dir.path().join(FILE), "u1 2\n\u{202e}garbage\nu3 x\nu2 7\nu4").unwrap();
        let (_, seen) = Admitted::open(dir.path()).unwrap();
        assert_eq!(seen, vec![("u1".to_owned(), 2), ("u2".to_owned(), 7)]);
    }

    #[test]
    fn the_record_is_compacted_to_what_the_fence_remembers() {
        let dir = tempfile::tempdir().unwrap();
        let body: String = (0..2 * REMEMBERED_TASKS + 10)
            .map(|i| format!("u{i} 1\n"))
            .collect();
        fs::write(dir.path().join(FILE), body).unwrap();
        let (mut record, seen) = Admitted::open(dir.path()).unwrap();
        assert_eq!(seen.len(), 2 * REMEMBERED_TASKS + 10);
        record.record("new", 1).unwrap();
        drop(record);
        let lines = fs::read_to_string(dir.path().join(FILE)).unwrap().lines().count();
        assert_eq!(lines, REMEMBERED_TASKS + 1);
        let (_, seen) = Admitted::open(dir.path()).unwrap();
        assert_eq!(seen.last().unwrap(), &("new".to_owned(), 1));
    }
}
