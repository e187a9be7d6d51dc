//! The machine image's kubectl binaries (1.32 and 1.27) against the server.

mod common;

use common::kubectl::Kubectl;

use std::io::{BufRead, BufReader};
use std::path::{Path, PathBuf};
use std::process::Stdio;
use std::time::{Duration, Instant};

use apiserver_lite::Config;

const KUBECTLS: &[&str] = &["/usr/bin/kubectl", "/usr/lib/google-cloud-sdk/bin/kubectl.1.27"];

fn data(file: &str) -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("tests/data")
        .join(file)
}

fn gizmo(name: &str, size: i64) -> String {
    format!("apiVersion: demo.k8s4r.io/v1\nkind: Gizmo\nmetadata:\n  name: {name}\n  labels:\n    app: demo\nspec:\n  size: {size}\n  mode: fast\n")
}

async fn kubectl_workflow(bin: &str) {
    let server = Config::for_tests().start().await.unwrap();
    let dir = tempfile::tempdir().unwrap();
    let kc = dir.path().join("kubeconfig");
    server.write_kubeconfig(&kc).unwrap();
    let Some(k) = Kubectl::new(bin, &kc) else { return };
    let crds = data("crds.yaml");
    let objects = data("objects.yaml");

    let out = k.ok(&["apply", "-f", crds.to_str().unwrap()]);
    assert!(out.contains("gizmos.demo.k8s4r.io created"), "{out}");
    k.ok(&[
        "wait",
        "--for",
        "condition=established",
        "crd/gizmos.demo.k8s4r.io",
        "--timeout",
        "10s",
    ]);
    let out = k.ok(&["apply", "-f", objects.to_str().unwrap()]);
    assert!(
        out.contains("gizmo.demo.k8s4r.io/g1 created") && out.contains("configmap/cfg created"),
        "{out}"
    );
    // Client-side apply of a change, then server-side apply taking over.
    let out = k.ok_stdin(&["apply", "-f", "-"], &gizmo("g1", 4));
    assert!(out.contains("configured"), "{out}");
    let out = k.ok_stdin(&["apply", "--server-side", "-f", "-"], &gizmo("g1", 5));
    assert!(out.contains("serverside-applied"), "{out}");
    let conflict = k.fails(
        &["apply", "--server-side", "--field-manager", "other", "-f", "-"],
        Some(&gizmo("g1", 6)),
    );
    assert!(
        conflict.contains("conflict with \"kubectl\"") && conflict.contains(".spec.size"),
        "{conflict}"
    );
    k.ok_stdin(
        &[
            "apply",
            "--server-side",
            "--field-manager",
            "other",
            "--force-conflicts",
            "-f",
            "-",
        ],
        &gizmo("g1", 6),
    );
    let conflict = k.fails(&["apply", "--server-side", "-f", "-"], Some(&gizmo("g1", 7)));
    assert!(conflict.contains("conflict"), "{conflict}");
    k.ok_stdin(
        &["apply", "--server-side", "--force-conflicts", "-f", "-"],
        &gizmo("g1", 7),
    );

    // Printer columns, short names, categories.
    let out = k.ok(&["get", "gz"]);
    let header = out.lines().next().unwrap_or_default();
    assert!(
        header.contains("NAME")
            && header.contains("SIZE")
            && header.contains("PHASE")
            && header.contains("AGE"),
        "{out}"
    );
    assert!(out.contains("g1") && out.contains(" 7 "), "{out}");
    let out = k.ok(&["get", "k8s4r"]);
    assert!(out.contains("g1") && out.contains("SIZE"), "{out}");
    let out = k.ok(&["get", "hosts"]);
    assert!(out.contains("ARCH") && out.contains("arm64"), "{out}");
    let out = k.ok(&["get", "gizmo", "g1", "-o", "yaml"]);
    assert!(
        out.contains("size: 7") && out.contains("uid:") && out.contains("resourceVersion:"),
        "{out}"
    );

    k.ok(&["label", "gizmo", "g1", "tier=gold"]);
    let out = k.ok(&["get", "gizmos", "-l", "tier=gold", "-o", "name"]);
    assert_eq!(out.trim(), "gizmo.demo.k8s4r.io/g1");
    k.ok(&[
        "patch",
        "gizmo",
        "g1",
        "--type",
        "merge",
        "-p",
        r#"{"spec":{"mode":"slow"}}"#,
    ]);
    k.ok(&[
        "patch",
        "gizmo",
        "g1",
        "--type",
        "json",
        "-p",
        r#"[{"op":"replace","path":"/spec/size","value":9}]"#,
    ]);
    let out = k.ok(&[
        "get",
        "gizmo",
        "g1",
        "-o",
        "jsonpath={.spec.mode}/{.spec.size}/{.metadata.generation}",
    ]);
    assert!(out.starts_with("slow/9/"), "{out}");
    k.ok(&[
        "patch",
        "gizmo",
        "g1",
        "--subresource",
        "status",
        "--type",
        "merge",
        "-p",
        r#"{"status":{"phase":"Ready","conditions":[{"type":"Ready","status":"True"}]}}"#,
    ]);
    k.ok(&["wait", "--for", "condition=Ready", "gizmo/g1", "--timeout", "10s"]);
    k.ok(&[
        "wait",
        "--for",
        "jsonpath={.status.phase}=Ready",
        "gizmo/g1",
        "--timeout",
        "10s",
    ]);
    let out = k.ok(&["patch", "configmap", "cfg", "-p", r#"{"data":{"extra":"1"}}"#]);
    assert!(out.contains("patched"), "{out}");

    // Schema violations and unknown fields are refused.
    let bad = "apiVersion: demo.k8s4r.io/v1\nkind: Gizmo\nmetadata:\n  name: bad\nspec:\n  size: -1\n  mode: turbo\n";
    let out = k.fails(&["apply", "-f", "-"], Some(bad));
    assert!(out.contains("spec.size") && out.contains("spec.mode"), "{out}");
    let unknown =
        "apiVersion: demo.k8s4r.io/v1\nkind: Gizmo\nmetadata:\n  name: bad\nspec:\n  size: 1\n  bogus: 1\n";
    let out = k.fails(&["apply", "-f", "-"], Some(unknown));
    assert!(out.contains("unknown field") && out.contains("bogus"), "{out}");

    // get -w sees changes as they happen.
    let mut watch = k
        .command(&["get", "gizmos", "-w", "--no-headers"])
        .stdout(Stdio::piped())
        .stderr(Stdio::null())
        .spawn()
        .unwrap();
    let stdout = watch.stdout.take().unwrap();
    let (tx, rx) = std::sync::mpsc::channel();
    std::thread::spawn(move || {
        for line in BufReader::new(stdout).lines().map_while(Result::ok) {
            if tx.send(line).is_err() {
                break;
            }
        }
    });
    let first = rx.recv_timeout(Duration::from_secs(10)).expect("initial row");
    assert!(first.starts_with("g1"), "{first}");
    k.ok_stdin(&["apply", "-f", "-"], &gizmo("g2", 2));
    let deadline = Instant::now() + Duration::from_secs(10);
    let mut seen = false;
    while Instant::now() < deadline {
        if let Ok(line) = rx.recv_timeout(Duration::from_millis(200)) {
            if line.starts_with("g2") {
                seen = true;
                break;
            }
        }
    }
    let _ = watch.kill();
    let _ = watch.wait();
    assert!(seen, "get -w did not show g2");

    // Deletion held by a finalizer, then released.
    k.ok(&[
        "patch",
        "gizmo",
        "g2",
        "--type",
        "merge",
        "-p",
        r#"{"metadata":{"finalizers":["demo.k8s4r.io/hold"]}}"#,
    ]);
    k.ok(&["delete", "gizmo", "g2", "--wait=false"]);
    let out = k.ok(&[
        "get",
        "gizmo",
        "g2",
        "-o",
        "jsonpath={.metadata.deletionTimestamp}",
    ]);
    assert!(!out.trim().is_empty(), "deletionTimestamp set");
    k.ok(&[
        "patch",
        "gizmo",
        "g2",
        "--type",
        "json",
        "-p",
        r#"[{"op":"remove","path":"/metadata/finalizers"}]"#,
    ]);
    k.ok(&["wait", "--for=delete", "gizmo/g2", "--timeout", "10s"]);
    let out = k.ok(&["delete", "-f", objects.to_str().unwrap()]);
    assert!(out.contains("deleted"), "{out}");
    let out = k.fails(&["get", "gizmo", "g1"], None);
    assert!(out.contains("NotFound") || out.contains("not found"), "{out}");
    server.shutdown().await.unwrap();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn kubectl_1_32_workflow() {
    kubectl_workflow(KUBECTLS[0]).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn kubectl_1_27_workflow() {
    kubectl_workflow(KUBECTLS[1]).await;
}

/// k8s4r's own CRDs, as `kubectl apply -f deploy/crds/` registers them.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn kubectl_applies_the_project_crds() {
    let root = std::fs::canonicalize(env!("CARGO_MANIFEST_DIR")).unwrap();
    let crds = root.join("../deploy/crds");
    if !crds.is_dir() {
        eprintln!("skipping: no deploy/crds");
        return;
    }
    let server = Config::for_tests().start().await.unwrap();
    let dir = tempfile::tempdir().unwrap();
    let kc = dir.path().join("kubeconfig");
    server.write_kubeconfig(&kc).unwrap();
    for bin in KUBECTLS {
        let Some(k) = Kubectl::new(bin, &kc) else { continue };
        k.ok(&["apply", "-f", crds.to_str().unwrap()]);
        k.ok(&["apply", "--server-side", "-f", crds.to_str().unwrap()]);
        let out = k.ok(&["get", "crds"]);
        assert!(
            out.contains("tasks.robot.k8s4r.io") && out.contains("robots.robot.k8s4r.io"),
            "{out}"
        );
        let out = k.ok(&["get", "robots,jobs,taskgroups,tasks", "-A"]);
        assert!(
            out.contains("No resources found") || out.is_empty() || out.contains("NAME"),
            "{out}"
        );
    }
    server.shutdown().await.unwrap();
}

/// `kubectl describe` shows the Events a controller recorded through
/// events.k8s.io/v1 (what kube-rs uses), as on a real cluster.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn kubectl_describe_shows_recorded_events() {
    use kube::Api;

    let server = Config::for_tests().start().await.unwrap();
    let client = server.client().await.unwrap();
    common::install_crds(&client).await;
    let widgets: Api<common::Widget> = Api::namespaced(client.clone(), "default");
    let w = widgets
        .create(&Default::default(), &common::widget("w1", 1))
        .await
        .unwrap();
    common::record_too_small(&client, &w).await;
    let dir = tempfile::tempdir().unwrap();
    let kc = dir.path().join("kubeconfig");
    server.write_kubeconfig(&kc).unwrap();
    for bin in KUBECTLS {
        let Some(k) = Kubectl::new(bin, &kc) else { continue };
        let out = k.ok(&["describe", "widget", "w1"]);
        let events = out.split("Events:").nth(1).unwrap_or_default();
        let line = events
            .lines()
            .find(|l| l.contains("TooSmall"))
            .unwrap_or_else(|| panic!("{bin}: no TooSmall event in\n{out}"));
        for part in ["Warning", "widget-controller", common::TOO_SMALL_NOTE] {
            assert!(line.contains(part), "{bin}: {part} missing from {line:?}");
        }
        let out = k.ok(&["get", "events"]);
        assert!(
            out.lines()
                .any(|l| l.contains("TooSmall") && l.contains("w1") && l.contains(common::TOO_SMALL_NOTE)),
            "{bin}:\n{out}"
        );
    }
    server.shutdown().await.unwrap();
}

/// A server whose users come from a token file, as `--token-auth-file`
/// reads it, and a kubeconfig for each of its tokens.
struct WithUsers {
    server: apiserver_lite::RunningServer,
    dir: tempfile::TempDir,
}

/// alice's token: she may do nothing but what every user may until
/// [`GRANT_ALICE`] lets her read ConfigMaps in `default`.
const ALICE_TOKEN: &str = "alice-token";

impl WithUsers {
    async fn start() -> WithUsers {
        use clap::Parser;
        let dir = tempfile::tempdir().unwrap();
        let tokens = dir.path().join("tokens.csv");
        std::fs::write(&tokens, format!("{ALICE_TOKEN},alice,1001,\"ops,dev\"\n")).unwrap();
        let args = apiserver_lite::cli::Args::parse_from([
            "apiserver-lite",
            "--in-memory",
            "--bind",
            "127.0.0.1:0",
            "--token-auth-file",
            tokens.to_str().unwrap(),
        ]);
        let server = args.config().unwrap().start().await.unwrap();
        server.write_kubeconfig(&dir.path().join("admin")).unwrap();
        let alice = apiserver_lite::kubeconfig_yaml(&server.url(), ALICE_TOKEN, server.ca_pem());
        apiserver_lite::write_kubeconfig(&dir.path().join("alice"), &alice).unwrap();
        WithUsers { server, dir }
    }

    fn kubectl(&self, bin: &str, user: &str) -> Option<Kubectl> {
        Kubectl::new(bin, &self.dir.path().join(user))
    }
}

const GRANT_ALICE: &str = "apiVersion: rbac.authorization.k8s.io/v1
kind: Role
metadata: {name: read-cms, namespace: default}
rules:
- {apiGroups: [\"\"], resources: [configmaps], verbs: [get, list]}
---
apiVersion: rbac.authorization.k8s.io/v1
kind: RoleBinding
metadata: {name: alice-reads, namespace: default}
roleRef: {apiGroup: rbac.authorization.k8s.io, kind: Role, name: read-cms}
subjects:
- {apiGroup: rbac.authorization.k8s.io, kind: User, name: alice}
";

async fn kubectl_auth(bin: &str) {
    let users = WithUsers::start().await;
    let (Some(admin), Some(alice)) = (users.kubectl(bin, "admin"), users.kubectl(bin, "alice")) else {
        return;
    };
    let table = |out: &str| -> Vec<Vec<String>> {
        out.lines()
            .map(|l| {
                l.split("  ")
                    .map(str::trim)
                    .filter(|c| !c.is_empty())
                    .map(str::to_owned)
                    .collect()
            })
            .collect()
    };

    let me = table(&alice.ok(&["auth", "whoami"]));
    assert_eq!(me[0], ["ATTRIBUTE", "VALUE"], "{me:?}");
    assert!(me.contains(&vec!["Username".into(), "alice".into()]), "{me:?}");
    assert!(me.contains(&vec!["UID".into(), "1001".into()]), "{me:?}");
    assert!(
        me.contains(&vec!["Groups".into(), "[ops dev system:authenticated]".into()]),
        "{me:?}"
    );
    let me = admin.ok(&["auth", "whoami", "-o", "jsonpath={.status.userInfo.username}"]);
    assert_eq!(me, "apiserver-lite:admin");

    // `no` is an exit status of 1, and what the server then enforces.
    let no = alice.fails(&["auth", "can-i", "list", "configmaps"], None);
    assert_eq!(no.trim(), "no", "{bin}");
    let denied = alice.fails(&["get", "configmaps"], None);
    assert!(denied.contains("forbidden"), "{denied}");
    assert_eq!(admin.ok(&["auth", "can-i", "list", "configmaps"]).trim(), "yes");

    admin.ok_stdin(&["apply", "-f", "-"], GRANT_ALICE);
    assert_eq!(alice.ok(&["auth", "can-i", "list", "configmaps"]).trim(), "yes");
    alice.ok(&["get", "configmaps"]);
    let elsewhere = alice.fails(
        &["auth", "can-i", "list", "configmaps", "-n", "kube-system"],
        None,
    );
    assert_eq!(elsewhere.trim(), "no");
    let create = alice.fails(&["auth", "can-i", "create", "configmaps"], None);
    assert_eq!(create.trim(), "no");
    assert_eq!(alice.ok(&["auth", "can-i", "get", "/version"]).trim(), "yes");
    assert_eq!(alice.fails(&["auth", "can-i", "get", "/"], None).trim(), "no");

    // --list: the bound Role's rules beside what every user may do.
    let rules = table(&alice.ok(&["auth", "can-i", "--list"]));
    assert_eq!(
        rules[0],
        ["Resources", "Non-Resource URLs", "Resource Names", "Verbs"],
        "{rules:?}"
    );
    for expected in [
        vec!["configmaps", "[]", "[]", "[get list]"],
        vec![
            "selfsubjectaccessreviews.authorization.k8s.io",
            "[]",
            "[]",
            "[create]",
        ],
        vec!["[/version]", "[]", "[get]"],
    ] {
        assert!(
            rules.contains(&expected.iter().map(|s| s.to_string()).collect()),
            "{bin}: {expected:?} not in {rules:?}"
        );
    }
    let everything = table(&admin.ok(&["auth", "can-i", "--list"]));
    assert!(
        everything.contains(&vec!["*.*".into(), "[]".into(), "[]".into(), "[*]".into()]),
        "{everything:?}"
    );
    users.server.shutdown().await.unwrap();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn kubectl_1_32_auth_whoami_and_can_i() {
    kubectl_auth(KUBECTLS[0]).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn kubectl_1_27_auth_whoami_and_can_i() {
    kubectl_auth(KUBECTLS[1]).await;
}

/// `kubectl get all` expands the `all` category from discovery: with no
/// workloads it says so, as a real server's does, and it lists Deployments,
/// the one kind of that category served here.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn kubectl_get_all() {
    let server = Config::for_tests().start().await.unwrap();
    let dir = tempfile::tempdir().unwrap();
    let kc = dir.path().join("kubeconfig");
    server.write_kubeconfig(&kc).unwrap();
    let deployment = "apiVersion: apps/v1
kind: Deployment
metadata: {name: web, namespace: robots}
spec:
  selector: {matchLabels: {app: web}}
  template:
    metadata: {labels: {app: web}}
    spec: {containers: [{name: c, image: nginx}]}
";
    for bin in KUBECTLS {
        let Some(k) = Kubectl::new(bin, &kc) else { continue };
        let (ok, out) = k.run(&["get", "all"], None);
        assert!(ok, "{bin}: {out}");
        assert_eq!(out.trim(), "No resources found in default namespace.", "{bin}");
        let (ok, out) = k.run(&["get", "all", "-A"], None);
        assert!(ok, "{bin}: {out}");
        assert_eq!(out.trim(), "No resources found", "{bin}");

        k.ok_stdin(
            &["apply", "-f", "-"],
            &format!("apiVersion: v1\nkind: Namespace\nmetadata: {{name: robots}}\n---\n{deployment}"),
        );
        let out = k.ok(&["get", "all", "-n", "robots", "-o", "name"]);
        assert_eq!(out.trim(), "deployment.apps/web", "{bin}");
        let out = k.ok(&["get", "all", "-A"]);
        assert!(
            out.lines().any(|l| l.starts_with("robots") && l.contains("web")),
            "{bin}: {out}"
        );
        k.ok(&["delete", "namespace", "robots", "--wait=false"]);
        k.ok(&["wait", "--for=delete", "namespace/robots", "--timeout", "10s"]);
    }
    server.shutdown().await.unwrap();
}

/// An object as `kubectl get -o json` shows it.
fn get_json(k: &Kubectl, args: &[&str]) -> serde_json::Value {
    let mut all = vec!["get"];
    all.extend_from_slice(args);
    all.extend_from_slice(&["-o", "json"]);
    let out = k.ok(&all);
    serde_json::from_str(&out).unwrap_or_else(|e| panic!("{args:?}: {e}\n{out}"))
}

/// kubectl's typed commands (`create namespace|secret|configmap|...`)
/// write protobuf (1.32; 1.27 writes JSON) and read protobuf answers; what
/// they wrote reads back field for field.
async fn kubectl_typed_writes(bin: &str, protobuf: bool) {
    use base64::Engine as _;
    let server = Config::for_tests().start().await.unwrap();
    let dir = tempfile::tempdir().unwrap();
    let kc = dir.path().join("kubeconfig");
    server.write_kubeconfig(&kc).unwrap();
    let Some(k) = Kubectl::new(bin, &kc) else { return };

    // Both ways of the wire really are protobuf (for kubectl 1.32).
    let out = k.ok(&["create", "namespace", "pb", "-v=8"]);
    let protobuf_headers = out
        .lines()
        .filter(|l| l.contains("Content-Type: application/vnd.kubernetes.protobuf"))
        .count();
    assert_eq!(
        protobuf_headers,
        if protobuf { 2 } else { 0 },
        "{bin}: the request and the answer should be protobuf: {protobuf}\n{out}"
    );
    let ns = get_json(&k, &["namespace", "pb"]);
    assert_eq!(ns["metadata"]["name"], "pb", "{bin}: {ns}");
    assert!(ns["metadata"]["uid"].is_string() && ns["metadata"]["creationTimestamp"].is_string());

    let out = k.ok(&[
        "create",
        "secret",
        "generic",
        "s",
        "-n",
        "pb",
        "--from-literal=a=b",
        "--from-literal=spaced=d e\u{e9}",
    ]);
    assert!(out.contains("secret/s created"), "{bin}: {out}");
    let secret = get_json(&k, &["secret", "s", "-n", "pb"]);
    let data = |key: &str| {
        let text = secret["data"][key]
            .as_str()
            .unwrap_or_else(|| panic!("{bin}: no data.{key} in {secret}"));
        String::from_utf8(base64::engine::general_purpose::STANDARD.decode(text).unwrap()).unwrap()
    };
    assert_eq!((data("a").as_str(), data("spaced").as_str()), ("b", "d e\u{e9}"));
    // kubectl leaves `type` to the server's defaulting, which this one
    // does not do for built-in kinds (KNOWN_DIFFERENCES).
    assert!(
        secret["type"].is_null() || secret["type"] == "Opaque",
        "{bin}: {secret}"
    );

    // `-o json` prints the object kubectl decoded from the protobuf answer.
    let out = k.ok(&[
        "create",
        "configmap",
        "c",
        "-n",
        "pb",
        "--from-literal=a=b",
        "-o",
        "json",
    ]);
    let answered: serde_json::Value = serde_json::from_str(&out).unwrap_or_else(|e| panic!("{e}: {out}"));
    assert_eq!(answered["data"]["a"], "b", "{bin}: {answered}");
    assert!(
        answered["metadata"]["resourceVersion"].is_string(),
        "{bin}: {answered}"
    );
    assert_eq!(
        get_json(&k, &["configmap", "c", "-n", "pb"])["data"],
        serde_json::json!({"a": "b"})
    );

    k.ok(&["create", "serviceaccount", "robot", "-n", "pb"]);
    assert_eq!(
        get_json(&k, &["serviceaccount", "robot", "-n", "pb"])["kind"],
        "ServiceAccount"
    );

    k.ok(&[
        "create",
        "role",
        "reader",
        "-n",
        "pb",
        "--verb=get,list",
        "--resource=configmaps,secrets",
    ]);
    let role = get_json(&k, &["role", "reader", "-n", "pb"]);
    assert_eq!(
        role["rules"],
        serde_json::json!([{"apiGroups": [""], "resources": ["configmaps", "secrets"], "verbs": ["get", "list"]}]),
        "{bin}"
    );
    k.ok(&[
        "create",
        "rolebinding",
        "reads",
        "-n",
        "pb",
        "--role=reader",
        "--serviceaccount=pb:robot",
        "--user=alice",
    ]);
    let binding = get_json(&k, &["rolebinding", "reads", "-n", "pb"]);
    assert_eq!(
        binding["roleRef"],
        serde_json::json!({"apiGroup": "rbac.authorization.k8s.io", "kind": "Role", "name": "reader"})
    );
    let subjects = binding["subjects"].as_array().cloned().unwrap_or_default();
    assert!(
        subjects.contains(&serde_json::json!({"kind": "ServiceAccount", "name": "robot", "namespace": "pb"}))
            && subjects.contains(
                &serde_json::json!({"kind": "User", "apiGroup": "rbac.authorization.k8s.io", "name": "alice"})
            ),
        "{bin}: {binding}"
    );

    k.ok(&[
        "create",
        "clusterrole",
        "ns-reader",
        "--verb=get,list,watch",
        "--resource=namespaces",
    ]);
    let cluster_role = get_json(&k, &["clusterrole", "ns-reader"]);
    assert_eq!(
        cluster_role["rules"][0]["verbs"],
        serde_json::json!(["get", "list", "watch"]),
        "{bin}: {cluster_role}"
    );
    k.ok(&[
        "create",
        "clusterrolebinding",
        "ns-readers",
        "--clusterrole=ns-reader",
        "--group=ops",
    ]);
    let cluster_binding = get_json(&k, &["clusterrolebinding", "ns-readers"]);
    assert_eq!(
        cluster_binding["subjects"],
        serde_json::json!([{"kind": "Group", "apiGroup": "rbac.authorization.k8s.io", "name": "ops"}]),
        "{bin}"
    );

    // A pointer set to zero stays zero; the pod template comes through.
    k.ok(&[
        "create",
        "deployment",
        "web",
        "-n",
        "pb",
        "--image=nginx:1.27",
        "--replicas=0",
        "--port=80",
    ]);
    let web = get_json(&k, &["deployment", "web", "-n", "pb"]);
    assert_eq!(web["spec"]["replicas"], 0, "{bin}: {web}");
    let container = &web["spec"]["template"]["spec"]["containers"][0];
    assert_eq!(container["image"], "nginx:1.27", "{bin}: {web}");
    assert_eq!(container["ports"][0]["containerPort"], 80, "{bin}: {web}");

    // Errors come back as protobuf Status objects kubectl can read.
    let out = k.fails(&["create", "namespace", "pb"], None);
    assert!(
        out.contains("AlreadyExists") && out.contains("namespaces \"pb\" already exists"),
        "{bin}: {out}"
    );
    server.shutdown().await.unwrap();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn kubectl_1_32_typed_writes_in_protobuf() {
    kubectl_typed_writes(KUBECTLS[0], true).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn kubectl_1_27_typed_writes_in_json() {
    kubectl_typed_writes(KUBECTLS[1], false).await;
}
