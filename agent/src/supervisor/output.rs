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

use nix::fcntl::{fcntl, FcntlArg, OFlag};
use tokio::io::unix::AsyncFd;
use tokio::io::Interest;

use super::logs::Stream;

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
