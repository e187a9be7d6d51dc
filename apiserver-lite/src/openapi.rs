//! Just enough OpenAPI for kubectl: every served kind with its
//! group/version/kind extension and its write operations' query parameters
//! (kubectl checks `fieldValidation` there before asking the server to
//! validate), and a custom resource's schema for `kubectl explain`.

use serde_json::{json, Map, Value};

use crate::resources::{Registry, ResourceType};

/// gnostic's `openapi_v2.Document` with field 1 (`swagger`) set to "2.0".
pub const V2_PROTOBUF_MINIMAL: &[u8] = &[0x0a, 0x03, b'2', b'.', b'0'];

fn definition_name(rt: &ResourceType) -> String {
    let group: Vec<&str> = if rt.group.is_empty() {
        vec!["io", "k8s", "api", "core"]
    } else {
        rt.group.split('.').rev().collect()
    };
    format!("{}.{}.{}", group.join("."), rt.version, rt.kind)
}

fn gvk(rt: &ResourceType) -> Value {
    json!({"group": rt.group, "version": rt.version, "kind": rt.kind})
}

fn prefix(rt: &ResourceType) -> String {
    if rt.group.is_empty() {
        format!("/api/{}", rt.version)
    } else {
        format!("/apis/{}/{}", rt.group, rt.version)
    }
}

fn param(name: &str, v3: bool) -> Value {
    if v3 {
        json!({"name": name, "in": "query", "schema": {"type": "string", "uniqueItems": true}})
    } else {
        json!({"name": name, "in": "query", "type": "string", "uniqueItems": true})
    }
}

fn op(rt: &ResourceType, action: &str, params: &[&str], v3: bool) -> Value {
    let parameters: Vec<Value> = params.iter().map(|p| param(p, v3)).collect();
    json!({
        "operationId": format!("{action}{}", rt.kind),
        "x-kubernetes-action": action,
        "x-kubernetes-group-version-kind": gvk(rt),
        "parameters": parameters,
        "responses": {"200": {"description": "OK"}},
    })
}

fn paths(rts: &[std::sync::Arc<ResourceType>], v3: bool) -> Value {
    let mut paths = Map::new();
    for rt in rts {
        let base = if rt.namespaced {
            format!("{}/namespaces/{{namespace}}/{}", prefix(rt), rt.plural)
        } else {
            format!("{}/{}", prefix(rt), rt.plural)
        };
        let write = ["dryRun", "fieldManager", "fieldValidation"];
        if rt.review {
            paths.insert(base, json!({"post": op(rt, "post", &write, v3)}));
            continue;
        }
        paths.insert(base.clone(), json!({
            "get": op(rt, "list", &["labelSelector", "fieldSelector", "limit", "continue", "watch", "resourceVersion"], v3),
            "post": op(rt, "post", &write, v3),
            "delete": op(rt, "deletecollection", &["labelSelector", "fieldSelector"], v3),
        }));
        paths.insert(
            format!("{base}/{{name}}"),
            json!({
                "get": op(rt, "get", &[], v3),
                "put": op(rt, "put", &write, v3),
                "patch": op(rt, "patch", &["dryRun", "fieldManager", "fieldValidation", "force"], v3),
                "delete": op(rt, "delete", &["dryRun", "gracePeriodSeconds", "propagationPolicy"], v3),
            }),
        );
        if rt.status_subresource {
            paths.insert(
                format!("{base}/{{name}}/status"),
                json!({
                    "get": op(rt, "get", &[], v3),
                    "put": op(rt, "put", &write, v3),
                    "patch": op(rt, "patch", &["dryRun", "fieldManager", "fieldValidation", "force"], v3),
                }),
            );
        }
    }
    Value::Object(paths)
}

fn schema_of(rt: &ResourceType, v3: bool) -> Value {
    let mut s = match (&rt.schema, v3) {
        (Some(schema), true) => schema.clone(),
        _ => json!({"type": "object", "x-kubernetes-preserve-unknown-fields": true}),
    };
    s["x-kubernetes-group-version-kind"] = json!([gvk(rt)]);
    if v3 {
        if let Some(props) = s.get_mut("properties").and_then(|p| p.as_object_mut()) {
            props.insert("apiVersion".into(), json!({"type": "string", "description": "APIVersion defines the versioned schema of this representation of an object."}));
            props.insert("kind".into(), json!({"type": "string", "description": "Kind is a string value representing the REST resource this object represents."}));
            props.insert(
                "metadata".into(),
                json!({"type": "object", "description": "Standard object's metadata."}),
            );
        }
    } else if let Some(m) = s.as_object_mut() {
        // Swagger 2.0 has no such extension; kubectl's client-side
        // validation must accept whatever the server will accept.
        m.remove("x-kubernetes-preserve-unknown-fields");
    }
    s
}

pub fn v2(reg: &Registry) -> Value {
    let all = reg.all();
    let mut defs = Map::new();
    for rt in &all {
        defs.insert(definition_name(rt), schema_of(rt, false));
    }
    json!({
        "swagger": "2.0",
        "info": {"title": "Kubernetes", "version": "v1.32.0"},
        "paths": paths(&all, false),
        "definitions": defs,
    })
}

fn gv_path(rt: &ResourceType) -> String {
    prefix(rt).trim_start_matches('/').to_string()
}

pub fn v3_root(reg: &Registry) -> Value {
    let mut paths = Map::new();
    for rt in reg.all() {
        let p = gv_path(&rt);
        paths.insert(
            p.clone(),
            json!({"serverRelativeURL": format!("/openapi/v3/{p}")}),
        );
    }
    json!({"paths": paths})
}

pub fn v3_doc(reg: &Registry, gv: &str) -> Option<Value> {
    let rts: Vec<_> = reg.all().into_iter().filter(|rt| gv_path(rt) == gv).collect();
    if rts.is_empty() {
        return None;
    }
    let mut schemas = Map::new();
    for rt in &rts {
        schemas.insert(definition_name(rt), schema_of(rt, true));
    }
    Some(json!({
        "openapi": "3.0.0",
        "info": {"title": "Kubernetes", "version": "v1.32.0"},
        "paths": paths(&rts, true),
        "components": {"schemas": schemas},
    }))
}
