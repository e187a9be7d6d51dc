//! Field ownership: `metadata.managedFields` bookkeeping for updates and
//! server-side apply (conflicts, forced takeover, removal of fields a manager
//! stops applying). Lists are atomic, except that applied finalizers are
//! unioned with the live ones (see the README's KNOWN_DIFFERENCES).

use std::collections::BTreeSet;

use serde_json::{json, Map, Value};

pub type Path = Vec<String>;
pub type FieldSet = BTreeSet<Path>;

/// Which part of an object a write addresses.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Scope {
    /// The main resource; `status` is excluded when it is a subresource.
    Main {
        status_is_subresource: bool,
    },
    Status,
}

impl Scope {
    fn subresource(self) -> &'static str {
        match self {
            Scope::Main { .. } => "",
            Scope::Status => "status",
        }
    }
}

fn leaves(v: &Value, prefix: &mut Path, out: &mut FieldSet) {
    match v {
        // An empty map owns nothing: applying `spec: {}` must not claim all of spec.
        Value::Object(m) => {
            for (k, child) in m {
                prefix.push(k.clone());
                leaves(child, prefix, out);
                prefix.pop();
            }
        }
        _ => {
            out.insert(prefix.clone());
        }
    }
}

/// The leaf fields of `obj` a manager can own in `scope`.
pub fn fields_of(obj: &Value, scope: Scope) -> FieldSet {
    let mut out = FieldSet::new();
    let Some(map) = obj.as_object() else {
        return out;
    };
    for (k, v) in map {
        let tracked = match (k.as_str(), scope) {
            ("apiVersion" | "kind", _) => false,
            ("metadata", Scope::Main { .. }) => {
                for mk in ["labels", "annotations", "finalizers", "ownerReferences"] {
                    if let Some(mv) = v.get(mk) {
                        let mut p = vec!["metadata".to_string(), mk.to_string()];
                        if mk == "labels" || mk == "annotations" {
                            leaves(mv, &mut p, &mut out);
                        } else {
                            out.insert(p);
                        }
                    }
                }
                false
            }
            ("metadata", Scope::Status) => false,
            (
                "status",
                Scope::Main {
                    status_is_subresource,
                },
            ) => !status_is_subresource,
            (_, Scope::Main { .. }) => true,
            ("status", Scope::Status) => true,
            (_, Scope::Status) => false,
        };
        if tracked {
            let mut p = vec![k.clone()];
            leaves(v, &mut p, &mut out);
        }
    }
    out
}

pub fn get_path<'a>(obj: &'a Value, path: &[String]) -> Option<&'a Value> {
    let mut cur = obj;
    for p in path {
        cur = cur.as_object()?.get(p)?;
    }
    Some(cur)
}

fn remove_path(obj: &mut Value, path: &[String]) {
    let Some((last, parents)) = path.split_last() else {
        return;
    };
    let mut cur = obj;
    for p in parents {
        match cur.as_object_mut().and_then(|m| m.get_mut(p)) {
            Some(next) => cur = next,
            None => return,
        }
    }
    if let Some(m) = cur.as_object_mut() {
        m.remove(last);
    }
}

fn overlap(a: &[String], b: &[String]) -> bool {
    a.starts_with(b) || b.starts_with(a)
}

pub fn to_fields_v1(set: &FieldSet) -> Value {
    let mut root = Map::new();
    for path in set {
        let mut cur = &mut root;
        for p in path {
            let entry = cur
                .entry(format!("f:{p}"))
                .or_insert_with(|| Value::Object(Map::new()));
            match entry {
                Value::Object(m) => cur = m,
                _ => break,
            }
        }
    }
    Value::Object(root)
}

pub fn from_fields_v1(v: &Value) -> FieldSet {
    fn walk(v: &Value, prefix: &mut Path, out: &mut FieldSet) {
        let children: Vec<(&String, &Value)> = v
            .as_object()
            .map(|m| m.iter().filter(|(k, _)| k.starts_with("f:")).collect())
            .unwrap_or_default();
        if children.is_empty() {
            if !prefix.is_empty() {
                out.insert(prefix.clone());
            }
            return;
        }
        for (k, child) in children {
            prefix.push(k[2..].to_string());
            walk(child, prefix, out);
            prefix.pop();
        }
    }
    let mut out = FieldSet::new();
    walk(v, &mut Vec::new(), &mut out);
    out
}

/// One `managedFields` entry.
#[derive(Debug, Clone, PartialEq)]
pub struct Managed {
    pub manager: String,
    pub operation: String,
    pub api_version: String,
    pub time: String,
    pub subresource: String,
    pub fields: FieldSet,
}

pub fn read_managed(obj: &Value) -> Vec<Managed> {
    obj["metadata"]["managedFields"]
        .as_array()
        .map(|a| {
            a.iter()
                .map(|e| Managed {
                    manager: e["manager"].as_str().unwrap_or_default().into(),
                    operation: e["operation"].as_str().unwrap_or("Update").into(),
                    api_version: e["apiVersion"].as_str().unwrap_or_default().into(),
                    time: e["time"].as_str().unwrap_or_default().into(),
                    subresource: e["subresource"].as_str().unwrap_or_default().into(),
                    fields: from_fields_v1(&e["fieldsV1"]),
                })
                .collect()
        })
        .unwrap_or_default()
}

pub fn write_managed(obj: &mut Value, entries: &[Managed]) {
    let list: Vec<Value> = entries
        .iter()
        .filter(|e| !e.fields.is_empty())
        .map(|e| {
            let mut v = json!({
                "manager": e.manager,
                "operation": e.operation,
                "apiVersion": e.api_version,
                "time": e.time,
                "fieldsType": "FieldsV1",
                "fieldsV1": to_fields_v1(&e.fields),
            });
            if !e.subresource.is_empty() {
                v["subresource"] = json!(e.subresource);
            }
            v
        })
        .collect();
    if let Some(meta) = obj.get_mut("metadata").and_then(|m| m.as_object_mut()) {
        if list.is_empty() {
            meta.remove("managedFields");
        } else {
            meta.insert("managedFields".into(), Value::Array(list));
        }
    }
}

/// Records an Update by `manager`: it takes the fields it changed from every
/// other manager; fields it removed are owned by nobody.
pub fn record_update(
    old: Option<&Value>,
    new: &mut Value,
    manager: &str,
    api_version: &str,
    scope: Scope,
    now: &str,
) {
    let mut entries = match old {
        Some(o) => read_managed(o),
        None => Vec::new(),
    };
    // A client that rewrites managedFields itself (kubectl's upgrade from
    // client-side apply does) gets what it wrote.
    if let Some(o) = old {
        if o["metadata"]["managedFields"] != new["metadata"]["managedFields"]
            && !new["metadata"]["managedFields"].is_null()
        {
            entries = read_managed(new);
        }
    }
    let empty = Value::Null;
    let old_v = old.unwrap_or(&empty);
    let before = fields_of(old_v, scope);
    let after = fields_of(new, scope);
    let changed: FieldSet = before
        .union(&after)
        .filter(|p| get_path(old_v, p) != get_path(new, p))
        .cloned()
        .collect();
    let sub = scope.subresource();
    if !changed.is_empty() {
        for e in entries.iter_mut() {
            if e.subresource == sub || sub.is_empty() {
                e.fields.retain(|q| !changed.iter().any(|p| overlap(p, q)));
            }
        }
        let owned: FieldSet = changed.iter().filter(|p| after.contains(*p)).cloned().collect();
        if !owned.is_empty() {
            match entries
                .iter_mut()
                .find(|e| e.manager == manager && e.operation == "Update" && e.subresource == sub)
            {
                Some(e) => {
                    e.fields.extend(owned);
                    e.time = now.to_string();
                    e.api_version = api_version.to_string();
                }
                None => entries.push(Managed {
                    manager: manager.to_string(),
                    operation: "Update".into(),
                    api_version: api_version.to_string(),
                    time: now.to_string(),
                    subresource: sub.to_string(),
                    fields: owned,
                }),
            }
        }
    }
    entries.retain(|e| !e.fields.is_empty());
    write_managed(new, &entries);
}

/// A field another manager owns with a different value.
#[derive(Debug, Clone, PartialEq)]
pub struct ApplyConflict {
    pub manager: String,
    /// As the real server prints it: `.spec.size`.
    pub field: String,
    pub path: Path,
}

fn deep_merge(target: &mut Value, patch: &Value, path: &mut Path) {
    match (target, patch) {
        (Value::Object(t), Value::Object(p)) => {
            for (k, pv) in p {
                path.push(k.clone());
                let is_finalizers = path.len() == 2 && path[0] == "metadata" && k == "finalizers";
                match t.get_mut(k) {
                    Some(tv) if is_finalizers => {
                        if let (Value::Array(have), Value::Array(want)) = (tv, pv) {
                            for f in want {
                                if !have.contains(f) {
                                    have.push(f.clone());
                                }
                            }
                        }
                    }
                    Some(tv) if tv.is_object() && pv.is_object() => deep_merge(tv, pv, path),
                    _ => {
                        t.insert(k.clone(), pv.clone());
                    }
                }
                path.pop();
            }
        }
        (t, p) => *t = p.clone(),
    }
}

/// Server-side apply of `config` by `manager` onto `live` (an empty object
/// when creating). Returns the merged object with managedFields updated.
pub fn apply(
    live: &Value,
    config: &Value,
    manager: &str,
    api_version: &str,
    scope: Scope,
    force: bool,
    now: &str,
) -> Result<Value, Vec<ApplyConflict>> {
    let mut entries = read_managed(live);
    let sub = scope.subresource();
    let applied = fields_of(config, scope);
    let mut conflicts = Vec::new();
    for e in entries.iter() {
        if e.subresource != sub || (e.manager == manager && e.operation == "Apply") {
            continue;
        }
        for p in &applied {
            if e.fields.iter().any(|q| overlap(p, q)) && get_path(live, p) != get_path(config, p) {
                conflicts.push(ApplyConflict {
                    manager: e.manager.clone(),
                    field: format!(".{}", p.join(".")),
                    path: p.clone(),
                });
            }
        }
    }
    if !conflicts.is_empty() && !force {
        return Err(conflicts);
    }
    for e in entries.iter_mut() {
        if e.subresource != sub || (e.manager == manager && e.operation == "Apply") {
            continue;
        }
        // Forced: the applier takes the fields it disagreed on.
        e.fields.retain(|q| {
            !applied
                .iter()
                .any(|p| overlap(p, q) && get_path(live, p) != get_path(config, p))
        });
    }
    let previous = entries
        .iter()
        .find(|e| e.manager == manager && e.operation == "Apply" && e.subresource == sub)
        .map(|e| e.fields.clone())
        .unwrap_or_default();
    let mut merged = live.clone();
    for p in &previous {
        let still_applied = applied.iter().any(|a| overlap(a, p));
        let owned_by_other = entries.iter().any(|e| {
            !(e.manager == manager && e.operation == "Apply")
                && e.subresource == sub
                && e.fields.iter().any(|q| overlap(p, q))
        });
        if !still_applied && !owned_by_other {
            remove_path(&mut merged, p);
        }
    }
    deep_merge(&mut merged, config, &mut Vec::new());
    entries.retain(|e| !(e.manager == manager && e.operation == "Apply" && e.subresource == sub));
    entries.push(Managed {
        manager: manager.to_string(),
        operation: "Apply".into(),
        api_version: api_version.to_string(),
        time: now.to_string(),
        subresource: sub.to_string(),
        fields: applied,
    });
    entries.retain(|e| !e.fields.is_empty());
    write_managed(&mut merged, &entries);
    Ok(merged)
}

#[cfg(test)]
mod tests {
    use super::*;

    const MAIN: Scope = Scope::Main {
        status_is_subresource: true,
    };

    #[test]
    fn fields_v1_round_trips() {
        let obj = json!({"metadata": {"name": "a", "labels": {"x": "1"}}, "spec": {"a": 1, "b": {"c": [1]}}, "status": {"s": 1}});
        let set = fields_of(&obj, MAIN);
        assert_eq!(set.len(), 3);
        assert_eq!(from_fields_v1(&to_fields_v1(&set)), set);
    }

    #[test]
    fn apply_conflicts_forces_and_removes() {
        let live = json!({"metadata": {"name": "a"}});
        let a = apply(
            &live,
            &json!({"spec": {"x": 1, "y": 2}}),
            "alice",
            "v1",
            MAIN,
            false,
            "t",
        )
        .unwrap();
        // bob disagrees about x: conflict, unless forced
        let err = apply(&a, &json!({"spec": {"x": 5}}), "bob", "v1", MAIN, false, "t").unwrap_err();
        assert_eq!(err.len(), 1);
        assert_eq!(
            (err[0].manager.as_str(), err[0].field.as_str()),
            ("alice", ".spec.x")
        );
        // agreeing on a value shares it
        let b = apply(&a, &json!({"spec": {"y": 2}}), "bob", "v1", MAIN, false, "t").unwrap();
        let c = apply(&b, &json!({"spec": {"x": 5}}), "bob", "v1", MAIN, true, "t").unwrap();
        assert_eq!(c["spec"]["x"], 5);
        // alice stops applying y and nobody else owns it: it is removed
        let d = apply(&c, &json!({"spec": {}}), "alice", "v1", MAIN, false, "t").unwrap();
        assert_eq!(d["spec"]["x"], 5);
        assert!(d["spec"].get("y").is_none(), "{d}");
    }

    #[test]
    fn update_takes_ownership_of_changed_fields() {
        let live = apply(
            &json!({"metadata": {}}),
            &json!({"spec": {"x": 1}}),
            "alice",
            "v1",
            MAIN,
            false,
            "t",
        )
        .unwrap();
        let mut new = live.clone();
        new["spec"]["x"] = json!(2);
        record_update(Some(&live), &mut new, "kubectl-edit", "v1", MAIN, "t");
        let m = read_managed(&new);
        assert_eq!(m.len(), 1);
        assert_eq!(m[0].manager, "kubectl-edit");
        // alice re-applying x=1 now conflicts with the editor
        assert!(apply(&new, &json!({"spec": {"x": 1}}), "alice", "v1", MAIN, false, "t").is_err());
    }
}
