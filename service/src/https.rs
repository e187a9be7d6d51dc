//! HTTPS endpoints of the cluster programs (the manager's admission
//! webhook, the server's aggregated logs API): a rustls configuration from
//! PEM, optionally requiring client certificates of one CA, and a serve
//! loop for an axum router.

use std::future::Future;
use std::net::SocketAddr;
use std::sync::Arc;
use std::time::Duration;

use axum::Router;
use hyper_util::rt::TokioIo;
use hyper_util::service::TowerToHyperService;
use rustls::pki_types::pem::PemObject;
use rustls::pki_types::{CertificateDer, PrivateKeyDer};
use tokio::net::TcpListener;
use tokio_rustls::TlsAcceptor;
use tokio_util::sync::CancellationToken;

/// How long a TLS handshake may take.
const HANDSHAKE_TIMEOUT: Duration = Duration::from_secs(10);

/// A certificate or key that cannot be used.
#[derive(Debug, thiserror::Error)]
#[error("TLS: {0}")]
pub struct TlsError(pub String);

fn err(e: impl std::fmt::Display) -> TlsError {
    TlsError(e.to_string())
}

/// A server configuration presenting `cert_pem` with `key_pem`; with
/// `client_ca_pem`, every client must present a certificate that CA signed.
pub fn server_config(
    cert_pem: &str,
    key_pem: &str,
    client_ca_pem: Option<&str>,
) -> Result<rustls::ServerConfig, TlsError> {
    let provider = Arc::new(rustls::crypto::ring::default_provider());
    let certs: Vec<CertificateDer<'static>> = CertificateDer::pem_slice_iter(cert_pem.as_bytes())
        .collect::<Result<_, _>>()
        .map_err(err)?;
    let key = PrivateKeyDer::from_pem_slice(key_pem.as_bytes()).map_err(err)?;
    let builder = rustls::ServerConfig::builder_with_provider(provider.clone())
        .with_safe_default_protocol_versions()
        .map_err(err)?;
    let builder = match client_ca_pem {
        Some(ca) => {
            let mut roots = rustls::RootCertStore::empty();
            for cert in CertificateDer::pem_slice_iter(ca.as_bytes()) {
                roots.add(cert.map_err(err)?).map_err(err)?;
            }
            let verifier =
                rustls::server::WebPkiClientVerifier::builder_with_provider(Arc::new(roots), provider)
                    .build()
                    .map_err(err)?;
            builder.with_client_cert_verifier(verifier)
        }
        None => builder.with_no_client_auth(),
    };
    let mut config = builder.with_single_cert(certs, key).map_err(err)?;
    config.alpn_protocols = vec![b"http/1.1".to_vec()];
    Ok(config)
}

/// The common name of the client certificate a connection presented, if
/// any: in every request's extensions.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct PeerName(pub Option<String>);

fn common_name(der: &[u8]) -> Option<String> {
    let (_, cert) = x509_parser::parse_x509_certificate(der).ok()?;
    let cn = cert.subject().iter_common_name().next()?;
    cn.as_str().ok().map(str::to_owned)
}

/// Binds `addr` and returns the bound address and the future that serves
/// `app` over TLS until `shutdown`.
pub async fn bind(
    addr: SocketAddr,
    tls: rustls::ServerConfig,
    app: Router,
    shutdown: CancellationToken,
) -> std::io::Result<(SocketAddr, impl Future<Output = ()> + Send + 'static)> {
    let acceptor = TlsAcceptor::from(Arc::new(tls));
    let listener = TcpListener::bind(addr).await?;
    let bound = listener.local_addr()?;
    let serve = async move {
        loop {
            let (stream, peer) = tokio::select! {
                accepted = listener.accept() => match accepted {
                    Ok(a) => a,
                    Err(e) => {
                        tracing::warn!(error = %e, "accept failed");
                        tokio::time::sleep(Duration::from_millis(100)).await;
                        continue;
                    }
                },
                () = shutdown.cancelled() => return,
            };
            // Small answers and a session's keystrokes go out at once.
            let _ = stream.set_nodelay(true);
            let (acceptor, app, shutdown) = (acceptor.clone(), app.clone(), shutdown.clone());
            tokio::spawn(async move {
                let tls = match tokio::time::timeout(HANDSHAKE_TIMEOUT, acceptor.accept(stream)).await {
                    Ok(Ok(tls)) => tls,
                    Ok(Err(e)) => return tracing::debug!(%peer, error = %e, "TLS handshake failed"),
                    Err(_) => return tracing::debug!(%peer, "TLS handshake timed out"),
                };
                let peer_name = tls
                    .get_ref()
                    .1
                    .peer_certificates()
                    .and_then(|certs| certs.first())
                    .and_then(|cert| common_name(cert));
                let app = app.layer(axum::Extension(PeerName(peer_name)));
                let conn = hyper::server::conn::http1::Builder::new()
                    .serve_connection(TokioIo::new(tls), TowerToHyperService::new(app))
                    // Exec and port-forward sessions switch to WebSockets.
                    .with_upgrades();
                tokio::select! {
                    result = conn => if let Err(e) = result {
                        tracing::debug!(%peer, error = %e, "connection ended");
                    },
                    () = shutdown.cancelled() => {}
                }
            });
        }
    };
    Ok((bound, serve))
}
