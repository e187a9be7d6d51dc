//! Accepting a WebSocket on an axum route by hand, with the workspace's
//! one `tokio-tungstenite` (axum's `ws` feature would bring a second):
//! [`Upgrade::of`] takes what a request needs to switch, the handler
//! answers with [`Upgrade::switching`], and [`Upgrade::socket`] gives the
//! WebSocket once the client has it.

use axum::extract::Request;
use axum::http::{header, HeaderValue, StatusCode};
use axum::response::Response;
use hyper_util::rt::TokioIo;
use tokio_tungstenite::tungstenite::handshake::derive_accept_key;
use tokio_tungstenite::tungstenite::protocol::{Role, WebSocketConfig};
use tokio_tungstenite::WebSocketStream;

/// A WebSocket this program accepted.
pub type ServerSocket = WebSocketStream<TokioIo<hyper::upgrade::Upgraded>>;

/// A request's way to a WebSocket.
pub struct Upgrade {
    accept: String,
    on_upgrade: hyper::upgrade::OnUpgrade,
}

impl Upgrade {
    /// The upgrade `request` asks for; None when it is not a WebSocket
    /// upgrade (no `Sec-WebSocket-Key`).
    pub fn of(request: &mut Request) -> Option<Upgrade> {
        let key = request.headers().get(header::SEC_WEBSOCKET_KEY)?;
        let accept = derive_accept_key(key.as_bytes());
        Some(Upgrade {
            accept,
            on_upgrade: hyper::upgrade::on(request),
        })
    }

    /// The 101 that accepts it, naming `protocol` when one was agreed.
    pub fn switching(&self, protocol: Option<&'static str>) -> Response {
        let mut response = Response::new(axum::body::Body::empty());
        *response.status_mut() = StatusCode::SWITCHING_PROTOCOLS;
        let h = response.headers_mut();
        h.insert(header::CONNECTION, HeaderValue::from_static("Upgrade"));
        h.insert(header::UPGRADE, HeaderValue::from_static("websocket"));
        if let Some(protocol) = protocol {
            h.insert(header::SEC_WEBSOCKET_PROTOCOL, HeaderValue::from_static(protocol));
        }
        if let Ok(v) = HeaderValue::from_str(&self.accept) {
            h.insert(header::SEC_WEBSOCKET_ACCEPT, v);
        }
        response
    }

    /// The WebSocket, once the 101 went out; an error when the client left
    /// before it switched.
    pub async fn socket(self, config: Option<WebSocketConfig>) -> Result<ServerSocket, hyper::Error> {
        let upgraded = self.on_upgrade.await?;
        Ok(WebSocketStream::from_raw_socket(TokioIo::new(upgraded), Role::Server, config).await)
    }
}
