//! The state journal: one JSON line per step of a task (accepted, started,
//! ended) in `state_dir/journal.jsonl`. After the agent dies, the tasks
//! accepted and not ended are exactly the ones a new agent must settle.
//!
//! Lines are appended with one write each (no fsync on the hot path: the
//! journal must survive the agent being killed, which the page cache does;
//! a power cut kills the tasks too and the manager's backstop covers it).
//! It is fsynced on compaction and at shutdown.

use std::collections::BTreeMap;
use std::fs::{self, File, OpenOptions};
use std::io::{self, BufRead, BufReader, Write};
use std::path::{Path, PathBuf};

use serde::{Deserialize, Serialize};

/// The journal's file name under the state dir.
pub(crate) const FILE_NAME: &str = "journal.jsonl";

/// Where a started task's processes are.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub(crate) struct Started {
    pub pid: i32,
    pub pgid: i32,
    /// The leader's start time in clock ticks, to tell it from a reused pid.
    pub pid_start: u64,
    /// The boot the process ran in; after a reboot nothing is left to kill.
    pub boot_id: String,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub cgroup: Option<PathBuf>,
    pub started_at: jiff::Timestamp,
}

/// One line of the journal.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(tag = "op", rename_all = "camelCase")]
pub(crate) enum Record {
    #[serde(rename_all = "camelCase")]
    Accepted {
        uid: String,
        attempt: u32,
        task_dir: PathBuf,
    },
    #[serde(rename_all = "camelCase")]
    Started {
        uid: String,
        attempt: u32,
        #[serde(flatten)]
        at: Started,
    },
    #[serde(rename_all = "camelCase")]
    Ended { uid: String, attempt: u32 },
}

/// A task the previous run accepted and never ended.
#[derive(Clone, Debug, PartialEq, Eq)]
pub(crate) struct Unfinished {
    pub uid: String,
    pub attempt: u32,
    pub task_dir: PathBuf,
    pub started: Option<Started>,
}

pub(crate) struct Journal {
    path: PathBuf,
    file: File,
    /// Lines written since the file was last rewritten.
    pub appended: usize,
}

impl Journal {
    /// Opens the journal and returns what the previous run left unfinished.
    pub(crate) fn open(state_dir: &Path) -> io::Result<(Journal, Vec<Unfinished>)> {
        let path = state_dir.join(FILE_NAME);
        let unfinished = match File::open(&path) {
            Ok(file) => replay(BufReader::new(file)),
            Err(e) if e.kind() == io::ErrorKind::NotFound => Vec::new(),
            Err(e) => return Err(e),
        };
        let file = OpenOptions::new().create(true).append(true).open(&path)?;
        Ok((
            Journal {
                path,
                file,
                appended: 0,
            },
            unfinished,
        ))
    }

    pub(crate) fn path(&self) -> &Path {
        &self.path
    }

    pub(crate) fn append(&mut self, record: &Record) -> io::Result<()> {
        let mut line = serde_json::to_vec(record).map_err(io::Error::other)?;
        line.push(b'\n');
        self.file.write_all(&line)?;
        self.appended += 1;
        Ok(())
    }

    /// Rewrites the journal with only `live` records (atomically: temp
    /// file, fsync, rename).
    pub(crate) fn compact<'a>(&mut self, live: impl IntoIterator<Item = &'a Record>) -> io::Result<()> {
        let tmp = self.path.with_extension("jsonl.tmp");
        {
            let mut out = io::BufWriter::new(File::create(&tmp)?);
            for record in live {
                serde_json::to_writer(&mut out, record).map_err(io::Error::other)?;
                out.write_all(b"\n")?;
            }
            out.into_inner().map_err(|e| e.into_error())?.sync_all()?;
        }
        fs::rename(&tmp, &self.path)?;
        self.file = OpenOptions::new().append(true).open(&self.path)?;
        self.appended = 0;
        Ok(())
    }

    pub(crate) fn sync(&self) -> io::Result<()> {
        self.file.sync_data()
    }
}

fn replay(reader: impl BufRead) -> Vec<Unfinished> {
    let mut open: BTreeMap<(String, u32), Unfinished> = BTreeMap::new();
    for (n, line) in reader.lines().enumerate() {
        let Ok(line) = line else { break };
        if line.trim().is_empty() {
            continue;
        }
        // A line cut short by a crash is skipped, not fatal.
        let record: Record = match serde_json::from_str(&line) {
            Ok(record) => record,
            Err(e) => {
                tracing::warn!(line = n + 1, error = %e, "skipping an unreadable journal line");
                continue;
            }
        };
        match record {
            Record::Accepted {
                uid,
                attempt,
                task_dir,
            } => {
                open.insert(
                    (uid.clone(), attempt),
                    Unfinished {
                        uid,
                        attempt,
                        task_dir,
                        started: None,
                    },
                );
            }
            Record::Started { uid, attempt, at } => {
                if let Some(task) = open.get_mut(&(uid, attempt)) {
                    task.started = Some(at);
                }
            }
            Record::Ended { uid, attempt } => {
                open.remove(&(uid, attempt));
            }
        }
    }
    open.into_values().collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    fn started(pid: i32) -> Started {
        Started {
            pid,
            pgid: pid,
            pid_start: 7,
            boot_id: "b".to_owned(),
            cgroup: None,
            started_at: jiff::Timestamp::UNIX_EPOCH,
        }
    }

    #[test]
    fn replays_what_was_not_ended_and_compacts() {
        let dir = tempfile::tempdir().unwrap();
        let (mut journal, left) = Journal::open(dir.path()).unwrap();
        assert!(left.is_empty());
        let accepted = |uid: &str| Record::Accepted {
            uid: uid.to_owned(),
            attempt: 1,
            task_dir: PathBuf::from("/t"),
        };
        journal.append(&accepted("a")).unwrap();
        journal.append(&accepted("b")).unwrap();
        journal.append(&accepted("c")).unwrap();
        let b_started = Record::Started {
            uid: "b".to_owned(),
            attempt: 1,
            at: started(42),
        };
        journal.append(&b_started).unwrap();
        journal
            .append(&Record::Ended {
                uid: "a".to_owned(),
                attempt: 1,
            })
            .unwrap();
        drop(journal);
        // A torn last line, as a crash mid-write leaves it.
        let mut file = OpenOptions::new()
            .append(true)
            .open(dir.path().join(FILE_NAME))
            .unwrap();
        file.write_all(b"{\"op\":\"ended\",\"ui").unwrap();

        let (mut journal, left) = Journal::open(dir.path()).unwrap();
        let uids: Vec<_> = left
            .iter()
            .map(|t| (t.uid.as_str(), t.started.as_ref().map(|s| s.pid)))
            .collect();
        assert_eq!(uids, vec![("b", Some(42)), ("c", None)]);

        journal.compact([&accepted("b"), &b_started]).unwrap();
        let (_, left) = Journal::open(dir.path()).unwrap();
        assert_eq!(left.len(), 1);
        assert_eq!(left[0].started, Some(started(42)));
    }
}
