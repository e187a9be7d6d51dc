//! The MQTT client's options: persistent session, last will, packet sizes
//! and TLS.

use std::sync::Arc;

use k8s4r_api::protocol::{encode, Online, Topics, MAX_MESSAGE_BYTES};
use rumqttc::{LastWill, MqttOptions, QoS, TlsConfiguration, Transport};
use rustls::pki_types::pem::PemObject;
use rustls::pki_types::{CertificateDer, PrivateKeyDer};

use crate::config::{Config, TlsFiles};

/// QoS 1 publishes in flight in rumqttc. The session keeps its own
/// outstanding count well below this (see [`crate::link::Link`]).
pub const CLIENT_INFLIGHT: u16 = 100;
/// The session's cap of outstanding QoS 1 publishes.
pub const MAX_OUTSTANDING: usize = 64;
/// Capacity of the channel into rumqttc's event loop.
pub const REQUEST_CHANNEL: usize = 256;
/// Largest incoming packet. Above [`MAX_MESSAGE_BYTES`] so that an
/// oversized dispatch arrives, is refused by the protocol check with a clear
/// error, and is acknowledged; a packet above rumqttc's own limit would
/// instead drop the connection and, being QoS 1 in a persistent session,
/// come back on every reconnect.
pub const MAX_INCOMING_PACKET: usize = 4 * MAX_MESSAGE_BYTES;

/// Why TLS could not be set up.
#[derive(Debug, thiserror::Error)]
pub enum TlsError {
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

/// The MQTT client id: stable per robot, so the broker keeps the session
/// (and queues dispatches) while the robot is away.
pub fn client_id(robot_id: &str) -> String {
    format!("k8s4r-agent-{robot_id}")
}

/// Options for the agent's connection.
pub fn options(config: &Config, topics: &Topics) -> Result<MqttOptions, TlsError> {
    let broker = &config.broker;
    let mut o = MqttOptions::new(client_id(&config.robot_id), broker.host.clone(), broker.port);
    o.set_keep_alive(broker.keep_alive);
    o.set_clean_session(false);
    // Outgoing: a status with a full output tail must fit too.
    o.set_max_packet_size(MAX_INCOMING_PACKET, MAX_MESSAGE_BYTES + 1024);
    o.set_inflight(CLIENT_INFLIGHT);
    o.set_last_will(LastWill::new(
        topics.online(&config.robot_id),
        encode(&Online { v: 1, online: false }),
        QoS::AtLeastOnce,
        true,
    ));
    if let Some((user, password)) = &broker.credentials {
        o.set_credentials(user.clone(), password.clone());
    }
    if let Some(tls) = &broker.tls {
        o.set_transport(Transport::tls_with_config(TlsConfiguration::Rustls(Arc::new(
            tls_config(tls)?,
        ))));
    }
    Ok(o)
}

/// Installs rustls's ring provider as the process default (once; a second
/// call is a no-op).
pub fn install_crypto_provider() {
    // Err means one is installed already, which is what we want.
    let _ = rustls::crypto::ring::default_provider().install_default();
}

fn pem_error(what: &'static str, path: &std::path::Path, e: impl std::fmt::Display) -> TlsError {
    TlsError::Pem {
        what,
        path: path.display().to_string(),
        reason: e.to_string(),
    }
}

/// A rustls client config from the CA bundle and optional client identity.
pub fn tls_config(tls: &TlsFiles) -> Result<rustls::ClientConfig, TlsError> {
    install_crypto_provider();
    let mut roots = rustls::RootCertStore::empty();
    let cas = CertificateDer::pem_file_iter(&tls.ca_file)
        .map_err(|e| pem_error("CA file", &tls.ca_file, e))?
        .collect::<Result<Vec<_>, _>>()
        .map_err(|e| pem_error("CA file", &tls.ca_file, e))?;
    if cas.is_empty() {
        return Err(pem_error("CA file", &tls.ca_file, "no certificate in it"));
    }
    for ca in cas {
        roots.add(ca)?;
    }
    let builder = rustls::ClientConfig::builder().with_root_certificates(roots);
    Ok(match &tls.client_auth {
        None => builder.with_no_client_auth(),
        Some((cert, key)) => {
            let chain = CertificateDer::pem_file_iter(cert)
                .map_err(|e| pem_error("client certificate", cert, e))?
                .collect::<Result<Vec<_>, _>>()
                .map_err(|e| pem_error("client certificate", cert, e))?;
            let key = PrivateKeyDer::from_pem_file(key).map_err(|e| pem_error("client key", key, e))?;
            builder.with_client_auth_cert(chain, key)?
        }
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::config::{Config, Settings};

    #[test]
    fn options_keep_the_session_and_set_the_will() {
        let config = Config::resolve(Settings {
            robot_id: Some("rb1".into()),
            ..Default::default()
        })
        .unwrap();
        let o = options(&config, &Topics::default()).unwrap();
        assert!(!o.clean_session());
        assert_eq!(o.client_id(), "k8s4r-agent-rb1");
        assert!(o.max_packet_size() >= MAX_MESSAGE_BYTES);
        let will = o.last_will().unwrap();
        assert_eq!(will.topic, "k8s4r/robots/rb1/online");
        assert!(will.retain);
        assert_eq!(
            k8s4r_api::protocol::decode::<Online>(&will.message).unwrap(),
            Online { v: 1, online: false }
        );
    }

    #[test]
    fn a_missing_ca_file_is_reported_with_its_path() {
        let err = tls_config(&TlsFiles {
            ca_file: "/nonexistent/ca.pem".into(),
            client_auth: None,
        })
        .unwrap_err()
        .to_string();
        assert!(err.contains("/nonexistent/ca.pem"), "{err}");
    }
}
