//! The chaos drill: after a decision is carried out, a Pod of the parent's is evicted when due.
//!
//! A parent asks for a drill with `policy-host.io/chaos`, and only a plugin granted chaos gets
//! one; each kill is an eviction (the plugin's PodDisruptionBudget may refuse it), with an Event.

use std::time::{Duration, Instant};

use kube::ResourceExt;
use kube::api::{Api, DynamicObject};

use super::PolicyController;
use crate::capability::scope::Grants;
use crate::chaos::{CHAOS_ANNOTATION, Turn, pick_pod, progressing};
use crate::contract::{Event, EventType};
use crate::observe::Observed;

impl PolicyController {
    /// Runs the parent's chaos drill if it asks for one and the plugin is granted chaos: kills
    /// one of its own Pods when due, with an Event. Returns when the drill next needs a look.
    pub(super) async fn chaos_drill(
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
}
