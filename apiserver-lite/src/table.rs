//! `meta.k8s.io/v1` Table responses (what `kubectl get` prints) and the small
//! JSONPath subset printer columns use.

use serde_json::{json, Value};

use crate::resources::ResourceType;

#[derive(Debug, Clone, PartialEq)]
enum Step {
    Field(String),
    Index(usize),
    All,
    Filter(String, String),
}

fn parse_path(path: &str) -> Vec<Step> {
    let p = path.trim();
    let p = p.strip_prefix('{').and_then(|s| s.strip_suffix('}')).unwrap_or(p);
    let mut steps = Vec::new();
    let mut rest = p;
    while !rest.is_empty() {
        if let Some(r) = rest.strip_prefix('.') {
            let end = r.find(['.', '[']).unwrap_or(r.len());
            if end > 0 {
                steps.push(Step::Field(r[..end].to_string()));
            }
            rest = &r[end..];
        } else if let Some(r) = rest.strip_prefix('[') {
            let end = r.find(']').unwrap_or(r.len());
            let inner = &r[..end];
            if inner == "*" {
                steps.push(Step::All);
            } else if let Ok(i) = inner.parse() {
                steps.push(Step::Index(i));
            } else if let Some(f) = inner.strip_prefix("?(@.").and_then(|f| f.strip_suffix(')')) {
                if let Some((k, v)) = f.split_once("==") {
                    let v = v.trim().trim_matches(|c| c == '"' || c == '\'');
                    steps.push(Step::Filter(k.trim().to_string(), v.to_string()));
                }
            } else {
                let name = inner.trim_matches(|c| c == '\'' || c == '"');
                steps.push(Step::Field(name.to_string()));
            }
            rest = r.get(end + 1..).unwrap_or("");
        } else {
            let end = rest.find(['.', '[']).unwrap_or(rest.len());
            steps.push(Step::Field(rest[..end].to_string()));
            rest = &rest[end..];
        }
    }
    steps
}

/// Evaluates a printer column's JSONPath; several matches are joined with commas.
pub fn eval(obj: &Value, path: &str) -> Option<Value> {
    let mut cur: Vec<&Value> = vec![obj];
    for step in parse_path(path) {
        let mut next = Vec::new();
        for v in cur {
            match &step {
                Step::Field(f) => next.extend(v.get(f)),
                Step::Index(i) => next.extend(v.get(*i)),
                Step::All => next.extend(v.as_array().into_iter().flatten()),
                Step::Filter(k, want) => {
                    next.extend(
                        v.as_array()
                            .into_iter()
                            .flatten()
                            .filter(|item| match item.get(k) {
                                Some(Value::String(s)) => s == want,
                                Some(other) => {
                                    let rendered = other.to_string();
                                    rendered == *want
                                }
                                None => false,
                            }),
                    )
                }
            }
        }
        cur = next;
    }
    match cur.len() {
        0 => None,
        1 => Some(cur[0].clone()),
        _ => Some(Value::String(
            cur.iter()
                .map(|v| match v {
                    Value::String(s) => s.clone(),
                    other => other.to_string(),
                })
                .collect::<Vec<_>>()
                .join(","),
        )),
    }
}

/// How much of each object a Table row carries (`includeObject`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum IncludeObject {
    None,
    Metadata,
    Object,
}

pub fn column_definitions(rt: &ResourceType) -> Vec<Value> {
    let mut cols = vec![json!({
        "name": "Name", "type": "string", "format": "name", "priority": 0,
        "description": "Name must be unique within a namespace. Is required when creating resources, although some resources may allow a client to request the generation of an appropriate name automatically."
    })];
    for c in &rt.columns {
        cols.push(json!({
            "name": c.name, "type": c.type_, "format": c.format,
            "description": c.description, "priority": c.priority,
        }));
    }
    cols
}

/// One row of a Table, for a stored object.
pub fn row(rt: &ResourceType, stored: &Value, include: IncludeObject) -> Value {
    let obj = &*rt.from_storage(stored);
    let mut cells = vec![obj["metadata"]["name"].clone()];
    for c in &rt.columns {
        let v = eval(obj, &c.json_path);
        cells.push(match (v, c.type_.as_str()) {
            (None, _) => Value::Null,
            (Some(Value::Array(a)), _) => Value::String(
                a.iter()
                    .map(|x| x.as_str().map(String::from).unwrap_or_else(|| x.to_string()))
                    .collect::<Vec<_>>()
                    .join(","),
            ),
            (Some(Value::Object(_)), _) => Value::String(obj.to_string()),
            (Some(Value::String(t)), "date") => Value::String(age(&t)),
            (Some(v), _) => v,
        });
    }
    let mut row = json!({ "cells": cells });
    match include {
        IncludeObject::None => {}
        IncludeObject::Metadata => {
            row["object"] = partial_metadata(obj);
        }
        IncludeObject::Object => {
            row["object"] = obj.clone();
            row["object"]["apiVersion"] = json!(rt.api_version());
        }
    }
    row
}

/// Like the real server, date columns are sent as a human-readable age ("5m", "3d").
fn age(timestamp: &str) -> String {
    match timestamp.parse::<jiff::Timestamp>() {
        Ok(t) => human_duration(jiff::Timestamp::now().as_second() - t.as_second()),
        Err(_) => "<unknown>".to_string(),
    }
}

/// apimachinery's `duration.HumanDuration`.
pub fn human_duration(secs: i64) -> String {
    if secs < -1 {
        return "<invalid>".into();
    }
    let s = secs.max(0);
    let (m, h, d) = (s / 60, s / 3600, s / 86400);
    let with = |a: i64, ua: &str, b: i64, ub: &str| {
        if b == 0 {
            format!("{a}{ua}")
        } else {
            format!("{a}{ua}{b}{ub}")
        }
    };
    if s < 120 {
        format!("{s}s")
    } else if m < 10 {
        with(m, "m", s % 60, "s")
    } else if m < 180 {
        format!("{m}m")
    } else if h < 8 {
        with(h, "h", m % 60, "m")
    } else if h < 48 {
        format!("{h}h")
    } else if h < 24 * 8 {
        with(d, "d", h % 24, "h")
    } else if h < 24 * 365 * 2 {
        format!("{d}d")
    } else if h < 24 * 365 * 8 {
        with(d / 365, "y", d % 365, "d")
    } else {
        format!("{}y", d / 365)
    }
}

pub fn partial_metadata(obj: &Value) -> Value {
    json!({
        "kind": "PartialObjectMetadata",
        "apiVersion": "meta.k8s.io/v1",
        "metadata": obj["metadata"].clone(),
    })
}

pub fn table(rt: &ResourceType, rows: Vec<Value>, rv: u64, cont: Option<String>) -> Value {
    let mut meta = json!({ "resourceVersion": rv.to_string() });
    if let Some(c) = cont {
        meta["continue"] = json!(c);
    }
    json!({
        "kind": "Table",
        "apiVersion": "meta.k8s.io/v1",
        "metadata": meta,
        "columnDefinitions": column_definitions(rt),
        "rows": rows,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn jsonpath_subset() {
        let o = json!({"status": {"phase": "Running", "conditions": [
            {"type": "Ready", "status": "True"}, {"type": "Synced", "status": "False"}]},
            "spec": {"list": ["a", "b"]}});
        assert_eq!(eval(&o, ".status.phase"), Some(json!("Running")));
        assert_eq!(eval(&o, "{.status.phase}"), Some(json!("Running")));
        assert_eq!(
            eval(&o, ".status.conditions[?(@.type==\"Ready\")].status"),
            Some(json!("True"))
        );
        assert_eq!(eval(&o, ".status.conditions[1].type"), Some(json!("Synced")));
        assert_eq!(eval(&o, ".spec.list[*]"), Some(json!("a,b")));
        assert_eq!(eval(&o, ".spec.missing"), None);
        assert_eq!(human_duration(5), "5s");
        assert_eq!(human_duration(190), "3m10s");
        assert_eq!(human_duration(3 * 86400 + 3600), "3d1h");
    }
}
