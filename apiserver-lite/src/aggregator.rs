//! API aggregation, as kube-apiserver's aggregator does it: a request for
//! a group/version an `apiregistration.k8s.io/v1` APIService names is
//! authenticated and authorized here like any other, then proxied to the
//! APIService's backend with the user in `X-Remote-User` and
//! `X-Remote-Group`, over TLS with a front-proxy client certificate. The
//! backend trusts that certificate's CA from the ConfigMap
//! `kube-system/extension-apiserver-authentication`, which this server
//! publishes as kube-apiserver does (request-header authentication).
//!
//! A real cluster reaches the APIService's `service` through cluster DNS;
//! here the program that embeds the server says where each service
//! listens ([`Endpoints::set`]). Differences: no `insecureSkipTLSVerify`
//! (give a `caBundle`), aggregated groups are not listed in discovery, and
//! the APIService's `Available` condition is not kept.

use std::collections::HashMap;
use std::net::SocketAddr;
use std::sync::{Arc, RwLock};

use axum::body::{Body, Bytes};
use axum::http::request::Parts;
use axum::http::{header, HeaderValue, StatusCode};
use axum::response::Response;
use futures::TryStreamExt;
use serde_json::{json, Value};

use crate::authz::Identity;
use crate::error::ApiError;
use crate::store::State;

mod upgrade;

/// Where APIServices are stored.
pub const APISERVICES: &str = "apiservices.apiregistration.k8s.io";
/// The ConfigMap (in kube-system) request-header backends read.
pub const AUTHENTICATION_CONFIGMAP: &str = "extension-apiserver-authentication";
/// The front-proxy client certificate's common name.
pub const FRONT_PROXY_CLIENT: &str = "front-proxy-client";

/// The front proxy's CA and client certificate, made at start.
#[derive(Clone)]
pub struct FrontProxy {
    /// The CA backends trust, PEM.
    pub ca_pem: String,
    cert_pem: String,
    key_pem: String,
}

impl std::fmt::Debug for FrontProxy {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("FrontProxy").finish_non_exhaustive()
    }
}

impl FrontProxy {
    /// A new CA and a client certificate it signs.
    pub fn generate() -> Result<FrontProxy, String> {
        use rcgen::{
            BasicConstraints, CertificateParams, DnType, ExtendedKeyUsagePurpose, IsCa, Issuer, KeyPair,
            KeyUsagePurpose,
        };
        let err = |e: rcgen::Error| e.to_string();
        let mut ca = CertificateParams::new(Vec::<String>::new()).map_err(err)?;
        ca.is_ca = IsCa::Ca(BasicConstraints::Unconstrained);
        ca.distinguished_name
            .push(DnType::CommonName, "apiserver-lite front-proxy CA");
        ca.key_usages = vec![KeyUsagePurpose::KeyCertSign, KeyUsagePurpose::CrlSign];
        let ca_key = KeyPair::generate().map_err(err)?;
        let ca_cert = ca.self_signed(&ca_key).map_err(err)?;
        let issuer = Issuer::new(ca, ca_key);
        let mut leaf = CertificateParams::new(Vec::<String>::new()).map_err(err)?;
        leaf.distinguished_name
            .push(DnType::CommonName, FRONT_PROXY_CLIENT);
        leaf.extended_key_usages = vec![ExtendedKeyUsagePurpose::ClientAuth];
        let leaf_key = KeyPair::generate().map_err(err)?;
        let leaf_cert = leaf.signed_by(&leaf_key, &issuer).map_err(err)?;
        Ok(FrontProxy {
            ca_pem: ca_cert.pem(),
            cert_pem: leaf_cert.pem(),
            key_pem: leaf_key.serialize_pem(),
        })
    }

    /// The ConfigMap request-header backends read, as kube-apiserver
    /// publishes it.
    pub fn configmap(&self) -> Value {
        json!({
            "apiVersion": "v1",
            "kind": "ConfigMap",
            "metadata": {"name": AUTHENTICATION_CONFIGMAP, "namespace": "kube-system"},
            "data": {
                "requestheader-client-ca-file": self.ca_pem,
                "requestheader-allowed-names": json!([FRONT_PROXY_CLIENT]).to_string(),
                "requestheader-username-headers": json!(["X-Remote-User"]).to_string(),
                "requestheader-group-headers": json!(["X-Remote-Group"]).to_string(),
                "requestheader-extra-headers-prefix": json!(["X-Remote-Extra-"]).to_string(),
            },
        })
    }

    /// An HTTPS client presenting the client certificate and trusting only
    /// `ca` (an APIService's caBundle).
    fn client(&self, ca: &[u8]) -> Result<reqwest::Client, String> {
        reqwest::Client::builder()
            .use_preconfigured_tls(self.tls(ca)?)
            .build()
            .map_err(|e| e.to_string())
    }

    /// The TLS settings of a connection to a backend: the client
    /// certificate, and `ca` as the only root.
    fn tls(&self, ca: &[u8]) -> Result<rustls::ClientConfig, String> {
        use rustls::pki_types::pem::PemObject;
        use rustls::pki_types::{CertificateDer, PrivateKeyDer};
        let mut roots = rustls::RootCertStore::empty();
        for cert in CertificateDer::pem_slice_iter(ca) {
            let cert = cert.map_err(|e| format!("caBundle: {e}"))?;
            roots.add(cert).map_err(|e| format!("caBundle: {e}"))?;
        }
        let chain: Vec<CertificateDer<'static>> = CertificateDer::pem_slice_iter(self.cert_pem.as_bytes())
            .collect::<Result<_, _>>()
            .map_err(|e| e.to_string())?;
        let key = PrivateKeyDer::from_pem_slice(self.key_pem.as_bytes()).map_err(|e| e.to_string())?;
        let tls =
            rustls::ClientConfig::builder_with_provider(Arc::new(rustls::crypto::ring::default_provider()))
                .with_safe_default_protocol_versions()
                .map_err(|e| e.to_string())?
                .with_root_certificates(roots)
                .with_client_auth_cert(chain, key)
                .map_err(|e| e.to_string())?;
        Ok(tls)
    }
}

/// Where each service an APIService names listens, as the embedding
/// program says.
#[derive(Debug, Default)]
pub struct Endpoints(RwLock<HashMap<(String, String), SocketAddr>>);

impl Endpoints {
    /// Service `namespace/name` listens on `addr`.
    pub fn set(&self, namespace: &str, name: &str, addr: SocketAddr) {
        self.0
            .write()
            .unwrap_or_else(|p| p.into_inner())
            .insert((namespace.to_owned(), name.to_owned()), addr);
    }

    fn get(&self, namespace: &str, name: &str) -> Option<SocketAddr> {
        self.0
            .read()
            .unwrap_or_else(|p| p.into_inner())
            .get(&(namespace.to_owned(), name.to_owned()))
            .copied()
    }
}

/// An APIService's backend.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Backend {
    name: String,
    namespace: String,
    service: String,
    ca_bundle: Option<Vec<u8>>,
}

/// The APIService serving `group`/`version`, if one is registered with a
/// service (one without is served locally, which here means: not at all).
pub fn backend(state: &State, group: &str, version: &str) -> Option<Backend> {
    let name = format!("{version}.{group}");
    let obj = state.get(APISERVICES, "", &name)?;
    let spec = &obj["spec"];
    let service = &spec["service"];
    Some(Backend {
        name,
        namespace: service["namespace"].as_str()?.to_owned(),
        service: service["name"].as_str()?.to_owned(),
        ca_bundle: spec["caBundle"].as_str().and_then(|b| {
            use base64::Engine;
            base64::engine::general_purpose::STANDARD.decode(b).ok()
        }),
    })
}

/// Sends the request on to `backend` as `identity`, and streams its
/// answer back.
pub async fn proxy(
    front: &FrontProxy,
    endpoints: &Endpoints,
    backend: &Backend,
    identity: &Identity,
    parts: &Parts,
    body: Bytes,
) -> Result<Response, ApiError> {
    let unavailable = |why: String| {
        ApiError::new(
            StatusCode::SERVICE_UNAVAILABLE,
            "ServiceUnavailable",
            format!(
                "the server is currently unable to handle the request ({}: {why})",
                backend.name
            ),
        )
    };
    let addr = endpoints
        .get(&backend.namespace, &backend.service)
        .ok_or_else(|| {
            unavailable(format!(
                "service {}/{} has no endpoint",
                backend.namespace, backend.service
            ))
        })?;
    let ca = backend.ca_bundle.as_deref().ok_or_else(|| {
        unavailable("the APIService has no caBundle (insecureSkipTLSVerify is not supported)".into())
    })?;
    if is_upgrade(parts) {
        return upgrade::proxy(front, addr, ca, identity, parts)
            .await
            .map_err(unavailable);
    }
    let client = front.client(ca).map_err(unavailable)?;
    let path_and_query = parts.uri.path_and_query().map_or("/", |p| p.as_str());
    let url = format!("https://{addr}{path_and_query}");
    let mut request = client.request(parts.method.clone(), &url).body(body);
    for (name, value) in remote_user(identity) {
        request = request.header(name, value);
    }
    for h in [header::ACCEPT, header::CONTENT_TYPE, header::USER_AGENT] {
        if let Some(v) = parts.headers.get(&h) {
            request = request.header(h, v);
        }
    }
    let answer = request.send().await.map_err(|e| unavailable(e.to_string()))?;
    let mut response = Response::builder().status(answer.status().as_u16());
    for (k, v) in answer.headers() {
        let keep = k == header::CONTENT_TYPE || k.as_str().starts_with("x-");
        if keep {
            response = response.header(
                k.as_str(),
                HeaderValue::from_bytes(v.as_bytes()).unwrap_or(HeaderValue::from_static("")),
            );
        }
    }
    let stream = answer.bytes_stream().map_err(std::io::Error::other);
    response
        .body(Body::from_stream(stream))
        .map_err(|e| ApiError::internal(e.to_string()))
}

/// Whether the request asks to switch protocols (a WebSocket, as exec and
/// port-forward ask).
fn is_upgrade(parts: &Parts) -> bool {
    let connection_upgrade = parts
        .headers
        .get_all(header::CONNECTION)
        .iter()
        .filter_map(|v| v.to_str().ok())
        .flat_map(|v| v.split(','))
        .any(|t| t.trim().eq_ignore_ascii_case("upgrade"));
    connection_upgrade && parts.headers.contains_key(header::UPGRADE)
}

/// The headers that say who the user is, as the backend reads them.
fn remote_user(identity: &Identity) -> Vec<(String, String)> {
    let user = identity.user_info();
    let mut headers = Vec::new();
    if let Some(name) = user["username"].as_str() {
        headers.push(("X-Remote-User".to_owned(), name.to_owned()));
    }
    for group in user["groups"]
        .as_array()
        .into_iter()
        .flatten()
        .filter_map(Value::as_str)
    {
        headers.push(("X-Remote-Group".to_owned(), group.to_owned()));
    }
    for (key, values) in user["extra"].as_object().into_iter().flatten() {
        for value in values.as_array().into_iter().flatten().filter_map(Value::as_str) {
            headers.push((format!("X-Remote-Extra-{}", header_safe(key)), value.to_owned()));
        }
    }
    headers
}

/// An extra's key as a header name may hold it: percent-encoded, as
/// client-go sends it and as backends read it back.
fn header_safe(key: &str) -> String {
    key.bytes()
        .map(|b| match b {
            b'a'..=b'z' | b'A'..=b'Z' | b'0'..=b'9' | b'-' | b'_' | b'.' => (b as char).to_string(),
            b => format!("%{b:02X}"),
        })
        .collect()
}
