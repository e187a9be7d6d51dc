//! Owner-reference garbage collection, as kube-controller-manager's
//! collector does it. One pass runs in one store transaction; the server
//! runs passes after deletions and now and then.
//!
//! ```text
//!   owner being deleted, holding the finalizer
//!     orphan              its dependents lose their reference to it,
//!                         then the finalizer goes
//!     foregroundDeletion  its dependents are deleted (in the foreground
//!                         too); once none is left, the finalizer goes
//!   dependent whose owners
//!     are all gone        deleted (in the background)
//!     are partly gone     keeps the references to the live ones
//! ```

use std::sync::Arc;

use serde_json::{json, Value};

use crate::authz::Identity;
use crate::metadata::meta_str;
use crate::ops::{commit_update, delete, FieldValidation, Precondition, Propagation, WriteOpts};
use crate::resources::ResourceType;
use crate::store::{Store, Txn};

/// One pass of the garbage collector over `store`; returns whether it
/// changed anything. What it decides on is read from a snapshot outside
/// the store lock (parsing every object under it would stall every write);
/// each change is made on the object as it stands in the write.
pub fn collect_garbage_in(store: &Store) -> bool {
    let snapshot = store.read(|s| {
        let mut objects = Vec::new();
        for gr in s.all_groups() {
            objects.extend(s.list(&gr, None).map(|(_, obj)| (gr.clone(), obj.clone())));
        }
        objects
    });
    let objects: Vec<(String, Value)> = snapshot
        .into_iter()
        .map(|(gr, obj)| (gr, obj.ownership()))
        .collect();
    store
        .write(|txn| Ok::<_, ()>(collect(txn, &objects)))
        .unwrap_or(false)
}

fn collect(txn: &mut Txn<'_>, objects: &[(String, Value)]) -> bool {
    let mut changed = false;
    for (gr, owner) in objects {
        changed |= finish_deletion(txn, objects, gr, owner);
    }
    for (gr, dependent) in objects {
        changed |= drop_dead_owners(txn, gr, dependent);
    }
    changed
}

/// Carries out an orphan or foreground deletion of `owner`.
fn finish_deletion(txn: &mut Txn<'_>, objects: &[(String, Value)], gr: &str, owner: &Value) -> bool {
    if owner["metadata"]["deletionTimestamp"].is_null() {
        return false;
    }
    let orphan = has_finalizer(owner, "orphan");
    if !orphan && !has_finalizer(owner, "foregroundDeletion") {
        return false;
    }
    let uid = meta_str(owner, "uid");
    let mut changed = false;
    let mut dependents_left = false;
    for (dgr, dep) in objects {
        if !owner_uids(dep).iter().any(|u| u == uid) {
            continue;
        }
        let Some(drt) = rt_of(txn, dgr) else { continue };
        let (dns, dname) = (meta_str(dep, "namespace"), meta_str(dep, "name"));
        let Some(current) = txn.state.get(dgr, dns, dname) else {
            continue;
        };
        if orphan {
            let mut next = (*current).clone();
            if let Some(refs) = next["metadata"]["ownerReferences"].as_array_mut() {
                refs.retain(|r| r["uid"] != json!(uid));
            }
            rewrite(txn, &drt, &current, next);
        } else {
            dependents_left = true;
            if current["metadata"]["deletionTimestamp"].is_null() {
                let _ = delete(txn, &drt, dns, dname, Propagation::Foreground, None, None, false);
            }
        }
        changed = true;
    }
    if orphan || !dependents_left {
        changed |= drop_deletion_finalizers(txn, gr, owner);
    }
    changed
}

/// Lets a deletion the collector has carried out complete.
fn drop_deletion_finalizers(txn: &mut Txn<'_>, gr: &str, owner: &Value) -> bool {
    let Some(ort) = rt_of(txn, gr) else { return false };
    let Some(current) = txn
        .state
        .get(gr, meta_str(owner, "namespace"), meta_str(owner, "name"))
    else {
        return false;
    };
    let mut next = (*current).clone();
    if let Some(f) = next["metadata"]["finalizers"].as_array_mut() {
        f.retain(|x| x != "orphan" && x != "foregroundDeletion");
    }
    rewrite(txn, &ort, &current, next);
    true
}

/// Deletes a dependent whose owners are all gone, or drops the references
/// to those that are.
fn drop_dead_owners(txn: &mut Txn<'_>, gr: &str, dep: &Value) -> bool {
    let owners = owner_uids(dep);
    if owners.is_empty() || owners.iter().all(|u| txn.state.uid_exists(u)) {
        return false;
    }
    // Earlier steps of this pass may have changed it (orphaning drops references).
    let (ns, name) = (meta_str(dep, "namespace"), meta_str(dep, "name"));
    let Some(current) = txn.state.get(gr, ns, name) else {
        return false;
    };
    let owners = owner_uids(&current);
    if owners.is_empty() || !current["metadata"]["deletionTimestamp"].is_null() {
        return false;
    }
    let alive = owners.iter().filter(|u| txn.state.uid_exists(u)).count();
    if alive == owners.len() {
        return false;
    }
    let Some(drt) = rt_of(txn, gr) else { return false };
    if alive == 0 {
        let _ = delete(txn, &drt, ns, name, Propagation::Background, None, None, false);
    } else {
        let mut next = (*current).clone();
        if let Some(refs) = next["metadata"]["ownerReferences"].as_array_mut() {
            refs.retain(|r| r["uid"].as_str().is_some_and(|u| txn.state.uid_exists(u)));
        }
        rewrite(txn, &drt, &current, next);
    }
    true
}

/// Writes what the collector changed, under its own field manager. A write
/// that fails changes nothing, so the next pass tries it again.
fn rewrite(txn: &mut Txn<'_>, rt: &ResourceType, current: &Arc<Value>, next: Value) {
    let opts = WriteOpts {
        manager: "generic-garbage-collector".into(),
        dry_run: false,
        field_validation: FieldValidation::Ignore,
        identity: Identity::Admin,
    };
    let _ = commit_update(txn, rt, current, next, false, &opts, Precondition::Patch, false);
}

fn rt_of(txn: &Txn<'_>, gr: &str) -> Option<Arc<ResourceType>> {
    txn.state.registry.by_group_resource(gr)
}

fn owner_uids(obj: &Value) -> Vec<String> {
    obj["metadata"]["ownerReferences"]
        .as_array()
        .map(|a| {
            a.iter()
                .filter_map(|r| r["uid"].as_str().map(String::from))
                .collect()
        })
        .unwrap_or_default()
}

fn has_finalizer(obj: &Value, f: &str) -> bool {
    obj["metadata"]["finalizers"]
        .as_array()
        .is_some_and(|a| a.iter().any(|x| x == f))
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::store::Store;

    /// A ConfigMap in `default` with uid `uid-{name}`, owned by `owners`.
    fn config_map(name: &str, owners: &[&str]) -> Value {
        let refs: Vec<Value> = owners
            .iter()
            .map(|o| json!({"apiVersion": "v1", "kind": "ConfigMap", "name": o, "uid": format!("uid-{o}")}))
            .collect();
        json!({
            "apiVersion": "v1", "kind": "ConfigMap",
            "metadata": {"name": name, "namespace": "default", "uid": format!("uid-{name}"), "ownerReferences": refs},
        })
    }

    fn owners_of(store: &Store, name: &str) -> Option<Vec<String>> {
        store.read(|s| s.get("configmaps", "default", name).map(|o| owner_uids(&o)))
    }

    #[test]
    fn dependents_keep_their_live_owners_and_go_with_the_last() {
        let store = Store::new(100);
        store
            .write(|txn| {
                txn.put("configmaps", config_map("alive", &[]));
                txn.put("configmaps", config_map("both", &["alive", "gone"]));
                txn.put("configmaps", config_map("orphaned", &["gone"]));
                Ok::<_, ()>(())
            })
            .unwrap();
        assert!(collect_garbage_in(&store));
        assert_eq!(owners_of(&store, "both"), Some(vec!["uid-alive".to_owned()]));
        assert_eq!(owners_of(&store, "orphaned"), None);
        assert!(!collect_garbage_in(&store));
    }

    #[test]
    fn an_orphaning_owner_lets_go_of_its_dependents_then_goes() {
        let store = Store::new(100);
        let mut owner = config_map("owner", &[]);
        owner["metadata"]["deletionTimestamp"] = json!("2026-01-01T00:00:00Z");
        owner["metadata"]["finalizers"] = json!(["orphan"]);
        store
            .write(|txn| {
                txn.put("configmaps", owner);
                txn.put("configmaps", config_map("dependent", &["owner"]));
                Ok::<_, ()>(())
            })
            .unwrap();
        assert!(collect_garbage_in(&store));
        assert_eq!(owners_of(&store, "dependent"), Some(vec![]));
        assert_eq!(owners_of(&store, "owner"), None);
    }
}
