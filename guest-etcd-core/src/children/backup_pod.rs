//! The backup Pod that takes one snapshot and proves it restores, and the cause of a snapshot
//! it carries.

use policy_host_sdk::pods::ObservedPod;
use serde_json::{Value, json};

use super::member::{serve_client_tls, with_operator_tls};
use super::object_store;
use super::{
    ANNOTATION_FILE, ANNOTATION_SCHEDULED, ANNOTATION_TRIGGER, BACKUP_MOUNT, CLIENT_PORT,
    ClusterRef, LABEL_INSTANCE, LABEL_MANAGED_BY, LABEL_NAME, LABEL_ROLE, PEER_PORT,
    RESTORE_CONTAINER, SAVE_CONTAINER, VERIFY_CONTAINER, VERIFY_MOUNT,
};
use crate::spec::{TlsSpec, ValidSpec};

/// Why a snapshot is taken; its backup Pod carries it as an annotation.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum SnapshotCause {
    /// `spec.backup.trigger` was set to this value.
    OnDemand(String),
    /// The schedule (`spec.backup.every`) made one due at this time (RFC 3339).
    Scheduled(String),
}

impl SnapshotCause {
    /// The cause a backup Pod carries, if it has one.
    pub fn of(pod: &ObservedPod) -> Option<SnapshotCause> {
        if let Some(due) = pod.annotation(ANNOTATION_SCHEDULED) {
            return Some(SnapshotCause::Scheduled(due.to_owned()));
        }
        pod.annotation(ANNOTATION_TRIGGER)
            .map(|t| SnapshotCause::OnDemand(t.to_owned()))
    }

    /// What `status.backup.snapshots[].trigger` says: the trigger, or `scheduled`.
    pub fn label(&self) -> &str {
        match self {
            SnapshotCause::OnDemand(trigger) => trigger,
            SnapshotCause::Scheduled(_) => "scheduled",
        }
    }
}

/// The Pod that takes one snapshot and proves it restores. The default etcd image is
/// distroless (no shell, no `rm`, no `cp`: only `etcd`, `etcdctl`, `etcdutl`), so each step is
/// one of those programs:
///
/// 1. init `save`: `etcdctl snapshot save` streams the snapshot from one member (a snapshot
///    always comes from a single member) into `file` in the backup claim. etcdctl writes
///    `<file>.part` and renames it, so a slot is replaced whole or not at all.
/// 2. init `restore`: `etcdutl snapshot restore` checks the snapshot's integrity hash and
///    restores it into a scratch `emptyDir`, as a new single-member cluster.
/// 3. init `upload`, only with `spec.backup.s3`: `mc cp` copies the slot file to the object
///    store ([`object_store::with_upload`]), after the restore proved it whole.
/// 4. `verify`: a throwaway etcd serves that data on the pod IP, port `client`, so the plugin
///    reads the snapshot's revision, size and KV hash through the same gateway it uses for
///    members. It is a cluster of its own (own name and token, peer URL on the pod's
///    loopback) and knows no member of the real one, so it can never join or reach it.
///
/// Its labels differ from the members' (`app.kubernetes.io/name: etcd-backup`), so neither
/// the Services nor the PodDisruptionBudget select it.
pub fn backup_pod(
    cluster: &ClusterRef,
    spec: &ValidSpec,
    from: &str,
    file: &str,
    cause: &SnapshotCause,
) -> Value {
    let labels = json!({
        LABEL_NAME: "etcd-backup",
        LABEL_INSTANCE: cluster.name,
        LABEL_MANAGED_BY: "policy-host",
        LABEL_ROLE: "backup",
    });
    let mut annotations = json!({ ANNOTATION_FILE: file });
    match cause {
        SnapshotCause::OnDemand(trigger) => annotations[ANNOTATION_TRIGGER] = json!(trigger),
        SnapshotCause::Scheduled(due) => annotations[ANNOTATION_SCHEDULED] = json!(due),
    }
    let snapshot = format!("{BACKUP_MOUNT}/{file}");
    let data_dir = format!("{VERIFY_MOUNT}/data");
    // Loopback is private to the pod: no member of the real cluster can reach this peer
    // URL, and the restored membership names no other member to reach.
    let peer = format!("http://127.0.0.1:{PEER_PORT}");
    let name = "verify";
    let token = format!("{}-backup-verify", cluster.name);
    let pod_ip =
        json!([{"name": "POD_IP", "valueFrom": {"fieldRef": {"fieldPath": "status.podIP"}}}]);
    let pod = json!({
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {
            "name": cluster.backup_pod_name(),
            "labels": labels,
            "annotations": annotations,
        },
        "spec": {
            "restartPolicy": "Never",
            "initContainers": [
                {
                    "name": SAVE_CONTAINER,
                    "image": spec.image,
                    "command": ["/usr/local/bin/etcdctl", "snapshot", "save", snapshot],
                    // The endpoint as an environment variable rather than `--endpoints`:
                    // etcdctl refuses a flag that shadows a variable, and an environment may
                    // set one.
                    "env": [{"name": "ETCDCTL_ENDPOINTS", "value": cluster.client_url(from)}],
                    "volumeMounts": [{"name": "backup", "mountPath": BACKUP_MOUNT}],
                    // kubelet keeps the end of a failed step's output in its status, which
                    // the plugin quotes in the BackupFailed Event: the Pod is gone soon after.
                    "terminationMessagePolicy": "FallbackToLogsOnError",
                },
                {
                    "name": RESTORE_CONTAINER,
                    "image": spec.image,
                    "command": [
                        "/usr/local/bin/etcdutl", "snapshot", "restore", snapshot,
                        format!("--data-dir={data_dir}"),
                        format!("--name={name}"),
                        format!("--initial-cluster={name}={peer}"),
                        format!("--initial-advertise-peer-urls={peer}"),
                        format!("--initial-cluster-token={token}"),
                    ],
                    "volumeMounts": [
                        {"name": "backup", "mountPath": BACKUP_MOUNT, "readOnly": true},
                        {"name": "verify", "mountPath": VERIFY_MOUNT},
                    ],
                    "terminationMessagePolicy": "FallbackToLogsOnError",
                },
            ],
            "containers": [{
                "name": VERIFY_CONTAINER,
                "image": spec.image,
                "command": ["/usr/local/bin/etcd"],
                // etcd ignores the initial-cluster flags on an existing data directory; they
                // repeat the restore's so the two can never disagree.
                "args": [
                    format!("--name={name}"),
                    format!("--data-dir={data_dir}"),
                    format!("--listen-client-urls={}://$(POD_IP):{CLIENT_PORT}", cluster.scheme()),
                    format!("--advertise-client-urls={}://$(POD_IP):{CLIENT_PORT}", cluster.scheme()),
                    format!("--listen-peer-urls={peer}"),
                    format!("--initial-advertise-peer-urls={peer}"),
                    format!("--initial-cluster={name}={peer}"),
                    format!("--initial-cluster-token={token}"),
                ],
                "env": pod_ip,
                "ports": [{"name": "client", "containerPort": CLIENT_PORT, "protocol": "TCP"}],
                "readinessProbe": {
                    "httpGet": {"path": "/health", "port": "client"},
                    "periodSeconds": 2,
                    "timeoutSeconds": 3,
                    "failureThreshold": 3,
                },
                "volumeMounts": [{"name": "verify", "mountPath": VERIFY_MOUNT}],
                "terminationMessagePolicy": "FallbackToLogsOnError",
            }],
            "volumes": [
                {"name": "backup", "persistentVolumeClaim": {"claimName": cluster.backup_claim_name()}},
                {"name": "verify", "emptyDir": {}},
            ],
        },
    });
    let pod = match spec.backup.as_ref().and_then(|b| b.s3.as_ref()) {
        Some(s3) => object_store::with_upload(pod, s3, cluster, file),
        None => pod,
    };
    match &spec.tls {
        Some(tls) => with_backup_tls(pod, tls),
        None => pod,
    }
}

/// A backup pod of a TLS cluster: its `etcdctl` step presents the operator's certificate, and
/// the throwaway etcd, which serves the cluster's keys, serves them like a member does (the
/// server certificate, client certificates required). The plugin reaches it as
/// `<cluster>-backup.<cluster>.<namespace>.svc`, a name the members' wildcard covers.
fn with_backup_tls(pod: Value, tls: &TlsSpec) -> Value {
    let mut pod = with_operator_tls(pod, tls);
    let mut volumes = Vec::new();
    for container in pod["spec"]["containers"]
        .as_array_mut()
        .into_iter()
        .flatten()
    {
        if container["command"][0]
            .as_str()
            .is_some_and(|c| c.ends_with("/etcd"))
        {
            serve_client_tls(container, &mut volumes, tls);
        }
    }
    if let Some(list) = pod["spec"]["volumes"].as_array_mut() {
        list.extend(volumes);
    }
    pod
}
