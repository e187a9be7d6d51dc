//! Lists: the objects a label and field selector select, a page at a time
//! (`limit` and `continue`), as JSON, a Table or PartialObjectMetadata.

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

    /// Whether it selects a stored object. Field selectors see it as `rt`
    /// serves it; labels live in metadata, which no conversion changes, so
    /// the conversion is skipped when there is no field selector, and the
    /// object is not parsed at all when there is no selector.
    pub(super) fn selects(&self, rt: &ResourceType, stored: &Object) -> bool {
        if self.labels.is_empty() && self.fields.is_empty() {
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
    /// The resourceVersion of the snapshot.
    rv: u64,
    /// Where the next page starts, when there is one.
    cont: Option<String>,
    /// How many selected objects the next pages hold.
    remaining: usize,
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
    let start_after: Option<(String, String)> = match query.get("continue").filter(|c| !c.is_empty()) {
        Some(c) => Some(decode_continue(c)?),
        None => None,
    };
    let page = read_page(app, rt, ns, &selection, limit, start_after.as_ref());
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

fn read_page(
    app: &App,
    rt: &ResourceType,
    ns: Option<&str>,
    selection: &Selection,
    limit: usize,
    start_after: Option<&(String, String)>,
) -> Page {
    let gr = rt.stored_resource();
    // One snapshot under the lock (clones of shared objects); the selectors,
    // which may parse objects, run after it is released.
    let (rv, candidates) = app.store.read(|s| {
        let candidates: Vec<((String, String), Object)> = s
            .list(&gr, ns)
            .filter(|(key, _)| start_after.is_none_or(|after| *key > after))
            .map(|(key, obj)| (key.clone(), obj.clone()))
            .collect();
        (s.rv, candidates)
    });
    let mut items = Vec::new();
    let mut last_key = None;
    let mut more = 0usize;
    for (key, obj) in candidates {
        if !selection.selects(rt, &obj) {
            continue;
        }
        if items.len() >= limit {
            more += 1;
            continue;
        }
        last_key = Some(key);
        items.push(obj);
    }
    let cont = if more > 0 {
        last_key.map(|k| encode_continue(&k))
    } else {
        None
    };
    Page {
        items,
        rv,
        cont,
        remaining: more,
    }
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
        meta["remainingItemCount"] = json!(page.remaining);
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

fn encode_continue(key: &(String, String)) -> String {
    let raw = serde_json::to_vec(&json!([key.0, key.1])).unwrap_or_default();
    raw.iter().map(|b| format!("{b:02x}")).collect()
}

fn decode_continue(c: &str) -> Result<(String, String), ApiError> {
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
    match (v[0].as_str(), v[1].as_str()) {
        (Some(a), Some(b)) => Ok((a.to_string(), b.to_string())),
        _ => Err(bad()),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_continue_token_that_is_not_hex_is_a_bad_request() {
        for bad in ["aéa", "abc", "zz", "éé"] {
            assert!(decode_continue(bad).is_err(), "{bad}");
        }
    }
}
