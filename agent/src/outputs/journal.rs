//! The outputs' journal, `state_dir/outputs/journal.jsonl`: one JSON line
//! per file taken into the spool, per step of its upload (begun, each part
//! the bucket took, completed, dropped) and when it is done, each synced
//! before what follows it is done. A restarted agent reads it back and
//! goes on from the last part the bucket confirmed. Lines it cannot read
//! (a crash mid-line, garbage) are skipped; the file is rewritten with
//! only what is pending when it opens.

use std::collections::BTreeMap;
use std::fs::{self, File, OpenOptions};
use std::io::{self, Write};
use std::os::unix::fs::OpenOptionsExt;
use std::path::{Path, PathBuf};

use serde::{Deserialize, Serialize};

use super::upload::Step;

/// The journal's name in the spool directory.
pub const FILE: &str = "journal.jsonl";
/// A journal with nothing pending is emptied once it has this many lines.
const EMPTY_AFTER: usize = 1024;

/// One file in the spool.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct Entry {
    /// Its number, and its file's name in the spool.
    pub id: u64,
    pub task_uid: String,
    pub attempt: u32,
    /// Relative to the task's working directory.
    pub path: String,
    pub size: u64,
    pub sha256: String,
    pub part_size: u64,
    /// The task's own directory (`work`) it was taken from...
    pub work_dir: PathBuf,
    /// ...and the working directory in it, which `path` is relative to.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub within: Option<String>,
    /// Remove it there once uploaded.
    #[serde(default)]
    pub delete_after: bool,
    /// Not taken at all, for this reason (a full quota): only reported.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub refused: Option<String>,
}

/// An entry and the steps of its upload so far.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Pending {
    pub entry: Entry,
    pub steps: Vec<Step>,
}

#[derive(Debug, Serialize, Deserialize)]
#[serde(rename_all = "camelCase", tag = "t")]
enum Line {
    Added { entry: Entry },
    Step { id: u64, step: Step },
    Done { id: u64 },
}

/// The journal, open for appending.
#[derive(Debug)]
pub struct Journal {
    path: PathBuf,
    file: File,
    live: usize,
    lines: usize,
}

impl Journal {
    /// Opens (creating) the journal in `dir`: it and what is pending, in
    /// the order taken.
    pub fn open(dir: &Path) -> io::Result<(Journal, Vec<Pending>)> {
        let path = dir.join(FILE);
        let text = match fs::read(&path) {
            Ok(bytes) => String::from_utf8_lossy(&bytes).into_owned(),
            Err(e) if e.kind() == io::ErrorKind::NotFound => String::new(),
            Err(e) => return Err(e),
        };
        let pending = replay(&text, &path);
        // Rewritten with only what is pending, then renamed over.
        let fresh = dir.join(format!("{FILE}.new"));
        let mut out = io::BufWriter::new(create(&fresh, true)?);
        for p in &pending {
            write_line(
                &mut out,
                &Line::Added {
                    entry: p.entry.clone(),
                },
            )?;
            for step in &p.steps {
                let id = p.entry.id;
                write_line(
                    &mut out,
                    &Line::Step {
                        id,
                        step: step.clone(),
                    },
                )?;
            }
        }
        out.into_inner().map_err(|e| e.into_error())?.sync_all()?;
        fs::rename(&fresh, &path)?;
        let file = create(&path, false)?;
        let live = pending.len();
        Ok((
            Journal {
                path,
                file,
                live,
                lines: 0,
            },
            pending,
        ))
    }

    /// A file taken into the spool.
    pub fn added(&mut self, entry: &Entry) -> io::Result<()> {
        self.append(&Line::Added { entry: entry.clone() })?;
        self.live += 1;
        Ok(())
    }

    /// A step of upload `id`.
    pub fn step(&mut self, id: u64, step: &Step) -> io::Result<()> {
        self.append(&Line::Step {
            id,
            step: step.clone(),
        })
    }

    /// Upload `id` is over (uploaded, dropped, reported).
    pub fn done(&mut self, id: u64) -> io::Result<()> {
        self.append(&Line::Done { id })?;
        self.live = self.live.saturating_sub(1);
        if self.live == 0 && self.lines >= EMPTY_AFTER {
            self.file.set_len(0)?;
            self.file.sync_all()?;
            self.lines = 0;
        }
        Ok(())
    }

    pub fn path(&self) -> &Path {
        &self.path
    }

    fn append(&mut self, line: &Line) -> io::Result<()> {
        let mut bytes = serde_json::to_vec(line).map_err(io::Error::other)?;
        bytes.push(b'\n');
        self.file.write_all(&bytes)?;
        self.file.sync_data()?;
        self.lines += 1;
        Ok(())
    }
}

fn create(path: &Path, truncate: bool) -> io::Result<File> {
    OpenOptions::new()
        .create(true)
        .append(!truncate)
        .write(true)
        .truncate(truncate)
        .mode(0o600)
        .open(path)
}

fn write_line(out: &mut impl Write, line: &Line) -> io::Result<()> {
    serde_json::to_writer(&mut *out, line).map_err(io::Error::other)?;
    out.write_all(b"\n")
}

fn replay(text: &str, path: &Path) -> Vec<Pending> {
    let mut pending: BTreeMap<u64, Pending> = BTreeMap::new();
    for (n, raw) in text.lines().enumerate() {
        if raw.trim().is_empty() {
            continue;
        }
        match serde_json::from_str::<Line>(raw) {
            Ok(Line::Added { entry }) => {
                pending.insert(
                    entry.id,
                    Pending {
                        entry,
                        steps: Vec::new(),
                    },
                );
            }
            Ok(Line::Step { id, step }) => {
                if let Some(p) = pending.get_mut(&id) {
                    p.steps.push(step);
                }
            }
            Ok(Line::Done { id }) => {
                pending.remove(&id);
            }
            Err(e) => {
                tracing::warn!(path = %path.display(), line = n + 1, error = %e, "an outputs journal line skipped")
            }
        }
    }
    pending.into_values().collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    fn entry(id: u64) -> Entry {
        Entry {
            id,
            task_uid: "u".into(),
            attempt: 1,
            path: format!("f{id}"),
            size: 10,
            sha256: "00".repeat(32),
            part_size: 8,
            work_dir: "/w".into(),
            within: None,
            delete_after: false,
            refused: None,
        }
    }

    #[test]
    fn what_is_pending_comes_back_with_its_steps_and_done_ones_do_not() {
        let dir = tempfile::tempdir().unwrap();
        let (mut j, pending) = Journal::open(dir.path()).unwrap();
        assert!(pending.is_empty());
        j.added(&entry(1)).unwrap();
        j.added(&entry(2)).unwrap();
        let begun = Step::Begun {
            upload_id: "up".into(),
            key: "k".into(),
        };
        j.step(1, &begun).unwrap();
        j.step(
            1,
            &Step::PartSent {
                part: 1,
                etag: "e1".into(),
            },
        )
        .unwrap();
        j.done(2).unwrap();
        drop(j);
        // A crash mid-line, and garbage.
        let mut f = OpenOptions::new()
            .append(true)
            .open(dir.path().join(FILE))
            .unwrap();
        f.write_all(b"not json\n{\"t\":\"step\",\"id\":1,\"st").unwrap();
        drop(f);
        let (_, pending) = Journal::open(dir.path()).unwrap();
        assert_eq!(
            pending,
            vec![Pending {
                entry: entry(1),
                steps: vec![
                    begun,
                    Step::PartSent {
                        part: 1,
                        etag: "e1".into()
                    }
                ],
            }]
        );
        // Rewritten with only that.
        let text = fs::read_to_string(dir.path().join(FILE)).unwrap();
        assert_eq!(text.lines().count(), 3, "{text}");
    }

    #[test]
    fn a_journal_with_nothing_pending_is_emptied() {
        let dir = tempfile::tempdir().unwrap();
        let (mut j, _) = Journal::open(dir.path()).unwrap();
        for id in 0..EMPTY_AFTER as u64 {
            j.added(&entry(id)).unwrap();
            j.done(id).unwrap();
        }
        assert_eq!(fs::metadata(j.path()).unwrap().len(), 0);
    }
}
