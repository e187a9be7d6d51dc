//! Exec, port-forward and copy sessions on the aggregated API, as
//! kube-apiserver serves `pods/exec` and `pods/portforward`: WebSockets
//! speaking Kubernetes' channel protocol (`v5.channel.k8s.io`: one byte of
//! channel, then data; 0 stdin, 1 stdout, 2 stderr, 3 the final Status, 4
//! terminal size, 255 a stream's end), each carried to the robot over its
//! MQTT connection ([`k8s4r_api::protocol::reach`]).
//!
//! - `GET .../namespaces/{ns}/tasks/{name}/exec?command=..&stdin=&tty=`
//!   (and `copyFrom=PATH` or `copyTo=PATH&length=N&mode=M` for `k8s4r
//!   cp`, which kubectl too authorizes as exec);
//! - `GET .../robots/{name}/exec?loadImage=SHA256&length=N` for `k8s4r
//!   image push`, an OCI archive into the robot's podman store, authorized
//!   as exec on the robot;
//! - `GET .../namespaces/{ns}/tasks/{name}/portforward?ports=P`, one TCP
//!   connection per WebSocket;
//! - `GET .../robots/{name}/exec` and `.../robots/{name}/portforward`.
//!
//! The user must be allowed to `create` the subresource (a
//! SubjectAccessReview as them); the robot then decides by its own
//! settings, and its refusal names the setting. The robot is asked before
//! the WebSocket is accepted, so every refusal is an HTTP answer with a
//! Status. Every session is an Event on its Task or Robot, opened and
//! ended (who, what, exit status, bytes).

use std::collections::VecDeque;
use std::time::Duration;

use axum::extract::{Extension, Path, RawQuery, Request, State};
use axum::http::{header, HeaderMap, HeaderValue, StatusCode};
use axum::response::Response;
use futures::{SinkExt, StreamExt};
use k8s4r_api::protocol::reach::{
    Flow, Frame, SessionEnd, SessionKind, SessionOpen, SessionOpened, DEFAULT_SESSION_WINDOW,
    MAX_SESSION_DATA, STDIN,
};
use k8s4r_api::TaskState;
use k8s4r_service::https::PeerName;
use k8s4r_service::websocket::Upgrade;
use k8s_openapi::api::core::v1::ObjectReference;
use kube::runtime::events::{Event, EventType};
use kube::runtime::reflector::ObjectRef;
use kube::Resource;
use serde_json::json;
use tokio_tungstenite::tungstenite::Message;
use tokio_tungstenite::WebSocketStream;
use tracing::{info, warn};

use super::{status, unreachable, LogsState};

/// The channel protocols spoken, best first.
const PROTOCOLS: [&str; 2] = ["v5.channel.k8s.io", "v4.channel.k8s.io"];
/// How long the robot has to take or refuse a session.
const OPEN_TIMEOUT: Duration = Duration::from_secs(10);
/// The channel of the final Status.
const STATUS_CHANNEL: u8 = 3;
/// The channel of terminal sizes.
const RESIZE_CHANNEL: u8 = 4;
/// The channel that says a stream ended (v5).
const CLOSE_CHANNEL: u8 = 255;

/// Where a session runs.
#[derive(Debug, Clone)]
enum Target {
    Task { ns: String, name: String },
    Robot { name: String },
}

impl Target {
    fn resource(&self) -> &'static str {
        match self {
            Target::Task { .. } => "tasks",
            Target::Robot { .. } => "robots",
        }
    }

    fn describe(&self) -> String {
        match self {
            Target::Task { ns, name } => format!("task {ns}/{name}"),
            Target::Robot { name } => format!("robot {name}"),
        }
    }
}

/// `GET .../tasks/{name}/exec`.
pub(super) async fn task_exec(
    State(state): State<LogsState>,
    Path((ns, name)): Path<(String, String)>,
    RawQuery(query): RawQuery,
    Extension(peer): Extension<PeerName>,
    request: Request,
) -> Response {
    session(state, peer, Target::Task { ns, name }, "exec", query, request).await
}

/// `GET .../tasks/{name}/portforward`.
pub(super) async fn task_portforward(
    State(state): State<LogsState>,
    Path((ns, name)): Path<(String, String)>,
    RawQuery(query): RawQuery,
    Extension(peer): Extension<PeerName>,
    request: Request,
) -> Response {
    session(
        state,
        peer,
        Target::Task { ns, name },
        "portforward",
        query,
        request,
    )
    .await
}

/// `GET .../robots/{name}/exec`.
pub(super) async fn robot_exec(
    State(state): State<LogsState>,
    Path(name): Path<String>,
    RawQuery(query): RawQuery,
    Extension(peer): Extension<PeerName>,
    request: Request,
) -> Response {
    session(state, peer, Target::Robot { name }, "exec", query, request).await
}

/// `GET .../robots/{name}/portforward`.
pub(super) async fn robot_portforward(
    State(state): State<LogsState>,
    Path(name): Path<String>,
    RawQuery(query): RawQuery,
    Extension(peer): Extension<PeerName>,
    request: Request,
) -> Response {
    session(state, peer, Target::Robot { name }, "portforward", query, request).await
}

/// What the query asks, as [`SessionOpen`] fields.
fn parse_query(subresource: &str, query: Option<&str>) -> Result<SessionOpen, String> {
    let mut open = SessionOpen {
        kind: if subresource == "portforward" {
            SessionKind::Forward
        } else {
            SessionKind::Exec
        },
        user: String::new(),
        task_uid: None,
        attempt: None,
        command: Vec::new(),
        tty: false,
        stdin: false,
        size: None,
        port: None,
        path: None,
        length: None,
        mode: None,
        sha256: None,
        image: None,
        window: DEFAULT_SESSION_WINDOW,
        lease_ms: 0,
    };
    let truthy = |v: &str| matches!(v, "true" | "1" | "");
    for (key, value) in form_urlencoded::parse(query.unwrap_or_default().as_bytes()) {
        let value = value.into_owned();
        match key.as_ref() {
            "command" => open.command.push(value),
            "stdin" => open.stdin = truthy(&value),
            "tty" => open.tty = truthy(&value),
            "stdout" | "stderr" => {}
            "ports" | "port" => {
                let port = value
                    .parse::<u16>()
                    .ok()
                    .filter(|p| *p > 0)
                    .ok_or_else(|| format!("{value:?} is not a port"))?;
                if open.port.replace(port).is_some() {
                    return Err("one port per connection".into());
                }
            }
            "copyFrom" => {
                open.kind = SessionKind::Download;
                open.path = Some(value);
            }
            "copyTo" => {
                open.kind = SessionKind::Upload;
                open.path = Some(value);
            }
            "loadImage" => {
                open.kind = SessionKind::LoadImage;
                open.sha256 = Some(value);
            }
            "image" => open.image = Some(value),
            "length" => open.length = Some(value.parse().map_err(|_| format!("length {value:?}"))?),
            "mode" => {
                open.mode =
                    Some(u32::from_str_radix(&value, 8).map_err(|_| format!("mode {value:?} (octal)"))?)
            }
            "width" | "height" => {
                let n: u16 = value.parse().map_err(|_| format!("{key} {value:?}"))?;
                let (w, h) = open.size.unwrap_or((80, 24));
                open.size = Some(if key == "width" { (n, h) } else { (w, n) });
            }
            other => return Err(format!("unknown parameter {other:?}")),
        }
    }
    if subresource == "portforward" && open.kind != SessionKind::Forward {
        return Err("copies go through exec".into());
    }
    if open.kind == SessionKind::Upload && open.length.is_none() {
        return Err("copyTo needs the file's length".into());
    }
    open.lease_ms = 0;
    open.check()?;
    Ok(open)
}

/// The channel protocol to answer with, of those the client offers.
fn protocol_of(headers: &HeaderMap) -> Option<&'static str> {
    let offered: Vec<String> = headers
        .get_all(header::SEC_WEBSOCKET_PROTOCOL)
        .iter()
        .filter_map(|v| v.to_str().ok())
        .flat_map(|v| v.split(','))
        .map(|p| p.trim().to_owned())
        .collect();
    PROTOCOLS.into_iter().find(|p| offered.iter().any(|o| o == p))
}

/// Who asked a session, where it runs and the object its Events are about.
struct Place {
    user: String,
    robot: String,
    regarding: ObjectReference,
}

/// Checks a session's ask: the user's right to it (a SubjectAccessReview),
/// its query, and that its robot is there to be asked; the open to send
/// it, or the answer to give.
async fn admit(
    state: &LogsState,
    peer: &PeerName,
    headers: &HeaderMap,
    target: &Target,
    subresource: &'static str,
    query: Option<&str>,
) -> Result<(SessionOpen, Place), Response> {
    let (ns, name) = match target {
        Target::Task { ns, name } => (Some(ns.as_str()), name.as_str()),
        Target::Robot { name } => (None, name.as_str()),
    };
    let user = super::authorize_as(
        state,
        peer,
        headers,
        ns,
        name,
        target.resource(),
        subresource,
        "create",
    )
    .await?;
    let mut open =
        parse_query(subresource, query).map_err(|why| status(StatusCode::BAD_REQUEST, "BadRequest", why))?;
    if open.kind == SessionKind::LoadImage && matches!(target, Target::Task { .. }) {
        return Err(status(
            StatusCode::BAD_REQUEST,
            "BadRequest",
            "an image push goes to a robot (robots/NAME/exec), not into a task".to_owned(),
        ));
    }
    open.user = user.clone();
    open.lease_ms = u64::try_from(state.session_lease.as_millis()).unwrap_or(u64::MAX);
    // Where it runs, and the object its Events are about.
    let (robot, regarding) = place_of(state, target, &mut open).await?;
    // Not 503 nor 504: clients (client-go, kube-rs) retry those for
    // minutes; kube-apiserver answers 500 for a kubelet it cannot dial.
    if let Some(why) = unreachable(&state.robots, &robot) {
        return Err(status(StatusCode::INTERNAL_SERVER_ERROR, "InternalError", why));
    }
    Ok((
        open,
        Place {
            user,
            robot,
            regarding,
        },
    ))
}

/// The subprotocol and the upgrade of a session's WebSocket; why a
/// request is not one (a bad request).
fn websocket_of(headers: &HeaderMap, request: &mut Request) -> Result<(&'static str, Upgrade), String> {
    let Some(protocol) = protocol_of(headers) else {
        return Err(format!(
            "a session is a WebSocket with subprotocol {}",
            PROTOCOLS.join(" or ")
        ));
    };
    let upgrade = Upgrade::of(request).ok_or("not a WebSocket upgrade")?;
    Ok((protocol, upgrade))
}

async fn session(
    state: LogsState,
    peer: PeerName,
    target: Target,
    subresource: &'static str,
    query: Option<String>,
    mut request: Request,
) -> Response {
    let headers = request.headers().clone();
    tracing::debug!(target = %target.describe(), subresource, "session asked");
    let (open, place) = match admit(&state, &peer, &headers, &target, subresource, query.as_deref()).await {
        Ok(admitted) => admitted,
        Err(answer) => return answer,
    };
    let Place {
        user,
        robot,
        regarding,
    } = place;
    let (protocol, upgrade) = match websocket_of(&headers, &mut request) {
        Ok(websocket) => websocket,
        Err(why) => return status(StatusCode::BAD_REQUEST, "BadRequest", why),
    };
    // Ask the robot before accepting: its refusal is an HTTP answer.
    let id = super::request_id();
    let Some(rx) = state.hub.open_session(&id, &robot) else {
        return status(
            StatusCode::TOO_MANY_REQUESTS,
            "TooManyRequests",
            "too many sessions; try again later".into(),
        );
    };
    let what = describe(&open);
    let mut bridge = Bridge::new(state.clone(), &id, robot.clone(), rx, open.lease());
    let opened = match bridge.open(open.clone()).await {
        Ok(opened) => opened,
        Err(refusal) => {
            state.hub.close_session(&id);
            return refusal;
        }
    };
    bridge.flow.peer_window(opened.window);
    info!(session = %id, %user, %robot, target = %target.describe(), %what, "session opened");
    record(
        &state,
        &regarding,
        EventType::Normal,
        "SessionOpened",
        format!(
            "{user} opened {what} on {} (robot {robot}{})",
            target.describe(),
            opened.run_as.map(|u| format!(", as {u}")).unwrap_or_default()
        ),
    )
    .await;
    let mut response = upgrade.switching(Some(protocol));
    if let Ok(v) = HeaderValue::from_str(&robot) {
        response.headers_mut().insert("x-k8s4r-robot", v);
    }
    tokio::spawn(serve(
        state,
        bridge,
        upgrade,
        id,
        Place {
            user,
            robot,
            regarding,
        },
        what,
    ));
    response
}

/// Carries an accepted session to its end, then says how it ended (the
/// log and an Event).
async fn serve(
    state: LogsState,
    mut bridge: Bridge,
    upgrade: Upgrade,
    id: String,
    place: Place,
    what: String,
) {
    let started = std::time::Instant::now();
    let Place {
        user,
        robot,
        regarding,
    } = place;
    let end = match upgrade.socket(None).await {
        Ok(ws) => bridge.run(ws).await,
        Err(e) => {
            bridge.hang_up().await;
            SessionEnd::error(format!("the WebSocket did not open: {e}"))
        }
    };
    state.hub.close_session(&id);
    let took = k8s4r_api::duration::format_duration(Duration::from_secs(started.elapsed().as_secs()));
    let outcome = outcome_of(&end);
    info!(session = %id, %user, %robot, %what, %outcome, bytes_in = end.bytes_in, bytes_out = end.bytes_out, "session ended");
    let kind = if end.error.is_some() {
        EventType::Warning
    } else {
        EventType::Normal
    };
    record(
        &state,
        &regarding,
        kind,
        "SessionEnded",
        format!(
            "{user}'s {what} on robot {robot} ended after {took}: {outcome}; {} bytes in, {} bytes out",
            end.bytes_in, end.bytes_out
        ),
    )
    .await;
}

/// The robot a session on `target` runs on, and the object its Events are
/// about; a task must be running, and `open` is told its uid and attempt.
/// An answer for the client when it cannot be opened.
async fn place_of(
    state: &LogsState,
    target: &Target,
    open: &mut SessionOpen,
) -> Result<(String, ObjectReference), Response> {
    match target {
        Target::Task { ns, name } => {
            let task = match super::task_named(&state.client, ns, name).await {
                Ok(task) => task,
                Err(answer) => return Err(answer),
            };
            let st = task.status.clone().unwrap_or_default();
            if st.state != Some(TaskState::Running) {
                let state = st.state.map_or("not started", TaskState::as_str);
                return Err(status(
                    StatusCode::BAD_REQUEST,
                    "BadRequest",
                    format!("task {name} is not running ({state}): sessions reach running tasks only"),
                ));
            }
            let Some(robot) = st.robot.clone() else {
                return Err(status(
                    StatusCode::BAD_REQUEST,
                    "BadRequest",
                    format!("task {name} has no robot"),
                ));
            };
            open.task_uid = task.metadata.uid.clone();
            open.attempt = Some(st.attempt);
            Ok((robot, task.object_ref(&())))
        }
        Target::Robot { name } => match state.robots.get(&ObjectRef::new(name)) {
            Some(robot) => Ok((name.clone(), robot.object_ref(&()))),
            None => Err(status(
                StatusCode::NOT_FOUND,
                "NotFound",
                format!("robots.robot.k8s4r.io \"{name}\" not found"),
            )),
        },
    }
}

/// What a session does, for people.
fn describe(open: &SessionOpen) -> String {
    match open.kind {
        SessionKind::Exec => format!("exec {:?}", open.command.join(" ")),
        SessionKind::Forward => format!("port-forward to port {}", open.port.unwrap_or(0)),
        SessionKind::Download => format!("copy of {}", open.path.as_deref().unwrap_or_default()),
        SessionKind::Upload => format!(
            "copy to {} ({} bytes)",
            open.path.as_deref().unwrap_or_default(),
            open.length.unwrap_or(0)
        ),
        SessionKind::LoadImage => format!(
            "image push of archive sha256:{} ({} bytes)",
            open.sha256.as_deref().unwrap_or_default(),
            open.length.unwrap_or(0)
        ),
    }
}

/// How a session ended, for people.
fn outcome_of(end: &SessionEnd) -> String {
    match (&end.error, end.exit_code, end.signal) {
        (Some(e), _, _) => e.clone(),
        (None, Some(code), _) => format!("exit status {code}"),
        (None, None, Some(signal)) => format!("killed by signal {signal}"),
        (None, None, None) => "closed".into(),
    }
}

async fn record(
    state: &LogsState,
    regarding: &ObjectReference,
    type_: EventType,
    reason: &str,
    note: String,
) {
    let event = Event {
        type_,
        reason: reason.into(),
        note: Some(note),
        action: "Session".into(),
        secondary: None,
    };
    if let Err(e) = state.recorder.publish(&event, regarding).await {
        warn!(error = %e, reason, "cannot record a session's Event");
    }
}

/// The Kubernetes Status that ends an exec's channel 3.
fn final_status(end: &SessionEnd) -> serde_json::Value {
    if let Some(error) = &end.error {
        let reason = if end.refused_by_setting.is_some() {
            "Forbidden"
        } else {
            "InternalError"
        };
        return json!({"metadata": {}, "status": "Failure", "message": error, "reason": reason});
    }
    let code = match (end.exit_code, end.signal) {
        (Some(code), _) => code,
        (None, Some(signal)) => 128 + signal,
        (None, None) => 0,
    };
    if code == 0 {
        return json!({"metadata": {}, "status": "Success"});
    }
    json!({
        "metadata": {}, "status": "Failure", "reason": "NonZeroExitCode",
        "message": format!("command terminated with non-zero exit code: {}", outcome_of(end)),
        "details": {"causes": [{"reason": "ExitCode", "message": code.to_string()}]},
    })
}

/// One session's two sides: the robot's frames and the client's
/// WebSocket.
struct Bridge {
    state: LogsState,
    robot: String,
    topic: String,
    rx: tokio::sync::mpsc::Receiver<Vec<u8>>,
    flow: Flow,
    epoch: std::time::Instant,
}

impl Bridge {
    fn new(
        state: LogsState,
        id: &str,
        robot: String,
        rx: tokio::sync::mpsc::Receiver<Vec<u8>>,
        lease: Duration,
    ) -> Self {
        let topic = state.topics.session_in(&robot, id);
        Bridge {
            state,
            robot,
            topic,
            rx,
            flow: Flow::new(DEFAULT_SESSION_WINDOW, lease, Duration::ZERO),
            epoch: std::time::Instant::now(),
        }
    }

    fn now(&self) -> Duration {
        self.epoch.elapsed()
    }

    async fn send(&mut self, frame: Frame) -> bool {
        let bytes = self.flow.send(&frame, self.now());
        self.state.publisher.queue_bulk(self.topic.clone(), bytes).await
    }

    /// Sends the open and waits for the robot's answer; a refusal is the
    /// HTTP answer to give.
    async fn open(&mut self, open: SessionOpen) -> Result<SessionOpened, Response> {
        let robot = self.robot.clone();
        if !self.send(Frame::Open(Box::new(open))).await {
            return Err(status(
                StatusCode::INTERNAL_SERVER_ERROR,
                "InternalError",
                format!("cannot reach robot {robot}: no broker connection"),
            ));
        }
        let first = tokio::time::timeout(OPEN_TIMEOUT, self.rx.recv()).await;
        let Ok(Some(bytes)) = first else {
            self.hang_up().await;
            return Err(status(
                StatusCode::INTERNAL_SERVER_ERROR,
                "InternalError",
                format!(
                    "robot {robot} did not answer the session in {}s (its agent may be too old, or cut off)",
                    OPEN_TIMEOUT.as_secs()
                ),
            ));
        };
        let now = self.now();
        match Frame::decode(&bytes) {
            Ok((seq, frame)) if self.flow.receive(seq, &frame, now).is_ok() => match frame {
                Frame::Opened(opened) => Ok(opened),
                Frame::End(end) => {
                    let message = end.error.unwrap_or_else(|| "the session ended at once".into());
                    let code = if end.refused_by_setting.is_some() {
                        StatusCode::FORBIDDEN
                    } else {
                        StatusCode::INTERNAL_SERVER_ERROR
                    };
                    let reason = if code == StatusCode::FORBIDDEN {
                        "Forbidden"
                    } else {
                        "InternalError"
                    };
                    Err(status(code, reason, message))
                }
                _ => Err(status(
                    StatusCode::BAD_GATEWAY,
                    "InternalError",
                    format!("robot {robot} answered the session out of turn"),
                )),
            },
            _ => Err(status(
                StatusCode::BAD_GATEWAY,
                "InternalError",
                format!("robot {robot} answered the session with a frame that cannot be read"),
            )),
        }
    }

    /// Tells the robot the session is over.
    async fn hang_up(&mut self) {
        self.send(Frame::End(SessionEnd::default())).await;
    }

    /// Carries the session until either side ends it; how it ended.
    async fn run<S>(mut self, ws: WebSocketStream<S>) -> SessionEnd
    where
        S: tokio::io::AsyncRead + tokio::io::AsyncWrite + Unpin,
    {
        let (mut sink, mut stream) = ws.split();
        let mut pending: VecDeque<Frame> = VecDeque::new();
        let mut bytes = Counted::default();
        let mut client_open = true;
        let tick = (self.flow.next_check(self.now())).min(Duration::from_secs(1));
        let mut ticker = tokio::time::interval(tick.max(Duration::from_millis(100)));
        let end = loop {
            // Data waits for the robot's credit; the client is read only
            // when nothing waits (its TCP window then holds it back).
            while self.flow.can_send() || pending.front().is_some_and(|f| !matches!(f, Frame::Data(..))) {
                let Some(frame) = pending.pop_front() else { break };
                if !self.send(frame).await {
                    break;
                }
            }
            let read_client = client_open && pending.is_empty();
            let ended = tokio::select! {
                message = stream.next(), if read_client => match message {
                    Some(Ok(Message::Binary(data))) => {
                        bytes.inbound += from_client(&data, &mut pending);
                        None
                    }
                    Some(Ok(Message::Close(_))) | None | Some(Err(_)) => {
                        client_open = false;
                        self.hang_up().await;
                        Some(SessionEnd::error("the client left"))
                    }
                    Some(Ok(_)) => None,
                },
                frame = self.rx.recv() => match frame {
                    Some(frame) => self.carry_from_robot(&frame, &mut sink, &mut bytes.outbound).await,
                    None => Some(SessionEnd::error("the session's route closed")),
                },
                _ = ticker.tick() => self.on_tick().await,
            };
            if let Some(end) = ended {
                break end;
            }
        };
        if client_open {
            let status = final_status(&end).to_string();
            let mut message = vec![STATUS_CHANNEL];
            message.extend_from_slice(status.as_bytes());
            let _ = sink.send(Message::Binary(message.into())).await;
            let _ = sink.send(Message::Close(None)).await;
        }
        bytes.into_end(end)
    }

    /// Carries one frame of the robot's to the client; the session's end
    /// when it ends it.
    async fn carry_from_robot<K>(
        &mut self,
        bytes: &[u8],
        sink: &mut K,
        bytes_out: &mut u64,
    ) -> Option<SessionEnd>
    where
        K: futures::Sink<Message> + Unpin,
    {
        let now = self.now();
        let (seq, frame) = match Frame::decode(bytes) {
            Ok(decoded) => decoded,
            Err(e) => {
                self.hang_up().await;
                return Some(SessionEnd::error(format!(
                    "robot {} sent a frame that cannot be read: {e}",
                    self.robot
                )));
            }
        };
        if let Err(gap) = self.flow.receive(seq, &frame, now) {
            self.hang_up().await;
            return Some(SessionEnd::error(format!("robot {}: {gap}", self.robot)));
        }
        match frame {
            Frame::Data(channel, data) => {
                *bytes_out += data.len() as u64;
                let mut message = Vec::with_capacity(data.len() + 1);
                message.push(channel);
                message.extend_from_slice(&data);
                if sink.send(Message::Binary(message.into())).await.is_err() {
                    self.hang_up().await;
                    return Some(SessionEnd::error("the client left"));
                }
                if let Some(n) = self.flow.consumed() {
                    self.send(Frame::Credit(n)).await;
                }
                None
            }
            Frame::Eof(channel) => {
                let _ = sink
                    .send(Message::Binary(vec![CLOSE_CHANNEL, channel].into()))
                    .await;
                None
            }
            Frame::End(end) => Some(end),
            Frame::Credit(_) | Frame::Alive | Frame::Open(_) | Frame::Opened(_) | Frame::Resize(..) => None,
        }
    }

    /// The robot's lease on the session, and keep-alives to it; the end
    /// when the robot stopped answering.
    async fn on_tick(&mut self) -> Option<SessionEnd> {
        let now = self.now();
        if self.flow.lapsed(now) {
            self.hang_up().await;
            return Some(SessionEnd::error(format!(
                "robot {} stopped answering (cut off from the broker?); the session is over",
                self.robot
            )));
        }
        if self.flow.keepalive_due(now) {
            self.send(Frame::Alive).await;
        }
        None
    }
}

/// The bytes a session carried, as the server counted them.
#[derive(Default)]
struct Counted {
    inbound: u64,
    outbound: u64,
}

impl Counted {
    /// The end with the robot's counts, or the server's where the robot
    /// gave none.
    fn into_end(self, end: SessionEnd) -> SessionEnd {
        SessionEnd {
            bytes_in: if end.bytes_in > 0 {
                end.bytes_in
            } else {
                self.inbound
            },
            bytes_out: if end.bytes_out > 0 {
                end.bytes_out
            } else {
                self.outbound
            },
            ..end
        }
    }
}

/// The frames a client's binary message asks of the robot, queued on
/// `pending`; how many bytes of stdin it carried.
fn from_client(data: &[u8], pending: &mut VecDeque<Frame>) -> u64 {
    let Some((&channel, body)) = data.split_first() else {
        return 0;
    };
    match channel {
        STDIN => {
            for chunk in body.chunks(MAX_SESSION_DATA) {
                pending.push_back(Frame::Data(STDIN, chunk.to_vec()));
            }
            body.len() as u64
        }
        RESIZE_CHANNEL => {
            if let Ok(size) = serde_json::from_slice::<serde_json::Value>(body) {
                let dim = |k: &str| size[k].as_u64().and_then(|n| u16::try_from(n).ok()).unwrap_or(0);
                pending.push_back(Frame::Resize(dim("Width"), dim("Height")));
            }
            0
        }
        CLOSE_CHANNEL if body.first() == Some(&STDIN) => {
            pending.push_back(Frame::Eof(STDIN));
            0
        }
        _ => 0,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn queries_read_as_kubectl_writes_them() {
        let open = parse_query(
            "exec",
            Some("command=sh&command=-c&command=echo%20hi&stdin=true&tty=true"),
        )
        .unwrap();
        assert_eq!(open.command, vec!["sh", "-c", "echo hi"]);
        assert!(open.stdin && open.tty);
        let fwd = parse_query("portforward", Some("ports=8080")).unwrap();
        assert_eq!((fwd.kind, fwd.port), (SessionKind::Forward, Some(8080)));
        let up = parse_query("exec", Some("copyTo=%2Ftmp%2Fx&length=3&mode=600")).unwrap();
        assert_eq!(
            (up.kind, up.length, up.mode),
            (SessionKind::Upload, Some(3), Some(0o600))
        );
        let sha = "a".repeat(64);
        let push = parse_query("exec", Some(&format!("loadImage={sha}&length=9"))).unwrap();
        assert_eq!(
            (push.kind, push.sha256.as_deref(), push.length),
            (SessionKind::LoadImage, Some(sha.as_str()), Some(9))
        );
        assert!(
            parse_query("exec", Some("loadImage=abc&length=9")).is_err(),
            "a sha256"
        );
        assert!(
            parse_query("exec", Some(&format!("loadImage={sha}"))).is_err(),
            "a length"
        );
        assert!(parse_query("exec", None).is_err(), "no command");
        assert!(
            parse_query("exec", Some("copyTo=x")).is_err(),
            "an upload says its length"
        );
        assert!(parse_query("portforward", Some("ports=0")).is_err());
        assert!(parse_query("portforward", Some("ports=1&ports=2")).is_err());
        assert!(parse_query("exec", Some("command=x&shell=1")).is_err());
    }

    #[test]
    fn the_final_status_says_the_exit_code_as_kubelet_does() {
        let ok = final_status(&SessionEnd {
            exit_code: Some(0),
            ..SessionEnd::default()
        });
        assert_eq!(ok["status"], "Success");
        let three = final_status(&SessionEnd {
            exit_code: Some(3),
            ..SessionEnd::default()
        });
        assert_eq!(three["reason"], "NonZeroExitCode");
        assert_eq!(three["details"]["causes"][0]["message"], "3");
        let killed = final_status(&SessionEnd {
            signal: Some(9),
            ..SessionEnd::default()
        });
        assert_eq!(killed["details"]["causes"][0]["message"], "137");
        let refused = final_status(&SessionEnd::refused("no", "sessions"));
        assert_eq!(refused["reason"], "Forbidden");
    }
}
