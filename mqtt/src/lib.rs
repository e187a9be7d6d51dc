//! MQTT plumbing that the robot agent and the server share, so that both
//! read a broker URL, set up TLS and match PUBACKs the same way:
//!
//! - [`url`]: `mqtt://host[:port]` and `mqtts://host[:port]`;
//! - [`tls`]: the rustls client configuration from PEM files, and the one
//!   place the process-wide crypto provider is installed;
//! - [`acks`]: which QoS 1 publish a PUBACK acknowledges.
//!
//! No Kubernetes here: the agent links this crate and builds with rustc 1.85.

pub mod acks;
pub mod tls;
pub mod url;

pub use acks::PacketIds;
pub use tls::{install_crypto_provider, TlsError, TlsFiles};
pub use url::BrokerUrl;

/// Makes `eventloop`'s connections send small packets at once
/// (`TCP_NODELAY`): a heartbeat's confirmation or a keystroke of `k8s4r
/// exec` must not wait for the ACK of the packet before it (Nagle's
/// algorithm against a delayed ACK stalls it up to 40 ms; rumqttc leaves
/// Nagle on).
pub fn send_at_once(eventloop: &mut rumqttc::EventLoop) {
    let mut network = eventloop.network_options();
    network.set_tcp_nodelay(true);
    eventloop.set_network_options(network);
}
