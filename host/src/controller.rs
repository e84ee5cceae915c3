//! The controller of one loaded policy: watches its target kind and declared child kinds, and
//! runs observe → decide → act for each parent that changes.
//!
//! The host knows no CRD at compile time: everything is a `DynamicObject` addressed by what the
//! plugin declared. Children are watched only when they carry the host's policy label, and
//! each change triggers the parent named in its controller owner reference. Requeues are kept
//! by the host, not kube-runtime ([`requeue`]): parents due are reconciled in turn, after
//! changes.

mod requeue;

use std::collections::HashMap;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use futures::{StreamExt, TryStreamExt};
use kube::api::{Api, ApiResource, DynamicObject, Patch, PatchParams};
use kube::runtime::controller::{Action as KubeAction, Config as ControllerConfig};
use kube::runtime::reflector::{self, ObjectRef};
use kube::runtime::{Controller, WatchStreamExt, watcher};
use kube::{Client, Resource, ResourceExt};
use serde_json::json;

use crate::act::{ActError, Carried, Executor, POLICY_LABEL, api_resource};
use crate::capability::replay::AppCallRecorder;
use crate::capability::scope::{AppCallScope, Grants};
use crate::chaos::{CHAOS_ANNOTATION, ChaosSchedule, Turn, pick_pod, progressing};
use crate::contract::{Event, EventType, Observation};
use crate::decide::DecideError;
use crate::metrics::Metrics;
use crate::observe::admission::{CacheLimits, DEFAULT_CHILD_LIMITS, DEFAULT_PARENT_LIMITS};
use crate::observe::cache::{CacheBounds, watch_children, watch_parents};
use crate::observe::{CachedChild, ChildCache, Observed, observe};
use crate::policy_store::{LoadedPolicy, PolicyStore};
use crate::shadow::{self, ComparableDecision, Comparison};
use crate::shard::Shard;

use self::requeue::Action as ControllerAction;
use self::requeue::{ParentRef, Requeues};

/// Every finalizer the host sets is this prefix and the policy's name.
pub const FINALIZER_PREFIX: &str = "policy-host.io/";

/// How long a parent may stay deleting while its finalize keeps failing, or while no loaded
/// policy reconciles its kind, before the host removes its finalizer (with a Warning Event).
pub const DEFAULT_FINALIZER_GRACE: Duration = Duration::from_secs(600);

/// How long `parent` has been deleting (zero if it is not, or its time is in the future).
pub fn deleting_for(parent: &DynamicObject) -> Duration {
    let Some(deleted_at) = parent.meta().deletion_timestamp.as_ref() else {
        return Duration::ZERO;
    };
    let now = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |d| d.as_secs());
    let since = u64::try_from(deleted_at.0.as_second()).unwrap_or(u64::MAX);
    Duration::from_secs(now.saturating_sub(since))
}

/// Reconcile again after this long when a plugin asks for nothing sooner.
pub const DEFAULT_RESYNC: Duration = Duration::from_secs(300);

pub use crate::decide::sandbox::SHADOW_RUNS_IN_FLIGHT;

/// How long the first list of the child caches may take before the controller warns.
const SYNC_WARNING_AFTER: Duration = Duration::from_secs(30);

/// Reconcile a parent being deleted again after this long when its plugin is not done and
/// asks for nothing sooner.
const FINALIZE_RETRY: Duration = Duration::from_secs(5);

/// The shortest requeue a plugin can ask for: `requeue-after: 0` would otherwise loop
/// decisions and writes as fast as the API server answers (review #18).
pub const MIN_REQUEUE: Duration = Duration::from_secs(1);

/// When to reconcile again: what the plugin asked for, never sooner than [`MIN_REQUEUE`],
/// or `otherwise` when it asked for nothing.
pub fn requeue_delay(asked_ms: Option<u64>, otherwise: Duration) -> Duration {
    asked_ms.map_or(otherwise, |ms| Duration::from_millis(ms).max(MIN_REQUEUE))
}

/// How soon a reconcile deferred for the host's own write (see [`OwnWrites`]) looks again if
/// the write's watch event has not triggered it sooner.
const OWN_WRITE_WAIT: Duration = Duration::from_millis(500);

/// How long a parent view superseded by the host's own write is waited out at most. The
/// write's watch event normally arrives within milliseconds; past this the view is decided
/// on anyway (a stale status write is still refused by its resourceVersion precondition).
const OWN_WRITE_PATIENCE: Duration = Duration::from_secs(30);

/// The parent views the host's own writes superseded, by parent uid: the resourceVersion the
/// host wrote the parent from. The parent cache lags such a write by one watch event, and a
/// reconcile triggered meanwhile by anything else (a child changing, a requeue) would decide
/// on the view before it. A plugin acts on its status in the decision itself (it promotes a
/// Redis replica, changes etcd's membership) before the status that records it is written:
/// on the older view it acts a second time on a state it already changed, and only its status
/// write is refused as stale, after the fact. Such a reconcile is deferred instead.
#[derive(Default)]
struct OwnWrites(Mutex<HashMap<String, (String, Instant)>>);

impl OwnWrites {
    /// The host changed `parent` (the view it decided from) with a write of its own. Views
    /// past their patience go at the same time, so parents deleted since are not kept.
    fn wrote(&self, parent: &DynamicObject) {
        if let (Some(uid), Some(version)) = (parent.uid(), parent.resource_version()) {
            let mut views = self.0.lock().unwrap_or_else(|p| p.into_inner());
            views.retain(|_, (_, at)| at.elapsed() < OWN_WRITE_PATIENCE);
            views.insert(uid, (version, Instant::now()));
        }
    }

    /// Whether `parent` is a view the host's own write superseded (and not for too long);
    /// a view that moved on is forgotten.
    fn superseded(&self, parent: &DynamicObject) -> bool {
        let (Some(uid), Some(version)) = (parent.uid(), parent.resource_version()) else {
            return false;
        };
        let mut views = self.0.lock().unwrap_or_else(|p| p.into_inner());
        match views.get(&uid) {
            Some((written_from, at))
                if *written_from == version && at.elapsed() < OWN_WRITE_PATIENCE =>
            {
                true
            }
            Some(_) => {
                views.remove(&uid);
                false
            }
            None => false,
        }
    }
}

/// Consecutive failed reconciles per parent, for the backoff. A parent that succeeds is
/// forgotten; so is one that leaves the parent cache (deleted, moved to another shard), which
/// is never reconciled again: the map holds at most the parents the cache holds.
#[derive(Default)]
struct Failures(Mutex<HashMap<ObjectRef<DynamicObject>, u32>>);

impl Failures {
    /// Counts a failure of `parent`; returns its consecutive failures.
    fn failed(&self, parent: ObjectRef<DynamicObject>) -> u32 {
        let mut map = self.0.lock().unwrap_or_else(|p| p.into_inner());
        let count = map.entry(parent).or_insert(0);
        *count += 1;
        *count
    }

    fn forget(&self, parent: &ObjectRef<DynamicObject>) {
        self.0
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .remove(parent);
    }

    #[cfg(test)]
    fn len(&self) -> usize {
        self.0.lock().unwrap_or_else(|p| p.into_inner()).len()
    }
}

/// Forgets the failures and drill of a parent that left the parent cache: on its delete event
/// (a parent deleted without a finalizer is never reconciled again), and on a re-list's end for
/// every parent the new list lacks (deleted while the watch was down). Called after the store
/// applied the event.
fn forget_departed(
    event: &watcher::Event<DynamicObject>,
    parents: &reflector::Store<DynamicObject>,
    resource: &ApiResource,
    failures: &Failures,
    chaos: &ChaosSchedule,
) {
    match event {
        watcher::Event::Delete(parent) => {
            failures.forget(&ObjectRef::from_obj_with(parent, resource.clone()));
            if let Some(uid) = parent.uid() {
                chaos.forget(&uid);
            }
        }
        watcher::Event::InitDone => {
            failures
                .0
                .lock()
                .unwrap_or_else(|p| p.into_inner())
                .retain(|parent, _| parents.get(parent).is_some());
            let listed: std::collections::HashSet<String> =
                parents.state().iter().filter_map(|p| p.uid()).collect();
            chaos.retain(|uid| listed.contains(uid));
        }
        _ => {}
    }
}

/// First and largest retry delay after a failed reconcile.
const BACKOFF: (Duration, Duration) = (Duration::from_secs(1), Duration::from_secs(120));

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

impl PolicyController {
    fn finalizer(&self) -> String {
        format!("{FINALIZER_PREFIX}{}", self.policy)
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
    let parent_stream = parent_stream
        .inspect_ok({
            let (store, resource) = (parent_store.clone(), parent_resource.clone());
            let (failures, chaos) = (failures.clone(), chaos.clone());
            move |event| forget_departed(event, &store, &resource, &failures, &chaos)
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
        let config = watcher::Config::default().labels(&format!("{POLICY_LABEL}={policy}"));
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
            // A newly loaded version decides for every parent at once (hot swap).
            .reconcile_all_on(store.replacements(&policy))
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
            .with_metrics(metrics.clone(), &policy),
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

async fn reconcile(
    parent: Arc<DynamicObject>,
    ctx: Arc<PolicyController>,
) -> Result<ControllerAction, ReconcileError> {
    let loaded = ctx
        .store
        .get(&ctx.policy)
        .ok_or_else(|| ReconcileError::PolicyGone(ctx.policy.clone()))?;
    let plugin = &loaded.plugin;
    let label = format!(
        "{}/{}",
        parent.namespace().unwrap_or_default(),
        parent.name_any()
    );
    if ctx.own_writes.superseded(&parent) {
        ctx.metrics.reconcile_deferred(&ctx.policy);
        tracing::debug!(
            parent = %label,
            resource_version = parent.resource_version().as_deref().unwrap_or_default(),
            "deferred: the cached parent predates the host's own write to it"
        );
        return Ok(ControllerAction::requeue(OWN_WRITE_WAIT));
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
    let finalizer = ctx.finalizer();
    let has_own = parent.finalizers().contains(&finalizer);
    // Finalizers of a policy that is no longer loaded (renamed, unloaded) are this policy's
    // now: it reconciles the kind, so it finalizes in their stead (review #17).
    let inherited = ctx.inherited_finalizers(&parent);
    let deleting = parent.meta().deletion_timestamp.is_some();

    if deleting {
        ctx.chaos.forget(&parent.uid().unwrap_or_default());
    }
    if deleting && !has_own && inherited.is_empty() {
        return Ok(ControllerAction::await_change());
    }
    let wants_finalizer = plugin.info().wants_finalizer;
    if !deleting && ((wants_finalizer && !has_own) || !inherited.is_empty()) {
        // The finalizer goes on before the first decision, so no child can exist without the
        // chance to clean up. The update triggers the next reconcile.
        ctx.patch_finalizers(&parent, wants_finalizer).await?;
        return Ok(ControllerAction::await_change());
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
    .with_tls(ctx.tls.clone(), parent.namespace().unwrap_or_default());
    let started = Instant::now();
    if deleting {
        let doing = format!("finalizing {label}");
        let finalized = async {
            let (observed, decision) = off_task(&doing, {
                let (plugin, doing) = (plugin.clone(), doing.clone());
                async move {
                    let decision = plugin.finalize(&observed.observation, scope, &doing).await;
                    (observed, decision)
                }
            })
            .await?;
            ctx.metrics.decision_took(&ctx.policy, started.elapsed());
            let decision = decision?;
            if ctx.left_the_cache(&parent) {
                return Ok((false, None));
            }
            let mut carried = Carried::default();
            let acted = ctx
                .executor
                .for_plugin(plugin.label())
                .with_grants(&loaded.grants)
                .apply_decision(&parent, &observed, decision.actions, &mut carried)
                .await;
            if carried.status_written {
                ctx.own_writes.wrote(&parent);
            }
            ctx.metrics
                .child_applies(&ctx.policy, carried.applies_sent, carried.applies_skipped);
            acted?;
            Ok::<_, ReconcileError>((decision.done, decision.requeue_after_ms))
        };
        let (done, requeue_after_ms) = match finalized.await {
            Ok(outcome) => outcome,
            Err(error) if deleting_for(&parent) > ctx.finalizer_grace => {
                // A finalize that keeps failing (a trap, a refused action) would hold the
                // parent, its namespace and its CRD forever: past the grace the host lets go.
                ctx.release_finalizers(&parent, &format!(
                    "finalize of {} kept failing for longer than {:?} since the deletion ({}: {error}); the finalizer was removed without its cleanup: check for leftovers",
                    plugin.label(),
                    ctx.finalizer_grace,
                    error.reason()
                ))
                .await?;
                return Ok(ControllerAction::await_change());
            }
            Err(error) => return Err(error),
        };
        ctx.succeeded(&parent);
        if done {
            ctx.executor.forget_parent(&label);
            ctx.patch_finalizers(&parent, false).await?;
            return Ok(ControllerAction::await_change());
        }
        return Ok(ControllerAction::requeue(requeue_delay(
            requeue_after_ms,
            FINALIZE_RETRY,
        )));
    }

    // A shadow of this kind decides on the same observation, with this run's app-call answers.
    let shadow = ctx.store.shadow_for(&plugin.info().target);
    let recorder = shadow.as_ref().map(|_| AppCallRecorder::new());
    let scope = match &recorder {
        Some(recorder) => scope.recorded_by(recorder.clone()),
        None => scope,
    };
    let doing = format!("reconciling {label}");
    let (observed, decision) = off_task(&doing, {
        let (plugin, doing) = (plugin.clone(), doing.clone());
        async move {
            let decision = plugin.reconcile(&observed.observation, scope, &doing).await;
            (observed, decision)
        }
    })
    .await?;
    ctx.metrics.decision_took(&ctx.policy, started.elapsed());
    if let (Some(candidate), Some(recorder)) = (shadow, recorder) {
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
    let mut carried = Carried::default();
    let acted = ctx
        .executor
        .for_plugin(plugin.label())
        .with_grants(&loaded.grants)
        .apply_decision(&parent, &observed, decision.actions, &mut carried)
        .await;
    // Before the outcome: a status written ahead of a failed action supersedes the view too.
    if carried.status_written {
        ctx.own_writes.wrote(&parent);
    }
    ctx.metrics
        .child_applies(&ctx.policy, carried.applies_sent, carried.applies_skipped);
    acted?;
    // After the decision is carried out, never instead of it: a drill only adds a kill.
    let drill_due = ctx.chaos_drill(&parent, &observed, &loaded.grants).await;
    ctx.succeeded(&parent);
    let requeue = requeue_delay(decision.requeue_after_ms, DEFAULT_RESYNC);
    Ok(ControllerAction::requeue(
        drill_due.map_or(requeue, |due| requeue.min(due)),
    ))
}

fn error_policy(
    parent: Arc<DynamicObject>,
    error: &ReconcileError,
    ctx: Arc<PolicyController>,
) -> ControllerAction {
    let failures = ctx.failures.failed(ObjectRef::from_obj_with(
        parent.as_ref(),
        ctx.parent_resource.clone(),
    ));
    let delay = BACKOFF
        .0
        .saturating_mul(2u32.saturating_pow(failures.saturating_sub(1).min(16)))
        .min(BACKOFF.1);
    let parent_label = format!(
        "{}/{}",
        parent.namespace().unwrap_or_default(),
        parent.name_any()
    );
    tracing::warn!(
        policy = %ctx.policy,
        parent = %parent_label,
        reason = error.reason(),
        failures,
        retry_in = ?delay,
        "reconcile failed: {error}"
    );
    ctx.metrics.reconcile_failed(&ctx.policy, error.reason());
    // A write refused because the world moved on since the observation is expected under
    // concurrent writers and fixes itself (the newer object's watch event brings a fresh
    // decision): retried, counted and logged, but no Warning Event for the user.
    if matches!(error, ReconcileError::Act(ActError::StaleView { .. })) {
        return ControllerAction::requeue(delay);
    }
    let event = Event {
        event_type: EventType::Warning,
        reason: error.reason().to_string(),
        message: error.to_string(),
    };
    let executor = ctx.executor.clone();
    tokio::spawn(async move {
        if let Err(error) = executor.record_event(&parent, event).await {
            tracing::warn!(%error, "could not record the failure Event");
        }
    });
    ControllerAction::requeue(delay)
}

impl PolicyController {
    /// Runs the parent's chaos drill if it asks for one and the plugin is granted chaos: kills
    /// one of its own Pods when due, with an Event. Returns when the drill next needs a look.
    async fn chaos_drill(
        &self,
        parent: &DynamicObject,
        observed: &Observed,
        grants: &Grants,
    ) -> Option<Duration> {
        let uid = parent.uid()?;
        let annotation = parent.annotations().get(CHAOS_ANNOTATION).cloned();
        let (event_type, reason, message, due) = match self.chaos.turn(
            &uid,
            annotation.as_deref(),
            grants.chaos,
            Instant::now(),
        ) {
            Turn::Idle => return None,
            Turn::Wait(due) => return Some(due),
            Turn::Refused(reason, message) => (EventType::Warning, reason, message, None),
            Turn::Kill(next) => {
                let drill = annotation.unwrap_or_default();
                let seed = std::time::SystemTime::now()
                    .duration_since(std::time::UNIX_EPOCH)
                    .map_or(0, |d| d.as_nanos() as u64);
                if let Some(why) = progressing(&parent.data) {
                    tracing::info!(parent = %parent.name_any(), "chaos drill: turn skipped, {why}");
                    return Some(next);
                }
                let Some((pod, pod_uid)) = pick_pod(&observed.observation, seed) else {
                    tracing::info!(parent = %parent.name_any(), "chaos drill: turn skipped, a pod is not Ready or is terminating (or there is none)");
                    return Some(next);
                };
                let pods: Api<k8s_openapi::api::core::v1::Pod> =
                    Api::namespaced(self.client.clone(), &parent.namespace().unwrap_or_default());
                // An eviction, not a delete: the plugin's PodDisruptionBudget may refuse it,
                // and the pod gets its grace period (review M7).
                let params = kube::api::EvictParams {
                    delete_options: Some(kube::api::DeleteParams {
                        preconditions: Some(kube::api::Preconditions {
                            uid: Some(pod_uid),
                            resource_version: None,
                        }),
                        ..Default::default()
                    }),
                    ..Default::default()
                };
                match pods.evict(&pod, &params).await {
                    Err(kube::Error::Api(status)) if status.code == 429 => {
                        tracing::info!(parent = %parent.name_any(), pod, "chaos drill: turn skipped, the PodDisruptionBudget allows no disruption now");
                        return Some(next);
                    }
                    Ok(_) => (
                        EventType::Normal,
                        "ChaosPodKilled",
                        format!(
                            "chaos drill `{drill}`: killed pod {pod}; the next kill in {next:?}"
                        ),
                        Some(next),
                    ),
                    Err(error) => (
                        EventType::Warning,
                        "ChaosKillFailed",
                        format!(
                            "chaos drill `{drill}`: evicting pod {pod} failed: {}; trying again in {next:?} (the host needs `create` on pods/eviction, which a plugin bundle grants with its pods)",
                            crate::act::api_error_text(&error)
                        ),
                        Some(next),
                    ),
                }
            }
        };
        tracing::info!(parent = %parent.name_any(), reason, "{message}");
        let event = Event {
            event_type,
            reason: reason.to_owned(),
            message,
        };
        if let Err(error) = self.executor.record_event(parent, event).await {
            tracing::warn!(%error, "cannot record the chaos drill's Event");
        }
        due
    }

    /// Runs the shadow candidate off the reconcile's path (it never delays the active
    /// decision) and reports how it compares: a metric always, a log line and an Event on the
    /// parent when it differs.
    fn shadow(
        &self,
        parent: &Arc<DynamicObject>,
        active: &str,
        candidate: Arc<LoadedPolicy>,
        observation: Observation,
        active_decision: ComparableDecision,
        recording: AppCallRecorder,
    ) {
        let shadow_label = candidate.plugin.label().to_string();
        // A recording cut at its budget would show the candidate another application than the
        // active plugin saw: nothing to compare fairly (review #5).
        if !recording.is_complete() {
            self.metrics
                .shadow_compared(&self.policy, &shadow_label, "dropped");
            tracing::info!(shadow = %shadow_label, "shadow run skipped: the active decision's app-calls were over the recording budget");
            return;
        }
        // At most SHADOW_RUNS_IN_FLIGHT shadows of this policy run at once: a shadow only
        // compares, so under load it is dropped (and counted), never queued (review #7b).
        let Ok(slot) = self.shadow_slots.clone().try_acquire_owned() else {
            self.metrics
                .shadow_compared(&self.policy, &shadow_label, "dropped");
            return;
        };
        let parent = parent.clone();
        let active = active.to_string();
        let executor = self.executor.clone();
        let metrics = self.metrics.clone();
        let policy = self.policy.clone();
        tokio::spawn(async move {
            let _slot = slot;
            let label = format!(
                "{}/{}",
                parent.namespace().unwrap_or_default(),
                parent.name_any()
            );
            let doing = format!("running shadow {shadow_label} for {label}");
            let comparison = off_task(&doing, {
                let label = label.clone();
                async move {
                    shadow::run_candidate(
                        &candidate.plugin,
                        &observation,
                        label,
                        &active_decision,
                        &recording,
                    )
                    .await
                }
            })
            .await;
            let shadow_label = shadow_label.as_str();
            match comparison {
                Err(error) => {
                    metrics.shadow_compared(&policy, shadow_label, "failed");
                    tracing::warn!(parent = %label, shadow = shadow_label, %error, "shadow run failed");
                }
                Ok(Comparison::Same) => {
                    metrics.shadow_compared(&policy, shadow_label, "same");
                    tracing::debug!(parent = %label, active = %active, shadow = shadow_label, "shadow decided the same");
                }
                Ok(Comparison::Different(diff)) => {
                    metrics.shadow_compared(&policy, shadow_label, "different");
                    tracing::info!(parent = %label, active = %active, shadow = shadow_label, %diff, "shadow decided differently");
                    let event = Event {
                        event_type: EventType::Normal,
                        reason: "ShadowDecisionDiffers".to_string(),
                        message: format!(
                            "shadow {shadow_label} would decide differently from {active} (not applied): {diff}"
                        ),
                    };
                    if let Err(error) = executor.record_event(&parent, event).await {
                        tracing::warn!(%error, "could not record the shadow diff Event");
                    }
                }
            }
        });
    }

    /// A parent asked for is no longer in the cache (deleted, or moved to another shard):
    /// what the host kept for it goes.
    fn parent_gone(&self, parent: &ObjectRef<DynamicObject>) {
        let namespace = parent.namespace.as_deref().unwrap_or_default();
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

    /// The parent's `policy-host.io/<name>` finalizers whose policy is not loaded.
    fn inherited_finalizers(&self, parent: &DynamicObject) -> Vec<String> {
        parent
            .finalizers()
            .iter()
            .filter(|f| {
                f.strip_prefix(FINALIZER_PREFIX).is_some_and(|name| {
                    name != self.policy && !name.is_empty() && self.store.get(name).is_none()
                })
            })
            .cloned()
            .collect()
    }

    /// Removes this policy's and the inherited finalizers, with a Warning Event saying why.
    async fn release_finalizers(
        &self,
        parent: &DynamicObject,
        why: &str,
    ) -> Result<(), ReconcileError> {
        tracing::warn!(
            policy = %self.policy,
            parent = %format!("{}/{}", parent.namespace().unwrap_or_default(), parent.name_any()),
            "{why}"
        );
        self.patch_finalizers(parent, false).await?;
        let event = Event {
            event_type: EventType::Warning,
            reason: "FinalizerReleased".to_string(),
            message: why.to_string(),
        };
        if let Err(error) = self.executor.record_event(parent, event).await {
            tracing::warn!(%error, "could not record the FinalizerReleased Event");
        }
        Ok(())
    }

    /// Sets this policy's finalizer on the parent (`add`) or removes it; inherited finalizers
    /// of policies that are no longer loaded are removed either way.
    async fn patch_finalizers(
        &self,
        parent: &DynamicObject,
        add: bool,
    ) -> Result<(), ReconcileError> {
        let finalizer = self.finalizer();
        let inherited = self.inherited_finalizers(parent);
        let mut finalizers: Vec<String> = parent
            .finalizers()
            .iter()
            .filter(|f| **f != finalizer && !inherited.contains(f))
            .cloned()
            .collect();
        if add {
            finalizers.push(finalizer);
        }
        let namespace = parent.namespace().unwrap_or_default();
        let api: Api<DynamicObject> =
            Api::namespaced_with(self.client.clone(), &namespace, &self.parent_resource);
        // A merge patch that also pins the resourceVersion: it fails instead of clobbering a
        // finalizer someone else added meanwhile, and the next reconcile retries.
        let patch = json!({
            "metadata": {
                "finalizers": finalizers,
                "resourceVersion": parent.resource_version(),
            }
        });
        match api
            .patch(
                &parent.name_any(),
                &PatchParams::default(),
                &Patch::Merge(&patch),
            )
            .await
        {
            Ok(patched) => {
                if patched.resource_version() != parent.resource_version() {
                    self.own_writes.wrote(parent);
                }
                Ok(())
            }
            Err(kube::Error::Api(status)) if status.code == 404 && !add => Ok(()),
            Err(source) => Err(ReconcileError::Finalizer {
                parent: format!("{namespace}/{}", parent.name_any()),
                source,
            }),
        }
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

    #[test]
    fn a_view_the_hosts_own_write_superseded_is_deferred_until_the_cache_moves_on() {
        let own = OwnWrites::default();
        assert!(
            !own.superseded(&parent_at("a", "10")),
            "nothing written yet"
        );
        own.wrote(&parent_at("a", "10"));
        assert!(
            own.superseded(&parent_at("a", "10")),
            "the view written from"
        );
        assert!(
            own.superseded(&parent_at("a", "10")),
            "still, until the cache moves"
        );
        assert!(!own.superseded(&parent_at("b", "10")), "another parent");
        assert!(
            !own.superseded(&parent_at("a", "11")),
            "the view as written"
        );
        assert!(
            !own.superseded(&parent_at("a", "10")),
            "forgotten once the cache moved on"
        );
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
            for uid in ["a", "b"] {
                let parent = parent_at(uid, "1");
                writer.apply_watcher_event(&Event::Apply(parent.clone()));
                failures.failed(ObjectRef::from_obj_with(&parent, resource.clone()));
                chaos.turn(uid, Some("kill-pod every=30s"), true, Instant::now());
            }
            for event in events {
                writer.apply_watcher_event(&event);
                forget_departed(&event, &store, &resource, &failures, &chaos);
            }
            assert_eq!(failures.len(), left, "{situation}: failures");
            assert_eq!(chaos.len(), left, "{situation}: drills");
        }
    }

    #[test]
    fn a_requeue_of_zero_waits_the_floor() {
        assert_eq!(requeue_delay(Some(0), DEFAULT_RESYNC), MIN_REQUEUE);
        assert_eq!(requeue_delay(Some(999), DEFAULT_RESYNC), MIN_REQUEUE);
    }

    #[test]
    fn a_requeue_above_the_floor_is_kept_and_none_means_the_default() {
        assert_eq!(
            requeue_delay(Some(2_500), DEFAULT_RESYNC),
            Duration::from_millis(2_500)
        );
        assert_eq!(requeue_delay(None, DEFAULT_RESYNC), DEFAULT_RESYNC);
        assert_eq!(requeue_delay(None, FINALIZE_RETRY), FINALIZE_RETRY);
    }
}
