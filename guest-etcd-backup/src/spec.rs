//! The `EtcdBackup` custom resource: the classic etcd-operator's backup API
//! (`etcd.database.coreos.com/v1beta2`), its status, what this plugin adds to both, and the
//! checked form of a spec.
//!
//! The doc comments on fields become the field descriptions of the generated CRD schema
//! (`cargo xtask crdgen`, feature `crd`).

use guest_etcd_core::classic::OtherStorages;
pub use guest_etcd_core::classic::S3Source;
use guest_etcd_core::spec::{
    Condition, DEFAULT_REPOSITORY, DEFAULT_VERSION, is_dns_subdomain, valid_mc_image,
};
use schemars::JsonSchema;
use serde::{Deserialize, Serialize};

/// How long a snapshot may take (save, restore, upload, serve) when
/// `spec.backupPolicy.timeoutInSecond` is not set.
pub const DEFAULT_TIMEOUT_SECONDS: i64 = 3_600;

/// A backup of an etcd cluster to S3, the classic etcd-operator's `EtcdBackup`.
#[allow(clippy::duplicated_attributes)]
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize, JsonSchema)]
#[cfg_attr(
    feature = "crd",
    derive(kube::CustomResource),
    kube(
        group = "etcd.database.coreos.com",
        version = "v1beta2",
        kind = "EtcdBackup",
        plural = "etcdbackups",
        namespaced,
        status = "EtcdBackupStatus",
        doc = "A verified snapshot of an etcd cluster in S3, taken by policy-host's etcd-backup plugin.",
        printcolumn(
            name = "Succeeded",
            type_ = "boolean",
            json_path = ".status.succeeded",
            description = "Whether the last snapshot was taken, verified and uploaded"
        ),
        printcolumn(
            name = "Revision",
            type_ = "integer",
            json_path = ".status.etcdRevision",
            description = "etcd revision of the last snapshot"
        ),
        printcolumn(
            name = "Location",
            type_ = "string",
            json_path = ".status.location",
            description = "Where the last snapshot is"
        ),
        printcolumn(
            name = "Last Success",
            type_ = "date",
            json_path = ".status.lastSuccessDate",
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
// Refused at `kubectl apply` (CEL): what the object shows by itself. `validate` checks it all
// again, with the names of buckets and Secrets.
#[schemars(extend("x-kubernetes-validations" = [
    {
        "rule": "!has(self.abs) && !has(self.gcs) && !has(self.oss) && has(self.storageType) && self.storageType.lowerAscii() == 's3'",
        "message": "only S3 (any S3-compatible store) is supported: write storageType: S3 and spec.s3; the classic abs, gcs and oss are not"
    },
    {
        "rule": "has(self.s3)",
        "message": "spec.s3 is missing: give path (<bucket>/<object>) and awsSecret"
    },
    {
        "rule": "has(self.etcdEndpoints) && size(self.etcdEndpoints) > 0 && (self.etcdEndpoints[0].startsWith('http://') || self.etcdEndpoints[0].startsWith('https://'))",
        "message": "spec.etcdEndpoints must start with the cluster's client URL, e.g. http://example-client:2379"
    }
]))]
pub struct EtcdBackupSpec {
    /// Client URLs of the cluster to back up, e.g. `http://example-client:2379` (its client
    /// Service). etcd takes a snapshot from one member: the first URL is used, so a Service
    /// URL, which reaches any live member, is the robust choice.
    #[serde(default)]
    pub etcd_endpoints: Vec<String>,
    /// Where the snapshot goes: `S3` (any S3-compatible store). The classic `ABS`, `GCS` and
    /// `OSS` are refused with a condition that says so.
    #[serde(default)]
    pub storage_type: String,
    /// The S3 object to write. With a backup interval each snapshot is
    /// `<object>_<UTC time>`, e.g. `prod/etcd.backup_20261125T153000Z`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub s3: Option<S3Source>,
    /// The classic operator's `abs`, `gcs` and `oss`: refused.
    #[serde(flatten)]
    pub other_storages: OtherStorages,
    /// A Secret with the client certificate etcd asks of its clients, with the classic
    /// operator's keys `etcd-client.crt`, `etcd-client.key` and `etcd-client-ca.crt`.
    #[serde(
        default,
        rename = "clientTLSSecret",
        skip_serializing_if = "Option::is_none"
    )]
    pub client_tls_secret: Option<String>,
    /// When and how long: one snapshot unless `backupIntervalInSecond` is set.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub backup_policy: Option<BackupPolicy>,
    /// Set it to a new value (e.g. the current time) to take another one-shot snapshot (not
    /// in the classic API, which took one per resource).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub trigger: Option<String>,
    /// The image whose `etcdctl`, `etcdutl` and `etcd` save, restore and serve the snapshot;
    /// defaults to the etcd image the EtcdCluster plugin runs by default (not in the classic
    /// API).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub image: Option<String>,
    /// The image running `mc` for the upload; defaults to a pinned `minio/mc` release (not in
    /// the classic API).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub mc_image: Option<String>,
}

/// When snapshots are taken, and how long one may take.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct BackupPolicy {
    /// How long one snapshot may take, from its Pod's creation to the upload verified
    /// (default 3600).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(extend("x-kubernetes-validations" = [{
        "rule": "self >= 0",
        "message": "spec.backupPolicy.timeoutInSecond must be a positive number of seconds (0: the default, 3600)"
    }]))]
    pub timeout_in_second: Option<i64>,
    /// Take a snapshot this often (seconds); unset or 0: one snapshot.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(extend("x-kubernetes-validations" = [{
        "rule": "self >= 0",
        "message": "spec.backupPolicy.backupIntervalInSecond must be a positive number of seconds, or 0 for one snapshot"
    }]))]
    pub backup_interval_in_second: Option<i64>,
    /// With an interval, the newest snapshots to keep in the bucket; older ones are removed
    /// by the next snapshot's Pod. Unset or 0: all are kept.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(extend("x-kubernetes-validations" = [{
        "rule": "self >= 0",
        "message": "spec.backupPolicy.maxBackups must be a positive number, or 0 to keep all"
    }]))]
    pub max_backups: Option<i64>,
}

/// What happened, as the classic operator reported it, plus what this plugin verified.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct EtcdBackupStatus {
    /// Whether the last snapshot was taken, restored, served and uploaded.
    #[serde(default)]
    pub succeeded: bool,
    /// Why the last snapshot failed, or why none is taken.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub reason: Option<String>,
    /// The version of the etcd that restored and served the last snapshot.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub etcd_version: Option<String>,
    /// The etcd revision the last snapshot holds.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub etcd_revision: Option<i64>,
    /// When the last snapshot succeeded (RFC 3339).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub last_success_date: Option<String>,
    /// `Running`, `Succeeded` or `Failed`: the last snapshot's progress.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub phase: Option<String>,
    /// `s3://<bucket>/<object>` of the last successful snapshot.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub location: Option<String>,
    /// Size in bytes of the last snapshot's database, as the etcd serving it reports.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub size: Option<i64>,
    /// etcd's `hashKV` of the last snapshot at its revision: equal to the source cluster's
    /// at that revision.
    #[serde(default, rename = "hashKV", skip_serializing_if = "Option::is_none")]
    pub hash_kv: Option<u32>,
    /// The `spec.trigger` the last one-shot snapshot was taken for (empty for the first).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub trigger: Option<String>,
    /// When the last scheduled snapshot was due (RFC 3339).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub last_scheduled_time: Option<String>,
    /// The objects of the scheduled snapshots kept (newest first), with `maxBackups`.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub backups: Vec<String>,
    /// `Succeeded`: whether the last snapshot succeeded, and why not.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub conditions: Vec<Condition>,
    /// The `metadata.generation` this status was computed for.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub observed_generation: Option<i64>,
}

/// The parent as the plugin reads it.
#[derive(Clone, Debug, Default, Deserialize)]
pub struct EtcdBackupObject {
    /// The spec, if it parses.
    #[serde(default)]
    pub spec: EtcdBackupSpec,
    /// The status last written.
    #[serde(default)]
    pub status: EtcdBackupStatus,
}

/// A checked spec.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct ValidBackup {
    /// The client URL the snapshot is taken from.
    pub endpoint: String,
    /// `http(s)://host[:port]` of the store.
    pub s3_endpoint: String,
    /// The bucket.
    pub bucket: String,
    /// The object (without the bucket), as written.
    pub object: String,
    /// The credentials Secret.
    pub credentials_secret: String,
    /// The client certificate Secret, if any.
    pub client_tls_secret: Option<String>,
    /// Seconds one snapshot may take.
    pub timeout_seconds: i64,
    /// Seconds between snapshots; `None`: one-shot.
    pub every_seconds: Option<i64>,
    /// Scheduled snapshots to keep; `None`: all.
    pub max_backups: Option<usize>,
    /// The on-demand trigger (empty for the first one-shot snapshot).
    pub trigger: String,
    /// The etcd image.
    pub image: String,
    /// The `mc` image.
    pub mc_image: String,
}

impl EtcdBackupSpec {
    /// Checks the spec; the error names the field and says what to write.
    pub fn validate(&self) -> Result<ValidBackup, String> {
        self.other_storages
            .refuse("storageType", &self.storage_type)?;
        let Some(s3) = &self.s3 else {
            return Err("spec.s3 is missing: give path (<bucket>/<object>) and awsSecret".into());
        };
        let endpoint = match self.etcd_endpoints.first().map(|e| e.trim()) {
            Some(url)
                if (url.starts_with("http://") || url.starts_with("https://"))
                    && !url.contains(char::is_whitespace)
                    && !url.contains(',') =>
            {
                url.to_owned()
            }
            Some(url) => {
                return Err(format!(
                    "spec.etcdEndpoints[0] {url:?} is not a client URL: write e.g. http://example-client:2379"
                ));
            }
            None => {
                return Err(
                    "spec.etcdEndpoints is empty: name the cluster's client URL, e.g. http://example-client:2379"
                        .into(),
                );
            }
        };
        let s3 = s3.validate("spec.s3")?;
        let client_tls_secret = match self.client_tls_secret.as_deref().map(str::trim) {
            None | Some("") => None,
            Some(secret) if is_dns_subdomain(secret) => Some(secret.to_owned()),
            Some(secret) => {
                return Err(format!(
                    "spec.clientTLSSecret {secret:?} is not a Secret name: name a Secret with etcd-client.crt, etcd-client.key and etcd-client-ca.crt"
                ));
            }
        };
        let policy = self.backup_policy.clone().unwrap_or_default();
        let timeout_seconds = match policy.timeout_in_second {
            None | Some(0) => DEFAULT_TIMEOUT_SECONDS,
            Some(t) if t > 0 => t,
            Some(t) => {
                return Err(format!(
                    "spec.backupPolicy.timeoutInSecond is {t}: give a positive number of seconds (default {DEFAULT_TIMEOUT_SECONDS})"
                ));
            }
        };
        let every_seconds = match policy.backup_interval_in_second {
            None | Some(0) => None,
            Some(every) if every > 0 => Some(every),
            Some(every) => {
                return Err(format!(
                    "spec.backupPolicy.backupIntervalInSecond is {every}: give a positive number of seconds, or 0 for one snapshot"
                ));
            }
        };
        let max_backups = match policy.max_backups {
            None | Some(0) => None,
            Some(max) if max > 0 => usize::try_from(max).ok(),
            Some(max) => {
                return Err(format!(
                    "spec.backupPolicy.maxBackups is {max}: give a positive number, or 0 to keep all"
                ));
            }
        };
        let image = match self.image.as_deref().map(str::trim) {
            None | Some("") => format!("{DEFAULT_REPOSITORY}:v{DEFAULT_VERSION}"),
            Some(image) if !image.contains(char::is_whitespace) => image.to_owned(),
            Some(image) => {
                return Err(format!(
                    "spec.image {image:?} is not an image: use e.g. {DEFAULT_REPOSITORY}:v{DEFAULT_VERSION}"
                ));
            }
        };
        Ok(ValidBackup {
            endpoint,
            s3_endpoint: s3.endpoint,
            bucket: s3.bucket,
            object: s3.object,
            credentials_secret: s3.credentials_secret,
            client_tls_secret,
            timeout_seconds,
            every_seconds,
            max_backups,
            trigger: self
                .trigger
                .as_deref()
                .unwrap_or_default()
                .trim()
                .to_owned(),
            image,
            mc_image: valid_mc_image("spec.mcImage", self.mc_image.as_deref())
                .map_err(|e| e.replace("spec.mcImage.image", "spec.mcImage"))?,
        })
    }
}

/// The CustomResourceDefinition for `EtcdBackup`, for `cargo xtask crdgen` (which writes it
/// as YAML to `deploy/crds/etcdbackup.yaml`).
#[cfg(feature = "crd")]
pub fn custom_resource_definition()
-> k8s_openapi::apiextensions_apiserver::pkg::apis::apiextensions::v1::CustomResourceDefinition {
    use kube::CustomResourceExt;
    EtcdBackup::crd()
}
