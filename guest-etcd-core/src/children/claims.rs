//! The PersistentVolumeClaims: a data claim per member (with `spec.storage`) and the claim
//! that keeps the snapshots (with `spec.backup`).

use serde_json::{Value, json};

use super::ClusterRef;
use crate::spec::{StorageSpec, ValidSpec};

/// The claim that keeps the snapshots (only with `spec.backup`).
pub fn backup_claim(cluster: &ClusterRef, spec: &ValidSpec) -> Option<Value> {
    let backup = spec.backup.as_ref()?;
    Some(claim(
        &cluster.backup_claim_name(),
        cluster.labels(),
        &backup.storage,
    ))
}

/// A claim mounted by one pod at a time (`ReadWriteOnce`), of the given size and class.
fn claim(name: &str, labels: Value, storage: &StorageSpec) -> Value {
    let mut claim_spec = json!({
        "accessModes": ["ReadWriteOnce"],
        "resources": {"requests": {"storage": storage.size.0}},
    });
    if let Some(class) = &storage.storage_class_name {
        claim_spec["storageClassName"] = json!(class);
    }
    json!({
        "apiVersion": "v1",
        "kind": "PersistentVolumeClaim",
        "metadata": {"name": name, "labels": labels},
        "spec": claim_spec,
    })
}

/// The data claim of a member pod (only with `spec.storage`).
pub fn member_claim(cluster: &ClusterRef, spec: &ValidSpec, pod: &str) -> Option<Value> {
    let storage = spec.storage.as_ref()?;
    Some(claim(
        &cluster.claim_name(pod),
        cluster.member_labels(pod),
        storage,
    ))
}
