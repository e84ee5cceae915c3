//! The `MariaDBCluster` custom resource: spec and status types, and the CRD built from them.
//!
//! The doc comments on fields become the field descriptions of the generated CRD schema
//! (`cargo xtask crdgen`, feature `crd`).

use std::collections::BTreeMap;

pub use policy_host_sdk::conditions::Condition;
use schemars::JsonSchema;
use serde::{Deserialize, Serialize};

/// MariaDB version used when `spec.version` is not set: Debian 12's.
pub const DEFAULT_VERSION: &str = "10.11";

/// Most replicas besides the primary (nine servers in all).
pub const MAX_REPLICAS: i32 = 8;

fn default_version() -> String {
    DEFAULT_VERSION.to_owned()
}

fn default_replicas() -> i32 {
    2
}

fn default_storage_size() -> String {
    "1Gi".to_owned()
}

/// Desired state of a MariaDB primary with GTID replicas.
// Each printer column repeats `type_ = "string"`, which clippy takes for a duplicate.
#[allow(clippy::duplicated_attributes)]
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize, JsonSchema)]
#[cfg_attr(
    feature = "crd",
    derive(kube::CustomResource),
    kube(
        group = "mariadb.policy-host.io",
        version = "v1alpha1",
        kind = "MariaDBCluster",
        plural = "mariadbclusters",
        namespaced,
        status = "MariaDBClusterStatus",
        shortname = "mdb",
        doc = "A MariaDB primary and its GTID replicas, run by policy-host's mariadb plugin.",
        printcolumn(
            name = "Primary",
            type_ = "string",
            json_path = ".status.currentPrimary",
            description = "The server taking writes"
        ),
        printcolumn(
            name = "Ready",
            type_ = "integer",
            json_path = ".status.readyReplicas",
            description = "Replicas replicating from the primary"
        ),
        printcolumn(
            name = "Replicas",
            type_ = "integer",
            json_path = ".spec.replicas",
            description = "Replicas asked for, besides the primary"
        ),
        printcolumn(
            name = "Phase",
            type_ = "string",
            json_path = ".status.phase",
            description = "Creating, Healthy, FailingOver, SwitchingOver, Degraded or Paused"
        ),
        printcolumn(
            name = "Age",
            type_ = "date",
            json_path = ".metadata.creationTimestamp"
        )
    )
)]
#[serde(rename_all = "camelCase")]
pub struct MariaDBClusterSpec {
    /// Replicas besides the primary (0..8): `2` is three servers.
    #[serde(default = "default_replicas")]
    #[schemars(extend("x-kubernetes-validations" = [{
        "rule": "self >= 0 && self <= 8",
        "message": "spec.replicas must be 0 to 8 (the primary not counted)"
    }]))]
    pub replicas: i32,
    /// Stop changing the cluster while a human works on it: no command is sent to a server (no
    /// failover, switchover, promotion or repointing), and no child is written or deleted. The
    /// servers are still read, so the status keeps reporting what they say, with a `Paused`
    /// condition. Set it back to `false` to resume where it stopped.
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub paused: bool,
    /// MariaDB version (`10.11`); the image is `mariadb:<version>` unless `image` is set.
    /// Read when a server's Pod is created.
    #[serde(default = "default_version")]
    #[schemars(length(max = 32))]
    pub version: String,
    /// The image to run instead of `mariadb:<version>` (it must accept the official image's
    /// `MARIADB_*` environment). The admin's image grants still apply.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub image: Option<String>,
    /// The Secret (in the resource's namespace) holding the passwords: `root-password` (the
    /// plugin logs in as root) and `replication-password` (the `repl` account replicas use).
    /// Default `<name>-credentials`, which the shipped bundle grants and the host creates with
    /// random passwords when it is absent; any other name needs the admin's grant
    /// (`pack --grant-secret`). A Secret you create yourself must carry the label
    /// `mountable-by.policy-host.io/mariadb: "true"`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(length(min = 1, max = 253))]
    pub credentials_secret: Option<String>,
    /// Each server's data volume.
    #[serde(default)]
    pub storage: Storage,
    /// CPU and memory of each server's container, as a Pod's `resources`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub resources: Option<Resources>,
    /// Server options added under `[mariadb]` in every server's configuration, e.g.
    /// `max_connections: "500"`. A change (like a `version` or `image` change) restarts the
    /// servers one at a time: the replicas first, then the primary after a switchover to an
    /// updated replica. Options failover relies on (binary log, GTIDs, read-only, semi-sync,
    /// replication start, server identity) are the plugin's and refused here.
    #[serde(default, skip_serializing_if = "BTreeMap::is_empty")]
    #[schemars(extend("maxProperties" = 64))]
    pub config: BTreeMap<String, String>,
    /// Backups: a logical dump of every database but MariaDB's own (`mariadb-dump
    /// --single-transaction --gtid` from the primary) and of the applications' accounts and
    /// roles with their grants, each loaded into a throwaway server to prove it restores
    /// before it is listed in `status.backup`, kept on the claim `<name>-backups`. Unset:
    /// none are taken (the claim and its files stay).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub backup: Option<Backup>,
    /// Start a new cluster from a backup: its first server loads the file before it takes
    /// writes, and the other servers copy it from there. Read only while the cluster has never
    /// had a primary; leaving it set afterwards changes nothing.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub restore: Option<Restore>,
}

fn default_keep() -> i32 {
    3
}

/// When to take backups and how many to keep.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct Backup {
    /// Take one every this long (`6h`, `30m`, `1h30m`): the first at once, the next `every`
    /// after the previous was due; a period missed while the cluster had no primary is
    /// skipped, not caught up. Unset: none on a schedule.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(length(max = 32))]
    pub every: Option<String>,
    /// Change this to any new value to take one backup now (`kubectl patch … -p
    /// '{"spec":{"backup":{"trigger":"before-upgrade"}}}'`). The last value carried out is
    /// `status.backup.lastTrigger`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(length(max = 63))]
    pub trigger: Option<String>,
    /// How many backups the claim keeps (1..30): the oldest file goes when a newer one is
    /// proven.
    #[serde(default = "default_keep")]
    #[schemars(extend("x-kubernetes-validations" = [{
        "rule": "self >= 1 && self <= 30",
        "message": "spec.backup.keep must be 1 to 30"
    }]))]
    pub keep: i32,
    /// The claim `<name>-backups`; size it for `keep` dumps.
    #[serde(default)]
    pub storage: Storage,
    /// Also upload each proven backup to an S3-compatible store, as
    /// `<prefix><namespace>/<file>`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub s3: Option<S3Target>,
}

/// The `mc` image the uploads and downloads run when `image` is not set (the etcd plugins').
pub const DEFAULT_MC_IMAGE: &str = "minio/mc:RELEASE.2025-03-12T17-29-24Z";

/// An S3-compatible store backups are uploaded to.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct S3Target {
    /// The store's URL, `http://` or `https://` and a host (and port), e.g.
    /// `http://minio.backup.svc:9000`.
    pub endpoint: String,
    /// The bucket; it must exist.
    pub bucket: String,
    /// Prepended to each object name, e.g. `mariadb/` (a missing trailing `/` is added).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub prefix: Option<String>,
    /// A Secret in the cluster's namespace with `accessKeyID` and `secretAccessKey`, labelled
    /// `mountable-by.policy-host.io/mariadb: "true"`; neither key may contain `:`.
    pub credentials_secret: String,
    /// The image running `mc`; default a pinned `minio/mc` release (the bundle grants it).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub image: Option<String>,
}

impl S3Target {
    /// The prefix with its trailing `/` (empty for none).
    pub fn prefix(&self) -> String {
        match self.prefix.as_deref().map(str::trim) {
            None | Some("") => String::new(),
            Some(p) if p.ends_with('/') => p.to_owned(),
            Some(p) => format!("{p}/"),
        }
    }
}

/// One object in an S3-compatible store, to restore a new cluster from.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct S3Object {
    /// The store's URL, `http://` or `https://` and a host (and port).
    pub endpoint: String,
    /// The bucket holding the backup.
    pub bucket: String,
    /// The object's name: what follows the bucket in `status.backup.backups[].location`.
    pub key: String,
    /// A Secret in the cluster's namespace with `accessKeyID` and `secretAccessKey`, labelled
    /// `mountable-by.policy-host.io/mariadb: "true"`.
    pub credentials_secret: String,
    /// The image running `mc`; default a pinned `minio/mc` release.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub image: Option<String>,
}

/// The backup a new cluster starts from: a file on a claim (`claim` and `file`), or an object
/// in an S3-compatible store (`s3`).
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "camelCase")]
#[schemars(extend("x-kubernetes-validations" = [{
    "rule": "has(self.s3) != (has(self.claim) && has(self.file))",
    "message": "spec.restore takes either claim and file, or s3"
}]))]
pub struct Restore {
    /// The claim holding the backup, in this namespace: another cluster's `<name>-backups`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(length(min = 1, max = 253))]
    pub claim: Option<String>,
    /// The backup's file on that claim, as `status.backup.backups[].file` lists it
    /// (`<name>-20261128T232500Z.sql`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(length(min = 1, max = 253))]
    pub file: Option<String>,
    /// The backup's object in an S3-compatible store.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub s3: Option<S3Object>,
}

/// Server options the plugin sets itself (see [`crate::children::SERVER_CONFIG`]) or that
/// would break what failover relies on: refused in `spec.config`.
pub const RESERVED_OPTIONS: &[&str] = &[
    "log_bin",
    "log_slave_updates",
    "log_replica_updates",
    "binlog_format",
    "gtid_strict_mode",
    "gtid_domain_id",
    "read_only",
    "super_read_only",
    "skip_slave_start",
    "skip_replica_start",
    "relay_log",
    "relay_log_recovery",
    "sync_binlog",
    "innodb_flush_log_at_trx_commit",
    "server_id",
    "report_host",
    "port",
    "datadir",
    "socket",
    "bind_address",
    "skip_networking",
    "skip_grant_tables",
];

/// Longest value of one `spec.config` option.
pub const MAX_OPTION_VALUE: usize = 256;

/// A server's data volume.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct Storage {
    /// Size of each server's PersistentVolumeClaim (`1Gi`).
    #[serde(default = "default_storage_size")]
    pub size: String,
    /// StorageClass of the claims; the cluster's default when unset.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub storage_class_name: Option<String>,
}

impl Default for Storage {
    fn default() -> Self {
        Storage {
            size: default_storage_size(),
            storage_class_name: None,
        }
    }
}

/// Requests and limits of a server's container (`cpu`, `memory`).
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize, JsonSchema)]
pub struct Resources {
    /// What the scheduler reserves, e.g. `{cpu: 500m, memory: 1Gi}`.
    #[serde(default, skip_serializing_if = "BTreeMap::is_empty")]
    pub requests: BTreeMap<String, String>,
    /// The most the container may use.
    #[serde(default, skip_serializing_if = "BTreeMap::is_empty")]
    pub limits: BTreeMap<String, String>,
}

impl MariaDBClusterSpec {
    /// A spec with the defaults and the given credentials Secret.
    pub fn with_secret(secret: &str) -> Self {
        MariaDBClusterSpec {
            credentials_secret: Some(secret.to_owned()),
            ..MariaDBClusterSpec::default()
        }
    }

    /// The Secret holding the passwords of the cluster `name`.
    pub fn secret(&self, name: &str) -> String {
        self.credentials_secret
            .clone()
            .unwrap_or_else(|| format!("{name}-credentials"))
    }
}

impl Default for MariaDBClusterSpec {
    fn default() -> Self {
        MariaDBClusterSpec {
            replicas: default_replicas(),
            paused: false,
            version: default_version(),
            image: None,
            credentials_secret: None,
            storage: Storage::default(),
            resources: None,
            config: BTreeMap::new(),
            backup: None,
            restore: None,
        }
    }
}

impl MariaDBClusterSpec {
    /// The image the servers run.
    pub fn image(&self) -> String {
        self.image
            .clone()
            .unwrap_or_else(|| format!("mariadb:{}", self.version))
    }

    /// Why the spec cannot be run, as a message naming the field to fix.
    pub fn invalid(&self) -> Option<String> {
        if !(0..=MAX_REPLICAS).contains(&self.replicas) {
            return Some(format!(
                "spec.replicas is {}; set it between 0 and {MAX_REPLICAS} (the primary is not counted)",
                self.replicas
            ));
        }
        if self.credentials_secret.as_deref() == Some("") {
            return Some(
                "spec.credentialsSecret is empty; name the Secret holding root-password and replication-password, or leave it out for `<name>-credentials`".to_owned(),
            );
        }
        let parts: Vec<&str> = self.version.split('.').collect();
        if self.image.is_none()
            && (!(2..=3).contains(&parts.len()) || parts.iter().any(|p| p.parse::<u32>().is_err()))
        {
            return Some(format!(
                "spec.version `{}` is not a version like 10.11; fix spec.version",
                self.version
            ));
        }
        if let Some(backup) = &self.backup {
            if let Some(every) = &backup.every
                && policy_host_sdk::schedule::parse_duration(every).is_none()
            {
                return Some(format!(
                    "spec.backup.every `{every}` is not a duration like 6h, 30m or 1h30m; fix it or remove it"
                ));
            }
            if !(1..=MAX_BACKUPS_KEPT).contains(&backup.keep) {
                return Some(format!(
                    "spec.backup.keep is {}; keep 1 to {MAX_BACKUPS_KEPT} backups",
                    backup.keep
                ));
            }
        }
        if let Some(backup) = &self.backup
            && let Some(s3) = &backup.s3
            && let Some(why) = invalid_store("spec.backup.s3", &s3.endpoint, &s3.bucket)
        {
            return Some(why);
        }
        if let Some(restore) = &self.restore {
            return invalid_restore(restore);
        }
        self.config
            .iter()
            .find_map(|(key, value)| invalid_option(key, value))
    }
}

/// Why `spec.restore` cannot be read, naming the field to fix.
fn invalid_restore(restore: &Restore) -> Option<String> {
    match (&restore.claim, &restore.file, &restore.s3) {
        (Some(claim), Some(file), None) => {
            if !backup_file_name(file) {
                return Some(format!(
                    "spec.restore.file `{file}` is not a backup file name (letters, digits, `-`, `_`, `.`, ending in .sql, as status.backup.backups[].file lists it); fix it"
                ));
            }
            if !policy_host_sdk::names::NameRule::Dns1123Subdomain.accepts(claim) {
                return Some(format!(
                    "spec.restore.claim `{claim}` is not a claim name; name the claim holding the backup (another cluster's `<name>-backups`)"
                ));
            }
            None
        }
        (None, None, Some(s3)) => {
            let file = s3.key.rsplit('/').next().unwrap_or_default();
            if !backup_file_name(file) || s3.key.split('/').any(|part| part == "..") {
                return Some(format!(
                    "spec.restore.s3.key `{}` does not name a backup object (…/<name>-<time>.sql, as status.backup.backups[].location shows after the bucket); fix it",
                    s3.key
                ));
            }
            invalid_store("spec.restore.s3", &s3.endpoint, &s3.bucket)
        }
        _ => Some(
            "spec.restore takes either claim and file (a backup on a claim), or s3 (a backup in a store); set one of them".to_owned(),
        ),
    }
}

/// Whether `file` is a name a backup gets (letters, digits, `-`, `_`, `.`, ending in `.sql`).
fn backup_file_name(file: &str) -> bool {
    file.ends_with(".sql")
        && !file.starts_with('.')
        && file
            .chars()
            .all(|c| c.is_ascii_alphanumeric() || matches!(c, '-' | '_' | '.'))
}

/// Why an S3 store's endpoint or bucket cannot be used, naming `field`.
fn invalid_store(field: &str, endpoint: &str, bucket: &str) -> Option<String> {
    let host = endpoint
        .strip_prefix("http://")
        .or_else(|| endpoint.strip_prefix("https://"));
    if host.is_none_or(|h| h.is_empty() || h.contains(['/', '@', ' '])) {
        return Some(format!(
            "{field}.endpoint `{endpoint}` is not http:// or https:// and a host (and port); fix it"
        ));
    }
    let bucket_ok = (3..=63).contains(&bucket.len())
        && bucket
            .chars()
            .all(|c| c.is_ascii_lowercase() || c.is_ascii_digit() || matches!(c, '-' | '.'));
    if !bucket_ok {
        return Some(format!(
            "{field}.bucket `{bucket}` is not a bucket name (3 to 63 lower-case letters, digits, `-` and `.`); fix it"
        ));
    }
    None
}

/// Most backups one cluster keeps.
pub const MAX_BACKUPS_KEPT: i32 = 30;

/// Why `key: value` cannot go into the server configuration, naming the field to fix.
fn invalid_option(key: &str, value: &str) -> Option<String> {
    let well_formed = key.len() <= 64
        && key.starts_with(|c: char| c.is_ascii_lowercase())
        && key
            .chars()
            .all(|c| c.is_ascii_lowercase() || c.is_ascii_digit() || c == '_' || c == '-');
    if !well_formed {
        return Some(format!(
            "spec.config key `{key}` is not a MariaDB option name (lower-case letters, digits, `_` and `-`, at most 64); fix or remove it"
        ));
    }
    // MariaDB reads `-` and `_` alike in option names and takes the prefixes `loose-`,
    // `skip-`, `disable-`, `enable-` and `maximum-` on any option (`skip-log-bin`); a
    // `rpl_semi_sync_` option decides whether an acknowledged write is on a replica.
    let normalized = key.replace('-', "_");
    let mut names = vec![normalized.as_str()];
    let mut rest = normalized.as_str();
    while let Some(stripped) = ["loose_", "skip_", "disable_", "enable_", "maximum_"]
        .iter()
        .find_map(|prefix| rest.strip_prefix(prefix))
    {
        names.push(stripped);
        rest = stripped;
    }
    if names
        .iter()
        .any(|n| RESERVED_OPTIONS.contains(n) || n.starts_with("rpl_semi_sync_"))
    {
        return Some(format!(
            "spec.config sets `{key}`, which the plugin sets itself (replication and failover rely on it); remove it from spec.config"
        ));
    }
    if value.len() > MAX_OPTION_VALUE || value.contains(['\n', '\r']) {
        return Some(format!(
            "spec.config `{key}` has a value longer than {MAX_OPTION_VALUE} characters or spanning lines; give it one short line"
        ));
    }
    None
}

/// One replica as the plugin last saw it.
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct ReplicaState {
    /// Pod name.
    pub name: String,
    /// `Replicating`, `Stopped` (replication threads not both running), `Errant` (holds
    /// transactions the primary lacks; quarantined), `Unreachable`.
    pub state: String,
    /// `@@gtid_current_pos`: what the server has executed.
    #[serde(default, skip_serializing_if = "String::is_empty")]
    pub gtid_current_pos: String,
    /// `Gtid_IO_Pos`: what it has retrieved from the primary.
    #[serde(default, skip_serializing_if = "String::is_empty")]
    pub gtid_io_pos: String,
}

/// One backup on the claim, proven to restore.
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct BackupRecord {
    /// The file on the claim `<name>-backups`: what `spec.restore.file` names.
    pub file: String,
    /// When it was taken (RFC 3339).
    #[serde(default)]
    pub taken_at: String,
    /// The GTID position it ends at (`@@gtid_binlog_pos` of its consistent snapshot).
    #[serde(default, skip_serializing_if = "String::is_empty")]
    pub gtid: String,
    /// Its size in bytes.
    #[serde(default)]
    pub bytes: i64,
    /// Tables and rows the throwaway server held after loading it.
    #[serde(default)]
    pub tables: i64,
    /// See `tables`.
    #[serde(default)]
    pub rows: i64,
    /// The applications' accounts it holds (not root, the replication account or MariaDB's
    /// own), counted in the loaded copy; absent in a record of an earlier plugin version.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub accounts: Option<i64>,
    /// What it was taken for: `trigger:<value>` or `scheduled`.
    #[serde(default)]
    pub reason: String,
    /// Where it was uploaded, with `spec.backup.s3`: `s3://<bucket>/<object>`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub location: Option<String>,
}

/// What the plugin knows of the backups, newest first.
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct BackupStatus {
    /// The backups kept on the claim, newest first.
    #[serde(default)]
    pub backups: Vec<BackupRecord>,
    /// The last `spec.backup.trigger` carried out (taken, or failed: set a new value to try
    /// again).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub last_trigger: Option<String>,
    /// When the last scheduled backup was due (RFC 3339).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub last_scheduled_time: Option<String>,
    /// When the next scheduled backup is due (RFC 3339).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub next_scheduled_time: Option<String>,
    /// Why the last backup failed, if it did (cleared by the next that succeeds).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub last_failure: Option<String>,
}

/// Observed state, written by the plugin.
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct MariaDBClusterStatus {
    /// The server taking writes: the `-primary` Service points at it.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub current_primary: Option<String>,
    /// The primary's `@@gtid_binlog_pos` when last seen.
    #[serde(default, skip_serializing_if = "String::is_empty")]
    pub primary_gtid_pos: String,
    /// Every other server, by name.
    #[serde(default)]
    pub replicas: Vec<ReplicaState>,
    /// Replicas replicating from the primary with both threads running.
    #[serde(default)]
    pub ready_replicas: i32,
    /// Replicas holding transactions the primary lacks: out of the `-replicas` Service and
    /// never promoted. Delete such a server's Pod and PersistentVolumeClaim to rebuild it.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub errant_replicas: Vec<String>,
    /// The last switchover request carried out (the annotation's value), so it is not
    /// carried out again.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub last_switchover: Option<String>,
    /// `Creating`, `Healthy`, `FailingOver`, `SwitchingOver`, `Degraded` or `Paused`.
    #[serde(default)]
    pub phase: String,
    /// Backups taken and proven, and the schedule's state; absent before the first.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub backup: Option<BackupStatus>,
    /// The backup this cluster started from (`<claim>/<file>`), once its first primary holds it.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub restored_from: Option<String>,
    /// The `metadata.generation` this status was computed from.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub observed_generation: Option<i64>,
    /// `Available` (the primary takes writes), `Progressing` (servers starting, catching up,
    /// a failover or switchover under way), `Degraded` (a spec that cannot run, a lost
    /// primary, an errant replica, fewer replicas than asked).
    #[serde(default)]
    pub conditions: Vec<Condition>,
}

/// The CRD, from the types above.
#[cfg(feature = "crd")]
pub fn custom_resource_definition()
-> k8s_openapi::apiextensions_apiserver::pkg::apis::apiextensions::v1::CustomResourceDefinition {
    use kube::CustomResourceExt;
    MariaDBCluster::crd()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn spec_validation_table() {
        let base = MariaDBClusterSpec::with_secret("db-auth");
        let rows = [
            ("the default spec runs", base.clone(), None),
            (
                "a lone primary runs",
                MariaDBClusterSpec {
                    replicas: 0,
                    ..base.clone()
                },
                None,
            ),
            (
                "nine replicas is refused",
                MariaDBClusterSpec {
                    replicas: 9,
                    ..base.clone()
                },
                Some("spec.replicas"),
            ),
            (
                "a negative count is refused",
                MariaDBClusterSpec {
                    replicas: -1,
                    ..base.clone()
                },
                Some("spec.replicas"),
            ),
            (
                "an empty credentials Secret name is refused",
                MariaDBClusterSpec::with_secret(""),
                Some("spec.credentialsSecret"),
            ),
            (
                "no credentials Secret named is `<name>-credentials`",
                MariaDBClusterSpec::default(),
                None,
            ),
            (
                "a version that is not x.y is refused",
                MariaDBClusterSpec {
                    version: "latest".into(),
                    ..base.clone()
                },
                Some("spec.version"),
            ),
            (
                "an image of one's own makes the version unread",
                MariaDBClusterSpec {
                    version: "latest".into(),
                    image: Some("registry.example/mariadb:10.11.6".into()),
                    ..base.clone()
                },
                None,
            ),
            (
                "a server option of one's own runs",
                MariaDBClusterSpec {
                    config: [("max_connections".to_owned(), "500".to_owned())].into(),
                    ..base.clone()
                },
                None,
            ),
            (
                "an option failover relies on is refused, however it is spelled",
                MariaDBClusterSpec {
                    config: [("log-bin".to_owned(), "OFF".to_owned())].into(),
                    ..base.clone()
                },
                Some("spec.config sets `log-bin`"),
            ),
            (
                "an option turned off by its prefix is refused",
                MariaDBClusterSpec {
                    config: [("loose-skip-log-bin".to_owned(), String::new())].into(),
                    ..base.clone()
                },
                Some("spec.config sets"),
            ),
            (
                "a semi-sync option is refused",
                MariaDBClusterSpec {
                    config: [("rpl_semi_sync_master_timeout".to_owned(), "10".to_owned())].into(),
                    ..base.clone()
                },
                Some("spec.config sets"),
            ),
            (
                "an option name that could inject a section is refused",
                MariaDBClusterSpec {
                    config: [("[client]".to_owned(), "x".to_owned())].into(),
                    ..base.clone()
                },
                Some("spec.config key"),
            ),
            (
                "a value spanning lines is refused",
                MariaDBClusterSpec {
                    config: [("max_connections".to_owned(), "5\nread_only=OFF".to_owned())].into(),
                    ..base.clone()
                },
                Some("one short line"),
            ),
        ];
        for (situation, spec, want) in rows {
            let got = spec.invalid();
            match want {
                None => assert_eq!(got, None, "{situation}"),
                Some(field) => assert!(
                    got.as_deref().is_some_and(|m| m.contains(field)),
                    "{situation}: {got:?}"
                ),
            }
        }
    }

    #[cfg(feature = "crd")]
    #[test]
    fn the_crd_has_its_printer_columns_and_short_name() {
        let crd = custom_resource_definition();
        assert_eq!(crd.spec.names.short_names, Some(vec!["mdb".to_owned()]));
        let columns = crd.spec.versions[0]
            .additional_printer_columns
            .clone()
            .unwrap_or_default();
        let names: Vec<_> = columns.iter().map(|c| c.name.as_str()).collect();
        assert_eq!(names, ["Primary", "Ready", "Replicas", "Phase", "Age"]);
    }
}
