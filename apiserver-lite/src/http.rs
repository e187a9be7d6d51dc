//! The HTTP face: routing of Kubernetes API paths, discovery, content
//! negotiation (JSON, Table, PartialObjectMetadata), lists, watches and the
//! write verbs, each answered as the real API server answers it.

use std::collections::HashMap;
use std::sync::Arc;
use std::time::Duration;

use axum::body::{Body, Bytes};
use axum::extract::{Request, State};
use axum::http::{header, HeaderMap, HeaderValue, Method, StatusCode};
use axum::response::{IntoResponse, Response};
use serde_json::{json, Value};
use tokio::sync::broadcast::error::RecvError;

use crate::authz::{Attributes, Authenticator, Identity};
use crate::error::ApiError;
use crate::openapi;
use crate::ops::{self, Deleted, FieldValidation, PatchType, Propagation, WriteOpts};
use crate::resources::ResourceType;
use crate::selectors::{FieldSelector, LabelSelector};
use crate::store::{EventType, Store};
use crate::table::{self, IncludeObject};

/// Shared state of every request.
#[derive(Clone)]
pub struct App {
    pub store: Arc<Store>,
    /// The accepted bearer tokens and who they stand for.
    pub auth: Arc<Authenticator>,
    pub max_body: usize,
    pub bookmark_interval: Duration,
    pub shutdown: tokio_util::sync::CancellationToken,
}

pub fn router(app: App) -> axum::Router {
    axum::Router::new().fallback(handle).with_state(app)
}

type Query = HashMap<String, String>;

fn json_response(code: StatusCode, v: &Value) -> Response {
    let body = serde_json::to_vec(v).unwrap_or_default();
    (code, [(header::CONTENT_TYPE, "application/json")], body).into_response()
}

fn bytes_response(code: StatusCode, body: Vec<u8>) -> Response {
    (code, [(header::CONTENT_TYPE, "application/json")], body).into_response()
}

/// The RBAC verb of a request on a resource.
fn verb_of(method: &Method, named: bool, watch: bool) -> Result<&'static str, ApiError> {
    Ok(match (method.clone(), named) {
        (Method::GET, _) if watch => "watch",
        (Method::GET, true) => "get",
        (Method::GET, false) => "list",
        (Method::POST, false) => "create",
        (Method::PUT, true) => "update",
        (Method::PATCH, true) => "patch",
        (Method::DELETE, true) => "delete",
        (Method::DELETE, false) => "deletecollection",
        _ => return Err(ApiError::method_not_allowed()),
    })
}

/// The one name a field selector pins (read as the list or watch will read
/// it), which RBAC's resourceNames can then allow.
fn name_selected(query: &Query) -> Option<String> {
    let selector = FieldSelector::parse(query.get("fieldSelector")?, |_| true).ok()?;
    selector.pinned_name().map(str::to_owned)
}

/// What the client asked the response to be.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Shape {
    Full,
    Table,
    Metadata,
}

fn shape(headers: &HeaderMap) -> Shape {
    let accept = headers
        .get(header::ACCEPT)
        .and_then(|v| v.to_str().ok())
        .unwrap_or_default();
    // The first acceptable media type wins; we serve JSON Table and partial metadata.
    for part in accept.split(',') {
        let p = part.replace(' ', "");
        if p.contains("as=Table")
            && p.contains("g=meta.k8s.io")
            && p.contains("v=v1")
            && !p.contains("v=v1beta1")
        {
            return if p.starts_with("application/json") {
                Shape::Table
            } else {
                continue;
            };
        }
        if p.contains("as=PartialObjectMetadata") && p.starts_with("application/json") {
            return Shape::Metadata;
        }
        if p.starts_with("application/json") || p.starts_with("*/*") || p.starts_with("application/yaml") {
            return Shape::Full;
        }
    }
    Shape::Full
}

async fn handle(State(app): State<App>, req: Request) -> Response {
    let (parts, body) = req.into_parts();
    let path = parts.uri.path().to_string();
    if matches!(path.as_str(), "/healthz" | "/readyz" | "/livez") {
        return (StatusCode::OK, "ok").into_response();
    }
    let authorization = parts
        .headers
        .get(header::AUTHORIZATION)
        .and_then(|v| v.to_str().ok());
    let Some(identity) = app.auth.authenticate(authorization) else {
        return ApiError::unauthorized().into_response();
    };
    let query: Query = axum::extract::Query::<Query>::try_from_uri(&parts.uri)
        .map(|q| q.0)
        .unwrap_or_default();
    let body = match axum::body::to_bytes(body, app.max_body).await {
        Ok(b) => b,
        Err(_) => return ApiError::too_large(app.max_body).into_response(),
    };
    match route(
        &app,
        &identity,
        &parts.method,
        &path,
        &query,
        &parts.headers,
        body,
    )
    .await
    {
        Ok(r) => r,
        Err(e) => e.into_response(),
    }
}

async fn route(
    app: &App,
    identity: &Identity,
    method: &Method,
    path: &str,
    query: &Query,
    headers: &HeaderMap,
    body: Bytes,
) -> Result<Response, ApiError> {
    let segs: Vec<&str> = path
        .trim_matches('/')
        .split('/')
        .filter(|s| !s.is_empty())
        .collect();
    let get_only = |r: Response| {
        if method == Method::GET {
            Ok(r)
        } else {
            Err(ApiError::method_not_allowed())
        }
    };
    match segs.as_slice() {
        [] => {
            return get_only(json_response(
                StatusCode::OK,
                &json!({"paths": ["/api", "/api/v1", "/apis", "/healthz", "/openapi/v2", "/openapi/v3", "/version"]}),
            ))
        }
        ["version"] => return get_only(json_response(StatusCode::OK, &version())),
        ["api"] => {
            return get_only(json_response(
                StatusCode::OK,
                &json!({"kind": "APIVersions", "versions": ["v1"], "serverAddressByClientCIDRs": [{"clientCIDR": "0.0.0.0/0", "serverAddress": ""}]}),
            ))
        }
        ["apis"] => {
            return get_only(json_response(
                StatusCode::OK,
                &app.store.read(|s| group_list(&s.registry)),
            ))
        }
        ["api", v] => return get_only(resource_list(app, "", v)?),
        ["apis", g] => return get_only(group_doc(app, g)?),
        ["apis", g, v] => return get_only(resource_list(app, g, v)?),
        ["openapi", "v2"] => {
            let accept = headers
                .get(header::ACCEPT)
                .and_then(|v| v.to_str().ok())
                .unwrap_or_default();
            if accept.contains("protobuf") && !accept.contains("json") {
                // Older kubectl (1.27) only reads the protobuf form. A document
                // holding just `swagger: "2.0"` tells it nothing about our kinds,
                // so it validates nothing client-side and leaves it to us.
                return get_only(
                    (
                        StatusCode::OK,
                        [(
                            header::CONTENT_TYPE,
                            "application/com.github.proto-openapi.spec.v2.v1.0+protobuf",
                        )],
                        openapi::V2_PROTOBUF_MINIMAL.to_vec(),
                    )
                        .into_response(),
                );
            }
            return get_only(json_response(
                StatusCode::OK,
                &app.store.read(|s| openapi::v2(&s.registry)),
            ));
        }
        ["openapi", "v3"] => {
            return get_only(json_response(
                StatusCode::OK,
                &app.store.read(|s| openapi::v3_root(&s.registry)),
            ))
        }
        ["openapi", "v3", rest @ ..] => {
            let doc = app.store.read(|s| openapi::v3_doc(&s.registry, &rest.join("/")));
            return get_only(json_response(
                StatusCode::OK,
                &doc.ok_or_else(ApiError::no_route)?,
            ));
        }
        _ => {}
    }
    let (group, version, rest) = match segs.as_slice() {
        ["api", v, rest @ ..] => ("", *v, rest),
        ["apis", g, v, rest @ ..] => (*g, *v, rest),
        _ => return Err(ApiError::no_route()),
    };
    let (watch_prefix, rest) = match rest {
        ["watch", r @ ..] => (true, r),
        r => (false, r),
    };
    let (ns, plural, name, sub): (Option<&str>, &str, Option<&str>, Option<&str>) = match rest {
        ["namespaces", n, s @ ("status" | "finalize")] if group.is_empty() => {
            (None, "namespaces", Some(*n), Some(*s))
        }
        ["namespaces", ns, plural] => (Some(*ns), *plural, None, None),
        ["namespaces", ns, plural, name] => (Some(*ns), *plural, Some(*name), None),
        ["namespaces", ns, plural, name, sub] => (Some(*ns), *plural, Some(*name), Some(*sub)),
        [plural] => (None, *plural, None, None),
        [plural, name] => (None, *plural, Some(*name), None),
        [plural, name, sub] => (None, *plural, Some(*name), Some(*sub)),
        _ => return Err(ApiError::no_route()),
    };
    let rt = app
        .store
        .read(|s| s.registry.get(group, version, plural))
        .ok_or_else(ApiError::no_route)?;
    if ns.is_some() && !rt.namespaced {
        return Err(ApiError::no_route());
    }
    let status = match sub {
        None => false,
        Some("status") if rt.status_subresource => true,
        Some(_) => return Err(ApiError::no_route()),
    };
    let watch = watch_prefix || matches!(query.get("watch").map(String::as_str), Some("true" | "1"));
    let verb = verb_of(method, name.is_some(), watch)?;
    // Only a list or a watch takes its name from the field selector.
    let selected = matches!(verb, "list" | "watch")
        .then(|| name_selected(query))
        .flatten();
    let attrs = Attributes {
        verb,
        group,
        resource: plural,
        subresource: sub,
        // A namespace's own namespace is itself, for RoleBindings in it.
        namespace: if group.is_empty() && plural == "namespaces" {
            name
        } else {
            ns
        },
        name: name.or(selected.as_deref()),
    };
    app.store.read(|s| app.auth.authorize(s, identity, &attrs))?;
    let shape = shape(headers);
    match (method.clone(), name) {
        (Method::GET, None) if watch => watch_handler(app, rt, ns, query, shape).await,
        (Method::GET, None) => list(app, &rt, ns, query, shape),
        (Method::GET, Some(n)) if watch => {
            let mut q = query.clone();
            q.insert("fieldSelector".into(), format!("metadata.name={n}"));
            watch_handler(app, rt, ns, &q, shape).await
        }
        (Method::POST, None) => {
            let ns = namespace_for_write(&rt, ns)?;
            let obj = decode(&body, headers)?;
            let opts = write_opts(query, headers)?;
            let w = app
                .store
                .write(|txn| ops::create(txn, &rt, ns, obj, &opts, None))?;
            Ok(written(&rt, StatusCode::CREATED, w, shape))
        }
        (Method::DELETE, None) => delete_collection(app, &rt, ns, query, &body),
        (Method::GET, Some(n)) => {
            let gr = rt.stored_resource();
            let obj = app
                .store
                .read(|s| s.get(&gr, ns.unwrap_or_default(), n))
                .ok_or_else(|| ApiError::not_found(&rt.group_resource(), n))?;
            Ok(object_response(&rt, StatusCode::OK, &obj, shape))
        }
        (Method::PUT, Some(n)) => {
            let nsv = namespace_for_write(&rt, ns)?;
            let obj = decode(&body, headers)?;
            let opts = write_opts(query, headers)?;
            let gr = rt.stored_resource();
            let w = app.store.write(|txn| {
                let old = txn
                    .state
                    .get(&gr, nsv, n)
                    .ok_or_else(|| ApiError::not_found(&rt.group_resource(), n))?;
                ops::commit_update(txn, &rt, &old, obj, status, &opts, ops::Precondition::Put, false)
            })?;
            Ok(written(&rt, StatusCode::OK, w, shape))
        }
        (Method::PATCH, Some(n)) => {
            let nsv = namespace_for_write(&rt, ns)?;
            let ct = headers
                .get(header::CONTENT_TYPE)
                .and_then(|v| v.to_str().ok())
                .unwrap_or_default();
            let kind = PatchType::from_content_type(ct).ok_or_else(|| {
                ApiError::unsupported_media_type(format!("the body of the request was in an unknown format - accepted media types include: application/json-patch+json, application/merge-patch+json, application/apply-patch+yaml, application/strategic-merge-patch+json (content type {ct:?})"))
            })?;
            let mut opts = write_opts(query, headers)?;
            if kind == PatchType::Apply && !query.contains_key("fieldManager") {
                return Err(ApiError::bad_request(
                    "PATCH requests with apply content type require fieldManager",
                ));
            }
            if kind == PatchType::Apply {
                opts.manager = query.get("fieldManager").cloned().unwrap_or_default();
                // An apply that brings the object into being needs `create`
                // as well, as on the real server.
                let gr = rt.stored_resource();
                if app.store.read(|s| s.get(&gr, nsv, n).is_none()) {
                    let create = Attributes {
                        verb: "create",
                        ..attrs
                    };
                    app.store.read(|s| app.auth.authorize(s, identity, &create))?;
                }
            }
            let force = query.get("force").is_some_and(|f| f == "true");
            let w = app
                .store
                .write(|txn| ops::patch(txn, &rt, nsv, n, kind, &body, status, force, &opts))?;
            let code = if w.created {
                StatusCode::CREATED
            } else {
                StatusCode::OK
            };
            Ok(written(&rt, code, w, shape))
        }
        (Method::DELETE, Some(n)) => {
            let nsv = namespace_for_write(&rt, ns)?;
            let opts = delete_opts(query, &body)?;
            let res = app.store.write(|txn| {
                ops::delete(
                    txn,
                    &rt,
                    nsv,
                    n,
                    opts.propagation,
                    opts.uid.as_deref(),
                    opts.rv.as_deref(),
                    opts.dry_run,
                )
            })?;
            Ok(match res {
                Deleted::Gone(obj) => json_response(
                    StatusCode::OK,
                    &json!({
                        "kind": "Status", "apiVersion": "v1", "metadata": {}, "status": "Success",
                        "details": {"name": n, "group": rt.group, "kind": rt.plural, "uid": obj["metadata"]["uid"]},
                    }),
                ),
                Deleted::Pending(obj) => object_response(&rt, StatusCode::OK, &obj, Shape::Full),
            })
        }
        _ => Err(ApiError::method_not_allowed()),
    }
}

fn version() -> Value {
    json!({
        "major": "1", "minor": "32", "gitVersion": "v1.32.0+k8s4r-apiserver-lite",
        "gitCommit": "", "gitTreeState": "clean", "buildDate": "2026-01-01T00:00:00Z",
        "goVersion": "n/a", "compiler": "rustc", "platform": "linux/amd64",
    })
}

fn group_list(reg: &crate::resources::Registry) -> Value {
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

fn group_doc(app: &App, g: &str) -> Result<Response, ApiError> {
    let versions = app
        .store
        .read(|s| s.registry.groups().get(g).cloned())
        .ok_or_else(ApiError::no_route)?;
    let mut doc = group_value(g, &versions);
    doc["kind"] = json!("APIGroup");
    doc["apiVersion"] = json!("v1");
    Ok(json_response(StatusCode::OK, &doc))
}

fn resource_list(app: &App, g: &str, v: &str) -> Result<Response, ApiError> {
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
    Ok(json_response(
        StatusCode::OK,
        &json!({"kind": "APIResourceList", "apiVersion": "v1", "groupVersion": gv, "resources": resources}),
    ))
}

fn namespace_for_write<'a>(rt: &ResourceType, ns: Option<&'a str>) -> Result<&'a str, ApiError> {
    match (rt.namespaced, ns) {
        (true, Some(n)) => Ok(n),
        (true, None) => Err(ApiError::no_route()),
        (false, _) => Ok(""),
    }
}

fn decode(body: &[u8], headers: &HeaderMap) -> Result<Value, ApiError> {
    let ct = headers
        .get(header::CONTENT_TYPE)
        .and_then(|v| v.to_str().ok())
        .unwrap_or("application/json");
    if ct.contains("protobuf") {
        return Err(ApiError::unsupported_media_type(format!("the body of the request was in an unknown format - accepted media types include: application/json, application/yaml (content type {ct:?})")));
    }
    let v: Value = if ct.contains("yaml") {
        serde_yaml::from_slice(body)
            .map_err(|e| ApiError::bad_request(format!("error decoding YAML: {e}")))?
    } else {
        serde_json::from_slice(body).map_err(|e| {
            ApiError::bad_request(format!(
                "the body of the request could not be decoded as JSON: {e}"
            ))
        })?
    };
    if !v.is_object() {
        return Err(ApiError::bad_request(
            "the body of the request must be a JSON object",
        ));
    }
    Ok(v)
}

fn write_opts(query: &Query, headers: &HeaderMap) -> Result<WriteOpts, ApiError> {
    let manager = match query.get("fieldManager") {
        Some(m) => m.clone(),
        None => headers
            .get(header::USER_AGENT)
            .and_then(|v| v.to_str().ok())
            .and_then(|ua| ua.split('/').next())
            .filter(|s| !s.is_empty())
            .unwrap_or("unknown")
            .to_string(),
    };
    let field_validation = match query.get("fieldValidation").map(String::as_str) {
        None | Some("") | Some("Warn") => FieldValidation::Warn,
        Some("Strict") => FieldValidation::Strict,
        Some("Ignore") => FieldValidation::Ignore,
        Some(other) => {
            return Err(ApiError::bad_request(format!(
                "fieldValidation must be one of Ignore, Warn or Strict, not {other:?}"
            )))
        }
    };
    Ok(WriteOpts {
        manager,
        dry_run: query.get("dryRun").is_some_and(|d| d == "All"),
        field_validation,
    })
}

struct DeleteOpts {
    propagation: Propagation,
    uid: Option<String>,
    rv: Option<String>,
    dry_run: bool,
}

fn delete_opts(query: &Query, body: &[u8]) -> Result<DeleteOpts, ApiError> {
    let b: Value = if body.iter().all(|c| c.is_ascii_whitespace()) {
        json!({})
    } else {
        serde_json::from_slice(body).map_err(|e| {
            ApiError::bad_request(format!(
                "the body of the request could not be decoded as DeleteOptions: {e}"
            ))
        })?
    };
    let policy = b["propagationPolicy"]
        .as_str()
        .map(String::from)
        .or_else(|| query.get("propagationPolicy").cloned());
    let orphan = b["orphanDependents"]
        .as_bool()
        .or_else(|| query.get("orphanDependents").map(|o| o == "true"));
    let propagation = match (policy.as_deref(), orphan) {
        (Some("Foreground"), _) => Propagation::Foreground,
        (Some("Orphan"), _) | (None, Some(true)) => Propagation::Orphan,
        (Some("Background") | None, _) => Propagation::Background,
        (Some(other), _) => {
            return Err(ApiError::bad_request(format!(
                "unknown propagationPolicy {other:?}"
            )))
        }
    };
    let dry_run = b["dryRun"]
        .as_array()
        .is_some_and(|a| a.iter().any(|d| d == "All"))
        || query.get("dryRun").is_some_and(|d| d == "All");
    Ok(DeleteOpts {
        propagation,
        uid: b["preconditions"]["uid"].as_str().map(String::from),
        rv: b["preconditions"]["resourceVersion"].as_str().map(String::from),
        dry_run,
    })
}

/// A stored object as `rt` serves it.
fn with_version(rt: &ResourceType, obj: &Value) -> Value {
    let mut o = rt.from_storage(obj).into_owned();
    o["apiVersion"] = json!(rt.api_version());
    o
}

fn object_response(rt: &ResourceType, code: StatusCode, obj: &Value, shape: Shape) -> Response {
    match shape {
        Shape::Full => {
            if obj["apiVersion"].as_str() == Some(&rt.api_version()) {
                bytes_response(code, serde_json::to_vec(obj).unwrap_or_default())
            } else {
                json_response(code, &with_version(rt, obj))
            }
        }
        Shape::Metadata => json_response(code, &table::partial_metadata(obj)),
        Shape::Table => {
            let rv = obj["metadata"]["resourceVersion"]
                .as_str()
                .and_then(|r| r.parse().ok())
                .unwrap_or(0);
            json_response(
                code,
                &table::table(rt, vec![table::row(rt, obj, IncludeObject::Metadata)], rv, None),
            )
        }
    }
}

fn written(rt: &ResourceType, code: StatusCode, w: ops::Written, shape: Shape) -> Response {
    let mut resp = object_response(rt, code, &w.object, shape);
    for warning in w.warnings {
        if let Ok(v) = HeaderValue::from_str(&format!("299 - \"{}\"", warning.replace('"', "\\\""))) {
            resp.headers_mut().append("Warning", v);
        }
    }
    resp
}

fn selectors(query: &Query) -> Result<(LabelSelector, FieldSelector), ApiError> {
    let labels = LabelSelector::parse(query.get("labelSelector").map(String::as_str).unwrap_or_default())
        .map_err(ApiError::bad_request)?;
    // metadata.name and metadata.namespace everywhere, as the real server; for
    // other dotted paths see KNOWN_DIFFERENCES.
    let fields = FieldSelector::parse(
        query.get("fieldSelector").map(String::as_str).unwrap_or_default(),
        |p| !p.is_empty() && p.split('.').all(|s| !s.is_empty()),
    )
    .map_err(ApiError::bad_request)?;
    Ok((labels, fields))
}

/// Whether the selectors select a stored object. Field selectors see it as
/// `rt` serves it; labels live in metadata, which no conversion changes, so
/// the conversion is skipped when there is no field selector.
fn selected(rt: &ResourceType, labels: &LabelSelector, fields: &FieldSelector, stored: &Value) -> bool {
    labels.matches(stored) && (fields.is_empty() || fields.matches(&rt.from_storage(stored)))
}

fn include_object(query: &Query) -> IncludeObject {
    match query.get("includeObject").map(String::as_str) {
        Some("None") => IncludeObject::None,
        Some("Object") => IncludeObject::Object,
        _ => IncludeObject::Metadata,
    }
}

fn list(
    app: &App,
    rt: &ResourceType,
    ns: Option<&str>,
    query: &Query,
    shape: Shape,
) -> Result<Response, ApiError> {
    let (labels, fields) = selectors(query)?;
    let limit: usize = query
        .get("limit")
        .and_then(|l| l.parse().ok())
        .filter(|l| *l > 0)
        .unwrap_or(usize::MAX);
    let start_after: Option<(String, String)> = match query.get("continue").filter(|c| !c.is_empty()) {
        Some(c) => Some(decode_continue(c)?),
        None => None,
    };
    let gr = rt.stored_resource();
    let (items, rv, cont, remaining) = app.store.read(|s| {
        let mut items = Vec::new();
        let mut last_key = None;
        let mut more = 0usize;
        for (key, obj) in s.list(&gr, ns) {
            if start_after.as_ref().is_some_and(|after| key <= after) {
                continue;
            }
            if !selected(rt, &labels, &fields, obj) {
                continue;
            }
            if items.len() >= limit {
                more += 1;
                continue;
            }
            last_key = Some(key.clone());
            items.push(obj.clone());
        }
        let cont = if more > 0 {
            last_key.map(|k| encode_continue(&k))
        } else {
            None
        };
        (items, s.rv, cont, more)
    });
    match shape {
        Shape::Table => {
            let inc = include_object(query);
            let rows = items.iter().map(|o| table::row(rt, o, inc)).collect();
            Ok(json_response(StatusCode::OK, &table::table(rt, rows, rv, cont)))
        }
        Shape::Metadata => {
            let items: Vec<Value> = items.iter().map(|o| table::partial_metadata(o)).collect();
            let mut meta = json!({"resourceVersion": rv.to_string()});
            if let Some(c) = cont {
                meta["continue"] = json!(c);
            }
            Ok(json_response(
                StatusCode::OK,
                &json!({"kind": "PartialObjectMetadataList", "apiVersion": "meta.k8s.io/v1", "metadata": meta, "items": items}),
            ))
        }
        Shape::Full => {
            let mut meta = json!({"resourceVersion": rv.to_string()});
            if let Some(c) = cont {
                meta["continue"] = json!(c);
                meta["remainingItemCount"] = json!(remaining);
            }
            // Written by hand so the items are serialized once, not cloned into a new tree.
            let mut out = Vec::with_capacity(256 + items.len() * 512);
            out.extend_from_slice(
                format!(
                    "{{\"kind\":{},\"apiVersion\":{},\"metadata\":{},\"items\":[",
                    json!(rt.list_kind),
                    json!(rt.api_version()),
                    meta
                )
                .as_bytes(),
            );
            let av = rt.api_version();
            for (i, o) in items.iter().enumerate() {
                if i > 0 {
                    out.push(b',');
                }
                if o["apiVersion"].as_str() == Some(&av) {
                    serde_json::to_writer(&mut out, &**o).map_err(|e| ApiError::internal(e.to_string()))?;
                } else {
                    serde_json::to_writer(&mut out, &with_version(rt, o))
                        .map_err(|e| ApiError::internal(e.to_string()))?;
                }
            }
            out.extend_from_slice(b"]}");
            Ok(bytes_response(StatusCode::OK, out))
        }
    }
}

fn encode_continue(key: &(String, String)) -> String {
    let raw = serde_json::to_vec(&json!([key.0, key.1])).unwrap_or_default();
    raw.iter().map(|b| format!("{b:02x}")).collect()
}

fn decode_continue(c: &str) -> Result<(String, String), ApiError> {
    let bad = || ApiError::bad_request("continue key is not valid");
    if !c.len().is_multiple_of(2) {
        return Err(bad());
    }
    let bytes: Result<Vec<u8>, _> = (0..c.len())
        .step_by(2)
        .map(|i| u8::from_str_radix(&c[i..i + 2], 16))
        .collect();
    let v: Value = serde_json::from_slice(&bytes.map_err(|_| bad())?).map_err(|_| bad())?;
    match (v[0].as_str(), v[1].as_str()) {
        (Some(a), Some(b)) => Ok((a.to_string(), b.to_string())),
        _ => Err(bad()),
    }
}

fn delete_collection(
    app: &App,
    rt: &ResourceType,
    ns: Option<&str>,
    query: &Query,
    body: &[u8],
) -> Result<Response, ApiError> {
    let (labels, fields) = selectors(query)?;
    let opts = delete_opts(query, body)?;
    let gr = rt.stored_resource();
    let deleted = app.store.write(|txn| {
        let keys: Vec<(String, String)> = txn
            .state
            .list(&gr, ns)
            .filter(|(_, o)| selected(rt, &labels, &fields, o))
            .map(|(k, _)| k.clone())
            .collect();
        let mut out = Vec::new();
        for (kns, name) in keys {
            match ops::delete(txn, rt, &kns, &name, opts.propagation, None, None, opts.dry_run)? {
                Deleted::Gone(o) | Deleted::Pending(o) => out.push(o),
            }
        }
        Ok::<_, ApiError>(out)
    })?;
    let items: Vec<Value> = deleted.iter().map(|o| with_version(rt, o)).collect();
    Ok(json_response(
        StatusCode::OK,
        &json!({"kind": rt.list_kind, "apiVersion": rt.api_version(), "metadata": {}, "items": items}),
    ))
}

fn event_line(type_: &str, object: &Value) -> Bytes {
    let mut out = Vec::with_capacity(512);
    out.extend_from_slice(b"{\"type\":\"");
    out.extend_from_slice(type_.as_bytes());
    out.extend_from_slice(b"\",\"object\":");
    let _ = serde_json::to_writer(&mut out, object);
    out.extend_from_slice(b"}\n");
    Bytes::from(out)
}

struct WatchView {
    rt: Arc<ResourceType>,
    shape: Shape,
    include: IncludeObject,
    first_table: bool,
}

impl WatchView {
    fn render(&mut self, type_: &str, obj: &Value) -> Bytes {
        match self.shape {
            Shape::Full if obj["apiVersion"].as_str() == Some(&self.rt.api_version()) => {
                event_line(type_, obj)
            }
            Shape::Full => event_line(type_, &with_version(&self.rt, obj)),
            Shape::Metadata => event_line(type_, &table::partial_metadata(obj)),
            Shape::Table => {
                let rv = obj["metadata"]["resourceVersion"]
                    .as_str()
                    .and_then(|r| r.parse().ok())
                    .unwrap_or(0);
                let mut t = table::table(&self.rt, vec![table::row(&self.rt, obj, self.include)], rv, None);
                // Like the real server, column definitions come with the first event only.
                if !self.first_table {
                    t["columnDefinitions"] = json!([]);
                }
                self.first_table = false;
                event_line(type_, &t)
            }
        }
    }

    fn bookmark(&self, rv: u64, initial_end: bool) -> Bytes {
        let mut meta = json!({"resourceVersion": rv.to_string()});
        if initial_end {
            meta["annotations"] = json!({"k8s.io/initial-events-end": "true"});
        }
        let obj = match self.shape {
            Shape::Full => {
                json!({"kind": self.rt.kind, "apiVersion": self.rt.api_version(), "metadata": meta})
            }
            Shape::Metadata => {
                json!({"kind": "PartialObjectMetadata", "apiVersion": "meta.k8s.io/v1", "metadata": meta})
            }
            Shape::Table => {
                json!({"kind": "Table", "apiVersion": "meta.k8s.io/v1", "metadata": meta, "columnDefinitions": [], "rows": []})
            }
        };
        event_line("BOOKMARK", &obj)
    }
}

async fn watch_handler(
    app: &App,
    rt: Arc<ResourceType>,
    ns: Option<&str>,
    query: &Query,
    shape: Shape,
) -> Result<Response, ApiError> {
    let (labels, fields) = selectors(query)?;
    let gr = rt.stored_resource();
    let ns = ns.map(String::from);
    let rv_param = query.get("resourceVersion").cloned().unwrap_or_default();
    let send_initial = query.get("sendInitialEvents").map(|s| s == "true");
    let bookmarks = query.get("allowWatchBookmarks").is_some_and(|b| b == "true");
    let timeout = query
        .get("timeoutSeconds")
        .and_then(|t| t.parse::<u64>().ok())
        .map(Duration::from_secs)
        .unwrap_or(Duration::from_secs(1800));
    let from: Option<u64> = if rv_param.is_empty() || rv_param == "0" {
        None
    } else {
        Some(
            rv_param
                .parse()
                .map_err(|_| ApiError::bad_request(format!("invalid resource version {rv_param:?}")))?,
        )
    };
    let initial_wanted = send_initial.unwrap_or(from.is_none());
    let matches = {
        let gr = gr.clone();
        let ns = ns.clone();
        let rt = rt.clone();
        move |obj: &Value| {
            obj["metadata"]["namespace"].as_str().unwrap_or_default()
                == ns
                    .as_deref()
                    .unwrap_or(obj["metadata"]["namespace"].as_str().unwrap_or_default())
                && selected(&rt, &labels, &fields, obj)
                && !gr.is_empty()
        }
    };
    enum Start {
        Initial(Vec<Arc<Value>>, u64),
        Backlog(Vec<Arc<crate::store::Event>>, u64),
        Gone(u64),
    }
    let (start, mut rx) = app.store.subscribe(|s| {
        if initial_wanted {
            let items = s.list(&gr, ns.as_deref()).map(|(_, o)| o.clone()).collect();
            Start::Initial(items, s.rv)
        } else {
            let from = from.unwrap_or(s.rv);
            match s.events_since(from) {
                Some(evs) => Start::Backlog(evs, from),
                None => Start::Gone(s.oldest()),
            }
        }
    });
    let (tx, body_rx) = tokio::sync::mpsc::channel::<Result<Bytes, std::io::Error>>(256);
    let mut view = WatchView {
        rt: rt.clone(),
        shape,
        include: include_object(query),
        first_table: true,
    };
    let interval = app.bookmark_interval;
    let shutdown = app.shutdown.clone();
    tokio::spawn(async move {
        let mut last_rv;
        match start {
            Start::Gone(oldest) => {
                let err = ApiError::gone(format!("too old resource version: {} ({oldest})", rv_param));
                let _ = tx.send(Ok(event_line("ERROR", &err.to_status()))).await;
                return;
            }
            Start::Initial(items, rv) => {
                for o in items.iter().filter(|o| matches(o)) {
                    if tx.send(Ok(view.render("ADDED", o))).await.is_err() {
                        return;
                    }
                }
                last_rv = rv;
                if send_initial == Some(true) && tx.send(Ok(view.bookmark(rv, true))).await.is_err() {
                    return;
                }
            }
            Start::Backlog(events, from) => {
                last_rv = from;
                for ev in events {
                    if let Some(line) = render_event(&mut view, &gr, &matches, &ev) {
                        if tx.send(Ok(line)).await.is_err() {
                            return;
                        }
                    }
                    last_rv = ev.rv;
                }
            }
        }
        let deadline = tokio::time::sleep(timeout);
        tokio::pin!(deadline);
        let mut tick = tokio::time::interval(interval);
        tick.reset();
        loop {
            tokio::select! {
                ev = rx.recv() => match ev {
                    Ok(ev) => {
                        if ev.rv <= last_rv {
                            continue;
                        }
                        last_rv = ev.rv;
                        if let Some(line) = render_event(&mut view, &gr, &matches, &ev) {
                            if tx.send(Ok(line)).await.is_err() {
                                return;
                            }
                        }
                    }
                    // A watcher that fell behind is closed; it resumes from its last resourceVersion.
                    Err(RecvError::Lagged(_)) | Err(RecvError::Closed) => return,
                },
                _ = tick.tick(), if bookmarks => {
                    if tx.send(Ok(view.bookmark(last_rv, false))).await.is_err() {
                        return;
                    }
                }
                _ = &mut deadline => return,
                _ = tx.closed() => return,
                _ = shutdown.cancelled() => return,
            }
        }
    });
    let stream = futures::stream::unfold(
        body_rx,
        |mut rx| async move { rx.recv().await.map(|item| (item, rx)) },
    );
    Ok(Response::builder()
        .status(StatusCode::OK)
        .header(header::CONTENT_TYPE, "application/json")
        .header(header::CACHE_CONTROL, "no-cache, private")
        .body(Body::from_stream(stream))
        .unwrap_or_else(|_| ApiError::internal("cannot build watch response").into_response()))
}

fn render_event(
    view: &mut WatchView,
    gr: &str,
    matches: &impl Fn(&Value) -> bool,
    ev: &crate::store::Event,
) -> Option<Bytes> {
    if ev.gr != gr {
        return None;
    }
    let now = matches(&ev.object);
    let before = ev.prev.as_deref().is_some_and(matches);
    let type_ = match ev.type_ {
        EventType::Added if now => "ADDED",
        EventType::Modified if now && before => "MODIFIED",
        EventType::Modified if now => "ADDED",
        // Leaving the selection looks like a deletion to this watcher.
        EventType::Modified if before => "DELETED",
        EventType::Deleted if before || now => "DELETED",
        _ => return None,
    };
    if view.shape == Shape::Full && ev.object["apiVersion"].as_str() == Some(&view.rt.api_version()) {
        let encoded = ev.encoded();
        let mut out = Vec::with_capacity(encoded.len() + 32);
        out.extend_from_slice(b"{\"type\":\"");
        out.extend_from_slice(type_.as_bytes());
        out.extend_from_slice(b"\",\"object\":");
        out.extend_from_slice(encoded);
        out.extend_from_slice(b"}\n");
        return Some(Bytes::from(out));
    }
    Some(view.render(type_, &ev.object))
}
