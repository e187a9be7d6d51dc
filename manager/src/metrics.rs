//! Prometheus metrics and the health endpoints.
//!
//! A handful of counters and histograms do not justify a metrics framework:
//! they are atomics behind one lock-free struct, rendered in the text
//! exposition format on `/metrics`.

use std::fmt::Write as _;
use std::net::SocketAddr;
use std::sync::atomic::{AtomicBool, AtomicI64, AtomicU64, Ordering};
use std::sync::Arc;
use std::time::Duration;

use axum::extract::State;
use axum::http::StatusCode;
use axum::routing::get;
use axum::Router;
use tokio_util::sync::CancellationToken;

use crate::error::{Error, Result};

/// The controllers, for labels.
pub const CONTROLLERS: [&str; 4] = ["job", "taskgroup", "task", "robot"];

/// Upper bounds of the histogram buckets, in seconds.
const BUCKETS: [f64; 12] = [
    0.001, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 10.0, 60.0,
];

/// A fixed-bucket histogram.
#[derive(Debug, Default)]
pub struct Histogram {
    buckets: [AtomicU64; BUCKETS.len()],
    count: AtomicU64,
    sum_micros: AtomicU64,
}

impl Histogram {
    /// Records one observation.
    pub fn observe(&self, d: Duration) {
        let secs = d.as_secs_f64();
        for (i, bound) in BUCKETS.iter().enumerate() {
            if secs <= *bound {
                self.buckets[i].fetch_add(1, Ordering::Relaxed);
            }
        }
        self.count.fetch_add(1, Ordering::Relaxed);
        self.sum_micros
            .fetch_add(d.as_micros().min(u64::MAX as u128) as u64, Ordering::Relaxed);
    }

    fn render(&self, out: &mut String, name: &str, labels: &str) {
        let sep = if labels.is_empty() { "" } else { "," };
        for (i, bound) in BUCKETS.iter().enumerate() {
            let n = self.buckets[i].load(Ordering::Relaxed);
            let _ = writeln!(out, "{name}_bucket{{{labels}{sep}le=\"{bound}\"}} {n}");
        }
        let count = self.count.load(Ordering::Relaxed);
        let _ = writeln!(out, "{name}_bucket{{{labels}{sep}le=\"+Inf\"}} {count}");
        let sum = self.sum_micros.load(Ordering::Relaxed) as f64 / 1e6;
        let braces = if labels.is_empty() {
            String::new()
        } else {
            format!("{{{labels}}}")
        };
        let _ = writeln!(out, "{name}_sum{braces} {sum}");
        let _ = writeln!(out, "{name}_count{braces} {count}");
    }
}

/// Per-controller figures.
#[derive(Debug, Default)]
pub struct ControllerMetrics {
    /// Reconciles run.
    pub reconciles: AtomicU64,
    /// Reconciles that failed.
    pub errors: AtomicU64,
    /// Reconciles running now.
    pub in_flight: AtomicI64,
    /// Objects whose latest reconcile failed and that wait for a retry.
    pub backing_off: AtomicI64,
    /// How long reconciles take.
    pub duration: Histogram,
}

/// Every figure the manager exports.
#[derive(Debug, Default)]
pub struct Metrics {
    controllers: [ControllerMetrics; CONTROLLERS.len()],
    /// Scheduling decisions that placed a task.
    pub decisions: AtomicU64,
    /// Scheduling attempts that found no robot.
    pub unschedulable: AtomicU64,
    /// Tasks waiting for a robot that fits.
    pub waiting: AtomicI64,
    /// From a task becoming schedulable to its placement.
    pub scheduling_latency: Histogram,
    /// Whether this replica leads (1) or not (0).
    pub leader: AtomicBool,
    /// Whether this replica does its job: standing by for the Lease, or
    /// leading with its caches filled and the controllers running.
    pub ready: AtomicBool,
}

impl Metrics {
    /// The figures of one controller (by its name in [`CONTROLLERS`]).
    pub fn controller(&self, name: &str) -> &ControllerMetrics {
        let i = CONTROLLERS.iter().position(|c| *c == name).unwrap_or(0);
        &self.controllers[i]
    }

    /// The text exposition format.
    pub fn render(&self) -> String {
        let mut out = String::new();
        let mut family = |name: &str, kind: &str, help: &str, f: &dyn Fn(&ControllerMetrics) -> String| {
            let _ = writeln!(out, "# HELP {name} {help}\n# TYPE {name} {kind}");
            for (c, m) in CONTROLLERS.iter().zip(&self.controllers) {
                let _ = writeln!(out, "{name}{{controller=\"{c}\"}} {}", f(m));
            }
        };
        family(
            "k8s4r_manager_reconciles_total",
            "counter",
            "Reconciles run.",
            &|m| m.reconciles.load(Ordering::Relaxed).to_string(),
        );
        family(
            "k8s4r_manager_reconcile_errors_total",
            "counter",
            "Reconciles that failed.",
            &|m| m.errors.load(Ordering::Relaxed).to_string(),
        );
        family(
            "k8s4r_manager_reconciles_in_flight",
            "gauge",
            "Reconciles running now.",
            &|m| m.in_flight.load(Ordering::Relaxed).to_string(),
        );
        family(
            "k8s4r_manager_queue_backoff",
            "gauge",
            "Objects waiting for a retry after a failed reconcile.",
            &|m| m.backing_off.load(Ordering::Relaxed).to_string(),
        );
        let name = "k8s4r_manager_reconcile_duration_seconds";
        let _ = writeln!(out, "# HELP {name} Reconcile duration.\n# TYPE {name} histogram");
        for (c, m) in CONTROLLERS.iter().zip(&self.controllers) {
            m.duration.render(&mut out, name, &format!("controller=\"{c}\""));
        }
        let simple = [
            (
                "k8s4r_manager_scheduling_decisions_total",
                "counter",
                "Tasks placed on a robot.",
                self.decisions.load(Ordering::Relaxed) as i64,
            ),
            (
                "k8s4r_manager_scheduling_failures_total",
                "counter",
                "Scheduling attempts that found no robot.",
                self.unschedulable.load(Ordering::Relaxed) as i64,
            ),
            (
                "k8s4r_manager_tasks_waiting",
                "gauge",
                "Tasks waiting for a robot that fits.",
                self.waiting.load(Ordering::Relaxed),
            ),
            (
                "k8s4r_manager_leader",
                "gauge",
                "1 when this replica holds the leader Lease.",
                i64::from(self.leader.load(Ordering::Relaxed)),
            ),
        ];
        for (name, kind, help, value) in simple {
            let _ = writeln!(out, "# HELP {name} {help}\n# TYPE {name} {kind}\n{name} {value}");
        }
        let name = "k8s4r_manager_scheduling_latency_seconds";
        let _ = writeln!(
            out,
            "# HELP {name} From a task becoming schedulable to its placement.\n# TYPE {name} histogram"
        );
        self.scheduling_latency.render(&mut out, name, "");
        out
    }
}

/// Serves `/metrics`, `/healthz` and `/readyz` until `shutdown`.
pub async fn serve(addr: SocketAddr, metrics: Arc<Metrics>, shutdown: CancellationToken) -> Result<()> {
    let app = Router::new()
        .route(
            "/metrics",
            get(|State(m): State<Arc<Metrics>>| async move { m.render() }),
        )
        .route("/healthz", get(|| async { "ok" }))
        .route(
            "/readyz",
            get(|State(m): State<Arc<Metrics>>| async move {
                if m.ready.load(Ordering::Relaxed) {
                    (StatusCode::OK, "ready")
                } else {
                    (StatusCode::SERVICE_UNAVAILABLE, "not ready")
                }
            }),
        )
        .with_state(metrics);
    let listener = tokio::net::TcpListener::bind(addr)
        .await
        .map_err(|source| Error::Metrics { addr, source })?;
    tracing::info!(addr = %listener.local_addr().unwrap_or(addr), "serving /metrics, /healthz, /readyz");
    axum::serve(listener, app)
        .with_graceful_shutdown(shutdown.cancelled_owned())
        .await
        .map_err(|source| Error::Metrics { addr, source })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn renders_every_family() {
        let m = Metrics::default();
        m.controller("task").reconciles.fetch_add(3, Ordering::Relaxed);
        m.controller("task").duration.observe(Duration::from_millis(20));
        m.scheduling_latency.observe(Duration::from_millis(2));
        let text = m.render();
        assert!(text.contains("k8s4r_manager_reconciles_total{controller=\"task\"} 3"));
        assert!(text
            .contains("k8s4r_manager_reconcile_duration_seconds_bucket{controller=\"task\",le=\"0.025\"} 1"));
        assert!(text.contains("k8s4r_manager_reconcile_duration_seconds_count{controller=\"task\"} 1"));
        assert!(text.contains("k8s4r_manager_scheduling_latency_seconds_bucket{le=\"0.005\"} 1"));
        assert!(text.contains("k8s4r_manager_leader 0"));
    }
}
