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

use crate::resources::Registry;

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
    pub object: Arc<Value>,
    /// The object before the change, so that a watcher with a selector can
    /// tell an object leaving its selection from one being modified in it.
    pub prev: Option<Arc<Value>>,
    /// The object serialized once, shared by every watcher that sends it as is.
    pub encoded: std::sync::OnceLock<Arc<[u8]>>,
}

impl Event {
    pub fn encoded(&self) -> &[u8] {
        self.encoded
            .get_or_init(|| serde_json::to_vec(&*self.object).unwrap_or_default().into())
    }
}

/// What the persistence task is told to do, in commit order.
#[derive(Debug)]
pub enum PersistOp {
    Put { key: String, value: Arc<[u8]>, rv: u64 },
    Delete { key: String, rv: u64 },
}

pub fn storage_key(gr: &str, ns: &str, name: &str) -> String {
    format!("{gr}/{ns}/{name}")
}

type Objects = BTreeMap<(String, String), Arc<Value>>;

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
}

const LOST_KEPT: usize = 256;

impl Durability {
    /// Whether the change at `rv` is stored (`Some(Ok)`), was rolled back
    /// (`Some(Err)`), or is still on its way (`None`).
    fn outcome(&self, rv: u64) -> Option<Result<(), Arc<str>>> {
        if let Some(lost) = self.lost.iter().find(|l| l.after < rv && rv <= l.upto) {
            return Some(Err(lost.message.clone()));
        }
        if rv <= self.committed {
            return Some(Ok(()));
        }
        // Older than every range still kept: cannot tell, so not stored.
        if self.lost.len() == LOST_KEPT && self.lost.front().is_some_and(|l| rv <= l.after) {
            return Some(Err("storage failed repeatedly".into()));
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
                    self.lost.pop_front();
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
    /// Shut down: changes are applied and never committed.
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
    pub fn get(&self, gr: &str, ns: &str, name: &str) -> Option<Arc<Value>> {
        self.objects
            .get(gr)?
            .get(&(ns.to_string(), name.to_string()))
            .cloned()
    }

    /// Objects of a group-resource in key order, optionally in one namespace.
    pub fn list<'a>(
        &'a self,
        gr: &str,
        ns: Option<&'a str>,
    ) -> impl Iterator<Item = (&'a (String, String), &'a Arc<Value>)> + 'a {
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
            if gr == crate::crd::STORED_RESOURCE {
                crate::crd::serve(&mut self.registry, &obj);
            }
            self.objects
                .entry(gr)
                .or_default()
                .insert((ns, name), Arc::new(obj));
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
    pub deleted_something: bool,
}

impl Txn<'_> {
    fn next_rv(&mut self) -> u64 {
        self.state.issued += 1;
        self.state.rv = self.state.issued;
        self.state.rv
    }

    /// Stores `obj` with a new resourceVersion and returns the stored copy.
    pub fn put(&mut self, gr: &str, mut obj: Value) -> Arc<Value> {
        let rv = self.next_rv();
        obj["metadata"]["resourceVersion"] = Value::String(rv.to_string());
        let ns = obj["metadata"]["namespace"]
            .as_str()
            .unwrap_or_default()
            .to_string();
        let name = obj["metadata"]["name"].as_str().unwrap_or_default().to_string();
        let uid = obj["metadata"]["uid"].as_str().unwrap_or_default().to_string();
        // Serialized once: for storage and for every watcher.
        let value: Arc<[u8]> = serde_json::to_vec(&obj).unwrap_or_default().into();
        let obj = Arc::new(obj);
        let prev = self
            .state
            .objects
            .entry(gr.to_string())
            .or_default()
            .insert((ns.clone(), name.clone()), obj.clone());
        self.state
            .uids
            .insert(uid, (gr.to_string(), ns.clone(), name.clone()));
        self.persist.push(PersistOp::Put {
            key: storage_key(gr, &ns, &name),
            value: value.clone(),
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
            object: obj.clone(),
            prev,
            encoded: std::sync::OnceLock::from(value),
        }));
        obj
    }

    /// Removes an object; the DELETED event carries it with the deletion's resourceVersion.
    pub fn remove(&mut self, gr: &str, ns: &str, name: &str) -> Option<Arc<Value>> {
        let old = self
            .state
            .objects
            .get_mut(gr)?
            .remove(&(ns.to_string(), name.to_string()))?;
        let rv = self.next_rv();
        if let Some(uid) = old["metadata"]["uid"].as_str() {
            self.state.uids.remove(uid);
        }
        let mut last = (*old).clone();
        last["metadata"]["resourceVersion"] = Value::String(rv.to_string());
        let last = Arc::new(last);
        self.persist.push(PersistOp::Delete {
            key: storage_key(gr, ns, name),
            rv,
        });
        self.events.push(Arc::new(Event {
            rv,
            gr: gr.to_string(),
            ns: ns.to_string(),
            type_: EventType::Deleted,
            object: last.clone(),
            prev: Some(old),
            encoded: Default::default(),
        }));
        self.deleted_something = true;
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

/// A request saw a change that storage then lost.
#[derive(Debug, Clone, thiserror::Error)]
#[error("storage failed to commit a change this request depends on: {0}")]
pub struct NotStored(pub Arc<str>);

impl Store {
    pub fn new(history_limit: usize) -> Self {
        let (events, _) = broadcast::channel(16 * 1024);
        Store {
            state: Mutex::new(State {
                rv: 0,
                issued: 0,
                committed: 0,
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
        *self.sink() = match tx {
            Some(tx) => Sink::Disk(tx),
            None => Sink::Closed,
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
            deleted_something: false,
        };
        let result = f(&mut txn);
        let Txn {
            events,
            persist,
            deleted_something,
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
                Sink::Closed => {}
            }
        }
        drop(st);
        if deleted_something {
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
        self.durability
            .send_modify(|d| d.record_loss(after, upto, message));
    }

    /// Waits until every change this request could have seen is committed;
    /// an error when one of them was lost.
    pub async fn settle(&self) -> Result<(), NotStored> {
        let target = self.lock().rv;
        self.settled(target).await
    }

    /// Waits until the change at `rv` (and all before it) is committed.
    pub async fn settled(&self, rv: u64) -> Result<(), NotStored> {
        let mut rx = self.durability.subscribe();
        loop {
            if let Some(outcome) = rx.borrow_and_update().outcome(rv) {
                return outcome.map_err(NotStored);
            }
            // The sender lives as long as the store; it is never dropped here.
            if rx.changed().await.is_err() {
                return Err(NotStored("storage closed".into()));
            }
        }
    }

    /// Subscribes to live events; under the lock, so `snapshot` and the
    /// subscription meet without a gap.
    pub fn subscribe<R>(&self, snapshot: impl FnOnce(&State) -> R) -> (R, broadcast::Receiver<Arc<Event>>) {
        let st = self.lock();
        let rx = self.events.subscribe();
        (snapshot(&st), rx)
    }
}
