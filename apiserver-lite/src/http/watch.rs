//! Watches: a stream of `{"type": ..., "object": ...}` lines, one per
//! change of a selected object, kept open until its timeout, the client
//! leaving, or shutdown.
//!
//! ```text
//!   subscribe ──┬─ no version, or sendInitialEvents: ADDED for each object
//!               │     (then the initial-events-end bookmark, when asked)
//!               ├─ a version still in the history: the events since it
//!               └─ a version older than the history: ERROR 410, close
//!   then follow: each new event; a BOOKMARK every interval when asked;
//!   close on timeout, on the client leaving, on falling behind the
//!   broadcast (the client resumes from its last resourceVersion) or on
//!   shutdown.
//! ```

use std::sync::Arc;
use std::time::Duration;

use axum::body::{Body, Bytes};
use axum::http::{header, StatusCode};
use axum::response::{IntoResponse, Response};
use serde_json::{json, Value};
use tokio::sync::broadcast::{self, error::RecvError};
use tokio::sync::mpsc;
use tokio_util::sync::CancellationToken;

use super::list::Selection;
use super::response::{include_object, one_row_table, with_version, Shape};
use super::{App, Query};
use crate::error::ApiError;
use crate::object::Object;
use crate::resources::ResourceType;
use crate::store::{self, EventType};
use crate::table::{self, IncludeObject};

pub(super) async fn serve(
    app: &App,
    rt: Arc<ResourceType>,
    ns: Option<&str>,
    query: &Query,
    shape: Shape,
) -> Result<Response, ApiError> {
    let selection = Selection::from_query(query)?;
    let params = Params::from_query(query)?;
    let filter = Filter {
        gr: rt.stored_resource(),
        ns: ns.map(String::from),
        rt: rt.clone(),
        selection,
    };
    let initial_wanted = params.send_initial.unwrap_or(params.from.is_none());
    let (start, events) = app
        .store
        .subscribe(|s| Start::read(s, &filter, initial_wanted, params.from));
    if let Start::Initial(_, rv) = &start {
        // The initial objects may include writes still on their way to disk.
        app.store.settled(*rv).await?;
    }
    let (tx, body) = mpsc::channel::<Result<Bytes, std::io::Error>>(256);
    let watcher = Watcher {
        tx,
        filter,
        view: WatchView {
            rt,
            shape,
            include: include_object(query),
            first_table: true,
        },
    };
    let follow = Follow {
        events,
        bookmarks: params.bookmarks,
        interval: app.bookmark_interval,
        timeout: params.timeout,
        shutdown: app.shutdown.clone(),
    };
    tokio::spawn(watcher.run(start, params.rv_param, params.send_initial, follow));
    Ok(streaming(body))
}

/// What a watch asks for in its query, besides its selectors.
struct Params {
    /// `resourceVersion` as sent.
    rv_param: String,
    /// The version to start after; `None` for "now".
    from: Option<u64>,
    send_initial: Option<bool>,
    bookmarks: bool,
    timeout: Duration,
}

impl Params {
    fn from_query(query: &Query) -> Result<Params, ApiError> {
        let rv_param = query.get("resourceVersion").cloned().unwrap_or_default();
        let from = if rv_param.is_empty() || rv_param == "0" {
            None
        } else {
            Some(
                rv_param
                    .parse()
                    .map_err(|_| ApiError::bad_request(format!("invalid resource version {rv_param:?}")))?,
            )
        };
        Ok(Params {
            send_initial: query.get("sendInitialEvents").map(|s| s == "true"),
            bookmarks: query.get("allowWatchBookmarks").is_some_and(|b| b == "true"),
            timeout: query
                .get("timeoutSeconds")
                .and_then(|t| t.parse::<u64>().ok())
                .map(Duration::from_secs)
                .unwrap_or(Duration::from_secs(1800)),
            rv_param,
            from,
        })
    }
}

/// Which stored objects the watch is about.
struct Filter {
    gr: String,
    ns: Option<String>,
    rt: Arc<ResourceType>,
    selection: Selection,
}

impl Filter {
    /// Whether the watcher sees `obj`, stored in namespace `ns`.
    fn matches(&self, ns: &str, obj: &Object) -> bool {
        self.ns.as_deref().is_none_or(|want| want == ns)
            && self.selection.selects(&self.rt, obj)
            && !self.gr.is_empty()
    }
}

/// Where a watch starts, read in the same snapshot as it subscribes.
enum Start {
    Initial(Vec<((String, String), Object)>, u64),
    Backlog(Vec<Arc<store::Event>>, u64),
    /// Older than the history kept: the oldest version that can be served.
    Gone(u64),
    /// Newer than anything this server wrote (storage restored from an
    /// older copy, or a version from another server): the newest one.
    TooNew(u64),
}

impl Start {
    fn read(s: &store::State, filter: &Filter, initial_wanted: bool, from: Option<u64>) -> Start {
        if initial_wanted {
            let items = s
                .list(&filter.gr, filter.ns.as_deref())
                .map(|(key, o)| (key.clone(), o.clone()))
                .collect();
            Start::Initial(items, s.rv)
        } else {
            // "Now" is what is committed: later changes are sent when they are.
            let from = from.unwrap_or(s.committed());
            if from > s.committed() {
                return Start::TooNew(s.committed());
            }
            match s.events_since(from) {
                Some(evs) => Start::Backlog(evs, from),
                None => Start::Gone(s.oldest()),
            }
        }
    }
}

/// What keeps a watch open after its start, and what ends it.
struct Follow {
    events: broadcast::Receiver<Arc<store::Event>>,
    bookmarks: bool,
    interval: Duration,
    timeout: Duration,
    shutdown: CancellationToken,
}

/// The task that writes one watch's stream.
struct Watcher {
    tx: mpsc::Sender<Result<Bytes, std::io::Error>>,
    filter: Filter,
    view: WatchView,
}

impl Watcher {
    async fn run(mut self, start: Start, rv_param: String, send_initial: Option<bool>, follow: Follow) {
        if let Some(last_rv) = self.replay(start, &rv_param, send_initial).await {
            self.follow(last_rv, follow).await;
        }
    }

    /// Sends a line; false once the client has gone.
    async fn send(&self, line: Bytes) -> bool {
        self.tx.send(Ok(line)).await.is_ok()
    }

    /// Sends what comes before live events; the resourceVersion it reached,
    /// or `None` when the stream is over.
    async fn replay(&mut self, start: Start, rv_param: &str, send_initial: Option<bool>) -> Option<u64> {
        match start {
            Start::Gone(oldest) => {
                let err = ApiError::gone(format!("too old resource version: {rv_param} ({oldest})"));
                self.send(event_line("ERROR", &err.to_status())).await;
                None
            }
            Start::TooNew(newest) => {
                let rv = rv_param.parse().unwrap_or(u64::MAX);
                let err = ApiError::version_too_new(rv, newest);
                self.send(event_line("ERROR", &err.to_status())).await;
                None
            }
            Start::Initial(items, rv) => {
                for ((ns, _), o) in &items {
                    if !self.filter.matches(ns, o) {
                        continue;
                    }
                    let line = self.view.render("ADDED", o);
                    if !self.send(line).await {
                        return None;
                    }
                }
                if send_initial == Some(true) && !self.send(self.view.bookmark(rv, true)).await {
                    return None;
                }
                Some(rv)
            }
            Start::Backlog(events, from) => {
                let mut last_rv = from;
                for ev in events {
                    if let Some(line) = self.line_for(&ev) {
                        if !self.send(line).await {
                            return None;
                        }
                    }
                    last_rv = ev.rv;
                }
                Some(last_rv)
            }
        }
    }

    async fn follow(&mut self, mut last_rv: u64, mut follow: Follow) {
        let deadline = tokio::time::sleep(follow.timeout);
        tokio::pin!(deadline);
        let mut tick = tokio::time::interval(follow.interval);
        tick.reset();
        loop {
            tokio::select! {
                ev = follow.events.recv() => match ev {
                    Ok(ev) => {
                        if ev.rv <= last_rv {
                            continue;
                        }
                        last_rv = ev.rv;
                        if let Some(line) = self.line_for(&ev) {
                            if !self.send(line).await {
                                return;
                            }
                        }
                    }
                    // A watcher that fell behind is closed; it resumes from its last resourceVersion.
                    Err(RecvError::Lagged(_)) | Err(RecvError::Closed) => return,
                },
                _ = tick.tick(), if follow.bookmarks => {
                    if !self.send(self.view.bookmark(last_rv, false)).await {
                        return;
                    }
                }
                _ = &mut deadline => return,
                _ = self.tx.closed() => return,
                _ = follow.shutdown.cancelled() => return,
            }
        }
    }

    /// The line an event makes for this watcher, if it sees the event at all.
    fn line_for(&mut self, ev: &store::Event) -> Option<Bytes> {
        if ev.gr != self.filter.gr {
            return None;
        }
        let now = self.filter.matches(&ev.ns, &ev.object);
        let before = ev.prev.as_ref().is_some_and(|p| self.filter.matches(&ev.ns, p));
        let type_ = match ev.type_ {
            EventType::Added if now => "ADDED",
            EventType::Modified if now && before => "MODIFIED",
            EventType::Modified if now => "ADDED",
            // Leaving the selection looks like a deletion to this watcher.
            EventType::Modified if before => "DELETED",
            EventType::Deleted if before || now => "DELETED",
            _ => return None,
        };
        Some(self.view.render(type_, &ev.object))
    }
}

/// How a watcher's events are written.
struct WatchView {
    rt: Arc<ResourceType>,
    shape: Shape,
    include: IncludeObject,
    first_table: bool,
}

impl WatchView {
    /// An event's line; the object goes out as stored when it is served so.
    fn render(&mut self, type_: &str, obj: &Object) -> Bytes {
        match self.shape {
            Shape::Full if obj.api_version().as_deref() == Some(&self.rt.api_version()) => {
                encoded_line(type_, obj.json())
            }
            Shape::Full => event_line(type_, &with_version(&self.rt, &obj.value())),
            Shape::Metadata => event_line(type_, &table::partial_metadata(&obj.value())),
            Shape::Table => {
                let mut t = one_row_table(&self.rt, &obj.value(), self.include);
                // Like the real server, column definitions come with the first event only.
                if !self.first_table {
                    t["columnDefinitions"] = json!([]);
                }
                self.first_table = false;
                event_line(type_, &t)
            }
        }
    }

    fn bookmark(&self, rv: u64, initial_end: bool) -> Bytes {
        let mut meta = json!({"resourceVersion": rv.to_string()});
        if initial_end {
            meta["annotations"] = json!({"k8s.io/initial-events-end": "true"});
        }
        let obj = match self.shape {
            Shape::Full => {
                json!({"kind": self.rt.kind, "apiVersion": self.rt.api_version(), "metadata": meta})
            }
            Shape::Metadata => {
                json!({"kind": "PartialObjectMetadata", "apiVersion": "meta.k8s.io/v1", "metadata": meta})
            }
            Shape::Table => {
                json!({"kind": "Table", "apiVersion": "meta.k8s.io/v1", "metadata": meta, "columnDefinitions": [], "rows": []})
            }
        };
        event_line("BOOKMARK", &obj)
    }
}

fn event_line(type_: &str, object: &Value) -> Bytes {
    line(type_, 512, |out| {
        let _ = serde_json::to_writer(out, object);
    })
}

/// A line around an object already encoded, which is not encoded again.
fn encoded_line(type_: &str, encoded: &[u8]) -> Bytes {
    line(type_, encoded.len() + 32, |out| out.extend_from_slice(encoded))
}

fn line(type_: &str, capacity: usize, write_object: impl FnOnce(&mut Vec<u8>)) -> Bytes {
    let mut out = Vec::with_capacity(capacity);
    out.extend_from_slice(b"{\"type\":\"");
    out.extend_from_slice(type_.as_bytes());
    out.extend_from_slice(b"\",\"object\":");
    write_object(&mut out);
    out.extend_from_slice(b"}\n");
    Bytes::from(out)
}

fn streaming(body: mpsc::Receiver<Result<Bytes, std::io::Error>>) -> Response {
    let stream = futures::stream::unfold(
        body,
        |mut rx| async move { rx.recv().await.map(|item| (item, rx)) },
    );
    Response::builder()
        .status(StatusCode::OK)
        .header(header::CONTENT_TYPE, "application/json")
        .header(header::CACHE_CONTROL, "no-cache, private")
        .body(Body::from_stream(stream))
        .unwrap_or_else(|_| ApiError::internal("cannot build watch response").into_response())
}
