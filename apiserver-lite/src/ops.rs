//! The API semantics of writes: create, update, patch and delete, the
//! status subresource, generation, finalizers and namespaces. Everything
//! here runs inside one store transaction. What a write means for a CRD is
//! in [`crate::crd`]; the garbage collector that carries out orphan and
//! foreground deletions is in [`crate::gc`].

use std::sync::Arc;

use serde_json::{json, Value};

use crate::authz::Identity;
use crate::error::{ApiError, FieldError};
use crate::fields::{self, Scope};
use crate::metadata::{meta_str, now};
use crate::object::Object;
use crate::resources::{self, ResourceType};
use crate::schema;
use crate::store::Txn;
use crate::{crd, escalation};

fn qualified(rt: &ResourceType) -> String {
    rt.group_resource()
}

/// How unknown fields are answered (`fieldValidation`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum FieldValidation {
    Ignore,
    Warn,
    Strict,
}

/// Per-request write options.
#[derive(Debug, Clone)]
pub struct WriteOpts {
    pub manager: String,
    pub dry_run: bool,
    pub field_validation: FieldValidation,
    /// Who writes: a user's writes of Roles and bindings are held to RBAC's
    /// escalation checks; the server's own writes are the administrator's.
    pub identity: Identity,
}

/// What a write did, for the response.
pub struct Written {
    pub object: Object,
    pub created: bool,
    pub warnings: Vec<String>,
}

impl Written {
    fn created(object: Object, warnings: Vec<String>) -> Written {
        Written {
            object,
            created: true,
            warnings,
        }
    }

    fn updated(object: Object, warnings: Vec<String>) -> Written {
        Written {
            object,
            created: false,
            warnings,
        }
    }
}

/// The patch formats of PATCH requests.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum PatchType {
    Merge,
    Json,
    Strategic,
    Apply,
}

impl PatchType {
    pub fn from_content_type(ct: &str) -> Option<Self> {
        let base = ct.split(';').next().unwrap_or_default().trim();
        match base {
            "application/merge-patch+json" => Some(PatchType::Merge),
            "application/json-patch+json" => Some(PatchType::Json),
            "application/strategic-merge-patch+json" => Some(PatchType::Strategic),
            "application/apply-patch+yaml" | "application/apply-patch+json" => Some(PatchType::Apply),
            _ => None,
        }
    }
}

fn scope_of(rt: &ResourceType, status: bool) -> Scope {
    if status {
        Scope::Status
    } else {
        Scope::Main {
            status_is_subresource: rt.status_subresource,
        }
    }
}

/// Checks apiVersion and kind of a body against the URL's resource.
pub(crate) fn check_type(rt: &ResourceType, obj: &Value) -> Result<(), ApiError> {
    if !obj.is_object() {
        return Err(ApiError::bad_request(
            "the body of the request must be a JSON object",
        ));
    }
    if let Some(av) = obj["apiVersion"].as_str() {
        let group = av.rsplit_once('/').map(|(g, _)| g).unwrap_or("");
        if group != rt.group {
            return Err(ApiError::bad_request(format!(
                "the API version in the data ({av}) does not match the expected API version ({})",
                rt.api_version()
            )));
        }
    }
    if let Some(kind) = obj["kind"].as_str() {
        if kind != rt.kind {
            return Err(ApiError::bad_request(format!(
                "the kind in the data ({kind}) does not match the expected kind ({}) of resource {}",
                rt.kind,
                rt.group_resource()
            )));
        }
    }
    Ok(())
}

/// A Secret's `stringData` is write-only: its entries are stored in `data`,
/// base64-encoded, over entries of the same key.
fn fold_string_data(secret: &mut Value) {
    use base64::Engine as _;
    let Some(Value::Object(plain)) = secret.as_object_mut().and_then(|o| o.remove("stringData")) else {
        return;
    };
    if !secret["data"].is_object() {
        secret["data"] = Value::Object(Default::default());
    }
    for (key, value) in plain {
        let text = value.as_str().unwrap_or_default();
        secret["data"][key] = Value::String(base64::engine::general_purpose::STANDARD.encode(text));
    }
}

/// Kubernetes's bound on a ConfigMap's or Secret's data, in bytes.
const MAX_DATA_BYTES: usize = 1024 * 1024;

/// What Kubernetes checks of a ConfigMap's or Secret's data: every key a
/// valid key (`[-._a-zA-Z0-9]+`, at most 253), a key in `data` or
/// `binaryData` but not both, base64 where it must be, and at most 1 MiB
/// of values in all (decoded).
fn check_data(obj: &Value, secret: bool) -> Vec<FieldError> {
    use base64::Engine as _;
    let mut errs = Vec::new();
    let mut total = 0usize;
    let mut seen = std::collections::BTreeSet::new();
    let fields: &[(&str, bool)] = if secret {
        &[("data", true)]
    } else {
        &[("data", false), ("binaryData", true)]
    };
    for (field, encoded) in fields {
        let Some(map) = obj[*field].as_object() else {
            continue;
        };
        for (key, value) in map {
            let path = format!("{field}[{key}]");
            let valid = !key.is_empty()
                && key.len() <= 253
                && key != "."
                && key != ".."
                && key
                    .bytes()
                    .all(|b| b.is_ascii_alphanumeric() || matches!(b, b'-' | b'_' | b'.'));
            if !valid {
                errs.push(FieldError::invalid(
                    &path,
                    &Value::String(key.clone()),
                    "a valid config key must consist of alphanumeric characters, '-', '_' or '.'",
                ));
            }
            if !seen.insert(key.clone()) {
                errs.push(FieldError::invalid(
                    &path,
                    &Value::String(key.clone()),
                    "duplicate of key present in data",
                ));
            }
            let text = value.as_str().unwrap_or_default();
            total += if *encoded {
                match base64::engine::general_purpose::STANDARD.decode(text) {
                    Ok(bytes) => bytes.len(),
                    Err(_) => {
                        errs.push(FieldError::invalid(
                            &path,
                            &Value::String("<value>".into()),
                            "illegal base64 data",
                        ));
                        0
                    }
                }
            } else {
                text.len()
            };
        }
    }
    if total > MAX_DATA_BYTES {
        errs.push(FieldError {
            reason: "FieldValueTooLong",
            field: if secret { "data".into() } else { "[]".into() },
            detail: format!("Too long: must have at most {MAX_DATA_BYTES} bytes"),
        });
    }
    errs
}

/// Prunes and validates a custom resource; returns the warnings of pruning.
fn prune_and_validate(rt: &ResourceType, obj: &mut Value, opts: &WriteOpts) -> Result<Vec<String>, ApiError> {
    let mut warnings = Vec::new();
    let name = meta_str(obj, "name").to_string();
    if rt.group.is_empty() && rt.plural == "secrets" {
        fold_string_data(obj);
    }
    if rt.group.is_empty() && matches!(rt.plural.as_str(), "secrets" | "configmaps") {
        let errs = check_data(obj, rt.plural == "secrets");
        if !errs.is_empty() {
            return Err(ApiError::invalid(&rt.kind, &rt.group, &name, &errs));
        }
    }
    if rt.is_crd() {
        if let Err(errs) = resources::from_crd(obj) {
            return Err(ApiError::invalid(&rt.kind, &rt.group, &name, &errs));
        }
        return Ok(warnings);
    }
    let Some(schema) = &rt.schema else {
        return Ok(warnings);
    };
    let removed = schema::prune(obj, schema);
    if !removed.is_empty() {
        match opts.field_validation {
            FieldValidation::Strict => {
                let list: Vec<String> = removed.iter().map(|f| format!("unknown field \"{f}\"")).collect();
                return Err(ApiError::bad_request(format!(
                    "strict decoding error: {}",
                    list.join(", ")
                )));
            }
            FieldValidation::Warn => {
                warnings.extend(removed.iter().map(|f| format!("unknown field \"{f}\"")));
            }
            FieldValidation::Ignore => {}
        }
    }
    schema::apply_defaults(obj, schema);
    let errs = schema::validate(obj, schema);
    if !errs.is_empty() {
        return Err(ApiError::invalid(&rt.kind, &rt.group, &name, &errs));
    }
    Ok(warnings)
}

fn validate_metadata(rt: &ResourceType, obj: &Value) -> Result<(), ApiError> {
    let name = meta_str(obj, "name");
    if let Some(err) = crate::metadata::name_problem(&rt.group, name) {
        return Err(ApiError::invalid(&rt.kind, &rt.group, name, &[err]));
    }
    for key in ["labels", "annotations"] {
        if let Some(m) = obj["metadata"].get(key) {
            let ok = m.is_null() || m.as_object().is_some_and(|m| m.values().all(|v| v.is_string()));
            if !ok {
                return Err(ApiError::invalid(
                    &rt.kind,
                    &rt.group,
                    name,
                    &[crate::error::FieldError::invalid(
                        &format!("metadata.{key}"),
                        m,
                        "must be a map of strings",
                    )],
                ));
            }
        }
    }
    Ok(())
}

fn random_suffix() -> String {
    uuid::Uuid::new_v4().simple().to_string()[..5].to_string()
}

fn namespace_exists(txn: &Txn<'_>, ns: &str) -> bool {
    txn.state.get("namespaces", "", ns).is_some()
}

/// The parts of an object whose change bumps `generation`.
fn spec_view(rt: &ResourceType, obj: &Value) -> Value {
    let mut v = obj.clone();
    if let Some(m) = v.as_object_mut() {
        m.remove("metadata");
        if rt.status_subresource || !rt.custom {
            m.remove("status");
        }
    }
    v
}

fn comparable(obj: &Value) -> Value {
    let mut v = obj.clone();
    if let Some(m) = v["metadata"].as_object_mut() {
        m.remove("managedFields");
        m.remove("resourceVersion");
    }
    v
}

/// Gives an object that asks for a generated name (`generateName`, no
/// `name`) its name.
pub fn settle_generated_name(obj: &mut Value) {
    if meta_str(obj, "name").is_empty() {
        let prefix = meta_str(obj, "generateName").to_string();
        if !prefix.is_empty() && obj["metadata"].is_object() {
            obj["metadata"]["name"] = json!(format!("{prefix}{}", random_suffix()));
        }
    }
}

pub fn create(
    txn: &mut Txn<'_>,
    rt: &ResourceType,
    ns: &str,
    obj: Value,
    opts: &WriteOpts,
    managed: Option<Value>,
) -> Result<Written, ApiError> {
    check_type(rt, &obj)?;
    let mut obj = rt.to_storage(obj);
    if !obj["metadata"].is_object() {
        obj["metadata"] = json!({});
    }
    let body_ns = meta_str(&obj, "namespace").to_string();
    if rt.namespaced {
        if !body_ns.is_empty() && body_ns != ns {
            return Err(ApiError::bad_request(
                "the namespace of the provided object does not match the namespace sent on the request",
            ));
        }
        if !namespace_exists(txn, ns) {
            return Err(ApiError::not_found("namespaces", ns));
        }
        obj["metadata"]["namespace"] = json!(ns);
    } else if let Some(m) = obj["metadata"].as_object_mut() {
        m.remove("namespace");
    }
    settle_generated_name(&mut obj);
    obj["apiVersion"] = json!(rt.stored_api_version());
    obj["kind"] = json!(rt.kind);
    validate_metadata(rt, &obj)?;
    if rt.status_subresource && rt.custom {
        if let Some(m) = obj.as_object_mut() {
            m.remove("status");
        }
    }
    let warnings = prune_and_validate(rt, &mut obj, opts)?;
    escalation::check(txn.state, &opts.identity, rt, None, &obj)?;
    let name = meta_str(&obj, "name").to_string();
    let gr = rt.stored_resource();
    if txn
        .state
        .get(&gr, if rt.namespaced { ns } else { "" }, &name)
        .is_some()
    {
        return Err(ApiError::already_exists(&qualified(rt), &name));
    }
    let now = now();
    {
        let meta = obj["metadata"].as_object_mut().expect("metadata is an object");
        meta.insert("uid".into(), json!(uuid::Uuid::new_v4().to_string()));
        meta.insert("creationTimestamp".into(), json!(now));
        meta.insert("generation".into(), json!(1));
        for k in [
            "deletionTimestamp",
            "deletionGracePeriodSeconds",
            "resourceVersion",
            "selfLink",
            "managedFields",
        ] {
            meta.remove(k);
        }
    }
    match managed {
        Some(m) => obj["metadata"]["managedFields"] = m,
        None => fields::record_update(
            None,
            &mut obj,
            &opts.manager,
            &rt.api_version(),
            scope_of(rt, false),
            &now,
        ),
    }
    if rt.is_namespace() {
        obj["status"] = json!({"phase": "Active"});
        obj["spec"] = json!({"finalizers": ["kubernetes"]});
    }
    if rt.is_crd() {
        crd::accept(&mut obj);
    }
    if opts.dry_run {
        return Ok(Written::created(Object::new(obj), warnings));
    }
    Ok(Written::created(store(txn, rt, obj), warnings))
}

/// Stores a written object; a CRD's kinds are served from now on.
fn store(txn: &mut Txn<'_>, rt: &ResourceType, obj: Value) -> Object {
    if rt.is_crd() {
        crd::register(txn, &obj);
    }
    let gr = rt.stored_resource();
    let stored = txn.put(&gr, obj);
    if gr == crate::authz::CLUSTER_ROLES {
        // The role may be aggregated, or aggregated into others.
        return crate::aggregation::after_write(txn, stored);
    }
    stored
}

/// How an update treats the resourceVersion the client sent.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Precondition {
    /// PUT: must match when given; custom resources must give it.
    Put,
    /// PATCH: must match when the patched object still carries one.
    Patch,
}

/// Turns `new` (a full object written by a client) into the next stored
/// version of `old`, enforcing the rules of the main resource or /status.
#[allow(clippy::too_many_arguments)]
pub fn commit_update(
    txn: &mut Txn<'_>,
    rt: &ResourceType,
    old: &Arc<Value>,
    new: Value,
    status: bool,
    opts: &WriteOpts,
    precondition: Precondition,
    applied: bool,
) -> Result<Written, ApiError> {
    check_type(rt, &new)?;
    let mut new = rt.to_storage(new);
    let name = meta_str(old, "name").to_string();
    let sent_rv = meta_str(&new, "resourceVersion").to_string();
    if sent_rv.is_empty() {
        if precondition == Precondition::Put && rt.custom {
            return Err(ApiError::invalid(
                &rt.kind,
                &rt.group,
                &name,
                &[crate::error::FieldError::invalid(
                    "metadata.resourceVersion",
                    &json!("0x0"),
                    "must be specified for an update",
                )],
            ));
        }
    } else if sent_rv != meta_str(old, "resourceVersion") {
        return Err(ApiError::conflict(&qualified(rt), &name));
    }
    let body_name = meta_str(&new, "name");
    if !body_name.is_empty() && body_name != name {
        return Err(ApiError::bad_request(
            "the name of the object does not match the name on the URL",
        ));
    }
    if rt.namespaced {
        let body_ns = meta_str(&new, "namespace");
        if !body_ns.is_empty() && body_ns != meta_str(old, "namespace") {
            return Err(ApiError::bad_request(
                "the namespace of the provided object does not match the namespace sent on the request",
            ));
        }
    }
    if !new["metadata"].is_object() {
        new["metadata"] = json!({});
    }
    if status {
        // /status writes change status only.
        let mut next = (**old).clone();
        match new.get("status") {
            Some(s) => next["status"] = s.clone(),
            None => {
                if let Some(m) = next.as_object_mut() {
                    m.remove("status");
                }
            }
        }
        if applied {
            next["metadata"]["managedFields"] = new["metadata"]["managedFields"].clone();
        }
        new = next;
    } else {
        if rt.status_subresource {
            match old.get("status") {
                Some(s) => new["status"] = s.clone(),
                None => {
                    if let Some(m) = new.as_object_mut() {
                        m.remove("status");
                    }
                }
            }
        }
        let meta = new["metadata"].as_object_mut().expect("metadata is an object");
        for k in [
            "name",
            "namespace",
            "uid",
            "creationTimestamp",
            "deletionTimestamp",
            "deletionGracePeriodSeconds",
            "generation",
        ] {
            match old["metadata"].get(k) {
                Some(v) => {
                    meta.insert(k.into(), v.clone());
                }
                None => {
                    meta.remove(k);
                }
            }
        }
    }
    new["apiVersion"] = json!(rt.stored_api_version());
    new["kind"] = json!(rt.kind);
    validate_metadata(rt, &new)?;
    let warnings = prune_and_validate(rt, &mut new, opts)?;
    if rt.is_crd() && !status {
        let keep = new["status"].clone();
        crd::accept(&mut new);
        if keep.is_object() && keep["conditions"].is_array() {
            new["status"]["conditions"] = keep["conditions"].clone();
        }
    }
    if spec_view(rt, old) != spec_view(rt, &new) {
        let g = old["metadata"]["generation"].as_i64().unwrap_or(1);
        new["metadata"]["generation"] = json!(g + 1);
    }
    let t = now();
    if !applied {
        fields::record_update(
            Some(old),
            &mut new,
            &opts.manager,
            &rt.api_version(),
            scope_of(rt, status),
            &t,
        );
    }
    // Nothing changed: no new resourceVersion, no event (controllers rely on this).
    if comparable(old) == comparable(&new) {
        // Answered with the stored bytes `old` was read from: not serialized again.
        let stored = txn
            .state
            .get_object(&rt.stored_resource(), meta_str(old, "namespace"), &name)
            .cloned();
        return Ok(Written::updated(
            stored.unwrap_or_else(|| Object::new(old.clone())),
            warnings,
        ));
    }
    escalation::check(txn.state, &opts.identity, rt, Some(old), &new)?;
    if opts.dry_run {
        return Ok(Written::updated(Object::new(new), warnings));
    }
    let gr = rt.stored_resource();
    let ns = meta_str(old, "namespace").to_string();
    let finalizers_empty = new["metadata"]["finalizers"]
        .as_array()
        .is_none_or(|f| f.is_empty());
    if !new["metadata"]["deletionTimestamp"].is_null() && finalizers_empty {
        txn.put(&gr, new);
        let gone = txn.remove(&gr, &ns, &name).expect("just stored");
        after_remove(txn, rt, &gone.value());
        return Ok(Written::updated(gone, warnings));
    }
    Ok(Written::updated(store(txn, rt, new), warnings))
}

fn after_remove(txn: &mut Txn<'_>, rt: &ResourceType, gone: &Value) {
    if rt.is_crd() {
        crd::unregister(txn, gone);
    }
    if rt.stored_resource() == crate::authz::CLUSTER_ROLES {
        crate::aggregation::aggregate(txn);
    }
    if rt.is_namespace() {
        let ns = meta_str(gone, "name").to_string();
        for gr in txn.state.all_groups() {
            let keys: Vec<String> = txn
                .state
                .list(&gr, Some(&ns))
                .map(|((_, n), _)| n.clone())
                .collect();
            for name in keys {
                txn.remove(&gr, &ns, &name);
            }
        }
    }
}

/// Applies a patch of any type to a copy of the live object (or, for apply,
/// creates the object when it does not exist).
#[allow(clippy::too_many_arguments)]
pub fn patch(
    txn: &mut Txn<'_>,
    rt: &ResourceType,
    ns: &str,
    name: &str,
    kind: PatchType,
    body: &[u8],
    status: bool,
    force: bool,
    opts: &WriteOpts,
) -> Result<Written, ApiError> {
    let gr = rt.stored_resource();
    let live = txn.state.get(&gr, ns, name);
    let decode_err = |e: &dyn std::fmt::Display| ApiError::bad_request(format!("error decoding patch: {e}"));
    match kind {
        PatchType::Apply => {
            let config: Value = match serde_json::from_slice(body) {
                Ok(v) => v,
                Err(_) => serde_yaml::from_slice(body).map_err(|e| decode_err(&e))?,
            };
            if !config.is_object() {
                return Err(ApiError::bad_request(
                    "error decoding patch: apply patches must be objects",
                ));
            }
            check_type(rt, &config)?;
            if config["apiVersion"].is_null() || config["kind"].is_null() {
                return Err(ApiError::bad_request(
                    "apiVersion and kind must be set in an apply patch",
                ));
            }
            let cname = meta_str(&config, "name");
            if !cname.is_empty() && cname != name {
                return Err(ApiError::bad_request(
                    "the name of the object does not match the name on the URL",
                ));
            }
            let t = now();
            let scope = scope_of(rt, status);
            let empty = json!({"metadata": {}});
            let served = live.as_deref().map(|l| rt.from_storage(l));
            let base = served.as_deref().unwrap_or(&empty);
            let merged =
                match fields::apply(base, &config, &opts.manager, &rt.api_version(), scope, force, &t) {
                    Ok(m) => m,
                    Err(conflicts) if conflicts_only_with_last_applied(base, &conflicts, scope) => {
                        fields::apply(base, &config, &opts.manager, &rt.api_version(), scope, true, &t)
                            .map_err(apply_conflict)?
                    }
                    Err(conflicts) => return Err(apply_conflict(conflicts)),
                };
            match live {
                None => {
                    if status {
                        return Err(ApiError::not_found(&qualified(rt), name));
                    }
                    let mut obj = merged;
                    obj["metadata"]["name"] = json!(name);
                    let managed = obj["metadata"]["managedFields"].clone();
                    create(txn, rt, ns, obj, opts, Some(managed))
                }
                Some(live) => {
                    let mut merged = merged;
                    // Apply never carries a precondition unless the config does.
                    if meta_str(&config, "resourceVersion").is_empty() {
                        merged["metadata"]["resourceVersion"] = live["metadata"]["resourceVersion"].clone();
                    }
                    commit_update(txn, rt, &live, merged, status, opts, Precondition::Patch, true)
                }
            }
        }
        _ => {
            let live = live.ok_or_else(|| ApiError::not_found(&qualified(rt), name))?;
            let mut doc = rt.from_storage(&live).into_owned();
            match kind {
                PatchType::Merge | PatchType::Strategic => {
                    if kind == PatchType::Strategic && rt.custom {
                        return Err(ApiError::unsupported_media_type(
                            "the body of the request was in an unknown format - accepted media types include: application/json-patch+json, application/merge-patch+json, application/apply-patch+yaml",
                        ));
                    }
                    let mut p: Value = serde_json::from_slice(body).map_err(|e| decode_err(&e))?;
                    if !p.is_object() {
                        return Err(ApiError::bad_request(
                            "error decoding patch: a merge patch must be a JSON object",
                        ));
                    }
                    if kind == PatchType::Strategic {
                        strip_directives(&mut p);
                    }
                    json_patch::merge(&mut doc, &p);
                }
                PatchType::Json => {
                    let p: json_patch::Patch = serde_json::from_slice(body).map_err(|e| decode_err(&e))?;
                    json_patch::patch(&mut doc, &p).map_err(|e| {
                        ApiError::new(
                            axum::http::StatusCode::UNPROCESSABLE_ENTITY,
                            "Invalid",
                            format!("the server rejected our request due to an error in our request: {e}"),
                        )
                    })?;
                }
                PatchType::Apply => unreachable!("handled above"),
            }
            commit_update(txn, rt, &live, doc, status, opts, Precondition::Patch, false)
        }
    }
}

/// Strategic merge patch on the few built-in kinds served here has no list
/// merge keys worth honouring; its `$` directives are dropped and the rest is a
/// merge patch (see KNOWN_DIFFERENCES).
fn strip_directives(v: &mut Value) {
    if let Value::Object(m) = v {
        m.retain(|k, _| !k.starts_with('$'));
        for child in m.values_mut() {
            strip_directives(child);
        }
    }
}

/// Moving from client-side to server-side apply: like the real server, an
/// apply may take over fields that the object's last-applied-configuration
/// annotation says the previous (client-side) apply set.
fn conflicts_only_with_last_applied(live: &Value, conflicts: &[fields::ApplyConflict], scope: Scope) -> bool {
    let Some(last) =
        live["metadata"]["annotations"]["kubectl.kubernetes.io/last-applied-configuration"].as_str()
    else {
        return false;
    };
    let Ok(last) = serde_json::from_str::<Value>(last) else {
        return false;
    };
    let owned = fields::fields_of(&last, scope);
    // Only the manager that wrote the annotation (the client-side apply) yields.
    let annotation: Vec<String> = [
        "metadata",
        "annotations",
        "kubectl.kubernetes.io/last-applied-configuration",
    ]
    .iter()
    .map(|s| s.to_string())
    .collect();
    let writers: Vec<String> = fields::read_managed(live)
        .into_iter()
        .filter(|m| m.fields.contains(&annotation))
        .map(|m| m.manager)
        .collect();
    conflicts
        .iter()
        .all(|c| owned.contains(&c.path) && writers.contains(&c.manager))
}

fn apply_conflict(conflicts: Vec<fields::ApplyConflict>) -> ApiError {
    let n = conflicts.len();
    let lines: Vec<String> = conflicts
        .iter()
        .map(|c| format!("conflict with \"{}\": {}", c.manager, c.field))
        .collect();
    let message = if n == 1 {
        format!("Apply failed with 1 conflict: {}", lines[0])
    } else {
        format!("Apply failed with {n} conflicts: {}", lines.join("\n"))
    };
    let causes: Vec<Value> = conflicts
        .iter()
        .map(|c| json!({"reason": "FieldManagerConflict", "message": format!("conflict with \"{}\"", c.manager), "field": c.field}))
        .collect();
    ApiError::new(axum::http::StatusCode::CONFLICT, "Conflict", message)
        .with_details(json!({"causes": causes}))
}

/// Deletion propagation policies.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Propagation {
    Background,
    Foreground,
    Orphan,
}

pub enum Deleted {
    /// The object is gone.
    Gone(Object),
    /// Finalizers hold it; it now has a deletionTimestamp.
    Pending(Object),
}

#[allow(clippy::too_many_arguments)]
pub fn delete(
    txn: &mut Txn<'_>,
    rt: &ResourceType,
    ns: &str,
    name: &str,
    propagation: Propagation,
    precondition_uid: Option<&str>,
    precondition_rv: Option<&str>,
    dry_run: bool,
) -> Result<Deleted, ApiError> {
    let gr = rt.stored_resource();
    let live = txn
        .state
        .get(&gr, ns, name)
        .ok_or_else(|| ApiError::not_found(&qualified(rt), name))?;
    if precondition_uid.is_some_and(|u| u != meta_str(&live, "uid")) {
        return Err(ApiError::conflict(&qualified(rt), name));
    }
    if precondition_rv.is_some_and(|r| r != meta_str(&live, "resourceVersion")) {
        return Err(ApiError::conflict(&qualified(rt), name));
    }
    let mut finalizers: Vec<Value> = live["metadata"]["finalizers"]
        .as_array()
        .cloned()
        .unwrap_or_default();
    let extra = match propagation {
        Propagation::Foreground => Some("foregroundDeletion"),
        Propagation::Orphan => Some("orphan"),
        Propagation::Background => None,
    };
    if let Some(f) = extra {
        if !finalizers.iter().any(|x| x == f) {
            finalizers.push(json!(f));
        }
    }
    if dry_run {
        return Ok(Deleted::Pending(Object::new(live)));
    }
    if finalizers.is_empty() {
        let gone = txn.remove(&gr, ns, name).expect("present");
        after_remove(txn, rt, &gone.value());
        return Ok(Deleted::Gone(gone));
    }
    if !live["metadata"]["deletionTimestamp"].is_null()
        && live["metadata"]["finalizers"].as_array().map(|a| a.len()) == Some(finalizers.len())
    {
        return Ok(Deleted::Pending(Object::new(live)));
    }
    let mut next = (*live).clone();
    if next["metadata"]["deletionTimestamp"].is_null() {
        next["metadata"]["deletionTimestamp"] = json!(now());
        next["metadata"]["deletionGracePeriodSeconds"] = json!(0);
    }
    next["metadata"]["finalizers"] = Value::Array(finalizers);
    let obj = txn.put(&gr, next);
    // Orphan and foreground deletions are carried out by the collector.
    txn.garbage_possible = true;
    Ok(Deleted::Pending(obj))
}
