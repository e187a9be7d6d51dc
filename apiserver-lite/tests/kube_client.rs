//! The kube client against the server over real HTTP.

mod common;

use std::time::Duration;

use common::*;
use futures::{StreamExt, TryStreamExt};
use k8s_openapi::api::core::v1::{ConfigMap, Namespace};
use kube::api::{Api, DeleteParams, ListParams, Patch, PatchParams, PostParams, WatchEvent, WatchParams};
use kube::discovery::Discovery;
use kube::{Error, Resource, ResourceExt};
use serde_json::json;

fn api_code(e: Error) -> u16 {
    match e {
        Error::Api(s) => s.code,
        other => panic!("expected an API error, got {other:?}"),
    }
}

fn api_err(e: Error) -> kube::core::Status {
    match e {
        Error::Api(s) => *s,
        other => panic!("expected an API error, got {other:?}"),
    }
}

#[tokio::test]
async fn crd_registers_kinds_for_discovery() {
    let (server, client) = server().await;
    install_crds(&client).await;
    let discovery = Discovery::new(client.clone()).run().await.unwrap();
    let (ar, caps) = discovery
        .groups()
        .flat_map(|g| g.recommended_resources())
        .find(|(ar, _)| ar.kind == "Widget")
        .expect("Widget discovered");
    assert_eq!(ar.plural, "widgets");
    assert_eq!(caps.scope, kube::discovery::Scope::Namespaced);
    assert!(caps
        .subresources
        .iter()
        .any(|(s, _)| s.plural == "widgets/status" || s.plural == "status"));
    let gadget = discovery
        .groups()
        .flat_map(|g| g.recommended_resources())
        .find(|(ar, _)| ar.kind == "Gadget")
        .unwrap();
    assert_eq!(gadget.1.scope, kube::discovery::Scope::Cluster);
    let ns: Api<Namespace> = Api::all(client.clone());
    assert!(ns.get("default").await.is_ok());
    server.shutdown().await.unwrap();
}

#[tokio::test]
async fn crud_status_generation_and_conflicts() {
    let (server, client) = server().await;
    install_crds(&client).await;
    let api: Api<Widget> = Api::namespaced(client.clone(), "default");
    let mut w = widget("w1", 1);
    w.status = Some(WidgetStatus {
        phase: Some("ignored".into()),
        observed: None,
    });
    let created = api.create(&PostParams::default(), &w).await.unwrap();
    assert_eq!(created.metadata.generation, Some(1));
    assert!(
        created.status.is_none(),
        "create ignores status when it is a subresource"
    );
    assert!(created.uid().is_some() && created.creation_timestamp().is_some());
    assert_eq!(
        api_code(api.create(&PostParams::default(), &w).await.unwrap_err()),
        409
    );

    // A status write changes status only, and not the generation.
    let s = api
        .patch_status(
            "w1",
            &PatchParams::default(),
            &Patch::Merge(json!({"status": {"phase": "Ready"}, "spec": {"size": 99}})),
        )
        .await
        .unwrap();
    assert_eq!(s.status.as_ref().unwrap().phase.as_deref(), Some("Ready"));
    assert_eq!(s.spec.size, 1);
    assert_eq!(s.metadata.generation, Some(1));

    // A spec write bumps the generation and ignores status.
    let mut next = s.clone();
    next.spec.size = 2;
    next.status = None;
    let replaced = api.replace("w1", &PostParams::default(), &next).await.unwrap();
    assert_eq!(replaced.metadata.generation, Some(2));
    assert_eq!(replaced.status.as_ref().unwrap().phase.as_deref(), Some("Ready"));
    let rv1: u64 = s.resource_version().unwrap().parse().unwrap();
    let rv2: u64 = replaced.resource_version().unwrap().parse().unwrap();
    assert!(rv2 > rv1);

    // A stale resourceVersion is a conflict.
    let err = api
        .replace("w1", &PostParams::default(), &next)
        .await
        .unwrap_err();
    let e = api_err(err);
    assert_eq!((e.code, e.reason.as_str()), (409, "Conflict"));

    // A label-only change keeps the generation.
    let l = api
        .patch(
            "w1",
            &PatchParams::default(),
            &Patch::Merge(json!({"metadata": {"labels": {"a": "b"}}})),
        )
        .await
        .unwrap();
    assert_eq!(l.metadata.generation, Some(2));
    // A no-op write changes nothing, not even the resourceVersion.
    let same = api
        .patch(
            "w1",
            &PatchParams::default(),
            &Patch::Merge(json!({"metadata": {"labels": {"a": "b"}}})),
        )
        .await
        .unwrap();
    assert_eq!(same.resource_version(), l.resource_version());

    let list = api.list(&ListParams::default()).await.unwrap();
    assert_eq!(list.items.len(), 1);
    let gone = api.delete("w1", &DeleteParams::default()).await.unwrap();
    assert!(gone.is_right(), "deleted at once without finalizers");
    assert_eq!(api_code(api.get("w1").await.unwrap_err()), 404);

    // Cluster-scoped kinds work without a namespace.
    let gadgets: Api<Gadget> = Api::all(client.clone());
    gadgets
        .create(
            &PostParams::default(),
            &Gadget::new("g1", GadgetSpec { arch: "arm64".into() }),
        )
        .await
        .unwrap();
    let g = gadgets
        .patch_status(
            "g1",
            &PatchParams::default(),
            &Patch::Merge(json!({"status": {"online": true}})),
        )
        .await
        .unwrap();
    assert!(g.status.unwrap().online);
    server.shutdown().await.unwrap();
}

#[tokio::test]
async fn json_merge_and_apply_patches() {
    let (server, client) = server().await;
    install_crds(&client).await;
    let api: Api<Widget> = Api::namespaced(client.clone(), "default");
    api.create(&PostParams::default(), &widget("p", 1)).await.unwrap();
    let j = api
        .patch("p", &PatchParams::default(), &Patch::<()>::Json(serde_json::from_value(json!([{"op": "replace", "path": "/spec/size", "value": 5}, {"op": "add", "path": "/spec/color", "value": "red"}])).unwrap()))
        .await
        .unwrap();
    assert_eq!((j.spec.size, j.spec.color.as_deref()), (5, Some("red")));
    let failed = api
        .patch(
            "p",
            &PatchParams::default(),
            &Patch::<()>::Json(
                serde_json::from_value(json!([{"op": "test", "path": "/spec/size", "value": 6}])).unwrap(),
            ),
        )
        .await
        .unwrap_err();
    assert_eq!(api_code(failed), 422);
    let m = api
        .patch(
            "p",
            &PatchParams::default(),
            &Patch::Merge(json!({"spec": {"color": null}})),
        )
        .await
        .unwrap();
    assert_eq!(m.spec.color, None);
    let s = api
        .patch(
            "p",
            &PatchParams::default(),
            &Patch::Strategic(json!({"spec": {"size": 3}})),
        )
        .await
        .unwrap_err();
    assert_eq!(api_code(s), 415);

    // Server-side apply: create, ownership, conflicts, force, and removal.
    let alice = PatchParams::apply("alice");
    let applied = json!({"apiVersion": "test.k8s4r.io/v1", "kind": "Widget", "metadata": {"name": "a"}, "spec": {"size": 1, "color": "blue"}});
    let a = api.patch("a", &alice, &Patch::Apply(&applied)).await.unwrap();
    assert_eq!(a.spec.color.as_deref(), Some("blue"));
    let managed = a.metadata.managed_fields.clone().unwrap();
    assert_eq!(managed[0].manager.as_deref(), Some("alice"));
    assert_eq!(managed[0].operation.as_deref(), Some("Apply"));
    let bob_cfg = json!({"apiVersion": "test.k8s4r.io/v1", "kind": "Widget", "metadata": {"name": "a"}, "spec": {"size": 2}});
    let conflict = api
        .patch("a", &PatchParams::apply("bob"), &Patch::Apply(&bob_cfg))
        .await
        .unwrap_err();
    let e = api_err(conflict);
    assert_eq!(e.code, 409);
    assert!(
        e.message.contains("alice") && e.message.contains(".spec.size"),
        "{}",
        e.message
    );
    let forced = api
        .patch("a", &PatchParams::apply("bob").force(), &Patch::Apply(&bob_cfg))
        .await
        .unwrap();
    assert_eq!(forced.spec.size, 2);
    // alice stops applying color: it goes away; size now belongs to bob.
    let alice_cfg = json!({"apiVersion": "test.k8s4r.io/v1", "kind": "Widget", "metadata": {"name": "a"}, "spec": {"size": 2}});
    let after = api.patch("a", &alice, &Patch::Apply(&alice_cfg)).await.unwrap();
    assert_eq!(after.spec.color, None);
    assert_eq!(after.spec.size, 2);
    // Status applied by a controller on the status subresource.
    let st = json!({"apiVersion": "test.k8s4r.io/v1", "kind": "Widget", "status": {"phase": "Applied"}});
    let s = api
        .patch_status("a", &PatchParams::apply("ctrl").force(), &Patch::Apply(&st))
        .await
        .unwrap();
    assert_eq!(s.status.unwrap().phase.as_deref(), Some("Applied"));
    server.shutdown().await.unwrap();
}

#[tokio::test]
async fn watch_resumes_and_expires() {
    let server = apiserver_lite::Config::for_tests()
        .history(8)
        .bookmark_interval(Duration::from_millis(100))
        .start()
        .await
        .unwrap();
    let client = server.client().await.unwrap();
    install_crds(&client).await;
    let api: Api<Widget> = Api::namespaced(client.clone(), "default");
    let start = api
        .list(&ListParams::default())
        .await
        .unwrap()
        .metadata
        .resource_version
        .unwrap();
    for i in 0..3 {
        api.create(&PostParams::default(), &widget(&format!("w{i}"), i))
            .await
            .unwrap();
    }
    api.delete("w0", &DeleteParams::default()).await.unwrap();
    // From `start`, every event in order.
    let stream = api
        .watch(&WatchParams::default().timeout(5), &start)
        .await
        .unwrap();
    let events: Vec<_> = stream.take(4).try_collect().await.unwrap();
    let kinds: Vec<String> = events
        .iter()
        .map(|e| match e {
            WatchEvent::Added(w) => format!("A{}", w.name_any()),
            WatchEvent::Deleted(w) => format!("D{}", w.name_any()),
            other => format!("{other:?}"),
        })
        .collect();
    assert_eq!(kinds, vec!["Aw0", "Aw1", "Aw2", "Dw0"]);
    // Bookmarks when asked for.
    let stream = api
        .watch(&WatchParams::default().timeout(5), &start)
        .await
        .unwrap();
    let mut stream = std::pin::pin!(stream);
    let mut saw_bookmark = false;
    while let Some(ev) = stream.try_next().await.unwrap() {
        if matches!(ev, WatchEvent::Bookmark(_)) {
            saw_bookmark = true;
            break;
        }
    }
    assert!(saw_bookmark);
    // Push `start` out of the retained history: 410 Gone as an ERROR event.
    for i in 10..20 {
        api.create(&PostParams::default(), &widget(&format!("w{i}"), i))
            .await
            .unwrap();
    }
    let stream = api
        .watch(&WatchParams::default().timeout(5), &start)
        .await
        .unwrap();
    let first: Vec<_> = stream.take(1).try_collect().await.unwrap();
    match &first[0] {
        WatchEvent::Error(e) => assert_eq!(e.code, 410),
        other => panic!("expected 410, got {other:?}"),
    }
    // Label and field selectors on lists and watches.
    api.patch(
        "w11",
        &PatchParams::default(),
        &Patch::Merge(json!({"metadata": {"labels": {"tier": "a"}}})),
    )
    .await
    .unwrap();
    let l = api
        .list(&ListParams::default().labels("tier in (a,b)"))
        .await
        .unwrap();
    assert_eq!(l.items.len(), 1);
    let l = api.list(&ListParams::default().labels("!tier")).await.unwrap();
    assert_eq!(l.items.len(), 11);
    let l = api
        .list(&ListParams::default().fields("metadata.name=w12"))
        .await
        .unwrap();
    assert_eq!(l.items[0].name_any(), "w12");
    // Pagination.
    let page = api.list(&ListParams::default().limit(5)).await.unwrap();
    assert_eq!(page.items.len(), 5);
    let token = page.metadata.continue_.clone().unwrap();
    let rest = api
        .list(&ListParams::default().limit(100).continue_token(&token))
        .await
        .unwrap();
    assert_eq!(rest.items.len(), 7);
    assert!(rest.metadata.continue_.is_none_or(|c| c.is_empty()));
    server.shutdown().await.unwrap();
}

/// Every page of a paginated list shows the objects as of its first page,
/// and says that resourceVersion; a watch from it brings what changed while
/// the client listed (read afresh per page, a change to an object on a page
/// already read would fall before the version the watch starts from).
#[tokio::test]
async fn paginated_lists_read_one_version_and_the_watch_brings_the_rest() {
    let (server, client) = server().await;
    let api: Api<ConfigMap> = Api::namespaced(client.clone(), "default");
    let cm = |name: &str, value: &str| -> ConfigMap {
        serde_json::from_value(json!({"metadata": {"name": name}, "data": {"v": value}})).unwrap()
    };
    for i in 0..9 {
        api.create(&PostParams::default(), &cm(&format!("p{i}"), "old"))
            .await
            .unwrap();
    }
    let first = api.list(&ListParams::default().limit(4)).await.unwrap();
    let rv = first.metadata.resource_version.clone().unwrap();
    assert_eq!(names(&first.items), ["p0", "p1", "p2", "p3"]);
    assert_eq!(first.metadata.remaining_item_count, Some(5));
    // While the client lists: one object it has is changed, one it has not
    // reached is deleted, and one is created.
    api.replace("p1", &PostParams::default(), &{
        let mut changed = first.items[1].clone();
        changed.data = Some([("v".to_string(), "new".to_string())].into());
        changed
    })
    .await
    .unwrap();
    api.delete("p6", &DeleteParams::default()).await.unwrap();
    api.create(&PostParams::default(), &cm("p9", "old"))
        .await
        .unwrap();
    let mut pages = vec![first.clone()];
    let mut token = first.metadata.continue_.clone();
    while let Some(t) = token.filter(|t| !t.is_empty()) {
        let page = api
            .list(&ListParams::default().limit(4).continue_token(&t))
            .await
            .unwrap();
        token = page.metadata.continue_.clone();
        pages.push(page);
    }
    for page in &pages {
        assert_eq!(page.metadata.resource_version.as_deref(), Some(rv.as_str()));
    }
    let listed: Vec<String> = pages.iter().flat_map(|p| names(&p.items)).collect();
    let as_of_first: Vec<String> = (0..9).map(|i| format!("p{i}")).collect();
    assert_eq!(
        listed, as_of_first,
        "every page reads the objects as of the first"
    );
    // The watch from the list's version brings the three changes, in order.
    let stream = api.watch(&WatchParams::default().timeout(2), &rv).await.unwrap();
    let changes: Vec<String> = stream
        .take(3)
        .map(|e| match e.unwrap() {
            WatchEvent::Modified(o) => format!("modified {}", o.name_any()),
            WatchEvent::Deleted(o) => format!("deleted {}", o.name_any()),
            WatchEvent::Added(o) => format!("added {}", o.name_any()),
            other => format!("{other:?}"),
        })
        .collect()
        .await;
    assert_eq!(changes, ["modified p1", "deleted p6", "added p9"]);
    // A selector hides how many objects are left, as on a real server.
    let selected = api
        .list(
            &ListParams::default()
                .limit(2)
                .fields("metadata.namespace=default"),
        )
        .await
        .unwrap();
    assert!(selected.metadata.continue_.is_some());
    assert_eq!(selected.metadata.remaining_item_count, None);
    // A page of a list no longer kept (here: one whose last page was
    // served) is 410 Expired; the client lists again.
    let err = api
        .list(
            &ListParams::default()
                .limit(4)
                .continue_token(first.metadata.continue_.as_deref().unwrap()),
        )
        .await
        .unwrap_err();
    let status = api_err(err);
    assert_eq!((status.code, status.reason.as_str()), (410, "Expired"));
    server.shutdown().await.unwrap();
}

fn names(items: &[ConfigMap]) -> Vec<String> {
    items.iter().map(|o| o.name_any()).collect()
}

#[tokio::test]
async fn kube_runtime_watcher_survives_restarts_of_the_watch() {
    use kube::runtime::{watcher, WatchStreamExt};
    let server = apiserver_lite::Config::for_tests()
        .history(4)
        .start()
        .await
        .unwrap();
    let client = server.client().await.unwrap();
    let cms: Api<ConfigMap> = Api::namespaced(client.clone(), "default");
    let stream = watcher(cms.clone(), watcher::Config::default().timeout(1)).applied_objects();
    let mut stream = std::pin::pin!(stream);
    for i in 0..12 {
        let cm: ConfigMap = serde_json::from_value(
            json!({"metadata": {"name": format!("c{i}")}, "data": {"i": i.to_string()}}),
        )
        .unwrap();
        cms.create(&PostParams::default(), &cm).await.unwrap();
    }
    let mut seen = std::collections::BTreeSet::new();
    let deadline = tokio::time::Instant::now() + Duration::from_secs(20);
    while seen.len() < 12 {
        let next = tokio::time::timeout_at(deadline, stream.try_next())
            .await
            .expect("watcher delivers")
            .unwrap()
            .unwrap();
        seen.insert(next.name_any());
    }
    // The 1s server-side timeout ends the watch; the watcher re-watches and sees new objects.
    let cm: ConfigMap = serde_json::from_value(json!({"metadata": {"name": "late"}})).unwrap();
    tokio::time::timeout(Duration::from_millis(1500), futures::future::pending::<()>())
        .await
        .ok();
    cms.create(&PostParams::default(), &cm).await.unwrap();
    loop {
        let next = tokio::time::timeout_at(deadline, stream.try_next())
            .await
            .expect("watcher delivers")
            .unwrap()
            .unwrap();
        if next.name_any() == "late" {
            break;
        }
    }
    server.shutdown().await.unwrap();
}

#[tokio::test]
async fn finalizers_hold_deletion() {
    let (server, client) = server().await;
    install_crds(&client).await;
    let api: Api<Widget> = Api::namespaced(client.clone(), "default");
    let mut w = widget("f", 1);
    w.metadata.finalizers = Some(vec!["test.k8s4r.io/cleanup".into()]);
    api.create(&PostParams::default(), &w).await.unwrap();
    let pending = api.delete("f", &DeleteParams::default()).await.unwrap();
    let obj = pending.left().expect("still there");
    assert!(obj.metadata.deletion_timestamp.is_some());
    assert!(api.get("f").await.is_ok());
    api.patch(
        "f",
        &PatchParams::default(),
        &Patch::Merge(json!({"metadata": {"finalizers": null}})),
    )
    .await
    .unwrap();
    assert_eq!(api_code(api.get("f").await.unwrap_err()), 404);
    server.shutdown().await.unwrap();
}

fn owned_by(name: &str, owner: &Widget) -> ConfigMap {
    let mut cm: ConfigMap = serde_json::from_value(json!({"metadata": {"name": name}})).unwrap();
    cm.metadata.owner_references = Some(vec![owner.controller_owner_ref(&()).unwrap()]);
    cm
}

#[tokio::test]
async fn owner_references_are_garbage_collected() {
    let (server, client) = server().await;
    install_crds(&client).await;
    let widgets: Api<Widget> = Api::namespaced(client.clone(), "default");
    let cms: Api<ConfigMap> = Api::namespaced(client.clone(), "default");
    let timeout = Duration::from_secs(5);

    // Background: the owner goes at once, the dependent after.
    let bg = widgets
        .create(&PostParams::default(), &widget("bg", 1))
        .await
        .unwrap();
    cms.create(&PostParams::default(), &owned_by("bg-child", &bg))
        .await
        .unwrap();
    widgets.delete("bg", &DeleteParams::background()).await.unwrap();
    eventually(timeout, "background GC", || async {
        cms.get_opt("bg-child").await.unwrap().is_none().then_some(())
    })
    .await;

    // Foreground: the owner waits for its dependents.
    let fg = widgets
        .create(&PostParams::default(), &widget("fg", 1))
        .await
        .unwrap();
    let mut child = owned_by("fg-child", &fg);
    child.metadata.finalizers = Some(vec!["test/hold".into()]);
    cms.create(&PostParams::default(), &child).await.unwrap();
    widgets.delete("fg", &DeleteParams::foreground()).await.unwrap();
    eventually(timeout, "child marked deleted", || async {
        cms.get("fg-child")
            .await
            .unwrap()
            .metadata
            .deletion_timestamp
            .map(|_| ())
    })
    .await;
    assert!(widgets
        .get("fg")
        .await
        .unwrap()
        .finalizers()
        .contains(&"foregroundDeletion".to_string()));
    cms.patch(
        "fg-child",
        &PatchParams::default(),
        &Patch::Merge(json!({"metadata": {"finalizers": null}})),
    )
    .await
    .unwrap();
    eventually(timeout, "foreground owner gone", || async {
        widgets.get_opt("fg").await.unwrap().is_none().then_some(())
    })
    .await;

    // Orphan: the dependent stays, without the reference.
    let or = widgets
        .create(&PostParams::default(), &widget("or", 1))
        .await
        .unwrap();
    cms.create(&PostParams::default(), &owned_by("or-child", &or))
        .await
        .unwrap();
    widgets.delete("or", &DeleteParams::orphan()).await.unwrap();
    eventually(timeout, "orphan owner gone", || async {
        widgets.get_opt("or").await.unwrap().is_none().then_some(())
    })
    .await;
    let orphan = cms.get("or-child").await.unwrap();
    assert!(orphan.metadata.owner_references.unwrap_or_default().is_empty());
    server.shutdown().await.unwrap();
}

/// The collector's own round comes every 30 s; a write naming an owner
/// that does not exist asks for it at once, as a deletion does.
#[tokio::test]
async fn a_dependent_of_an_absent_owner_is_collected_at_once() {
    let (server, client) = server().await;
    install_crds(&client).await;
    let widgets: Api<Widget> = Api::namespaced(client.clone(), "default");
    let cms: Api<ConfigMap> = Api::namespaced(client.clone(), "default");
    // An owner that existed: its uid is real, and it is gone.
    let owner = widgets
        .create(&PostParams::default(), &widget("gone", 1))
        .await
        .unwrap();
    widgets.delete("gone", &DeleteParams::background()).await.unwrap();
    eventually(Duration::from_secs(5), "owner gone", || async {
        widgets.get_opt("gone").await.unwrap().is_none().then_some(())
    })
    .await;
    cms.create(&PostParams::default(), &owned_by("late-child", &owner))
        .await
        .unwrap();
    eventually(
        Duration::from_secs(10),
        "dependent of an absent owner collected",
        || async { cms.get_opt("late-child").await.unwrap().is_none().then_some(()) },
    )
    .await;
    server.shutdown().await.unwrap();
}

#[tokio::test]
async fn controller_reconciles_owned_children() {
    use kube::runtime::controller::{Action, Controller};
    use std::sync::Arc;
    let (server, client) = server().await;
    install_crds(&client).await;
    let widgets: Api<Widget> = Api::namespaced(client.clone(), "default");
    let cms: Api<ConfigMap> = Api::namespaced(client.clone(), "default");

    async fn reconcile(w: Arc<Widget>, client: Arc<kube::Client>) -> Result<Action, kube::Error> {
        let cms: Api<ConfigMap> = Api::namespaced((*client).clone(), "default");
        let mut cm = owned_by(&format!("{}-cfg", w.name_any()), &w);
        cm.data = Some([("size".to_string(), w.spec.size.to_string())].into());
        cms.patch(
            &cm.name_any(),
            &PatchParams::apply("widget-ctrl").force(),
            &Patch::Apply(&cm),
        )
        .await?;
        let widgets: Api<Widget> = Api::namespaced((*client).clone(), "default");
        let st = json!({"apiVersion": "test.k8s4r.io/v1", "kind": "Widget", "status": {"phase": "Ready", "observed": w.metadata.generation}});
        widgets
            .patch_status(
                &w.name_any(),
                &PatchParams::apply("widget-ctrl").force(),
                &Patch::Apply(&st),
            )
            .await?;
        Ok(Action::await_change())
    }
    fn on_error(_: Arc<Widget>, _: &kube::Error, _: Arc<kube::Client>) -> Action {
        Action::requeue(Duration::from_millis(200))
    }
    let ctrl = Controller::new(widgets.clone(), Default::default())
        .owns(cms.clone(), Default::default())
        .run(reconcile, on_error, Arc::new(client.clone()))
        .for_each(|_| async {});
    let handle = tokio::spawn(ctrl);

    widgets
        .create(&PostParams::default(), &widget("c1", 3))
        .await
        .unwrap();
    let timeout = Duration::from_secs(10);
    eventually(timeout, "child created", || async {
        cms.get_opt("c1-cfg").await.unwrap()
    })
    .await;
    widgets
        .patch(
            "c1",
            &PatchParams::default(),
            &Patch::Merge(json!({"spec": {"size": 4}})),
        )
        .await
        .unwrap();
    eventually(timeout, "child updated", || async {
        let cm = cms.get_opt("c1-cfg").await.unwrap()?;
        (cm.data?.get("size")? == "4").then_some(())
    })
    .await;
    eventually(timeout, "status observed generation 2", || async {
        (widgets.get("c1").await.unwrap().status?.observed? == 2).then_some(())
    })
    .await;
    // Deleting the child by hand: the controller recreates it (it .owns() them).
    cms.delete("c1-cfg", &DeleteParams::default()).await.unwrap();
    widgets
        .patch(
            "c1",
            &PatchParams::default(),
            &Patch::Merge(json!({"metadata": {"labels": {"poke": "1"}}})),
        )
        .await
        .unwrap();
    eventually(timeout, "child recreated", || async {
        cms.get_opt("c1-cfg").await.unwrap()
    })
    .await;
    handle.abort();
    server.shutdown().await.unwrap();
}

#[tokio::test]
async fn schema_validation_and_pruning() {
    let (server, client) = server().await;
    install_crds(&client).await;
    let api: Api<kube::api::DynamicObject> = Api::namespaced_with(
        client.clone(),
        "default",
        &kube::api::ApiResource::erase::<Widget>(&()),
    );
    let bad: kube::api::DynamicObject = serde_json::from_value(json!({
        "apiVersion": "test.k8s4r.io/v1", "kind": "Widget", "metadata": {"name": "bad"},
        "spec": {"size": "big"}
    }))
    .unwrap();
    let e = api_err(api.create(&PostParams::default(), &bad).await.unwrap_err());
    assert_eq!((e.code, e.reason.as_str()), (422, "Invalid"));
    assert!(e.message.contains("spec.size"), "{}", e.message);
    let missing: kube::api::DynamicObject = serde_json::from_value(json!({
        "apiVersion": "test.k8s4r.io/v1", "kind": "Widget", "metadata": {"name": "missing"}, "spec": {}
    }))
    .unwrap();
    let e = api_err(api.create(&PostParams::default(), &missing).await.unwrap_err());
    assert!(e.message.contains("spec.size: Required value"), "{}", e.message);
    let extra: kube::api::DynamicObject = serde_json::from_value(json!({
        "apiVersion": "test.k8s4r.io/v1", "kind": "Widget", "metadata": {"name": "extra"},
        "spec": {"size": 1, "unknownField": true}, "topLevel": 1
    }))
    .unwrap();
    let created = api.create(&PostParams::default(), &extra).await.unwrap();
    assert!(created.data["spec"].get("unknownField").is_none());
    assert!(created.data.get("topLevel").is_none());
    server.shutdown().await.unwrap();
}

#[tokio::test]
async fn objects_survive_a_restart() {
    let dir = tempfile::tempdir().unwrap();
    let server = apiserver_lite::Config::for_tests()
        .data_dir(dir.path())
        .start()
        .await
        .unwrap();
    let client = server.client().await.unwrap();
    install_crds(&client).await;
    let api: Api<Widget> = Api::namespaced(client.clone(), "default");
    let w = api
        .create(&PostParams::default(), &widget("keep", 7))
        .await
        .unwrap();
    server.shutdown().await.unwrap();

    let server = apiserver_lite::Config::for_tests()
        .data_dir(dir.path())
        .start()
        .await
        .unwrap();
    let client = server.client().await.unwrap();
    let api: Api<Widget> = Api::namespaced(client.clone(), "default");
    let again = api.get("keep").await.unwrap();
    assert_eq!(again.spec.size, 7);
    assert_eq!(again.uid(), w.uid());
    assert_eq!(again.resource_version(), w.resource_version());
    let next = api
        .create(&PostParams::default(), &widget("after", 1))
        .await
        .unwrap();
    let (a, b): (u64, u64) = (
        w.resource_version().unwrap().parse().unwrap(),
        next.resource_version().unwrap().parse().unwrap(),
    );
    assert!(b > a, "resourceVersions keep growing across restarts");
    server.shutdown().await.unwrap();
}

#[tokio::test]
async fn secret_string_data_is_stored_in_data() {
    use k8s_openapi::api::core::v1::Secret;
    let (server, client) = server().await;
    let api: Api<Secret> = Api::namespaced(client.clone(), "default");
    let secret: Secret = serde_json::from_value(json!({
        "metadata": {"name": "tokens"},
        "data": {"kept": "eQ==", "replaced": "eQ=="},
        "stringData": {"plain": "x", "replaced": "z"}
    }))
    .unwrap();
    api.create(&PostParams::default(), &secret).await.unwrap();
    let read = |s: &Secret, key: &str| String::from_utf8(s.data.as_ref().unwrap()[key].0.clone()).unwrap();
    let stored = api.get("tokens").await.unwrap();
    assert!(stored.string_data.is_none(), "stringData is write-only");
    assert_eq!(read(&stored, "plain"), "x");
    assert_eq!(read(&stored, "replaced"), "z");
    assert_eq!(read(&stored, "kept"), "y");
    let patched = api
        .patch(
            "tokens",
            &PatchParams::default(),
            &Patch::Merge(json!({"stringData": {"plain": "w"}})),
        )
        .await
        .unwrap();
    assert_eq!(read(&patched, "plain"), "w");
    assert_eq!(read(&patched, "kept"), "y");
    drop(server);
}

/// On a real server core/v1 and events.k8s.io/v1 Events are one resource:
/// kube-rs records through the second, `kubectl describe` reads the first.
#[tokio::test]
async fn events_are_one_resource_under_both_apis() {
    use k8s_openapi::api::core::v1::Event as CoreEvent;
    use k8s_openapi::api::events::v1::Event as EventsEvent;
    let (server, client) = server().await;
    install_crds(&client).await;
    let widgets: Api<Widget> = Api::namespaced(client.clone(), "default");
    let w = widgets
        .create(&PostParams::default(), &widget("w1", 1))
        .await
        .unwrap();
    let core: Api<CoreEvent> = Api::namespaced(client.clone(), "default");
    let mut watch = core.watch(&WatchParams::default(), "0").await.unwrap().boxed();

    record_too_small(&client, &w).await;

    // What kubectl describe asks for: core/v1, by the object's identity.
    let selector = format!(
        "involvedObject.kind=Widget,involvedObject.uid={},involvedObject.name=w1,involvedObject.namespace=default",
        w.uid().unwrap()
    );
    let found = core.list(&ListParams::default().fields(&selector)).await.unwrap();
    assert_eq!(found.items.len(), 1, "{:?}", found.items);
    let ev = &found.items[0];
    assert_eq!(ev.reason.as_deref(), Some("TooSmall"));
    assert_eq!(ev.message.as_deref(), Some(TOO_SMALL_NOTE));
    assert_eq!(ev.type_.as_deref(), Some("Warning"));
    assert_eq!(ev.reporting_component.as_deref(), Some("widget-controller"));
    assert_eq!(ev.involved_object.name.as_deref(), Some("w1"));
    let other = core
        .list(&ListParams::default().fields("involvedObject.name=w2"))
        .await
        .unwrap();
    assert!(other.items.is_empty());
    let seen = tokio::time::timeout(Duration::from_secs(10), async {
        while let Some(e) = watch.try_next().await.unwrap() {
            if let WatchEvent::Added(e) = e {
                return e;
            }
        }
        panic!("watch ended");
    })
    .await
    .expect("a core/v1 watch sees the recorded Event");
    assert_eq!(seen.message.as_deref(), Some(TOO_SMALL_NOTE));

    // Written through core/v1, read through events.k8s.io/v1.
    let name = ev.name_any();
    core.patch(
        &name,
        &PatchParams::default(),
        &Patch::Merge(json!({"message": "size 1 is still below 2"})),
    )
    .await
    .unwrap();
    let events: Api<EventsEvent> = Api::namespaced(client.clone(), "default");
    let stored = events.get(&name).await.unwrap();
    assert_eq!(stored.note.as_deref(), Some("size 1 is still below 2"));
    assert_eq!(stored.regarding.as_ref().and_then(|r| r.uid.clone()), w.uid());
    let created: CoreEvent = serde_json::from_value(json!({
        "metadata": {"name": "by-hand"},
        "involvedObject": {"kind": "Widget", "name": "w1", "namespace": "default"},
        "reason": "Poked",
        "message": "a person was here",
        "type": "Normal",
        "count": 1,
        "source": {"component": "kubectl"}
    }))
    .unwrap();
    core.create(&PostParams::default(), &created).await.unwrap();
    let stored = events.get("by-hand").await.unwrap();
    assert_eq!(stored.note.as_deref(), Some("a person was here"));
    assert_eq!(stored.deprecated_count, Some(1));
    assert_eq!(stored.regarding.and_then(|r| r.name).as_deref(), Some("w1"));
    core.delete("by-hand", &DeleteParams::default()).await.unwrap();
    assert_eq!(api_code(events.get("by-hand").await.unwrap_err()), 404);
    let missing = api_err(core.get("by-hand").await.unwrap_err());
    assert_eq!(missing.message, "events \"by-hand\" not found");

    // kubectl delete events --field-selector involvedObject.name=w1
    core.delete_collection(
        &DeleteParams::default(),
        &ListParams::default().fields("involvedObject.name=w1"),
    )
    .await
    .unwrap();
    assert!(events
        .list(&ListParams::default())
        .await
        .unwrap()
        .items
        .is_empty());
    server.shutdown().await.unwrap();
}

/// A PriorityLevelConfiguration as deploy/cluster/50-flowcontrol.yaml
/// writes them.
fn priority_level(name: &str, shares: i32) -> k8s_openapi::api::flowcontrol::v1::PriorityLevelConfiguration {
    serde_json::from_value(json!({
        "metadata": {"name": name},
        "spec": {"type": "Limited", "limited": {
            "nominalConcurrencyShares": shares, "lendablePercent": 50, "borrowingLimitPercent": 0,
            "limitResponse": {"type": "Queue", "queuing": {"queues": 64, "handSize": 4, "queueLengthLimit": 50}},
        }},
    }))
    .unwrap()
}

/// A FlowSchema putting one ServiceAccount's robot writes on `level`.
fn flow_schema(name: &str, level: &str) -> k8s_openapi::api::flowcontrol::v1::FlowSchema {
    serde_json::from_value(json!({
        "metadata": {"name": name},
        "spec": {
            "priorityLevelConfiguration": {"name": level},
            "matchingPrecedence": 1000,
            "distinguisherMethod": {"type": "ByNamespace"},
            "rules": [{
                "subjects": [{"kind": "ServiceAccount", "serviceAccount": {"name": "server", "namespace": "system"}}],
                "resourceRules": [{
                    "apiGroups": ["robot.k8s4r.io"], "resources": ["robots", "robots/status"],
                    "verbs": ["create", "patch"], "clusterScope": true,
                }],
            }],
        },
    }))
    .unwrap()
}

/// API Priority and Fairness objects are stored as the cluster-scoped
/// built-ins they are, with a status that only `/status` writes change,
/// and listed with a real server's columns. Nothing enforces them, and no
/// built-in ones (`exempt`, `global-default`, ...) exist (KNOWN_DIFFERENCES).
#[tokio::test]
async fn flow_control_objects_are_stored_but_not_enforced() {
    use k8s_openapi::api::flowcontrol::v1::{FlowSchema, PriorityLevelConfiguration};
    let (server, client) = server().await;
    let levels: Api<PriorityLevelConfiguration> = Api::all(client.clone());
    let schemas: Api<FlowSchema> = Api::all(client.clone());

    let level = priority_level("robots", 20);
    let created = levels.create(&PostParams::default(), &level).await.unwrap();
    assert_eq!(created.spec, level.spec);
    assert!(created.uid().is_some() && created.creation_timestamp().is_some());
    assert_eq!(levels.get("robots").await.unwrap().spec, level.spec);

    let schema = flow_schema("robot-server", "robots");
    schemas.create(&PostParams::default(), &schema).await.unwrap();
    assert_eq!(schemas.get("robot-server").await.unwrap().spec, schema.spec);
    let dangling = |status: &str| json!({"status": {"conditions": [{"type": "Dangling", "status": status}]}});
    let condition = |s: FlowSchema| {
        let conditions = s.status.and_then(|s| s.conditions).unwrap_or_default();
        conditions.first().and_then(|c| c.status.clone())
    };
    let patched = schemas
        .patch_status(
            "robot-server",
            &PatchParams::default(),
            &Patch::Merge(dangling("False")),
        )
        .await
        .unwrap();
    assert_eq!(patched.spec, schema.spec, "a status write leaves the spec");
    assert_eq!(condition(patched).as_deref(), Some("False"));
    let mut change = dangling("True");
    change["spec"] = json!({"matchingPrecedence": 1100});
    let patched = schemas
        .patch("robot-server", &PatchParams::default(), &Patch::Merge(change))
        .await
        .unwrap();
    assert_eq!(patched.spec.matching_precedence, Some(1100));
    assert_eq!(
        condition(patched).as_deref(),
        Some("False"),
        "a spec write leaves the status"
    );
    // Only what was created: no mandatory or suggested objects.
    let names: Vec<String> = schemas
        .list(&ListParams::default())
        .await
        .unwrap()
        .items
        .iter()
        .map(|s| s.name_any())
        .collect();
    assert_eq!(names, ["robot-server"]);

    let discovery = Discovery::new(client.clone()).run().await.unwrap();
    for kind in ["FlowSchema", "PriorityLevelConfiguration"] {
        let (ar, caps) = discovery
            .groups()
            .flat_map(|g| g.recommended_resources())
            .find(|(ar, _)| ar.kind == kind)
            .unwrap_or_else(|| panic!("{kind} discovered"));
        assert_eq!(ar.group, "flowcontrol.apiserver.k8s.io");
        assert_eq!(caps.scope, kube::discovery::Scope::Cluster, "{kind}");
        assert!(
            caps.subresources
                .iter()
                .any(|(s, _)| s.plural.ends_with("status")),
            "{kind}: no status subresource"
        );
    }

    // What `kubectl get prioritylevelconfigurations` prints.
    let req = http::Request::builder()
        .uri("/apis/flowcontrol.apiserver.k8s.io/v1/prioritylevelconfigurations")
        .header(
            "Accept",
            "application/json;as=Table;v=v1;g=meta.k8s.io,application/json",
        )
        .body(vec![])
        .unwrap();
    let table: serde_json::Value = serde_json::from_str(&client.request_text(req).await.unwrap()).unwrap();
    let columns: Vec<&str> = table["columnDefinitions"]
        .as_array()
        .unwrap()
        .iter()
        .map(|c| c["name"].as_str().unwrap())
        .collect();
    assert_eq!(
        columns,
        [
            "Name",
            "Type",
            "NominalConcurrencyShares",
            "Queues",
            "HandSize",
            "QueueLengthLimit",
            "Age"
        ]
    );
    let cells = table["rows"][0]["cells"].as_array().unwrap();
    assert_eq!(
        cells[..6],
        json!(["robots", "Limited", 20, 64, 4, 50]).as_array().unwrap()[..]
    );

    schemas
        .delete("robot-server", &DeleteParams::default())
        .await
        .unwrap();
    assert_eq!(api_code(schemas.get("robot-server").await.unwrap_err()), 404);
    server.shutdown().await.unwrap();
}
