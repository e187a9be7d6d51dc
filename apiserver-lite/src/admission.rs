//! Validating admission webhooks (`admissionregistration.k8s.io/v1`
//! ValidatingWebhookConfiguration), as kube-apiserver calls them: after the
//! write has been worked out and before it is stored, each webhook whose
//! rules match the request gets an `AdmissionReview` and may refuse it.
//!
//! The write is first worked out as a dry run, outside any lock, the
//! webhooks are asked, and then the write is made for real only if, under
//! the store's lock, it still comes out as what they approved (else the
//! whole round is tried again, as kube-apiserver retries an update that met
//! a newer version).
//!
//! What is not done (KNOWN_DIFFERENCES in the README): webhooks named by a
//! `service` (only `url` is reachable without cluster DNS), namespace and
//! object selectors (every matching request is sent), `matchConditions`,
//! mutating webhooks, and DELETE and CONNECT operations.

use std::time::Duration;

use axum::http::StatusCode;
use serde_json::{json, Value};

use crate::authz::Identity;
use crate::error::ApiError;
use crate::object::Object;
use crate::resources::ResourceType;
use crate::store::State;

/// Where configurations are stored.
pub const CONFIGURATIONS: &str = "validatingwebhookconfigurations.admissionregistration.k8s.io";
/// kube-apiserver's default and longest webhook timeouts.
const DEFAULT_TIMEOUT: Duration = Duration::from_secs(10);
const MAX_TIMEOUT: Duration = Duration::from_secs(30);

/// One webhook of a configuration, as far as calling it goes.
#[derive(Clone, Debug)]
pub struct Webhook {
    name: String,
    url: Option<String>,
    ca_bundle: Option<Vec<u8>>,
    ignore_failure: bool,
    timeout: Duration,
}

/// The operation a write is to a webhook.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Operation {
    Create,
    Update,
}

impl Operation {
    fn as_str(self) -> &'static str {
        match self {
            Operation::Create => "CREATE",
            Operation::Update => "UPDATE",
        }
    }
}

fn matches_list(list: &Value, want: &str) -> bool {
    list.as_array().is_some_and(|l| {
        l.iter()
            .any(|v| v.as_str().is_some_and(|s| s == "*" || s == want))
    })
}

/// Whether a rule's `resources` entry covers `resource[/sub]`.
fn matches_resource(list: &Value, resource: &str, sub: Option<&str>) -> bool {
    list.as_array().is_some_and(|l| {
        l.iter().filter_map(Value::as_str).any(|entry| {
            let (r, s) = entry.split_once('/').map_or((entry, None), |(r, s)| (r, Some(s)));
            let resource_ok = r == "*" || r == resource;
            let sub_ok = match (s, sub) {
                (None, None) => true,
                (Some(s), Some(sub)) => s == "*" || s == sub,
                _ => false,
            };
            resource_ok && sub_ok
        })
    })
}

fn rule_matches(rule: &Value, rt: &ResourceType, sub: Option<&str>, op: Operation) -> bool {
    let scope = rule["scope"].as_str().unwrap_or("*");
    let scope_ok = match scope {
        "Cluster" => !rt.namespaced,
        "Namespaced" => rt.namespaced,
        _ => true,
    };
    scope_ok
        && matches_list(&rule["apiGroups"], &rt.group)
        && matches_list(&rule["apiVersions"], &rt.version)
        && matches_list(&rule["operations"], op.as_str())
        && matches_resource(&rule["resources"], &rt.plural, sub)
}

/// The webhooks whose rules match a write of `rt` (its status when
/// `status`), in name order of their configurations.
pub fn matching(state: &State, rt: &ResourceType, status: bool, op: Operation) -> Vec<Webhook> {
    let sub = status.then_some("status");
    let mut hooks = Vec::new();
    for (_, config) in state.list(CONFIGURATIONS, None) {
        let config = config.value();
        let Some(webhooks) = config["webhooks"].as_array() else {
            continue;
        };
        for hook in webhooks {
            let rules = hook["rules"].as_array().map(Vec::as_slice).unwrap_or_default();
            if !rules.iter().any(|r| rule_matches(r, rt, sub, op)) {
                continue;
            }
            let client = &hook["clientConfig"];
            let ca_bundle = client["caBundle"].as_str().and_then(|b| {
                use base64::Engine;
                base64::engine::general_purpose::STANDARD.decode(b).ok()
            });
            let timeout = hook["timeoutSeconds"]
                .as_u64()
                .map_or(DEFAULT_TIMEOUT, Duration::from_secs)
                .min(MAX_TIMEOUT);
            hooks.push(Webhook {
                name: hook["name"].as_str().unwrap_or_default().to_owned(),
                url: client["url"].as_str().map(str::to_owned),
                ca_bundle,
                ignore_failure: hook["failurePolicy"].as_str() == Some("Ignore"),
                timeout,
            });
        }
    }
    hooks
}

/// What the webhooks are told about one write.
pub struct Request<'a> {
    pub rt: &'a ResourceType,
    pub status: bool,
    pub operation: Operation,
    pub namespace: &'a str,
    pub name: &'a str,
    pub object: &'a Object,
    pub old: Option<&'a Object>,
    pub identity: &'a Identity,
    pub dry_run: bool,
}

fn review_of(req: &Request<'_>, uid: &str) -> Value {
    let rt = req.rt;
    let gvk = json!({"group": rt.group, "version": rt.version, "kind": rt.kind});
    let gvr = json!({"group": rt.group, "version": rt.version, "resource": rt.plural});
    let mut request = json!({
        "uid": uid,
        "kind": gvk,
        "resource": gvr,
        "requestKind": gvk,
        "requestResource": gvr,
        "name": req.name,
        "operation": req.operation.as_str(),
        "userInfo": req.identity.user_info(),
        "object": *req.object.value(),
        "oldObject": req.old.map(|o| (*o.value()).clone()),
        "dryRun": req.dry_run,
    });
    if req.status {
        request["subResource"] = json!("status");
    }
    if rt.namespaced {
        request["namespace"] = json!(req.namespace);
    }
    json!({
        "apiVersion": "admission.k8s.io/v1",
        "kind": "AdmissionReview",
        "request": request,
    })
}

/// Asks every webhook in turn; the first refusal ends the write with its
/// message, as kube-apiserver words it. Returns the webhooks' warnings.
pub async fn review(hooks: &[Webhook], req: &Request<'_>) -> Result<Vec<String>, ApiError> {
    let mut warnings = Vec::new();
    for hook in hooks {
        let uid = uuid::Uuid::new_v4().to_string();
        match call(hook, &review_of(req, &uid)).await {
            Ok(answer) => {
                let response = &answer["response"];
                if let Some(w) = response["warnings"].as_array() {
                    warnings.extend(w.iter().filter_map(Value::as_str).map(str::to_owned));
                }
                if response["allowed"].as_bool() == Some(true) {
                    continue;
                }
                return Err(denial(&hook.name, &response["status"]));
            }
            Err(why) if hook.ignore_failure => {
                tracing::warn!(webhook = %hook.name, error = %why, "webhook failed; failurePolicy Ignore lets the request through");
            }
            Err(why) => {
                return Err(ApiError::internal(format!(
                    "Internal error occurred: failed calling webhook \"{}\": {why}",
                    hook.name
                )));
            }
        }
    }
    Ok(warnings)
}

/// A refusal as kube-apiserver words it: the webhook's code (400 when it
/// gave none below 400) and its message after "admission webhook ... denied
/// the request".
fn denial(webhook: &str, status: &Value) -> ApiError {
    let code = status["code"]
        .as_u64()
        .and_then(|c| u16::try_from(c).ok())
        .and_then(|c| StatusCode::from_u16(c).ok())
        .filter(|c| c.as_u16() >= 400)
        .unwrap_or(StatusCode::BAD_REQUEST);
    let reason = match code {
        StatusCode::FORBIDDEN => "Forbidden",
        StatusCode::UNPROCESSABLE_ENTITY => "Invalid",
        StatusCode::CONFLICT => "Conflict",
        _ if code.is_server_error() => "InternalError",
        _ => "BadRequest",
    };
    let denied = format!("admission webhook \"{webhook}\" denied the request");
    let message = match (status["message"].as_str(), status["reason"].as_str()) {
        (Some(m), _) if !m.is_empty() => format!("{denied}: {m}"),
        (_, Some(r)) if !r.is_empty() => format!("{denied}: {r}"),
        _ => format!("{denied} without explanation"),
    };
    ApiError::new(code, reason, message)
}

async fn call(hook: &Webhook, review: &Value) -> Result<Value, String> {
    let url = hook.url.as_deref().ok_or_else(|| {
        "the webhook names a service; apiserver-lite reaches webhooks by clientConfig.url only".to_owned()
    })?;
    let client = client_for(hook)?;
    let response = client
        .post(url)
        .json(review)
        .send()
        .await
        .map_err(|e| format!("Post {url:?}: {}", error_chain(&e)))?;
    if !response.status().is_success() {
        return Err(format!("Post {url:?}: status {}", response.status()));
    }
    let body: Value = response
        .json()
        .await
        .map_err(|e| format!("Post {url:?}: the answer is not an AdmissionReview: {e}"))?;
    if body["response"].is_null() {
        return Err(format!("Post {url:?}: the AdmissionReview has no response"));
    }
    Ok(body)
}

fn error_chain(e: &dyn std::error::Error) -> String {
    let mut out = e.to_string();
    let mut source = e.source();
    while let Some(s) = source {
        out.push_str(": ");
        out.push_str(&s.to_string());
        source = s.source();
    }
    out
}

/// The client for a webhook, kept per URL, caBundle and timeout so that
/// its connections are reused across calls.
fn client_for(hook: &Webhook) -> Result<reqwest::Client, String> {
    use std::collections::HashMap;
    use std::sync::{Mutex, OnceLock};
    type Key = (Option<String>, Option<Vec<u8>>, Duration);
    static CLIENTS: OnceLock<Mutex<HashMap<Key, reqwest::Client>>> = OnceLock::new();
    let key = (hook.url.clone(), hook.ca_bundle.clone(), hook.timeout);
    let clients = CLIENTS.get_or_init(Mutex::default);
    if let Some(client) = clients.lock().unwrap_or_else(|p| p.into_inner()).get(&key) {
        return Ok(client.clone());
    }
    let client = new_client(hook)?;
    let mut clients = clients.lock().unwrap_or_else(|p| p.into_inner());
    // A configuration that changes often must not grow this without end.
    if clients.len() >= 64 {
        clients.clear();
    }
    clients.insert(key, client.clone());
    Ok(client)
}

/// An HTTPS client trusting the webhook's caBundle only (no caBundle: the
/// call fails, where kube-apiserver would trust the system's roots).
fn new_client(hook: &Webhook) -> Result<reqwest::Client, String> {
    use rustls::pki_types::pem::PemObject;
    use rustls::pki_types::CertificateDer;
    let mut roots = rustls::RootCertStore::empty();
    if let Some(ca) = &hook.ca_bundle {
        for cert in CertificateDer::pem_slice_iter(ca) {
            let cert = cert.map_err(|e| format!("clientConfig.caBundle: {e}"))?;
            roots
                .add(cert)
                .map_err(|e| format!("clientConfig.caBundle: {e}"))?;
        }
    }
    let tls = rustls::ClientConfig::builder_with_provider(std::sync::Arc::new(
        rustls::crypto::ring::default_provider(),
    ))
    .with_safe_default_protocol_versions()
    .map_err(|e| e.to_string())?
    .with_root_certificates(roots)
    .with_no_client_auth();
    reqwest::Client::builder()
        .use_preconfigured_tls(tls)
        .timeout(hook.timeout)
        .build()
        .map_err(|e| e.to_string())
}

/// Whether two workings-out of one write store the same thing (the uid,
/// times and versions a create makes up differ every time).
pub fn same(a: &Object, b: &Object) -> bool {
    fn strip(o: &Object) -> Value {
        let mut v = (*o.value()).clone();
        if let Some(m) = v["metadata"].as_object_mut() {
            for k in ["uid", "creationTimestamp", "resourceVersion", "managedFields"] {
                m.remove(k);
            }
        }
        v
    }
    strip(a) == strip(b)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn rt(group: &str, plural: &str, namespaced: bool) -> ResourceType {
        let mut rt = crate::resources::builtins()
            .into_iter()
            .find(|r| r.plural == "configmaps")
            .expect("configmaps");
        rt.group = group.into();
        rt.plural = plural.into();
        rt.namespaced = namespaced;
        rt
    }

    #[test]
    fn rules_match_group_version_resource_operation_and_scope() {
        let jobs = rt("robot.k8s4r.io", "jobs", true);
        let rule = json!({
            "apiGroups": ["robot.k8s4r.io"], "apiVersions": ["*"],
            "operations": ["CREATE", "UPDATE"], "resources": ["jobs"], "scope": "Namespaced",
        });
        let mut jobs_v = jobs.clone();
        jobs_v.version = "v1alpha1".into();
        assert!(rule_matches(&rule, &jobs_v, None, Operation::Create));
        assert!(
            !rule_matches(&rule, &jobs_v, Some("status"), Operation::Update),
            "not /status"
        );
        let mut other = jobs_v.clone();
        other.plural = "tasks".into();
        assert!(!rule_matches(&rule, &other, None, Operation::Create));
        let cluster = json!({
            "apiGroups": ["*"], "apiVersions": ["*"], "operations": ["*"],
            "resources": ["*/*"], "scope": "Cluster",
        });
        assert!(!rule_matches(
            &cluster,
            &jobs_v,
            Some("status"),
            Operation::Update
        ));
        let all_status = json!({
            "apiGroups": ["*"], "apiVersions": ["*"], "operations": ["UPDATE"], "resources": ["*/status"],
        });
        assert!(rule_matches(
            &all_status,
            &jobs_v,
            Some("status"),
            Operation::Update
        ));
        assert!(!rule_matches(&all_status, &jobs_v, None, Operation::Update));
    }

    #[test]
    fn a_refusal_keeps_the_webhooks_code_and_message() {
        let e = denial("jobs.example", &json!({"code": 403, "message": "no cycles"}));
        assert_eq!(e.code, StatusCode::FORBIDDEN);
        assert_eq!(
            e.message,
            "admission webhook \"jobs.example\" denied the request: no cycles"
        );
        let e = denial("w", &json!({"code": 200}));
        assert_eq!(e.code, StatusCode::BAD_REQUEST);
        assert_eq!(
            e.message,
            "admission webhook \"w\" denied the request without explanation"
        );
    }

    #[test]
    fn made_up_fields_do_not_count_as_a_change() {
        let a = Object::new(
            json!({"metadata": {"name": "x", "uid": "1", "creationTimestamp": "t1"}, "spec": {"a": 1}}),
        );
        let b = Object::new(
            json!({"metadata": {"name": "x", "uid": "2", "creationTimestamp": "t2"}, "spec": {"a": 1}}),
        );
        let c = Object::new(json!({"metadata": {"name": "x", "uid": "2"}, "spec": {"a": 2}}));
        assert!(same(&a, &b));
        assert!(!same(&a, &c));
    }
}
