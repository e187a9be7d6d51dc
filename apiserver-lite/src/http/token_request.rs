//! TokenRequest, the `token` subresource of a ServiceAccount (`kubectl
//! create token`): a bound, expiring token for the ServiceAccount, signed
//! by [`crate::service_account_tokens`] and accepted by this server until it
//! expires or the ServiceAccount is gone. Nothing is stored.

use axum::http::StatusCode;
use axum::response::Response;
use serde_json::{json, Value};

use super::objects::decode_kind;
use super::response::json_response;
use super::Call;
use crate::error::{ApiError, FieldError};
use crate::service_account_tokens::{self as tokens, Grant};

const API_VERSION: &str = "authentication.k8s.io/v1";
const KIND: &str = "TokenRequest";

pub(super) fn create(call: &Call<'_>, name: &str) -> Result<Response, ApiError> {
    let ns = call.path.namespace.unwrap_or_default();
    let request = decode_kind(&call.body, call.headers, (API_VERSION, KIND))?;
    for (field, want) in [("apiVersion", API_VERSION), ("kind", KIND)] {
        if request[field].as_str().is_some_and(|v| v != want) {
            return Err(ApiError::bad_request(format!(
                "the body of the request must be a {API_VERSION} {KIND}, not {field} {}",
                request[field]
            )));
        }
    }
    let spec = &request["spec"];
    let invalid = |field: &str, value: &Value, why: String| {
        ApiError::invalid(
            KIND,
            "authentication.k8s.io",
            name,
            &[FieldError::invalid(field, value, why)],
        )
    };
    let requested = &spec["expirationSeconds"];
    let lifetime = match requested {
        Value::Null => tokens::lifetime(None),
        v => tokens::lifetime(Some(v.as_i64().ok_or_else(|| {
            invalid("spec.expirationSeconds", v, "must be a number of seconds".into())
        })?)),
    }
    .map_err(|why| invalid("spec.expirationSeconds", requested, why))?;
    if !spec["boundObjectRef"].is_null() {
        return Err(invalid(
            "spec.boundObjectRef",
            &spec["boundObjectRef"],
            "this server binds tokens to their ServiceAccount only".into(),
        ));
    }
    let mut audiences: Vec<String> = spec["audiences"]
        .as_array()
        .into_iter()
        .flatten()
        .filter_map(Value::as_str)
        .map(str::to_owned)
        .collect();
    if audiences.is_empty() {
        audiences.push(tokens::AUDIENCE.to_owned());
    }
    let account = call
        .app
        .store
        .read(|s| s.get("serviceaccounts", ns, name))
        .ok_or_else(|| ApiError::not_found("serviceaccounts", name))?;
    let now = jiff::Timestamp::now().as_second();
    let grant = Grant {
        namespace: ns.to_owned(),
        name: name.to_owned(),
        uid: account["metadata"]["uid"].as_str().unwrap_or_default().to_owned(),
        audiences,
        issued_at: now,
        expires_at: now + lifetime,
    };
    let expires = jiff::Timestamp::from_second(grant.expires_at)
        .map_err(|e| ApiError::bad_request(format!("spec.expirationSeconds: {e}")))?;
    let token = call.app.auth.signer().issue(&grant);
    let answer = json!({
        "kind": KIND,
        "apiVersion": API_VERSION,
        "metadata": {"name": name, "namespace": ns, "creationTimestamp": null},
        "spec": {"audiences": grant.audiences, "expirationSeconds": lifetime, "boundObjectRef": null},
        "status": {"token": token, "expirationTimestamp": expires.to_string()},
    });
    Ok(json_response(StatusCode::CREATED, &answer))
}
