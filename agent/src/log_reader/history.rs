//! What a read sends of a task's log files before it follows them: the
//! files of a stream oldest first, each from where `since` begins (its
//! time index, `crate::supervisor::log_times`), whole or its last lines.

use std::fs::File;
use std::io::{Read, Seek, SeekFrom};
use std::os::unix::fs::MetadataExt;
use std::path::{Path, PathBuf};
use std::time::SystemTime;

use k8s4r_api::protocol::LogStream;

use super::{Followed, Job, Out, BLOCK, MAX_TAIL_BYTES};
use crate::supervisor::LogFile;

pub(super) fn file_name(stream: LogStream) -> &'static str {
    match stream {
        LogStream::Stderr => LogFile::Stderr,
        _ => LogFile::Stdout,
    }
    .file_name()
}

/// A log's files, oldest first: `name.N` ... `name.1`, `name`.
pub(super) fn files_oldest_first(dir: &Path, stream: LogStream) -> Vec<PathBuf> {
    let name = file_name(stream);
    let mut rotated: Vec<(u32, PathBuf)> = std::fs::read_dir(dir)
        .into_iter()
        .flatten()
        .flatten()
        .filter_map(|e| {
            let file = e.file_name().into_string().ok()?;
            let n: u32 = file.strip_prefix(name)?.strip_prefix('.')?.parse().ok()?;
            Some((n, e.path()))
        })
        .collect();
    rotated.sort_by_key(|r| std::cmp::Reverse(r.0));
    let mut files: Vec<PathBuf> = rotated.into_iter().map(|(_, p)| p).collect();
    files.push(dir.join(name));
    files
}

/// The last `lines` lines of `data`.
pub(super) fn last_lines(data: &[u8], lines: u32) -> &[u8] {
    if lines == 0 {
        return &[];
    }
    let body = data.strip_suffix(b"\n").unwrap_or(data);
    let mut seen = 0;
    for (i, b) in body.iter().enumerate().rev() {
        if *b == b'\n' {
            seen += 1;
            if seen == lines {
                return &data[i + 1..];
            }
        }
    }
    data
}

/// What is read of one log file: from `from` to its length when opened.
pub(super) struct Part {
    file: File,
    from: u64,
    len: u64,
}

/// Sends the files' contents in order, a block at a time.
pub(super) fn send_history(files: &mut [Part], out: &mut Out<'_>) {
    let mut block = vec![0u8; BLOCK];
    for Part { file, from, len } in files.iter_mut() {
        if file.seek(SeekFrom::Start(*from)).is_err() {
            continue;
        }
        let mut left = len.saturating_sub(*from);
        while left > 0 && out.alive() {
            let want = usize::try_from(left).unwrap_or(BLOCK).min(BLOCK);
            let n = match file.read(&mut block[..want]) {
                Ok(0) | Err(_) => break,
                Ok(n) => n,
            };
            left -= n as u64;
            out.data(&block[..n], false);
        }
    }
}

/// The last `lines` lines of the files (newest last), read backwards a
/// block at a time, at most [`MAX_TAIL_BYTES`] of them.
pub(super) fn tail_of(files: &mut [Part], lines: u32) -> Vec<u8> {
    let mut blocks: Vec<Vec<u8>> = Vec::new();
    let mut newlines = 0u64;
    let mut taken = 0u64;
    'files: for Part { file, from, len } in files.iter_mut().rev() {
        let mut end = *len;
        while end > *from {
            if newlines > u64::from(lines) || taken >= MAX_TAIL_BYTES {
                break 'files;
            }
            let start = end.saturating_sub(BLOCK as u64).max(*from);
            let mut block = vec![0u8; usize::try_from(end - start).unwrap_or(BLOCK)];
            if file.seek(SeekFrom::Start(start)).is_err() || file.read_exact(&mut block).is_err() {
                break;
            }
            newlines += block.iter().filter(|b| **b == b'\n').count() as u64;
            taken += block.len() as u64;
            blocks.push(block);
            end = start;
        }
    }
    let all: Vec<u8> = blocks.into_iter().rev().flatten().collect();
    last_lines(&all, lines).to_vec()
}

impl Job {
    /// What is on disk now of `stream` (each file up to its length now;
    /// with `since`, those changed since, each from where its time index
    /// says output of that time begins), and its current file to follow
    /// from there: what comes later is followed.
    pub(super) fn open_stream(&self, stream: LogStream) -> (Vec<Part>, Followed) {
        let files = files_oldest_first(&self.dir, stream);
        let since = self.request.since.map(SystemTime::from);
        let since_ms = self
            .request
            .since
            .map(|s| u64::try_from(s.as_millisecond()).unwrap_or(0));
        let current = files.last().cloned().unwrap_or_default();
        let mut history: Vec<Part> = Vec::new();
        let mut followed = None;
        for path in &files {
            let Ok(file) = File::open(path) else {
                continue;
            };
            let Ok(meta) = file.metadata() else {
                continue;
            };
            let recent = since.is_none_or(|s| meta.modified().is_ok_and(|m| m >= s));
            if *path == current {
                if let Ok(again) = file.try_clone() {
                    followed = Some(Followed {
                        path: path.clone(),
                        inode: meta.ino(),
                        offset: meta.len(),
                        file: Some(again),
                    });
                }
            }
            if recent {
                let from = since_ms
                    .and_then(|s| crate::supervisor::log_times::start_of(path, s))
                    .unwrap_or(0)
                    .min(meta.len());
                history.push(Part {
                    file,
                    from,
                    len: meta.len(),
                });
            }
        }
        let followed = followed.unwrap_or(Followed {
            path: current,
            inode: 0,
            offset: 0,
            file: None,
        });
        (history, followed)
    }
}
