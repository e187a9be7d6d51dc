//! Impersonation, as kube-apiserver does it (`kubectl --as`, `--as-group`,
//! `--as-uid`): the `Impersonate-User`, `Impersonate-Group` (repeatable),
//! `Impersonate-Uid` and `Impersonate-Extra-<key>` headers make a request
//! act as another user, once the requester is allowed the `impersonate`
//! verb on each thing it claims:
//!
//! | header                     | resource (API group)                         | name       |
//! |----------------------------|----------------------------------------------|------------|
//! | `Impersonate-User`         | `users` ("")                                 | the user   |
//! | … a ServiceAccount's user  | `serviceaccounts` ("", in its namespace)     | its name   |
//! | `Impersonate-Group`        | `groups` ("")                                | the group  |
//! | `Impersonate-Extra-<key>`  | `userextras/<key>` (authentication.k8s.io)   | each value |
//! | `Impersonate-Uid`          | `uids` (authentication.k8s.io)               | the uid    |
//!
//! The first claim refused answers 403 with the real server's message. The
//! identity that comes out has the claimed groups, plus the
//! ServiceAccount's groups when a ServiceAccount is claimed without any,
//! plus `system:authenticated`; every later step (authorization, reviews,
//! admission, aggregated APIs) sees only it.

use std::collections::BTreeMap;

use axum::http::HeaderMap;

use crate::authz::{self, Attributes, Authenticator, Identity, User};
use crate::error::ApiError;
use crate::store::State;

const USER: &str = "impersonate-user";
const GROUP: &str = "impersonate-group";
const UID: &str = "impersonate-uid";
const EXTRA_PREFIX: &str = "impersonate-extra-";
const AUTHENTICATION_GROUP: &str = "authentication.k8s.io";

/// Who a request asks to act as.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Claim {
    pub user: String,
    pub groups: Vec<String>,
    pub uid: Option<String>,
    pub extra: BTreeMap<String, Vec<String>>,
}

/// The claim a request's headers make; `None` when they make none.
pub fn claim(headers: &HeaderMap) -> Result<Option<Claim>, ApiError> {
    let text = |v: &axum::http::HeaderValue| {
        v.to_str()
            .map(str::to_owned)
            .map_err(|_| ApiError::bad_request("impersonation headers must be visible ASCII"))
    };
    let mut claim = Claim::default();
    let mut user = None;
    for (name, value) in headers {
        let name = name.as_str();
        if name == USER {
            user = Some(text(value)?);
        } else if name == GROUP {
            claim.groups.push(text(value)?);
        } else if name == UID {
            claim.uid = Some(text(value)?);
        } else if let Some(key) = name.strip_prefix(EXTRA_PREFIX) {
            // The key is percent-encoded in the header's name (client-go
            // escapes what a header name may not hold).
            let key = percent_decode(key).to_lowercase();
            claim.extra.entry(key).or_default().push(text(value)?);
        }
    }
    match user {
        Some(user) if !user.is_empty() => {
            claim.user = user;
            Ok(Some(claim))
        }
        _ if claim.groups.is_empty() && claim.uid.is_none() && claim.extra.is_empty() => Ok(None),
        _ => Err(ApiError::bad_request(format!(
            "requested {} without impersonating a user",
            claim.describe()
        ))),
    }
}

impl Claim {
    fn describe(&self) -> String {
        let mut parts: Vec<String> = self.groups.iter().map(|g| format!("group {g:?}")).collect();
        parts.extend(self.extra.keys().map(|k| format!("extra {k:?}")));
        parts.extend(self.uid.iter().map(|u| format!("uid {u:?}")));
        format!("[{}]", parts.join(", "))
    }

    /// Each `impersonate` check the claim needs, in the real server's order.
    fn checks(&self) -> Vec<Attributes<'_>> {
        let check = |group, resource, subresource, namespace, name| Attributes {
            verb: "impersonate",
            group,
            resource,
            subresource,
            namespace,
            name: Some(name),
        };
        let mut checks = vec![match service_account(&self.user) {
            Some((ns, name)) => check("", "serviceaccounts", None, Some(ns), name),
            None => check("", "users", None, None, self.user.as_str()),
        }];
        checks.extend(
            self.groups
                .iter()
                .map(|g| check("", "groups", None, None, g.as_str())),
        );
        for (key, values) in &self.extra {
            for value in values {
                checks.push(check(
                    AUTHENTICATION_GROUP,
                    "userextras",
                    Some(key.as_str()),
                    None,
                    value.as_str(),
                ));
            }
        }
        if let Some(uid) = &self.uid {
            checks.push(check(AUTHENTICATION_GROUP, "uids", None, None, uid.as_str()));
        }
        checks
    }

    /// The user the request then acts as.
    fn user(&self) -> User {
        let mut groups = self.groups.clone();
        if groups.is_empty() {
            if let Some((ns, _)) = service_account(&self.user) {
                groups = User::service_account(ns, "").groups;
            }
        }
        let mut user = User::new(self.user.clone(), groups);
        user.uid = self.uid.clone();
        user.extra = self.extra.clone();
        user
    }
}

/// The namespace and name of a ServiceAccount's user name.
fn service_account(user: &str) -> Option<(&str, &str)> {
    let rest = user.strip_prefix("system:serviceaccount:")?;
    let (ns, name) = rest.split_once(':')?;
    (!ns.is_empty() && !name.is_empty() && !name.contains(':')).then_some((ns, name))
}

/// The identity a request acts as: `identity` itself without a claim, or
/// the claimed user once `identity` may impersonate everything it claims.
pub fn resolve(
    auth: &Authenticator,
    state: &State,
    identity: Identity,
    claim: Option<Claim>,
) -> Result<Identity, ApiError> {
    let Some(claim) = claim else {
        return Ok(identity);
    };
    if let Identity::User(requester) = &identity {
        for attrs in claim.checks() {
            if authz::allowed(state, requester, &attrs).is_none() {
                return Err(auth.deny(requester, authz::forbidden(requester, &attrs)));
            }
        }
    }
    Ok(Identity::User(claim.user()))
}

fn percent_decode(text: &str) -> String {
    let bytes = text.as_bytes();
    let mut out = Vec::with_capacity(bytes.len());
    let mut i = 0;
    while i < bytes.len() {
        let hex = bytes
            .get(i + 1..i + 3)
            .and_then(|h| std::str::from_utf8(h).ok())
            .and_then(|h| u8::from_str_radix(h, 16).ok());
        match (bytes[i], hex) {
            (b'%', Some(b)) => {
                out.push(b);
                i += 3;
            }
            (b, _) => {
                out.push(b);
                i += 1;
            }
        }
    }
    String::from_utf8_lossy(&out).into_owned()
}

#[cfg(test)]
mod tests;
