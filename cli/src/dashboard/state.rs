//! What one dashboard holds for its one user: a watch and a cache per
//! kind (made with the user's client, so they hold what the user may
//! list), a notice per kind the user may not watch, the change feed the
//! pages follow, the tokens, and what the user may do (asked of the API
//! server with SelfSubjectAccessReview, kept 10 s).

use std::collections::{BTreeMap, HashMap};
use std::net::SocketAddr;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use futures::StreamExt;
use k8s4r_api::names::DEFAULT_ROBOT_LEASE_NAMESPACE;
use k8s4r_api::{AgentRollout, Job, PeriodicJob, Robot, Task, TaskGroup};
use k8s_openapi::api::authorization::v1::{
    ResourceAttributes, SelfSubjectAccessReview, SelfSubjectAccessReviewSpec,
};
use k8s_openapi::api::coordination::v1::Lease;
use kube::api::PostParams;
use kube::runtime::reflector::{self, Store};
use kube::runtime::{watcher, WatchStreamExt};
use kube::{Api, Client, Resource};
use serde::de::DeserializeOwned;
use tokio::sync::broadcast;
use tokio_util::sync::CancellationToken;

/// How long an answer about what the user may do is kept.
const CAN_I_FOR: Duration = Duration::from_secs(10);

/// A kind the pages show.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum Kind {
    Robot,
    Job,
    TaskGroup,
    Task,
    PeriodicJob,
    /// The robots' Leases (their freshest sign of life).
    Lease,
    AgentRollout,
}

impl Kind {
    pub fn name(self) -> &'static str {
        match self {
            Kind::Robot => "robot",
            Kind::Job => "job",
            Kind::TaskGroup => "taskgroup",
            Kind::Task => "task",
            Kind::PeriodicJob => "periodicjob",
            Kind::Lease => "lease",
            Kind::AgentRollout => "agentrollout",
        }
    }

    pub fn parse(s: &str) -> Option<Kind> {
        [
            Kind::Robot,
            Kind::Job,
            Kind::TaskGroup,
            Kind::Task,
            Kind::PeriodicJob,
            Kind::AgentRollout,
        ]
        .into_iter()
        .find(|k| k.name() == s)
    }
}

/// What is asked of the API server: group, resource, subresource, verb, namespace.
type Question = [String; 5];

/// The dashboard's state.
pub struct State {
    pub client: Client,
    /// Jobs and Tasks of this namespace; all when `None`.
    pub namespace: Option<String>,
    pub robots: Store<Robot>,
    pub jobs: Store<Job>,
    pub groups: Store<TaskGroup>,
    pub tasks: Store<Task>,
    pub periodics: Store<PeriodicJob>,
    /// The robots' Leases, when the user may read them.
    pub leases: Store<Lease>,
    /// The AgentRollouts (cluster-scoped).
    pub rollouts: Store<AgentRollout>,
    /// A kind changed (or its watch broke or came back).
    pub changes: broadcast::Sender<Kind>,
    /// Per kind, why it cannot be watched now.
    notices: Notices,
    /// The user, as the API server names them.
    pub user: Option<String>,
    login: String,
    csrf: String,
    /// The Host header values a request may carry.
    pub hosts: Vec<String>,
    can: Mutex<HashMap<Question, (Instant, bool)>>,
}

impl State {
    /// Starts the watches (stopped with `shutdown`) for a dashboard on `addr`.
    pub async fn start(
        client: Client,
        namespace: Option<String>,
        addr: SocketAddr,
        shutdown: &CancellationToken,
    ) -> anyhow::Result<State> {
        let (changes, _) = broadcast::channel(1024);
        let scoped = |c: &Client| -> (Api<Job>, Api<TaskGroup>, Api<Task>) {
            match &namespace {
                Some(ns) => (
                    Api::namespaced(c.clone(), ns),
                    Api::namespaced(c.clone(), ns),
                    Api::namespaced(c.clone(), ns),
                ),
                None => (Api::all(c.clone()), Api::all(c.clone()), Api::all(c.clone())),
            }
        };
        let (job_api, group_api, task_api) = scoped(&client);
        let periodic_api: Api<PeriodicJob> = match &namespace {
            Some(ns) => Api::namespaced(client.clone(), ns),
            None => Api::all(client.clone()),
        };
        let notices = Notices::default();
        let feed = (&changes, &notices, shutdown);
        Ok(State {
            robots: watch(Api::all(client.clone()), Kind::Robot, feed),
            jobs: watch(job_api, Kind::Job, feed),
            groups: watch(group_api, Kind::TaskGroup, feed),
            tasks: watch(task_api, Kind::Task, feed),
            periodics: watch(periodic_api, Kind::PeriodicJob, feed),
            leases: watch(
                Api::namespaced(client.clone(), DEFAULT_ROBOT_LEASE_NAMESPACE),
                Kind::Lease,
                feed,
            ),
            rollouts: watch(Api::all(client.clone()), Kind::AgentRollout, feed),
            changes,
            notices,
            user: crate::operate::whoami(&client).await,
            login: crate::secret::random_secret()?,
            csrf: crate::secret::random_secret()?,
            hosts: allowed_hosts(addr),
            can: Mutex::default(),
            client,
            namespace,
        })
    }

    /// The token of the printed URL.
    pub fn login_token(&self) -> &str {
        &self.login
    }

    /// The token every form carries.
    pub fn csrf_token(&self) -> &str {
        &self.csrf
    }

    /// Why some kinds cannot be shown (the user may not watch them, or the
    /// API server is not answering).
    pub fn notices(&self) -> Vec<String> {
        // The Leases only sharpen the heartbeat's age: not being allowed
        // to read them is not worth a word.
        lock(&self.notices.0)
            .iter()
            .filter(|(k, _)| **k != Kind::Lease)
            .map(|(_, v)| v.clone())
            .collect()
    }

    /// When `robot` last showed a sign of life the cluster recorded: its
    /// Robot's heartbeat (rewritten every few minutes) or its Lease
    /// (renewed every 10–60 s), whichever is newer.
    pub fn last_heartbeat(&self, robot: &Robot) -> Option<jiff::Timestamp> {
        let name = kube::ResourceExt::name_any(robot);
        let lease = self
            .leases
            .get(&kube::runtime::reflector::ObjectRef::new(&name).within(DEFAULT_ROBOT_LEASE_NAMESPACE))
            .and_then(|l| l.spec.as_ref()?.renew_time.as_ref().map(|t| t.0));
        let recorded = robot.status.as_ref().and_then(|s| s.last_heartbeat_time);
        recorded.max(lease)
    }

    /// Whether every watch has listed once.
    pub fn ready(&self) -> bool {
        [
            self.robots.is_empty_ready(),
            self.jobs.is_empty_ready(),
            self.groups.is_empty_ready(),
            self.tasks.is_empty_ready(),
        ]
        .iter()
        .all(|r| *r)
    }

    /// Whether the user may `verb` `resource` (of robot.k8s4r.io) in `ns`
    /// (cluster-wide when empty), as the API server answers.
    pub async fn can_i(&self, verb: &str, resource: &str, ns: &str) -> bool {
        let group = k8s4r_api::Robot::group(&()).into_owned();
        self.may(&group, resource, None, verb, ns).await
    }

    /// Whether the user may open exec sessions on tasks in `ns`
    /// (`create` on `tasks/exec` of logs.k8s4r.io, as `k8s4r exec` needs).
    pub async fn can_exec(&self, ns: &str) -> bool {
        self.may(k8s4r_server::logs::GROUP, "tasks", Some("exec"), "create", ns)
            .await
    }

    /// The API server's answer (a SelfSubjectAccessReview), kept a while.
    async fn may(
        &self,
        group: &str,
        resource: &str,
        subresource: Option<&str>,
        verb: &str,
        ns: &str,
    ) -> bool {
        let key = [group, resource, subresource.unwrap_or(""), verb, ns].map(str::to_owned);
        if let Some((at, allowed)) = lock(&self.can).get(&key) {
            if at.elapsed() < CAN_I_FOR {
                return *allowed;
            }
        }
        let review = SelfSubjectAccessReview {
            spec: SelfSubjectAccessReviewSpec {
                resource_attributes: Some(ResourceAttributes {
                    group: Some(group.to_owned()),
                    resource: Some(resource.to_owned()),
                    subresource: subresource.map(str::to_owned),
                    verb: Some(verb.to_owned()),
                    namespace: (!ns.is_empty()).then(|| ns.to_owned()),
                    ..ResourceAttributes::default()
                }),
                ..SelfSubjectAccessReviewSpec::default()
            },
            ..SelfSubjectAccessReview::default()
        };
        let api: Api<SelfSubjectAccessReview> = Api::all(self.client.clone());
        let allowed = api
            .create(&PostParams::default(), &review)
            .await
            .ok()
            .and_then(|r| r.status)
            .is_some_and(|s| s.allowed);
        lock(&self.can).insert(key, (Instant::now(), allowed));
        allowed
    }
}

/// Whether a store has listed once (an empty store that has not may still
/// be filling).
trait Ready {
    fn is_empty_ready(&self) -> bool;
}

impl<K: Resource + Clone + 'static> Ready for Store<K>
where
    K::DynamicType: Eq + std::hash::Hash + Clone,
{
    fn is_empty_ready(&self) -> bool {
        futures::FutureExt::now_or_never(self.wait_until_ready()).is_some()
    }
}

/// The Host header values of a dashboard on `addr`: its address, and the
/// loopback names of its port (anything else may be DNS rebinding).
fn allowed_hosts(addr: SocketAddr) -> Vec<String> {
    let port = addr.port();
    let mut hosts = vec![
        format!("127.0.0.1:{port}"),
        format!("localhost:{port}"),
        format!("[::1]:{port}"),
    ];
    if !addr.ip().is_unspecified() {
        hosts.push(addr.to_string());
    }
    hosts.dedup();
    hosts
}

/// Per kind, why it cannot be watched now (shared with the watches).
#[derive(Clone, Default)]
struct Notices(Arc<Mutex<BTreeMap<Kind, String>>>);

impl Notices {
    /// Records `notice` for `kind` (none: it is fine); whether it changed.
    fn set(&self, kind: Kind, notice: Option<String>) -> bool {
        let mut notices = lock(&self.0);
        match notice {
            Some(n) => notices.insert(kind, n.clone()).as_ref() != Some(&n),
            None => notices.remove(&kind).is_some(),
        }
    }
}

/// Watches `api` into a new cache, telling `changes` of every change
/// and noting why it cannot watch, until `shutdown`.
fn watch<K>(
    api: Api<K>,
    kind: Kind,
    (changes, notices, shutdown): (&broadcast::Sender<Kind>, &Notices, &CancellationToken),
) -> Store<K>
where
    K: Resource + Clone + DeserializeOwned + std::fmt::Debug + Send + Sync + 'static,
    K::DynamicType: Eq + std::hash::Hash + Clone + Default,
{
    let (reader, writer) = reflector::store();
    let changes = changes.clone();
    let notices = notices.clone();
    let shutdown = shutdown.clone();
    tokio::spawn(async move {
        let events = watcher(api, watcher::Config::default())
            .default_backoff()
            .reflect(writer)
            .take_until(shutdown.cancelled_owned());
        futures::pin_mut!(events);
        while let Some(event) = events.next().await {
            let changed = match event {
                Ok(_) => {
                    notices.set(kind, None);
                    true
                }
                Err(e) => notices.set(kind, Some(explain_watch(kind, &e))),
            };
            // Leases are renewed every few seconds per robot: a page learns
            // of them when it is fetched again, not from each renewal.
            if changed && kind != Kind::Lease {
                let _ = changes.send(kind);
            }
        }
    });
    reader
}

/// What a broken watch means for the user.
fn explain_watch(kind: Kind, error: &watcher::Error) -> String {
    let text = error.to_string();
    if text.contains("403") || text.to_ascii_lowercase().contains("forbidden") {
        format!(
            "you may not list and watch {}s here (it takes `list` and `watch` on them): they are not shown",
            kind.name()
        )
    } else {
        format!(
            "the API server is not answering the {} watch: {text}",
            kind.name()
        )
    }
}

pub(super) fn lock<T>(m: &Mutex<T>) -> std::sync::MutexGuard<'_, T> {
    m.lock().unwrap_or_else(std::sync::PoisonError::into_inner)
}
