//! Merge-patch bodies guarded by a `resourceVersion`: the API server applies
//! one only to the version the decision was made on, and answers 409 to
//! anything newer, so a decision never lands on an object it did not see.

use serde::Serialize;

/// A merge-patch body: `metadata` (the guard, and any metadata fields)
/// beside one top-level part such as `status` or `spec`.
#[derive(Debug, Serialize)]
pub struct Guarded<'a, M: Serialize, B: Serialize> {
    metadata: Metadata<'a, M>,
    #[serde(flatten)]
    body: B,
}

#[derive(Debug, Serialize)]
#[serde(rename_all = "camelCase")]
struct Metadata<'a, M: Serialize> {
    #[serde(skip_serializing_if = "Option::is_none")]
    resource_version: Option<&'a str>,
    #[serde(flatten)]
    fields: M,
}

/// `{"status": ...}`.
#[derive(Debug, Serialize)]
pub struct Status<'a, S: Serialize> {
    status: &'a S,
}

/// `{"spec": ...}`.
#[derive(Debug, Serialize)]
pub struct Spec<'a, S: Serialize> {
    spec: &'a S,
}

impl<'a, S: Serialize> Guarded<'a, (), Status<'a, S>> {
    /// The status, guarded by `resource_version` when given.
    pub fn status(resource_version: Option<&'a str>, status: &'a S) -> Self {
        Self::new(resource_version, (), Status { status })
    }
}

impl<'a, S: Serialize> Guarded<'a, (), Spec<'a, S>> {
    /// Spec fields, guarded by `resource_version` when given.
    pub fn spec(resource_version: Option<&'a str>, spec: &'a S) -> Self {
        Self::new(resource_version, (), Spec { spec })
    }
}

impl<'a, M: Serialize> Guarded<'a, M, ()> {
    /// Metadata fields (labels, annotations, finalizers), guarded by
    /// `resource_version` when given.
    pub fn metadata(resource_version: Option<&'a str>, fields: M) -> Self {
        Self::new(resource_version, fields, ())
    }
}

impl<'a, M: Serialize, B: Serialize> Guarded<'a, M, B> {
    /// Any combination of metadata fields and body.
    pub fn new(resource_version: Option<&'a str>, fields: M, body: B) -> Self {
        Self {
            metadata: Metadata {
                resource_version,
                fields,
            },
            body,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::collections::BTreeMap;

    #[derive(Debug, Serialize)]
    #[serde(rename_all = "camelCase")]
    struct Heartbeat {
        last_heartbeat_time: &'static str,
    }

    #[derive(Debug, Serialize)]
    struct Labels {
        labels: BTreeMap<&'static str, Option<&'static str>>,
    }

    fn json<T: Serialize>(v: &T) -> String {
        serde_json::to_string(v).unwrap()
    }

    #[test]
    fn bodies_carry_the_resource_version_beside_what_they_change() {
        let status = Heartbeat {
            last_heartbeat_time: "2026-11-22T10:00:00Z",
        };
        assert_eq!(
            json(&Guarded::status(Some("42"), &status)),
            r#"{"metadata":{"resourceVersion":"42"},"status":{"lastHeartbeatTime":"2026-11-22T10:00:00Z"}}"#
        );
        assert_eq!(
            json(&Guarded::status(None, &status)),
            r#"{"metadata":{},"status":{"lastHeartbeatTime":"2026-11-22T10:00:00Z"}}"#,
            "unguarded: merges over whatever version is there"
        );
        let labels = Labels {
            labels: [("gone", None)].into(),
        };
        assert_eq!(
            json(&Guarded::metadata(Some("7"), labels)),
            r#"{"metadata":{"resourceVersion":"7","labels":{"gone":null}}}"#
        );
        assert_eq!(
            json(&Guarded::spec(
                Some("9"),
                &BTreeMap::from([("targetRobot", "r1")])
            )),
            r#"{"metadata":{"resourceVersion":"9"},"spec":{"targetRobot":"r1"}}"#
        );
    }
}
