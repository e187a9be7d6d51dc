//! What can stop `k8s4r up` and friends.

use std::net::SocketAddr;
use std::path::PathBuf;

/// Errors of the `k8s4r` commands, each saying what it was doing.
#[derive(Debug, thiserror::Error)]
pub enum UpError {
    /// A listener could not be bound (port taken, no permission).
    #[error("cannot listen for the {what} on {addr}: {source} (is another `k8s4r up` running? pick another address with the flag)")]
    Bind {
        /// Which listener.
        what: &'static str,
        /// Its address.
        addr: SocketAddr,
        /// Why.
        source: std::io::Error,
    },
    /// A part did not come up in time.
    #[error("the {what} on {addr} did not become ready")]
    NotReady {
        /// Which part.
        what: &'static str,
        /// Its address.
        addr: SocketAddr,
    },
    /// A file or directory operation failed.
    #[error("cannot {what}: {source}")]
    Io {
        /// What was being done, with the path.
        what: String,
        /// Why.
        source: std::io::Error,
    },
    /// The data directory was never set up (`k8s4r kubeconfig` before `up`).
    #[error("no kubeconfig at {0}: run `k8s4r up` first (with the same --data-dir)")]
    NoKubeconfig(PathBuf),
    /// The embedded API server failed.
    #[error("API server: {0}")]
    ApiServer(#[from] apiserver_lite::Error),
    /// A call to the API server failed.
    #[error("{what}: {source}")]
    Kube {
        /// What was being done.
        what: String,
        /// The client's error.
        source: kube::Error,
    },
    /// Something else, with its context.
    #[error("{0}")]
    Other(String),
}
