//! Test kinds and helpers shared by the integration tests.
#![allow(dead_code)]

pub mod kubectl;

use std::time::{Duration, Instant};

use apiserver_lite::{Config, RunningServer};
use k8s_openapi::apiextensions_apiserver::pkg::apis::apiextensions::v1::CustomResourceDefinition;
use kube::api::{Api, PostParams};
use kube::{Client, CustomResource, CustomResourceExt};
use schemars::JsonSchema;
use serde::{Deserialize, Serialize};

/// A namespaced test kind with a status subresource, printer columns, a short name and a category.
#[derive(CustomResource, Serialize, Deserialize, Clone, Debug, Default, PartialEq, JsonSchema)]
#[kube(group = "test.k8s4r.io", version = "v1", kind = "Widget", namespaced)]
#[kube(status = "WidgetStatus", shortname = "wd", category = "k8s4r")]
#[kube(printcolumn = r#"{"name":"Size","type":"integer","jsonPath":".spec.size"}"#)]
#[kube(printcolumn = r#"{"name":"Phase","type":"string","jsonPath":".status.phase"}"#)]
#[serde(rename_all = "camelCase")]
pub struct WidgetSpec {
    pub size: i32,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub color: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub owner_note: Option<String>,
}

#[derive(Serialize, Deserialize, Clone, Debug, Default, PartialEq, JsonSchema)]
pub struct WidgetStatus {
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub phase: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub observed: Option<i64>,
}

/// A cluster-scoped test kind, like k8s4r's Robot.
#[derive(CustomResource, Serialize, Deserialize, Clone, Debug, Default, PartialEq, JsonSchema)]
#[kube(group = "test.k8s4r.io", version = "v1", kind = "Gadget")]
#[kube(status = "GadgetStatus", shortname = "gd")]
pub struct GadgetSpec {
    pub arch: String,
}

#[derive(Serialize, Deserialize, Clone, Debug, Default, PartialEq, JsonSchema)]
pub struct GadgetStatus {
    pub online: bool,
}

pub async fn server() -> (RunningServer, Client) {
    let server = Config::for_tests().start().await.expect("server starts");
    let client = server.client().await.expect("client");
    (server, client)
}

pub async fn install_crds(client: &Client) {
    let crds: Api<CustomResourceDefinition> = Api::all(client.clone());
    for crd in [Widget::crd(), Gadget::crd()] {
        crds.create(&PostParams::default(), &crd)
            .await
            .expect("CRD created");
    }
}

pub fn widget(name: &str, size: i32) -> Widget {
    Widget::new(
        name,
        WidgetSpec {
            size,
            ..Default::default()
        },
    )
}

/// Polls `f` until it returns `Some`, failing after `timeout`.
pub async fn eventually<T, F, Fut>(timeout: Duration, what: &str, mut f: F) -> T
where
    F: FnMut() -> Fut,
    Fut: std::future::Future<Output = Option<T>>,
{
    let deadline = Instant::now() + timeout;
    loop {
        if let Some(v) = f().await {
            return v;
        }
        assert!(Instant::now() < deadline, "timed out waiting for {what}");
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
}

/// What [`record_too_small`] records.
pub const TOO_SMALL_NOTE: &str = "size 1 is below 2";

/// Records, as a kube-rs controller named `widget-controller` does (through
/// events.k8s.io/v1), a Warning Event `TooSmall` on `w`.
pub async fn record_too_small(client: &Client, w: &Widget) {
    use kube::runtime::events::{Event, EventType, Recorder, Reporter};
    use kube::Resource;
    let recorder = Recorder::new(client.clone(), Reporter::from("widget-controller"));
    let event = Event {
        type_: EventType::Warning,
        reason: "TooSmall".into(),
        note: Some(TOO_SMALL_NOTE.into()),
        action: "Check".into(),
        secondary: None,
    };
    recorder
        .publish(&event, &w.object_ref(&()))
        .await
        .expect("Event recorded");
}
