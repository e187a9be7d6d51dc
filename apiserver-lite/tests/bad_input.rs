//! Malformed and conflicting requests, answered as a real server answers them.

mod common;

use common::*;
use k8s_openapi::api::core::v1::{ConfigMap, Namespace};
use k8s_openapi::apiextensions_apiserver::pkg::apis::apiextensions::v1::CustomResourceDefinition;
use kube::api::{Api, DeleteParams, PostParams};
use kube::{CustomResourceExt, Error, ResourceExt};
use serde_json::{json, Value};

fn request(method: &str, uri: &str, content_type: &str, body: Vec<u8>) -> http::Request<Vec<u8>> {
    http::Request::builder()
        .method(method)
        .uri(uri)
        .header("Content-Type", content_type)
        .body(body)
        .unwrap()
}

/// (code, reason) of a failed request.
async fn status_of(client: &kube::Client, req: http::Request<Vec<u8>>) -> (u16, String) {
    match client.request_text(req).await {
        Err(Error::Api(s)) => (s.code, s.reason.clone()),
        Ok(text) => panic!("expected a failure, got {text}"),
        Err(other) => panic!("expected an API error, got {other:?}"),
    }
}

const WIDGETS: &str = "/apis/test.k8s4r.io/v1/namespaces/default/widgets";

#[tokio::test]
async fn malformed_and_misdirected_requests() {
    let server = apiserver_lite::Config::for_tests()
        .max_body_bytes(64 * 1024)
        .start()
        .await
        .unwrap();
    let client = server.client().await.unwrap();
    install_crds(&client).await;

    let json = "application/json";
    assert_eq!(
        status_of(&client, request("POST", WIDGETS, json, b"{not json".to_vec())).await,
        (400, "BadRequest".into())
    );
    let wrong_kind = json!({"apiVersion": "test.k8s4r.io/v1", "kind": "Gadget", "metadata": {"name": "x"}, "spec": {"size": 1}});
    assert_eq!(
        status_of(
            &client,
            request("POST", WIDGETS, json, wrong_kind.to_string().into_bytes())
        )
        .await,
        (400, "BadRequest".into())
    );
    let wrong_group = json!({"apiVersion": "other.io/v1", "kind": "Widget", "metadata": {"name": "x"}, "spec": {"size": 1}});
    assert_eq!(
        status_of(
            &client,
            request("POST", WIDGETS, json, wrong_group.to_string().into_bytes())
        )
        .await
        .0,
        400
    );
    assert_eq!(
        status_of(
            &client,
            request(
                "GET",
                "/apis/test.k8s4r.io/v1/namespaces/default/nothings",
                json,
                vec![]
            )
        )
        .await,
        (404, "NotFound".into())
    );
    assert_eq!(
        status_of(&client, request("GET", "/apis/nope.io/v1/things", json, vec![]))
            .await
            .0,
        404
    );
    assert_eq!(
        status_of(
            &client,
            request(
                "GET",
                "/apis/test.k8s4r.io/v1/namespaces/default/widgets/x/bogus",
                json,
                vec![]
            )
        )
        .await
        .0,
        404
    );
    assert_eq!(
        status_of(&client, request("PUT", WIDGETS, json, b"{}".to_vec())).await,
        (405, "MethodNotAllowed".into())
    );
    let big = vec![b' '; 100 * 1024];
    assert_eq!(
        status_of(&client, request("POST", WIDGETS, json, big)).await.0,
        413
    );
    let api: Api<Widget> = Api::namespaced(client.clone(), "default");
    api.create(&PostParams::default(), &widget("w", 1)).await.unwrap();
    let (code, reason) = status_of(
        &client,
        request("PATCH", &format!("{WIDGETS}/w"), "text/plain", b"{}".to_vec()),
    )
    .await;
    assert_eq!((code, reason.as_str()), (415, "UnsupportedMediaType"));
    let (code, _) = status_of(
        &client,
        request(
            "PATCH",
            &format!("{WIDGETS}/w"),
            "application/apply-patch+yaml",
            b"{}".to_vec(),
        ),
    )
    .await;
    assert_eq!(code, 400, "apply without fieldManager");

    // A wrong token is refused.
    let kc = apiserver_lite::kubeconfig_yaml(&server.url(), "wrong", server.ca_pem());
    let intruder = apiserver_lite::server::client_for(&kc).await.unwrap();
    let ns: Api<Namespace> = Api::all(intruder);
    match ns.list(&Default::default()).await {
        Err(Error::Api(s)) => assert_eq!(s.code, 401),
        other => panic!("expected 401, got {other:?}"),
    }
    server.shutdown().await.unwrap();
}

#[tokio::test]
async fn concurrent_conflicting_updates_let_exactly_one_win() {
    let (server, client) = server().await;
    install_crds(&client).await;
    let api: Api<Widget> = Api::namespaced(client.clone(), "default");
    api.create(&PostParams::default(), &widget("race", 0))
        .await
        .unwrap();
    let base = api.get("race").await.unwrap();
    let tasks: Vec<_> = (1..=8)
        .map(|i| {
            let (api, mut w) = (api.clone(), base.clone());
            tokio::spawn(async move {
                w.spec.size = i;
                api.replace("race", &PostParams::default(), &w).await
            })
        })
        .collect();
    let mut wins = 0;
    let mut conflicts = 0;
    for t in tasks {
        match t.await.unwrap() {
            Ok(_) => wins += 1,
            Err(Error::Api(s)) if s.code == 409 => conflicts += 1,
            Err(e) => panic!("unexpected {e:?}"),
        }
    }
    assert_eq!((wins, conflicts), (1, 7));
    server.shutdown().await.unwrap();
}

#[tokio::test]
async fn tables_namespaces_and_crd_removal() {
    let (server, client) = server().await;
    install_crds(&client).await;
    let api: Api<Widget> = Api::namespaced(client.clone(), "default");
    api.create(&PostParams::default(), &widget("t", 3)).await.unwrap();
    let req = http::Request::builder()
        .uri(WIDGETS)
        .header(
            "Accept",
            "application/json;as=Table;v=v1;g=meta.k8s.io,application/json",
        )
        .body(vec![])
        .unwrap();
    let table: Value = serde_json::from_str(&client.request_text(req).await.unwrap()).unwrap();
    assert_eq!(table["kind"], "Table");
    let names: Vec<&str> = table["columnDefinitions"]
        .as_array()
        .unwrap()
        .iter()
        .map(|c| c["name"].as_str().unwrap())
        .collect();
    assert_eq!(names, vec!["Name", "Size", "Phase"]);
    assert_eq!(table["rows"][0]["cells"], json!(["t", 3, null]));
    assert_eq!(table["rows"][0]["object"]["kind"], "PartialObjectMetadata");

    // Objects need their namespace; deleting a namespace deletes its objects.
    let other: Api<ConfigMap> = Api::namespaced(client.clone(), "team");
    let cm: ConfigMap = serde_json::from_value(json!({"metadata": {"name": "c"}})).unwrap();
    match other.create(&PostParams::default(), &cm).await {
        Err(Error::Api(s)) => assert_eq!(s.code, 404),
        r => panic!("expected 404, got {r:?}"),
    }
    let nss: Api<Namespace> = Api::all(client.clone());
    nss.create(
        &PostParams::default(),
        &serde_json::from_value(json!({"metadata": {"name": "team"}})).unwrap(),
    )
    .await
    .unwrap();
    other.create(&PostParams::default(), &cm).await.unwrap();
    nss.delete("team", &DeleteParams::default()).await.unwrap();
    assert!(other.get_opt("c").await.unwrap().is_none());

    // Deleting a CRD removes its kind and its objects.
    let crds: Api<CustomResourceDefinition> = Api::all(client.clone());
    crds.delete("widgets.test.k8s4r.io", &DeleteParams::default())
        .await
        .unwrap();
    match api.list(&Default::default()).await {
        Err(Error::Api(s)) => assert_eq!(s.code, 404),
        r => panic!("expected 404, got {r:?}"),
    }
    crds.create(&PostParams::default(), &Widget::crd()).await.unwrap();
    let again = api.list(&Default::default()).await.unwrap();
    assert!(
        again.items.iter().all(|w| w.name_any() != "t"),
        "objects of a deleted CRD are gone"
    );
    server.shutdown().await.unwrap();
}
