use super::*;
use crate::http::request::Verb;

fn attrs<'a>(verb: Verb, resource: &'a str, sub: Option<&'a str>, name: Option<&'a str>) -> Attributes<'a> {
    Attributes {
        verb: verb.as_str(),
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
    assert!(rule_allows(&rule, &attrs(Verb::Get, "tasks", None, Some("a"))));
    assert!(rule_allows(
        &rule,
        &attrs(Verb::Patch, "tasks", Some("status"), Some("a"))
    ));
    assert!(!rule_allows(
        &rule,
        &attrs(Verb::Delete, "tasks", None, Some("a"))
    ));
    assert!(!rule_allows(&rule, &attrs(Verb::Get, "jobs", None, Some("a"))));
    assert!(!rule_allows(
        &rule,
        &attrs(Verb::Patch, "jobs", Some("status"), None)
    ));
    let mut other_group = attrs(Verb::Get, "tasks", None, None);
    other_group.group = "";
    assert!(!rule_allows(&rule, &other_group));

    // The resource alone does not grant its subresources.
    let plain = json!({"apiGroups": ["*"], "resources": ["tasks"], "verbs": ["*"]});
    assert!(rule_allows(
        &plain,
        &attrs(Verb::DeleteCollection, "tasks", None, None)
    ));
    assert!(!rule_allows(
        &plain,
        &attrs(Verb::Patch, "tasks", Some("status"), None)
    ));
    let any_status = json!({"apiGroups": ["robot.k8s4r.io"], "resources": ["*/status"], "verbs": ["patch"]});
    assert!(rule_allows(
        &any_status,
        &attrs(Verb::Patch, "jobs", Some("status"), None)
    ));
    assert!(!rule_allows(&any_status, &attrs(Verb::Patch, "jobs", None, None)));

    let named = json!({"apiGroups": ["robot.k8s4r.io"], "resources": ["jobs"], "resourceNames": ["one"], "verbs": ["get", "list"]});
    assert!(rule_allows(&named, &attrs(Verb::Get, "jobs", None, Some("one"))));
    assert!(!rule_allows(&named, &attrs(Verb::Get, "jobs", None, Some("two"))));
    assert!(!rule_allows(&named, &attrs(Verb::List, "jobs", None, None)));
}

#[test]
fn path_rules_match_exact_paths_and_prefixes() {
    let rule = json!({"nonResourceURLs": ["/version", "/apis/*"], "verbs": ["get"]});
    let path = |path| PathAttributes { verb: "get", path };
    assert!(rule_allows_path(&rule, &path("/version")));
    assert!(rule_allows_path(&rule, &path("/apis/apps/v1")));
    assert!(!rule_allows_path(&rule, &path("/apis")));
    assert!(!rule_allows_path(&rule, &path("/version/x")));
    assert!(!rule_allows_path(
        &rule,
        &PathAttributes {
            verb: "post",
            path: "/version"
        }
    ));
    let any = json!({"nonResourceURLs": ["*"], "verbs": ["*"]});
    assert!(rule_allows_path(
        &any,
        &PathAttributes {
            verb: "delete",
            path: "/"
        }
    ));
    // A resource rule grants no path.
    let resources = json!({"apiGroups": ["*"], "resources": ["*"], "verbs": ["*"]});
    assert!(!rule_allows_path(&resources, &path("/version")));
}

#[test]
fn grants_are_described_as_the_real_authorizer_does() {
    let role = Arc::new(json!({"rules": []}));
    let binding = json!({"metadata": {"name": "b"}, "roleRef": {"kind": "Role", "name": "r"}});
    let sa = json!({"kind": "ServiceAccount", "name": "sa"});
    let local = Bound {
        binding: &binding,
        subject: &sa,
        namespace: Some("ns"),
        role: role.clone(),
    };
    assert_eq!(
        local.describe(),
        r#"RoleBinding "b/ns" of Role "r" to ServiceAccount "sa/ns""#
    );
    let cluster_binding =
        json!({"metadata": {"name": "cb"}, "roleRef": {"kind": "ClusterRole", "name": "cr"}});
    let group = json!({"kind": "Group", "name": "ops"});
    let cluster = Bound {
        binding: &cluster_binding,
        subject: &group,
        namespace: None,
        role,
    };
    assert_eq!(
        cluster.describe(),
        r#"ClusterRoleBinding "cb" of ClusterRole "cr" to Group "ops""#
    );
}

#[test]
fn token_files_name_users_and_groups() {
    let users = parse_token_file("# comment\n\nt1,alice,1\nt2,bob,2,\"ops,dev\"\n").unwrap();
    assert_eq!(users["t1"].name, "alice");
    assert_eq!(users["t1"].uid.as_deref(), Some("1"));
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
    assert!(subject_of(&binding, None, &sa).is_some());
    let other =
        json!({"subjects": [{"kind": "ServiceAccount", "name": "k8s4r-server", "namespace": "default"}]});
    assert!(subject_of(&other, None, &sa).is_none());
    let group = json!({"subjects": [{"kind": "Group", "name": "system:serviceaccounts"}]});
    assert!(subject_of(&group, None, &sa).is_some());
    // In a RoleBinding, a ServiceAccount without a namespace is in the binding's.
    let bare = json!({"subjects": [{"kind": "ServiceAccount", "name": "k8s4r-server"}]});
    assert!(subject_of(&bare, Some("k8s4r-system"), &sa).is_some());
    assert!(subject_of(&bare, Some("default"), &sa).is_none());
}

#[test]
fn the_admin_token_matches_only_whole() {
    let auth = Authenticator::new(
        "s3cret-admin".into(),
        HashMap::new(),
        crate::service_account_tokens::Signer::from_bytes(b"key"),
    );
    assert!(auth.is_admin_token("s3cret-admin"));
    for wrong in ["", "s3cret", "s3cret-admin2", "s3cret-admiN", "t3cret-admin"] {
        assert!(!auth.is_admin_token(wrong), "{wrong:?}");
    }
}
