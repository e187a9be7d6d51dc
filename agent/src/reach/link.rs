//! A session's side of the robot's MQTT connection: frames out at QoS 0,
//! numbered and within the server's credits and the robot's rate; frames
//! in, checked for order ([`Flow`]), with credits and keepalives handled
//! here and the rest handed to the session. And the writer that feeds what
//! arrives to a process or a socket without holding up the session's loop.

use std::sync::Arc;
use std::time::Duration;

use k8s4r_api::protocol::reach::{
    Flow, Frame, SessionEnd, SessionOpen, SessionOpened, DEFAULT_SESSION_WINDOW,
};
use rumqttc::{AsyncClient, QoS};
use tokio::io::{AsyncWrite, AsyncWriteExt};
use tokio::sync::mpsc;
use tokio::time::Instant;

use super::Rate;

/// What the server said, for the session.
#[derive(Debug)]
pub(super) enum Incoming {
    /// Bytes of a stream (stdin, or towards the port).
    Data(u8, Vec<u8>),
    /// That stream ended.
    Eof(u8),
    /// The terminal's new size.
    Resize(u16, u16),
    /// Time to say the session is still here ([`Link::keepalive`]).
    Tick,
    /// The server granted credit: data may go again.
    Credit,
    /// The session is over from the server's side: why.
    Hangup(String),
}

/// One session's frames, both ways.
pub(super) struct Link {
    client: AsyncClient,
    topic: String,
    rx: mpsc::Receiver<Vec<u8>>,
    rate: Arc<Rate>,
    flow: Flow,
    epoch: Instant,
    lease: Duration,
    /// Bytes taken from the client.
    pub bytes_in: u64,
    /// Bytes sent to the client.
    pub bytes_out: u64,
}

impl Link {
    /// The link of a session `open` started, its frames arriving on `rx`.
    pub fn new(
        client: AsyncClient,
        topic: String,
        rx: mpsc::Receiver<Vec<u8>>,
        rate: Arc<Rate>,
        open: &SessionOpen,
    ) -> Self {
        let epoch = Instant::now();
        let mut flow = Flow::new(DEFAULT_SESSION_WINDOW, open.lease(), Duration::ZERO);
        flow.peer_window(open.window);
        // The open was frame 0.
        let _ = flow.receive(0, &Frame::Alive, Duration::ZERO);
        Link {
            client,
            topic,
            rx,
            rate,
            flow,
            epoch,
            lease: open.lease(),
            bytes_in: 0,
            bytes_out: 0,
        }
    }

    fn now(&self) -> Duration {
        self.epoch.elapsed()
    }

    async fn send(&mut self, frame: Frame) -> bool {
        let bytes = self.flow.send(&frame, self.now());
        self.client
            .publish(&self.topic, QoS::AtMostOnce, false, bytes)
            .await
            .is_ok()
    }

    /// Says the robot took the session.
    pub async fn opened(&mut self, mut opened: SessionOpened) -> bool {
        opened.window = self.flow.window();
        self.send(Frame::Opened(opened)).await
    }

    /// Whether a data frame may go now (the server has room for it).
    pub fn can_send(&self) -> bool {
        self.flow.can_send()
    }

    /// Sends bytes of `stream`, within the robot's rate; false once the
    /// connection is gone.
    pub async fn data(&mut self, stream: u8, bytes: &[u8]) -> bool {
        self.rate.spend(bytes.len()).await;
        self.bytes_out += bytes.len() as u64;
        self.send(Frame::Data(stream, bytes.to_vec())).await
    }

    /// Waits until `bytes` that arrived fit in the robot's rate (shared
    /// with what sessions send): an image push comes no faster.
    pub async fn take_in(&self, bytes: usize) {
        self.rate.spend(bytes).await;
    }

    /// Says `stream` has ended.
    pub async fn eof(&mut self, stream: u8) -> bool {
        self.send(Frame::Eof(stream)).await
    }

    /// A data frame that arrived was consumed: grants credit back when it
    /// is time.
    pub async fn consumed(&mut self) {
        if let Some(n) = self.flow.consumed() {
            self.send(Frame::Credit(n)).await;
        }
    }

    /// Says the session is still here.
    pub async fn keepalive(&mut self) {
        self.send(Frame::Alive).await;
    }

    /// Ends the session with `end`, counting its bytes.
    pub async fn end(mut self, mut end: SessionEnd) -> SessionEnd {
        end.bytes_in = self.bytes_in;
        end.bytes_out = self.bytes_out;
        self.send(Frame::End(end.clone())).await;
        end
    }

    /// The next thing the server says. Cancel-safe: it only waits for a
    /// frame or for time, and sends nothing itself (a keepalive due is
    /// [`Incoming::Tick`]).
    pub async fn next(&mut self) -> Incoming {
        loop {
            let now = self.now();
            if self.flow.lapsed(now) {
                return Incoming::Hangup(format!(
                    "no word from the cluster in {}s: the connection was lost",
                    self.lease.as_secs()
                ));
            }
            if self.flow.keepalive_due(now) {
                return Incoming::Tick;
            }
            let wait = self.flow.next_check(now).max(Duration::from_millis(10));
            let bytes = tokio::select! {
                bytes = self.rx.recv() => bytes,
                () = tokio::time::sleep(wait) => continue,
            };
            let Some(bytes) = bytes else {
                return Incoming::Hangup("the server sent more than the session's window; ended".into());
            };
            let (seq, frame) = match Frame::decode(&bytes) {
                Ok(decoded) => decoded,
                Err(e) => return Incoming::Hangup(format!("a frame that cannot be read: {e}")),
            };
            if let Err(gap) = self.flow.receive(seq, &frame, self.now()) {
                return Incoming::Hangup(gap.to_string());
            }
            match frame {
                Frame::Data(stream, data) => {
                    self.bytes_in += data.len() as u64;
                    return Incoming::Data(stream, data);
                }
                Frame::Eof(stream) => return Incoming::Eof(stream),
                Frame::Resize(cols, rows) => return Incoming::Resize(cols, rows),
                Frame::End(_) => return Incoming::Hangup("the client left".into()),
                Frame::Credit(_) => return Incoming::Credit,
                Frame::Alive => {}
                Frame::Open(_) | Frame::Opened(_) => {
                    return Incoming::Hangup("an open inside an open session".into())
                }
            }
        }
    }
}

/// What the writer does at the end of its stream.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) enum AtEof {
    /// Shut the stream down (a pipe or a socket's write half).
    Close,
    /// Write ^D (a terminal: the line discipline makes it an end of file
    /// for the reader).
    EndOfTransmission,
}

/// Feeds what arrives to a process's stdin or a socket, off the session's
/// loop (a process that does not read its stdin must not stop its output
/// from being read): one message per data frame, `None` for the end.
/// Every write done is said on `written`, so that the session grants
/// credit only for what left its memory.
pub(super) struct Writer {
    pub tx: mpsc::Sender<Option<Vec<u8>>>,
    pub written: mpsc::Receiver<std::io::Result<()>>,
}

impl Writer {
    /// Starts writing to `sink`.
    pub fn spawn<W: AsyncWrite + Unpin + Send + 'static>(mut sink: W, at_eof: AtEof) -> Writer {
        let window = usize::try_from(DEFAULT_SESSION_WINDOW).unwrap_or(8);
        let (tx, mut rx) = mpsc::channel::<Option<Vec<u8>>>(window + 1);
        let (done, written) = mpsc::channel(window + 1);
        tokio::spawn(async move {
            while let Some(next) = rx.recv().await {
                let result = match next {
                    Some(bytes) => sink.write_all(&bytes).await,
                    // The end takes no credit: nothing is said of it.
                    None => match at_eof {
                        AtEof::Close => {
                            let _ = sink.shutdown().await;
                            return;
                        }
                        AtEof::EndOfTransmission => {
                            let _ = sink.write_all(&[4]).await;
                            continue;
                        }
                    },
                };
                let failed = result.is_err();
                if done.send(result).await.is_err() || failed {
                    return;
                }
            }
        });
        Writer { tx, written }
    }
}
