//! The server's errors.

use std::time::Duration;

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
    /// A Kubernetes API call failed.
    #[error("{action}: {source}")]
    Kube {
        /// What was being done, with the object's name.
        action: String,
        /// The client's error.
        source: kube::Error,
    },
    /// A Kubernetes API call took too long.
    #[error("{action}: no answer within {after:?}")]
    KubeTimeout {
        /// What was being done.
        action: String,
        /// The timeout.
        after: Duration,
    },
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
        matches!(self, Error::Kube { source: kube::Error::Api(s), .. } if s.code == 409)
    }

    /// Whether trying again later may help: timeouts, transport errors,
    /// conflicts and server-side (5xx, 429) errors.
    pub fn is_transient(&self) -> bool {
        match self {
            Error::KubeTimeout { .. } | Error::Conflict { .. } | Error::Publish { .. } => true,
            Error::Kube {
                source: kube::Error::Api(s),
                ..
            } => s.code == 409 || s.code == 429 || s.code >= 500,
            Error::Kube { .. } => true,
            _ => false,
        }
    }

    /// Whether this is an HTTP 404 from the API server.
    pub fn is_not_found(&self) -> bool {
        matches!(self, Error::Kube { source: kube::Error::Api(s), .. } if s.code == 404)
    }
}

/// The crate's result.
pub type Result<T, E = Error> = std::result::Result<T, E>;
