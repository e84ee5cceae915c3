//! Names and JSON of what the plugin creates: one Pod per Redis server, and the client Service
//! that follows the primary through the role label.

use policy_host_sdk::children::{child_object, pod_kind, service_kind};
use policy_host_sdk::names::ChildName;
use serde_json::{Value, json};

/// Redis' port, named `redis` on every server's container: the exchange capability asks for it.
pub const REDIS_PORT: u16 = 6379;

/// The container port name the plugin exchanges with.
pub const REDIS_PORT_NAME: &str = "redis";

/// Label naming the resource a Pod belongs to.
pub const INSTANCE_LABEL: &str = "app.kubernetes.io/instance";

/// Label the plugin sets on every server: `primary` or `replica`. The client Service selects
/// `primary`, so it follows a failover as soon as the label moves.
pub const ROLE_LABEL: &str = "redis.policy-host.io/role";

/// Every name and label value derived from the parent's name, with the largest ordinal
/// (`spec.replicas` is at most 9): a parent whose name makes one invalid is refused before
/// anything is applied.
pub const CHILD_NAMES: &[ChildName] = &[
    ChildName::service("{name}"),
    // The Pod name is also its hostname: a DNS label.
    ChildName::dns_label("Pod", "{name}-8"),
    ChildName::label_value(INSTANCE_LABEL, "{name}"),
];

/// The Pod name of server `ordinal`.
pub fn pod_name(parent: &str, ordinal: u32) -> String {
    format!("{parent}-{ordinal}")
}

/// The ordinal of a server Pod of `parent`, if `pod` is one.
pub fn ordinal(parent: &str, pod: &str) -> Option<u32> {
    pod.strip_prefix(parent)?.strip_prefix('-')?.parse().ok()
}

/// A server Pod. The role label is the only field that changes over a Pod's life; the rest is
/// fixed at creation (`image` is the one the Pod was created with).
///
/// Without persistence, a primary that restarts in place comes back empty and its replicas
/// would copy that emptiness (Redis' replication docs warn against automatic restarts of such a
/// primary), so servers never restart: `restartPolicy: Never`, and a dead server is replaced by
/// a fresh replica after a failover.
pub fn server_pod(parent: &str, name: &str, image: &str, primary: bool) -> Value {
    let role = if primary { "primary" } else { "replica" };
    child_object(
        &pod_kind(),
        name,
        &[(INSTANCE_LABEL, parent), (ROLE_LABEL, role)],
        json!({
            "spec": {
                "hostname": name,
                "restartPolicy": "Never",
                "containers": [{
                    "name": "redis",
                    "image": image,
                    "command": ["redis-server"],
                    "args": [
                        "--port", REDIS_PORT.to_string(),
                        "--bind", "0.0.0.0",
                        "--protected-mode", "no",
                        "--dir", "/data",
                        "--save", "",
                        "--appendonly", "no"
                    ],
                    "ports": [{ "name": REDIS_PORT_NAME, "containerPort": REDIS_PORT }],
                    "readinessProbe": {
                        "tcpSocket": { "port": REDIS_PORT_NAME },
                        "periodSeconds": 1
                    },
                    "volumeMounts": [{ "name": "data", "mountPath": "/data" }]
                }],
                "volumes": [{ "name": "data", "emptyDir": {} }]
            }
        }),
    )
}

/// The client Service `<parent>`: port 6379 of whichever server carries the primary label.
pub fn client_service(parent: &str) -> Value {
    child_object(
        &service_kind(),
        parent,
        &[(INSTANCE_LABEL, parent)],
        json!({
            "spec": {
                "selector": { INSTANCE_LABEL: parent, ROLE_LABEL: "primary" },
                "ports": [{ "name": REDIS_PORT_NAME, "port": REDIS_PORT, "targetPort": REDIS_PORT_NAME }]
            }
        }),
    )
}

/// `redis:<version>`.
pub fn image(version: &str) -> String {
    format!("redis:{version}")
}
