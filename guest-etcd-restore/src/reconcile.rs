//! The decisions for one `EtcdRestore`: create its EtcdCluster once, restoring from the S3
//! object, then report that cluster's progress until all its members are ready.
//!
//! The cluster is applied only while it does not exist: afterwards it is the user's to edit
//! (scale, upgrade), and re-applying the restore's copy of its spec would undo their edits.
//! An EtcdRestore restores once: a cluster deleted after success is not made again.

use guest_etcd_core::spec::Condition;
use policy_host_sdk::conditions::set_condition;
use policy_host_sdk::contract::EventType;
use policy_host_sdk::prelude::*;
use serde_json::{Value, json};

use crate::spec::{EtcdRestoreObject, EtcdRestoreStatus, ValidRestore};

/// The condition this plugin reports.
pub const CONDITION_SUCCEEDED: &str = "Succeeded";

/// One reconcile's working state.
struct Step {
    generation: Option<i64>,
    now: Timestamp,
    status: EtcdRestoreStatus,
    actions: Vec<Action>,
}

/// Decides for one `EtcdRestore`.
pub fn reconcile(observation: &Observation) -> Result<Decision, PolicyError> {
    let parent: EtcdRestoreObject = observation.parent()?;
    let mut step = Step {
        generation: observation.parent_generation(),
        now: observation.now,
        status: parent.status.clone(),
        actions: Vec::new(),
    };
    step.status.observed_generation = step.generation;
    match parent.spec.validate() {
        Err(why) => step.refuse(why),
        Ok(restore) => {
            let cluster = observation
                .child_named(&guest_etcd_core::target_kind(), &restore.cluster)
                .map(Child::parse::<Value>)
                .transpose()?;
            match cluster {
                None => step.create(&restore),
                Some(cluster) => step.follow(&restore, &cluster),
            }
        }
    }
    if step.status != parent.status {
        step.actions.insert(0, Action::set_status(&step.status)?);
    }
    Ok(Decision {
        actions: step.actions,
        requeue_after_ms: None,
        metrics: Vec::new(),
    })
}

impl Step {
    fn set(&mut self, phase: &str, succeeded: bool, reason: &str, message: String) {
        self.status.phase = Some(phase.to_owned());
        self.status.succeeded = succeeded;
        set_condition(
            &mut self.status.conditions,
            Condition::new(CONDITION_SUCCEEDED, succeeded, reason, message.clone())
                .observed(self.generation),
            self.now,
        );
        self.status.reason = (!succeeded).then_some(message);
    }

    fn event(&mut self, event_type: EventType, reason: &str, message: String) {
        self.actions.push(Action::RecordEvent(Event {
            event_type,
            reason: reason.to_owned(),
            message,
        }));
    }

    fn refuse(&mut self, why: String) {
        if self.status.succeeded {
            // Done already: a later edit changes nothing that was restored.
            return;
        }
        if self.status.reason.as_deref() != Some(why.as_str()) {
            self.event(EventType::Warning, "InvalidSpec", why.clone());
        }
        self.set("Failed", false, "InvalidSpec", why);
    }

    fn create(&mut self, restore: &ValidRestore) {
        if self.status.succeeded {
            let message = format!(
                "EtcdCluster {} was restored and has since been deleted; an EtcdRestore restores once: create a new EtcdRestore to restore again",
                restore.cluster
            );
            if self.status.conditions.iter().all(|c| c.message != message) {
                set_condition(
                    &mut self.status.conditions,
                    Condition::new(CONDITION_SUCCEEDED, true, "ClusterDeleted", message)
                        .observed(self.generation),
                    self.now,
                );
            }
            return;
        }
        let source = &restore.source;
        let message = format!(
            "creating EtcdCluster {} from s3://{}/{} at {}",
            restore.cluster, source.bucket, source.object, source.endpoint
        );
        if self.status.phase.as_deref() != Some("Restoring") {
            self.event(EventType::Normal, "RestoreStarted", message.clone());
        }
        self.actions.push(Action::Apply(json!({
            "apiVersion": "etcd.database.coreos.com/v1beta2",
            "kind": "EtcdCluster",
            "metadata": {"name": restore.cluster},
            "spec": restore.cluster_spec,
        })));
        self.set("Restoring", false, "Restoring", message);
    }

    fn follow(&mut self, restore: &ValidRestore, cluster: &Value) {
        if self.status.succeeded {
            return;
        }
        let status = &cluster["status"];
        let size = cluster["spec"]["size"].as_i64().unwrap_or_default();
        let phase = status["phase"].as_str().unwrap_or("Creating");
        let ready = status["ready"].as_str().unwrap_or("0/?");
        let source = &restore.source;
        if phase == "Running" && ready == format!("{size}/{size}") {
            let message = format!(
                "EtcdCluster {} runs with {ready} members ready, restored from s3://{}/{}",
                restore.cluster, source.bucket, source.object
            );
            self.event(EventType::Normal, "RestoreSucceeded", message.clone());
            self.set("Succeeded", true, "ClusterRunning", message);
            return;
        }
        // The cluster's own account of what is wrong (a download that fails, a snapshot that
        // does not restore): its Degraded condition.
        let degraded = status["conditions"]
            .as_array()
            .into_iter()
            .flatten()
            .find(|c| c["type"] == "Degraded" && c["status"] == "True")
            .and_then(|c| c["message"].as_str());
        match (phase, degraded) {
            ("Failed", why) => {
                let message = format!(
                    "EtcdCluster {} failed: {}",
                    restore.cluster,
                    why.unwrap_or("see its status and Events")
                );
                if self.status.reason.as_deref() != Some(message.as_str()) {
                    self.event(EventType::Warning, "RestoreFailed", message.clone());
                }
                self.set("Failed", false, "ClusterFailed", message);
            }
            (_, why) => {
                let message = format!(
                    "waiting for EtcdCluster {}: phase {phase}, {ready} members ready{}",
                    restore.cluster,
                    why.map(|w| format!("; {w}")).unwrap_or_default()
                );
                self.set("Restoring", false, "Restoring", message);
            }
        }
    }
}

#[cfg(test)]
mod tests;
