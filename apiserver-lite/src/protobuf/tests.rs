use std::collections::BTreeSet;

use serde_json::json;

use super::*;

/// Encodes and decodes `obj`, which must come back as it went.
fn round_trip(obj: &Value) {
    let bytes = encode(obj).unwrap_or_else(|e| panic!("encode {}: {e}", obj["kind"]));
    assert!(bytes.starts_with(MAGIC));
    let back = decode(&bytes, ("", "")).unwrap_or_else(|e| panic!("decode {}: {e}", obj["kind"]));
    assert_eq!(&back, obj, "{} changed on the way", obj["kind"]);
}

/// Object metadata with everything a stored object carries.
fn metadata(name: &str, namespace: Option<&str>) -> Value {
    let mut m = json!({
        "name": name,
        "uid": "0b7e7c3e-3c5a-4d0e-9a53-5d1c1d6a0e01",
        "resourceVersion": "42",
        "generation": 3,
        "creationTimestamp": "2026-11-23T11:52:36Z",
        "labels": {"app": "demo", "empty": ""},
        "annotations": {"note": "a b c"},
        "finalizers": ["demo.k8s4r.io/hold"],
        "ownerReferences": [{
            "apiVersion": "apps/v1", "kind": "Deployment", "name": "web",
            "uid": "1b7e7c3e-3c5a-4d0e-9a53-5d1c1d6a0e02", "controller": true, "blockOwnerDeletion": false,
        }],
        "managedFields": [{
            "manager": "kubectl-create", "operation": "Update", "apiVersion": "v1",
            "time": "2026-11-23T11:52:36Z", "fieldsType": "FieldsV1",
            "fieldsV1": {"f:data": {".": {}, "f:a": {}}},
        }],
    });
    if let Some(ns) = namespace {
        m["namespace"] = json!(ns);
    }
    m
}

fn object(api_version: &str, kind: &str, name: &str, namespace: Option<&str>) -> Value {
    json!({"apiVersion": api_version, "kind": kind, "metadata": metadata(name, namespace)})
}

fn with(mut obj: Value, fields: Value) -> Value {
    if let (Some(o), Value::Object(f)) = (obj.as_object_mut(), fields) {
        o.extend(f);
    }
    obj
}

#[test]
fn core_kinds_round_trip() {
    round_trip(&with(
        object("v1", "Namespace", "robots", None),
        json!({"spec": {"finalizers": ["kubernetes"]}, "status": {"phase": "Active"}}),
    ));
    round_trip(&with(
        object("v1", "ConfigMap", "cfg", Some("default")),
        json!({"data": {"a": "b", "empty": ""}, "binaryData": {"bin": "AAEC/w=="}, "immutable": false}),
    ));
    round_trip(&with(
        object("v1", "Secret", "s", Some("default")),
        json!({"type": "Opaque", "data": {"a": "Yg==", "nul": "AA=="}, "immutable": true}),
    ));
    round_trip(&with(
        object("v1", "ServiceAccount", "robot", Some("default")),
        json!({
            "secrets": [{"name": "robot-token"}],
            "imagePullSecrets": [{"name": "registry"}],
            "automountServiceAccountToken": false,
        }),
    ));
}

#[test]
fn events_and_leases_keep_their_times() {
    let regarding = json!({"kind": "Widget", "namespace": "default", "name": "w1", "apiVersion": "test.k8s4r.io/v1", "uid": "u1"});
    round_trip(&with(
        object("v1", "Event", "w1.1", Some("default")),
        json!({
            "involvedObject": regarding, "reason": "TooSmall", "message": "size 1 is below 2",
            "source": {"component": "widget-controller"},
            "firstTimestamp": "2026-11-23T11:52:36Z", "lastTimestamp": "2026-11-23T11:53:00Z",
            "count": 2, "type": "Warning",
            "eventTime": "2026-11-23T11:52:36.123456Z",
            "series": {"count": 2, "lastObservedTime": "2026-11-23T11:53:00.000001Z"},
            "action": "Check", "reportingComponent": "widget-controller", "reportingInstance": "pod-1",
        }),
    ));
    round_trip(&with(
        object("events.k8s.io/v1", "Event", "w1.2", Some("default")),
        json!({
            "eventTime": "2026-11-23T11:52:36.500000Z", "reportingController": "widget-controller",
            "reportingInstance": "pod-1", "action": "Check", "reason": "TooSmall",
            "regarding": regarding, "note": "size 1 is below 2", "type": "Warning",
            "deprecatedCount": 0,
        }),
    ));
    round_trip(&with(
        object("coordination.k8s.io/v1", "Lease", "leader", Some("kube-system")),
        json!({"spec": {
            "holderIdentity": "manager-0", "leaseDurationSeconds": 15,
            "acquireTime": "2026-11-23T11:52:36.000000Z", "renewTime": "2026-11-23T11:52:51.250000Z",
            "leaseTransitions": 0,
        }}),
    ));
}

#[test]
fn rbac_kinds_round_trip() {
    let rules = json!([
        {"apiGroups": [""], "resources": ["configmaps"], "verbs": ["get", "list"], "resourceNames": ["cfg"]},
        {"nonResourceURLs": ["/healthz"], "verbs": ["get"]},
    ]);
    round_trip(&with(
        object("rbac.authorization.k8s.io/v1", "Role", "r", Some("default")),
        json!({"rules": rules}),
    ));
    round_trip(&with(
        object("rbac.authorization.k8s.io/v1", "ClusterRole", "cr", None),
        json!({"rules": rules, "aggregationRule": {"clusterRoleSelectors": [{"matchLabels": {"agg": "true"}}]}}),
    ));
    let binding = json!({
        "subjects": [
            {"kind": "User", "apiGroup": "rbac.authorization.k8s.io", "name": "alice"},
            {"kind": "ServiceAccount", "name": "robot", "namespace": "default"},
        ],
        "roleRef": {"apiGroup": "rbac.authorization.k8s.io", "kind": "Role", "name": "r"},
    });
    round_trip(&with(
        object(
            "rbac.authorization.k8s.io/v1",
            "RoleBinding",
            "rb",
            Some("default"),
        ),
        binding.clone(),
    ));
    round_trip(&with(
        object("rbac.authorization.k8s.io/v1", "ClusterRoleBinding", "crb", None),
        binding,
    ));
}

/// What deploy/cluster/50-flowcontrol.yaml holds, and the condition a real
/// server's APF controller writes: `borrowingLimitPercent: 0` (a pointer
/// set to zero) stays zero.
#[test]
fn flow_control_kinds_round_trip() {
    round_trip(&with(
        object(
            "flowcontrol.apiserver.k8s.io/v1",
            "PriorityLevelConfiguration",
            "robots",
            None,
        ),
        json!({"spec": {"type": "Limited", "limited": {
            "nominalConcurrencyShares": 20, "lendablePercent": 50, "borrowingLimitPercent": 0,
            "limitResponse": {"type": "Queue", "queuing": {"queues": 64, "handSize": 4, "queueLengthLimit": 50}},
        }}}),
    ));
    round_trip(&with(
        object("flowcontrol.apiserver.k8s.io/v1", "FlowSchema", "robots", None),
        json!({
            "spec": {
                "priorityLevelConfiguration": {"name": "robots"},
                "matchingPrecedence": 1000,
                "distinguisherMethod": {"type": "ByNamespace"},
                "rules": [{
                    "subjects": [{"kind": "ServiceAccount", "serviceAccount": {"name": "server", "namespace": "system"}}],
                    "resourceRules": [
                        {"verbs": ["create", "patch"], "apiGroups": ["robot.k8s4r.io"], "resources": ["robots", "robots/status"], "clusterScope": true},
                        {"verbs": ["patch"], "apiGroups": ["coordination.k8s.io"], "resources": ["leases"], "namespaces": ["leases"]},
                    ],
                    "nonResourceRules": [{"verbs": ["get"], "nonResourceURLs": ["/healthz"]}],
                }],
            },
            "status": {"conditions": [{
                "type": "Dangling", "status": "False", "lastTransitionTime": "2026-11-23T11:52:36Z",
                "reason": "Found", "message": "This FlowSchema references the PriorityLevelConfiguration object named \"robots\" and it exists",
            }]},
        }),
    ));
}

/// A Deployment reaches most of what core/v1 marshals by hand: quantities,
/// int-or-strings, inline structs, empty structs that mean something.
#[test]
fn deployments_round_trip_with_their_pod_template() {
    round_trip(&with(
        object("apps/v1", "Deployment", "web", Some("robots")),
        json!({
            "spec": {
                "replicas": 0,
                "selector": {"matchLabels": {"app": "web"}, "matchExpressions": [{"key": "tier", "operator": "In", "values": ["a", "b"]}]},
                "strategy": {"type": "RollingUpdate", "rollingUpdate": {"maxSurge": "25%", "maxUnavailable": 1}},
                "template": {
                    "metadata": {"labels": {"app": "web"}},
                    "spec": {
                        "containers": [{
                            "name": "c", "image": "nginx:1.27", "args": ["-g", "daemon off;"],
                            "ports": [{"containerPort": 80, "protocol": "TCP"}],
                            "resources": {"limits": {"cpu": "500m", "memory": "128Mi"}, "requests": {"cpu": "100m"}},
                            "env": [
                                {"name": "PLAIN", "value": "v"},
                                {"name": "FROM_SECRET", "valueFrom": {"secretKeyRef": {"name": "s", "key": "a", "optional": true}}},
                            ],
                            "envFrom": [{"configMapRef": {"name": "cfg"}}],
                            "livenessProbe": {"httpGet": {"path": "/healthz", "port": "http"}, "periodSeconds": 5},
                            "readinessProbe": {"tcpSocket": {"port": 80}},
                            "securityContext": {"allowPrivilegeEscalation": false, "runAsUser": 1000},
                            "volumeMounts": [{"name": "scratch", "mountPath": "/tmp"}],
                        }],
                        "volumes": [
                            {"name": "scratch", "emptyDir": {}},
                            {"name": "config", "configMap": {"name": "cfg", "defaultMode": 420}},
                        ],
                        "imagePullSecrets": [{"name": "registry"}],
                        "terminationGracePeriodSeconds": 30,
                    },
                },
            },
            "status": {
                "observedGeneration": 3,
                "conditions": [{
                    "type": "Available", "status": "True",
                    "lastUpdateTime": "2026-11-23T11:52:36Z", "lastTransitionTime": "2026-11-23T11:52:36Z",
                    "reason": "MinimumReplicasAvailable",
                }],
            },
        }),
    ));
}

#[test]
fn lists_and_status_round_trip() {
    round_trip(&json!({
        "apiVersion": "v1", "kind": "SecretList",
        "metadata": {"resourceVersion": "7", "continue": "abc", "remainingItemCount": 2},
        // Items carry no apiVersion and kind in protobuf (nor in a real server's JSON).
        "items": [{"metadata": metadata("s", Some("default")), "data": {"a": "Yg=="}}],
    }));
    round_trip(&json!({"apiVersion": "v1", "kind": "NamespaceList", "metadata": {"resourceVersion": "1"}}));
    round_trip(&json!({
        "apiVersion": "v1", "kind": "Status", "metadata": {}, "status": "Failure",
        "message": "Secret \"s\" is invalid: data.a: Invalid value", "reason": "Invalid", "code": 422,
        "details": {"name": "s", "kind": "Secret", "causes": [{"reason": "FieldValueInvalid", "message": "bad", "field": "data.a"}]},
    }));
}

#[test]
fn every_served_builtin_has_a_message_and_so_does_its_list() {
    for rt in crate::resources::builtins() {
        if rt.is_crd() {
            assert!(
                descriptor(&rt.api_version(), &rt.kind).is_none(),
                "CRDs are JSON only"
            );
            continue;
        }
        let av = rt.api_version();
        assert!(descriptor(&av, &rt.kind).is_some(), "{av} {}", rt.kind);
        if !rt.review {
            assert!(descriptor(&av, &rt.list_kind).is_some(), "{av} {}", rt.list_kind);
        }
    }
}

/// Every message the served kinds hold is either plain or one of the
/// special forms handled here; a new hand-marshalled type would be caught.
#[test]
fn served_kinds_hold_no_message_this_codec_does_not_know() {
    let mut seen = BTreeSet::new();
    for rt in crate::resources::builtins() {
        for kind in [&rt.kind, &rt.list_kind] {
            if let Some(d) = descriptor(&rt.api_version(), kind) {
                reachable(&d, &mut seen);
            }
        }
    }
    assert!(seen.contains("api.core.v1.PodSpec"), "walked the pod template");
    for name in [
        "apimachinery.pkg.apis.meta.v1.Duration",
        "apimachinery.pkg.apis.meta.v1.Timestamp",
        "apimachinery.pkg.runtime.Unknown",
    ] {
        assert!(
            !seen.contains(name),
            "{name} is reachable but has no JSON form here"
        );
    }
}

/// Bytes as kubectl's `-v=8` hex dump shows them.
fn hex(dump: &str) -> Vec<u8> {
    dump.split_whitespace()
        .map(|b| u8::from_str_radix(b, 16).expect("hex"))
        .collect()
}

#[test]
fn reads_what_kubectl_1_32_sends_for_can_i() {
    // kubectl auth can-i get configmaps/status -n kube-system: Go writes
    // every empty string and zero, which JSON leaves out.
    let body = hex(
        "6b 38 73 00 0a 32 0a 17 61 75 74 68 6f 72 69 7a 61 74 69 6f 6e 2e 6b 38 73 2e 69 6f 2f 76 31 12
         17 53 65 6c 66 53 75 62 6a 65 63 74 41 63 63 65 73 73 52 65 76 69 65 77 12 4c 0a 10 0a 00 12 00
         1a 00 22 00 2a 00 32 00 38 00 42 00 12 2e 0a 2c 0a 0b 6b 75 62 65 2d 73 79 73 74 65 6d 12 03 67
         65 74 1a 00 22 00 2a 0a 63 6f 6e 66 69 67 6d 61 70 73 32 00 3a 06 73 74 61 74 75 73 1a 08 08 00
         12 00 1a 00 20 00 1a 00 22 00",
    );
    let review = decode(&body, ("", "")).unwrap();
    assert_eq!(review["apiVersion"], "authorization.k8s.io/v1");
    assert_eq!(review["kind"], "SelfSubjectAccessReview");
    assert_eq!(
        review["spec"],
        json!({"resourceAttributes": {"namespace": "kube-system", "verb": "get", "resource": "configmaps", "name": "status"}})
    );
    assert_eq!(
        review["metadata"],
        json!({"generation": 0}),
        "empty strings and the zero time left out"
    );
    // kubectl auth can-i get /healthz
    let body = hex(
        "6b 38 73 00 0a 32 0a 17 61 75 74 68 6f 72 69 7a 61 74 69 6f 6e 2e 6b 38 73 2e 69 6f 2f 76 31 12
         17 53 65 6c 66 53 75 62 6a 65 63 74 41 63 63 65 73 73 52 65 76 69 65 77 12 2f 0a 10 0a 00 12 00
         1a 00 22 00 2a 00 32 00 38 00 42 00 12 11 12 0f 0a 08 2f 68 65 61 6c 74 68 7a 12 03 67 65 74 1a
         08 08 00 12 00 1a 00 20 00 1a 00 22 00",
    );
    assert_eq!(
        decode(&body, ("", "")).unwrap()["spec"],
        json!({"nonResourceAttributes": {"path": "/healthz", "verb": "get"}})
    );
}

#[test]
fn reads_what_kubectl_1_32_sends_for_list_and_whoami() {
    // kubectl auth can-i --list (namespace default)
    let body = hex(
        "6b 38 73 00 0a 31 0a 17 61 75 74 68 6f 72 69 7a 61 74 69 6f 6e 2e 6b 38 73 2e 69 6f 2f 76 31 12
         16 53 65 6c 66 53 75 62 6a 65 63 74 52 75 6c 65 73 52 65 76 69 65 77 12 23 0a 10 0a 00 12 00 1a
         00 22 00 2a 00 32 00 38 00 42 00 12 09 0a 07 64 65 66 61 75 6c 74 1a 04 18 00 22 00 1a 00 22 00",
    );
    let review = decode(&body, ("", "")).unwrap();
    assert_eq!(review["kind"], "SelfSubjectRulesReview");
    assert_eq!(review["spec"], json!({"namespace": "default"}));
    // kubectl auth whoami
    let body = hex(
        "6b 38 73 00 0a 2d 0a 18 61 75 74 68 65 6e 74 69 63 61 74 69 6f 6e 2e 6b 38 73 2e 69 6f 2f 76 31
         12 11 53 65 6c 66 53 75 62 6a 65 63 74 52 65 76 69 65 77 12 1a 0a 10 0a 00 12 00 1a 00 22 00 2a
         00 32 00 38 00 42 00 12 06 0a 04 0a 00 12 00 1a 00 22 00",
    );
    let review = decode(&body, ("", "")).unwrap();
    assert_eq!(
        (review["apiVersion"].as_str(), review["kind"].as_str()),
        (Some("authentication.k8s.io/v1"), Some("SelfSubjectReview"))
    );
}

#[test]
fn the_envelope_is_what_client_go_reads() {
    let secret = json!({"apiVersion": "v1", "kind": "Secret", "metadata": {"name": "s"}});
    let bytes = encode(&secret).unwrap();
    let unknown = message(UNKNOWN)
        .unwrap()
        .parse_from_bytes(&bytes[MAGIC.len()..])
        .unwrap();
    let Some(ReflectValueRef::Message(type_meta)) = field_value(&*unknown, "typeMeta") else {
        panic!("no typeMeta");
    };
    assert_eq!(string_field(&*type_meta, "apiVersion"), "v1");
    assert_eq!(string_field(&*type_meta, "kind"), "Secret");
    // raw: Secret { metadata: ObjectMeta { name: "s" } }
    let raw = bytes_field(&*unknown, "raw");
    assert_eq!(raw, b"\x0a\x03\x0a\x01s");
    // An envelope without a type (only raw, field 2) is read as the URL's kind.
    let mut untyped = MAGIC.to_vec();
    untyped.extend_from_slice(&[0x12, raw.len() as u8]);
    untyped.extend_from_slice(raw);
    assert_eq!(decode(&untyped, ("v1", "Secret")).unwrap(), secret);
}

#[test]
fn special_forms_follow_kubernetes_json() {
    // Secret { metadata { name: "s", namespace: "", creationTimestamp: {} },
    //          data { "bin": 00 01 02 ff }, immutable: false }, as Go writes it.
    let raw = hex("0a 07 0a 01 73 1a 00 42 00 12 0b 0a 03 62 69 6e 12 04 00 01 02 ff 28 00");
    let body = envelope("v1", "Secret", raw).unwrap();
    assert_eq!(
        decode(&body, ("", "")).unwrap(),
        json!({"apiVersion": "v1", "kind": "Secret", "metadata": {"name": "s"}, "data": {"bin": "AAEC/w=="}, "immutable": false}),
        "empty strings and zero times left out, false kept, bytes in base64"
    );
}

#[test]
fn the_vendored_descriptors_load() {
    assert!(!files().is_empty());
    for (av, kind, name) in KINDS {
        let d = descriptor(av, kind).unwrap_or_else(|| panic!("{name} is not in proto/"));
        assert_eq!(d.full_name(), *name);
    }
    assert!(message(UNKNOWN).is_some() && message(DELETE_OPTIONS).is_some());
    assert!(message("api.core.v1.NoSuchThing").is_none() && message("").is_none());
}

#[test]
fn kinds_not_served_are_refused_as_such() {
    for obj in [
        json!({"apiVersion": "demo.k8s4r.io/v1", "kind": "Gizmo"}),
        json!({"apiVersion": "apiextensions.k8s.io/v1", "kind": "CustomResourceDefinition"}),
    ] {
        assert!(!serves(&obj));
        assert!(matches!(encode(&obj), Err(ProtobufError::NotServed { .. })));
    }
    let body = envelope("demo.k8s4r.io/v1", "Gizmo", Vec::new()).unwrap();
    assert!(matches!(
        decode(&body, ("", "")),
        Err(ProtobufError::NotServed { .. })
    ));
}

#[test]
fn json_protobuf_cannot_hold_is_an_error_naming_the_field() {
    for (obj, path) in [
        (
            json!({"apiVersion": "v1", "kind": "Secret", "data": {"a": "not base64!"}}),
            "data.a",
        ),
        (
            json!({"apiVersion": "v1", "kind": "ConfigMap", "data": {"a": 1}}),
            "data.a",
        ),
        (
            json!({"apiVersion": "v1", "kind": "Namespace", "metadata": {"creationTimestamp": "yesterday"}}),
            "metadata.creationTimestamp",
        ),
        (
            json!({"apiVersion": "coordination.k8s.io/v1", "kind": "Lease", "spec": {"leaseDurationSeconds": 1u64 << 40}}),
            "spec.leaseDurationSeconds",
        ),
        (
            json!({"apiVersion": "rbac.authorization.k8s.io/v1", "kind": "Role", "rules": {"verbs": ["get"]}}),
            "rules",
        ),
    ] {
        match encode(&obj) {
            Err(ProtobufError::Field { path: p, .. }) => assert_eq!(p, path, "{obj}"),
            other => panic!("{obj}: {other:?}"),
        }
    }
}

#[test]
fn malformed_bodies_are_errors_not_panics() {
    let good = encode(&json!({
        "apiVersion": "v1", "kind": "Secret", "metadata": metadata("s", Some("default")), "data": {"a": "Yg=="},
    }))
    .unwrap();
    assert!(matches!(
        decode(b"{}", ("v1", "Secret")),
        Err(ProtobufError::NoMagic)
    ));
    // Every truncation of a good body.
    for len in 0..good.len() {
        let _ = decode(&good[..len], ("v1", "Secret"));
    }
    assert!(decode(&good[..good.len() - 3], ("v1", "Secret")).is_err());
    for (body, what) in [
        (&b"k8s\0\x0a\x05ab"[..], "truncated type meta"),
        (b"k8s\0\x0a\xff", "truncated length"),
        (b"k8s\0\x0b", "wire type 3 with no end"),
        (b"k8s\0\x12\x02\x12\x80", "raw with a truncated varint"),
        (
            b"k8s\0\x12\x0a\xff\xff\xff\xff\xff\xff\xff\xff\xff\x01",
            "a length of 2^64",
        ),
    ] {
        assert!(decode(body, ("v1", "Secret")).is_err(), "{what}");
    }
    // Bytes flipped one at a time, and pseudo-random noise after the magic.
    for i in MAGIC.len()..good.len() {
        let mut bad = good.clone();
        bad[i] ^= 0xa5;
        let _ = decode(&bad, ("v1", "Secret"));
    }
    let mut seed = 0x2545_f491_4f6c_dd1du64;
    for _ in 0..500 {
        let mut body = MAGIC.to_vec();
        for _ in 0..64 {
            seed ^= seed << 13;
            seed ^= seed >> 7;
            seed ^= seed << 17;
            body.push(seed as u8);
        }
        let _ = decode(&body, ("v1", "Secret"));
    }
}

#[test]
fn deep_nesting_is_refused_not_a_stack_overflow() {
    // No served message holds itself, so the only unbounded nesting is of
    // unknown groups (wire type 3, field 3), opened and never closed.
    let groups = vec![0x1b; 100_000];
    let body = envelope("v1", "Secret", groups).unwrap();
    assert!(decode(&body, ("v1", "Secret")).is_err());
}

#[test]
fn a_body_of_another_kind_than_the_url_takes_is_refused_before_parsing() {
    let deployment = object("apps/v1", "Deployment", "web", Some("default"));
    let body = encode(&deployment).unwrap();
    let err = decode(&body, ("authorization.k8s.io/v1", "SelfSubjectAccessReview")).unwrap_err();
    assert!(matches!(err, ProtobufError::WrongKind { .. }), "{err}");
    let err = decode(&body, ("apps/v1beta2", "Deployment")).unwrap_err();
    assert!(matches!(err, ProtobufError::WrongKind { .. }), "{err}");
    assert_eq!(decode(&body, ("apps/v1", "Deployment")).unwrap(), deployment);
}

#[test]
fn a_body_of_a_million_empty_messages_is_refused_before_parsing() {
    // Each rule is 2 bytes on the wire and a dynamic message of every
    // PolicyRule field once parsed.
    let role = descriptor("rbac.authorization.k8s.io/v1", "Role").unwrap();
    let rules = role.field_by_name("rules").unwrap().number();
    let mut raw = Vec::new();
    for _ in 0..(MAX_MESSAGES + 1) {
        raw.push(((rules << 3) | 2) as u8);
        raw.push(0);
    }
    let body = envelope("rbac.authorization.k8s.io/v1", "Role", raw.clone()).unwrap();
    let err = decode(&body, ("rbac.authorization.k8s.io/v1", "Role")).unwrap_err();
    assert!(matches!(err, ProtobufError::TooComplex(_)), "{err}");
    // One fewer is within bounds: the limit, not the shape, refused it.
    raw.truncate(raw.len() - 4);
    assert!(check_cost(&role, &raw).is_ok());
}

#[test]
fn the_cost_walk_refuses_malformed_wire_forms() {
    let role = descriptor("rbac.authorization.k8s.io/v1", "Role").unwrap();
    for bad in [
        &[0x0a, 0x05, 0x00][..],
        &[0xff; 11][..],
        &[0x0b][..],
        &[0x09, 0x00][..],
    ] {
        assert!(check_cost(&role, bad).is_err(), "{bad:?}");
    }
}

/// The full names of the messages `from` holds, itself included, to
/// check in tests what the served kinds contain.
fn reachable(from: &MessageDescriptor, seen: &mut std::collections::BTreeSet<String>) {
    if !seen.insert(from.full_name().to_owned()) {
        return;
    }
    for field in from.fields() {
        let types = match field.runtime_field_type() {
            RuntimeFieldType::Singular(t) | RuntimeFieldType::Repeated(t) => vec![t],
            RuntimeFieldType::Map(k, v) => vec![k, v],
        };
        for t in types {
            if let RuntimeType::Message(m) = t {
                reachable(&m, seen);
            }
        }
    }
}
