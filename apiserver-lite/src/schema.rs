//! Structural-schema handling for custom resources: pruning of undeclared
//! fields and validation against the CRD's openAPIV3Schema.

use serde_json::{Map, Value};

use crate::error::FieldError;

fn join(path: &str, key: &str) -> String {
    if path.is_empty() {
        key.to_string()
    } else {
        format!("{path}.{key}")
    }
}

fn preserves(schema: &Value) -> bool {
    schema["x-kubernetes-preserve-unknown-fields"].as_bool() == Some(true)
}

/// Removes fields the schema does not declare (and nulls it does not allow);
/// returns the paths removed so strict field validation can report them.
pub fn prune(obj: &mut Value, schema: &Value) -> Vec<String> {
    let mut removed = Vec::new();
    if let Value::Object(map) = obj {
        for (key, value) in map.iter_mut() {
            if matches!(key.as_str(), "apiVersion" | "kind" | "metadata") {
                continue;
            }
            if let Some(sub) = schema["properties"].get(key) {
                prune_value(value, sub, key, &mut removed);
            }
        }
        if !preserves(schema) {
            let declared = &schema["properties"];
            map.retain(|k, _| {
                let keep =
                    matches!(k.as_str(), "apiVersion" | "kind" | "metadata") || declared.get(k).is_some();
                if !keep {
                    removed.push(k.clone());
                }
                keep
            });
        }
        drop_nulls(map, schema);
    }
    removed
}

fn drop_nulls(map: &mut Map<String, Value>, schema: &Value) {
    map.retain(|k, v| {
        !(v.is_null()
            && schema["properties"]
                .get(k)
                .is_some_and(|s| s["nullable"].as_bool() != Some(true)))
    });
}

fn prune_value(value: &mut Value, schema: &Value, path: &str, removed: &mut Vec<String>) {
    match value {
        Value::Object(map) => {
            let embedded = schema["x-kubernetes-embedded-resource"].as_bool() == Some(true);
            if let Some(props) = schema["properties"].as_object() {
                for (k, v) in map.iter_mut() {
                    if let Some(sub) = props.get(k) {
                        prune_value(v, sub, &join(path, k), removed);
                    }
                }
                if !preserves(schema) && schema.get("additionalProperties").is_none() {
                    map.retain(|k, _| {
                        let keep = props.contains_key(k)
                            || (embedded && matches!(k.as_str(), "apiVersion" | "kind" | "metadata"));
                        if !keep {
                            removed.push(join(path, k));
                        }
                        keep
                    });
                }
                drop_nulls(map, schema);
            } else if let Some(sub) = schema.get("additionalProperties").filter(|s| s.is_object()) {
                for (k, v) in map.iter_mut() {
                    prune_value(v, sub, &join(path, k), removed);
                }
            } else if !preserves(schema) && schema["type"] == "object" && !embedded {
                // An object schema that declares nothing keeps nothing.
                for k in map.keys() {
                    removed.push(join(path, k));
                }
                map.clear();
            }
        }
        Value::Array(items) => {
            if let Some(sub) = schema.get("items").filter(|s| s.is_object()) {
                for (i, v) in items.iter_mut().enumerate() {
                    prune_value(v, sub, &format!("{path}[{i}]"), removed);
                }
            }
        }
        _ => {}
    }
}

/// Fills in the `default` of every absent field whose parent is present, as
/// the real server does on every write (after pruning, before validation).
pub fn apply_defaults(obj: &mut Value, schema: &Value) {
    match obj {
        Value::Object(map) => {
            if let Some(props) = schema["properties"].as_object() {
                for (k, sub) in props {
                    match map.get_mut(k) {
                        Some(child) => apply_defaults(child, sub),
                        None => {
                            if let Some(d) = sub.get("default") {
                                let mut d = d.clone();
                                apply_defaults(&mut d, sub);
                                map.insert(k.clone(), d);
                            }
                        }
                    }
                }
            } else if let Some(sub) = schema.get("additionalProperties").filter(|s| s.is_object()) {
                for child in map.values_mut() {
                    apply_defaults(child, sub);
                }
            }
        }
        Value::Array(items) => {
            if let Some(sub) = schema.get("items").filter(|s| s.is_object()) {
                for item in items.iter_mut() {
                    apply_defaults(item, sub);
                }
            }
        }
        _ => {}
    }
}

/// Whether `value` matches a schema's `pattern`, as kube-apiserver checks
/// it (an unanchored search with Go's RE2 syntax, which the `regex` crate
/// shares). Each pattern is compiled once; one that does not compile checks
/// nothing (a real server refuses such a CRD when it is created).
fn matches_pattern(pattern: &str, value: &str) -> bool {
    static COMPILED: std::sync::LazyLock<
        std::sync::Mutex<std::collections::HashMap<String, Option<regex::Regex>>>,
    > = std::sync::LazyLock::new(Default::default);
    let mut compiled = COMPILED.lock().unwrap_or_else(std::sync::PoisonError::into_inner);
    if compiled.len() > 1024 {
        // CRDs are few; this bounds what a stream of new ones could hold.
        compiled.clear();
    }
    compiled
        .entry(pattern.to_owned())
        .or_insert_with(|| regex::Regex::new(pattern).ok())
        .as_ref()
        .is_none_or(|re| re.is_match(value))
}

/// Validates `obj` (already pruned) against the schema; the root's
/// apiVersion, kind and metadata are the server's business, not the schema's.
pub fn validate(obj: &Value, schema: &Value) -> Vec<FieldError> {
    let mut errors = Vec::new();
    if let Some(props) = schema["properties"].as_object() {
        for (k, sub) in props {
            if matches!(k.as_str(), "apiVersion" | "kind" | "metadata") {
                continue;
            }
            if let Some(v) = obj.get(k) {
                validate_value(v, sub, k, &mut errors);
            }
        }
    }
    if let Some(req) = schema["required"].as_array() {
        for r in req.iter().filter_map(|r| r.as_str()) {
            if obj.get(r).is_none() {
                errors.push(FieldError::required(r));
            }
        }
    }
    errors
}

fn type_matches(ty: &str, v: &Value) -> bool {
    match ty {
        "object" => v.is_object(),
        "array" => v.is_array(),
        "string" => v.is_string(),
        "boolean" => v.is_boolean(),
        "integer" => v.is_i64() || v.is_u64(),
        "number" => v.is_number(),
        _ => true,
    }
}

fn validate_value(v: &Value, schema: &Value, path: &str, errors: &mut Vec<FieldError>) {
    if v.is_null() {
        if schema["nullable"].as_bool() != Some(true) {
            errors.push(FieldError::invalid(
                path,
                v,
                format!(
                    "{path} in body must be of type {}: \"null\"",
                    schema["type"].as_str().unwrap_or("object")
                ),
            ));
        }
        return;
    }
    let int_or_string = schema["x-kubernetes-int-or-string"].as_bool() == Some(true);
    if int_or_string {
        if !(v.is_string() || v.is_i64() || v.is_u64()) {
            errors.push(FieldError::invalid(
                path,
                v,
                format!("{path} in body must be of type integer,string: {}", type_name(v)),
            ));
            return;
        }
    } else if let Some(ty) = schema["type"].as_str() {
        if !type_matches(ty, v) {
            errors.push(FieldError::invalid(
                path,
                v,
                format!("{path} in body must be of type {ty}: {}", type_name(v)),
            ));
            return;
        }
    }
    if let Some(allowed) = schema["enum"].as_array() {
        if !allowed.contains(v) {
            errors.push(FieldError::not_supported(path, v, allowed));
        }
    }
    match v {
        Value::Number(n) => {
            let x = n.as_f64().unwrap_or(0.0);
            if let Some(min) = schema["minimum"].as_f64() {
                let excl = schema["exclusiveMinimum"].as_bool() == Some(true);
                if x < min || (excl && x == min) {
                    let op = if excl {
                        "greater than"
                    } else {
                        "greater than or equal to"
                    };
                    errors.push(FieldError::invalid(
                        path,
                        v,
                        format!("{path} in body should be {op} {min}"),
                    ));
                }
            }
            if let Some(max) = schema["maximum"].as_f64() {
                let excl = schema["exclusiveMaximum"].as_bool() == Some(true);
                if x > max || (excl && x == max) {
                    let op = if excl {
                        "less than"
                    } else {
                        "less than or equal to"
                    };
                    errors.push(FieldError::invalid(
                        path,
                        v,
                        format!("{path} in body should be {op} {max}"),
                    ));
                }
            }
            if schema["format"] == "int32" && (x < i32::MIN as f64 || x > i32::MAX as f64) {
                errors.push(FieldError::invalid(
                    path,
                    v,
                    format!("{path} in body must be of type int32"),
                ));
            }
        }
        Value::String(s) => {
            let len = s.chars().count() as u64;
            if let Some(min) = schema["minLength"].as_u64() {
                if len < min {
                    errors.push(FieldError::invalid(
                        path,
                        v,
                        format!("{path} in body should be at least {min} chars long"),
                    ));
                }
            }
            if let Some(max) = schema["maxLength"].as_u64() {
                if len > max {
                    errors.push(FieldError::invalid(
                        path,
                        v,
                        format!("{path} in body may not be more than {max} chars long"),
                    ));
                }
            }
            if let Some(pattern) = schema["pattern"].as_str() {
                if !matches_pattern(pattern, s) {
                    errors.push(FieldError::invalid(
                        path,
                        v,
                        format!("{path} in body should match '{pattern}'"),
                    ));
                }
            }
            if schema["format"] == "date-time" && s.parse::<jiff::Timestamp>().is_err() {
                errors.push(FieldError::invalid(
                    path,
                    v,
                    format!("{path} in body must be of type date-time: {v}"),
                ));
            }
        }
        Value::Array(items) => {
            let n = items.len() as u64;
            if let Some(min) = schema["minItems"].as_u64() {
                if n < min {
                    errors.push(FieldError::invalid(
                        path,
                        v,
                        format!("{path} in body should have at least {min} items"),
                    ));
                }
            }
            if let Some(max) = schema["maxItems"].as_u64() {
                if n > max {
                    errors.push(FieldError::invalid(
                        path,
                        v,
                        format!("{path} in body should have at most {max} items"),
                    ));
                }
            }
            if let Some(sub) = schema.get("items").filter(|s| s.is_object()) {
                for (i, item) in items.iter().enumerate() {
                    validate_value(item, sub, &format!("{path}[{i}]"), errors);
                }
            }
        }
        Value::Object(map) => {
            if let Some(props) = schema["properties"].as_object() {
                for (k, sub) in props {
                    if let Some(child) = map.get(k) {
                        validate_value(child, sub, &join(path, k), errors);
                    }
                }
            }
            if let Some(sub) = schema.get("additionalProperties").filter(|s| s.is_object()) {
                for (k, child) in map {
                    validate_value(child, sub, &join(path, k), errors);
                }
            }
            if let Some(req) = schema["required"].as_array() {
                for r in req.iter().filter_map(|r| r.as_str()) {
                    if !map.contains_key(r) {
                        errors.push(FieldError::required(&join(path, r)));
                    }
                }
            }
        }
        _ => {}
    }
}

fn type_name(v: &Value) -> String {
    match v {
        Value::Null => "\"null\"",
        Value::Bool(_) => "\"boolean\"",
        Value::Number(n) if n.is_f64() => "\"number\"",
        Value::Number(_) => "\"integer\"",
        Value::String(_) => "\"string\"",
        Value::Array(_) => "\"array\"",
        Value::Object(_) => "\"object\"",
    }
    .to_string()
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    #[test]
    fn a_string_must_match_its_pattern_as_on_a_real_server() {
        let duration = "^(0|([0-9]{1,2}d)?([0-9]{1,3}h)?([0-9]{1,5}m)?([0-9]{1,7}s)?([0-9]{1,10}ms)?)$";
        let schema = json!({"type": "object", "properties": {"spec": {"type": "object", "properties": {
            "timeout": {"type": "string", "pattern": duration},
            "url": {"type": "string", "pattern": "^https?://"}
        }}}});
        let ok = json!({"spec": {"timeout": "1h30m", "url": "https://example.invalid/agent"}});
        assert!(validate(&ok, &schema).is_empty());
        let bad = json!({"spec": {"timeout": "5 min", "url": "ftp://x/https://"}});
        let errors: Vec<String> = validate(&bad, &schema).iter().map(ToString::to_string).collect();
        assert_eq!(errors.len(), 2, "{errors:?}");
        assert!(
            errors[0].contains("spec.timeout in body should match '^(0|"),
            "{errors:?}"
        );
        assert!(
            errors[1].contains("spec.url in body should match '^https?://'"),
            "{errors:?}"
        );
    }

    fn schema() -> Value {
        json!({
            "type": "object",
            "properties": {
                "spec": {
                    "type": "object",
                    "required": ["count"],
                    "properties": {
                        "count": {"type": "integer", "minimum": 0},
                        "mode": {"type": "string", "enum": ["a", "b"]},
                        "free": {"type": "object", "x-kubernetes-preserve-unknown-fields": true},
                        "env": {"type": "object", "additionalProperties": {"type": "string"}},
                        "items": {"type": "array", "items": {"type": "object", "properties": {"n": {"type": "string"}}}}
                    }
                },
                "status": {"type": "object", "properties": {"phase": {"type": "string"}}}
            }
        })
    }

    #[test]
    fn prunes_undeclared_fields_but_keeps_preserved_ones() {
        let mut o = json!({
            "apiVersion": "x/v1", "kind": "K", "metadata": {"name": "a", "whatever": 1},
            "extra": 1,
            "spec": {"count": 1, "bogus": true, "free": {"any": {"thing": 1}},
                     "env": {"A": "1"}, "items": [{"n": "x", "junk": 2}]}
        });
        let mut removed = prune(&mut o, &schema());
        removed.sort();
        assert_eq!(removed, vec!["extra", "spec.bogus", "spec.items[0].junk"]);
        assert_eq!(o["spec"]["free"]["any"]["thing"], 1);
        assert_eq!(o["metadata"]["whatever"], 1);
        assert_eq!(o["spec"]["env"]["A"], "1");
    }

    #[test]
    fn fills_defaults_of_absent_fields_only() {
        let schema = json!({"type": "object", "properties": {"spec": {"type": "object", "properties": {
            "mode": {"type": "string", "default": "fail"},
            "retry": {"type": "object", "properties": {"attempts": {"type": "integer", "default": 0}}},
            "env": {"type": "array", "items": {"type": "object", "properties": {"value": {"type": "string", "default": ""}}}}
        }}}});
        let mut o = json!({"spec": {"mode": "keep", "retry": {}, "env": [{"name": "A"}]}});
        apply_defaults(&mut o, &schema);
        assert_eq!(
            o,
            json!({"spec": {"mode": "keep", "retry": {"attempts": 0}, "env": [{"name": "A", "value": ""}]}})
        );
        let mut o = json!({"spec": {}});
        apply_defaults(&mut o, &schema);
        assert_eq!(o["spec"]["mode"], "fail");
        assert!(
            o["spec"].get("retry").is_none(),
            "no default for the object itself"
        );
    }

    #[test]
    fn reports_types_required_enums_and_bounds_with_paths() {
        let o = json!({"spec": {"count": "three", "mode": "c"}});
        let errs = validate(&o, &schema());
        let fields: Vec<_> = errs.iter().map(|e| e.field.as_str()).collect();
        assert_eq!(fields, vec!["spec.count", "spec.mode"]);
        assert!(errs[0].to_string().contains("must be of type integer"));
        let o = json!({"spec": {"count": -1}});
        assert!(validate(&o, &schema())[0]
            .to_string()
            .contains("greater than or equal to 0"));
        let o = json!({"spec": {}});
        assert_eq!(validate(&o, &schema())[0].reason, "FieldValueRequired");
        assert!(validate(&json!({"spec": {"count": 2, "mode": "a"}}), &schema()).is_empty());
    }
}
