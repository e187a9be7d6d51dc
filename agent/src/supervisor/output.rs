//! Output pipes of running tasks and the tail kept for the status.
//!
//! The read ends are non-blocking fds registered with tokio; the supervisor
//! keeps one pending read per pipe in a `FuturesUnordered` it polls itself.
//! The fd is shared (`Arc`) with the task's record so that, when the task's
//! process exits, the supervisor can drain what is left synchronously
//! before it reports the end.

use std::collections::VecDeque;
use std::future::Future;
use std::io;
use std::os::fd::OwnedFd;
use std::pin::Pin;
use std::sync::Arc;

use futures::stream::FuturesUnordered;
use futures::StreamExt;
use nix::fcntl::{fcntl, FcntlArg, OFlag};
use tokio::io::unix::AsyncFd;
use tokio::io::Interest;

use super::logs::{LogWriter, Stream};

/// Bytes read from a pipe at a time.
const CHUNK: usize = 8192;

pub(crate) type PipeFd = Arc<AsyncFd<OwnedFd>>;

/// One completed read: task id, stream, the pipe, and the bytes (empty at
/// end of file).
pub(crate) type PipeRead = Pin<Box<dyn Future<Output = (u64, Stream, PipeFd, io::Result<Vec<u8>>)> + Send>>;

/// A pipe whose read end the supervisor polls; the write end goes to the
/// child.
pub(crate) fn pipe() -> io::Result<(PipeFd, OwnedFd)> {
    let (read, write) = nix::unistd::pipe2(OFlag::O_CLOEXEC)?;
    fcntl(&read, FcntlArg::F_SETFL(OFlag::O_NONBLOCK))?;
    // Deprecated because a `T` that does not own its fd could close or swap
    // it under the registration; an `OwnedFd` owns it and is never replaced.
    #[allow(deprecated)]
    let read = AsyncFd::with_interest(read, Interest::READABLE)?;
    Ok((Arc::new(read), write))
}

/// Waits until the pipe is readable and reads one chunk.
pub(crate) fn read_next(id: u64, stream: Stream, fd: PipeFd) -> PipeRead {
    Box::pin(async move {
        let result = loop {
            let mut guard = match fd.readable().await {
                Ok(guard) => guard,
                Err(e) => break Err(e),
            };
            if let Ok(result) = guard.try_io(|inner| read_chunk(inner.get_ref())) {
                break result;
            }
        };
        (id, stream, fd, result)
    })
}

fn read_chunk(fd: &OwnedFd) -> io::Result<Vec<u8>> {
    let mut buf = vec![0u8; CHUNK];
    let n = nix::unistd::read(fd, &mut buf)?;
    buf.truncate(n);
    Ok(buf)
}

/// Reads whatever the pipe holds right now, without waiting.
pub(crate) fn drain(fd: &AsyncFd<OwnedFd>, max: usize) -> Vec<u8> {
    let mut out = Vec::new();
    while out.len() < max {
        match read_chunk(fd.get_ref()) {
            Ok(chunk) if !chunk.is_empty() => out.extend_from_slice(&chunk),
            _ => break,
        }
    }
    out
}

/// Most output read from a pipe when its task's process has exited.
const DRAIN_MAX: usize = 1 << 20;

/// The output of running tasks: one pending read per pipe, what is read
/// goes to the task's tail and, through the log writer's thread, to its
/// log files; what the writer cannot take in time is dropped and counted.
pub(crate) struct Output {
    logs: LogWriter,
    pipes: FuturesUnordered<PipeRead>,
    /// Bytes dropped since the agent started.
    dropped: u64,
}

/// What a task keeps of its output.
pub(crate) struct Kept<'a> {
    pub tail: &'a mut Tail,
    pub dropped: &'a mut u64,
}

impl Output {
    pub(crate) fn new(logs: LogWriter) -> Self {
        Output {
            logs,
            pipes: FuturesUnordered::new(),
            dropped: 0,
        }
    }

    /// Bytes of output dropped since the agent started.
    pub(crate) fn dropped(&self) -> u64 {
        self.dropped
    }

    /// Whether the writer thread still runs.
    pub(crate) fn is_alive(&self) -> bool {
        self.logs.is_alive()
    }

    /// Bytes waiting for the writer.
    pub(crate) fn queued(&self) -> u64 {
        self.logs.queued()
    }

    /// Resolves when what is queued is written.
    pub(crate) fn flush(&self) -> tokio::sync::oneshot::Receiver<()> {
        self.logs.flush()
    }

    /// Task `id`'s pipes are read from now on, into `logs_dir`.
    pub(crate) fn attach(&mut self, id: u64, logs_dir: std::path::PathBuf, stdout: PipeFd, stderr: PipeFd) {
        self.logs.open(id, logs_dir);
        self.pipes.push(read_next(id, Stream::Stdout, stdout));
        self.pipes.push(read_next(id, Stream::Stderr, stderr));
    }

    /// The next read that completed. Cancel-safe.
    pub(crate) async fn next(&mut self) -> Option<(u64, Stream, PipeFd, io::Result<Vec<u8>>)> {
        self.pipes.next().await
    }

    /// Whether no pipe is read.
    pub(crate) fn is_empty(&self) -> bool {
        self.pipes.is_empty()
    }

    /// A read came back: kept (for a task still held) and read again.
    pub(crate) fn received(&mut self, id: u64, stream: Stream, fd: PipeFd, data: Vec<u8>, task: Kept<'_>) {
        self.keep(id, stream, data, task);
        self.pipes.push(read_next(id, stream, fd));
    }

    fn keep(&mut self, id: u64, stream: Stream, data: Vec<u8>, task: Kept<'_>) {
        task.tail.push(&data);
        let len = data.len() as u64;
        if !self.logs.write(id, stream, data) {
            *task.dropped += len;
            self.dropped += len;
        }
    }

    /// Task `id`'s process ended: what is left in its pipes is kept, and
    /// its log files closed.
    pub(crate) fn finish(&mut self, id: u64, pipes: [Option<PipeFd>; 2], task: Kept<'_>) {
        for (stream, fd) in [Stream::Stdout, Stream::Stderr].into_iter().zip(pipes) {
            if let Some(fd) = fd {
                let rest = drain(&fd, DRAIN_MAX);
                if !rest.is_empty() {
                    self.keep(
                        id,
                        stream,
                        rest,
                        Kept {
                            tail: &mut *task.tail,
                            dropped: &mut *task.dropped,
                        },
                    );
                }
            }
        }
        self.logs.close(id);
    }
}

/// The last bytes of a task's output, stdout and stderr interleaved as read.
/// Grows with the output, up to its cap; a silent task costs nothing.
#[derive(Debug, Default)]
pub(crate) struct Tail {
    buf: VecDeque<u8>,
    max: usize,
}

impl Tail {
    pub(crate) fn new(max: usize) -> Self {
        Tail {
            buf: VecDeque::new(),
            max,
        }
    }

    pub(crate) fn push(&mut self, data: &[u8]) {
        if self.max == 0 {
            return;
        }
        let data = &data[data.len().saturating_sub(self.max)..];
        let overflow = (self.buf.len() + data.len()).saturating_sub(self.max);
        self.buf.drain(..overflow);
        self.buf.extend(data);
    }

    /// The tail as text; a character cut at the start is dropped.
    pub(crate) fn text(&self) -> String {
        let bytes: Vec<u8> = self.buf.iter().copied().collect();
        lossy_tail(&bytes)
    }
}

/// Text of bytes that may start in the middle of a UTF-8 character.
pub(crate) fn lossy_tail(bytes: &[u8]) -> String {
    let skip = bytes
        .iter()
        .take(3)
        .take_while(|b| (**b & 0b1100_0000) == 0b1000_0000)
        .count();
    String::from_utf8_lossy(&bytes[skip..]).into_owned()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn tail_keeps_the_last_bytes() {
        let mut tail = Tail::new(8);
        tail.push(b"hello ");
        tail.push(b"world");
        assert_eq!(tail.text(), "lo world");
        tail.push(b"0123456789");
        assert_eq!(tail.text(), "23456789");
    }

    #[test]
    fn tail_drops_a_cut_character() {
        let mut tail = Tail::new(4);
        tail.push("aé€".as_bytes()); // 1 + 2 + 3 bytes: the cut keeps é's second byte
        assert_eq!(tail.text(), "€");
    }
}
