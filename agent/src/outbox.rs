//! The on-disk status outbox.
//!
//! Every status update is written here (one file per update, fsynced and
//! renamed into place) before it is handed to MQTT, and its file is removed
//! only when the broker acknowledges it. After a broker outage or an agent
//! restart the session replays what is left, oldest first.
//!
//! Each entry's id is also its update's `seq`: ids only ever grow, across
//! restarts too (a high-water mark is reserved on disk in blocks), so every
//! update of an attempt carries a larger seq than the one before it.
//!
//! The outbox is bounded: past `max_entries`, non-terminal updates that a
//! later update of the same task supersedes are dropped. Terminal updates
//! are never dropped, so the bound is soft when only terminal ones remain.

use std::collections::BTreeMap;
use std::fs::{self, File};
use std::io::Write;
use std::path::{Path, PathBuf};

use k8s4r_api::protocol::{self, StatusUpdate};

/// How many seqs are reserved per write of the high-water mark.
const SEQ_BLOCK: u64 = 1024;
const SEQ_FILE: &str = "seq";
const ENTRY_SUFFIX: &str = ".json";

/// What went wrong with the outbox's files.
#[derive(Debug, thiserror::Error)]
pub enum OutboxError {
    /// A file operation failed.
    #[error("outbox {op} {path}: {source}")]
    Io {
        /// What was being done.
        op: &'static str,
        /// The file or directory.
        path: PathBuf,
        /// The error.
        source: std::io::Error,
    },
}

/// A status that could not be journalled, and the seq it was given.
#[derive(Debug, thiserror::Error)]
#[error("{source}")]
pub struct PushError {
    /// The seq the update got (and may still be sent with).
    pub seq: u64,
    /// Why it was not written.
    #[source]
    pub source: OutboxError,
}

fn io(op: &'static str, path: &Path) -> impl FnOnce(std::io::Error) -> OutboxError {
    let path = path.to_owned();
    move |source| OutboxError::Io { op, path, source }
}

/// The outbox in one directory.
#[derive(Debug)]
pub struct Outbox {
    dir: PathBuf,
    entries: BTreeMap<u64, StatusUpdate>,
    next_seq: u64,
    reserved: u64,
    max_entries: usize,
}

impl Outbox {
    /// Opens (creating if needed) the outbox in `dir` and loads what a
    /// previous run left. Unreadable entries are logged and set aside with a
    /// `.bad` suffix rather than blocking the queue.
    pub fn open(dir: &Path, max_entries: usize) -> Result<Outbox, OutboxError> {
        fs::create_dir_all(dir).map_err(io("create", dir))?;
        // Statuses carry tasks' output: root's alone, as the state directory
        // is traversable by task users.
        {
            use std::os::unix::fs::PermissionsExt;
            fs::set_permissions(dir, fs::Permissions::from_mode(0o700)).map_err(io("protect", dir))?;
        }
        let seq_path = dir.join(SEQ_FILE);
        let reserved = match fs::read_to_string(&seq_path) {
            Ok(text) => text.trim().parse::<u64>().unwrap_or_else(|_| {
                tracing::warn!(path = %seq_path.display(), "unreadable seq mark, starting above the entries");
                0
            }),
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => 0,
            Err(e) => return Err(io("read", &seq_path)(e)),
        };
        let mut entries = BTreeMap::new();
        for item in fs::read_dir(dir).map_err(io("list", dir))? {
            let item = item.map_err(io("list", dir))?;
            let path = item.path();
            let Some(name) = path.file_name().and_then(|n| n.to_str()) else {
                continue;
            };
            if name.starts_with(".tmp-") {
                // A write interrupted before its rename: never published.
                let _ = fs::remove_file(&path);
                continue;
            }
            let Some(id) = name
                .strip_suffix(ENTRY_SUFFIX)
                .and_then(|n| n.parse::<u64>().ok())
            else {
                continue;
            };
            let parsed = fs::read(&path)
                .map_err(|e| e.to_string())
                .and_then(|bytes| protocol::decode::<StatusUpdate>(&bytes).map_err(|e| e.to_string()));
            match parsed {
                Ok(update) => {
                    entries.insert(id, update);
                }
                Err(reason) => {
                    tracing::error!(path = %path.display(), %reason, "unreadable outbox entry set aside");
                    let _ = fs::rename(&path, path.with_extension("bad"));
                }
            }
        }
        let above_entries = entries.keys().next_back().map_or(1, |id| id + 1);
        let mut outbox = Outbox {
            dir: dir.to_owned(),
            entries,
            // Anything below the reserved mark may have been used by the
            // previous run (and acknowledged, so its file is gone).
            next_seq: reserved.max(above_entries).max(1),
            reserved: 0,
            max_entries: max_entries.max(1),
        };
        outbox.reserve()?;
        Ok(outbox)
    }

    fn reserve(&mut self) -> Result<(), OutboxError> {
        let mark = self.next_seq.max(self.reserved) + SEQ_BLOCK;
        write_atomically(&self.dir, SEQ_FILE, mark.to_string().as_bytes())?;
        self.reserved = mark;
        Ok(())
    }

    /// The seq the next update will get.
    pub fn peek_seq(&self) -> u64 {
        self.next_seq
    }

    /// Gives `update` the next seq, writes it to disk, and returns its id
    /// (which is its seq). May compact superseded entries first.
    ///
    /// The seq is used up even when the write fails (the error carries it),
    /// so an update sent without its journal entry never shares a seq with
    /// the next one, which the server would then drop as a duplicate.
    pub fn push(&mut self, mut update: StatusUpdate) -> Result<u64, PushError> {
        let id = self.next_seq;
        self.next_seq += 1;
        update.seq = id;
        let written = if id >= self.reserved {
            self.reserve()
        } else {
            Ok(())
        };
        let written =
            written.and_then(|()| write_atomically(&self.dir, &entry_name(id), &protocol::encode(&update)));
        // Kept in memory either way: it is sent and waits for the server's
        // confirmation like the others; it just would not survive a restart.
        self.entries.insert(id, update);
        written.map_err(|source| PushError { seq: id, source })?;
        if self.entries.len() > self.max_entries {
            self.compact();
        }
        Ok(id)
    }

    /// Drops the entry `id` once the broker has it. Unknown ids (already
    /// removed, compacted away) are ignored.
    pub fn remove(&mut self, id: u64) -> Result<(), OutboxError> {
        if self.entries.remove(&id).is_some() {
            let path = self.dir.join(entry_name(id));
            match fs::remove_file(&path) {
                Ok(()) => {}
                Err(e) if e.kind() == std::io::ErrorKind::NotFound => {}
                Err(e) => return Err(io("remove", &path)(e)),
            }
        }
        Ok(())
    }

    /// The first entry with an id of at least `from`.
    pub fn first_from(&self, from: u64) -> Option<(u64, &StatusUpdate)> {
        self.entries.range(from..).next().map(|(id, u)| (*id, u))
    }

    /// Whether entry `id` is still waiting.
    pub fn contains(&self, id: u64) -> bool {
        self.entries.contains_key(&id)
    }

    /// Entries waiting for the broker.
    pub fn len(&self) -> usize {
        self.entries.len()
    }

    /// Whether nothing is waiting.
    pub fn is_empty(&self) -> bool {
        self.entries.is_empty()
    }

    /// The waiting updates, oldest first.
    pub fn iter(&self) -> impl Iterator<Item = (u64, &StatusUpdate)> {
        self.entries.iter().map(|(id, u)| (*id, u))
    }

    /// Removes non-terminal updates that a later update of the same task
    /// (same or later attempt) supersedes.
    pub fn compact(&mut self) {
        let superseded = superseded_entries(self.entries.iter().map(|(id, u)| (*id, u)));
        for id in &superseded {
            if let Err(e) = self.remove(*id) {
                tracing::warn!(error = %e, "cannot remove a compacted outbox entry");
            }
        }
        if self.entries.len() > self.max_entries {
            tracing::warn!(
                entries = self.entries.len(),
                max = self.max_entries,
                "outbox over its bound with nothing left to compact; terminal updates are kept"
            );
        } else if !superseded.is_empty() {
            tracing::info!(dropped = superseded.len(), "outbox compacted");
        }
    }
}

/// The ids of non-terminal updates followed by a later update of the same
/// task uid with the same or a later attempt. Pure, for testing.
pub fn superseded_entries<'a>(entries: impl DoubleEndedIterator<Item = (u64, &'a StatusUpdate)>) -> Vec<u64> {
    // Walk newest first, remembering the highest attempt seen per uid.
    let mut latest: BTreeMap<&str, u32> = BTreeMap::new();
    let mut out = Vec::new();
    for (id, u) in entries.rev() {
        match latest.get(u.task_uid.as_str()) {
            Some(&attempt) if attempt >= u.attempt && !u.state.is_terminal() => out.push(id),
            Some(&attempt) if attempt >= u.attempt => {}
            _ => {
                latest.insert(&u.task_uid, u.attempt);
            }
        }
    }
    out.reverse();
    out
}

fn entry_name(id: u64) -> String {
    format!("{id:020}{ENTRY_SUFFIX}")
}

/// Writes `name` in `dir` so that a crash leaves either the old content or
/// the new, never a torn file: temp file, fsync, rename, fsync the dir.
fn write_atomically(dir: &Path, name: &str, bytes: &[u8]) -> Result<(), OutboxError> {
    let tmp = dir.join(format!(".tmp-{name}"));
    let dest = dir.join(name);
    let mut file = File::create(&tmp).map_err(io("create", &tmp))?;
    file.write_all(bytes).map_err(io("write", &tmp))?;
    file.sync_all().map_err(io("sync", &tmp))?;
    drop(file);
    fs::rename(&tmp, &dest).map_err(io("rename", &dest))?;
    File::open(dir)
        .and_then(|d| d.sync_all())
        .map_err(io("sync", dir))?;
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;
    use k8s4r_api::{TaskReason, TaskState};

    fn update(uid: &str, attempt: u32, state: TaskState) -> StatusUpdate {
        StatusUpdate {
            reason: state.is_terminal().then_some(TaskReason::Completed),
            ..StatusUpdate::new(uid, attempt, 0, state)
        }
    }

    #[test]
    fn a_failed_write_uses_up_its_seq() {
        let root = tempfile::tempdir().unwrap();
        let dir = root.path().join("outbox");
        let mut ob = Outbox::open(&dir, 100).unwrap();
        {
            use std::os::unix::fs::PermissionsExt;
            let mode = fs::metadata(&dir).unwrap().permissions().mode();
            assert_eq!(mode & 0o777, 0o700, "statuses carry output: root's alone");
        }
        let a = ob.push(update("a", 1, TaskState::Running)).unwrap();
        // The disk goes away (full, unmounted): the write fails.
        std::fs::remove_dir_all(&dir).unwrap();
        let failed = ob.push(update("a", 1, TaskState::Completed)).unwrap_err();
        assert_eq!(
            failed.seq,
            a + 1,
            "the update goes out unjournalled with this seq"
        );
        assert!(
            ob.contains(a + 1),
            "and waits in memory for the server's confirmation like the others"
        );
        std::fs::create_dir_all(&dir).unwrap();
        let c = ob.push(update("b", 1, TaskState::Running)).unwrap();
        assert_eq!(c, a + 2, "never the unjournalled update's seq again");
    }

    #[test]
    fn entries_survive_reopen_in_order_and_seqs_keep_growing() {
        let dir = tempfile::tempdir().unwrap();
        let mut ob = Outbox::open(dir.path(), 100).unwrap();
        let a = ob.push(update("a", 1, TaskState::Running)).unwrap();
        let b = ob.push(update("a", 1, TaskState::Completed)).unwrap();
        let c = ob.push(update("b", 1, TaskState::Running)).unwrap();
        assert!(a < b && b < c);
        ob.remove(a).unwrap();
        ob.remove(c).unwrap();
        drop(ob);

        let mut ob = Outbox::open(dir.path(), 100).unwrap();
        let left: Vec<_> = ob.iter().map(|(id, u)| (id, u.seq, u.state)).collect();
        assert_eq!(left, vec![(b, b, TaskState::Completed)]);
        let d = ob.push(update("b", 1, TaskState::Completed)).unwrap();
        assert!(d > c, "seq {d} must exceed every earlier one ({c})");
        // Even when everything was acknowledged, the mark keeps seqs growing.
        ob.remove(b).unwrap();
        ob.remove(d).unwrap();
        drop(ob);
        let mut ob = Outbox::open(dir.path(), 100).unwrap();
        assert!(ob.is_empty());
        assert!(ob.push(update("c", 1, TaskState::Running)).unwrap() > d);
    }

    #[test]
    fn torn_writes_and_junk_are_skipped() {
        let dir = tempfile::tempdir().unwrap();
        fs::write(dir.path().join(".tmp-00000000000000000009.json"), b"{").unwrap();
        fs::write(dir.path().join("00000000000000000003.json"), b"not json").unwrap();
        let ob = Outbox::open(dir.path(), 10).unwrap();
        assert!(ob.is_empty());
        assert!(dir.path().join("00000000000000000003.bad").exists());
        assert!(!dir.path().join(".tmp-00000000000000000009.json").exists());
    }

    #[test]
    fn compaction_drops_superseded_running_and_keeps_terminal() {
        let dir = tempfile::tempdir().unwrap();
        let mut ob = Outbox::open(dir.path(), 4).unwrap();
        ob.push(update("a", 1, TaskState::Running)).unwrap();
        ob.push(update("a", 1, TaskState::Failed)).unwrap();
        ob.push(update("a", 2, TaskState::Running)).unwrap();
        ob.push(update("b", 1, TaskState::Running)).unwrap();
        // The fifth push goes over the bound and compacts.
        ob.push(update("a", 2, TaskState::Completed)).unwrap();
        let left: Vec<_> = ob
            .iter()
            .map(|(_, u)| (u.task_uid.clone(), u.attempt, u.state))
            .collect();
        assert_eq!(
            left,
            vec![
                ("a".into(), 1, TaskState::Failed),
                ("b".into(), 1, TaskState::Running),
                ("a".into(), 2, TaskState::Completed),
            ]
        );
        assert_eq!(
            fs::read_dir(dir.path()).unwrap().count(),
            3 + 1,
            "3 entries + the seq mark"
        );
    }

    #[test]
    fn terminal_updates_are_never_dropped() {
        let dir = tempfile::tempdir().unwrap();
        let mut ob = Outbox::open(dir.path(), 2).unwrap();
        for i in 0..5 {
            ob.push(update(&format!("t{i}"), 1, TaskState::Completed))
                .unwrap();
        }
        assert_eq!(ob.len(), 5);
    }

    #[test]
    fn a_later_attempts_running_does_not_hide_an_earlier_terminal() {
        let u = [
            update("a", 1, TaskState::Running),
            update("a", 2, TaskState::Running),
            update("a", 1, TaskState::Running),
        ];
        let ids = superseded_entries(u.iter().enumerate().map(|(i, u)| (i as u64, u)));
        assert_eq!(ids, vec![0]);
    }
}
