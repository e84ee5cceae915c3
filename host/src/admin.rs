//! The admin HTTP endpoint: `/healthz`, `/readyz`, `/metrics` and `/plugins`, and the
//! [`Health`] they report.
//!
//! `/plugins` lists the loaded plugins as JSON, one object per plugin:
//! `name`, `version`, `mode` (`active`, `shadow` for a candidate that only compares, or
//! `rollout` for a staged rollout's new version), `sha256` (of the component), `target`
//! (`plural.group/version`), `children`, `source` (`file <path>` or `configmap
//! <namespace>/<name>`), `since` (RFC 3339, when this version was loaded), `grants.appCall`,
//! `grants.exchange`, `limits` and `concurrency`; a rollout also `rollout` (its settings,
//! state, parents per version and both versions' figures: [`crate::policy_store::LoadedRollout`]).

use std::collections::{BTreeMap, BTreeSet};
use std::net::SocketAddr;
use std::sync::{Arc, Mutex};

use axum::Router;
use axum::extract::State;
use axum::http::StatusCode;
use axum::routing::get;

use crate::metrics::Metrics;
use crate::policy_store::PolicyStore;

/// A controller that died this many times in a row, without its caches syncing in between,
/// fails `/healthz`: the supervisor's restarts are not helping, so the kubelet should restart
/// the host.
pub const MAX_CONTROLLER_DEATHS_IN_A_ROW: u32 = 5;

/// What `/readyz` and `/healthz` report (review #20).
///
/// Ready: the plugins are loaded (the files at start, and the first list of plugin
/// ConfigMaps) and every loaded policy's controller has listed its parents and children.
/// Alive: no long-lived host task (supervisor, plugin loader, status publisher, admin server)
/// has ended or panicked, and no controller keeps dying.
#[derive(Clone, Default)]
pub struct Health(Arc<Mutex<HealthState>>);

#[derive(Default)]
struct HealthState {
    /// Waiting for the leader-election Lease: ready (a rollout must be able to finish) but
    /// running nothing.
    standby: bool,
    plugins_loaded: bool,
    /// Policies whose controller runs with its caches synced.
    synced: BTreeSet<String>,
    /// Deaths in a row per policy, reset when its controller syncs.
    deaths_in_a_row: BTreeMap<String, u32>,
    /// Host tasks that ended while the host should run, with how.
    ended_tasks: Vec<String>,
}

impl Health {
    fn state(&self) -> std::sync::MutexGuard<'_, HealthState> {
        self.0.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// This replica waits for the leader-election Lease (`true`) or has taken it (`false`).
    pub fn standby(&self, waiting: bool) {
        self.state().standby = waiting;
    }

    /// True while this replica waits for the leader-election Lease.
    pub fn is_standby(&self) -> bool {
        self.state().standby
    }

    /// The plugins to load at start are loaded.
    pub fn plugins_loaded(&self) {
        self.state().plugins_loaded = true;
    }

    /// The controller of `policy` has listed its parents and every child kind.
    pub fn controller_synced(&self, policy: &str) {
        let mut state = self.state();
        state.synced.insert(policy.to_string());
        state.deaths_in_a_row.remove(policy);
    }

    /// The controller of `policy` stopped (restarted, unloaded): not synced until it says so.
    pub fn controller_stopped(&self, policy: &str) {
        self.state().synced.remove(policy);
    }

    /// The controller of `policy` ended on its own (a panic, a watch that ended).
    pub fn controller_died(&self, policy: &str) {
        let mut state = self.state();
        state.synced.remove(policy);
        *state.deaths_in_a_row.entry(policy.to_string()).or_insert(0) += 1;
    }

    /// A long-lived host task ended while the host should run; `how` says which and why.
    pub fn task_ended(&self, how: String) {
        self.state().ended_tasks.push(how);
    }

    /// `Ok` when ready for the policies `loaded`, else what is missing.
    pub fn readiness(&self, loaded: &[String]) -> Result<(), String> {
        let state = self.state();
        // A standby is ready: were it not, a rolling update of two replicas would never
        // finish, since the new pod cannot lead before the old one goes.
        if state.standby {
            return Ok(());
        }
        if !state.plugins_loaded {
            return Err("plugins not loaded yet".to_string());
        }
        let unsynced: Vec<&str> = loaded
            .iter()
            .filter(|p| !state.synced.contains(*p))
            .map(String::as_str)
            .collect();
        if !unsynced.is_empty() {
            return Err(format!(
                "controllers not synced yet (parents and children not listed): {}",
                unsynced.join(", ")
            ));
        }
        Ok(())
    }

    /// `Ok` while alive, else what died.
    pub fn liveness(&self) -> Result<(), String> {
        let state = self.state();
        if !state.ended_tasks.is_empty() {
            return Err(state.ended_tasks.join("; "));
        }
        let looping: Vec<String> = state
            .deaths_in_a_row
            .iter()
            .filter(|(_, deaths)| **deaths >= MAX_CONTROLLER_DEATHS_IN_A_ROW)
            .map(|(policy, deaths)| format!("{policy} ({deaths} times)"))
            .collect();
        if !looping.is_empty() {
            return Err(format!(
                "controllers keep dying without syncing: {}",
                looping.join(", ")
            ));
        }
        Ok(())
    }
}

#[derive(Clone)]
struct AdminState {
    metrics: Metrics,
    health: Health,
    store: PolicyStore,
}

/// Binds the admin endpoint; returns the bound address and the server future.
pub async fn serve(
    addr: SocketAddr,
    metrics: Metrics,
    health: Health,
    store: PolicyStore,
) -> std::io::Result<(
    SocketAddr,
    impl std::future::Future<Output = std::io::Result<()>>,
)> {
    let app = Router::new()
        .route("/healthz", get(healthz))
        .route("/readyz", get(readyz))
        .route("/metrics", get(metrics_text))
        .route("/plugins", get(plugins_json))
        .with_state(AdminState {
            metrics,
            health,
            store,
        });
    let listener = tokio::net::TcpListener::bind(addr).await?;
    let bound = listener.local_addr()?;
    Ok((bound, async move { axum::serve(listener, app).await }))
}

async fn readyz(State(state): State<AdminState>) -> (StatusCode, String) {
    let loaded: Vec<String> = state
        .store
        .list()
        .iter()
        .map(|p| p.name().to_string())
        .collect();
    match state.health.readiness(&loaded) {
        Ok(()) if state.health.is_standby() => (
            StatusCode::OK,
            "ok: standby (another replica holds the leader-election Lease)".to_string(),
        ),
        Ok(()) => (StatusCode::OK, "ok".to_string()),
        Err(missing) => (StatusCode::SERVICE_UNAVAILABLE, missing),
    }
}

async fn healthz(State(state): State<AdminState>) -> (StatusCode, String) {
    match state.health.liveness() {
        Ok(()) => (StatusCode::OK, "ok".to_string()),
        Err(dead) => (StatusCode::INTERNAL_SERVER_ERROR, dead),
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
        .chain(state.store.list_rollouts().iter().map(|r| {
            let active = state.store.active_for(&r.policy.plugin.info().target);
            r.summary(active.as_deref())
        }))
        .collect();
    (
        [("content-type", "application/json")],
        serde_json::Value::Array(plugins).to_string(),
    )
}

#[cfg(test)]
mod tests {
    use super::*;

    fn loaded(names: &[&str]) -> Vec<String> {
        names.iter().map(|n| n.to_string()).collect()
    }

    #[test]
    fn not_ready_until_plugins_load_and_every_controller_syncs() {
        let health = Health::default();
        assert!(health.readiness(&[]).is_err(), "ready before loading");
        health.plugins_loaded();
        let missing = health
            .readiness(&loaded(&["etcd", "redis"]))
            .expect_err("ready before any controller synced");
        assert!(missing.contains("etcd, redis"), "{missing}");
        health.controller_synced("etcd");
        assert!(health.readiness(&loaded(&["etcd", "redis"])).is_err());
        health.controller_synced("redis");
        assert_eq!(health.readiness(&loaded(&["etcd", "redis"])), Ok(()));
        // A restarted controller is not ready until it has listed again.
        health.controller_stopped("redis");
        assert!(health.readiness(&loaded(&["etcd", "redis"])).is_err());
    }

    #[test]
    fn a_standby_is_ready_so_that_a_rollout_can_finish() {
        let health = Health::default();
        health.standby(true);
        assert_eq!(health.readiness(&loaded(&["etcd"])), Ok(()));
        // Once it leads, it is ready only when its controllers have synced.
        health.standby(false);
        health.plugins_loaded();
        assert!(health.readiness(&loaded(&["etcd"])).is_err());
    }

    #[test]
    fn a_dead_host_task_or_a_controller_that_keeps_dying_fails_liveness() {
        let health = Health::default();
        assert_eq!(health.liveness(), Ok(()));
        for _ in 1..MAX_CONTROLLER_DEATHS_IN_A_ROW {
            health.controller_died("etcd");
        }
        assert_eq!(health.liveness(), Ok(()), "restarts still in hand");
        health.controller_synced("etcd");
        for _ in 1..MAX_CONTROLLER_DEATHS_IN_A_ROW {
            health.controller_died("etcd");
        }
        assert_eq!(health.liveness(), Ok(()), "a sync resets the count");
        health.controller_died("etcd");
        assert!(health.liveness().is_err());

        let health = Health::default();
        health.task_ended("the supervisor panicked: boom".into());
        let dead = health.liveness().expect_err("a dead task fails liveness");
        assert!(dead.contains("supervisor panicked"), "{dead}");
    }
}
