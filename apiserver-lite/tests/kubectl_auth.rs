//! kubectl's authentication and authorization habits against the server,
//! with the oldest supported kubectl (1.27) and the newest on the machine,
//! unmodified: `auth can-i --as` (impersonation), `create token` and the
//! token in use, `auth can-i --list` as a ServiceAccount, the default
//! ClusterRoles with what is aggregated into them, and 403 before 404.

mod common;

use std::path::Path;

use apiserver_lite::{Config, RunningServer, User};
use common::kubectl::{Kubectl, NEWEST, OLDEST};

const ALICE_TOKEN: &str = "alice-token";
const VIEWER: &str = "system:serviceaccount:ns:viewer";

/// An administrator, a user alice with no rights of her own, a namespace
/// `ns` with a ServiceAccount `viewer` bound to `view`, and k8s4r's CRDs
/// and log-reader role (aggregated into `view`).
struct Session {
    server: RunningServer,
    dir: tempfile::TempDir,
    admin: Kubectl,
    alice: Kubectl,
}

impl Session {
    async fn start(bin: &str) -> Option<Session> {
        let server = Config::for_tests()
            .user(ALICE_TOKEN, User::new("alice", []))
            .start()
            .await
            .unwrap();
        let dir = tempfile::tempdir().unwrap();
        server.write_kubeconfig(&dir.path().join("admin")).unwrap();
        let alice = apiserver_lite::kubeconfig_yaml(&server.url(), ALICE_TOKEN, server.ca_pem());
        apiserver_lite::write_kubeconfig(&dir.path().join("alice"), &alice).unwrap();
        let admin = Kubectl::new(bin, &dir.path().join("admin"))?;
        let alice = Kubectl::new(bin, &dir.path().join("alice"))?;
        let repo = Path::new(env!("CARGO_MANIFEST_DIR")).join("..");
        admin.ok(&["apply", "-f", repo.join("deploy/crds").to_str().unwrap()]);
        admin.ok_stdin(&["apply", "-f", "-"], &log_reader_role(&repo));
        admin.ok(&["create", "namespace", "ns"]);
        admin.ok(&["-n", "ns", "create", "serviceaccount", "viewer"]);
        admin.ok(&[
            "-n",
            "ns",
            "create",
            "rolebinding",
            "viewer",
            "--clusterrole=view",
            "--serviceaccount=ns:viewer",
        ]);
        Some(Session {
            server,
            dir,
            admin,
            alice,
        })
    }

    /// kubectl presenting `token` instead of the kubeconfig's.
    fn with_token(&self, token: &str, args: &[&str]) -> (bool, String) {
        let mut all = vec!["--token", token];
        all.extend_from_slice(args);
        self.admin.run(&all, None)
    }
}

/// k8s4r's `k8s4r-log-reader` ClusterRole, as deploy/ ships it.
fn log_reader_role(repo: &Path) -> String {
    let text = std::fs::read_to_string(repo.join("deploy/cluster/30-logs.yaml")).unwrap();
    text.split("\n---")
        .find(|doc| doc.contains("kind: ClusterRole\n") && doc.contains("name: k8s4r-log-reader"))
        .expect("deploy/ has the k8s4r-log-reader ClusterRole")
        .to_owned()
}

/// can-i's answer, among kubectl's warnings.
fn answer(out: &str) -> &str {
    out.lines()
        .map(str::trim)
        .find(|l| matches!(*l, "yes" | "no"))
        .unwrap_or(out)
}

async fn impersonation(bin: &str) {
    let Some(s) = Session::start(bin).await else {
        return;
    };
    let (admin, alice) = (&s.admin, &s.alice);
    let as_viewer = format!("--as={VIEWER}");

    // The administrator may impersonate anyone; the answer is the viewer's.
    let no = admin.fails(&["auth", "can-i", "delete", "robots", &as_viewer], None);
    assert_eq!(answer(&no), "no", "{bin}: {no}");
    let no = admin.fails(
        &["auth", "can-i", "delete", "configmaps", "-n", "ns", &as_viewer],
        None,
    );
    assert_eq!(answer(&no), "no", "{bin}: {no}");
    let no = admin.fails(&["auth", "can-i", "get", "secrets", "-n", "ns", &as_viewer], None);
    assert_eq!(answer(&no), "no", "{bin}: {no}");
    let yes = admin.ok(&["auth", "can-i", "list", "configmaps", "-n", "ns", &as_viewer]);
    assert_eq!(answer(&yes), "yes", "{bin}");
    // Through k8s4r-log-reader, aggregated into view.
    let yes = admin.ok(&[
        "auth",
        "can-i",
        "get",
        "tasks.robot.k8s4r.io",
        "-n",
        "ns",
        &as_viewer,
    ]);
    assert_eq!(answer(&yes), "yes", "{bin}");
    let no = admin.fails(
        &["auth", "can-i", "list", "configmaps", "-n", "default", &as_viewer],
        None,
    );
    assert_eq!(answer(&no), "no", "{bin}: {no}");
    // What the server enforces is the same answer.
    let denied = admin.fails(
        &["-n", "ns", "delete", "configmap", "kube-root", &as_viewer],
        None,
    );
    assert!(
        denied.contains(&format!(
            "User \"{VIEWER}\" cannot delete resource \"configmaps\""
        )),
        "{bin}: {denied}"
    );
    let me = admin.ok(&["auth", "whoami", &as_viewer, "-o", "json"]);
    let me: serde_json::Value = serde_json::from_str(&me).unwrap();
    assert_eq!(me["status"]["userInfo"]["username"], VIEWER);
    assert_eq!(
        me["status"]["userInfo"]["groups"],
        serde_json::json!([
            "system:serviceaccounts",
            "system:serviceaccounts:ns",
            "system:authenticated"
        ])
    );

    // Groups: jane has nothing, jane in `ops` has what ops is bound to.
    admin.ok(&[
        "-n",
        "ns",
        "create",
        "rolebinding",
        "ops",
        "--clusterrole=edit",
        "--group=ops",
    ]);
    let no = admin.fails(
        &["auth", "can-i", "create", "configmaps", "-n", "ns", "--as=jane"],
        None,
    );
    assert_eq!(answer(&no), "no", "{bin}: {no}");
    let yes = admin.ok(&[
        "auth",
        "can-i",
        "create",
        "configmaps",
        "-n",
        "ns",
        "--as=jane",
        "--as-group=ops",
    ]);
    assert_eq!(answer(&yes), "yes", "{bin}");
    // As upstream's edit: no Leases, whose renewals fence robots' work.
    for verb in ["patch", "update", "create", "delete"] {
        let no = admin.fails(
            &[
                "auth",
                "can-i",
                verb,
                "leases.coordination.k8s.io",
                "-n",
                "ns",
                "--as=jane",
                "--as-group=ops",
            ],
            None,
        );
        assert_eq!(answer(&no), "no", "{bin}: edit may {verb} leases: {no}");
    }

    // alice may not impersonate: refused with the real server's words
    // (kubectl's discovery shows a refusal as `Forbidden: unknown`, as it
    // does against a real server; a raw request shows the message).
    let refused = alice.fails(
        &["auth", "can-i", "get", "configmaps", "-n", "ns", &as_viewer],
        None,
    );
    assert!(refused.contains("Forbidden"), "{bin}: {refused}");
    let refused = alice.fails(
        &["get", "--raw", "/api/v1/namespaces/ns/configmaps", &as_viewer],
        None,
    );
    assert!(
        refused.contains(
            "serviceaccounts \"viewer\" is forbidden: User \"alice\" cannot impersonate resource \"serviceaccounts\" in API group \"\" in the namespace \"ns\""
        ),
        "{bin}: {refused}"
    );
    let refused = alice.fails(
        &["get", "--raw", "/api/v1/namespaces/ns/configmaps", "--as=bob"],
        None,
    );
    assert!(
        refused.contains("users \"bob\" is forbidden: User \"alice\" cannot impersonate resource \"users\" in API group \"\" at the cluster scope"),
        "{bin}: {refused}"
    );
    // edit lets her act as the namespace's ServiceAccounts, not as users.
    admin.ok(&[
        "-n",
        "ns",
        "create",
        "rolebinding",
        "alice-edits",
        "--clusterrole=edit",
        "--user=alice",
    ]);
    let yes = alice.ok(&["auth", "can-i", "list", "configmaps", "-n", "ns", &as_viewer]);
    assert_eq!(answer(&yes), "yes", "{bin}");
    let no = alice.fails(
        &["auth", "can-i", "create", "configmaps", "-n", "ns", &as_viewer],
        None,
    );
    assert_eq!(answer(&no), "no", "{bin}: {no}");
    alice.fails(
        &["auth", "can-i", "list", "configmaps", "-n", "ns", "--as=bob"],
        None,
    );
    s.server.shutdown().await.unwrap();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn kubectl_1_27_impersonates_with_as() {
    impersonation(OLDEST).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn kubectl_newest_impersonates_with_as() {
    impersonation(NEWEST).await;
}

async fn tokens(bin: &str) {
    let Some(s) = Session::start(bin).await else {
        return;
    };
    let admin = &s.admin;
    admin.ok(&[
        "-n",
        "ns",
        "create",
        "configmap",
        "settings",
        "--from-literal=a=1",
    ]);

    let token = admin.ok(&["-n", "ns", "create", "token", "viewer"]);
    let token = token.trim();
    assert_eq!(token.split('.').count(), 3, "{bin}: a JWT: {token}");
    let (ok, out) = s.with_token(token, &["-n", "ns", "get", "configmap", "settings"]);
    assert!(ok, "{bin}: {out}");
    let (ok, out) = s.with_token(token, &["-n", "ns", "delete", "configmap", "settings"]);
    assert!(!ok, "{bin}: {out}");
    assert!(
        out.contains(&format!(
            "User \"{VIEWER}\" cannot delete resource \"configmaps\""
        )),
        "{bin}: {out}"
    );
    let (ok, out) = s.with_token(
        token,
        &["auth", "whoami", "-o", "jsonpath={.status.userInfo.username}"],
    );
    assert!(ok && out == VIEWER, "{bin}: {out}");

    // --list as the ServiceAccount: view's rules and what is aggregated.
    let (ok, out) = s.with_token(token, &["auth", "can-i", "--list", "-n", "ns"]);
    assert!(ok, "{bin}: {out}");
    for line in [
        "configmaps ",
        "deployments.apps ",
        "tasks.robot.k8s4r.io ",
        "tasks.logs.k8s4r.io/log ",
        "selfsubjectrulesreviews.authorization.k8s.io ",
    ] {
        assert!(
            out.lines().any(|l| l.starts_with(line)),
            "{bin}: no {line:?} in\n{out}"
        );
    }
    assert!(
        !out.lines().any(|l| l.starts_with("secrets ")),
        "{bin}: view reads no Secrets:\n{out}"
    );
    assert!(!out.contains("[*]"), "{bin}: not everything:\n{out}");

    // --duration, and the shortest a server allows.
    let json = admin.ok(&[
        "-n",
        "ns",
        "create",
        "token",
        "viewer",
        "--duration=20m",
        "-o",
        "json",
    ]);
    let request: serde_json::Value = serde_json::from_str(&json).unwrap();
    assert_eq!(request["kind"], "TokenRequest", "{json}");
    assert_eq!(request["spec"]["expirationSeconds"], 1200, "{json}");
    let expires: jiff::Timestamp = request["status"]["expirationTimestamp"]
        .as_str()
        .unwrap()
        .parse()
        .unwrap();
    let left = expires.duration_since(jiff::Timestamp::now()).as_secs();
    assert!((1100..=1200).contains(&left), "{bin}: expires in {left} s");
    let short = admin.fails(&["-n", "ns", "create", "token", "viewer", "--duration=1m"], None);
    assert!(
        short.contains("may not specify a duration less than 10 minutes"),
        "{bin}: {short}"
    );
    let missing = admin.fails(&["-n", "ns", "create", "token", "nobody"], None);
    assert!(
        missing.contains("serviceaccounts \"nobody\" not found"),
        "{bin}: {missing}"
    );

    // A ServiceAccount deleted and made again is another one: old tokens are void.
    admin.ok(&["-n", "ns", "delete", "serviceaccount", "viewer"]);
    admin.ok(&["-n", "ns", "create", "serviceaccount", "viewer"]);
    let (ok, out) = s.with_token(token, &["-n", "ns", "get", "configmap", "settings"]);
    assert!(!ok && out.contains("Unauthorized"), "{bin}: {out}");
    let fresh = admin.ok(&["-n", "ns", "create", "token", "viewer"]);
    let (ok, out) = s.with_token(fresh.trim(), &["-n", "ns", "get", "configmap", "settings"]);
    assert!(ok, "{bin}: {out}");
    s.server.shutdown().await.unwrap();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn kubectl_1_27_creates_and_uses_tokens() {
    tokens(OLDEST).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn kubectl_newest_creates_and_uses_tokens() {
    tokens(NEWEST).await;
}

async fn default_roles_and_forbidden_first(bin: &str) {
    let Some(s) = Session::start(bin).await else {
        return;
    };
    let (admin, alice) = (&s.admin, &s.alice);

    let names = admin.ok(&["get", "clusterroles", "-o", "name"]);
    for role in ["cluster-admin", "admin", "edit", "view"] {
        assert!(
            names
                .lines()
                .any(|l| l == format!("clusterrole.rbac.authorization.k8s.io/{role}")),
            "{bin}: no {role} in {names}"
        );
    }
    let view = admin.ok(&["get", "clusterrole", "view", "-o", "json"]);
    let view: serde_json::Value = serde_json::from_str(&view).unwrap();
    let rules = view["rules"].to_string();
    assert!(
        rules.contains(r#""tasks/log""#) && rules.contains(r#""configmaps""#),
        "{bin}: {rules}"
    );
    let admin_role = admin.ok(&["describe", "clusterrole", "admin"]);
    for resource in [
        "rolebindings.rbac.authorization.k8s.io",
        "tasks.logs.k8s4r.io/log",
        "secrets",
        "configmaps",
    ] {
        assert!(
            admin_role.contains(resource),
            "{bin}: no {resource} in\n{admin_role}"
        );
    }

    // A new role labelled for view joins it, and leaves it when unlabelled.
    admin.ok(&[
        "create",
        "clusterrole",
        "gadget-reader",
        "--verb=get",
        "--resource=leases",
    ]);
    admin.ok(&[
        "label",
        "clusterrole",
        "gadget-reader",
        "rbac.authorization.k8s.io/aggregate-to-view=true",
    ]);
    let edit = admin.ok(&["get", "clusterrole", "edit", "-o", "jsonpath={.rules}"]);
    assert!(
        edit.contains(r#""get"]"#) && edit.contains("leases"),
        "{bin}: {edit}"
    );
    let view = admin.ok(&["get", "clusterrole", "view", "-o", "jsonpath={.rules}"]);
    assert!(view.contains("leases"), "{bin}: {view}");
    admin.ok(&[
        "label",
        "clusterrole",
        "gadget-reader",
        "rbac.authorization.k8s.io/aggregate-to-view-",
    ]);
    let view = admin.ok(&["get", "clusterrole", "view", "-o", "jsonpath={.rules}"]);
    assert!(!view.contains("leases"), "{bin}: {view}");

    // 403 before 404: alice may not learn that nothing is there.
    for args in [
        &["-n", "nowhere", "get", "configmap", "nothing"][..],
        &["-n", "ns", "get", "configmap", "nothing"],
        &[
            "get",
            "--raw",
            "/apis/nothing.example.com/v1/namespaces/ns/things/x",
        ],
        &[
            "get",
            "--raw",
            "/api/v1/namespaces/ns/serviceaccounts/viewer/nosuch",
        ],
    ] {
        let out = alice.fails(args, None);
        assert!(
            out.contains("Forbidden") || out.contains("forbidden"),
            "{bin} {args:?}: {out}"
        );
        let out = admin.fails(args, None);
        assert!(
            out.contains("NotFound") || out.contains("not found"),
            "{bin} {args:?}: {out}"
        );
    }
    s.server.shutdown().await.unwrap();
    drop(s.dir);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn kubectl_1_27_default_roles_and_403_before_404() {
    default_roles_and_forbidden_first(OLDEST).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn kubectl_newest_default_roles_and_403_before_404() {
    default_roles_and_forbidden_first(NEWEST).await;
}
