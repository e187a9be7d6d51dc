//! The embedded MQTT broker of `k8s4r up` (rumqttd, in-process).
//!
//! rumqttd runs its router and listeners on threads of its own and has no
//! stop call; it lives as long as the process, which is what `up` needs.

use std::collections::HashMap;
use std::net::{SocketAddr, TcpStream};
use std::time::{Duration, Instant};

use rumqttd::{Broker, Config, ConnectionSettings, RouterConfig, ServerSettings};

use crate::error::UpError;

/// The largest MQTT packet the embedded broker accepts: the protocol's own
/// limit, the same as deploy/mosquitto's `max_packet_size`, so that a
/// message the broker takes is one the server and agents accept too.
const MAX_PACKET_BYTES: usize = k8s4r_api::protocol::MAX_PACKET_BYTES;

/// Starts the broker on `listen` and waits until it accepts connections.
pub fn start(listen: SocketAddr) -> Result<(), UpError> {
    // Fail with a clear message rather than from inside rumqttd's thread.
    std::net::TcpListener::bind(listen).map_err(|source| UpError::Bind {
        what: "MQTT broker",
        addr: listen,
        source,
    })?;
    let server = ServerSettings {
        name: "k8s4r-up".to_owned(),
        listen,
        tls: None,
        next_connection_delay_ms: 1,
        connections: ConnectionSettings {
            connection_timeout_ms: 60_000,
            max_payload_size: MAX_PACKET_BYTES,
            max_inflight_count: 500,
            auth: None,
            external_auth: None,
            dynamic_filters: true,
        },
    };
    let config = Config {
        id: 0,
        router: RouterConfig {
            max_connections: 10_010,
            max_outgoing_packet_count: 200,
            max_segment_size: 100 * 1024 * 1024,
            max_segment_count: 10,
            ..RouterConfig::default()
        },
        v4: Some(HashMap::from([("1".to_owned(), server)])),
        ..Config::default()
    };
    std::thread::Builder::new()
        .name("mqtt-broker".to_owned())
        .spawn(move || {
            let mut broker = Broker::new(config);
            if let Err(e) = broker.start() {
                tracing::error!(error = %e, "embedded MQTT broker stopped");
            }
        })
        .map_err(|source| UpError::Io {
            what: "start the MQTT broker thread".to_owned(),
            source,
        })?;
    let deadline = Instant::now() + Duration::from_secs(10);
    while !answers_mqtt(listen) {
        if Instant::now() > deadline {
            return Err(UpError::NotReady {
                what: "MQTT broker",
                addr: listen,
            });
        }
        std::thread::sleep(Duration::from_millis(10));
    }
    Ok(())
}

/// Whether an MQTT 3.1.1 broker at `addr` accepts a connection: CONNECT,
/// then CONNACK with return code 0. A bare TCP connect would do to see the
/// port open, but rumqttd logs every such probe as a failed client.
fn answers_mqtt(addr: SocketAddr) -> bool {
    use std::io::{Read, Write};
    const CLIENT_ID: &[u8] = b"k8s4r-up-probe";
    let mut connect = vec![0x10, (12 + CLIENT_ID.len()) as u8];
    // Protocol "MQTT", level 4, clean session, keep-alive 10 s.
    connect.extend_from_slice(&[0, 4, b'M', b'Q', b'T', b'T', 4, 0x02, 0, 10]);
    connect.extend_from_slice(&[0, CLIENT_ID.len() as u8]);
    connect.extend_from_slice(CLIENT_ID);
    let timeout = Duration::from_millis(500);
    let Ok(mut stream) = TcpStream::connect_timeout(&addr, timeout) else {
        return false;
    };
    let mut connack = [0u8; 4];
    let accepted = stream.set_read_timeout(Some(timeout)).is_ok()
        && stream.write_all(&connect).is_ok()
        && stream.read_exact(&mut connack).is_ok()
        && connack == [0x20, 0x02, 0x00, 0x00];
    // Closed without a DISCONNECT packet: rumqttd logs a client's DISCONNECT
    // as an error ("router-drop") and a closed connection as information.
    accepted
}
