//! The Pod that takes one snapshot of the cluster behind `spec.etcdEndpoints`, proves it
//! restores, uploads it and serves it for the plugin to read.
//!
//! The same steps as an EtcdCluster's own backup Pod (`guest_etcd_core::children::backup_pod`),
//! in a scratch volume instead of a backup claim: `save` (`etcdctl snapshot save` from the
//! first endpoint), `restore` (`etcdutl snapshot restore`, which checks the snapshot's
//! integrity hash), `upload` (`mc cp`, only after the restore proved it whole), `prune` (with
//! `maxBackups`, `mc rm` of the scheduled snapshots beyond it, only after the upload), then
//! `verify`: a throwaway etcd, a cluster of its own on the Pod's loopback, serving the
//! restored data on the Pod IP for the plugin to ask its revision, size and hash.

use guest_etcd_core::children::object_store::{UPLOAD_CONTAINER, credentials_env};
use guest_etcd_core::children::{
    BACKUP_MOUNT, CLIENT_PORT, LABEL_INSTANCE, LABEL_MANAGED_BY, LABEL_NAME, LABEL_ROLE, PEER_PORT,
    RESTORE_CONTAINER, SAVE_CONTAINER, VERIFY_CONTAINER, VERIFY_MOUNT,
};
use serde_json::{Value, json};

use crate::spec::ValidBackup;

/// Init container that removes scheduled snapshots beyond `maxBackups`.
pub const PRUNE_CONTAINER: &str = "prune";
/// Annotation: the `spec.trigger` a one-shot snapshot is taken for.
pub const ANNOTATION_TRIGGER: &str = "etcd.database.coreos.com/backup-trigger";
/// Annotation: when (RFC 3339) a scheduled snapshot was due.
pub const ANNOTATION_SCHEDULED: &str = "etcd.database.coreos.com/backup-scheduled-for";
/// Annotation: the object the snapshot is uploaded to, `s3://<bucket>/<object>`.
pub const ANNOTATION_LOCATION: &str = "etcd.database.coreos.com/backup-location";
/// Where the client certificate Secret is mounted.
const CLIENT_TLS_MOUNT: &str = "/etc/etcd/client-tls";
/// The snapshot file in the scratch volume.
const SNAPSHOT_FILE: &str = "snapshot.db";
/// The `mc` alias of the store.
const ALIAS: &str = "s3";
/// Where `mc` keeps its configuration (a scratch volume: the image's home may be read-only).
const MC_CONFIG_MOUNT: &str = "/mc";

/// Why a snapshot is taken.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Cause {
    /// One-shot, for this `spec.trigger` (empty for the first).
    OnDemand(String),
    /// Scheduled, due at this time (RFC 3339).
    Scheduled(String),
}

/// The snapshot Pod's name: `<backup>-snapshot`.
pub fn pod_name(backup: &str) -> String {
    format!("{backup}-snapshot")
}

/// `s3://<bucket>/<object>`.
pub fn location(spec: &ValidBackup, object: &str) -> String {
    format!("s3://{}/{object}", spec.bucket)
}

/// The object a snapshot for `cause` is written to: `spec.s3.path`'s object for a one-shot
/// snapshot, `<object>_<due time as 20261125T153000Z>` for a scheduled one.
pub fn object_for(spec: &ValidBackup, cause: &Cause) -> String {
    match cause {
        Cause::OnDemand(_) => spec.object.clone(),
        Cause::Scheduled(due) => {
            let compact: String = due.chars().filter(|c| !matches!(c, '-' | ':')).collect();
            format!("{}_{compact}", spec.object)
        }
    }
}

/// The Pod for one snapshot of `backup` (the EtcdBackup's name) for `cause`, removing the
/// objects `prune` (scheduled snapshots beyond `maxBackups`) once it uploaded.
pub fn snapshot_pod(backup: &str, spec: &ValidBackup, cause: &Cause, prune: &[String]) -> Value {
    let object = object_for(spec, cause);
    let mut annotations = json!({ ANNOTATION_LOCATION: location(spec, &object) });
    match cause {
        Cause::OnDemand(trigger) => annotations[ANNOTATION_TRIGGER] = json!(trigger),
        Cause::Scheduled(due) => annotations[ANNOTATION_SCHEDULED] = json!(due),
    }
    let snapshot = format!("{BACKUP_MOUNT}/{SNAPSHOT_FILE}");
    let data_dir = format!("{VERIFY_MOUNT}/data");
    // Loopback is private to the Pod: the restored single-member cluster can reach nothing.
    let peer = format!("http://127.0.0.1:{PEER_PORT}");
    let token = format!("{backup}-verify");
    let mut save_env = vec![json!({"name": "ETCDCTL_ENDPOINTS", "value": spec.endpoint})];
    let mut save_mounts = vec![json!({"name": "backup", "mountPath": BACKUP_MOUNT})];
    let mut volumes = vec![
        json!({"name": "backup", "emptyDir": {}}),
        json!({"name": "verify", "emptyDir": {}}),
        json!({"name": "mc-config", "emptyDir": {}}),
    ];
    if let Some(secret) = &spec.client_tls_secret {
        // The classic operator's key names, read by etcdctl from its environment.
        for (variable, key) in [
            ("ETCDCTL_CACERT", "etcd-client-ca.crt"),
            ("ETCDCTL_CERT", "etcd-client.crt"),
            ("ETCDCTL_KEY", "etcd-client.key"),
        ] {
            save_env.push(json!({"name": variable, "value": format!("{CLIENT_TLS_MOUNT}/{key}")}));
        }
        save_mounts
            .push(json!({"name": "client-tls", "mountPath": CLIENT_TLS_MOUNT, "readOnly": true}));
        volumes.push(json!({"name": "client-tls", "secret": {"secretName": secret}}));
    }
    let mc = |name: &str, args: Vec<String>| {
        let mut command = vec![
            "mc".to_owned(),
            "--config-dir".to_owned(),
            MC_CONFIG_MOUNT.to_owned(),
        ];
        command.extend(args);
        json!({
            "name": name,
            "image": spec.mc_image,
            "command": command,
            "env": credentials_env(&spec.s3_endpoint, &spec.credentials_secret),
            "volumeMounts": [
                {"name": "backup", "mountPath": BACKUP_MOUNT, "readOnly": true},
                {"name": "mc-config", "mountPath": MC_CONFIG_MOUNT},
            ],
            "terminationMessagePolicy": "FallbackToLogsOnError",
        })
    };
    let mut init = vec![
        json!({
            "name": SAVE_CONTAINER,
            "image": spec.image,
            "command": ["/usr/local/bin/etcdctl", "snapshot", "save", snapshot],
            "env": save_env,
            "volumeMounts": save_mounts,
            "terminationMessagePolicy": "FallbackToLogsOnError",
        }),
        json!({
            "name": RESTORE_CONTAINER,
            "image": spec.image,
            "command": [
                "/usr/local/bin/etcdutl", "snapshot", "restore", snapshot,
                format!("--data-dir={data_dir}"),
                "--name=verify",
                format!("--initial-cluster=verify={peer}"),
                format!("--initial-advertise-peer-urls={peer}"),
                format!("--initial-cluster-token={token}"),
            ],
            "volumeMounts": [
                {"name": "backup", "mountPath": BACKUP_MOUNT, "readOnly": true},
                {"name": "verify", "mountPath": VERIFY_MOUNT},
            ],
            "terminationMessagePolicy": "FallbackToLogsOnError",
        }),
        mc(
            UPLOAD_CONTAINER,
            vec![
                "cp".into(),
                snapshot.clone(),
                format!("{ALIAS}/{}/{object}", spec.bucket),
            ],
        ),
    ];
    if !prune.is_empty() {
        let mut args = vec!["rm".to_owned(), "--force".to_owned()];
        args.extend(prune.iter().map(|o| format!("{ALIAS}/{}/{o}", spec.bucket)));
        init.push(mc(PRUNE_CONTAINER, args));
    }
    json!({
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {
            "name": pod_name(backup),
            "labels": {
                LABEL_NAME: "etcd-backup",
                LABEL_INSTANCE: backup,
                LABEL_MANAGED_BY: "policy-host",
                LABEL_ROLE: "backup",
            },
            "annotations": annotations,
        },
        "spec": {
            "restartPolicy": "Never",
            // `timeoutInSecond`, enforced by kubelet as well as read by the plugin.
            "activeDeadlineSeconds": spec.timeout_seconds,
            "initContainers": init,
            "containers": [{
                "name": VERIFY_CONTAINER,
                "image": spec.image,
                "command": ["/usr/local/bin/etcd"],
                "args": [
                    "--name=verify",
                    format!("--data-dir={data_dir}"),
                    format!("--listen-client-urls=http://$(POD_IP):{CLIENT_PORT}"),
                    format!("--advertise-client-urls=http://$(POD_IP):{CLIENT_PORT}"),
                    format!("--listen-peer-urls={peer}"),
                    format!("--initial-advertise-peer-urls={peer}"),
                    format!("--initial-cluster=verify={peer}"),
                    format!("--initial-cluster-token={token}"),
                ],
                "env": [{"name": "POD_IP", "valueFrom": {"fieldRef": {"fieldPath": "status.podIP"}}}],
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
            "volumes": volumes,
        },
    })
}
