//! Counters and histograms in the Prometheus text format.
//!
//! A handful of series, so a mutex-guarded map is plenty; no metrics crate.

use std::collections::BTreeMap;
use std::fmt::Write;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::Mutex;
use std::time::Duration;

/// Upper bounds of the latency histograms, in seconds.
const BUCKETS: &[f64] = &[0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0];

#[derive(Debug, Default, Clone)]
struct Histogram {
    counts: Vec<u64>,
    sum: f64,
    count: u64,
}

impl Histogram {
    fn observe(&mut self, seconds: f64) {
        if self.counts.is_empty() {
            self.counts = vec![0; BUCKETS.len()];
        }
        for (i, bound) in BUCKETS.iter().enumerate() {
            if seconds <= *bound {
                self.counts[i] += 1;
            }
        }
        self.sum += seconds;
        self.count += 1;
    }
}

#[derive(Debug, Default)]
struct Inner {
    messages_in: BTreeMap<(String, String), u64>,
    messages_out: BTreeMap<(String, String), u64>,
    api_writes: BTreeMap<(String, String), u64>,
    api_latency: BTreeMap<String, Histogram>,
    dispatch_latency: Histogram,
}

/// Everything `/metrics` shows. Cheap to share behind an `Arc`.
#[derive(Debug, Default)]
pub struct Metrics {
    inner: Mutex<Inner>,
    mqtt_connected: AtomicBool,
    mqtt_connections: AtomicU64,
    kube_synced: AtomicBool,
}

fn bump(map: &mut BTreeMap<(String, String), u64>, a: &str, b: &str) {
    *map.entry((a.to_owned(), b.to_owned())).or_default() += 1;
}

impl Metrics {
    fn with<R>(&self, f: impl FnOnce(&mut Inner) -> R) -> R {
        // A panic while holding the lock leaves counters that are still
        // usable; keep counting rather than poisoning every later call.
        let mut guard = self.inner.lock().unwrap_or_else(|e| e.into_inner());
        f(&mut guard)
    }

    /// One message received on `kind` (register, heartbeat, status, online,
    /// unknown) with its outcome (applied, coalesced, stale, rejected_..).
    pub fn message_in(&self, kind: &str, outcome: &str) {
        self.with(|m| bump(&mut m.messages_in, kind, outcome));
    }

    /// One message published on `kind` (dispatch, cancel, response) with
    /// its outcome (acked, failed).
    pub fn message_out(&self, kind: &str, outcome: &str) {
        self.with(|m| bump(&mut m.messages_out, kind, outcome));
    }

    /// One API write (`verb` is e.g. `robot_status`, `lease`) and how it went.
    pub fn api_write(&self, verb: &str, outcome: &str, took: Duration) {
        self.with(|m| {
            bump(&mut m.api_writes, verb, outcome);
            m.api_latency
                .entry(verb.to_owned())
                .or_default()
                .observe(took.as_secs_f64());
        });
    }

    /// Time from seeing a Task dispatching to the broker's PUBACK.
    pub fn dispatch_latency(&self, took: Duration) {
        self.with(|m| m.dispatch_latency.observe(took.as_secs_f64()));
    }

    /// The count of API writes of `verb` with `outcome` so far.
    pub fn api_writes(&self, verb: &str, outcome: &str) -> u64 {
        self.with(|m| {
            m.api_writes
                .get(&(verb.to_owned(), outcome.to_owned()))
                .copied()
                .unwrap_or(0)
        })
    }

    /// The count of messages in on `kind` with `outcome` so far.
    pub fn messages_in(&self, kind: &str, outcome: &str) -> u64 {
        self.with(|m| {
            m.messages_in
                .get(&(kind.to_owned(), outcome.to_owned()))
                .copied()
                .unwrap_or(0)
        })
    }

    /// The count of messages out on `kind` with `outcome` so far.
    pub fn messages_out(&self, kind: &str, outcome: &str) -> u64 {
        self.with(|m| {
            m.messages_out
                .get(&(kind.to_owned(), outcome.to_owned()))
                .copied()
                .unwrap_or(0)
        })
    }

    /// Records whether the broker connection is up.
    pub fn set_mqtt_connected(&self, up: bool) {
        self.mqtt_connected.store(up, Ordering::Relaxed);
    }

    /// Counts one accepted connection to the broker (CONNACK).
    pub fn mqtt_connection(&self) {
        self.mqtt_connections.fetch_add(1, Ordering::Relaxed);
    }

    /// Connections accepted by the broker so far; more than one means
    /// reconnects.
    pub fn mqtt_connections(&self) -> u64 {
        self.mqtt_connections.load(Ordering::Relaxed)
    }

    /// Records that the Kubernetes caches have their first full list.
    pub fn set_kube_synced(&self, synced: bool) {
        self.kube_synced.store(synced, Ordering::Relaxed);
    }

    /// Ready: connected to the broker and the caches are filled.
    pub fn ready(&self) -> bool {
        self.mqtt_connected.load(Ordering::Relaxed) && self.kube_synced.load(Ordering::Relaxed)
    }

    /// The Prometheus text exposition.
    pub fn render(&self) -> String {
        let mut out = String::new();
        let up = |b: &AtomicBool| u8::from(b.load(Ordering::Relaxed));
        let _ = writeln!(
            out,
            "# HELP k8s4r_server_mqtt_connected Whether the broker connection is up.\n\
             # TYPE k8s4r_server_mqtt_connected gauge\n\
             k8s4r_server_mqtt_connected {}",
            up(&self.mqtt_connected)
        );
        let _ = writeln!(
            out,
            "# HELP k8s4r_server_mqtt_connections_total Connections the broker accepted (reconnects included).\n\
             # TYPE k8s4r_server_mqtt_connections_total counter\n\
             k8s4r_server_mqtt_connections_total {}",
            self.mqtt_connections.load(Ordering::Relaxed)
        );
        let _ = writeln!(
            out,
            "# HELP k8s4r_server_kube_synced Whether the Robot and Task caches are filled.\n\
             # TYPE k8s4r_server_kube_synced gauge\n\
             k8s4r_server_kube_synced {}",
            up(&self.kube_synced)
        );
        self.with(|m| {
            counter(
                &mut out,
                "k8s4r_server_messages_received_total",
                "MQTT messages received, by topic kind and outcome.",
                ("topic", "outcome"),
                &m.messages_in,
            );
            counter(
                &mut out,
                "k8s4r_server_messages_published_total",
                "MQTT messages published, by topic kind and outcome.",
                ("topic", "outcome"),
                &m.messages_out,
            );
            counter(
                &mut out,
                "k8s4r_server_api_writes_total",
                "Kubernetes API writes, by kind of write and outcome.",
                ("write", "outcome"),
                &m.api_writes,
            );
            let _ = writeln!(
                out,
                "# HELP k8s4r_server_api_write_duration_seconds Latency of Kubernetes API writes.\n\
                 # TYPE k8s4r_server_api_write_duration_seconds histogram"
            );
            for (verb, h) in &m.api_latency {
                histogram(
                    &mut out,
                    "k8s4r_server_api_write_duration_seconds",
                    &format!("write=\"{verb}\""),
                    h,
                );
            }
            let _ = writeln!(
                out,
                "# HELP k8s4r_server_dispatch_duration_seconds From a Task seen dispatching to the broker's PUBACK.\n\
                 # TYPE k8s4r_server_dispatch_duration_seconds histogram"
            );
            histogram(
                &mut out,
                "k8s4r_server_dispatch_duration_seconds",
                "",
                &m.dispatch_latency,
            );
        });
        out
    }
}

fn counter(
    out: &mut String,
    name: &str,
    help: &str,
    labels: (&str, &str),
    values: &BTreeMap<(String, String), u64>,
) {
    let _ = writeln!(out, "# HELP {name} {help}\n# TYPE {name} counter");
    for ((a, b), n) in values {
        let _ = writeln!(
            out,
            "{name}{{{}=\"{}\",{}=\"{}\"}} {n}",
            labels.0,
            escape(a),
            labels.1,
            escape(b)
        );
    }
}

fn histogram(out: &mut String, name: &str, labels: &str, h: &Histogram) {
    let sep = if labels.is_empty() { "" } else { "," };
    for (i, bound) in BUCKETS.iter().enumerate() {
        let n = h.counts.get(i).copied().unwrap_or(0);
        let _ = writeln!(out, "{name}_bucket{{{labels}{sep}le=\"{bound}\"}} {n}");
    }
    let _ = writeln!(out, "{name}_bucket{{{labels}{sep}le=\"+Inf\"}} {}", h.count);
    let braces = if labels.is_empty() {
        String::new()
    } else {
        format!("{{{labels}}}")
    };
    let _ = writeln!(out, "{name}_sum{braces} {}", h.sum);
    let _ = writeln!(out, "{name}_count{braces} {}", h.count);
}

fn escape(value: &str) -> String {
    value
        .replace('\\', "\\\\")
        .replace('"', "\\\"")
        .replace('\n', "\\n")
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
        m.api_write("lease", "ok", Duration::from_millis(3));
        m.dispatch_latency(Duration::from_millis(20));
        let text = m.render();
        assert!(text.contains("k8s4r_server_messages_received_total{topic=\"status\",outcome=\"applied\"} 2"));
        assert!(
            text.contains("k8s4r_server_api_write_duration_seconds_bucket{write=\"lease\",le=\"0.005\"} 1")
        );
        assert!(text.contains("k8s4r_server_dispatch_duration_seconds_count 1"));
        assert_eq!(m.api_writes("lease", "ok"), 1);
        assert!(!m.ready());
    }
}
