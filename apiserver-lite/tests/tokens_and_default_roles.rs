//! ServiceAccount tokens and the default ClusterRoles across restarts,
//! impersonation's extras and uid, and authorization before existence,
//! with the kube client.

use apiserver_lite::{Config, RunningServer, User};
use k8s_openapi::api::authentication::v1::TokenRequest;
use k8s_openapi::api::core::v1::{ConfigMap, ServiceAccount};
use k8s_openapi::api::rbac::v1::ClusterRole;
use kube::api::{Api, DeleteParams, PostParams};
use kube::Client;
use serde_json::json;

const ALICE: &str = "alice-token";

async fn start(dir: &std::path::Path) -> RunningServer {
    Config::for_tests()
        .data_dir(dir)
        .user(ALICE, User::new("alice", []))
        .start()
        .await
        .expect("server starts")
}

async fn token(admin: &Client, audiences: &[&str]) -> String {
    let request: TokenRequest = serde_json::from_value(json!({"spec": {"audiences": audiences}})).unwrap();
    let answer = Api::<ServiceAccount>::namespaced(admin.clone(), "default")
        .create_token_request("robot", &PostParams::default(), &request)
        .await
        .unwrap();
    answer.status.unwrap().token.unwrap()
}

fn status_code(result: Result<impl std::fmt::Debug, kube::Error>) -> u16 {
    match result {
        Err(kube::Error::Api(s)) => s.code,
        other => panic!("expected an error Status, got {other:?}"),
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn tokens_and_default_roles_outlive_a_restart() {
    let dir = tempfile::tempdir().unwrap();
    let server = start(dir.path()).await;
    let admin = server.client().await.unwrap();
    let sa: ServiceAccount = serde_json::from_value(json!({"metadata": {"name": "robot"}})).unwrap();
    Api::<ServiceAccount>::namespaced(admin.clone(), "default")
        .create(&PostParams::default(), &sa)
        .await
        .unwrap();
    let good = token(&admin, &[]).await;
    let elsewhere = token(&admin, &["https://somewhere.else"]).await;
    let roles = Api::<ClusterRole>::all(admin.clone());
    roles.delete("edit", &DeleteParams::default()).await.unwrap();
    // Gone from admin too: edit was aggregated into it.
    let admin_role = roles.get("admin").await.unwrap();
    let admin_rules = serde_json::to_string(&admin_role.rules).unwrap();
    assert!(!admin_rules.contains("deployments"), "{admin_rules}");
    server.shutdown().await.unwrap();

    let server = start(dir.path()).await;
    let admin = server.client().await.unwrap();
    let roles = Api::<ClusterRole>::all(admin.clone());
    let edit = roles.get("edit").await.expect("edit is made again at start");
    assert_eq!(
        edit.metadata.labels.unwrap()["rbac.authorization.k8s.io/aggregate-to-admin"],
        "true"
    );
    let admin_rules = serde_json::to_string(&roles.get("admin").await.unwrap().rules).unwrap();
    assert!(admin_rules.contains("deployments"), "{admin_rules}");

    // The token signed before the restart is still good; one for another
    // audience never was.
    let robot = server.client_with_token(&good).await.unwrap();
    let me = Api::<ConfigMap>::namespaced(robot, "default")
        .list(&Default::default())
        .await;
    assert_eq!(status_code(me), 403, "authenticated, and not allowed");
    let other = server.client_with_token(&elsewhere).await.unwrap();
    let refused = Api::<ConfigMap>::namespaced(other, "default")
        .list(&Default::default())
        .await;
    assert_eq!(status_code(refused), 401);
    // The signing key is the owner's alone.
    use std::os::unix::fs::PermissionsExt;
    let key = dir.path().join(apiserver_lite::service_account_tokens::KEY_FILE);
    assert_eq!(
        std::fs::metadata(key).unwrap().permissions().mode() & 0o777,
        0o600
    );
    server.shutdown().await.unwrap();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn authorization_comes_before_existence() {
    let dir = tempfile::tempdir().unwrap();
    let server = start(dir.path()).await;
    let admin = server.client().await.unwrap();
    let alice = server.client_with_token(ALICE).await.unwrap();
    for (client, code) in [(&alice, 403), (&admin, 404)] {
        let missing = Api::<ConfigMap>::namespaced(client.clone(), "nowhere")
            .get("x")
            .await;
        assert_eq!(status_code(missing), code);
        let delete = Api::<ConfigMap>::namespaced(client.clone(), "default")
            .delete("x", &DeleteParams::default())
            .await;
        assert_eq!(status_code(delete), code);
        let request = http::Request::get("/apis/nothing.example.com/v1/things/x")
            .body(Vec::new())
            .unwrap();
        let unknown = client.request::<serde_json::Value>(request).await;
        assert_eq!(status_code(unknown), code);
    }
    server.shutdown().await.unwrap();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn impersonated_extras_and_uid_reach_whoami() {
    let dir = tempfile::tempdir().unwrap();
    let server = start(dir.path()).await;
    let admin = server.client().await.unwrap();
    let alice = server.client_with_token(ALICE).await.unwrap();
    let review = json!({"apiVersion": "authentication.k8s.io/v1", "kind": "SelfSubjectReview"});
    let whoami = |headers: &[(&str, &str)]| {
        let mut request = http::Request::post("/apis/authentication.k8s.io/v1/selfsubjectreviews")
            .header("content-type", "application/json");
        for (k, v) in headers {
            request = request.header(*k, *v);
        }
        request.body(serde_json::to_vec(&review).unwrap()).unwrap()
    };
    let claim = [
        ("Impersonate-User", "jane"),
        ("Impersonate-Uid", "u-7"),
        ("Impersonate-Extra-Scopes", "robots"),
    ];
    let me: serde_json::Value = admin.request(whoami(&claim)).await.unwrap();
    let info = &me["status"]["userInfo"];
    assert_eq!(info["username"], "jane");
    assert_eq!(info["uid"], "u-7");
    assert_eq!(info["extra"]["scopes"], json!(["robots"]));
    assert_eq!(info["groups"], json!(["system:authenticated"]));

    // alice may impersonate jane, but not jane's uid: each claim is checked.
    let role: ClusterRole = serde_json::from_value(json!({
        "metadata": {"name": "impersonate-jane"},
        "rules": [
            {"apiGroups": [""], "resources": ["users"], "resourceNames": ["jane"], "verbs": ["impersonate"]},
            {"apiGroups": ["authentication.k8s.io"], "resources": ["userextras/scopes"], "verbs": ["impersonate"]},
        ],
    }))
    .unwrap();
    Api::<ClusterRole>::all(admin.clone())
        .create(&PostParams::default(), &role)
        .await
        .unwrap();
    let binding = json!({
        "apiVersion": "rbac.authorization.k8s.io/v1", "kind": "ClusterRoleBinding",
        "metadata": {"name": "alice-impersonates-jane"},
        "roleRef": {"apiGroup": "rbac.authorization.k8s.io", "kind": "ClusterRole", "name": "impersonate-jane"},
        "subjects": [{"apiGroup": "rbac.authorization.k8s.io", "kind": "User", "name": "alice"}],
    });
    let binding: k8s_openapi::api::rbac::v1::ClusterRoleBinding = serde_json::from_value(binding).unwrap();
    Api::all(admin.clone())
        .create(&PostParams::default(), &binding)
        .await
        .unwrap();
    let me: serde_json::Value = alice.request(whoami(&claim[..1])).await.unwrap();
    assert_eq!(me["status"]["userInfo"]["username"], "jane");
    let me: serde_json::Value = alice.request(whoami(&[claim[0], claim[2]])).await.unwrap();
    assert_eq!(me["status"]["userInfo"]["extra"]["scopes"], json!(["robots"]));
    let uid = alice.request::<serde_json::Value>(whoami(&claim)).await;
    match uid {
        Err(kube::Error::Api(s)) => assert_eq!(
            s.message,
            "uids.authentication.k8s.io \"u-7\" is forbidden: User \"alice\" cannot impersonate resource \"uids\" in API group \"authentication.k8s.io\" at the cluster scope"
        ),
        other => panic!("expected 403, got {other:?}"),
    }
    let bob = alice
        .request::<serde_json::Value>(whoami(&[("Impersonate-User", "bob")]))
        .await;
    assert_eq!(status_code(bob), 403);
    let groupless = admin
        .request::<serde_json::Value>(whoami(&[("Impersonate-Group", "ops")]))
        .await;
    assert_eq!(status_code(groupless), 400);
    server.shutdown().await.unwrap();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn only_who_may_escalate_sets_an_aggregation_rule() {
    let dir = tempfile::tempdir().unwrap();
    let server = start(dir.path()).await;
    let admin = server.client().await.unwrap();
    let alice = server.client_with_token(ALICE).await.unwrap();
    let writer: ClusterRole = serde_json::from_value(json!({
        "metadata": {"name": "role-writer"},
        "rules": [{"apiGroups": ["rbac.authorization.k8s.io"], "resources": ["clusterroles"], "verbs": ["create", "get"]}],
    }))
    .unwrap();
    Api::<ClusterRole>::all(admin.clone())
        .create(&PostParams::default(), &writer)
        .await
        .unwrap();
    let binding: k8s_openapi::api::rbac::v1::ClusterRoleBinding = serde_json::from_value(json!({
        "metadata": {"name": "alice-writes-roles"},
        "roleRef": {"apiGroup": "rbac.authorization.k8s.io", "kind": "ClusterRole", "name": "role-writer"},
        "subjects": [{"apiGroup": "rbac.authorization.k8s.io", "kind": "User", "name": "alice"}],
    }))
    .unwrap();
    Api::all(admin.clone())
        .create(&PostParams::default(), &binding)
        .await
        .unwrap();
    let gatherer: ClusterRole = serde_json::from_value(json!({
        "metadata": {"name": "everything"},
        "aggregationRule": {"clusterRoleSelectors": [{"matchLabels": {"kubernetes.io/bootstrapping": "rbac-defaults"}}]},
    }))
    .unwrap();
    let refused = Api::<ClusterRole>::all(alice.clone())
        .create(&PostParams::default(), &gatherer)
        .await;
    match refused {
        Err(kube::Error::Api(s)) => assert_eq!(
            s.message,
            "clusterroles.rbac.authorization.k8s.io \"everything\" is forbidden: must have cluster-admin privileges to use the aggregationRule"
        ),
        other => panic!("expected 403, got {other:?}"),
    }
    // The administrator may, and the role gathers cluster-admin's rules.
    let made = Api::<ClusterRole>::all(admin)
        .create(&PostParams::default(), &gatherer)
        .await
        .unwrap();
    let rules = serde_json::to_string(&made.rules).unwrap();
    assert!(rules.contains(r#""nonResourceURLs":["*"]"#), "{rules}");
    server.shutdown().await.unwrap();
}
