//! policy-host: a Kubernetes operator that hands every domain decision to a sandboxed
//! WebAssembly plugin. Start with [`run`]; one policy's data path is
//! [`controller::reconcile`].
//!
//! The host does the Kubernetes work and nothing domain-specific. The modules, in the order
//! data flows through them:
//!
//! - [`contract`] — the WIT contract as Rust types; the ground floor, importing nothing of the
//!   host;
//! - [`load`] turns files and labelled ConfigMaps into checked, compiled plugins,
//!   [`policy_store`] holds what is loaded and swaps it atomically, and [`supervisor`] keeps one
//!   [`controller`] running per loaded policy; each reconcile is three stages, in one direction:
//! - [`observe`] — the parent custom resource, the children it controls and the time;
//! - [`decide`] — the plugin, in its wasmtime sandbox, turns that into a decision; its only
//!   ways out are the [`capability`] doors (HTTP app-calls, TLS, exchanges), checked against
//!   what the parent controls and the admin granted;
//! - [`act`] — the decision becomes server-side applies, deletes, status and Events;
//! - [`shadow`] — a candidate plugin decides beside the active one, compared, never acted on.
//!
//! Of several replicas, only the one that holds the [`leader`] Lease runs controllers; several
//! host deployments can split the parents among them as [`shard`]s, each with its own Lease;
//! [`orphans`] releases the finalizers of plugins that are gone. Around them: [`admin`] (health, readiness, metrics), [`metrics`], [`telemetry`], and
//! [`plugin_cli`] (`pack`, `validate`, `simulate` for plugin authors).

pub mod contract;
// Beside the contract: how an API error reads, for every stage that writes.
pub mod api_error;

pub mod leader;
pub mod load;
pub mod orphans;
pub mod policy_store;
pub mod shard;
pub mod supervisor;

// One reconcile, in data-path order (one line each: rustfmt sorts a group alphabetically).
pub mod controller;

pub mod observe;

pub mod decide;

pub mod capability;

pub mod act;
// What the act stage checks pods against: the pod-security level of the plugin's grant.
pub mod pod_security;
// ...and the images they run and the Secrets they use: the grant's allow-list, opted-in Secrets.
pub mod pod_inputs;

pub mod shadow;
// Beside act: the host's own writes for a parent's opt-in chaos drill.
pub mod chaos;

pub mod admin;
pub mod metrics;
pub mod plugin_cli;
pub mod telemetry;

use std::net::SocketAddr;
use std::path::PathBuf;

use futures::future::{BoxFuture, FutureExt, Shared};
use kube::Client;

use crate::admin::Health;
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
    /// The app-call HTTP client could not be built.
    #[error(transparent)]
    HttpClient(#[from] capability::http::HttpClientError),
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
    /// Leader election among replicas (`None`: this replica always leads). With several
    /// shards (`controller.shard`), the Lease's name is the base of each shard's own:
    /// `<name>-shard-<index>` ([`shard::Shard::lease_name`]), so shards never share a Lease.
    pub leader_election: Option<LeaseSettings>,
    /// The keys plugin ConfigMaps must be signed by (empty: any pack loads).
    pub trust: load::trust::TrustPolicy,
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
    // Built once here so that a host that cannot speak to its pods says so at start, not at
    // its first app-call.
    capability::http::http_client()?;
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
    let health = Health::default();
    let mut admin_addr = None;
    let mut tasks = tokio::task::JoinSet::new();
    if let Some(addr) = settings.admin_addr {
        let (bound, server) = admin::serve(addr, metrics.clone(), health.clone(), store.clone())
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
            "the admin endpoint"
        });
    }

    let shard = settings.controller.shard;
    if shard.count() > 1 {
        tracing::info!(%shard, "reconciling only this shard's parents");
    }
    let (mut elector, leadership) = match settings.leader_election.clone() {
        Some(mut lease) => {
            lease.name = shard.lease_name(&lease.name);
            let (elector, leadership) = LeaseElector::new(client.clone(), lease);
            health.standby(true);
            (Some(elector), leadership)
        }
        None => (None, Leadership::always()),
    };
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
        health.standby(false);
    }

    // Leading: everything that writes starts now. `stop` ends it on shutdown; a lost Lease
    // ends it harder (below).
    let (stop_tx, stop_rx) = tokio::sync::oneshot::channel::<()>();
    let stop: Shared<BoxFuture<'static, ()>> = async move {
        let _ = stop_rx.await;
    }
    .boxed()
    .shared();
    tasks.spawn(
        supervisor::supervise(
            client.clone(),
            store.clone(),
            metrics.clone(),
            health.clone(),
            settings.controller.clone(),
            stop.clone(),
        )
        .map(|()| "the controller supervisor"),
    );
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
        )
        .with_trust(settings.trust.clone());
        let (listed_tx, listed_rx) = tokio::sync::oneshot::channel();
        let loaded = health.clone();
        tokio::spawn(async move {
            if listed_rx.await.is_ok() {
                loaded.plugins_loaded();
            }
        });
        tasks.spawn(
            source
                .on_first_list(listed_tx)
                .run(stop.clone())
                .map(|()| "the plugin ConfigMap watch"),
        );
        tasks.spawn(
            load::status::publish(client.clone(), namespace, store.clone(), stop.clone())
                .map(|()| "the load status publisher"),
        );
    } else {
        health.plugins_loaded();
    }
    // A task that ends before shutdown (or panics) leaves the host without a part it needs:
    // `/healthz` fails so that the kubelet restarts the host (review #20).
    let mut stopping = shutdown.clone();
    let lost: Option<LostLease> = loop {
        let hold = async {
            match elector.as_mut() {
                Some(elector) => elector.hold().await,
                None => std::future::pending().await,
            }
        };
        tokio::select! {
            () = &mut stopping => break None,
            lost = hold => break Some(lost),
            ended = tasks.join_next() => match ended {
                None => {
                    (&mut stopping).await;
                    break None;
                }
                Some(Ok(task)) => {
                    tracing::error!(task, "a host task ended before shutdown; /healthz now fails");
                    health.task_ended(format!("{task} ended"));
                }
                Some(Err(error)) => {
                    tracing::error!(%error, "a host task panicked; /healthz now fails");
                    health.task_ended(format!("a host task panicked: {error}"));
                }
            },
        }
    };
    if let Some(lost) = lost {
        // Not a graceful stop: another replica may lead within the lease duration, so every
        // task is aborted now (the supervisor aborts its controllers as it drops).
        tasks.abort_all();
        return Err(HostError::LeadershipLost(lost));
    }
    tracing::info!("shutting down: no new reconciles; finishing those in flight");
    let _ = stop_tx.send(());
    while tasks.join_next().await.is_some() {}
    if let Some(elector) = elector.as_mut()
        && let Err(error) = elector.release().await
    {
        tracing::warn!(%error, "could not release the Lease; a standby takes over when it expires");
    }
    Ok(())
}
