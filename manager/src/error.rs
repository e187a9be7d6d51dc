//! The manager's errors.

use k8s4r_service::leader::LeaderError;
use k8s4r_service::ApiError;

/// Everything a controller can fail with.
#[derive(Debug, thiserror::Error)]
pub enum Error {
    /// A call to the API server failed or did not answer in time.
    #[error(transparent)]
    Api(#[from] ApiError),
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
    /// An Event that must not be lost could not be queued for publishing.
    #[error("recording the {reason} Event of {object}: {why}")]
    EventNotRecorded {
        /// The Event's reason.
        reason: &'static str,
        /// The object it is about (kind namespace/name).
        object: String,
        /// Why not.
        why: String,
    },
    /// Serialising a patch failed.
    #[error("serialising a patch: {0}")]
    Serialize(#[from] serde_json::Error),
    /// Leader election failed.
    #[error(transparent)]
    Leader(#[from] LeaderError),
    /// Another replica took the leader Lease.
    #[error("lost the leader Lease")]
    LeadershipLost,
    /// The webhook could not start.
    #[error("admission webhook on {addr}: {source}")]
    Webhook {
        /// The address.
        addr: std::net::SocketAddr,
        /// The cause.
        #[source]
        source: std::io::Error,
    },
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
        matches!(self, Error::Api(e) if e.is_conflict())
    }
}

/// The manager's result.
pub type Result<T, E = Error> = std::result::Result<T, E>;
