//! Protobuf on the wire, for the kinds [`crate::protobuf`] serves: request
//! bodies are read into the same JSON the JSON path produces, and answers
//! are turned into protobuf after the fact when the client prefers it, so
//! nothing between (validation, RBAC, storage) knows protobuf exists.
//!
//! ```text
//!   request:  Content-Type protobuf ── kind served ── decode ── 400 if malformed
//!                                    └─ not served (custom resources, CRDs) ── 415
//!   answer:   Accept lists plain protobuf before JSON or */*
//!             ├─ a buffered JSON body of a served kind (objects, lists, Status) ── protobuf
//!             └─ anything else (watch streams, Tables, custom resources) ── JSON as it was
//! ```
//!
//! Watches answer JSON: client-go's watch `Accept` also lists `*/*`, and it
//! decodes a stream by its Content-Type.

use axum::body::{Body, HttpBody as _};
use axum::http::{header, HeaderMap, HeaderValue};
use axum::response::{IntoResponse, Response};
use serde_json::Value;

use crate::error::ApiError;
use crate::protobuf::{self, ProtobufError, MEDIA_TYPE};
use crate::resources::ResourceType;

/// Whether a Content-Type is Kubernetes protobuf.
pub(super) fn is_protobuf(content_type: &str) -> bool {
    content_type
        .split(';')
        .next()
        .is_some_and(|media| media.trim().eq_ignore_ascii_case(MEDIA_TYPE))
}

/// Reads a protobuf body sent to `rt` into its JSON form.
pub(super) fn decode(body: &[u8], rt: &ResourceType) -> Result<Value, ApiError> {
    if rt.custom {
        return Err(not_accepted());
    }
    protobuf::decode(body, (&rt.api_version(), &rt.kind)).map_err(request_error)
}

/// Reads a protobuf body that is `kind` (`(apiVersion, kind)`).
pub(super) fn decode_kind(body: &[u8], kind: (&str, &str)) -> Result<Value, ApiError> {
    protobuf::decode(body, kind).map_err(request_error)
}

/// Reads DeleteOptions sent as protobuf, which a typed client-go client does.
pub(super) fn decode_delete_options(body: &[u8]) -> Result<Value, ApiError> {
    protobuf::decode(body, ("meta.k8s.io/v1", "DeleteOptions")).map_err(request_error)
}

fn not_accepted() -> ApiError {
    ApiError::unsupported_media_type(format!(
        "the body of the request was in an unknown format - accepted media types include: application/json, application/yaml (content type {MEDIA_TYPE:?})"
    ))
}

fn request_error(e: ProtobufError) -> ApiError {
    match e {
        ProtobufError::NotServed { .. } => not_accepted(),
        e => ApiError::bad_request(format!(
            "the body of the request could not be decoded as protobuf: {e}"
        )),
    }
}

/// Whether the client prefers protobuf: the first media type in `Accept`
/// that this server can answer is plain protobuf (not a Table or metadata
/// form of it, which are served as JSON only).
pub(super) fn wanted(headers: &HeaderMap) -> bool {
    let accept = super::response::accept(headers);
    for part in accept.split(',') {
        let mut params = part.split(';').map(str::trim);
        let media = params.next().unwrap_or_default().to_ascii_lowercase();
        let as_something_else = params.any(|p| p.starts_with("as="));
        match media.as_str() {
            MEDIA_TYPE if !as_something_else => return true,
            "application/json" | "application/yaml" | "application/*" | "*/*" => return false,
            _ => {}
        }
    }
    false
}

/// The answer in protobuf when the client prefers it and the answer is
/// a served kind; otherwise the answer as it is.
pub(super) async fn negotiate(headers: &HeaderMap, response: Response) -> Response {
    let json = response
        .headers()
        .get(header::CONTENT_TYPE)
        .is_some_and(|ct| ct.as_bytes().starts_with(b"application/json"));
    // A stream (a watch) has no exact size; it is never buffered here.
    let buffered = response.body().size_hint().exact().is_some();
    if !json || !buffered || !wanted(headers) {
        return response;
    }
    let (mut parts, body) = response.into_parts();
    let bytes = match axum::body::to_bytes(body, usize::MAX).await {
        Ok(bytes) => bytes,
        Err(e) => return ApiError::internal(format!("cannot read the answer: {e}")).into_response(),
    };
    let object: Option<Value> = serde_json::from_slice(&bytes).ok();
    let Some(object) = object.filter(protobuf::serves) else {
        return Response::from_parts(parts, Body::from(bytes));
    };
    match protobuf::encode(&object) {
        Ok(encoded) => {
            parts
                .headers
                .insert(header::CONTENT_TYPE, HeaderValue::from_static(MEDIA_TYPE));
            parts.headers.remove(header::CONTENT_LENGTH);
            Response::from_parts(parts, Body::from(encoded))
        }
        // The client listed JSON too (or `*/*`); an object protobuf cannot
        // carry goes as JSON rather than not at all.
        Err(e) => {
            tracing::debug!(error = %e, "answering JSON: the object has no protobuf form");
            Response::from_parts(parts, Body::from(bytes))
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn accept(value: &str) -> HeaderMap {
        let mut h = HeaderMap::new();
        h.insert(header::ACCEPT, HeaderValue::from_str(value).unwrap());
        h
    }

    #[test]
    fn protobuf_is_wanted_only_when_it_comes_first() {
        assert!(wanted(&accept("application/vnd.kubernetes.protobuf, */*")));
        assert!(wanted(&accept(
            "application/vnd.kubernetes.protobuf,application/json"
        )));
        assert!(!wanted(&accept(
            "application/json, application/vnd.kubernetes.protobuf"
        )));
        assert!(!wanted(&accept("*/*")));
        assert!(!wanted(&HeaderMap::new()));
        // Tables and metadata are JSON only: the JSON form further on wins.
        assert!(!wanted(&accept(
            "application/vnd.kubernetes.protobuf;as=Table;v=v1;g=meta.k8s.io,application/json;as=Table;v=v1;g=meta.k8s.io,application/json"
        )));
        assert!(wanted(&accept("text/html, application/vnd.kubernetes.protobuf")));
    }

    #[test]
    fn protobuf_content_types_are_recognised_with_parameters() {
        assert!(is_protobuf("application/vnd.kubernetes.protobuf"));
        assert!(is_protobuf("application/vnd.kubernetes.protobuf; charset=binary"));
        assert!(!is_protobuf("application/json"));
        assert!(!is_protobuf(
            "application/com.github.proto-openapi.spec.v2.v1.0+protobuf"
        ));
    }

    fn json(v: &Value) -> Response {
        crate::http::response::json_response(axum::http::StatusCode::OK, v)
    }

    async fn body(r: Response) -> (String, Vec<u8>) {
        let ct = r.headers()[header::CONTENT_TYPE].to_str().unwrap().to_owned();
        let bytes = axum::body::to_bytes(r.into_body(), usize::MAX).await.unwrap();
        (ct, bytes.to_vec())
    }

    #[tokio::test]
    async fn served_kinds_are_answered_in_protobuf_others_in_json() {
        let pb = accept("application/vnd.kubernetes.protobuf, */*");
        let secret = serde_json::json!({"apiVersion": "v1", "kind": "Secret", "metadata": {"name": "s"}, "data": {"a": "Yg=="}});
        let (ct, bytes) = body(negotiate(&pb, json(&secret)).await).await;
        assert_eq!(ct, MEDIA_TYPE);
        assert_eq!(protobuf::decode(&bytes, ("", "")).unwrap(), secret);

        let gizmo =
            serde_json::json!({"apiVersion": "demo.k8s4r.io/v1", "kind": "Gizmo", "metadata": {"name": "g"}});
        let (ct, bytes) = body(negotiate(&pb, json(&gizmo)).await).await;
        assert_eq!(ct, "application/json");
        assert_eq!(serde_json::from_slice::<Value>(&bytes).unwrap(), gizmo);

        let (ct, _) = body(negotiate(&accept("application/json"), json(&secret)).await).await;
        assert_eq!(ct, "application/json");

        // A Secret whose data protobuf cannot hold still gets an answer.
        let odd = serde_json::json!({"apiVersion": "v1", "kind": "Secret", "data": {"a": "not base64!"}});
        let (ct, bytes) = body(negotiate(&pb, json(&odd)).await).await;
        assert_eq!(ct, "application/json");
        assert_eq!(serde_json::from_slice::<Value>(&bytes).unwrap(), odd);
    }

    #[tokio::test]
    async fn errors_are_answered_as_protobuf_status() {
        let pb = accept("application/vnd.kubernetes.protobuf, */*");
        let err = ApiError::not_found("secrets", "gone").into_response();
        let status_code = err.status();
        let negotiated = negotiate(&pb, err).await;
        assert_eq!(negotiated.status(), status_code);
        let (ct, bytes) = body(negotiated).await;
        assert_eq!(ct, MEDIA_TYPE);
        let status = protobuf::decode(&bytes, ("", "")).unwrap();
        assert_eq!(status["kind"], "Status");
        assert_eq!(status["code"], 404);
        assert_eq!(status["reason"], "NotFound");
        assert_eq!(status["details"]["name"], "gone");
    }

    #[test]
    fn custom_resources_refuse_protobuf_bodies() {
        let mut rt = crate::resources::builtins()
            .into_iter()
            .find(|rt| rt.kind == "ConfigMap")
            .unwrap();
        rt.custom = true;
        let err = decode(b"k8s\0", &rt).unwrap_err();
        assert_eq!(err.code, axum::http::StatusCode::UNSUPPORTED_MEDIA_TYPE);
    }
}
