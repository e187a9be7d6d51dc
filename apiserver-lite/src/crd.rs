//! CustomResourceDefinitions: a CRD is accepted at once (its names and
//! Established conditions set), and its kinds are served from the moment it
//! is stored until it is deleted, which takes every object of them along,
//! as on the real server.

use serde_json::{json, Value};

use crate::metadata::{meta_str, now};
use crate::store::Txn;

/// Sets the status of a CRD being written: its names accepted, its storage
/// versions recorded, `NamesAccepted` and `Established`.
pub fn accept(crd: &mut Value) {
    let storage: Vec<Value> = crd["spec"]["versions"]
        .as_array()
        .map(|vs| {
            vs.iter()
                .filter(|v| v["storage"].as_bool() == Some(true))
                .map(|v| v["name"].clone())
                .collect()
        })
        .unwrap_or_default();
    let t = now();
    crd["status"] = json!({
        "acceptedNames": crd["spec"]["names"].clone(),
        "storedVersions": storage,
        "conditions": [
            {"type": "NamesAccepted", "status": "True", "reason": "NoConflicts", "message": "no conflicts found", "lastTransitionTime": t},
            {"type": "Established", "status": "True", "reason": "InitialNamesAccepted", "message": "the initial names have been accepted", "lastTransitionTime": t},
        ],
    });
}

/// Serves a stored CRD's kinds (again, when it is rewritten or loaded).
pub fn register(txn: &mut Txn<'_>, crd: &Value) {
    txn.state.registry.serve_crd(crd);
}

/// Removes a deleted CRD's kinds and every object of them.
pub fn unregister(txn: &mut Txn<'_>, crd: &Value) {
    if let Some(gr) = txn.state.registry.unregister_crd(meta_str(crd, "name")) {
        let keys: Vec<(String, String)> = txn.state.list(&gr, None).map(|(k, _)| k.clone()).collect();
        for (ns, name) in keys {
            txn.remove(&gr, &ns, &name);
        }
    }
}
