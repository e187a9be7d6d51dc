//! Objects a program wrote, as the API server answered each write, kept
//! until its watch brings the same version back or a newer one.
//!
//! A decision read from a cache that has not caught up with the program's
//! own last write is made on an older object than the one it writes over:
//! the server's next status report about a Task met its own dispatch
//! records not yet watched back (a conflict, a read and a second write
//! each: 12,870 conflicts in one 100,000-robot run), and the manager's next
//! look at a Job or TaskGroup compared its new status with the one before
//! its last write. [`Written::newest`] gives the newer of the two.
//!
//! It also lets a watch handler tell its program's own write coming back
//! ([`Written::echo`]), which needs no second look: the reconcile that wrote
//! it already knew everything in it, and the next one reads it here.
//!
//! Bounded: at most [`KEPT`] objects, and entries older than [`WORTH`] are
//! dropped at the next write after a sweep is due (one a [`WORTH`]), so an
//! entry whose echo came before it was recorded lives two minutes at most.
//! A version missing here is taken from the cache as before, and its echo
//! is not recognised (a needless look, never a missed one).

use std::collections::HashMap;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use kube::Resource;

use crate::lock;

/// Objects kept before the old entries are dropped.
pub const KEPT: usize = 16_384;

/// How long an entry is worth keeping: the watch brings a write back
/// within seconds even under load.
pub const WORTH: Duration = Duration::from_secs(60);

/// The objects last written by this program, by uid.
#[derive(Debug)]
pub struct Written<K> {
    kept: Mutex<Kept<K>>,
}

/// The entries, and when old ones were last swept out.
#[derive(Debug)]
struct Kept<K> {
    objects: HashMap<String, (Instant, Arc<K>)>,
    swept: Instant,
}

impl<K> Default for Written<K> {
    fn default() -> Self {
        Written {
            kept: Mutex::new(Kept {
                objects: HashMap::new(),
                swept: Instant::now(),
            }),
        }
    }
}

impl<K: Resource> Written<K> {
    /// Keeps `obj`, as a write returned it (or a fresh read found it).
    pub fn record(&self, obj: K) {
        let Some(uid) = obj.meta().uid.clone() else {
            return;
        };
        let now = Instant::now();
        let mut kept = lock(&self.kept);
        if kept.objects.len() >= KEPT || now.duration_since(kept.swept) >= WORTH {
            kept.objects.retain(|_, (at, _)| now.duration_since(*at) < WORTH);
            kept.swept = now;
            if kept.objects.len() >= KEPT {
                kept.objects.clear();
            }
        }
        kept.objects.insert(uid, (now, Arc::new(obj)));
    }

    /// The newer of `cached` and what this program last wrote of the same
    /// object; an entry the cache has gone past is dropped.
    pub fn newest(&self, cached: Arc<K>) -> Arc<K> {
        let Some(uid) = cached.meta().uid.as_deref() else {
            return cached;
        };
        let objects = &mut lock(&self.kept).objects;
        let Some((_, written)) = objects.get(uid) else {
            return cached;
        };
        match compare(written.as_ref(), cached.as_ref()) {
            Some(std::cmp::Ordering::Greater) => written.clone(),
            Some(std::cmp::Ordering::Equal) => cached,
            _ => {
                objects.remove(uid);
                cached
            }
        }
    }

    /// Whether `watched` is this program's own last write of it coming
    /// back through the watch (the same version). The entry is done with
    /// once the watch brought that version or a newer one.
    pub fn echo(&self, watched: &K) -> bool {
        use std::cmp::Ordering;
        let Some(uid) = watched.meta().uid.as_deref() else {
            return false;
        };
        let objects = &mut lock(&self.kept).objects;
        let Some((_, written)) = objects.get(uid) else {
            return false;
        };
        let order = compare(written.as_ref(), watched);
        if matches!(order, Some(Ordering::Equal | Ordering::Less)) {
            objects.remove(uid);
        }
        order == Some(Ordering::Equal)
    }

    /// Forgets the object `uid` (it was deleted).
    pub fn forget(&self, uid: &str) {
        lock(&self.kept).objects.remove(uid);
    }
}

/// How version `a` stands to version `b` of the same object; `None` for
/// two objects, or a version that is not a number. A resourceVersion is
/// opaque to clients in general; the API server's (and apiserver-lite's)
/// are increasing integers, and anything else is never taken for newer,
/// so the cache is used as before.
fn compare<K: Resource>(a: &K, b: &K) -> Option<std::cmp::Ordering> {
    let version = |o: &K| o.meta().resource_version.as_deref()?.parse::<u64>().ok();
    if a.meta().uid != b.meta().uid {
        return None;
    }
    Some(version(a)?.cmp(&version(b)?))
}

#[cfg(test)]
mod tests {
    use super::*;
    use k8s_openapi::api::core::v1::ConfigMap;

    fn object(uid: &str, version: &str) -> ConfigMap {
        let mut o = ConfigMap::default();
        o.metadata.uid = Some(uid.into());
        o.metadata.resource_version = Some(version.into());
        o
    }

    fn version(o: Arc<ConfigMap>) -> String {
        o.metadata.resource_version.clone().unwrap_or_default()
    }

    #[test]
    fn a_write_stands_until_the_cache_catches_up() {
        let written = Written::default();
        written.record(object("u1", "12"));

        // The cache lags the write: the write is what the next look sees.
        assert_eq!(version(written.newest(Arc::new(object("u1", "10")))), "12");
        // Another object's cache entry is not touched.
        assert_eq!(version(written.newest(Arc::new(object("u2", "5")))), "5");
        // The cache caught up: the cache's, and the entry stays for its echo.
        assert_eq!(version(written.newest(Arc::new(object("u1", "12")))), "12");
        assert!(written.echo(&object("u1", "12")));
        // Someone wrote since: the cache wins, and the entry is gone.
        written.record(object("u1", "13"));
        assert_eq!(version(written.newest(Arc::new(object("u1", "14")))), "14");
        assert_eq!(version(written.newest(Arc::new(object("u1", "11")))), "11");
        // A version that is not a number is never taken for newer.
        written.record(object("u3", "abc"));
        assert_eq!(version(written.newest(Arc::new(object("u3", "1")))), "1");
    }

    #[test]
    fn only_the_version_written_is_its_echo() {
        let written = Written::default();
        written.record(object("u1", "7"));
        // An older version (a write before it, or someone else's) and
        // another object are not.
        assert!(!written.echo(&object("u1", "6")));
        assert!(!written.echo(&object("u2", "7")));
        assert!(written.echo(&object("u1", "7")));
        // Recognised once: a relist showing the same version again looks.
        assert!(!written.echo(&object("u1", "7")));
        written.record(object("u1", "8"));
        written.forget("u1");
        assert!(!written.echo(&object("u1", "8")));
        // A newer version watched (the echo came before the write was
        // recorded, then someone wrote): not an echo, and the entry goes.
        written.record(object("u1", "9"));
        assert!(!written.echo(&object("u1", "10")));
        assert!(!written.echo(&object("u1", "9")));
    }
}
