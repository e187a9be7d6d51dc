//! The default ClusterRoles every cluster has (`cluster-admin`, `admin`,
//! `edit`, `view`), made at every start as kube-apiserver's RBAC bootstrap
//! does, and ClusterRole aggregation, as its clusterrole-aggregation
//! controller does it.
//!
//! `admin`, `edit` and `view` carry an `aggregationRule`: their rules are
//! the union of the rules of every ClusterRole its selectors match, kept up
//! to date inside each write of a ClusterRole (so a change is seen by the
//! very next request). The rights themselves live in
//! `system:aggregate-to-{admin,edit,view}`, labelled to be aggregated, and
//! `view` is labelled into `edit`, `edit` into `admin`, so that each role
//! holds the one below it. Any ClusterRole labelled
//! `rbac.authorization.k8s.io/aggregate-to-view: "true"` (k8s4r's
//! `k8s4r-log-reader`, say) joins them.
//!
//! At start a default role that is missing is made again; one that exists
//! gets back its labels and its aggregation rule, and the rules it lost,
//! unless it is annotated `rbac.authorization.kubernetes.io/autoupdate:
//! "false"` (kube-apiserver's reconciliation). The rights are those of the
//! real roles, for the kinds this server serves.
//!
//! A rule an earlier version granted and the real roles never had is taken
//! back at start ([`REVOKED`]): `edit` once wrote Leases, which upstream's
//! `edit` cannot, and a Lease in the robots' namespace is what the manager
//! fences a silent robot's work by.

use std::sync::LazyLock;

use serde_json::{json, Value};

pub use crate::aggregation::{after_write, aggregate, aggregated_rules};
use crate::authz::Identity;
use crate::error::ApiError;
use crate::ops::{self, FieldValidation, WriteOpts};
use crate::store::Store;

const RBAC: &str = "rbac.authorization.k8s.io";
const AUTOUPDATE: &str = "rbac.authorization.kubernetes.io/autoupdate";
const BOOTSTRAPPING: &str = "kubernetes.io/bootstrapping";

fn label(to: &str) -> String {
    format!("{RBAC}/aggregate-to-{to}")
}

fn read() -> Vec<&'static str> {
    vec!["get", "list", "watch"]
}

fn write() -> Vec<&'static str> {
    vec!["create", "delete", "deletecollection", "patch", "update"]
}

fn all_verbs() -> Vec<&'static str> {
    [read(), write()].concat()
}

/// The default ClusterRoles, as they are made.
pub static DEFAULT_CLUSTER_ROLES: LazyLock<Vec<Value>> = LazyLock::new(|| {
    let role = |name: &str, labels: Value, body: Value| {
        let mut labels = labels;
        labels[BOOTSTRAPPING] = json!("rbac-defaults");
        let mut role = json!({
            "apiVersion": format!("{RBAC}/v1"),
            "kind": "ClusterRole",
            "metadata": {"name": name, "labels": labels, "annotations": {AUTOUPDATE: "true"}},
        });
        for (k, v) in body.as_object().into_iter().flatten() {
            role[k] = v.clone();
        }
        role
    };
    let aggregated = |to: &str| json!({"clusterRoleSelectors": [{"matchLabels": {label(to): "true"}}]});
    vec![
        role(
            "cluster-admin",
            json!({}),
            json!({"rules": [
                {"apiGroups": ["*"], "resources": ["*"], "verbs": ["*"]},
                {"nonResourceURLs": ["*"], "verbs": ["*"]},
            ]}),
        ),
        role(
            "admin",
            json!({}),
            json!({"aggregationRule": aggregated("admin")}),
        ),
        role(
            "edit",
            json!({label("admin"): "true"}),
            json!({"aggregationRule": aggregated("edit")}),
        ),
        role(
            "view",
            json!({label("edit"): "true"}),
            json!({"aggregationRule": aggregated("view")}),
        ),
        role(
            "system:aggregate-to-admin",
            json!({label("admin"): "true"}),
            json!({"rules": [
                {"apiGroups": [RBAC], "resources": ["rolebindings", "roles"], "verbs": all_verbs()},
            ]}),
        ),
        role(
            "system:aggregate-to-edit",
            json!({label("edit"): "true"}),
            json!({"rules": [
                {"apiGroups": [""], "resources": ["serviceaccounts"], "verbs": ["impersonate"]},
                {"apiGroups": [""], "resources": ["secrets"], "verbs": read()},
                {"apiGroups": [""], "resources": ["configmaps", "secrets", "serviceaccounts", "services"], "verbs": write()},
                {"apiGroups": ["apps"], "resources": ["deployments"], "verbs": write()},
            ]}),
        ),
        role(
            "system:aggregate-to-view",
            json!({label("view"): "true"}),
            json!({"rules": [
                {"apiGroups": [""], "resources": ["configmaps", "events", "serviceaccounts", "services", "namespaces", "namespaces/status"], "verbs": read()},
                {"apiGroups": ["events.k8s.io"], "resources": ["events"], "verbs": read()},
                {"apiGroups": ["apps"], "resources": ["deployments", "deployments/status"], "verbs": read()},
            ]}),
        ),
    ]
});

/// Rules earlier versions put in a default role that the real role does not
/// have: removed from the stored role at start (unless it is annotated not
/// to be updated).
pub static REVOKED: LazyLock<Vec<(&'static str, Value)>> = LazyLock::new(|| {
    vec![(
        "system:aggregate-to-edit",
        json!({"apiGroups": ["coordination.k8s.io"], "resources": ["leases"], "verbs": all_verbs()}),
    )]
});

/// The ClusterRoleBinding that gives `cluster-admin` to `system:masters`,
/// as on a real cluster (that group may do everything here anyway).
fn cluster_admin_binding() -> Value {
    json!({
        "apiVersion": format!("{RBAC}/v1"),
        "kind": "ClusterRoleBinding",
        "metadata": {
            "name": "cluster-admin",
            "labels": {BOOTSTRAPPING: "rbac-defaults"},
            "annotations": {AUTOUPDATE: "true"},
        },
        "roleRef": {"apiGroup": RBAC, "kind": "ClusterRole", "name": "cluster-admin"},
        "subjects": [{"apiGroup": RBAC, "kind": "Group", "name": crate::authz::ADMIN_GROUP}],
    })
}

/// Makes (or mends) the default roles; see the module's comment.
pub fn reconcile_at_start(store: &Store) -> Result<(), ApiError> {
    let opts = WriteOpts {
        manager: "apiserver-lite".into(),
        dry_run: false,
        field_validation: FieldValidation::Ignore,
        identity: Identity::Admin,
    };
    store.write(|txn| {
        let registry = &txn.state.registry;
        let roles = registry
            .get(RBAC, "v1", "clusterroles")
            .expect("RBAC is built in");
        let bindings = registry
            .get(RBAC, "v1", "clusterrolebindings")
            .expect("RBAC is built in");
        let wanted = DEFAULT_CLUSTER_ROLES.iter().map(|r| (&roles, r.clone()));
        for (rt, want) in wanted.chain([(&bindings, cluster_admin_binding())]) {
            let name = want["metadata"]["name"].as_str().unwrap_or_default().to_owned();
            match txn.state.get(&rt.stored_resource(), "", &name) {
                None => {
                    ops::create(txn, rt, "", want, &opts, None)?;
                }
                Some(old) if old["metadata"]["annotations"][AUTOUPDATE] == "false" => {}
                Some(old) => {
                    let revoked: Vec<&Value> = REVOKED
                        .iter()
                        .filter(|(role, _)| *role == name)
                        .map(|(_, rule)| rule)
                        .collect();
                    if let Some(mended) = mend(&old, &want, &revoked) {
                        ops::commit_update(
                            txn,
                            rt,
                            &old,
                            mended,
                            false,
                            &opts,
                            ops::Precondition::Put,
                            false,
                        )?;
                    }
                }
            }
        }
        Ok(())
    })
}

/// `old` with what `want` has and `old` lost (labels, annotations, the
/// aggregation rule, rules, subjects), and without the `revoked` rules;
/// `None` when nothing changes.
fn mend(old: &Value, want: &Value, revoked: &[&Value]) -> Option<Value> {
    let mut new = old.clone();
    if let Some(rules) = new["rules"].as_array_mut() {
        rules.retain(|rule| !revoked.contains(&rule));
    }
    for field in ["labels", "annotations"] {
        for (k, v) in want["metadata"][field].as_object().into_iter().flatten() {
            new["metadata"][field][k] = v.clone();
        }
    }
    if want["aggregationRule"].is_object() {
        new["aggregationRule"] = want["aggregationRule"].clone();
    }
    for field in ["rules", "subjects"] {
        for item in want[field].as_array().into_iter().flatten() {
            let items = new[field].as_array().cloned().unwrap_or_default();
            if !items.contains(item) {
                let mut items = items;
                items.push(item.clone());
                new[field] = Value::Array(items);
            }
        }
    }
    if want["roleRef"].is_object() {
        new["roleRef"] = want["roleRef"].clone();
    }
    (new != *old).then_some(new)
}

#[cfg(test)]
mod tests;
