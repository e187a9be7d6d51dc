//! HTTPS for the server. kubectl (client-go) never sends a bearer token over
//! plain HTTP, so token auth needs TLS: a self-signed certificate for the
//! loopback names, kept beside the data so kubeconfigs stay valid across
//! restarts, and handed to clients as the kubeconfig's certificate authority.

use std::net::{IpAddr, SocketAddr};
use std::path::Path;
use std::sync::Arc;
use std::time::Duration;

use rustls::pki_types::pem::PemObject;
use rustls::pki_types::{CertificateDer, PrivateKeyDer};
use tokio::net::{TcpListener, TcpStream};
use tokio::sync::mpsc;
use tokio_rustls::server::TlsStream;
use tokio_rustls::TlsAcceptor;
use tokio_util::sync::CancellationToken;

use crate::error::Error;

const CERT_FILE: &str = "tls.crt";
const KEY_FILE: &str = "tls.key";

/// A certificate and its key, PEM encoded.
#[derive(Debug, Clone)]
pub struct TlsMaterial {
    pub cert_pem: String,
    pub key_pem: String,
}

fn tls_err(e: impl std::fmt::Display) -> Error {
    Error::Tls(e.to_string())
}

/// Reads the certificate kept in `dir`, or makes (and keeps) a new one.
pub fn load_or_generate(dir: Option<&Path>, bind: IpAddr) -> Result<TlsMaterial, Error> {
    if let Some(dir) = dir {
        let (c, k) = (dir.join(CERT_FILE), dir.join(KEY_FILE));
        if c.exists() && k.exists() {
            crate::private_files::narrow_existing(&k)?;
            return Ok(TlsMaterial {
                cert_pem: std::fs::read_to_string(c)?,
                key_pem: std::fs::read_to_string(k)?,
            });
        }
    }
    let mut names = vec![
        "127.0.0.1".to_string(),
        "::1".to_string(),
        "localhost".to_string(),
    ];
    if !bind.is_unspecified() && !bind.is_loopback() {
        names.push(bind.to_string());
    }
    let generated = rcgen::generate_simple_self_signed(names).map_err(tls_err)?;
    let m = TlsMaterial {
        cert_pem: generated.cert.pem(),
        key_pem: generated.signing_key.serialize_pem(),
    };
    if let Some(dir) = dir {
        crate::private_files::write(&dir.join(KEY_FILE), m.key_pem.as_bytes())?;
        std::fs::write(dir.join(CERT_FILE), &m.cert_pem)?;
    }
    Ok(m)
}

pub fn acceptor(m: &TlsMaterial) -> Result<TlsAcceptor, Error> {
    let certs: Vec<CertificateDer<'static>> = CertificateDer::pem_slice_iter(m.cert_pem.as_bytes())
        .collect::<Result<_, _>>()
        .map_err(tls_err)?;
    let key = PrivateKeyDer::from_pem_slice(m.key_pem.as_bytes()).map_err(tls_err)?;
    let mut config =
        rustls::ServerConfig::builder_with_provider(Arc::new(rustls::crypto::ring::default_provider()))
            .with_safe_default_protocol_versions()
            .map_err(tls_err)?
            .with_no_client_auth()
            .with_single_cert(certs, key)
            .map_err(tls_err)?;
    config.alpn_protocols = vec![b"http/1.1".to_vec()];
    Ok(TlsAcceptor::from(Arc::new(config)))
}

/// A listener yielding connections whose TLS handshake is done; handshakes
/// run concurrently, so one slow client cannot hold up the others.
pub struct TlsListener {
    rx: mpsc::Receiver<(TlsStream<TcpStream>, SocketAddr)>,
    local: SocketAddr,
}

impl TlsListener {
    pub fn new(tcp: TcpListener, acceptor: TlsAcceptor, cancel: CancellationToken) -> std::io::Result<Self> {
        let local = tcp.local_addr()?;
        let (tx, rx) = mpsc::channel(64);
        tokio::spawn(async move {
            loop {
                let (stream, peer) = tokio::select! {
                    r = tcp.accept() => match r {
                        Ok(x) => x,
                        Err(e) => {
                            tracing::warn!(error = %e, "accept failed");
                            tokio::time::sleep(Duration::from_millis(50)).await;
                            continue;
                        }
                    },
                    _ = cancel.cancelled() => return,
                };
                // Small responses must not wait for delayed ACKs (40 ms on loopback).
                let _ = stream.set_nodelay(true);
                let (acceptor, tx) = (acceptor.clone(), tx.clone());
                tokio::spawn(async move {
                    match tokio::time::timeout(Duration::from_secs(10), acceptor.accept(stream)).await {
                        Ok(Ok(tls)) => {
                            let _ = tx.send((tls, peer)).await;
                        }
                        Ok(Err(e)) => tracing::debug!(%peer, error = %e, "TLS handshake failed"),
                        Err(_) => tracing::debug!(%peer, "TLS handshake timed out"),
                    }
                });
            }
        });
        Ok(TlsListener { rx, local })
    }
}

impl axum::serve::Listener for TlsListener {
    type Io = TlsStream<TcpStream>;
    type Addr = SocketAddr;

    async fn accept(&mut self) -> (Self::Io, Self::Addr) {
        match self.rx.recv().await {
            Some(conn) => conn,
            // The accept loop has stopped (shutdown): no more connections.
            None => std::future::pending().await,
        }
    }

    fn local_addr(&self) -> std::io::Result<Self::Addr> {
        Ok(self.local)
    }
}
