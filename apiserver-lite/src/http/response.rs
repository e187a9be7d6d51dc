//! How objects are answered: the representation the client asked for in
//! `Accept` (the object itself, a Table, or PartialObjectMetadata), and
//! the JSON bodies that carry it.

use axum::body::Bytes;
use axum::http::{header, HeaderMap, HeaderValue, StatusCode};
use axum::response::{IntoResponse, Response};
use serde_json::{json, Value};

use super::Query;
use crate::object::Object;
use crate::ops;
use crate::resources::ResourceType;
use crate::table::{self, IncludeObject};

pub(super) fn json_response(code: StatusCode, v: &Value) -> Response {
    let body = serde_json::to_vec(v).unwrap_or_default();
    (code, [(header::CONTENT_TYPE, "application/json")], body).into_response()
}

pub(super) fn bytes_response(code: StatusCode, body: impl Into<axum::body::Body>) -> Response {
    (code, [(header::CONTENT_TYPE, "application/json")], body.into()).into_response()
}

/// What the client asked the response to be.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) enum Shape {
    Full,
    Table,
    Metadata,
}

/// The request's `Accept` header ("" when it has none or it is not text).
pub(super) fn accept(headers: &HeaderMap) -> &str {
    headers
        .get(header::ACCEPT)
        .and_then(|v| v.to_str().ok())
        .unwrap_or_default()
}

pub(super) fn shape(headers: &HeaderMap) -> Shape {
    let accept = accept(headers);
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

/// What a Table's rows carry of each object (`includeObject`).
pub(super) fn include_object(query: &Query) -> IncludeObject {
    match query.get("includeObject").map(String::as_str) {
        Some("None") => IncludeObject::None,
        Some("Object") => IncludeObject::Object,
        _ => IncludeObject::Metadata,
    }
}

/// A stored object as `rt` serves it.
pub(super) fn with_version(rt: &ResourceType, obj: &Value) -> Value {
    let mut o = rt.from_storage(obj).into_owned();
    o["apiVersion"] = json!(rt.api_version());
    o
}

/// A Table of one stored object, at the object's resourceVersion.
pub(super) fn one_row_table(rt: &ResourceType, obj: &Value, include: IncludeObject) -> Value {
    let rv = obj["metadata"]["resourceVersion"]
        .as_str()
        .and_then(|r| r.parse().ok())
        .unwrap_or(0);
    table::table(rt, vec![table::row(rt, obj, include)], rv, None)
}

/// A stored object as `rt` serves it, in the shape asked for: as stored,
/// without parsing it, when that is what was asked.
pub(super) fn object_response(rt: &ResourceType, code: StatusCode, obj: &Object, shape: Shape) -> Response {
    match shape {
        Shape::Full if obj.api_version().as_deref() == Some(&rt.api_version()) => {
            bytes_response(code, Bytes::from_owner(obj.json().clone()))
        }
        Shape::Full => json_response(code, &with_version(rt, &obj.value())),
        Shape::Metadata => json_response(code, &table::partial_metadata(&obj.value())),
        Shape::Table => json_response(code, &one_row_table(rt, &obj.value(), IncludeObject::Metadata)),
    }
}

/// The object a write left, with its warnings as `Warning` headers.
pub(super) fn written(rt: &ResourceType, code: StatusCode, w: ops::Written, shape: Shape) -> Response {
    let mut resp = object_response(rt, code, &w.object, shape);
    for warning in w.warnings {
        if let Ok(v) = HeaderValue::from_str(&format!("299 - \"{}\"", warning.replace('"', "\\\""))) {
            resp.headers_mut().append("Warning", v);
        }
    }
    resp
}
