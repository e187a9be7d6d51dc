//! Who is asking, and may they.
//!
//! Bearer tokens name users, the way kube-apiserver's `--token-auth-file`
//! does; the server's own token is the administrator (like
//! `system:masters`, it may do everything). Every other user may do what
//! the stored RBAC objects grant: Roles and ClusterRoles, bound to it (or to
//! one of its groups, or to its ServiceAccount) by RoleBindings and
//! ClusterRoleBindings. Denied requests get the real server's 403 and are
//! remembered, so that a test can show that a set of RBAC manifests is
//! enough for the program that runs under it.

use std::collections::{BTreeSet, HashMap, VecDeque};
use std::sync::Mutex;

use serde_json::Value;

use crate::error::ApiError;
use crate::store::State;

const ROLES: &str = "roles.rbac.authorization.k8s.io";
const CLUSTER_ROLES: &str = "clusterroles.rbac.authorization.k8s.io";
const ROLE_BINDINGS: &str = "rolebindings.rbac.authorization.k8s.io";
const CLUSTER_ROLE_BINDINGS: &str = "clusterrolebindings.rbac.authorization.k8s.io";
/// How many denials are remembered.
const DENIALS_KEPT: usize = 100;

/// A user a bearer token stands for.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct User {
    pub name: String,
    /// Its groups, `system:authenticated` included.
    pub groups: Vec<String>,
}

impl User {
    /// A user with these groups (and `system:authenticated`).
    pub fn new(name: impl Into<String>, groups: impl IntoIterator<Item = String>) -> User {
        let mut groups: Vec<String> = groups.into_iter().collect();
        if !groups.iter().any(|g| g == "system:authenticated") {
            groups.push("system:authenticated".to_owned());
        }
        User {
            name: name.into(),
            groups,
        }
    }

    /// The user a ServiceAccount's token authenticates as, with the groups
    /// the real server gives it.
    pub fn service_account(namespace: &str, name: &str) -> User {
        User::new(
            format!("system:serviceaccount:{namespace}:{name}"),
            [
                "system:serviceaccounts".to_owned(),
                format!("system:serviceaccounts:{namespace}"),
            ],
        )
    }
}

/// Who a request comes from.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Identity {
    /// The server's own token: may do everything.
    Admin,
    /// A user whose requests RBAC decides.
    User(User),
}

/// What a resource request asks to do, in RBAC's terms.
#[derive(Debug, Clone, Copy)]
pub struct Attributes<'a> {
    /// get, list, watch, create, update, patch, delete, deletecollection.
    pub verb: &'a str,
    pub group: &'a str,
    /// The plural, e.g. `tasks`.
    pub resource: &'a str,
    pub subresource: Option<&'a str>,
    pub namespace: Option<&'a str>,
    /// The object's name; for a list or watch, the name its field selector
    /// pins (`metadata.name=...`), as the real server takes it.
    pub name: Option<&'a str>,
}

/// The tokens the server accepts and what it has denied.
#[derive(Debug)]
pub struct Authenticator {
    admin_token: String,
    users: HashMap<String, User>,
    denied: Mutex<VecDeque<String>>,
    used: Mutex<BTreeSet<String>>,
}

impl Authenticator {
    pub fn new(admin_token: String, users: HashMap<String, User>) -> Authenticator {
        Authenticator {
            admin_token,
            users,
            denied: Mutex::new(VecDeque::new()),
            used: Mutex::new(BTreeSet::new()),
        }
    }

    /// The identity behind an `Authorization` header's value, if any.
    pub fn authenticate(&self, authorization: Option<&str>) -> Option<Identity> {
        let token = authorization?.strip_prefix("Bearer ")?.trim();
        if token == self.admin_token {
            return Some(Identity::Admin);
        }
        self.users.get(token).cloned().map(Identity::User)
    }

    /// Lets the request through, or answers 403 as the real server does.
    pub fn authorize(
        &self,
        state: &State,
        identity: &Identity,
        attrs: &Attributes<'_>,
    ) -> Result<(), ApiError> {
        let Identity::User(user) = identity else {
            return Ok(());
        };
        if allowed(state, user, attrs) {
            let mut used = self.used.lock().unwrap_or_else(|e| e.into_inner());
            used.insert(usage(user, attrs));
            return Ok(());
        }
        let error = forbidden(user, attrs);
        tracing::warn!(user = %user.name, "{}", error.message);
        let mut denied = self.denied.lock().unwrap_or_else(|e| e.into_inner());
        if denied.len() == DENIALS_KEPT {
            denied.pop_front();
        }
        denied.push_back(error.message.clone());
        Err(error)
    }

    /// What users were allowed to do, one line per distinct
    /// `user verb group/resource[/subresource] namespace` (`-` for the
    /// cluster scope): what an audit would show they need.
    pub fn used(&self) -> BTreeSet<String> {
        self.used.lock().unwrap_or_else(|e| e.into_inner()).clone()
    }

    /// The messages of the last requests denied (oldest first).
    pub fn denied(&self) -> Vec<String> {
        let denied = self.denied.lock().unwrap_or_else(|e| e.into_inner());
        denied.iter().cloned().collect()
    }
}

/// Reads a kube-apiserver token file: one `token,user,uid[,"group1,group2"]`
/// per line; blank lines and `#` comments are skipped.
pub fn parse_token_file(text: &str) -> Result<HashMap<String, User>, String> {
    let mut users = HashMap::new();
    for (i, line) in text.lines().enumerate() {
        let line = line.trim();
        if line.is_empty() || line.starts_with('#') {
            continue;
        }
        let mut fields = line.splitn(4, ',');
        let token = fields.next().unwrap_or_default().trim();
        let name = fields.next().unwrap_or_default().trim();
        let _uid = fields.next();
        if token.is_empty() || name.is_empty() {
            return Err(format!("line {}: want token,user,uid[,\"groups\"]", i + 1));
        }
        let groups = fields
            .next()
            .map(|g| g.trim().trim_matches('"'))
            .unwrap_or_default()
            .split(',')
            .map(str::trim)
            .filter(|g| !g.is_empty())
            .map(str::to_owned);
        if users.insert(token.to_owned(), User::new(name, groups)).is_some() {
            return Err(format!("line {}: a token given twice", i + 1));
        }
    }
    Ok(users)
}

/// Whether some binding of `user` grants a rule matching `attrs`.
pub fn allowed(state: &State, user: &User, attrs: &Attributes<'_>) -> bool {
    let grants = |binding: &Value, namespace: Option<&str>| {
        binds(binding, namespace, user)
            && role_of(state, binding, namespace).is_some_and(|role| role_allows(&role, attrs))
    };
    if state
        .list(CLUSTER_ROLE_BINDINGS, None)
        .any(|(_, binding)| grants(binding, None))
    {
        return true;
    }
    attrs.namespace.is_some_and(|ns| {
        state
            .list(ROLE_BINDINGS, Some(ns))
            .any(|(_, binding)| grants(binding, Some(ns)))
    })
}

/// Whether a binding (a RoleBinding in `namespace`, or a
/// ClusterRoleBinding) names the user, one of its groups or its
/// ServiceAccount; a RoleBinding's ServiceAccount subject without a
/// namespace is in the binding's.
fn binds(binding: &Value, namespace: Option<&str>, user: &User) -> bool {
    let subjects = binding["subjects"]
        .as_array()
        .map(Vec::as_slice)
        .unwrap_or_default();
    subjects.iter().any(|s| {
        let name = s["name"].as_str().unwrap_or_default();
        match s["kind"].as_str() {
            Some("User") => name == user.name,
            Some("Group") => user.groups.iter().any(|g| g == name),
            Some("ServiceAccount") => {
                let namespace = s["namespace"].as_str().or(namespace).unwrap_or_default();
                user.name == format!("system:serviceaccount:{namespace}:{name}")
            }
            _ => false,
        }
    })
}

/// The Role or ClusterRole a binding refers to; a RoleBinding's Role is in
/// its own namespace.
fn role_of(state: &State, binding: &Value, namespace: Option<&str>) -> Option<std::sync::Arc<Value>> {
    let name = binding["roleRef"]["name"].as_str()?;
    match (binding["roleRef"]["kind"].as_str()?, namespace) {
        ("ClusterRole", _) => state.get(CLUSTER_ROLES, "", name),
        ("Role", Some(ns)) => state.get(ROLES, ns, name),
        _ => None,
    }
}

fn role_allows(role: &Value, attrs: &Attributes<'_>) -> bool {
    let rules = role["rules"].as_array().map(Vec::as_slice).unwrap_or_default();
    rules.iter().any(|rule| rule_allows(rule, attrs))
}

/// One PolicyRule against a request, by the real authorizer's rules:
/// `*` matches any verb, group or resource; `*/status` any resource's
/// status; resourceNames, when given, only named requests.
pub fn rule_allows(rule: &Value, attrs: &Attributes<'_>) -> bool {
    let list = |field: &str| -> Vec<&str> {
        rule[field]
            .as_array()
            .map(|a| a.iter().filter_map(Value::as_str).collect())
            .unwrap_or_default()
    };
    let verbs = list("verbs");
    let groups = list("apiGroups");
    let resources = list("resources");
    let names = list("resourceNames");
    let verb_ok = verbs.iter().any(|v| *v == "*" || *v == attrs.verb);
    let group_ok = groups.iter().any(|g| *g == "*" || *g == attrs.group);
    let resource_ok = resources.iter().any(|r| match attrs.subresource {
        None => *r == "*" || *r == attrs.resource,
        Some(sub) => {
            *r == "*"
                || r.split_once('/')
                    .is_some_and(|(res, s)| (res == "*" || res == attrs.resource) && s == sub)
        }
    });
    let name_ok = names.is_empty() || attrs.name.is_some_and(|n| names.contains(&n));
    verb_ok && group_ok && resource_ok && name_ok
}

fn usage(user: &User, attrs: &Attributes<'_>) -> String {
    let sub = attrs.subresource.map(|s| format!("/{s}")).unwrap_or_default();
    format!(
        "{} {} {}/{}{sub} {}",
        user.name,
        attrs.verb,
        attrs.group,
        attrs.resource,
        attrs.namespace.unwrap_or("-")
    )
}

fn forbidden(user: &User, attrs: &Attributes<'_>) -> ApiError {
    let qualified = if attrs.group.is_empty() {
        attrs.resource.to_owned()
    } else {
        format!("{}.{}", attrs.resource, attrs.group)
    };
    let object = match attrs.name {
        Some(name) => format!("{qualified} \"{name}\""),
        None => qualified,
    };
    let resource = match attrs.subresource {
        Some(sub) => format!("{}/{sub}", attrs.resource),
        None => attrs.resource.to_owned(),
    };
    let scope = match attrs.namespace {
        Some(ns) => format!("in the namespace \"{ns}\""),
        None => "at the cluster scope".to_owned(),
    };
    ApiError::new(
        axum::http::StatusCode::FORBIDDEN,
        "Forbidden",
        format!(
            "{object} is forbidden: User \"{}\" cannot {} resource \"{resource}\" in API group \"{}\" {scope}",
            user.name, attrs.verb, attrs.group
        ),
    )
    .with_details(serde_json::json!({
        "name": attrs.name.unwrap_or_default(),
        "group": attrs.group,
        "kind": attrs.resource,
    }))
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    fn attrs<'a>(
        verb: &'a str,
        resource: &'a str,
        sub: Option<&'a str>,
        name: Option<&'a str>,
    ) -> Attributes<'a> {
        Attributes {
            verb,
            group: "robot.k8s4r.io",
            resource,
            subresource: sub,
            namespace: Some("default"),
            name,
        }
    }

    #[test]
    fn rules_match_verbs_groups_resources_and_names() {
        let rule = json!({"apiGroups": ["robot.k8s4r.io"], "resources": ["tasks", "tasks/status"], "verbs": ["get", "patch"]});
        assert!(rule_allows(&rule, &attrs("get", "tasks", None, Some("a"))));
        assert!(rule_allows(
            &rule,
            &attrs("patch", "tasks", Some("status"), Some("a"))
        ));
        assert!(!rule_allows(&rule, &attrs("delete", "tasks", None, Some("a"))));
        assert!(!rule_allows(&rule, &attrs("get", "jobs", None, Some("a"))));
        assert!(!rule_allows(&rule, &attrs("patch", "jobs", Some("status"), None)));
        let mut other_group = attrs("get", "tasks", None, None);
        other_group.group = "";
        assert!(!rule_allows(&rule, &other_group));

        // The resource alone does not grant its subresources.
        let plain = json!({"apiGroups": ["*"], "resources": ["tasks"], "verbs": ["*"]});
        assert!(rule_allows(
            &plain,
            &attrs("deletecollection", "tasks", None, None)
        ));
        assert!(!rule_allows(
            &plain,
            &attrs("patch", "tasks", Some("status"), None)
        ));
        let any_status =
            json!({"apiGroups": ["robot.k8s4r.io"], "resources": ["*/status"], "verbs": ["patch"]});
        assert!(rule_allows(
            &any_status,
            &attrs("patch", "jobs", Some("status"), None)
        ));
        assert!(!rule_allows(&any_status, &attrs("patch", "jobs", None, None)));

        let named = json!({"apiGroups": ["robot.k8s4r.io"], "resources": ["jobs"], "resourceNames": ["one"], "verbs": ["get", "list"]});
        assert!(rule_allows(&named, &attrs("get", "jobs", None, Some("one"))));
        assert!(!rule_allows(&named, &attrs("get", "jobs", None, Some("two"))));
        assert!(!rule_allows(&named, &attrs("list", "jobs", None, None)));
    }

    #[test]
    fn token_files_name_users_and_groups() {
        let users = parse_token_file("# comment\n\nt1,alice,1\nt2,bob,2,\"ops,dev\"\n").unwrap();
        assert_eq!(users["t1"].name, "alice");
        assert_eq!(users["t1"].groups, vec!["system:authenticated"]);
        assert_eq!(users["t2"].groups, vec!["ops", "dev", "system:authenticated"]);
        assert!(parse_token_file("t1,alice,1\nt1,bob,2\n")
            .unwrap_err()
            .contains("line 2"));
        assert!(parse_token_file("justatoken\n").unwrap_err().contains("line 1"));
    }

    #[test]
    fn service_accounts_have_the_real_groups() {
        let sa = User::service_account("k8s4r-system", "k8s4r-server");
        assert_eq!(sa.name, "system:serviceaccount:k8s4r-system:k8s4r-server");
        assert!(sa
            .groups
            .contains(&"system:serviceaccounts:k8s4r-system".to_owned()));
        assert!(sa.groups.contains(&"system:authenticated".to_owned()));
        let binding = json!({"subjects": [{"kind": "ServiceAccount", "name": "k8s4r-server", "namespace": "k8s4r-system"}]});
        assert!(binds(&binding, None, &sa));
        let other =
            json!({"subjects": [{"kind": "ServiceAccount", "name": "k8s4r-server", "namespace": "default"}]});
        assert!(!binds(&other, None, &sa));
        let group = json!({"subjects": [{"kind": "Group", "name": "system:serviceaccounts"}]});
        assert!(binds(&group, None, &sa));
        // In a RoleBinding, a ServiceAccount without a namespace is in the binding's.
        let bare = json!({"subjects": [{"kind": "ServiceAccount", "name": "k8s4r-server"}]});
        assert!(binds(&bare, Some("k8s4r-system"), &sa));
        assert!(!binds(&bare, Some("default"), &sa));
    }
}
