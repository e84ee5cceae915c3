//! Building child objects: the kind references of common built-in kinds, a skeleton object
//! with `apiVersion`, `kind` and `metadata` filled in, and small builders for what every
//! stateful app owns: its member [`Pod`]s, a [`service`] and a [`headless_service`], a
//! [`claim`] per member and a [`disruption_budget`]. Put them in a
//! [`Desired`](crate::desired::Desired) set to get the deletes of what is no longer wanted.
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

/// A Pod child, built up: `Pod::new(name).label(..).container(..).build()`.
///
/// Only what stateful apps usually set; anything else goes in with [`Pod::spec_field`] (the
/// pod's `spec`) or by editing the built JSON.
#[derive(Clone, Debug)]
pub struct Pod {
    name: String,
    labels: Vec<(String, String)>,
    annotations: Vec<(String, String)>,
    spec: serde_json::Map<String, Value>,
    containers: Vec<Value>,
    volumes: Vec<Value>,
}

impl Pod {
    /// A Pod named `name`, with no containers yet.
    pub fn new(name: &str) -> Self {
        Pod {
            name: name.to_owned(),
            labels: Vec::new(),
            annotations: Vec::new(),
            spec: serde_json::Map::new(),
            containers: Vec::new(),
            volumes: Vec::new(),
        }
    }

    /// Adds a label (the host adds its own policy label besides).
    pub fn label(mut self, key: &str, value: &str) -> Self {
        self.labels.push((key.to_owned(), value.to_owned()));
        self
    }

    /// Adds an annotation.
    pub fn annotation(mut self, key: &str, value: &str) -> Self {
        self.annotations.push((key.to_owned(), value.to_owned()));
        self
    }

    /// Adds a container (see [`Container`]).
    pub fn container(mut self, container: Container) -> Self {
        self.containers.push(container.build());
        self
    }

    /// Makes the Pod reachable as `<name>.<service>` through a headless Service: sets its
    /// `hostname` to its name and its `subdomain` to `service` (the name must then be a
    /// DNS-1123 label, see [`crate::names`]).
    pub fn stable_dns(mut self, service: &str) -> Self {
        self.spec
            .insert("hostname".into(), Value::from(self.name.clone()));
        self.spec.insert("subdomain".into(), Value::from(service));
        self
    }

    /// Mounts the PersistentVolumeClaim `claim` as the volume `volume`.
    pub fn claim_volume(mut self, volume: &str, claim: &str) -> Self {
        self.volumes
            .push(json!({ "name": volume, "persistentVolumeClaim": { "claimName": claim } }));
        self
    }

    /// An empty scratch volume `volume` (gone with the Pod).
    pub fn empty_dir_volume(mut self, volume: &str) -> Self {
        self.volumes.push(json!({ "name": volume, "emptyDir": {} }));
        self
    }

    /// Sets `spec.<key>` (e.g. `restartPolicy`, `securityContext`, `terminationGracePeriodSeconds`).
    pub fn spec_field(mut self, key: &str, value: Value) -> Self {
        self.spec.insert(key.to_owned(), value);
        self
    }

    /// The Pod as the host applies it.
    pub fn build(self) -> Value {
        let labels: Vec<(&str, &str)> = self
            .labels
            .iter()
            .map(|(k, v)| (k.as_str(), v.as_str()))
            .collect();
        let mut spec = self.spec;
        spec.insert("containers".into(), Value::from(self.containers));
        if !self.volumes.is_empty() {
            spec.insert("volumes".into(), Value::from(self.volumes));
        }
        let mut pod = child_object(&pod_kind(), &self.name, &labels, json!({ "spec": spec }));
        if !self.annotations.is_empty() {
            pod["metadata"]["annotations"] = self
                .annotations
                .into_iter()
                .map(|(k, v)| (k, Value::from(v)))
                .collect::<serde_json::Map<_, _>>()
                .into();
        }
        pod
    }
}

/// One container of a [`Pod`].
#[derive(Clone, Debug)]
pub struct Container {
    object: serde_json::Map<String, Value>,
}

impl Container {
    /// A container `name` running `image`.
    pub fn new(name: &str, image: &str) -> Self {
        let mut object = serde_json::Map::new();
        object.insert("name".into(), Value::from(name));
        object.insert("image".into(), Value::from(image));
        Container { object }
    }

    /// The command's arguments (`args`).
    pub fn args<S: AsRef<str>>(mut self, args: impl IntoIterator<Item = S>) -> Self {
        let args: Vec<Value> = args.into_iter().map(|a| Value::from(a.as_ref())).collect();
        self.object.insert("args".into(), Value::from(args));
        self
    }

    /// A named TCP port: the name is what a plugin's capability and the admin's grant say
    /// (`Capability::Exchange("mysql")`), so the host resolves it on each Pod.
    pub fn port(mut self, name: &str, number: u16) -> Self {
        self.push(
            "ports",
            json!({ "name": name, "containerPort": number, "protocol": "TCP" }),
        );
        self
    }

    /// An environment variable with a literal value.
    pub fn env(mut self, name: &str, value: &str) -> Self {
        self.push("env", json!({ "name": name, "value": value }));
        self
    }

    /// An environment variable from `key` of the Secret `secret` (the host never reads it).
    pub fn env_from_secret(mut self, name: &str, secret: &str, key: &str) -> Self {
        self.push(
            "env",
            json!({ "name": name, "valueFrom": { "secretKeyRef": { "name": secret, "key": key } } }),
        );
        self
    }

    /// Mounts the Pod's volume `volume` at `path`.
    pub fn mount(mut self, volume: &str, path: &str) -> Self {
        self.push("volumeMounts", json!({ "name": volume, "mountPath": path }));
        self
    }

    /// Ready while a TCP connection to the port named `port` opens.
    pub fn ready_on_tcp(mut self, port: &str) -> Self {
        self.object.insert(
            "readinessProbe".into(),
            json!({ "tcpSocket": { "port": port }, "periodSeconds": 2 }),
        );
        self
    }

    /// Ready while `command` exits 0.
    pub fn ready_on_command<S: AsRef<str>>(mut self, command: impl IntoIterator<Item = S>) -> Self {
        let command: Vec<Value> = command
            .into_iter()
            .map(|c| Value::from(c.as_ref()))
            .collect();
        self.object.insert(
            "readinessProbe".into(),
            json!({ "exec": { "command": command }, "periodSeconds": 2 }),
        );
        self
    }

    /// Sets `<key>` on the container (e.g. `resources`, `securityContext`).
    pub fn field(mut self, key: &str, value: Value) -> Self {
        self.object.insert(key.to_owned(), value);
        self
    }

    fn push(&mut self, list: &str, item: Value) {
        match self.object.get_mut(list).and_then(Value::as_array_mut) {
            Some(items) => items.push(item),
            None => {
                self.object.insert(list.to_owned(), Value::from(vec![item]));
            }
        }
    }

    /// The container's JSON.
    pub fn build(self) -> Value {
        Value::Object(self.object)
    }
}

/// `(name, port)` pairs as a Service's `ports`.
fn service_ports(ports: &[(&str, u16)]) -> Value {
    ports
        .iter()
        .map(|(name, port)| json!({ "name": name, "port": port, "targetPort": name, "protocol": "TCP" }))
        .collect()
}

fn selector(labels: &[(&str, &str)]) -> Value {
    labels
        .iter()
        .map(|(k, v)| ((*k).to_owned(), Value::from(*v)))
        .collect::<serde_json::Map<_, _>>()
        .into()
}

/// A ClusterIP Service `name` over the Pods with the `selector` labels, on the named ports
/// (each targets the container port of the same name).
pub fn service(name: &str, selector_labels: &[(&str, &str)], ports: &[(&str, u16)]) -> Value {
    child_object(
        &service_kind(),
        name,
        &[],
        json!({ "spec": { "selector": selector(selector_labels), "ports": service_ports(ports) } }),
    )
}

/// A headless Service `name`: a DNS name per Pod (`<pod>.<name>`, see [`Pod::stable_dns`])
/// published before the Pods are ready, so members find each other while they start.
pub fn headless_service(
    name: &str,
    selector_labels: &[(&str, &str)],
    ports: &[(&str, u16)],
) -> Value {
    child_object(
        &service_kind(),
        name,
        &[],
        json!({ "spec": {
            "clusterIP": "None",
            "publishNotReadyAddresses": true,
            "selector": selector(selector_labels),
            "ports": service_ports(ports),
        } }),
    )
}

/// A PersistentVolumeClaim `name` of `size` (`"1Gi"`), ReadWriteOnce, of `storage_class` or
/// the cluster's default.
pub fn claim(name: &str, size: &str, storage_class: Option<&str>) -> Value {
    let mut spec = json!({
        "accessModes": ["ReadWriteOnce"],
        "resources": { "requests": { "storage": size } },
    });
    if let Some(class) = storage_class {
        spec["storageClassName"] = Value::from(class);
    }
    child_object(&pvc_kind(), name, &[], json!({ "spec": spec }))
}

/// A PodDisruptionBudget `name`: at least `min_available` of the Pods with the `selector`
/// labels stay up through voluntary evictions (a quorum of three: 2). `minAvailable`, never
/// `maxUnavailable`: a plugin's Pods are owned by its parent, a custom resource, and Kubernetes
/// reads `maxUnavailable` against the owner's scale subresource, which a kind may not have; the
/// budget then never syncs and guards nothing ("does not implement the scale subresource" in
/// kube-controller-manager's log). An integer `minAvailable` needs no owner at all.
pub fn disruption_budget(
    name: &str,
    selector_labels: &[(&str, &str)],
    min_available: u32,
) -> Value {
    child_object(
        &pdb_kind(),
        name,
        &[],
        json!({ "spec": {
            "minAvailable": min_available,
            "selector": { "matchLabels": selector(selector_labels) },
        } }),
    )
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_member_pod_with_its_claim_port_and_stable_name() {
        let pod = Pod::new("db-0")
            .label("app.kubernetes.io/instance", "db")
            .annotation("example.com/config-hash", "abc")
            .stable_dns("db")
            .claim_volume("data", "data-db-0")
            .container(
                Container::new("mariadb", "mariadb:11.4")
                    .args(["--log-bin"])
                    .port("mysql", 3306)
                    .env("MARIADB_AUTO_UPGRADE", "1")
                    .env_from_secret("MARIADB_ROOT_PASSWORD", "db-auth", "password")
                    .mount("data", "/var/lib/mysql")
                    .ready_on_tcp("mysql"),
            )
            .build();
        assert_eq!(pod["apiVersion"], "v1");
        assert_eq!(pod["kind"], "Pod");
        assert_eq!(pod["metadata"]["name"], "db-0");
        assert_eq!(
            pod["metadata"]["labels"]["app.kubernetes.io/instance"],
            "db"
        );
        assert_eq!(
            pod["metadata"]["annotations"]["example.com/config-hash"],
            "abc"
        );
        assert_eq!(pod["spec"]["hostname"], "db-0");
        assert_eq!(pod["spec"]["subdomain"], "db");
        assert_eq!(
            pod["spec"]["volumes"][0]["persistentVolumeClaim"]["claimName"],
            "data-db-0"
        );
        let container = &pod["spec"]["containers"][0];
        assert_eq!(container["image"], "mariadb:11.4");
        assert_eq!(container["args"], json!(["--log-bin"]));
        assert_eq!(
            container["ports"][0],
            json!({ "name": "mysql", "containerPort": 3306, "protocol": "TCP" })
        );
        assert_eq!(
            container["env"][1]["valueFrom"]["secretKeyRef"]["name"],
            "db-auth"
        );
        assert_eq!(container["volumeMounts"][0]["mountPath"], "/var/lib/mysql");
        assert_eq!(container["readinessProbe"]["tcpSocket"]["port"], "mysql");
    }

    #[test]
    fn services_claims_and_budgets() {
        let selector = [("app.kubernetes.io/instance", "db")];
        // (situation, built, field path, expected)
        let rows: [(&str, Value, &str, Value); 8] = [
            (
                "a service selects the pods",
                service("db", &selector, &[("mysql", 3306)]),
                "/spec/selector/app.kubernetes.io~1instance",
                json!("db"),
            ),
            (
                "a service port targets the container port by name",
                service("db", &selector, &[("mysql", 3306)]),
                "/spec/ports/0/targetPort",
                json!("mysql"),
            ),
            (
                "a headless service has no cluster IP",
                headless_service("db-peers", &selector, &[("mysql", 3306)]),
                "/spec/clusterIP",
                json!("None"),
            ),
            (
                "a headless service publishes starting members",
                headless_service("db-peers", &selector, &[]),
                "/spec/publishNotReadyAddresses",
                json!(true),
            ),
            (
                "a claim asks for its size",
                claim("data-db-0", "1Gi", None),
                "/spec/resources/requests/storage",
                json!("1Gi"),
            ),
            (
                "a claim without a class takes the default",
                claim("data-db-0", "1Gi", None),
                "/spec/storageClassName",
                Value::Null,
            ),
            (
                "a budget keeps a number of Pods up",
                disruption_budget("db", &selector, 2),
                "/spec/minAvailable",
                json!(2),
            ),
            (
                "never maxUnavailable, which needs the owner's scale subresource",
                disruption_budget("db", &selector, 2),
                "/spec/maxUnavailable",
                Value::Null,
            ),
        ];
        for (situation, built, path, expected) in rows {
            assert_eq!(
                built.pointer(path).cloned().unwrap_or(Value::Null),
                expected,
                "{situation}"
            );
        }
        assert_eq!(
            claim("d", "1Gi", Some("fast"))["spec"]["storageClassName"],
            "fast"
        );
        assert_eq!(
            disruption_budget("db", &selector, 1)["apiVersion"],
            "policy/v1"
        );
    }
}
