//! The MQTT client's options: persistent session, last will, packet sizes
//! and TLS.

use std::time::Duration;

use k8s4r_api::protocol::{encode, Online, Topics, MAX_INCOMING_PACKET_BYTES, MAX_PACKET_BYTES};
pub use k8s4r_mqtt::{install_crypto_provider, TlsError};
use rumqttc::{AsyncClient, EventLoop, LastWill, MqttOptions, QoS};

use crate::config::Config;

/// QoS 1 publishes in flight in rumqttc. The session keeps its own
/// outstanding count well below this (see [`crate::link::Link`]).
pub const CLIENT_INFLIGHT: u16 = 100;
/// The session's cap of outstanding QoS 1 publishes.
pub const MAX_OUTSTANDING: usize = 64;
/// Capacity of the channel into rumqttc's event loop.
pub const REQUEST_CHANNEL: usize = 256;
/// The agent's MQTT client and event loop (the scale benches' simulated
/// robots use it too): small packets sent at once, and `connect_timeout`
/// (rounded up to whole seconds, as rumqttc counts it).
pub fn client(options: MqttOptions, connect_timeout: Duration) -> (AsyncClient, EventLoop) {
    let (client, mut eventloop) = AsyncClient::new(options, REQUEST_CHANNEL);
    k8s4r_mqtt::send_at_once(&mut eventloop);
    let mut network = eventloop.network_options();
    network.set_connection_timeout(connect_timeout.as_secs_f64().ceil().max(1.0) as u64);
    eventloop.set_network_options(network);
    (client, eventloop)
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
    // An oversized dispatch is read and refused by the protocol check with
    // a clear error (and acknowledged), rather than dropping the connection.
    o.set_max_packet_size(MAX_INCOMING_PACKET_BYTES, MAX_PACKET_BYTES);
    o.set_inflight(CLIENT_INFLIGHT);
    o.set_last_will(LastWill::new(
        topics.online(&config.robot_id),
        encode(&Online::new(false)),
        QoS::AtLeastOnce,
        true,
    ));
    if let Some((user, password)) = &broker.credentials {
        o.set_credentials(user.clone(), password.clone());
    }
    if let Some(tls) = &broker.tls {
        o.set_transport(tls.transport()?);
    }
    Ok(o)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::config::{Config, Settings, DEFAULT_CONNECT_TIMEOUT};

    #[test]
    fn the_client_connects_with_the_timeout_asked_for_in_whole_seconds() {
        let config = Config::resolve(Settings {
            robot_id: Some("rb1".into()),
            ..Default::default()
        })
        .unwrap();
        assert_eq!(config.broker.connect_timeout, DEFAULT_CONNECT_TIMEOUT);
        let o = options(&config, &Topics::default()).unwrap();
        let (_, eventloop) = client(o.clone(), DEFAULT_CONNECT_TIMEOUT);
        assert_eq!(eventloop.network_options().connection_timeout(), 20);
        let (_, eventloop) = client(o, Duration::from_millis(1500));
        assert_eq!(eventloop.network_options().connection_timeout(), 2);
    }

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
        assert_eq!(o.max_packet_size(), MAX_INCOMING_PACKET_BYTES);
        let will = o.last_will().unwrap();
        assert_eq!(will.topic, "k8s4r/robots/rb1/online");
        assert!(will.retain);
        assert_eq!(
            k8s4r_api::protocol::decode::<Online>(&will.message).unwrap(),
            Online::new(false)
        );
    }
}
