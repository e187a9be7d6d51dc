//! The object store: every object in memory, one global resourceVersion
//! counter, a bounded history of events for watch resumption, a broadcast
//! channel for live watchers, and write-through to the persistence task.

use std::collections::{BTreeMap, HashMap, VecDeque};
use std::sync::{Arc, Mutex, MutexGuard};

use serde_json::Value;
use tokio::sync::{broadcast, mpsc, Notify};

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

pub struct State {
    pub rv: u64,
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
        self.state.rv += 1;
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
    persist: Mutex<Option<mpsc::UnboundedSender<PersistOp>>>,
    /// Woken after deletions so the garbage collector looks for orphans.
    pub gc: Notify,
}

impl Store {
    pub fn new(history_limit: usize) -> Self {
        let (events, _) = broadcast::channel(16 * 1024);
        Store {
            state: Mutex::new(State {
                rv: 0,
                objects: HashMap::new(),
                uids: HashMap::new(),
                history: VecDeque::new(),
                oldest: 0,
                history_limit: history_limit.max(1),
                registry: Registry::with_builtins(),
            }),
            events,
            persist: Mutex::new(None),
            gc: Notify::new(),
        }
    }

    fn lock(&self) -> MutexGuard<'_, State> {
        // A panic while holding the lock leaves plain data behind; keep serving.
        self.state.lock().unwrap_or_else(|e| e.into_inner())
    }

    pub fn set_persist(&self, tx: Option<mpsc::UnboundedSender<PersistOp>>) {
        *self.persist.lock().unwrap_or_else(|e| e.into_inner()) = tx;
    }

    /// Loads objects read from storage (no events; watches resume from `rv` on).
    pub fn load(&self, rv: u64, objects: Vec<(String, Value)>) {
        let mut st = self.lock();
        for (gr, obj) in objects {
            let ns = obj["metadata"]["namespace"]
                .as_str()
                .unwrap_or_default()
                .to_string();
            let name = obj["metadata"]["name"].as_str().unwrap_or_default().to_string();
            if let Some(uid) = obj["metadata"]["uid"].as_str() {
                st.uids
                    .insert(uid.to_string(), (gr.clone(), ns.clone(), name.clone()));
            }
            st.objects
                .entry(gr)
                .or_default()
                .insert((ns, name), Arc::new(obj));
        }
        st.rv = st.rv.max(rv);
        st.oldest = st.rv;
    }

    pub fn read<R>(&self, f: impl FnOnce(&State) -> R) -> R {
        f(&self.lock())
    }

    /// Runs `f` as one atomic write; on success its events are published in order.
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
        // itself), so their events must still go out.
        if !persist.is_empty() {
            if let Some(tx) = self.persist.lock().unwrap_or_else(|e| e.into_inner()).as_ref() {
                for op in persist {
                    let _ = tx.send(op);
                }
            }
        }
        for ev in events {
            st.history.push_back(ev.clone());
            while st.history.len() > st.history_limit {
                if let Some(old) = st.history.pop_front() {
                    st.oldest = old.rv;
                }
            }
            // No receivers is fine: nobody is watching.
            let _ = self.events.send(ev);
        }
        drop(st);
        if deleted_something {
            self.gc.notify_one();
        }
        result
    }

    /// Subscribes to live events; under the lock, so `snapshot` and the
    /// subscription meet without a gap.
    pub fn subscribe<R>(&self, snapshot: impl FnOnce(&State) -> R) -> (R, broadcast::Receiver<Arc<Event>>) {
        let st = self.lock();
        let rx = self.events.subscribe();
        (snapshot(&st), rx)
    }
}
