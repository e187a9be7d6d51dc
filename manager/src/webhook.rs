//! The validating admission webhook: the API server asks it about every
//! create and update of a Job or PeriodicJob (what people write; Tasks are
//! the manager's own, and a Task made by hand is still validated before it
//! is scheduled), and a spec the
//! controllers would refuse (a circle of groups, an unknown `after`, a bad
//! cron schedule, a timeout out of range) is refused at `kubectl apply`
//! with the same message, instead of being stored and failing later.
//!
//! Every replica serves it (validation reads nothing but the request), over
//! HTTPS with the certificate it is given; the API server's
//! ValidatingWebhookConfiguration trusts that certificate's CA. The
//! controllers validate again before acting, so a webhook that is down
//! (failurePolicy Ignore) costs the early error, never safety.

use std::future::Future;
use std::net::SocketAddr;

use axum::routing::post;
use axum::{Json, Router};
use k8s4r_api::validation::{validate_job_spec, validate_task_spec};
use k8s4r_api::{JobSpec, PeriodicJobSpec, TaskSpec};
use k8s4r_service::https;
use serde::de::DeserializeOwned;
use serde_json::{json, Value};
use tokio_util::sync::CancellationToken;

use crate::periodic::schedule_of;

/// The path the webhook answers on.
pub const PATH: &str = "/validate";
/// The name of the webhook in its ValidatingWebhookConfiguration (and in
/// the API server's refusals).
pub const NAME: &str = "validate.robot.k8s4r.io";
/// The resources it validates.
pub const RESOURCES: [&str; 2] = ["jobs", "periodicjobs"];

/// Where and with which certificate the webhook serves.
#[derive(Clone, Debug)]
pub struct WebhookConfig {
    /// The address to listen on.
    pub addr: SocketAddr,
    /// Its certificate chain, PEM.
    pub cert_pem: String,
    /// Its private key, PEM.
    pub key_pem: String,
}

/// Binds the webhook; returns the bound address and the future that serves
/// it until `shutdown`.
pub async fn bind(
    config: &WebhookConfig,
    shutdown: CancellationToken,
) -> std::io::Result<(SocketAddr, impl Future<Output = ()> + Send + 'static)> {
    let tls = https::server_config(&config.cert_pem, &config.key_pem, None).map_err(std::io::Error::other)?;
    let app = Router::new().route(PATH, post(validate));
    https::bind(config.addr, tls, app, shutdown).await
}

async fn validate(Json(review): Json<Value>) -> Json<Value> {
    Json(answer(&review))
}

fn spec_of<T: DeserializeOwned>(object: &Value) -> Result<T, String> {
    serde_json::from_value(object["spec"].clone()).map_err(|e| format!("spec: {e}"))
}

/// The problems with the object a review carries, if any. An update that
/// leaves the spec as it was (labels, annotations, finalizers, a cancel or
/// retry) or of an object being deleted is not held to the spec: an
/// object stored while the webhook was down must stay manageable.
fn problems(request: &Value) -> Option<String> {
    let object = &request["object"];
    if request["operation"] == "UPDATE"
        && (object["spec"] == request["oldObject"]["spec"]
            || !object["metadata"]["deletionTimestamp"].is_null())
    {
        return None;
    }
    let outcome = match request["resource"]["resource"].as_str() {
        Some("jobs") => {
            spec_of::<JobSpec>(object).and_then(|s| validate_job_spec(&s).map_err(|e| e.to_string()))
        }
        Some("periodicjobs") => spec_of::<PeriodicJobSpec>(object).and_then(|s| {
            let name = object["metadata"]["name"]
                .as_str()
                .or(request["name"].as_str())
                .unwrap_or_default();
            schedule_of(name, &s).map(drop)
        }),
        Some("tasks") => {
            spec_of::<TaskSpec>(object).and_then(|s| validate_task_spec(&s).map_err(|e| e.to_string()))
        }
        _ => Ok(()),
    };
    outcome.err()
}

/// The AdmissionReview answering `review`: allowed, or refused with every
/// problem and its field (HTTP 403 in the answer, as controller-runtime's
/// webhooks refuse).
pub fn answer(review: &Value) -> Value {
    let request = &review["request"];
    let uid = request["uid"].clone();
    let response = match problems(request) {
        None => json!({ "uid": uid, "allowed": true }),
        Some(message) => json!({
            "uid": uid,
            "allowed": false,
            "status": { "code": 403, "reason": "Forbidden", "message": message },
        }),
    };
    json!({
        "apiVersion": review["apiVersion"].as_str().unwrap_or("admission.k8s.io/v1"),
        "kind": "AdmissionReview",
        "response": response,
    })
}

/// The ValidatingWebhookConfiguration that sends Job and PeriodicJob writes to a webhook at `url` whose certificate `ca_pem` signs.
pub fn configuration(url: &str, ca_pem: &str) -> Value {
    use base64::Engine;
    json!({
        "apiVersion": "admissionregistration.k8s.io/v1",
        "kind": "ValidatingWebhookConfiguration",
        "metadata": { "name": "k8s4r" },
        "webhooks": [{
            "name": NAME,
            "admissionReviewVersions": ["v1"],
            "sideEffects": "None",
            "failurePolicy": "Ignore",
            "timeoutSeconds": 5,
            "clientConfig": {
                "url": url,
                "caBundle": base64::engine::general_purpose::STANDARD.encode(ca_pem),
            },
            "rules": [{
                "apiGroups": [k8s4r_api::GROUP],
                "apiVersions": ["*"],
                "operations": ["CREATE", "UPDATE"],
                "resources": RESOURCES,
                "scope": "Namespaced",
            }],
        }],
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    fn review(resource: &str, spec: Value) -> Value {
        json!({
            "apiVersion": "admission.k8s.io/v1",
            "kind": "AdmissionReview",
            "request": {
                "uid": "u-1",
                "resource": { "group": "robot.k8s4r.io", "version": "v1alpha1", "resource": resource },
                "operation": "CREATE",
                "object": { "spec": spec },
            },
        })
    }

    fn task() -> Value {
        json!({ "driver": "raw_exec", "command": "/bin/true" })
    }

    #[test]
    fn a_valid_job_is_allowed() {
        let spec = json!({ "taskGroups": [{ "name": "a", "count": 1, "task": task() }] });
        let a = answer(&review("jobs", spec));
        assert_eq!(a["response"]["uid"], "u-1");
        assert_eq!(a["response"]["allowed"], true);
    }

    #[test]
    fn a_circle_of_groups_is_refused_with_the_circle() {
        let spec = json!({ "taskGroups": [
            { "name": "a", "count": 1, "task": task(), "after": ["b"] },
            { "name": "b", "count": 1, "task": task(), "after": ["a"] },
        ] });
        let a = answer(&review("jobs", spec));
        assert_eq!(a["response"]["allowed"], false);
        assert_eq!(a["response"]["status"]["code"], 403);
        assert_eq!(
            a["response"]["status"]["message"],
            "spec.taskGroups: the groups wait for each other in a circle: a -> b -> a"
        );
    }

    #[test]
    fn a_bad_schedule_or_zone_is_refused() {
        let job = json!({ "taskGroups": [{ "name": "a", "count": 1, "task": task() }] });
        let a = answer(&review(
            "periodicjobs",
            json!({ "schedule": "0 9 * * *", "timeZone": "Mars/Olympus", "jobTemplate": { "spec": job } }),
        ));
        let message = a["response"]["status"]["message"].as_str().unwrap();
        assert!(
            message.starts_with("spec.schedule: time zone \"Mars/Olympus\""),
            "{message}"
        );
        let a = answer(&review(
            "periodicjobs",
            json!({ "schedule": "0 9 * * *", "jobTemplate": { "spec": job } }),
        ));
        assert_eq!(a["response"]["allowed"], true);
    }

    #[test]
    fn an_update_leaving_the_spec_alone_is_allowed() {
        let bad = json!({ "taskGroups": [{ "name": "a", "count": 1, "task": task(), "after": ["a"] }] });
        let mut r = review("jobs", bad.clone());
        assert_eq!(answer(&r)["response"]["allowed"], false);
        r["request"]["operation"] = json!("UPDATE");
        r["request"]["oldObject"] = json!({ "spec": bad });
        assert_eq!(
            answer(&r)["response"]["allowed"],
            true,
            "an annotation on a stored bad Job"
        );
        r["request"]["oldObject"] = json!({ "spec": {} });
        assert_eq!(
            answer(&r)["response"]["allowed"],
            false,
            "a spec change is checked"
        );
    }

    #[test]
    fn a_spec_of_the_wrong_shape_is_refused() {
        let a = answer(&review("tasks", json!({ "driver": 7 })));
        assert_eq!(a["response"]["allowed"], false);
        assert!(a["response"]["status"]["message"]
            .as_str()
            .unwrap()
            .starts_with("spec: "));
    }
}
