//! Limits that keep one client, or a fleet of controllers gone wrong, from
//! exhausting the server: the in-flight request limits kube-apiserver users
//! know (`--max-requests-inflight`, `--max-mutating-requests-inflight`), a
//! watch limit, and bounds on connections and TLS handshakes with timeouts
//! for clients that connect and say nothing.
//!
//! ```text
//!   TCP accept ──────── over --max-connections: closed at once
//!        │
//!   TLS handshake ───── at most --max-tls-handshakes at a time; waiting for
//!        │              a turn and the handshake within --tls-handshake-timeout
//!   HTTP/1.1 ────────── each request's headers within --header-read-timeout,
//!        │              counted from the handshake or the previous answer
//!        │              (so it also closes idle keep-alive connections)
//!   authenticate ────── no valid token: not counted; the handler
//!        │              answers 401 (or a health check)
//!   admit ───────────── a watch: --max-watches in all and
//!        │              --max-watches-per-user for each user ─── 429
//!        │              get, list, discovery: --max-requests-inflight ─ 429
//!        │              anything else: --max-mutating-requests-inflight 429
//!        │              (system:masters are served even when full)
//!   read the body, parse, authorize, dispatch; the slot is given back once
//!   the answer (for a watch, its whole stream) has been handed to the
//!   connection
//! ```
//!
//! Every limit is a tokio [`Semaphore`]: a request or connection holds an
//! owned permit for as long as it counts, so nothing has to remember to
//! give a slot back.

mod connections;
mod requests;

use std::collections::HashMap;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex, PoisonError};
use std::time::Duration;

use tokio::sync::Semaphore;

pub use self::connections::{raise_open_files_limit, serve};
pub use self::requests::{admit, classify, Kind, Refused, Slot, RETRY_AFTER_SECONDS};

/// The limits, with kube-apiserver's defaults where it has the same limit.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Limits {
    /// Non-mutating requests (get, list, discovery) served at once; 0 for
    /// no limit, as kube-apiserver's `--max-requests-inflight`.
    pub max_requests_inflight: usize,
    /// Mutating requests served at once; 0 for no limit, as kube-apiserver's
    /// `--max-mutating-requests-inflight`.
    pub max_mutating_requests_inflight: usize,
    /// Watches open at once, all users together (kube-apiserver has no such
    /// limit). The administrator's watches count here.
    pub max_watches: usize,
    /// Watches open at once for one user of [`crate::Config::user`].
    pub max_watches_per_user: usize,
    /// Connections open at once; more are closed as soon as accepted. With
    /// HTTP/1.1 each watch holds a connection of its own.
    pub max_connections: usize,
    /// TLS handshakes under way at once; more wait for a turn.
    pub max_tls_handshakes: usize,
    /// How long a connection has to complete its TLS handshake, waiting for
    /// a turn included.
    pub tls_handshake_timeout: Duration,
    /// How long a connection has to send a request's headers, counted from
    /// the handshake or from the previous answer: a slow sender, or an idle
    /// keep-alive connection, is closed after it.
    pub header_read_timeout: Duration,
    /// How long a request's body may take to arrive once its headers have:
    /// a client that never finishes its body is answered 408 and gives its
    /// in-flight slot back (kube-apiserver bounds a whole request by its
    /// 60 s `--request-timeout`).
    pub body_read_timeout: Duration,
}

impl Default for Limits {
    fn default() -> Self {
        Limits {
            max_requests_inflight: 400,
            max_mutating_requests_inflight: 200,
            max_watches: 1000,
            max_watches_per_user: 250,
            // Room for every watch and every in-flight request, each on its
            // own connection, and for idle keep-alive ones.
            max_connections: 2048,
            max_tls_handshakes: 64,
            tls_handshake_timeout: Duration::from_secs(10),
            // kube-apiserver's ReadHeaderTimeout.
            header_read_timeout: Duration::from_secs(32),
            body_read_timeout: Duration::from_secs(60),
        }
    }
}

/// What the limits hold now, and what they have turned away so far.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct Usage {
    /// Non-mutating requests being served (slots held).
    pub read_only: usize,
    /// Mutating requests being served (slots held).
    pub mutating: usize,
    /// Watches open.
    pub watches: usize,
    /// Connections open, those still in their TLS handshake included.
    pub connections: usize,
    /// Requests answered 429 since the server started.
    pub rejected_requests: u64,
    /// Connections closed at once because the connection limit was reached.
    pub refused_connections: u64,
}

/// The limits at run time, shared by the connection loop and every request.
pub struct Limiter {
    limits: Limits,
    /// `None` when the limit is 0 (none).
    read_only: Option<Arc<Semaphore>>,
    mutating: Option<Arc<Semaphore>>,
    watches: Arc<Semaphore>,
    /// One pool per user that has watched, made on first use; users come
    /// from the token list given at start, so this stays small.
    user_watches: Mutex<HashMap<String, Arc<Semaphore>>>,
    connections: Arc<Semaphore>,
    handshakes: Arc<Semaphore>,
    rejected_requests: AtomicU64,
    refused_connections: AtomicU64,
}

/// A semaphore of `n` permits; tokio's cap is far beyond anything useful,
/// but a number from the command line must not make it panic.
fn pool(n: usize) -> Arc<Semaphore> {
    Arc::new(Semaphore::new(n.min(Semaphore::MAX_PERMITS)))
}

fn used(pool: &Semaphore, limit: usize) -> usize {
    limit.min(Semaphore::MAX_PERMITS) - pool.available_permits()
}

impl Limiter {
    pub fn new(limits: Limits) -> Limiter {
        let unless_zero = |n: usize| (n > 0).then(|| pool(n));
        Limiter {
            read_only: unless_zero(limits.max_requests_inflight),
            mutating: unless_zero(limits.max_mutating_requests_inflight),
            watches: pool(limits.max_watches),
            user_watches: Mutex::new(HashMap::new()),
            connections: pool(limits.max_connections),
            handshakes: pool(limits.max_tls_handshakes),
            rejected_requests: AtomicU64::new(0),
            refused_connections: AtomicU64::new(0),
            limits,
        }
    }

    pub fn limits(&self) -> &Limits {
        &self.limits
    }

    pub fn usage(&self) -> Usage {
        let l = &self.limits;
        let held = |p: &Option<Arc<Semaphore>>, limit| p.as_deref().map_or(0, |p| used(p, limit));
        Usage {
            read_only: held(&self.read_only, l.max_requests_inflight),
            mutating: held(&self.mutating, l.max_mutating_requests_inflight),
            watches: used(&self.watches, l.max_watches),
            connections: used(&self.connections, l.max_connections),
            rejected_requests: self.rejected_requests.load(Ordering::Relaxed),
            refused_connections: self.refused_connections.load(Ordering::Relaxed),
        }
    }

    fn user_watches(&self, user: &str) -> Arc<Semaphore> {
        // A panic elsewhere while holding the lock leaves the map intact.
        let mut map = self.user_watches.lock().unwrap_or_else(PoisonError::into_inner);
        map.entry(user.to_owned())
            .or_insert_with(|| pool(self.limits.max_watches_per_user))
            .clone()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn usage_counts_what_is_held_and_zero_inflight_means_unlimited() {
        let limiter = Limiter::new(Limits {
            max_requests_inflight: 0,
            max_mutating_requests_inflight: 3,
            max_watches: 5,
            ..Limits::default()
        });
        assert!(limiter.read_only.is_none());
        let held = limiter
            .mutating
            .clone()
            .unwrap()
            .try_acquire_many_owned(2)
            .unwrap();
        let watch = limiter.watches.clone().try_acquire_owned().unwrap();
        let usage = limiter.usage();
        assert_eq!((usage.read_only, usage.mutating, usage.watches), (0, 2, 1));
        drop((held, watch));
        assert_eq!(limiter.usage(), Usage::default());
    }

    #[test]
    fn a_limit_beyond_what_a_semaphore_holds_is_capped_not_a_panic() {
        let limiter = Limiter::new(Limits {
            max_connections: usize::MAX,
            ..Limits::default()
        });
        assert_eq!(limiter.usage().connections, 0);
    }
}
