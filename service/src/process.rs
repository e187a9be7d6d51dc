//! What each cluster program's `main` does the same way: find its
//! Kubernetes client, and turn SIGTERM and SIGINT into one cancellation
//! token that every part of the program watches.

use std::path::Path;

use kube::config::{KubeConfigOptions, Kubeconfig};
use kube::Client;
use tokio_util::sync::CancellationToken;

/// Why no client could be built; the message says where it looked.
#[derive(Debug, thiserror::Error)]
#[error("{0}")]
pub struct ClientError(String);

/// A client from the kubeconfig at `path`, or, without one, from the
/// in-cluster service account or the default kubeconfig ($KUBECONFIG,
/// ~/.kube/config).
pub async fn client(kubeconfig: Option<&Path>) -> Result<Client, ClientError> {
    let config = match kubeconfig {
        Some(path) => {
            let fail = |e: &dyn std::fmt::Display| ClientError(format!("kubeconfig {}: {e}", path.display()));
            let kubeconfig = Kubeconfig::read_from(path).map_err(|e| fail(&e))?;
            kube::Config::from_custom_kubeconfig(kubeconfig, &KubeConfigOptions::default())
                .await
                .map_err(|e| fail(&e))?
        }
        None => kube::Config::infer().await.map_err(|e| {
            ClientError(format!(
                "no kubeconfig given, and neither in-cluster nor default config found: {e}"
            ))
        })?,
    };
    Client::try_from(config).map_err(|e| ClientError(format!("building the Kubernetes client: {e}")))
}

/// A token cancelled on the first SIGTERM or SIGINT.
pub fn shutdown_on_signals() -> CancellationToken {
    let token = CancellationToken::new();
    let cancel = token.clone();
    tokio::spawn(async move {
        let terminate = async {
            match tokio::signal::unix::signal(tokio::signal::unix::SignalKind::terminate()) {
                Ok(mut signal) => {
                    signal.recv().await;
                }
                Err(error) => {
                    tracing::error!(%error, "cannot listen for SIGTERM");
                    std::future::pending::<()>().await;
                }
            }
        };
        tokio::select! {
            _ = tokio::signal::ctrl_c() => tracing::info!("SIGINT, shutting down"),
            _ = terminate => tracing::info!("SIGTERM, shutting down"),
        }
        cancel.cancel();
    });
    token
}
