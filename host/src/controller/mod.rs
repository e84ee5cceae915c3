//! The controller of one loaded policy: watches its target kind and declared child kinds, and
//! runs observe → decide → act for each parent that changes.
//!
//! The host knows no CRD at compile time: everything is a `DynamicObject` addressed by what the
//! plugin declared. Children are watched only when they carry the host's policy label, and
//! each change triggers the parent named in its controller owner reference. Requeues are kept
//! by the host, not kube-runtime ([`requeue`]): parents due are reconciled in turn, after
//! changes.
//!
//! [`reconcile`] is the data path, one step per module: the version that decides under a
//! staged rollout and the tally of its outcome ([`rollout`]), the own-write deferral
//! ([`own_writes`]), the finalizers ([`finalizers`]), a sharded host's adoption of the children
//! of a parent new to its shard ([`adopt`]), the finalize branch ([`finalize`]),
//! the shadow dispatch ([`shadow`]), the chaos drill ([`drill`]), the requeue ([`requeue`]) and
//! the retry of a failed reconcile ([`retry`]).

mod adopt;
mod drill;
mod finalize;
mod finalizers;
mod own_writes;
mod requeue;
mod retry;
mod rollout;
mod shadow;

use std::sync::Arc;
use std::time::{Duration, Instant};

use futures::{StreamExt, TryStreamExt};
use kube::api::{Api, ApiResource, DynamicObject};
use kube::runtime::controller::{Action as KubeAction, Config as ControllerConfig};
use kube::runtime::reflector::{self, ObjectRef};
use kube::runtime::{Controller, WatchStreamExt, watcher};
use kube::{Client, Resource, ResourceExt};

use crate::act::{ActError, Carried, Executor, api_resource};
use crate::capability::credentials::{CredentialParent, CredentialSource, LiveCredentials};
use crate::capability::metrics::MetricReport;
use crate::capability::scope::AppCallScope;
use crate::chaos::ChaosSchedule;
use crate::contract::Action;
use crate::decide::DecideError;
use crate::metrics::Metrics;
use crate::observe::admission::{CacheLimits, DEFAULT_CHILD_LIMITS, DEFAULT_PARENT_LIMITS};
use crate::observe::cache::{CacheBounds, child_selector, watch_children, watch_parents};
use crate::observe::{CachedChild, ChildCache, Observed, observe};
use crate::policy_store::{LoadedPolicy, PolicyStore};
use crate::shadow::ComparableDecision;
use crate::shard::Shard;

use self::own_writes::OwnWrites;
use self::requeue::Action as ControllerAction;
use self::requeue::{ParentRef, Requeues};
use self::retry::{Failures, error_policy};
use self::rollout::Placements;

pub use self::finalize::{DEFAULT_FINALIZER_GRACE, deleting_for};
pub use self::finalizers::FINALIZER_PREFIX;
pub use self::requeue::{DEFAULT_RESYNC, MIN_REQUEUE, requeue_delay};
pub use crate::decide::sandbox::SHADOW_RUNS_IN_FLIGHT;

/// How long the first list of the child caches may take before the controller warns.
const SYNC_WARNING_AFTER: Duration = Duration::from_secs(30);

/// Forgets the failures, drill, placement and plugin metric series of a parent that left the
/// parent cache: on its delete event (a parent deleted without a finalizer is never reconciled
/// again), and on a re-list's end for every parent the new list lacks (deleted while the watch
/// was down). Called after the store applied the event.
fn forget_departed(
    event: &watcher::Event<DynamicObject>,
    parents: &reflector::Store<DynamicObject>,
    resource: &ApiResource,
    failures: &Failures,
    chaos: &ChaosSchedule,
    placements: &Placements,
    (metrics, policy): (&Metrics, &str),
) {
    match event {
        watcher::Event::Delete(parent) => {
            failures.forget(&ObjectRef::from_obj_with(parent, resource.clone()));
            if let Some(uid) = parent.uid() {
                chaos.forget(&uid);
                placements.forget(&uid);
            }
            let namespace = parent.namespace().unwrap_or_default();
            metrics.plugin_parent_gone(policy, &namespace, &parent.name_any());
        }
        watcher::Event::InitDone => {
            failures.retain(|parent| parents.get(parent).is_some());
            let listed: std::collections::HashSet<String> =
                parents.state().iter().filter_map(|p| p.uid()).collect();
            chaos.retain(|uid| listed.contains(uid));
            placements.retain(|uid| listed.contains(uid));
            metrics.plugin_parents_retain(policy, |namespace, name| {
                let mut key = ObjectRef::new_with(name, resource.clone());
                key.namespace = (!namespace.is_empty()).then(|| namespace.to_string());
                parents.get(&key).is_some()
            });
        }
        _ => {}
    }
}

/// Why one reconcile failed. Each is logged, counted, recorded as an Event on the parent and
/// retried with backoff.
#[derive(Debug, thiserror::Error)]
pub enum ReconcileError {
    /// The policy was unloaded while its controller still ran.
    #[error("policy `{0}` is no longer loaded")]
    PolicyGone(String),
    /// The observation could not be built.
    #[error("cannot encode the observation: {0}")]
    Observe(#[from] serde_json::Error),
    /// The plugin gave no decision.
    #[error(transparent)]
    Decide(#[from] DecideError),
    /// The decision could not be carried out.
    #[error(transparent)]
    Act(#[from] ActError),
    /// The host panicked while running the plugin (a host bug, contained to this reconcile).
    #[error(
        "the host panicked while {doing}: {message}; this is a bug in policy-host (the plugin may have provoked it), please report it"
    )]
    HostPanicked {
        /// What it was doing.
        doing: String,
        /// The panic message.
        message: String,
    },
    /// The controller could not be set up (its app-call client).
    #[error("{0}")]
    Setup(String),
    /// A child cache refused a child of the parent's namespace at its bounds: the view may lack
    /// one of the parent's children, and a decision on it could recreate or write off what
    /// exists.
    #[error(
        "the {kind} cache of policy `{policy}` is at its bounds and refused an object of namespace {namespace}, so this parent's view may be incomplete and it is not decided; remove the objects labelled policy-host.io/policy={policy} that no parent needs, or raise the host's cache bounds"
    )]
    ChildCacheFull {
        /// The policy.
        policy: String,
        /// The child kind whose cache is full.
        kind: String,
        /// The parent's namespace.
        namespace: String,
    },
    /// The children of a parent new to this shard could not be labelled for it.
    #[error(transparent)]
    Adopt(#[from] adopt::AdoptError),
    /// The host's own bookkeeping write (finalizer) failed.
    #[error(
        "updating the finalizer of {parent} failed: {}",
        crate::act::api_error_text(source)
    )]
    Finalizer {
        /// namespace/name.
        parent: String,
        /// The API error.
        #[source]
        source: kube::Error,
    },
}

impl ReconcileError {
    /// A short CamelCase reason for Events and metrics.
    pub fn reason(&self) -> &str {
        match self {
            ReconcileError::PolicyGone(_) => "PolicyUnloaded",
            ReconcileError::Observe(_) => "ObservationFailed",
            ReconcileError::Decide(e) => e.reason(),
            ReconcileError::Act(e) => e.reason(),
            ReconcileError::HostPanicked { .. } => "HostPanicked",
            ReconcileError::Setup(_) => "HostSetupFailed",
            ReconcileError::Finalizer { .. } => "FinalizerUpdateFailed",
            ReconcileError::ChildCacheFull { .. } => "ChildCacheFull",
            ReconcileError::Adopt(_) => "ChildrenNotAdopted",
        }
    }
}

/// What every reconcile of one policy shares.
pub struct PolicyController {
    client: Client,
    store: PolicyStore,
    policy: String,
    caches: Vec<ChildCache>,
    parent_resource: ApiResource,
    executor: Executor,
    metrics: Metrics,
    http: reqwest::Client,
    /// Certificates for app-calls over HTTPS, from Secrets of the parents' namespaces.
    tls: crate::capability::tls::AppTls,
    /// The parents this host reconciles (its shard's), as the watch last saw them.
    parents: reflector::Store<DynamicObject>,
    /// Consecutive failures per parent, for the backoff; forgotten when the parent leaves.
    failures: Arc<Failures>,
    /// Parent views superseded by the host's own writes.
    own_writes: OwnWrites,
    finalizer_grace: Duration,
    /// Permits for shadow runs in flight (see [`SHADOW_RUNS_IN_FLIGHT`]).
    shadow_slots: Arc<tokio::sync::Semaphore>,
    /// The parents' chaos drills (`policy-host.io/chaos`).
    chaos: Arc<ChaosSchedule>,
    /// The parents' requeues, kept out of kube-runtime's scheduler.
    requeues: Arc<Requeues>,
    /// Which version last decided for each parent (staged rollouts).
    placements: Arc<Placements>,
    /// The shard this host serves: its child caches hold only its parents' children.
    shard: Shard,
    /// The children of parents new to this shard, until its caches hold them.
    arrivals: adopt::Arrivals,
}

/// Options for a policy's controller.
#[derive(Clone, Debug)]
pub struct ControllerOptions {
    /// Parents reconciled at the same time.
    pub concurrency: u16,
    /// Watch parents and children only in this namespace (`None`: every namespace).
    pub namespace: Option<String>,
    /// How long a deleting parent's finalizer is held when its finalize keeps failing or no
    /// loaded policy reconciles its kind (see [`DEFAULT_FINALIZER_GRACE`]).
    pub finalizer_grace: Duration,
    /// The shard of the parents this host reconciles ([`Shard::whole`]: all of them).
    pub shard: Shard,
    /// The bounds of each child cache ([`DEFAULT_CHILD_LIMITS`]).
    pub child_cache: CacheLimits,
    /// The bounds of the parent cache ([`DEFAULT_PARENT_LIMITS`]).
    pub parent_cache: CacheLimits,
}

impl Default for ControllerOptions {
    fn default() -> Self {
        Self {
            concurrency: 8,
            namespace: None,
            finalizer_grace: DEFAULT_FINALIZER_GRACE,
            shard: Shard::whole(),
            child_cache: DEFAULT_CHILD_LIMITS,
            parent_cache: DEFAULT_PARENT_LIMITS,
        }
    }
}

/// Every object of `resource`, in the watched namespace or in all of them.
fn scoped_api<K>(client: &Client, resource: &ApiResource, namespace: Option<&str>) -> Api<K>
where
    K: kube::Resource<DynamicType = ApiResource, Scope = kube::core::DynamicResourceScope>,
{
    match namespace {
        Some(namespace) => Api::namespaced_with(client.clone(), namespace, resource),
        None => Api::all_with(client.clone(), resource),
    }
}

/// Runs the controller of the policy called `policy` until `shutdown` resolves.
///
/// No parent is decided before the parents and every child kind are listed; `on_synced` is
/// called then (readiness).
pub async fn run(
    client: Client,
    store: PolicyStore,
    policy: String,
    metrics: Metrics,
    options: ControllerOptions,
    on_synced: impl FnOnce() + Send,
    shutdown: impl std::future::Future<Output = ()> + Send + Sync + 'static,
) -> Result<(), ReconcileError> {
    let loaded = store
        .get(&policy)
        .ok_or_else(|| ReconcileError::PolicyGone(policy.clone()))?;
    let info = loaded.plugin.info().clone();
    let parent_resource = api_resource(&info.target);
    let namespace = options.namespace.as_deref();
    let parents: Api<DynamicObject> = scoped_api(&client, &parent_resource, namespace);

    // The parent reflector is built here rather than by `Controller::new_with` so that its
    // stream can be held back until every child cache has listed: kube-runtime delays
    // reconciles until the *parent* store is ready, and nothing else. A parent decided before
    // its children are listed looks childless, and a plugin then recreates or writes off
    // children that exist (review #1).
    let bounds = CacheBounds {
        policy: policy.clone(),
        metrics: metrics.clone(),
        children: options.child_cache,
        parents: options.parent_cache,
    };
    let (parent_store, parent_stream) = watch_parents(
        parents,
        parent_resource.clone(),
        watcher::Config::default(),
        options.shard,
        &bounds,
    );
    let failures = Arc::new(Failures::default());
    let chaos = Arc::new(ChaosSchedule::default());
    let placements = Arc::new(Placements::default());
    let parent_stream = parent_stream
        .inspect_ok({
            let (store, resource) = (parent_store.clone(), parent_resource.clone());
            let (failures, chaos, placements) =
                (failures.clone(), chaos.clone(), placements.clone());
            let (metrics, policy) = (metrics.clone(), policy.clone());
            move |event| {
                let exported = (&metrics, policy.as_str());
                forget_departed(
                    event,
                    &store,
                    &resource,
                    &failures,
                    &chaos,
                    &placements,
                    exported,
                )
            }
        })
        .applied_objects();
    let parents_listed = parent_store.clone();
    let parents_held = parent_store.clone();
    let cached_parents = parent_store.clone();
    let requeues = Requeues::new(options.concurrency);
    let mut caches = Vec::new();
    let mut child_streams = Vec::new();
    for kind in &info.children {
        let resource = api_resource(kind);
        let children = scoped_api(&client, &resource, namespace);
        // A sharded host caches only its own parents' children: the host labels each child it
        // applies with its parent's shard ([`adopt`] labels those it finds unlabelled).
        let config = watcher::Config::default().labels(&child_selector(&policy, options.shard));
        let (cache, stream) = watch_children(
            children,
            kind.clone(),
            resource.clone(),
            config,
            &info.target,
            &bounds,
        );
        child_streams.push((stream.touched_objects(), resource));
        caches.push(cache);
    }
    let children_listed = children_synced(
        policy.clone(),
        caches.iter().map(|c| c.store.clone()).collect(),
    );
    let gated_parents = futures::stream::once(async move {
        children_listed.await;
        parent_stream
    })
    .flatten();
    let mut controller =
        Controller::for_stream_with(gated_parents, parent_store, parent_resource.clone())
            .with_config(ControllerConfig::default().concurrency(options.concurrency))
            // A newly loaded version decides for every parent at once (hot swap), and so does
            // a rollout loaded, widened, rolled back or ended: each parent moves at once.
            .reconcile_all_on(store.replacements(&policy))
            .reconcile_all_on(store.rollout_changes(&info.target.to_string()))
            .reconcile_on(
                requeues
                    .clone()
                    .due_parents(move |parent| cached_parents.get(parent).is_some()),
            );
    for (stream, resource) in child_streams {
        controller = controller.owns_stream_with(stream, resource);
    }
    let tls = crate::capability::tls::AppTls::new(client.clone());
    let context = Arc::new(PolicyController {
        executor: Executor::new(client.clone(), loaded.plugin.label(), &info)
            .with_metrics(metrics.clone(), &policy)
            .with_child_shard(options.shard.child_label()),
        client,
        store,
        policy: policy.clone(),
        caches,
        parent_resource,
        metrics,
        http: crate::capability::http::http_client()
            .map_err(|e| ReconcileError::Setup(e.to_string()))?,
        tls,
        parents: parents_held,
        failures,
        own_writes: OwnWrites::default(),
        shadow_slots: Arc::new(tokio::sync::Semaphore::new(SHADOW_RUNS_IN_FLIGHT)),
        finalizer_grace: options.finalizer_grace,
        chaos,
        requeues,
        placements,
        shard: options.shard,
        arrivals: adopt::Arrivals::default(),
    });
    tracing::info!(
        policy = %policy,
        plugin = loaded.plugin.label(),
        target = %info.target,
        children = ?info.children.iter().map(|k| k.to_string()).collect::<Vec<_>>(),
        "controller started"
    );
    let outcomes = context.clone();
    let running = controller
        .graceful_shutdown_on(shutdown)
        .run(reconcile_in_turn, error_policy_in_turn, context)
        .for_each(move |outcome| {
            if let Err(error) = outcome {
                if let kube::runtime::controller::Error::ObjectNotFound(gone) = &error {
                    outcomes.parent_gone(gone);
                }
                tracing::debug!(%error, "reconcile did not complete");
            }
            std::future::ready(())
        });
    tokio::pin!(running);
    // The parents are listed only after every child kind (see above): their store being
    // ready means the whole view is.
    tokio::select! {
        () = &mut running => {}
        listed = parents_listed.wait_until_ready() => {
            if listed.is_ok() {
                tracing::info!(policy = %policy, "controller synced: parents and children listed");
                on_synced();
            }
            running.await;
        }
    }
    tracing::info!(policy = %policy, "controller stopped");
    Ok(())
}

/// Resolves once every child cache has finished its first list. The watches are polled by the
/// controller meanwhile (they are its trigger streams), so this only waits, it drives nothing.
async fn children_synced(policy: String, stores: Vec<reflector::Store<CachedChild>>) {
    let all = futures::future::join_all(stores.iter().map(|s| s.wait_until_ready()));
    tokio::pin!(all);
    // A list that does not come (RBAC, an API server in trouble) holds every decision of this
    // policy back; say so instead of waiting in silence.
    loop {
        match tokio::time::timeout(SYNC_WARNING_AFTER, &mut all).await {
            Ok(_) => break,
            Err(_) => tracing::warn!(
                policy = %policy,
                waited = ?SYNC_WARNING_AFTER,
                "child caches not listed yet; no parent is decided until they are (check the host's RBAC for the child kinds and the API server)"
            ),
        }
    }
    tracing::debug!(policy = %policy, "child caches listed");
}

/// Runs plugin code on a thread of tokio's blocking pool, never on the controller's task.
///
/// kube-runtime polls every reconcile of a policy inside one task, and a wasm loop under
/// `epoch_deadline_trap` never yields: run inline, one parent looping up to its deadline
/// would freeze the policy's other reconciles and its watches, and they would miss their own
/// deadlines (review #7a). On its own thread the plugin can only hold that thread; the
/// deadline still ends it. A panic there (a host bug a plugin provoked) fails this reconcile
/// instead of killing the controller. The cost, one thread hand-off per decision, is in
/// BENCHMARKS.md ("Off-task decisions").
pub async fn off_task<T: Send + 'static>(
    doing: &str,
    work: impl std::future::Future<Output = T> + Send + 'static,
) -> Result<T, ReconcileError> {
    let runtime = tokio::runtime::Handle::current();
    tokio::task::spawn_blocking(move || runtime.block_on(work))
        .await
        .map_err(|error| ReconcileError::HostPanicked {
            doing: doing.to_string(),
            message: panic_message(error),
        })
}

fn panic_message(error: tokio::task::JoinError) -> String {
    match error.try_into_panic() {
        Ok(payload) => payload
            .downcast_ref::<&str>()
            .map(|s| s.to_string())
            .or_else(|| payload.downcast_ref::<String>().cloned())
            .unwrap_or_else(|| "a panic without a message".to_string()),
        Err(error) => error.to_string(),
    }
}

/// [`reconcile`] as kube-runtime runs it: counted as running while it runs, its requeue kept in
/// the host's queue ([`requeue`]), and kube-runtime told to await a change.
async fn reconcile_in_turn(
    parent: Arc<DynamicObject>,
    ctx: Arc<PolicyController>,
) -> Result<KubeAction, ReconcileError> {
    let key = ParentRef::from_obj_with(parent.as_ref(), ctx.parent_resource.clone());
    let running = ctx.requeues.started(&key);
    let outcome = reconcile(parent, ctx.clone()).await;
    if let Ok(next) = &outcome {
        ctx.requeues
            .schedule(key, *next, tokio::time::Instant::now());
    }
    drop(running);
    outcome.map(|_| KubeAction::await_change())
}

/// [`error_policy`] as kube-runtime calls it: its retry kept in the host's queue.
fn error_policy_in_turn(
    parent: Arc<DynamicObject>,
    error: &ReconcileError,
    ctx: Arc<PolicyController>,
) -> KubeAction {
    let key = ParentRef::from_obj_with(parent.as_ref(), ctx.parent_resource.clone());
    let retry = error_policy(parent, error, ctx.clone());
    ctx.requeues
        .schedule(key, retry, tokio::time::Instant::now());
    KubeAction::await_change()
}

/// One parent's reconcile: the version that decides for it (the active plugin, or a staged
/// rollout's candidate), its decision, and the outcome tallied for the rollout ([`rollout`]).
async fn reconcile(
    parent: Arc<DynamicObject>,
    ctx: Arc<PolicyController>,
) -> Result<ControllerAction, ReconcileError> {
    let version = ctx.version_for(&parent).await?;
    let mut decided = None;
    let outcome = reconcile_with(parent.clone(), &ctx, version.loaded.clone(), &mut decided).await;
    ctx.tally(&parent, &version, outcome.as_ref().map(|_| ()), decided);
    outcome
}

/// One parent's reconcile by `loaded`, step by step: observe → decide → act, with the host's
/// own steps around it (each in a module of its own). `decided` becomes `Some(degraded)` once
/// the plugin decided, `degraded` when its status turns the parent's `Degraded` condition on.
async fn reconcile_with(
    parent: Arc<DynamicObject>,
    ctx: &Arc<PolicyController>,
    loaded: Arc<LoadedPolicy>,
    decided: &mut Option<bool>,
) -> Result<ControllerAction, ReconcileError> {
    let plugin = &loaded.plugin;
    let label = format!(
        "{}/{}",
        parent.namespace().unwrap_or_default(),
        parent.name_any()
    );
    if let Some(deferred) = ctx.defer_for_own_write(&parent, &label) {
        return Ok(deferred);
    }
    ctx.metrics.reconcile_started(&ctx.policy);
    // The moment a reconcile starts, for the bench that times a change to a parent until its
    // reconcile (tests/e2e/benches/reconcile_latency.rs, issue 17): TRACE only, so it costs
    // a disabled callsite's check unless a subscriber asks for it.
    tracing::trace!(
        parent = %label,
        resource_version = parent.resource_version().as_deref().unwrap_or_default(),
        "reconcile started"
    );
    let deleting = parent.meta().deletion_timestamp.is_some();
    if deleting {
        ctx.chaos.forget(&parent.uid().unwrap_or_default());
    }
    if let Some(settled) = ctx
        .settle_finalizers(&parent, deleting, plugin.info().wants_finalizer)
        .await?
    {
        return Ok(settled);
    }
    if let Some(adopting) = ctx.adopt_children(&parent, &label).await? {
        return Ok(adopting);
    }

    if let Some(full) = ctx
        .caches
        .iter()
        .find(|c| c.incomplete(parent.namespace().as_deref()))
    {
        return Err(ReconcileError::ChildCacheFull {
            policy: ctx.policy.clone(),
            kind: full.kind.to_string(),
            namespace: parent.namespace().unwrap_or_default(),
        });
    }
    let observed = observe(&parent, &ctx.caches)?;
    let scope = AppCallScope::new(
        label.clone(),
        observed.pods.clone(),
        loaded.grants.clone(),
        ctx.http.clone(),
    )
    .with_tls(ctx.tls.clone(), parent.namespace().unwrap_or_default())
    .with_credentials(CredentialSource::Live(Box::new(LiveCredentials {
        client: ctx.client.clone(),
        parent: CredentialParent {
            namespace: parent.namespace().unwrap_or_default(),
            name: parent.name_any(),
            api_version: plugin.info().target.api_version(),
            kind: plugin.info().target.kind.clone(),
            uid: parent.metadata.uid.clone().unwrap_or_default(),
        },
        opt_in_label: crate::pod_inputs::mountable_label(&plugin.info().name),
        may_create: true,
    })));
    let started = Instant::now();
    if deleting {
        return ctx
            .finalize(&parent, &loaded, observed, scope, &label, started)
            .await;
    }

    let (shadow, scope) = ctx.shadow_of(&plugin.info().target, scope);
    let doing = format!("reconciling {label}");
    let (observed, decision, reported) = off_task(&doing, {
        let (plugin, doing) = (plugin.clone(), doing.clone());
        async move {
            let decided = plugin
                .reconcile_reporting(&observed.observation, scope, &doing)
                .await;
            let (decision, reported) = match decided {
                Ok((decision, reported)) => (Ok(decision), reported),
                Err(error) => (Err(error), MetricReport::default()),
            };
            (observed, decision, reported)
        }
    })
    .await?;
    ctx.metrics.decision_took(&ctx.policy, started.elapsed());
    if let Some((candidate, recorder)) = shadow {
        ctx.shadow(
            &parent,
            plugin.label(),
            candidate,
            observed.observation.clone(),
            ComparableDecision::of(&decision),
            recorder,
        );
    }
    let decision = decision?;
    *decided = Some(decision.actions.iter().any(|action| {
        matches!(action, Action::SetStatus(status)
            if crate::rollout::degraded_caused(parent.data.get("status"), status))
    }));
    tracing::debug!(
        parent = %label,
        plugin = plugin.label(),
        actions = decision.actions.len(),
        requeue_after_ms = ?decision.requeue_after_ms,
        "decided"
    );
    if ctx.left_the_cache(&parent) {
        return Ok(ControllerAction::await_change());
    }
    let carried = ctx
        .carry_out(&parent, &loaded, &observed, decision.actions)
        .await;
    // Gauges are what the plugin saw; counters count only what was carried out.
    let parent_name = (parent.namespace().unwrap_or_default(), parent.name_any());
    ctx.metrics.plugin_reported(
        &ctx.policy,
        (&parent_name.0, &parent_name.1),
        plugin.declared_metrics(),
        &reported,
        carried.is_ok(),
    );
    carried?;
    // After the decision is carried out, never instead of it: a drill only adds a kill.
    let drill_due = ctx.chaos_drill(&parent, &observed, &loaded.grants).await;
    ctx.succeeded(&parent);
    Ok(requeue::after_decision(
        decision.requeue_after_ms,
        drill_due,
    ))
}

impl PolicyController {
    /// Carries out `actions`, decided for `parent` observed as `observed`, and keeps what that
    /// wrote: a status write supersedes the view ([`own_writes`]); applies sent and skipped
    /// are counted.
    async fn carry_out(
        &self,
        parent: &DynamicObject,
        loaded: &LoadedPolicy,
        observed: &Observed,
        actions: Vec<Action>,
    ) -> Result<(), ReconcileError> {
        let mut carried = Carried::default();
        let acted = self
            .executor
            .for_plugin(loaded.plugin.label())
            .with_grants(&loaded.grants)
            .apply_decision(parent, observed, actions, &mut carried)
            .await;
        // Before the outcome: a status written ahead of a failed action supersedes the view too.
        if carried.status_written {
            self.own_writes.wrote(parent);
        }
        self.metrics
            .child_applies(&self.policy, carried.applies_sent, carried.applies_skipped);
        acted?;
        Ok(())
    }

    /// A parent asked for is no longer in the cache (deleted, or moved to another shard):
    /// what the host kept for it goes.
    fn parent_gone(&self, parent: &ObjectRef<DynamicObject>) {
        let namespace = parent.namespace.as_deref().unwrap_or_default();
        self.metrics
            .plugin_parent_gone(&self.policy, namespace, &parent.name);
        self.executor
            .forget_parent(&format!("{namespace}/{}", parent.name));
        let mut key = ParentRef::new_with(&parent.name, self.parent_resource.clone());
        key.namespace = parent.namespace.clone();
        self.requeues.gone(&key);
    }

    /// Whether `parent` left this host's parent cache while its plugin decided: moved to
    /// another shard by its label, or deleted. Its decision is then not carried out: the shard
    /// it moved to decides afresh, and two shards' writes for one parent would interleave
    /// (review L6). App-calls the decision made are not undone; see [`crate::shard`].
    fn left_the_cache(&self, parent: &DynamicObject) -> bool {
        let key = ObjectRef::from_obj_with(parent, self.parent_resource.clone());
        if self.parents.get(&key).is_some() {
            return false;
        }
        self.metrics.reconcile_abandoned(&self.policy);
        tracing::info!(
            policy = %self.policy,
            parent = %format!("{}/{}", parent.namespace().unwrap_or_default(), parent.name_any()),
            "decision not carried out: the parent left this host's shard (or was deleted) while its plugin decided"
        );
        true
    }

    fn succeeded(&self, parent: &DynamicObject) {
        self.failures.forget(&ObjectRef::from_obj_with(
            parent,
            self.parent_resource.clone(),
        ));
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn parent_at(uid: &str, version: &str) -> DynamicObject {
        let mut parent = DynamicObject::new(
            uid,
            &ApiResource::erase::<k8s_openapi::api::core::v1::ConfigMap>(&()),
        );
        parent.metadata.uid = Some(uid.into());
        parent.metadata.resource_version = Some(version.into());
        parent
    }

    /// A parent deleted (or moved to another shard) without a reconcile after it left its
    /// failure count and drill behind; a parent whose delete the watch missed goes at the
    /// next re-list (review L3). Each row: the events after two parents failed and drilled,
    /// then the parents still remembered.
    #[test]
    fn what_the_controller_keeps_of_a_parent_goes_when_the_parent_leaves() {
        use kube::runtime::watcher::Event;
        let resource = ApiResource::erase::<k8s_openapi::api::core::v1::ConfigMap>(&());
        let rows: Vec<(&str, Vec<Event<DynamicObject>>, usize)> = vec![
            (
                "a deleted parent is forgotten",
                vec![Event::Delete(parent_at("a", "10"))],
                1,
            ),
            (
                "a re-list without a parent forgets it",
                vec![
                    Event::Init,
                    Event::InitApply(parent_at("b", "11")),
                    Event::InitDone,
                ],
                1,
            ),
            (
                "a change forgets nothing",
                vec![Event::Apply(parent_at("a", "12"))],
                2,
            ),
        ];
        for (situation, events, left) in rows {
            let mut writer = reflector::store::Writer::new(resource.clone());
            let store = writer.as_reader();
            let (failures, chaos) = (Failures::default(), ChaosSchedule::default());
            let placements = Placements::default();
            for uid in ["a", "b"] {
                let parent = parent_at(uid, "1");
                writer.apply_watcher_event(&Event::Apply(parent.clone()));
                failures.failed(ObjectRef::from_obj_with(&parent, resource.clone()));
                chaos.turn(uid, Some("kill-pod every=30s"), true, Instant::now());
                placements.placed_for_test(uid);
            }
            let metrics = Metrics::new();
            for event in events {
                writer.apply_watcher_event(&event);
                forget_departed(
                    &event,
                    &store,
                    &resource,
                    &failures,
                    &chaos,
                    &placements,
                    (&metrics, "p"),
                );
            }
            assert_eq!(failures.len(), left, "{situation}: failures");
            assert_eq!(chaos.len(), left, "{situation}: drills");
            assert_eq!(placements.len(), left, "{situation}: versions");
        }
    }
}
