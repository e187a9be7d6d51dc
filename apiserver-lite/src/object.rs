//! One stored object, kept as the JSON it is stored, served and watched as.
//!
//! A parsed `serde_json::Value` takes several times the memory of its JSON
//! (every map is a B-tree node of its own), and the store holds every
//! object plus a long history of changes. So an object is kept as its
//! bytes: one allocation, shared by the store, its history, storage and
//! every reader, written to clients as it is. The tree is parsed when a
//! write or a selector needs it. The few kinds the server itself reads on
//! every request (RBAC for authorization, namespaces, CRDs) keep their
//! tree as well.

use std::sync::Arc;

use serde::Deserialize;
use serde_json::{json, Value};

/// The group-resources whose objects keep their parsed tree.
const KEPT_PARSED: &[&str] = &[
    "namespaces",
    "clusterroles.rbac.authorization.k8s.io",
    "clusterrolebindings.rbac.authorization.k8s.io",
    "roles.rbac.authorization.k8s.io",
    "rolebindings.rbac.authorization.k8s.io",
    crate::resources::CRD_RESOURCE,
];

#[derive(Debug, Clone)]
pub struct Object {
    json: Arc<[u8]>,
    tree: Option<Arc<Value>>,
}

impl Object {
    /// `value` serialized once. The tree comes along (a writer usually
    /// goes on to use it); [`Object::stored`] is what the store keeps.
    pub fn new(value: impl Into<Arc<Value>>) -> Object {
        let value = value.into();
        let json = serde_json::to_vec(&*value).unwrap_or_default().into();
        Object {
            json,
            tree: Some(value),
        }
    }

    /// The copy the store keeps of an object of `gr`: bytes only, unless
    /// the server reads objects of `gr` on every request.
    pub fn stored(&self, gr: &str) -> Object {
        Object {
            json: self.json.clone(),
            tree: if KEPT_PARSED.contains(&gr) {
                self.tree.clone().or_else(|| Some(Arc::new(self.parse())))
            } else {
                None
            },
        }
    }

    /// The object as JSON, as stored and served.
    pub fn json(&self) -> &Arc<[u8]> {
        &self.json
    }

    /// The object's tree: kept, or parsed now.
    pub fn value(&self) -> Arc<Value> {
        self.tree.clone().unwrap_or_else(|| Arc::new(self.parse()))
    }

    /// The kept tree of the kinds the server reads on every request.
    pub fn tree(&self) -> Option<&Value> {
        self.tree.as_deref()
    }

    fn parse(&self) -> Value {
        // The bytes were serialized from a Value: they always parse.
        serde_json::from_slice(&self.json).unwrap_or(Value::Null)
    }

    /// Its `apiVersion`, read without parsing the rest.
    pub fn api_version(&self) -> Option<String> {
        if let Some(tree) = &self.tree {
            return tree["apiVersion"].as_str().map(str::to_string);
        }
        // Keys are written in sorted order, so `apiVersion` usually comes
        // first: read it there when it holds no escapes, else parse.
        const KEY: &[u8] = br#"{"apiVersion":""#;
        if let Some(rest) = self.json.strip_prefix(KEY) {
            if let Some(end) = rest.iter().position(|b| *b == b'"' || *b == b'\\') {
                if rest[end] == b'"' {
                    return std::str::from_utf8(&rest[..end]).ok().map(str::to_string);
                }
            }
        }
        #[derive(Deserialize)]
        struct Head {
            #[serde(rename = "apiVersion")]
            api_version: Option<String>,
        }
        serde_json::from_slice::<Head>(&self.json).ok()?.api_version
    }

    /// The metadata the garbage collector reads (`{"metadata": {...}}`
    /// with the identity, owners, deletion and finalizers only), parsed
    /// without the rest of the object.
    pub fn ownership(&self) -> Value {
        #[derive(Deserialize)]
        struct Outer {
            #[serde(default)]
            metadata: Ownership,
        }
        #[derive(Deserialize, Default)]
        #[serde(rename_all = "camelCase")]
        struct Ownership {
            #[serde(default)]
            name: Value,
            #[serde(default)]
            namespace: Value,
            #[serde(default)]
            uid: Value,
            #[serde(default)]
            owner_references: Value,
            #[serde(default)]
            deletion_timestamp: Value,
            #[serde(default)]
            finalizers: Value,
        }
        let m = serde_json::from_slice::<Outer>(&self.json)
            .map(|o| o.metadata)
            .unwrap_or_default();
        let mut meta = json!({});
        for (key, value) in [
            ("name", m.name),
            ("namespace", m.namespace),
            ("uid", m.uid),
            ("ownerReferences", m.owner_references),
            ("deletionTimestamp", m.deletion_timestamp),
            ("finalizers", m.finalizers),
        ] {
            if !value.is_null() {
                meta[key] = value;
            }
        }
        json!({ "metadata": meta })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn task() -> Value {
        json!({
            "apiVersion": "k8s4r.io/v1alpha1", "kind": "Task",
            "metadata": {"name": "t", "namespace": "default", "uid": "u1",
                "ownerReferences": [{"uid": "owner", "kind": "Job", "name": "j"}],
                "labels": {"a": "b"}},
            "spec": {"command": "/bin/true", "nested": {"apiVersion": "not this one"}},
        })
    }

    #[test]
    fn a_stored_object_keeps_its_bytes_and_parses_to_the_same_tree() {
        let obj = Object::new(task()).stored("tasks.k8s4r.io");
        assert!(obj.tree().is_none());
        assert_eq!(*obj.value(), task());
        assert_eq!(obj.api_version().as_deref(), Some("k8s4r.io/v1alpha1"));
        assert_eq!(serde_json::from_slice::<Value>(obj.json()).unwrap(), task());
    }

    #[test]
    fn the_api_version_is_read_wherever_it_stands() {
        for (value, want) in [
            (json!({"apiVersion": "v1", "kind": "ConfigMap"}), Some("v1")),
            // A key that sorts first (ClusterRoles have one).
            (
                json!({"aggregationRule": {"apiVersion": "no"}, "apiVersion": "rbac/v1"}),
                Some("rbac/v1"),
            ),
            (json!({"apiVersion": "we\\ird\"v1"}), Some("we\\ird\"v1")),
            (json!({"kind": "NoVersion"}), None),
        ] {
            let obj = Object::new(value).stored("configmaps");
            assert_eq!(obj.api_version().as_deref(), want);
        }
    }

    #[test]
    fn the_kinds_read_on_every_request_keep_their_tree() {
        let role = json!({"apiVersion": "rbac.authorization.k8s.io/v1", "kind": "ClusterRole", "metadata": {"name": "r"}});
        let obj = Object::new(role.clone()).stored("clusterroles.rbac.authorization.k8s.io");
        assert_eq!(obj.tree(), Some(&role));
    }

    #[test]
    fn ownership_is_the_identity_owners_and_deletion_only() {
        let obj = Object::new(task()).stored("tasks.k8s4r.io");
        assert_eq!(
            obj.ownership(),
            json!({"metadata": {"name": "t", "namespace": "default", "uid": "u1",
                "ownerReferences": [{"uid": "owner", "kind": "Job", "name": "j"}]}})
        );
    }
}
