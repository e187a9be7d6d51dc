//! The reviews a user asks about itself: who am I (SelfSubjectReview,
//! `kubectl auth whoami`), may I (SelfSubjectAccessReview, `kubectl auth
//! can-i`) and what may I (SelfSubjectRulesReview, `kubectl auth can-i
//! --list`); and the one a program asks about another user, to authorize
//! what it serves for the API server (SubjectAccessReview, delegated
//! authorization). Each is answered at once from the same bindings that
//! authorize requests, and never stored.

use axum::http::StatusCode;
use axum::response::Response;
use serde_json::{json, Value};

use super::objects::decode;
use super::response::json_response;
use super::Call;
use crate::authz::{self, Attributes, PathAttributes, Review};
use crate::error::{ApiError, FieldError};

pub(super) fn create(call: &Call<'_>) -> Result<Response, ApiError> {
    let rt = &call.rt;
    // kubectl 1.32 sends its reviews as protobuf, and gives up on a 415.
    let review = decode(&call.body, call.headers, rt)?;
    crate::ops::check_type(rt, &review)?;
    let spec = &review["spec"];
    let (app, identity) = (call.app, call.identity);
    let status = match rt.kind.as_str() {
        "SelfSubjectReview" => json!({"userInfo": identity.user_info()}),
        "SelfSubjectAccessReview" => {
            let request = access_request(spec)?;
            let decision = app.store.read(|s| app.auth.review(s, identity, &request));
            let mut status = json!({"allowed": decision.allowed});
            if !decision.reason.is_empty() {
                status["reason"] = json!(decision.reason);
            }
            status
        }
        "SubjectAccessReview" => {
            let request = access_request(spec)?;
            let subject = subject_of(spec)?;
            let decision = app.store.read(|s| app.auth.review(s, &subject, &request));
            let mut status = json!({"allowed": decision.allowed});
            if !decision.reason.is_empty() {
                status["reason"] = json!(decision.reason);
            }
            status
        }
        "SelfSubjectRulesReview" => {
            let namespace = spec["namespace"].as_str().filter(|n| !n.is_empty());
            let (resources, paths) = app.store.read(|s| authz::rules_for(s, identity, namespace));
            json!({"resourceRules": resources, "nonResourceRules": paths, "incomplete": false})
        }
        _ => return Err(ApiError::no_route()),
    };
    let mut answer = json!({
        "kind": rt.kind,
        "apiVersion": rt.api_version(),
        "metadata": {"creationTimestamp": null},
        "status": status,
    });
    if rt.kind != "SelfSubjectReview" {
        answer["spec"] = spec.clone();
    }
    Ok(json_response(StatusCode::CREATED, &answer))
}

/// Whom a SubjectAccessReview asks about: `spec.user` and `spec.groups`.
fn subject_of(spec: &Value) -> Result<authz::Identity, ApiError> {
    let user = spec["user"].as_str().unwrap_or_default();
    let groups: Vec<String> = spec["groups"]
        .as_array()
        .into_iter()
        .flatten()
        .filter_map(Value::as_str)
        .map(str::to_owned)
        .collect();
    if user.is_empty() && groups.is_empty() {
        return Err(ApiError::invalid(
            "SubjectAccessReview",
            "authorization.k8s.io",
            "",
            &[FieldError::invalid(
                "spec.user",
                &json!(""),
                "at least one of user or groups must be specified",
            )],
        ));
    }
    let mut subject = authz::User::new(user, groups);
    // Only what the request says: not `system:authenticated` unless listed.
    subject.groups = spec["groups"]
        .as_array()
        .into_iter()
        .flatten()
        .filter_map(Value::as_str)
        .map(str::to_owned)
        .collect();
    Ok(authz::Identity::User(subject))
}

/// What a SelfSubjectAccessReview asks: exactly one of a resource request
/// and a path request. Empty strings mean "none" (all namespaces, no name).
fn access_request(spec: &Value) -> Result<Review<'_>, ApiError> {
    fn text<'v>(v: &'v Value, field: &str) -> Option<&'v str> {
        v[field].as_str().filter(|s| !s.is_empty())
    }
    let (resource, path) = (&spec["resourceAttributes"], &spec["nonResourceAttributes"]);
    match (resource.is_object(), path.is_object()) {
        (true, false) => Ok(Review::Resource(Attributes {
            verb: text(resource, "verb").unwrap_or_default(),
            group: text(resource, "group").unwrap_or_default(),
            resource: text(resource, "resource").unwrap_or_default(),
            subresource: text(resource, "subresource"),
            namespace: text(resource, "namespace"),
            name: text(resource, "name"),
        })),
        (false, true) => Ok(Review::Path(PathAttributes {
            verb: text(path, "verb").unwrap_or_default(),
            path: text(path, "path").unwrap_or_default(),
        })),
        _ => Err(ApiError::invalid(
            "SelfSubjectAccessReview",
            "authorization.k8s.io",
            "",
            &[FieldError::invalid(
                "spec.resourceAttributes",
                resource,
                "exactly one of nonResourceAttributes or resourceAttributes must be specified",
            )],
        )),
    }
}
