//! Prometheus metrics on `prometheus-client`: each program registers its
//! own families in a [`Registry`] under its prefix (`k8s4r_server`,
//! `k8s4r_manager`); what both need (API writes, latency histograms) is
//! defined here once.

use std::time::Duration;

use prometheus_client::encoding::EncodeLabelSet;
use prometheus_client::metrics::counter::Counter;
use prometheus_client::metrics::family::Family;
use prometheus_client::metrics::histogram::Histogram;
pub use prometheus_client::registry::Registry;

/// Upper bounds of every latency histogram, in seconds: from a millisecond
/// (a cached decision) to a minute (a call stuck behind a slow API server).
pub const LATENCY_BUCKETS: [f64; 12] = [
    0.001, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 10.0, 60.0,
];

/// A latency histogram with [`LATENCY_BUCKETS`].
pub fn latency() -> Histogram {
    Histogram::new(LATENCY_BUCKETS)
}

/// Records `took` in `histogram`, in seconds.
pub fn observe(histogram: &Histogram, took: Duration) {
    histogram.observe(took.as_secs_f64());
}

/// Labels of an API write: its kind and how it went.
#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct WriteOutcome {
    /// The kind of write (`task_status`, `lease`, ...).
    pub write: String,
    /// `ok`, `conflict`, `not_found`, `timeout` or `error`.
    pub outcome: String,
}

/// Labels of an API write's latency.
#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct Write {
    /// The kind of write.
    pub write: String,
}

type LatencyFamily = Family<Write, Histogram, fn() -> Histogram>;

/// API writes by kind and outcome, and their latency. Cheap to clone: the
/// clones count into the same series.
#[derive(Clone, Debug)]
pub struct ApiMetrics {
    writes: Family<WriteOutcome, Counter>,
    latency: LatencyFamily,
}

impl ApiMetrics {
    /// Registers `api_writes_total` and `api_write_duration_seconds`.
    pub fn register(registry: &mut Registry) -> Self {
        let writes = Family::default();
        let latency = LatencyFamily::new_with_constructor(latency);
        registry.register(
            "api_writes",
            "Kubernetes API writes, by kind of write and outcome.",
            writes.clone(),
        );
        registry.register(
            "api_write_duration_seconds",
            "Latency of Kubernetes API writes.",
            latency.clone(),
        );
        Self { writes, latency }
    }

    /// One write of kind `write` ended with `outcome` after `took`.
    pub fn observe(&self, write: &str, outcome: &str, took: Duration) {
        self.writes
            .get_or_create(&WriteOutcome {
                write: write.to_owned(),
                outcome: outcome.to_owned(),
            })
            .inc();
        observe(
            &self.latency.get_or_create(&Write {
                write: write.to_owned(),
            }),
            took,
        );
    }

    /// How many writes of kind `write` ended with `outcome` so far.
    pub fn count(&self, write: &str, outcome: &str) -> u64 {
        self.writes
            .get(&WriteOutcome {
                write: write.to_owned(),
                outcome: outcome.to_owned(),
            })
            .map_or(0, |c| c.get())
    }
}

/// The text exposition of `registry`.
pub fn render(registry: &Registry) -> String {
    let mut out = String::new();
    // Writing into a String cannot fail.
    let _ = prometheus_client::encoding::text::encode(&mut out, registry);
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn api_writes_are_counted_and_timed() {
        let mut registry = Registry::with_prefix("k8s4r_test");
        let api = ApiMetrics::register(&mut registry);
        api.observe("lease", "ok", Duration::from_millis(3));
        api.clone().observe("lease", "ok", Duration::from_millis(30));
        api.observe("lease", "conflict", Duration::from_millis(3));
        assert_eq!((api.count("lease", "ok"), api.count("lease", "conflict")), (2, 1));
        let text = render(&registry);
        assert!(
            text.contains(r#"k8s4r_test_api_writes_total{write="lease",outcome="ok"} 2"#),
            "{text}"
        );
        assert!(
            text.contains(r#"k8s4r_test_api_write_duration_seconds_bucket{le="0.005",write="lease"} 2"#),
            "{text}"
        );
    }
}
