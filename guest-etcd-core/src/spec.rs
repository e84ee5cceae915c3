//! The `EtcdCluster` custom resource: spec and status types, API-compatible with the
//! classic etcd-operator (`etcd.database.coreos.com/v1beta2`), and the CRD built from them.
//!
//! The doc comments on fields become the field descriptions of the generated CRD schema
//! (`cargo xtask crdgen`, feature `crd`).

use std::collections::BTreeMap;
use std::fmt;

/// A status condition (`metav1.Condition` conventions): the SDK's.
pub use policy_host_sdk::conditions::Condition;
use schemars::JsonSchema;
use serde::{Deserialize, Serialize};

use crate::schedule::parse_duration;

/// Image repository used when `spec.repository` is not set.
pub const DEFAULT_REPOSITORY: &str = "gcr.io/etcd-development/etcd";

/// etcd version used when `spec.version` is not set.
pub const DEFAULT_VERSION: &str = "3.6.16";

/// Image running `mc` (the MinIO client, which speaks to any S3-compatible store) for
/// uploads and downloads when `image` is not set.
pub const DEFAULT_MC_IMAGE: &str = "minio/mc:RELEASE.2025-03-12T17-29-24Z";

/// Largest cluster size accepted: etcd recommends at most 7 voting members, and every voter
/// slows down writes (each one is in the quorum path).
pub const MAX_SIZE: i64 = 9;

/// etcd minor versions this plugin knows how to run, as `(major, minor)`. All of them
/// support learners (etcd 3.4+), which the scale-up procedure relies on.
pub const SUPPORTED_MINORS: &[(u64, u64)] = &[(3, 5), (3, 6)];

fn default_version() -> String {
    DEFAULT_VERSION.to_owned()
}

/// Desired state of an etcd cluster.
// Each printer column repeats `type_ = "string"`, which clippy takes for a duplicate.
#[allow(clippy::duplicated_attributes)]
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize, JsonSchema)]
#[cfg_attr(
    feature = "crd",
    derive(kube::CustomResource),
    kube(
        group = "etcd.database.coreos.com",
        version = "v1beta2",
        kind = "EtcdCluster",
        plural = "etcdclusters",
        namespaced,
        status = "EtcdClusterStatus",
        shortname = "etcd",
        doc = "An etcd cluster run by policy-host's etcd plugin.",
        scale(
            spec_replicas_path = ".spec.size",
            status_replicas_path = ".status.size"
        ),
        printcolumn(
            name = "Size",
            type_ = "integer",
            json_path = ".spec.size",
            description = "Desired number of members"
        ),
        printcolumn(
            name = "Ready",
            type_ = "string",
            json_path = ".status.ready",
            description = "Ready members / desired members"
        ),
        printcolumn(
            name = "Version",
            type_ = "string",
            json_path = ".status.currentVersion",
            description = "etcd version the cluster runs"
        ),
        printcolumn(
            name = "Phase",
            type_ = "string",
            json_path = ".status.phase",
            description = "Creating, Running, Scaling, Paused or Failed"
        ),
        printcolumn(
            name = "Last Backup",
            type_ = "date",
            json_path = ".status.backup.lastSuccessTime",
            description = "When the last snapshot succeeded"
        ),
        printcolumn(
            name = "Age",
            type_ = "date",
            json_path = ".metadata.creationTimestamp"
        )
    )
)]
#[serde(rename_all = "camelCase")]
// What the API server refuses at `kubectl apply` (CEL, `x-kubernetes-validations`): only what
// the object shows by itself. What needs the world (the running version, the pods) stays with
// `validate` and the reconcile.
#[schemars(extend("x-kubernetes-validations" = [
    {
        "rule": "has(self.restore) == has(oldSelf.restore) && (!has(self.restore) || self.restore == oldSelf.restore)",
        "message": "spec.restore is read only when the cluster is created: to start from another snapshot, create a new EtcdCluster with it"
    },
    {
        "rule": "has(self.tls) == has(oldSelf.tls)",
        "message": "spec.tls cannot be added to or removed from an existing EtcdCluster (its members' URLs are in etcd's membership): create a new EtcdCluster with spec.tls and spec.restore from a snapshot of this one"
    }
]))]
pub struct EtcdClusterSpec {
    /// Number of etcd members (voters). 1 to 9; use an odd number (3 or 5) so the cluster
    /// tolerates (size-1)/2 failed members.
    #[schemars(extend("x-kubernetes-validations" = [{
        "rule": "self >= 1 && self <= 9",
        "message": "spec.size must be 1 to 9: use an odd number, 3 or 5, so that (size-1)/2 members may fail"
    }]))]
    pub size: i64,
    /// etcd version, e.g. `3.6.16` (a leading `v` is accepted). Supported minors: 3.5 and
    /// 3.6. The image is `<repository>:v<version>`.
    #[serde(default = "default_version")]
    #[schemars(length(max = 64), extend("x-kubernetes-validations" = [{
        "rule": "self.matches('^v?[0-9]+[.][0-9]+[.][0-9]+([-+][0-9A-Za-z.+-]+)?$')",
        "message": "spec.version must be an etcd version such as 3.6.16 (a leading v is accepted)"
    }]))]
    pub version: String,
    /// Image repository; defaults to `gcr.io/etcd-development/etcd`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub repository: Option<String>,
    /// Settings for the member pods.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub pod: Option<PodPolicy>,
    /// Persistent storage for each member's data directory. Without it, members keep their
    /// data in an `emptyDir` and a member whose pod is lost is replaced by a fresh member.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub storage: Option<StorageSpec>,
    /// Snapshots of the cluster's data into a claim `backup-<cluster>`, on demand and on a
    /// schedule, each one proven to restore before it is listed in `status.backup`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub backup: Option<BackupSpec>,
    /// Database maintenance: compaction, the backend quota, defragmentation and recovery
    /// from the NOSPACE alarm.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub maintenance: Option<crate::maintenance::MaintenanceSpec>,
    /// Start a new cluster from a snapshot instead of empty (read only at creation; later
    /// changes are ignored).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub restore: Option<RestoreSpec>,
    /// TLS for peer and client traffic, from Secrets in the cluster's namespace. Read at
    /// creation: adding or removing it on a running cluster is refused and changes nothing.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub tls: Option<TlsSpec>,
    /// The classic operator's TLS (`TLS.static`): refused with what to do instead, since its
    /// Secrets use other key names; use `tls`.
    #[serde(default, rename = "TLS", skip_serializing_if = "Option::is_none")]
    pub classic_tls: Option<crate::classic::ClassicTls>,
    /// Stop changing the cluster while a human works on it (the classic operator's field):
    /// no member is added, removed, replaced or upgraded, no child is written or deleted, and
    /// no snapshot is taken unless `backup.whilePaused`. The status keeps reporting what etcd
    /// says, with a `Paused` condition. Set it back to `false` to resume where it stopped.
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub paused: bool,
}

/// The Secrets of a TLS cluster, each with `ca.crt`, `tls.crt` and `tls.key` (as cert-manager
/// writes them). Certificates of members must be valid for every member's DNS name,
/// `<pod>.<cluster>.<namespace>.svc` (a wildcard `*.<cluster>.<namespace>.svc` covers them);
/// each `ca.crt` is the CA that signed the certificates the other side presents.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct TlsSpec {
    /// Peer traffic between members: the certificate each member serves and presents to the
    /// others (it needs both server and client usages). Mounted at `/etc/etcd/tls/peer`.
    pub peer_secret: String,
    /// The client port: the certificate members serve to clients, which must present a
    /// client certificate signed by this Secret's `ca.crt`. Mounted at
    /// `/etc/etcd/tls/server`.
    pub server_secret: String,
    /// The client certificate the operator uses: policy-host's calls to members, and backup
    /// pods' `etcdctl`. The host reads it for its calls (it needs `get` on Secrets); the
    /// plugin never sees it.
    pub operator_secret: String,
}

/// Where snapshots go, when one is taken and how many are kept.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct BackupSpec {
    /// The claim `backup-<cluster>` that keeps the snapshots.
    pub storage: StorageSpec,
    /// Set it to a new value (e.g. the current time) to take a snapshot now, beside any
    /// schedule.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub trigger: Option<String>,
    /// Take a snapshot this often, e.g. `6h`, `30m` or `1h30m` (units `s`, `m`, `h`). The
    /// first is taken as soon as the cluster answers.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(length(max = 32), extend("x-kubernetes-validations" = [{
        "rule": "self.matches('^([0-9]+[smh])+$') && self.matches('[1-9]')",
        "message": "spec.backup.every must be a duration: a number and a unit s, m or h, e.g. 6h, 30m or 1h30m"
    }]))]
    pub every: Option<String>,
    /// How many snapshots to keep (default 3, at least 1). Snapshots rotate through that
    /// many files `<cluster>-<slot>.db`, a new one replacing the oldest;
    /// `status.backup.snapshots` says which file holds what.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(extend("x-kubernetes-validations" = [{
        "rule": "self >= 1",
        "message": "spec.backup.keep must be at least 1 snapshot (the default is 3)"
    }]))]
    pub keep: Option<i64>,
    /// When a majority of voting members lost their pods and data (emptyDir storage), so
    /// etcd cannot recover by itself: delete what is left and start the cluster again from
    /// the last successful snapshot (`status.backup.lastSnapshot`). Writes made after that
    /// snapshot are lost. Off by default: the loss is then only reported.
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub restore_on_quorum_loss: bool,
    /// Also upload each verified snapshot to an S3-compatible object store, as
    /// `<prefix><namespace>/<cluster>-<slot>.db`: the objects rotate with the slot files, so
    /// the bucket keeps the same `keep` snapshots as the claim, and same-named clusters of
    /// two namespaces never share an object.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub s3: Option<S3BackupSpec>,
    /// Keep taking snapshots (on demand and on schedule) while `spec.paused` is true. Off by
    /// default: a paused cluster is one a human is working on (often restoring or moving
    /// data by hand), and a backup Pod is a new workload reading from the members.
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub while_paused: bool,
}

/// The S3-compatible bucket that receives a copy of every verified snapshot.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct S3BackupSpec {
    /// The store's URL, `http://` or `https://` and a host (and port), e.g.
    /// `http://minio.backup.svc:9000` or `https://s3.eu-west-1.amazonaws.com`.
    pub endpoint: String,
    /// The bucket; it must exist.
    pub bucket: String,
    /// Prepended to each object name, e.g. `etcd/prod/` (a missing trailing `/` is added).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub prefix: Option<String>,
    /// A Secret in the cluster's namespace with `accessKeyID` and `secretAccessKey`. `mc`
    /// reads them from `MC_HOST_s3=<scheme>://<id>:<secret>@<host>` as written, so neither may
    /// contain `:` (`/`, `+` and `@` are fine).
    pub credentials_secret: String,
    /// The image running `mc` for the upload; defaults to a pinned `minio/mc` release.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub image: Option<String>,
}

/// One object in an S3-compatible store, to restore a new cluster from.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct S3RestoreSpec {
    /// The store's URL, `http://` or `https://` and a host (and port).
    pub endpoint: String,
    /// The bucket holding the snapshot.
    pub bucket: String,
    /// The object's name, e.g. `etcd/prod/default/example-0.db` (what follows the bucket in
    /// `status.backup.snapshots[].location`).
    pub key: String,
    /// A Secret in the cluster's namespace with `accessKeyID` and `secretAccessKey`.
    pub credentials_secret: String,
    /// The image running `mc` for the download; defaults to a pinned `minio/mc` release.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub image: Option<String>,
}

/// A snapshot to restore a new cluster from: a file in a claim (`claimName` and `snapshot`),
/// or an object in an S3-compatible store (`s3`).
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "camelCase")]
#[schemars(extend("x-kubernetes-validations" = [{
    "rule": "has(self.s3) ? !has(self.claimName) && !has(self.snapshot) : has(self.claimName) && has(self.snapshot)",
    "message": "spec.restore needs exactly one source: claimName and snapshot (a file in that claim), or s3 (endpoint, bucket, key, credentialsSecret)"
}]))]
pub struct RestoreSpec {
    /// The claim holding the snapshot, e.g. `backup-<other cluster>`.
    #[serde(default, skip_serializing_if = "String::is_empty")]
    pub claim_name: String,
    /// The snapshot file in that claim, as `status.backup.snapshots[].file` names it.
    #[serde(default, skip_serializing_if = "String::is_empty")]
    pub snapshot: String,
    /// The snapshot as an object in an S3-compatible store, instead of a claim's file.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub s3: Option<S3RestoreSpec>,
}

/// Settings for the member pods.
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct PodPolicy {
    /// Compute resources of the etcd container (Kubernetes ResourceRequirements).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub resources: Option<ResourceRequirements>,
    /// Node labels the member pods must run on (Kubernetes `nodeSelector`).
    #[serde(default, skip_serializing_if = "BTreeMap::is_empty")]
    pub node_selector: BTreeMap<String, String>,
    /// Kubernetes `Affinity` of the member pods, passed as written; e.g. a pod
    /// anti-affinity on `app.kubernetes.io/instance` spreads members over nodes.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(schema_with = "any_object")]
    pub affinity: Option<serde_json::Value>,
    /// Kubernetes `Toleration`s of the member pods, passed as written.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    #[schemars(schema_with = "any_objects")]
    pub tolerations: Vec<serde_json::Value>,
    /// Extra labels of the member pods (the classic operator's field). `app`, `etcd_*` and the
    /// operator's own keys are refused.
    #[serde(default, skip_serializing_if = "BTreeMap::is_empty")]
    pub labels: BTreeMap<String, String>,
    /// Annotations of the member pods (the classic operator's field).
    #[serde(default, skip_serializing_if = "BTreeMap::is_empty")]
    pub annotations: BTreeMap<String, String>,
    /// The classic operator's spread of members over nodes: `true` (and no `affinity`) adds a
    /// required pod anti-affinity over `kubernetes.io/hostname` among the cluster's members.
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub anti_affinity: bool,
    /// Environment variables of the etcd container (Kubernetes `EnvVar`s, the classic
    /// operator's field), e.g. `ETCD_AUTO_COMPACTION_RETENTION`. Variables that would override
    /// the operator's own flags (`ETCD_NAME`, `ETCD_INITIAL_*`, `ETCD_LISTEN_*`, ...) are refused.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    #[schemars(schema_with = "any_objects")]
    pub etcd_env: Vec<serde_json::Value>,
    /// The classic operator's member volume: read as `storage` (its
    /// `resources.requests.storage` and `storageClassName`). Use `spec.storage` instead.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(schema_with = "any_object")]
    pub persistent_volume_claim_spec: Option<serde_json::Value>,
    /// Kubernetes `PodSecurityContext` of the member pods, passed as written.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(schema_with = "any_object")]
    pub security_context: Option<serde_json::Value>,
    /// The classic operator's DNS-wait init container image: accepted and ignored (no such
    /// container is needed here); named in the `IgnoredFields` condition.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub busybox_image: Option<String>,
    /// The classic operator's DNS wait: accepted and ignored (see `busyboxImage`).
    #[serde(
        default,
        rename = "DNSTimeoutInSecond",
        skip_serializing_if = "Option::is_none"
    )]
    pub dns_timeout_in_second: Option<i64>,
    /// The classic operator's cluster domain for member URLs: accepted and ignored (member
    /// URLs are `<pod>.<cluster>.<namespace>.svc`).
    #[serde(
        default,
        rename = "ClusterDomain",
        skip_serializing_if = "Option::is_none"
    )]
    pub cluster_domain: Option<String>,
}

/// Schema of a Kubernetes object the plugin passes through unchecked (the API server
/// validates it when the pod is created).
/// The schema of a field kept as any JSON object (unknown fields preserved), for
/// `#[schemars(schema_with = ..)]`.
pub fn any_object(_: &mut schemars::SchemaGenerator) -> schemars::Schema {
    schemars::json_schema!({
        "type": "object",
        "x-kubernetes-preserve-unknown-fields": true,
    })
}

/// Schema of a list of such objects.
fn any_objects(_: &mut schemars::SchemaGenerator) -> schemars::Schema {
    schemars::json_schema!({
        "type": "array",
        "items": {"type": "object", "x-kubernetes-preserve-unknown-fields": true},
    })
}

/// Compute resources, as Kubernetes `ResourceRequirements` (limits and requests only).
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct ResourceRequirements {
    /// Maximum amount of each resource, e.g. `{cpu: 500m, memory: 512Mi}`.
    #[serde(default, skip_serializing_if = "BTreeMap::is_empty")]
    pub limits: BTreeMap<String, Quantity>,
    /// Amount of each resource the scheduler reserves, e.g. `{cpu: 100m, memory: 128Mi}`.
    #[serde(default, skip_serializing_if = "BTreeMap::is_empty")]
    pub requests: BTreeMap<String, Quantity>,
}

/// Persistent storage: one PersistentVolumeClaim per member, named after its pod.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "camelCase")]
#[schemars(extend("x-kubernetes-validations" = [{
    "rule": "!isQuantity(string(self.size)) || !isQuantity(string(oldSelf.size)) || quantity(string(self.size)).compareTo(quantity(string(oldSelf.size))) >= 0",
    "message": "size cannot shrink (Kubernetes never makes a PersistentVolumeClaim smaller): keep it at least what it was"
}]))]
pub struct StorageSpec {
    /// Requested size of each member's volume, e.g. `1Gi`.
    pub size: Quantity,
    /// StorageClass of the claims; the cluster's default class when unset.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub storage_class_name: Option<String>,
}

/// A Kubernetes resource quantity (`500m`, `1Gi`, `2`): a string or an integer in YAML.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize)]
pub struct Quantity(pub String);

impl<'de> Deserialize<'de> for Quantity {
    fn deserialize<D: serde::Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        struct QuantityVisitor;
        impl serde::de::Visitor<'_> for QuantityVisitor {
            type Value = Quantity;
            fn expecting(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
                f.write_str("a quantity such as \"500m\", \"1Gi\" or 2")
            }
            fn visit_str<E: serde::de::Error>(self, v: &str) -> Result<Quantity, E> {
                Ok(Quantity(v.to_owned()))
            }
            fn visit_u64<E: serde::de::Error>(self, v: u64) -> Result<Quantity, E> {
                Ok(Quantity(v.to_string()))
            }
            fn visit_i64<E: serde::de::Error>(self, v: i64) -> Result<Quantity, E> {
                Ok(Quantity(v.to_string()))
            }
            fn visit_f64<E: serde::de::Error>(self, v: f64) -> Result<Quantity, E> {
                Ok(Quantity(v.to_string()))
            }
        }
        d.deserialize_any(QuantityVisitor)
    }
}

impl JsonSchema for Quantity {
    fn schema_name() -> std::borrow::Cow<'static, str> {
        "Quantity".into()
    }

    fn inline_schema() -> bool {
        true
    }

    fn json_schema(_: &mut schemars::SchemaGenerator) -> schemars::Schema {
        schemars::json_schema!({
            "description": "A Kubernetes quantity, e.g. 500m, 1Gi or 2.",
            "x-kubernetes-int-or-string": true,
        })
    }
}

/// Observed state of an etcd cluster, written by the plugin on every reconcile. The classic
/// etcd-operator's fields (`phase`, `reason`, `controlPaused`, `size`, `serviceName`,
/// `clientPort`, `members.ready`/`members.unready`, `currentVersion`, `targetVersion`) mean
/// what they meant there, so tools written for `v1beta2` read them unchanged; `etcdMembers`
/// is this plugin's fuller account of each member.
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct EtcdClusterStatus {
    /// `Creating`, `Running`, `Scaling`, `Paused` or `Failed`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub phase: Option<Phase>,
    /// Why the phase is `Failed`: the `Degraded` condition's message (the classic field).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub reason: Option<String>,
    /// Whether `spec.paused` holds every change (the classic field).
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub control_paused: bool,
    /// Current number of etcd members (voters and learners).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub size: Option<i64>,
    /// The client Service, `<cluster>-client` (the classic field).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub service_name: Option<String>,
    /// The client port of that Service and of every member, 2379 (the classic field).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub client_port: Option<i64>,
    /// Ready members over desired members, e.g. `2/3`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub ready: Option<String>,
    /// The members by readiness, as pod names (the classic field).
    #[serde(default)]
    pub members: ClassicMembers,
    /// The members etcd reports, with their IDs and roles.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub etcd_members: Vec<MemberStatus>,
    /// The member that leads, as the member the plugin asked last reported it (absent while
    /// no member answered yet). A change of it is counted in the leader-changes metric.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub leader: Option<String>,
    /// etcd's cluster ID (decimal), once the cluster answered.
    #[serde(default, rename = "clusterID", skip_serializing_if = "Option::is_none")]
    pub cluster_id: Option<String>,
    /// etcd version the cluster runs, as etcd reports it.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub current_version: Option<String>,
    /// etcd version the cluster is being upgraded to: `spec.version` while it differs from
    /// `currentVersion`, absent otherwise (as in the classic operator).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub target_version: Option<String>,
    /// `Available` (a quorum of members is ready), `Progressing` (membership is changing),
    /// `Degraded` (something needs attention: invalid spec, lost or failed members).
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub conditions: Vec<Condition>,
    /// The `metadata.generation` this status was computed for.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub observed_generation: Option<i64>,
    /// The snapshots kept and the outcome of the last one, once one was taken.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub backup: Option<BackupStatus>,
    /// The snapshot (in the backup claim) the cluster is being started again from after a
    /// quorum loss, until the new cluster answers.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub restoring: Option<String>,
}

/// The snapshots kept, and the outcome of the last one.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct BackupStatus {
    /// The last `spec.backup.trigger` a snapshot was taken for.
    #[serde(default)]
    pub trigger: String,
    /// `Succeeded` or `Failed`: the outcome of the last snapshot, on demand or scheduled.
    #[serde(default)]
    pub phase: String,
    /// Why the last snapshot failed, when it did.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub message: Option<String>,
    /// The newest verified snapshot file in the backup claim (the first of `snapshots`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub last_snapshot: Option<String>,
    /// When the last snapshot succeeded (RFC 3339).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub last_success_time: Option<String>,
    /// The time the last scheduled snapshot was due (RFC 3339), succeeded or not: the next
    /// one is due `spec.backup.every` later.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub last_scheduled_time: Option<String>,
    /// When the next scheduled snapshot is due (RFC 3339), with `spec.backup.every`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub next_scheduled_time: Option<String>,
    /// The snapshots kept in the backup claim, newest first, at most `spec.backup.keep`.
    /// Each was restored and served by a throwaway etcd before it was listed.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub snapshots: Vec<SnapshotStatus>,
}

/// One verified snapshot in the backup claim.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct SnapshotStatus {
    /// The file in the backup claim, `<cluster>-<slot>.db`: give it to `spec.restore`.
    pub file: String,
    /// The `spec.backup.trigger` it was taken for, or `scheduled`.
    pub trigger: String,
    /// When it was saved (RFC 3339).
    pub taken_at: String,
    /// The etcd revision it holds: the last write in it.
    pub revision: i64,
    /// Size of the restored database in bytes (etcd's `dbSize`).
    pub size: i64,
    /// etcd's KV hash at `revision` (`hashKV`): equal to `etcdctl endpoint hashkv
    /// --rev=<revision>` of a member that has not compacted past it, so a live cluster can be
    /// checked against the snapshot.
    #[serde(rename = "hashKV")]
    pub hash_kv: u32,
    /// Where the snapshot was uploaded, `s3://<bucket>/<prefix><namespace>/<file>`, with
    /// `spec.backup.s3`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub location: Option<String>,
}

/// Lifecycle phase of the cluster.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
pub enum Phase {
    /// The seed member is starting; the cluster has not answered yet.
    Creating,
    /// Membership matches the spec and every member is ready.
    Running,
    /// Members are being added, promoted, removed or replaced.
    Scaling,
    /// The spec is invalid, or the cluster is lost and needs a human.
    Failed,
    /// `spec.paused` is true: nothing is changed until it is set back to false.
    Paused,
}

/// The classic `status.members`: member pod names by readiness.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
pub struct ClassicMembers {
    /// Voting members whose pod is Ready and whose etcd has started: they serve requests.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub ready: Vec<String>,
    /// Every other member: starting, failed, without a pod, or a learner still catching up.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub unready: Vec<String>,
}

impl EtcdClusterStatus {
    /// Reads a status as this plugin wrote it. A status written before `status.members`
    /// became the classic `{ready, unready}` holds the member list there: it is read as
    /// `etcdMembers`, so a plugin swapped in while etcd does not answer still knows the members
    /// it must recover. `None` for anything else that does not parse.
    pub fn read(mut status: serde_json::Value) -> Option<EtcdClusterStatus> {
        if let Some(object) = status.as_object_mut()
            && object
                .get("members")
                .is_some_and(serde_json::Value::is_array)
        {
            let list = object.remove("members").unwrap_or_default();
            object.entry("etcdMembers").or_insert(list);
        }
        serde_json::from_value(status).ok()
    }
}

/// One etcd member.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct MemberStatus {
    /// Member name, which is also its pod's name.
    pub name: String,
    /// etcd member ID (decimal).
    pub id: String,
    /// Whether the member's pod is Ready.
    pub ready: bool,
    /// Whether the member is a learner (non-voting, catching up).
    pub learner: bool,
}

/// A validated spec: what the rest of the plugin works with.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct ValidSpec {
    /// Number of members wanted.
    pub size: usize,
    /// Version without the leading `v`, e.g. `3.6.16`.
    pub version: Version,
    /// Container image, `<repository>:v<version>`.
    pub image: String,
    /// Compute resources of the etcd container.
    pub resources: Option<ResourceRequirements>,
    /// `nodeSelector` of the member pods.
    pub node_selector: BTreeMap<String, String>,
    /// `affinity` of the member pods.
    pub affinity: Option<serde_json::Value>,
    /// `tolerations` of the member pods.
    pub tolerations: Vec<serde_json::Value>,
    /// Persistent storage, if any.
    pub storage: Option<StorageSpec>,
    /// Snapshots, if any.
    pub backup: Option<ValidBackup>,
    /// Database maintenance (defaults: none).
    pub maintenance: crate::maintenance::ValidMaintenance,
    /// Snapshot to start from, if any.
    pub restore: Option<RestoreSpec>,
    /// TLS Secrets, if the cluster speaks TLS.
    pub tls: Option<TlsSpec>,
    /// `spec.paused`: change nothing.
    pub paused: bool,
    /// What the classic operator's pod fields add to the member pods.
    pub classic: crate::classic::ClassicPod,
    /// Classic fields accepted without a meaning here, each with why.
    pub ignored: Vec<String>,
}

/// Default of `spec.backup.keep`.
pub const DEFAULT_KEEP: usize = 3;

/// A validated `spec.backup`.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct ValidBackup {
    /// The backup claim.
    pub storage: StorageSpec,
    /// The on-demand trigger, trimmed; empty when unset.
    pub trigger: String,
    /// Seconds between scheduled snapshots; `None`: no schedule.
    pub every_seconds: Option<i64>,
    /// Snapshots to keep (slots to rotate through), at least 1.
    pub keep: usize,
    /// Restore the last snapshot when quorum is lost for good.
    pub restore_on_quorum_loss: bool,
    /// The object store each verified snapshot is uploaded to, if any.
    pub s3: Option<ValidS3>,
    /// Snapshots continue while the cluster is paused.
    pub while_paused: bool,
}

/// A validated `spec.backup.s3`.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct ValidS3 {
    /// `http://host:port` or `https://host:port`, without a trailing `/`.
    pub endpoint: String,
    /// The bucket.
    pub bucket: String,
    /// Empty, or ending in `/`.
    pub prefix: String,
    /// The Secret with `accessKeyID` and `secretAccessKey`.
    pub credentials_secret: String,
    /// The image running `mc`.
    pub image: String,
}

/// An etcd version `major.minor.patch` (pre-release suffixes are kept for the image tag).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Version {
    /// Major version.
    pub major: u64,
    /// Minor version.
    pub minor: u64,
    /// Patch version.
    pub patch: u64,
    /// The text as written, without a leading `v` (e.g. `3.6.0-rc.1`).
    pub text: String,
}

impl Version {
    /// Parses `3.6.16` or `v3.6.16` (an optional `-suffix` is allowed).
    pub fn parse(text: &str) -> Option<Version> {
        let text = text.trim();
        let bare = text.strip_prefix('v').unwrap_or(text);
        let core = bare.split(['-', '+']).next()?;
        let mut parts = core.split('.');
        let major = parts.next()?.parse().ok()?;
        let minor = parts.next()?.parse().ok()?;
        let patch = parts.next()?.parse().ok()?;
        if parts.next().is_some() {
            return None;
        }
        Some(Version {
            major,
            minor,
            patch,
            text: bare.to_owned(),
        })
    }

    /// Whether etcd at this version supports learner members (etcd 3.4+).
    pub fn supports_learners(&self) -> bool {
        (self.major, self.minor) >= (3, 4)
    }

    /// Whether etcd at this version takes `--max-learners` (etcd 3.6+; 3.5 allows one).
    pub fn supports_max_learners(&self) -> bool {
        (self.major, self.minor) >= (3, 6)
    }
}

impl fmt::Display for Version {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.text)
    }
}

impl EtcdClusterSpec {
    /// Checks the spec; on failure the message says what to fix.
    pub fn validate(&self) -> Result<ValidSpec, String> {
        if self.size < 1 || self.size > MAX_SIZE {
            return Err(format!(
                "spec.size is {}: set it between 1 and {MAX_SIZE} (3 or 5 for a cluster that tolerates failures)",
                self.size
            ));
        }
        let supported = SUPPORTED_MINORS
            .iter()
            .map(|(major, minor)| format!("{major}.{minor}.x"))
            .collect::<Vec<_>>()
            .join(", ");
        let Some(version) = Version::parse(&self.version) else {
            return Err(format!(
                "spec.version {:?} is not a version like 3.6.16: use one of {supported}",
                self.version
            ));
        };
        if !SUPPORTED_MINORS.contains(&(version.major, version.minor)) {
            return Err(format!(
                "spec.version {version} is not supported: use one of {supported}"
            ));
        }
        let repository = self
            .repository
            .as_deref()
            .map(str::trim)
            .filter(|r| !r.is_empty())
            .unwrap_or(DEFAULT_REPOSITORY);
        if repository.contains(char::is_whitespace) || repository.contains('@') {
            return Err(format!(
                "spec.repository {repository:?} is not an image repository: use e.g. {DEFAULT_REPOSITORY}"
            ));
        }
        if let Some(storage) = &self.storage
            && storage.size.0.trim().is_empty()
        {
            return Err("spec.storage.size is empty: set it, e.g. 1Gi".to_owned());
        }
        let (classic, classic_storage, ignored) = crate::classic::read(self)?;
        let backup = self.backup.as_ref().map(BackupSpec::validate).transpose()?;
        let maintenance = self
            .maintenance
            .as_ref()
            .map(crate::maintenance::MaintenanceSpec::validate)
            .transpose()?
            .unwrap_or_default();
        if let Some(restore) = &self.restore {
            validate_restore(restore)?;
        }
        if let Some(tls) = &self.tls {
            for (field, secret) in [
                ("peerSecret", &tls.peer_secret),
                ("serverSecret", &tls.server_secret),
                ("operatorSecret", &tls.operator_secret),
            ] {
                if !is_dns_subdomain(secret) {
                    return Err(format!(
                        "spec.tls.{field} {secret:?} is not a Secret name: name a Secret in this namespace with ca.crt, tls.crt and tls.key"
                    ));
                }
            }
        }
        Ok(ValidSpec {
            // Checked above: 1 <= size <= MAX_SIZE.
            size: usize::try_from(self.size).unwrap_or(1),
            image: format!("{repository}:v{version}"),
            version,
            resources: self.pod.as_ref().and_then(|p| p.resources.clone()),
            node_selector: self
                .pod
                .as_ref()
                .map(|p| p.node_selector.clone())
                .unwrap_or_default(),
            affinity: self.pod.as_ref().and_then(|p| p.affinity.clone()),
            tolerations: self
                .pod
                .as_ref()
                .map(|p| p.tolerations.clone())
                .unwrap_or_default(),
            storage: self.storage.clone().or(classic_storage),
            backup,
            maintenance,
            restore: self.restore.clone(),
            tls: self.tls.clone(),
            paused: self.paused,
            classic,
            ignored,
        })
    }
}

/// A Kubernetes object name: lower-case letters, digits, `-` and `.`, starting and ending
/// with a letter or digit, at most 253 characters.
pub fn is_dns_subdomain(name: &str) -> bool {
    let edge = |c: Option<char>| c.is_some_and(|c| c.is_ascii_lowercase() || c.is_ascii_digit());
    name.len() <= 253
        && edge(name.chars().next())
        && edge(name.chars().last())
        && name
            .chars()
            .all(|c| c.is_ascii_lowercase() || c.is_ascii_digit() || c == '-' || c == '.')
}

impl BackupSpec {
    /// Checks `spec.backup`; on failure the message says what to fix.
    pub fn validate(&self) -> Result<ValidBackup, String> {
        if self.storage.size.0.trim().is_empty() {
            return Err("spec.backup.storage.size is empty: set it, e.g. 1Gi".to_owned());
        }
        let every_seconds = match &self.every {
            None => None,
            Some(every) => Some(parse_duration(every).ok_or_else(|| {
                format!(
                    "spec.backup.every {every:?} is not a duration: use a number and a unit s, m or h, e.g. 6h, 30m or 1h30m"
                )
            })?),
        };
        let keep = match self.keep {
            None => DEFAULT_KEEP,
            Some(keep) => usize::try_from(keep).ok().filter(|k| *k >= 1).ok_or_else(|| {
                format!("spec.backup.keep is {keep}: keep at least 1 snapshot (default {DEFAULT_KEEP})")
            })?,
        };
        Ok(ValidBackup {
            storage: self.storage.clone(),
            trigger: self
                .trigger
                .as_deref()
                .unwrap_or_default()
                .trim()
                .to_owned(),
            every_seconds,
            keep,
            restore_on_quorum_loss: self.restore_on_quorum_loss,
            s3: self.s3.as_ref().map(S3BackupSpec::validate).transpose()?,
            while_paused: self.while_paused,
        })
    }
}

impl S3BackupSpec {
    /// Checks `spec.backup.s3`; on failure the message says what to fix.
    pub fn validate(&self) -> Result<ValidS3, String> {
        let field = "spec.backup.s3";
        let prefix = self.prefix.as_deref().unwrap_or_default().trim();
        let prefix = prefix.trim_start_matches('/');
        if prefix.contains(char::is_whitespace) || prefix.contains("//") {
            return Err(format!(
                "{field}.prefix {prefix:?} is not an object name prefix: use e.g. etcd/prod/ (no spaces, no empty path segment)"
            ));
        }
        let prefix = if prefix.is_empty() || prefix.ends_with('/') {
            prefix.to_owned()
        } else {
            format!("{prefix}/")
        };
        Ok(ValidS3 {
            endpoint: valid_endpoint(field, &self.endpoint)?,
            bucket: valid_bucket(field, &self.bucket)?,
            prefix,
            credentials_secret: valid_credentials(field, &self.credentials_secret)?,
            image: valid_mc_image(field, self.image.as_deref())?,
        })
    }
}

/// `spec.restore`: either a claim's file or an S3 object, each complete.
fn validate_restore(restore: &RestoreSpec) -> Result<(), String> {
    let from_claim = !restore.claim_name.trim().is_empty() || !restore.snapshot.trim().is_empty();
    match &restore.s3 {
        Some(_) if from_claim => Err(
            "spec.restore names both a claim (claimName, snapshot) and an s3 object: keep one of them"
                .to_owned(),
        ),
        Some(s3) => {
            let field = "spec.restore.s3";
            valid_endpoint(field, &s3.endpoint)?;
            valid_bucket(field, &s3.bucket)?;
            valid_credentials(field, &s3.credentials_secret)?;
            valid_mc_image(field, s3.image.as_deref())?;
            let key = s3.key.trim();
            if key.is_empty()
                || key.ends_with('/')
                || key.starts_with('/')
                || key.contains(char::is_whitespace)
            {
                return Err(format!(
                    "{field}.key {:?} is not an object name: use the object of a snapshot, e.g. etcd/prod/example-0.db (status.backup.snapshots[].location without s3://<bucket>/)",
                    s3.key
                ));
            }
            Ok(())
        }
        None if restore.claim_name.trim().is_empty()
            || restore.snapshot.trim().is_empty()
            || restore.snapshot.contains('/') =>
        {
            Err(
                "spec.restore needs either claimName and snapshot (a file name in that claim, as status.backup.lastSnapshot names it), or s3 (endpoint, bucket, key, credentialsSecret)"
                    .to_owned(),
            )
        }
        None => Ok(()),
    }
}

/// `http(s)://host[:port]`, without a trailing `/`.
pub fn valid_endpoint(field: &str, endpoint: &str) -> Result<String, String> {
    let endpoint = endpoint.trim().trim_end_matches('/');
    let host = endpoint
        .strip_prefix("http://")
        .or_else(|| endpoint.strip_prefix("https://"));
    match host {
        Some(host)
            if !host.is_empty()
                && !host.contains(['/', '@', '?', '#'])
                && !host.contains(char::is_whitespace) =>
        {
            Ok(endpoint.to_owned())
        }
        _ => Err(format!(
            "{field}.endpoint {endpoint:?} is not an S3 endpoint: use http:// or https:// and a host (and port), e.g. http://minio.backup.svc:9000"
        )),
    }
}

/// S3 bucket names: 3 to 63 lower-case letters, digits, `.` and `-`, starting and ending
/// with a letter or digit (AWS "Bucket naming rules").
pub fn valid_bucket(field: &str, bucket: &str) -> Result<String, String> {
    if (3..=63).contains(&bucket.len()) && is_dns_subdomain(bucket) {
        Ok(bucket.to_owned())
    } else {
        Err(format!(
            "{field}.bucket {bucket:?} is not a bucket name: use 3 to 63 lower-case letters, digits, '.' and '-'"
        ))
    }
}

/// A credentials Secret name (`<field>.credentialsSecret`).
pub fn valid_credentials(field: &str, secret: &str) -> Result<String, String> {
    if is_dns_subdomain(secret) {
        Ok(secret.to_owned())
    } else {
        Err(format!(
            "{field}.credentialsSecret {secret:?} is not a Secret name: name a Secret in this namespace with accessKeyID and secretAccessKey"
        ))
    }
}

/// The `mc` image of `<field>.image`, or the pinned default.
pub fn valid_mc_image(field: &str, image: Option<&str>) -> Result<String, String> {
    match image.map(str::trim) {
        None | Some("") => Ok(DEFAULT_MC_IMAGE.to_owned()),
        Some(image) if !image.contains(char::is_whitespace) => Ok(image.to_owned()),
        Some(image) => Err(format!(
            "{field}.image {image:?} is not an image: use e.g. {DEFAULT_MC_IMAGE}"
        )),
    }
}

/// The CustomResourceDefinition for `EtcdCluster`, for `cargo xtask crdgen` (which writes it
/// as YAML to `deploy/crds/etcdcluster.yaml`).
#[cfg(feature = "crd")]
pub fn custom_resource_definition()
-> k8s_openapi::apiextensions_apiserver::pkg::apis::apiextensions::v1::CustomResourceDefinition {
    use kube::CustomResourceExt;
    EtcdCluster::crd()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn versions_parse_with_or_without_v() {
        let cases = [
            ("3.6.16", Some((3, 6, 16))),
            ("v3.5.21", Some((3, 5, 21))),
            ("3.6.0-rc.1", Some((3, 6, 0))),
            ("3.6", None),
            ("latest", None),
            ("3.6.1.2", None),
        ];
        for (text, want) in cases {
            let got = Version::parse(text).map(|v| (v.major, v.minor, v.patch));
            assert_eq!(got, want, "{text}");
        }
    }

    #[test]
    fn validation_table() {
        let base = EtcdClusterSpec {
            size: 3,
            version: "3.6.16".into(),
            ..Default::default()
        };
        let cases: Vec<(&str, EtcdClusterSpec, Result<&str, &str>)> = vec![
            (
                "classic example",
                base.clone(),
                Ok("gcr.io/etcd-development/etcd:v3.6.16"),
            ),
            (
                "leading v and custom repository",
                EtcdClusterSpec {
                    version: "v3.5.21".into(),
                    repository: Some("quay.io/coreos/etcd".into()),
                    ..base.clone()
                },
                Ok("quay.io/coreos/etcd:v3.5.21"),
            ),
            (
                "size 0",
                EtcdClusterSpec {
                    size: 0,
                    ..base.clone()
                },
                Err("spec.size is 0"),
            ),
            (
                "size 10",
                EtcdClusterSpec {
                    size: 10,
                    ..base.clone()
                },
                Err("spec.size is 10"),
            ),
            (
                "3.4 is unsupported",
                EtcdClusterSpec {
                    version: "3.4.30".into(),
                    ..base.clone()
                },
                Err("not supported"),
            ),
            (
                "garbage version",
                EtcdClusterSpec {
                    version: "latest".into(),
                    ..base.clone()
                },
                Err("not a version"),
            ),
            (
                "TLS with three Secrets",
                EtcdClusterSpec {
                    tls: Some(TlsSpec {
                        peer_secret: "ex-peer".into(),
                        server_secret: "ex-server".into(),
                        operator_secret: "ex-operator".into(),
                    }),
                    ..base.clone()
                },
                Ok("gcr.io/etcd-development/etcd:v3.6.16"),
            ),
            (
                "TLS without an operator Secret",
                EtcdClusterSpec {
                    tls: Some(TlsSpec {
                        peer_secret: "ex-peer".into(),
                        server_secret: "ex-server".into(),
                        operator_secret: String::new(),
                    }),
                    ..base.clone()
                },
                Err("spec.tls.operatorSecret \"\" is not a Secret name"),
            ),
            (
                "TLS with a Secret name that is not one",
                EtcdClusterSpec {
                    tls: Some(TlsSpec {
                        peer_secret: "Peer_Certs".into(),
                        server_secret: "ex-server".into(),
                        operator_secret: "ex-operator".into(),
                    }),
                    ..base.clone()
                },
                Err("spec.tls.peerSecret \"Peer_Certs\""),
            ),
        ];
        let s3_backup = |s3: serde_json::Value| -> EtcdClusterSpec {
            serde_json::from_value(serde_json::json!({
                "size": 3,
                "backup": {"storage": {"size": "1Gi"}, "s3": s3},
            }))
            .expect("parses")
        };
        let s3_restore = |restore: serde_json::Value| -> EtcdClusterSpec {
            serde_json::from_value(serde_json::json!({"size": 1, "restore": restore}))
                .expect("parses")
        };
        let object = serde_json::json!({"endpoint": "https://s3.example.com", "bucket": "etcd",
            "key": "prod/ex-0.db", "credentialsSecret": "s3-credentials"});
        let cases = cases.into_iter().chain([
            (
                "backup to s3",
                s3_backup(serde_json::json!({"endpoint": "http://minio.backup.svc:9000",
                    "bucket": "etcd-snapshots", "credentialsSecret": "s3-credentials"})),
                Ok("gcr.io/etcd-development/etcd:v3.6.16"),
            ),
            (
                "backup to s3 without a scheme",
                s3_backup(serde_json::json!({"endpoint": "minio:9000",
                    "bucket": "etcd-snapshots", "credentialsSecret": "s3-credentials"})),
                Err("spec.backup.s3.endpoint \"minio:9000\" is not an S3 endpoint: use http:// or https://"),
            ),
            (
                "backup to s3 with a bucket name that is not one",
                s3_backup(serde_json::json!({"endpoint": "http://minio:9000",
                    "bucket": "Etcd_Snapshots", "credentialsSecret": "s3-credentials"})),
                Err("spec.backup.s3.bucket \"Etcd_Snapshots\" is not a bucket name"),
            ),
            (
                "backup to s3 without a credentials Secret",
                s3_backup(serde_json::json!({"endpoint": "http://minio:9000",
                    "bucket": "etcd", "credentialsSecret": ""})),
                Err("spec.backup.s3.credentialsSecret \"\" is not a Secret name: name a Secret in this namespace with accessKeyID and secretAccessKey"),
            ),
            (
                "backup to s3 with a prefix that has an empty segment",
                s3_backup(serde_json::json!({"endpoint": "http://minio:9000",
                    "bucket": "etcd", "credentialsSecret": "c", "prefix": "a//b"})),
                Err("spec.backup.s3.prefix \"a//b\""),
            ),
            (
                "restore from s3",
                s3_restore(serde_json::json!({"s3": object.clone()})),
                Ok("gcr.io/etcd-development/etcd:v3.6.16"),
            ),
            (
                "restore from nothing",
                s3_restore(serde_json::json!({})),
                Err("spec.restore needs either claimName and snapshot (a file name in that claim, as status.backup.lastSnapshot names it), or s3"),
            ),
            (
                "restore from both a claim and s3",
                s3_restore(serde_json::json!({"claimName": "backup-old", "snapshot": "old-0.db",
                    "s3": object.clone()})),
                Err("names both a claim (claimName, snapshot) and an s3 object: keep one"),
            ),
            (
                "restore from an s3 prefix rather than an object",
                s3_restore(serde_json::json!({"s3": {"endpoint": "https://s3.example.com",
                    "bucket": "etcd", "key": "prod/", "credentialsSecret": "c"}})),
                Err("spec.restore.s3.key \"prod/\" is not an object name"),
            ),
            (
                "restore from s3 without a bucket",
                s3_restore(serde_json::json!({"s3": {"endpoint": "https://s3.example.com",
                    "bucket": "", "key": "k.db", "credentialsSecret": "c"}})),
                Err("spec.restore.s3.bucket \"\" is not a bucket name"),
            ),
        ]);
        for (name, spec, want) in cases {
            match (spec.validate(), want) {
                (Ok(valid), Ok(image)) => assert_eq!(valid.image, image, "{name}"),
                (Err(msg), Err(part)) => assert!(msg.contains(part), "{name}: {msg}"),
                (got, want) => panic!("{name}: got {got:?}, want {want:?}"),
            }
        }
    }

    #[test]
    fn s3_prefixes_end_in_a_slash_once() {
        for (prefix, want) in [
            (None, ""),
            (Some("prod"), "prod/"),
            (Some("/etcd/prod/"), "etcd/prod/"),
            (Some("  "), ""),
        ] {
            let s3 = S3BackupSpec {
                endpoint: "http://minio:9000/".into(),
                bucket: "etcd".into(),
                prefix: prefix.map(str::to_owned),
                credentials_secret: "c".into(),
                image: None,
            }
            .validate()
            .expect("valid");
            assert_eq!(s3.prefix, want, "{prefix:?}");
            assert_eq!(s3.endpoint, "http://minio:9000");
            assert_eq!(s3.image, DEFAULT_MC_IMAGE);
        }
    }

    #[test]
    fn the_classic_example_parses_and_quantities_accept_numbers() {
        let spec: EtcdClusterSpec = serde_json::from_value(serde_json::json!({
            "size": 3,
            "pod": {"resources": {"limits": {"cpu": 1, "memory": "512Mi"}}},
        }))
        .expect("parses");
        assert_eq!(spec.version, DEFAULT_VERSION);
        let limits = spec
            .pod
            .and_then(|p| p.resources)
            .map(|r| r.limits)
            .unwrap_or_default();
        assert_eq!(limits.get("cpu"), Some(&Quantity("1".into())));
    }

    #[cfg(feature = "crd")]
    #[test]
    fn crd_schema_is_structural_enough() {
        let crd = custom_resource_definition();
        let json = serde_json::to_string(&crd).expect("serializes");
        assert!(!json.contains("\"$ref\""), "no references: {json}");
        assert!(!json.contains("\"oneOf\""), "no oneOf: {json}");
        assert_eq!(crd.spec.names.short_names, Some(vec!["etcd".to_owned()]));
        let columns = crd.spec.versions[0]
            .additional_printer_columns
            .clone()
            .unwrap_or_default();
        let names: Vec<_> = columns.iter().map(|c| c.name.as_str()).collect();
        assert_eq!(
            names,
            ["Size", "Ready", "Version", "Phase", "Last Backup", "Age"]
        );
    }
}
