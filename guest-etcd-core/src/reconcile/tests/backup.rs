//! Backup rows: on-demand and scheduled snapshots, slot rotation with `keep`, the verify step
//! (backup Pod serving → app-calls → status), its failures, and the rule that the backup Pod
//! goes only once the status recording it is observed.

use super::*;
use crate::children::{
    ANNOTATION_FILE, ANNOTATION_LOCATION, ANNOTATION_SCHEDULED, ANNOTATION_TRIGGER, SnapshotCause,
};

const MEMBERS: [&str; 3] = ["ex-0", "ex-1", "ex-2"];

fn members() -> Vec<Child> {
    MEMBERS.iter().map(|m| ready(m)).collect()
}

fn healthy() -> FakeEtcd {
    FakeEtcd::with(vec![voter(1, "ex-0"), voter(2, "ex-1"), voter(3, "ex-2")])
}

/// A 3-member spec whose `backup` is `{storage: 1Gi}` plus `fields`.
fn backup_spec(fields: Value) -> Value {
    let mut backup = json!({"storage": {"size": "1Gi"}});
    if let (Some(backup), Some(fields)) = (backup.as_object_mut(), fields.as_object()) {
        backup.extend(fields.clone());
    }
    json!({"size": 3, "version": "3.6.16", "backup": backup})
}

/// A recorded 3-member cluster whose `status.backup` is `backup`.
fn backed_up_with(backup: Value) -> Value {
    let mut status = recorded(&MEMBERS);
    status["backup"] = backup;
    status
}

/// A kept snapshot as status lists it.
fn kept(file: &str, trigger: &str, revision: i64) -> Value {
    json!({"file": file, "trigger": trigger, "takenAt": "2024-05-01T11:00:00Z",
           "revision": revision, "size": 20480, "hashKV": 1})
}

/// Where a backup Pod has got to.
#[derive(Clone, Copy)]
enum Stage {
    Pending,
    SaveFailed,
    RestoreFailed,
    Serving,
    VerifyExited,
    /// Saved and restored; `mc cp` exited 1.
    UploadFailed,
    /// Saved and restored; the upload cannot start: its Secret is missing.
    UploadUnstartable,
}

/// The backup Pod as the plugin builds it for `cause` into `file`, at `stage`, created 10 s
/// before `NOW` (Ready, when serving, 5 s before).
fn backup_pod(cause: SnapshotCause, file: &str, stage: Stage) -> Child {
    backup_pod_of(json!({"size": 3, "version": "3.6.16"}), cause, file, stage)
}

/// `spec.backup.s3` of the S3 rows.
fn s3() -> Value {
    json!({"endpoint": "http://minio.backup.svc:9000", "bucket": "etcd-snapshots",
           "prefix": "prod", "credentialsSecret": "s3-credentials"})
}

/// The backup Pod of a spec with `backup.s3` ([`s3`]).
fn s3_backup_pod(cause: SnapshotCause, file: &str, stage: Stage) -> Child {
    backup_pod_of(backup_spec(json!({"s3": s3()})), cause, file, stage)
}

/// The backup Pod the plugin builds from `spec` for `cause` into `file`, at `stage`.
fn backup_pod_of(spec: Value, cause: SnapshotCause, file: &str, stage: Stage) -> Child {
    let cluster = ClusterRef {
        name: "ex".into(),
        namespace: "ns".into(),
        tls: false,
    };
    let spec = serde_json::from_value::<EtcdClusterSpec>(spec)
        .expect("parses")
        .validate()
        .expect("valid");
    let mut object = children::backup_pod(&cluster, &spec, "ex-0", file, &cause);
    object["metadata"]["creationTimestamp"] = json!("2024-05-01T11:59:50Z");
    let exited = |name: &str, code: i64, message: &str| {
        json!({"name": name, "state": {"terminated": {
            "exitCode": code, "message": message, "finishedAt": "2024-05-01T11:59:52Z"}}})
    };
    let saved = exited("save", 0, "");
    let restored = exited("restore", 0, "");
    object["status"] = match stage {
        Stage::Pending => json!({"phase": "Pending"}),
        Stage::SaveFailed => json!({"phase": "Failed", "initContainerStatuses": [
            exited("save", 1, "Error: context deadline exceeded"),
            {"name": "restore", "state": {"waiting": {"reason": "PodInitializing"}}},
        ]}),
        Stage::RestoreFailed => json!({"phase": "Failed", "initContainerStatuses": [
            saved, exited("restore", 1, "Error: expected sha256 [..], got [..]"),
        ]}),
        Stage::Serving => json!({
            "phase": "Running",
            "conditions": [{"type": "Ready", "status": "True", "lastTransitionTime": "2024-05-01T11:59:55Z"}],
            "initContainerStatuses": [saved, restored],
            "containerStatuses": [{"name": "verify", "ready": true, "state": {"running": {}}}],
        }),
        Stage::UploadFailed => json!({"phase": "Failed", "initContainerStatuses": [
            saved, restored,
            exited("upload", 1, "mc: <ERROR> Unable to upload. The specified bucket does not exist."),
        ]}),
        Stage::UploadUnstartable => json!({"phase": "Pending", "initContainerStatuses": [
            saved, restored,
            {"name": "upload", "state": {"waiting": {"reason": "CreateContainerConfigError",
                "message": "secret \"s3-credentials\" not found"}}},
        ]}),
        Stage::VerifyExited => json!({"phase": "Failed",
            "initContainerStatuses": [saved, restored],
            "containerStatuses": [exited("verify", 2, "panic: failed to recover v3 backend")],
        }),
    };
    Child {
        kind: pod_kind(),
        object: object.to_string(),
    }
}

/// The same Pod, created (and Ready) at `time`.
fn since(mut child: Child, time: &str) -> Child {
    let mut object: Value = serde_json::from_str(&child.object).unwrap_or_default();
    object["metadata"]["creationTimestamp"] = json!(time);
    if let Some(ready) = object["status"]
        .get_mut("conditions")
        .and_then(|c| c.get_mut(0))
    {
        ready["lastTransitionTime"] = json!(time);
    }
    child.object = object.to_string();
    child
}

fn on_demand(trigger: &str) -> SnapshotCause {
    SnapshotCause::OnDemand(trigger.into())
}

fn scheduled(due: &str) -> SnapshotCause {
    SnapshotCause::Scheduled(due.into())
}

fn with(mut children: Vec<Child>, pod: Child) -> Vec<Child> {
    children.push(pod);
    children
}

/// The backup Pod the decision applies.
fn applied_backup_pod(d: &Decision) -> Value {
    d.actions
        .iter()
        .find_map(|a| match a {
            Action::Apply(o) if o["metadata"]["name"] == "ex-backup" => Some(o.clone()),
            _ => None,
        })
        .unwrap_or_default()
}

fn backup_status(d: &Decision) -> Value {
    summarize(d).status["backup"].clone()
}

fn files(backup: &Value) -> Vec<String> {
    backup["snapshots"]
        .as_array()
        .map(|list| {
            list.iter()
                .filter_map(|s| s["file"].as_str().map(str::to_owned))
                .collect()
        })
        .unwrap_or_default()
}

fn event_message(d: &Decision, reason: &str) -> String {
    d.actions
        .iter()
        .find_map(|a| match a {
            Action::RecordEvent(e) if e.reason == reason => Some(e.message.clone()),
            _ => None,
        })
        .unwrap_or_default()
}

/// A row with a healthy 3-member cluster: only the observation, the expected backup actions
/// and events, the requeue and the check differ.
#[allow(clippy::too_many_arguments)]
fn row(
    name: &'static str,
    spec: Value,
    status: Value,
    children: Vec<Child>,
    etcd: FakeEtcd,
    applied: &'static [&'static str],
    deleted: &'static [&'static str],
    events: &'static [&'static str],
    requeue: u64,
    check: fn(&Decision, &FakeEtcd),
) -> Row {
    Row {
        name,
        observation: observation(spec, Some(status), children),
        etcd,
        changes: &[],
        applied,
        deleted,
        events,
        phase: "Running",
        requeue: Some(requeue),
        check,
    }
}

const CLAIM: &str = "PersistentVolumeClaim/backup-ex";
const POD: &str = "Pod/ex-backup";

pub(super) fn rows() -> Vec<Row> {
    vec![
        // ---- starting a snapshot ----
        row(
            "a new trigger starts a backup pod that saves, restores and serves the snapshot",
            backup_spec(json!({"trigger": "2024-05-01T12:00"})),
            recorded(&MEMBERS),
            members(),
            healthy(),
            &[CLAIM, POD],
            &[],
            &[],
            2_000,
            |d, _| {
                let pod = applied_backup_pod(d);
                let annotations = &pod["metadata"]["annotations"];
                assert_eq!(annotations[ANNOTATION_TRIGGER], "2024-05-01T12:00");
                assert_eq!(annotations[ANNOTATION_FILE], "ex-0.db");
                let init = &pod["spec"]["initContainers"];
                assert_eq!(init.as_array().map(Vec::len), Some(2), "no upload: {init}");
                assert!(annotations.get(ANNOTATION_LOCATION).is_none());
                assert_eq!(
                    init[0]["command"],
                    json!([
                        "/usr/local/bin/etcdctl",
                        "snapshot",
                        "save",
                        "/backup/ex-0.db"
                    ])
                );
                assert_eq!(
                    init[0]["env"],
                    json!([{"name": "ETCDCTL_ENDPOINTS", "value": "http://ex-0.ex.ns.svc:2379"}])
                );
                let restore: Vec<String> =
                    serde_json::from_value(init[1]["command"].clone()).unwrap_or_default();
                assert_eq!(
                    restore[..4],
                    [
                        "/usr/local/bin/etcdutl",
                        "snapshot",
                        "restore",
                        "/backup/ex-0.db"
                    ]
                );
                for container in [&init[0], &init[1], &pod["spec"]["containers"][0]] {
                    assert_eq!(
                        container["terminationMessagePolicy"],
                        "FallbackToLogsOnError"
                    );
                }
                let verify = &pod["spec"]["containers"][0];
                assert_eq!(verify["command"], json!(["/usr/local/bin/etcd"]));
                assert_eq!(verify["ports"][0]["name"], "client");
                let args: Vec<String> =
                    serde_json::from_value(verify["args"].clone()).unwrap_or_default();
                // A cluster of its own: never the members' name, token or peer URLs.
                for want in [
                    "--name=verify",
                    "--listen-client-urls=http://$(POD_IP):2379",
                    "--listen-peer-urls=http://127.0.0.1:2380",
                    "--initial-cluster=verify=http://127.0.0.1:2380",
                    "--initial-cluster-token=ex-backup-verify",
                ] {
                    assert!(args.iter().any(|a| a == want), "{want} in {args:?}");
                    if want.starts_with("--initial") || want.starts_with("--name") {
                        assert!(restore.iter().any(|a| a == want), "{want} in {restore:?}");
                    }
                }
                assert!(!args.iter().any(|a| a.contains("ex.ns.svc")), "{args:?}");
                // Neither the Services nor the budget select it.
                let labels = &pod["metadata"]["labels"];
                assert_ne!(labels["app.kubernetes.io/name"], "etcd", "{labels}");
                assert_eq!(labels["etcd.database.coreos.com/role"], "backup");
            },
        ),
        row(
            "schedule never run: the first scheduled snapshot starts now, annotated with its due time",
            backup_spec(json!({"every": "6h"})),
            recorded(&MEMBERS),
            members(),
            healthy(),
            &[CLAIM, POD],
            &[],
            &[],
            2_000,
            |d, _| {
                let annotations = applied_backup_pod(d)["metadata"]["annotations"].clone();
                assert_eq!(annotations[ANNOTATION_SCHEDULED], "2024-05-01T12:00:00Z");
                assert!(
                    annotations.get(ANNOTATION_TRIGGER).is_none(),
                    "{annotations}"
                );
            },
        ),
        row(
            "schedule due: started at the due time it was due, keeping the schedule's phase",
            backup_spec(json!({"every": "6h"})),
            backed_up_with(json!({"lastScheduledTime": "2024-05-01T05:59:30Z"})),
            members(),
            healthy(),
            &[CLAIM, POD],
            &[],
            &[],
            2_000,
            |d, _| {
                let pod = applied_backup_pod(d);
                assert_eq!(
                    pod["metadata"]["annotations"][ANNOTATION_SCHEDULED],
                    "2024-05-01T11:59:30Z"
                );
            },
        ),
        row(
            "schedule missed by more than a period: one snapshot now, not a burst of catch-ups",
            backup_spec(json!({"every": "6h"})),
            backed_up_with(json!({"lastScheduledTime": "2024-04-29T00:00:00Z"})),
            members(),
            healthy(),
            &[CLAIM, POD],
            &[],
            &[],
            2_000,
            |d, _| {
                let pod = applied_backup_pod(d);
                assert_eq!(
                    pod["metadata"]["annotations"][ANNOTATION_SCHEDULED],
                    "2024-05-01T12:00:00Z"
                );
            },
        ),
        row(
            "schedule not due within the steady requeue: nothing started, next due time in status",
            backup_spec(json!({"every": "6h"})),
            backed_up_with(json!({"lastScheduledTime": "2024-05-01T10:00:00Z"})),
            members(),
            healthy(),
            &[CLAIM],
            &[],
            &[],
            30_000,
            |d, _| {
                assert_eq!(
                    backup_status(d)["nextScheduledTime"],
                    "2024-05-01T16:00:00Z"
                );
            },
        ),
        row(
            "schedule due in 20 s: the plugin asks to be called again exactly then",
            backup_spec(json!({"every": "30s"})),
            backed_up_with(json!({"lastScheduledTime": "2024-05-01T11:59:50Z"})),
            members(),
            healthy(),
            &[CLAIM],
            &[],
            &[],
            20_000,
            |d, _| {
                assert_eq!(
                    backup_status(d)["nextScheduledTime"],
                    "2024-05-01T12:00:20Z"
                );
            },
        ),
        row(
            "on demand beside a schedule: a new trigger goes first, the due scheduled one waits",
            backup_spec(json!({"every": "6h", "trigger": "t2"})),
            backed_up_with(json!({"trigger": "t1", "lastScheduledTime": "2024-05-01T05:00:00Z"})),
            members(),
            healthy(),
            &[CLAIM, POD],
            &[],
            &[],
            2_000,
            |d, _| {
                let annotations = applied_backup_pod(d)["metadata"]["annotations"].clone();
                assert_eq!(annotations[ANNOTATION_TRIGGER], "t2");
                assert!(annotations.get(ANNOTATION_SCHEDULED).is_none());
            },
        ),
        row(
            "one backup pod at a time: a due schedule waits while an on-demand snapshot runs",
            backup_spec(json!({"every": "6h", "trigger": "t2"})),
            backed_up_with(json!({"trigger": "t1", "lastScheduledTime": "2024-05-01T05:00:00Z"})),
            with(
                members(),
                backup_pod(on_demand("t2"), "ex-1.db", Stage::Pending),
            ),
            healthy(),
            &[CLAIM],
            &[],
            &[],
            2_000,
            |d, etcd| {
                assert_eq!(
                    backup_status(d)["lastScheduledTime"],
                    "2024-05-01T05:00:00Z"
                );
                assert!(
                    !etcd.calls.iter().any(|c| c.contains("ex-backup")),
                    "{:?}",
                    etcd.calls
                );
            },
        ),
        row(
            "a trigger already recorded is not taken again",
            backup_spec(json!({"trigger": "t1"})),
            backed_up(&MEMBERS, "t1"),
            members(),
            healthy(),
            &[CLAIM],
            &[],
            &[],
            30_000,
            no_check,
        ),
        // ---- uploads to an S3-compatible store ----
        row(
            "with s3, the snapshot is uploaded as its slot's object after it restored, keys from the Secret",
            backup_spec(json!({"trigger": "t1", "keep": 2, "s3": s3()})),
            recorded(&MEMBERS),
            members(),
            healthy(),
            &[CLAIM, POD],
            &[],
            &[],
            2_000,
            |d, _| {
                let pod = applied_backup_pod(d);
                assert_eq!(
                    pod["metadata"]["annotations"][ANNOTATION_LOCATION],
                    "s3://etcd-snapshots/prod/ns/ex-0.db"
                );
                let init = pod["spec"]["initContainers"]
                    .as_array()
                    .cloned()
                    .unwrap_or_default();
                let names: Vec<&str> = init.iter().filter_map(|c| c["name"].as_str()).collect();
                assert_eq!(names, ["save", "restore", "upload"]);
                let upload = &init[2];
                assert_eq!(upload["image"], crate::spec::DEFAULT_MC_IMAGE);
                assert_eq!(
                    upload["command"],
                    json!([
                        "mc",
                        "--config-dir",
                        "/mc",
                        "cp",
                        "/backup/ex-0.db",
                        "s3/etcd-snapshots/prod/ns/ex-0.db"
                    ])
                );
                assert_eq!(
                    upload["env"],
                    json!([
                        {"name": "S3_ACCESS_KEY_ID", "valueFrom": {"secretKeyRef":
                            {"name": "s3-credentials", "key": "accessKeyID"}}},
                        {"name": "S3_SECRET_ACCESS_KEY", "valueFrom": {"secretKeyRef":
                            {"name": "s3-credentials", "key": "secretAccessKey"}}},
                        {"name": "MC_HOST_s3", "value":
                            "http://$(S3_ACCESS_KEY_ID):$(S3_SECRET_ACCESS_KEY)@minio.backup.svc:9000"},
                    ])
                );
                // No key in the Pod spec itself.
                assert!(!pod.to_string().contains("AKIA"), "{pod}");
                let volumes = pod["spec"]["volumes"].to_string();
                assert!(volumes.contains("mc-config"), "{volumes}");
            },
        ),
        row(
            "with s3, the object rotates with the slot: keep 2 replaces the oldest object",
            backup_spec(json!({"trigger": "t3", "keep": 2, "s3": s3()})),
            backed_up_with(
                json!({"trigger": "t2", "snapshots": [kept("ex-0.db", "t2", 9), kept("ex-1.db", "t1", 5)]}),
            ),
            members(),
            healthy(),
            &[CLAIM, POD],
            &[],
            &[],
            2_000,
            |d, _| {
                let pod = applied_backup_pod(d);
                assert_eq!(
                    pod["spec"]["initContainers"][2]["command"][5],
                    "s3/etcd-snapshots/prod/ns/ex-1.db"
                );
            },
        ),
        row(
            "an uploaded snapshot is listed with its location",
            backup_spec(json!({"trigger": "t1", "s3": s3()})),
            recorded(&MEMBERS),
            with(
                members(),
                s3_backup_pod(on_demand("t1"), "ex-0.db", Stage::Serving),
            ),
            healthy(),
            &[CLAIM],
            &[],
            &["Normal/BackupSucceeded"],
            2_000,
            |d, _| {
                let backup = backup_status(d);
                assert_eq!(
                    backup["snapshots"][0]["location"], "s3://etcd-snapshots/prod/ns/ex-0.db",
                    "{backup}"
                );
                assert!(
                    event_message(d, "BackupSucceeded")
                        .contains("uploaded to s3://etcd-snapshots/prod/ns/ex-0.db")
                );
            },
        ),
        row(
            "a failed upload is a failed backup naming the endpoint, the Secret and the bucket",
            backup_spec(json!({"trigger": "t1", "s3": s3()})),
            backed_up_with(
                json!({"snapshots": [kept("ex-0.db", "t0", 5), kept("ex-1.db", "t", 3)]}),
            ),
            with(
                members(),
                s3_backup_pod(on_demand("t1"), "ex-0.db", Stage::UploadFailed),
            ),
            healthy(),
            &[CLAIM],
            &[],
            &["Warning/BackupFailed"],
            2_000,
            |d, etcd| {
                let backup = backup_status(d);
                assert_eq!(backup["phase"], "Failed");
                assert_eq!(files(&backup), ["ex-1.db"]);
                let message = event_message(d, "BackupFailed");
                for part in [
                    "uploading it to s3://etcd-snapshots/prod/ns/ex-0.db failed",
                    "exit code 1",
                    "bucket does not exist",
                    "http://minio.backup.svc:9000",
                    "Secret s3-credentials",
                    "bucket etcd-snapshots exists",
                ] {
                    assert!(message.contains(part), "{part} in {message}");
                }
                assert!(!etcd.calls.iter().any(|c| c.contains("ex-backup")));
            },
        ),
        row(
            "an upload that cannot start for a missing Secret fails now, not at the deadline",
            backup_spec(json!({"trigger": "t1", "s3": s3()})),
            recorded(&MEMBERS),
            with(
                members(),
                s3_backup_pod(on_demand("t1"), "ex-0.db", Stage::UploadUnstartable),
            ),
            healthy(),
            &[CLAIM],
            &[],
            &["Warning/BackupFailed"],
            2_000,
            |d, _| {
                let message = event_message(d, "BackupFailed");
                assert!(
                    message.contains("secret \"s3-credentials\" not found"),
                    "{message}"
                );
                assert_eq!(backup_status(d)["phase"], "Failed");
            },
        ),
        // ---- slots ----
        row(
            "keep 3 with two slots used: the new snapshot goes to the free slot",
            backup_spec(json!({"trigger": "t3"})),
            backed_up_with(
                json!({"trigger": "t2", "snapshots": [kept("ex-1.db", "t2", 9), kept("ex-0.db", "t1", 5)]}),
            ),
            members(),
            healthy(),
            &[CLAIM, POD],
            &[],
            &[],
            2_000,
            |d, _| {
                let pod = applied_backup_pod(d);
                assert_eq!(pod["metadata"]["annotations"][ANNOTATION_FILE], "ex-2.db");
                assert_eq!(
                    pod["spec"]["initContainers"][0]["command"][3],
                    "/backup/ex-2.db"
                );
            },
        ),
        row(
            "keep 2 with both slots used: the new snapshot replaces the oldest",
            backup_spec(json!({"trigger": "t3", "keep": 2})),
            backed_up_with(
                json!({"trigger": "t2", "snapshots": [kept("ex-0.db", "t2", 9), kept("ex-1.db", "t1", 5)]}),
            ),
            members(),
            healthy(),
            &[CLAIM, POD],
            &[],
            &[],
            2_000,
            |d, _| {
                let pod = applied_backup_pod(d);
                assert_eq!(pod["metadata"]["annotations"][ANNOTATION_FILE], "ex-1.db");
            },
        ),
        row(
            "keep lowered to 2: status lists only the 2 newest",
            backup_spec(json!({"keep": 2})),
            backed_up_with(json!({"snapshots": [
                kept("ex-2.db", "scheduled", 9), kept("ex-1.db", "scheduled", 7), kept("ex-0.db", "scheduled", 5)]})),
            members(),
            healthy(),
            &[CLAIM],
            &[],
            &[],
            30_000,
            |d, _| assert_eq!(files(&backup_status(d)), ["ex-2.db", "ex-1.db"]),
        ),
        // ---- the verify step ----
        row(
            "the verifying etcd serves the snapshot: revision, size and hashKV listed newest first, pod kept until observed",
            backup_spec(json!({"every": "6h"})),
            backed_up_with(
                json!({"lastScheduledTime": "2024-05-01T06:00:00Z", "snapshots": [kept("ex-1.db", "t1", 5)]}),
            ),
            with(
                members(),
                backup_pod(scheduled("2024-05-01T11:59:50Z"), "ex-0.db", Stage::Serving),
            ),
            healthy(),
            &[CLAIM],
            &[],
            &["Normal/BackupSucceeded"],
            2_000,
            |d, etcd| {
                assert!(
                    etcd.calls.contains(&"status ex-backup".to_owned())
                        && etcd.calls.contains(&"hashkv ex-backup 42".to_owned()),
                    "{:?}",
                    etcd.calls
                );
                let backup = backup_status(d);
                assert_eq!(
                    backup["snapshots"][0],
                    json!({"file": "ex-0.db", "trigger": "scheduled", "takenAt": "2024-05-01T11:59:52Z",
                           "revision": 42, "size": 20480, "hashKV": 4_178_063_679_u32}),
                    "{backup}"
                );
                assert_eq!(files(&backup), ["ex-0.db", "ex-1.db"]);
                assert_eq!(backup["lastSnapshot"], "ex-0.db");
                assert_eq!(backup["lastSuccessTime"], "2024-05-01T11:59:52Z");
                assert_eq!(backup["lastScheduledTime"], "2024-05-01T11:59:50Z");
                assert_eq!(backup["nextScheduledTime"], "2024-05-01T17:59:50Z");
                assert_eq!(backup["phase"], "Succeeded");
                assert!(event_message(d, "BackupSucceeded").contains("hashKV 4178063679"));
            },
        ),
        row(
            "a verified snapshot replacing the oldest slot drops that slot's old entry (keep 2)",
            backup_spec(json!({"trigger": "t3", "keep": 2})),
            backed_up_with(
                json!({"trigger": "t2", "snapshots": [kept("ex-0.db", "t2", 9), kept("ex-1.db", "t1", 5)]}),
            ),
            with(
                members(),
                backup_pod(on_demand("t3"), "ex-1.db", Stage::Serving),
            ),
            healthy(),
            &[CLAIM],
            &[],
            &["Normal/BackupSucceeded"],
            2_000,
            |d, _| {
                let backup = backup_status(d);
                assert_eq!(files(&backup), ["ex-1.db", "ex-0.db"]);
                assert_eq!(backup["snapshots"][0]["trigger"], "t3");
                assert_eq!(backup["snapshots"][0]["revision"], 42);
                assert_eq!(backup["trigger"], "t3");
            },
        ),
        row(
            "the pod is deleted once the status recording it is observed, and not asked again",
            backup_spec(json!({"every": "6h"})),
            backed_up_with(
                json!({"lastScheduledTime": "2024-05-01T11:59:50Z", "phase": "Succeeded",
                                  "snapshots": [kept("ex-0.db", "scheduled", 42)]}),
            ),
            with(
                members(),
                backup_pod(scheduled("2024-05-01T11:59:50Z"), "ex-0.db", Stage::Serving),
            ),
            healthy(),
            &[CLAIM],
            &[POD],
            &[],
            30_000,
            |d, etcd| {
                assert!(
                    !etcd.calls.iter().any(|c| c.contains("ex-backup")),
                    "{:?}",
                    etcd.calls
                );
                assert_eq!(files(&backup_status(d)), ["ex-0.db"]);
            },
        ),
        row(
            "a finished on-demand pod whose trigger the status records is deleted, not run again",
            backup_spec(json!({"trigger": "t1"})),
            backed_up(&MEMBERS, "t1"),
            with(
                members(),
                backup_pod(on_demand("t1"), "ex-0.db", Stage::Serving),
            ),
            healthy(),
            &[CLAIM],
            &[POD],
            &[],
            30_000,
            no_check,
        ),
        row(
            "a backup pod still starting is left alone, and never taken for a stray member",
            backup_spec(json!({"trigger": "t1"})),
            recorded(&MEMBERS),
            with(
                members(),
                backup_pod(on_demand("t1"), "ex-0.db", Stage::Pending),
            ),
            healthy(),
            &[CLAIM],
            &[],
            &[],
            2_000,
            |d, etcd| {
                assert!(etcd.changes().is_empty());
                assert!(backup_status(d).get("phase").is_none_or(|p| p == ""));
            },
        ),
        row(
            "a backup pod of an older plugin version (no verify step) is deleted, the snapshot taken again",
            backup_spec(json!({"trigger": "t1"})),
            recorded(&MEMBERS),
            with(members(), {
                let mut child = backup_pod(on_demand("t1"), "ex-0.db", Stage::Serving);
                let mut object: Value = serde_json::from_str(&child.object).unwrap_or_default();
                if let Some(a) = object["metadata"]["annotations"].as_object_mut() {
                    a.remove(ANNOTATION_FILE);
                }
                child.object = object.to_string();
                child
            }),
            healthy(),
            &[CLAIM],
            &[POD],
            &[],
            30_000,
            no_check,
        ),
        row(
            "backups turned off: a backup pod in flight is deleted",
            json!({"size": 3, "version": "3.6.16"}),
            recorded(&MEMBERS),
            with(
                members(),
                backup_pod(on_demand("t1"), "ex-0.db", Stage::Serving),
            ),
            healthy(),
            &[],
            &[POD],
            &[],
            30_000,
            |_, etcd| assert!(!etcd.calls.iter().any(|c| c.contains("ex-backup"))),
        ),
        // ---- failures ----
        row(
            "save failed: Failed with what to do, the slot's previous snapshot still listed",
            backup_spec(json!({"trigger": "t2"})),
            backed_up(&MEMBERS, "t1"),
            with(
                members(),
                backup_pod(on_demand("t2"), "ex-0.db", Stage::SaveFailed),
            ),
            healthy(),
            &[CLAIM],
            &[],
            &["Warning/BackupFailed"],
            2_000,
            |d, _| {
                let backup = backup_status(d);
                assert_eq!(backup["phase"], "Failed", "{backup}");
                assert_eq!(backup["trigger"], "t2");
                assert_eq!(files(&backup), ["ex-0.db"]);
                assert_eq!(backup["lastSnapshot"], "ex-0.db");
                let message = event_message(d, "BackupFailed");
                for part in [
                    "etcdctl snapshot save failed",
                    "context deadline exceeded",
                    "still holds",
                    "spec.backup.trigger",
                ] {
                    assert!(message.contains(part), "{part} in {message}");
                }
                assert_eq!(backup["message"], message.as_str());
            },
        ),
        row(
            "a saved snapshot that does not restore: Failed, its slot no longer listed",
            backup_spec(json!({"every": "6h"})),
            backed_up_with(json!({"lastSnapshot": "ex-1.db", "phase": "Succeeded",
                                  "snapshots": [kept("ex-1.db", "scheduled", 9), kept("ex-0.db", "scheduled", 5)]})),
            with(
                members(),
                backup_pod(
                    scheduled("2024-05-01T11:59:50Z"),
                    "ex-0.db",
                    Stage::RestoreFailed,
                ),
            ),
            healthy(),
            &[CLAIM],
            &[],
            &["Warning/BackupFailed"],
            2_000,
            |d, _| {
                let backup = backup_status(d);
                assert_eq!(backup["phase"], "Failed");
                assert_eq!(files(&backup), ["ex-1.db"]);
                assert_eq!(backup["lastSnapshot"], "ex-1.db");
                assert_eq!(
                    backup["lastScheduledTime"], "2024-05-01T11:59:50Z",
                    "the period counts"
                );
                let message = event_message(d, "BackupFailed");
                assert!(
                    message.contains("does not restore") && message.contains("next scheduled"),
                    "{message}"
                );
            },
        ),
        row(
            "keep 1: a snapshot etcd would not serve leaves no last snapshot to restore from",
            backup_spec(json!({"trigger": "t2", "keep": 1})),
            backed_up(&MEMBERS, "t1"),
            with(
                members(),
                backup_pod(on_demand("t2"), "ex-0.db", Stage::VerifyExited),
            ),
            healthy(),
            &[CLAIM],
            &[],
            &["Warning/BackupFailed"],
            2_000,
            |d, _| {
                let backup = backup_status(d);
                assert!(backup.get("snapshots").is_none(), "{backup}");
                assert!(backup.get("lastSnapshot").is_none(), "{backup}");
                assert!(event_message(d, "BackupFailed").contains("would not serve"));
            },
        ),
        row(
            "verifying etcd Ready but not answering yet: waits, records nothing",
            backup_spec(json!({"trigger": "t1"})),
            recorded(&MEMBERS),
            with(
                members(),
                backup_pod(on_demand("t1"), "ex-0.db", Stage::Serving),
            ),
            FakeEtcd {
                answering: Some(MEMBERS.to_vec()),
                ..healthy()
            },
            &[CLAIM],
            &[],
            &[],
            2_000,
            |d, etcd| {
                assert!(etcd.calls.contains(&"status ex-backup".to_owned()));
                assert!(backup_status(d).get("phase").is_none_or(|p| p == ""));
            },
        ),
        row(
            "verifying etcd unreachable past the grace period: Failed, saying what to check",
            backup_spec(json!({"trigger": "t1"})),
            recorded(&MEMBERS),
            with(
                members(),
                since(
                    backup_pod(on_demand("t1"), "ex-0.db", Stage::Serving),
                    "2024-05-01T11:58:00Z",
                ),
            ),
            FakeEtcd {
                answering: Some(MEMBERS.to_vec()),
                ..healthy()
            },
            &[CLAIM],
            &[],
            &["Warning/BackupFailed"],
            2_000,
            |d, _| {
                let backup = backup_status(d);
                assert_eq!(backup["phase"], "Failed");
                assert_eq!(backup["trigger"], "t1");
                let message = event_message(d, "BackupFailed");
                assert!(
                    message.contains("did not answer") && message.contains("port client"),
                    "{message}"
                );
            },
        ),
        row(
            "a backup pod with no result an hour after it was created has failed",
            backup_spec(json!({"trigger": "t1"})),
            recorded(&MEMBERS),
            with(
                members(),
                since(
                    backup_pod(on_demand("t1"), "ex-0.db", Stage::Pending),
                    "2024-05-01T10:59:00Z",
                ),
            ),
            healthy(),
            &[CLAIM],
            &[],
            &["Warning/BackupFailed"],
            2_000,
            |d, _| {
                let message = event_message(d, "BackupFailed");
                assert!(message.contains("backup-ex binds"), "{message}");
            },
        ),
        // ---- invalid values ----
        Row {
            name: "every that is not a duration is rejected with InvalidSpec, touching nothing",
            observation: observation(
                backup_spec(json!({"every": "daily"})),
                Some(json!({"phase": "Running", "clusterID": "777", "size": 3})),
                members(),
            ),
            etcd: healthy(),
            changes: &[],
            applied: &[],
            deleted: &[],
            events: &["Warning/InvalidSpec"],
            phase: "Running",
            requeue: None,
            check: |d, etcd| {
                let status = summarize(d).status;
                let degraded = condition(&status, "Degraded").cloned().unwrap_or_default();
                assert!(
                    degraded["message"].as_str().is_some_and(|m| m
                        .contains("spec.backup.every \"daily\"")
                        && m.contains("6h")),
                    "{degraded}"
                );
                assert!(etcd.calls.is_empty());
            },
        },
        Row {
            name: "keep 0 is rejected with InvalidSpec",
            observation: observation(
                backup_spec(json!({"keep": 0})),
                Some(json!({"phase": "Running", "clusterID": "777", "size": 3})),
                members(),
            ),
            etcd: healthy(),
            changes: &[],
            applied: &[],
            deleted: &[],
            events: &["Warning/InvalidSpec"],
            phase: "Running",
            requeue: None,
            check: |d, _| {
                let status = summarize(d).status;
                let degraded = condition(&status, "Degraded").cloned().unwrap_or_default();
                assert!(
                    degraded["message"]
                        .as_str()
                        .is_some_and(|m| m.contains("spec.backup.keep is 0")),
                    "{degraded}"
                );
            },
        },
    ]
}

/// Replays a schedule for a while, as the host and kubelet would: each decision's actions
/// are applied, a backup Pod serves its snapshot one round after it is created, and time
/// moves on by each requeue. Snapshots rotate through `keep` slots, the Pod is deleted only
/// after its result is in the observed status, and there is never more than one.
#[test]
fn scheduled_snapshots_rotate_through_the_kept_slots() {
    let mut etcd = healthy();
    let mut status = recorded(&MEMBERS);
    let mut backup_pod_child: Option<Child> = None;
    let mut now = NOW.seconds;
    let mut taken = Vec::new();
    let spec = backup_spec(json!({"every": "1m", "keep": 2}));
    for round in 0..40 {
        let mut children = members();
        children.extend(backup_pod_child.clone());
        let mut obs = observation(spec.clone(), Some(status.clone()), children);
        obs.now.seconds = now;
        // A write between snapshots moves the revision on.
        etcd.revision += 1;
        let decision = reconcile(&obs, &mut etcd).unwrap_or_else(|e| panic!("round {round}: {e}"));
        let before = files(&status["backup"]);
        for action in &decision.actions {
            match action {
                Action::Apply(o) if o["metadata"]["name"] == "ex-backup" => {
                    assert!(
                        backup_pod_child.is_none(),
                        "round {round}: a second backup pod"
                    );
                    let file = o["metadata"]["annotations"][ANNOTATION_FILE]
                        .as_str()
                        .unwrap_or_default();
                    let due = o["metadata"]["annotations"][ANNOTATION_SCHEDULED]
                        .as_str()
                        .unwrap_or_default();
                    backup_pod_child = Some(backup_pod(scheduled(due), file, Stage::Serving));
                }
                Action::Delete { name, .. } if name == "ex-backup" => {
                    let recorded_file = backup_pod_child
                        .as_ref()
                        .and_then(|c| serde_json::from_str::<Value>(&c.object).ok())
                        .map(|o| o["metadata"]["annotations"][ANNOTATION_FILE].clone());
                    assert_eq!(
                        recorded_file.as_ref().and_then(|f| f.as_str()),
                        before.first().map(String::as_str),
                        "round {round}: deleted before its result was observed"
                    );
                    backup_pod_child = None;
                }
                Action::SetStatus(s) => status = s.clone(),
                _ => {}
            }
        }
        let after = files(&status["backup"]);
        if after != before {
            taken.push(after.first().cloned().unwrap_or_default());
        }
        assert!(after.len() <= 2, "round {round}: {after:?}");
        now += i64::try_from(decision.requeue_after_ms.unwrap_or(30_000) / 1_000).unwrap_or(30);
    }
    assert!(taken.len() >= 4, "{taken:?}");
    assert_eq!(taken[..4], ["ex-0.db", "ex-1.db", "ex-0.db", "ex-1.db"]);
    let revisions: Vec<i64> = status["backup"]["snapshots"]
        .as_array()
        .map(|l| l.iter().filter_map(|s| s["revision"].as_i64()).collect())
        .unwrap_or_default();
    assert!(
        revisions.len() == 2 && revisions[0] > revisions[1],
        "newest first: {revisions:?}"
    );
}

/// Review M3: `staging/ex` and `prod/ex` backing up to one bucket wrote the same objects, so
/// each status listed a location holding whichever cluster uploaded last.
#[test]
fn same_named_clusters_in_two_namespaces_upload_to_objects_that_cannot_collide() {
    let uploaded_to = |namespace: &str| {
        let mut observation = observation(
            backup_spec(json!({"trigger": "t1", "s3": s3()})),
            Some(recorded(&MEMBERS)),
            members(),
        );
        let mut parent: Value = serde_json::from_str(&observation.parent).expect("JSON");
        parent["metadata"]["namespace"] = json!(namespace);
        observation.parent = parent.to_string();
        let decision = reconcile(&observation, &mut healthy()).expect("decides");
        let pod = applied_backup_pod(&decision);
        let upload = pod["spec"]["initContainers"]
            .as_array()
            .and_then(|init| init.iter().find(|c| c["name"] == "upload"))
            .map(|c| c["command"][5].clone())
            .unwrap_or_default();
        (
            pod["metadata"]["annotations"][ANNOTATION_LOCATION].clone(),
            upload,
        )
    };
    let (staging, prod) = (uploaded_to("staging"), uploaded_to("prod"));
    assert_eq!(
        staging,
        (
            json!("s3://etcd-snapshots/prod/staging/ex-0.db"),
            json!("s3/etcd-snapshots/prod/staging/ex-0.db")
        ),
        "the object is named with the cluster's namespace"
    );
    assert_ne!(
        staging, prod,
        "each namespace's cluster has its own objects"
    );
}
