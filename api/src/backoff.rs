//! Retry delays, one policy for every program: exponential, capped, and on
//! the robot jittered.
//!
//! [`exponential`] is the bare curve the cluster programs use per object
//! (a controller's error requeue, the server's retried writes and broker
//! reconnects). [`Backoff`] adds state and jitter for the agent: rumqttc
//! reconnects on the very next `poll` after an error, so a fleet that lost
//! its broker would hammer it in lock-step the moment it returns. Spreading
//! each robot's delay uniformly over `[base/2, base]` breaks the lock-step
//! while still growing the delay exponentially.

use std::time::Duration;

/// `base` doubled `doublings` times, never above `cap` (and never
/// overflowing, however many failures were counted).
pub fn exponential(base: Duration, cap: Duration, doublings: u32) -> Duration {
    let factor = 1u32.checked_shl(doublings.min(31)).unwrap_or(u32::MAX);
    base.checked_mul(factor).unwrap_or(cap).min(cap)
}

/// A small, seedable pseudo-random source for jitter (xorshift64*). Jitter
/// needs spread between robots, not cryptographic quality, and this keeps a
/// dependency out of the agent.
#[derive(Debug, Clone)]
pub struct Jitter {
    state: u64,
}

impl Jitter {
    /// Seeded from the clock and the process id, so robots started at the
    /// same instant still diverge.
    pub fn from_entropy() -> Self {
        let nanos = std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .map(|d| d.as_nanos() as u64)
            .unwrap_or(0);
        Self::with_seed(nanos ^ (u64::from(std::process::id()) << 32))
    }

    /// A fixed seed, for tests.
    pub fn with_seed(seed: u64) -> Self {
        // splitmix64 scrambles nearby seeds (robots booted a nanosecond
        // apart) into unrelated states; zero is xorshift's only fixed point.
        let mut z = seed.wrapping_add(0x9e37_79b9_7f4a_7c15);
        z = (z ^ (z >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
        z ^= z >> 31;
        Self { state: z.max(1) }
    }

    /// The next value, uniform in `[0, 1)`.
    pub fn next_f64(&mut self) -> f64 {
        let mut x = self.state;
        x ^= x >> 12;
        x ^= x << 25;
        x ^= x >> 27;
        self.state = x;
        let r = x.wrapping_mul(0x2545_f491_4f6c_dd1d);
        (r >> 11) as f64 / (1u64 << 53) as f64
    }

    /// `d` scaled by a factor uniform in `[1 - spread, 1 + spread]`.
    pub fn spread(&mut self, d: Duration, spread: f64) -> Duration {
        let factor = 1.0 - spread + 2.0 * spread * self.next_f64();
        d.mul_f64(factor.max(0.0))
    }
}

/// Exponential backoff with jitter between `min` and `max`.
#[derive(Debug, Clone)]
pub struct Backoff {
    min: Duration,
    max: Duration,
    failures: u32,
    jitter: Jitter,
}

impl Backoff {
    /// Starts at `min`, doubles per failure, capped at `max`.
    pub fn new(min: Duration, max: Duration, jitter: Jitter) -> Self {
        Self {
            min,
            max: max.max(min),
            failures: 0,
            jitter,
        }
    }

    /// The delay before the next try; counts one more failure.
    pub fn next_delay(&mut self) -> Duration {
        let base = exponential(self.min, self.max, self.failures);
        self.failures = self.failures.saturating_add(1);
        // Uniform in [base/2, base]: never zero, never above the cap.
        base.mul_f64(0.5 + 0.5 * self.jitter.next_f64())
    }

    /// Failures since the last reset.
    pub fn failures(&self) -> u32 {
        self.failures
    }

    /// Back to `min` after a success.
    pub fn reset(&mut self) {
        self.failures = 0;
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn exponential_doubles_and_is_capped() {
        let base = Duration::from_millis(500);
        let cap = Duration::from_secs(5);
        let got: Vec<u128> = (0..6).map(|n| exponential(base, cap, n).as_millis()).collect();
        assert_eq!(got, vec![500, 1000, 2000, 4000, 5000, 5000]);
        assert_eq!(exponential(base, cap, u32::MAX), cap);
        assert_eq!(exponential(Duration::MAX, cap, 3), cap);
    }

    #[test]
    fn delays_grow_exponentially_within_jitter_and_cap() {
        let min = Duration::from_millis(100);
        let max = Duration::from_secs(2);
        let mut b = Backoff::new(min, max, Jitter::with_seed(7));
        let mut base = min;
        for _ in 0..10 {
            let d = b.next_delay();
            assert!(
                d >= base / 2 && d <= base,
                "{d:?} not in [{:?}, {base:?}]",
                base / 2
            );
            base = (base * 2).min(max);
        }
        b.reset();
        assert!(b.next_delay() <= min);
    }

    #[test]
    fn jitter_spreads_robots_apart() {
        let delays: Vec<Duration> = (0..20)
            .map(|seed| {
                Backoff::new(
                    Duration::from_secs(1),
                    Duration::from_secs(60),
                    Jitter::with_seed(seed),
                )
                .next_delay()
            })
            .collect();
        let distinct: std::collections::BTreeSet<_> = delays.iter().collect();
        assert!(distinct.len() > 15, "{delays:?}");
    }

    #[test]
    fn spread_stays_within_ten_percent() {
        let mut j = Jitter::with_seed(3);
        let d = Duration::from_secs(30);
        let mut lo = d;
        let mut hi = d;
        for _ in 0..1000 {
            let s = j.spread(d, 0.1);
            assert!(
                s >= Duration::from_secs(27) && s <= Duration::from_secs(33),
                "{s:?}"
            );
            lo = lo.min(s);
            hi = hi.max(s);
        }
        assert!(
            lo < Duration::from_secs(28) && hi > Duration::from_secs(32),
            "{lo:?} {hi:?}"
        );
    }
}
