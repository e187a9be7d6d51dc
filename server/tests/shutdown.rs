//! A stop of the server ends, whenever it comes: here before its Task
//! cache ever fills (its account may not list Tasks, as happens while the
//! API server is away at start). kube-runtime's controller would wait for
//! that first list forever.

mod support;

use std::time::Duration;

use k8s_openapi::api::rbac::v1::{ClusterRole, ClusterRoleBinding, PolicyRule, RoleRef, Subject};
use kube::{Api, Client};
use support::{eventually, Env};
use tokio_util::sync::CancellationToken;

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_server_stopped_before_its_tasks_are_listed_stops_at_once() {
    let env = Env::start().await;
    env.api.add_user(
        "no-tasks-token",
        apiserver_lite::authz::User::service_account("default", "no-tasks"),
    );
    let rule = |groups: &[&str], resources: &[&str]| PolicyRule {
        api_groups: Some(groups.iter().map(|s| (*s).to_owned()).collect()),
        resources: Some(resources.iter().map(|s| (*s).to_owned()).collect()),
        verbs: vec!["*".to_owned()],
        ..Default::default()
    };
    // Everything but Tasks.
    let role = ClusterRole {
        metadata: kube::api::ObjectMeta {
            name: Some("no-tasks".into()),
            ..Default::default()
        },
        rules: Some(vec![
            rule(&["", "coordination.k8s.io", "events.k8s.io"], &["*"]),
            rule(&["robot.k8s4r.io"], &["robots", "robots/status", "agentrollouts"]),
        ]),
        ..Default::default()
    };
    Api::<ClusterRole>::all(env.client.clone())
        .create(&Default::default(), &role)
        .await
        .unwrap();
    let binding = ClusterRoleBinding {
        metadata: kube::api::ObjectMeta {
            name: Some("no-tasks".into()),
            ..Default::default()
        },
        role_ref: RoleRef {
            api_group: Some("rbac.authorization.k8s.io".into()),
            kind: "ClusterRole".into(),
            name: "no-tasks".into(),
        },
        subjects: Some(vec![Subject {
            kind: "ServiceAccount".into(),
            name: "no-tasks".into(),
            namespace: Some("default".into()),
            ..Default::default()
        }]),
    };
    Api::<ClusterRoleBinding>::all(env.client.clone())
        .create(&Default::default(), &binding)
        .await
        .unwrap();
    let yaml = apiserver_lite::server::kubeconfig_yaml(&env.api.url(), "no-tasks-token", env.api.ca_pem());
    let kubeconfig = kube::config::Kubeconfig::from_yaml(&yaml).unwrap();
    let config = kube::Config::from_custom_kubeconfig(kubeconfig, &Default::default())
        .await
        .unwrap();
    let client = Client::try_from(config).unwrap();

    let server = k8s4r_server::Server::new(env.config(), client);
    let metrics = server.metrics();
    let shutdown = CancellationToken::new();
    let task = tokio::spawn(server.run(shutdown.clone()));
    // Its Robots listed, the Task controller has started: its list of
    // Tasks is refused, and it waits for one.
    eventually("the server's Task controller asks for the Tasks", || {
        let denied = env.api.denied();
        async move {
            denied
                .iter()
                .any(|d| d.contains("no-tasks") && d.contains("\"tasks\""))
                .then_some(())
        }
    })
    .await;
    assert!(
        !metrics.ready(),
        "ready without its Task cache: {:?}",
        env.api.denied()
    );

    shutdown.cancel();
    let stopped = tokio::time::timeout(Duration::from_secs(10), task).await;
    let result = stopped
        .expect("the server stops within 10 s")
        .expect("the server's task");
    result.expect("the server stopped cleanly");
}
