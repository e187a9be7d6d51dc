//! Write-through storage in a redb file. Writes reach the file through one
//! task that commits them in batches (group commit), so a burst of writes
//! costs one fsync, not one each; `flush` on shutdown waits for all of them.

use std::path::{Path, PathBuf};

use redb::{Database, ReadableDatabase, ReadableTable, TableDefinition};
use serde_json::Value;
use tokio::sync::mpsc;

use crate::error::Error;
use crate::store::PersistOp;

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
        // Make sure the tables exist so that reading a fresh file works.
        let txn = p.db.begin_write().map_err(|e| storage_err(path, e))?;
        txn.open_table(OBJECTS).map_err(|e| storage_err(path, e))?;
        txn.open_table(META).map_err(|e| storage_err(path, e))?;
        txn.commit().map_err(|e| storage_err(path, e))?;
        let loaded = p.load()?;
        Ok((p, loaded))
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

    fn commit(&self, ops: &[PersistOp]) -> Result<(), Error> {
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

    /// Runs until every sender is dropped, then returns after the last commit.
    pub async fn run(self, mut rx: mpsc::UnboundedReceiver<PersistOp>) {
        let mut batch = Vec::with_capacity(BATCH);
        let db = std::sync::Arc::new(self);
        while rx.recv_many(&mut batch, BATCH).await > 0 {
            let ops = std::mem::take(&mut batch);
            let db2 = db.clone();
            let res = tokio::task::spawn_blocking(move || db2.commit(&ops)).await;
            match res {
                Ok(Ok(())) => {}
                Ok(Err(e)) => tracing::error!(error = %e, "storage commit failed"),
                Err(e) => tracing::error!(error = %e, "storage task failed"),
            }
        }
    }
}
