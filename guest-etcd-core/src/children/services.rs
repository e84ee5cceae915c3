//! The Services and the PodDisruptionBudget of a cluster: the headless Service that gives
//! members their DNS names, the client Service, and the budget that keeps a quorum.

use serde_json::{Value, json};

use super::{CLIENT_PORT, ClusterRef, PEER_PORT, quorum};

/// The headless Service `<cluster>` that gives members their DNS names.
pub fn headless_service(cluster: &ClusterRef) -> Value {
    json!({
        "apiVersion": "v1",
        "kind": "Service",
        "metadata": {"name": cluster.name, "labels": cluster.labels()},
        "spec": {
            "clusterIP": "None",
            // Members must resolve each other before they are Ready: a new member is not
            // Ready until it has joined, and it joins through these names.
            "publishNotReadyAddresses": true,
            "selector": cluster.selector(),
            "ports": [
                {"name": "client", "port": CLIENT_PORT, "targetPort": "client", "protocol": "TCP"},
                {"name": "peer", "port": PEER_PORT, "targetPort": "peer", "protocol": "TCP"},
            ],
        },
    })
}

/// The client Service `<cluster>-client` (Ready members only), port 2379.
pub fn client_service(cluster: &ClusterRef) -> Value {
    json!({
        "apiVersion": "v1",
        "kind": "Service",
        "metadata": {"name": cluster.client_service_name(), "labels": cluster.labels()},
        "spec": {
            "selector": cluster.selector(),
            "ports": [
                {"name": "client", "port": CLIENT_PORT, "targetPort": "client", "protocol": "TCP"},
            ],
        },
    })
}

/// The PodDisruptionBudget `<cluster>`: voluntary evictions keep a quorum of `size`.
pub fn pod_disruption_budget(cluster: &ClusterRef, size: usize) -> Value {
    json!({
        "apiVersion": "policy/v1",
        "kind": "PodDisruptionBudget",
        "metadata": {"name": cluster.name, "labels": cluster.labels()},
        "spec": {
            "minAvailable": quorum(size),
            "selector": {"matchLabels": cluster.selector()},
        },
    })
}
