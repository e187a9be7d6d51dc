//! Task logs, live from the robots: the aggregated API
//! `logs.k8s4r.io/v1alpha1`, read as
//! `GET /apis/logs.k8s4r.io/v1alpha1/namespaces/{ns}/tasks/{name}/log`.
//!
//! The Kubernetes API server authenticates the user and proxies the request
//! here (an APIService), as it proxies `kubectl logs` to a kubelet: the
//! user's own credentials, whatever kind they are, and no tunnel. This
//! server trusts the proxy by its client certificate (the request-header CA
//! of `kube-system/extension-apiserver-authentication`), asks the API server
//! whether the user may `get` `tasks/log` (a SubjectAccessReview), and
//! then asks the task's robot for the output over MQTT
//! (`logs/request`), relaying the chunks it sends back (`tasks/{uid}/log`,
//! QoS 0, numbered: a gap is shown). It renews every request so that the
//! robot keeps sending (a large read outlasts the robot's lease), and
//! acknowledges what reached the reader's connection: the robot keeps at
//! most [`WINDOW`] chunks on the way, so that a read of any size streams
//! at the pace of its reader in bounded memory and no chunk is dropped
//! here. A follow ends once the attempt is over. Asked with `frames=true`
//! (as `k8s4r logs` asks), the answer is framed ([`log_frame`]): output
//! and warnings apart, and an end that says the read is complete; in
//! plain text, warnings are inline `[k8s4r: ...]` lines. A robot that is offline, or does not answer, is said
//! so at once, with the last output the cluster has (`status.outputTail`).
//! Logs never pass through the API server's storage.

use std::net::SocketAddr;
use std::sync::Arc;
use std::time::{Duration, Instant};

use axum::body::{Body, Bytes};
use axum::extract::{Extension, Path, Query, State};
use axum::http::{header, HeaderMap, HeaderValue, StatusCode};
use axum::response::{IntoResponse, Response};
use axum::routing::get;
use axum::Router;
use k8s4r_api::condition::find_condition;
use k8s4r_api::log_frame::{self, Frame};
use k8s4r_api::names::CONDITION_CONNECTED;
use k8s4r_api::protocol::{encode, LogChunk, LogRequest, Topics};
use k8s4r_api::{ConditionStatus, Robot, RobotPhase, Task, TaskState};
use k8s4r_service::https::PeerName;
use k8s_openapi::api::authorization::v1::{ResourceAttributes, SubjectAccessReview, SubjectAccessReviewSpec};
use k8s_openapi::api::core::v1::ConfigMap;
use kube::api::PostParams;
use kube::runtime::reflector::{ObjectRef, Store};
use kube::{Api, Client};
use serde::Deserialize;
use serde_json::json;
use tokio::sync::mpsc;
use tokio_util::sync::CancellationToken;
use tracing::{info, warn};

use crate::log_hub::LogHub;

mod outputs;
mod read;
mod sessions;
use crate::mqtt::Publisher;
use read::{Piece, Step};

/// Where the logs API listens and with which certificate; the settings
/// live with the server's others.
pub use crate::config::LogsConfig;

/// The API group and version served.
pub const GROUP: &str = "logs.k8s4r.io";
/// The version.
pub const VERSION: &str = "v1alpha1";
/// How long the robot has to send its first chunk.
const FIRST_CHUNK: Duration = Duration::from_secs(5);
/// How often a follow is renewed (well within the robot's lease).
const RENEW: Duration = Duration::from_secs(10);
/// Chunks a robot may have on the way beyond the last one delivered to the
/// reader's client (below the hub's queue, so that none is dropped there).
const WINDOW: u32 = 192;

/// A self-signed certificate and key (PEM) for the loopback names, the
/// service's cluster names and `extra`.
pub fn self_signed(extra: &[String]) -> Result<(String, String), String> {
    let mut names = vec![
        "127.0.0.1".to_owned(),
        "localhost".to_owned(),
        "k8s4r-server-logs.k8s4r-system.svc".to_owned(),
    ];
    names.extend(extra.iter().filter(|n| !n.is_empty()).cloned());
    let generated = rcgen::generate_simple_self_signed(names).map_err(|e| e.to_string())?;
    Ok((generated.cert.pem(), generated.signing_key.serialize_pem()))
}

#[derive(Clone)]
struct LogsState {
    /// Common names the front proxy's client certificate may have (empty:
    /// any the request-header CA signed), from the API server.
    allowed_names: Arc<Vec<String>>,
    hub: Arc<LogHub>,
    client: Client,
    publisher: Publisher,
    topics: Topics,
    robots: Store<Robot>,
    tasks: Store<Task>,
    /// Records the Events of exec, port-forward and copy sessions.
    recorder: Arc<k8s4r_service::events::Recorder>,
    /// Silence after which a session ends (either side).
    session_lease: Duration,
    /// The bucket of task outputs, when one is configured.
    bucket: Option<Arc<crate::bucket::Bucket>>,
    /// Fetches outputs from it.
    http: reqwest::Client,
}

/// What a reader asks, as kubectl's `logs` names it (plus `stream`).
#[derive(Debug, Default, Deserialize)]
#[serde(rename_all = "camelCase")]
struct LogQuery {
    #[serde(default)]
    follow: Option<String>,
    #[serde(default)]
    tail_lines: Option<u32>,
    #[serde(default)]
    since_seconds: Option<u64>,
    #[serde(default)]
    previous: Option<String>,
    #[serde(default)]
    stream: Option<String>,
    /// Answer in frames ([`k8s4r_api::log_frame`]) rather than plain text.
    #[serde(default)]
    frames: Option<String>,
}

fn truthy(v: &Option<String>) -> bool {
    matches!(v.as_deref(), Some("true" | "1" | ""))
}

/// A Kubernetes Status answer.
fn status(code: StatusCode, reason: &str, message: String) -> Response {
    let body = json!({
        "kind": "Status", "apiVersion": "v1", "metadata": {},
        "status": "Failure", "message": message, "reason": reason, "code": code.as_u16(),
    });
    (
        code,
        [(header::CONTENT_TYPE, "application/json")],
        body.to_string(),
    )
        .into_response()
}

/// Reads the request-header CA kube-apiserver (or apiserver-lite)
/// publishes for the backends of aggregated APIs, and the common names
/// its client certificate may have.
pub async fn request_header_ca(client: &Client) -> Result<(String, Vec<String>), String> {
    let api: Api<ConfigMap> = Api::namespaced(client.clone(), "kube-system");
    let cm = api
        .get_opt("extension-apiserver-authentication")
        .await
        .map_err(|e| format!("reading kube-system/extension-apiserver-authentication: {e}"))?
        .ok_or("kube-system/extension-apiserver-authentication does not exist")?;
    let data = cm.data.unwrap_or_default();
    let ca = data
        .get("requestheader-client-ca-file")
        .cloned()
        .filter(|ca| !ca.trim().is_empty())
        .ok_or("extension-apiserver-authentication has no requestheader-client-ca-file")?;
    let names = data
        .get("requestheader-allowed-names")
        .and_then(|n| serde_json::from_str::<Vec<String>>(n).ok())
        .unwrap_or_default();
    Ok((ca, names))
}

/// Binds the logs API; returns the bound address and the future serving it.
#[allow(clippy::too_many_arguments)]
pub async fn bind(
    config: &LogsConfig,
    hub: Arc<LogHub>,
    client: Client,
    publisher: Publisher,
    topics: Topics,
    robots: Store<Robot>,
    tasks: Store<Task>,
    bucket: Option<Arc<crate::bucket::Bucket>>,
    shutdown: CancellationToken,
) -> Result<(SocketAddr, impl std::future::Future<Output = ()> + Send + 'static), String> {
    let (ca, allowed_names) = request_header_ca(&client).await?;
    let tls = k8s4r_service::https::server_config(&config.cert_pem, &config.key_pem, Some(&ca))
        .map_err(|e| e.to_string())?;
    let recorder = k8s4r_service::events::Recorder::new(
        client.clone(),
        kube::runtime::events::Reporter {
            controller: k8s4r_api::names::MANAGER_SERVER.to_owned(),
            instance: None,
        },
    );
    let state = LogsState {
        allowed_names: Arc::new(allowed_names),
        hub,
        client,
        publisher,
        topics,
        robots,
        tasks,
        recorder: Arc::new(recorder),
        session_lease: config.session_lease,
        bucket,
        http: reqwest::Client::new(),
    };
    let base = format!("/apis/{GROUP}/{VERSION}");
    let app = Router::new()
        .route(&format!("/apis/{GROUP}"), get(group_doc))
        .route(&base, get(resources_doc))
        .route(
            &format!("{base}/namespaces/{{ns}}/tasks/{{name}}/log"),
            get(task_log),
        )
        .route(
            &format!("{base}/namespaces/{{ns}}/tasks/{{name}}/outputs"),
            get(outputs::task_outputs),
        )
        .route(
            &format!("{base}/namespaces/{{ns}}/tasks/{{name}}/exec"),
            get(sessions::task_exec),
        )
        .route(
            &format!("{base}/namespaces/{{ns}}/tasks/{{name}}/portforward"),
            get(sessions::task_portforward),
        )
        .route(&format!("{base}/robots/{{name}}/exec"), get(sessions::robot_exec))
        .route(
            &format!("{base}/robots/{{name}}/portforward"),
            get(sessions::robot_portforward),
        )
        .with_state(state);
    let (bound, serve) = k8s4r_service::https::bind(config.addr, tls, app, shutdown)
        .await
        .map_err(|e| format!("binding {}: {e}", config.addr))?;
    info!(addr = %bound, "serving the logs API ({GROUP}/{VERSION})");
    Ok((bound, serve))
}

async fn group_doc() -> Response {
    let gv = json!({"groupVersion": format!("{GROUP}/{VERSION}"), "version": VERSION});
    axum::Json(json!({
        "kind": "APIGroup", "apiVersion": "v1", "name": GROUP,
        "versions": [gv], "preferredVersion": gv,
    }))
    .into_response()
}

async fn resources_doc() -> Response {
    axum::Json(json!({
        "kind": "APIResourceList", "apiVersion": "v1", "groupVersion": format!("{GROUP}/{VERSION}"),
        "resources": [
            {"name": "tasks/log", "singularName": "", "namespaced": true, "kind": "Task", "verbs": ["get"]},
            {"name": "tasks/outputs", "singularName": "", "namespaced": true, "kind": "Task", "verbs": ["get"]},
            {"name": "tasks/exec", "singularName": "", "namespaced": true, "kind": "Task", "verbs": ["get", "create"]},
            {"name": "tasks/portforward", "singularName": "", "namespaced": true, "kind": "Task", "verbs": ["get", "create"]},
            {"name": "robots/exec", "singularName": "", "namespaced": false, "kind": "Robot", "verbs": ["get", "create"]},
            {"name": "robots/portforward", "singularName": "", "namespaced": false, "kind": "Robot", "verbs": ["get", "create"]},
        ],
    }))
    .into_response()
}

/// The user the front proxy vouches for.
fn user_of(headers: &HeaderMap) -> Option<(String, Vec<String>)> {
    let user = headers.get("x-remote-user")?.to_str().ok()?.to_owned();
    let groups = headers
        .get_all("x-remote-group")
        .iter()
        .filter_map(|v| v.to_str().ok())
        .map(str::to_owned)
        .collect();
    Some((user, groups))
}

/// What a request asks to do, as RBAC reads it.
struct Access<'a> {
    ns: Option<&'a str>,
    name: &'a str,
    resource: &'a str,
    subresource: &'a str,
    verb: &'a str,
}

async fn allowed(
    state: &LogsState,
    user: &str,
    groups: Vec<String>,
    access: &Access<'_>,
) -> Result<bool, String> {
    let review = SubjectAccessReview {
        spec: SubjectAccessReviewSpec {
            user: Some(user.to_owned()),
            groups: Some(groups),
            resource_attributes: Some(ResourceAttributes {
                namespace: access.ns.map(str::to_owned),
                verb: Some(access.verb.into()),
                group: Some(GROUP.into()),
                resource: Some(access.resource.into()),
                subresource: Some(access.subresource.into()),
                name: Some(access.name.to_owned()),
                ..ResourceAttributes::default()
            }),
            ..SubjectAccessReviewSpec::default()
        },
        ..SubjectAccessReview::default()
    };
    let api: Api<SubjectAccessReview> = Api::all(state.client.clone());
    let answer = tokio::time::timeout(
        Duration::from_secs(10),
        api.create(&PostParams::default(), &review),
    )
    .await
    .map_err(|_| "the API server did not answer the access review in 10s".to_owned())?
    .map_err(|e| format!("access review: {e}"))?;
    Ok(answer.status.is_some_and(|s| s.allowed))
}

/// Why the robot cannot be asked now, if it cannot.
fn unreachable(robots: &Store<Robot>, robot: &str) -> Option<String> {
    let Some(r) = robots.get(&ObjectRef::new(robot)) else {
        return Some(format!("robot {robot} is not registered"));
    };
    let status = r.status.clone().unwrap_or_default();
    if status.phase == Some(RobotPhase::Offline) {
        return Some(format!("robot {robot} is offline"));
    }
    let connected = find_condition(&status.conditions, CONDITION_CONNECTED);
    if connected.is_some_and(|c| c.status == ConditionStatus::False) {
        return Some(format!("robot {robot} is not connected to the broker"));
    }
    None
}

/// The answer when the robot cannot be asked: the output the cluster has.
fn from_the_cluster(task: &Task, why: &str) -> Response {
    let tail = task
        .status
        .as_ref()
        .and_then(|s| s.output_tail.clone())
        .unwrap_or_default();
    let notice = format!("{why}: showing the last output the cluster has (status.outputTail)");
    let mut response = (StatusCode::OK, tail).into_response();
    let headers = response.headers_mut();
    headers.insert(
        header::CONTENT_TYPE,
        HeaderValue::from_static("text/plain; charset=utf-8"),
    );
    if let Ok(v) = HeaderValue::from_str(&notice) {
        headers.insert("x-k8s4r-notice", v);
    }
    response
}

fn request_id() -> String {
    use std::hash::{BuildHasher, Hasher};
    let mut h = std::collections::hash_map::RandomState::new().build_hasher();
    h.write_u128(
        std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .unwrap_or_default()
            .as_nanos(),
    );
    format!("{:016x}{:08x}", h.finish(), std::process::id())
}

/// `GET .../tasks/{name}/log`: checks who asks, plans the read
/// ([`read::attempt_to_read`]) and streams it from the robot, or answers
/// with what the cluster has when the robot cannot be asked.
async fn task_log(
    State(state): State<LogsState>,
    Path((ns, name)): Path<(String, String)>,
    Query(query): Query<LogQuery>,
    Extension(peer): Extension<PeerName>,
    headers: HeaderMap,
) -> Response {
    if let Err(refused) = authorize(&state, &peer, &headers, &ns, &name).await {
        return refused;
    }
    let task = match task_named(&state.client, &ns, &name).await {
        Ok(task) => task,
        Err(answer) => return answer,
    };
    let previous = truthy(&query.previous);
    let (attempt, robot) = match read::attempt_to_read(&task, &name, previous) {
        Ok(read) => read,
        Err(why) => return status(StatusCode::BAD_REQUEST, "BadRequest", why),
    };
    if let Some(why) = unreachable(&state.robots, &robot) {
        return offline_answer(&task, &why, previous, attempt);
    }
    let stream = match read::stream_asked(query.stream.as_deref()) {
        Ok(stream) => stream,
        Err(why) => return status(StatusCode::BAD_REQUEST, "BadRequest", why),
    };
    let request = LogRequest {
        v: k8s4r_api::protocol::PROTOCOL_VERSION,
        request_id: request_id(),
        task_uid: task.metadata.uid.clone().unwrap_or_default(),
        attempt,
        stream,
        tail_lines: query.tail_lines,
        since: query.since_seconds.and_then(|s| {
            jiff::Timestamp::now()
                .checked_sub(jiff::SignedDuration::from_secs(
                    i64::try_from(s).unwrap_or(i64::MAX),
                ))
                .ok()
        }),
        follow: truthy(&query.follow),
        stop: false,
        renew: false,
        window: Some(WINDOW),
        acked: None,
    };
    let task_ref = ObjectRef::new(&name).within(&ns);
    stream_from_robot(state, &task, task_ref, &robot, request, truthy(&query.frames)).await
}

/// Refuses a request that does not come through the API server's front
/// proxy, or whose user may not `get` `tasks/log`.
async fn authorize(
    state: &LogsState,
    peer: &PeerName,
    headers: &HeaderMap,
    ns: &str,
    name: &str,
) -> Result<(), Response> {
    authorize_as(state, peer, headers, Some(ns), name, "tasks", "log", "get")
        .await
        .map(|_| ())
}

/// Refuses a request that does not come through the API server's front
/// proxy, or whose user may not `verb` `resource/subresource`; the user's
/// name when allowed.
#[allow(clippy::too_many_arguments)]
async fn authorize_as(
    state: &LogsState,
    peer: &PeerName,
    headers: &HeaderMap,
    ns: Option<&str>,
    name: &str,
    resource: &str,
    subresource: &str,
    verb: &str,
) -> Result<String, Response> {
    // Only the front proxy speaks for users: its certificate (the TLS layer
    // checked the CA) must carry one of the names the API server allows.
    let trusted =
        state.allowed_names.is_empty() || peer.0.as_ref().is_some_and(|n| state.allowed_names.contains(n));
    if !trusted {
        return Err(status(
            StatusCode::UNAUTHORIZED,
            "Unauthorized",
            format!(
                "client certificate {:?} is not the API server's front proxy",
                peer.0
            ),
        ));
    }
    let Some((user, groups)) = user_of(headers) else {
        return Err(status(
            StatusCode::UNAUTHORIZED,
            "Unauthorized",
            "no user: requests come through the API server".into(),
        ));
    };
    let access = Access {
        ns,
        name,
        resource,
        subresource,
        verb,
    };
    match allowed(state, &user, groups, &access).await {
        Ok(true) => Ok(user),
        Ok(false) => {
            let scope = match ns {
                Some(ns) => format!("in the namespace \"{ns}\""),
                None => "at the cluster scope".to_owned(),
            };
            Err(status(
                StatusCode::FORBIDDEN,
                "Forbidden",
                format!("{resource}.{GROUP} \"{name}\" is forbidden: User \"{user}\" cannot {verb} resource \"{resource}/{subresource}\" in API group \"{GROUP}\" {scope}"),
            ))
        }
        Err(e) => Err(status(StatusCode::SERVICE_UNAVAILABLE, "ServiceUnavailable", e)),
    }
}

/// The Task, read from the API server (not the cache: a reader right after
/// a placement asks for the attempt just placed).
async fn task_named(client: &Client, ns: &str, name: &str) -> Result<Task, Response> {
    let tasks: Api<Task> = Api::namespaced(client.clone(), ns);
    match tokio::time::timeout(Duration::from_secs(10), tasks.get_opt(name)).await {
        Ok(Ok(Some(task))) => Ok(task),
        Ok(Ok(None)) => Err(status(
            StatusCode::NOT_FOUND,
            "NotFound",
            format!("tasks.robot.k8s4r.io \"{name}\" not found in namespace \"{ns}\""),
        )),
        Ok(Err(e)) => Err(status(
            StatusCode::SERVICE_UNAVAILABLE,
            "ServiceUnavailable",
            e.to_string(),
        )),
        Err(_) => Err(status(
            StatusCode::SERVICE_UNAVAILABLE,
            "ServiceUnavailable",
            "the API server did not answer in 10s".into(),
        )),
    }
}

/// The answer for a robot that cannot be asked: the current attempt's
/// last output the cluster has; for an earlier attempt, nothing (the
/// cluster keeps only the current attempt's), said so.
fn offline_answer(task: &Task, why: &str, previous: bool, attempt: u32) -> Response {
    let mut answer = from_the_cluster(task, why);
    if previous {
        *answer.body_mut() = Body::empty();
        if let Ok(v) = HeaderValue::from_str(&format!(
            "{why}: the cluster keeps no output of attempt {attempt}"
        )) {
            answer.headers_mut().insert("x-k8s4r-notice", v);
        }
    }
    answer
}

/// Asks `robot` for the output and answers with a body that relays it as
/// it comes; answers with what the cluster has when the robot cannot be
/// asked or does not answer.
async fn stream_from_robot(
    state: LogsState,
    task: &Task,
    task_ref: ObjectRef<Task>,
    robot: &str,
    request: LogRequest,
    framed: bool,
) -> Response {
    let Some(mut chunks) = state.hub.open(&request.request_id, robot, &request.task_uid) else {
        return status(
            StatusCode::TOO_MANY_REQUESTS,
            "TooManyRequests",
            "too many log readers; try again later".into(),
        );
    };
    let topic = state.topics.log_request(robot);
    if let Err(e) = state.publisher.publish(topic.clone(), encode(&request)).await {
        state.hub.close(&request.request_id);
        return from_the_cluster(task, &format!("cannot ask robot {robot}: {e}"));
    }
    let Ok(Some(first)) = tokio::time::timeout(FIRST_CHUNK, chunks.recv()).await else {
        state.hub.close(&request.request_id);
        // A reader that starts late stops at once.
        let stop = LogRequest {
            stop: true,
            ..request
        };
        let _ = state.publisher.publish(topic, encode(&stop)).await;
        let why = format!(
            "robot {robot} did not answer in {}s (its agent may be too old, or cut off)",
            FIRST_CHUNK.as_secs()
        );
        return from_the_cluster(task, &why);
    };
    let (tx, rx) = mpsc::channel::<Bytes>(64);
    let relay = Relay {
        state,
        request,
        topic,
        task_ref,
        framed,
        robot: robot.to_owned(),
    };
    tokio::spawn(relay.run(first, chunks, tx));
    let body = futures::stream::unfold(rx, |mut rx| async move {
        rx.recv()
            .await
            .map(|b| (Ok::<Bytes, std::convert::Infallible>(b), rx))
    });
    let mut response = Response::new(Body::from_stream(body));
    let headers = response.headers_mut();
    headers.insert(
        header::CONTENT_TYPE,
        HeaderValue::from_static(if framed {
            log_frame::CONTENT_TYPE
        } else {
            "text/plain; charset=utf-8"
        }),
    );
    if let Ok(v) = HeaderValue::from_str(robot) {
        headers.insert("x-k8s4r-robot", v);
    }
    response
}

/// Carries one reader's chunks to its HTTP answer: performs what
/// [`read::Relaying`] decides.
struct Relay {
    state: LogsState,
    request: LogRequest,
    topic: String,
    task_ref: ObjectRef<Task>,
    /// Frames ([`log_frame`]) rather than plain text with inline notes.
    framed: bool,
    robot: String,
}

impl Relay {
    /// Sends `piece` to the reader in the answer's form; false once the
    /// reader is gone.
    async fn say(&self, out: &mpsc::Sender<Bytes>, piece: Piece) -> bool {
        let bytes = match (self.framed, piece) {
            (true, Piece::Output(text)) => Frame::Output(text.into_bytes()).encode(),
            (true, Piece::Warning(text)) => Frame::Warning(text).encode(),
            (true, Piece::End) => Frame::End.encode(),
            (false, Piece::Output(text)) => text.into_bytes(),
            (false, Piece::Warning(text)) => format!("[k8s4r: {text}]\n").into_bytes(),
            (false, Piece::End) => return true,
        };
        bytes.is_empty() || out.send(Bytes::from(bytes)).await.is_ok()
    }

    /// Whether the attempt read is over (or the Task gone).
    fn over(&self) -> bool {
        match self.state.tasks.get(&self.task_ref) {
            None => true,
            Some(task) => {
                let s = task.status.clone().unwrap_or_default();
                s.attempt != self.request.attempt || s.state.is_some_and(TaskState::is_terminal)
            }
        }
    }

    /// A renewal of the robot's reader that acknowledges `acked` chunks.
    fn renewal(&self, acked: u64) -> Vec<u8> {
        encode(&LogRequest {
            renew: true,
            acked: Some(acked),
            ..self.request.clone()
        })
    }

    /// Performs `steps` in order; false once the relay ends.
    async fn perform(&self, out: &mpsc::Sender<Bytes>, steps: Vec<Step>) -> bool {
        for step in steps {
            match step {
                Step::Say(piece) => {
                    if !self.say(out, piece).await {
                        return false;
                    }
                }
                Step::Ack(acked) => {
                    self.state.publisher.send(self.topic.clone(), self.renewal(acked));
                }
                Step::Finish => return false,
            }
        }
        true
    }

    async fn run(self, first: LogChunk, mut chunks: mpsc::Receiver<LogChunk>, out: mpsc::Sender<Bytes>) {
        let mut relaying = read::Relaying::new(self.request.follow, &self.robot, Instant::now());
        let mut pending = Some(first);
        let mut renew = tokio::time::interval(RENEW);
        renew.tick().await;
        let mut check = tokio::time::interval(Duration::from_millis(250));
        loop {
            let steps = match pending.take() {
                Some(chunk) => relaying.on_chunk(chunk, Instant::now()),
                None => tokio::select! {
                    chunk = chunks.recv() => match chunk {
                        Some(chunk) => relaying.on_chunk(chunk, Instant::now()),
                        None => break,
                    },
                    // Every reader is renewed, a read of what is on disk
                    // too: a large one takes longer than the robot's lease.
                    _ = renew.tick() => {
                        let _ = self.state.publisher.publish(self.topic.clone(), self.renewal(relaying.delivered())).await;
                        continue;
                    }
                    _ = check.tick() => {
                        if out.is_closed() {
                            break;
                        }
                        relaying.on_tick(Instant::now(), self.request.follow && self.over())
                    }
                },
            };
            if !self.perform(&out, steps).await {
                break;
            }
        }
        self.state.hub.close(&self.request.request_id);
        let stop = LogRequest {
            stop: true,
            ..self.request.clone()
        };
        if let Err(e) = self
            .state
            .publisher
            .publish(self.topic.clone(), encode(&stop))
            .await
        {
            warn!(error = %e, "could not tell the robot to stop a log reader; it stops by itself");
        }
    }
}
