//! The deployment files under deploy/ do what they say: every manifest is a
//! well-formed object of its kind (no misspelt field slips through), the
//! Deployments start the programs with flags they accept and probe the
//! ports they serve, kubectl applies the whole kustomization to the
//! embedded API server, and Mosquitto running deploy/mosquitto's
//! configuration enforces TLS, passwords and the per-robot ACL.
//! (That the RBAC is enough for the programs is shown by the end-to-end
//! tests, which run them under it.)

use std::collections::BTreeSet;
use std::path::{Path, PathBuf};
use std::time::Duration;

use clap::{CommandFactory, Parser};
use k8s4r_testbed::{kubectl, Mosquitto};
use rumqttc::{
    AsyncClient, ConnectionError, Event, EventLoop, MqttOptions, Packet, QoS, TlsConfiguration, Transport,
};
use serde::de::DeserializeOwned;
use serde::Serialize;
use serde_json::Value;
use tokio::sync::mpsc;

#[path = "support/deployed.rs"]
mod deployed;
use deployed::{deploy_dir, repo_file, start_deployed_mosquitto};

const WAIT: Duration = Duration::from_secs(20);

/// Every YAML file under deploy/, sorted.
fn yaml_files(dir: &Path) -> Vec<PathBuf> {
    let mut files = Vec::new();
    for entry in std::fs::read_dir(dir).unwrap() {
        let path = entry.unwrap().path();
        if path.is_dir() {
            files.extend(yaml_files(&path));
        } else if path.extension().is_some_and(|e| e == "yaml" || e == "yml") {
            files.push(path);
        }
    }
    files.sort();
    files
}

/// The documents of a YAML file, as JSON values (empty documents skipped).
fn documents(path: &Path) -> Vec<Value> {
    let text = std::fs::read_to_string(path).unwrap();
    serde_yaml::Deserializer::from_str(&text)
        .map(|doc| {
            let value: Value = serde::Deserialize::deserialize(doc)
                .unwrap_or_else(|e| panic!("{}: not YAML: {e}", path.display()));
            value
        })
        .filter(|v| !v.is_null())
        .collect()
}

/// Every object of deploy/, with the file it is in.
fn manifests() -> Vec<(PathBuf, Value)> {
    yaml_files(&deploy_dir())
        .into_iter()
        .flat_map(|file| documents(&file).into_iter().map(move |doc| (file.clone(), doc)))
        .collect()
}

/// Reads `doc` as the typed object `T` and writes it back: a field `T` does
/// not have (a typo, a wrong level) is lost on the way and shows as a
/// difference.
fn round_trips_as<T: DeserializeOwned + Serialize>(file: &Path, doc: &Value) {
    let typed: T = serde_json::from_value(doc.clone()).unwrap_or_else(|e| {
        panic!(
            "{}: {} {}: {e}",
            file.display(),
            doc["kind"],
            doc["metadata"]["name"]
        )
    });
    let back = serde_json::to_value(&typed).unwrap();
    if &back != doc {
        panic!(
            "{}: {} {} has fields its kind does not know\nwritten:\n{}\nas read:\n{}",
            file.display(),
            doc["kind"],
            doc["metadata"]["name"],
            serde_json::to_string_pretty(doc).unwrap(),
            serde_json::to_string_pretty(&back).unwrap()
        );
    }
}

#[test]
fn every_manifest_is_a_well_formed_object_of_its_kind() {
    use k8s_openapi::api::admissionregistration::v1::ValidatingWebhookConfiguration;
    use k8s_openapi::api::apps::v1::Deployment;
    use k8s_openapi::api::core::v1::{Namespace, Service, ServiceAccount};
    use k8s_openapi::api::flowcontrol::v1::{FlowSchema, PriorityLevelConfiguration};
    use k8s_openapi::api::rbac::v1::{ClusterRole, ClusterRoleBinding, Role, RoleBinding};
    use k8s_openapi::apiextensions_apiserver::pkg::apis::apiextensions::v1::CustomResourceDefinition;
    use k8s_openapi::kube_aggregator::pkg::apis::apiregistration::v1::APIService;

    let all = manifests();
    // Kustomize patches are partial objects: only their target is checked.
    let patches: BTreeSet<PathBuf> = all
        .iter()
        .filter(|(_, doc)| matches!(doc["kind"].as_str(), Some("Kustomization" | "Component")))
        .flat_map(|(file, doc)| {
            let dir = file.parent().unwrap().to_path_buf();
            doc["patches"]
                .as_array()
                .into_iter()
                .flatten()
                .filter_map(move |p| p["path"].as_str().map(|path| dir.join(path)))
        })
        .collect();
    let mut kinds = BTreeSet::new();
    for (file, doc) in &all {
        let api_version = doc["apiVersion"]
            .as_str()
            .unwrap_or_else(|| panic!("{}: no apiVersion", file.display()));
        let kind = doc["kind"]
            .as_str()
            .unwrap_or_else(|| panic!("{}: no kind", file.display()));
        kinds.insert(kind.to_owned());
        if kind == "Kustomization" || kind == "Component" {
            let listed = doc["resources"].as_array().into_iter().flatten();
            let patched = doc["patches"]
                .as_array()
                .into_iter()
                .flatten()
                .map(|p| &p["path"]);
            let components = doc["components"].as_array().into_iter().flatten();
            for resource in listed.chain(patched).chain(components) {
                let path = file.parent().unwrap().join(resource.as_str().unwrap());
                assert!(
                    path.exists(),
                    "{}: {} does not exist",
                    file.display(),
                    path.display()
                );
            }
            continue;
        }
        let name = doc["metadata"]["name"].as_str().unwrap_or_default();
        assert!(!name.is_empty(), "{}: a {kind} without a name", file.display());
        if patches.contains(file) {
            assert!(
                all.iter().any(|(f, d)| !patches.contains(f)
                    && d["kind"] == doc["kind"]
                    && d["metadata"]["name"] == name),
                "{}: patches a {kind} {name} that deploy/ does not have",
                file.display()
            );
            continue;
        }
        match (api_version, kind) {
            ("v1", "Namespace") => round_trips_as::<Namespace>(file, doc),
            ("v1", "ServiceAccount") => round_trips_as::<ServiceAccount>(file, doc),
            ("rbac.authorization.k8s.io/v1", "Role") => round_trips_as::<Role>(file, doc),
            ("rbac.authorization.k8s.io/v1", "ClusterRole") => round_trips_as::<ClusterRole>(file, doc),
            ("rbac.authorization.k8s.io/v1", "RoleBinding") => round_trips_as::<RoleBinding>(file, doc),
            ("rbac.authorization.k8s.io/v1", "ClusterRoleBinding") => {
                round_trips_as::<ClusterRoleBinding>(file, doc)
            }
            ("apps/v1", "Deployment") => round_trips_as::<Deployment>(file, doc),
            ("v1", "Service") => round_trips_as::<Service>(file, doc),
            ("apiregistration.k8s.io/v1", "APIService") => round_trips_as::<APIService>(file, doc),
            ("admissionregistration.k8s.io/v1", "ValidatingWebhookConfiguration") => {
                round_trips_as::<ValidatingWebhookConfiguration>(file, doc)
            }
            ("flowcontrol.apiserver.k8s.io/v1", "FlowSchema") => round_trips_as::<FlowSchema>(file, doc),
            ("flowcontrol.apiserver.k8s.io/v1", "PriorityLevelConfiguration") => {
                round_trips_as::<PriorityLevelConfiguration>(file, doc)
            }
            // cert-manager's kinds (the webhook component): no Rust types here.
            ("cert-manager.io/v1", "Issuer" | "Certificate") => {
                assert!(
                    doc["spec"].is_object(),
                    "{}: {kind} {name} has no spec",
                    file.display()
                );
            }
            ("robot.k8s4r.io/v1alpha1", "PeriodicJob") => {
                let pj: k8s4r_api::PeriodicJob =
                    serde_json::from_value(doc.clone()).unwrap_or_else(|e| panic!("{}: {e}", file.display()));
                if let Err(errors) = k8s4r_api::validation::validate_periodic_job_spec(&pj.spec) {
                    panic!("{}: periodic job {name} is invalid: {errors}", file.display());
                }
            }
            ("apiextensions.k8s.io/v1", "CustomResourceDefinition") => {
                round_trips_as::<CustomResourceDefinition>(file, doc)
            }
            ("robot.k8s4r.io/v1alpha1", "Job") => {
                let job: k8s4r_api::Job =
                    serde_json::from_value(doc.clone()).unwrap_or_else(|e| panic!("{}: {e}", file.display()));
                if let Err(errors) = k8s4r_api::validation::validate_job_spec(&job.spec) {
                    panic!("{}: job {name} is invalid: {errors}", file.display());
                }
            }
            _ => panic!(
                "{}: no check here for {api_version} {kind}: add one",
                file.display()
            ),
        }
    }
    for expected in [
        "Namespace",
        "ServiceAccount",
        "ClusterRole",
        "Role",
        "Deployment",
        "CustomResourceDefinition",
    ] {
        assert!(kinds.contains(expected), "no {expected} under deploy/");
    }
}

/// The names of the environment variables a program reads its flags from.
fn env_names(command: &clap::Command) -> BTreeSet<String> {
    command
        .get_arguments()
        .filter_map(|a| a.get_env())
        .map(|e| e.to_string_lossy().into_owned())
        .collect()
}

#[test]
fn deployments_run_the_programs_with_flags_they_accept() {
    let all = manifests();
    let containerfile = repo_file("Containerfile");
    let kustomization = documents(&deploy_dir().join("kustomization.yaml")).remove(0);
    let image = &kustomization["images"][0];
    let service_accounts: BTreeSet<(String, String)> = all
        .iter()
        .filter(|(_, d)| d["kind"] == "ServiceAccount")
        .map(|(_, d)| {
            (
                d["metadata"]["namespace"].as_str().unwrap().to_owned(),
                d["metadata"]["name"].as_str().unwrap().to_owned(),
            )
        })
        .collect();
    let mut programs = BTreeSet::new();
    // A component's patch of the manager sets only what the manager reads.
    let manager_env = env_names(&k8s4r_manager::cli::Args::command());
    let is_patch = |f: &PathBuf| f.components().any(|c| c.as_os_str() == "components");
    for (file, patch) in all
        .iter()
        .filter(|(f, d)| d["kind"] == "Deployment" && is_patch(f))
    {
        assert_eq!(patch["metadata"]["name"], "k8s4r-manager", "{}", file.display());
        for container in patch["spec"]["template"]["spec"]["containers"]
            .as_array()
            .unwrap()
        {
            for env in container["env"].as_array().into_iter().flatten() {
                let var = env["name"].as_str().unwrap();
                assert!(
                    manager_env.contains(var),
                    "{}: k8s4r-manager does not read {var}",
                    file.display()
                );
            }
        }
    }
    for (file, deployment) in all
        .iter()
        .filter(|(f, d)| d["kind"] == "Deployment" && !is_patch(f))
    {
        let name = deployment["metadata"]["name"].as_str().unwrap();
        let namespace = deployment["metadata"]["namespace"].as_str().unwrap();
        let what = format!("{} {name}", file.display());
        let spec = &deployment["spec"];
        let template = &spec["template"];
        for (key, value) in spec["selector"]["matchLabels"].as_object().unwrap() {
            assert_eq!(
                &template["metadata"]["labels"][key], value,
                "{what}: the selector misses the pods"
            );
        }
        let account = template["spec"]["serviceAccountName"].as_str().unwrap();
        assert!(
            service_accounts.contains(&(namespace.to_owned(), account.to_owned())),
            "{what}: no ServiceAccount {namespace}/{account} under deploy/"
        );
        let containers = template["spec"]["containers"].as_array().unwrap();
        assert_eq!(containers.len(), 1, "{what}");
        let container = &containers[0];
        let image_name = container["image"].as_str().unwrap().split(':').next().unwrap();
        assert_eq!(
            image_name, image["name"],
            "{what}: not the image the kustomization sets"
        );

        let binary = container["command"][0].as_str().unwrap();
        let program = binary.rsplit('/').next().unwrap();
        let copied = containerfile.lines().any(|l| {
            l.starts_with("COPY --from=build")
                && l.contains(&format!("/out/{program} "))
                && l.ends_with(" /usr/local/bin/")
        });
        assert!(
            copied && binary == format!("/usr/local/bin/{program}"),
            "{what}: the Containerfile does not put {program} at {binary}"
        );
        programs.insert(program.to_owned());
        let argv: Vec<&str> = std::iter::once(program)
            .chain(
                container["args"]
                    .as_array()
                    .unwrap()
                    .iter()
                    .map(|a| a.as_str().unwrap()),
            )
            .collect();
        let (metrics_port, known_env) = match program {
            "k8s4r-server" => {
                let args = k8s4r_server::cli::Args::try_parse_from(&argv)
                    .unwrap_or_else(|e| panic!("{what}: k8s4r-server rejects its args: {e}"));
                (
                    args.metrics_addr.port(),
                    env_names(&k8s4r_server::cli::Args::command()),
                )
            }
            "k8s4r-manager" => {
                let args = k8s4r_manager::cli::Args::try_parse_from(&argv)
                    .unwrap_or_else(|e| panic!("{what}: k8s4r-manager rejects its args: {e}"));
                let mut env = env_names(&k8s4r_manager::cli::Args::command());
                // Read by its default identity, not a flag.
                env.insert("POD_NAME".to_owned());
                (args.metrics_addr.port(), env)
            }
            other => panic!("{what}: runs {other}, which is not one of k8s4r's programs"),
        };
        for env in container["env"].as_array().into_iter().flatten() {
            let var = env["name"].as_str().unwrap();
            assert!(known_env.contains(var), "{what}: {program} does not read {var}");
        }

        let ports = container["ports"].as_array().unwrap();
        let metrics = ports
            .iter()
            .find(|p| p["name"] == "metrics")
            .unwrap_or_else(|| panic!("{what}: no metrics port"));
        assert_eq!(
            metrics["containerPort"], metrics_port,
            "{what}: the port is not the one it serves on"
        );
        for (probe, path) in [("livenessProbe", "/healthz"), ("readinessProbe", "/readyz")] {
            let get = &container[probe]["httpGet"];
            assert_eq!(get["path"], path, "{what}: {probe}");
            assert_eq!(get["port"], "metrics", "{what}: {probe}");
        }
        let resources = &container["resources"];
        for field in ["requests/cpu", "requests/memory", "limits/memory"] {
            let (kind, resource) = field.split_once('/').unwrap();
            assert!(resources[kind][resource].is_string(), "{what}: no {field}");
        }
        assert_eq!(
            template["metadata"]["annotations"]["prometheus.io/port"],
            metrics_port.to_string(),
            "{what}: scraped on another port"
        );
    }
    assert_eq!(
        programs,
        BTreeSet::from(["k8s4r-server".to_owned(), "k8s4r-manager".to_owned()]),
        "a Deployment for each program"
    );
}

/// What a ServiceAccount's RBAC under deploy/ lets it do: (API group,
/// resource, verb, namespace), with `None` for a grant in every namespace.
fn rbac_grants(
    all: &[(PathBuf, Value)],
    namespace: &str,
    name: &str,
) -> Vec<(String, String, String, Option<String>)> {
    use k8s_openapi::api::rbac::v1::{PolicyRule, Subject};
    let is_account = |subjects: &Value| {
        let subjects: Vec<Subject> = serde_json::from_value(subjects.clone()).unwrap_or_default();
        subjects.iter().any(|s| {
            s.kind == "ServiceAccount" && s.name == name && s.namespace.as_deref() == Some(namespace)
        })
    };
    let rules_of = |kind: &str, role: &str, role_namespace: Option<&str>| -> Vec<PolicyRule> {
        let (_, doc) = all
            .iter()
            .find(|(_, d)| {
                d["kind"] == kind
                    && d["metadata"]["name"] == role
                    && d["metadata"]["namespace"].as_str() == role_namespace
            })
            .unwrap_or_else(|| panic!("no {kind} {role} under deploy/"));
        serde_json::from_value(doc["rules"].clone()).unwrap()
    };
    let mut grants = Vec::new();
    for (_, binding) in all.iter().filter(|(_, d)| {
        matches!(d["kind"].as_str(), Some("RoleBinding" | "ClusterRoleBinding")) && is_account(&d["subjects"])
    }) {
        let scope = binding["metadata"]["namespace"].as_str();
        let role_kind = binding["roleRef"]["kind"].as_str().unwrap();
        let role_namespace = if role_kind == "Role" { scope } else { None };
        let role = binding["roleRef"]["name"].as_str().unwrap();
        for rule in rules_of(role_kind, role, role_namespace) {
            for group in rule.api_groups.iter().flatten() {
                for resource in rule.resources.iter().flatten() {
                    for verb in &rule.verbs {
                        grants.push((
                            group.clone(),
                            resource.clone(),
                            verb.clone(),
                            scope.map(str::to_owned),
                        ));
                    }
                }
            }
        }
    }
    grants
}

/// The API Priority and Fairness objects of deploy/cluster are ones a real
/// API server accepts (apiserver-lite stores them unchecked), they name
/// only k8s4r's ServiceAccounts (people's kubectl stays on the built-in
/// levels), and every write the programs' RBAC grants is on their own
/// level: a write added to the RBAC and not to the FlowSchema would go on
/// sharing `workload-low` with the rest of the cluster.
#[test]
fn flow_control_puts_every_write_of_the_programs_on_their_own_levels() {
    use k8s_openapi::api::flowcontrol::v1::{FlowSchema, PriorityLevelConfiguration, ResourcePolicyRule};
    let all = manifests();
    let typed = |kind: &'static str| {
        all.iter()
            .filter(move |(_, d)| d["kind"] == kind)
            .map(|(_, d)| d.clone())
    };
    let levels: Vec<PriorityLevelConfiguration> = typed("PriorityLevelConfiguration")
        .map(|d| serde_json::from_value(d).unwrap())
        .collect();
    let schemas: Vec<FlowSchema> = typed("FlowSchema")
        .map(|d| serde_json::from_value(d).unwrap())
        .collect();
    assert!(
        !levels.is_empty() && !schemas.is_empty(),
        "no APF objects under deploy/"
    );

    for level in &levels {
        let name = level.metadata.name.as_deref().unwrap();
        let spec = &level.spec;
        assert_eq!(spec.type_, "Limited", "{name}");
        let limited = spec.limited.as_ref().unwrap();
        // Modest: no more than global-default's share, people's traffic.
        let shares = limited.nominal_concurrency_shares.unwrap();
        assert!(
            (1..=20).contains(&shares),
            "{name}: nominalConcurrencyShares {shares}"
        );
        assert!((0..=100).contains(&limited.lendable_percent.unwrap()), "{name}");
        assert!(limited.borrowing_limit_percent.unwrap() >= 0, "{name}");
        let response = &limited.limit_response;
        assert_eq!(response.type_, "Queue", "{name}");
        let q = response.queuing.as_ref().unwrap();
        let (queues, hand, length) = (
            q.queues.unwrap(),
            q.hand_size.unwrap(),
            q.queue_length_limit.unwrap(),
        );
        assert!(queues > 0 && hand > 0 && length > 0, "{name}");
        assert!(hand <= queues, "{name}: handSize {hand} above queues {queues}");
        // kube-apiserver's shuffle-sharding check: the hand must be dealt
        // from one 60-bit hash.
        let entropy = (f64::from(queues).log2() * f64::from(hand)).ceil();
        assert!(
            entropy <= 60.0,
            "{name}: {queues} queues, hand {hand}: {entropy} bits"
        );
    }

    let service_accounts: BTreeSet<(String, String)> = typed("ServiceAccount")
        .map(|d| {
            (
                d["metadata"]["namespace"].as_str().unwrap().to_owned(),
                d["metadata"]["name"].as_str().unwrap().to_owned(),
            )
        })
        .collect();
    let mut schema_of = std::collections::BTreeMap::new();
    for schema in &schemas {
        let name = schema.metadata.name.as_deref().unwrap();
        let spec = &schema.spec;
        let level = &spec.priority_level_configuration.name;
        assert!(
            levels.iter().any(|l| l.metadata.name.as_ref() == Some(level)),
            "{name}: no PriorityLevelConfiguration {level} under deploy/"
        );
        // After the control plane's built-in schemas (kube-system's
        // ServiceAccounts are 900), before service-accounts (9000).
        let precedence = spec.matching_precedence.unwrap();
        assert!(
            (901..9000).contains(&precedence),
            "{name}: matchingPrecedence {precedence}"
        );
        assert_eq!(
            spec.distinguisher_method.as_ref().map(|d| d.type_.as_str()),
            Some("ByNamespace"),
            "{name}: one ServiceAccount is one user, so ByUser would be one flow"
        );
        for rule in spec.rules.iter().flatten() {
            for subject in &rule.subjects {
                assert_eq!(subject.kind, "ServiceAccount", "{name}: only k8s4r's programs");
                let sa = subject.service_account.as_ref().unwrap();
                let account = (sa.namespace.clone(), sa.name.clone());
                assert!(
                    service_accounts.contains(&account),
                    "{name}: no ServiceAccount {account:?} under deploy/"
                );
                assert!(
                    schema_of
                        .insert(account.clone(), rule.resource_rules.clone().unwrap_or_default())
                        .is_none(),
                    "{account:?} is matched by two schemas"
                );
            }
            for r in rule.resource_rules.iter().flatten() {
                let namespaces = r.namespaces.as_deref().unwrap_or_default();
                assert!(
                    r.cluster_scope == Some(true) || !namespaces.is_empty(),
                    "{name}: a rule without clusterScope or namespaces matches nothing"
                );
            }
        }
    }

    // Robots are cluster-scoped, as are the reviews and namespaces.
    let cluster_scoped = |group: &str, resource: &str| {
        let plural = resource.split('/').next().unwrap();
        typed("CustomResourceDefinition").any(|crd| {
            crd["spec"]["group"] == group
                && crd["spec"]["names"]["plural"] == plural
                && crd["spec"]["scope"] == "Cluster"
        }) || matches!(plural, "namespaces" | "subjectaccessreviews")
    };
    let matches = |r: &ResourcePolicyRule, group: &str, resource: &str, verb: &str, ns: Option<&str>| {
        let has = |list: &[String], x: &str| list.iter().any(|v| v == "*" || v == x);
        has(&r.verbs, verb)
            && has(&r.api_groups, group)
            && has(&r.resources, resource)
            && if cluster_scoped(group, resource) {
                r.cluster_scope == Some(true)
            } else {
                let namespaces = r.namespaces.as_deref().unwrap_or_default();
                match ns {
                    Some(ns) => has(namespaces, ns),
                    None => namespaces.iter().any(|n| n == "*"),
                }
            }
    };
    let writes = ["create", "update", "patch", "delete", "deletecollection"];
    // The server's SubjectAccessReviews are made for a person reading a
    // log: they stay on the built-in levels, out of the robots' queue.
    for (account, left_out) in [
        ("k8s4r-server", &["subjectaccessreviews"][..]),
        ("k8s4r-manager", &[]),
    ] {
        let key = ("k8s4r-system".to_owned(), account.to_owned());
        let rules = schema_of
            .get(&key)
            .unwrap_or_else(|| panic!("no FlowSchema matches {account}"));
        let grants = rbac_grants(&all, "k8s4r-system", account);
        assert!(!grants.is_empty(), "{account}: no RBAC found");
        for (group, resource, verb, ns) in grants {
            if !writes.contains(&verb.as_str()) || left_out.contains(&resource.as_str()) {
                continue;
            }
            assert!(
                rules
                    .iter()
                    .any(|r| matches(r, &group, &resource, &verb, ns.as_deref())),
                "{account} may {verb} {resource}.{group} in {}, but its FlowSchema does not match that",
                ns.as_deref().unwrap_or("every namespace")
            );
        }
    }
}

// kubectl runs synchronously: the API server needs a thread of its own.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn kubectl_applies_deploy_to_the_embedded_api_server() {
    let server = apiserver_lite::Config::for_tests().start().await.unwrap();
    let dir = tempfile::tempdir().unwrap();
    let kubeconfig = dir.path().join("kubeconfig");
    server.write_kubeconfig(&kubeconfig).unwrap();
    let deploy = deploy_dir();
    let deploy = deploy.to_str().unwrap();

    let applied = kubectl(&kubeconfig, &["apply", "--server-side", "-k", deploy]);
    for object in [
        "namespace/k8s4r-system",
        "customresourcedefinition.apiextensions.k8s.io/tasks.robot.k8s4r.io",
        "clusterrole.rbac.authorization.k8s.io/k8s4r-server",
        "rolebinding.rbac.authorization.k8s.io/k8s4r-manager-robot-leases",
        "deployment.apps/k8s4r-server",
        "deployment.apps/k8s4r-manager",
        "prioritylevelconfiguration.flowcontrol.apiserver.k8s.io/k8s4r-robot-traffic",
        "flowschema.flowcontrol.apiserver.k8s.io/k8s4r-server",
        "flowschema.flowcontrol.apiserver.k8s.io/k8s4r-manager",
    ] {
        assert!(
            applied.contains(&format!("{object} serverside-applied")),
            "{object}:\n{applied}"
        );
    }
    let deployments = kubectl(
        &kubeconfig,
        &[
            "get",
            "deployments",
            "-n",
            "k8s4r-system",
            "-o",
            "jsonpath={.items[*].spec.template.spec.containers[0].image}",
        ],
    );
    assert_eq!(deployments, "k8s4r:0.1.0 k8s4r:0.1.0");
    // Stored (not enforced), and listed with a real server's columns.
    let columns = |out: &str| -> Vec<Vec<String>> {
        out.lines()
            .map(|l| l.split_whitespace().map(str::to_owned).collect())
            .collect()
    };
    let levels = columns(&kubectl(&kubeconfig, &["get", "prioritylevelconfigurations"]));
    assert_eq!(
        levels[0],
        [
            "NAME",
            "TYPE",
            "NOMINALCONCURRENCYSHARES",
            "QUEUES",
            "HANDSIZE",
            "QUEUELENGTHLIMIT",
            "AGE"
        ]
    );
    assert!(
        levels
            .iter()
            .any(|l| l[..6] == ["k8s4r-robot-traffic", "Limited", "20", "64", "4", "50"]),
        "{levels:?}"
    );
    let schemas = columns(&kubectl(&kubeconfig, &["get", "flowschemas"]));
    assert_eq!(
        schemas[0],
        [
            "NAME",
            "PRIORITYLEVEL",
            "MATCHINGPRECEDENCE",
            "DISTINGUISHERMETHOD",
            "AGE"
        ]
    );
    assert!(
        schemas
            .iter()
            .any(|l| l[..4] == ["k8s4r-server", "k8s4r-robot-traffic", "1000", "ByNamespace"]),
        "{schemas:?}"
    );

    // Applying again succeeds too; the examples apply on top, strictly validated.
    kubectl(&kubeconfig, &["apply", "--server-side", "-k", deploy]);
    let examples = format!("{deploy}/examples");
    let applied = kubectl(
        &kubeconfig,
        &["apply", "--server-side", "--validate=strict", "-f", &examples],
    );
    assert!(
        applied.contains("job.robot.k8s4r.io/demo serverside-applied"),
        "{applied}"
    );
    server.shutdown().await.unwrap();
}

fn tls_options(id: &str, port: u16, ca: &[u8], login: Option<(&str, &str)>) -> MqttOptions {
    let mut options = MqttOptions::new(id, "127.0.0.1", port);
    options.set_transport(Transport::tls_with_config(TlsConfiguration::Simple {
        ca: ca.to_vec(),
        alpn: None,
        client_auth: None,
    }));
    options.set_keep_alive(Duration::from_secs(5));
    if let Some((user, password)) = login {
        options.set_credentials(user, password);
    }
    options
}

/// Connects; the broker's CONNACK refusal or the connection error otherwise.
async fn connect(options: MqttOptions) -> Result<(AsyncClient, EventLoop), ConnectionError> {
    let (client, mut events) = AsyncClient::new(options, 16);
    loop {
        match events.poll().await? {
            Event::Incoming(Packet::ConnAck(_)) => return Ok((client, events)),
            _ => continue,
        }
    }
}

/// Polls the event loop in the background, passing on (topic, payload) of
/// every message received, and ("SUBACK", "") for each acknowledged
/// subscription.
fn received(mut events: EventLoop) -> mpsc::UnboundedReceiver<(String, String)> {
    let (tx, rx) = mpsc::unbounded_channel();
    tokio::spawn(async move {
        while let Ok(event) = events.poll().await {
            let item = match event {
                Event::Incoming(Packet::Publish(p)) => {
                    (p.topic.clone(), String::from_utf8_lossy(&p.payload).into_owned())
                }
                Event::Incoming(Packet::SubAck(_)) => ("SUBACK".to_owned(), String::new()),
                _ => continue,
            };
            let _ = tx.send(item);
        }
    });
    rx
}

async fn next(rx: &mut mpsc::UnboundedReceiver<(String, String)>, what: &str) -> (String, String) {
    tokio::time::timeout(WAIT, rx.recv())
        .await
        .unwrap_or_else(|_| panic!("timed out waiting for {what}"))
        .expect("the client's event loop ended")
}

#[tokio::test]
async fn deployed_mosquitto_enforces_tls_passwords_and_the_per_robot_acl() {
    k8s4r_mqtt::install_crypto_provider();
    let broker = start_deployed_mosquitto(&[("k8s4r-server", "server-pw"), ("r1", "r1-pw"), ("r2", "r2-pw")]);
    let port = broker.port;
    let ca = std::fs::read(broker.dir().join("ca.pem")).unwrap();

    // No plain MQTT, no anonymous clients, no wrong passwords.
    let mut plain = MqttOptions::new("plain", "127.0.0.1", port);
    plain.set_credentials("r1", "r1-pw");
    assert!(
        connect(plain).await.is_err(),
        "plain MQTT was accepted on the TLS listener"
    );
    for (login, what) in [(None, "anonymous"), (Some(("r1", "r2-pw")), "a wrong password")] {
        match connect(tls_options("intruder", port, &ca, login)).await {
            Err(ConnectionError::ConnectionRefused(_)) => {}
            Err(other) => panic!(
                "{what}: expected a refused CONNACK, got {other}\n{}",
                broker.log()
            ),
            Ok(_) => panic!("{what} was let in"),
        }
    }

    let (server, server_events) = connect(tls_options(
        "k8s4r-server",
        port,
        &ca,
        Some(("k8s4r-server", "server-pw")),
    ))
    .await
    .unwrap_or_else(|e| panic!("the server user: {e}\n{}", broker.log()));
    let (r1, r1_events) = connect(tls_options("r1", port, &ca, Some(("r1", "r1-pw"))))
        .await
        .unwrap_or_else(|e| panic!("robot r1: {e}\n{}", broker.log()));
    let mut to_server = received(server_events);
    let mut to_r1 = received(r1_events);
    server.subscribe("k8s4r/#", QoS::AtLeastOnce).await.unwrap();
    // r1 asks for its own and r2's messages; the ACL lets it read only its
    // own downlink.
    r1.subscribe("k8s4r/robots/r1/#", QoS::AtLeastOnce).await.unwrap();
    r1.subscribe("k8s4r/robots/r2/#", QoS::AtLeastOnce).await.unwrap();
    assert_eq!(next(&mut to_server, "the server's SUBACK").await.0, "SUBACK");
    for _ in 0..2 {
        assert_eq!(next(&mut to_r1, "r1's SUBACKs").await.0, "SUBACK");
    }

    // Its uplink reaches the server.
    for topic in [
        "k8s4r/robots/r1/register",
        "k8s4r/robots/r1/heartbeat",
        "k8s4r/robots/r1/online",
        "k8s4r/robots/r1/tasks/u1/status",
        "k8s4r/robots/r1/tasks/u1/log",
        "k8s4r/robots/r1/sessions/s1/out",
        "k8s4r/robots/r1/outputs/ask",
    ] {
        r1.publish(topic, QoS::AtLeastOnce, false, "up").await.unwrap();
        assert_eq!(
            next(&mut to_server, topic).await,
            (topic.to_owned(), "up".to_owned())
        );
    }

    // The server may write to any robot; each robot reads only its own.
    server
        .publish(
            "k8s4r/robots/r2/tasks/dispatch",
            QoS::AtLeastOnce,
            false,
            "for r2",
        )
        .await
        .unwrap();
    server
        .publish(
            "k8s4r/robots/r1/tasks/dispatch",
            QoS::AtLeastOnce,
            false,
            "for r1",
        )
        .await
        .unwrap();
    let mut seen_by_server = Vec::new();
    for _ in 0..2 {
        seen_by_server.push(next(&mut to_server, "the dispatches").await.1);
    }
    assert_eq!(seen_by_server, ["for r2", "for r1"]);
    let (topic, body) = next(&mut to_r1, "r1's dispatch").await;
    assert_eq!(
        (topic.as_str(), body.as_str()),
        ("k8s4r/robots/r1/tasks/dispatch", "for r1"),
        "r1 read r2's dispatch, or its own uplink"
    );
    // Sessions likewise: r1 reads its own session's frames, not r2's.
    for robot in ["r2", "r1"] {
        let topic = format!("k8s4r/robots/{robot}/sessions/s1/in");
        server
            .publish(topic, QoS::AtLeastOnce, false, format!("session of {robot}"))
            .await
            .unwrap();
        next(&mut to_server, "the session frames").await;
    }
    let (topic, body) = next(&mut to_r1, "r1's session frame").await;
    assert_eq!(
        (topic.as_str(), body.as_str()),
        ("k8s4r/robots/r1/sessions/s1/in", "session of r1"),
        "r1 read r2's session"
    );
    // And outputs' answers.
    for robot in ["r2", "r1"] {
        let topic = format!("k8s4r/robots/{robot}/outputs/answer");
        server
            .publish(topic, QoS::AtLeastOnce, false, format!("answer for {robot}"))
            .await
            .unwrap();
        next(&mut to_server, "the answers").await;
    }
    let (topic, body) = next(&mut to_r1, "r1's answer").await;
    assert_eq!(
        (topic.as_str(), body.as_str()),
        ("k8s4r/robots/r1/outputs/answer", "answer for r1"),
        "r1 read r2's answer"
    );

    // A robot cannot speak for another, nor write its own commands (not
    // even retained ones): none of these arrives, while its own status,
    // sent after them, does.
    r1.publish(
        "k8s4r/robots/r2/tasks/u2/status",
        QoS::AtLeastOnce,
        false,
        "spoofed",
    )
    .await
    .unwrap();
    for topic in [
        "k8s4r/robots/r1/response",
        "k8s4r/robots/r1/tasks/dispatch",
        "k8s4r/robots/r1/tasks/cancel",
        "k8s4r/robots/r1/tasks/config",
        "k8s4r/robots/r1/tasks/acks",
        "k8s4r/robots/r1/logs/request",
        "k8s4r/robots/r1/sessions/s1/in",
        "k8s4r/robots/r2/sessions/s1/out",
        "k8s4r/robots/r1/outputs/answer",
        "k8s4r/robots/r2/outputs/ask",
    ] {
        r1.publish(topic, QoS::AtLeastOnce, true, "forged").await.unwrap();
    }
    r1.publish("k8s4r/robots/r1/tasks/u1/status", QoS::AtLeastOnce, false, "own")
        .await
        .unwrap();
    let (topic, body) = next(&mut to_server, "r1's status").await;
    assert_eq!(
        (topic.as_str(), body.as_str()),
        ("k8s4r/robots/r1/tasks/u1/status", "own"),
        "r1 wrote as r2, or wrote a command"
    );
    // Nothing it tried to retain is in the broker.
    let retained = retained_topics(port, &ca, "k8s4r/robots/r1/#").await;
    assert!(retained.is_empty(), "a robot retained a message: {retained:?}");
}

/// The topics under `filter` that hold a retained message, as a new
/// subscriber (the server's user) is sent them.
async fn retained_topics(port: u16, ca: &[u8], filter: &str) -> Vec<String> {
    let (fresh, fresh_events) = connect(tls_options(
        "fresh",
        port,
        ca,
        Some(("k8s4r-server", "server-pw")),
    ))
    .await
    .unwrap();
    let mut to_fresh = received(fresh_events);
    fresh.subscribe(filter, QoS::AtLeastOnce).await.unwrap();
    assert_eq!(next(&mut to_fresh, "the SUBACK").await.0, "SUBACK");
    let mut topics = Vec::new();
    while let Ok(Some((topic, _))) = tokio::time::timeout(Duration::from_secs(2), to_fresh.recv()).await {
        topics.push(topic);
    }
    topics
}

/// Retained commands left in the broker (by a robot before the ACL was
/// tightened, or by anyone with more rights) act on nobody: the agent
/// ignores retained messages on its command topics (a retained Online
/// answer and dispatch start nothing), and the server's sweep clears them.
#[tokio::test]
async fn retained_commands_are_ignored_by_the_agent_and_cleared_by_the_server() {
    use k8s4r_api::protocol::{encode, Dispatch, RegisterResponse};
    k8s4r_mqtt::install_crypto_provider();
    let broker = start_deployed_mosquitto(&[("k8s4r-server", "server-pw"), ("r1", "r1-pw")]);
    let port = broker.port;
    let ca_file = broker.dir().join("ca.pem");
    let ca = std::fs::read(&ca_file).unwrap();
    let work = tempfile::tempdir().unwrap();
    let marker = work.path().join("ran");
    std::fs::set_permissions(work.path(), std::os::unix::fs::PermissionsExt::from_mode(0o777)).unwrap();

    // What an attacker left: an Online answer and a dispatch, retained.
    let (attacker, attacker_events) = connect(tls_options(
        "leftover",
        port,
        &ca,
        Some(("k8s4r-server", "server-pw")),
    ))
    .await
    .unwrap();
    let _drive = received(attacker_events);
    let answer = RegisterResponse {
        server_time: Some(jiff::Timestamp::now()),
        status_acks: true,
        ..RegisterResponse::new(k8s4r_api::RobotPhase::Online, None)
    };
    let dispatch = Dispatch {
        expires_at: Some(jiff::Timestamp::now() + jiff::SignedDuration::from_hours(24)),
        ..Dispatch::new(
            "evil-uid",
            "default/evil",
            1,
            k8s4r_api::TaskTemplate {
                driver: "exec".into(),
                command: "/bin/sh".into(),
                args: vec!["-c".into(), format!("touch {}", marker.display())],
                ..Default::default()
            },
        )
    };
    attacker
        .publish(
            "k8s4r/robots/r1/response",
            QoS::AtLeastOnce,
            true,
            encode(&answer),
        )
        .await
        .unwrap();
    attacker
        .publish(
            "k8s4r/robots/r1/tasks/dispatch",
            QoS::AtLeastOnce,
            true,
            encode(&dispatch),
        )
        .await
        .unwrap();

    let state = work.path().join("state");
    let log = work.path().join("agent.log");
    let mut agent = k8s4r_testbed::Program::start(
        "r1",
        Path::new(env!("CARGO_BIN_EXE_e2e-agent")),
        [
            "--robot-id",
            "r1",
            "--broker-url",
            &format!("mqtts://127.0.0.1:{port}"),
            "--ca-file",
            &ca_file.display().to_string(),
            "--username",
            "r1",
            "--password",
            "r1-pw",
            "--state-dir",
            &state.display().to_string(),
            "--log",
            "info",
        ]
        .iter()
        .map(|s| (*s).to_owned())
        .collect(),
        &log,
    );
    // Either the agent says it ignored both, or the retained dispatch ran.
    k8s4r_testbed::eventually(WAIT, "the agent acting on both retained messages", || async {
        (marker.exists() || agent.log().matches("ignored a retained message").count() >= 2).then_some(())
    })
    .await;
    agent.stop();
    assert!(!marker.exists(), "the retained dispatch ran\n{}", agent.log());
    assert!(
        !agent.log().contains("registration approved"),
        "the retained answer approved the agent\n{}",
        agent.log()
    );

    // The server's sweep clears both.
    let mut config = k8s4r_server::BrokerConfig::new(format!("mqtts://127.0.0.1:{port}"), "k8s4r-server");
    config.ca_file = Some(ca_file.clone());
    config.username = Some("k8s4r-server".into());
    config.password = Some("server-pw".into());
    let mut swept = k8s4r_server::retained::sweep(&config, &k8s4r_api::protocol::Topics::default())
        .await
        .unwrap();
    swept.cleared.sort();
    assert_eq!(
        swept.cleared,
        ["k8s4r/robots/r1/response", "k8s4r/robots/r1/tasks/dispatch"]
    );
    // The same pass read the robots' presence: the agent stopped.
    assert!(swept.online.is_empty(), "{:?}", swept.online);
    // Only the agent's own retained presence is left.
    assert_eq!(
        retained_topics(port, &ca, "k8s4r/robots/r1/#").await,
        ["k8s4r/robots/r1/online"]
    );
}

/// The RBAC of deploy/cluster is enough for leader election too, which
/// `k8s4r up` (one replica of each program) never uses: the server and the
/// manager each take, renew and release their Lease with nothing but their
/// ServiceAccount's permissions.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn leader_election_works_under_the_deployed_rbac() {
    use apiserver_lite::User;
    use k8s_openapi::api::coordination::v1::Lease;
    use kube::Api;
    use tokio_util::sync::CancellationToken;

    k8s4r_mqtt::install_crypto_provider();
    // RUST_LOG=k8s4r_manager=debug,k8s4r_server=debug shows what they did.
    let _ = tracing_subscriber::fmt()
        .with_env_filter(tracing_subscriber::EnvFilter::from_default_env())
        .with_test_writer()
        .try_init();
    let server = apiserver_lite::Config::for_tests()
        .user(
            "server-token",
            User::service_account(k8s4r::up::SYSTEM_NAMESPACE, k8s4r::up::SERVER_ACCOUNT),
        )
        .user(
            "manager-token",
            User::service_account(k8s4r::up::SYSTEM_NAMESPACE, k8s4r::up::MANAGER_ACCOUNT),
        )
        .start()
        .await
        .unwrap();
    let admin = server.client().await.unwrap();
    k8s4r::up::install_crds(&admin).await.unwrap();
    k8s4r::up::apply_cluster_rbac(&admin).await.unwrap();
    let broker = Mosquitto::start();

    let stop = CancellationToken::new();
    let mut bridge = k8s4r_server::ServerConfig::new(broker.url());
    bridge.leader = Some(k8s4r_service::leader::LeaderConfig::new(
        k8s4r_server::leader::LEADER_LEASE,
        "server-a",
    ));
    bridge.identity = "server-a".to_owned();
    let bridge = tokio::spawn(k8s4r_server::run(
        bridge,
        server.client_with_token("server-token").await.unwrap(),
        stop.clone(),
    ));
    let mut controllers = k8s4r::up::manager_config();
    controllers.leader = Some(k8s4r_manager::LeaderConfig {
        lease_name: "k8s4r-manager".to_owned(),
        identity: "manager-a".to_owned(),
        lease_seconds: 15,
        renew_grace_seconds: 5,
    });
    let metrics = std::sync::Arc::new(k8s4r_manager::metrics::Metrics::default());
    let manager = tokio::spawn(k8s4r_manager::run_with_metrics(
        controllers,
        server.client_with_token("manager-token").await.unwrap(),
        metrics.clone(),
        stop.clone(),
    ));

    let holder = |namespace: &'static str, name: &'static str| {
        let leases: Api<Lease> = Api::namespaced(admin.clone(), namespace);
        async move {
            let lease = leases.get_opt(name).await.unwrap()?;
            lease.spec?.holder_identity
        }
    };
    let deadline = Duration::from_secs(30);
    k8s4r_testbed::eventually(deadline, "the server to lead", || async {
        (holder(k8s4r::up::LEASE_NAMESPACE, "k8s4r-server-leader")
            .await
            .as_deref()
            == Some("server-a"))
        .then_some(())
    })
    .await;
    k8s4r_testbed::eventually(deadline, "the manager to lead", || async {
        let leads = metrics.is_leader();
        (leads
            && holder(k8s4r::up::SYSTEM_NAMESPACE, "k8s4r-manager")
                .await
                .as_deref()
                == Some("manager-a"))
        .then_some(())
    })
    .await;

    // Stopping hands the Leases over at once (the server releases with an update).
    stop.cancel();
    bridge.await.unwrap().unwrap();
    manager.await.unwrap().unwrap();
    assert_eq!(
        holder(k8s4r::up::LEASE_NAMESPACE, "k8s4r-server-leader").await,
        None
    );
    let denied = server.denied();
    assert!(
        denied.is_empty(),
        "deploy/cluster's RBAC denied:\n{}",
        denied.join("\n")
    );
    server.shutdown().await.unwrap();
}

/// The broker refuses what the server and agents would refuse: Mosquitto's
/// packet limit is the protocol's, so an oversized message is stopped at the
/// broker (and the publisher disconnected) instead of reaching the server.
#[test]
fn the_brokers_packet_limit_is_the_protocols() {
    let conf = repo_file("deploy/mosquitto/mosquitto.conf");
    let limit: usize = conf
        .lines()
        .find_map(|l| l.trim().strip_prefix("max_packet_size "))
        .expect("deploy/mosquitto/mosquitto.conf sets max_packet_size")
        .trim()
        .parse()
        .unwrap();
    assert_eq!(limit, k8s4r_api::protocol::MAX_PACKET_BYTES);
}
