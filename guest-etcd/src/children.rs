//! The children of an `EtcdCluster`: how they are named, built (as JSON for server-side
//! apply) and read back from the observation.
//!
//! - Service `<cluster>` — headless, publishes not-ready addresses so members find each
//!   other by DNS (`<pod>.<cluster>.<ns>.svc`) before they are Ready.
//! - Service `<cluster>-client` — the address clients use, port 2379.
//! - Pod `<cluster>-<n>` per member, whose etcd member name is the pod name.
//! - PersistentVolumeClaim `data-<cluster>-<n>` per member, only with `spec.storage`.
//! - PodDisruptionBudget `<cluster>`, keeping a quorum through voluntary disruptions.
//! - PersistentVolumeClaim `backup-<cluster>` and, while a snapshot is taken and verified
//!   (and uploaded, with `spec.backup.s3`), Pod `<cluster>-backup`, only with `spec.backup`.
//!
//! The host sets namespaces and owner references itself; nothing here sets them.

use policy_host_sdk::pods::ObservedPod;
use policy_host_sdk::{Observation, PolicyError};
use serde_json::{Value, json};

/// The kinds of the children: member and backup pods, the two services, the claims, the
/// budget.
pub use policy_host_sdk::children::{pdb_kind, pod_kind, pvc_kind, service_kind};

use crate::object_store;
use crate::spec::{DEFAULT_MC_IMAGE, RestoreSpec, StorageSpec, TlsSpec, ValidSpec};

/// Label every child carries: `app.kubernetes.io/name: etcd`.
pub const LABEL_NAME: &str = "app.kubernetes.io/name";
/// Label every child carries: `app.kubernetes.io/instance: <cluster>`.
pub const LABEL_INSTANCE: &str = "app.kubernetes.io/instance";
/// Label every child carries: `app.kubernetes.io/managed-by: policy-host`.
pub const LABEL_MANAGED_BY: &str = "app.kubernetes.io/managed-by";
/// Label of member pods and claims: `etcd.database.coreos.com/member: <pod>`.
pub const LABEL_MEMBER: &str = "etcd.database.coreos.com/member";
/// The container that runs etcd in a member pod.
pub const ETCD_CONTAINER: &str = "etcd";
/// etcd's client port.
pub const CLIENT_PORT: u16 = 2379;
/// etcd's peer port.
pub const PEER_PORT: u16 = 2380;
/// Port of a TLS member's plain-HTTP `/health` and `/metrics`, for probes (kubelet presents no
/// client certificate, so it cannot probe a client port that requires one).
pub const METRICS_PORT: u16 = 2381;
/// Where a TLS member's Secrets are mounted: `<TLS_MOUNT>/{peer,server}`, and a backup pod's
/// operator Secret at `<TLS_MOUNT>/operator`.
pub const TLS_MOUNT: &str = "/etc/etcd/tls";
/// Where the data volume is mounted; etcd's data dir is `data` below it.
pub const DATA_MOUNT: &str = "/var/lib/etcd";
/// Where the backup Pod mounts the backup claim.
pub const BACKUP_MOUNT: &str = "/backup";
/// Where a restoring seed member mounts the claim holding its snapshot.
pub const RESTORE_MOUNT: &str = "/restore";
/// Label of the backup Pod (`backup`), which is not a member.
pub const LABEL_ROLE: &str = "etcd.database.coreos.com/role";
/// Annotation of a backup Pod taken on demand: the `spec.backup.trigger` it runs for.
pub const ANNOTATION_TRIGGER: &str = "etcd.database.coreos.com/backup-trigger";
/// Annotation of a scheduled backup Pod: when (RFC 3339) its snapshot was due.
pub const ANNOTATION_SCHEDULED: &str = "etcd.database.coreos.com/backup-scheduled-for";
/// Annotation of a backup Pod: the snapshot file it writes in the backup claim.
pub const ANNOTATION_FILE: &str = "etcd.database.coreos.com/backup-file";
/// Init container of the backup Pod that saves the snapshot (`etcdctl snapshot save`).
pub const SAVE_CONTAINER: &str = "save";
/// Annotation of a backup Pod that uploads its snapshot: the object's
/// `s3://<bucket>/<object>`.
pub const ANNOTATION_LOCATION: &str = "etcd.database.coreos.com/backup-location";
/// Init container of the backup Pod that restores the saved snapshot into a scratch data
/// directory (`etcdutl snapshot restore`).
pub const RESTORE_CONTAINER: &str = "restore";
/// Container of the backup Pod that serves the restored snapshot: a throwaway etcd.
pub const VERIFY_CONTAINER: &str = "verify";
/// Where the backup Pod mounts its scratch volume for the restored snapshot.
pub const VERIFY_MOUNT: &str = "/verify";

/// Where a cluster lives: its name and namespace, from which every child name and DNS
/// name derives.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct ClusterRef {
    /// `metadata.name` of the EtcdCluster.
    pub name: String,
    /// `metadata.namespace` of the EtcdCluster.
    pub namespace: String,
    /// Whether members speak TLS (`spec.tls`): URLs are `https`.
    pub tls: bool,
}

impl ClusterRef {
    /// Name of the client Service.
    pub fn client_service_name(&self) -> String {
        format!("{}-client", self.name)
    }

    /// Name of the pod (and etcd member) with index `n`.
    pub fn member_name(&self, n: usize) -> String {
        format!("{}-{n}", self.name)
    }

    /// Index of a member pod from its name, if it is one of ours.
    pub fn member_index(&self, pod: &str) -> Option<usize> {
        let digits = pod.strip_prefix(&self.name)?.strip_prefix('-')?;
        let canonical = !digits.is_empty()
            && digits.bytes().all(|b| b.is_ascii_digit())
            && (digits == "0" || !digits.starts_with('0'));
        if canonical { digits.parse().ok() } else { None }
    }

    /// Name of the claim that keeps the snapshots: `backup-<cluster>`.
    pub fn backup_claim_name(&self) -> String {
        format!("backup-{}", self.name)
    }

    /// Name of the Pod that takes a snapshot: `<cluster>-backup` (never a member name).
    pub fn backup_pod_name(&self) -> String {
        format!("{}-backup", self.name)
    }

    /// Snapshot file of a slot: `<cluster>-<slot>.db`. Snapshots rotate through
    /// `spec.backup.keep` slots, so the claim never holds more than that many.
    pub fn slot_file(&self, slot: usize) -> String {
        format!("{}-{slot}.db", self.name)
    }

    /// Name of the data claim of a member pod.
    pub fn claim_name(&self, pod: &str) -> String {
        format!("data-{pod}")
    }

    /// The member pod a data claim belongs to, if it is one of ours.
    pub fn claim_member(&self, claim: &str) -> Option<String> {
        let pod = claim.strip_prefix("data-")?;
        self.member_index(pod).map(|_| pod.to_owned())
    }

    /// Stable DNS name of a member pod, through the headless service.
    pub fn member_host(&self, pod: &str) -> String {
        format!("{pod}.{}", self.member_domain())
    }

    /// The domain of the members' DNS names: `<cluster>.<namespace>.svc`.
    pub fn member_domain(&self) -> String {
        format!("{}.{}.svc", self.name, self.namespace)
    }

    /// Peer URL of a member pod.
    pub fn peer_url(&self, pod: &str) -> String {
        format!("{}://{}:{PEER_PORT}", self.scheme(), self.member_host(pod))
    }

    /// Client URL of a member pod.
    pub fn client_url(&self, pod: &str) -> String {
        format!(
            "{}://{}:{CLIENT_PORT}",
            self.scheme(),
            self.member_host(pod)
        )
    }

    fn scheme(&self) -> &'static str {
        if self.tls { "https" } else { "http" }
    }

    /// The pod a peer URL points at, if it is one of this cluster's member hosts.
    pub fn pod_of_peer_url(&self, url: &str) -> Option<String> {
        let rest = url.split_once("://").map_or(url, |(_, rest)| rest);
        let host = rest.split(['/', ':']).next()?;
        let pod = host.split('.').next()?;
        (host == self.member_host(pod) && self.member_index(pod).is_some()).then(|| pod.to_owned())
    }

    fn labels(&self) -> Value {
        json!({
            LABEL_NAME: "etcd",
            LABEL_INSTANCE: self.name,
            LABEL_MANAGED_BY: "policy-host",
        })
    }

    fn selector(&self) -> Value {
        json!({ LABEL_NAME: "etcd", LABEL_INSTANCE: self.name })
    }

    fn member_labels(&self, pod: &str) -> Value {
        let mut labels = self.labels();
        labels[LABEL_MEMBER] = json!(pod);
        labels
    }
}

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

/// Votes needed for a quorum among `voters` members.
pub fn quorum(voters: usize) -> usize {
    voters / 2 + 1
}

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
            "httpGet": {"path": "/health", "port": "client"},
            "periodSeconds": 5,
            "timeoutSeconds": 3,
            "failureThreshold": 3,
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
    json!({
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {"name": pod, "labels": cluster.member_labels(pod)},
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
fn serve_client_tls(container: &mut Value, volumes: &mut Vec<Value>, tls: &TlsSpec) {
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
fn with_operator_tls(mut pod: Value, tls: &TlsSpec) -> Value {
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
pub fn with_image(observed: &Value, image: &str) -> Option<Value> {
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
    ] {
        if let Some(value) = spec.get(key) {
            pod_spec[key] = value.clone();
        }
    }
    let mut labels = json!({});
    for key in [LABEL_NAME, LABEL_INSTANCE, LABEL_MANAGED_BY, LABEL_MEMBER] {
        if let Some(value) = observed["metadata"]["labels"].get(key) {
            labels[key] = value.clone();
        }
    }
    Some(json!({
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {"name": name, "labels": labels},
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
        Some(s3) => object_store::with_upload(pod, s3, file),
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

/// The data claim of a member pod (only with `spec.storage`).
pub fn member_claim(cluster: &ClusterRef, spec: &ValidSpec, pod: &str) -> Option<Value> {
    let storage = spec.storage.as_ref()?;
    Some(claim(
        &cluster.claim_name(pod),
        cluster.member_labels(pod),
        storage,
    ))
}

/// The children of one EtcdCluster, as observed.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct ObservedChildren {
    /// Member pods, sorted by name.
    pub pods: Vec<ObservedPod>,
    /// Backup pods (label `etcd.database.coreos.com/role: backup`).
    pub backup_pods: Vec<ObservedPod>,
    /// Names of data claims, sorted.
    pub claims: Vec<String>,
}

impl ObservedChildren {
    /// Reads the pods and the names of the claims; other kinds are ignored. A child that is
    /// not an object of its kind is an error naming it (the host sends objects it got from
    /// the API server, so this means a host bug).
    pub fn read(observation: &Observation) -> Result<Self, PolicyError> {
        let (backup_pods, pods) = observation
            .pods()?
            .into_iter()
            .partition(|p| p.label(LABEL_ROLE) == Some("backup"));
        let mut claims = observation
            .children_of_kind(&pvc_kind())
            .map(|c| {
                Ok(c.parse::<Value>()?["metadata"]["name"]
                    .as_str()
                    .unwrap_or_default()
                    .to_owned())
            })
            .collect::<Result<Vec<String>, PolicyError>>()?;
        claims.sort();
        Ok(ObservedChildren {
            pods,
            backup_pods,
            claims,
        })
    }

    /// The observed pod with this name.
    pub fn pod(&self, name: &str) -> Option<&ObservedPod> {
        self.pods.iter().find(|p| p.name == name)
    }

    /// Whether a data claim with this name exists.
    pub fn has_claim(&self, name: &str) -> bool {
        self.claims.iter().any(|c| c == name)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::spec::{EtcdClusterSpec, Quantity};

    fn cluster() -> ClusterRef {
        ClusterRef {
            name: "ex".into(),
            namespace: "ns".into(),
            tls: false,
        }
    }

    fn spec(storage: bool) -> ValidSpec {
        EtcdClusterSpec {
            size: 3,
            version: "3.6.16".into(),
            storage: storage.then(|| StorageSpec {
                size: Quantity("1Gi".into()),
                storage_class_name: None,
            }),
            ..Default::default()
        }
        .validate()
        .expect("valid")
    }

    #[test]
    fn names_round_trip() {
        let c = cluster();
        let cases = [
            ("ex-0", Some(0)),
            ("ex-12", Some(12)),
            ("ex-01", None),
            ("ex-", None),
            ("ex-client", None),
            ("other-1", None),
            ("ex-1-2", None),
        ];
        for (pod, want) in cases {
            assert_eq!(c.member_index(pod), want, "{pod}");
        }
        assert_eq!(
            c.pod_of_peer_url("http://ex-3.ex.ns.svc:2380").as_deref(),
            Some("ex-3")
        );
        assert_eq!(c.pod_of_peer_url("http://ex-3.ex.other.svc:2380"), None);
        assert_eq!(c.pod_of_peer_url("http://10.0.0.1:2380"), None);
        assert_eq!(c.claim_member("data-ex-2").as_deref(), Some("ex-2"));
    }

    #[test]
    fn member_pod_has_the_etcd_flags() {
        let c = cluster();
        let pod = member_pod(
            &c,
            &spec(false),
            &MemberPod {
                name: "ex-1".into(),
                initial_cluster: vec![
                    ("ex-0".into(), c.peer_url("ex-0")),
                    ("ex-1".into(), c.peer_url("ex-1")),
                ],
                state: ClusterState::Existing,
            },
        );
        let args: Vec<String> =
            serde_json::from_value(pod["spec"]["containers"][0]["args"].clone()).expect("args");
        for want in [
            "--name=ex-1",
            "--listen-client-urls=http://$(POD_IP):2379",
            "--advertise-client-urls=http://ex-1.ex.ns.svc:2379",
            "--initial-cluster=ex-0=http://ex-0.ex.ns.svc:2380,ex-1=http://ex-1.ex.ns.svc:2380",
            "--initial-cluster-state=existing",
            "--initial-cluster-token=ex",
        ] {
            assert!(args.iter().any(|a| a == want), "{want} in {args:?}");
        }
        assert!(!args.iter().any(|a| a.contains("0.0.0.0")));
        assert_eq!(pod["spec"]["subdomain"], "ex");
        assert_eq!(pod["metadata"]["labels"][LABEL_MEMBER], "ex-1");
        assert_eq!(pod["spec"]["volumes"][0]["emptyDir"], json!({}));
        assert!(pod["metadata"].get("namespace").is_none());
        assert!(pod["metadata"].get("ownerReferences").is_none());
    }

    #[test]
    fn storage_mounts_a_claim_per_member() {
        let c = cluster();
        let s = spec(true);
        let pod = member_pod(
            &c,
            &s,
            &MemberPod {
                name: "ex-0".into(),
                initial_cluster: vec![("ex-0".into(), c.peer_url("ex-0"))],
                state: ClusterState::New,
            },
        );
        assert_eq!(
            pod["spec"]["volumes"][0]["persistentVolumeClaim"]["claimName"],
            "data-ex-0"
        );
        let claim = member_claim(&c, &s, "ex-0").expect("claim");
        assert_eq!(claim["spec"]["resources"]["requests"]["storage"], "1Gi");
    }

    #[test]
    fn with_image_keeps_everything_but_the_image() {
        let c = cluster();
        let mut pod = member_pod(
            &c,
            &spec(false),
            &MemberPod {
                name: "ex-0".into(),
                initial_cluster: vec![("ex-0".into(), c.peer_url("ex-0"))],
                state: ClusterState::New,
            },
        );
        // What admission adds must not be re-applied.
        pod["spec"]["volumes"]
            .as_array_mut()
            .expect("volumes")
            .push(json!({"name": "kube-api-access-x", "projected": {}}));
        let upgraded = with_image(&pod, "repo:v3.6.17").expect("etcd container");
        assert_eq!(upgraded["spec"]["containers"][0]["image"], "repo:v3.6.17");
        assert_eq!(
            upgraded["spec"]["containers"][0]["args"],
            pod["spec"]["containers"][0]["args"]
        );
        assert_eq!(
            upgraded["spec"]["volumes"].as_array().map(Vec::len),
            Some(1)
        );
        assert_eq!(upgraded["metadata"]["labels"], pod["metadata"]["labels"]);
    }

    #[test]
    fn a_restoring_seed_keeps_its_init_container_through_an_upgrade() {
        let c = cluster();
        let s = spec(false);
        let pod = member_pod(
            &c,
            &s,
            &MemberPod {
                name: "ex-0".into(),
                initial_cluster: vec![("ex-0".into(), c.peer_url("ex-0"))],
                state: ClusterState::New,
            },
        );
        let restore = RestoreSpec {
            claim_name: "backup-old".into(),
            snapshot: "old-1.db".into(),
            s3: None,
        };
        let restoring = with_restore(pod, &c, &s, &restore);
        assert_eq!(
            restoring["spec"]["initContainers"][0]["command"][0],
            "/usr/local/bin/etcdutl"
        );
        // Init containers of a running pod are immutable: an upgrade re-applies them as
        // they are, with the snapshot's volume.
        let upgraded = with_image(&restoring, "repo:v3.6.17").expect("etcd container");
        assert_eq!(
            upgraded["spec"]["initContainers"],
            restoring["spec"]["initContainers"]
        );
        assert_eq!(upgraded["spec"]["volumes"], restoring["spec"]["volumes"]);
    }

    #[test]
    fn a_seed_restoring_from_s3_downloads_the_object_then_restores_it() {
        let c = cluster();
        let s = spec(false);
        let pod = member_pod(
            &c,
            &s,
            &MemberPod {
                name: "ex-0".into(),
                initial_cluster: vec![("ex-0".into(), c.peer_url("ex-0"))],
                state: ClusterState::New,
            },
        );
        let restore = RestoreSpec {
            s3: Some(crate::spec::S3RestoreSpec {
                endpoint: "https://s3.example.com".into(),
                bucket: "etcd".into(),
                key: "prod/old-1.db".into(),
                credentials_secret: "s3-credentials".into(),
                image: None,
            }),
            ..Default::default()
        };
        let restoring = with_restore(pod, &c, &s, &restore);
        let init = &restoring["spec"]["initContainers"];
        assert_eq!(init[0]["name"], "download");
        assert_eq!(init[0]["image"], DEFAULT_MC_IMAGE);
        assert_eq!(
            init[0]["command"],
            json!([
                "mc",
                "--config-dir",
                "/restore/.mc",
                "cp",
                "s3/etcd/prod/old-1.db",
                "/restore/old-1.db"
            ])
        );
        assert_eq!(
            init[0]["env"][2]["value"],
            "https://$(S3_ACCESS_KEY_ID):$(S3_SECRET_ACCESS_KEY)@s3.example.com"
        );
        assert_eq!(
            init[0]["env"][0]["valueFrom"]["secretKeyRef"],
            json!({"name": "s3-credentials", "key": "accessKeyID"})
        );
        assert_eq!(init[1]["name"], "restore");
        assert_eq!(init[1]["command"][3], "/restore/old-1.db");
        assert!(
            init[1]["command"]
                .as_array()
                .is_some_and(|c| c.contains(&json!("--initial-cluster-token=ex-from-old-1"))),
            "{init}"
        );
        let volumes = restoring["spec"]["volumes"]
            .as_array()
            .cloned()
            .unwrap_or_default();
        assert!(
            volumes.contains(&json!({"name": "restore", "emptyDir": {}})),
            "{volumes:?}"
        );
        // An upgrade re-applies the init containers as they are, credentials included.
        let upgraded = with_image(&restoring, "repo:v3.6.17").expect("etcd container");
        assert_eq!(
            upgraded["spec"]["initContainers"],
            restoring["spec"]["initContainers"]
        );
        assert_eq!(upgraded["spec"]["volumes"], restoring["spec"]["volumes"]);
        assert_eq!(
            restore.source(),
            "object s3://etcd/prod/old-1.db at https://s3.example.com"
        );
    }

    #[test]
    fn scheduling_settings_reach_the_pod_and_survive_an_upgrade() {
        let c = cluster();
        let s = EtcdClusterSpec {
            size: 3,
            version: "3.6.16".into(),
            pod: Some(crate::spec::PodPolicy {
                node_selector: [("disk".to_owned(), "ssd".to_owned())].into(),
                affinity: Some(json!({"podAntiAffinity": {"preferredDuringSchedulingIgnoredDuringExecution": []}})),
                tolerations: vec![json!({"key": "dedicated", "operator": "Equal", "value": "etcd", "effect": "NoSchedule"})],
                ..Default::default()
            }),
            ..Default::default()
        }
        .validate()
        .expect("valid");
        let pod = member_pod(
            &c,
            &s,
            &MemberPod {
                name: "ex-0".into(),
                initial_cluster: vec![("ex-0".into(), c.peer_url("ex-0"))],
                state: ClusterState::New,
            },
        );
        assert_eq!(pod["spec"]["nodeSelector"], json!({"disk": "ssd"}));
        assert_eq!(pod["spec"]["tolerations"][0]["key"], "dedicated");
        assert!(pod["spec"]["affinity"]["podAntiAffinity"].is_object());
        let upgraded = with_image(&pod, "repo:v3.6.17").expect("etcd container");
        for key in ["nodeSelector", "affinity", "tolerations"] {
            assert_eq!(upgraded["spec"][key], pod["spec"][key], "{key}");
        }
    }

    #[test]
    fn services() {
        let c = cluster();
        let headless = headless_service(&c);
        assert_eq!(headless["spec"]["clusterIP"], "None");
        assert_eq!(headless["spec"]["publishNotReadyAddresses"], true);
        assert_eq!(client_service(&c)["metadata"]["name"], "ex-client");
        assert_eq!(pod_disruption_budget(&c, 3)["spec"]["minAvailable"], 2);
    }

    fn tls() -> TlsSpec {
        TlsSpec {
            peer_secret: "ex-peer".into(),
            server_secret: "ex-server".into(),
            operator_secret: "ex-operator".into(),
        }
    }

    #[test]
    fn a_tls_member_serves_https_on_both_ports_and_is_probed_on_plain_metrics() {
        let c = ClusterRef {
            tls: true,
            ..cluster()
        };
        let mut tls_spec = spec(false);
        tls_spec.tls = Some(tls());
        let pod = member_pod(
            &c,
            &tls_spec,
            &MemberPod {
                name: "ex-0".into(),
                initial_cluster: vec![("ex-0".into(), c.peer_url("ex-0"))],
                state: ClusterState::New,
            },
        );
        let container = &pod["spec"]["containers"][0];
        let args: Vec<&str> = container["args"]
            .as_array()
            .into_iter()
            .flatten()
            .filter_map(Value::as_str)
            .collect();
        for wanted in [
            "--listen-client-urls=https://$(POD_IP):2379",
            "--listen-peer-urls=https://$(POD_IP):2380",
            "--advertise-client-urls=https://ex-0.ex.ns.svc:2379",
            "--initial-advertise-peer-urls=https://ex-0.ex.ns.svc:2380",
            "--initial-cluster=ex-0=https://ex-0.ex.ns.svc:2380",
            "--cert-file=/etc/etcd/tls/server/tls.crt",
            "--trusted-ca-file=/etc/etcd/tls/server/ca.crt",
            "--client-cert-auth=true",
            "--peer-cert-file=/etc/etcd/tls/peer/tls.crt",
            "--peer-client-cert-auth=true",
            "--listen-metrics-urls=http://$(POD_IP):2381",
        ] {
            assert!(args.contains(&wanted), "{wanted} in {args:?}");
        }
        assert_eq!(container["readinessProbe"]["httpGet"]["port"], "metrics");
        assert_eq!(
            pod["spec"]["volumes"],
            json!([
                {"name": "data", "emptyDir": {}},
                {"name": "server-tls", "secret": {"secretName": "ex-server"}},
                {"name": "peer-tls", "secret": {"secretName": "ex-peer"}},
            ])
        );
        // Without TLS nothing of it is there.
        let plain = member_pod(
            &cluster(),
            &spec(false),
            &MemberPod {
                name: "ex-0".into(),
                initial_cluster: vec![("ex-0".into(), cluster().peer_url("ex-0"))],
                state: ClusterState::New,
            },
        );
        let plain_args = plain["spec"]["containers"][0]["args"].to_string();
        assert!(
            !plain_args.contains("https") && !plain_args.contains("cert"),
            "{plain_args}"
        );
        assert_eq!(
            plain["spec"]["containers"][0]["readinessProbe"]["httpGet"]["port"],
            "client"
        );
    }

    #[test]
    fn etcdctl_containers_get_the_operator_certificate_and_others_do_not() {
        let pod = json!({"spec": {
            "initContainers": [{"name": "save", "command": ["/usr/local/bin/etcdctl", "snapshot", "save", "/b/x.db"],
                "env": [{"name": "ETCDCTL_ENDPOINTS", "value": "https://ex-0.ex.ns.svc:2379"}]}],
            "containers": [{"name": "serve", "command": ["/usr/local/bin/etcd"]}],
            "volumes": [{"name": "backup", "emptyDir": {}}],
        }});
        let pod = with_operator_tls(pod, &tls());
        let save = &pod["spec"]["initContainers"][0];
        assert_eq!(
            save["env"],
            json!([
                {"name": "ETCDCTL_ENDPOINTS", "value": "https://ex-0.ex.ns.svc:2379"},
                {"name": "ETCDCTL_CACERT", "value": "/etc/etcd/tls/operator/ca.crt"},
                {"name": "ETCDCTL_CERT", "value": "/etc/etcd/tls/operator/tls.crt"},
                {"name": "ETCDCTL_KEY", "value": "/etc/etcd/tls/operator/tls.key"},
            ])
        );
        assert_eq!(
            save["volumeMounts"],
            json!([{"name": "operator-tls", "mountPath": "/etc/etcd/tls/operator", "readOnly": true}])
        );
        assert!(pod["spec"]["containers"][0].get("env").is_none());
        assert_eq!(
            pod["spec"]["volumes"][1],
            json!({"name": "operator-tls", "secret": {"secretName": "ex-operator"}})
        );
    }

    #[test]
    fn a_tls_cluster_s_backup_pod_saves_with_the_operator_certificate_and_verifies_over_tls() {
        let c = ClusterRef {
            tls: true,
            ..cluster()
        };
        let mut tls_spec = spec(false);
        tls_spec.tls = Some(tls());
        let pod = backup_pod(
            &c,
            &tls_spec,
            "ex-0",
            "ex-0.db",
            &SnapshotCause::OnDemand("now".into()),
        );
        let save = &pod["spec"]["initContainers"][0];
        assert_eq!(
            save["env"][0],
            json!({"name": "ETCDCTL_ENDPOINTS", "value": "https://ex-0.ex.ns.svc:2379"})
        );
        assert!(
            save["env"]
                .to_string()
                .contains("/etc/etcd/tls/operator/tls.crt"),
            "{save}"
        );
        let serve = &pod["spec"]["containers"][0];
        let args = serve["args"].to_string();
        for wanted in [
            "--listen-client-urls=https://$(POD_IP):2379",
            "--cert-file=/etc/etcd/tls/server/tls.crt",
            "--client-cert-auth=true",
        ] {
            assert!(args.contains(wanted), "{wanted} in {args}");
        }
        assert!(!args.contains("--peer-cert-file"), "{args}");
        assert_eq!(serve["readinessProbe"]["httpGet"]["port"], "metrics");
        let volumes = pod["spec"]["volumes"].to_string();
        assert!(
            volumes.contains("ex-operator") && volumes.contains("ex-server"),
            "{volumes}"
        );
        // A plain cluster's backup pod has none of it.
        let plain = backup_pod(
            &cluster(),
            &spec(false),
            "ex-0",
            "ex-0.db",
            &SnapshotCause::OnDemand("now".into()),
        );
        assert!(!plain.to_string().contains("tls"), "{plain}");
    }

    #[test]
    fn a_tls_cluster_s_upload_gets_the_store_s_credentials_not_the_operator_certificate() {
        let c = ClusterRef {
            tls: true,
            ..cluster()
        };
        let mut s = spec(false);
        s.tls = Some(tls());
        s.backup = crate::spec::BackupSpec {
            storage: StorageSpec {
                size: Quantity("1Gi".into()),
                storage_class_name: None,
            },
            s3: Some(crate::spec::S3BackupSpec {
                endpoint: "https://s3.example.com".into(),
                bucket: "etcd".into(),
                credentials_secret: "s3-credentials".into(),
                ..Default::default()
            }),
            ..Default::default()
        }
        .validate()
        .ok();
        let pod = backup_pod(
            &c,
            &s,
            "ex-0",
            "ex-1.db",
            &SnapshotCause::OnDemand("now".into()),
        );
        let init = pod["spec"]["initContainers"]
            .as_array()
            .cloned()
            .unwrap_or_default();
        let names: Vec<&str> = init.iter().filter_map(|c| c["name"].as_str()).collect();
        assert_eq!(names, ["save", "restore", "upload"]);
        let upload = init[2].to_string();
        assert!(
            !upload.contains("ETCDCTL") && !upload.contains("operator-tls"),
            "{upload}"
        );
        assert!(upload.contains("s3/etcd/ex-1.db"), "{upload}");
        // The etcd steps keep their TLS.
        assert!(init[0].to_string().contains("operator-tls"), "{}", init[0]);
        assert!(
            pod["spec"]["containers"][0]["args"]
                .to_string()
                .contains("--client-cert-auth=true")
        );
    }
}
