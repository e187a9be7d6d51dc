//! Errors: the Kubernetes `Status` answers the HTTP layer sends, the
//! crate-level error for starting and stopping the server, and the store's
//! failure to commit. It imports nothing of this crate: every layer uses it.

use axum::http::StatusCode;
use axum::response::{IntoResponse, Response};
use serde_json::{json, Value};

/// An API error answered to the client as a `metav1.Status` object.
#[derive(Debug, Clone)]
pub struct ApiError {
    pub code: StatusCode,
    pub reason: &'static str,
    pub message: String,
    pub details: Option<Value>,
}

impl ApiError {
    pub fn new(code: StatusCode, reason: &'static str, message: impl Into<String>) -> Self {
        ApiError {
            code,
            reason,
            message: message.into(),
            details: None,
        }
    }

    pub fn with_details(mut self, details: Value) -> Self {
        self.details = Some(details);
        self
    }

    pub fn not_found(qualified: &str, name: &str) -> Self {
        Self::new(
            StatusCode::NOT_FOUND,
            "NotFound",
            format!("{qualified} \"{name}\" not found"),
        )
        .with_details(json!({ "name": name, "kind": kind_of(qualified), "group": group_of(qualified) }))
    }

    /// The answer for a path no resource is served at.
    pub fn no_route() -> Self {
        Self::new(
            StatusCode::NOT_FOUND,
            "NotFound",
            "the server could not find the requested resource",
        )
    }

    pub fn already_exists(qualified: &str, name: &str) -> Self {
        Self::new(
            StatusCode::CONFLICT,
            "AlreadyExists",
            format!("{qualified} \"{name}\" already exists"),
        )
        .with_details(json!({ "name": name, "kind": kind_of(qualified), "group": group_of(qualified) }))
    }

    pub fn conflict(qualified: &str, name: &str) -> Self {
        Self::new(
            StatusCode::CONFLICT,
            "Conflict",
            format!(
                "Operation cannot be fulfilled on {qualified} \"{name}\": the object has been modified; please apply your changes to the latest version and try again"
            ),
        )
        .with_details(json!({ "name": name, "kind": kind_of(qualified), "group": group_of(qualified) }))
    }

    pub fn bad_request(message: impl Into<String>) -> Self {
        Self::new(StatusCode::BAD_REQUEST, "BadRequest", message)
    }

    pub fn gone(message: impl Into<String>) -> Self {
        Self::new(StatusCode::GONE, "Expired", message)
    }

    pub fn method_not_allowed() -> Self {
        Self::new(
            StatusCode::METHOD_NOT_ALLOWED,
            "MethodNotAllowed",
            "the server does not allow this method on the requested resource",
        )
    }

    pub fn unsupported_media_type(message: impl Into<String>) -> Self {
        Self::new(
            StatusCode::UNSUPPORTED_MEDIA_TYPE,
            "UnsupportedMediaType",
            message,
        )
    }

    pub fn unauthorized() -> Self {
        Self::new(StatusCode::UNAUTHORIZED, "Unauthorized", "Unauthorized")
    }

    pub fn too_large(limit: usize) -> Self {
        Self::new(
            StatusCode::PAYLOAD_TOO_LARGE,
            "RequestEntityTooLarge",
            format!("Request entity too large: limit is {limit}"),
        )
    }

    /// A body that did not arrive in time (408, as Go's server answers).
    pub fn body_timeout(limit: std::time::Duration) -> Self {
        Self::new(
            StatusCode::REQUEST_TIMEOUT,
            "Timeout",
            format!("the request body did not arrive within {} s", limit.as_secs()),
        )
    }

    pub fn internal(message: impl Into<String>) -> Self {
        Self::new(StatusCode::INTERNAL_SERVER_ERROR, "InternalError", message)
    }

    /// A watch from a resourceVersion this server never reached: it cannot
    /// be served, so the client must list again.
    pub fn version_too_new(rv: u64, newest: u64) -> Self {
        Self::gone(format!(
            "resource version {rv} is newer than this server's ({newest}); list again"
        ))
    }

    /// 422 Invalid with one cause per offending field, as the real server lists them.
    pub fn invalid(kind: &str, group: &str, name: &str, causes: &[FieldError]) -> Self {
        let qualified = if group.is_empty() {
            kind.to_string()
        } else {
            format!("{kind}.{group}")
        };
        let list: Vec<String> = causes.iter().map(|c| c.to_string()).collect();
        let message = if list.len() == 1 {
            format!("{qualified} \"{name}\" is invalid: {}", list[0])
        } else {
            format!("{qualified} \"{name}\" is invalid: [{}]", list.join(", "))
        };
        let causes: Vec<Value> = causes
            .iter()
            .map(|c| json!({ "reason": c.reason, "message": c.to_string(), "field": c.field }))
            .collect();
        Self::new(StatusCode::UNPROCESSABLE_ENTITY, "Invalid", message)
            .with_details(json!({ "name": name, "group": group, "kind": kind, "causes": causes }))
    }

    pub fn to_status(&self) -> Value {
        let mut status = json!({
            "kind": "Status",
            "apiVersion": "v1",
            "metadata": {},
            "status": "Failure",
            "message": self.message,
            "reason": self.reason,
            "code": self.code.as_u16(),
        });
        if let Some(details) = &self.details {
            status["details"] = details.clone();
        }
        status
    }
}

fn kind_of(qualified: &str) -> &str {
    qualified.split('.').next().unwrap_or(qualified)
}

fn group_of(qualified: &str) -> &str {
    qualified.split_once('.').map(|(_, g)| g).unwrap_or("")
}

impl IntoResponse for ApiError {
    fn into_response(self) -> Response {
        let body = serde_json::to_vec(&self.to_status()).unwrap_or_default();
        (
            self.code,
            [(axum::http::header::CONTENT_TYPE, "application/json")],
            body,
        )
            .into_response()
    }
}

/// One field-level validation failure, rendered like apimachinery's `field.Error`.
#[derive(Debug, Clone, PartialEq)]
pub struct FieldError {
    /// `FieldValueInvalid`, `FieldValueRequired`, `FieldValueNotSupported`, ...
    pub reason: &'static str,
    pub field: String,
    pub detail: String,
}

impl FieldError {
    pub fn invalid(field: &str, value: &Value, detail: impl Into<String>) -> Self {
        FieldError {
            reason: "FieldValueInvalid",
            field: field.to_string(),
            detail: format!("Invalid value: {}: {}", short_value(value), detail.into()),
        }
    }

    pub fn required(field: &str) -> Self {
        FieldError {
            reason: "FieldValueRequired",
            field: field.to_string(),
            detail: "Required value".to_string(),
        }
    }

    pub fn not_supported(field: &str, value: &Value, allowed: &[Value]) -> Self {
        let allowed: Vec<String> = allowed.iter().map(|v| v.to_string()).collect();
        FieldError {
            reason: "FieldValueNotSupported",
            field: field.to_string(),
            detail: format!(
                "Unsupported value: {}: supported values: {}",
                short_value(value),
                allowed.join(", ")
            ),
        }
    }
}

impl std::fmt::Display for FieldError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "{}: {}", self.field, self.detail)
    }
}

fn short_value(value: &Value) -> String {
    match value {
        Value::Object(_) => "\"object\"".to_string(),
        Value::Array(_) => "\"array\"".to_string(),
        other => other.to_string(),
    }
}

/// Errors of starting, running and stopping the server.
#[derive(Debug, thiserror::Error)]
pub enum Error {
    #[error("cannot bind {addr}: {source}")]
    Bind {
        addr: std::net::SocketAddr,
        source: std::io::Error,
    },
    #[error("storage {path}: {message}")]
    Storage { path: String, message: String },
    #[error("TLS: {0}")]
    Tls(String),
    #[error("kubeconfig: {0}")]
    Kubeconfig(String),
    #[error("kube client: {0}")]
    Client(#[from] kube::Error),
    #[error("io: {0}")]
    Io(#[from] std::io::Error),
}

pub type Result<T, E = Error> = std::result::Result<T, E>;

/// A request saw a change that storage then lost (see
/// [`crate::store::Store::settle`]).
#[derive(Debug, Clone, thiserror::Error)]
#[error("storage failed to commit a change this request depends on: {0}")]
pub struct NotStored(pub std::sync::Arc<str>);

impl From<NotStored> for ApiError {
    fn from(e: NotStored) -> Self {
        ApiError::internal(e.to_string())
    }
}
