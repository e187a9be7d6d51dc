//! What every object's metadata holds, read and stamped the way the real
//! server does. It imports nothing of this crate but its error types, so
//! that the store, the resource registry and the write path can all use it.

use serde_json::{json, Value};

use crate::error::FieldError;

/// A string field of `obj`'s metadata (`name`, `namespace`, `uid`, ...),
/// empty when absent.
pub fn meta_str<'a>(obj: &'a Value, key: &str) -> &'a str {
    obj["metadata"][key].as_str().unwrap_or_default()
}

/// The time now as metadata and conditions carry it (RFC 3339, seconds).
pub fn now() -> String {
    jiff::Timestamp::now().strftime("%Y-%m-%dT%H:%M:%SZ").to_string()
}

/// What is wrong with an object's name, if anything. RBAC objects are
/// named by path segment (`system:aggregate-to-view`), everything else by
/// DNS subdomain, as on a real server.
pub fn name_problem(group: &str, name: &str) -> Option<FieldError> {
    if name.is_empty() {
        return Some(FieldError::required("metadata.name"));
    }
    let (valid, rule) = if group == "rbac.authorization.k8s.io" {
        let valid = !matches!(name, "." | "..") && !name.contains(['/', '%']);
        (valid, "may not be '.' or '..', and may not contain '/' or '%'")
    } else {
        let valid = name.len() <= 253
            && name
                .chars()
                .all(|c| c.is_ascii_lowercase() || c.is_ascii_digit() || c == '-' || c == '.')
            && name.starts_with(|c: char| c.is_ascii_alphanumeric())
            && name.ends_with(|c: char| c.is_ascii_alphanumeric());
        (valid, "a lowercase RFC 1123 subdomain must consist of lower case alphanumeric characters, '-' or '.', and must start and end with an alphanumeric character")
    };
    (!valid).then(|| FieldError::invalid("metadata.name", &json!(name), rule))
}
