//! Per-object retry delays for reconcilers: each object's consecutive
//! failures are counted apart, so one object failing does not slow down
//! the others, and a success starts its count again.

use std::collections::HashMap;
use std::hash::Hash;
use std::sync::Mutex;

pub use k8s4r_api::backoff::exponential;

use crate::lock;

/// Consecutive failures per object.
#[derive(Debug)]
pub struct Failures<K> {
    counts: Mutex<HashMap<K, u32>>,
}

impl<K> Default for Failures<K> {
    fn default() -> Self {
        Self {
            counts: Mutex::new(HashMap::new()),
        }
    }
}

impl<K: Eq + Hash> Failures<K> {
    /// Counts one more failure of `key`; returns how many in a row (1 for
    /// the first).
    pub fn failed(&self, key: K) -> u32 {
        let mut counts = lock(&self.counts);
        let n = counts.entry(key).or_insert(0);
        *n = n.saturating_add(1);
        *n
    }

    /// `key` succeeded; returns whether it had been failing.
    pub fn succeeded(&self, key: &K) -> bool {
        lock(&self.counts).remove(key).is_some()
    }

    /// How many objects are failing now.
    pub fn failing(&self) -> usize {
        lock(&self.counts).len()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::time::Duration;

    #[test]
    fn each_object_counts_its_own_failures() {
        let f = Failures::default();
        assert_eq!((f.failed("a"), f.failed("a"), f.failed("b")), (1, 2, 1));
        assert_eq!(f.failing(), 2);
        assert!(f.succeeded(&"a"));
        assert!(!f.succeeded(&"a"));
        assert_eq!(f.failed("a"), 1, "a success starts the count again");
        let delays: Vec<u64> = (0..4)
            .map(|n| exponential(Duration::from_secs(1), Duration::from_secs(5), n).as_secs())
            .collect();
        assert_eq!(delays, [1, 2, 4, 5]);
    }
}
