//! The container image that scripts/image.sh builds holds programs that
//! start: podman runs the image's k8s4r-server and k8s4r-manager as a
//! kubelet would run the Deployments of deploy/ (their command, args, env,
//! mounted Secret, service account token, user and security context, all
//! read from what `kubectl apply -k deploy/` stored), against
//! apiserver-lite and a Mosquitto with deploy/mosquitto's configuration,
//! and each becomes ready on its readinessProbe. The image's user and
//! entrypoint are the Containerfile's, so both describe one image.
//!
//! It needs the image: `scripts/image-test.sh` builds it from the debug
//! binaries and runs this test with K8S4R_IMAGE_ARCHIVE set
//! (scripts/test.sh calls it).

use std::collections::BTreeMap;
use std::net::TcpListener;
use std::os::unix::fs::PermissionsExt;
use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::Duration;

use k8s4r_testbed::{eventually_or, kubectl};
use k8s_openapi::api::apps::v1::Deployment;
use k8s_openapi::api::core::v1::Secret;
use kube::Api;
use serde_json::Value;
use tokio::io::{AsyncReadExt, AsyncWriteExt};

#[path = "support/deployed.rs"]
mod deployed;
use deployed::{deploy_dir, repo_file, start_deployed_mosquitto};

/// How long a program has to become ready: a pod's start, with room for
/// a loaded 2-core machine.
const READY: Duration = Duration::from_secs(60);
const NAMESPACE: &str = "k8s4r-system";
/// Where a kubelet mounts a pod's service account token.
const SERVICE_ACCOUNT_DIR: &str = "/var/run/secrets/kubernetes.io/serviceaccount";

/// podman with a store of its own in a temporary directory, so that the
/// test leaves nothing in the machine's store and meets nothing there.
struct Podman {
    store: tempfile::TempDir,
}

impl Podman {
    fn new() -> Podman {
        match Command::new("podman").arg("--version").output() {
            Ok(out) if out.status.success() => {}
            _ => {
                panic!("podman is not installed: run scripts/setup.sh (it installs podman, runc and buildah)")
            }
        }
        Podman {
            store: tempfile::tempdir().expect("a temporary directory"),
        }
    }

    fn command(&self) -> Command {
        let mut cmd = Command::new("podman");
        cmd.arg("--root")
            .arg(self.store.path().join("root"))
            .arg("--runroot")
            .arg(self.store.path().join("run"))
            // vfs needs neither overlayfs nor fuse; runc, unlike crun 1.8,
            // runs under the hybrid cgroup hierarchy of this machine kind.
            .args(["--storage-driver", "vfs", "--runtime", "runc"]);
        cmd
    }

    /// Runs podman with `args`; panics with its stderr when it fails.
    fn run(&self, args: &[String]) -> String {
        let out = self.command().args(args).output().expect("run podman");
        assert!(
            out.status.success(),
            "podman {}: {}",
            args.join(" "),
            String::from_utf8_lossy(&out.stderr)
        );
        String::from_utf8_lossy(&out.stdout).into_owned()
    }

    /// A container's state and exit code, e.g. `running 0`, `exited 127`.
    fn state(&self, name: &str) -> String {
        self.run(&strings([
            "container",
            "inspect",
            "--format",
            "{{.State.Status}} {{.State.ExitCode}}",
            name,
        ]))
        .trim()
        .to_owned()
    }

    /// What a container wrote, for a failure message.
    fn logs(&self, name: &str) -> String {
        let out = self
            .command()
            .args(["logs", name])
            .output()
            .expect("run podman logs");
        format!(
            "{}{}",
            String::from_utf8_lossy(&out.stdout),
            String::from_utf8_lossy(&out.stderr)
        )
    }
}

/// A running container, removed (killed first) on drop.
struct Container<'a> {
    podman: &'a Podman,
    name: String,
}

impl Drop for Container<'_> {
    fn drop(&mut self) {
        let _ = self
            .podman
            .command()
            .args(["rm", "--force", "--time", "0", &self.name])
            .output();
    }
}

fn strings<const N: usize>(args: [&str; N]) -> Vec<String> {
    args.iter().map(|a| (*a).to_owned()).collect()
}

/// The value of the last `instruction` line of the Containerfile (its
/// final stage's).
fn containerfile(instruction: &str) -> String {
    let prefix = format!("{instruction} ");
    repo_file("Containerfile")
        .lines()
        .rev()
        .find_map(|l| l.strip_prefix(&prefix))
        .unwrap_or_else(|| panic!("the Containerfile has no {instruction}"))
        .trim()
        .to_owned()
}

/// What a kubelet would have for one pod: the cluster's Secrets, the
/// service account tokens apiserver-lite accepts, where to write files.
struct Node<'a> {
    secrets: Api<Secret>,
    tokens: &'a BTreeMap<String, String>,
    api_port: u16,
    ca_pem: &'a str,
    dir: &'a Path,
}

impl Node<'_> {
    async fn secret_key(&self, name: &str, key: &str) -> Vec<u8> {
        let secret = self
            .secrets
            .get(name)
            .await
            .unwrap_or_else(|e| panic!("Secret {NAMESPACE}/{name}: {e}"));
        secret
            .data
            .unwrap_or_default()
            .remove(key)
            .unwrap_or_else(|| panic!("Secret {NAMESPACE}/{name} has no key {key}"))
            .0
    }

    /// A directory of files readable by the container's user, to mount.
    fn files(&self, name: &str, files: &[(String, Vec<u8>)]) -> PathBuf {
        let dir = self.dir.join(name);
        std::fs::create_dir_all(&dir).expect("a volume directory");
        std::fs::set_permissions(&dir, std::fs::Permissions::from_mode(0o755)).expect("chmod");
        for (file, content) in files {
            std::fs::write(dir.join(file), content).expect("a volume file");
            std::fs::set_permissions(dir.join(file), std::fs::Permissions::from_mode(0o644)).expect("chmod");
        }
        dir
    }

    /// `podman run` arguments for the Deployment's pod, as a kubelet reads
    /// its template; a field it does not know how to honour fails the test
    /// rather than being skipped. Returns them and the container's probes.
    async fn pod(&self, deployment: &Deployment, pod_name: &str) -> (Vec<String>, Probes) {
        let template = deployment.spec.template.clone();
        let pod = serde_json::to_value(template.spec.expect("a pod spec")).expect("JSON");
        known_fields(
            &pod,
            "pod spec",
            &["serviceAccountName", "securityContext", "containers", "volumes"],
        );
        let containers = pod["containers"].as_array().expect("containers");
        assert_eq!(containers.len(), 1, "{pod_name}: one container");
        let container = &containers[0];
        known_fields(
            container,
            "container",
            &[
                "name",
                "image",
                "command",
                "args",
                "env",
                "ports",
                "livenessProbe",
                "readinessProbe",
                "resources",
                "securityContext",
                "volumeMounts",
            ],
        );
        let mut args = strings(["run", "--detach", "--pull", "never", "--network", "host"]);
        args.extend(["--name".to_owned(), pod_name.to_owned()]);
        args.extend(["--hostname".to_owned(), pod_name.to_owned()]);
        // Podman's default open-files and process limits are above what
        // this machine lets a root without CAP_SYS_RESOURCE set.
        args.extend(strings([
            "--ulimit",
            "nofile=16384:16384",
            "--ulimit",
            "nproc=4096:4096",
        ]));

        // Security context: the container's fields over the pod's.
        let mut security = pod["securityContext"].as_object().cloned().unwrap_or_default();
        if let Some(own) = container["securityContext"].as_object() {
            security.extend(own.clone());
        }
        for (field, value) in &security {
            match (field.as_str(), value) {
                ("runAsUser" | "runAsGroup", _) => {}
                ("runAsNonRoot", Value::Bool(true)) => {
                    assert_ne!(
                        security["runAsUser"], 0,
                        "{pod_name}: runAsNonRoot with runAsUser 0"
                    );
                }
                ("seccompProfile", profile) => {
                    // podman's default profile is the runtime's default.
                    assert_eq!(profile["type"], "RuntimeDefault", "{pod_name}: seccompProfile");
                }
                ("readOnlyRootFilesystem", Value::Bool(true)) => {
                    // A kubelet mounts nothing writable the pod did not ask for.
                    args.extend(strings(["--read-only", "--read-only-tmpfs=false"]));
                }
                ("allowPrivilegeEscalation", Value::Bool(false)) => {
                    args.extend(strings(["--security-opt", "no-new-privileges"]));
                }
                ("capabilities", caps) => {
                    assert!(
                        caps["add"].is_null(),
                        "{pod_name}: capabilities.add is not emulated"
                    );
                    for cap in caps["drop"].as_array().into_iter().flatten() {
                        args.push(format!("--cap-drop={}", cap.as_str().expect("a capability")));
                    }
                }
                other => panic!("{pod_name}: securityContext {other:?} is not emulated here: add it"),
            }
        }
        let user = |field: &str| {
            security[field]
                .as_u64()
                .unwrap_or_else(|| panic!("{pod_name}: no {field}"))
        };
        args.push(format!("--user={}:{}", user("runAsUser"), user("runAsGroup")));
        if let Some(memory) = container["resources"]["limits"]["memory"].as_str() {
            let mib = memory
                .strip_suffix("Mi")
                .unwrap_or_else(|| panic!("{pod_name}: memory limit {memory} is not in Mi"));
            args.push(format!("--memory={mib}m"));
        }

        // The service account's token, as a kubelet projects it.
        let account = pod["serviceAccountName"].as_str().expect("serviceAccountName");
        let token = self
            .tokens
            .get(account)
            .unwrap_or_else(|| panic!("{pod_name}: no token for service account {account}"));
        let token_dir = self.files(
            &format!("{pod_name}-token"),
            &[
                ("token".to_owned(), token.as_bytes().to_vec()),
                ("ca.crt".to_owned(), self.ca_pem.as_bytes().to_vec()),
                ("namespace".to_owned(), NAMESPACE.as_bytes().to_vec()),
            ],
        );
        args.push(format!(
            "--volume={}:{SERVICE_ACCOUNT_DIR}:ro",
            token_dir.display()
        ));
        args.push("--env=KUBERNETES_SERVICE_HOST=127.0.0.1".to_owned());
        args.push(format!("--env=KUBERNETES_SERVICE_PORT={}", self.api_port));

        for env in container["env"].as_array().into_iter().flatten() {
            let name = env["name"].as_str().expect("an env name");
            let value = if let Some(value) = env["value"].as_str() {
                value.to_owned()
            } else if let Some(key) = env["valueFrom"]["secretKeyRef"].as_object() {
                let bytes = self
                    .secret_key(key["name"].as_str().unwrap(), key["key"].as_str().unwrap())
                    .await;
                String::from_utf8(bytes).expect("a UTF-8 Secret value")
            } else {
                match env["valueFrom"]["fieldRef"]["fieldPath"].as_str() {
                    Some("metadata.name") => pod_name.to_owned(),
                    Some("metadata.namespace") => NAMESPACE.to_owned(),
                    _ => panic!("{pod_name}: env {env} is not emulated here: add it"),
                }
            };
            args.push(format!("--env={name}={value}"));
        }

        let volumes = pod["volumes"].as_array().cloned().unwrap_or_default();
        for mount in container["volumeMounts"].as_array().into_iter().flatten() {
            let name = mount["name"].as_str().expect("a mount name");
            let volume = volumes
                .iter()
                .find(|v| v["name"] == name)
                .unwrap_or_else(|| panic!("{pod_name}: no volume {name}"));
            let secret = volume["secret"]["secretName"]
                .as_str()
                .unwrap_or_else(|| panic!("{pod_name}: volume {volume} is not emulated here: add it"));
            let mut files = Vec::new();
            for item in volume["secret"]["items"].as_array().expect("the Secret's items") {
                let key = item["key"].as_str().expect("an item key");
                let content = self.secret_key(secret, key).await;
                files.push((item["path"].as_str().expect("an item path").to_owned(), content));
            }
            let dir = self.files(&format!("{pod_name}-{name}"), &files);
            let read_only = if mount["readOnly"] == true { ":ro" } else { "" };
            let target = mount["mountPath"].as_str().expect("a mountPath");
            args.push(format!("--volume={}:{target}{read_only}", dir.display()));
        }

        // With the host's network the ports are the host's: say so when
        // one is taken, rather than let the program fail to bind.
        let ports = container["ports"].as_array().expect("ports");
        for port in ports {
            let number = port["containerPort"].as_u64().expect("a containerPort") as u16;
            if let Err(e) = TcpListener::bind(("0.0.0.0", number)) {
                panic!(
                    "{pod_name} binds port {number}, which something on this machine holds ({e}): stop it"
                );
            }
        }
        let probes = Probes {
            readiness: http_probe(container, "readinessProbe", pod_name),
            liveness: http_probe(container, "livenessProbe", pod_name),
        };

        // The image, then the command as its entrypoint and the args after.
        let command = container["command"].as_array().expect("a command");
        assert_eq!(command.len(), 1, "{pod_name}: a command of one program");
        args.push(format!("--entrypoint={}", command[0].as_str().unwrap()));
        args.push(container["image"].as_str().expect("an image").to_owned());
        args.extend(
            container["args"]
                .as_array()
                .into_iter()
                .flatten()
                .map(|a| a.as_str().expect("an argument").to_owned()),
        );
        (args, probes)
    }
}

/// Where a kubelet would send an httpGet probe: a port and a path.
struct Probe {
    port: u16,
    path: String,
}

struct Probes {
    readiness: Probe,
    liveness: Probe,
}

/// The container's httpGet `probe`, its port resolved by name.
fn http_probe(container: &Value, probe: &str, pod_name: &str) -> Probe {
    let get = &container[probe]["httpGet"];
    let port = match &get["port"] {
        Value::Number(n) => n.as_u64(),
        Value::String(named) => container["ports"]
            .as_array()
            .into_iter()
            .flatten()
            .find(|p| p["name"] == named.as_str())
            .and_then(|p| p["containerPort"].as_u64()),
        _ => None,
    }
    .unwrap_or_else(|| panic!("{pod_name}: {probe} has no httpGet port a container port names"));
    Probe {
        port: port as u16,
        path: get["path"]
            .as_str()
            .unwrap_or_else(|| panic!("{pod_name}: {probe} has no httpGet path"))
            .to_owned(),
    }
}

/// Fails on a field of `object` not in `known`: the emulated kubelet would
/// silently ignore it.
fn known_fields(object: &Value, what: &str, known: &[&str]) {
    for field in object.as_object().expect("an object").keys() {
        assert!(
            known.contains(&field.as_str()),
            "the Deployment's {what} has {field}, which this test does not emulate: add it"
        );
    }
}

/// The image is the one the Containerfile describes (its user and
/// entrypoint), and the Deployment runs it as the image's user.
fn check_image_config(podman: &Podman, image: &str, run_args: &[String]) {
    let inspected: Value = serde_json::from_str(&podman.run(&strings(["image", "inspect", image])))
        .expect("podman image inspect prints JSON");
    let config = &inspected[0]["Config"];
    assert_eq!(
        config["User"],
        containerfile("USER"),
        "{image}: the image's user is not the Containerfile's"
    );
    let entrypoint: Value =
        serde_json::from_str(&containerfile("ENTRYPOINT")).expect("the Containerfile's ENTRYPOINT is JSON");
    assert_eq!(
        config["Entrypoint"], entrypoint,
        "{image}: the image's entrypoint is not the Containerfile's"
    );
    let user = run_args
        .iter()
        .find_map(|a| a.strip_prefix("--user="))
        .expect("a user");
    assert_eq!(
        config["User"], user,
        "{image}: the Deployment runs it as another user"
    );
}

/// The HTTP status of GET `path` on 127.0.0.1:`port`, if it answers.
async fn http_status(port: u16, path: &str) -> Option<u16> {
    let mut stream = tokio::net::TcpStream::connect(("127.0.0.1", port)).await.ok()?;
    let request = format!("GET {path} HTTP/1.1\r\nHost: 127.0.0.1\r\nConnection: close\r\n\r\n");
    stream.write_all(request.as_bytes()).await.ok()?;
    let mut answer = Vec::new();
    tokio::time::timeout(Duration::from_secs(5), stream.read_to_end(&mut answer))
        .await
        .ok()?
        .ok()?;
    let answer = String::from_utf8_lossy(&answer);
    answer.split_whitespace().nth(1)?.parse().ok()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
#[ignore = "needs the image: scripts/image-test.sh builds it and runs this test"]
async fn the_images_programs_start_as_the_deployments_run_them_and_become_ready() {
    let archive = std::env::var_os("K8S4R_IMAGE_ARCHIVE").map(PathBuf::from).expect(
        "K8S4R_IMAGE_ARCHIVE: the OCI archive scripts/image.sh wrote (scripts/image-test.sh sets it)",
    );
    assert!(
        archive.is_file(),
        "{}: no such archive: build it with scripts/image.sh",
        archive.display()
    );
    let podman = Podman::new();
    let loaded = podman.run(&[
        "load".to_owned(),
        "--input".to_owned(),
        archive.display().to_string(),
    ]);
    assert!(loaded.contains("Loaded image"), "podman load: {loaded}");

    let dir = tempfile::tempdir().expect("a temporary directory");
    let broker = start_deployed_mosquitto(&[("k8s4r-server", "server-pw")]);
    let tokens: BTreeMap<String, String> = ["k8s4r-server", "k8s4r-manager"]
        .iter()
        .map(|account| {
            (
                (*account).to_owned(),
                format!("{account}-token-{}", std::process::id()),
            )
        })
        .collect();
    let mut config = apiserver_lite::Config::for_tests();
    for (account, token) in &tokens {
        config = config.user(
            token.as_str(),
            apiserver_lite::User::service_account(NAMESPACE, account),
        );
    }
    let server = config.start().await.expect("apiserver-lite starts");
    let kubeconfig = dir.path().join("kubeconfig");
    server.write_kubeconfig(&kubeconfig).expect("kubeconfig");
    kubectl(
        &kubeconfig,
        &["apply", "--server-side", "-k", deploy_dir().to_str().unwrap()],
    );
    // The Secret an operator creates, as 10-server.yaml says.
    let ca = broker.dir().join("ca.pem");
    kubectl(
        &kubeconfig,
        &[
            "create",
            "secret",
            "generic",
            "k8s4r-server-mqtt",
            "-n",
            NAMESPACE,
            &format!("--from-literal=broker-url=mqtts://127.0.0.1:{}", broker.port),
            "--from-literal=username=k8s4r-server",
            "--from-literal=password=server-pw",
            &format!("--from-file=ca.crt={}", ca.display()),
        ],
    );

    let client = server.client().await.expect("a client");
    let deployments: Api<Deployment> = Api::namespaced(client.clone(), NAMESPACE);
    let node = Node {
        secrets: Api::namespaced(client, NAMESPACE),
        tokens: &tokens,
        api_port: server.addr().port(),
        ca_pem: server.ca_pem().expect("apiserver-lite serves TLS"),
        dir: dir.path(),
    };

    // One pod of each: the manager's second replica would bind the same
    // ports in the host's network, where a cluster gives it its own.
    let mut running = Vec::new();
    for name in ["k8s4r-server", "k8s4r-manager"] {
        let deployment = deployments
            .get(name)
            .await
            .unwrap_or_else(|e| panic!("Deployment {name} after kubectl apply -k deploy/: {e}"));
        let pod_name = format!("{name}-image-test-{}", std::process::id());
        let (args, probes) = node.pod(&deployment, &pod_name).await;
        let image = deployment
            .spec
            .template
            .spec
            .as_ref()
            .expect("a pod spec")
            .containers[0]
            .image
            .clone()
            .expect("an image");
        check_image_config(&podman, &image, &args);
        podman.run(&args);
        running.push((
            Container {
                podman: &podman,
                name: pod_name,
            },
            probes,
        ));
    }

    for (container, probes) in &running {
        let name = &container.name;
        let Probe { port, path } = &probes.readiness;
        // Ready, or stopped: a program that exits (a missing library, a
        // flag it refuses) fails the test at once, with what it wrote.
        let outcome = eventually_or(READY, || async {
            if http_status(*port, path).await == Some(200) {
                return Some(Ok(()));
            }
            let state = podman.state(name);
            (!state.starts_with("running")).then_some(Err(state))
        })
        .await;
        let failure = match outcome {
            Some(Ok(())) => None,
            Some(Err(state)) => Some(format!("{name} stopped before it was ready ({state})")),
            None => Some(format!(
                "{name} did not answer 200 on :{port}{path} within {READY:?}"
            )),
        };
        if let Some(failure) = failure {
            panic!(
                "{failure}; what it wrote:\n{}\nMosquitto:\n{}",
                podman.logs(name),
                broker.log()
            );
        }
        let Probe { port, path } = &probes.liveness;
        assert_eq!(
            http_status(*port, path).await,
            Some(200),
            "{name}: ready but its liveness probe :{port}{path} fails; what it wrote:\n{}",
            podman.logs(name)
        );
    }
    let denied: Vec<String> = server
        .denied()
        .into_iter()
        .filter(|d| d.contains("system:serviceaccount:"))
        .collect();
    assert!(
        denied.is_empty(),
        "deploy/cluster's RBAC denied the image's programs:\n{}",
        denied.join("\n")
    );
    drop(running);
    server.shutdown().await.expect("apiserver-lite stops");
}
