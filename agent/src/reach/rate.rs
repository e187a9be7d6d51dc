//! The robot's limit on what all its sessions send together: a token
//! bucket of bytes, refilled at the configured rate, holding a quarter of
//! a second's worth (at least one frame) so that a burst stays short.

use std::sync::Mutex;
use std::time::Duration;

use k8s4r_api::protocol::reach::MAX_SESSION_DATA;
use tokio::time::Instant;

/// Bytes per second for all sessions; 0 is no limit.
#[derive(Debug)]
pub struct Rate {
    per_second: u64,
    bucket: Mutex<(f64, Instant)>,
}

impl Rate {
    /// A limit of `per_second` bytes (0: none).
    pub fn new(per_second: u64) -> Self {
        Rate {
            per_second,
            bucket: Mutex::new((0.0, Instant::now())),
        }
    }

    /// Its bytes a second (0: no limit).
    pub fn per_second(&self) -> u64 {
        self.per_second
    }

    fn capacity(&self) -> f64 {
        (self.per_second as f64 / 4.0).max(MAX_SESSION_DATA as f64)
    }

    /// How long to wait before `bytes` may go, taking them if none.
    fn take(&self, bytes: usize, now: Instant) -> Duration {
        let mut bucket = self.bucket.lock().unwrap_or_else(|e| e.into_inner());
        let (tokens, at) = &mut *bucket;
        let rate = self.per_second as f64;
        *tokens = (*tokens + now.saturating_duration_since(*at).as_secs_f64() * rate).min(self.capacity());
        *at = now;
        let bytes = bytes as f64;
        if *tokens >= bytes {
            *tokens -= bytes;
            return Duration::ZERO;
        }
        Duration::from_secs_f64((bytes - *tokens) / rate)
    }

    /// Waits until `bytes` may go (more than the bucket holds go in
    /// pieces it does).
    pub async fn spend(&self, bytes: usize) {
        if self.per_second == 0 {
            return;
        }
        let mut left = bytes;
        while left > 0 {
            let piece = left.min(self.capacity() as usize);
            loop {
                let wait = self.take(piece, Instant::now());
                if wait.is_zero() {
                    break;
                }
                tokio::time::sleep(wait).await;
            }
            left -= piece;
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_second_of_bytes_takes_a_second_after_the_burst() {
        let rate = Rate::new(1 << 20);
        let start = Instant::now();
        // The bucket starts empty: the first frame waits its share.
        let first = rate.take(32 * 1024, start);
        assert!(
            first > Duration::from_millis(25) && first < Duration::from_millis(40),
            "{first:?}"
        );
        let later = start + Duration::from_millis(250);
        assert_eq!(rate.take(32 * 1024, later), Duration::ZERO);
        // No more than a quarter second's worth piles up while idle.
        let idle = later + Duration::from_secs(60);
        assert_eq!(rate.take(256 * 1024 - 32 * 1024, idle), Duration::ZERO);
        assert!(rate.take(64 * 1024, idle) > Duration::from_millis(25));
    }

    #[tokio::test(start_paused = true)]
    async fn more_than_the_bucket_holds_goes_in_pieces() {
        // 100 kB/s holds a frame's worth, less than 100 kB.
        let rate = Rate::new(100_000);
        let start = Instant::now();
        rate.spend(100_000).await;
        let took = start.elapsed();
        assert!(
            took >= Duration::from_millis(990) && took < Duration::from_millis(1100),
            "{took:?}"
        );
    }
}
