//! Kubernetes Events (`events.k8s.io/v1`) whose series carry what they say.
//!
//! kube-runtime's `Recorder` folds every Event with the same reason about
//! the same object into one series and keeps the first note: `Scheduled
//! (x2) attempt 1 assigned to robot a` although attempt 2 went to robot b.
//! This recorder counts a repeat only when the note is the same too, so
//! Events that say different things stay different Events, and an Event
//! that repeats word for word becomes a series (as `kubectl describe` shows
//! `(x3)`) instead of one object per repeat.

use std::collections::HashMap;
use std::sync::Mutex;

use k8s_openapi::api::core::v1::ObjectReference;
use k8s_openapi::api::events::v1::{Event as K8sEvent, EventSeries};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::{MicroTime, ObjectMeta};
use k8s_openapi::jiff::{SignedDuration, Timestamp};
use kube::api::{Api, Patch, PatchParams, PostParams};
use kube::runtime::events::{Event, EventType, Reporter};
use kube::Client;

use crate::lock;

/// The budget of routine (Normal) Events a program may write: at scale a
/// Scheduled or Dispatched per attempt would be an API write per task, as
/// kubelet's `--event-qps` limits its own. Warnings always pass.
pub struct RoutineBudget {
    /// `None`: no limit.
    limiter: Option<governor::DefaultDirectRateLimiter>,
    /// No routine Event is written at all.
    off: bool,
}

impl RoutineBudget {
    /// Routine Events at `qps` per second with bursts of `burst` (`qps` 0:
    /// no limit; `burst` 0: `qps`).
    pub fn new(qps: u32, burst: u32) -> Self {
        use std::num::NonZeroU32;
        let limiter = NonZeroU32::new(qps).map(|qps| {
            let burst = NonZeroU32::new(burst).unwrap_or(qps);
            governor::RateLimiter::direct(governor::Quota::per_second(qps).allow_burst(burst))
        });
        Self { limiter, off: false }
    }

    /// The budget a program's flags ask for: routine Events at `qps` with
    /// bursts of `burst` (as [`RoutineBudget::new`]), or none at all when
    /// `routine` is false (`--routine-events=false`: only Warnings are
    /// written, which at a steady stream of short tasks halves the API
    /// writes per task; docs/contract.md, "What a task costs").
    pub fn configured(routine: bool, qps: u32, burst: u32) -> Self {
        if routine {
            Self::new(qps, burst)
        } else {
            Self {
                limiter: None,
                off: true,
            }
        }
    }

    /// Whether routine Events are off altogether (not written, and not
    /// dropped either: nothing was over a budget).
    pub fn is_off(&self) -> bool {
        self.off
    }

    /// Whether an Event of `type_` may be written now (taking its place in
    /// the budget).
    pub fn admits(&self, type_: EventType) -> bool {
        type_ == EventType::Warning || (!self.off && self.limiter.as_ref().is_none_or(|l| l.check().is_ok()))
    }
}

/// How long a published Event can still grow a series; past it, a repeat
/// is a new Event (as client-go forgets isomorphic Events after a while).
const SERIES_WINDOW: SignedDuration = SignedDuration::from_mins(6);

/// What makes two Events the same one repeated.
#[derive(Clone, Debug, PartialEq, Eq, Hash)]
struct Key {
    type_: &'static str,
    reason: String,
    action: String,
    note: Option<String>,
    regarding: (Option<String>, Option<String>, Option<String>, Option<String>),
}

impl Key {
    fn of(event: &Event, regarding: &ObjectReference) -> Self {
        Key {
            type_: type_name(event.type_),
            reason: event.reason.clone(),
            action: event.action.clone(),
            note: event.note.clone(),
            regarding: (
                regarding.kind.clone(),
                regarding.namespace.clone(),
                regarding.name.clone(),
                regarding.uid.clone(),
            ),
        }
    }
}

fn type_name(type_: EventType) -> &'static str {
    match type_ {
        EventType::Normal => "Normal",
        EventType::Warning => "Warning",
    }
}

/// The Events published recently, by what they say: the pure half of
/// [`Recorder`].
#[derive(Debug, Default)]
struct Series {
    recent: HashMap<Key, K8sEvent>,
}

impl Series {
    /// The Event to write for `event` at `now`: a new one (`series` unset,
    /// to create) or the repeat of a recent one (`series` set, to patch).
    fn next(
        &mut self,
        reporter: &Reporter,
        event: &Event,
        regarding: &ObjectReference,
        now: Timestamp,
    ) -> K8sEvent {
        self.recent
            .retain(|_, e| last_seen(e).is_some_and(|t| t + SERIES_WINDOW > now));
        let key = Key::of(event, regarding);
        match self.recent.get(&key) {
            Some(earlier) => {
                let mut repeat = earlier.clone();
                let count = earlier.series.as_ref().map_or(2, |s| s.count + 1);
                repeat.series = Some(EventSeries {
                    count,
                    last_observed_time: MicroTime(now),
                });
                repeat
            }
            None => fresh(reporter, event, regarding, now),
        }
    }

    /// Remembers `written`, once the API server took it.
    fn written(&mut self, event: &Event, regarding: &ObjectReference, written: K8sEvent) {
        self.recent.insert(Key::of(event, regarding), written);
    }
}

fn last_seen(event: &K8sEvent) -> Option<Timestamp> {
    match &event.series {
        Some(series) => Some(series.last_observed_time.0),
        None => event.event_time.as_ref().map(|t| t.0),
    }
}

fn fresh(reporter: &Reporter, event: &Event, regarding: &ObjectReference, now: Timestamp) -> K8sEvent {
    let name = regarding.name.as_deref().unwrap_or(&reporter.controller);
    K8sEvent {
        metadata: ObjectMeta {
            namespace: regarding.namespace.clone(),
            name: Some(format!("{name}.{:x}", now.as_nanosecond())),
            ..ObjectMeta::default()
        },
        action: Some(event.action.clone()),
        reason: Some(event.reason.clone()),
        note: event.note.clone(),
        type_: Some(type_name(event.type_).to_owned()),
        event_time: Some(MicroTime(now)),
        regarding: Some(regarding.clone()),
        related: event.secondary.clone(),
        reporting_controller: Some(reporter.controller.clone()),
        reporting_instance: Some(
            reporter
                .instance
                .clone()
                .unwrap_or_else(|| reporter.controller.clone()),
        ),
        ..K8sEvent::default()
    }
}

/// Publishes Events for one reporting controller.
pub struct Recorder {
    client: Client,
    reporter: Reporter,
    series: Mutex<Series>,
}

impl Recorder {
    /// A recorder that signs its Events as `reporter`.
    pub fn new(client: Client, reporter: Reporter) -> Self {
        Recorder {
            client,
            reporter,
            series: Mutex::default(),
        }
    }

    /// Creates `event` about `regarding`, or adds one to the count of the
    /// same Event published in the last minutes.
    pub async fn publish(&self, event: &Event, regarding: &ObjectReference) -> kube::Result<()> {
        // Not held across the call: a slow API server must not queue every
        // other Event behind this one (two identical Events at once may
        // then make two objects, which is harmless).
        let next = lock(&self.series).next(&self.reporter, event, regarding, Timestamp::now());
        let namespace = regarding.namespace.as_deref().unwrap_or("default");
        let events: Api<K8sEvent> = Api::namespaced(self.client.clone(), namespace);
        let name = next.metadata.name.clone().unwrap_or_default();
        if next.series.is_some() {
            events
                .patch(&name, &PatchParams::default(), &Patch::Merge(&next))
                .await?;
        } else {
            events.create(&PostParams::default(), &next).await?;
        }
        lock(&self.series).written(event, regarding, next);
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn routine_events_are_budgeted_and_warnings_are_not() {
        let budget = RoutineBudget::new(1, 3);
        let admitted = (0..10).filter(|_| budget.admits(EventType::Normal)).count();
        assert_eq!(admitted, 3, "the burst, then nothing within the second");
        assert!(budget.admits(EventType::Warning));
        let unlimited = RoutineBudget::new(0, 0);
        assert!((0..1000).all(|_| unlimited.admits(EventType::Normal)));
        let off = RoutineBudget::configured(false, 0, 0);
        assert!(!off.admits(EventType::Normal), "no routine Event at all");
        assert!(off.admits(EventType::Warning), "warnings still pass");
        assert!(RoutineBudget::configured(true, 0, 0).admits(EventType::Normal));
    }

    fn reporter() -> Reporter {
        Reporter {
            controller: "k8s4r-manager".into(),
            instance: None,
        }
    }

    fn task() -> ObjectReference {
        ObjectReference {
            kind: Some("Task".into()),
            namespace: Some("ns".into()),
            name: Some("t".into()),
            uid: Some("u".into()),
            ..ObjectReference::default()
        }
    }

    fn scheduled(note: &str) -> Event {
        Event {
            type_: EventType::Normal,
            reason: "Scheduled".into(),
            note: Some(note.into()),
            action: "Scheduled".into(),
            secondary: None,
        }
    }

    fn publish(series: &mut Series, event: &Event, at: Timestamp) -> K8sEvent {
        let next = series.next(&reporter(), event, &task(), at);
        series.written(event, &task(), next.clone());
        next
    }

    #[test]
    fn events_that_say_different_things_are_different_events() {
        let mut series = Series::default();
        let t0 = Timestamp::UNIX_EPOCH + SignedDuration::from_hours(24);
        let first = publish(&mut series, &scheduled("attempt 1 assigned to robot a"), t0);
        let second = publish(
            &mut series,
            &scheduled("attempt 2 assigned to robot b"),
            t0 + SignedDuration::from_secs(1),
        );
        assert!(first.series.is_none() && second.series.is_none());
        assert_ne!(first.metadata.name, second.metadata.name);
        assert_eq!(second.note.as_deref(), Some("attempt 2 assigned to robot b"));
    }

    #[test]
    fn the_same_event_repeated_is_a_series_until_it_is_old() {
        let mut series = Series::default();
        let t0 = Timestamp::UNIX_EPOCH + SignedDuration::from_hours(24);
        let waiting = scheduled("no robot matches");
        let first = publish(&mut series, &waiting, t0);
        let second = publish(&mut series, &waiting, t0 + SignedDuration::from_secs(10));
        let third = publish(&mut series, &waiting, t0 + SignedDuration::from_secs(20));
        assert_eq!(second.metadata.name, first.metadata.name);
        assert_eq!(third.series.as_ref().map(|s| s.count), Some(3));
        let later = publish(&mut series, &waiting, t0 + SignedDuration::from_mins(30));
        assert!(later.series.is_none());
        assert_ne!(later.metadata.name, first.metadata.name);
    }
}
