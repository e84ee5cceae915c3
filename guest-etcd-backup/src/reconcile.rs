//! The decisions for one `EtcdBackup`: whether a snapshot is due, following its Pod step by
//! step, reading what the verified snapshot holds, and the status that reports it.
//!
//! One snapshot Pod at a time (its name is fixed). A result is written to status first; the
//! Pod is deleted only once a status recording it is observed, so a reconcile that still sees
//! the previous status never takes the same snapshot twice. A failed snapshot is not retried
//! in a loop: a one-shot backup is retried by a new `spec.trigger`, a scheduled one at its
//! next period.

use guest_etcd_core::children::object_store::UPLOAD_CONTAINER;
use guest_etcd_core::children::{RESTORE_CONTAINER, SAVE_CONTAINER, VERIFY_CONTAINER};
use guest_etcd_core::etcd_api::EtcdApi;
use guest_etcd_core::pod_steps::{age, exit_summary, ready_since, terminated};
use guest_etcd_core::schedule::{due_time_to_record, next_due, parse_rfc3339};
use policy_host_sdk::children::pod_kind;
use policy_host_sdk::conditions::{Condition, rfc3339, set_condition};
use policy_host_sdk::contract::EventType;
use policy_host_sdk::pods::ObservedPod;
use policy_host_sdk::prelude::*;

use crate::snapshot_pod::{
    ANNOTATION_LOCATION, ANNOTATION_SCHEDULED, ANNOTATION_TRIGGER, Cause, PRUNE_CONTAINER,
    pod_name, snapshot_pod,
};
use crate::spec::{EtcdBackupObject, EtcdBackupStatus, ValidBackup};

/// The condition this plugin reports.
pub const CONDITION_SUCCEEDED: &str = "Succeeded";
/// The verifying etcd has been Ready this long but does not answer the plugin: it failed.
pub const VERIFY_GRACE_SECONDS: i64 = 60;
/// Look again this often while a snapshot Pod works (its changes wake the plugin anyway).
const FOLLOW_MS: u64 = 5_000;
/// Look again this soon while the verifying etcd starts answering.
const VERIFY_RETRY_MS: u64 = 1_000;

/// What a snapshot Pod has got to.
#[derive(Debug, PartialEq, Eq)]
enum Progress {
    Working,
    Serving,
    Failed(String),
}

/// What to check when the upload fails: the three things it depends on.
fn upload_hint(spec: &ValidBackup) -> String {
    format!(
        "check that {} is reachable from the pod, that Secret {} has accessKeyID and secretAccessKey allowed to write, and that bucket {} exists",
        spec.s3_endpoint, spec.credentials_secret, spec.bucket
    )
}

fn progress(pod: &ObservedPod, spec: &ValidBackup) -> Progress {
    let failed = |container: &str| {
        terminated(pod, "initContainerStatuses", container).filter(|s| s["exitCode"] != 0)
    };
    let destination = pod
        .annotation(ANNOTATION_LOCATION)
        .unwrap_or("the object store");
    if let Some(save) = failed(SAVE_CONTAINER) {
        return Progress::Failed(format!(
            "etcdctl snapshot save from {} failed ({}); check that spec.etcdEndpoints[0] answers from the pod{}",
            spec.endpoint,
            exit_summary(save),
            if spec.client_tls_secret.is_some() {
                " and that spec.clientTLSSecret holds a client certificate it accepts"
            } else {
                ""
            }
        ));
    }
    if let Some(restore) = failed(RESTORE_CONTAINER) {
        return Progress::Failed(format!(
            "the saved snapshot does not restore: etcdutl snapshot restore failed ({})",
            exit_summary(restore)
        ));
    }
    if let Some(upload) = failed(UPLOAD_CONTAINER) {
        return Progress::Failed(format!(
            "uploading it to {destination} failed: mc cp {}; {}",
            exit_summary(upload),
            upload_hint(spec)
        ));
    }
    if let Some(prune) = failed(PRUNE_CONTAINER) {
        return Progress::Failed(format!(
            "the snapshot is in {destination}, but removing the snapshots beyond spec.backupPolicy.maxBackups failed: mc rm {}",
            exit_summary(prune)
        ));
    }
    // A missing Secret or key: kubelet would retry until the deadline, but nothing changes
    // until someone creates it, so it is reported now.
    let config_error = pod.object()["status"]["initContainerStatuses"]
        .as_array()
        .into_iter()
        .flatten()
        .chain(
            pod.object()["status"]["containerStatuses"]
                .as_array()
                .into_iter()
                .flatten(),
        )
        .find_map(|s| {
            let waiting = s["state"].get("waiting")?;
            (waiting["reason"] == "CreateContainerConfigError").then(|| {
                format!(
                    "step {} cannot start ({})",
                    s["name"].as_str().unwrap_or("?"),
                    waiting["message"]
                        .as_str()
                        .unwrap_or("CreateContainerConfigError")
                )
            })
        });
    if let Some(why) = config_error {
        return Progress::Failed(format!(
            "{why}; check that Secret {} exists with accessKeyID and secretAccessKey{}",
            spec.credentials_secret,
            spec.client_tls_secret
                .as_ref()
                .map(|s| format!(
                    ", and Secret {s} with etcd-client.crt, etcd-client.key and etcd-client-ca.crt"
                ))
                .unwrap_or_default()
        ));
    }
    if let Some(verify) = terminated(pod, "containerStatuses", VERIFY_CONTAINER) {
        return Progress::Failed(format!(
            "etcd would not serve the restored snapshot: it exited ({})",
            exit_summary(verify)
        ));
    }
    if pod.phase == "Failed" {
        return Progress::Failed(format!(
            "the pod failed ({}); spec.backupPolicy.timeoutInSecond is {} s",
            pod.object()["status"]["message"]
                .as_str()
                .unwrap_or("no reason given"),
            spec.timeout_seconds
        ));
    }
    if pod.ready {
        Progress::Serving
    } else {
        Progress::Working
    }
}

/// The cause a snapshot Pod carries.
fn cause_of(pod: &ObservedPod) -> Option<Cause> {
    if let Some(due) = pod.annotation(ANNOTATION_SCHEDULED) {
        return Some(Cause::Scheduled(due.to_owned()));
    }
    pod.annotation(ANNOTATION_TRIGGER)
        .map(|t| Cause::OnDemand(t.to_owned()))
}

/// Whether `status` already records the result of a snapshot for `cause`.
fn recorded(status: &EtcdBackupStatus, cause: &Cause) -> bool {
    match cause {
        Cause::OnDemand(trigger) => status.trigger.as_deref() == Some(trigger.as_str()),
        Cause::Scheduled(due) => status.last_scheduled_time.as_deref() == Some(due.as_str()),
    }
}

/// One reconcile's working state.
struct Step {
    name: String,
    generation: Option<i64>,
    now: Timestamp,
    status: EtcdBackupStatus,
    actions: Vec<Action>,
    requeue_ms: Option<u64>,
}

/// Decides for one `EtcdBackup`, asking the verifying etcd through `etcd`.
pub fn reconcile(
    observation: &Observation,
    etcd: &mut impl EtcdApi,
) -> Result<Decision, PolicyError> {
    let parent: EtcdBackupObject = observation.parent()?;
    let mut step = Step {
        name: observation.parent_name()?,
        generation: observation.parent_generation(),
        now: observation.now,
        status: parent.status.clone(),
        actions: Vec::new(),
        requeue_ms: None,
    };
    step.status.observed_generation = step.generation;
    let pod_name = pod_name(&step.name);
    let pod = observation.pods()?.into_iter().find(|p| p.name == pod_name);
    match parent.spec.validate() {
        Err(why) => step.refuse(why, pod.as_ref()),
        Ok(spec) => match &pod {
            Some(pod) => step.follow(etcd, pod, &spec),
            None => step.start_if_due(&spec),
        },
    }
    if step.status != parent.status {
        step.actions.insert(0, Action::set_status(&step.status)?);
    }
    Ok(Decision {
        actions: step.actions,
        requeue_after_ms: step.requeue_ms,
        metrics: Vec::new(),
    })
}

impl Step {
    fn condition(&mut self, ok: bool, reason: &str, message: &str) {
        set_condition(
            &mut self.status.conditions,
            Condition::new(CONDITION_SUCCEEDED, ok, reason, message).observed(self.generation),
            self.now,
        );
    }

    fn event(&mut self, event_type: EventType, reason: &str, message: String) {
        self.actions.push(Action::RecordEvent(Event {
            event_type,
            reason: reason.to_owned(),
            message,
        }));
    }

    /// An invalid spec: said in status (and an Event when it is news); a snapshot in flight
    /// is abandoned, its result would have nowhere valid to go.
    fn refuse(&mut self, why: String, pod: Option<&ObservedPod>) {
        if self.status.reason.as_deref() != Some(why.as_str()) {
            self.event(EventType::Warning, "InvalidSpec", why.clone());
        }
        self.status.succeeded = false;
        self.status.phase = Some("Failed".into());
        self.condition(false, "InvalidSpec", &why);
        self.status.reason = Some(why);
        if let Some(pod) = pod.filter(|p| !p.terminating) {
            self.actions.push(Action::delete(&pod_kind(), &pod.name));
        }
    }

    fn start_if_due(&mut self, spec: &ValidBackup) {
        let now = self.now.seconds;
        let trigger_changed = self.status.trigger.as_deref() != Some(spec.trigger.as_str());
        let cause = match spec.every_seconds {
            // One-shot: the first snapshot, then one per new trigger.
            None if trigger_changed => Cause::OnDemand(spec.trigger.clone()),
            None => return,
            Some(_) if trigger_changed && !spec.trigger.is_empty() => {
                Cause::OnDemand(spec.trigger.clone())
            }
            Some(every) => {
                let due = next_due(self.status.last_scheduled_time.as_deref(), every, now);
                if now < due {
                    let now_ms = now * 1_000 + i64::from(self.now.nanoseconds / 1_000_000);
                    self.requeue_ms = u64::try_from(due * 1_000 - now_ms)
                        .ok()
                        .map(|ms| ms.max(100));
                    return;
                }
                Cause::Scheduled(rfc3339(Timestamp {
                    seconds: due_time_to_record(due, every, now),
                    nanoseconds: 0,
                }))
            }
        };
        let prune = match (&cause, spec.max_backups) {
            (Cause::Scheduled(_), Some(max)) => self
                .status
                .backups
                .iter()
                .skip(max.saturating_sub(1))
                .cloned()
                .collect(),
            _ => Vec::new(),
        };
        self.actions.push(Action::Apply(snapshot_pod(
            &self.name, spec, &cause, &prune,
        )));
        self.status.phase = Some("Running".into());
        self.requeue_ms = Some(FOLLOW_MS);
    }

    fn follow(&mut self, etcd: &mut impl EtcdApi, pod: &ObservedPod, spec: &ValidBackup) {
        let Some(cause) = cause_of(pod) else {
            self.actions.push(Action::delete(&pod_kind(), &pod.name));
            return;
        };
        if recorded(&self.status, &cause) {
            if !pod.terminating {
                self.actions.push(Action::delete(&pod_kind(), &pod.name));
            }
            return;
        }
        if pod.terminating {
            // Deleted by someone else before its result was read: once it is gone, the same
            // snapshot is taken again (its cause is still not recorded).
            return;
        }
        self.requeue_ms = Some(FOLLOW_MS);
        let failed = match progress(pod, spec) {
            Progress::Serving => match self.read_snapshot(etcd, pod) {
                Ok(()) => {
                    self.record(&cause, pod, spec);
                    return;
                }
                Err(why) => {
                    let serving_for = ready_since(pod).map_or(0, |since| self.now.seconds - since);
                    if serving_for < VERIFY_GRACE_SECONDS {
                        self.requeue_ms = Some(VERIFY_RETRY_MS);
                        return;
                    }
                    format!(
                        "the etcd serving the restored snapshot did not answer the plugin for {VERIFY_GRACE_SECONDS} s ({why}); check that the host reaches pod {} on port client",
                        pod.name
                    )
                }
            },
            Progress::Working => {
                if age(pod, self.now).is_none_or(|age| age < spec.timeout_seconds) {
                    return;
                }
                format!(
                    "pod {} had no result {} s after it was created (phase {}, spec.backupPolicy.timeoutInSecond); check that the images {} and {} can be pulled",
                    pod.name,
                    spec.timeout_seconds,
                    if pod.phase.is_empty() {
                        "unknown"
                    } else {
                        &pod.phase
                    },
                    spec.image,
                    spec.mc_image
                )
            }
            Progress::Failed(why) => why,
        };
        self.record_cause(&cause, None, spec);
        self.status.succeeded = false;
        self.status.phase = Some("Failed".into());
        self.condition(false, "BackupFailed", &failed);
        self.event(EventType::Warning, "BackupFailed", failed.clone());
        self.status.reason = Some(failed);
    }

    /// Asks the verifying etcd what the snapshot holds, into status (not yet the outcome).
    fn read_snapshot(&mut self, etcd: &mut impl EtcdApi, pod: &ObservedPod) -> Result<(), String> {
        let served = etcd.status(&pod.name).map_err(|e| e.to_string())?;
        let hash = etcd
            .hash_kv(&pod.name, served.revision)
            .map_err(|e| e.to_string())?;
        let taken_at = terminated(pod, "initContainerStatuses", SAVE_CONTAINER)
            .and_then(|s| s["finishedAt"].as_str())
            .filter(|t| parse_rfc3339(t).is_some())
            .map_or_else(|| rfc3339(self.now), str::to_owned);
        self.status.etcd_version = Some(served.version);
        self.status.etcd_revision = Some(served.revision);
        self.status.size = Some(served.db_size);
        self.status.hash_kv = Some(hash.hash);
        self.status.last_success_date = Some(taken_at);
        Ok(())
    }

    fn record(&mut self, cause: &Cause, pod: &ObservedPod, spec: &ValidBackup) {
        let location = pod.annotation(ANNOTATION_LOCATION).map(str::to_owned);
        self.record_cause(cause, location.as_deref(), spec);
        self.status.succeeded = true;
        self.status.reason = None;
        self.status.phase = Some("Succeeded".into());
        self.status.location = location.clone();
        let message = format!(
            "snapshot of {} verified (restored and served by etcd {}) and uploaded to {}: revision {}, {} bytes, hashKV {}",
            spec.endpoint,
            self.status.etcd_version.as_deref().unwrap_or("?"),
            location.as_deref().unwrap_or("the object store"),
            self.status.etcd_revision.unwrap_or_default(),
            self.status.size.unwrap_or_default(),
            self.status.hash_kv.unwrap_or_default(),
        );
        self.condition(true, "SnapshotVerified", &message);
        self.event(EventType::Normal, "BackupSucceeded", message);
    }

    /// Marks `cause` as done (succeeded or not); a scheduled success joins `backups`, whose
    /// oldest beyond `maxBackups` its Pod removed.
    fn record_cause(&mut self, cause: &Cause, uploaded: Option<&str>, spec: &ValidBackup) {
        match cause {
            Cause::OnDemand(trigger) => self.status.trigger = Some(trigger.clone()),
            Cause::Scheduled(due) => {
                self.status.last_scheduled_time = Some(due.clone());
                if let Some(location) = uploaded {
                    let prefix = format!("s3://{}/", spec.bucket);
                    let object = location.strip_prefix(&prefix).unwrap_or(location);
                    self.status.backups.retain(|o| o != object);
                    self.status.backups.insert(0, object.to_owned());
                    if let Some(max) = spec.max_backups {
                        self.status.backups.truncate(max);
                    }
                }
            }
        }
    }
}

#[cfg(test)]
mod tests;
