//! Shadow dispatch: a loaded shadow candidate decides beside the active plugin, off its path.
//!
//! It sees the same observation and the active run's recorded app-call answers; only how it
//! compares is reported (a metric, and a log line and an Event when it decides differently).

use std::sync::Arc;

use kube::ResourceExt;
use kube::api::DynamicObject;

use super::{PolicyController, off_task};
use crate::capability::replay::AppCallRecorder;
use crate::capability::scope::AppCallScope;
use crate::contract::{Event, EventType, KindRef, Observation};
use crate::policy_store::LoadedPolicy;
use crate::shadow::{self, ComparableDecision, Comparison};

/// A shadow candidate, and the recorder of the active run's app-call answers it is shown.
pub(super) type ShadowRun = (Arc<LoadedPolicy>, AppCallRecorder);

impl PolicyController {
    /// The shadow of `target`'s kind, if one is loaded, and `scope` recording the app-call
    /// answers for it: a shadow decides on the same observation, with this run's answers.
    pub(super) fn shadow_of(
        &self,
        target: &KindRef,
        scope: AppCallScope,
    ) -> (Option<ShadowRun>, AppCallScope) {
        match self.store.shadow_for(target) {
            Some(candidate) => {
                let recorder = AppCallRecorder::new();
                let scope = scope.recorded_by(recorder.clone());
                (Some((candidate, recorder)), scope)
            }
            None => (None, scope),
        }
    }

    /// Runs the shadow candidate off the reconcile's path (it never delays the active
    /// decision) and reports how it compares: a metric always, a log line and an Event on the
    /// parent when it differs.
    pub(super) fn shadow(
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
}
