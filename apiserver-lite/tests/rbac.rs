//! Bearer tokens for users, and RBAC deciding what they may do, through the
//! kube client over real HTTPS.

use apiserver_lite::{Config, User};
use k8s_openapi::api::apps::v1::Deployment;
use k8s_openapi::api::core::v1::{ConfigMap, Secret};
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
