//! Who is asking, and may they.
//!
//! Bearer tokens name users, the way kube-apiserver's `--token-auth-file`
//! does, or ServiceAccounts (tokens from TokenRequest, see
//! [`crate::service_account_tokens`]); the server's own token is the
//! administrator (like `system:masters`, it may do everything). A request
//! may then act as someone else ([`crate::impersonation`]). Every other user may do what
//! the stored RBAC objects grant: Roles and ClusterRoles, bound to it (or to
//! one of its groups, or to its ServiceAccount) by RoleBindings and
//! ClusterRoleBindings. Denied requests get the real server's 403 and are
//! remembered, so that a test can show that a set of RBAC manifests is
//! enough for the program that runs under it.
//!
//! What every authenticated user may do comes from the default roles a real
//! server binds to `system:authenticated` (see [`DEFAULT_GRANTS`]), which
//! are built in rather than stored. The same bindings answer the requests
//! themselves, `kubectl auth can-i` ([`Authenticator::review`]) and
//! `kubectl auth can-i --list` ([`rules_for`]), and say what a writer of
//! Roles and bindings holds ([`rules_of`], for [`crate::escalation`]).

use std::collections::{BTreeSet, HashMap, VecDeque};
use std::sync::{Arc, LazyLock, Mutex};

use serde_json::{json, Value};

use crate::error::ApiError;
use crate::store::State;

pub(crate) const ROLES: &str = "roles.rbac.authorization.k8s.io";
pub(crate) const CLUSTER_ROLES: &str = "clusterroles.rbac.authorization.k8s.io";
const ROLE_BINDINGS: &str = "rolebindings.rbac.authorization.k8s.io";
const CLUSTER_ROLE_BINDINGS: &str = "clusterrolebindings.rbac.authorization.k8s.io";
/// How many denials are remembered.
const DENIALS_KEPT: usize = 100;

pub use crate::user::User;

/// Who a request comes from.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Identity {
    /// The server's own token: may do everything.
    Admin,
    /// A user whose requests RBAC decides.
    User(User),
}

/// The name `kubectl auth whoami` shows for the server's own token.
pub const ADMIN_NAME: &str = "apiserver-lite:admin";
/// The group the server's own token is in: the one a real server lets do
/// everything.
pub const ADMIN_GROUP: &str = "system:masters";

impl Identity {
    /// Who this is, as SelfSubjectReview's `userInfo` tells it.
    pub fn user_info(&self) -> Value {
        match self {
            Identity::Admin => json!({
                "username": ADMIN_NAME,
                "groups": [ADMIN_GROUP, "system:authenticated"],
            }),
            Identity::User(user) => {
                let mut info = json!({"username": user.name, "groups": user.groups});
                if let Some(uid) = &user.uid {
                    info["uid"] = json!(uid);
                }
                if !user.extra.is_empty() {
                    info["extra"] = json!(user.extra);
                }
                info
            }
        }
    }
}

/// What a resource request asks to do, in RBAC's terms.
#[derive(Debug, Clone, Copy)]
pub struct Attributes<'a> {
    /// A request's [`Verb`], or any verb a review asks about (`escalate`,
    /// `bind`, `use`, `*`).
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

/// What a request for a path outside the resource APIs (discovery,
/// `/version`, `/healthz`) asks, in RBAC's terms.
#[derive(Debug, Clone, Copy)]
pub struct PathAttributes<'a> {
    /// The method, lowercased (`get`).
    pub verb: &'a str,
    pub path: &'a str,
}

/// The tokens the server accepts and what it has denied.
#[derive(Debug)]
pub struct Authenticator {
    admin_token: String,
    /// Signs and checks ServiceAccount tokens (TokenRequest).
    signer: crate::service_account_tokens::Signer,
    users: std::sync::RwLock<HashMap<String, User>>,
    denied: Mutex<VecDeque<String>>,
    used: Mutex<BTreeSet<String>>,
}

impl Authenticator {
    pub fn new(
        admin_token: String,
        users: HashMap<String, User>,
        signer: crate::service_account_tokens::Signer,
    ) -> Authenticator {
        Authenticator {
            admin_token,
            signer,
            users: std::sync::RwLock::new(users),
            denied: Mutex::new(VecDeque::new()),
            used: Mutex::new(BTreeSet::new()),
        }
    }

    /// The identity behind an `Authorization` header's value, if any: the
    /// server's own token, a token file's, or a ServiceAccount token still
    /// good in `store`'s objects.
    pub fn authenticate(&self, store: &crate::store::Store, authorization: Option<&str>) -> Option<Identity> {
        let token = authorization?.strip_prefix("Bearer ")?.trim();
        if self.is_admin_token(token) {
            return Some(Identity::Admin);
        }
        let known = {
            let users = self.users.read().unwrap_or_else(|e| e.into_inner());
            users.get(token).cloned()
        };
        if let Some(user) = known {
            return Some(Identity::User(user));
        }
        let now = jiff::Timestamp::now().as_second();
        store
            .read(|s| self.signer.authenticate(s, token, now))
            .map(Identity::User)
    }

    /// Whether `token` is the server's own, compared in constant time: how
    /// long a wrong guess takes to refuse must not say how much of it was
    /// right (a `==` stops at the first byte that differs).
    fn is_admin_token(&self, token: &str) -> bool {
        bool::from(subtle::ConstantTimeEq::ct_eq(
            token.as_bytes(),
            self.admin_token.as_bytes(),
        ))
    }

    /// Signs ServiceAccount tokens.
    pub fn signer(&self) -> &crate::service_account_tokens::Signer {
        &self.signer
    }

    /// Accepts `token` as `user` from now on.
    pub fn add_user(&self, token: &str, user: User) {
        let mut users = self.users.write().unwrap_or_else(|e| e.into_inner());
        users.insert(token.to_owned(), user);
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
        if allowed(state, user, attrs).is_some() {
            let mut used = self.used.lock().unwrap_or_else(|e| e.into_inner());
            used.insert(usage(user, attrs));
            return Ok(());
        }
        Err(self.deny(user, forbidden(user, attrs)))
    }

    /// Lets a request for a path outside the resource APIs through, or
    /// answers 403 as the real server does.
    pub fn authorize_path(
        &self,
        state: &State,
        identity: &Identity,
        attrs: &PathAttributes<'_>,
    ) -> Result<(), ApiError> {
        let Identity::User(user) = identity else {
            return Ok(());
        };
        if allowed_path(state, user, attrs).is_some() {
            return Ok(());
        }
        let message = format!(
            "forbidden: User \"{}\" cannot {} path \"{}\"",
            user.name, attrs.verb, attrs.path
        );
        let error =
            ApiError::new(axum::http::StatusCode::FORBIDDEN, "Forbidden", message).with_details(json!({}));
        Err(self.deny(user, error))
    }

    pub(crate) fn deny(&self, user: &User, error: ApiError) -> ApiError {
        tracing::warn!(user = %user.name, "{}", error.message);
        let mut denied = self.denied.lock().unwrap_or_else(|e| e.into_inner());
        if denied.len() == DENIALS_KEPT {
            denied.pop_front();
        }
        denied.push_back(error.message.clone());
        error
    }

    /// Whether `identity` may do what `request` describes, and why, as a
    /// SelfSubjectAccessReview answers; nothing is recorded.
    pub fn review(&self, state: &State, identity: &Identity, request: &Review<'_>) -> Decision {
        let Identity::User(user) = identity else {
            return Decision::allow(String::new());
        };
        let reason = match request {
            Review::Resource(attrs) => allowed(state, user, attrs),
            Review::Path(attrs) => allowed_path(state, user, attrs),
        };
        reason.map(Decision::allow).unwrap_or_default()
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
        let uid = fields.next().map(str::trim).unwrap_or_default();
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
        let mut user = User::new(name, groups);
        if !uid.is_empty() {
            user = user.with_uid(uid);
        }
        if users.insert(token.to_owned(), user).is_some() {
            return Err(format!("line {}: a token given twice", i + 1));
        }
    }
    Ok(users)
}

/// A request a SelfSubjectAccessReview asks about.
#[derive(Debug, Clone, Copy)]
pub enum Review<'a> {
    Resource(Attributes<'a>),
    Path(PathAttributes<'a>),
}

/// A SelfSubjectAccessReview's answer.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Decision {
    pub allowed: bool,
    /// Which binding allowed it, in the real authorizer's words; empty for
    /// the administrator and for a denial (RBAC never denies outright, it
    /// only finds no grant).
    pub reason: String,
}

impl Decision {
    fn allow(reason: String) -> Decision {
        Decision {
            allowed: true,
            reason,
        }
    }
}

/// The roles a real server creates and binds to every authenticated user
/// (`system:basic-user`, `system:discovery`, `system:public-info-viewer`),
/// each as a ClusterRoleBinding to its ClusterRole, limited to what this
/// server serves. They are not stored: `kubectl get clusterroles` does not
/// list them.
pub static DEFAULT_GRANTS: LazyLock<Vec<(Value, Arc<Value>)>> = LazyLock::new(|| {
    let grant = |name: &str, rules: Value| {
        let binding = json!({
            "metadata": {"name": name},
            "roleRef": {"apiGroup": "rbac.authorization.k8s.io", "kind": "ClusterRole", "name": name},
            "subjects": [{"apiGroup": "rbac.authorization.k8s.io", "kind": "Group", "name": "system:authenticated"}],
        });
        let role = json!({"metadata": {"name": name}, "rules": rules});
        (binding, Arc::new(role))
    };
    vec![
        grant(
            "system:basic-user",
            json!([
                {"apiGroups": ["authentication.k8s.io"], "resources": ["selfsubjectreviews"], "verbs": ["create"]},
                {"apiGroups": ["authorization.k8s.io"], "resources": ["selfsubjectaccessreviews", "selfsubjectrulesreviews"], "verbs": ["create"]},
            ]),
        ),
        grant(
            "system:discovery",
            json!([{
                "nonResourceURLs": ["/api", "/api/*", "/apis", "/apis/*", "/healthz", "/livez", "/openapi", "/openapi/*", "/readyz", "/version", "/version/"],
                "verbs": ["get"],
            }]),
        ),
        grant(
            "system:public-info-viewer",
            json!([{
                "nonResourceURLs": ["/healthz", "/livez", "/readyz", "/version", "/version/"],
                "verbs": ["get"],
            }]),
        ),
    ]
});

/// A binding that names the user, the subject that does, and the role it
/// grants.
struct Bound<'s> {
    binding: &'s Value,
    subject: &'s Value,
    /// The RoleBinding's namespace; `None` for a ClusterRoleBinding.
    namespace: Option<&'s str>,
    role: Arc<Value>,
}

impl Bound<'_> {
    fn rules(&self) -> &[Value] {
        self.role["rules"]
            .as_array()
            .map(Vec::as_slice)
            .unwrap_or_default()
    }

    /// The binding as the real authorizer's reasons describe it, e.g.
    /// `RoleBinding "reader/default" of Role "read-cms" to ServiceAccount "reader/default"`.
    fn describe(&self) -> String {
        let name = self.binding["metadata"]["name"].as_str().unwrap_or_default();
        let (kind, name) = match self.namespace {
            Some(ns) => ("RoleBinding", format!("{name}/{ns}")),
            None => ("ClusterRoleBinding", name.to_owned()),
        };
        let role_ref = &self.binding["roleRef"];
        let subject_kind = self.subject["kind"].as_str().unwrap_or_default();
        let mut subject = self.subject["name"].as_str().unwrap_or_default().to_owned();
        if subject_kind == "ServiceAccount" {
            let ns = self.subject["namespace"]
                .as_str()
                .or(self.namespace)
                .unwrap_or_default();
            subject = format!("{subject}/{ns}");
        }
        format!(
            "{kind} {name:?} of {} {:?} to {subject_kind} {subject:?}",
            role_ref["kind"].as_str().unwrap_or_default(),
            role_ref["name"].as_str().unwrap_or_default(),
        )
    }
}

/// Every binding that applies to `user` in `namespace` (cluster-wide ones
/// only for `None`), in the real authorizer's order: ClusterRoleBindings
/// (the built-in defaults first), then the namespace's RoleBindings. A
/// binding to a missing role grants nothing and is skipped.
fn bindings<'s>(
    state: &'s State,
    user: &'s User,
    namespace: Option<&'s str>,
) -> impl Iterator<Item = Bound<'s>> + 's {
    let defaults = DEFAULT_GRANTS.iter().filter_map(move |(binding, role)| {
        let subject = subject_of(binding, None, user)?;
        Some(Bound {
            binding,
            subject,
            namespace: None,
            role: role.clone(),
        })
    });
    let cluster = state
        .list(CLUSTER_ROLE_BINDINGS, None)
        .filter_map(move |(_, binding)| bound(state, binding.tree()?, None, user));
    let local = namespace.into_iter().flat_map(move |ns| {
        state
            .list(ROLE_BINDINGS, Some(ns))
            .filter_map(move |(_, binding)| bound(state, binding.tree()?, Some(ns), user))
    });
    defaults.chain(cluster).chain(local)
}

fn bound<'s>(
    state: &State,
    binding: &'s Value,
    namespace: Option<&'s str>,
    user: &User,
) -> Option<Bound<'s>> {
    let subject = subject_of(binding, namespace, user)?;
    let role = role_of(state, binding, namespace)?;
    Some(Bound {
        binding,
        subject,
        namespace,
        role,
    })
}

/// Why `user` may make a resource request (the real authorizer's reason),
/// or `None`.
pub fn allowed(state: &State, user: &User, attrs: &Attributes<'_>) -> Option<String> {
    if let Some(why) = master(user) {
        return Some(why);
    }
    bindings(state, user, attrs.namespace)
        .find(|b| b.rules().iter().any(|rule| rule_allows(rule, attrs)))
        .map(|b| format!("RBAC: allowed by {}", b.describe()))
}

/// As kube-apiserver: whoever is in the group system:masters may do
/// everything (a user a token file puts there, or the administrator a
/// SubjectAccessReview asks about).
fn master(user: &User) -> Option<String> {
    user.groups
        .iter()
        .any(|g| g == ADMIN_GROUP)
        .then(|| format!("allowed: in group {ADMIN_GROUP}"))
}

/// Why `user` may make a request for a path outside the resource APIs, or
/// `None`. Only ClusterRoleBindings grant paths, as on a real server.
pub fn allowed_path(state: &State, user: &User, attrs: &PathAttributes<'_>) -> Option<String> {
    if let Some(why) = master(user) {
        return Some(why);
    }
    bindings(state, user, None)
        .find(|b| b.rules().iter().any(|rule| rule_allows_path(rule, attrs)))
        .map(|b| format!("RBAC: allowed by {}", b.describe()))
}

/// Every rule that applies to `identity` in `namespace`, split into
/// resource rules and path rules, as a SelfSubjectRulesReview lists them.
/// The administrator gets the one rule that allows everything, as a real
/// server answers for `system:masters`.
pub fn rules_for(state: &State, identity: &Identity, namespace: Option<&str>) -> (Vec<Value>, Vec<Value>) {
    let user = match identity {
        Identity::Admin => {
            return (
                vec![json!({"verbs": ["*"], "apiGroups": ["*"], "resources": ["*"]})],
                vec![json!({"verbs": ["*"], "nonResourceURLs": ["*"]})],
            )
        }
        Identity::User(user) => user,
    };
    let (mut resources, mut paths) = (Vec::new(), Vec::new());
    for rule in &rules_of(state, user, namespace) {
        // Empty lists are left out, as the real server's `omitempty` does.
        let field = |name: &str| {
            rule.get(name)
                .filter(|v| v.as_array().is_some_and(|a| !a.is_empty()))
        };
        let verbs = rule.get("verbs").cloned().unwrap_or_else(|| json!([]));
        if let Some(urls) = field("nonResourceURLs") {
            paths.push(json!({"verbs": verbs, "nonResourceURLs": urls}));
        } else {
            let mut r = json!({"verbs": verbs});
            for name in ["apiGroups", "resources", "resourceNames"] {
                if let Some(v) = field(name) {
                    r[name] = v.clone();
                }
            }
            resources.push(r);
        }
    }
    (resources, paths)
}

/// Every rule `user` holds in `namespace` (cluster-wide ones only for
/// `None`), the built-in defaults included.
pub fn rules_of(state: &State, user: &User, namespace: Option<&str>) -> Vec<Value> {
    bindings(state, user, namespace)
        .flat_map(|b| b.rules().to_vec())
        .collect()
}

/// The subject of a binding (a RoleBinding in `namespace`, or a
/// ClusterRoleBinding) that is the user, one of its groups or its
/// ServiceAccount; a RoleBinding's ServiceAccount subject without a
/// namespace is in the binding's.
fn subject_of<'b>(binding: &'b Value, namespace: Option<&str>, user: &User) -> Option<&'b Value> {
    let subjects = binding["subjects"]
        .as_array()
        .map(Vec::as_slice)
        .unwrap_or_default();
    subjects.iter().find(|s| {
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
fn role_of(state: &State, binding: &Value, namespace: Option<&str>) -> Option<Arc<Value>> {
    let name = binding["roleRef"]["name"].as_str()?;
    match (binding["roleRef"]["kind"].as_str()?, namespace) {
        ("ClusterRole", _) => state.get(CLUSTER_ROLES, "", name),
        ("Role", Some(ns)) => state.get(ROLES, ns, name),
        _ => None,
    }
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

/// One PolicyRule against a path request: `*` matches any path, `/x/*`
/// any path under `/x/`.
pub fn rule_allows_path(rule: &Value, attrs: &PathAttributes<'_>) -> bool {
    let list = |field: &str| -> Vec<&str> {
        rule[field]
            .as_array()
            .map(|a| a.iter().filter_map(Value::as_str).collect())
            .unwrap_or_default()
    };
    let verb_ok = list("verbs").iter().any(|v| *v == "*" || *v == attrs.verb);
    let path_ok = list("nonResourceURLs").iter().any(|url| {
        *url == "*"
            || *url == attrs.path
            || url
                .strip_suffix('*')
                .is_some_and(|prefix| attrs.path.starts_with(prefix))
    });
    verb_ok && path_ok
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

pub(crate) fn forbidden(user: &User, attrs: &Attributes<'_>) -> ApiError {
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
mod tests;
