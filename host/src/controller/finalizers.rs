//! The host's finalizer on each parent: set before the first decision, removed after the last.
//!
//! It goes on first so that no child exists without the chance to clean up; the finalizers of
//! policies no longer loaded are taken over by the policy that now reconciles the kind.

use kube::ResourceExt;
use kube::api::{Api, DynamicObject, Patch, PatchParams};
use serde_json::json;

use super::requeue::Action as ControllerAction;
use super::{PolicyController, ReconcileError};
use crate::contract::{Event, EventType};

/// Every finalizer the host sets is this prefix and the policy's name.
pub const FINALIZER_PREFIX: &str = "policy-host.io/";

impl PolicyController {
    pub(super) fn finalizer(&self) -> String {
        format!("{FINALIZER_PREFIX}{}", self.policy)
    }

    /// Puts this policy's finalizer on `parent` before its first decision, and takes over the
    /// finalizers of policies no longer loaded. `Some`: the reconcile ends here (the update
    /// triggers the next one, or a parent being deleted is none of this policy's business).
    pub(super) async fn settle_finalizers(
        &self,
        parent: &DynamicObject,
        deleting: bool,
        wants_finalizer: bool,
    ) -> Result<Option<ControllerAction>, ReconcileError> {
        let finalizer = self.finalizer();
        let has_own = parent.finalizers().contains(&finalizer);
        // Finalizers of a policy that is no longer loaded (renamed, unloaded) are this policy's
        // now: it reconciles the kind, so it finalizes in their stead (review #17).
        let inherited = self.inherited_finalizers(parent);
        if deleting && !has_own && inherited.is_empty() {
            return Ok(Some(ControllerAction::await_change()));
        }
        if !deleting && ((wants_finalizer && !has_own) || !inherited.is_empty()) {
            // The finalizer goes on before the first decision, so no child can exist without the
            // chance to clean up. The update triggers the next reconcile.
            self.patch_finalizers(parent, wants_finalizer).await?;
            return Ok(Some(ControllerAction::await_change()));
        }
        Ok(None)
    }

    /// The parent's `policy-host.io/<name>` finalizers whose policy is not loaded.
    pub(super) fn inherited_finalizers(&self, parent: &DynamicObject) -> Vec<String> {
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
    pub(super) async fn release_finalizers(
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
    pub(super) async fn patch_finalizers(
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
