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
//!
//! One file per kind of child ([`services`], [`member`], [`claims`], [`backup_pod`], the
//! [`object_store`] containers of backup and restore), reading them back in [`observed`];
//! the names, labels, ports and mounts they share are here, so the files depend on this one
//! and never on each other's constants.

use policy_host_sdk::names::ChildName;
use serde_json::{Value, json};

/// The kinds of the children: member and backup pods, the two services, the claims, the
/// budget.
pub use policy_host_sdk::children::{pdb_kind, pod_kind, pvc_kind, service_kind};

pub mod backup_pod;
pub mod claims;
pub mod member;
pub mod object_store;
pub mod observed;
pub mod services;

pub use backup_pod::{SnapshotCause, backup_pod};
pub use claims::{backup_claim, member_claim};
pub use member::{
    ClusterState, MAX_LEARNERS, MemberPod, member_pod, runs_parallel_learners, with_image,
    with_restore,
};
pub use observed::ObservedChildren;
pub use services::{client_service, headless_service, pod_disruption_budget};

/// Label every child carries: `app.kubernetes.io/name: etcd`.
pub const LABEL_NAME: &str = "app.kubernetes.io/name";
/// Label every child carries: `app.kubernetes.io/instance: <cluster>`.
pub const LABEL_INSTANCE: &str = "app.kubernetes.io/instance";
/// Label every child carries: `app.kubernetes.io/managed-by: policy-host`.
pub const LABEL_MANAGED_BY: &str = "app.kubernetes.io/managed-by";
/// Label of member pods and claims: `etcd.database.coreos.com/member: <pod>`.
pub const LABEL_MEMBER: &str = "etcd.database.coreos.com/member";
/// The classic etcd-operator's label on every child but the backup pod: `app: etcd`. With
/// [`LABEL_CLASSIC_CLUSTER`] it selects a cluster's members (and Services) as tools, network
/// policies and monitors written for that operator do.
pub const LABEL_CLASSIC_APP: &str = "app";
/// The classic label `etcd_cluster: <cluster>`.
pub const LABEL_CLASSIC_CLUSTER: &str = "etcd_cluster";
/// The classic label of a member pod: `etcd_node: <pod>`.
pub const LABEL_CLASSIC_NODE: &str = "etcd_node";
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
/// Annotation of a member pod re-applied with a new image: when (RFC 3339, the kubelet's
/// clock) the etcd container it replaces had started. The restart is done once the container
/// runs the new image and started after that.
pub const ANNOTATION_REPLACES_STARTED: &str =
    "etcd.database.coreos.com/replaces-container-started-at";
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
            LABEL_CLASSIC_APP: "etcd",
            LABEL_CLASSIC_CLUSTER: self.name,
        })
    }

    fn selector(&self) -> Value {
        json!({ LABEL_NAME: "etcd", LABEL_INSTANCE: self.name })
    }

    fn member_labels(&self, pod: &str) -> Value {
        let mut labels = self.labels();
        labels[LABEL_MEMBER] = json!(pod);
        labels[LABEL_CLASSIC_NODE] = json!(pod);
        labels
    }
}

/// Every name and label value derived from the cluster's name, with the largest member
/// index (`spec.size` is at most 9): a cluster whose name makes one of them invalid is refused
/// before anything is applied.
pub const CHILD_NAMES: &[ChildName] = &[
    ChildName::service("{name}"),
    ChildName::service("{name}-client"),
    // Members find each other as `<pod>.<cluster>.<ns>.svc`: the pod name is its hostname
    // and the cluster name its subdomain, both DNS labels.
    ChildName::dns_label("Pod", "{name}-8"),
    ChildName::dns_label("Pod", "{name}-backup"),
    ChildName::object("PersistentVolumeClaim", "data-{name}-8"),
    ChildName::object("PersistentVolumeClaim", "backup-{name}"),
    ChildName::object("PodDisruptionBudget", "{name}"),
    ChildName::label_value(LABEL_INSTANCE, "{name}"),
    ChildName::label_value(LABEL_MEMBER, "{name}-8"),
];

/// Votes needed for a quorum among `voters` members.
pub fn quorum(voters: usize) -> usize {
    voters / 2 + 1
}

#[cfg(test)]
mod tests;
