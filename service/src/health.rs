//! `/metrics`, `/healthz` and `/readyz`, the same for every program.

use std::future::Future;
use std::net::SocketAddr;
use std::sync::Arc;

use axum::extract::State;
use axum::http::{header, StatusCode};
use axum::response::IntoResponse;
use axum::routing::get;
use axum::Router;
use tokio_util::sync::CancellationToken;

use crate::metrics::Registry;

/// What a program shows on its endpoints.
pub trait Health: Send + Sync + 'static {
    /// Where its metrics are registered.
    fn registry(&self) -> &Registry;

    /// Ready to do its job, or why not.
    fn ready(&self) -> Result<(), &'static str>;

    /// The metrics, in the text exposition format.
    fn render(&self) -> String {
        crate::metrics::render(self.registry())
    }
}

/// The routes, for tests and for embedding.
pub fn router(health: Arc<dyn Health>) -> Router {
    Router::new()
        .route("/metrics", get(metrics))
        .route("/healthz", get(|| async { "ok" }))
        .route("/readyz", get(ready))
        .with_state(health)
}

async fn metrics(State(health): State<Arc<dyn Health>>) -> impl IntoResponse {
    (
        [(
            header::CONTENT_TYPE,
            "application/openmetrics-text; version=1.0.0; charset=utf-8",
        )],
        health.render(),
    )
}

async fn ready(State(health): State<Arc<dyn Health>>) -> impl IntoResponse {
    match health.ready() {
        Ok(()) => (StatusCode::OK, "ready".to_owned()),
        Err(why) => (StatusCode::SERVICE_UNAVAILABLE, format!("not ready: {why}")),
    }
}

/// Binds `addr`; returns the bound address (useful with port 0) and the
/// future that serves until `shutdown`.
pub async fn bind(
    addr: SocketAddr,
    health: Arc<dyn Health>,
    shutdown: CancellationToken,
) -> std::io::Result<(SocketAddr, impl Future<Output = ()>)> {
    let listener = tokio::net::TcpListener::bind(addr).await?;
    let bound = listener.local_addr()?;
    let serve = async move {
        let result = axum::serve(listener, router(health))
            .with_graceful_shutdown(shutdown.cancelled_owned())
            .await;
        if let Err(error) = result {
            tracing::warn!(%error, "the metrics endpoint stopped");
        }
    };
    Ok((bound, serve))
}
