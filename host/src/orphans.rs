//! Orphaned finalizers: parents that still carry `policy-host.io/<name>` after the policy
//! `<name>` was unloaded, and that no loaded policy reconciles any more.
//!
//! Without this, such a parent stays Terminating forever, and with it its namespace and its
//! CRD (review #17). The supervisor runs one [`release`] per unloaded policy whose kind no
//! other policy took over: it watches the kind's parents and, once a parent has been deleting
//! for the grace period, removes that finalizer with a Warning Event (`FinalizerReleased`),
//! because nobody is left to run its cleanup. The grace leaves time for a rename (unload `a`,
//! load `b` for the same kind): the new policy's controller inherits the old finalizer and
//! finalizes properly, and this task is stopped as soon as a policy for the kind is loaded.
//!
//! It needs no more than a bundle grants on the target kind (`list, watch, patch`): the patch
//! is made from the watched object, pinned to its resourceVersion, instead of reading the
//! parent again (a `get` the bundles do not grant; review M1). A patch refused because the
//! parent changed meanwhile is retried by the task of that change's watch event. Deleting the
//! bundle removes the rights with the plugin, so nothing can be released after that: unload the
//! plugin (delete its ConfigMap) first, and delete the rest of the bundle once its parents are
//! gone.

use std::time::Duration;

use futures::StreamExt;
use kube::api::{Api, ApiResource, DynamicObject, Patch, PatchParams};
use kube::runtime::{WatchStreamExt, watcher};
use kube::{Client, Resource, ResourceExt};
use serde_json::json;

use crate::act::Executor;
use crate::contract::{Event, EventType, PolicyInfo};
use crate::controller::{ControllerOptions, FINALIZER_PREFIX, deleting_for};
use crate::policy_store::PolicyStore;

/// Releases the finalizer of `policy` (no longer loaded, last seen as `label` reconciling
/// `info.target`) from parents of `options.shard` (in `options.namespace`, or all) deleting
/// for longer than `options.finalizer_grace`, until `shutdown`.
pub async fn release(
    client: Client,
    store: PolicyStore,
    policy: String,
    label: String,
    info: PolicyInfo,
    options: ControllerOptions,
) {
    let grace = options.finalizer_grace;
    let resource = crate::act::api_resource(&info.target);
    let parents: Api<DynamicObject> = match options.namespace.as_deref() {
        Some(namespace) => Api::namespaced_with(client.clone(), namespace, &resource),
        None => Api::all_with(client.clone(), &resource),
    };
    let finalizer = format!("{FINALIZER_PREFIX}{policy}");
    let executor = Executor::new(client.clone(), &label, &info);
    tracing::info!(policy = %policy, target = %info.target, ?grace, "policy unloaded: its finalizers are released from parents deleting longer than the grace");
    let mut pending = tokio::task::JoinSet::new();
    let events = watcher(parents, watcher::Config::default())
        .default_backoff()
        .applied_objects();
    tokio::pin!(events);
    loop {
        tokio::select! {
            event = events.next() => match event {
                None => break,
                Some(Err(error)) => tracing::warn!(policy = %policy, %error, "watching parents for orphaned finalizers failed; retrying"),
                Some(Ok(parent)) => {
                    // Another shard's parent is that shard's to release.
                    if parent.meta().deletion_timestamp.is_none()
                        || !parent.finalizers().contains(&finalizer)
                        || !options.shard.owns(&parent)
                    {
                        continue;
                    }
                    let wait = grace.saturating_sub(deleting_for(&parent));
                    let (client, store, policy, finalizer, executor, resource) = (
                        client.clone(), store.clone(), policy.clone(), finalizer.clone(),
                        executor.clone(), resource.clone(),
                    );
                    pending.spawn(async move {
                        tokio::time::sleep(wait).await;
                        if store.get(&policy).is_some() {
                            return;
                        }
                        release_one(&client, &resource, &parent, &finalizer, &executor, grace).await;
                    });
                }
            },
            Some(_) = pending.join_next(), if !pending.is_empty() => {}
        }
    }
}

/// Removes `finalizer` from `parent` as it was watched, if it is still that version.
async fn release_one(
    client: &Client,
    resource: &ApiResource,
    parent: &DynamicObject,
    finalizer: &str,
    executor: &Executor,
    grace: Duration,
) {
    let namespace = parent.namespace().unwrap_or_default();
    let name = parent.name_any();
    let api: Api<DynamicObject> = Api::namespaced_with(client.clone(), &namespace, resource);
    let finalizers: Vec<&String> = parent
        .finalizers()
        .iter()
        .filter(|f| *f != finalizer)
        .collect();
    // Pinned to the version watched: a concurrent change makes this fail, and the watch event
    // of that change scheduled its own try.
    let patch = json!({
        "metadata": { "finalizers": finalizers, "resourceVersion": parent.resource_version() }
    });
    let current = match api
        .patch(&name, &PatchParams::default(), &Patch::Merge(&patch))
        .await
    {
        Ok(current) => current,
        Err(kube::Error::Api(status)) if status.code == 404 => return,
        Err(kube::Error::Api(status)) if status.code == 409 => {
            tracing::debug!(parent = %format!("{namespace}/{name}"), "the parent changed since this try was scheduled; the try of its newer version releases the finalizer");
            return;
        }
        Err(error) => {
            tracing::warn!(
                parent = %format!("{namespace}/{name}"),
                finalizer,
                "could not release an orphaned finalizer: {}; the next change of the parent retries (does the host still hold `patch` on {}? delete a plugin's ConfigMap, not its whole bundle, while its parents are deleting)",
                crate::act::api_error_text(&error),
                resource.plural
            );
            return;
        }
    };
    let why = format!(
        "{finalizer} was released: the policy that set it is no longer loaded and no loaded policy reconciles this kind, and the parent was deleting for longer than {grace:?}; its cleanup did not run: check for leftovers"
    );
    tracing::warn!(parent = %format!("{namespace}/{name}"), "{why}");
    let event = Event {
        event_type: EventType::Warning,
        reason: "FinalizerReleased".into(),
        message: why,
    };
    if let Err(error) = executor.record_event(&current, event).await {
        tracing::warn!(%error, "could not record the FinalizerReleased Event");
    }
}
