//! Protobuf over real HTTP with the kube client's transport: what client-go
//! sends for built-in kinds, and what it gets back.

mod common;

use apiserver_lite::protobuf::{decode, encode, MEDIA_TYPE};
use http::{header, Method, Request, StatusCode};
use http_body_util::BodyExt;
use kube::client::Body;
use kube::Client;
use serde_json::{json, Value};

/// client-go's Accept for built-in kinds.
const PREFERS_PROTOBUF: &str = "application/vnd.kubernetes.protobuf, */*";

struct Answer {
    code: StatusCode,
    content_type: String,
    body: Vec<u8>,
}

impl Answer {
    /// The object answered, whichever way it was encoded.
    fn object(&self) -> Value {
        if self.content_type == MEDIA_TYPE {
            decode(&self.body, ("", "")).unwrap_or_else(|e| panic!("{e}"))
        } else {
            serde_json::from_slice(&self.body)
                .unwrap_or_else(|e| panic!("{e}: {}", String::from_utf8_lossy(&self.body)))
        }
    }
}

async fn call(client: &Client, method: Method, uri: &str, content_type: &str, body: Vec<u8>) -> Answer {
    let req = Request::builder()
        .method(method)
        .uri(uri)
        .header(header::ACCEPT, PREFERS_PROTOBUF)
        .header(header::CONTENT_TYPE, content_type)
        .body(Body::from(body))
        .unwrap();
    let resp = client.send(req).await.unwrap();
    let code = resp.status();
    let content_type = resp.headers()[header::CONTENT_TYPE].to_str().unwrap().to_owned();
    let body = resp.into_body().collect().await.unwrap().to_bytes().to_vec();
    Answer {
        code,
        content_type,
        body,
    }
}

fn secret(data: &str) -> Value {
    json!({"apiVersion": "v1", "kind": "Secret", "metadata": {"name": "s", "namespace": "default"}, "data": {"a": data}})
}

#[tokio::test]
async fn built_in_kinds_are_written_and_read_in_protobuf() {
    let (server, client) = common::server().await;
    let secrets = "/api/v1/namespaces/default/secrets";

    let created = call(
        &client,
        Method::POST,
        secrets,
        MEDIA_TYPE,
        encode(&secret("Yg==")).unwrap(),
    )
    .await;
    assert_eq!(created.code, StatusCode::CREATED);
    assert_eq!(created.content_type, MEDIA_TYPE);
    let created = created.object();
    assert_eq!(created["data"], json!({"a": "Yg=="}));
    assert!(created["metadata"]["uid"].is_string());

    // An update carries the resourceVersion it read.
    let mut changed = secret("Yw==");
    changed["metadata"]["resourceVersion"] = created["metadata"]["resourceVersion"].clone();
    let updated = call(
        &client,
        Method::PUT,
        &format!("{secrets}/s"),
        MEDIA_TYPE,
        encode(&changed).unwrap(),
    )
    .await;
    assert_eq!(updated.code, StatusCode::OK, "{}", updated.object());
    let stale = call(
        &client,
        Method::PUT,
        &format!("{secrets}/s"),
        MEDIA_TYPE,
        encode(&changed).unwrap(),
    )
    .await;
    assert_eq!(stale.code, StatusCode::CONFLICT);
    assert_eq!(
        stale.content_type, MEDIA_TYPE,
        "errors are protobuf Status objects"
    );
    assert_eq!(stale.object()["reason"], "Conflict");

    let list = call(&client, Method::GET, secrets, MEDIA_TYPE, Vec::new()).await;
    assert_eq!(list.content_type, MEDIA_TYPE);
    let list = list.object();
    assert_eq!(list["kind"], "SecretList");
    assert_eq!(list["items"][0]["data"], json!({"a": "Yw=="}));
    assert!(list["metadata"]["resourceVersion"].is_string());

    // DeleteOptions as a typed client-go client sends them.
    let options = json!({"apiVersion": "v1", "kind": "DeleteOptions", "propagationPolicy": "Orphan", "dryRun": ["All"]});
    let dry = call(
        &client,
        Method::DELETE,
        &format!("{secrets}/s"),
        MEDIA_TYPE,
        encode(&options).unwrap(),
    )
    .await;
    assert_eq!(dry.code, StatusCode::OK, "{}", dry.object());
    let still = call(
        &client,
        Method::GET,
        &format!("{secrets}/s"),
        MEDIA_TYPE,
        Vec::new(),
    )
    .await;
    assert_eq!(still.code, StatusCode::OK, "a dry run deletes nothing");

    // Watches stay JSON, which client-go's Accept allows.
    let watch = Request::builder()
        .uri(format!("{secrets}?watch=true&timeoutSeconds=1"))
        .header(header::ACCEPT, PREFERS_PROTOBUF)
        .body(Body::empty())
        .unwrap();
    let watch = client.send(watch).await.unwrap();
    assert_eq!(watch.headers()[header::CONTENT_TYPE], "application/json");
    server.shutdown().await.unwrap();
}

#[tokio::test]
async fn malformed_protobuf_is_400_and_custom_resources_refuse_it() {
    let (server, client) = common::server().await;
    common::install_crds(&client).await;
    let configmaps = "/api/v1/namespaces/default/configmaps";
    for (body, what) in [
        (b"{}".to_vec(), "no magic"),
        (b"k8s\0\x0a\xff".to_vec(), "truncated"),
        (b"k8s\0\x12\x03\x0a\x05a".to_vec(), "truncated object"),
    ] {
        let answer = call(&client, Method::POST, configmaps, MEDIA_TYPE, body).await;
        assert_eq!(answer.code, StatusCode::BAD_REQUEST, "{what}");
        let status = answer.object();
        assert!(
            status["message"]
                .as_str()
                .is_some_and(|m| m.contains("could not be decoded as protobuf")),
            "{what}: {status}"
        );
    }
    let widget =
        encode(&json!({"apiVersion": "v1", "kind": "ConfigMap", "metadata": {"name": "w"}})).unwrap();
    let answer = call(
        &client,
        Method::POST,
        "/apis/test.k8s4r.io/v1/namespaces/default/widgets",
        MEDIA_TYPE,
        widget,
    )
    .await;
    assert_eq!(answer.code, StatusCode::UNSUPPORTED_MEDIA_TYPE);
    server.shutdown().await.unwrap();
}
