//! How late the supervisor's signals leave: the time from a deadline
//! (timeout, or timeout + killTimeout) to the moment SIGTERM or SIGKILL has
//! been sent to the task's group. Kept as fixed-size histograms, so the
//! cost does not grow with the number of tasks.

use std::time::Duration;

/// Bucket width.
const BUCKET: Duration = Duration::from_micros(100);
/// Buckets (100 µs each: up to 200 ms; later lands in the last one).
const BUCKETS: usize = 2000;

/// A latency histogram with 100 µs resolution.
#[derive(Clone, Debug)]
pub struct Histogram {
    counts: Vec<u32>,
    total: u64,
    max: Duration,
}

impl Default for Histogram {
    fn default() -> Self {
        Histogram {
            counts: vec![0; BUCKETS],
            total: 0,
            max: Duration::ZERO,
        }
    }
}

impl Histogram {
    pub(crate) fn record(&mut self, value: Duration) {
        let bucket = (value.as_micros() / BUCKET.as_micros()) as usize;
        self.counts[bucket.min(BUCKETS - 1)] += 1;
        self.total += 1;
        self.max = self.max.max(value);
    }

    /// Samples recorded.
    pub fn count(&self) -> u64 {
        self.total
    }

    /// The largest sample.
    pub fn max(&self) -> Duration {
        self.max
    }

    /// The `q` quantile (0..=1), as the upper bound of its bucket (never
    /// more than the largest sample); None when empty.
    pub fn quantile(&self, q: f64) -> Option<Duration> {
        if self.total == 0 {
            return None;
        }
        let rank = ((self.total as f64) * q).ceil().max(1.0) as u64;
        let mut seen = 0;
        for (i, count) in self.counts.iter().enumerate() {
            seen += u64::from(*count);
            if seen >= rank && i == BUCKETS - 1 {
                return Some(self.max); // the overflow bucket has no bound
            }
            if seen >= rank {
                return Some((BUCKET * (i as u32 + 1)).min(self.max));
            }
        }
        Some(self.max)
    }
}

/// Signal lateness since the supervisor started, and how long the loop's
/// handlers held its thread (a deadline waits for the handler before it).
#[derive(Clone, Debug, Default)]
pub struct SupervisorStats {
    /// Deadline -> SIGTERM sent, for timeouts.
    pub sigterm_late: Histogram,
    /// Deadline + killTimeout -> SIGKILL sent (timeouts, cancels, shutdown).
    pub sigkill_late: Histogram,
    /// Per branch of the loop (deadline, exit, command, prepared, output,
    /// housework, sigchld): how long one handling took.
    pub handlers: std::collections::BTreeMap<&'static str, Histogram>,
}

impl SupervisorStats {
    /// One handling of the loop's `branch` took `took`.
    pub(crate) fn handled(&mut self, branch: &'static str, took: Duration) {
        self.handlers.entry(branch).or_default().record(took);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn quantiles_from_buckets() {
        let mut h = Histogram::default();
        assert_eq!(h.quantile(0.99), None);
        for ms in 1..=100 {
            h.record(Duration::from_millis(ms));
        }
        assert_eq!(h.count(), 100);
        assert_eq!(h.quantile(0.5), Some(Duration::from_micros(50_100)));
        assert_eq!(h.quantile(0.99), Some(Duration::from_micros(99_100)));
        assert_eq!(h.quantile(1.0), Some(Duration::from_millis(100)));
        h.record(Duration::from_secs(9));
        assert_eq!(h.max(), Duration::from_secs(9));
        assert_eq!(h.quantile(1.0), Some(Duration::from_secs(9)));
    }
}
