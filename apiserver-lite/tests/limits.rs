//! The in-flight, watch and connection limits, against the real server over
//! real sockets: what a client over a limit is answered, that the others
//! are still served, and that slots come back.

mod common;

use std::net::SocketAddr;
use std::time::{Duration, Instant};

use apiserver_lite::{Config, Limits, RunningServer, User};
use common::eventually;
use futures::StreamExt;
use k8s_openapi::api::core::v1::ConfigMap;
use k8s_openapi::api::rbac::v1::{ClusterRole, ClusterRoleBinding};
use kube::api::{Api, ListParams, PostParams, WatchEvent, WatchParams};
use kube::Client;
use serde_json::{json, Value};
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::TcpStream;

const ALICE: &str = "alice-token";
const BOB: &str = "bob-token";
/// The group the test users are in, which the ClusterRole is bound to.
const TESTERS: &str = "testers";
const WAIT: Duration = Duration::from_secs(20);

fn tester(name: &str) -> User {
    User::new(name, [TESTERS.to_owned()])
}

/// A server with users alice and bob, who may do anything to ConfigMaps.
async fn server(config: Config) -> RunningServer {
    let server = config
        .user(ALICE, tester("alice"))
        .user(BOB, tester("bob"))
        .start()
        .await
        .expect("server starts");
    let admin = server.client().await.unwrap();
    let role: ClusterRole = serde_json::from_value(json!({
        "metadata": {"name": "configmaps"},
        "rules": [{"apiGroups": [""], "resources": ["configmaps"], "verbs": ["*"]}],
    }))
    .unwrap();
    Api::<ClusterRole>::all(admin.clone())
        .create(&PostParams::default(), &role)
        .await
        .unwrap();
    let binding: ClusterRoleBinding = serde_json::from_value(json!({
        "metadata": {"name": "testers-configmaps"},
        "roleRef": {"apiGroup": "rbac.authorization.k8s.io", "kind": "ClusterRole", "name": "configmaps"},
        "subjects": [{"apiGroup": "rbac.authorization.k8s.io", "kind": "Group", "name": TESTERS}],
    }))
    .unwrap();
    Api::<ClusterRoleBinding>::all(admin)
        .create(&PostParams::default(), &binding)
        .await
        .unwrap();
    server
}

/// A client presenting `token` that does not retry 429s, so that a test
/// sees them (kube's default client retries them after `Retry-After`).
async fn no_retry_client(server: &RunningServer, token: &str) -> Client {
    let yaml = apiserver_lite::kubeconfig_yaml(&server.url(), token, server.ca_pem());
    let kubeconfig = kube::config::Kubeconfig::from_yaml(&yaml).unwrap();
    let mut config =
        kube::Config::from_custom_kubeconfig(kubeconfig, &kube::config::KubeConfigOptions::default())
            .await
            .unwrap();
    config.default_retry = false;
    Client::try_from(config).unwrap()
}

fn configmaps(client: &Client) -> Api<ConfigMap> {
    Api::namespaced(client.clone(), "default")
}

fn configmap(name: &str) -> ConfigMap {
    serde_json::from_value(json!({"metadata": {"name": name}, "data": {"k": "v"}})).unwrap()
}

/// The `Status` of a 429, checked to be the one kube-apiserver sends.
fn too_many<T>(result: Result<T, kube::Error>) -> String {
    match result {
        Err(kube::Error::Api(s)) if s.code == 429 => {
            assert_eq!(s.reason, "TooManyRequests");
            assert_eq!(
                s.details.as_ref().map(|d| d.retry_after_seconds),
                Some(1),
                "{s:?}"
            );
            s.message
        }
        Err(other) => panic!("expected 429 TooManyRequests, got {other:?}"),
        Ok(_) => panic!("expected 429 TooManyRequests, got a success"),
    }
}

/// A request over a raw plain-HTTP connection whose body is only half sent,
/// so that the server holds its slot until [`Held::finish`].
struct Held {
    stream: TcpStream,
    rest: Vec<u8>,
}

fn head(method: &str, path: &str, token: &str, body_len: usize) -> String {
    format!(
        "{method} {path} HTTP/1.1\r\nHost: localhost\r\nAuthorization: Bearer {token}\r\n\
         Content-Type: application/json\r\nContent-Length: {body_len}\r\nConnection: close\r\n\r\n"
    )
}

impl Held {
    async fn start(addr: SocketAddr, method: &str, path: &str, token: &str, body: Value) -> Held {
        let body = serde_json::to_vec(&body).unwrap();
        let mut stream = TcpStream::connect(addr).await.unwrap();
        stream
            .write_all(head(method, path, token, body.len()).as_bytes())
            .await
            .unwrap();
        let half = body.len() / 2;
        stream.write_all(&body[..half]).await.unwrap();
        Held {
            stream,
            rest: body[half..].to_vec(),
        }
    }

    /// Sends the rest of the body; the answer's status line.
    async fn finish(mut self) -> String {
        self.stream.write_all(&self.rest).await.unwrap();
        let mut answer = String::new();
        self.stream.read_to_string(&mut answer).await.unwrap();
        answer.lines().next().unwrap_or_default().to_owned()
    }
}

/// One whole request over a raw connection: the answer's head (lowercase)
/// and its body.
async fn raw(addr: SocketAddr, method: &str, path: &str, token: &str, body: Value) -> (String, Value) {
    let body = serde_json::to_vec(&body).unwrap();
    let mut stream = TcpStream::connect(addr).await.unwrap();
    stream
        .write_all(head(method, path, token, body.len()).as_bytes())
        .await
        .unwrap();
    stream.write_all(&body).await.unwrap();
    let mut answer = String::new();
    stream.read_to_string(&mut answer).await.unwrap();
    let (head, body) = answer.split_once("\r\n\r\n").unwrap();
    (
        head.to_lowercase(),
        serde_json::from_str(body).unwrap_or(Value::Null),
    )
}

async fn until(what: &str, mut done: impl FnMut() -> bool) {
    eventually(WAIT, what, || std::future::ready(done().then_some(()))).await
}

const CONFIGMAPS: &str = "/api/v1/namespaces/default/configmaps";

#[tokio::test]
async fn requests_over_the_inflight_limits_get_429_with_retry_after() {
    let limits = Limits {
        max_requests_inflight: 1,
        max_mutating_requests_inflight: 2,
        ..Limits::default()
    };
    let server = server(Config::for_tests().tls(false).limits(limits)).await;
    let addr = server.addr();
    let admin = server.client().await.unwrap();
    let alice = no_retry_client(&server, ALICE).await;

    // Two slow creates fill the mutating pool.
    let mut slow = Vec::new();
    for name in ["slow-1", "slow-2"] {
        let held = Held::start(addr, "POST", CONFIGMAPS, ALICE, json!(configmap(name))).await;
        slow.push(held);
    }
    until("the slow creates to hold both slots", || {
        server.usage().mutating == 2
    })
    .await;

    let message = too_many(
        configmaps(&alice)
            .create(&PostParams::default(), &configmap("c"))
            .await,
    );
    assert_eq!(message, "Too many requests, please try again later.");
    let (head, status) = raw(addr, "POST", CONFIGMAPS, ALICE, json!(configmap("d"))).await;
    let lines: Vec<&str> = head.lines().collect();
    assert!(lines[0].starts_with("http/1.1 429"), "{head}");
    assert!(lines.contains(&"retry-after: 1"), "{head}");
    assert!(lines.contains(&"content-type: application/json"), "{head}");
    assert_eq!(status["kind"], "Status");
    assert_eq!(status["code"], 429);
    assert_eq!(status["details"]["retryAfterSeconds"], 1);

    // Reads have a pool of their own, and system:masters are served over a full one.
    configmaps(&alice).list(&ListParams::default()).await.unwrap();
    configmaps(&admin)
        .create(&PostParams::default(), &configmap("by-admin"))
        .await
        .unwrap();

    // A client that honours Retry-After gets through once there is room.
    let patient = server.client_with_token(ALICE).await.unwrap();
    let rejected = server.usage().rejected_requests;
    let retried = tokio::spawn(async move {
        configmaps(&patient)
            .create(&PostParams::default(), &configmap("patient"))
            .await
    });
    until("the patient create to be refused once", || {
        server.usage().rejected_requests > rejected
    })
    .await;

    // The slow requests were admitted, so they are served in full.
    for held in slow {
        let status_line = held.finish().await;
        assert!(status_line.starts_with("HTTP/1.1 201"), "{status_line}");
    }
    until("the slots to come back", || server.usage().mutating == 0).await;
    tokio::time::timeout(WAIT, retried)
        .await
        .expect("the retried create ends")
        .unwrap()
        .expect("the retried create succeeds");
    configmaps(&alice)
        .create(&PostParams::default(), &configmap("after"))
        .await
        .unwrap();

    // A slow read fills the read pool; a watch is not an in-flight request.
    let slow_read = Held::start(addr, "GET", CONFIGMAPS, ALICE, json!({"pad": "pad"})).await;
    until("the slow read to hold its slot", || server.usage().read_only == 1).await;
    too_many(configmaps(&alice).list(&ListParams::default()).await);
    let watch = configmaps(&alice).watch(&WatchParams::default(), "0").await;
    assert!(watch.is_ok(), "a watch is not limited by --max-requests-inflight");
    configmaps(&admin).list(&ListParams::default()).await.unwrap();
    let status_line = slow_read.finish().await;
    assert!(status_line.starts_with("HTTP/1.1 200"), "{status_line}");
    until("the read slot to come back", || server.usage().read_only == 0).await;
    configmaps(&alice).list(&ListParams::default()).await.unwrap();
}

/// Starts a watch of ConfigMaps, or the error it was answered.
async fn watch(
    client: &Client,
    params: &WatchParams,
) -> Result<impl futures::Stream<Item = kube::Result<WatchEvent<ConfigMap>>> + Unpin, kube::Error> {
    configmaps(client).watch(params, "0").await.map(Box::pin)
}

#[tokio::test]
async fn watches_over_the_watch_limits_get_429_and_slots_come_back() {
    let limits = Limits {
        max_watches: 3,
        max_watches_per_user: 2,
        ..Limits::default()
    };
    let server = server(Config::for_tests().limits(limits)).await;
    let admin = server.client().await.unwrap();
    let alice = no_retry_client(&server, ALICE).await;
    let bob = no_retry_client(&server, BOB).await;
    configmaps(&admin)
        .create(&PostParams::default(), &configmap("a"))
        .await
        .unwrap();

    let every = WatchParams::default();
    let _first = watch(&alice, &every).await.unwrap();
    let second = watch(&alice, &every).await.unwrap();
    let message = too_many(watch(&alice, &every).await);
    assert_eq!(
        message,
        "Too many watches by user \"alice\": 2 is the limit, please try again later."
    );
    let _bobs = watch(&bob, &every).await.unwrap();
    let message = too_many(watch(&bob, &every).await);
    assert_eq!(
        message,
        "Too many watches: 3 is the limit, please try again later."
    );
    assert_eq!(server.usage().watches, 3);

    // Lists and gets are not watches.
    assert_eq!(
        configmaps(&alice)
            .list(&ListParams::default())
            .await
            .unwrap()
            .items
            .len(),
        1
    );
    configmaps(&bob).get("a").await.unwrap();
    // The administrator (system:masters) is served over the limit.
    let _admins = watch(&admin, &every).await.unwrap();

    // A watch whose client goes away gives its slot back.
    drop(second);
    let third = eventually(WAIT, "alice's next watch after she dropped one", || async {
        watch(&alice, &every).await.ok()
    })
    .await;
    // So does one that times out: while it lasts alice is at her limit,
    // so her next watch is admitted only once it has ended.
    drop(third);
    let _ending = eventually(WAIT, "a watch that times out", || async {
        watch(&alice, &WatchParams::default().timeout(1)).await.ok()
    })
    .await;
    let _last = eventually(WAIT, "alice's next watch after one timed out", || async {
        watch(&alice, &every).await.ok()
    })
    .await;
}

#[tokio::test]
async fn silent_connections_do_not_keep_others_out() {
    let limits = Limits {
        max_connections: 8,
        max_tls_handshakes: 2,
        tls_handshake_timeout: Duration::from_millis(500),
        ..Limits::default()
    };
    let server = Config::for_tests().limits(limits).start().await.unwrap();
    let before = server.client().await.unwrap();
    let mut events = watch(&before, &WatchParams::default()).await.unwrap();

    // Many connections that never send a byte: more than the limit, so
    // some are closed at once and the rest hold every slot left.
    let mut silent = Vec::new();
    for _ in 0..40 {
        silent.push(TcpStream::connect(server.addr()).await.unwrap());
    }
    until("connections over the limit to be refused", || {
        server.usage().refused_connections > 0
    })
    .await;

    // A new, well-behaved client is served once the silent ones time out.
    let late = server.client().await.unwrap();
    eventually(WAIT, "a new client to be served", || async {
        configmaps(&late).list(&ListParams::default()).await.ok()
    })
    .await;
    eventually(WAIT, "a create by the new client", || async {
        configmaps(&late)
            .create(&PostParams::default(), &configmap("seen"))
            .await
            .ok()
    })
    .await;
    // The watch that was open before is unharmed.
    let deadline = Instant::now() + WAIT;
    loop {
        let next = tokio::time::timeout_at(deadline.into(), events.next()).await;
        match next.expect("the watch sees the create") {
            Some(Ok(WatchEvent::Added(cm))) if cm.metadata.name.as_deref() == Some("seen") => break,
            Some(Ok(_)) => continue,
            other => panic!("the watch ended: {other:?}"),
        }
    }

    // Every silent connection has been closed by the server.
    for mut stream in silent {
        let mut buf = [0u8; 16];
        let read = tokio::time::timeout(WAIT, stream.read(&mut buf)).await;
        match read.expect("the server closes a silent connection") {
            Ok(0) | Err(_) => {}
            Ok(n) => panic!("a silent connection was sent {n} bytes"),
        }
    }
}

#[tokio::test]
async fn connections_that_send_no_complete_header_are_closed() {
    let limits = Limits {
        header_read_timeout: Duration::from_millis(300),
        ..Limits::default()
    };
    let server = Config::for_tests()
        .tls(false)
        .limits(limits)
        .start()
        .await
        .unwrap();
    let addr = server.addr();

    let closed = |mut stream: TcpStream| async move {
        let mut answer = Vec::new();
        let read = tokio::time::timeout(WAIT, stream.read_to_end(&mut answer)).await;
        assert!(read.is_ok(), "the server closes the connection");
        answer
    };
    // Nothing at all.
    closed(TcpStream::connect(addr).await.unwrap()).await;
    // Half a header.
    let mut half = TcpStream::connect(addr).await.unwrap();
    half.write_all(b"GET /version HTTP/1.1\r\nHost: localhost\r\n")
        .await
        .unwrap();
    closed(half).await;
    // A keep-alive connection left idle after its answer.
    let mut idle = TcpStream::connect(addr).await.unwrap();
    idle.write_all(b"GET /healthz HTTP/1.1\r\nHost: localhost\r\n\r\n")
        .await
        .unwrap();
    let answer = closed(idle).await;
    assert!(
        answer.starts_with(b"HTTP/1.1 200"),
        "{}",
        String::from_utf8_lossy(&answer)
    );
    until("the closed connections to give their slots back", || {
        server.usage().connections == 0
    })
    .await;

    // A client that talks normally is served.
    let client = server.client().await.unwrap();
    configmaps(&client).list(&ListParams::default()).await.unwrap();
}

#[tokio::test]
async fn a_body_that_never_finishes_is_answered_408_and_gives_its_slot_back() {
    let limits = Limits {
        max_mutating_requests_inflight: 1,
        body_read_timeout: Duration::from_millis(500),
        ..Limits::default()
    };
    let server = server(Config::for_tests().tls(false).limits(limits)).await;
    let addr = server.addr();
    let alice = no_retry_client(&server, ALICE).await;

    let mut stalled = Held::start(addr, "POST", CONFIGMAPS, ALICE, json!(configmap("stalled"))).await;
    until("the stalled create to hold the slot", || {
        server.usage().mutating == 1
    })
    .await;
    let mut answer = String::new();
    tokio::time::timeout(WAIT, stalled.stream.read_to_string(&mut answer))
        .await
        .expect("the stalled request is answered")
        .unwrap();
    assert!(answer.starts_with("HTTP/1.1 408"), "{answer}");
    assert!(answer.contains("did not arrive"), "{answer}");
    until("the slot to come back", || server.usage().mutating == 0).await;
    configmaps(&alice)
        .create(&PostParams::default(), &configmap("after"))
        .await
        .expect("a write is admitted once the stalled one is answered");
}
