//! HTTPS for the server. kubectl (client-go) never sends a bearer token over
//! plain HTTP, so token auth needs TLS: a self-signed certificate for the
//! loopback names, kept beside the data so kubeconfigs stay valid across
//! restarts, and handed to clients as the kubeconfig's certificate authority.

use std::net::IpAddr;
use std::path::Path;
use std::sync::Arc;

use rustls::pki_types::pem::PemObject;
use rustls::pki_types::{CertificateDer, PrivateKeyDer};
use tokio_rustls::TlsAcceptor;

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
