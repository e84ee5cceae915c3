//! Backups: when a snapshot is due (on demand or on schedule), which slot file it replaces,
//! and what its backup Pod's outcome means for `status.backup`.
//!
//! One backup Pod at a time (its name is fixed). Each snapshot is saved, restored and served
//! by a throwaway etcd in that Pod ([`children::backup_pod`]); the plugin asks that etcd for
//! the snapshot's revision, size and KV hash, and only then lists it as kept. A snapshot that
//! fails to save, restore, upload (with `spec.backup.s3`) or serve is reported as `Failed`
//! with a Warning Event.
//!
//! The Pod is deleted only once a status recording its result is observed: deleted earlier,
//! a reconcile that still sees the previous status would take the snapshot again.

use policy_host_sdk::conditions::rfc3339;
use policy_host_sdk::pods::ObservedPod;

use super::Step;
use crate::children::object_store::{ACCESS_KEY_ID, SECRET_ACCESS_KEY, UPLOAD_CONTAINER};
use crate::children::{
    self, ANNOTATION_FILE, ANNOTATION_LOCATION, RESTORE_CONTAINER, SAVE_CONTAINER, SnapshotCause,
    VERIFY_CONTAINER,
};
use crate::etcd_api::EtcdApi;
use crate::pod_steps::{age, exit_summary, ready_since, terminated};
use crate::protocol::{Action, EventType, Timestamp};
use crate::schedule::{due_time_to_record, next_due, parse_rfc3339};
use crate::spec::{BackupStatus, SnapshotStatus, ValidBackup, ValidS3};

/// A backup Pod with no result this long after it was created has failed: it never
/// scheduled, its claim never bound, or a step hangs. Generous, because saving and restoring
/// a large database takes minutes.
pub const BACKUP_DEADLINE_SECONDS: i64 = 3_600;
/// The verifying etcd has been Ready this long but does not answer the plugin: it has failed
/// (the host cannot reach the Pod, or the restored data cannot be hashed).
pub const VERIFY_GRACE_SECONDS: i64 = 60;

/// What a backup Pod has got to, read from its container statuses.
#[derive(Clone, Debug, PartialEq, Eq)]
enum Progress {
    /// Pending, saving, restoring, or etcd starting.
    Working,
    /// The verifying etcd is Ready: ask it.
    Serving,
    /// It failed; `overwritten`: the save had finished, so the slot file now holds the
    /// snapshot that failed (the previous one in that file is gone).
    Failed { why: String, overwritten: bool },
}

/// What to check when the upload to `s3` fails: the three things it depends on.
fn upload_hint(s3: Option<&ValidS3>) -> String {
    match s3 {
        Some(s3) => format!(
            "check that {} is reachable from the pod, that Secret {} has {ACCESS_KEY_ID} and {SECRET_ACCESS_KEY} allowed to write, and that bucket {} exists",
            s3.endpoint, s3.credentials_secret, s3.bucket
        ),
        None => "check spec.backup.s3's endpoint, credentials Secret and bucket".to_owned(),
    }
}

fn progress(pod: &ObservedPod, s3: Option<&ValidS3>) -> Progress {
    let init = |container| terminated(pod, "initContainerStatuses", container);
    let saved = init(SAVE_CONTAINER).is_some_and(|s| s["exitCode"] == 0);
    if let Some(save) = init(SAVE_CONTAINER).filter(|_| !saved) {
        return Progress::Failed {
            why: format!("etcdctl snapshot save failed ({})", exit_summary(save)),
            overwritten: false,
        };
    }
    if let Some(restore) = init(RESTORE_CONTAINER).filter(|s| s["exitCode"] != 0) {
        return Progress::Failed {
            why: format!(
                "the saved snapshot does not restore: etcdutl snapshot restore failed ({})",
                exit_summary(restore)
            ),
            overwritten: true,
        };
    }
    let destination = pod
        .annotation(ANNOTATION_LOCATION)
        .unwrap_or("the object store");
    if let Some(upload) = init(UPLOAD_CONTAINER).filter(|s| s["exitCode"] != 0) {
        return Progress::Failed {
            why: format!(
                "uploading it to {destination} failed: mc cp {}; {}",
                exit_summary(upload),
                upload_hint(s3)
            ),
            overwritten: true,
        };
    }
    // A missing Secret or key: kubelet would retry until the deadline, but nothing changes
    // until someone creates it, so it is reported now.
    let upload_waiting = pod.object()["status"]["initContainerStatuses"]
        .as_array()
        .and_then(|list| list.iter().find(|s| s["name"] == UPLOAD_CONTAINER))
        .and_then(|s| s["state"].get("waiting"));
    if let Some(waiting) = upload_waiting.filter(|w| w["reason"] == "CreateContainerConfigError") {
        return Progress::Failed {
            why: format!(
                "the upload to {destination} cannot start ({}); {}",
                waiting["message"]
                    .as_str()
                    .unwrap_or("CreateContainerConfigError"),
                upload_hint(s3)
            ),
            overwritten: true,
        };
    }
    if let Some(verify) = terminated(pod, "containerStatuses", VERIFY_CONTAINER) {
        return Progress::Failed {
            why: format!(
                "etcd would not serve the restored snapshot: it exited ({})",
                exit_summary(verify)
            ),
            overwritten: true,
        };
    }
    if pod.phase == "Failed" {
        return Progress::Failed {
            why: format!(
                "the pod failed ({})",
                pod.object()["status"]["message"]
                    .as_str()
                    .unwrap_or("no reason given")
            ),
            overwritten: saved,
        };
    }
    if pod.ready {
        Progress::Serving
    } else {
        Progress::Working
    }
}

/// Whether `status` already records the result of a snapshot taken for `cause`.
fn recorded(status: &BackupStatus, cause: &SnapshotCause) -> bool {
    match cause {
        SnapshotCause::OnDemand(trigger) => status.trigger == *trigger,
        SnapshotCause::Scheduled(due) => status.last_scheduled_time.as_deref() == Some(due),
    }
}

/// The slot the next snapshot goes to: the first of `keep` slots no kept snapshot is in,
/// else the oldest kept snapshot's. `snapshots` is newest first.
fn next_slot(
    snapshots: &[SnapshotStatus],
    keep: usize,
    slot_file: impl Fn(usize) -> String,
) -> usize {
    let in_use = |slot: usize| snapshots.iter().any(|s| s.file == slot_file(slot));
    if let Some(free) = (0..keep).find(|slot| !in_use(*slot)) {
        return free;
    }
    snapshots
        .iter()
        .rev()
        .find_map(|s| (0..keep).find(|slot| s.file == slot_file(*slot)))
        .unwrap_or(0)
}

impl Step<'_> {
    /// Snapshots: records the result of the backup Pod, or deletes it once that result is
    /// observed, or starts one when due: `spec.backup.trigger` changed (first), or the
    /// schedule says so. `contact` is the member that answered; snapshots stream from it.
    pub(super) fn backup(&mut self, etcd: &mut impl EtcdApi, contact: &str) {
        let Some(backup) = self.spec.backup.clone() else {
            // Backups turned off: a snapshot in flight is abandoned (its result would have
            // nowhere to go), and its throwaway etcd stops.
            let children = self.children;
            for pod in &children.backup_pods {
                self.delete_backup_pod(pod);
            }
            return;
        };
        if let Some(claim) = children::backup_claim(self.cluster, self.spec) {
            self.actions.push(Action::Apply(claim));
        }
        let mut status = self.observed.backup.clone().unwrap_or_default();
        status.snapshots.truncate(backup.keep);
        match self.children.backup_pods.first() {
            Some(pod) => self.follow_backup_pod(etcd, pod, &backup, &mut status),
            None => self.start_backup_if_due(contact, &backup, &status),
        }
        status.next_scheduled_time = backup.every_seconds.map(|every| {
            let running = self
                .children
                .backup_pods
                .first()
                .and_then(SnapshotCause::of);
            let last = match running {
                Some(SnapshotCause::Scheduled(due)) => Some(due),
                _ => status.last_scheduled_time.clone(),
            };
            let due = next_due(last.as_deref(), every, self.now.seconds);
            if !self.backup_running {
                let now_ms = self.now.seconds * 1_000 + i64::from(self.now.nanoseconds / 1_000_000);
                self.backup_due_in_ms = u64::try_from(due * 1_000 - now_ms)
                    .ok()
                    .map(|ms| ms.max(100));
            }
            rfc3339(Timestamp {
                seconds: due,
                nanoseconds: 0,
            })
        });
        self.backup_status = Some(status);
    }

    fn start_backup_if_due(&mut self, contact: &str, backup: &ValidBackup, status: &BackupStatus) {
        let cause = if !backup.trigger.is_empty() && status.trigger != backup.trigger {
            SnapshotCause::OnDemand(backup.trigger.clone())
        } else if let Some(every) = backup.every_seconds {
            let now = self.now.seconds;
            let due = next_due(status.last_scheduled_time.as_deref(), every, now);
            if now < due {
                return;
            }
            SnapshotCause::Scheduled(rfc3339(Timestamp {
                seconds: due_time_to_record(due, every, now),
                nanoseconds: 0,
            }))
        } else {
            return;
        };
        let slot = next_slot(&status.snapshots, backup.keep, |s| {
            self.cluster.slot_file(s)
        });
        let file = self.cluster.slot_file(slot);
        self.actions.push(Action::Apply(children::backup_pod(
            self.cluster,
            self.spec,
            contact,
            &file,
            &cause,
        )));
        self.backup_running = true;
    }

    fn follow_backup_pod(
        &mut self,
        etcd: &mut impl EtcdApi,
        pod: &ObservedPod,
        backup: &ValidBackup,
        status: &mut BackupStatus,
    ) {
        let cause = SnapshotCause::of(pod);
        let file = pod.annotation(ANNOTATION_FILE).map(str::to_owned);
        let (Some(cause), Some(file)) = (cause, file) else {
            // A Pod of an older plugin version, which did not verify its snapshot: taken again.
            self.delete_backup_pod(pod);
            return;
        };
        if recorded(status, &cause) {
            self.delete_backup_pod(pod);
            return;
        }
        self.backup_running = true;
        if pod.terminating {
            // Deleted by someone else before its result was read: once it is gone, the same
            // snapshot is taken again (its trigger or due time is still not recorded).
            return;
        }
        let failed = match progress(pod, backup.s3.as_ref()) {
            Progress::Serving => match self.read_snapshot(etcd, pod, &file, &cause) {
                Ok(snapshot) => {
                    self.record_success(status, backup, &cause, snapshot);
                    return;
                }
                Err(why) => {
                    let serving_for = ready_since(pod).map_or(0, |since| self.now.seconds - since);
                    if serving_for < VERIFY_GRACE_SECONDS {
                        return;
                    }
                    (
                        format!(
                            "the etcd serving the restored snapshot did not answer the plugin for {VERIFY_GRACE_SECONDS} s ({why}); check that the host reaches pod {} on port client",
                            pod.name
                        ),
                        true,
                    )
                }
            },
            Progress::Working => {
                if age(pod, self.now).is_none_or(|age| age < BACKUP_DEADLINE_SECONDS) {
                    return;
                }
                (
                    format!(
                        "pod {} had no result {} minutes after it was created (phase {}); check that claim {} binds and the image {}{} can be pulled",
                        pod.name,
                        BACKUP_DEADLINE_SECONDS / 60,
                        if pod.phase.is_empty() {
                            "unknown"
                        } else {
                            &pod.phase
                        },
                        self.cluster.backup_claim_name(),
                        self.spec.image,
                        backup
                            .s3
                            .as_ref()
                            .map(|s3| format!(" (and {})", s3.image))
                            .unwrap_or_default()
                    ),
                    terminated(pod, "initContainerStatuses", SAVE_CONTAINER)
                        .is_some_and(|s| s["exitCode"] == 0),
                )
            }
            Progress::Failed { why, overwritten } => (why, overwritten),
        };
        self.record_failure(status, &cause, &file, failed);
    }

    /// Asks the verifying etcd for what the snapshot holds.
    fn read_snapshot(
        &mut self,
        etcd: &mut impl EtcdApi,
        pod: &ObservedPod,
        file: &str,
        cause: &SnapshotCause,
    ) -> Result<SnapshotStatus, String> {
        let served = etcd.status(&pod.name).map_err(|e| e.to_string())?;
        let hash = etcd
            .hash_kv(&pod.name, served.revision)
            .map_err(|e| e.to_string())?;
        let taken_at = terminated(pod, "initContainerStatuses", SAVE_CONTAINER)
            .and_then(|s| s["finishedAt"].as_str())
            .filter(|t| parse_rfc3339(t).is_some())
            .map_or_else(|| rfc3339(self.now), str::to_owned);
        Ok(SnapshotStatus {
            file: file.to_owned(),
            trigger: cause.label().to_owned(),
            taken_at,
            revision: served.revision,
            size: served.db_size,
            hash_kv: hash.hash,
            // Set only on a Pod that uploaded: the upload step ran before etcd served.
            location: pod.annotation(ANNOTATION_LOCATION).map(str::to_owned),
        })
    }

    fn record_success(
        &mut self,
        status: &mut BackupStatus,
        backup: &ValidBackup,
        cause: &SnapshotCause,
        snapshot: SnapshotStatus,
    ) {
        let uploaded = snapshot
            .location
            .as_ref()
            .map(|at| format!(", uploaded to {at}"))
            .unwrap_or_default();
        self.event(
            EventType::Normal,
            "BackupSucceeded",
            format!(
                "snapshot {} saved in claim {} and verified (restored and served by etcd){uploaded}: revision {}, {} bytes, hashKV {}",
                snapshot.file,
                self.cluster.backup_claim_name(),
                snapshot.revision,
                snapshot.size,
                snapshot.hash_kv
            ),
        );
        record_cause(status, cause);
        status.phase = "Succeeded".into();
        status.message = None;
        status.last_snapshot = Some(snapshot.file.clone());
        status.last_success_time = Some(snapshot.taken_at.clone());
        status.snapshots.retain(|s| s.file != snapshot.file);
        status.snapshots.insert(0, snapshot);
        status.snapshots.truncate(backup.keep);
    }

    fn record_failure(
        &mut self,
        status: &mut BackupStatus,
        cause: &SnapshotCause,
        file: &str,
        (why, overwritten): (String, bool),
    ) {
        let kept = if overwritten {
            status.snapshots.retain(|s| s.file != file);
            if status.last_snapshot.as_deref() == Some(file) {
                status.last_snapshot = status.snapshots.first().map(|s| s.file.clone());
            }
            format!("{file} no longer holds a verified snapshot and is not listed")
        } else {
            format!("{file} still holds the snapshot it held")
        };
        let retry = match cause {
            SnapshotCause::OnDemand(_) => "set spec.backup.trigger to a new value to try again",
            SnapshotCause::Scheduled(_) => {
                "the next scheduled snapshot tries again, or set spec.backup.trigger to try now"
            }
        };
        let message = format!("snapshot {file} failed: {why}; {kept}; {retry}");
        self.event(EventType::Warning, "BackupFailed", message.clone());
        record_cause(status, cause);
        status.phase = "Failed".into();
        status.message = Some(message);
    }

    fn delete_backup_pod(&mut self, pod: &ObservedPod) {
        if !pod.terminating {
            self.actions.push(Action::Delete {
                kind: children::pod_kind(),
                name: pod.name.clone(),
            });
        }
    }
}

/// Marks the snapshot's trigger or due time as handled, so it is not taken again.
fn record_cause(status: &mut BackupStatus, cause: &SnapshotCause) {
    match cause {
        SnapshotCause::OnDemand(trigger) => status.trigger = trigger.clone(),
        SnapshotCause::Scheduled(due) => status.last_scheduled_time = Some(due.clone()),
    }
}
