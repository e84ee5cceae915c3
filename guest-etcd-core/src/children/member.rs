//! The member pod: its etcd flags, its TLS, a restore into its data directory, and the same
//! pod re-applied with a new image for an upgrade.

use policy_host_sdk::pods::ObservedPod;
use serde_json::{Value, json};

use super::object_store;
use super::{
    CLIENT_PORT, ClusterRef, DATA_MOUNT, ETCD_CONTAINER, LABEL_CLASSIC_APP, LABEL_CLASSIC_CLUSTER,
    LABEL_CLASSIC_NODE, LABEL_INSTANCE, LABEL_MANAGED_BY, LABEL_MEMBER, LABEL_NAME, METRICS_PORT,
    PEER_PORT, RESTORE_CONTAINER, RESTORE_MOUNT, TLS_MOUNT,
};
use crate::spec::{DEFAULT_MC_IMAGE, RestoreSpec, TlsSpec, ValidSpec};

/// Whether a member pod starts a new cluster or joins an existing one
/// (`--initial-cluster-state`).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum ClusterState {
    /// The seed member of a new cluster.
    New,
    /// A member added to a running cluster with `member add`.
    Existing,
}

/// A member pod to create.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct MemberPod {
    /// Pod name, also the etcd member name.
    pub name: String,
    /// `--initial-cluster`: `(member name, peer URL)` of every member, this one included.
    pub initial_cluster: Vec<(String, String)>,
    /// `--initial-cluster-state`.
    pub state: ClusterState,
}

/// Learners a cluster may hold at once, when every member runs with [`MAX_LEARNERS_FLAG`].
///
/// etcd refuses a `member add` (even of a learner) until the member it is sent to has been
/// connected to every *voting* member for 5 s (`HealthInterval`, etcdserver's
/// `isConnectedFullySince`), so adding the next member only after promoting the previous one
/// costs 5 s or more per member. Adding the next learner while the previous one catches up
/// (the voters are unchanged, so the check passes at once) removes that wait; promotions then
/// follow one at a time. Two bounds the catch-up load on the leader.
pub const MAX_LEARNERS: usize = 2;

/// The flag every member gets on etcd 3.6+. The limit is checked when each member applies a
/// membership change, so all members must agree: a second learner is added only when every
/// member pod carries it ([`runs_parallel_learners`]).
pub const MAX_LEARNERS_FLAG: &str = "--max-learners=2";

/// Whether this member pod's etcd runs with [`MAX_LEARNERS_FLAG`].
pub fn runs_parallel_learners(pod: &ObservedPod) -> bool {
    pod.args(ETCD_CONTAINER)
        .iter()
        .any(|arg| arg == MAX_LEARNERS_FLAG)
}

/// The member pod, as JSON for server-side apply.
pub fn member_pod(cluster: &ClusterRef, spec: &ValidSpec, member: &MemberPod) -> Value {
    let pod = &member.name;
    let initial_cluster = member
        .initial_cluster
        .iter()
        .map(|(name, url)| format!("{name}={url}"))
        .collect::<Vec<_>>()
        .join(",");
    let state = match member.state {
        ClusterState::New => "new",
        ClusterState::Existing => "existing",
    };
    // Each pod listens on its own IP only, never 0.0.0.0: the pod IP comes from the
    // downward API and kubelet expands `$(POD_IP)` in args.
    let args = vec![
        format!("--name={pod}"),
        format!("--data-dir={DATA_MOUNT}/data"),
        format!(
            "--listen-peer-urls={}://$(POD_IP):{PEER_PORT}",
            cluster.scheme()
        ),
        format!(
            "--listen-client-urls={}://$(POD_IP):{CLIENT_PORT}",
            cluster.scheme()
        ),
        format!("--advertise-client-urls={}", cluster.client_url(pod)),
        format!("--initial-advertise-peer-urls={}", cluster.peer_url(pod)),
        format!("--initial-cluster={initial_cluster}"),
        format!("--initial-cluster-state={state}"),
        format!("--initial-cluster-token={}", cluster.name),
    ];
    let mut args = args;
    if spec.version.supports_max_learners() {
        args.push(MAX_LEARNERS_FLAG.to_owned());
    }
    args.extend(spec.maintenance.flags.iter().cloned());
    let mut container = json!({
        "name": ETCD_CONTAINER,
        "image": spec.image,
        "command": ["/usr/local/bin/etcd"],
        "args": args,
        "env": [{"name": "POD_IP", "valueFrom": {"fieldRef": {"fieldPath": "status.podIP"}}}],
        "ports": [
            {"name": "client", "containerPort": CLIENT_PORT, "protocol": "TCP"},
            {"name": "peer", "containerPort": PEER_PORT, "protocol": "TCP"},
        ],
        "readinessProbe": {
            // A member under the NOSPACE alarm still serves reads and must stay reachable for
            // the recovery: /health alone answers 503 for any alarm.
            "httpGet": {"path": "/health?exclude=NOSPACE", "port": "client"},
            // Every second: a new member is Ready (and counted) within a second of answering,
            // rather than up to a period later; /health answers in milliseconds.
            "periodSeconds": 1,
            "timeoutSeconds": 1,
            "failureThreshold": 5,
        },
        "volumeMounts": [{"name": "data", "mountPath": DATA_MOUNT}],
    });
    let mut volumes = vec![match spec.storage {
        Some(_) => {
            json!({"name": "data", "persistentVolumeClaim": {"claimName": cluster.claim_name(pod)}})
        }
        None => json!({"name": "data", "emptyDir": {}}),
    }];
    if let Some(tls) = &spec.tls {
        with_member_tls(&mut container, &mut volumes, tls);
    }
    if let Some(resources) = &spec.resources
        && let Ok(resources) = serde_json::to_value(resources)
    {
        container["resources"] = resources;
    }
    if let Some(env) = container["env"].as_array_mut() {
        env.extend(spec.classic.env.iter().cloned());
    }
    let mut pod_spec = json!({
        "hostname": pod,
        "subdomain": cluster.name,
        "restartPolicy": "Always",
        "containers": [container],
        "volumes": volumes,
    });
    if !spec.node_selector.is_empty() {
        pod_spec["nodeSelector"] = json!(spec.node_selector);
    }
    if let Some(affinity) = &spec.affinity {
        pod_spec["affinity"] = affinity.clone();
    }
    if !spec.tolerations.is_empty() {
        pod_spec["tolerations"] = json!(spec.tolerations);
    }
    if spec.classic.anti_affinity {
        // What the classic operator's `antiAffinity: true` meant: no two members on one node.
        pod_spec["affinity"] = json!({"podAntiAffinity": {"requiredDuringSchedulingIgnoredDuringExecution": [{
            "labelSelector": {"matchLabels": {LABEL_INSTANCE: cluster.name}},
            "topologyKey": "kubernetes.io/hostname",
        }]}});
    }
    if let Some(security_context) = &spec.classic.security_context {
        pod_spec["securityContext"] = security_context.clone();
    }
    let mut labels = cluster.member_labels(pod);
    for (key, value) in &spec.classic.labels {
        labels[key] = json!(value);
    }
    let mut metadata = json!({"name": pod, "labels": labels});
    if !spec.classic.annotations.is_empty() {
        metadata["annotations"] = json!(spec.classic.annotations);
    }
    json!({
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": metadata,
        "spec": pod_spec,
    })
}

/// Makes a member container speak TLS with the Secrets of `tls`: certificates for the client
/// and peer ports, client certificates required on both.
fn with_member_tls(container: &mut Value, volumes: &mut Vec<Value>, tls: &TlsSpec) {
    serve_client_tls(container, volumes, tls);
    let peer = format!("{TLS_MOUNT}/peer");
    let flags = [
        format!("--peer-cert-file={peer}/tls.crt"),
        format!("--peer-key-file={peer}/tls.key"),
        format!("--peer-trusted-ca-file={peer}/ca.crt"),
        "--peer-client-cert-auth=true".to_owned(),
    ];
    if let Some(args) = container["args"].as_array_mut() {
        args.extend(flags.into_iter().map(Value::String));
    }
    if let Some(mounts) = container["volumeMounts"].as_array_mut() {
        mounts.push(json!({"name": "peer-tls", "mountPath": peer, "readOnly": true}));
    }
    volumes.push(json!({"name": "peer-tls", "secret": {"secretName": tls.peer_secret}}));
}

/// Makes an etcd container serve its client port with the server certificate of `tls` and
/// require client certificates there; its readiness probe moves to a plain-HTTP metrics port,
/// since kubelet presents no client certificate.
pub(super) fn serve_client_tls(container: &mut Value, volumes: &mut Vec<Value>, tls: &TlsSpec) {
    let server = format!("{TLS_MOUNT}/server");
    let flags = [
        format!("--cert-file={server}/tls.crt"),
        format!("--key-file={server}/tls.key"),
        format!("--trusted-ca-file={server}/ca.crt"),
        "--client-cert-auth=true".to_owned(),
        format!("--listen-metrics-urls=http://$(POD_IP):{METRICS_PORT}"),
    ];
    if let Some(args) = container["args"].as_array_mut() {
        args.extend(flags.into_iter().map(Value::String));
    }
    if let Some(ports) = container["ports"].as_array_mut() {
        ports.push(json!({"name": "metrics", "containerPort": METRICS_PORT, "protocol": "TCP"}));
    }
    container["readinessProbe"]["httpGet"]["port"] = json!("metrics");
    if let Some(mounts) = container["volumeMounts"].as_array_mut() {
        mounts.push(json!({"name": "server-tls", "mountPath": server, "readOnly": true}));
    }
    volumes.push(json!({"name": "server-tls", "secret": {"secretName": tls.server_secret}}));
}

/// Gives every `etcdctl` container of a pod the operator's client certificate of `tls`
/// (mounted from its Secret; etcdctl reads `ETCDCTL_CACERT`, `ETCDCTL_CERT`, `ETCDCTL_KEY`).
pub(super) fn with_operator_tls(mut pod: Value, tls: &TlsSpec) -> Value {
    let dir = format!("{TLS_MOUNT}/operator");
    let spec = &mut pod["spec"];
    for list in ["initContainers", "containers"] {
        for container in spec[list].as_array_mut().into_iter().flatten() {
            let runs_etcdctl = container["command"][0]
                .as_str()
                .is_some_and(|c| c.ends_with("etcdctl"));
            if !runs_etcdctl {
                continue;
            }
            let env = [
                ("ETCDCTL_CACERT", "ca.crt"),
                ("ETCDCTL_CERT", "tls.crt"),
                ("ETCDCTL_KEY", "tls.key"),
            ]
            .map(|(name, file)| json!({"name": name, "value": format!("{dir}/{file}")}));
            match container["env"].as_array_mut() {
                Some(list) => list.extend(env),
                None => container["env"] = json!(env),
            }
            let mount = json!({"name": "operator-tls", "mountPath": dir, "readOnly": true});
            match container["volumeMounts"].as_array_mut() {
                Some(list) => list.push(mount),
                None => container["volumeMounts"] = json!([mount]),
            }
        }
    }
    let volume = json!({"name": "operator-tls", "secret": {"secretName": tls.operator_secret}});
    match spec["volumes"].as_array_mut() {
        Some(list) => list.push(volume),
        None => spec["volumes"] = json!([volume]),
    }
    pod
}

/// An observed member pod re-applied with another image, for a rolling upgrade: kubelet
/// restarts the container in place and the member keeps its data directory (the volume
/// outlives the container). Everything else is copied from the observed pod, because a
/// pod's other fields are immutable and its `--initial-cluster` was what it was at
/// creation. `None` if the pod has no `etcd` container.
///
/// The labels and annotations of `spec_labels` and `spec_annotations` (`pod.labels`,
/// `pod.annotations`) are kept as the pod has them: this plugin applied them at creation, and an
/// apply without them would remove them.
pub fn with_image(
    observed: &Value,
    image: &str,
    spec_labels: &std::collections::BTreeMap<String, String>,
    spec_annotations: &std::collections::BTreeMap<String, String>,
) -> Option<Value> {
    let name = observed["metadata"]["name"].as_str()?;
    let spec = observed.get("spec")?;
    let container = spec["containers"]
        .as_array()?
        .iter()
        .find(|c| c["name"] == ETCD_CONTAINER)?;
    let mut etcd = json!({"name": ETCD_CONTAINER, "image": image});
    for key in [
        "command",
        "args",
        "env",
        "ports",
        "readinessProbe",
        "resources",
    ] {
        if let Some(value) = container.get(key) {
            etcd[key] = value.clone();
        }
    }
    // Only our own volumes: admission adds the service account token volume and mount.
    let data = |list: &Value| -> Value {
        Value::Array(
            list.as_array()
                .map(|items| {
                    items
                        .iter()
                        .filter(|v| v["name"] == "data" || v["name"] == "restore")
                        .cloned()
                        .collect()
                })
                .unwrap_or_default(),
        )
    };
    etcd["volumeMounts"] = data(&container["volumeMounts"]);
    let mut pod_spec = json!({"containers": [etcd], "volumes": data(&spec["volumes"])});
    // Init containers cannot change on a running pod: re-applied as they are.
    if let Some(init) = spec["initContainers"].as_array() {
        let init: Vec<Value> = init
            .iter()
            .map(|c| {
                let mut kept = json!({"name": c["name"], "image": c["image"]});
                for key in ["command", "args", "env", "terminationMessagePolicy"] {
                    if let Some(value) = c.get(key) {
                        kept[key] = value.clone();
                    }
                }
                kept["volumeMounts"] = data(&c["volumeMounts"]);
                kept
            })
            .collect();
        pod_spec["initContainers"] = Value::Array(init);
    }
    // Scheduling fields cannot change on a running pod either (tolerations only grow):
    // re-applied as observed, which includes what admission added.
    for key in [
        "hostname",
        "subdomain",
        "restartPolicy",
        "nodeSelector",
        "affinity",
        "tolerations",
        "securityContext",
    ] {
        if let Some(value) = spec.get(key) {
            pod_spec[key] = value.clone();
        }
    }
    let mut labels = json!({});
    for key in [LABEL_NAME, LABEL_INSTANCE, LABEL_MANAGED_BY, LABEL_MEMBER]
        .into_iter()
        .chain(spec_labels.keys().map(String::as_str))
    {
        if let Some(value) = observed["metadata"]["labels"].get(key) {
            labels[key] = value.clone();
        }
    }
    // The classic labels, also on a pod created before this plugin set them: labels may
    // change on a running pod, and the upgrade is this plugin's one write to it.
    if let Some(cluster) = observed["metadata"]["labels"].get(LABEL_INSTANCE) {
        labels[LABEL_CLASSIC_APP] = json!("etcd");
        labels[LABEL_CLASSIC_CLUSTER] = cluster.clone();
        labels[LABEL_CLASSIC_NODE] = json!(name);
    }
    let mut metadata = json!({"name": name, "labels": labels});
    let annotations: serde_json::Map<String, Value> = spec_annotations
        .keys()
        .filter_map(|key| {
            let value = observed["metadata"]["annotations"].get(key)?;
            Some((key.clone(), value.clone()))
        })
        .collect();
    if !annotations.is_empty() {
        metadata["annotations"] = Value::Object(annotations);
    }
    Some(json!({
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": metadata,
        "spec": pod_spec,
    }))
}

/// A seed member pod that starts from a snapshot: an init container restores it into the
/// data directory (`etcdutl snapshot restore`, which makes a new cluster of one member with
/// the snapshot's keys and new IDs), then etcd starts on it. etcd ignores the initial-cluster flags when
/// its data directory exists, so the member's own flags stay as they are.
pub fn with_restore(
    mut pod: Value,
    cluster: &ClusterRef,
    spec: &ValidSpec,
    restore: &RestoreSpec,
) -> Value {
    let name = pod["metadata"]["name"]
        .as_str()
        .unwrap_or_default()
        .to_owned();
    let peer = cluster.peer_url(&name);
    let file = match &restore.s3 {
        Some(s3) => object_store::downloaded_file(s3),
        None => restore.snapshot.clone(),
    };
    let restore_container = json!({
        "name": RESTORE_CONTAINER,
        "image": spec.image,
        "command": [
            "/usr/local/bin/etcdutl", "snapshot", "restore",
            format!("{RESTORE_MOUNT}/{file}"),
            format!("--data-dir={DATA_MOUNT}/data"),
            format!("--name={name}"),
            format!("--initial-cluster={name}={peer}"),
            format!("--initial-advertise-peer-urls={peer}"),
            // etcd derives member and cluster IDs from the peer URLs and this token: a token
            // of its own makes the restored cluster a new one, which no member of the old
            // cluster (same name, same URLs) can ever join or confuse with its own.
            format!("--initial-cluster-token={}-from-{}", cluster.name, file.trim_end_matches(".db")),
        ],
        "volumeMounts": [
            {"name": "data", "mountPath": DATA_MOUNT},
            {"name": "restore", "mountPath": RESTORE_MOUNT, "readOnly": true},
        ],
    });
    let volume = match &restore.s3 {
        // Downloaded first into scratch space, then restored from there like a claim's file.
        Some(s3) => {
            let image = s3
                .image
                .as_deref()
                .map(str::trim)
                .filter(|i| !i.is_empty())
                .unwrap_or(DEFAULT_MC_IMAGE);
            pod["spec"]["initContainers"] = json!([
                object_store::download_container(s3, image),
                restore_container
            ]);
            json!({"name": "restore", "emptyDir": {}})
        }
        None => {
            pod["spec"]["initContainers"] = json!([restore_container]);
            json!({
                "name": "restore",
                "persistentVolumeClaim": {"claimName": restore.claim_name, "readOnly": true},
            })
        }
    };
    if let Some(volumes) = pod["spec"]["volumes"].as_array_mut() {
        volumes.push(volume);
    }
    pod
}

impl RestoreSpec {
    /// Where the snapshot comes from, for Events: `snapshot <file> in claim <claim>` or
    /// `object s3://<bucket>/<key> at <endpoint>`.
    pub fn source(&self) -> String {
        match &self.s3 {
            Some(s3) => format!(
                "object s3://{}/{} at {}",
                s3.bucket,
                s3.key.trim(),
                s3.endpoint.trim()
            ),
            None => format!("snapshot {} in claim {}", self.snapshot, self.claim_name),
        }
    }
}
