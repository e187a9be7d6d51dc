//! Event expiry: a real API server deletes Events an hour (`--event-ttl`)
//! after they last happened, so that a long-running stack does not keep
//! every Event it ever recorded. The server runs [`expire_events`] now and
//! then.

use serde_json::Value;

use crate::event_conversion::STORED_RESOURCE;
use crate::object::Object;
use crate::store::{Store, Txn};

/// Deletes the Events last seen more than `ttl` before `now`; returns how
/// many it deleted. The Events are read from a snapshot outside the store
/// lock (parsing thousands under it would stall every write), and each
/// one found expired is checked again in the write.
pub fn expire_events(store: &Store, now: jiff::Timestamp, ttl: std::time::Duration) -> usize {
    let events: Vec<((String, String), Object)> = store.read(|s| {
        s.list(STORED_RESOURCE, None)
            .map(|(key, event)| (key.clone(), event.clone()))
            .collect()
    });
    let expired: Vec<(String, String)> = events
        .into_iter()
        .filter(|(_, event)| is_expired(event, now, ttl))
        .map(|(key, _)| key)
        .collect();
    if expired.is_empty() {
        return 0;
    }
    store
        .write(|txn| Ok::<_, ()>(remove_expired(txn, &expired, now, ttl)))
        .unwrap_or(0)
}

/// Deletes those of `keys` that are Events still expired at `now`.
fn remove_expired(
    txn: &mut Txn<'_>,
    keys: &[(String, String)],
    now: jiff::Timestamp,
    ttl: std::time::Duration,
) -> usize {
    let mut removed = 0;
    for (ns, name) in keys {
        let still = txn
            .state
            .get_object(STORED_RESOURCE, ns, name)
            .is_some_and(|event| is_expired(event, now, ttl));
        if still && txn.remove(STORED_RESOURCE, ns, name).is_some() {
            removed += 1;
        }
    }
    removed
}

fn is_expired(event: &Object, now: jiff::Timestamp, ttl: std::time::Duration) -> bool {
    let Ok(ttl) = jiff::SignedDuration::try_from(ttl) else {
        return false;
    };
    last_seen(&event.value()).is_some_and(|t| now.duration_since(t) > ttl)
}

/// When an Event (stored as events.k8s.io/v1) last happened: the latest of
/// its creation, its time, its series' last observation and its deprecated
/// last timestamp.
fn last_seen(event: &Value) -> Option<jiff::Timestamp> {
    [
        &event["metadata"]["creationTimestamp"],
        &event["eventTime"],
        &event["series"]["lastObservedTime"],
        &event["deprecatedLastTimestamp"],
    ]
    .into_iter()
    .filter_map(|t| t.as_str()?.parse::<jiff::Timestamp>().ok())
    .max()
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::store::Store;
    use serde_json::json;
    use std::time::Duration;

    fn event(name: &str, created: &str, extra: Value) -> Value {
        let mut e = json!({
            "apiVersion": "events.k8s.io/v1",
            "kind": "Event",
            "metadata": {"name": name, "namespace": "default", "creationTimestamp": created},
        });
        json_patch::merge(&mut e, &extra);
        e
    }

    #[test]
    fn events_expire_an_hour_after_they_last_happened() {
        let store = Store::new(100);
        store
            .write(|txn| {
                txn.put(STORED_RESOURCE, event("old", "2026-01-01T10:00:00Z", json!({})));
                txn.put(
                    STORED_RESOURCE,
                    event("recent", "2026-01-01T10:30:00Z", json!({})),
                );
                // Created long ago, but it happened again a minute ago.
                txn.put(
                    STORED_RESOURCE,
                    event(
                        "repeating",
                        "2026-01-01T09:00:00Z",
                        json!({"series": {"count": 9, "lastObservedTime": "2026-01-01T11:04:00.000000Z"}}),
                    ),
                );
                txn.put(
                    "configmaps",
                    event("not-an-event", "2026-01-01T00:00:00Z", json!({})),
                );
                Ok::<_, ()>(())
            })
            .unwrap();
        let now: jiff::Timestamp = "2026-01-01T11:05:00Z".parse().unwrap();
        let expired = expire_events(&store, now, Duration::from_secs(3600));
        assert_eq!(expired, 1);
        let left: Vec<String> = store.read(|s| {
            s.list(STORED_RESOURCE, None)
                .map(|((_, n), _)| n.clone())
                .collect()
        });
        assert_eq!(left, ["recent", "repeating"]);
        assert!(store.read(|s| s.get("configmaps", "default", "not-an-event").is_some()));
    }
}
