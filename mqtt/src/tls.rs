//! TLS to the broker: which PEM files, checked together, and the rustls
//! client configuration made from them.

use std::path::{Path, PathBuf};
use std::sync::Arc;

use rumqttc::{TlsConfiguration, Transport};
use rustls::pki_types::pem::PemObject;
use rustls::pki_types::{CertificateDer, PrivateKeyDer};

/// The PEM files of a TLS connection.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct TlsFiles {
    /// The CA bundle that verifies the broker.
    pub ca_file: PathBuf,
    /// Client certificate and key, for mutual TLS.
    pub client_auth: Option<(PathBuf, PathBuf)>,
}

/// Why TLS could not be set up.
#[derive(Debug, thiserror::Error)]
pub enum TlsError {
    /// The settings do not go together; `key` names the setting to fix.
    #[error("{reason}")]
    Settings {
        /// The setting at fault (`ca_file`, `client_cert`, `broker_url`).
        key: &'static str,
        /// Why.
        reason: String,
    },
    /// A PEM file could not be read or parsed.
    #[error("{what} {path}: {reason}")]
    Pem {
        /// Which file.
        what: &'static str,
        /// Its path.
        path: String,
        /// Why.
        reason: String,
    },
    /// rustls refused the certificates or key.
    #[error("TLS setup: {0}")]
    Rustls(#[from] rustls::Error),
}

impl TlsFiles {
    /// The TLS files for a broker URL: `mqtts://` needs a CA file, a client
    /// certificate needs its key, and TLS files beside a plain `mqtt://`
    /// URL are a mistake worth stopping for (the operator meant TLS).
    pub fn resolve(
        url: &crate::BrokerUrl,
        ca_file: Option<PathBuf>,
        client_cert: Option<PathBuf>,
        client_key: Option<PathBuf>,
    ) -> Result<Option<Self>, TlsError> {
        let settings = |key, reason: String| TlsError::Settings { key, reason };
        let client_auth = match (client_cert, client_key) {
            (Some(cert), Some(key)) => Some((cert, key)),
            (None, None) => None,
            _ => {
                return Err(settings(
                    "client_cert",
                    "client_cert and client_key must be given together".into(),
                ))
            }
        };
        match (url.tls, ca_file) {
            (true, Some(ca_file)) => Ok(Some(Self { ca_file, client_auth })),
            (true, None) => Err(settings(
                "ca_file",
                format!("{url} uses TLS and needs the broker's CA file"),
            )),
            (false, None) if client_auth.is_none() => Ok(None),
            (false, _) => Err(settings(
                "broker_url",
                format!("TLS files are set but {url} is plain mqtt://; use mqtts:// for TLS"),
            )),
        }
    }

    /// A rustls client configuration from the CA bundle and the optional
    /// client identity.
    pub fn client_config(&self) -> Result<rustls::ClientConfig, TlsError> {
        install_crypto_provider();
        let mut roots = rustls::RootCertStore::empty();
        let cas = certificates("CA file", &self.ca_file)?;
        if cas.is_empty() {
            return Err(pem_error("CA file", &self.ca_file, "no certificate in it"));
        }
        for ca in cas {
            roots.add(ca)?;
        }
        let builder = rustls::ClientConfig::builder().with_root_certificates(roots);
        Ok(match &self.client_auth {
            None => builder.with_no_client_auth(),
            Some((cert, key)) => {
                let chain = certificates("client certificate", cert)?;
                let key = PrivateKeyDer::from_pem_file(key).map_err(|e| pem_error("client key", key, e))?;
                builder.with_client_auth_cert(chain, key)?
            }
        })
    }

    /// rumqttc's transport over TLS with these files.
    pub fn transport(&self) -> Result<Transport, TlsError> {
        Ok(Transport::tls_with_config(TlsConfiguration::Rustls(Arc::new(
            self.client_config()?,
        ))))
    }
}

/// Installs rustls's ring provider as the process default. rumqttc and
/// reqwest are built without one; a second call, or a provider the
/// embedding program chose first, leaves things as they are.
pub fn install_crypto_provider() {
    // Err means one is installed already, which is what we want.
    let _ = rustls::crypto::ring::default_provider().install_default();
}

fn certificates(what: &'static str, path: &Path) -> Result<Vec<CertificateDer<'static>>, TlsError> {
    CertificateDer::pem_file_iter(path)
        .map_err(|e| pem_error(what, path, e))?
        .collect::<Result<Vec<_>, _>>()
        .map_err(|e| pem_error(what, path, e))
}

fn pem_error(what: &'static str, path: &Path, e: impl std::fmt::Display) -> TlsError {
    TlsError::Pem {
        what,
        path: path.display().to_string(),
        reason: e.to_string(),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::BrokerUrl;

    fn url(s: &str) -> BrokerUrl {
        BrokerUrl::parse(s).unwrap()
    }

    #[test]
    fn tls_settings_are_checked_together() {
        let tls = url("mqtts://b");
        let key = |r: Result<Option<TlsFiles>, TlsError>| match r {
            Err(TlsError::Settings { key, .. }) => key,
            other => panic!("{other:?}"),
        };
        assert_eq!(key(TlsFiles::resolve(&tls, None, None, None)), "ca_file");
        assert_eq!(
            key(TlsFiles::resolve(&tls, Some("ca".into()), Some("c".into()), None)),
            "client_cert"
        );
        assert_eq!(
            key(TlsFiles::resolve(&url("mqtt://b"), Some("ca".into()), None, None)),
            "broker_url"
        );
        assert!(TlsFiles::resolve(&url("mqtt://b"), None, None, None)
            .unwrap()
            .is_none());
        let files = TlsFiles::resolve(&tls, Some("ca".into()), Some("c".into()), Some("k".into()))
            .unwrap()
            .unwrap();
        assert_eq!(files.client_auth, Some(("c".into(), "k".into())));
    }

    #[test]
    fn a_missing_ca_file_is_reported_with_its_path() {
        let err = TlsFiles {
            ca_file: "/nonexistent/ca.pem".into(),
            client_auth: None,
        }
        .client_config()
        .unwrap_err()
        .to_string();
        assert!(err.contains("/nonexistent/ca.pem"), "{err}");
    }
}
