//! The finalize branch: a parent being deleted is decided by its plugin's `finalize`.
//!
//! Once the plugin says it is done, the policy's finalizer goes; a finalize that keeps failing
//! past the grace is let go of, with a Warning Event.

use std::time::{Duration, Instant};

use kube::Resource;
use kube::api::DynamicObject;

use super::requeue::{Action as ControllerAction, requeue_delay};
use super::{PolicyController, ReconcileError, off_task};
use crate::capability::scope::AppCallScope;
use crate::observe::Observed;
use crate::policy_store::LoadedPolicy;

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

/// Reconcile a parent being deleted again after this long when its plugin is not done and
/// asks for nothing sooner.
const FINALIZE_RETRY: Duration = Duration::from_secs(5);

impl PolicyController {
    /// Finalizes `parent` (being deleted), observed as `observed`: the plugin's finalize
    /// decision is carried out, and once it is done the policy's finalizer is removed.
    pub(super) async fn finalize(
        &self,
        parent: &DynamicObject,
        loaded: &LoadedPolicy,
        observed: Observed,
        scope: AppCallScope,
        label: &str,
        started: Instant,
    ) -> Result<ControllerAction, ReconcileError> {
        let plugin = &loaded.plugin;
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
            self.metrics.decision_took(&self.policy, started.elapsed());
            let decision = decision?;
            if self.left_the_cache(parent) {
                return Ok((false, None));
            }
            self.carry_out(parent, loaded, &observed, decision.actions)
                .await?;
            Ok::<_, ReconcileError>((decision.done, decision.requeue_after_ms))
        };
        let (done, requeue_after_ms) = match finalized.await {
            Ok(outcome) => outcome,
            Err(error) if deleting_for(parent) > self.finalizer_grace => {
                // A finalize that keeps failing (a trap, a refused action) would hold the
                // parent, its namespace and its CRD forever: past the grace the host lets go.
                self.release_finalizers(parent, &format!(
                    "finalize of {} kept failing for longer than {:?} since the deletion ({}: {error}); the finalizer was removed without its cleanup: check for leftovers",
                    plugin.label(),
                    self.finalizer_grace,
                    error.reason()
                ))
                .await?;
                return Ok(ControllerAction::await_change());
            }
            Err(error) => return Err(error),
        };
        self.succeeded(parent);
        if done {
            self.executor.forget_parent(label);
            self.patch_finalizers(parent, false).await?;
            return Ok(ControllerAction::await_change());
        }
        Ok(ControllerAction::requeue(requeue_delay(
            requeue_after_ms,
            FINALIZE_RETRY,
        )))
    }
}
