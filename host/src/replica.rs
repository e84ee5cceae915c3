//! One replica of the host, from start to exit: load the plugin files, serve the admin
//! endpoint, stand by until this replica holds the Lease, lead (the controller supervisor, the
//! plugin ConfigMap watch, the load status), and on shutdown hand over.
//!
//! A rollout is a handover, not an overlap: the leader keeps renewing its Lease while it
//! drains (the reconciles in flight finish and write), releases it only once nothing it
//! started can write any more, and stops at once, abandoning the drain, if it loses the Lease
//! meanwhile. So the standby's first write comes after the old leader's last.

use std::net::SocketAddr;
use std::path::PathBuf;

use futures::future::{BoxFuture, FutureExt, Shared};
use kube::Client;
use tokio::task::JoinSet;

use crate::admin::{self, Health};
use crate::capability;
use crate::controller::ControllerOptions;
use crate::decide::{Limits, Sandbox};
use crate::leader::{Leadership, LeaseElector, LeaseSettings};
use crate::load::artifact_cache::ArtifactCache;
use crate::load::config_maps::ConfigMapSource;
use crate::load::pack::PackDefaults;
use crate::load::{self, PluginLoader};
use crate::metrics::Metrics;
use crate::policy_store::PolicyStore;
use crate::{HostError, supervisor};

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
    /// `<name>-shard-<index>` ([`crate::shard::Shard::lease_name`]), so shards never share a Lease.
    pub leader_election: Option<LeaseSettings>,
    /// The keys plugin ConfigMaps must be signed by (empty: any pack loads).
    pub trust: load::trust::TrustPolicy,
    /// The largest component a plugin ConfigMap may have pulled from a registry
    /// ([`load::oci::DEFAULT_MAX_PULL_BYTES`] by default).
    pub max_pulled_plugin_bytes: u64,
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

/// A future every part of the host can wait on: the shutdown signal, or the leader's stop.
type Signal = Shared<BoxFuture<'static, ()>>;

/// Loads the policies and runs their controllers until `shutdown` resolves.
///
/// Plugin files load before anything else (a bad file fails the start); plugin ConfigMaps are
/// then watched for the host's whole life, and the supervisor starts, restarts and stops one
/// controller per loaded policy as the store changes. `on_started` is called once the files
/// are loaded and the admin endpoint serves.
///
/// With leader election, the replica waits for the Lease before it watches plugin ConfigMaps
/// or starts a controller; on `shutdown` it stops taking reconciles and lets those in flight
/// finish (bounded by the supervisor's grace) while it goes on renewing the Lease, then
/// releases it and returns. A leader that loses the Lease, leading or draining, returns
/// [`HostError::LeadershipLost`] at once, aborting its tasks.
pub async fn run(
    client: Client,
    settings: Settings,
    shutdown: impl std::future::Future<Output = ()> + Send + 'static,
    on_started: impl FnOnce(&Running),
) -> Result<(), HostError> {
    let shutdown: Signal = shutdown.boxed().shared();
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
    let mut tasks = JoinSet::new();
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
    let (elector, leadership) = match settings.leader_election.clone() {
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
    let Some(mut elector) = elector else {
        lead(
            client, settings, loader, store, metrics, health, tasks, shutdown,
        )
        .await;
        return Ok(());
    };
    tokio::select! {
        () = elector.acquire() => {}
        () = shutdown.clone() => {
            while tasks.join_next().await.is_some() {}
            return Ok(());
        }
    }
    health.standby(false);
    // One renewal loop for the whole leadership, drain included. Losing the Lease drops
    // `lead` where it stands: its tasks are aborted with their JoinSet (the supervisor aborts
    // its controllers as it drops), since another replica may lead within the lease duration.
    let led = lead(
        client, settings, loader, store, metrics, health, tasks, shutdown,
    );
    if let Err(lost) = elector.while_holding(led).await {
        return Err(HostError::LeadershipLost(lost));
    }
    if let Err(error) = elector.release().await {
        tracing::warn!(%error, "could not release the Lease; a standby takes over when it expires");
    }
    Ok(())
}

/// Leads until `shutdown`, then drains: everything that writes starts here, and it returns
/// once every task has finished.
#[allow(clippy::too_many_arguments)]
async fn lead(
    client: Client,
    settings: Settings,
    loader: PluginLoader,
    store: PolicyStore,
    metrics: Metrics,
    health: Health,
    mut tasks: JoinSet<&'static str>,
    shutdown: Signal,
) {
    let (stop_tx, stop_rx) = tokio::sync::oneshot::channel::<()>();
    let stop: Signal = async move {
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
            loader,
            store.clone(),
            metrics,
            PackDefaults {
                limits: settings.limits.clone(),
                concurrency: settings.controller.concurrency,
            },
        )
        .with_trust(settings.trust.clone())
        .with_pull_limit(settings.max_pulled_plugin_bytes);
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
            load::status::publish(client, namespace, store, stop.clone())
                .map(|()| "the load status publisher"),
        );
    } else {
        health.plugins_loaded();
    }
    // A task that ends before shutdown (or panics) leaves the host without a part it needs:
    // `/healthz` fails so that the kubelet restarts the host (review #20).
    let mut stopping = shutdown;
    loop {
        tokio::select! {
            () = &mut stopping => break,
            ended = tasks.join_next() => match ended {
                None => {
                    (&mut stopping).await;
                    break;
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
    }
    tracing::info!("shutting down: no new reconciles; finishing those in flight");
    let _ = stop_tx.send(());
    while tasks.join_next().await.is_some() {}
}
