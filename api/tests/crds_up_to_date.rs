//! The committed CRD YAML must be what the types generate: a field added to a
//! type without regenerating fails here (and in CI).
#![cfg(feature = "kube")]

use k8s4r_api::crd::{crds, to_yaml};

#[test]
fn committed_crds_match_the_types() {
    let dir = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("../deploy/crds");
    for (file, crd) in crds() {
        let generated = to_yaml(&crd).expect("render CRD");
        let committed = std::fs::read_to_string(dir.join(file))
            .unwrap_or_else(|e| panic!("deploy/crds/{file} is missing ({e}); run `cargo run -p k8s4r-api --features kube --bin crdgen`"));
        assert!(
            committed == generated,
            "deploy/crds/{file} differs from the Rust types; run `cargo run -p k8s4r-api --features kube --bin crdgen`"
        );
    }
}

#[test]
fn crds_are_structural_and_complete() {
    for (file, crd) in crds() {
        let names = &crd.spec.names;
        assert_eq!(crd.spec.group, "robot.k8s4r.io", "{file}");
        assert_eq!(
            names.categories.as_deref(),
            Some(&["k8s4r".to_string()][..]),
            "{file}"
        );
        assert!(
            names.short_names.as_ref().is_some_and(|s| !s.is_empty()),
            "{file}"
        );
        let version = &crd.spec.versions[0];
        assert_eq!(version.name, "v1alpha1");
        assert!(
            version
                .subresources
                .as_ref()
                .and_then(|s| s.status.as_ref())
                .is_some(),
            "{file}: status subresource"
        );
        assert!(
            version
                .additional_printer_columns
                .as_ref()
                .is_some_and(|c| c.len() >= 4),
            "{file}: printer columns"
        );
        let schema = serde_json::to_string(&version.schema).unwrap();
        // allOf/oneOf at the top of a property make a schema non-structural,
        // which a real API server refuses.
        assert!(!schema.contains("\"$ref\""), "{file}: unresolved $ref");
        assert!(!schema.contains("\"allOf\""), "{file}: allOf is not structural");
    }
}

#[test]
fn every_field_has_a_description() {
    fn walk(path: &str, schema: &serde_json::Value, missing: &mut Vec<String>) {
        if let Some(props) = schema.get("properties").and_then(|p| p.as_object()) {
            for (name, sub) in props {
                let p = format!("{path}.{name}");
                if !path.is_empty()
                    && !["apiVersion", "kind", "metadata"].contains(&name.as_str())
                    && sub.get("description").is_none()
                {
                    missing.push(p.clone());
                }
                walk(&p, sub, missing);
            }
        }
        if let Some(items) = schema.get("items") {
            walk(&format!("{path}[]"), items, missing);
        }
        if let Some(extra) = schema.get("additionalProperties").filter(|v| v.is_object()) {
            walk(&format!("{path}{{}}"), extra, missing);
        }
    }
    for (file, crd) in crds() {
        let schema = serde_json::to_value(&crd.spec.versions[0].schema).unwrap();
        let mut missing = Vec::new();
        walk("", &schema["openAPIV3Schema"], &mut missing);
        assert!(
            missing.is_empty(),
            "{file}: fields without a doc comment: {missing:?}"
        );
    }
}

/// Every description `kubectl explain` shows is for a person: a Rust doc
/// comment's intra-doc link (``[`Type::item`]``) has no meaning there.
#[test]
fn descriptions_carry_no_rust_doc_links() {
    fn walk(value: &serde_json::Value, path: &str, found: &mut Vec<String>) {
        match value {
            serde_json::Value::Object(map) => {
                for (key, v) in map {
                    let here = format!("{path}.{key}");
                    if key == "description" {
                        if let Some(text) = v.as_str().filter(|t| t.contains("[`") || t.contains("`]")) {
                            found.push(format!("{here}: {text}"));
                        }
                    }
                    walk(v, &here, found);
                }
            }
            serde_json::Value::Array(items) => {
                for (i, v) in items.iter().enumerate() {
                    walk(v, &format!("{path}[{i}]"), found);
                }
            }
            _ => {}
        }
    }
    let mut found = Vec::new();
    for (file, crd) in crds() {
        let value = serde_json::to_value(&crd).expect("CRD as JSON");
        walk(&value, file, &mut found);
    }
    assert!(
        found.is_empty(),
        "Rust doc links in CRD descriptions:\n{}",
        found.join("\n")
    );
}
