//! Prometheus metrics (on `prometheus-client`, through
//! [`k8s4r_service::metrics`]) and what the health endpoints report.

use std::sync::atomic::{AtomicBool, Ordering};
use std::time::Duration;

use k8s4r_service::health::Health;
use k8s4r_service::metrics::{self, Registry};
use prometheus_client::encoding::EncodeLabelSet;
use prometheus_client::metrics::counter::Counter;
use prometheus_client::metrics::family::Family;
use prometheus_client::metrics::gauge::Gauge;
use prometheus_client::metrics::histogram::Histogram;

/// The controllers, for labels.
pub const CONTROLLERS: [&str; 6] = ["job", "taskgroup", "task", "robot", "periodicjob", "agentrollout"];

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct ControllerLabel {
    controller: String,
}

/// Per-controller figures.
#[derive(Debug)]
pub struct ControllerMetrics {
    /// Reconciles run.
    pub reconciles: Counter,
    /// Reconciles that failed.
    pub errors: Counter,
    /// Reconciles running now.
    pub in_flight: Gauge,
    /// Objects whose latest reconcile failed and that wait for a retry.
    pub backing_off: Gauge,
    /// Reconciles due and waiting for a free slot (the controller is at
    /// its `concurrency`).
    pub waiting: Gauge,
    /// How long reconciles take.
    pub duration: Histogram,
}

/// Every figure the manager exports.
#[derive(Debug)]
pub struct Metrics {
    registry: Registry,
    controllers: Vec<ControllerMetrics>,
    /// Scheduling decisions that placed a task.
    pub decisions: Counter,
    /// Scheduling attempts that found no robot.
    pub unschedulable: Counter,
    /// Placements that patched `spec.targetRobot` (a Task created naming
    /// its robot needs only its status written).
    pub target_patches: Counter,
    /// Routine Events not published: over the Event rate limit.
    pub events_dropped: Counter,
    /// Replacements of a silent robot's attempt not made because the API
    /// server's Robot and Lease were fresher than the caches' (a watch
    /// that stalled or relists).
    pub stale_robot_records: Counter,
    /// Tasks waiting for a robot that fits.
    waiting: Gauge,
    /// From a task becoming schedulable to its placement.
    scheduling_latency: Histogram,
    leader: Gauge,
    leading: AtomicBool,
    ready: AtomicBool,
}

impl Default for Metrics {
    fn default() -> Self {
        let mut registry = Registry::with_prefix("k8s4r_manager");
        let controllers = controller_metrics(&mut registry);
        let decisions = Counter::default();
        let unschedulable = Counter::default();
        let target_patches = Counter::default();
        let events_dropped = Counter::default();
        let stale_robot_records = Counter::default();
        let waiting = Gauge::default();
        let scheduling_latency = metrics::latency();
        let leader = Gauge::default();
        registry.register(
            "scheduling_decisions",
            "Tasks placed on a robot.",
            decisions.clone(),
        );
        registry.register(
            "scheduling_failures",
            "Scheduling attempts that found no robot.",
            unschedulable.clone(),
        );
        registry.register(
            "target_robot_patches",
            "Placements that patched spec.targetRobot; a Task created naming its robot needs none.",
            target_patches.clone(),
        );
        registry.register(
            "events_dropped",
            "Routine (Normal) Events not published: over --event-qps.",
            events_dropped.clone(),
        );
        registry.register(
            "stale_robot_records",
            "Replacements of a silent robot's attempt called off: the API server had the robot heard from later than the watch caches (a stalled or relisting watch).",
            stale_robot_records.clone(),
        );
        registry.register(
            "tasks_waiting",
            "Tasks waiting for a robot that fits.",
            waiting.clone(),
        );
        registry.register(
            "leader",
            "1 when this replica holds the leader Lease.",
            leader.clone(),
        );
        registry.register(
            "scheduling_latency_seconds",
            "From a task becoming schedulable to its placement.",
            scheduling_latency.clone(),
        );
        Self {
            registry,
            controllers,
            decisions,
            unschedulable,
            target_patches,
            events_dropped,
            stale_robot_records,
            waiting,
            scheduling_latency,
            leader,
            leading: AtomicBool::new(false),
            ready: AtomicBool::new(false),
        }
    }
}

/// Registers the per-controller families in `registry` and returns each
/// controller's figures, in the order of [`CONTROLLERS`].
fn controller_metrics(registry: &mut Registry) -> Vec<ControllerMetrics> {
    let reconciles = Family::<ControllerLabel, Counter>::default();
    let errors = Family::<ControllerLabel, Counter>::default();
    let in_flight = Family::<ControllerLabel, Gauge>::default();
    let backing_off = Family::<ControllerLabel, Gauge>::default();
    let waiting = Family::<ControllerLabel, Gauge>::default();
    let duration =
        Family::<ControllerLabel, Histogram, fn() -> Histogram>::new_with_constructor(metrics::latency);
    registry.register("reconciles", "Reconciles run.", reconciles.clone());
    registry.register("reconcile_errors", "Reconciles that failed.", errors.clone());
    registry.register(
        "reconciles_in_flight",
        "Reconciles running now.",
        in_flight.clone(),
    );
    registry.register(
        "reconciles_waiting",
        "Reconciles due and waiting for a free slot.",
        waiting.clone(),
    );
    registry.register(
        "queue_backoff",
        "Objects waiting for a retry after a failed reconcile.",
        backing_off.clone(),
    );
    registry.register(
        "reconcile_duration_seconds",
        "Reconcile duration.",
        duration.clone(),
    );
    CONTROLLERS
        .iter()
        .map(|c| {
            let label = ControllerLabel {
                controller: (*c).to_owned(),
            };
            ControllerMetrics {
                reconciles: reconciles.get_or_create_owned(&label),
                errors: errors.get_or_create_owned(&label),
                in_flight: in_flight.get_or_create_owned(&label),
                backing_off: backing_off.get_or_create_owned(&label),
                waiting: waiting.get_or_create_owned(&label),
                duration: duration.get_or_create_owned(&label),
            }
        })
        .collect()
}

impl Metrics {
    /// The figures of one controller (by its name in [`CONTROLLERS`]).
    pub fn controller(&self, name: &str) -> &ControllerMetrics {
        let i = CONTROLLERS.iter().position(|c| *c == name).unwrap_or(0);
        &self.controllers[i]
    }

    /// How many tasks wait for a robot that fits.
    pub fn set_waiting(&self, n: usize) {
        self.waiting.set(i64::try_from(n).unwrap_or(i64::MAX));
    }

    /// One placement, `took` after the task became schedulable.
    pub fn scheduled(&self, took: Duration) {
        metrics::observe(&self.scheduling_latency, took);
    }

    /// Records whether this replica holds the leader Lease.
    pub fn set_leader(&self, leading: bool) {
        self.leading.store(leading, Ordering::Relaxed);
        self.leader.set(i64::from(leading));
    }

    /// Whether this replica holds the leader Lease.
    pub fn is_leader(&self) -> bool {
        self.leading.load(Ordering::Relaxed)
    }

    /// Records whether this replica does its job: standing by for the
    /// Lease, or leading with its caches filled and the controllers running.
    pub fn set_ready(&self, ready: bool) {
        self.ready.store(ready, Ordering::Relaxed);
    }

    /// See [`Metrics::set_ready`].
    pub fn is_ready(&self) -> bool {
        self.ready.load(Ordering::Relaxed)
    }
}

impl Health for Metrics {
    fn registry(&self) -> &Registry {
        &self.registry
    }

    fn ready(&self) -> Result<(), &'static str> {
        if self.is_ready() {
            Ok(())
        } else {
            Err("waiting for the Lease or for the caches to fill")
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn renders_every_family() {
        let m = Metrics::default();
        m.controller("task").reconciles.inc_by(3);
        metrics::observe(&m.controller("task").duration, Duration::from_millis(20));
        m.scheduled(Duration::from_millis(2));
        let text = m.render();
        assert!(
            text.contains("k8s4r_manager_reconciles_total{controller=\"task\"} 3"),
            "{text}"
        );
        assert!(
            text.contains("k8s4r_manager_reconciles_total{controller=\"robot\"} 0"),
            "{text}"
        );
        assert!(
            text.contains(
                "k8s4r_manager_reconcile_duration_seconds_bucket{le=\"0.025\",controller=\"task\"} 1"
            ),
            "{text}"
        );
        assert!(
            text.contains("k8s4r_manager_reconcile_duration_seconds_count{controller=\"task\"} 1"),
            "{text}"
        );
        assert!(
            text.contains("k8s4r_manager_scheduling_latency_seconds_bucket{le=\"0.005\"} 1"),
            "{text}"
        );
        assert!(text.contains("k8s4r_manager_leader 0"), "{text}");
    }
}
