//! Server-sent events: the changes a page follows (a page refetches its
//! live part when the kinds it shows changed, at most every 100 ms), and a
//! task's output through the logs API, as the user.

use std::convert::Infallible;
use std::sync::Arc;
use std::time::Duration;

use axum::extract::{Path, Query, State as Extract};
use axum::response::sse::{Event, KeepAlive, Sse};
use futures::{Stream, StreamExt};
use k8s4r_api::log_frame::{Decoder, Frame, QUERY};
use serde::Deserialize;
use tokio::sync::broadcast::error::RecvError;

use super::state::Kind;
use super::State;

/// How long changes are gathered before a page is told.
const COALESCE: Duration = Duration::from_millis(100);
/// Lines of output a task page starts with.
const TAIL_LINES: u32 = 2000;

#[derive(Debug, Deserialize)]
pub struct Watching {
    /// The kinds, comma-separated (`robot,task`).
    #[serde(default)]
    watch: String,
}

/// `changed` events for the kinds a page shows.
pub async fn changes(
    Extract(state): Extract<Arc<State>>,
    Query(watching): Query<Watching>,
) -> Sse<impl Stream<Item = Result<Event, Infallible>>> {
    let kinds: Vec<Kind> = watching.watch.split(',').filter_map(Kind::parse).collect();
    let mut feed = state.changes.subscribe();
    let stream = async_stream(move |tx| async move {
        // Said at once: a page that reconnected refetches what it missed.
        if tx
            .send(Event::default().event("hello").data("hello"))
            .await
            .is_err()
        {
            return;
        }
        loop {
            let relevant = match feed.recv().await {
                Ok(kind) => kinds.contains(&kind),
                Err(RecvError::Lagged(_)) => true,
                Err(RecvError::Closed) => return,
            };
            if !relevant {
                continue;
            }
            tokio::time::sleep(COALESCE).await;
            // Whatever came meanwhile is told with this one.
            while feed.try_recv().is_ok() {}
            if tx
                .send(Event::default().event("changed").data("changed"))
                .await
                .is_err()
            {
                return;
            }
        }
    });
    Sse::new(stream).keep_alive(KeepAlive::new().interval(Duration::from_secs(10)))
}

#[derive(Debug, Deserialize)]
pub struct LogQuery {
    #[serde(default)]
    follow: bool,
}

/// A task's output: `out` events (a chunk of text), `gap` (output is
/// missing, and why), `notice` (the robot could not be asked: this is the
/// cluster's last output), `end` (all of it), `cut` (the read broke off
/// before the end), `error` (the logs API refused, and why).
pub async fn log(
    Extract(state): Extract<Arc<State>>,
    Path((ns, name)): Path<(String, String)>,
    Query(query): Query<LogQuery>,
) -> Sse<impl Stream<Item = Result<Event, Infallible>>> {
    let client = state.client.clone();
    let stream = async_stream(move |tx| async move {
        let q = format!(
            "stream=all&tailLines={TAIL_LINES}&{QUERY}{}",
            if query.follow { "&follow=true" } else { "" }
        );
        let reading = match crate::logs::open(&client, &ns, &name, &q).await {
            Ok(r) => r,
            Err(e) => {
                let _ = tx
                    .send(Event::default().event("error").data(format!("{e:#}")))
                    .await;
                return;
            }
        };
        if let Some(notice) = &reading.notice {
            let _ = tx
                .send(Event::default().event("notice").data(notice.clone()))
                .await;
        }
        let mut body = reading.body;
        let mut frames = reading.framed.then(Decoder::default);
        while let Some(chunk) = body.next().await {
            let Ok(chunk) = chunk else { break };
            let events = match frames.as_mut() {
                Some(decoder) => {
                    decoder.push(&chunk);
                    let mut out = Vec::new();
                    while let Ok(Some(frame)) = decoder.next_frame() {
                        out.push(match frame {
                            Frame::Output(bytes) => text_event("out", &bytes),
                            Frame::Warning(w) => Event::default().event("gap").data(w),
                            Frame::End => Event::default().event("end").data("end"),
                        });
                    }
                    out
                }
                None => vec![text_event("out", &chunk)],
            };
            for event in events {
                if tx.send(event).await.is_err() {
                    return;
                }
            }
        }
        // A framed answer said its End already; one without an End was cut.
        let last = match &frames {
            Some(decoder) if decoder.ended() => return,
            Some(_) => "cut",
            None => "end",
        };
        let _ = tx.send(Event::default().event(last).data(last)).await;
    });
    Sse::new(stream).keep_alive(KeepAlive::new().interval(Duration::from_secs(10)))
}

/// Output as an event; SSE data is lines, so the text travels as JSON.
fn text_event(name: &str, bytes: &[u8]) -> Event {
    let text = String::from_utf8_lossy(bytes);
    Event::default()
        .event(name)
        .data(serde_json::to_string(&text).unwrap_or_default())
}

/// A stream fed by `produce` through a small channel (the stream ends when
/// `produce` returns; `produce` stops when the page goes).
fn async_stream<F, Fut>(produce: F) -> impl Stream<Item = Result<Event, Infallible>>
where
    F: FnOnce(tokio::sync::mpsc::Sender<Event>) -> Fut,
    Fut: std::future::Future<Output = ()> + Send + 'static,
{
    let (tx, rx) = tokio::sync::mpsc::channel(64);
    tokio::spawn(produce(tx));
    tokio_stream::wrappers::ReceiverStream::new(rx).map(Ok)
}
