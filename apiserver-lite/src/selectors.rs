//! Label selectors (equality- and set-based) and field selectors, parsed from
//! the query string the way apimachinery reads them.

use std::collections::BTreeSet;

use serde_json::Value;

#[derive(Debug, Clone, PartialEq)]
enum Requirement {
    Equals(String, String),
    NotEquals(String, String),
    In(String, BTreeSet<String>),
    NotIn(String, BTreeSet<String>),
    Exists(String),
    NotExists(String),
}

/// A parsed `labelSelector`.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct LabelSelector(Vec<Requirement>);

/// Splits on commas that are not inside parentheses.
fn split_top(s: &str) -> Vec<&str> {
    let mut out = Vec::new();
    let mut depth = 0;
    let mut start = 0;
    for (i, c) in s.char_indices() {
        match c {
            '(' => depth += 1,
            ')' => depth -= 1,
            ',' if depth == 0 => {
                out.push(&s[start..i]);
                start = i + 1;
            }
            _ => {}
        }
    }
    out.push(&s[start..]);
    out
}

fn parse_set(s: &str) -> Result<BTreeSet<String>, String> {
    let inner = s
        .trim()
        .strip_prefix('(')
        .and_then(|r| r.strip_suffix(')'))
        .ok_or_else(|| format!("expected a parenthesised set, found {s:?}"))?;
    Ok(inner
        .split(',')
        .map(|v| v.trim().to_string())
        .filter(|v| !v.is_empty())
        .collect())
}

impl LabelSelector {
    pub fn parse(s: &str) -> Result<Self, String> {
        let mut reqs = Vec::new();
        for part in split_top(s) {
            let part = part.trim();
            if part.is_empty() {
                continue;
            }
            if let Some(key) = part.strip_prefix('!') {
                reqs.push(Requirement::NotExists(key.trim().to_string()));
            } else if let Some((k, v)) = part.split_once("!=") {
                reqs.push(Requirement::NotEquals(k.trim().into(), v.trim().into()));
            } else if let Some((k, v)) = part.split_once("==") {
                reqs.push(Requirement::Equals(k.trim().into(), v.trim().into()));
            } else if let Some((k, v)) = part.split_once('=') {
                reqs.push(Requirement::Equals(k.trim().into(), v.trim().into()));
            } else if let Some((k, rest)) = part.split_once(" notin ") {
                reqs.push(Requirement::NotIn(k.trim().into(), parse_set(rest)?));
            } else if let Some((k, rest)) = part.split_once(" in ") {
                reqs.push(Requirement::In(k.trim().into(), parse_set(rest)?));
            } else if part.contains(' ') || part.contains('(') {
                return Err(format!("unable to parse requirement: {part:?}"));
            } else {
                reqs.push(Requirement::Exists(part.to_string()));
            }
        }
        Ok(LabelSelector(reqs))
    }

    /// Whether it selects everything.
    pub fn is_empty(&self) -> bool {
        self.0.is_empty()
    }

    /// A selector written as an object (`matchLabels` and
    /// `matchExpressions` with `In`, `NotIn`, `Exists`, `DoesNotExist`), as
    /// an aggregation rule holds it. An unknown operator is an error, so
    /// that a typo selects nothing rather than everything.
    pub fn from_object(selector: &Value) -> Result<Self, String> {
        let mut reqs = Vec::new();
        for (k, v) in selector["matchLabels"].as_object().into_iter().flatten() {
            let v = v
                .as_str()
                .ok_or_else(|| format!("matchLabels.{k} is not a string"))?;
            reqs.push(Requirement::Equals(k.clone(), v.to_owned()));
        }
        for e in selector["matchExpressions"].as_array().into_iter().flatten() {
            let key = e["key"].as_str().unwrap_or_default().to_owned();
            let values: BTreeSet<String> = e["values"]
                .as_array()
                .into_iter()
                .flatten()
                .filter_map(Value::as_str)
                .map(str::to_owned)
                .collect();
            reqs.push(match e["operator"].as_str().unwrap_or_default() {
                "In" => Requirement::In(key, values),
                "NotIn" => Requirement::NotIn(key, values),
                "Exists" => Requirement::Exists(key),
                "DoesNotExist" => Requirement::NotExists(key),
                other => return Err(format!("{other:?} is not a valid label selector operator")),
            });
        }
        Ok(LabelSelector(reqs))
    }

    pub fn matches(&self, obj: &Value) -> bool {
        let labels = &obj["metadata"]["labels"];
        self.matches_with(|k| labels.get(k).and_then(|v| v.as_str()))
    }

    /// Whether `labels` (an object's labels as a map) match.
    pub fn matches_labels(&self, labels: &std::collections::BTreeMap<String, String>) -> bool {
        self.matches_with(|k| labels.get(k).map(String::as_str))
    }

    fn matches_with<'a>(&self, get: impl Fn(&str) -> Option<&'a str>) -> bool {
        self.0.iter().all(|r| match r {
            Requirement::Equals(k, v) => get(k) == Some(v.as_str()),
            Requirement::NotEquals(k, v) => get(k) != Some(v.as_str()),
            Requirement::In(k, set) => get(k).is_some_and(|v| set.contains(v)),
            Requirement::NotIn(k, set) => get(k).is_none_or(|v| !set.contains(v)),
            Requirement::Exists(k) => get(k).is_some(),
            Requirement::NotExists(k) => get(k).is_none(),
        })
    }
}

/// A parsed `fieldSelector`: `path=value`, `path==value` and `path!=value` terms.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct FieldSelector(Vec<(Vec<String>, bool, String)>);

impl FieldSelector {
    /// `allowed` says which paths the resource supports; the real server
    /// supports `metadata.name` and `metadata.namespace` on every resource.
    pub fn parse(s: &str, allowed: impl Fn(&str) -> bool) -> Result<Self, String> {
        let mut terms = Vec::new();
        for part in s.split(',') {
            let part = part.trim();
            if part.is_empty() {
                continue;
            }
            let (path, eq, value) = if let Some((k, v)) = part.split_once("!=") {
                (k, false, v)
            } else if let Some((k, v)) = part.split_once("==") {
                (k, true, v)
            } else if let Some((k, v)) = part.split_once('=') {
                (k, true, v)
            } else {
                return Err(format!("invalid selector: '{part}'; can't understand '{part}'"));
            };
            let path = path.trim();
            if !allowed(path) {
                return Err(format!("field label not supported: {path}"));
            }
            terms.push((
                path.split('.').map(String::from).collect(),
                eq,
                value.trim().to_string(),
            ));
        }
        Ok(FieldSelector(terms))
    }

    /// Whether the selector has no terms (selects everything).
    pub fn is_empty(&self) -> bool {
        self.0.is_empty()
    }

    /// The name an equality term on `metadata.name` pins, if any.
    pub fn pinned_name(&self) -> Option<&str> {
        self.0
            .iter()
            .find(|(path, eq, _)| *eq && path.len() == 2 && path[0] == "metadata" && path[1] == "name")
            .map(|(_, _, value)| value.as_str())
    }

    pub fn matches(&self, obj: &Value) -> bool {
        self.0.iter().all(|(path, eq, want)| {
            let mut cur = obj;
            for p in path {
                cur = &cur[p.as_str()];
            }
            let have = match cur {
                Value::String(s) => s.clone(),
                Value::Null => String::new(),
                other => other.to_string(),
            };
            (have == *want) == *eq
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    fn obj(labels: Value) -> Value {
        json!({"metadata": {"name": "a", "namespace": "ns1", "labels": labels}})
    }

    #[test]
    fn equality_and_set_based() {
        let o = obj(json!({"app": "web", "tier": "front"}));
        let yes = [
            "app=web",
            "app==web,tier",
            "app in (web, db)",
            "env notin (prod)",
            "!env",
            "tier!=back",
            "app in (web),tier notin (x,y)",
        ];
        for s in yes {
            assert!(LabelSelector::parse(s).unwrap().matches(&o), "{s}");
        }
        let no = ["app=db", "env", "app notin (web)", "!app", "app in (db)"];
        for s in no {
            assert!(!LabelSelector::parse(s).unwrap().matches(&o), "{s}");
        }
        assert!(LabelSelector::parse("app in web").is_err());
    }

    #[test]
    fn field_selector_on_metadata() {
        let allowed = |p: &str| p == "metadata.name" || p == "metadata.namespace";
        let o = obj(json!({}));
        assert!(FieldSelector::parse("metadata.name=a", allowed)
            .unwrap()
            .matches(&o));
        assert!(FieldSelector::parse("metadata.namespace!=x", allowed)
            .unwrap()
            .matches(&o));
        assert!(!FieldSelector::parse("metadata.name==b", allowed)
            .unwrap()
            .matches(&o));
        assert!(FieldSelector::parse("spec.x=1", allowed).is_err());
    }
}
