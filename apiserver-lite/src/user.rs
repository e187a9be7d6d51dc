//! Who a request comes from, as authentication found it (a token, a
//! ServiceAccount, or someone impersonated); [`crate::authz`] decides what
//! they may do.

/// A user a bearer token stands for.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct User {
    pub name: String,
    /// Its uid, as a token file gives it (shown by `kubectl auth whoami`).
    pub uid: Option<String>,
    /// Its groups, `system:authenticated` included.
    pub groups: Vec<String>,
    /// What else its authenticator (or an impersonator) says of it.
    pub extra: std::collections::BTreeMap<String, Vec<String>>,
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
            uid: None,
            groups,
            extra: Default::default(),
        }
    }

    pub fn with_uid(mut self, uid: impl Into<String>) -> User {
        self.uid = Some(uid.into());
        self
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
