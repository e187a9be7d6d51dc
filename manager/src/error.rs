//! The manager's errors.

use std::time::Duration;

/// Everything a controller can fail with.
#[derive(Debug, thiserror::Error)]
pub enum Error {
    /// A call to the API server failed.
    #[error("{action} {kind} {name}: {source}")]
    Kube {
        /// What was attempted ("patch status of", "create", ...).
        action: &'static str,
        /// The kind of object.
        kind: &'static str,
        /// The object's namespace/name.
        name: String,
        /// The client's error.
        #[source]
        source: kube::Error,
    },
    /// A call to the API server did not answer in time.
    #[error("{action} {kind} {name}: no answer within {after:?}")]
    ApiTimeout {
        /// What was attempted.
        action: &'static str,
        /// The kind of object.
        kind: &'static str,
        /// The object's namespace/name.
        name: String,
        /// The timeout.
        after: Duration,
    },
    /// An object lacks something the controller needs.
    #[error("{kind} {name}: {reason}")]
    Malformed {
        /// The kind of object.
        kind: &'static str,
        /// The object's namespace/name.
        name: String,
        /// What is missing.
        reason: String,
    },
    /// Serialising a patch failed.
    #[error("serialising a patch: {0}")]
    Serialize(#[from] serde_json::Error),
    /// Leader election failed.
    #[error("leader election: {0}")]
    Leader(#[from] kube_lease_manager::LeaseManagerError),
    /// Another replica took the leader Lease.
    #[error("lost the leader Lease")]
    LeadershipLost,
    /// The metrics endpoint could not start.
    #[error("metrics endpoint on {addr}: {source}")]
    Metrics {
        /// The address.
        addr: std::net::SocketAddr,
        /// The cause.
        #[source]
        source: std::io::Error,
    },
}

impl Error {
    /// A 409 Conflict: someone else wrote first; re-read and decide again.
    pub fn is_conflict(&self) -> bool {
        matches!(self, Error::Kube { source: kube::Error::Api(s), .. } if s.code == 409)
    }
}

/// The manager's result.
pub type Result<T, E = Error> = std::result::Result<T, E>;
