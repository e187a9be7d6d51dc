//! The object store: every object in memory, one global resourceVersion
//! counter, a bounded history of events for watch resumption, a broadcast
//! channel for live watchers, and write-through to the persistence task.
//!
//! With storage, a change is *applied* in memory at once (so the next
//! write sees it) and *committed* once the persistence task has it on
//! disk. Nothing leaves the server before it is committed: watchers are
//! sent events only then, and a request is answered only once everything
//! it could have seen is committed ([`Store::settle`]). A failed commit
//! rolls memory back to what is on disk, and the requests that saw the
//! lost changes fail. resourceVersions are never reused, so one that
//! was answered is never answered again for something else.
//!
//! ```text
//!   write ── apply in memory (rv n) ── queue ──> persistence: commit
//!                                                   ├─ ok:   publish events, committed = n
//!                                                   └─ fail: reload from disk, (committed, n] lost
//!   request ── handler ── settle: wait until committed >= rv it saw ── answer
//! ```
//!
//! Without storage, a change is committed when it is applied.

use std::collections::{BTreeMap, HashMap, VecDeque};
use std::sync::{Arc, Mutex, MutexGuard};

use serde_json::Value;
use tokio::sync::{broadcast, mpsc, watch, Notify};

use crate::error::NotStored;
use crate::object::Object;
use crate::resources::{Registry, CRD_RESOURCE};

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum EventType {
    Added,
    Modified,
    Deleted,
}

impl EventType {
    pub fn as_str(self) -> &'static str {
        match self {
            EventType::Added => "ADDED",
            EventType::Modified => "MODIFIED",
            EventType::Deleted => "DELETED",
        }
    }
}

/// One change, as watchers see it.
#[derive(Debug)]
pub struct Event {
    pub rv: u64,
    /// `plural.group` of the object.
    pub gr: String,
    pub ns: String,
    pub type_: EventType,
    pub object: Object,
    /// The object before the change, so that a watcher with a selector can
    /// tell an object leaving its selection from one being modified in it.
    pub prev: Option<Object>,
}

/// What the persistence task is told to do, in commit order.
#[derive(Debug)]
pub enum PersistOp {
    Put { key: String, value: Arc<[u8]>, rv: u64 },
    Delete { key: String, rv: u64 },
}

impl PersistOp {
    pub fn rv(&self) -> u64 {
        match self {
            PersistOp::Put { rv, .. } | PersistOp::Delete { rv, .. } => *rv,
        }
    }
}

pub fn storage_key(gr: &str, ns: &str, name: &str) -> String {
    format!("{gr}/{ns}/{name}")
}

type Objects = BTreeMap<(String, String), Object>;

/// One write's share of the persistence queue: its storage operations and
/// the events published once they are committed.
#[derive(Debug)]
pub struct Batch {
    pub ops: Vec<PersistOp>,
    events: Vec<Arc<Event>>,
}

/// A failed commit: changes with resourceVersions in `(after, upto]` were
/// applied in memory and never stored, and were rolled back.
#[derive(Debug, Clone)]
pub struct Lost {
    after: u64,
    upto: u64,
    message: Arc<str>,
}

/// How far storage has come.
#[derive(Debug, Clone, Default)]
pub struct Durability {
    /// Every change up to this resourceVersion is stored.
    committed: u64,
    /// The changes failed commits rolled back, oldest first; adjacent
    /// ranges are merged, and only the last [`LOST_KEPT`] are kept.
    lost: VecDeque<Lost>,
    /// The span the ranges dropped from `lost` covered: what lies in it is
    /// taken as lost (it may have been stored; a request asking now fails).
    evicted: Option<(u64, u64)>,
}

const LOST_KEPT: usize = 256;

/// How long a request waits for storage to commit what it saw before it is
/// answered 500 (its write may still be committed later, as with a real
/// server's storage timeout).
const COMMIT_WAIT: std::time::Duration = std::time::Duration::from_secs(60);

impl Durability {
    /// Whether the change at `rv` is stored (`Some(Ok)`), was rolled back
    /// (`Some(Err)`), or is still on its way (`None`).
    fn outcome(&self, rv: u64) -> Option<Result<(), Arc<str>>> {
        if let Some(lost) = self.lost.iter().find(|l| l.after < rv && rv <= l.upto) {
            return Some(Err(lost.message.clone()));
        }
        if self.evicted.is_some_and(|(after, upto)| after < rv && rv <= upto) {
            return Some(Err("storage failed repeatedly".into()));
        }
        if rv <= self.committed {
            return Some(Ok(()));
        }
        None
    }

    fn record_loss(&mut self, after: u64, upto: u64, message: &str) {
        if upto <= after {
            return;
        }
        match self.lost.back_mut() {
            Some(last) if last.upto >= after => {
                last.upto = last.upto.max(upto);
                last.message = message.into();
            }
            _ => {
                if self.lost.len() == LOST_KEPT {
                    if let Some(old) = self.lost.pop_front() {
                        let (after, upto) = self.evicted.unwrap_or((old.after, old.upto));
                        self.evicted = Some((after.min(old.after), upto.max(old.upto)));
                    }
                }
                self.lost.push_back(Lost {
                    after,
                    upto,
                    message: message.into(),
                });
            }
        }
    }
}

/// Where applied changes go.
enum Sink {
    /// No storage: a change is committed when applied.
    Memory,
    /// The persistence task's queue.
    Disk(mpsc::UnboundedSender<Batch>),
    /// Shut down: changes are applied, never committed, and count as lost.
    Closed,
}

pub struct State {
    /// The resourceVersion of the newest change that stands (what lists
    /// answer, and what a read waits to see committed).
    pub rv: u64,
    /// The last resourceVersion handed out: above `rv` after a rollback,
    /// so that no version is ever used twice.
    issued: u64,
    /// The last resourceVersion committed; watches that start "now" start here.
    committed: u64,
    /// How many times memory was rolled back to storage.
    rollbacks: u64,
    objects: HashMap<String, Objects>,
    /// uid -> (group-resource, namespace, name), for owner references.
    uids: HashMap<String, (String, String, String)>,
    history: VecDeque<Arc<Event>>,
    /// Watches can resume from any resourceVersion >= this one.
    oldest: u64,
    history_limit: usize,
    pub registry: Registry,
}

impl State {
    /// An object's tree (parsed now, for most kinds).
    pub fn get(&self, gr: &str, ns: &str, name: &str) -> Option<Arc<Value>> {
        self.get_object(gr, ns, name).map(Object::value)
    }

    pub fn get_object(&self, gr: &str, ns: &str, name: &str) -> Option<&Object> {
        self.objects.get(gr)?.get(&(ns.to_string(), name.to_string()))
    }

    /// Objects of a group-resource in key order, optionally in one namespace.
    pub fn list<'a>(
        &'a self,
        gr: &str,
        ns: Option<&'a str>,
    ) -> impl Iterator<Item = (&'a (String, String), &'a Object)> + 'a {
        self.objects
            .get(gr)
            .into_iter()
            .flat_map(move |m| m.iter().filter(move |((ons, _), _)| ns.is_none_or(|n| n == ons)))
    }

    pub fn count(&self) -> usize {
        self.objects.values().map(|m| m.len()).sum()
    }

    pub fn uid_exists(&self, uid: &str) -> bool {
        self.uids.contains_key(uid)
    }

    pub fn all_groups(&self) -> Vec<String> {
        self.objects.keys().cloned().collect()
    }

    /// Events after `rv`, or `None` when they are no longer retained (410 Gone).
    pub fn events_since(&self, rv: u64) -> Option<Vec<Arc<Event>>> {
        if rv < self.oldest {
            return None;
        }
        let start = self.history.partition_point(|e| e.rv <= rv);
        Some(self.history.iter().skip(start).cloned().collect())
    }

    pub fn oldest(&self) -> u64 {
        self.oldest
    }

    pub fn committed(&self) -> u64 {
        self.committed
    }

    /// Replaces every object with `objects` (what storage holds, as of
    /// `rv`) and serves the kinds of the CRDs among them. Versions handed
    /// out since are not handed out again.
    fn replace(&mut self, rv: u64, objects: Vec<(String, Value)>) {
        self.objects.clear();
        self.uids.clear();
        self.registry = Registry::with_builtins();
        for (gr, obj) in objects {
            let ns = obj["metadata"]["namespace"]
                .as_str()
                .unwrap_or_default()
                .to_string();
            let name = obj["metadata"]["name"].as_str().unwrap_or_default().to_string();
            if let Some(uid) = obj["metadata"]["uid"].as_str() {
                self.uids
                    .insert(uid.to_string(), (gr.clone(), ns.clone(), name.clone()));
            }
            if gr == CRD_RESOURCE {
                self.registry.serve_crd(&obj);
            }
            let obj = Object::new(obj).stored(&gr);
            self.objects.entry(gr).or_default().insert((ns, name), obj);
        }
        self.rv = rv;
        self.issued = self.issued.max(rv);
    }

    /// Sends committed events to the history and to live watchers.
    fn publish(&mut self, events: Vec<Arc<Event>>, live: &broadcast::Sender<Arc<Event>>) {
        for ev in events {
            self.committed = self.committed.max(ev.rv);
            self.history.push_back(ev.clone());
            while self.history.len() > self.history_limit {
                if let Some(old) = self.history.pop_front() {
                    self.oldest = old.rv;
                }
            }
            // No receivers is fine: nobody is watching.
            let _ = live.send(ev);
        }
    }
}

/// A write in progress: changes are applied at once, and their events and
/// persistence operations are published when the transaction ends.
pub struct Txn<'a> {
    pub state: &'a mut State,
    events: Vec<Arc<Event>>,
    persist: Vec<PersistOp>,
    /// Whether this write may have left garbage for the collector: an
    /// object removed or marked for deletion, or one naming an owner that
    /// does not exist. The collector runs after each such write.
    pub garbage_possible: bool,
}

impl Txn<'_> {
    fn next_rv(&mut self) -> u64 {
        self.state.issued += 1;
        self.state.rv = self.state.issued;
        self.state.rv
    }

    /// Stores `obj` with a new resourceVersion and returns the stored copy
    /// (with its tree).
    pub fn put(&mut self, gr: &str, mut obj: Value) -> Object {
        let rv = self.next_rv();
        obj["metadata"]["resourceVersion"] = Value::String(rv.to_string());
        let ns = obj["metadata"]["namespace"]
            .as_str()
            .unwrap_or_default()
            .to_string();
        let name = obj["metadata"]["name"].as_str().unwrap_or_default().to_string();
        let uid = obj["metadata"]["uid"].as_str().unwrap_or_default().to_string();
        // One being deleted is left to its finalizers.
        let absent_owner = obj["metadata"]["deletionTimestamp"].is_null()
            && obj["metadata"]["ownerReferences"].as_array().is_some_and(|refs| {
                refs.iter().any(|r| {
                    r["uid"]
                        .as_str()
                        .is_some_and(|u| !self.state.uids.contains_key(u))
                })
            });
        self.garbage_possible |= absent_owner;
        // Serialized once: for storage, every reader and every watcher.
        let obj = Object::new(obj);
        let prev = self
            .state
            .objects
            .entry(gr.to_string())
            .or_default()
            .insert((ns.clone(), name.clone()), obj.stored(gr));
        self.state
            .uids
            .insert(uid, (gr.to_string(), ns.clone(), name.clone()));
        self.persist.push(PersistOp::Put {
            key: storage_key(gr, &ns, &name),
            value: obj.json().clone(),
            rv,
        });
        self.events.push(Arc::new(Event {
            rv,
            gr: gr.to_string(),
            ns,
            type_: if prev.is_some() {
                EventType::Modified
            } else {
                EventType::Added
            },
            object: obj.stored(gr),
            prev,
        }));
        obj
    }

    /// Removes an object; the DELETED event carries it with the deletion's resourceVersion.
    pub fn remove(&mut self, gr: &str, ns: &str, name: &str) -> Option<Object> {
        let old = self
            .state
            .objects
            .get_mut(gr)?
            .remove(&(ns.to_string(), name.to_string()))?;
        let rv = self.next_rv();
        let mut last = (*old.value()).clone();
        if let Some(uid) = last["metadata"]["uid"].as_str() {
            self.state.uids.remove(uid);
        }
        last["metadata"]["resourceVersion"] = Value::String(rv.to_string());
        let last = Object::new(last);
        self.persist.push(PersistOp::Delete {
            key: storage_key(gr, ns, name),
            rv,
        });
        self.events.push(Arc::new(Event {
            rv,
            gr: gr.to_string(),
            ns: ns.to_string(),
            type_: EventType::Deleted,
            object: last.stored(gr),
            prev: Some(old),
        }));
        self.garbage_possible = true;
        Some(last)
    }
}

pub struct Store {
    state: Mutex<State>,
    events: broadcast::Sender<Arc<Event>>,
    sink: Mutex<Sink>,
    durability: watch::Sender<Durability>,
    /// Woken after deletions so the garbage collector looks for orphans.
    pub gc: Notify,
}

/// How many rollbacks the store had been through when a request began.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Generation(u64);

impl Store {
    pub fn new(history_limit: usize) -> Self {
        let (events, _) = broadcast::channel(16 * 1024);
        Store {
            state: Mutex::new(State {
                rv: 0,
                issued: 0,
                committed: 0,
                rollbacks: 0,
                objects: HashMap::new(),
                uids: HashMap::new(),
                history: VecDeque::new(),
                oldest: 0,
                history_limit: history_limit.max(1),
                registry: Registry::with_builtins(),
            }),
            events,
            sink: Mutex::new(Sink::Memory),
            durability: watch::Sender::new(Durability::default()),
            gc: Notify::new(),
        }
    }

    fn lock(&self) -> MutexGuard<'_, State> {
        // A panic while holding the lock leaves plain data behind; keep serving.
        self.state.lock().unwrap_or_else(|e| e.into_inner())
    }

    fn sink(&self) -> MutexGuard<'_, Sink> {
        self.sink.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// Sends applied changes to the persistence task from now on; `None`
    /// on shutdown, after which nothing more is committed.
    pub fn set_persist(&self, tx: Option<mpsc::UnboundedSender<Batch>>) {
        let mut sink = self.sink();
        *sink = match (tx, &*sink) {
            (Some(tx), _) => Sink::Disk(tx),
            (None, Sink::Memory) => Sink::Memory,
            (None, _) => Sink::Closed,
        };
    }

    /// Loads what storage holds (no events; watches resume from `rv` on).
    pub fn load(&self, rv: u64, objects: Vec<(String, Value)>) {
        let mut st = self.lock();
        st.replace(rv, objects);
        st.committed = st.rv;
        st.oldest = st.rv;
        let committed = st.rv;
        self.durability.send_modify(|d| d.committed = committed);
    }

    pub fn read<R>(&self, f: impl FnOnce(&State) -> R) -> R {
        f(&self.lock())
    }

    /// Runs `f` as one atomic write. Its changes are applied at once; their
    /// events go out when storage has committed them.
    pub fn write<R, E>(&self, f: impl FnOnce(&mut Txn<'_>) -> Result<R, E>) -> Result<R, E> {
        let mut st = self.lock();
        let mut txn = Txn {
            state: &mut st,
            events: Vec::new(),
            persist: Vec::new(),
            garbage_possible: false,
        };
        let result = f(&mut txn);
        let Txn {
            events,
            persist,
            garbage_possible,
            ..
        } = txn;
        // Changes made before an error stay (each put/remove is complete in
        // itself), so they are committed and published all the same.
        if !events.is_empty() {
            // Queued under the state lock, so the queue is in resourceVersion order.
            match &*self.sink() {
                Sink::Memory => {
                    st.publish(events, &self.events);
                    let committed = st.committed;
                    self.durability.send_modify(|d| d.committed = committed);
                }
                Sink::Disk(tx) => {
                    let _ = tx.send(Batch { ops: persist, events });
                }
                Sink::Closed => {
                    let (first, last) = (events[0].rv, events[events.len() - 1].rv);
                    self.durability
                        .send_modify(|d| d.record_loss(first - 1, last, "the server is shutting down"));
                }
            }
        }
        drop(st);
        if garbage_possible {
            self.gc.notify_one();
        }
        result
    }

    /// Called by the persistence task once `batches` are on disk.
    pub fn committed(&self, batches: Vec<Batch>) {
        let mut st = self.lock();
        for batch in batches {
            st.publish(batch.events, &self.events);
        }
        let committed = st.committed;
        self.durability.send_modify(|d| d.committed = committed);
    }

    /// Called by the persistence task when a commit failed: memory goes
    /// back to what storage holds (`rv`, `objects`), and every change
    /// applied since the last commit, queued or not, is lost.
    pub fn roll_back(
        &self,
        rv: u64,
        objects: Vec<(String, Value)>,
        queue: &mut mpsc::UnboundedReceiver<Batch>,
        message: &str,
    ) {
        let mut st = self.lock();
        // Writers queue under the state lock: nothing joins while we drain.
        while queue.try_recv().is_ok() {}
        let (after, upto) = (st.committed, st.issued);
        st.replace(rv, objects);
        st.rollbacks += 1;
        self.durability
            .send_modify(|d| d.record_loss(after, upto, message));
    }

    /// Where the store stands, taken before a request looks at it.
    pub fn generation(&self) -> Generation {
        Generation(self.lock().rollbacks)
    }

    /// Waits until every change a request that started at `since` could
    /// have seen is committed; an error when one of them was lost (memory
    /// was rolled back since), or when storage takes longer than
    /// [`COMMIT_WAIT`].
    pub async fn settle(&self, since: Generation) -> Result<(), NotStored> {
        let target = {
            let st = self.lock();
            if st.rollbacks != since.0 {
                return Err(NotStored(
                    "storage failed a commit while the request was served".into(),
                ));
            }
            st.rv
        };
        self.settled(target).await
    }

    /// Waits until the change at `rv` (and all before it) is committed.
    pub async fn settled(&self, rv: u64) -> Result<(), NotStored> {
        let mut rx = self.durability.subscribe();
        let wait = async {
            loop {
                if let Some(outcome) = rx.borrow_and_update().outcome(rv) {
                    return outcome.map_err(NotStored);
                }
                // The sender lives as long as the store; it is never dropped here.
                if rx.changed().await.is_err() {
                    return Err(NotStored("storage closed".into()));
                }
            }
        };
        tokio::time::timeout(COMMIT_WAIT, wait)
            .await
            .unwrap_or_else(|_| Err(NotStored("storage did not commit within 60 s".into())))
    }

    /// Subscribes to live events; under the lock, so `snapshot` and the
    /// subscription meet without a gap.
    pub fn subscribe<R>(&self, snapshot: impl FnOnce(&State) -> R) -> (R, broadcast::Receiver<Arc<Event>>) {
        let st = self.lock();
        let rx = self.events.subscribe();
        (snapshot(&st), rx)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    fn put(store: &Store, name: &str) {
        store
            .write(|txn| {
                txn.put(
                    "configmaps",
                    json!({"metadata": {"name": name, "namespace": "default", "uid": name}}),
                );
                Ok::<_, ()>(())
            })
            .unwrap();
    }

    fn rv_of(store: &Store, name: &str) -> Option<String> {
        store.read(|s| s.get("configmaps", "default", name)).map(|o| {
            o["metadata"]["resourceVersion"]
                .as_str()
                .unwrap_or_default()
                .to_string()
        })
    }

    #[tokio::test]
    async fn a_rolled_back_change_fails_what_saw_it_and_its_version_is_never_reissued() {
        let store = Store::new(100);
        let (tx, mut rx) = mpsc::unbounded_channel();
        store.set_persist(Some(tx));
        let mut events = store.subscribe(|_| ()).1;

        put(&store, "kept");
        assert!(events.try_recv().is_err(), "published before it was committed");
        store.committed(vec![rx.try_recv().unwrap()]);
        assert_eq!(events.try_recv().unwrap().rv, 1);
        store.settle(store.generation()).await.unwrap();

        let seen = store.generation();
        put(&store, "lost");
        put(&store, "lost-too");
        // The commit failed; the file holds only "kept".
        let kept = (*store.read(|s| s.get("configmaps", "default", "kept")).unwrap()).clone();
        store.roll_back(1, vec![("configmaps".into(), kept)], &mut rx, "disk full");
        assert!(rx.try_recv().is_err(), "the queue was drained");
        assert_eq!(rv_of(&store, "lost"), None);
        assert!(events.try_recv().is_err(), "a lost change reached a watcher");
        assert!(
            store.settle(seen).await.is_err(),
            "a request that saw lost changes succeeded"
        );
        assert!(store.settled(2).await.unwrap_err().0.contains("disk full"));
        assert_eq!(store.read(|s| s.rv), 1, "lists answer the version that stands");

        // Requests after the rollback are served; versions move on.
        store.settle(store.generation()).await.unwrap();
        put(&store, "next");
        assert_eq!(rv_of(&store, "next").as_deref(), Some("4"));
        store.committed(vec![rx.try_recv().unwrap()]);
        store.settled(4).await.unwrap();
        assert!(store.settled(3).await.is_err(), "a lost version counts as stored");
    }

    #[tokio::test]
    async fn after_shutdown_writes_fail_instead_of_waiting_and_memory_mode_is_unchanged() {
        let store = Store::new(100);
        let (tx, _rx) = mpsc::unbounded_channel();
        store.set_persist(Some(tx));
        store.set_persist(None);
        put(&store, "late");
        assert!(store.settle(store.generation()).await.is_err());

        let memory = Store::new(100);
        memory.set_persist(None);
        put(&memory, "fine");
        memory.settle(memory.generation()).await.unwrap();
    }

    #[test]
    fn lost_ranges_merge_and_evicted_ones_stay_lost() {
        let mut d = Durability::default();
        d.record_loss(5, 10, "a");
        d.record_loss(5, 12, "b");
        assert_eq!(d.lost.len(), 1);
        d.committed = 13;
        assert!(matches!(d.outcome(11), Some(Err(_))));
        assert!(matches!(d.outcome(13), Some(Ok(()))));
        assert_eq!(d.outcome(14), None);
        let mut d = Durability::default();
        for i in 0..(LOST_KEPT as u64 + 10) {
            d.record_loss(2 * i, 2 * i + 1, "full");
        }
        d.committed = 10_000;
        assert_eq!(d.lost.len(), LOST_KEPT);
        assert!(
            matches!(d.outcome(1), Some(Err(_))),
            "an evicted loss must not count as stored"
        );
        assert!(matches!(d.outcome(9_999), Some(Ok(()))));
    }
}
