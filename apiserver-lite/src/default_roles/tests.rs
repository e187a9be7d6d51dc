use super::*;

fn role(name: &str, labels: Value, rules: Value) -> Value {
    json!({"metadata": {"name": name, "labels": labels}, "rules": rules})
}

fn rule(resource: &str, verb: &str) -> Value {
    json!({"apiGroups": [""], "resources": [resource], "verbs": [verb]})
}

#[test]
fn an_aggregated_role_holds_the_rules_of_the_roles_it_selects_once_each() {
    let admin = json!({
        "metadata": {"name": "admin"},
        "aggregationRule": {"clusterRoleSelectors": [
            {"matchLabels": {"to-admin": "true"}},
            {"matchExpressions": [{"key": "tier", "operator": "In", "values": ["a", "b"]}]},
        ]},
        "rules": [rule("stale", "get")],
    });
    let all = vec![
        admin.clone(),
        role(
            "a",
            json!({"to-admin": "true"}),
            json!([rule("cms", "get"), rule("secrets", "get")]),
        ),
        role(
            "b",
            json!({"tier": "b"}),
            json!([rule("cms", "get"), rule("leases", "list")]),
        ),
        role(
            "c",
            json!({"to-admin": "false", "tier": "c"}),
            json!([rule("nodes", "get")]),
        ),
    ];
    assert_eq!(
        aggregated_rules(&admin, &all),
        Some(json!([
            rule("cms", "get"),
            rule("secrets", "get"),
            rule("leases", "list")
        ]))
    );
    // A role without an aggregation rule keeps its own rules.
    assert_eq!(aggregated_rules(&all[1], &all), None);
    // A selector with an unknown operator selects nothing.
    let typo = json!({
        "metadata": {"name": "t"},
        "aggregationRule": {"clusterRoleSelectors": [{"matchExpressions": [{"key": "tier", "operator": "Inn", "values": ["b"]}]}]},
    });
    assert_eq!(aggregated_rules(&typo, &all), Some(json!([])));
}

#[test]
fn view_is_read_only_and_without_secrets_edit_writes_admin_grants_roles() {
    let find = |name: &str| {
        DEFAULT_CLUSTER_ROLES
            .iter()
            .find(|r| r["metadata"]["name"] == name)
            .cloned()
            .unwrap()
    };
    let view = find("system:aggregate-to-view");
    for rule in view["rules"].as_array().unwrap() {
        assert_eq!(rule["verbs"], json!(["get", "list", "watch"]), "{rule}");
        assert!(
            !rule["resources"].as_array().unwrap().contains(&json!("secrets")),
            "{rule}"
        );
    }
    assert_eq!(find("view")["metadata"]["labels"][label("edit")], "true");
    assert_eq!(find("edit")["metadata"]["labels"][label("admin")], "true");
    let admin = find("system:aggregate-to-admin");
    assert_eq!(admin["rules"][0]["resources"], json!(["rolebindings", "roles"]));
    assert_eq!(find("cluster-admin")["rules"][0]["verbs"], json!(["*"]));
}

#[test]
fn mending_gives_back_what_was_lost_and_keeps_what_was_added() {
    let want = json!({
        "metadata": {"name": "r", "labels": {"a": "1"}},
        "rules": [rule("cms", "get")],
    });
    let mut old = want.clone();
    assert_eq!(mend(&old, &want, &[]), None);
    old["rules"] = json!([rule("extra", "get")]);
    old["metadata"]["labels"] = json!({"mine": "x"});
    let mended = mend(&old, &want, &[]).unwrap();
    assert_eq!(mended["rules"], json!([rule("extra", "get"), rule("cms", "get")]));
    assert_eq!(mended["metadata"]["labels"], json!({"mine": "x", "a": "1"}));
}

#[test]
fn edit_writes_no_leases_as_upstream_and_a_stored_edit_that_did_loses_the_rule() {
    let grants_leases = |role: &Value| {
        role["rules"].as_array().into_iter().flatten().any(|r| {
            r["resources"]
                .as_array()
                .is_some_and(|rs| rs.contains(&json!("leases")))
        })
    };
    for role in DEFAULT_CLUSTER_ROLES
        .iter()
        .filter(|r| r["metadata"]["name"] != "cluster-admin")
    {
        assert!(!grants_leases(role), "{role}");
    }
    // A role stored by an earlier version, with a rule a person added.
    let want = DEFAULT_CLUSTER_ROLES
        .iter()
        .find(|r| r["metadata"]["name"] == "system:aggregate-to-edit")
        .unwrap()
        .clone();
    let mut old = want.clone();
    let (_, leases) = &REVOKED[0];
    old["rules"].as_array_mut().unwrap().push(leases.clone());
    old["rules"].as_array_mut().unwrap().push(rule("widgets", "get"));
    let mended = mend(&old, &want, &[leases]).unwrap();
    assert!(!grants_leases(&mended), "{mended}");
    assert!(mended["rules"]
        .as_array()
        .unwrap()
        .contains(&rule("widgets", "get")));
}
