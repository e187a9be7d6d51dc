//! Lists: the objects a label and field selector select, a page at a time
//! (`limit` and `continue`), as JSON, a Table or PartialObjectMetadata.

use std::collections::VecDeque;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use axum::http::StatusCode;
use axum::response::Response;
use serde_json::{json, Value};

use super::response::{bytes_response, include_object, json_response, with_version, Shape};
use super::{App, Query};
use crate::error::ApiError;
use crate::object::Object;
use crate::resources::ResourceType;
use crate::selectors::{FieldSelector, LabelSelector};
use crate::table;

/// The `labelSelector` and `fieldSelector` of a list, a watch or a
/// deletecollection.
pub(super) struct Selection {
    labels: LabelSelector,
    fields: FieldSelector,
}

impl Selection {
    pub(super) fn from_query(query: &Query) -> Result<Selection, ApiError> {
        let labels = LabelSelector::parse(query.get("labelSelector").map(String::as_str).unwrap_or_default())
            .map_err(ApiError::bad_request)?;
        // metadata.name and metadata.namespace everywhere, as the real server; for
        // other dotted paths see KNOWN_DIFFERENCES.
        let fields = FieldSelector::parse(
            query.get("fieldSelector").map(String::as_str).unwrap_or_default(),
            |p| !p.is_empty() && p.split('.').all(|s| !s.is_empty()),
        )
        .map_err(ApiError::bad_request)?;
        Ok(Selection { labels, fields })
    }

    /// Whether it selects every object (no selector at all).
    fn is_everything(&self) -> bool {
        self.labels.is_empty() && self.fields.is_empty()
    }

    /// Whether it selects a stored object. Field selectors see it as `rt`
    /// serves it; labels live in metadata, which no conversion changes, so
    /// the conversion is skipped when there is no field selector, and the
    /// object is not parsed at all when there is no selector.
    pub(super) fn selects(&self, rt: &ResourceType, stored: &Object) -> bool {
        if self.is_everything() {
            return true;
        }
        let stored = stored.value();
        self.labels.matches(&stored)
            && (self.fields.is_empty() || self.fields.matches(&rt.from_storage(&stored)))
    }
}

/// One page of a list, read in one snapshot.
struct Page {
    items: Vec<Object>,
    /// The resourceVersion of the snapshot (the first page's, on every page).
    rv: u64,
    /// Where the next page starts, when there is one.
    cont: Option<String>,
    /// How many objects the next pages hold; unknown (and not reported, as
    /// by a real API server) when a selector chooses among them.
    remaining: Option<usize>,
}

pub(super) fn serve(
    app: &App,
    rt: &ResourceType,
    ns: Option<&str>,
    query: &Query,
    shape: Shape,
) -> Result<Response, ApiError> {
    let selection = Selection::from_query(query)?;
    let limit: usize = query
        .get("limit")
        .and_then(|l| l.parse().ok())
        .filter(|l| *l > 0)
        .unwrap_or(usize::MAX);
    let cursor = match query.get("continue").filter(|c| !c.is_empty()) {
        Some(c) => Some(Cursor::decode(c)?),
        None => None,
    };
    let page = read_page(app, rt, ns, &selection, limit, cursor)?;
    match shape {
        Shape::Table => {
            let inc = include_object(query);
            let rows = page
                .items
                .iter()
                .map(|o| table::row(rt, &o.value(), inc))
                .collect();
            Ok(json_response(
                StatusCode::OK,
                &table::table(rt, rows, page.rv, page.cont),
            ))
        }
        Shape::Metadata => Ok(metadata_list(page)),
        Shape::Full => full_list(rt, page),
    }
}

/// A page of the list: the first one read from the store now, the next
/// ones from what the first one read (see [`ListSnapshots`]).
fn read_page(
    app: &App,
    rt: &ResourceType,
    ns: Option<&str>,
    selection: &Selection,
    limit: usize,
    cursor: Option<Cursor>,
) -> Result<Page, ApiError> {
    let gr = rt.stored_resource();
    let (rv, entries, start) = match &cursor {
        // One snapshot under the lock (clones of shared objects); the
        // selectors, which may parse objects, run after it is released.
        None => app.store.read(|s| {
            let entries: Vec<Entry> = s
                .list(&gr, ns)
                .map(|(key, obj)| (key.clone(), obj.clone()))
                .collect();
            (s.rv, Arc::new(entries), 0)
        }),
        Some(cursor) => {
            let entries = app.lists.find(cursor.list, &gr, ns, cursor.rv).ok_or_else(|| {
                ApiError::gone(format!(
                    "the continue token of this list (resourceVersion {}) has expired: list again without it",
                    cursor.rv
                ))
            })?;
            let start = entries.partition_point(|(key, _)| *key <= cursor.after);
            (cursor.rv, entries, start)
        }
    };
    let mut items = Vec::new();
    let mut next = start;
    for (_, obj) in &entries[start..] {
        if items.len() >= limit {
            break;
        }
        next += 1;
        if selection.selects(rt, obj) {
            items.push(obj.clone());
        }
    }
    let rest = &entries[next..];
    let more = if selection.is_everything() {
        !rest.is_empty()
    } else {
        rest.iter().any(|(_, obj)| selection.selects(rt, obj))
    };
    let list = match (&cursor, more) {
        (Some(cursor), true) => Some(cursor.list),
        (None, true) => Some(app.lists.keep(&gr, ns, rv, entries.clone())),
        // The last page: what the list read is no longer needed.
        (Some(cursor), false) => {
            app.lists.done(cursor.list);
            None
        }
        (None, false) => None,
    };
    let cont = list.zip(next.checked_sub(1)).map(|(list, last)| {
        Cursor {
            rv,
            list,
            after: entries[last].0.clone(),
        }
        .encode()
    });
    Ok(Page {
        items,
        rv,
        cont,
        remaining: selection.is_everything().then_some(rest.len()),
    })
}

fn metadata_list(page: Page) -> Response {
    let items: Vec<Value> = page
        .items
        .iter()
        .map(|o| table::partial_metadata(&o.value()))
        .collect();
    let mut meta = json!({"resourceVersion": page.rv.to_string()});
    if let Some(c) = page.cont {
        meta["continue"] = json!(c);
    }
    json_response(
        StatusCode::OK,
        &json!({"kind": "PartialObjectMetadataList", "apiVersion": "meta.k8s.io/v1", "metadata": meta, "items": items}),
    )
}

fn full_list(rt: &ResourceType, page: Page) -> Result<Response, ApiError> {
    let mut meta = json!({"resourceVersion": page.rv.to_string()});
    if let Some(c) = page.cont {
        meta["continue"] = json!(c);
        if let Some(remaining) = page.remaining {
            meta["remainingItemCount"] = json!(remaining);
        }
    }
    // Written by hand so the items go out as stored, not parsed into a new tree.
    let mut out = Vec::with_capacity(256 + page.items.iter().map(|o| o.json().len() + 1).sum::<usize>());
    out.extend_from_slice(
        format!(
            "{{\"kind\":{},\"apiVersion\":{},\"metadata\":{},\"items\":[",
            json!(rt.list_kind),
            json!(rt.api_version()),
            meta
        )
        .as_bytes(),
    );
    let av = rt.api_version();
    for (i, o) in page.items.iter().enumerate() {
        if i > 0 {
            out.push(b',');
        }
        if o.api_version().as_deref() == Some(&av) {
            out.extend_from_slice(o.json());
        } else {
            serde_json::to_writer(&mut out, &with_version(rt, &o.value()))
                .map_err(|e| ApiError::internal(e.to_string()))?;
        }
    }
    out.extend_from_slice(b"]}");
    Ok(bytes_response(StatusCode::OK, out))
}

/// Where the next page of a list starts: after `after`, in the objects
/// list number `list` read as of `rv`. Sent as hex of a JSON array.
#[derive(Debug, PartialEq)]
struct Cursor {
    rv: u64,
    list: u64,
    after: Key,
}

impl Cursor {
    fn encode(&self) -> String {
        let raw =
            serde_json::to_vec(&json!([self.rv, self.list, self.after.0, self.after.1])).unwrap_or_default();
        raw.iter().map(|b| format!("{b:02x}")).collect()
    }

    fn decode(c: &str) -> Result<Cursor, ApiError> {
        let bad = || ApiError::bad_request("continue key is not valid");
        // Hex only: slicing a non-ASCII value two bytes at a time would panic.
        if !c.is_ascii() || !c.len().is_multiple_of(2) {
            return Err(bad());
        }
        let bytes: Result<Vec<u8>, _> = (0..c.len())
            .step_by(2)
            .map(|i| u8::from_str_radix(&c[i..i + 2], 16))
            .collect();
        let v: Value = serde_json::from_slice(&bytes.map_err(|_| bad())?).map_err(|_| bad())?;
        match (v[0].as_u64(), v[1].as_u64(), v[2].as_str(), v[3].as_str()) {
            (Some(rv), Some(list), Some(ns), Some(name)) => Ok(Cursor {
                rv,
                list,
                after: (ns.to_string(), name.to_string()),
            }),
            _ => Err(bad()),
        }
    }
}

/// An object's key in the store: namespace and name.
type Key = (String, String);
type Entry = (Key, Object);

/// How long the objects a paginated list read are kept for its next pages.
/// A real API server serves the next pages from etcd at the first one's
/// revision until etcd is compacted past it (every 5 minutes by default).
const SNAPSHOT_TTL: Duration = Duration::from_secs(300);
/// How many bytes the kept lists may hold together (their objects' JSON,
/// which they share with the store until the store replaces an object);
/// the oldest list goes first.
const SNAPSHOT_BYTES: usize = 512 << 20;

/// The objects of each paginated list as its first page read them, so that
/// every page shows the objects as of one resourceVersion, as a real API
/// server's pages do. A client that lists in pages and then watches from
/// the list's resourceVersion (kube-runtime's watcher, client-go's
/// reflector) sees every change made while it listed: one made to an object
/// on a page it already had comes after that version, and the watch brings
/// it. Read afresh per page, such a change would be older than the version
/// the watch starts from, and lost to the client for good.
///
/// Each list keeps its own, until its last page is served. A page asked
/// for once its list is no longer kept (older than [`SNAPSHOT_TTL`], pushed
/// out by newer lists, or already finished) is answered 410 Gone, reason
/// `Expired`, as a real server answers a compacted continue token; the
/// client lists again from the start.
#[derive(Default)]
pub struct ListSnapshots(Mutex<Kept>);

#[derive(Default)]
struct Kept {
    /// Oldest first.
    lists: VecDeque<Snapshot>,
    /// The bytes they hold together.
    bytes: usize,
    /// The number the last list kept was given.
    last: u64,
}

struct Snapshot {
    list: u64,
    gr: String,
    ns: Option<String>,
    rv: u64,
    taken: Instant,
    bytes: usize,
    entries: Arc<Vec<Entry>>,
}

impl ListSnapshots {
    fn lock(&self) -> std::sync::MutexGuard<'_, Kept> {
        // A panic while holding the lock leaves plain data behind; keep serving.
        self.0.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// Keeps the objects a list of `gr` (in `ns`, or every namespace) read
    /// as of `rv` for its next pages; the list's number.
    fn keep(&self, gr: &str, ns: Option<&str>, rv: u64, entries: Arc<Vec<Entry>>) -> u64 {
        let bytes = entries
            .iter()
            .map(|((ns, name), obj)| ns.len() + name.len() + obj.json().len() + 96)
            .sum();
        let mut kept = self.lock();
        kept.last += 1;
        let list = kept.last;
        kept.bytes += bytes;
        kept.lists.push_back(Snapshot {
            list,
            gr: gr.to_string(),
            ns: ns.map(str::to_string),
            rv,
            taken: Instant::now(),
            bytes,
            entries,
        });
        kept.expire(Instant::now());
        list
    }

    /// The objects list number `list` (of `gr` in `ns`, as of `rv`) read,
    /// if still kept.
    fn find(&self, list: u64, gr: &str, ns: Option<&str>, rv: u64) -> Option<Arc<Vec<Entry>>> {
        let mut kept = self.lock();
        kept.expire(Instant::now());
        kept.lists
            .iter()
            .find(|s| s.list == list && s.rv == rv && s.gr == gr && s.ns.as_deref() == ns)
            .map(|s| s.entries.clone())
    }

    /// Forgets list number `list`: its last page was served.
    fn done(&self, list: u64) {
        let mut kept = self.lock();
        if let Some(at) = kept.lists.iter().position(|s| s.list == list) {
            if let Some(gone) = kept.lists.remove(at) {
                kept.bytes -= gone.bytes;
            }
        }
    }
}

impl Kept {
    /// Drops lists older than the TTL, then the oldest while they hold too
    /// many bytes (the newest list is kept whatever its size: two lists
    /// each over the bound, paged at once, push each other out, and their
    /// clients list again).
    fn expire(&mut self, now: Instant) {
        while let Some(oldest) = self.lists.front() {
            let stale = now.duration_since(oldest.taken) > SNAPSHOT_TTL;
            if !stale && (self.bytes <= SNAPSHOT_BYTES || self.lists.len() == 1) {
                break;
            }
            if let Some(gone) = self.lists.pop_front() {
                self.bytes -= gone.bytes;
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_continue_token_that_is_not_hex_is_a_bad_request() {
        for bad in ["aéa", "abc", "zz", "éé"] {
            assert!(Cursor::decode(bad).is_err(), "{bad}");
        }
    }
}
