//! Discovery and OpenAPI: the documents kubectl and kube-rs read to learn
//! which groups, versions and resources are served. They are computed from
//! the registry, so a CRD's kinds appear as soon as it is created.

use axum::http::{header, HeaderMap, StatusCode};
use axum::response::{IntoResponse, Response};
use serde_json::{json, Value};

use super::request::Discovery;
use super::response::json_response;
use super::App;
use crate::error::ApiError;
use crate::openapi;
use crate::resources::Registry;

/// The document a discovery path names; 404 when it names nothing served.
pub(super) fn serve(app: &App, doc: &Discovery<'_>, headers: &HeaderMap) -> Result<Response, ApiError> {
    let body = match doc {
        Discovery::Root => {
            json!({"paths": ["/api", "/api/v1", "/apis", "/healthz", "/openapi/v2", "/openapi/v3", "/version"]})
        }
        Discovery::Version => version(),
        Discovery::CoreVersions => {
            json!({"kind": "APIVersions", "versions": ["v1"], "serverAddressByClientCIDRs": [{"clientCIDR": "0.0.0.0/0", "serverAddress": ""}]})
        }
        Discovery::Groups => app.store.read(|s| group_list(&s.registry)),
        Discovery::Group(group) => group_doc(app, group)?,
        Discovery::Resources { group, version } => resource_list(app, group, version)?,
        Discovery::OpenApiV2 if wants_protobuf(headers) => return Ok(openapi_v2_protobuf()),
        Discovery::OpenApiV2 => app.store.read(|s| openapi::v2(&s.registry)),
        Discovery::OpenApiV3Root => app.store.read(|s| openapi::v3_root(&s.registry)),
        Discovery::OpenApiV3(path) => app
            .store
            .read(|s| openapi::v3_doc(&s.registry, path))
            .ok_or_else(ApiError::no_route)?,
    };
    Ok(json_response(StatusCode::OK, &body))
}

fn version() -> Value {
    json!({
        "major": "1", "minor": "32", "gitVersion": "v1.32.0+k8s4r-apiserver-lite",
        "gitCommit": "", "gitTreeState": "clean", "buildDate": "2026-01-01T00:00:00Z",
        "goVersion": "n/a", "compiler": "rustc", "platform": "linux/amd64",
    })
}

fn group_list(reg: &Registry) -> Value {
    let groups: Vec<Value> = reg
        .groups()
        .into_iter()
        .map(|(g, vs)| group_value(&g, &vs))
        .collect();
    json!({"kind": "APIGroupList", "apiVersion": "v1", "groups": groups})
}

fn group_value(g: &str, versions: &[String]) -> Value {
    let vs: Vec<Value> = versions
        .iter()
        .map(|v| json!({"groupVersion": format!("{g}/{v}"), "version": v}))
        .collect();
    json!({"name": g, "versions": vs, "preferredVersion": vs.first().cloned().unwrap_or(Value::Null)})
}

fn group_doc(app: &App, g: &str) -> Result<Value, ApiError> {
    let versions = app
        .store
        .read(|s| s.registry.groups().get(g).cloned())
        .ok_or_else(ApiError::no_route)?;
    let mut doc = group_value(g, &versions);
    doc["kind"] = json!("APIGroup");
    doc["apiVersion"] = json!("v1");
    Ok(doc)
}

fn resource_list(app: &App, g: &str, v: &str) -> Result<Value, ApiError> {
    let rts = app.store.read(|s| s.registry.resources_of(g, v));
    if rts.is_empty() {
        return Err(ApiError::no_route());
    }
    let gv = if g.is_empty() {
        v.to_string()
    } else {
        format!("{g}/{v}")
    };
    let resources: Vec<Value> = rts.iter().flat_map(|rt| rt.discovery_entries()).collect();
    Ok(json!({"kind": "APIResourceList", "apiVersion": "v1", "groupVersion": gv, "resources": resources}))
}

fn wants_protobuf(headers: &HeaderMap) -> bool {
    let accept = super::response::accept(headers);
    accept.contains("protobuf") && !accept.contains("json")
}

/// Older kubectl (1.27) only reads the protobuf form. A document holding
/// just `swagger: "2.0"` tells it nothing about our kinds, so it validates
/// nothing client-side and leaves it to us.
fn openapi_v2_protobuf() -> Response {
    (
        StatusCode::OK,
        [(
            header::CONTENT_TYPE,
            "application/com.github.proto-openapi.spec.v2.v1.0+protobuf",
        )],
        openapi::V2_PROTOBUF_MINIMAL.to_vec(),
    )
        .into_response()
}
