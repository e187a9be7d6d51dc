//! Who a program under test is to the embedded API server: a
//! ServiceAccount bound to a ClusterRole of chosen rules, and a client
//! presenting its token (through a proxy the test can cut, if it likes),
//! so a test can take a right away mid-run as an administrator would.

use apiserver_lite::RunningServer;
use k8s_openapi::api::rbac::v1::{ClusterRole, ClusterRoleBinding, PolicyRule, RoleRef, Subject};
use kube::api::{ObjectMeta, PostParams};
use kube::{Api, Client};

/// An RBAC rule: `verbs` on `resources` of the API `groups`.
pub fn rule(groups: &[&str], resources: &[&str], verbs: &[&str]) -> PolicyRule {
    let owned = |items: &[&str]| items.iter().map(|s| (*s).to_owned()).collect::<Vec<_>>();
    PolicyRule {
        api_groups: Some(owned(groups)),
        resources: Some(owned(resources)),
        verbs: owned(verbs),
        ..Default::default()
    }
}

/// The ClusterRole `name`, allowing `rules`.
pub fn cluster_role(name: &str, rules: Vec<PolicyRule>) -> ClusterRole {
    ClusterRole {
        metadata: ObjectMeta {
            name: Some(name.into()),
            ..Default::default()
        },
        rules: Some(rules),
        ..Default::default()
    }
}

/// Makes ServiceAccount `default/<name>` with the token `<name>-token`,
/// bound to a ClusterRole `<name>` of `rules` (written by `admin`); its
/// token.
pub async fn service_account(
    api: &RunningServer,
    admin: &Client,
    name: &str,
    rules: Vec<PolicyRule>,
) -> String {
    let token = format!("{name}-token");
    api.add_user(
        &token,
        apiserver_lite::authz::User::service_account("default", name),
    );
    Api::<ClusterRole>::all(admin.clone())
        .create(&PostParams::default(), &cluster_role(name, rules))
        .await
        .expect("the ClusterRole is made");
    let binding = ClusterRoleBinding {
        metadata: ObjectMeta {
            name: Some(name.into()),
            ..Default::default()
        },
        role_ref: RoleRef {
            api_group: Some("rbac.authorization.k8s.io".into()),
            kind: "ClusterRole".into(),
            name: name.into(),
        },
        subjects: Some(vec![Subject {
            kind: "ServiceAccount".into(),
            name: name.into(),
            namespace: Some("default".into()),
            ..Default::default()
        }]),
    };
    Api::<ClusterRoleBinding>::all(admin.clone())
        .create(&PostParams::default(), &binding)
        .await
        .expect("the ClusterRoleBinding is made");
    token
}

/// Replaces ClusterRole `name`'s rules with `rules`.
pub async fn set_rules(admin: &Client, name: &str, rules: Vec<PolicyRule>) {
    Api::<ClusterRole>::all(admin.clone())
        .replace(name, &PostParams::default(), &cluster_role(name, rules))
        .await
        .expect("the ClusterRole is replaced");
}

/// A client presenting `token` to `api` at `addr` (its own address, or a
/// proxy's before it).
pub async fn client_via(api: &RunningServer, addr: std::net::SocketAddr, token: &str) -> Client {
    let url = api.url().replace(&api.addr().to_string(), &addr.to_string());
    let yaml = apiserver_lite::server::kubeconfig_yaml(&url, token, api.ca_pem());
    let kubeconfig = kube::config::Kubeconfig::from_yaml(&yaml).expect("a kubeconfig");
    let config = kube::Config::from_custom_kubeconfig(kubeconfig, &Default::default())
        .await
        .expect("a client config");
    Client::try_from(config).expect("a client")
}
