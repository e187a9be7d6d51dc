//! Watch streams whose relists reach the controllers only when the cache
//! holds them.
//!
//! A reflector's cache takes a relist (the first list, and every one after
//! a watch expired) in all at once, at its end (`InitDone`). A controller
//! triggered by an object of the relist before then looks the object up in
//! the old cache; one created while the watch was down is not there, the
//! controller skips it and never looks again. [`settle_relists`] holds a
//! relist's objects back until the cache has them, and hands on as deleted
//! what the old cache held and the relist no longer shows (deleted while
//! the watch was down, with no event of its own).

use std::hash::Hash;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;

use futures::{Stream, StreamExt};
use kube::runtime::reflector::{ObjectRef, Store};
use kube::runtime::watcher;
use kube::Resource;

/// The annotation `kubectl apply` keeps the whole applied object in.
const LAST_APPLIED: &str = "kubectl.kubernetes.io/last-applied-configuration";

/// Drops from a watched object what no k8s4r cache reads and what costs the
/// most memory per object: `metadata.managedFields` (one entry per field
/// manager, each with the set of fields it owns; larger than the rest of a
/// Robot or a Lease) and `kubectl apply`'s copy of the object. For caches
/// of the kinds there are as many of as robots; a cache that needs to know
/// who wrote a field (the manager's cancel and retry requests) keeps them.
pub fn trim<K: Resource>(obj: &mut K) {
    let meta = obj.meta_mut();
    meta.managed_fields = None;
    if let Some(annotations) = meta.annotations.as_mut() {
        annotations.remove(LAST_APPLIED);
    }
}

/// `events` (already taken into the cache `reader` reads), with each
/// relist's objects handed on after its `InitDone` and its missing objects
/// as deletions before them.
pub fn settle_relists<K, S>(
    events: S,
    reader: Store<K>,
) -> impl Stream<Item = Result<watcher::Event<K>, watcher::Error>>
where
    K: Resource + Clone + Send + Sync + 'static,
    K::DynamicType: Eq + Hash + Clone + Default,
    S: Stream<Item = Result<watcher::Event<K>, watcher::Error>>,
{
    let mut relist: Option<(Vec<Arc<K>>, Vec<K>)> = None;
    events
        .map(move |event| {
            let out = match event {
                Ok(watcher::Event::Init) => {
                    relist = Some((reader.state(), Vec::new()));
                    vec![watcher::Event::Init]
                }
                Ok(watcher::Event::InitApply(obj)) => match &mut relist {
                    Some((_, listed)) => {
                        listed.push(obj);
                        Vec::new()
                    }
                    None => vec![watcher::Event::InitApply(obj)],
                },
                Ok(watcher::Event::InitDone) => {
                    let (before, listed) = relist.take().unwrap_or_default();
                    let gone = before
                        .into_iter()
                        .filter(|old| reader.get(&ObjectRef::from_obj(old.as_ref())).is_none())
                        .map(|old| watcher::Event::Delete(K::clone(&old)));
                    let listed = listed.into_iter().map(watcher::Event::InitApply);
                    gone.chain(listed)
                        .chain(std::iter::once(watcher::Event::InitDone))
                        .collect()
                }
                Ok(event) => vec![event],
                Err(error) => return futures::stream::iter(vec![Err(error)]),
            };
            futures::stream::iter(out.into_iter().map(Ok).collect::<Vec<_>>())
        })
        .flatten()
}

/// Whether a watch is in sync with the API server: false from the start,
/// after an error, and while a relist is under way; true once a list is
/// complete or a watch resumed. A cheap, cloneable flag.
///
/// A watch that hangs without an error (a blackholed connection) still
/// reads as in sync: whoever concludes something from what a cache lacks
/// reads the object from the API server as well.
#[derive(Debug, Clone, Default)]
pub struct InSync {
    synced: Arc<AtomicBool>,
    /// A relist is under way.
    relisting: Arc<AtomicBool>,
}

impl InSync {
    /// Whether the watch is in sync now.
    pub fn is_synced(&self) -> bool {
        self.synced.load(Ordering::Acquire)
    }

    /// Follows `events` (passing them on unchanged).
    pub fn track<K, S>(&self, events: S) -> impl Stream<Item = Result<watcher::Event<K>, watcher::Error>>
    where
        S: Stream<Item = Result<watcher::Event<K>, watcher::Error>>,
    {
        let flag = self.clone();
        events.inspect(move |event| flag.observe(event))
    }

    fn observe<K>(&self, event: &Result<watcher::Event<K>, watcher::Error>) {
        let synced = match event {
            Err(_) => {
                self.relisting.store(false, Ordering::Release);
                false
            }
            Ok(watcher::Event::Init) => {
                self.relisting.store(true, Ordering::Release);
                false
            }
            Ok(watcher::Event::InitApply(_)) => false,
            Ok(watcher::Event::InitDone) => {
                self.relisting.store(false, Ordering::Release);
                true
            }
            Ok(watcher::Event::Apply(_) | watcher::Event::Delete(_)) => {
                !self.relisting.load(Ordering::Acquire)
            }
        };
        self.synced.store(synced, Ordering::Release);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn trimming_drops_managed_fields_and_the_applied_copy_only() {
        use k8s_openapi::api::coordination::v1::Lease;
        use k8s_openapi::apimachinery::pkg::apis::meta::v1::ManagedFieldsEntry;
        let mut lease = Lease::default();
        lease.metadata.name = Some("r1".into());
        lease.metadata.managed_fields = Some(vec![ManagedFieldsEntry {
            manager: Some("k8s4r-server".into()),
            ..Default::default()
        }]);
        lease.metadata.annotations = Some(
            [
                (LAST_APPLIED.to_owned(), "{}".to_owned()),
                ("keep".to_owned(), "me".to_owned()),
            ]
            .into(),
        );
        trim(&mut lease);
        assert_eq!(lease.metadata.managed_fields, None);
        assert_eq!(
            lease.metadata.annotations,
            Some([("keep".to_owned(), "me".to_owned())].into())
        );
        assert_eq!(lease.metadata.name.as_deref(), Some("r1"));
    }
    use k8s_openapi::api::core::v1::ConfigMap;
    use kube::runtime::{reflector, WatchStreamExt};
    use kube::ResourceExt;

    fn map(name: &str) -> ConfigMap {
        let mut m = ConfigMap::default();
        m.metadata.name = Some(name.into());
        m.metadata.namespace = Some("ns".into());
        m
    }

    #[tokio::test]
    async fn in_sync_follows_lists_errors_and_resumed_watches() {
        let flag = InSync::default();
        assert!(!flag.is_synced(), "not before the first list");
        let steps: Vec<(Result<watcher::Event<ConfigMap>, watcher::Error>, bool)> = vec![
            (Ok(watcher::Event::Init), false),
            (Ok(watcher::Event::InitApply(map("a"))), false),
            (Ok(watcher::Event::InitDone), true),
            (Ok(watcher::Event::Apply(map("a"))), true),
            (Err(watcher::Error::NoResourceVersion), false),
            // The watch resumed from its resourceVersion.
            (Ok(watcher::Event::Delete(map("a"))), true),
            (Ok(watcher::Event::Init), false),
        ];
        for (event, expected) in steps {
            let mut stream = std::pin::pin!(flag.track(futures::stream::iter(vec![event])));
            let _ = stream.next().await;
            assert_eq!(flag.is_synced(), expected);
        }
    }

    /// A relist after the watch expired: what it brings is handed on only
    /// when the cache holds it, and what it no longer lists is handed on
    /// as deleted.
    #[tokio::test]
    async fn a_relist_is_handed_on_once_the_cache_holds_it() {
        let (reader, writer) = reflector::store::<ConfigMap>();
        let events = vec![
            watcher::Event::Init,
            watcher::Event::InitApply(map("kept")),
            watcher::Event::InitApply(map("deleted-later")),
            watcher::Event::InitDone,
            watcher::Event::Apply(map("seen-live")),
            // The watch expired; meanwhile `new` was created and
            // `deleted-later` deleted.
            watcher::Event::Init,
            watcher::Event::InitApply(map("kept")),
            watcher::Event::InitApply(map("seen-live")),
            watcher::Event::InitApply(map("new")),
            watcher::Event::InitDone,
        ];
        let reflected = futures::stream::iter(events.into_iter().map(Ok)).reflect(writer);
        let seen: Vec<String> = settle_relists(reflected, reader.clone())
            .map(|event| match event.expect("no error") {
                watcher::Event::InitApply(o) | watcher::Event::Apply(o) => {
                    let cached = reader.get(&ObjectRef::from_obj(&o)).is_some();
                    format!("apply {} cached={cached}", o.name_any())
                }
                watcher::Event::Delete(o) => format!("delete {}", o.name_any()),
                watcher::Event::Init => "init".into(),
                watcher::Event::InitDone => "done".into(),
            })
            .collect()
            .await;
        assert_eq!(
            seen,
            [
                "init",
                "apply kept cached=true",
                "apply deleted-later cached=true",
                "done",
                "apply seen-live cached=true",
                "init",
                "delete deleted-later",
                "apply kept cached=true",
                "apply seen-live cached=true",
                "apply new cached=true",
                "done",
            ]
        );
    }
}
