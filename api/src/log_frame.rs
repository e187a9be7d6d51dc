//! The logs API's framed answer (`frames=true`), which `k8s4r logs` asks
//! for: the task's output and what the server has to say about it kept
//! apart, and an explicit end, so that a reader can tell a complete read
//! from one that was cut (a connection that closes cleanly half-way looks,
//! in plain text, like the end of the output).
//!
//! Each frame is one tag byte, the payload's length (4 bytes, big-endian)
//! and the payload:
//!
//! - `o`: output, as the robot sent it;
//! - `w`: a warning that some output is missing (skipped, lost on the
//!   way, or the robot stopped answering), as text for a person;
//! - `e`: the end of the answer (empty payload). Nothing follows it.
//!
//! An answer without its `e` frame was cut.

/// The content type of a framed answer.
pub const CONTENT_TYPE: &str = "application/x-k8s4r-log-frames";
/// The query parameter that asks for frames.
pub const QUERY: &str = "frames=true";
/// Largest payload a reader accepts (the server sends at most a chunk's
/// worth of output, or a line of warning, per frame).
pub const MAX_PAYLOAD: usize = 1 << 20;

/// One frame.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Frame {
    /// Output.
    Output(Vec<u8>),
    /// Some output is missing, and why.
    Warning(String),
    /// The answer is complete.
    End,
}

const OUTPUT: u8 = b'o';
const WARNING: u8 = b'w';
const END: u8 = b'e';
const HEADER: usize = 5;

impl Frame {
    /// The frame's bytes.
    pub fn encode(&self) -> Vec<u8> {
        let (tag, payload): (u8, &[u8]) = match self {
            Frame::Output(data) => (OUTPUT, data),
            Frame::Warning(text) => (WARNING, text.as_bytes()),
            Frame::End => (END, &[]),
        };
        let len = u32::try_from(payload.len()).unwrap_or(u32::MAX);
        let mut out = Vec::with_capacity(HEADER + payload.len());
        out.push(tag);
        out.extend_from_slice(&len.to_be_bytes());
        out.extend_from_slice(payload);
        out
    }
}

/// What makes a framed answer unreadable.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum FrameError {
    /// A tag this reader does not know.
    #[error("the logs answer is garbled (unknown frame {0:#04x})")]
    UnknownTag(u8),
    /// A frame larger than any the server sends.
    #[error("the logs answer is garbled (a frame of {0} bytes)")]
    TooLarge(usize),
    /// Bytes after the end frame.
    #[error("the logs answer goes on after its end")]
    AfterEnd,
}

/// Splits a byte stream into frames, however it was cut into pieces.
#[derive(Debug, Default)]
pub struct Decoder {
    buf: Vec<u8>,
    ended: bool,
}

impl Decoder {
    /// Takes the next piece of the stream.
    pub fn push(&mut self, bytes: &[u8]) {
        self.buf.extend_from_slice(bytes);
    }

    /// The next whole frame, if one has arrived.
    pub fn next_frame(&mut self) -> Result<Option<Frame>, FrameError> {
        if self.buf.is_empty() {
            return Ok(None);
        }
        if self.ended {
            return Err(FrameError::AfterEnd);
        }
        if self.buf.len() < HEADER {
            return Ok(None);
        }
        let tag = self.buf[0];
        if ![OUTPUT, WARNING, END].contains(&tag) {
            return Err(FrameError::UnknownTag(tag));
        }
        let len = u32::from_be_bytes([self.buf[1], self.buf[2], self.buf[3], self.buf[4]]) as usize;
        if len > MAX_PAYLOAD {
            return Err(FrameError::TooLarge(len));
        }
        if self.buf.len() < HEADER + len {
            return Ok(None);
        }
        let payload: Vec<u8> = self.buf.drain(..HEADER + len).skip(HEADER).collect();
        Ok(Some(match tag {
            OUTPUT => Frame::Output(payload),
            WARNING => Frame::Warning(String::from_utf8_lossy(&payload).into_owned()),
            _ => {
                self.ended = true;
                Frame::End
            }
        }))
    }

    /// Whether the end frame has arrived.
    pub fn ended(&self) -> bool {
        self.ended
    }

    /// Bytes received that do not make a whole frame yet.
    pub fn pending(&self) -> usize {
        self.buf.len()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn frames_survive_any_cut_of_the_stream() {
        let frames = vec![
            Frame::Output(b"hello\n".to_vec()),
            Frame::Warning("3 chunks lost".into()),
            Frame::Output(Vec::new()),
            Frame::End,
        ];
        let bytes: Vec<u8> = frames.iter().flat_map(Frame::encode).collect();
        for piece in 1..bytes.len() {
            let mut d = Decoder::default();
            let mut got = Vec::new();
            for part in bytes.chunks(piece) {
                d.push(part);
                while let Some(f) = d.next_frame().unwrap() {
                    got.push(f);
                }
            }
            assert_eq!(got, frames, "pieces of {piece}");
            assert!(d.ended());
            assert_eq!(d.pending(), 0);
        }
    }

    #[test]
    fn a_stream_without_its_end_is_not_ended() {
        let mut d = Decoder::default();
        d.push(&Frame::Output(b"partial".to_vec()).encode());
        d.push(&[b'o', 0, 0]);
        assert_eq!(d.next_frame().unwrap(), Some(Frame::Output(b"partial".to_vec())));
        assert_eq!(d.next_frame().unwrap(), None);
        assert!(!d.ended());
        assert_eq!(d.pending(), 3);
    }

    #[test]
    fn garbage_is_refused() {
        let mut d = Decoder::default();
        d.push(b"plain text");
        assert_eq!(d.next_frame(), Err(FrameError::UnknownTag(b'p')));
        let mut d = Decoder::default();
        d.push(&[b'o', 0xff, 0xff, 0xff, 0xff]);
        assert!(matches!(d.next_frame(), Err(FrameError::TooLarge(_))));
        let mut d = Decoder::default();
        d.push(&Frame::End.encode());
        d.push(b"o");
        assert_eq!(d.next_frame().unwrap(), Some(Frame::End));
        assert_eq!(d.next_frame(), Err(FrameError::AfterEnd));
    }
}
