//! A port-forward session: one TCP connection to a port on the robot's
//! loopback (127.0.0.1, then ::1), its bytes carried both ways until both
//! directions have ended or the session does. `k8s4r port-forward` opens
//! one session per connection it accepts, as kubectl opens one stream
//! pair per connection.

use k8s4r_api::protocol::reach::{SessionEnd, SessionOpen, SessionOpened, MAX_SESSION_DATA, STDIN, STDOUT};
use tokio::io::AsyncReadExt;
use tokio::net::TcpStream;
use tokio_util::sync::CancellationToken;

use super::link::{AtEof, Incoming, Link, Writer};

/// How long the port has to accept the connection.
const CONNECT: std::time::Duration = std::time::Duration::from_secs(5);

/// Connects to the port and carries the connection to its end.
pub(super) async fn run(mut link: Link, open: &SessionOpen, stop: CancellationToken) -> SessionEnd {
    let port = open.port.unwrap_or(0);
    let socket = match connect(port).await {
        Ok(socket) => socket,
        Err(why) => return link.end(SessionEnd::error(why)).await,
    };
    let _ = socket.set_nodelay(true);
    let (mut read, write) = socket.into_split();
    let mut writer = Some(Writer::spawn(write, AtEof::Close));
    if !link.opened(SessionOpened::default()).await {
        return SessionEnd::error("the robot's connection is gone");
    }
    let mut buf = vec![0u8; MAX_SESSION_DATA];
    let mut reading = true;
    let mut writing = true;
    while reading || writing {
        let can_send = link.can_send();
        tokio::select! {
            () = stop.cancelled() => return link.end(SessionEnd::error("the robot's agent is stopping")).await,
            incoming = link.next() => match incoming {
                Incoming::Data(STDIN, bytes) => match &writer {
                    Some(w) => { let _ = w.tx.send(Some(bytes)).await; }
                    None => link.consumed().await,
                },
                Incoming::Data(..) | Incoming::Resize(..) => link.consumed().await,
                Incoming::Eof(_) => {
                    if let Some(w) = &writer {
                        let _ = w.tx.send(None).await;
                    }
                    writing = false;
                }
                Incoming::Tick => link.keepalive().await,
                Incoming::Credit => {}
                Incoming::Hangup(why) => return link.end(SessionEnd::error(why)).await,
            },
            Some(written) = recv_written(&mut writer) => {
                if let Err(e) = written {
                    tracing::debug!(port, error = %e, "a forwarded connection stopped taking data");
                    writer = None;
                    writing = false;
                }
                link.consumed().await;
            }
            read = read.read(&mut buf), if reading && can_send => match read {
                Ok(n) if n > 0 => {
                    if !link.data(STDOUT, &buf[..n]).await {
                        return SessionEnd::error("the robot's connection is gone");
                    }
                }
                Ok(_) => {
                    reading = false;
                    link.eof(STDOUT).await;
                }
                Err(e) => {
                    return link.end(SessionEnd::error(format!("port {port}: {e}"))).await;
                }
            },
        }
    }
    link.end(SessionEnd::default()).await
}

async fn recv_written(writer: &mut Option<Writer>) -> Option<std::io::Result<()>> {
    match writer {
        Some(w) => w.written.recv().await,
        None => std::future::pending().await,
    }
}

/// A connection to `port` on the loopback, IPv4 first.
async fn connect(port: u16) -> Result<TcpStream, String> {
    let mut last = String::new();
    for host in ["127.0.0.1", "::1"] {
        match tokio::time::timeout(CONNECT, TcpStream::connect((host, port))).await {
            Ok(Ok(socket)) => return Ok(socket),
            Ok(Err(e)) => last = e.to_string(),
            Err(_) => last = format!("no answer within {}s", CONNECT.as_secs()),
        }
    }
    Err(format!(
        "cannot connect to port {port} on the robot's loopback: {last}"
    ))
}
