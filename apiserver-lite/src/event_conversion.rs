//! core/v1 Events and events.k8s.io/v1 Events are one resource on a real API
//! server: an Event written through either API is read through both. kube-rs
//! records Events through events.k8s.io/v1 while `kubectl describe` reads
//! core/v1, so here both are stored as events.k8s.io/v1 and core/v1 is
//! converted field by field, the way the real server's conversion does.
//! (The core/v1 Events that earlier versions stored apart are moved by
//! [`crate::persist::migrate_core_events`].)

use serde_json::{Map, Value};

/// The apiVersion Events are stored under.
pub const STORED_API_VERSION: &str = "events.k8s.io/v1";

/// The storage key (`plural.group`) both Event APIs share.
pub const STORED_RESOURCE: &str = "events.events.k8s.io";

/// `(events.k8s.io/v1 name, core/v1 name)` of the fields whose names differ;
/// every other field has the same name in both.
const RENAMED: &[(&str, &str)] = &[
    ("regarding", "involvedObject"),
    ("note", "message"),
    ("reportingController", "reportingComponent"),
    ("deprecatedSource", "source"),
    ("deprecatedFirstTimestamp", "firstTimestamp"),
    ("deprecatedLastTimestamp", "lastTimestamp"),
    ("deprecatedCount", "count"),
];

/// A stored (events.k8s.io/v1) Event as core/v1 serves it.
pub fn to_core(stored: &Value) -> Value {
    rename(stored, "v1", RENAMED.iter().copied())
}

/// A core/v1 Event as it is stored (events.k8s.io/v1).
pub fn from_core(core: &Value) -> Value {
    rename(
        core,
        STORED_API_VERSION,
        RENAMED.iter().map(|&(events, core)| (core, events)),
    )
}

/// Copies `obj` into `api_version` with each field renamed as `renames`
/// says (`(from, to)` pairs). A field that carries a target name already is
/// not a field of the source version, so it is dropped (the real server
/// prunes unknown fields): that keeps the two conversions inverse for
/// Events of the stored version.
fn rename(
    obj: &Value,
    api_version: &str,
    renames: impl Iterator<Item = (&'static str, &'static str)>,
) -> Value {
    let Some(fields) = obj.as_object() else {
        return obj.clone();
    };
    let renames: Vec<(&str, &str)> = renames.collect();
    let mut out = Map::with_capacity(fields.len());
    for (key, value) in fields {
        if renames.iter().any(|(_, to)| to == key) {
            continue;
        }
        let key = renames
            .iter()
            .find(|(from, _)| from == key)
            .map_or(key.as_str(), |(_, to)| to);
        out.insert(key.to_owned(), value.clone());
    }
    out.insert("apiVersion".to_owned(), Value::String(api_version.to_owned()));
    Value::Object(out)
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    fn recorded() -> Value {
        json!({
            "apiVersion": "events.k8s.io/v1",
            "kind": "Event",
            "metadata": {"name": "t.1", "namespace": "default"},
            "eventTime": "2026-01-01T00:00:00.000000Z",
            "type": "Warning",
            "reason": "TimedOut",
            "action": "Reconcile",
            "note": "attempt 1 failed",
            "regarding": {"kind": "Task", "name": "t", "namespace": "default", "uid": "u1"},
            "reportingController": "k8s4r-manager",
            "reportingInstance": "m-1",
            "series": {"count": 2, "lastObservedTime": "2026-01-01T00:00:05.000000Z"}
        })
    }

    #[test]
    fn core_reads_the_fields_kubectl_describe_prints() {
        let core = to_core(&recorded());
        assert_eq!(core["apiVersion"], "v1");
        assert_eq!(core["involvedObject"]["uid"], "u1");
        assert_eq!(core["message"], "attempt 1 failed");
        assert_eq!(core["reportingComponent"], "k8s4r-manager");
        assert_eq!(core["reason"], "TimedOut");
        assert_eq!(core["series"]["count"], 2);
        assert!(core.get("note").is_none() && core.get("regarding").is_none());
    }

    #[test]
    fn the_conversions_are_inverse() {
        assert_eq!(from_core(&to_core(&recorded())), recorded());
        let core = json!({"apiVersion": "v1", "message": "m", "count": 3, "source": {"component": "c"}, "firstTimestamp": "x"});
        assert_eq!(to_core(&from_core(&core)), core);
    }

    #[test]
    fn a_field_of_the_other_version_is_dropped() {
        let core = json!({"message": "kept", "note": "not a core/v1 field"});
        assert_eq!(
            from_core(&core),
            json!({"apiVersion": STORED_API_VERSION, "note": "kept"})
        );
    }
}
