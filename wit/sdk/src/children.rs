//! Building child objects: the kind references of common built-in kinds, and a skeleton
//! object with `apiVersion`, `kind` and `metadata` filled in.
//!
//! The host sets the namespace and the controller owner reference on every applied child,
//! so a plugin only names it. Server-side apply merges by field owner: apply the whole
//! object you want each time (an omitted field is removed), never a patch.

use serde_json::{Value, json};

use crate::contract::KindRef;

/// Core `v1` `ConfigMap`.
pub fn config_map_kind() -> KindRef {
    KindRef::namespaced("", "v1", "ConfigMap", "configmaps")
}

/// Core `v1` `Secret`.
pub fn secret_kind() -> KindRef {
    KindRef::namespaced("", "v1", "Secret", "secrets")
}

/// Core `v1` `Service`.
pub fn service_kind() -> KindRef {
    KindRef::namespaced("", "v1", "Service", "services")
}

/// Core `v1` `Pod`.
pub fn pod_kind() -> KindRef {
    KindRef::namespaced("", "v1", "Pod", "pods")
}

/// Core `v1` `PersistentVolumeClaim`.
pub fn pvc_kind() -> KindRef {
    KindRef::namespaced("", "v1", "PersistentVolumeClaim", "persistentvolumeclaims")
}

/// `policy/v1` `PodDisruptionBudget`.
pub fn pdb_kind() -> KindRef {
    KindRef::namespaced(
        "policy",
        "v1",
        "PodDisruptionBudget",
        "poddisruptionbudgets",
    )
}

/// A child object of `kind` named `name` with the given labels and the top-level `fields`
/// (for example `{"data": {...}}` for a ConfigMap, `{"spec": {...}}` for a Pod) merged in.
/// `fields` that are not a JSON object are ignored.
pub fn child_object(kind: &KindRef, name: &str, labels: &[(&str, &str)], fields: Value) -> Value {
    let labels: serde_json::Map<String, Value> = labels
        .iter()
        .map(|(k, v)| ((*k).to_owned(), Value::from(*v)))
        .collect();
    let mut object = json!({
        "apiVersion": kind.api_version(),
        "kind": kind.kind,
        "metadata": { "name": name, "labels": labels },
    });
    if let (Some(object), Value::Object(fields)) = (object.as_object_mut(), fields) {
        object.extend(fields);
    }
    object
}
