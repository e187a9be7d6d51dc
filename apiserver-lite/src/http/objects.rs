//! The verbs on objects (get, create, update, patch, delete) and
//! deletecollection: each reads its body and options, leaves the write to
//! [`ops`] in one store transaction, and answers in the shape asked for.

use axum::http::{header, HeaderMap, StatusCode};
use axum::response::Response;
use serde_json::{json, Value};

use super::list::Selection;
use super::request::Verb;
use super::response::{json_response, object_response, with_version, written, Shape};
use super::{protobuf, Call, Query};
use crate::admission;
use crate::error::ApiError;
use crate::object::Object;
use crate::ops::{self, Deleted, FieldValidation, PatchType, Propagation, WriteOpts, Written};
use crate::resources::ResourceType;
use crate::store::Txn;

pub(super) fn get(call: &Call<'_>, name: &str) -> Result<Response, ApiError> {
    let rt = &call.rt;
    let gr = rt.stored_resource();
    let obj = call
        .app
        .store
        .read(|s| {
            s.get_object(&gr, call.path.namespace.unwrap_or_default(), name)
                .cloned()
        })
        .ok_or_else(|| ApiError::not_found(&rt.group_resource(), name))?;
    Ok(object_response(rt, StatusCode::OK, &obj, call.shape))
}

pub(super) async fn create(call: &Call<'_>) -> Result<Response, ApiError> {
    let rt = &call.rt;
    let ns = namespace_for_write(call)?;
    let mut obj = decode(&call.body, call.headers, rt)?;
    // A generated name is settled once, so that the webhooks' dry run and
    // the real write make the same object.
    ops::settle_generated_name(&mut obj);
    let opts = write_opts(call)?;
    let w = admitted(call, ns, None, &opts, |txn, opts| {
        ops::create(txn, rt, ns, obj.clone(), opts, None)
    })
    .await?;
    Ok(written(rt, StatusCode::CREATED, w, call.shape))
}

/// Makes a write, asking the validating admission webhooks that match it
/// first (see [`admission`]): `write` is worked out as a dry run, the
/// webhooks see the result, and the real write must come out the same
/// under the lock, else the round starts over.
async fn admitted(
    call: &Call<'_>,
    ns: &str,
    name: Option<&str>,
    opts: &WriteOpts,
    write: impl Fn(&mut Txn<'_>, &WriteOpts) -> Result<Written, ApiError>,
) -> Result<Written, ApiError> {
    let rt = &call.rt;
    let store = &call.app.store;
    let gr = rt.stored_resource();
    let key_ns = if rt.namespaced { ns } else { "" };
    let old_of = |name: Option<&str>| {
        let name = name?;
        store.read(|s| s.get_object(&gr, key_ns, name).cloned())
    };
    let operation_of = |old: &Option<Object>| match old {
        Some(_) => admission::Operation::Update,
        None => admission::Operation::Create,
    };
    let old = old_of(name);
    let hooks = store.read(|s| admission::matching(s, rt, call.status, operation_of(&old)));
    if hooks.is_empty() {
        return store.write(|txn| write(txn, opts));
    }
    let dry = WriteOpts {
        dry_run: true,
        ..opts.clone()
    };
    for _ in 0..3 {
        let old = old_of(name);
        let preview = store.write(|txn| write(txn, &dry))?;
        let object_name = crate::metadata::meta_str(&preview.object.value(), "name").to_owned();
        let request = admission::Request {
            rt,
            status: call.status,
            operation: operation_of(&old),
            namespace: ns,
            name: &object_name,
            object: &preview.object,
            old: old.as_ref(),
            identity: call.identity,
            dry_run: opts.dry_run,
        };
        let warnings = admission::review(&hooks, &request).await?;
        let outcome = store.write(|txn| {
            let again = write(txn, &dry)?;
            if !admission::same(&again.object, &preview.object) {
                return Ok(None);
            }
            write(txn, opts).map(Some)
        })?;
        if let Some(mut w) = outcome {
            w.warnings.extend(warnings);
            return Ok(w);
        }
    }
    Err(ApiError::new(
        StatusCode::CONFLICT,
        "Conflict",
        format!(
            "Operation cannot be fulfilled on {}: the object kept changing while admission webhooks looked at it; please try again",
            rt.group_resource()
        ),
    ))
}

pub(super) async fn update(call: &Call<'_>, name: &str) -> Result<Response, ApiError> {
    let rt = &call.rt;
    let ns = namespace_for_write(call)?;
    let obj = decode(&call.body, call.headers, rt)?;
    let opts = write_opts(call)?;
    let gr = rt.stored_resource();
    let w = admitted(call, ns, Some(name), &opts, |txn, opts| {
        let old = txn
            .state
            .get(&gr, ns, name)
            .ok_or_else(|| ApiError::not_found(&rt.group_resource(), name))?;
        ops::commit_update(
            txn,
            rt,
            &old,
            obj.clone(),
            call.status,
            opts,
            ops::Precondition::Put,
            false,
        )
    })
    .await?;
    Ok(written(rt, StatusCode::OK, w, call.shape))
}

pub(super) async fn patch(call: &Call<'_>, name: &str) -> Result<Response, ApiError> {
    let rt = &call.rt;
    let ns = namespace_for_write(call)?;
    let ct = content_type(call.headers).unwrap_or_default();
    let kind = PatchType::from_content_type(ct).ok_or_else(|| {
        ApiError::unsupported_media_type(format!("the body of the request was in an unknown format - accepted media types include: application/json-patch+json, application/merge-patch+json, application/apply-patch+yaml, application/strategic-merge-patch+json (content type {ct:?})"))
    })?;
    let mut opts = write_opts(call)?;
    if kind == PatchType::Apply {
        let Some(manager) = call.query.get("fieldManager") else {
            return Err(ApiError::bad_request(
                "PATCH requests with apply content type require fieldManager",
            ));
        };
        opts.manager = manager.clone();
        // An apply that brings the object into being needs `create` as
        // well, as on the real server.
        let gr = rt.stored_resource();
        if call.app.store.read(|s| s.get(&gr, ns, name).is_none()) {
            call.authorize(Verb::Create)?;
        }
    }
    let force = call.query.get("force").is_some_and(|f| f == "true");
    let w = admitted(call, ns, Some(name), &opts, |txn, opts| {
        ops::patch(txn, rt, ns, name, kind, &call.body, call.status, force, opts)
    })
    .await?;
    let code = if w.created {
        StatusCode::CREATED
    } else {
        StatusCode::OK
    };
    Ok(written(rt, code, w, call.shape))
}

pub(super) fn delete(call: &Call<'_>, name: &str) -> Result<Response, ApiError> {
    let rt = &call.rt;
    let ns = namespace_for_write(call)?;
    let opts = delete_opts(call.query, &call.body)?;
    let res = call.app.store.write(|txn| {
        ops::delete(
            txn,
            rt,
            ns,
            name,
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
                "details": {"name": name, "group": rt.group, "kind": rt.plural, "uid": obj.value()["metadata"]["uid"]},
            }),
        ),
        Deleted::Pending(obj) => object_response(rt, StatusCode::OK, &obj, Shape::Full),
    })
}

pub(super) fn delete_collection(call: &Call<'_>) -> Result<Response, ApiError> {
    let rt = &call.rt;
    let selection = Selection::from_query(call.query)?;
    let opts = delete_opts(call.query, &call.body)?;
    let gr = rt.stored_resource();
    let deleted = call.app.store.write(|txn| {
        let keys: Vec<(String, String)> = txn
            .state
            .list(&gr, call.path.namespace)
            .filter(|(_, o)| selection.selects(rt, o))
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
    let items: Vec<Value> = deleted.iter().map(|o| with_version(rt, &o.value())).collect();
    Ok(json_response(
        StatusCode::OK,
        &json!({"kind": rt.list_kind, "apiVersion": rt.api_version(), "metadata": {}, "items": items}),
    ))
}

/// The namespace a write goes to: `""` for cluster-scoped kinds; a
/// namespaced kind written outside a namespace path names nothing.
fn namespace_for_write<'a>(call: &Call<'a>) -> Result<&'a str, ApiError> {
    match (call.rt.namespaced, call.path.namespace) {
        (true, Some(n)) => Ok(n),
        (true, None) => Err(ApiError::no_route()),
        (false, _) => Ok(""),
    }
}

fn content_type(headers: &HeaderMap) -> Option<&str> {
    headers.get(header::CONTENT_TYPE).and_then(|v| v.to_str().ok())
}

pub(super) fn decode(body: &[u8], headers: &HeaderMap, rt: &ResourceType) -> Result<Value, ApiError> {
    let ct = content_type(headers).unwrap_or("application/json");
    if protobuf::is_protobuf(ct) {
        return protobuf::decode(body, rt);
    }
    decode_json(body, ct)
}

/// Reads a body that is a `kind` (a subresource's, such as a
/// TokenRequest) whatever the resource it is sent to.
pub(super) fn decode_kind(body: &[u8], headers: &HeaderMap, kind: (&str, &str)) -> Result<Value, ApiError> {
    let ct = content_type(headers).unwrap_or("application/json");
    if protobuf::is_protobuf(ct) {
        return protobuf::decode_kind(body, kind);
    }
    decode_json(body, ct)
}

fn decode_json(body: &[u8], ct: &str) -> Result<Value, ApiError> {
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

fn write_opts(call: &Call<'_>) -> Result<WriteOpts, ApiError> {
    let (query, headers) = (call.query, call.headers);
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
        identity: call.identity.clone(),
    })
}

/// DeleteOptions, from the body or the query.
struct DeleteOpts {
    propagation: Propagation,
    uid: Option<String>,
    rv: Option<String>,
    dry_run: bool,
}

fn delete_opts(query: &Query, body: &[u8]) -> Result<DeleteOpts, ApiError> {
    let b: Value = if body.iter().all(|c| c.is_ascii_whitespace()) {
        json!({})
    } else if body.starts_with(crate::protobuf::MAGIC) {
        protobuf::decode_delete_options(body)?
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
