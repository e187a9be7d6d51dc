//! The accept loop: connections within `--max-connections`, TLS handshakes
//! within their bound and timeout, HTTP/1.1 with a header-read timeout, and
//! a graceful stop.
//!
//! ```text
//!   accepted ──(no connection slot)──> closed at once
//!      │ slot held until the connection ends
//!      ├─ plain HTTP ──────────────────────────┐
//!      └─ wait for a handshake turn, handshake │ (both within the timeout,
//!            │      └─(timeout, error)──> closed  else closed)
//!            ▼                                 ▼
//!      HTTP/1.1: headers within the header-read timeout, each request
//!      answered by the router; on shutdown, idle connections close and
//!      busy ones close after their answer
//! ```

use std::net::SocketAddr;
use std::sync::atomic::Ordering;
use std::sync::Arc;
use std::time::Duration;

use hyper_util::rt::{TokioIo, TokioTimer};
use hyper_util::server::graceful::{GracefulShutdown, Watcher};
use hyper_util::service::TowerToHyperService;
use tokio::io::{AsyncRead, AsyncWrite};
use tokio::net::{TcpListener, TcpStream};
use tokio::sync::OwnedSemaphorePermit;
use tokio_rustls::TlsAcceptor;
use tokio_util::sync::CancellationToken;

use super::Limiter;

/// File descriptors the server needs beside its connections (the store,
/// the listener, logs).
const SPARE_FILES: u64 = 64;

/// Serves `router` on `listener` (over TLS when `tls` is given) within the
/// connection limits, until `shutdown`; then stops accepting and returns once
/// every connection has ended.
pub async fn serve(
    listener: TcpListener,
    tls: Option<TlsAcceptor>,
    router: axum::Router,
    limiter: Arc<Limiter>,
    shutdown: CancellationToken,
) -> std::io::Result<()> {
    warn_if_files_run_out_first(limiter.limits.max_connections);
    let graceful = GracefulShutdown::new();
    let mut http = hyper::server::conn::http1::Builder::new();
    http.timer(TokioTimer::new())
        .header_read_timeout(limiter.limits.header_read_timeout);
    let service = TowerToHyperService::new(router);
    let mut refusing = false;
    // Said once per run of failures, not every 50 ms.
    let mut accept_failing = false;
    loop {
        let (stream, peer) = tokio::select! {
            accepted = listener.accept() => match accepted {
                Ok(conn) => {
                    if accept_failing {
                        tracing::info!("accepting connections again");
                        accept_failing = false;
                    }
                    conn
                }
                Err(e) => {
                    // Out of file descriptors, mostly: let connections end
                    // rather than spin.
                    if !accept_failing {
                        tracing::warn!(error = %e, "accept failed; retrying every 50 ms until it works again");
                        accept_failing = true;
                    } else {
                        tracing::debug!(error = %e, "accept failed");
                    }
                    tokio::time::sleep(Duration::from_millis(50)).await;
                    continue;
                }
            },
            _ = shutdown.cancelled() => break,
        };
        let Ok(slot) = limiter.connections.clone().try_acquire_owned() else {
            limiter.refused_connections.fetch_add(1, Ordering::Relaxed);
            if !refusing {
                tracing::warn!(
                    limit = limiter.limits.max_connections,
                    "connection limit reached: new connections are closed until some end"
                );
                refusing = true;
            }
            drop(stream);
            continue;
        };
        if refusing {
            tracing::info!("below the connection limit again");
            refusing = false;
        }
        // Small responses must not wait for delayed ACKs (40 ms on loopback).
        let _ = stream.set_nodelay(true);
        let accepted = Accepted {
            peer,
            http: http.clone(),
            service: service.clone(),
            watcher: graceful.watcher(),
            shutdown: shutdown.clone(),
            _slot: slot,
        };
        match &tls {
            Some(acceptor) => tokio::spawn(accepted.handshake(stream, acceptor.clone(), limiter.clone())),
            None => tokio::spawn(accepted.serve(stream)),
        };
    }
    drop(listener);
    graceful.shutdown().await;
    Ok(())
}

/// A connection that got a slot, on its way to being served.
struct Accepted {
    peer: SocketAddr,
    http: hyper::server::conn::http1::Builder,
    service: TowerToHyperService<axum::Router>,
    watcher: Watcher,
    shutdown: CancellationToken,
    /// Held until the connection ends.
    _slot: OwnedSemaphorePermit,
}

impl Accepted {
    async fn handshake(self, stream: TcpStream, acceptor: TlsAcceptor, limiter: Arc<Limiter>) {
        let timeout = limiter.limits.tls_handshake_timeout;
        let handshake = async {
            // The turn is held through the handshake; the semaphore is
            // never closed, so waiting only ends with a turn.
            let _turn = limiter.handshakes.acquire().await;
            acceptor.accept(stream).await
        };
        let outcome = tokio::select! {
            outcome = tokio::time::timeout(timeout, handshake) => outcome,
            _ = self.shutdown.cancelled() => return,
        };
        match outcome {
            Ok(Ok(tls)) => self.serve(tls).await,
            Ok(Err(e)) => tracing::debug!(peer = %self.peer, error = %e, "TLS handshake failed"),
            Err(_) => tracing::debug!(peer = %self.peer, ?timeout, "TLS handshake timed out"),
        }
    }

    async fn serve<I>(self, io: I)
    where
        I: AsyncRead + AsyncWrite + Unpin + Send + 'static,
    {
        // Upgrades (exec and port-forward through an aggregated API) are
        // served: the connection hands its socket over and ends.
        let conn = self
            .http
            .serve_connection(TokioIo::new(io), self.service)
            .with_upgrades();
        tokio::pin!(conn);
        // hyper-util's graceful watcher does not take an upgradeable
        // connection: holding it keeps shutdown waiting for this one, which
        // is told to finish its request itself when shutdown begins.
        let _watching = self.watcher;
        let ended = tokio::select! {
            ended = conn.as_mut() => ended,
            () = self.shutdown.cancelled() => {
                conn.as_mut().graceful_shutdown();
                conn.await
            }
        };
        // Header-read timeouts and clients that go away end up here.
        if let Err(e) = ended {
            tracing::debug!(peer = %self.peer, error = %e, "connection ended");
        }
    }
}

/// Raises this process's soft limit on open files to its hard limit, as Go
/// programs such as kube-apiserver do when they start, so that
/// `--max-connections` and not the file limit decides which connections are
/// refused. Returns the soft limit in force.
pub fn raise_open_files_limit() -> std::io::Result<u64> {
    use nix::sys::resource::{getrlimit, setrlimit, Resource};
    let (soft, hard) = getrlimit(Resource::RLIMIT_NOFILE)?;
    if soft < hard && setrlimit(Resource::RLIMIT_NOFILE, hard, hard).is_ok() {
        return Ok(hard);
    }
    Ok(soft)
}

/// Past the open-files limit new connections wait unaccepted in the
/// kernel's queue instead of being closed at once, so say so at start.
fn warn_if_files_run_out_first(max_connections: usize) {
    let Ok((soft, _)) = nix::sys::resource::getrlimit(nix::sys::resource::Resource::RLIMIT_NOFILE) else {
        return;
    };
    let needed = (max_connections as u64).saturating_add(SPARE_FILES);
    if needed > soft {
        // Not a warning: an embedding program (`k8s4r up`) keeps the limit
        // its shell gave it, and is rarely near it.
        tracing::info!(
            max_connections,
            open_files_limit = soft,
            "the open-files limit (ulimit -n) is below --max-connections: past it, new \
             connections wait instead of being refused; raise the limit or lower --max-connections"
        );
    }
}
