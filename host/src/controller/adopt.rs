//! A parent's children follow it to its shard: before a sharded host decides for a parent new
//! to its shard, the parent's children are labelled for this shard and its child caches hold
//! them ([`crate::shard`], "The children follow their parent").
//!
//! A shard's child watches select on [`CHILD_SHARD_LABEL`], so the children of a parent that
//! was created, moved here by its label, or last reconciled by a host with another shard count
//! are not in this shard's caches. A decision on that view sees no children and recreates or
//! writes off the ones that exist. So the parent is held back: the shard lists the children of
//! the parent's namespace that the parent controls (an API call, not the cache), labels those
//! not yet labelled for it, records on the parent that they are
//! ([`CHILDREN_SHARD_ANNOTATION`], so the listing happens once per parent and shard, not on
//! every restart), and decides once its caches hold every child it labelled or found.

use std::collections::HashMap;
use std::sync::Mutex;
use std::time::{Duration, Instant};

use kube::ResourceExt;
use kube::api::{Api, DynamicObject, ListParams, Patch, PatchParams};
use kube::runtime::reflector::ObjectRef;
use serde_json::json;

use super::requeue::Action as ControllerAction;
use super::{PolicyController, ReconcileError};
use crate::act::POLICY_LABEL;
use crate::observe::is_controlled_by;
use crate::shard::{CHILD_SHARD_LABEL, CHILDREN_SHARD_ANNOTATION};

/// How soon a parent whose children are on their way into the caches is looked at again (their
/// watch events normally arrive within milliseconds, and trigger it sooner).
const ARRIVAL_WAIT: Duration = Duration::from_millis(500);

/// How long the children a parent was found with are waited for. Past it (a child deleted
/// after the listing never arrives) the parent is decided on what the caches hold.
const ARRIVAL_PATIENCE: Duration = Duration::from_secs(30);

/// A child an adopted parent waits for: the index of its cache, and its name.
type Awaited = (usize, String);

/// The children each adopted parent is waiting for, by parent uid, and since when.
#[derive(Default)]
pub(super) struct Arrivals(Mutex<HashMap<String, (Vec<Awaited>, Instant)>>);

impl Arrivals {
    fn expect(&self, uid: &str, children: Vec<Awaited>) {
        let mut waiting = self.0.lock().unwrap_or_else(|p| p.into_inner());
        // Parents deleted or moved away meanwhile are not kept past their patience.
        waiting.retain(|_, (_, since)| since.elapsed() < ARRIVAL_PATIENCE);
        if !children.is_empty() {
            waiting.insert(uid.to_string(), (children, Instant::now()));
        }
    }
}

/// Why the children of a parent could not be labelled for this shard.
#[derive(Debug, thiserror::Error)]
#[error(
    "{doing} (so that this shard caches the children of {parent}, which came to it) failed: {}; the host retries with backoff: check its RBAC (list and patch on the policy's child kinds, patch on its parent kind)",
    crate::act::api_error_text(source)
)]
pub struct AdoptError {
    /// What was being done.
    doing: String,
    /// namespace/name.
    parent: String,
    /// The API error.
    #[source]
    source: kube::Error,
}

impl PolicyController {
    /// Holds `parent` back until its children are this shard's (see the module); `Some`: the
    /// reconcile ends here and the parent is looked at again. Nothing for an unsharded host.
    pub(super) async fn adopt_children(
        &self,
        parent: &DynamicObject,
        label: &str,
    ) -> Result<Option<ControllerAction>, ReconcileError> {
        let Some(shard) = self.shard.child_label() else {
            return Ok(None);
        };
        let uid = parent.uid().unwrap_or_default();
        if parent.annotations().get(CHILDREN_SHARD_ANNOTATION) == Some(&shard) {
            return Ok(self.still_arriving(parent, &uid));
        }
        let namespace = parent.namespace().unwrap_or_default();
        let failed = |doing: String, source| {
            ReconcileError::from(AdoptError {
                doing,
                parent: label.to_string(),
                source,
            })
        };
        let mut found = Vec::new();
        for (index, cache) in self.caches.iter().enumerate() {
            let api: Api<DynamicObject> =
                Api::namespaced_with(self.client.clone(), &namespace, &cache.resource);
            let selector = format!("{POLICY_LABEL}={}", self.policy);
            let listed = api
                .list_metadata(&ListParams::default().labels(&selector))
                .await
                .map_err(|e| failed(format!("listing {} of {namespace}", cache.kind.kind), e))?;
            for child in listed.items.iter().filter(|c| is_controlled_by(*c, &uid)) {
                let name = child.name_any();
                if child.labels().get(CHILD_SHARD_LABEL) != Some(&shard) {
                    let patch = json!({ "metadata": { "labels": { CHILD_SHARD_LABEL: shard } } });
                    api.patch(&name, &PatchParams::default(), &Patch::Merge(&patch))
                        .await
                        .map_err(|e| {
                            failed(
                                format!("labelling {} {namespace}/{name}", cache.kind.kind),
                                e,
                            )
                        })?;
                }
                found.push((index, name));
            }
        }
        tracing::info!(
            policy = %self.policy,
            parent = %label,
            children = found.len(),
            shard = %shard,
            "a parent new to this shard: its children are labelled for it"
        );
        let api: Api<DynamicObject> =
            Api::namespaced_with(self.client.clone(), &namespace, &self.parent_resource);
        // Pinned to the view's resourceVersion, as the finalizers are: a parent changed
        // meanwhile (moved on again) is looked at afresh.
        let patch = json!({
            "metadata": {
                "annotations": { CHILDREN_SHARD_ANNOTATION: shard },
                "resourceVersion": parent.resource_version(),
            }
        });
        api.patch(
            &parent.name_any(),
            &PatchParams::default(),
            &Patch::Merge(&patch),
        )
        .await
        .map_err(|e| failed(format!("annotating {label}"), e))?;
        self.own_writes.wrote(parent);
        self.arrivals.expect(&uid, found);
        // The annotation's watch event triggers the next reconcile, which waits for the children.
        Ok(Some(ControllerAction::await_change()))
    }

    /// `Some` while a child the parent was adopted with is not in its cache yet (and not for
    /// longer than [`ARRIVAL_PATIENCE`]).
    fn still_arriving(&self, parent: &DynamicObject, uid: &str) -> Option<ControllerAction> {
        let mut waiting = self.arrivals.0.lock().unwrap_or_else(|p| p.into_inner());
        let (children, since) = waiting.get_mut(uid)?;
        let namespace = parent.namespace();
        children.retain(|(index, name)| {
            let cache = &self.caches[*index];
            let mut key = ObjectRef::new_with(name, cache.resource.clone());
            key.namespace = namespace.clone();
            cache.store.get(&key).is_none()
        });
        if children.is_empty() {
            waiting.remove(uid);
            return None;
        }
        if since.elapsed() >= ARRIVAL_PATIENCE {
            tracing::warn!(
                policy = %self.policy,
                parent = %format!("{}/{}", namespace.unwrap_or_default(), parent.name_any()),
                missing = ?children,
                "children labelled for this shard never reached its caches (deleted since?); deciding on what the caches hold"
            );
            waiting.remove(uid);
            return None;
        }
        Some(ControllerAction::requeue(ARRIVAL_WAIT))
    }
}
