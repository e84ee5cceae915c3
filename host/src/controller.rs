//! The controller of one loaded policy: watches its target kind and declared child kinds, and
//! runs observe → decide → act for each parent that changes.
//!
//! The host knows no CRD at compile time: everything is a `DynamicObject` addressed by what the
//! plugin declared. Children are watched only when they carry the host's policy label, and
//! each change triggers the parent named in its controller owner reference.

use std::collections::HashMap;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use futures::StreamExt;
use kube::api::{Api, ApiResource, DynamicObject, Patch, PatchParams};
use kube::runtime::controller::{Action as ControllerAction, Config as ControllerConfig};
use kube::runtime::reflector::{self, ObjectRef};
use kube::runtime::{Controller, WatchStreamExt, watcher};
use kube::{Client, Resource, ResourceExt};
use serde_json::json;

use crate::act::{ActError, Executor, POLICY_LABEL, api_resource};
use crate::capability::replay::AppCallRecorder;
use crate::capability::scope::AppCallScope;
use crate::contract::{Event, EventType, Observation};
use crate::decide::DecideError;
use crate::metrics::Metrics;
use crate::observe::{ChildCache, observe};
use crate::policy_store::{LoadedPolicy, PolicyStore};
use crate::shadow::{self, ComparableDecision, Comparison};

/// Reconcile again after this long when a plugin asks for nothing sooner.
pub const DEFAULT_RESYNC: Duration = Duration::from_secs(300);

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
            ReconcileError::Finalizer { .. } => "FinalizerUpdateFailed",
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
    failures: Mutex<HashMap<ObjectRef<DynamicObject>, u32>>,
}

/// Options for a policy's controller.
#[derive(Clone, Debug)]
pub struct ControllerOptions {
    /// Parents reconciled at the same time.
    pub concurrency: u16,
    /// Watch parents and children only in this namespace (`None`: every namespace).
    pub namespace: Option<String>,
}

impl Default for ControllerOptions {
    fn default() -> Self {
        Self {
            concurrency: 8,
            namespace: None,
        }
    }
}

/// Every object of `resource`, in the watched namespace or in all of them.
fn scoped_api(
    client: &Client,
    resource: &ApiResource,
    namespace: Option<&str>,
) -> Api<DynamicObject> {
    match namespace {
        Some(namespace) => Api::namespaced_with(client.clone(), namespace, resource),
        None => Api::all_with(client.clone(), resource),
    }
}

impl PolicyController {
    fn finalizer(&self) -> String {
        format!("policy-host.io/{}", self.policy)
    }
}

/// Runs the controller of the policy called `policy` until `shutdown` resolves.
pub async fn run(
    client: Client,
    store: PolicyStore,
    policy: String,
    metrics: Metrics,
    options: ControllerOptions,
    shutdown: impl std::future::Future<Output = ()> + Send + Sync + 'static,
) -> Result<(), ReconcileError> {
    let loaded = store
        .get(&policy)
        .ok_or_else(|| ReconcileError::PolicyGone(policy.clone()))?;
    let info = loaded.plugin.info().clone();
    let parent_resource = api_resource(&info.target);
    let namespace = options.namespace.as_deref();
    let parents = scoped_api(&client, &parent_resource, namespace);

    let mut controller =
        Controller::new_with(parents, watcher::Config::default(), parent_resource.clone())
            .with_config(ControllerConfig::default().concurrency(options.concurrency))
            // A newly loaded version decides for every parent at once (hot swap).
            .reconcile_all_on(store.replacements(&policy));
    let mut caches = Vec::new();
    for kind in &info.children {
        let resource = api_resource(kind);
        let writer = reflector::store::Writer::new(resource.clone());
        let reader = writer.as_reader();
        let children = scoped_api(&client, &resource, namespace);
        let config = watcher::Config::default().labels(&format!("{POLICY_LABEL}={policy}"));
        let stream = watcher(children, config)
            .default_backoff()
            .reflect(writer)
            .touched_objects();
        controller = controller.owns_stream_with(stream, resource.clone());
        caches.push(ChildCache {
            kind: kind.clone(),
            resource,
            store: reader,
        });
    }
    let tls = crate::capability::tls::AppTls::new(client.clone());
    let context = Arc::new(PolicyController {
        executor: Executor::new(client.clone(), loaded.plugin.label(), &info),
        client,
        store,
        policy: policy.clone(),
        caches,
        parent_resource,
        metrics,
        http: crate::capability::http::http_client(),
        tls,
        failures: Mutex::new(HashMap::new()),
    });
    tracing::info!(
        policy = %policy,
        plugin = loaded.plugin.label(),
        target = %info.target,
        children = ?info.children.iter().map(|k| k.to_string()).collect::<Vec<_>>(),
        "controller started"
    );
    controller
        .graceful_shutdown_on(shutdown)
        .run(reconcile, error_policy, context)
        .for_each(|outcome| async move {
            if let Err(error) = outcome {
                tracing::debug!(%error, "reconcile did not complete");
            }
        })
        .await;
    tracing::info!(policy = %policy, "controller stopped");
    Ok(())
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
    ctx.metrics.reconcile_started(&ctx.policy);
    let finalizer = ctx.finalizer();
    let has_finalizer = parent.finalizers().contains(&finalizer);
    let deleting = parent.meta().deletion_timestamp.is_some();

    if deleting && !has_finalizer {
        return Ok(ControllerAction::await_change());
    }
    if !deleting && plugin.info().wants_finalizer && !has_finalizer {
        // The finalizer goes on before the first decision, so no child can exist without the
        // chance to clean up. The update triggers the next reconcile.
        ctx.patch_finalizers(&parent, true).await?;
        return Ok(ControllerAction::await_change());
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
        let decision = plugin.finalize(&observed.observation, scope, &doing).await;
        ctx.metrics.decision_took(&ctx.policy, started.elapsed());
        let decision = decision?;
        ctx.executor
            .apply_decision(&parent, &observed, decision.actions)
            .await?;
        ctx.succeeded(&parent);
        if decision.done {
            ctx.patch_finalizers(&parent, false).await?;
            return Ok(ControllerAction::await_change());
        }
        return Ok(ControllerAction::requeue(
            decision
                .requeue_after_ms
                .map_or(Duration::from_secs(5), Duration::from_millis),
        ));
    }

    // A shadow of this kind decides on the same observation, with this run's app-call answers.
    let shadow = ctx.store.shadow_for(&plugin.info().target);
    let recorder = shadow.as_ref().map(|_| AppCallRecorder::new());
    let scope = match &recorder {
        Some(recorder) => scope.recorded_by(recorder.clone()),
        None => scope,
    };
    let doing = format!("reconciling {label}");
    let decision = plugin.reconcile(&observed.observation, scope, &doing).await;
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
    ctx.executor
        .apply_decision(&parent, &observed, decision.actions)
        .await?;
    ctx.succeeded(&parent);
    Ok(ControllerAction::requeue(
        decision
            .requeue_after_ms
            .map_or(DEFAULT_RESYNC, Duration::from_millis),
    ))
}

fn error_policy(
    parent: Arc<DynamicObject>,
    error: &ReconcileError,
    ctx: Arc<PolicyController>,
) -> ControllerAction {
    let failures = {
        let mut map = ctx.failures.lock().unwrap_or_else(|p| p.into_inner());
        let key = ObjectRef::from_obj_with(parent.as_ref(), ctx.parent_resource.clone());
        let count = map.entry(key).or_insert(0);
        *count += 1;
        *count
    };
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
        let parent = parent.clone();
        let active = active.to_string();
        let executor = self.executor.clone();
        let metrics = self.metrics.clone();
        let policy = self.policy.clone();
        tokio::spawn(async move {
            let label = format!(
                "{}/{}",
                parent.namespace().unwrap_or_default(),
                parent.name_any()
            );
            let comparison = shadow::run_candidate(
                &candidate.plugin,
                &observation,
                label.clone(),
                &active_decision,
                &recording,
            )
            .await;
            let shadow_label = candidate.plugin.label();
            match comparison {
                Comparison::Same => {
                    metrics.shadow_compared(&policy, shadow_label, "same");
                    tracing::debug!(parent = %label, active = %active, shadow = shadow_label, "shadow decided the same");
                }
                Comparison::Different(diff) => {
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

    fn succeeded(&self, parent: &DynamicObject) {
        let key = ObjectRef::from_obj_with(parent, self.parent_resource.clone());
        self.failures
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .remove(&key);
    }

    /// Adds or removes this policy's finalizer on the parent.
    async fn patch_finalizers(
        &self,
        parent: &DynamicObject,
        add: bool,
    ) -> Result<(), ReconcileError> {
        let finalizer = self.finalizer();
        let mut finalizers: Vec<String> = parent
            .finalizers()
            .iter()
            .filter(|f| **f != finalizer)
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
            Ok(_) => Ok(()),
            Err(kube::Error::Api(status)) if status.code == 404 && !add => Ok(()),
            Err(source) => Err(ReconcileError::Finalizer {
                parent: format!("{namespace}/{}", parent.name_any()),
                source,
            }),
        }
    }
}
