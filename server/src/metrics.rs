//! What `/metrics` shows, on `prometheus-client` (families defined in
//! [`k8s4r_service::metrics`] where the manager shares them).

use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::time::Duration;

use k8s4r_service::health::Health;
use k8s4r_service::metrics::{self, ApiMetrics, Registry};
use prometheus_client::encoding::EncodeLabelSet;
use prometheus_client::metrics::counter::Counter;
use prometheus_client::metrics::family::Family;
use prometheus_client::metrics::gauge::Gauge;
use prometheus_client::metrics::histogram::Histogram;

/// Labels of an MQTT message: its topic kind and what became of it.
#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct TopicOutcome {
    topic: String,
    outcome: String,
}

/// Everything `/metrics` shows. Cheap to share behind an `Arc`.
#[derive(Debug)]
pub struct Metrics {
    registry: Registry,
    messages_in: Family<TopicOutcome, Counter>,
    messages_out: Family<TopicOutcome, Counter>,
    api: ApiMetrics,
    dispatch_latency: Histogram,
    dispatch_wait: Histogram,
    mqtt_connected: Gauge,
    mqtt_connections: Counter,
    kube_synced: Gauge,
    events_dropped: Counter,
    // Readiness is read far more often than it changes; the gauges above
    // are what Prometheus sees.
    /// Broker connections up.
    connected: AtomicUsize,
    mqtt_brokers: Gauge,
    synced: AtomicBool,
}

impl Default for Metrics {
    fn default() -> Self {
        let mut registry = Registry::with_prefix("k8s4r_server");
        let messages_in = Family::default();
        let messages_out = Family::default();
        let dispatch_latency = metrics::latency();
        let dispatch_wait = metrics::latency();
        let mqtt_connected = Gauge::default();
        let mqtt_brokers = Gauge::default();
        let mqtt_connections = Counter::default();
        let kube_synced = Gauge::default();
        let events_dropped = Counter::default();
        registry.register(
            "messages_received",
            "MQTT messages received, by topic kind and outcome.",
            messages_in.clone(),
        );
        registry.register(
            "messages_published",
            "MQTT messages published, by topic kind and outcome.",
            messages_out.clone(),
        );
        let api = ApiMetrics::register(&mut registry);
        registry.register(
            "dispatch_duration_seconds",
            "From a Task seen dispatching to the broker's PUBACK.",
            dispatch_latency.clone(),
        );
        registry.register(
            "dispatch_wait_seconds",
            "From a Task's dispatchTime (the manager's choice of robot) to this server recording that it sends it: how far behind its Task watch it is.",
            dispatch_wait.clone(),
        );
        registry.register(
            "mqtt_connected",
            "Broker connections up (1 or 0 with one broker).",
            mqtt_connected.clone(),
        );
        registry.register(
            "mqtt_brokers",
            "Brokers the server connects to (--broker-url).",
            mqtt_brokers.clone(),
        );
        registry.register(
            "mqtt_connections",
            "Connections the broker accepted (reconnects included).",
            mqtt_connections.clone(),
        );
        registry.register(
            "kube_synced",
            "Whether the Robot and Task caches are filled.",
            kube_synced.clone(),
        );
        registry.register(
            "events_dropped",
            "Routine (Normal) Events not recorded: over --event-qps.",
            events_dropped.clone(),
        );
        Self {
            registry,
            events_dropped,
            messages_in,
            messages_out,
            api,
            dispatch_latency,
            dispatch_wait,
            mqtt_connected,
            mqtt_connections,
            kube_synced,
            connected: AtomicUsize::new(0),
            mqtt_brokers,
            synced: AtomicBool::new(false),
        }
    }
}

fn labels(topic: &str, outcome: &str) -> TopicOutcome {
    TopicOutcome {
        topic: topic.to_owned(),
        outcome: outcome.to_owned(),
    }
}

impl Metrics {
    /// One message received on `kind` (register, heartbeat, status, online,
    /// unknown) with its outcome (applied, coalesced, stale, rejected_..).
    pub fn message_in(&self, kind: &str, outcome: &str) {
        self.add_messages_in(kind, outcome, 1);
    }

    /// `count` messages received on `kind` with the same outcome.
    pub fn add_messages_in(&self, kind: &str, outcome: &str, count: u64) {
        self.messages_in
            .get_or_create(&labels(kind, outcome))
            .inc_by(count);
    }

    /// One message published on `kind` (dispatch, cancel, response) with
    /// its outcome (acked, failed).
    pub fn message_out(&self, kind: &str, outcome: &str) {
        self.messages_out.get_or_create(&labels(kind, outcome)).inc();
    }

    /// One routine Event not recorded: over the budget.
    pub fn event_dropped(&self) {
        self.events_dropped.inc();
    }

    /// The API writes and their latency, for the server's [`k8s4r_service::Kube`].
    pub fn api(&self) -> ApiMetrics {
        self.api.clone()
    }

    /// Time from seeing a Task dispatching to the broker's PUBACK.
    pub fn dispatch_latency(&self, took: Duration) {
        metrics::observe(&self.dispatch_latency, took);
    }

    /// Time from a Task's dispatchTime to this server finding it to send.
    pub fn dispatch_wait(&self, waited: Duration) {
        metrics::observe(&self.dispatch_wait, waited);
    }

    /// The count of API writes of `verb` with `outcome` so far.
    pub fn api_writes(&self, verb: &str, outcome: &str) -> u64 {
        self.api.count(verb, outcome)
    }

    /// The count of messages in on `kind` with `outcome` so far.
    pub fn messages_in(&self, kind: &str, outcome: &str) -> u64 {
        self.messages_in
            .get(&labels(kind, outcome))
            .map_or(0, |c| c.get())
    }

    /// The count of messages out on `kind` with `outcome` so far.
    pub fn messages_out(&self, kind: &str, outcome: &str) -> u64 {
        self.messages_out
            .get(&labels(kind, outcome))
            .map_or(0, |c| c.get())
    }

    /// How many brokers the server connects to.
    pub fn set_mqtt_brokers(&self, brokers: usize) {
        self.mqtt_brokers.set(i64::try_from(brokers).unwrap_or(i64::MAX));
    }

    /// Records that one broker connection came up (`true`) or went down.
    pub fn mqtt_connected(&self, up: bool) {
        if up {
            self.connected.fetch_add(1, Ordering::Relaxed);
            self.mqtt_connected.inc();
        } else if self
            .connected
            .fetch_update(Ordering::Relaxed, Ordering::Relaxed, |n| n.checked_sub(1))
            .is_ok()
        {
            self.mqtt_connected.dec();
        }
    }

    /// Counts one accepted connection to the broker (CONNACK).
    pub fn mqtt_connection(&self) {
        self.mqtt_connections.inc();
    }

    /// Connections accepted by the broker so far; more than one means
    /// reconnects.
    pub fn mqtt_connections(&self) -> u64 {
        self.mqtt_connections.get()
    }

    /// Records that the Kubernetes caches have their first full list.
    pub fn set_kube_synced(&self, synced: bool) {
        self.synced.store(synced, Ordering::Relaxed);
        self.kube_synced.set(i64::from(synced));
    }

    /// Ready: connected to a broker (with several, one down holds up only
    /// its own robots: `mqtt_connected` below `mqtt_brokers` is what to
    /// alert on) and the caches are filled.
    pub fn ready(&self) -> bool {
        self.connected.load(Ordering::Relaxed) > 0 && self.synced.load(Ordering::Relaxed)
    }
}

impl Health for Metrics {
    fn registry(&self) -> &Registry {
        &self.registry
    }

    fn ready(&self) -> Result<(), &'static str> {
        if Metrics::ready(self) {
            Ok(())
        } else {
            Err("waiting for a broker connection or the first list of robots and tasks")
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn renders_prometheus_text() {
        let m = Metrics::default();
        m.message_in("status", "applied");
        m.message_in("status", "applied");
        m.message_in("register", "rejected_invalid_label");
        m.api().observe("lease", "ok", Duration::from_millis(3));
        m.dispatch_latency(Duration::from_millis(20));
        m.mqtt_connected(true);
        let text = m.render();
        assert!(
            text.contains("k8s4r_server_messages_received_total{topic=\"status\",outcome=\"applied\"} 2"),
            "{text}"
        );
        assert!(
            text.contains("k8s4r_server_api_write_duration_seconds_bucket{le=\"0.005\",write=\"lease\"} 1"),
            "{text}"
        );
        assert!(
            text.contains("k8s4r_server_dispatch_duration_seconds_count 1"),
            "{text}"
        );
        assert!(text.contains("k8s4r_server_mqtt_connected 1"), "{text}");
        assert_eq!(m.api_writes("lease", "ok"), 1);
        assert_eq!(m.messages_in("register", "rejected_invalid_label"), 1);
        assert!(!m.ready(), "connected but the caches are not filled");
        m.set_kube_synced(true);
        assert!(m.ready());
        m.set_mqtt_brokers(2);
        assert!(m.ready(), "one of two brokers connected: its robots are served");
        m.mqtt_connected(true);
        let text = m.render();
        assert!(text.contains("k8s4r_server_mqtt_connected 2"), "{text}");
        assert!(text.contains("k8s4r_server_mqtt_brokers 2"), "{text}");
        m.mqtt_connected(false);
        m.mqtt_connected(false);
        assert!(!m.ready(), "no broker connection");
        m.mqtt_connected(false);
        assert!(
            m.render().contains("k8s4r_server_mqtt_connected 0"),
            "never below none"
        );
    }
}
