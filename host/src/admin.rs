//! The admin HTTP endpoint: `/healthz`, `/readyz`, `/metrics` and `/plugins`.
//!
//! `/plugins` lists the loaded plugins as JSON, one object per plugin:
//! `name`, `version`, `mode` (`active`, or `shadow` for a candidate that only compares), `sha256` (of the component), `target` (`plural.group/version`),
//! `children`, `source` (`file <path>` or `configmap <namespace>/<name>`), `since` (RFC 3339,
//! when this version was loaded), `grants.appCall`, `grants.exchange`, `limits` and `concurrency`.

use std::net::SocketAddr;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};

use axum::Router;
use axum::extract::State;
use axum::http::StatusCode;
use axum::routing::get;

use crate::metrics::Metrics;
use crate::policy_store::PolicyStore;

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
    store: PolicyStore,
}

/// Binds the admin endpoint; returns the bound address and the server future.
pub async fn serve(
    addr: SocketAddr,
    metrics: Metrics,
    readiness: Readiness,
    store: PolicyStore,
) -> std::io::Result<(
    SocketAddr,
    impl std::future::Future<Output = std::io::Result<()>>,
)> {
    let app = Router::new()
        .route("/healthz", get(|| async { "ok" }))
        .route("/readyz", get(readyz))
        .route("/metrics", get(metrics_text))
        .route("/plugins", get(plugins_json))
        .with_state(AdminState {
            metrics,
            readiness,
            store,
        });
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

async fn metrics_text(
    State(state): State<AdminState>,
) -> ([(&'static str, &'static str); 1], String) {
    (
        [("content-type", "text/plain; version=0.0.4; charset=utf-8")],
        state.metrics.render(),
    )
}

async fn plugins_json(
    State(state): State<AdminState>,
) -> ([(&'static str, &'static str); 1], String) {
    let plugins: Vec<serde_json::Value> = state
        .store
        .list()
        .iter()
        .map(|p| p.summary("active"))
        .chain(
            state
                .store
                .list_shadows()
                .iter()
                .map(|p| p.summary("shadow")),
        )
        .collect();
    (
        [("content-type", "application/json")],
        serde_json::Value::Array(plugins).to_string(),
    )
}
