//! The server's errors.

use k8s4r_service::ApiError;

/// Everything that can go wrong in the bridge.
#[derive(Debug, thiserror::Error)]
pub enum Error {
    /// A setting is unusable.
    #[error("configuration: {0}")]
    Config(String),
    /// A file named in the settings could not be read.
    #[error("reading {path}: {source}")]
    ReadFile {
        /// The file.
        path: String,
        /// Why.
        source: std::io::Error,
    },
    /// A Kubernetes API call failed or timed out.
    #[error(transparent)]
    Api(#[from] ApiError),
    /// The resourceVersion changed under a guarded write too often.
    #[error("{action}: still conflicting after {tries} tries")]
    Conflict {
        /// What was being done.
        action: String,
        /// How often it was tried.
        tries: u32,
    },
    /// A publish was not acknowledged.
    #[error("publish to {topic}: {reason}")]
    Publish {
        /// The topic.
        topic: String,
        /// Why.
        reason: String,
    },
    /// The MQTT settings are unusable (broker URL, TLS files).
    #[error("{0}")]
    Mqtt(String),
    /// Serving /metrics failed.
    #[error("metrics server on {addr}: {source}")]
    Http {
        /// The address.
        addr: String,
        /// Why.
        source: std::io::Error,
    },
}

impl Error {
    /// Whether this is an HTTP 409 from the API server.
    pub fn is_conflict(&self) -> bool {
        matches!(self, Error::Api(e) if e.is_conflict())
    }

    /// Whether trying again later may help: timeouts, transport errors,
    /// conflicts and server-side (5xx, 429) errors, unacknowledged publishes.
    pub fn is_transient(&self) -> bool {
        match self {
            Error::Api(e) => e.is_transient(),
            Error::Conflict { .. } | Error::Publish { .. } => true,
            _ => false,
        }
    }

    /// Whether this is an HTTP 404 from the API server.
    pub fn is_not_found(&self) -> bool {
        matches!(self, Error::Api(e) if e.is_not_found())
    }
}

/// The crate's result.
pub type Result<T, E = Error> = std::result::Result<T, E>;
