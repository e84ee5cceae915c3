//! The admin HTTP endpoint: `/healthz`, `/readyz` and `/metrics`.

use std::net::SocketAddr;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};

use axum::Router;
use axum::extract::State;
use axum::http::StatusCode;
use axum::routing::get;

use crate::metrics::Metrics;

/// Whether the host has loaded its policies and started their controllers.
#[derive(Clone, Default)]
pub struct Readiness(Arc<AtomicBool>);

impl Readiness {
    /// Marks the host ready.
    pub fn set_ready(&self) {
        self.0.store(true, Ordering::Relaxed);
    }

    /// True once ready.
    pub fn is_ready(&self) -> bool {
        self.0.load(Ordering::Relaxed)
    }
}

#[derive(Clone)]
struct AdminState {
    metrics: Metrics,
    readiness: Readiness,
}

/// Binds the admin endpoint; returns the bound address and the server future.
pub async fn serve(
    addr: SocketAddr,
    metrics: Metrics,
    readiness: Readiness,
) -> std::io::Result<(SocketAddr, impl std::future::Future<Output = std::io::Result<()>>)> {
    let app = Router::new()
        .route("/healthz", get(|| async { "ok" }))
        .route("/readyz", get(readyz))
        .route("/metrics", get(metrics_text))
        .with_state(AdminState { metrics, readiness });
    let listener = tokio::net::TcpListener::bind(addr).await?;
    let bound = listener.local_addr()?;
    Ok((bound, async move { axum::serve(listener, app).await }))
}

async fn readyz(State(state): State<AdminState>) -> (StatusCode, &'static str) {
    if state.readiness.is_ready() {
        (StatusCode::OK, "ok")
    } else {
        (StatusCode::SERVICE_UNAVAILABLE, "policies not loaded yet")
    }
}

async fn metrics_text(State(state): State<AdminState>) -> ([(&'static str, &'static str); 1], String) {
    (
        [("content-type", "text/plain; version=0.0.4; charset=utf-8")],
        state.metrics.render(),
    )
}
