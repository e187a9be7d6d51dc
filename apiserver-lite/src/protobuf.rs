//! Kubernetes' protobuf encoding of the built-in kinds, to and from the
//! JSON form (`serde_json::Value`) the rest of the server works on.
//!
//! ```text
//!   "k8s\0" runtime.Unknown { 1: typeMeta { 1: apiVersion, 2: kind },
//!                             2: raw (the kind's own message),
//!                             3: contentEncoding, 4: contentType }
//! ```
//!
//! The messages are described by the Kubernetes `.proto` files vendored in
//! `proto/` (see its README), parsed by build.rs into descriptors, so one
//! walk over a message's fields converts any kind, with rust-protobuf's
//! dynamic messages. Protobuf and JSON agree on field names (Kubernetes
//! names its proto fields after the JSON ones) except where Kubernetes
//! marshals a type by hand, which this module does the same way:
//!
//! - `Time` and `MicroTime`: RFC 3339 strings (seconds, microseconds);
//!   the zero time is JSON's `null`, so it is left out.
//! - `IntOrString`: a number or a string; `Quantity`: its string.
//! - `bytes`: base64 (Secret `data`, ConfigMap `binaryData`).
//! - `FieldsV1`, `RawExtension`, apiextensions `JSON`: JSON held as bytes.
//! - `ExtraValue` (a user's extra attributes): an array of strings.
//! - Go structs embedded with `json:",inline"` ([`INLINE`]): a field of
//!   their own in protobuf, their fields lifted into the parent in JSON.
//!
//! Go's encoder writes every non-pointer field, empty or not; JSON leaves
//! empty strings out (`omitempty`), and so does [`decode`]. Booleans and
//! numbers are kept as sent: `false` and `0` can be meaningful (a pointer
//! set to them) and are harmless when they are the defaults.
//!
//! A body is untrusted: it is bounded by the server's body limit; its
//! type must be the one the URL names; before rust-protobuf parses it (its
//! dynamic messages cost far more memory than their bytes: every field of
//! a message is set up once one is), [`check_cost`] walks the wire format
//! against the schema and refuses more than [`MAX_MESSAGES`] messages or
//! nesting deeper than [`MAX_DEPTH`]; and every mismatch is an error,
//! never a panic.

use base64::Engine as _;
use protobuf::descriptor::FileDescriptorSet;
use protobuf::reflect::FileDescriptor;
use protobuf::reflect::{
    FieldDescriptor, MessageDescriptor, ReflectFieldRef, ReflectValueBox, ReflectValueRef, RuntimeFieldType,
    RuntimeType,
};
use protobuf::{Message as _, MessageDyn};
use serde_json::{Map, Value};

/// What every Kubernetes protobuf body starts with.
pub const MAGIC: &[u8] = b"k8s\0";

/// The media type of protobuf bodies.
pub const MEDIA_TYPE: &str = "application/vnd.kubernetes.protobuf";

/// Why a protobuf body could not be read, or an object not encoded.
#[derive(Debug, thiserror::Error)]
pub enum ProtobufError {
    #[error("the body does not start with the k8s protobuf prefix \"k8s\\0\"")]
    NoMagic,
    #[error("the runtime.Unknown envelope is malformed: {0}")]
    Envelope(protobuf::Error),
    #[error("bodies with content encoding {0:?} are not read")]
    ContentEncoding(String),
    #[error("the envelope holds {0:?}, not protobuf")]
    ContentType(String),
    /// Not a kind served in protobuf (a custom resource, a CRD): the
    /// media type is refused, as a real server refuses it.
    #[error("{api_version}, Kind={kind} is not served in protobuf")]
    NotServed { api_version: String, kind: String },
    #[error("the {kind} message is malformed: {source}")]
    Message { kind: String, source: protobuf::Error },
    #[error("{path}: {problem}")]
    Field { path: String, problem: String },
    #[error("the body holds {sent}, but this URL takes {expected}")]
    WrongKind { sent: String, expected: String },
    #[error("the body is too complex: {0}")]
    TooComplex(String),
}

/// The most messages one body may hold. An object of a built-in kind
/// holds tens to a few thousand (a container, an env var, a rule, a
/// subject each count one); a hostile body of empty messages would hold a
/// million in 3 MiB and cost gigabytes once parsed.
pub const MAX_MESSAGES: usize = 10_000;

/// The deepest messages may nest in one body.
pub const MAX_DEPTH: usize = 64;

fn field_error(path: &str, problem: impl Into<String>) -> ProtobufError {
    ProtobufError::Field {
        path: if path.is_empty() {
            "(object)".into()
        } else {
            path.into()
        },
        problem: problem.into(),
    }
}

/// The descriptor set build.rs makes of the vendored `.proto` files.
const DESCRIPTORS: &[u8] = include_bytes!(concat!(env!("OUT_DIR"), "/kubernetes.fds"));

/// The kinds served in protobuf, by apiVersion and kind, and their
/// messages: the built-ins, their lists, the self reviews and `Status`;
/// `DeleteOptions` is in every group version, so it is looked up by kind
/// alone. CRDs are left out: their schemas are JSON Schema marshalled by
/// hand (`$ref`, `x-kubernetes-*`), and kubectl sends them as JSON anyway.
const KINDS: &[(&str, &str, &str)] = &[
    ("v1", "Status", "apimachinery.pkg.apis.meta.v1.Status"),
    ("v1", "Namespace", "api.core.v1.Namespace"),
    ("v1", "NamespaceList", "api.core.v1.NamespaceList"),
    ("v1", "ConfigMap", "api.core.v1.ConfigMap"),
    ("v1", "ConfigMapList", "api.core.v1.ConfigMapList"),
    ("v1", "Secret", "api.core.v1.Secret"),
    ("v1", "SecretList", "api.core.v1.SecretList"),
    ("v1", "Service", "api.core.v1.Service"),
    ("v1", "ServiceList", "api.core.v1.ServiceList"),
    ("v1", "ServiceAccount", "api.core.v1.ServiceAccount"),
    ("v1", "ServiceAccountList", "api.core.v1.ServiceAccountList"),
    ("v1", "Event", "api.core.v1.Event"),
    ("v1", "EventList", "api.core.v1.EventList"),
    ("events.k8s.io/v1", "Event", "api.events.v1.Event"),
    ("events.k8s.io/v1", "EventList", "api.events.v1.EventList"),
    ("coordination.k8s.io/v1", "Lease", "api.coordination.v1.Lease"),
    (
        "coordination.k8s.io/v1",
        "LeaseList",
        "api.coordination.v1.LeaseList",
    ),
    (
        "apiregistration.k8s.io/v1",
        "APIService",
        "kube_aggregator.pkg.apis.apiregistration.v1.APIService",
    ),
    (
        "apiregistration.k8s.io/v1",
        "APIServiceList",
        "kube_aggregator.pkg.apis.apiregistration.v1.APIServiceList",
    ),
    (
        "admissionregistration.k8s.io/v1",
        "ValidatingWebhookConfiguration",
        "api.admissionregistration.v1.ValidatingWebhookConfiguration",
    ),
    (
        "admissionregistration.k8s.io/v1",
        "ValidatingWebhookConfigurationList",
        "api.admissionregistration.v1.ValidatingWebhookConfigurationList",
    ),
    (
        "flowcontrol.apiserver.k8s.io/v1",
        "FlowSchema",
        "api.flowcontrol.v1.FlowSchema",
    ),
    (
        "flowcontrol.apiserver.k8s.io/v1",
        "FlowSchemaList",
        "api.flowcontrol.v1.FlowSchemaList",
    ),
    (
        "flowcontrol.apiserver.k8s.io/v1",
        "PriorityLevelConfiguration",
        "api.flowcontrol.v1.PriorityLevelConfiguration",
    ),
    (
        "flowcontrol.apiserver.k8s.io/v1",
        "PriorityLevelConfigurationList",
        "api.flowcontrol.v1.PriorityLevelConfigurationList",
    ),
    ("apps/v1", "Deployment", "api.apps.v1.Deployment"),
    ("apps/v1", "DeploymentList", "api.apps.v1.DeploymentList"),
    ("rbac.authorization.k8s.io/v1", "Role", "api.rbac.v1.Role"),
    ("rbac.authorization.k8s.io/v1", "RoleList", "api.rbac.v1.RoleList"),
    (
        "rbac.authorization.k8s.io/v1",
        "RoleBinding",
        "api.rbac.v1.RoleBinding",
    ),
    (
        "rbac.authorization.k8s.io/v1",
        "RoleBindingList",
        "api.rbac.v1.RoleBindingList",
    ),
    (
        "rbac.authorization.k8s.io/v1",
        "ClusterRole",
        "api.rbac.v1.ClusterRole",
    ),
    (
        "rbac.authorization.k8s.io/v1",
        "ClusterRoleList",
        "api.rbac.v1.ClusterRoleList",
    ),
    (
        "rbac.authorization.k8s.io/v1",
        "ClusterRoleBinding",
        "api.rbac.v1.ClusterRoleBinding",
    ),
    (
        "rbac.authorization.k8s.io/v1",
        "ClusterRoleBindingList",
        "api.rbac.v1.ClusterRoleBindingList",
    ),
    (
        "authentication.k8s.io/v1",
        "SelfSubjectReview",
        "api.authentication.v1.SelfSubjectReview",
    ),
    (
        "authentication.k8s.io/v1",
        "TokenRequest",
        "api.authentication.v1.TokenRequest",
    ),
    (
        "authentication.k8s.io/v1beta1",
        "SelfSubjectReview",
        "api.authentication.v1beta1.SelfSubjectReview",
    ),
    (
        "authorization.k8s.io/v1",
        "SelfSubjectAccessReview",
        "api.authorization.v1.SelfSubjectAccessReview",
    ),
    (
        "authorization.k8s.io/v1",
        "SelfSubjectRulesReview",
        "api.authorization.v1.SelfSubjectRulesReview",
    ),
    (
        "authorization.k8s.io/v1",
        "SubjectAccessReview",
        "api.authorization.v1.SubjectAccessReview",
    ),
];

const DELETE_OPTIONS: &str = "apimachinery.pkg.apis.meta.v1.DeleteOptions";
const UNKNOWN: &str = "apimachinery.pkg.runtime.Unknown";

/// The vendored files' descriptors, built once. They are part of the
/// binary, so failing to build them is a bug; protobuf is then not served
/// (bodies are 415, answers JSON) rather than the server not starting.
fn files() -> &'static [FileDescriptor] {
    static FILES: std::sync::OnceLock<Vec<FileDescriptor>> = std::sync::OnceLock::new();
    FILES.get_or_init(|| {
        let built = FileDescriptorSet::parse_from_bytes(DESCRIPTORS)
            .and_then(|set| FileDescriptor::new_dynamic_fds(set.file, &[]));
        built.unwrap_or_else(|e| {
            tracing::error!(error = %e, "the Kubernetes protobuf descriptors do not load; protobuf is not served");
            Vec::new()
        })
    })
}

/// A message of the vendored files by its full name (`api.core.v1.Secret`).
fn message(full_name: &str) -> Option<MessageDescriptor> {
    files().iter().find_map(|file| {
        let relative = full_name
            .strip_prefix(file.proto().package())?
            .strip_prefix('.')?;
        file.message_by_package_relative_name(relative)
    })
}

/// The message of a kind served in protobuf.
pub fn descriptor(api_version: &str, kind: &str) -> Option<MessageDescriptor> {
    if kind == "DeleteOptions" {
        return message(DELETE_OPTIONS);
    }
    let (_, _, name) = KINDS.iter().find(|(av, k, _)| *av == api_version && *k == kind)?;
    message(name)
}

/// Whether an object (in JSON form) is of a kind served in protobuf.
pub fn serves(obj: &Value) -> bool {
    match (obj["apiVersion"].as_str(), obj["kind"].as_str()) {
        (Some(av), Some(kind)) => descriptor(av, kind).is_some(),
        _ => false,
    }
}

/// Reads a protobuf body into the JSON form of its object, `apiVersion`
/// and `kind` included. `default` is the (apiVersion, kind) the URL takes:
/// a body of another type is refused before it is parsed, and an envelope
/// without a type (client-go always sends one) is read as `default`'s.
/// `("", "")` takes any served kind (reading a server's answer).
pub fn decode(body: &[u8], default: (&str, &str)) -> Result<Value, ProtobufError> {
    let unknown = body.strip_prefix(MAGIC).ok_or(ProtobufError::NoMagic)?;
    let envelope = message(UNKNOWN).ok_or_else(|| not_served(default))?;
    let unknown = envelope
        .parse_from_bytes(unknown)
        .map_err(ProtobufError::Envelope)?;
    let unknown = &*unknown;
    let enc = string_field(unknown, "contentEncoding");
    if !enc.is_empty() {
        return Err(ProtobufError::ContentEncoding(enc.into()));
    }
    let ct = string_field(unknown, "contentType");
    if !ct.is_empty() && ct != MEDIA_TYPE {
        return Err(ProtobufError::ContentType(ct.into()));
    }
    let typed = match field_value(unknown, "typeMeta") {
        Some(ReflectValueRef::Message(type_meta)) => (
            string_field(&*type_meta, "apiVersion").to_owned(),
            string_field(&*type_meta, "kind").to_owned(),
        ),
        _ => Default::default(),
    };
    let (api_version, kind) = match (typed.0.as_str(), typed.1.as_str()) {
        ("", "") => default,
        typed => typed,
    };
    // Checked before the body is parsed: a kind the URL does not take
    // would otherwise cost its full parse before being refused.
    let any = default == ("", "");
    let same = kind == default.1 && (kind == "DeleteOptions" || api_version == default.0);
    if !any && !same {
        return Err(ProtobufError::WrongKind {
            sent: format!("{api_version}, Kind={kind}"),
            expected: format!("{}, Kind={}", default.0, default.1),
        });
    }
    let descriptor = descriptor(api_version, kind).ok_or_else(|| not_served((api_version, kind)))?;
    let raw = bytes_field(unknown, "raw");
    check_cost(&descriptor, raw)?;
    let message = descriptor
        .parse_from_bytes(raw)
        .map_err(|source| ProtobufError::Message {
            kind: kind.into(),
            source,
        })?;
    let mut out = Map::new();
    out.insert("apiVersion".into(), api_version.into());
    out.insert("kind".into(), kind.into());
    if let Value::Object(fields) = message_to_json(&*message, "")? {
        out.extend(fields);
    }
    Ok(Value::Object(out))
}

/// Writes an object (in JSON form, with `apiVersion` and `kind`) as a
/// protobuf body. Fields its message does not have are left out, as a
/// real server's protobuf never carries them.
pub fn encode(obj: &Value) -> Result<Vec<u8>, ProtobufError> {
    let api_version = obj["apiVersion"].as_str().unwrap_or_default();
    let kind = obj["kind"].as_str().unwrap_or_default();
    let descriptor = descriptor(api_version, kind).ok_or_else(|| not_served((api_version, kind)))?;
    let raw = message_from_json(&descriptor, obj, "")?
        .write_to_bytes_dyn()
        .map_err(|source| ProtobufError::Message {
            kind: kind.into(),
            source,
        })?;
    envelope(api_version, kind, raw)
}

fn envelope(api_version: &str, kind: &str, raw: Vec<u8>) -> Result<Vec<u8>, ProtobufError> {
    let type_meta = Value::Object(Map::from_iter([
        ("apiVersion".to_owned(), Value::from(api_version)),
        ("kind".to_owned(), Value::from(kind)),
    ]));
    let unknown_descriptor = message(UNKNOWN).ok_or_else(|| not_served((api_version, kind)))?;
    // Go writes its empty strings too; client-go reads either.
    let mut unknown = message_from_json(
        &unknown_descriptor,
        &Value::Object(Map::from_iter([
            ("typeMeta".to_owned(), type_meta),
            ("contentEncoding".to_owned(), Value::from("")),
            ("contentType".to_owned(), Value::from("")),
        ])),
        "",
    )?;
    set(&mut *unknown, "raw", ReflectValueBox::Bytes(raw));
    let mut out = MAGIC.to_vec();
    unknown
        .write_to_vec_dyn(&mut out)
        .map_err(|source| ProtobufError::Message {
            kind: "Unknown".into(),
            source,
        })?;
    Ok(out)
}

fn not_served((api_version, kind): (&str, &str)) -> ProtobufError {
    ProtobufError::NotServed {
        api_version: api_version.into(),
        kind: kind.into(),
    }
}

fn string_field<'a>(m: &'a dyn MessageDyn, name: &str) -> &'a str {
    match field_value(m, name) {
        Some(ReflectValueRef::String(s)) => s,
        _ => "",
    }
}

/// Go structs embedded with `json:",inline"`: (message, field name).
const INLINE: &[(&str, &str)] = &[
    ("api.core.v1.LocalObjectReference", "localObjectReference"),
    ("api.core.v1.VolumeSource", "volumeSource"),
    ("api.core.v1.PersistentVolumeSource", "persistentVolumeSource"),
    ("api.core.v1.EphemeralContainerCommon", "ephemeralContainerCommon"),
    ("api.core.v1.ProbeHandler", "handler"),
];

/// The message an inline field embeds, if `field` is one.
fn inline_message(field: &FieldDescriptor) -> Option<MessageDescriptor> {
    match field.runtime_field_type() {
        RuntimeFieldType::Singular(RuntimeType::Message(m))
            if INLINE.contains(&(m.full_name(), field.name())) =>
        {
            Some(m)
        }
        _ => None,
    }
}

/// The messages Kubernetes marshals to JSON by hand.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Special {
    Time,
    MicroTime,
    IntOrString,
    Quantity,
    /// Bytes holding JSON: `FieldsV1`, `RawExtension`, apiextensions `JSON`.
    EmbeddedJson,
    ExtraValue,
}

impl Special {
    fn of(message: &MessageDescriptor) -> Option<Special> {
        Some(match message.full_name() {
            "apimachinery.pkg.apis.meta.v1.Time" => Special::Time,
            "apimachinery.pkg.apis.meta.v1.MicroTime" => Special::MicroTime,
            "apimachinery.pkg.util.intstr.IntOrString" => Special::IntOrString,
            "apimachinery.pkg.api.resource.Quantity" => Special::Quantity,
            "apimachinery.pkg.apis.meta.v1.FieldsV1"
            | "apimachinery.pkg.runtime.RawExtension"
            | "apiextensions_apiserver.pkg.apis.apiextensions.v1.JSON" => Special::EmbeddedJson,
            name if name.ends_with(".ExtraValue") => Special::ExtraValue,
            _ => return None,
        })
    }
}

fn join(path: &str, name: &str) -> String {
    if path.is_empty() {
        name.into()
    } else {
        format!("{path}.{name}")
    }
}

// ---- protobuf to JSON ----

fn message_to_json(m: &dyn MessageDyn, path: &str) -> Result<Value, ProtobufError> {
    let descriptor = m.descriptor_dyn();
    if let Some(special) = Special::of(&descriptor) {
        return special_to_json(special, m, path);
    }
    let mut out = Map::new();
    for field in descriptor.fields() {
        let name = field.name();
        let here = join(path, name);
        match field.get_reflect(m) {
            ReflectFieldRef::Optional(value) => {
                let Some(value) = value.value() else { continue };
                if inline_message(&field).is_some() {
                    if let ReflectValueRef::Message(inner) = &value {
                        if let Value::Object(fields) = message_to_json(&**inner, path)? {
                            out.extend(fields);
                        }
                    }
                    continue;
                }
                if matches!(value, ReflectValueRef::String("")) {
                    continue;
                }
                let json = value_to_json(value, &here)?;
                if !json.is_null() {
                    out.insert(name.into(), json);
                }
            }
            ReflectFieldRef::Repeated(items) => {
                if items.is_empty() {
                    continue;
                }
                let items = items
                    .into_iter()
                    .enumerate()
                    .map(|(i, v)| value_to_json(v, &format!("{here}[{i}]")))
                    .collect::<Result<Vec<_>, _>>()?;
                out.insert(name.into(), Value::Array(items));
            }
            ReflectFieldRef::Map(map) => {
                if map.is_empty() {
                    continue;
                }
                let mut object = Map::new();
                for (key, value) in &map {
                    let ReflectValueRef::String(key) = key else {
                        return Err(field_error(&here, "map keys must be strings"));
                    };
                    object.insert(key.into(), value_to_json(value, &join(&here, key))?);
                }
                out.insert(name.into(), Value::Object(object));
            }
        }
    }
    Ok(Value::Object(out))
}

fn value_to_json(v: ReflectValueRef<'_>, path: &str) -> Result<Value, ProtobufError> {
    Ok(match v {
        ReflectValueRef::U32(n) => n.into(),
        ReflectValueRef::U64(n) => n.into(),
        ReflectValueRef::I32(n) => n.into(),
        ReflectValueRef::I64(n) => n.into(),
        ReflectValueRef::F32(n) => float(f64::from(n), path)?,
        ReflectValueRef::F64(n) => float(n, path)?,
        ReflectValueRef::Bool(b) => b.into(),
        ReflectValueRef::String(s) => s.into(),
        ReflectValueRef::Bytes(b) => base64::engine::general_purpose::STANDARD.encode(b).into(),
        ReflectValueRef::Enum(_, n) => n.into(),
        ReflectValueRef::Message(m) => message_to_json(&*m, path)?,
    })
}

fn float(n: f64, path: &str) -> Result<Value, ProtobufError> {
    serde_json::Number::from_f64(n)
        .map(Value::Number)
        .ok_or_else(|| field_error(path, format!("{n} is not a JSON number")))
}

/// A field of a special message, read with the reflection API (the
/// messages are tiny; their field numbers are fixed by Kubernetes).
fn field_value<'a>(m: &'a dyn MessageDyn, name: &str) -> Option<ReflectValueRef<'a>> {
    let field = m.descriptor_dyn().field_by_name(name)?;
    match field.get_reflect(m) {
        ReflectFieldRef::Optional(v) => v.value(),
        _ => None,
    }
}

fn int_field(m: &dyn MessageDyn, name: &str) -> i64 {
    match field_value(m, name) {
        Some(ReflectValueRef::I64(n)) => n,
        Some(ReflectValueRef::I32(n)) => n.into(),
        _ => 0,
    }
}

fn bytes_field<'a>(m: &'a dyn MessageDyn, name: &str) -> &'a [u8] {
    match field_value(m, name) {
        Some(ReflectValueRef::Bytes(b)) => b,
        _ => &[],
    }
}

fn special_to_json(special: Special, m: &dyn MessageDyn, path: &str) -> Result<Value, ProtobufError> {
    Ok(match special {
        Special::Time | Special::MicroTime => {
            let (seconds, nanos) = (int_field(m, "seconds"), int_field(m, "nanos"));
            if seconds == 0 && nanos == 0 {
                return Ok(Value::Null);
            }
            let nanos = i32::try_from(nanos).map_err(|_| field_error(path, "nanos out of range"))?;
            let at = jiff::Timestamp::new(seconds, nanos)
                .map_err(|e| field_error(path, format!("not a time: {e}")))?;
            let whole = at.strftime("%Y-%m-%dT%H:%M:%S");
            if special == Special::Time {
                format!("{whole}Z").into()
            } else {
                format!("{whole}.{:06}Z", at.subsec_nanosecond() / 1000).into()
            }
        }
        Special::IntOrString => match (int_field(m, "type"), field_value(m, "strVal")) {
            (1, Some(ReflectValueRef::String(s))) => s.into(),
            (1, _) => "".into(),
            _ => int_field(m, "intVal").into(),
        },
        Special::Quantity => match field_value(m, "string") {
            Some(ReflectValueRef::String(s)) if !s.is_empty() => s.into(),
            _ => "0".into(),
        },
        Special::EmbeddedJson => {
            let raw = bytes_field(m, "raw");
            let raw = if raw.is_empty() {
                bytes_field(m, "Raw")
            } else {
                raw
            };
            if raw.is_empty() {
                Value::Null
            } else if raw.starts_with(MAGIC) {
                return Err(field_error(path, "embedded protobuf objects are not read"));
            } else {
                serde_json::from_slice(raw)
                    .map_err(|e| field_error(path, format!("does not hold JSON: {e}")))?
            }
        }
        Special::ExtraValue => {
            let field = m
                .descriptor_dyn()
                .field_by_name("items")
                .ok_or_else(|| field_error(path, "ExtraValue without items"))?;
            match field.get_reflect(m) {
                ReflectFieldRef::Repeated(items) => Value::Array(
                    items
                        .into_iter()
                        .map(|v| value_to_json(v, path))
                        .collect::<Result<_, _>>()?,
                ),
                _ => return Err(field_error(path, "ExtraValue items are not a list")),
            }
        }
    })
}

// ---- JSON to protobuf ----

fn message_from_json(
    descriptor: &MessageDescriptor,
    v: &Value,
    path: &str,
) -> Result<Box<dyn MessageDyn>, ProtobufError> {
    let mut message = descriptor.new_instance();
    if let Some(special) = Special::of(descriptor) {
        special_from_json(special, &mut *message, v, path)?;
        return Ok(message);
    }
    let Value::Object(object) = v else {
        return Err(field_error(
            path,
            format!("expected an object, not {}", type_name(v)),
        ));
    };
    for field in descriptor.fields() {
        if let Some(inner) = inline_message(&field) {
            // The parent's keys that belong to the embedded struct.
            let mine: Map<String, Value> = object
                .iter()
                .filter(|(k, _)| inner.field_by_name(k).is_some())
                .map(|(k, v)| (k.clone(), v.clone()))
                .collect();
            if !mine.is_empty() {
                let value = message_from_json(&inner, &Value::Object(mine), path)?;
                field.set_singular_field(&mut *message, ReflectValueBox::Message(value));
            }
            continue;
        }
        let Some(value) = object.get(field.name()).filter(|v| !v.is_null()) else {
            continue;
        };
        let here = join(path, field.name());
        match field.runtime_field_type() {
            RuntimeFieldType::Singular(t) => {
                let value = value_from_json(&t, value, &here)?;
                field.set_singular_field(&mut *message, value);
            }
            RuntimeFieldType::Repeated(t) => {
                let Value::Array(items) = value else {
                    return Err(field_error(
                        &here,
                        format!("expected a list, not {}", type_name(value)),
                    ));
                };
                let mut repeated = field.mut_repeated(&mut *message);
                for (i, item) in items.iter().enumerate() {
                    repeated.push(value_from_json(&t, item, &format!("{here}[{i}]"))?);
                }
            }
            RuntimeFieldType::Map(key_type, value_type) => {
                let Value::Object(entries) = value else {
                    return Err(field_error(
                        &here,
                        format!("expected an object, not {}", type_name(value)),
                    ));
                };
                if key_type != RuntimeType::String {
                    return Err(field_error(&here, "map keys must be strings"));
                }
                let mut map = field.mut_map(&mut *message);
                for (key, item) in entries {
                    let item = value_from_json(&value_type, item, &join(&here, key))?;
                    map.insert(ReflectValueBox::String(key.clone()), item);
                }
            }
        }
    }
    Ok(message)
}

fn value_from_json(t: &RuntimeType, v: &Value, path: &str) -> Result<ReflectValueBox, ProtobufError> {
    let wrong = || {
        field_error(
            path,
            format!("expected {}, not {}", runtime_type_name(t), type_name(v)),
        )
    };
    let int = |v: &Value| v.as_i64().ok_or_else(wrong);
    Ok(match t {
        RuntimeType::I32 => ReflectValueBox::I32(i32::try_from(int(v)?).map_err(|_| wrong())?),
        RuntimeType::I64 => ReflectValueBox::I64(int(v)?),
        RuntimeType::U32 => ReflectValueBox::U32(u32::try_from(int(v)?).map_err(|_| wrong())?),
        RuntimeType::U64 => ReflectValueBox::U64(v.as_u64().ok_or_else(wrong)?),
        // Narrowing to f32 is what the field holds.
        RuntimeType::F32 => ReflectValueBox::F32(v.as_f64().ok_or_else(wrong)? as f32),
        RuntimeType::F64 => ReflectValueBox::F64(v.as_f64().ok_or_else(wrong)?),
        RuntimeType::Bool => ReflectValueBox::Bool(v.as_bool().ok_or_else(wrong)?),
        RuntimeType::String => ReflectValueBox::String(v.as_str().ok_or_else(wrong)?.into()),
        RuntimeType::VecU8 => {
            let text = v.as_str().ok_or_else(wrong)?;
            let bytes = base64::engine::general_purpose::STANDARD
                .decode(text)
                .map_err(|e| field_error(path, format!("not base64: {e}")))?;
            ReflectValueBox::Bytes(bytes)
        }
        RuntimeType::Enum(e) => {
            ReflectValueBox::Enum(e.clone(), i32::try_from(int(v)?).map_err(|_| wrong())?)
        }
        RuntimeType::Message(m) => ReflectValueBox::Message(message_from_json(m, v, path)?),
    })
}

fn set(message: &mut dyn MessageDyn, name: &str, value: ReflectValueBox) {
    // The special messages' fields are fixed by Kubernetes; a descriptor
    // without one is a different message, which `Special::of` never names.
    if let Some(field) = message.descriptor_dyn().field_by_name(name) {
        field.set_singular_field(message, value);
    }
}

fn special_from_json(
    special: Special,
    message: &mut dyn MessageDyn,
    v: &Value,
    path: &str,
) -> Result<(), ProtobufError> {
    match special {
        Special::Time | Special::MicroTime => {
            let text = v
                .as_str()
                .ok_or_else(|| field_error(path, format!("expected a time, not {}", type_name(v))))?;
            let at: jiff::Timestamp = text
                .parse()
                .map_err(|e| field_error(path, format!("{text:?} is not an RFC 3339 time: {e}")))?;
            set(message, "seconds", ReflectValueBox::I64(at.as_second()));
            set(message, "nanos", ReflectValueBox::I32(at.subsec_nanosecond()));
        }
        Special::IntOrString => match v {
            Value::String(s) => {
                set(message, "type", ReflectValueBox::I64(1));
                set(message, "strVal", ReflectValueBox::String(s.clone()));
            }
            Value::Number(n) => {
                let n = n
                    .as_i64()
                    .and_then(|n| i32::try_from(n).ok())
                    .ok_or_else(|| field_error(path, format!("{n} is not a 32-bit integer")))?;
                set(message, "type", ReflectValueBox::I64(0));
                set(message, "intVal", ReflectValueBox::I32(n));
            }
            other => {
                return Err(field_error(
                    path,
                    format!("expected a number or a string, not {}", type_name(other)),
                ))
            }
        },
        Special::Quantity => {
            let text = match v {
                Value::String(s) => s.clone(),
                Value::Number(n) => n.to_string(),
                other => {
                    return Err(field_error(
                        path,
                        format!("expected a quantity, not {}", type_name(other)),
                    ))
                }
            };
            set(message, "string", ReflectValueBox::String(text));
        }
        Special::EmbeddedJson => {
            let raw = serde_json::to_vec(v).map_err(|e| field_error(path, e.to_string()))?;
            let name = if message.descriptor_dyn().field_by_name("Raw").is_some() {
                "Raw"
            } else {
                "raw"
            };
            set(message, name, ReflectValueBox::Bytes(raw));
        }
        Special::ExtraValue => {
            let Value::Array(items) = v else {
                return Err(field_error(
                    path,
                    format!("expected a list, not {}", type_name(v)),
                ));
            };
            let field = message
                .descriptor_dyn()
                .field_by_name("items")
                .ok_or_else(|| field_error(path, "ExtraValue without items"))?;
            let mut repeated = field.mut_repeated(message);
            for item in items {
                repeated.push(value_from_json(&RuntimeType::String, item, path)?);
            }
        }
    }
    Ok(())
}

fn type_name(v: &Value) -> &'static str {
    match v {
        Value::Null => "null",
        Value::Bool(_) => "a boolean",
        Value::Number(_) => "a number",
        Value::String(_) => "a string",
        Value::Array(_) => "a list",
        Value::Object(_) => "an object",
    }
}

fn runtime_type_name(t: &RuntimeType) -> &'static str {
    match t {
        RuntimeType::I32 | RuntimeType::I64 | RuntimeType::U32 | RuntimeType::U64 => "an integer",
        RuntimeType::F32 | RuntimeType::F64 => "a number",
        RuntimeType::Bool => "a boolean",
        RuntimeType::String => "a string",
        RuntimeType::VecU8 => "a base64 string",
        RuntimeType::Enum(_) => "an enum number",
        RuntimeType::Message(_) => "an object",
    }
}

#[cfg(test)]
mod tests;

/// Walks `bytes` as the wire form of `descriptor`'s message without
/// building it, counting the messages it holds; an error past
/// [`MAX_MESSAGES`] or [`MAX_DEPTH`], or when the wire form is malformed.
pub fn check_cost(descriptor: &MessageDescriptor, bytes: &[u8]) -> Result<(), ProtobufError> {
    let mut count = 0;
    walk(descriptor, bytes, 0, &mut count)
}

fn too_complex(problem: String) -> ProtobufError {
    ProtobufError::TooComplex(problem)
}

fn walk(
    descriptor: &MessageDescriptor,
    bytes: &[u8],
    depth: usize,
    count: &mut usize,
) -> Result<(), ProtobufError> {
    *count += 1;
    if *count > MAX_MESSAGES {
        return Err(too_complex(format!("more than {MAX_MESSAGES} messages")));
    }
    if depth > MAX_DEPTH {
        return Err(too_complex(format!("messages nested more than {MAX_DEPTH} deep")));
    }
    each_delimited(bytes, |number, value| {
        let Some(field) = descriptor.field_by_number(number) else {
            return Ok(());
        };
        match field.runtime_field_type() {
            RuntimeFieldType::Singular(RuntimeType::Message(m))
            | RuntimeFieldType::Repeated(RuntimeType::Message(m)) => walk(&m, value, depth + 1, count),
            // A map entry's field 2 is its value.
            RuntimeFieldType::Map(_, RuntimeType::Message(m)) => each_delimited(value, |number, value| {
                if number == 2 {
                    walk(&m, value, depth + 1, count)?;
                }
                Ok(())
            }),
            _ => Ok(()),
        }
    })
}

/// Calls `f` with the number and bytes of each length-delimited field of a
/// message's wire form, skipping the others; an error when it is malformed.
fn each_delimited(
    mut bytes: &[u8],
    mut f: impl FnMut(u32, &[u8]) -> Result<(), ProtobufError>,
) -> Result<(), ProtobufError> {
    while !bytes.is_empty() {
        let tag = varint(&mut bytes)?;
        let number =
            u32::try_from(tag >> 3).map_err(|_| too_complex("a field number out of range".into()))?;
        match tag & 7 {
            0 => {
                varint(&mut bytes)?;
            }
            1 => bytes = skip(bytes, 8)?,
            5 => bytes = skip(bytes, 4)?,
            2 => {
                let len = usize::try_from(varint(&mut bytes)?)
                    .map_err(|_| too_complex("a length out of range".into()))?;
                if len > bytes.len() {
                    return Err(too_complex("a length past the end of the body".into()));
                }
                let (value, rest) = bytes.split_at(len);
                bytes = rest;
                f(number, value)?;
            }
            other => return Err(too_complex(format!("wire type {other} (groups are not used)"))),
        }
    }
    Ok(())
}

fn varint(bytes: &mut &[u8]) -> Result<u64, ProtobufError> {
    let mut value = 0u64;
    for i in 0..10 {
        let (&b, rest) = bytes
            .split_first()
            .ok_or_else(|| too_complex("a number cut short".into()))?;
        *bytes = rest;
        value |= u64::from(b & 0x7f) << (7 * i);
        if b & 0x80 == 0 {
            return Ok(value);
        }
    }
    Err(too_complex("a number longer than 10 bytes".into()))
}

fn skip(bytes: &[u8], n: usize) -> Result<&[u8], ProtobufError> {
    bytes
        .get(n..)
        .ok_or_else(|| too_complex("a fixed-size number cut short".into()))
}
