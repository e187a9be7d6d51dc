//! Per-task log files with a size cap and rotation, written by one thread.
//!
//! The supervisor reads the pipes; writing to disk happens on a dedicated
//! thread so a slow SD card never delays a deadline. One thread for every
//! task: the per-task cost is two open files at most.

use std::collections::HashMap;
use std::fs::{self, File, OpenOptions};
use std::io::{self, Write};
use std::path::{Path, PathBuf};
use std::sync::mpsc::{self, Receiver, SyncSender, TrySendError};

/// Chunks queued for the writer before output is dropped (and counted).
const QUEUE: usize = 4096;

/// Which stream a chunk of output came from.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Stream {
    Stdout,
    Stderr,
}

impl Stream {
    pub(crate) fn file_name(self) -> &'static str {
        match self {
            Stream::Stdout => "stdout.log",
            Stream::Stderr => "stderr.log",
        }
    }
}

enum Op {
    Open { id: u64, dir: PathBuf },
    Write { id: u64, stream: Stream, data: Vec<u8> },
    Close { id: u64 },
    RemoveDir(PathBuf),
    Flush(tokio::sync::oneshot::Sender<()>),
}

/// The sending side, owned by the supervisor.
pub(crate) struct LogWriter {
    tx: SyncSender<Op>,
}

impl LogWriter {
    pub(crate) fn start(max_bytes: u64, max_files: u32) -> io::Result<Self> {
        let (tx, rx) = mpsc::sync_channel(QUEUE);
        std::thread::Builder::new()
            .name("k8s4r-logs".to_owned())
            .spawn(move || write_loop(rx, max_bytes.max(1), max_files.max(1)))?;
        Ok(LogWriter { tx })
    }

    /// Logs of task `id` go to `dir/stdout.log` and `dir/stderr.log`.
    pub(crate) fn open(&self, id: u64, dir: PathBuf) {
        // Open and Close are never dropped: block if the queue is full.
        let _ = self.tx.send(Op::Open { id, dir });
    }

    /// Queues a chunk; returns false when it had to be dropped.
    pub(crate) fn write(&self, id: u64, stream: Stream, data: Vec<u8>) -> bool {
        match self.tx.try_send(Op::Write { id, stream, data }) {
            Ok(()) => true,
            Err(TrySendError::Full(_)) => false,
            Err(TrySendError::Disconnected(_)) => false,
        }
    }

    pub(crate) fn close(&self, id: u64) {
        let _ = self.tx.send(Op::Close { id });
    }

    /// Deletes a finished task's directory (on this thread: a large log
    /// tree on a slow card must not hold up the supervisor).
    pub(crate) fn remove_dir(&self, dir: PathBuf) {
        let _ = self.tx.send(Op::RemoveDir(dir));
    }

    /// Resolves when everything queued so far is written.
    pub(crate) fn flush(&self) -> tokio::sync::oneshot::Receiver<()> {
        let (tx, rx) = tokio::sync::oneshot::channel();
        let _ = self.tx.send(Op::Flush(tx));
        rx
    }
}

fn write_loop(rx: Receiver<Op>, max_bytes: u64, max_files: u32) {
    let mut open: HashMap<u64, [RotatingLog; 2]> = HashMap::new();
    while let Ok(op) = rx.recv() {
        match op {
            Op::Open { id, dir } => {
                let logs = [Stream::Stdout, Stream::Stderr]
                    .map(|s| RotatingLog::new(dir.join(s.file_name()), max_bytes, max_files));
                open.insert(id, logs);
            }
            Op::Write { id, stream, data } => {
                if let Some(logs) = open.get_mut(&id) {
                    let log = &mut logs[stream as usize];
                    if let Err(e) = log.write(&data) {
                        tracing::warn!(path = %log.path.display(), error = %e, "cannot write task log");
                    }
                }
            }
            Op::Close { id } => {
                open.remove(&id);
            }
            Op::RemoveDir(dir) => {
                if let Err(e) = fs::remove_dir_all(&dir) {
                    if e.kind() != io::ErrorKind::NotFound {
                        tracing::warn!(path = %dir.display(), error = %e, "cannot remove a finished task's directory");
                    }
                }
            }
            Op::Flush(done) => {
                let _ = done.send(());
            }
        }
    }
}

/// One stream's log: `name`, then `name.1` (newest) to `name.<max_files-1>`.
pub(crate) struct RotatingLog {
    path: PathBuf,
    file: Option<File>,
    size: u64,
    max_bytes: u64,
    max_files: u32,
}

impl RotatingLog {
    pub(crate) fn new(path: PathBuf, max_bytes: u64, max_files: u32) -> Self {
        RotatingLog {
            path,
            file: None,
            size: 0,
            max_bytes,
            max_files,
        }
    }

    pub(crate) fn write(&mut self, mut data: &[u8]) -> io::Result<()> {
        while !data.is_empty() {
            if self.size >= self.max_bytes {
                self.rotate()?;
            }
            let file = match &mut self.file {
                Some(file) => file,
                None => {
                    let file = OpenOptions::new().create(true).append(true).open(&self.path)?;
                    self.size = file.metadata()?.len();
                    self.file.insert(file)
                }
            };
            if self.size >= self.max_bytes {
                continue;
            }
            let room = usize::try_from(self.max_bytes - self.size).unwrap_or(usize::MAX);
            let n = room.min(data.len());
            file.write_all(&data[..n])?;
            self.size += n as u64;
            data = &data[n..];
        }
        Ok(())
    }

    fn rotate(&mut self) -> io::Result<()> {
        self.file = None;
        self.size = 0;
        let kept = self.max_files - 1;
        if kept == 0 {
            return remove_if_exists(&self.path);
        }
        remove_if_exists(&numbered(&self.path, kept))?;
        for i in (1..kept).rev() {
            rename_if_exists(&numbered(&self.path, i), &numbered(&self.path, i + 1))?;
        }
        rename_if_exists(&self.path, &numbered(&self.path, 1))
    }
}

fn numbered(path: &Path, n: u32) -> PathBuf {
    let mut name = path.as_os_str().to_owned();
    name.push(format!(".{n}"));
    PathBuf::from(name)
}

fn remove_if_exists(path: &Path) -> io::Result<()> {
    match fs::remove_file(path) {
        Err(e) if e.kind() != io::ErrorKind::NotFound => Err(e),
        _ => Ok(()),
    }
}

fn rename_if_exists(from: &Path, to: &Path) -> io::Result<()> {
    match fs::rename(from, to) {
        Err(e) if e.kind() != io::ErrorKind::NotFound => Err(e),
        _ => Ok(()),
    }
}

/// The last `max` bytes of a file (for the output tail of a task found in
/// the journal after a restart).
pub(crate) fn read_tail(path: &Path, max: usize) -> Vec<u8> {
    use std::io::{Read, Seek, SeekFrom};
    let Ok(mut file) = File::open(path) else {
        return Vec::new();
    };
    let len = file.metadata().map(|m| m.len()).unwrap_or(0);
    let start = len.saturating_sub(max as u64);
    let mut buf = Vec::new();
    if file.seek(SeekFrom::Start(start)).is_ok() {
        let _ = file.take(max as u64).read_to_end(&mut buf);
    }
    buf
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn rotates_and_keeps_max_files() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("stdout.log");
        let mut log = RotatingLog::new(path.clone(), 10, 3);
        for chunk in [&b"0123456789abc"[..], b"defghijklmnopqrstu", b"vwxyz"] {
            log.write(chunk).unwrap();
        }
        // 36 bytes in files of 10: the current file and two rotated ones.
        assert_eq!(fs::read(&path).unwrap(), b"uvwxyz");
        assert_eq!(fs::read(numbered(&path, 1)).unwrap(), b"klmnopqrst");
        assert_eq!(fs::read(numbered(&path, 2)).unwrap(), b"abcdefghij");
        assert!(!numbered(&path, 3).exists());
    }

    #[test]
    fn a_single_file_is_truncated() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("stderr.log");
        let mut log = RotatingLog::new(path.clone(), 4, 1);
        log.write(b"abcdefghij").unwrap();
        assert_eq!(fs::read(&path).unwrap(), b"ij");
        assert!(!numbered(&path, 1).exists());
    }

    #[test]
    fn tail_of_a_file() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("x");
        fs::write(&path, b"hello world").unwrap();
        assert_eq!(read_tail(&path, 5), b"world");
        assert_eq!(read_tail(&path, 100), b"hello world");
        assert!(read_tail(&dir.path().join("missing"), 5).is_empty());
    }
}
