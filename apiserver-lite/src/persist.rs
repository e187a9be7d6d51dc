//! Write-through storage in a redb file. Writes reach the file through one
//! task that commits them in batches (group commit), so a burst of writes
//! costs one fsync, not one each. The store answers a write only after its
//! batch is committed (see [`crate::store`]); when a commit fails, the file
//! is reopened and memory is rolled back to what it holds. On shutdown the
//! task commits what is queued, then ends.
//!
//! What earlier versions stored differently is moved once the file is
//! loaded ([`migrate_core_events`]).

use std::path::{Path, PathBuf};

use std::sync::Arc;
use std::time::Duration;

use redb::{Database, ReadableDatabase, ReadableTable, TableDefinition};
use serde_json::Value;
use tokio::sync::mpsc;

use crate::error::Error;
use crate::event_conversion::{from_core, STORED_RESOURCE as EVENTS};
use crate::store::{Batch, PersistOp, Store, Txn};

const OBJECTS: TableDefinition<&str, &[u8]> = TableDefinition::new("objects");
const META: TableDefinition<&str, u64> = TableDefinition::new("meta");
const BATCH: usize = 4096;

fn storage_err(path: &Path, e: impl std::fmt::Display) -> Error {
    Error::Storage {
        path: path.display().to_string(),
        message: e.to_string(),
    }
}

pub struct Persistence {
    db: Database,
    path: PathBuf,
}

/// What was stored: the last resourceVersion and every object with its group-resource.
pub struct Loaded {
    pub rv: u64,
    pub objects: Vec<(String, Value)>,
}

impl Persistence {
    pub fn open(path: &Path) -> Result<(Self, Loaded), Error> {
        if let Some(dir) = path.parent().filter(|d| !d.as_os_str().is_empty()) {
            crate::private_files::create_dir(dir)?;
        }
        // It holds Secrets: opened 0600 here, before redb writes a byte.
        let file = crate::private_files::open(path)?;
        let backend = redb::backends::FileBackend::new(file).map_err(|e| storage_err(path, e))?;
        let db = Database::builder()
            .create_with_backend(backend)
            .map_err(|e| storage_err(path, e))?;
        let p = Persistence {
            db,
            path: path.to_path_buf(),
        };
        // A fresh file gets its tables; one that has them is only read, so
        // that reopening on a full disk after a failed commit works.
        if !p.has_tables()? {
            let txn = p.db.begin_write().map_err(|e| storage_err(path, e))?;
            txn.open_table(OBJECTS).map_err(|e| storage_err(path, e))?;
            txn.open_table(META).map_err(|e| storage_err(path, e))?;
            txn.commit().map_err(|e| storage_err(path, e))?;
        }
        let loaded = p.load()?;
        Ok((p, loaded))
    }

    fn has_tables(&self) -> Result<bool, Error> {
        let txn = self.db.begin_read().map_err(|e| storage_err(&self.path, e))?;
        let has = |r: Result<_, redb::TableError>| match r {
            Ok(_) => Ok(true),
            Err(redb::TableError::TableDoesNotExist(_)) => Ok(false),
            Err(e) => Err(storage_err(&self.path, e)),
        };
        Ok(has(txn.open_table(OBJECTS).map(|_| ()))? && has(txn.open_table(META).map(|_| ()))?)
    }

    fn load(&self) -> Result<Loaded, Error> {
        let path = &self.path;
        let txn = self.db.begin_read().map_err(|e| storage_err(path, e))?;
        let meta = txn.open_table(META).map_err(|e| storage_err(path, e))?;
        let rv = meta
            .get("rv")
            .map_err(|e| storage_err(path, e))?
            .map(|g| g.value())
            .unwrap_or(0);
        let table = txn.open_table(OBJECTS).map_err(|e| storage_err(path, e))?;
        let mut objects = Vec::new();
        for row in table.iter().map_err(|e| storage_err(path, e))? {
            let (k, v) = row.map_err(|e| storage_err(path, e))?;
            let key = k.value();
            let gr = key.split('/').next().unwrap_or_default().to_string();
            match serde_json::from_slice::<Value>(v.value()) {
                Ok(obj) => objects.push((gr, obj)),
                Err(e) => tracing::warn!(key, error = %e, "skipping unreadable stored object"),
            }
        }
        Ok(Loaded { rv, objects })
    }

    fn commit(&self, ops: &[&PersistOp]) -> Result<(), Error> {
        let path = &self.path;
        let txn = self.db.begin_write().map_err(|e| storage_err(path, e))?;
        let mut last_rv = 0;
        {
            let mut table = txn.open_table(OBJECTS).map_err(|e| storage_err(path, e))?;
            for op in ops {
                match op {
                    PersistOp::Put { key, value, rv } => {
                        table
                            .insert(key.as_str(), &value[..])
                            .map_err(|e| storage_err(path, e))?;
                        last_rv = last_rv.max(*rv);
                    }
                    PersistOp::Delete { key, rv } => {
                        table.remove(key.as_str()).map_err(|e| storage_err(path, e))?;
                        last_rv = last_rv.max(*rv);
                    }
                }
            }
            let mut meta = txn.open_table(META).map_err(|e| storage_err(path, e))?;
            meta.insert("rv", last_rv).map_err(|e| storage_err(path, e))?;
        }
        txn.commit().map_err(|e| storage_err(path, e))
    }

    /// Commits what the store queues until the store stops queueing, then
    /// returns after the last commit.
    pub async fn run(self, mut rx: mpsc::UnboundedReceiver<Batch>, store: Arc<Store>) {
        let path = self.path.clone();
        let mut db = Some(self);
        let mut batches = Vec::with_capacity(BATCH);
        while rx.recv_many(&mut batches, BATCH).await > 0 {
            let group = std::mem::take(&mut batches);
            let Some(current) = db.take() else { break };
            let newest = group.iter().flat_map(|b| b.ops.iter()).map(PersistOp::rv).max();
            let done = tokio::task::spawn_blocking(move || {
                let ops: Vec<&PersistOp> = group.iter().flat_map(|b| b.ops.iter()).collect();
                match current.commit(&ops) {
                    Ok(()) => (Some(current), group, Ok(())),
                    // redb wants a database that failed an I/O reopened;
                    // dropping it does I/O, so here, not on a runtime thread.
                    Err(e) => (None, group, Err(e.to_string())),
                }
            })
            .await;
            let (group, error) = match done {
                Ok((current, group, Ok(()))) => {
                    store.committed(group);
                    db = current;
                    continue;
                }
                Ok((_, group, Err(e))) => (Some(group), e),
                Err(e) => (None, format!("storage task failed: {e}")),
            };
            tracing::error!(error = %error, "storage commit failed; the writes it held are rolled back");
            match reopen(&path, &rx).await {
                Some((reopened, loaded)) => {
                    match group {
                        // The commit reached the file after all (it failed
                        // after its header was written): nothing is lost.
                        Some(group) if newest.is_some_and(|n| loaded.rv >= n) => store.committed(group),
                        _ => store.roll_back(loaded.rv, loaded.objects, &mut rx, &error),
                    }
                    db = Some(reopened);
                }
                None => break,
            }
        }
    }
}

/// Opens storage again after a failed commit, retrying every second until
/// the file can be read; `None` when the store stopped queueing meanwhile
/// (shutdown), since nothing is left to commit.
async fn reopen(path: &Path, rx: &mpsc::UnboundedReceiver<Batch>) -> Option<(Persistence, Loaded)> {
    loop {
        let p = path.to_path_buf();
        match tokio::task::spawn_blocking(move || Persistence::open(&p)).await {
            Ok(Ok(opened)) => return Some(opened),
            Ok(Err(e)) => tracing::error!(error = %e, "storage cannot be reopened; retrying"),
            Err(e) => tracing::error!(error = %e, "storage cannot be reopened; retrying"),
        }
        if rx.is_closed() {
            tracing::error!("shutting down with storage that cannot be reopened");
            return None;
        }
        tokio::time::sleep(Duration::from_secs(1)).await;
    }
}

/// Moves the core/v1 Events that earlier versions stored apart (under
/// `events`) to the storage both Event APIs now share, converted; returns
/// how many it moved. Without this they would stay in the database, served
/// by nothing and never expired.
pub fn migrate_core_events(txn: &mut Txn<'_>) -> usize {
    const LEGACY: &str = "events";
    let keys: Vec<(String, String)> = txn.state.list(LEGACY, None).map(|(key, _)| key.clone()).collect();
    for (ns, name) in &keys {
        if let Some(old) = txn.remove(LEGACY, ns, name) {
            txn.put(EVENTS, from_core(&old.value()));
        }
    }
    keys.len()
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    #[test]
    fn core_events_stored_apart_by_earlier_versions_move_to_the_shared_storage() {
        let store = Store::new(100);
        let legacy = json!({
            "apiVersion": "v1", "kind": "Event",
            "metadata": {"name": "t.1", "namespace": "default", "uid": "e1"},
            "involvedObject": {"kind": "Task", "name": "t"},
            "message": "attempt 1 started",
        });
        store
            .write(|txn| {
                txn.put("events", legacy);
                Ok::<_, ()>(migrate_core_events(txn))
            })
            .unwrap();
        assert!(store.read(|s| s.list("events", None).next().is_none()));
        let moved = store.read(|s| s.get(EVENTS, "default", "t.1")).expect("moved");
        assert_eq!(moved["apiVersion"], "events.k8s.io/v1");
        assert_eq!(moved["note"], "attempt 1 started");
        assert_eq!(moved["regarding"]["name"], "t");
        assert_eq!(moved["metadata"]["uid"], "e1");
    }
}
