//! policy-host: a Kubernetes operator that hands every domain decision to a sandboxed
//! WebAssembly plugin.
//!
//! The host does the Kubernetes work and nothing domain-specific. For each loaded policy it
//! runs one controller whose reconcile is three stages, in one direction:
//!
//! - [`observe`] — the parent custom resource, the children it controls and the time;
//! - [`decide`] — the plugin, in its wasmtime sandbox, turns that into a decision;
//! - [`act`] — the decision becomes server-side applies, deletes, status and Events.
//!
//! Plugins reach the outside only through [`app_call`] (over HTTPS with certificates from
//! [`app_tls`]) and [`app_exchange`]. Loading is a separate concern:
//! [`load`] turns files and labelled ConfigMaps into checked, compiled plugins,
//! [`policy_store`] holds what is loaded and swaps it atomically, and [`supervisor`] keeps one
//! controller running per loaded policy. Of several replicas, only the one that holds the
//! [`leader`] Lease runs them.

pub mod act;
pub mod admin;
pub mod app_call;
pub mod app_exchange;
pub mod app_tls;
pub mod controller;
pub mod decide;
pub mod leader;
pub mod load;
pub mod metrics;
pub mod observe;
pub mod plugin_cli;
pub mod policy_store;
pub mod shadow;
pub mod supervisor;
pub mod telemetry;

use std::net::SocketAddr;
use std::path::PathBuf;

use futures::future::{BoxFuture, FutureExt, Shared};
use kube::Client;

use crate::admin::Readiness;
use crate::controller::ControllerOptions;
use crate::decide::{Limits, Sandbox};
use crate::leader::{Leadership, LeaseElector, LeaseSettings, LostLease};
use crate::load::artifact_cache::ArtifactCache;
use crate::load::config_maps::ConfigMapSource;
use crate::load::pack::PackDefaults;
use crate::load::{LoadError, PluginLoader};
use crate::metrics::Metrics;
use crate::policy_store::PolicyStore;

/// Why the host could not run.
#[derive(Debug, thiserror::Error)]
pub enum HostError {
    /// A plugin could not be loaded at start.
    #[error(transparent)]
    Load(#[from] LoadError),
    /// The sandbox could not be built.
    #[error(transparent)]
    Sandbox(#[from] decide::DecideError),
    /// The admin endpoint could not bind.
    #[error("cannot serve the admin endpoint on {addr}: {source}; pick another --admin-addr")]
    Admin {
        /// The address.
        addr: SocketAddr,
        /// The I/O error.
        #[source]
        source: std::io::Error,
    },
    /// This replica led and lost the Lease: it stops at once, so that it never decides beside
    /// the replica that leads now (the kubelet restarts it as a standby).
    #[error(
        "lost leadership: {0}; stopping so that only the new leader decides (restarts as a standby)"
    )]
    LeadershipLost(LostLease),
    /// Two plugins claim the same custom resource kind.
    #[error("plugins `{first}` and `{second}` both reconcile {kind}; load only one of them")]
    SameTarget {
        /// First plugin.
        first: String,
        /// Second plugin.
        second: String,
        /// The contested kind.
        kind: String,
    },
}

/// How to run the host.
#[derive(Clone, Debug)]
pub struct Settings {
    /// Plugin files to load at start (granted what they ask for).
    pub policy_files: Vec<PathBuf>,
    /// Watch plugin ConfigMaps (label `policy-host.io/plugin=true`) in this namespace
    /// (`None`: load only `policy_files`).
    pub plugin_namespace: Option<String>,
    /// Where compiled plugins are cached across loads and restarts (`None`: no cache).
    pub artifact_cache: Option<PathBuf>,
    /// Limits every plugin file runs under, and the defaults of ConfigMap plugins.
    pub limits: Limits,
    /// Where `/healthz`, `/readyz` and `/metrics` are served (`None`: not served).
    pub admin_addr: Option<SocketAddr>,
    /// Controller options.
    pub controller: ControllerOptions,
    /// Leader election among replicas (`None`: this replica always leads).
    pub leader_election: Option<LeaseSettings>,
}

/// A running host's handles, for embedding (tests, benchmarks).
#[derive(Clone)]
pub struct Running {
    /// The loaded plugins.
    pub store: PolicyStore,
    /// The metrics.
    pub metrics: Metrics,
    /// The bound admin address, if served.
    pub admin_addr: Option<SocketAddr>,
    /// Whether this replica leads (always, without leader election).
    pub leadership: Leadership,
}

/// Loads the policies and runs their controllers until `shutdown` resolves.
///
/// Plugin files load before anything else (a bad file fails the start); plugin ConfigMaps are
/// then watched for the host's whole life, and the supervisor starts, restarts and stops one
/// controller per loaded policy as the store changes. `on_started` is called once the files
/// are loaded and the admin endpoint serves.
///
/// With leader election, the replica waits for the Lease before it watches plugin ConfigMaps
/// or starts a controller; on `shutdown` it stops taking reconciles, lets those in flight
/// finish (bounded by the supervisor's grace), releases the Lease and returns. A leader that
/// loses the Lease returns [`HostError::LeadershipLost`] at once, aborting its tasks.
pub async fn run(
    client: Client,
    settings: Settings,
    shutdown: impl std::future::Future<Output = ()> + Send + 'static,
    on_started: impl FnOnce(&Running),
) -> Result<(), HostError> {
    let shutdown: Shared<BoxFuture<'static, ()>> = shutdown.boxed().shared();
    let loader = PluginLoader::new(
        Sandbox::new()?,
        settings.artifact_cache.clone().map(ArtifactCache::new),
    );
    let store = PolicyStore::new();
    for path in &settings.policy_files {
        let policy = load::load_file(&loader, path, settings.limits.clone()).await?;
        tracing::info!(
            plugin = policy.plugin.label(),
            source = %policy.source,
            sha256 = policy.plugin.content_sha256(),
            target = %policy.plugin.info().target,
            grants = ?policy.grants,
            "plugin loaded"
        );
        if let Some(other) = store
            .list()
            .into_iter()
            .find(|p| p.plugin.info().target.to_string() == policy.plugin.info().target.to_string())
        {
            return Err(HostError::SameTarget {
                first: other.plugin.label().to_string(),
                second: policy.plugin.label().to_string(),
                kind: policy.plugin.info().target.to_string(),
            });
        }
        store.insert(policy);
    }

    let metrics = Metrics::new();
    let readiness = Readiness::default();
    let mut admin_addr = None;
    let mut tasks = tokio::task::JoinSet::new();
    if let Some(addr) = settings.admin_addr {
        let (bound, server) = admin::serve(addr, metrics.clone(), readiness.clone(), store.clone())
            .await
            .map_err(|source| HostError::Admin { addr, source })?;
        admin_addr = Some(bound);
        tracing::info!(%bound, "admin endpoint serving /healthz /readyz /metrics /plugins");
        let stop = shutdown.clone();
        tasks.spawn(async move {
            tokio::select! {
                result = server => if let Err(error) = result {
                    tracing::error!(%error, "admin endpoint failed");
                },
                () = stop => {}
            }
        });
    }

    let (mut elector, leadership) = match settings.leader_election.clone() {
        Some(lease) => {
            let (elector, leadership) = LeaseElector::new(client.clone(), lease);
            (Some(elector), leadership)
        }
        None => (None, Leadership::always()),
    };
    // A standby is ready: it serves and waits. Were it not, a rolling update of two replicas
    // would never finish, since the new pod cannot lead before the old one goes.
    readiness.set_ready();
    on_started(&Running {
        store: store.clone(),
        metrics: metrics.clone(),
        admin_addr,
        leadership,
    });
    if let Some(elector) = elector.as_mut() {
        tokio::select! {
            () = elector.acquire() => {}
            () = shutdown.clone() => {
                while tasks.join_next().await.is_some() {}
                return Ok(());
            }
        }
    }

    // Leading: everything that writes starts now. `stop` ends it on shutdown; a lost Lease
    // ends it harder (below).
    let (stop_tx, stop_rx) = tokio::sync::oneshot::channel::<()>();
    let stop: Shared<BoxFuture<'static, ()>> = async move {
        let _ = stop_rx.await;
    }
    .boxed()
    .shared();
    let mut leading = tokio::task::JoinSet::new();
    leading.spawn(supervisor::supervise(
        client.clone(),
        store.clone(),
        metrics.clone(),
        settings.controller.clone(),
        stop.clone(),
    ));
    if let Some(namespace) = settings.plugin_namespace.clone() {
        let source = ConfigMapSource::new(
            client.clone(),
            namespace.clone(),
            loader.clone(),
            store.clone(),
            metrics.clone(),
            PackDefaults {
                limits: settings.limits.clone(),
                concurrency: settings.controller.concurrency,
            },
        );
        leading.spawn(source.run(stop.clone()));
        leading.spawn(load::status::publish(
            client.clone(),
            namespace,
            store.clone(),
            stop.clone(),
        ));
    }

    let lost = match elector.as_mut() {
        Some(elector) => tokio::select! {
            lost = elector.hold() => Some(lost),
            () = shutdown.clone() => None,
        },
        None => {
            shutdown.clone().await;
            None
        }
    };
    if let Some(lost) = lost {
        // Not a graceful stop: another replica may lead within the lease duration, so every
        // task that writes is aborted now (dropping the sets aborts them; a process exit, which
        // the binary does next, ends the controllers they started).
        leading.abort_all();
        tasks.abort_all();
        return Err(HostError::LeadershipLost(lost));
    }
    tracing::info!("shutting down: no new reconciles; finishing those in flight");
    let _ = stop_tx.send(());
    while leading.join_next().await.is_some() {}
    if let Some(elector) = elector.as_mut()
        && let Err(error) = elector.release().await
    {
        tracing::warn!(%error, "could not release the Lease; a standby takes over when it expires");
    }
    while tasks.join_next().await.is_some() {}
    Ok(())
}
