//! The retry of a failed reconcile: a backoff per parent, and a word on why it failed.
//!
//! Each failure is logged, counted and, unless the world merely moved on since the observation,
//! recorded as a Warning Event on the parent.

use std::collections::HashMap;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use kube::ResourceExt;
use kube::api::DynamicObject;
use kube::runtime::reflector::ObjectRef;

use super::requeue::Action as ControllerAction;
use super::{PolicyController, ReconcileError};
use crate::act::ActError;
use crate::contract::{Event, EventType};

/// First and largest retry delay after a failed reconcile.
const BACKOFF: (Duration, Duration) = (Duration::from_secs(1), Duration::from_secs(120));

/// Consecutive failed reconciles per parent, for the backoff. A parent that succeeds is
/// forgotten; so is one that leaves the parent cache (deleted, moved to another shard), which
/// is never reconciled again: the map holds at most the parents the cache holds.
#[derive(Default)]
pub(super) struct Failures(Mutex<HashMap<ObjectRef<DynamicObject>, u32>>);

impl Failures {
    /// Counts a failure of `parent`; returns its consecutive failures.
    pub(super) fn failed(&self, parent: ObjectRef<DynamicObject>) -> u32 {
        let mut map = self.0.lock().unwrap_or_else(|p| p.into_inner());
        let count = map.entry(parent).or_insert(0);
        *count += 1;
        *count
    }

    pub(super) fn forget(&self, parent: &ObjectRef<DynamicObject>) {
        self.0
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .remove(parent);
    }

    /// Keeps only the parents `keep` says are still cached.
    pub(super) fn retain(&self, keep: impl Fn(&ObjectRef<DynamicObject>) -> bool) {
        self.0
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .retain(|parent, _| keep(parent));
    }

    #[cfg(test)]
    pub(super) fn len(&self) -> usize {
        self.0.lock().unwrap_or_else(|p| p.into_inner()).len()
    }
}

pub(super) fn error_policy(
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
