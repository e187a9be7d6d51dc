//! `k8s4r up`: the embedded API server, the MQTT broker, the server, the
//! manager and (optionally) a local agent, in one process.

use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

use anyhow::Context as _;
use k8s4r_api::{Job, Robot, RobotPhase, Task, TaskCounts};
use k8s_openapi::api::core::v1::Secret;
use kube::api::{ListParams, Patch, PatchParams, PostParams};
use kube::{Api, Client, ResourceExt};
use tokio::task::JoinSet;
use tokio_util::sync::CancellationToken;

use crate::error::UpError;
use crate::progress::Progress;

/// The cluster manifests whose namespaces, ServiceAccounts and RBAC `up`
/// applies, so that the server and the manager run here with exactly the
/// permissions they get in a cluster. deploy/cluster/50-flowcontrol.yaml
/// holds none of those: its API Priority and Fairness objects would be
/// stored here but not enforced, and listing them would suggest otherwise.
pub const CLUSTER_MANIFESTS: &[(&str, &str)] = &[
    (
        "deploy/cluster/00-namespaces.yaml",
        include_str!("../../deploy/cluster/00-namespaces.yaml"),
    ),
    (
        "deploy/cluster/10-server.yaml",
        include_str!("../../deploy/cluster/10-server.yaml"),
    ),
    (
        "deploy/cluster/20-manager.yaml",
        include_str!("../../deploy/cluster/20-manager.yaml"),
    ),
    (
        "deploy/cluster/30-logs.yaml",
        include_str!("../../deploy/cluster/30-logs.yaml"),
    ),
    (
        "deploy/cluster/40-people.yaml",
        include_str!("../../deploy/cluster/40-people.yaml"),
    ),
];
/// The ServiceAccounts of the server and the manager.
pub const SERVER_ACCOUNT: &str = "k8s4r-server";
/// See [`SERVER_ACCOUNT`].
pub const MANAGER_ACCOUNT: &str = "k8s4r-manager";
/// The Service the logs APIService names.
pub const LOGS_SERVICE: &str = "k8s4r-server-logs";
/// The demo job `--demo` submits.
pub const DEMO_JOB: &str = include_str!("../../deploy/examples/demo-job.yaml");
/// Field manager of what `up` writes itself.
const FIELD_MANAGER: &str = "k8s4r-up";
/// The namespace of the bootstrap-token Secret and the manager's Lease.
pub const SYSTEM_NAMESPACE: &str = k8s4r_api::names::DEFAULT_NAMESPACE;
/// The namespace of the robots' Leases.
pub const LEASE_NAMESPACE: &str = k8s4r_api::names::DEFAULT_ROBOT_LEASE_NAMESPACE;
/// The Secret holding bootstrap tokens.
pub const TOKEN_SECRET: &str = k8s4r_api::names::DEFAULT_BOOTSTRAP_SECRET;

/// Flags of `k8s4r up`.
#[derive(Debug, Clone, clap::Args)]
pub struct UpArgs {
    /// Address of the embedded Kubernetes API server (loopback by default;
    /// HTTPS with a self-signed certificate and a bearer token, both in the
    /// kubeconfig `up` writes).
    #[arg(long, env = "K8S4R_API_BIND", default_value = "127.0.0.1:6443")]
    pub api_bind: SocketAddr,
    /// Address of the embedded MQTT broker.
    #[arg(long, env = "K8S4R_MQTT_BIND", default_value = "127.0.0.1:1883")]
    pub mqtt_bind: SocketAddr,
    /// Use this broker instead of the embedded one (mqtt://host:port).
    #[arg(long, env = "K8S4R_BROKER_URL")]
    pub broker_url: Option<String>,
    /// Run an agent for this machine as a robot (default: on with --demo).
    #[arg(long, env = "K8S4R_LOCAL_AGENT", num_args = 0..=1, default_missing_value = "true")]
    pub local_agent: Option<bool>,
    /// The local agent's robot id (default: this host's name).
    #[arg(long, env = "K8S4R_ROBOT_ID")]
    pub robot_id: Option<String>,
    /// Labels of the local robot, as key=value (repeat or comma-separate).
    #[arg(long = "label", env = "K8S4R_ROBOT_LABELS", value_delimiter = ',')]
    pub labels: Vec<String>,
    /// Submit a demo Job once up, show its progress until it finishes, then
    /// keep running until Ctrl-C.
    #[arg(long, env = "K8S4R_DEMO")]
    pub demo: bool,
    /// Keep the API server's objects in memory only (nothing survives).
    #[arg(long, env = "K8S4R_IN_MEMORY")]
    pub in_memory: bool,
    /// Where to serve the dashboard (as `k8s4r dashboard --listen`).
    #[arg(long, env = "K8S4R_DASHBOARD_LISTEN", default_value = crate::dashboard::DEFAULT_LISTEN)]
    pub dashboard_listen: SocketAddr,
    /// Do not serve the dashboard.
    #[arg(long, env = "K8S4R_NO_DASHBOARD")]
    pub no_dashboard: bool,
    /// Silence after which an exec, port-forward or copy session ends on
    /// both sides (a robot cut off mid-session hangs its process up).
    #[arg(long, env = "K8S4R_SESSION_LEASE", default_value = "30s", value_parser = k8s4r_api::duration::parse_duration)]
    pub session_lease: std::time::Duration,
    /// Where the embedded object store for task outputs listens (an S3
    /// API; its files under the data directory's `outputs/`).
    #[arg(long, env = "K8S4R_STORE_LISTEN", default_value = DEFAULT_STORE_LISTEN)]
    pub store_listen: SocketAddr,
    /// The store's URL as robots reach it, when not `http://` and the
    /// listen address (a robot elsewhere on the network).
    #[arg(long, env = "K8S4R_STORE_URL")]
    pub store_url: Option<String>,
    /// Keep task outputs in this S3-compatible endpoint's bucket instead of
    /// the embedded store (with --outputs-credentials).
    #[arg(long, env = "K8S4R_OUTPUTS_ENDPOINT", requires = "outputs_credentials")]
    pub outputs_endpoint: Option<String>,
    /// With --outputs-endpoint: the bucket.
    #[arg(long, env = "K8S4R_OUTPUTS_BUCKET", default_value = STORE_BUCKET)]
    pub outputs_bucket: String,
    /// With --outputs-endpoint: the region signatures name.
    #[arg(long, env = "K8S4R_OUTPUTS_REGION", default_value = "us-east-1")]
    pub outputs_region: String,
    /// With --outputs-endpoint: a file of two lines, `accessKeyId=...` and
    /// `secretAccessKey=...` (read by the server alone; robots never see
    /// them).
    #[arg(long, env = "K8S4R_OUTPUTS_CREDENTIALS", value_name = "FILE")]
    pub outputs_credentials: Option<PathBuf>,
}

impl UpArgs {
    /// The flags as `k8s4r up` parses them (every other one its default;
    /// their environment variables apply too; a flag given twice takes the
    /// later value), for programs that start a stack in their own process
    /// (tests, benchmarks).
    pub fn from_flags(flags: &[&str]) -> Result<UpArgs, clap::Error> {
        #[derive(clap::Parser)]
        #[command(args_override_self = true)]
        struct Up {
            #[command(flatten)]
            args: UpArgs,
        }
        use clap::Parser as _;
        Up::try_parse_from(std::iter::once("up").chain(flags.iter().copied())).map(|u| u.args)
    }
}

/// Where the embedded object store listens unless told.
pub const DEFAULT_STORE_LISTEN: &str = "127.0.0.1:9878";
/// Its one bucket.
pub const STORE_BUCKET: &str = "k8s4r-outputs";

pub use crate::data_dir::kubeconfig_path;
use crate::secret::random_secret;

/// Runs `k8s4r up` until Ctrl-C or SIGTERM.
pub async fn run(args: UpArgs, data_dir: PathBuf) -> anyhow::Result<()> {
    let started = Instant::now();
    let shutdown = CancellationToken::new();
    spawn_signal_handler(shutdown.clone());
    let stack = Stack::start(&args, &data_dir, shutdown.clone()).await?;
    let kubeconfig = kubeconfig_path(&data_dir);
    println!("k8s4r is up ({:.2}s)", started.elapsed().as_secs_f64());
    println!(
        "  API server   {}  (kubeconfig {})",
        stack.api_url(),
        kubeconfig.display()
    );
    println!("  MQTT broker  {}", stack.broker_url);
    if !args.no_dashboard {
        let config = crate::dashboard::Config {
            client: stack.client.clone(),
            namespace: None,
            listen: args.dashboard_listen,
        };
        match crate::dashboard::serve(config, shutdown.clone()).await {
            Ok(served) => println!("  dashboard    {}", served.url),
            Err(e) => eprintln!("warning: no dashboard: {e:#} (--dashboard-listen chooses another address)"),
        }
    }
    if let Some(robot) = &stack.local_robot {
        println!("  local robot  {robot}");
    }
    println!("  export KUBECONFIG={}", kubeconfig.display());
    println!("Join another robot (here; from another machine: `k8s4r join-command --help`):");
    let recipe = crate::join::Recipe::new(&data_dir, &stack.broker_url, None);
    println!("  {}", recipe.command());
    if args.demo {
        tokio::select! {
            result = run_demo(stack.client.clone(), stack.local_robot.as_deref(), &kubeconfig) => result?,
            () = shutdown.cancelled() => {}
        }
    }
    if !shutdown.is_cancelled() {
        println!("Press Ctrl-C to stop.");
    }
    shutdown.cancelled().await;
    println!("stopping...");
    stack.stop().await
}

fn spawn_signal_handler(shutdown: CancellationToken) {
    tokio::spawn(async move {
        let mut term = match tokio::signal::unix::signal(tokio::signal::unix::SignalKind::terminate()) {
            Ok(s) => s,
            Err(e) => {
                tracing::error!(error = %e, "cannot listen for SIGTERM; Ctrl-C still works");
                let _ = tokio::signal::ctrl_c().await;
                shutdown.cancel();
                return;
            }
        };
        tokio::select! {
            _ = tokio::signal::ctrl_c() => {}
            _ = term.recv() => {}
        }
        shutdown.cancel();
    });
}

/// The running stack.
pub struct Stack {
    apiserver: apiserver_lite::RunningServer,
    /// A client of the embedded API server.
    pub client: Client,
    /// The MQTT broker the parts use.
    pub broker_url: String,
    /// The local agent's robot id, when one runs.
    pub local_robot: Option<String>,
    /// The embedded object store's bucket for task outputs (its secret
    /// is the server's; Debug leaves it out).
    pub bucket: k8s4r_server::bucket::BucketConfig,
    tasks: JoinSet<(&'static str, anyhow::Result<()>)>,
    shutdown: CancellationToken,
}

impl Stack {
    /// Starts every part and returns once the API server serves the CRDs,
    /// the broker accepts connections and the programs are running.
    pub async fn start(args: &UpArgs, data_dir: &Path, shutdown: CancellationToken) -> anyhow::Result<Stack> {
        Self::start_with(args, data_dir, shutdown, manager_config()).await
    }

    /// Like [`Stack::start`], with the given manager configuration (tests
    /// use it for short liveness timeouts); see [`manager_config`].
    pub async fn start_with(
        args: &UpArgs,
        data_dir: &Path,
        shutdown: CancellationToken,
        manager: k8s4r_manager::ManagerConfig,
    ) -> anyhow::Result<Stack> {
        std::fs::create_dir_all(data_dir).map_err(|source| UpError::Io {
            what: format!("create {}", data_dir.display()),
            source,
        })?;
        let token = load_or_create_secret(&data_dir.join("api-token"))?;
        // The server and the manager get tokens of their own, as their pods
        // would, and the RBAC of deploy/cluster decides what they may do.
        let server_token = random_secret()?;
        let manager_token = random_secret()?;
        let mut config = apiserver_lite::Config::default()
            .bind(args.api_bind)
            .token(token)
            .user(
                server_token.as_str(),
                apiserver_lite::User::service_account(SYSTEM_NAMESPACE, SERVER_ACCOUNT),
            )
            .user(
                manager_token.as_str(),
                apiserver_lite::User::service_account(SYSTEM_NAMESPACE, MANAGER_ACCOUNT),
            );
        config = if args.in_memory {
            config.in_memory()
        } else {
            config.data_dir(data_dir.join("apiserver"))
        };
        let apiserver = config.start().await?;
        apiserver.write_kubeconfig(&kubeconfig_path(data_dir))?;
        let client = apiserver.client().await?;
        install_crds(&client).await?;
        apply_cluster_rbac(&client).await?;
        let bootstrap_token = load_or_create_secret(&data_dir.join("bootstrap-token"))?;
        store_bootstrap_token(&client, &bootstrap_token).await?;

        let broker_url = match &args.broker_url {
            Some(url) => url.clone(),
            None => {
                let listen = args.mqtt_bind;
                tokio::task::spawn_blocking(move || crate::broker::start(listen)).await??;
                format!("mqtt://{listen}")
            }
        };
        let noted = crate::join::broker_url_path(data_dir);
        std::fs::write(&noted, &broker_url).map_err(|source| UpError::Io {
            what: format!("write {}", noted.display()),
            source,
        })?;

        let mut tasks = JoinSet::new();
        let programs = Clients {
            server: apiserver.client_with_token(&server_token).await?,
            manager: apiserver.client_with_token(&manager_token).await?,
        };
        let bucket = start_store(args, data_dir, shutdown.clone()).await?;
        let logs = spawn_programs(
            &mut tasks,
            programs,
            &broker_url,
            (manager, args.session_lease, bucket.clone()),
            shutdown.clone(),
        )?;
        start_webhook(&mut tasks, &client, shutdown.clone()).await?;
        register_logs_api(&apiserver, &client, logs).await?;
        let local_robot = if args.local_agent.unwrap_or(args.demo) {
            let robot = match &args.robot_id {
                Some(id) => id.clone(),
                None => local_robot_id(),
            };
            spawn_local_agent(
                &mut tasks,
                args,
                data_dir,
                &broker_url,
                &robot,
                &bootstrap_token,
                shutdown.clone(),
            )?;
            Some(robot)
        } else {
            None
        };
        Ok(Stack {
            apiserver,
            client,
            broker_url,
            local_robot,
            bucket,
            tasks,
            shutdown,
        })
    }

    /// A client for a user with only what RBAC gives `user` (its token is
    /// accepted from now on).
    pub async fn client_as(&self, user: &str, groups: &[&str]) -> anyhow::Result<Client> {
        let token = random_secret()?;
        self.apiserver.add_user(
            &token,
            apiserver_lite::User::new(user, groups.iter().map(|g| (*g).to_owned())),
        );
        Ok(self.apiserver.client_with_token(&token).await?)
    }

    /// The API server's URL.
    pub fn api_url(&self) -> String {
        self.apiserver.url()
    }

    /// The record of what the server and the manager were allowed and
    /// denied; it stays readable after [`Stack::stop`].
    pub fn authenticator(&self) -> std::sync::Arc<apiserver_lite::authz::Authenticator> {
        self.apiserver.authenticator()
    }

    /// Stops the programs (the agent first, so its tasks end and their
    /// statuses are sent), then the API server, flushing its database.
    pub async fn stop(mut self) -> anyhow::Result<()> {
        self.shutdown.cancel();
        let mut failures = Vec::new();
        while let Some(joined) = self.tasks.join_next().await {
            match joined {
                Ok((_, Ok(()))) => {}
                Ok((name, Err(e))) => failures.push(format!("{name}: {e:#}")),
                Err(e) => failures.push(format!("a part panicked: {e}")),
            }
        }
        self.apiserver.shutdown().await?;
        if failures.is_empty() {
            Ok(())
        } else {
            anyhow::bail!("stopped with errors: {}", failures.join("; "))
        }
    }
}

/// Reads a secret kept in the data dir, or makes one (so that a second `up`
/// keeps the same kubeconfig and bootstrap token).
fn load_or_create_secret(path: &Path) -> Result<String, UpError> {
    match std::fs::read_to_string(path) {
        Ok(s) if !s.trim().is_empty() => return Ok(s.trim().to_owned()),
        Ok(_) => {}
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => {}
        Err(source) => {
            return Err(UpError::Io {
                what: format!("read {}", path.display()),
                source,
            })
        }
    }
    let secret = random_secret()?;
    write_private(path, &secret)?;
    Ok(secret)
}

fn write_private(path: &Path, contents: &str) -> Result<(), UpError> {
    use std::io::Write as _;
    use std::os::unix::fs::OpenOptionsExt as _;
    let io = |source| UpError::Io {
        what: format!("write {}", path.display()),
        source,
    };
    let mut file = std::fs::OpenOptions::new()
        .write(true)
        .create(true)
        .truncate(true)
        .mode(0o600)
        .open(path)
        .map_err(io)?;
    // `mode` applies only to a file it creates: narrow one that was there
    // before the secret goes in.
    use std::os::unix::fs::PermissionsExt as _;
    file.set_permissions(std::fs::Permissions::from_mode(0o600))
        .map_err(io)?;
    file.write_all(contents.as_bytes()).map_err(io)
}

/// Applies the CRDs and waits until their kinds are served.
pub async fn install_crds(client: &Client) -> Result<(), UpError> {
    k8s4r_api::crd::apply(client, FIELD_MANAGER)
        .await
        .map_err(|e| UpError::Kube {
            what: format!("apply CRD {}", e.name),
            source: e.source,
        })?;
    let deadline = Instant::now() + Duration::from_secs(10);
    loop {
        let jobs: Api<Job> = Api::all(client.clone());
        match jobs.list(&ListParams::default().limit(1)).await {
            Ok(_) => return Ok(()),
            Err(e) if Instant::now() > deadline => {
                return Err(UpError::Kube {
                    what: "wait for the k8s4r kinds to be served".to_owned(),
                    source: e,
                })
            }
            Err(_) => tokio::time::sleep(Duration::from_millis(20)).await,
        }
    }
}

/// Applies the namespaces, ServiceAccounts, Roles, ClusterRoles and their
/// bindings of [`CLUSTER_MANIFESTS`] (the Deployments are for a cluster:
/// here the programs run in this process).
pub async fn apply_cluster_rbac(client: &Client) -> Result<(), UpError> {
    use kube::core::{ApiResource, DynamicObject, GroupVersionKind};
    const KINDS: &[(&str, &str, &str)] = &[
        ("v1", "Namespace", "namespaces"),
        ("v1", "ServiceAccount", "serviceaccounts"),
        ("rbac.authorization.k8s.io/v1", "Role", "roles"),
        ("rbac.authorization.k8s.io/v1", "ClusterRole", "clusterroles"),
        ("rbac.authorization.k8s.io/v1", "RoleBinding", "rolebindings"),
        (
            "rbac.authorization.k8s.io/v1",
            "ClusterRoleBinding",
            "clusterrolebindings",
        ),
    ];
    let params = PatchParams::apply(FIELD_MANAGER).force();
    for (file, text) in CLUSTER_MANIFESTS {
        for document in serde_yaml::Deserializer::from_str(text) {
            let object: DynamicObject = serde::Deserialize::deserialize(document)
                .map_err(|e| UpError::Other(format!("{file}: {e}")))?;
            let Some(types) = &object.types else { continue };
            let Some((api_version, kind, plural)) = KINDS
                .iter()
                .find(|(v, k, _)| *v == types.api_version && *k == types.kind)
            else {
                continue;
            };
            let (group, version) = api_version.rsplit_once('/').unwrap_or(("", api_version));
            let resource =
                ApiResource::from_gvk_with_plural(&GroupVersionKind::gvk(group, version, kind), plural);
            let name = object.name_any();
            let api: Api<DynamicObject> = match object.namespace() {
                Some(ns) => Api::namespaced_with(client.clone(), &ns, &resource),
                None => Api::all_with(client.clone(), &resource),
            };
            api.patch(&name, &params, &Patch::Apply(&object))
                .await
                .map_err(|source| UpError::Kube {
                    what: format!("apply {kind} {name} from {file}"),
                    source,
                })?;
        }
    }
    Ok(())
}

async fn store_bootstrap_token(client: &Client, bootstrap_token: &str) -> Result<(), UpError> {
    let secrets: Api<Secret> = Api::namespaced(client.clone(), SYSTEM_NAMESPACE);
    let secret: Secret = serde_json::from_value(serde_json::json!({
        "apiVersion": "v1", "kind": "Secret",
        "metadata": {"name": TOKEN_SECRET},
        "stringData": {(k8s4r_api::names::BOOTSTRAP_TOKEN_KEY): bootstrap_token}
    }))
    .map_err(|e| UpError::Other(e.to_string()))?;
    secrets
        .patch(
            TOKEN_SECRET,
            &PatchParams::apply(FIELD_MANAGER).force(),
            &Patch::Apply(&secret),
        )
        .await
        .map_err(|source| UpError::Kube {
            what: "store the bootstrap token".to_owned(),
            source,
        })?;
    Ok(())
}

/// Serves the manager's validating admission webhook on a loopback port,
/// with a certificate made for it, and registers it with the API server, so
/// that `kubectl apply` of a Job the controllers would refuse (a circle of
/// groups, a bad cron schedule) is refused at once with the reason.
async fn start_webhook(
    tasks: &mut JoinSet<(&'static str, anyhow::Result<()>)>,
    client: &Client,
    shutdown: CancellationToken,
) -> anyhow::Result<()> {
    use k8s4r_manager::webhook;
    use k8s_openapi::api::admissionregistration::v1::ValidatingWebhookConfiguration;
    let loopback = std::net::IpAddr::from([127, 0, 0, 1]);
    let tls = apiserver_lite::tls::load_or_generate(None, loopback).context("the webhook's certificate")?;
    let config = webhook::WebhookConfig {
        addr: SocketAddr::new(loopback, 0),
        cert_pem: tls.cert_pem.clone(),
        key_pem: tls.key_pem,
    };
    let (bound, serve) = webhook::bind(&config, shutdown)
        .await
        .context("serving the admission webhook")?;
    tasks.spawn(async move {
        serve.await;
        ("webhook", Ok(()))
    });
    let url = format!("https://{bound}{}", webhook::PATH);
    let vwc: ValidatingWebhookConfiguration =
        serde_json::from_value(webhook::configuration(&url, &tls.cert_pem))
            .context("the webhook's configuration")?;
    let api: Api<ValidatingWebhookConfiguration> = Api::all(client.clone());
    let name = vwc.name_any();
    api.patch(
        &name,
        &PatchParams::apply(FIELD_MANAGER).force(),
        &Patch::Apply(&vwc),
    )
    .await
    .map_err(|source| UpError::Kube {
        what: "register the admission webhook".to_owned(),
        source,
    })?;
    tracing::info!(%url, "admission webhook registered");
    Ok(())
}

/// This host's name, made into a valid robot id (`local` if it cannot be).
pub fn local_robot_id() -> String {
    let raw = std::fs::read_to_string("/proc/sys/kernel/hostname").unwrap_or_default();
    k8s4r_api::validation::robot_id_from_hostname(&raw).unwrap_or_else(|| "local".to_owned())
}

/// How long the demo waits for the local robot before submitting anyway.
const LOCAL_ROBOT_WAIT: Duration = Duration::from_secs(30);

/// Submits the demo job and shows its progress until it finishes. With a
/// local robot, it first waits until that robot is Online, so that the job's
/// first word is not "no robot".
pub async fn run_demo(client: Client, local_robot: Option<&str>, kubeconfig: &Path) -> anyhow::Result<()> {
    if let Some(robot) = local_robot {
        println!("waiting for robot {robot} to come Online...");
        let robots: Api<Robot> = Api::all(client.clone());
        let online = |r: Option<&Robot>| {
            r.and_then(|r| r.status.as_ref())
                .is_some_and(|s| s.phase == Some(RobotPhase::Online))
        };
        let waited = tokio::time::timeout(
            LOCAL_ROBOT_WAIT,
            kube::runtime::wait::await_condition(robots, robot, online),
        )
        .await;
        match waited {
            Ok(result) => {
                result.with_context(|| format!("watch robot {robot}"))?;
            }
            Err(_) => println!(
                "robot {robot} is not Online after {}s; submitting the demo job anyway",
                LOCAL_ROBOT_WAIT.as_secs()
            ),
        }
    }
    let job: Job = serde_yaml::from_str(DEMO_JOB).context("the built-in demo job")?;
    let namespace = job.namespace().unwrap_or_else(|| "default".to_owned());
    let name = job.name_any();
    let jobs: Api<Job> = Api::namespaced(client.clone(), &namespace);
    // A demo from an earlier `up` is replaced, so that every run shows a fresh job.
    if jobs.get_opt(&name).await?.is_some() {
        jobs.delete(&name, &Default::default()).await?;
        let deadline = Instant::now() + Duration::from_secs(30);
        while jobs.get_opt(&name).await?.is_some() {
            anyhow::ensure!(
                Instant::now() < deadline,
                "the previous demo job {name} is still being deleted"
            );
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
    }
    jobs.create(&PostParams::default(), &job)
        .await
        .context("submit the demo job")?;
    println!("submitted job {namespace}/{name}");
    let tasks: Api<Task> = Api::namespaced(client.clone(), &namespace);
    let selector = format!("{}={name}", k8s4r_api::names::LABEL_JOB);
    let mut progress = Progress::default();
    let finished = loop {
        let job = jobs.get(&name).await?;
        let mut counts = TaskCounts::default();
        for task in tasks.list(&ListParams::default().labels(&selector)).await? {
            counts.add(task.status.as_ref().and_then(|s| s.state));
        }
        let state = job.status.as_ref().and_then(|s| s.state);
        progress.show(&name, state, &counts);
        if state.is_some_and(|s| s.is_finished()) {
            break state;
        }
        tokio::time::sleep(Duration::from_millis(250)).await;
    };
    progress.finish();
    println!(
        "job {namespace}/{name} {}",
        if finished == Some(k8s4r_api::WorkState::Completed) {
            "completed"
        } else {
            "failed"
        }
    );
    println!("Look further with kubectl (in another shell):");
    println!("  export KUBECONFIG={}", kubeconfig.display());
    println!("  kubectl get k8s4r");
    println!("  kubectl get robots");
    println!("  kubectl get rjob,rtg,rtask -n {namespace}");
    println!("  kubectl get rtask -n {namespace} -l {selector} -o custom-columns=NAME:.metadata.name,OUTPUT:.status.outputTail");
    println!("  kubectl describe rjob {name} -n {namespace}");
    Ok(())
}

/// Serves the embedded object store for task outputs (s3s-fs, under
/// `DATA_DIR/outputs`) with a key made for this run, which only the server
/// holds; the bucket the server presigns uploads for.
async fn start_store(
    args: &UpArgs,
    data_dir: &Path,
    shutdown: CancellationToken,
) -> anyhow::Result<k8s4r_server::bucket::BucketConfig> {
    if let Some(endpoint) = &args.outputs_endpoint {
        let file = args
            .outputs_credentials
            .as_deref()
            .context("--outputs-endpoint needs --outputs-credentials")?;
        let (access_key, secret_key) = read_credentials(file)?;
        tracing::info!(%endpoint, bucket = %args.outputs_bucket, "task outputs go to this bucket");
        return Ok(k8s4r_server::bucket::BucketConfig {
            endpoint: endpoint.clone(),
            bucket: args.outputs_bucket.clone(),
            region: args.outputs_region.clone(),
            access_key,
            secret_key,
        });
    }
    let secret_key = random_secret()?;
    let access_key = "k8s4r-up".to_owned();
    let served = k8s4r_store::serve(
        k8s4r_store::StoreConfig {
            root: data_dir.join("outputs"),
            listen: args.store_listen,
            bucket: STORE_BUCKET.to_owned(),
            access_key: access_key.clone(),
            secret_key: secret_key.clone(),
        },
        shutdown,
    )
    .await?;
    let endpoint = args.store_url.clone().unwrap_or(served.endpoint);
    tracing::info!(%endpoint, bucket = STORE_BUCKET, "the object store for task outputs is serving");
    Ok(k8s4r_server::bucket::BucketConfig {
        endpoint,
        bucket: STORE_BUCKET.to_owned(),
        region: "us-east-1".to_owned(),
        access_key,
        secret_key,
    })
}

/// The access key id and secret of `--outputs-credentials`.
fn read_credentials(file: &Path) -> anyhow::Result<(String, String)> {
    let text = std::fs::read_to_string(file).with_context(|| format!("cannot read {}", file.display()))?;
    let value = |key: &str| {
        text.lines()
            .filter_map(|l| l.trim().split_once('='))
            .find(|(k, _)| k.trim() == key)
            .map(|(_, v)| v.trim().to_owned())
            .filter(|v| !v.is_empty())
            .with_context(|| format!("{} has no {key}=... line", file.display()))
    };
    Ok((value("accessKeyId")?, value("secretAccessKey")?))
}

/// The server's and the manager's clients, each with its own token.
struct Clients {
    server: Client,
    manager: Client,
}

/// Where the server's logs API listens, once it does, and the CA of its
/// certificate.
struct LogsApi {
    bound: tokio::sync::oneshot::Receiver<SocketAddr>,
    ca_pem: String,
}

/// Starts the server and the manager on the embedded API server.
fn spawn_programs(
    tasks: &mut JoinSet<(&'static str, anyhow::Result<()>)>,
    clients: Clients,
    broker_url: &str,
    (manager, session_lease, bucket): (
        k8s4r_manager::ManagerConfig,
        std::time::Duration,
        k8s4r_server::bucket::BucketConfig,
    ),
    shutdown: CancellationToken,
) -> anyhow::Result<LogsApi> {
    let mut server = k8s4r_server::ServerConfig::new(broker_url);
    server.outputs = Some(bucket);
    let (cert_pem, key_pem) = k8s4r_server::logs::self_signed(&[]).map_err(|e| anyhow::anyhow!(e))?;
    server.logs = Some(k8s4r_server::logs::LogsConfig {
        addr: SocketAddr::from(([127, 0, 0, 1], 0)),
        cert_pem: cert_pem.clone(),
        key_pem,
        session_lease,
    });
    server.lease_namespace = LEASE_NAMESPACE.to_owned();
    // A lab fleet is small: renewing Leases every 10 s (idle or not) costs
    // nothing, and the manager's fencing (which allows for the renewal
    // interval) moves a lost robot's work about 50 s sooner than with the
    // cluster default; a robot silent on a live connection is Offline after
    // the manager's 5 minutes, not an idle Lease's 30.
    server.coalescing.lease_interval = LEASE_INTERVAL;
    server.coalescing.idle_lease_interval = LEASE_INTERVAL;
    server.coalescing.idle_status_refresh = server.coalescing.status_refresh;
    let server_client = clients.server;
    let server_stop = shutdown.clone();
    let mut program = k8s4r_server::Server::new(server, server_client);
    let bound = program.logs_addr();
    tasks.spawn(async move {
        let result = program.run(server_stop).await;
        ("server", result.map_err(anyhow::Error::from))
    });

    let manager_client = clients.manager;
    tasks.spawn(async move {
        let result = k8s4r_manager::run(manager, manager_client, shutdown).await;
        ("manager", result.map_err(anyhow::Error::from))
    });
    Ok(LogsApi {
        bound,
        ca_pem: cert_pem,
    })
}

/// Registers the server's logs API with the embedded API server (an
/// APIService, and where its service listens), as a cluster's
/// deploy/cluster/30-logs.yaml does.
async fn register_logs_api(
    apiserver: &apiserver_lite::RunningServer,
    client: &Client,
    logs: LogsApi,
) -> anyhow::Result<()> {
    use k8s_openapi::kube_aggregator::pkg::apis::apiregistration::v1::APIService;
    let addr = match tokio::time::timeout(Duration::from_secs(30), logs.bound).await {
        Ok(Ok(addr)) => addr,
        _ => {
            tracing::warn!("the server's logs API did not start: `k8s4r logs` will not work");
            return Ok(());
        }
    };
    apiserver.set_service_endpoint(SYSTEM_NAMESPACE, LOGS_SERVICE, addr);
    let service: APIService = serde_json::from_value(serde_json::json!({
        "apiVersion": "apiregistration.k8s.io/v1",
        "kind": "APIService",
        "metadata": {"name": "v1alpha1.logs.k8s4r.io"},
        "spec": {
            "group": "logs.k8s4r.io",
            "version": "v1alpha1",
            "groupPriorityMinimum": 1000,
            "versionPriority": 15,
            "caBundle": base64_encode(logs.ca_pem.as_bytes()),
            "service": {"name": LOGS_SERVICE, "namespace": SYSTEM_NAMESPACE, "port": 443},
        },
    }))?;
    let api: Api<APIService> = Api::all(client.clone());
    api.patch(
        "v1alpha1.logs.k8s4r.io",
        &PatchParams::apply(FIELD_MANAGER).force(),
        &Patch::Apply(&service),
    )
    .await
    .map_err(|source| UpError::Kube {
        what: "register the logs API".to_owned(),
        source,
    })?;
    Ok(())
}

fn base64_encode(bytes: &[u8]) -> String {
    use k8s_openapi::ByteString;
    serde_json::to_value(ByteString(bytes.to_vec()))
        .ok()
        .and_then(|v| v.as_str().map(str::to_owned))
        .unwrap_or_default()
}

/// How often the server of `k8s4r up` renews robots' Leases, idle or not;
/// its manager reads no Lease as renewed more often.
const LEASE_INTERVAL: std::time::Duration = std::time::Duration::from_secs(10);

/// The manager configuration `k8s4r up` runs with.
pub fn manager_config() -> k8s4r_manager::ManagerConfig {
    k8s4r_manager::ManagerConfig {
        lifecycle: k8s4r_manager::lifecycle::LifecycleConfig {
            lease_interval: LEASE_INTERVAL,
            ..Default::default()
        },
        namespace: SYSTEM_NAMESPACE.to_owned(),
        robot_lease_namespace: LEASE_NAMESPACE.to_owned(),
        bootstrap_secret: TOKEN_SECRET.to_owned(),
        // A lab machine has one manager: no election to wait for.
        leader: None,
        ..Default::default()
    }
}

/// Starts an agent for this machine, with its state under the data dir.
fn spawn_local_agent(
    tasks: &mut JoinSet<(&'static str, anyhow::Result<()>)>,
    args: &UpArgs,
    data_dir: &Path,
    broker_url: &str,
    robot: &str,
    bootstrap_token: &str,
    shutdown: CancellationToken,
) -> anyhow::Result<()> {
    let settings = k8s4r_agent::config::Settings {
        robot_id: Some(robot.to_owned()),
        token: Some(bootstrap_token.to_owned()),
        broker_url: Some(broker_url.to_owned()),
        state_dir: Some(data_dir.join("agent")),
        labels: args.labels.clone(),
        // This machine's own agent also offers raw_exec (tasks as whoever
        // runs `k8s4r up`, root included), the way a lab expects; the
        // examples use exec, which every agent offers. A robot's agent
        // keeps both off unless its configuration turns them on.
        raw_exec: Some(true),
        allow_root: Some(true),
        ..Default::default()
    };
    let mut config = k8s4r_agent::config::Config::resolve(settings).context("the local agent's settings")?;
    // The `k8s4r` binary serves as its tasks' shim and logger, as the
    // agent's does: tasks outlive a crash of `k8s4r up` and are re-adopted
    // by the next, their output is written as it comes, with the time
    // index `k8s4r logs --since` reads. (A stop of `k8s4r up` stops them.)
    config.supervisor.shim_program = k8s4r_agent::cli::own_binary_as_helpers();
    let (_handle, task) = k8s4r_agent::agent::start(&config, shutdown)?;
    tasks.spawn(async move {
        let result = task
            .await
            .map_err(|e| anyhow::anyhow!("the local agent panicked: {e}"));
        ("agent", result)
    });
    Ok(())
}
