//! Bearer tokens for users, and RBAC deciding what they may do, through the
//! kube client over real HTTPS.

use apiserver_lite::{Config, User};
use k8s_openapi::api::apps::v1::Deployment;
use k8s_openapi::api::authentication::v1::SelfSubjectReview;
use k8s_openapi::api::authorization::v1::{
    SelfSubjectAccessReview, SelfSubjectRulesReview, SubjectAccessReviewStatus,
};
use k8s_openapi::api::core::v1::{ConfigMap, Secret};
use k8s_openapi::api::rbac::v1::{ClusterRole, ClusterRoleBinding, Role, RoleBinding};
use kube::api::{Api, ListParams, Patch, PatchParams, PostParams};
use kube::Client;
use serde_json::json;

const SA_TOKEN: &str = "reader-token";

fn forbidden(result: Result<impl std::fmt::Debug, kube::Error>) -> String {
    match result {
        Err(kube::Error::Api(s)) if s.code == 403 => {
            assert_eq!(s.reason, "Forbidden");
            s.message
        }
        other => panic!("expected 403 Forbidden, got {other:?}"),
    }
}

async fn apply(admin: &Client, object: serde_json::Value) {
    let kind = object["kind"].as_str().unwrap().to_owned();
    let name = object["metadata"]["name"].as_str().unwrap().to_owned();
    let ns = object["metadata"]["namespace"].as_str().map(str::to_owned);
    let (ar, _) = kube::discovery::pinned_kind(
        admin,
        &kube::core::GroupVersionKind::try_from(&kube::core::TypeMeta {
            api_version: object["apiVersion"].as_str().unwrap().to_owned(),
            kind: kind.clone(),
        })
        .unwrap(),
    )
    .await
    .unwrap();
    let api: Api<kube::core::DynamicObject> = match &ns {
        Some(ns) => Api::namespaced_with(admin.clone(), ns, &ar),
        None => Api::all_with(admin.clone(), &ar),
    };
    api.patch(&name, &PatchParams::apply("test"), &Patch::Apply(object))
        .await
        .unwrap_or_else(|e| panic!("apply {kind} {name}: {e}"));
}

#[tokio::test]
async fn rbac_decides_what_a_service_account_may_do() {
    let server = Config::for_tests()
        .user(SA_TOKEN, User::service_account("default", "reader"))
        .start()
        .await
        .unwrap();
    let admin = server.client().await.unwrap();
    let reader = server.client_with_token(SA_TOKEN).await.unwrap();

    // Discovery needs no grant.
    reader.apiserver_version().await.unwrap();

    let admin_cms: Api<ConfigMap> = Api::namespaced(admin.clone(), "default");
    let cm = |name: &str| -> ConfigMap {
        serde_json::from_value(json!({"metadata": {"name": name}, "data": {"k": "v"}})).unwrap()
    };
    admin_cms.create(&PostParams::default(), &cm("a")).await.unwrap();
    let cms: Api<ConfigMap> = Api::namespaced(reader.clone(), "default");

    let message = forbidden(cms.list(&ListParams::default()).await);
    assert_eq!(
        message,
        "configmaps is forbidden: User \"system:serviceaccount:default:reader\" cannot list resource \"configmaps\" in API group \"\" in the namespace \"default\""
    );

    // A Role bound to the service account in its namespace grants reading there only.
    apply(
        &admin,
        json!({"apiVersion": "rbac.authorization.k8s.io/v1", "kind": "Role",
               "metadata": {"name": "read-cms", "namespace": "default"},
               "rules": [{"apiGroups": [""], "resources": ["configmaps"], "verbs": ["get", "list", "watch"]}]}),
    )
    .await;
    apply(
        &admin,
        json!({"apiVersion": "rbac.authorization.k8s.io/v1", "kind": "RoleBinding",
               "metadata": {"name": "reader", "namespace": "default"},
               "roleRef": {"apiGroup": "rbac.authorization.k8s.io", "kind": "Role", "name": "read-cms"},
               "subjects": [{"kind": "ServiceAccount", "name": "reader", "namespace": "default"}]}),
    )
    .await;
    assert_eq!(cms.list(&ListParams::default()).await.unwrap().items.len(), 1);
    assert_eq!(cms.get("a").await.unwrap().data.unwrap()["k"], "v");
    let message = forbidden(cms.create(&PostParams::default(), &cm("b")).await);
    assert!(
        message.contains("cannot create resource \"configmaps\""),
        "{message}"
    );
    let elsewhere: Api<ConfigMap> = Api::namespaced(reader.clone(), "kube-system");
    let message = forbidden(elsewhere.list(&ListParams::default()).await);
    assert!(message.contains("in the namespace \"kube-system\""), "{message}");

    // resourceNames: only the named Secret, also when a list pins its name.
    let admin_secrets: Api<Secret> = Api::namespaced(admin.clone(), "default");
    for name in ["one", "two"] {
        let secret: Secret = serde_json::from_value(json!({"metadata": {"name": name}})).unwrap();
        admin_secrets
            .create(&PostParams::default(), &secret)
            .await
            .unwrap();
    }
    apply(
        &admin,
        json!({"apiVersion": "rbac.authorization.k8s.io/v1", "kind": "ClusterRole",
               "metadata": {"name": "secret-one"},
               "rules": [{"apiGroups": [""], "resources": ["secrets"], "resourceNames": ["one"], "verbs": ["get", "list"]}]}),
    )
    .await;
    apply(
        &admin,
        json!({"apiVersion": "rbac.authorization.k8s.io/v1", "kind": "ClusterRoleBinding",
               "metadata": {"name": "reader-secret-one"},
               "roleRef": {"apiGroup": "rbac.authorization.k8s.io", "kind": "ClusterRole", "name": "secret-one"},
               "subjects": [{"kind": "ServiceAccount", "name": "reader", "namespace": "default"}]}),
    )
    .await;
    let secrets: Api<Secret> = Api::namespaced(reader.clone(), "default");
    secrets.get("one").await.unwrap();
    let message = forbidden(secrets.get("two").await);
    assert!(message.starts_with("secrets \"two\" is forbidden"), "{message}");
    forbidden(secrets.list(&ListParams::default()).await);
    let pinned = secrets
        .list(&ListParams::default().fields("metadata.name=one"))
        .await
        .unwrap();
    assert_eq!(pinned.items.len(), 1);

    // A resource's rule does not cover its status subresource.
    let admin_deploys: Api<Deployment> = Api::namespaced(admin.clone(), "default");
    let deploy: Deployment = serde_json::from_value(json!({
        "metadata": {"name": "d"},
        "spec": {"selector": {"matchLabels": {"app": "d"}},
                 "template": {"metadata": {"labels": {"app": "d"}}, "spec": {"containers": [{"name": "c", "image": "i"}]}}}
    }))
    .unwrap();
    admin_deploys
        .create(&PostParams::default(), &deploy)
        .await
        .unwrap();
    apply(
        &admin,
        json!({"apiVersion": "rbac.authorization.k8s.io/v1", "kind": "Role",
               "metadata": {"name": "read-cms", "namespace": "default"},
               "rules": [{"apiGroups": [""], "resources": ["configmaps"], "verbs": ["get", "list", "watch"]},
                         {"apiGroups": ["apps"], "resources": ["deployments"], "verbs": ["patch"]}]}),
    )
    .await;
    let deploys: Api<Deployment> = Api::namespaced(reader.clone(), "default");
    let status = Patch::Merge(json!({"status": {"replicas": 1}}));
    let message = forbidden(deploys.patch_status("d", &PatchParams::default(), &status).await);
    assert!(
        message.contains("cannot patch resource \"deployments/status\" in API group \"apps\""),
        "{message}"
    );
    deploys
        .patch(
            "d",
            &PatchParams::default(),
            &Patch::Merge(json!({"metadata": {"labels": {"x": "y"}}})),
        )
        .await
        .unwrap();

    // What was denied is on record, newest last.
    let denied = server.denied();
    assert_eq!(denied.len(), 6, "{denied:#?}");
    assert!(denied.last().unwrap().contains("deployments/status"));

    // A field selector names nothing but a list or a watch: a create
    // allowed for one name cannot borrow it from the query string.
    apply(
        &admin,
        json!({"apiVersion": "rbac.authorization.k8s.io/v1", "kind": "Role",
               "metadata": {"name": "pinned", "namespace": "default"},
               "rules": [{"apiGroups": [""], "resources": ["configmaps"], "resourceNames": ["pinned"], "verbs": ["create"]},
                         {"apiGroups": [""], "resources": ["configmaps"], "verbs": ["patch"]}]}),
    )
    .await;
    apply(
        &admin,
        json!({"apiVersion": "rbac.authorization.k8s.io/v1", "kind": "RoleBinding",
               "metadata": {"name": "pinned", "namespace": "default"},
               "roleRef": {"apiGroup": "rbac.authorization.k8s.io", "kind": "Role", "name": "pinned"},
               "subjects": [{"kind": "ServiceAccount", "name": "reader"}]}),
    )
    .await;
    let body =
        serde_json::to_vec(&json!({"apiVersion": "v1", "kind": "ConfigMap", "metadata": {"name": "other"}}))
            .unwrap();
    let smuggled =
        http::Request::post("/api/v1/namespaces/default/configmaps?fieldSelector=metadata.name%3Dpinned")
            .header("content-type", "application/json")
            .body(body)
            .unwrap();
    forbidden(reader.request::<ConfigMap>(smuggled).await);

    // An apply that creates needs `create` as well as `patch` (the binding's
    // ServiceAccount subject has no namespace: it is the binding's).
    let apply_cm = |name: &str| {
        Patch::Apply(
            json!({"apiVersion": "v1", "kind": "ConfigMap", "metadata": {"name": name}, "data": {"k": "applied"}}),
        )
    };
    let message = forbidden(
        cms.patch("fresh", &PatchParams::apply("reader"), &apply_cm("fresh"))
            .await,
    );
    assert!(
        message.contains("cannot create resource \"configmaps\""),
        "{message}"
    );
    admin_cms
        .create(&PostParams::default(), &cm("fresh"))
        .await
        .unwrap();
    let applied = cms
        .patch("fresh", &PatchParams::apply("reader").force(), &apply_cm("fresh"))
        .await
        .unwrap();
    assert_eq!(applied.data.unwrap()["k"], "applied");
    cms.patch("pinned", &PatchParams::apply("reader"), &apply_cm("pinned"))
        .await
        .unwrap();

    // What was allowed is on record too, once per kind of use.
    let used = server.used();
    assert!(
        used.contains("system:serviceaccount:default:reader get /secrets default"),
        "{used:#?}"
    );
    assert!(
        used.contains("system:serviceaccount:default:reader patch apps/deployments default"),
        "{used:#?}"
    );
    assert!(
        !used.iter().any(|u| u.contains("deployments/status")),
        "{used:#?}"
    );

    // A token nobody issued is not a user at all.
    let stranger = server.client_with_token("nobody").await.unwrap();
    match stranger.apiserver_version().await {
        Err(kube::Error::Api(s)) => assert_eq!(s.code, 401),
        other => panic!("expected 401, got {other:?}"),
    }
    server.shutdown().await.unwrap();
}

/// Asks the server, as `client`, whether it may do something.
async fn can_i(client: &Client, attributes: serde_json::Value) -> SubjectAccessReviewStatus {
    let reviews: Api<SelfSubjectAccessReview> = Api::all(client.clone());
    let review: SelfSubjectAccessReview = serde_json::from_value(json!({"spec": attributes})).unwrap();
    reviews
        .create(&PostParams::default(), &review)
        .await
        .unwrap()
        .status
        .expect("a status")
}

#[tokio::test]
async fn access_reviews_answer_as_the_enforced_rbac_decides() {
    let server = Config::for_tests()
        .user(SA_TOKEN, User::service_account("default", "reader"))
        .start()
        .await
        .unwrap();
    let admin = server.client().await.unwrap();
    let reader = server.client_with_token(SA_TOKEN).await.unwrap();
    apply(
        &admin,
        json!({"apiVersion": "rbac.authorization.k8s.io/v1", "kind": "Role",
               "metadata": {"name": "read-cms", "namespace": "default"},
               "rules": [{"apiGroups": [""], "resources": ["configmaps"], "verbs": ["get", "list"]},
                         {"apiGroups": [""], "resources": ["secrets"], "resourceNames": ["one"], "verbs": ["get"]}]}),
    )
    .await;
    apply(
        &admin,
        json!({"apiVersion": "rbac.authorization.k8s.io/v1", "kind": "RoleBinding",
               "metadata": {"name": "reader", "namespace": "default"},
               "roleRef": {"apiGroup": "rbac.authorization.k8s.io", "kind": "Role", "name": "read-cms"},
               "subjects": [{"kind": "ServiceAccount", "name": "reader"}]}),
    )
    .await;

    // Each question is asked as a review, then as the request itself: the
    // two answers agree.
    let cm = || -> ConfigMap { serde_json::from_value(json!({"metadata": {"name": "c"}})).unwrap() };
    Api::<ConfigMap>::namespaced(admin.clone(), "default")
        .create(&PostParams::default(), &cm())
        .await
        .unwrap();
    let cms = |ns: &str| Api::<ConfigMap>::namespaced(reader.clone(), ns);
    let cases: Vec<(serde_json::Value, bool)> = vec![
        (
            json!({"verb": "list", "resource": "configmaps", "namespace": "default"}),
            cms("default").list(&ListParams::default()).await.is_ok(),
        ),
        (
            json!({"verb": "list", "resource": "configmaps", "namespace": "kube-system"}),
            cms("kube-system").list(&ListParams::default()).await.is_ok(),
        ),
        (
            json!({"verb": "create", "resource": "configmaps", "namespace": "default"}),
            cms("default").create(&PostParams::default(), &cm()).await.is_ok(),
        ),
        (
            json!({"verb": "get", "resource": "secrets", "namespace": "default", "name": "two"}),
            Api::<Secret>::namespaced(reader.clone(), "default")
                .get("two")
                .await
                .is_ok(),
        ),
    ];
    for (attributes, did) in cases {
        let status = can_i(&reader, json!({"resourceAttributes": attributes})).await;
        assert_eq!(status.allowed, did, "{attributes}: {status:?}");
    }
    let allowed = can_i(
        &reader,
        json!({"resourceAttributes": {"verb": "get", "resource": "secrets", "namespace": "default", "name": "one"}}),
    )
    .await;
    assert!(allowed.allowed);
    assert_eq!(
        allowed.reason.as_deref(),
        Some("RBAC: allowed by RoleBinding \"reader/default\" of Role \"read-cms\" to ServiceAccount \"reader/default\"")
    );
    // Every user may ask, and read discovery, but not `/`.
    let reviews = json!({"resourceAttributes": {"verb": "create", "group": "authorization.k8s.io", "resource": "selfsubjectaccessreviews"}});
    assert!(can_i(&reader, reviews).await.allowed);
    let version = can_i(
        &reader,
        json!({"nonResourceAttributes": {"verb": "get", "path": "/version"}}),
    )
    .await;
    assert!(version.allowed);
    assert!(version
        .reason
        .unwrap()
        .contains("ClusterRole \"system:discovery\" to Group \"system:authenticated\""),);
    assert!(
        !can_i(
            &reader,
            json!({"nonResourceAttributes": {"verb": "get", "path": "/"}})
        )
        .await
        .allowed
    );
    let root = reader
        .request_text(http::Request::get("/").body(vec![]).unwrap())
        .await;
    assert!(
        matches!(root, Err(kube::Error::Api(s)) if s.code == 403 && s.message == "forbidden: User \"system:serviceaccount:default:reader\" cannot get path \"/\"")
    );
    // A ClusterRole's nonResourceURLs, bound cluster-wide, grant paths.
    apply(
        &admin,
        json!({"apiVersion": "rbac.authorization.k8s.io/v1", "kind": "ClusterRole",
               "metadata": {"name": "root"},
               "rules": [{"nonResourceURLs": ["/"], "verbs": ["get"]}]}),
    )
    .await;
    apply(
        &admin,
        json!({"apiVersion": "rbac.authorization.k8s.io/v1", "kind": "ClusterRoleBinding",
               "metadata": {"name": "reader-root"},
               "roleRef": {"apiGroup": "rbac.authorization.k8s.io", "kind": "ClusterRole", "name": "root"},
               "subjects": [{"kind": "ServiceAccount", "name": "reader", "namespace": "default"}]}),
    )
    .await;
    assert!(
        can_i(
            &reader,
            json!({"nonResourceAttributes": {"verb": "get", "path": "/"}})
        )
        .await
        .allowed
    );
    reader
        .request_text(http::Request::get("/").body(vec![]).unwrap())
        .await
        .unwrap();
    // The administrator may do anything, and is told so without a reason.
    let anything = can_i(
        &admin,
        json!({"resourceAttributes": {"verb": "*", "group": "*", "resource": "*"}}),
    )
    .await;
    assert_eq!((anything.allowed, anything.reason), (true, None));

    // A review asks exactly one question.
    let reviews: Api<SelfSubjectAccessReview> = Api::all(reader.clone());
    let both: SelfSubjectAccessReview = serde_json::from_value(json!({"spec": {
        "resourceAttributes": {"verb": "get", "resource": "configmaps"},
        "nonResourceAttributes": {"verb": "get", "path": "/version"}}}))
    .unwrap();
    match reviews.create(&PostParams::default(), &both).await {
        Err(kube::Error::Api(s)) => assert_eq!((s.code, s.reason.as_str()), (422, "Invalid")),
        other => panic!("expected 422, got {other:?}"),
    }
    // Reviews are created, never read back.
    match reviews.list(&ListParams::default()).await {
        Err(kube::Error::Api(s)) => assert_eq!(s.code, 403),
        other => panic!("expected 403, got {other:?}"),
    }
    match Api::<SelfSubjectAccessReview>::all(admin.clone())
        .list(&ListParams::default())
        .await
    {
        Err(kube::Error::Api(s)) => assert_eq!(s.code, 405),
        other => panic!("expected 405, got {other:?}"),
    }

    // The rules review lists the built-in grants and the bound Role's rules.
    let rules: Api<SelfSubjectRulesReview> = Api::all(reader.clone());
    let review: SelfSubjectRulesReview =
        serde_json::from_value(json!({"spec": {"namespace": "default"}})).unwrap();
    let status = rules
        .create(&PostParams::default(), &review)
        .await
        .unwrap()
        .status
        .unwrap();
    assert!(!status.incomplete);
    let resources: Vec<String> = status
        .resource_rules
        .iter()
        .map(|r| {
            format!(
                "{:?} {:?} {:?}",
                r.resources.clone().unwrap_or_default(),
                r.resource_names.clone().unwrap_or_default(),
                r.verbs
            )
        })
        .collect();
    assert!(
        resources.contains(&r#"["configmaps"] [] ["get", "list"]"#.to_owned()),
        "{resources:#?}"
    );
    assert!(
        resources.contains(&r#"["secrets"] ["one"] ["get"]"#.to_owned()),
        "{resources:#?}"
    );
    assert!(
        resources.iter().any(|r| r.contains("selfsubjectrulesreviews")),
        "{resources:#?}"
    );
    assert!(status
        .non_resource_rules
        .iter()
        .any(|r| r.non_resource_urls.as_deref() == Some(&["/".to_owned()][..])));
    // In another namespace, the RoleBinding does not apply.
    let review: SelfSubjectRulesReview =
        serde_json::from_value(json!({"spec": {"namespace": "kube-system"}})).unwrap();
    let status = rules
        .create(&PostParams::default(), &review)
        .await
        .unwrap()
        .status
        .unwrap();
    assert!(!status.resource_rules.iter().any(|r| r
        .resources
        .as_ref()
        .is_some_and(|r| r.contains(&"configmaps".to_owned()))));
    server.shutdown().await.unwrap();
}

#[tokio::test]
async fn whoami_names_the_token_s_user() {
    let server = Config::for_tests()
        .user(SA_TOKEN, User::service_account("default", "reader"))
        .start()
        .await
        .unwrap();
    for (client, name, group) in [
        (
            server.client().await.unwrap(),
            "apiserver-lite:admin",
            "system:masters",
        ),
        (
            server.client_with_token(SA_TOKEN).await.unwrap(),
            "system:serviceaccount:default:reader",
            "system:serviceaccounts:default",
        ),
    ] {
        let reviews: Api<SelfSubjectReview> = Api::all(client);
        let me = reviews
            .create(&PostParams::default(), &SelfSubjectReview::default())
            .await
            .unwrap();
        let info = me.status.unwrap().user_info.unwrap();
        assert_eq!(info.username.as_deref(), Some(name));
        let groups = info.groups.unwrap();
        assert!(groups.iter().any(|g| g == group), "{groups:?}");
        assert!(groups.iter().any(|g| g == "system:authenticated"), "{groups:?}");
    }
    server.shutdown().await.unwrap();
}

const ALICE_TOKEN: &str = "alice-token";

fn role(name: &str, rules: serde_json::Value) -> Role {
    serde_json::from_value(json!({"metadata": {"name": name, "namespace": "default"}, "rules": rules}))
        .unwrap()
}

fn role_binding(name: &str, kind: &str, role: &str) -> RoleBinding {
    serde_json::from_value(json!({
        "metadata": {"name": name, "namespace": "default"},
        "roleRef": {"apiGroup": "rbac.authorization.k8s.io", "kind": kind, "name": role},
        "subjects": [{"apiGroup": "rbac.authorization.k8s.io", "kind": "User", "name": "bob"}],
    }))
    .unwrap()
}

/// Binds `rules` to alice: in `default` (a Role), or cluster-wide.
async fn grant_alice(admin: &Client, name: &str, namespace: Option<&str>, rules: serde_json::Value) {
    let (role_kind, binding_kind) = match namespace {
        Some(_) => ("Role", "RoleBinding"),
        None => ("ClusterRole", "ClusterRoleBinding"),
    };
    let mut meta = json!({"name": name});
    if let Some(ns) = namespace {
        meta["namespace"] = json!(ns);
    }
    apply(
        admin,
        json!({"apiVersion": "rbac.authorization.k8s.io/v1", "kind": role_kind, "metadata": meta, "rules": rules}),
    )
    .await;
    apply(
        admin,
        json!({"apiVersion": "rbac.authorization.k8s.io/v1", "kind": binding_kind, "metadata": meta,
               "roleRef": {"apiGroup": "rbac.authorization.k8s.io", "kind": role_kind, "name": name},
               "subjects": [{"apiGroup": "rbac.authorization.k8s.io", "kind": "User", "name": "alice"}]}),
    )
    .await;
}

#[tokio::test]
async fn roles_and_bindings_grant_only_what_their_writer_holds() {
    let server = Config::for_tests()
        .user(ALICE_TOKEN, User::new("alice", ["ops".to_owned()]))
        .start()
        .await
        .unwrap();
    let admin = server.client().await.unwrap();
    let alice = server.client_with_token(ALICE_TOKEN).await.unwrap();
    // alice may write Roles and RoleBindings in `default`, and read ConfigMaps there.
    grant_alice(
        &admin,
        "rbac-writer",
        Some("default"),
        json!([{"apiGroups": ["rbac.authorization.k8s.io"], "resources": ["roles", "rolebindings"], "verbs": ["create", "update", "patch", "get"]},
               {"apiGroups": [""], "resources": ["configmaps"], "verbs": ["get", "list"]}]),
    )
    .await;
    let roles: Api<Role> = Api::namespaced(alice.clone(), "default");
    let bindings: Api<RoleBinding> = Api::namespaced(alice.clone(), "default");
    let pp = PostParams::default();

    // A Role with rights she holds, yes; one with more, no.
    let cm_reader = roles
        .create(
            &pp,
            &role(
                "cm-reader",
                json!([{"apiGroups": [""], "resources": ["configmaps"], "verbs": ["get"]}]),
            ),
        )
        .await
        .unwrap();
    let secrets = json!([{"apiGroups": [""], "resources": ["secrets"], "verbs": ["get", "list"]}]);
    let message = forbidden(roles.create(&pp, &role("secret-reader", secrets.clone())).await);
    assert_eq!(
        message,
        "roles.rbac.authorization.k8s.io \"secret-reader\" is forbidden: user \"alice\" (groups=[\"ops\" \"system:authenticated\"]) is attempting to grant RBAC permissions not currently held:\n{APIGroups:[\"\"], Resources:[\"secrets\"], Verbs:[\"get\" \"list\"]}"
    );
    // Nor can she widen one by an update, a patch or an apply.
    let mut wider = cm_reader.clone();
    wider.rules.as_mut().unwrap()[0].verbs.push("delete".into());
    forbidden(roles.replace("cm-reader", &pp, &wider).await);
    let add_delete = Patch::Json::<()>(
        serde_json::from_value(json!([{"op": "add", "path": "/rules/0/verbs/-", "value": "delete"}]))
            .unwrap(),
    );
    forbidden(
        roles
            .patch("cm-reader", &PatchParams::default(), &add_delete)
            .await,
    );
    let applied = Patch::Apply(
        json!({"apiVersion": "rbac.authorization.k8s.io/v1", "kind": "Role",
        "metadata": {"name": "cm-reader"}, "rules": [{"apiGroups": [""], "resources": ["configmaps"], "verbs": ["*"]}]}),
    );
    forbidden(
        roles
            .patch("cm-reader", &PatchParams::apply("alice").force(), &applied)
            .await,
    );

    // A Role she could not have written: only its finalizers and owners may change.
    apply(
        &admin,
        json!({"apiVersion": "rbac.authorization.k8s.io/v1", "kind": "Role",
               "metadata": {"name": "secret-reader", "namespace": "default"}, "rules": secrets}),
    )
    .await;
    let finalizer = Patch::Merge(json!({"metadata": {"finalizers": ["example.com/hold"]}}));
    roles
        .patch("secret-reader", &PatchParams::default(), &finalizer)
        .await
        .unwrap();
    let label = Patch::Merge(json!({"metadata": {"labels": {"a": "b"}}}));
    forbidden(
        roles
            .patch("secret-reader", &PatchParams::default(), &label)
            .await,
    );

    // Binding: to a Role whose rights she holds, yes; to more, no; to nothing, 404.
    bindings
        .create(&pp, &role_binding("bob-cms", "Role", "cm-reader"))
        .await
        .unwrap();
    let message = forbidden(
        bindings
            .create(&pp, &role_binding("bob-secrets", "Role", "secret-reader"))
            .await,
    );
    assert!(
        message.starts_with(
            "rolebindings.rbac.authorization.k8s.io \"bob-secrets\" is forbidden: user \"alice\""
        ),
        "{message}"
    );
    match bindings
        .create(&pp, &role_binding("bob-nothing", "Role", "missing"))
        .await
    {
        Err(kube::Error::Api(s)) => assert_eq!(
            (s.code, s.message.as_str()),
            (404, "roles.rbac.authorization.k8s.io \"missing\" not found")
        ),
        other => panic!("expected 404, got {other:?}"),
    }
    // Pointing an existing binding at more is the same as creating it.
    let mut rebound = bindings.get("bob-cms").await.unwrap();
    rebound.role_ref.name = "secret-reader".into();
    forbidden(bindings.replace("bob-cms", &pp, &rebound).await);

    // `bind`, for the one Role it names, lets her bind that Role.
    grant_alice(
        &admin,
        "bind-secret-reader",
        Some("default"),
        json!([{"apiGroups": ["rbac.authorization.k8s.io"], "resources": ["roles"], "resourceNames": ["secret-reader"], "verbs": ["bind"]}]),
    )
    .await;
    bindings
        .create(&pp, &role_binding("bob-secrets", "Role", "secret-reader"))
        .await
        .unwrap();
    apply(
        &admin,
        json!({"apiVersion": "rbac.authorization.k8s.io/v1", "kind": "ClusterRole",
               "metadata": {"name": "all-secrets"}, "rules": secrets}),
    )
    .await;
    forbidden(
        bindings
            .create(
                &pp,
                &role_binding("bob-all-secrets", "ClusterRole", "all-secrets"),
            )
            .await,
    );
    // `escalate` lets her write any Role.
    assert!(!can_i(&alice, json!({"resourceAttributes": {"verb": "escalate", "group": "rbac.authorization.k8s.io", "resource": "roles", "namespace": "default"}})).await.allowed);
    grant_alice(
        &admin,
        "escalate-roles",
        Some("default"),
        json!([{"apiGroups": ["rbac.authorization.k8s.io"], "resources": ["roles"], "verbs": ["escalate"]}]),
    )
    .await;
    assert!(can_i(&alice, json!({"resourceAttributes": {"verb": "escalate", "group": "rbac.authorization.k8s.io", "resource": "roles", "namespace": "default"}})).await.allowed);
    roles
        .create(
            &pp,
            &role(
                "anything",
                json!([{"apiGroups": ["*"], "resources": ["*"], "verbs": ["*"]}]),
            ),
        )
        .await
        .unwrap();

    // A ClusterRole needs its rights held cluster-wide: alice reads
    // ConfigMaps in `default` only.
    grant_alice(
        &admin,
        "cluster-rbac-writer",
        None,
        json!([{"apiGroups": ["rbac.authorization.k8s.io"], "resources": ["clusterroles", "clusterrolebindings"], "verbs": ["create"]}]),
    )
    .await;
    let cluster_roles: Api<ClusterRole> = Api::all(alice.clone());
    let cluster_role = |name: &str, rules: serde_json::Value| -> ClusterRole {
        serde_json::from_value(json!({"metadata": {"name": name}, "rules": rules})).unwrap()
    };
    let message = forbidden(
        cluster_roles
            .create(
                &pp,
                &cluster_role(
                    "cms",
                    json!([{"apiGroups": [""], "resources": ["configmaps"], "verbs": ["get"]}]),
                ),
            )
            .await,
    );
    assert!(
        message.starts_with("clusterroles.rbac.authorization.k8s.io \"cms\" is forbidden"),
        "{message}"
    );
    cluster_roles
        .create(&pp, &cluster_role("rbac-creator", json!([{"apiGroups": ["rbac.authorization.k8s.io"], "resources": ["clusterroles"], "verbs": ["create"]}])))
        .await
        .unwrap();
    let cluster_bindings: Api<ClusterRoleBinding> = Api::all(alice.clone());
    let cluster_binding = |name: &str, role: &str| -> ClusterRoleBinding {
        serde_json::from_value(json!({"metadata": {"name": name},
            "roleRef": {"apiGroup": "rbac.authorization.k8s.io", "kind": "ClusterRole", "name": role},
            "subjects": [{"apiGroup": "rbac.authorization.k8s.io", "kind": "User", "name": "bob"}]}))
        .unwrap()
    };
    cluster_bindings
        .create(&pp, &cluster_binding("bob-rbac", "rbac-creator"))
        .await
        .unwrap();
    forbidden(
        cluster_bindings
            .create(&pp, &cluster_binding("bob-secrets", "all-secrets"))
            .await,
    );

    // The administrator is held to none of this.
    Api::<ClusterRoleBinding>::all(admin.clone())
        .create(&pp, &cluster_binding("bob-secrets", "all-secrets"))
        .await
        .unwrap();
    server.shutdown().await.unwrap();
}
