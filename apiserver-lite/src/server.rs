//! Starting and stopping the server: configuration, storage, the HTTP
//! listener, the garbage collector, and what a client needs to connect.

use std::collections::HashMap;
use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::Duration;

use serde_json::json;
use tokio::task::JoinHandle;
use tokio_util::sync::CancellationToken;

use crate::aggregator::{Endpoints, FrontProxy, AUTHENTICATION_CONFIGMAP};
use crate::authz::{Authenticator, Identity, User};
use crate::error::{Error, Result};
use crate::event_ttl::expire_events;
use crate::gc;
use crate::http::{self, App};
use crate::limits::{self, Limiter, Limits};
use crate::ops::{self, FieldValidation, WriteOpts};
use crate::persist::{self, Persistence};
use crate::service_account_tokens::Signer;
use crate::store::Store;

/// The file the server keeps its objects in, inside the data directory.
pub const DATA_FILE: &str = "apiserver.redb";

/// How to run the server; `Config::default()` binds 127.0.0.1:6443 in memory.
#[derive(Debug, Clone)]
pub struct Config {
    pub bind: SocketAddr,
    /// Where the redb file lives; `None` keeps everything in memory only.
    pub data_dir: Option<PathBuf>,
    /// The administrator's bearer token (may do everything); generated
    /// when `None`.
    pub token: Option<String>,
    /// More bearer tokens, each for a user whose requests RBAC decides.
    pub users: HashMap<String, User>,
    pub max_body_bytes: usize,
    /// How many events are kept for watches to resume from.
    pub history: usize,
    pub bookmark_interval: Duration,
    /// How long an Event is kept after it last happened (kube-apiserver's
    /// `--event-ttl`).
    pub event_ttl: Duration,
    /// Serve HTTPS with a self-signed certificate (kept in the data
    /// directory). kubectl only sends the token over TLS; plain HTTP is for
    /// kube-rs-only setups.
    pub tls: bool,
    /// In-flight, watch and connection limits.
    pub limits: Limits,
}

impl Default for Config {
    fn default() -> Self {
        Config {
            bind: SocketAddr::from(([127, 0, 0, 1], 6443)),
            data_dir: None,
            token: None,
            users: HashMap::new(),
            // The real API server's limit.
            max_body_bytes: 3 * 1024 * 1024,
            history: 50_000,
            bookmark_interval: Duration::from_secs(5),
            event_ttl: Duration::from_secs(60 * 60),
            tls: true,
            limits: Limits::default(),
        }
    }
}

impl Config {
    /// In memory, on a free loopback port: what tests want.
    pub fn for_tests() -> Self {
        Config {
            bind: SocketAddr::from(([127, 0, 0, 1], 0)),
            ..Config::default()
        }
    }

    pub fn bind(mut self, addr: SocketAddr) -> Self {
        self.bind = addr;
        self
    }

    pub fn data_dir(mut self, dir: impl Into<PathBuf>) -> Self {
        self.data_dir = Some(dir.into());
        self
    }

    pub fn in_memory(mut self) -> Self {
        self.data_dir = None;
        self
    }

    /// Accepts `token` for `user`, whose requests the stored RBAC
    /// objects authorize.
    pub fn user(mut self, token: impl Into<String>, user: User) -> Self {
        self.users.insert(token.into(), user);
        self
    }

    pub fn token(mut self, token: impl Into<String>) -> Self {
        self.token = Some(token.into());
        self
    }

    pub fn max_body_bytes(mut self, n: usize) -> Self {
        self.max_body_bytes = n;
        self
    }

    pub fn history(mut self, events: usize) -> Self {
        self.history = events;
        self
    }

    pub fn bookmark_interval(mut self, every: Duration) -> Self {
        self.bookmark_interval = every;
        self
    }

    pub fn event_ttl(mut self, ttl: Duration) -> Self {
        self.event_ttl = ttl;
        self
    }

    pub fn tls(mut self, on: bool) -> Self {
        self.tls = on;
        self
    }

    pub fn limits(mut self, limits: Limits) -> Self {
        self.limits = limits;
        self
    }

    pub async fn start(self) -> Result<RunningServer> {
        start(self).await
    }
}

/// A server that is serving; dropping it without `shutdown` aborts it.
pub struct RunningServer {
    addr: SocketAddr,
    token: String,
    ca_pem: Option<String>,
    store: Arc<Store>,
    auth: Arc<Authenticator>,
    limiter: Arc<Limiter>,
    endpoints: Arc<Endpoints>,
    cancel: CancellationToken,
    serve: Option<JoinHandle<std::io::Result<()>>>,
    persist: Option<JoinHandle<()>>,
    gc: Option<JoinHandle<()>>,
}

fn generate_token() -> String {
    format!(
        "{}{}",
        uuid::Uuid::new_v4().simple(),
        uuid::Uuid::new_v4().simple()
    )
}

/// Starts serving: loads storage, ensures the standard namespaces, binds.
pub async fn start(config: Config) -> Result<RunningServer> {
    let store = Arc::new(Store::new(config.history));
    let mut persist_task = None;
    if let Some(dir) = &config.data_dir {
        let path = dir.join(DATA_FILE);
        let (db, loaded) = tokio::task::spawn_blocking({
            let path = path.clone();
            move || Persistence::open(&path)
        })
        .await
        .map_err(|e| Error::Storage {
            path: path.display().to_string(),
            message: e.to_string(),
        })??;
        store.load(loaded.rv, loaded.objects);
        let (tx, rx) = tokio::sync::mpsc::unbounded_channel();
        store.set_persist(Some(tx));
        persist_task = Some(tokio::spawn(db.run(rx, store.clone())));
        let moved = store
            .write(|txn| Ok::<_, ()>(persist::migrate_core_events(txn)))
            .unwrap_or(0);
        if moved > 0 {
            tracing::info!(moved, "core/v1 Events moved to the storage both Event APIs share");
        }
    }
    ensure_namespaces(&store);
    crate::default_roles::reconcile_at_start(&store).map_err(|e| {
        Error::Io(std::io::Error::other(format!(
            "cannot make the default ClusterRoles: {}",
            e.message
        )))
    })?;
    let token = config.token.clone().unwrap_or_else(generate_token);
    let listener = tokio::net::TcpListener::bind(config.bind)
        .await
        .map_err(|source| Error::Bind {
            addr: config.bind,
            source,
        })?;
    let addr = listener.local_addr()?;
    let cancel = CancellationToken::new();
    let tls = if config.tls {
        let dir = config.data_dir.clone();
        let ip = config.bind.ip();
        let material = tokio::task::spawn_blocking(move || crate::tls::load_or_generate(dir.as_deref(), ip))
            .await
            .map_err(|e| Error::Tls(e.to_string()))??;
        Some((crate::tls::acceptor(&material)?, material.cert_pem))
    } else {
        None
    };
    let signer = {
        let dir = config.data_dir.clone();
        tokio::task::spawn_blocking(move || Signer::load_or_generate(dir.as_deref()))
            .await
            .map_err(|e| Error::Io(std::io::Error::other(e)))??
    };
    let auth = Arc::new(Authenticator::new(token.clone(), config.users.clone(), signer));
    let limiter = Arc::new(Limiter::new(config.limits.clone()));
    let front = tokio::task::spawn_blocking(FrontProxy::generate)
        .await
        .map_err(|e| Error::Tls(e.to_string()))?
        .map_err(Error::Tls)?;
    publish_front_proxy_ca(&store, &front);
    let endpoints = Arc::new(Endpoints::default());
    let app = App {
        store: store.clone(),
        auth: auth.clone(),
        max_body: config.max_body_bytes,
        bookmark_interval: config.bookmark_interval,
        shutdown: cancel.clone(),
        limiter: limiter.clone(),
        front: Arc::new(front),
        endpoints: endpoints.clone(),
        lists: Arc::default(),
    };
    let router = http::router(app);
    let (acceptor, ca_pem) = tls.unzip();
    let serve = tokio::spawn(limits::serve(
        listener,
        acceptor,
        router,
        limiter.clone(),
        cancel.clone(),
    ));
    let gc = tokio::spawn(collector(store.clone(), config.event_ttl, cancel.clone()));
    tracing::info!(%addr, persistent = config.data_dir.is_some(), "apiserver-lite serving");
    Ok(RunningServer {
        addr,
        token,
        ca_pem,
        store,
        auth,
        limiter,
        endpoints,
        cancel,
        serve: Some(serve),
        persist: persist_task,
        gc: Some(gc),
    })
}

/// Writes (or renews) the ConfigMap backends of aggregated APIs read the
/// front proxy's CA from: it changes every start.
fn publish_front_proxy_ca(store: &Store, front: &FrontProxy) {
    let opts = WriteOpts {
        manager: "apiserver-lite".into(),
        dry_run: false,
        field_validation: FieldValidation::Ignore,
        identity: Identity::Admin,
    };
    let result = store.write(|txn| {
        let rt = txn
            .state
            .registry
            .get("", "v1", "configmaps")
            .expect("configmaps are built in");
        let obj = front.configmap();
        match txn
            .state
            .get("configmaps", "kube-system", AUTHENTICATION_CONFIGMAP)
        {
            None => ops::create(txn, &rt, "kube-system", obj, &opts, None).map(drop),
            Some(old) => {
                let mut new = obj;
                new["metadata"]["resourceVersion"] = old["metadata"]["resourceVersion"].clone();
                ops::commit_update(txn, &rt, &old, new, false, &opts, ops::Precondition::Put, false).map(drop)
            }
        }
    });
    if let Err(e) = result {
        tracing::warn!(error = %e.message, "cannot publish the front proxy's CA; aggregated APIs will refuse its requests");
    }
}

fn ensure_namespaces(store: &Store) {
    let opts = WriteOpts {
        manager: "apiserver-lite".into(),
        dry_run: false,
        field_validation: FieldValidation::Ignore,
        identity: Identity::Admin,
    };
    let _ = store.write(|txn| {
        let rt = txn
            .state
            .registry
            .get("", "v1", "namespaces")
            .expect("namespaces are built in");
        for ns in ["default", "kube-system", "kube-public", "kube-node-lease"] {
            if txn.state.get("namespaces", "", ns).is_none() {
                let obj = json!({"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": ns}});
                ops::create(txn, &rt, "", obj, &opts, None)?;
            }
        }
        Ok::<_, crate::error::ApiError>(())
    });
}

/// The garbage collector: after each write that may leave garbage (see
/// [`crate::store::Txn::garbage_possible`]) and every [`GC_INTERVAL`],
/// deletes dependents whose owners are gone and carries out orphan and
/// foreground deletions. Now and then it also drops Events older than
/// `event_ttl`. A pass reads every object (a second of CPU at 100,000
/// robots), so it runs on the blocking pool: on an async worker it held up
/// the requests queued behind it on that worker, every write waiting up to
/// a second.
async fn collector(store: Arc<Store>, event_ttl: Duration, cancel: CancellationToken) {
    let mut tick = tokio::time::interval(GC_INTERVAL);
    // Expiry scans every Event, so it runs less often than the collector;
    // an Event outlives its TTL by at most this much.
    let mut expiry = tokio::time::interval(EVENT_EXPIRY_INTERVAL.min(event_ttl).max(Duration::from_secs(1)));
    loop {
        tokio::select! {
            _ = store.gc.notified() => {}
            _ = tick.tick() => {}
            _ = expiry.tick() => {
                let store = store.clone();
                let now = jiff::Timestamp::now();
                let expired = tokio::task::spawn_blocking(move || expire_events(&store, now, event_ttl))
                    .await
                    .unwrap_or(0);
                if expired > 0 {
                    tracing::debug!(expired, "events past their TTL deleted");
                }
                continue;
            }
            _ = cancel.cancelled() => return,
        }
        // A pass can make more garbage (a foreground deletion's dependents).
        let store = store.clone();
        let passes = tokio::task::spawn_blocking(move || {
            for _ in 0..16 {
                if !gc::collect_garbage_in(&store) {
                    break;
                }
            }
        });
        if let Err(e) = passes.await {
            tracing::error!(error = %e, "a garbage collection pass failed");
        }
    }
}

/// How often the collector looks without being asked: every write that
/// may leave garbage asks at once, so this is a backstop.
const GC_INTERVAL: Duration = Duration::from_secs(30);

/// How often Events past their TTL are looked for.
const EVENT_EXPIRY_INTERVAL: Duration = Duration::from_secs(30);

impl RunningServer {
    pub fn addr(&self) -> SocketAddr {
        self.addr
    }

    /// Accepts `token` as `user` from now on (tests: a person with only
    /// the permissions RBAC gives them).
    pub fn add_user(&self, token: &str, user: User) {
        self.auth.add_user(token, user);
    }

    /// Says that the service `namespace/name` (as an APIService names its
    /// backend) listens on `addr`: there is no cluster DNS to ask.
    pub fn set_service_endpoint(&self, namespace: &str, name: &str, addr: SocketAddr) {
        self.endpoints.set(namespace, name, addr);
    }

    pub fn token(&self) -> &str {
        &self.token
    }

    /// The URL clients use: loopback when bound to all addresses.
    pub fn url(&self) -> String {
        let mut addr = self.addr;
        if addr.ip().is_unspecified() {
            addr.set_ip(std::net::Ipv4Addr::LOCALHOST.into());
        }
        let scheme = if self.ca_pem.is_some() { "https" } else { "http" };
        format!("{scheme}://{addr}")
    }

    /// The server's certificate (PEM), which clients trust as their CA; `None` without TLS.
    pub fn ca_pem(&self) -> Option<&str> {
        self.ca_pem.as_deref()
    }

    /// The number of stored objects (all kinds).
    pub fn object_count(&self) -> usize {
        self.store.read(|s| s.count())
    }

    /// A kubeconfig for kubectl and kube-rs: the URL, the CA and the bearer token.
    pub fn kubeconfig_yaml(&self) -> String {
        kubeconfig_yaml(&self.url(), &self.token, self.ca_pem.as_deref())
    }

    pub fn write_kubeconfig(&self, path: &Path) -> Result<()> {
        write_kubeconfig(path, &self.kubeconfig_yaml())
    }

    pub async fn client(&self) -> Result<kube::Client> {
        self.client_with_token(&self.token).await
    }

    /// A client presenting `token` (one of [`Config::user`]'s).
    pub async fn client_with_token(&self, token: &str) -> Result<kube::Client> {
        client_for(&kubeconfig_yaml(&self.url(), token, self.ca_pem.as_deref())).await
    }

    /// What the users of [`Config::user`] were allowed to do, one line per
    /// distinct `user verb group/resource[/subresource] namespace`.
    pub fn used(&self) -> std::collections::BTreeSet<String> {
        self.auth.used()
    }

    /// The tokens' users and the record of what they did, which outlives
    /// the server (to check what was denied while it shut down).
    pub fn authenticator(&self) -> Arc<Authenticator> {
        self.auth.clone()
    }

    /// What the in-flight, watch and connection limits hold now, and how
    /// many requests and connections they have turned away.
    pub fn usage(&self) -> limits::Usage {
        self.limiter.usage()
    }

    /// The messages of the last requests RBAC denied, oldest first.
    pub fn denied(&self) -> Vec<String> {
        self.auth.denied()
    }

    /// Stops serving, ends watches and waits for storage to be flushed.
    pub async fn shutdown(mut self) -> Result<()> {
        self.cancel.cancel();
        if let Some(serve) = self.serve.take() {
            // Connections still open after a grace period are dropped.
            match tokio::time::timeout(Duration::from_secs(5), serve).await {
                Ok(Ok(Err(e))) => return Err(Error::Io(e)),
                Ok(_) => {}
                Err(_) => tracing::warn!("connections still open at shutdown"),
            }
        }
        if let Some(gc) = self.gc.take() {
            let _ = gc.await;
        }
        self.store.set_persist(None);
        if let Some(p) = self.persist.take() {
            let _ = p.await;
        }
        Ok(())
    }
}

impl Drop for RunningServer {
    fn drop(&mut self) {
        self.cancel.cancel();
    }
}

pub fn kubeconfig_yaml(server: &str, token: &str, ca_pem: Option<&str>) -> String {
    use base64::Engine;
    let ca = match ca_pem {
        Some(pem) => format!(
            "\n    certificate-authority-data: {}",
            base64::engine::general_purpose::STANDARD.encode(pem)
        ),
        None => String::new(),
    };
    format!(
        "apiVersion: v1\nkind: Config\nclusters:\n- name: k8s4r\n  cluster:\n    server: {server}{ca}\ncontexts:\n- name: k8s4r\n  context:\n    cluster: k8s4r\n    user: k8s4r\n    namespace: default\ncurrent-context: k8s4r\nusers:\n- name: k8s4r\n  user:\n    token: {token}\npreferences: {{}}\n"
    )
}

/// Writes a kubeconfig readable by its owner only (it holds the token),
/// never readable by others even for a moment (see [`crate::private_files`]).
pub fn write_kubeconfig(path: &Path, yaml: &str) -> Result<()> {
    Ok(crate::private_files::write(path, yaml.as_bytes())?)
}

pub async fn client_for(kubeconfig: &str) -> Result<kube::Client> {
    let kc = kube::config::Kubeconfig::from_yaml(kubeconfig).map_err(|e| Error::Kubeconfig(e.to_string()))?;
    let config = kube::Config::from_custom_kubeconfig(kc, &kube::config::KubeConfigOptions::default())
        .await
        .map_err(|e| Error::Kubeconfig(e.to_string()))?;
    Ok(kube::Client::try_from(config)?)
}
