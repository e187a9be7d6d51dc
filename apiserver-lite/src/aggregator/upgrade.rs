//! Upgraded requests to an APIService's backend, as kube-apiserver's
//! upgrade-aware proxy carries them: the request goes on with its
//! `Connection: Upgrade` headers; when the backend switches protocols
//! (101), the client is answered 101 with the backend's headers and the
//! two sockets are joined until either side closes. Exec and port-forward
//! through the aggregated API (`k8s4r exec`) take this path.

use std::net::SocketAddr;
use std::sync::Arc;

use axum::body::Body;
use axum::http::request::Parts;
use axum::http::{header, HeaderName, Request, StatusCode};
use axum::response::Response;
use hyper_util::rt::TokioIo;

use super::{remote_user, FrontProxy};
use crate::authz::Identity;

/// How long the backend has to accept the connection.
const CONNECT_TIMEOUT: std::time::Duration = std::time::Duration::from_secs(10);
/// How long the backend has to answer the upgrade: k8s4r-server asks the
/// robot first (10 s), and its answer must get here rather than a 503
/// that clients retry for minutes.
const ANSWER_TIMEOUT: std::time::Duration = std::time::Duration::from_secs(60);

/// Headers of the request that go on to the backend.
const REQUEST_HEADERS: [HeaderName; 7] = [
    header::CONNECTION,
    header::UPGRADE,
    header::SEC_WEBSOCKET_KEY,
    header::SEC_WEBSOCKET_VERSION,
    header::SEC_WEBSOCKET_PROTOCOL,
    header::SEC_WEBSOCKET_EXTENSIONS,
    header::USER_AGENT,
];

/// Headers of the backend's 101 that go back to the client (besides its
/// own `x-` ones).
const RESPONSE_HEADERS: [HeaderName; 5] = [
    header::CONNECTION,
    header::UPGRADE,
    header::SEC_WEBSOCKET_ACCEPT,
    header::SEC_WEBSOCKET_PROTOCOL,
    header::SEC_WEBSOCKET_EXTENSIONS,
];

/// Sends an upgrade request on to the backend at `addr` as `identity`;
/// answers with the backend's answer, and when that is 101, joins the two
/// connections once the client's side is upgraded too.
pub(super) async fn proxy(
    front: &FrontProxy,
    addr: SocketAddr,
    ca: &[u8],
    identity: &Identity,
    parts: &Parts,
) -> Result<Response, String> {
    let client_side = parts
        .extensions
        .get::<hyper::upgrade::OnUpgrade>()
        .cloned()
        .ok_or("this connection cannot be upgraded")?;
    let tls = front.tls(ca)?;
    let connect = async {
        let tcp = tokio::net::TcpStream::connect(addr)
            .await
            .map_err(|e| format!("connecting to {addr}: {e}"))?;
        let _ = tcp.set_nodelay(true);
        let name = rustls::pki_types::ServerName::from(addr.ip());
        tokio_rustls::TlsConnector::from(Arc::new(tls))
            .connect(name, tcp)
            .await
            .map_err(|e| format!("TLS with {addr}: {e}"))
    };
    let stream = tokio::time::timeout(CONNECT_TIMEOUT, connect)
        .await
        .map_err(|_| format!("no connection to {addr} within {CONNECT_TIMEOUT:?}"))??;
    let (mut sender, conn) = hyper::client::conn::http1::handshake(TokioIo::new(stream))
        .await
        .map_err(|e| format!("HTTP with {addr}: {e}"))?;
    tokio::spawn(async move {
        if let Err(e) = conn.with_upgrades().await {
            tracing::debug!(error = %e, "upgraded backend connection ended");
        }
    });
    let path_and_query = parts.uri.path_and_query().map_or("/", |p| p.as_str());
    let mut request = Request::builder()
        .method(parts.method.clone())
        .uri(path_and_query)
        .header(header::HOST, addr.to_string());
    for name in REQUEST_HEADERS {
        for value in parts.headers.get_all(&name) {
            request = request.header(&name, value);
        }
    }
    for (name, value) in remote_user(identity) {
        request = request.header(name, value);
    }
    let request = request.body(Body::empty()).map_err(|e| e.to_string())?;
    let mut answer = tokio::time::timeout(ANSWER_TIMEOUT, sender.send_request(request))
        .await
        .map_err(|_| format!("{addr} did not answer within {ANSWER_TIMEOUT:?}"))?
        .map_err(|e| format!("{addr}: {e}"))?;
    let mut response = Response::builder().status(answer.status());
    for (name, value) in answer.headers() {
        let keep = (answer.status() != StatusCode::SWITCHING_PROTOCOLS && name == header::CONTENT_TYPE)
            || RESPONSE_HEADERS.contains(name)
            || name.as_str().starts_with("x-");
        if keep {
            response = response.header(name, value);
        }
    }
    if answer.status() != StatusCode::SWITCHING_PROTOCOLS {
        // A refusal (403, 404, ...): its body is the backend's Status.
        return response
            .body(Body::new(answer.into_body()))
            .map_err(|e| e.to_string());
    }
    let backend_side = hyper::upgrade::on(&mut answer);
    tokio::spawn(async move {
        let (backend, client) = match tokio::join!(backend_side, client_side) {
            (Ok(backend), Ok(client)) => (backend, client),
            (Err(e), _) | (_, Err(e)) => {
                return tracing::debug!(error = %e, "an upgraded connection did not open");
            }
        };
        let (mut backend, mut client) = (TokioIo::new(backend), TokioIo::new(client));
        if let Err(e) = tokio::io::copy_bidirectional(&mut client, &mut backend).await {
            tracing::debug!(error = %e, "an upgraded connection ended");
        }
    });
    response.body(Body::empty()).map_err(|e| e.to_string())
}
