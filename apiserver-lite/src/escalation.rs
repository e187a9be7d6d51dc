//! RBAC's escalation prevention, as kube-apiserver's RBAC storage does it.
//! Being allowed to write Roles and bindings must not be a way to gain
//! more rights:
//!
//! - a Role or ClusterRole may be created or changed only with rules its
//!   writer holds itself (in the Role's namespace, or cluster-wide for a
//!   ClusterRole), unless the writer may `escalate` that role;
//! - a RoleBinding or ClusterRoleBinding may be created or changed only to
//!   a role whose rules its writer holds (in the binding's namespace, or
//!   cluster-wide), unless the writer may `bind` that role;
//! - a ClusterRole's aggregation rule may be set or changed only by a
//!   writer who may `escalate` it (it could gather any role's rules).
//!
//! The administrator (`system:masters`) is exempt, and so is a change of
//! nothing but finalizers and owner references (what the garbage collector
//! writes). The check runs on the object as it would be stored, inside the
//! write's transaction, so a create, an update, every kind of patch and a
//! server-side apply are all held to it.

use serde_json::{json, Value};

use crate::authz::{self, Attributes, Identity, User};
use crate::error::ApiError;
use crate::resources::ResourceType;
use crate::store::State;

const RBAC_GROUP: &str = "rbac.authorization.k8s.io";

/// Lets the write of `new` (replacing `old`, if any) through, or answers
/// 403 (or 404 for a binding to a missing role) as the real server does.
pub fn check(
    state: &State,
    identity: &Identity,
    rt: &ResourceType,
    old: Option<&Value>,
    new: &Value,
) -> Result<(), ApiError> {
    let Identity::User(user) = identity else {
        return Ok(());
    };
    if rt.group != RBAC_GROUP || old.is_some_and(|old| only_gc_fields_differ(old, new)) {
        return Ok(());
    }
    let name = new["metadata"]["name"].as_str().unwrap_or_default();
    let namespace = new["metadata"]["namespace"].as_str().filter(|n| !n.is_empty());
    let granted: Vec<Value> = match rt.plural.as_str() {
        "roles" | "clusterroles" => {
            let escalate = Attributes {
                verb: "escalate",
                group: RBAC_GROUP,
                resource: &rt.plural,
                subresource: None,
                namespace,
                // A create names no object, as on the real server.
                name: old.map(|_| name),
            };
            if authz::allowed(state, user, &escalate).is_some() {
                return Ok(());
            }
            // An aggregation rule can gather any role's rules, so only who
            // may escalate sets or changes one, as on a real server.
            let aggregation = &new["aggregationRule"];
            if !aggregation.is_null() && old.is_none_or(|old| old["aggregationRule"] != *aggregation) {
                return Err(ApiError::new(
                    axum::http::StatusCode::FORBIDDEN,
                    "Forbidden",
                    format!("{}.{RBAC_GROUP} {name:?} is forbidden: must have cluster-admin privileges to use the aggregationRule", rt.plural),
                ));
            }
            rules_of(new)
        }
        "rolebindings" | "clusterrolebindings" => {
            let role_ref = &new["roleRef"];
            let role_name = role_ref["name"].as_str().unwrap_or_default();
            let (role_resource, stored, role_namespace) = match role_ref["kind"].as_str() {
                Some("Role") => ("roles", authz::ROLES, namespace.unwrap_or_default()),
                _ => ("clusterroles", authz::CLUSTER_ROLES, ""),
            };
            let bind = Attributes {
                verb: "bind",
                group: role_ref["apiGroup"].as_str().unwrap_or_default(),
                resource: role_resource,
                subresource: None,
                // Where the binding is, so that binding a ClusterRole can
                // be allowed in one namespace.
                namespace,
                name: Some(role_name),
            };
            if authz::allowed(state, user, &bind).is_some() {
                return Ok(());
            }
            let role = state
                .get(stored, role_namespace, role_name)
                .ok_or_else(|| ApiError::not_found(stored, role_name))?;
            rules_of(&role)
        }
        _ => return Ok(()),
    };
    let held = authz::rules_of(state, user, namespace);
    let missing = missing(&held, &granted);
    if missing.is_empty() {
        return Ok(());
    }
    Err(forbidden(rt, name, user, &missing))
}

fn rules_of(role: &Value) -> Vec<Value> {
    role["rules"].as_array().cloned().unwrap_or_default()
}

/// Whether `new` differs from `old` in finalizers and owner references
/// only (besides what the server keeps up to date).
fn only_gc_fields_differ(old: &Value, new: &Value) -> bool {
    let strip = |obj: &Value| {
        let mut v = obj.clone();
        if let Some(m) = v["metadata"].as_object_mut() {
            for key in [
                "finalizers",
                "ownerReferences",
                "managedFields",
                "resourceVersion",
                "generation",
            ] {
                m.remove(key);
            }
        }
        v
    };
    strip(old) == strip(new)
}

/// One verb on one group's resource (and one name, if the rule names
/// them), or one verb on one path: the unit rights are compared in.
#[derive(Debug, Clone, PartialEq, Eq)]
enum Right {
    Resource {
        verb: String,
        group: String,
        resource: String,
        name: Option<String>,
    },
    Path {
        verb: String,
        url: String,
    },
}

fn strings<'a>(rule: &'a Value, field: &str) -> Vec<&'a str> {
    rule[field]
        .as_array()
        .map(|a| a.iter().filter_map(Value::as_str).collect())
        .unwrap_or_default()
}

/// A rule broken down into the rights it grants.
fn rights(rule: &Value) -> Vec<Right> {
    let verbs = strings(rule, "verbs");
    let names = strings(rule, "resourceNames");
    let names: Vec<Option<&str>> = if names.is_empty() {
        vec![None]
    } else {
        names.into_iter().map(Some).collect()
    };
    let mut out = Vec::new();
    for group in strings(rule, "apiGroups") {
        for resource in strings(rule, "resources") {
            for verb in &verbs {
                for name in &names {
                    out.push(Right::Resource {
                        verb: (*verb).into(),
                        group: group.into(),
                        resource: resource.into(),
                        name: name.map(str::to_owned),
                    });
                }
            }
        }
    }
    for url in strings(rule, "nonResourceURLs") {
        for verb in &verbs {
            out.push(Right::Path {
                verb: (*verb).into(),
                url: url.into(),
            });
        }
    }
    out
}

/// Whether a held rule covers a right. `*` covers anything; a held
/// resource `*/status` covers every resource's status; a held rule limited
/// to names covers only those names; a held path ending in `*` covers the
/// paths under it.
fn covers(held: &Value, right: &Right) -> bool {
    let has = |field: &str, want: &str| strings(held, field).iter().any(|h| *h == "*" || *h == want);
    match right {
        Right::Resource {
            verb,
            group,
            resource,
            name,
        } => {
            let resources = strings(held, "resources");
            let resource_ok = resources.iter().any(|h| {
                *h == "*"
                    || h == resource
                    || resource
                        .split_once('/')
                        .is_some_and(|(_, sub)| h.strip_prefix("*/") == Some(sub))
            });
            let held_names = strings(held, "resourceNames");
            let name_ok = held_names.is_empty() || name.as_deref().is_some_and(|n| held_names.contains(&n));
            has("verbs", verb) && has("apiGroups", group) && resource_ok && name_ok
        }
        Right::Path { verb, url } => {
            let url_ok = strings(held, "nonResourceURLs")
                .iter()
                .any(|h| h == url || h.strip_suffix('*').is_some_and(|prefix| url.starts_with(prefix)));
            has("verbs", verb) && url_ok
        }
    }
}

/// The rights `granted` gives that no rule in `held` covers.
fn missing(held: &[Value], granted: &[Value]) -> Vec<Right> {
    let mut out: Vec<Right> = Vec::new();
    for right in granted.iter().flat_map(rights) {
        if !held.iter().any(|h| covers(h, &right)) && !out.contains(&right) {
            out.push(right);
        }
    }
    out
}

/// The real server's message: the writer, its groups, and the missing
/// rights, those on one resource without names joined into one line.
fn forbidden(rt: &ResourceType, name: &str, user: &User, missing: &[Right]) -> ApiError {
    let quoted = |items: &[&str]| {
        let q: Vec<String> = items.iter().map(|s| format!("{s:?}")).collect();
        format!("[{}]", q.join(" "))
    };
    // (group, resource) -> verbs, for the rights without a name.
    let mut merged: Vec<((&str, &str), Vec<&str>)> = Vec::new();
    let mut lines = std::collections::BTreeSet::new();
    for right in missing {
        match right {
            Right::Resource {
                verb,
                group,
                resource,
                name: None,
            } => match merged
                .iter_mut()
                .find(|(k, _)| *k == (group.as_str(), resource.as_str()))
            {
                Some((_, verbs)) => verbs.push(verb),
                None => merged.push(((group, resource), vec![verb])),
            },
            Right::Resource {
                verb,
                group,
                resource,
                name: Some(n),
            } => {
                lines.insert(format!(
                    "{{APIGroups:{}, Resources:{}, ResourceNames:{}, Verbs:{}}}",
                    quoted(&[group]),
                    quoted(&[resource]),
                    quoted(&[n]),
                    quoted(&[verb])
                ));
            }
            Right::Path { verb, url } => {
                lines.insert(format!(
                    "{{NonResourceURLs:{}, Verbs:{}}}",
                    quoted(&[url]),
                    quoted(&[verb])
                ));
            }
        }
    }
    for ((group, resource), verbs) in merged {
        lines.insert(format!(
            "{{APIGroups:{}, Resources:{}, Verbs:{}}}",
            quoted(&[group]),
            quoted(&[resource]),
            quoted(&verbs)
        ));
    }
    let groups: Vec<&str> = user.groups.iter().map(String::as_str).collect();
    let message = format!(
        "{} {name:?} is forbidden: user {:?} (groups={}) is attempting to grant RBAC permissions not currently held:\n{}",
        rt.group_resource(),
        user.name,
        quoted(&groups),
        lines.into_iter().collect::<Vec<_>>().join("\n")
    );
    ApiError::new(axum::http::StatusCode::FORBIDDEN, "Forbidden", message).with_details(json!({
        "name": name,
        "group": rt.group,
        "kind": rt.plural,
    }))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn rule(groups: &[&str], resources: &[&str], verbs: &[&str]) -> Value {
        json!({"apiGroups": groups, "resources": resources, "verbs": verbs})
    }

    #[test]
    fn held_rules_cover_the_rights_they_include() {
        let held = vec![
            rule(&[""], &["configmaps", "secrets"], &["get", "list"]),
            rule(&["apps"], &["*"], &["*"]),
            rule(&["*"], &["*/status"], &["patch"]),
            json!({"apiGroups": [""], "resources": ["pods"], "resourceNames": ["a", "b"], "verbs": ["delete"]}),
            json!({"nonResourceURLs": ["/metrics", "/debug/*"], "verbs": ["get"]}),
        ];
        for covered in [
            rule(&[""], &["configmaps"], &["get"]),
            rule(&[""], &["secrets", "configmaps"], &["list", "get"]),
            rule(&["apps"], &["deployments", "deployments/scale"], &["*"]),
            rule(&["batch"], &["jobs/status"], &["patch"]),
            json!({"apiGroups": [""], "resources": ["pods"], "resourceNames": ["b"], "verbs": ["delete"]}),
            json!({"nonResourceURLs": ["/debug/pprof"], "verbs": ["get"]}),
            // A rule with no groups grants nothing, so needs nothing.
            json!({"resources": ["anything"], "verbs": ["*"]}),
        ] {
            assert_eq!(
                missing(&held, std::slice::from_ref(&covered)),
                vec![],
                "{covered}"
            );
        }
        for (granted, count) in [
            (rule(&[""], &["configmaps"], &["get", "delete"]), 1),
            (rule(&[""], &["configmaps"], &["*"]), 1),
            (rule(&["*"], &["configmaps"], &["get"]), 1),
            (rule(&[""], &["configmaps/status"], &["get"]), 1),
            (rule(&["batch"], &["jobs"], &["patch"]), 1),
            (rule(&[""], &["pods"], &["delete"]), 1),
            (
                json!({"apiGroups": [""], "resources": ["pods"], "resourceNames": ["a", "c"], "verbs": ["delete"]}),
                1,
            ),
            (json!({"nonResourceURLs": ["/debug", "/"], "verbs": ["get"]}), 2),
        ] {
            assert_eq!(
                missing(&held, std::slice::from_ref(&granted)).len(),
                count,
                "{granted}"
            );
        }
    }

    #[test]
    fn the_message_lists_what_is_missing_as_the_real_server_does() {
        let user = User::new("alice", ["ops".to_owned()]);
        let rt = crate::resources::builtins()
            .into_iter()
            .find(|rt| rt.plural == "roles")
            .unwrap();
        let granted = vec![
            rule(&["", "apps"], &["secrets"], &["get", "list"]),
            json!({"apiGroups": [""], "resources": ["pods"], "resourceNames": ["p"], "verbs": ["delete"]}),
            json!({"nonResourceURLs": ["/metrics"], "verbs": ["get"]}),
        ];
        let error = forbidden(&rt, "r", &user, &missing(&[], &granted));
        assert_eq!(error.code, axum::http::StatusCode::FORBIDDEN);
        assert_eq!(
            error.message,
            "roles.rbac.authorization.k8s.io \"r\" is forbidden: user \"alice\" (groups=[\"ops\" \"system:authenticated\"]) is attempting to grant RBAC permissions not currently held:\n\
             {APIGroups:[\"\"], Resources:[\"pods\"], ResourceNames:[\"p\"], Verbs:[\"delete\"]}\n\
             {APIGroups:[\"\"], Resources:[\"secrets\"], Verbs:[\"get\" \"list\"]}\n\
             {APIGroups:[\"apps\"], Resources:[\"secrets\"], Verbs:[\"get\" \"list\"]}\n\
             {NonResourceURLs:[\"/metrics\"], Verbs:[\"get\"]}"
        );
    }

    #[test]
    fn only_finalizers_and_owners_may_change_unchecked() {
        let old = json!({"metadata": {"name": "r", "resourceVersion": "1"}, "rules": []});
        let mut gc = old.clone();
        gc["metadata"]["finalizers"] = json!(["x"]);
        gc["metadata"]["ownerReferences"] = json!([{"uid": "u"}]);
        gc["metadata"]["resourceVersion"] = json!("2");
        assert!(only_gc_fields_differ(&old, &gc));
        let mut labelled = old.clone();
        labelled["metadata"]["labels"] = json!({"a": "b"});
        assert!(!only_gc_fields_differ(&old, &labelled));
    }
}
