//! What every object's metadata holds, read and stamped the way the real
//! server does. It imports nothing of this crate, so that the store, the
//! resource registry and the write path can all use it.

use serde_json::Value;

/// A string field of `obj`'s metadata (`name`, `namespace`, `uid`, ...),
/// empty when absent.
pub fn meta_str<'a>(obj: &'a Value, key: &str) -> &'a str {
    obj["metadata"][key].as_str().unwrap_or_default()
}

/// The time now as metadata and conditions carry it (RFC 3339, seconds).
pub fn now() -> String {
    jiff::Timestamp::now().strftime("%Y-%m-%dT%H:%M:%SZ").to_string()
}
