//! Per-task log files with a size cap and rotation, written by one thread.
//!
//! The supervisor reads the pipes; writing to disk happens on a dedicated
//! thread so a slow SD card never delays a deadline. Nothing the supervisor
//! asks of it ever blocks: output waits in a queue bounded by bytes, and
//! what does not fit is dropped and counted (the task's status says how
//! much); opening and closing a task's logs queue without a bound, one
//! each per task. One thread for every task: the per-task cost is two open
//! files at most.

use std::collections::HashMap;
use std::fs::{self, File, OpenOptions};
use std::io::{self, Write};
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::mpsc::{self, Receiver, Sender};
use std::sync::Arc;

/// Bytes of output queued for the writer before more is dropped.
const QUEUE_BYTES: u64 = 8 << 20;

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

pub(crate) enum Op {
    Open { id: u64, dir: PathBuf },
    Write { id: u64, stream: Stream, data: Vec<u8> },
    Close { id: u64 },
    Flush(tokio::sync::oneshot::Sender<()>),
}

/// How the writer thread takes its operations from the channel: as they
/// come in production; the unit tests hold them at a gate, as a stalled
/// disk would.
pub(crate) type OpSource = Box<dyn FnOnce(Receiver<Op>) -> Box<dyn Iterator<Item = Op> + Send> + Send>;

/// Operations as they come.
pub(crate) fn as_they_come() -> OpSource {
    Box::new(|rx| Box::new(rx.into_iter()))
}

/// The sending side, owned by the supervisor.
pub(crate) struct LogWriter {
    tx: Sender<Op>,
    queued: Arc<AtomicU64>,
    alive: Arc<std::sync::atomic::AtomicBool>,
}

impl LogWriter {
    /// Starts the writer thread, which takes its operations through
    /// `source`.
    pub(crate) fn start(max_bytes: u64, max_files: u32, source: OpSource) -> io::Result<Self> {
        let (tx, rx) = mpsc::channel();
        let queued = Arc::new(AtomicU64::new(0));
        let counter = Arc::clone(&queued);
        let alive = Arc::new(std::sync::atomic::AtomicBool::new(true));
        let guard = super::journal::Alive(Arc::clone(&alive));
        std::thread::Builder::new()
            .name("k8s4r-logs".to_owned())
            .stack_size(256 * 1024)
            .spawn(move || {
                let _alive = guard;
                write_loop(source(rx), counter, max_bytes.max(1), max_files.max(1))
            })?;
        Ok(LogWriter { tx, queued, alive })
    }

    /// Logs of task `id` go to `dir/stdout.log` and `dir/stderr.log`.
    pub(crate) fn open(&self, id: u64, dir: PathBuf) {
        let _ = self.tx.send(Op::Open { id, dir });
    }

    /// Whether the thread still runs (it ends only when the writer is
    /// dropped, or by a bug).
    pub(crate) fn is_alive(&self) -> bool {
        self.alive.load(Ordering::Relaxed)
    }

    /// Bytes of output waiting for the writer.
    pub(crate) fn queued(&self) -> u64 {
        self.queued.load(Ordering::Relaxed)
    }

    /// Queues a chunk; returns false when it had to be dropped (the writer
    /// is that far behind).
    pub(crate) fn write(&self, id: u64, stream: Stream, data: Vec<u8>) -> bool {
        let len = data.len() as u64;
        let before = self.queued.fetch_add(len, Ordering::Relaxed);
        if before.saturating_add(len) > QUEUE_BYTES {
            self.queued.fetch_sub(len, Ordering::Relaxed);
            return false;
        }
        if self.tx.send(Op::Write { id, stream, data }).is_err() {
            self.queued.fetch_sub(len, Ordering::Relaxed);
            return false;
        }
        true
    }

    pub(crate) fn close(&self, id: u64) {
        let _ = self.tx.send(Op::Close { id });
    }

    /// Resolves when everything queued so far is written.
    pub(crate) fn flush(&self) -> tokio::sync::oneshot::Receiver<()> {
        let (tx, rx) = tokio::sync::oneshot::channel();
        let _ = self.tx.send(Op::Flush(tx));
        rx
    }
}

fn write_loop(rx: impl Iterator<Item = Op>, queued: Arc<AtomicU64>, max_bytes: u64, max_files: u32) {
    let mut open: HashMap<u64, [RotatingLog; 2]> = HashMap::new();
    for op in rx {
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
                queued.fetch_sub(data.len() as u64, Ordering::Relaxed);
            }
            Op::Close { id } => {
                open.remove(&id);
            }
            Op::Flush(done) => {
                let _ = done.send(());
            }
        }
    }
}

/// A stall switch for the unit tests: the writer thread waits at the gate
/// before each operation while it is closed.
#[cfg(test)]
pub(crate) mod test_gate {
    use super::Receiver;
    use std::sync::{Arc, Condvar, Mutex};

    #[derive(Default)]
    pub(crate) struct Gate {
        closed: Mutex<bool>,
        opened: Condvar,
    }

    pub(crate) struct Stall(Arc<Gate>);

    impl Gate {
        pub(crate) fn close(self: &Arc<Self>) -> Stall {
            *self.closed.lock().unwrap() = true;
            Stall(Arc::clone(self))
        }
    }

    impl Drop for Stall {
        fn drop(&mut self) {
            *self.0.closed.lock().unwrap() = false;
            self.0.opened.notify_all();
        }
    }

    /// Operations held at `gate` while it is closed.
    pub(crate) fn gated(gate: Arc<Gate>) -> super::OpSource {
        Box::new(move |rx: Receiver<super::Op>| {
            Box::new(std::iter::from_fn(move || {
                let op = rx.recv().ok()?;
                let mut closed = gate.closed.lock().unwrap();
                while *closed {
                    closed = gate.opened.wait(closed).unwrap();
                }
                Some(op)
            }))
        })
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

/// Rotates a log file another process writes: a service's, opened with
/// `O_APPEND` and handed to it, so that its output reaches the disk with or
/// without the agent. Once the file holds `max_bytes`, its content is
/// copied to `.1` (older ones shifted, `max_files` kept in all) and it is
/// truncated in place; the writer goes on at its start. What it writes
/// between the copy and the truncation is lost. Blocking.
pub(crate) fn rotate_shared(path: &Path, max_bytes: u64, max_files: u32) -> io::Result<()> {
    let len = match fs::metadata(path) {
        Ok(meta) => meta.len(),
        Err(e) if e.kind() == io::ErrorKind::NotFound => return Ok(()),
        Err(e) => return Err(e),
    };
    if len < max_bytes {
        return Ok(());
    }
    let kept = max_files.saturating_sub(1);
    if kept > 0 {
        remove_if_exists(&numbered(path, kept))?;
        for i in (1..kept).rev() {
            rename_if_exists(&numbered(path, i), &numbered(path, i + 1))?;
        }
        fs::copy(path, numbered(path, 1))?;
    }
    OpenOptions::new().write(true).open(path)?.set_len(0)
}

/// The last `max` bytes of a task's output from its log files: stdout's,
/// then stderr's.
pub(crate) fn files_tail(logs_dir: &Path, max: usize) -> Vec<u8> {
    let mut tail = read_tail(&logs_dir.join(Stream::Stdout.file_name()), max);
    tail.extend(read_tail(&logs_dir.join(Stream::Stderr.file_name()), max));
    tail.split_off(tail.len().saturating_sub(max))
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
    fn a_stalled_writer_never_blocks_and_drops_what_does_not_fit() {
        let dir = tempfile::tempdir().unwrap();
        let gate = std::sync::Arc::new(test_gate::Gate::default());
        let logs = LogWriter::start(1 << 30, 2, test_gate::gated(gate.clone())).unwrap();
        logs.open(1, dir.path().to_path_buf());
        let stall = gate.close();
        let chunk = vec![b'x'; 1 << 20];
        let mut taken = 0u64;
        let mut dropped = 0u64;
        for _ in 0..16 {
            if logs.write(1, Stream::Stdout, chunk.clone()) {
                taken += 1;
            } else {
                dropped += 1;
            }
        }
        // Open and close never wait, however far behind the writer is.
        logs.open(2, dir.path().join("other"));
        logs.close(2);
        assert_eq!((taken, dropped), (8, 8));
        drop(stall);
        let flushed = logs.flush();
        flushed.blocking_recv().unwrap();
        let written = fs::metadata(dir.path().join("stdout.log")).unwrap().len();
        assert_eq!(written, 8 << 20);
        assert!(logs.write(1, Stream::Stdout, chunk), "room again once written");
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
