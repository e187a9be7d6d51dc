//! The three review requests as kubectl 1.32 sends them: protobuf (its
//! typed clients prefer it for built-in kinds, and it does not fall back to
//! JSON on a 415). A review's request holds a handful of strings, so this
//! reads just those from the wire format, into the JSON form the rest of
//! the server handles; answers stay JSON, which kubectl accepts too.
//!
//! This is deliberately not a protobuf codec for objects: serving built-in
//! kinds in protobuf is a separate piece of work (issue 16), built on the
//! generated Kubernetes types, which can replace this reader when it lands.
//!
//! ```text
//!   "k8s\0" runtime.Unknown { 1: TypeMeta { 1: apiVersion, 2: kind },
//!                             2: raw (the review), 3: contentEncoding }
//!   SelfSubjectAccessReview { 1: metadata, 2: spec {
//!       1: resourceAttributes { 1: namespace, 2: verb, 3: group,
//!            4: version, 5: resource, 6: subresource, 7: name },
//!       2: nonResourceAttributes { 1: path, 2: verb } } }
//!   SelfSubjectRulesReview  { 1: metadata, 2: spec { 1: namespace } }
//!   SelfSubjectReview       { 1: metadata, 2: status }
//! ```

use serde_json::{json, Map, Value};

use crate::error::ApiError;

/// What every Kubernetes protobuf body starts with.
const MAGIC: &[u8] = b"k8s\0";

/// Reads a review request into its JSON form: `apiVersion`, `kind` and, for
/// the reviews that have one, `spec`.
pub(super) fn decode(body: &[u8]) -> Result<Value, ApiError> {
    read(body).map_err(|e| {
        ApiError::bad_request(format!(
            "the body of the request could not be decoded as protobuf: {e}"
        ))
    })
}

fn read(body: &[u8]) -> Result<Value, String> {
    let unknown = body.strip_prefix(MAGIC).ok_or("no k8s protobuf envelope")?;
    let unknown = Fields::parse(unknown)?;
    if unknown.string(3)?.is_some_and(|enc| !enc.is_empty()) {
        return Err("encoded (compressed) bodies are not read".into());
    }
    let type_meta = Fields::parse(unknown.bytes(1).unwrap_or_default())?;
    let api_version = type_meta.string(1)?.unwrap_or_default();
    let kind = type_meta.string(2)?.unwrap_or_default();
    let review = Fields::parse(unknown.bytes(2).unwrap_or_default())?;
    let mut out = json!({"apiVersion": api_version, "kind": kind});
    let spec = Fields::parse(review.bytes(2).unwrap_or_default())?;
    match kind {
        "SelfSubjectAccessReview" => {
            let mut s = Map::new();
            if let Some(attrs) = spec.bytes(1) {
                let names = [
                    "namespace",
                    "verb",
                    "group",
                    "version",
                    "resource",
                    "subresource",
                    "name",
                ];
                s.insert("resourceAttributes".into(), strings(attrs, &names)?);
            }
            if let Some(attrs) = spec.bytes(2) {
                s.insert("nonResourceAttributes".into(), strings(attrs, &["path", "verb"])?);
            }
            out["spec"] = Value::Object(s);
        }
        "SelfSubjectRulesReview" => {
            out["spec"] = strings(review.bytes(2).unwrap_or_default(), &["namespace"])?
        }
        // A SelfSubjectReview has no spec: its field 2 is the status.
        _ => {}
    }
    Ok(out)
}

/// A message's string fields numbered 1, 2, ... as a JSON object with
/// these names; empty strings are left out, as in JSON's `omitempty`.
fn strings(message: &[u8], names: &[&str]) -> Result<Value, String> {
    let fields = Fields::parse(message)?;
    let mut out = Map::new();
    for (number, name) in (1..).zip(names) {
        if let Some(v) = fields.string(number)?.filter(|v| !v.is_empty()) {
            out.insert((*name).into(), json!(v));
        }
    }
    Ok(Value::Object(out))
}

/// The length-delimited fields of one message, by number; numbers and
/// fixed-width fields are skipped (no review field this reads is one).
struct Fields<'a>(Vec<(u64, &'a [u8])>);

impl<'a> Fields<'a> {
    fn parse(mut buf: &'a [u8]) -> Result<Fields<'a>, String> {
        let mut fields = Vec::new();
        while !buf.is_empty() {
            let key = varint(&mut buf)?;
            let (number, wire_type) = (key >> 3, key & 7);
            match wire_type {
                0 => {
                    varint(&mut buf)?;
                }
                1 => buf = buf.get(8..).ok_or("truncated 64-bit field")?,
                2 => {
                    let len = usize::try_from(varint(&mut buf)?).map_err(|_| "field too long")?;
                    let value = buf.get(..len).ok_or("truncated field")?;
                    fields.push((number, value));
                    buf = &buf[len..];
                }
                5 => buf = buf.get(4..).ok_or("truncated 32-bit field")?,
                other => return Err(format!("wire type {other} is not read")),
            }
        }
        Ok(Fields(fields))
    }

    /// The last occurrence of a field, as protobuf reads a repeated scalar.
    fn bytes(&self, number: u64) -> Option<&'a [u8]> {
        self.0.iter().rev().find(|(n, _)| *n == number).map(|(_, v)| *v)
    }

    fn string(&self, number: u64) -> Result<Option<&'a str>, String> {
        self.bytes(number)
            .map(|b| std::str::from_utf8(b).map_err(|_| format!("field {number} is not UTF-8")))
            .transpose()
    }
}

fn varint(buf: &mut &[u8]) -> Result<u64, String> {
    let mut value = 0u64;
    for shift in (0..64).step_by(7) {
        let (&byte, rest) = buf.split_first().ok_or("truncated varint")?;
        *buf = rest;
        value |= u64::from(byte & 0x7f) << shift;
        if byte & 0x80 == 0 {
            return Ok(value);
        }
    }
    Err("varint longer than 64 bits".into())
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Bytes as kubectl's `-v=8` hex dump shows them.
    fn hex(dump: &str) -> Vec<u8> {
        dump.split_whitespace()
            .map(|b| u8::from_str_radix(b, 16).expect("hex"))
            .collect()
    }

    #[test]
    fn reads_what_kubectl_1_32_sends_for_can_i() {
        // kubectl auth can-i get configmaps/status -n kube-system (a name,
        // to kubectl; a subresource is `--subresource`)
        let body = hex(
            "6b 38 73 00 0a 32 0a 17 61 75 74 68 6f 72 69 7a 61 74 69 6f 6e 2e 6b 38 73 2e 69 6f 2f 76 31 12
             17 53 65 6c 66 53 75 62 6a 65 63 74 41 63 63 65 73 73 52 65 76 69 65 77 12 4c 0a 10 0a 00 12 00
             1a 00 22 00 2a 00 32 00 38 00 42 00 12 2e 0a 2c 0a 0b 6b 75 62 65 2d 73 79 73 74 65 6d 12 03 67
             65 74 1a 00 22 00 2a 0a 63 6f 6e 66 69 67 6d 61 70 73 32 00 3a 06 73 74 61 74 75 73 1a 08 08 00
             12 00 1a 00 20 00 1a 00 22 00",
        );
        assert_eq!(
            decode(&body).unwrap(),
            json!({
                "apiVersion": "authorization.k8s.io/v1", "kind": "SelfSubjectAccessReview",
                "spec": {"resourceAttributes": {"namespace": "kube-system", "verb": "get", "resource": "configmaps", "name": "status"}},
            })
        );
        // kubectl auth can-i get /healthz
        let body = hex(
            "6b 38 73 00 0a 32 0a 17 61 75 74 68 6f 72 69 7a 61 74 69 6f 6e 2e 6b 38 73 2e 69 6f 2f 76 31 12
             17 53 65 6c 66 53 75 62 6a 65 63 74 41 63 63 65 73 73 52 65 76 69 65 77 12 2f 0a 10 0a 00 12 00
             1a 00 22 00 2a 00 32 00 38 00 42 00 12 11 12 0f 0a 08 2f 68 65 61 6c 74 68 7a 12 03 67 65 74 1a
             08 08 00 12 00 1a 00 20 00 1a 00 22 00",
        );
        assert_eq!(
            decode(&body).unwrap()["spec"],
            json!({"nonResourceAttributes": {"path": "/healthz", "verb": "get"}})
        );
    }

    #[test]
    fn reads_what_kubectl_1_32_sends_for_list_and_whoami() {
        // kubectl auth can-i --list (namespace default)
        let body = hex(
            "6b 38 73 00 0a 31 0a 17 61 75 74 68 6f 72 69 7a 61 74 69 6f 6e 2e 6b 38 73 2e 69 6f 2f 76 31 12
             16 53 65 6c 66 53 75 62 6a 65 63 74 52 75 6c 65 73 52 65 76 69 65 77 12 23 0a 10 0a 00 12 00 1a
             00 22 00 2a 00 32 00 38 00 42 00 12 09 0a 07 64 65 66 61 75 6c 74 1a 04 18 00 22 00 1a 00 22 00",
        );
        let review = decode(&body).unwrap();
        assert_eq!(review["kind"], "SelfSubjectRulesReview");
        assert_eq!(review["spec"], json!({"namespace": "default"}));
        // kubectl auth whoami
        let body = hex(
            "6b 38 73 00 0a 2d 0a 18 61 75 74 68 65 6e 74 69 63 61 74 69 6f 6e 2e 6b 38 73 2e 69 6f 2f 76 31
             12 11 53 65 6c 66 53 75 62 6a 65 63 74 52 65 76 69 65 77 12 1a 0a 10 0a 00 12 00 1a 00 22 00 2a
             00 32 00 38 00 42 00 12 06 0a 04 0a 00 12 00 1a 00 22 00",
        );
        assert_eq!(
            decode(&body).unwrap(),
            json!({"apiVersion": "authentication.k8s.io/v1", "kind": "SelfSubjectReview"})
        );
    }

    #[test]
    fn malformed_bodies_are_bad_requests() {
        for body in [
            &b"{}"[..],
            b"k8s\0\x0a\x05ab",
            b"k8s\0\x0a\xff",
            b"k8s\0\x0b",
            b"k8s\0\x12\x02\x12\x80",
        ] {
            let err = decode(body).unwrap_err();
            assert_eq!(err.code, axum::http::StatusCode::BAD_REQUEST, "{body:?}");
        }
    }
}
