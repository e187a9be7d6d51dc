//! The Tasks this server wrote, as the API server answered each write, kept
//! until the watch brings the same version or a newer one.
//!
//! A robot's next status about a Task is decided on, and its write guarded
//! by, the newer of the cached Task and the one this server last wrote.
//! Without this, a short task's reports met the server's own writes not
//! yet watched back: the dispatch records, then `running` before
//! `completed`. Each such report cost a conflict, a read and a second
//! write (12,870 conflicts in one 100,000-robot run, BENCHMARKS.md), and
//! the workers' backlog grew by as much.
//!
//! Only an optimisation: a Task someone else wrote since still fails the
//! guard and is read again, and a version missing here is taken from the
//! cache as before.

use std::collections::HashMap;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use k8s4r_api::Task;
use k8s4r_service::lock;

/// Tasks kept before the old entries are dropped.
const KEPT: usize = 16_384;

/// How long an entry is worth keeping: the watch brings a write back
/// within seconds even under load.
const WORTH: Duration = Duration::from_secs(60);

/// The Tasks last written by this server, by uid.
#[derive(Debug, Default)]
pub struct Written {
    tasks: Mutex<HashMap<String, (Instant, Arc<Task>)>>,
}

impl Written {
    /// Keeps `task`, as a write returned it (or a fresh read found it).
    pub fn record(&self, mut task: Task) {
        let Some(uid) = task.metadata.uid.clone() else {
            return;
        };
        k8s4r_service::watch::trim(&mut task);
        let now = Instant::now();
        let mut tasks = lock(&self.tasks);
        if tasks.len() >= KEPT {
            tasks.retain(|_, (at, _)| now.duration_since(*at) < WORTH);
            if tasks.len() >= KEPT {
                tasks.clear();
            }
        }
        tasks.insert(uid, (now, Arc::new(task)));
    }

    /// The newer of `cached` and what this server last wrote of the same
    /// Task; an entry the cache has caught up with is dropped.
    pub fn newest(&self, cached: Arc<Task>) -> Arc<Task> {
        let Some(uid) = cached.metadata.uid.as_deref() else {
            return cached;
        };
        let mut tasks = lock(&self.tasks);
        match tasks.get(uid) {
            Some((_, written)) if is_newer(written, &cached) => written.clone(),
            Some(_) => {
                tasks.remove(uid);
                cached
            }
            None => cached,
        }
    }
}

/// Whether `a` is a later version of the same object than `b`. A
/// resourceVersion is opaque to clients in general; the API server's (and
/// apiserver-lite's) are increasing integers, and anything else reads as
/// not newer, so the cache is used as before.
fn is_newer(a: &Task, b: &Task) -> bool {
    let version = |t: &Task| t.metadata.resource_version.as_deref()?.parse::<u64>().ok();
    a.metadata.uid == b.metadata.uid && matches!((version(a), version(b)), (Some(a), Some(b)) if a > b)
}

#[cfg(test)]
mod tests {
    use super::*;
    use k8s4r_api::TaskSpec;

    fn task(uid: &str, version: &str) -> Task {
        let mut t = Task::new("t", TaskSpec::default());
        t.metadata.uid = Some(uid.into());
        t.metadata.resource_version = Some(version.into());
        t
    }

    #[test]
    fn a_write_stands_until_the_cache_catches_up() {
        let written = Written::default();
        written.record(task("u1", "12"));
        let version = |t: Arc<Task>| t.metadata.resource_version.clone().unwrap_or_default();

        // The cache lags the write: the write is what the next report sees.
        assert_eq!(version(written.newest(Arc::new(task("u1", "10")))), "12");
        // Another Task's cache entry is not touched.
        assert_eq!(version(written.newest(Arc::new(task("u2", "5")))), "5");
        // The cache caught up (or someone wrote since): the cache wins, and
        // the entry is gone for good.
        assert_eq!(version(written.newest(Arc::new(task("u1", "14")))), "14");
        assert_eq!(version(written.newest(Arc::new(task("u1", "11")))), "11");
        // A version that is not a number is never taken for newer.
        written.record(task("u3", "abc"));
        assert_eq!(version(written.newest(Arc::new(task("u3", "1")))), "1");
    }
}
