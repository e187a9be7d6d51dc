use super::*;

fn headers(pairs: &[(&str, &str)]) -> HeaderMap {
    let mut h = HeaderMap::new();
    for (k, v) in pairs {
        h.append(
            axum::http::HeaderName::from_bytes(k.as_bytes()).unwrap(),
            v.parse().unwrap(),
        );
    }
    h
}

fn checks(claim: &Claim) -> Vec<String> {
    claim
        .checks()
        .iter()
        .map(|a| {
            let sub = a.subresource.map(|s| format!("/{s}")).unwrap_or_default();
            format!(
                "{} {}/{}{sub} {} {}",
                a.verb,
                a.group,
                a.resource,
                a.namespace.unwrap_or("-"),
                a.name.unwrap_or("-")
            )
        })
        .collect()
}

#[test]
fn no_headers_no_claim() {
    assert_eq!(claim(&headers(&[("accept", "x")])).unwrap(), None);
}

#[test]
fn a_user_with_groups_uid_and_extras_is_checked_claim_by_claim() {
    let claim = claim(&headers(&[
        ("Impersonate-User", "jane"),
        ("Impersonate-Group", "ops"),
        ("Impersonate-Group", "dev"),
        ("Impersonate-Uid", "42"),
        ("Impersonate-Extra-Scopes%2Fa", "view"),
    ]))
    .unwrap()
    .unwrap();
    assert_eq!(
        checks(&claim),
        [
            "impersonate /users - jane",
            "impersonate /groups - ops",
            "impersonate /groups - dev",
            "impersonate authentication.k8s.io/userextras/scopes/a - view",
            "impersonate authentication.k8s.io/uids - 42",
        ]
    );
    let user = claim.user();
    assert_eq!(user.name, "jane");
    assert_eq!(user.groups, ["ops", "dev", "system:authenticated"]);
    assert_eq!(user.uid.as_deref(), Some("42"));
    assert_eq!(user.extra["scopes/a"], ["view"]);
}

#[test]
fn a_service_account_is_checked_in_its_namespace_and_gets_its_groups() {
    let claim = claim(&headers(&[(
        "impersonate-user",
        "system:serviceaccount:ns:viewer",
    )]))
    .unwrap()
    .unwrap();
    assert_eq!(checks(&claim), ["impersonate /serviceaccounts ns viewer"]);
    assert_eq!(
        claim.user().groups,
        [
            "system:serviceaccounts",
            "system:serviceaccounts:ns",
            "system:authenticated"
        ]
    );
    // Groups given replace the ServiceAccount's own.
    let with_group = Claim {
        groups: vec!["ops".into()],
        ..claim
    };
    assert_eq!(with_group.user().groups, ["ops", "system:authenticated"]);
    // Not a ServiceAccount's name: a plain user.
    assert_eq!(service_account("system:serviceaccount:ns"), None);
    assert_eq!(service_account("system:serviceaccount:ns:a:b"), None);
}

#[test]
fn groups_without_a_user_are_refused() {
    for h in [
        headers(&[("impersonate-group", "ops")]),
        headers(&[("impersonate-uid", "1")]),
        headers(&[("impersonate-user", ""), ("impersonate-group", "ops")]),
    ] {
        let err = claim(&h).unwrap_err();
        assert_eq!(err.code, axum::http::StatusCode::BAD_REQUEST);
        assert!(
            err.message.contains("without impersonating a user"),
            "{}",
            err.message
        );
    }
}

#[test]
fn extra_keys_are_percent_decoded() {
    assert_eq!(percent_decode("a%2Fb%zz"), "a/b%zz");
}
