//! A TCP proxy between one client (an agent) and its server (the broker)
//! that a test can cut, blackhole or slow down, like the network a robot
//! lives on. No root needed.
//!
//! - [`Fault::Cut`]: every connection is closed and new ones are closed as
//!   soon as accepted (a dead link that both ends notice).
//! - [`Fault::Blackhole`]: connections stay open but nothing flows either
//!   way; bytes wait in the kernel's buffers and arrive intact when the link
//!   heals (a Wi-Fi drop: neither end is told, keep-alives time out).
//! - [`Fault::Delay`]: every chunk waits this long before it is forwarded.
//! - [`Fault::Throttle`]: each direction forwards at most this many bytes
//!   a second (a thin cellular link); what waits, waits in order.

use std::net::SocketAddr;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::{TcpListener, TcpStream};
use tokio::sync::watch;
use tokio::task::JoinHandle;

/// What the proxy does to the link.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Fault {
    /// Bytes flow.
    None,
    /// Connections are closed, and new ones refused.
    Cut,
    /// Nothing flows; connections stay open.
    Blackhole,
    /// Bytes flow after this delay.
    Delay(Duration),
    /// Bytes flow at most this fast (bytes a second, each direction).
    Throttle(u64),
}

/// A running proxy; stops (closing every connection) on drop.
pub struct Proxy {
    addr: SocketAddr,
    fault: watch::Sender<Fault>,
    accept: JoinHandle<()>,
    links: Arc<Mutex<Vec<JoinHandle<()>>>>,
    /// Bytes forwarded from clients to the upstream.
    upstream_bytes: Arc<AtomicU64>,
}

impl Proxy {
    /// Listens on a free loopback port and forwards to `upstream`.
    pub async fn start(upstream: SocketAddr) -> Proxy {
        let listener = TcpListener::bind("127.0.0.1:0").await.expect("bind the proxy");
        let addr = listener.local_addr().expect("the proxy's address");
        let (fault, _) = watch::channel(Fault::None);
        let links: Arc<Mutex<Vec<JoinHandle<()>>>> = Arc::default();
        let upstream_bytes = Arc::new(AtomicU64::new(0));
        let accept = {
            let (fault, links, counted) = (fault.clone(), links.clone(), upstream_bytes.clone());
            tokio::spawn(async move {
                while let Ok((client, _)) = listener.accept().await {
                    if *fault.borrow() == Fault::Cut {
                        drop(client);
                        continue;
                    }
                    let link = tokio::spawn(forward(client, upstream, fault.subscribe(), counted.clone()));
                    let mut links = links.lock().unwrap_or_else(|e| e.into_inner());
                    links.retain(|l| !l.is_finished());
                    links.push(link);
                }
            })
        };
        Proxy {
            addr,
            fault,
            accept,
            links,
            upstream_bytes,
        }
    }

    /// Where clients connect.
    pub fn addr(&self) -> SocketAddr {
        self.addr
    }

    /// `mqtt://<addr>`, for a client of an MQTT upstream.
    pub fn mqtt_url(&self) -> String {
        format!("mqtt://{}", self.addr)
    }

    /// Applies `fault` from now on (to open connections too).
    pub fn set(&self, fault: Fault) {
        self.fault.send_replace(fault);
        if fault == Fault::Cut {
            for link in self.links.lock().unwrap_or_else(|e| e.into_inner()).drain(..) {
                link.abort();
            }
        }
    }

    /// Bytes forwarded from clients to the upstream so far.
    pub fn upstream_bytes(&self) -> u64 {
        self.upstream_bytes.load(Ordering::Relaxed)
    }

    /// The fault applied now.
    pub fn fault(&self) -> Fault {
        *self.fault.borrow()
    }

    /// Back to a healthy link.
    pub fn heal(&self) {
        self.set(Fault::None);
    }
}

impl Drop for Proxy {
    fn drop(&mut self) {
        self.accept.abort();
        for link in self.links.lock().unwrap_or_else(|e| e.into_inner()).drain(..) {
            link.abort();
        }
    }
}

async fn forward(
    client: TcpStream,
    upstream: SocketAddr,
    fault: watch::Receiver<Fault>,
    counted: Arc<AtomicU64>,
) {
    let Ok(server) = TcpStream::connect(upstream).await else {
        return;
    };
    let _ = client.set_nodelay(true);
    let _ = server.set_nodelay(true);
    let (client_read, client_write) = client.into_split();
    let (server_read, server_write) = server.into_split();
    tokio::select! {
        _ = pump(client_read, server_write, fault.clone(), Some(counted)) => {}
        _ = pump(server_read, client_write, fault, None) => {}
    }
}

/// Copies one direction, obeying the fault before each read. A delay is
/// latency, not a throttle: each chunk is forwarded its delay after it was
/// read, while the next ones are read meanwhile.
async fn pump(
    mut from: tokio::net::tcp::OwnedReadHalf,
    mut to: tokio::net::tcp::OwnedWriteHalf,
    fault: watch::Receiver<Fault>,
    counted: Option<Arc<AtomicU64>>,
) {
    let (chunks, mut due) = tokio::sync::mpsc::channel::<(tokio::time::Instant, Vec<u8>)>(1024);
    let mut read_fault = fault.clone();
    let reader = async move {
        let mut buf = vec![0u8; 16 * 1024];
        loop {
            // A blackhole stops reading: the sender's kernel buffers fill and
            // its TCP stalls, and nothing is lost when the link heals.
            let delay = loop {
                let now = *read_fault.borrow_and_update();
                match now {
                    Fault::Blackhole => {
                        if read_fault.changed().await.is_err() {
                            return;
                        }
                    }
                    Fault::Cut => return,
                    Fault::Delay(d) => break d,
                    Fault::None | Fault::Throttle(_) => break Duration::ZERO,
                }
            };
            let n = match from.read(&mut buf).await {
                Ok(0) | Err(_) => return,
                Ok(n) => n,
            };
            let at = tokio::time::Instant::now() + delay;
            if chunks.send((at, buf[..n].to_vec())).await.is_err() {
                return;
            }
        }
    };
    let mut write_fault = fault;
    let writer = async move {
        while let Some((at, bytes)) = due.recv().await {
            tokio::time::sleep_until(at).await;
            // Read before the blackhole began: hold it until the link heals.
            while *write_fault.borrow() == Fault::Blackhole {
                if write_fault.changed().await.is_err() {
                    return;
                }
            }
            let now = *write_fault.borrow();
            if now == Fault::Cut || to.write_all(&bytes).await.is_err() {
                return;
            }
            if let Some(counted) = &counted {
                counted.fetch_add(bytes.len() as u64, Ordering::Relaxed);
            }
            if let Fault::Throttle(rate) = now {
                tokio::time::sleep(Duration::from_secs_f64(bytes.len() as f64 / rate.max(1) as f64)).await;
            }
        }
    };
    // The reader's end lets the writer forward what is left, then stop.
    tokio::join!(reader, writer);
}

#[cfg(test)]
mod tests {
    use super::*;

    async fn echo_server() -> SocketAddr {
        let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
        let addr = listener.local_addr().unwrap();
        tokio::spawn(async move {
            while let Ok((mut s, _)) = listener.accept().await {
                tokio::spawn(async move {
                    let mut buf = [0u8; 1024];
                    while let Ok(n) = s.read(&mut buf).await {
                        if n == 0 || s.write_all(&buf[..n]).await.is_err() {
                            return;
                        }
                    }
                });
            }
        });
        addr
    }

    async fn roundtrip(s: &mut TcpStream, msg: &[u8], within: Duration) -> Option<Vec<u8>> {
        s.write_all(msg).await.ok()?;
        let mut buf = vec![0u8; msg.len()];
        tokio::time::timeout(within, s.read_exact(&mut buf))
            .await
            .ok()?
            .ok()?;
        Some(buf)
    }

    #[tokio::test]
    async fn a_blackhole_holds_bytes_until_it_heals_and_a_cut_closes() {
        let proxy = Proxy::start(echo_server().await).await;
        let mut s = TcpStream::connect(proxy.addr()).await.unwrap();
        assert_eq!(
            roundtrip(&mut s, b"one", Duration::from_secs(5)).await.as_deref(),
            Some(&b"one"[..])
        );
        proxy.set(Fault::Blackhole);
        assert_eq!(
            roundtrip(&mut s, b"two", Duration::from_millis(300)).await,
            None,
            "nothing flows"
        );
        proxy.heal();
        let mut buf = [0u8; 3];
        tokio::time::timeout(Duration::from_secs(5), s.read_exact(&mut buf))
            .await
            .unwrap()
            .unwrap();
        assert_eq!(&buf, b"two", "held, not lost");
        proxy.set(Fault::Cut);
        let mut rest = Vec::new();
        let closed = tokio::time::timeout(Duration::from_secs(5), s.read_to_end(&mut rest)).await;
        assert!(
            matches!(closed, Ok(Ok(0)) | Ok(Err(_))),
            "the connection is closed"
        );
        proxy.heal();
        let mut again = TcpStream::connect(proxy.addr()).await.unwrap();
        assert!(roundtrip(&mut again, b"back", Duration::from_secs(5))
            .await
            .is_some());
    }
}
