//! The `EtcdRestore` custom resource: the classic etcd-operator's restore API
//! (`etcd.database.coreos.com/v1beta2`), its status, and what this plugin adds to both.
//!
//! The doc comments on fields become the field descriptions of the generated CRD schema
//! (`cargo xtask crdgen`, feature `crd`).

pub use guest_etcd_core::classic::S3Source;
use guest_etcd_core::classic::{OtherStorages, ValidS3Object};
use guest_etcd_core::spec::{Condition, EtcdClusterSpec, is_dns_subdomain};
use schemars::JsonSchema;
use serde::{Deserialize, Serialize};
use serde_json::{Value, json};

/// A new etcd cluster started from a snapshot in S3, the classic etcd-operator's
/// `EtcdRestore`.
#[allow(clippy::duplicated_attributes)]
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize, JsonSchema)]
#[cfg_attr(
    feature = "crd",
    derive(kube::CustomResource),
    kube(
        group = "etcd.database.coreos.com",
        version = "v1beta2",
        kind = "EtcdRestore",
        plural = "etcdrestores",
        namespaced,
        status = "EtcdRestoreStatus",
        doc = "An EtcdCluster started from a snapshot in S3 by policy-host's etcd-restore plugin.",
        printcolumn(
            name = "Cluster",
            type_ = "string",
            json_path = ".spec.etcdCluster.name",
            description = "The EtcdCluster restored"
        ),
        printcolumn(
            name = "Succeeded",
            type_ = "boolean",
            json_path = ".status.succeeded",
            description = "Whether the restored cluster runs with all its members ready"
        ),
        printcolumn(
            name = "Phase",
            type_ = "string",
            json_path = ".status.phase",
            description = "Restoring, Succeeded or Failed"
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
// again, with the names of buckets and Secrets, and the cluster spec.
#[schemars(extend("x-kubernetes-validations" = [
    {
        "rule": "!has(self.abs) && !has(self.gcs) && !has(self.oss) && has(self.backupStorageType) && self.backupStorageType.lowerAscii() == 's3'",
        "message": "only S3 (any S3-compatible store) is supported: write backupStorageType: S3 and spec.s3; the classic abs, gcs and oss are not"
    },
    {
        "rule": "has(self.s3)",
        "message": "spec.s3 is missing: give path (<bucket>/<object>) and awsSecret"
    },
    {
        "rule": "has(self.etcdCluster) && has(self.etcdCluster.name) && size(self.etcdCluster.name) > 0",
        "message": "spec.etcdCluster.name is missing: name the EtcdCluster to create, e.g. example-etcd-cluster"
    }
]))]
pub struct EtcdRestoreSpec {
    /// The EtcdCluster to create from the snapshot. It must not exist: the classic operator
    /// deleted and replaced an existing one, policy-host never deletes a cluster it did not
    /// create, and refuses a name already taken. Read when the restore starts: it cannot
    /// change afterwards.
    #[serde(default)]
    #[schemars(extend("x-kubernetes-validations" = [{
        "rule": "self == oldSelf",
        "message": "spec.etcdCluster cannot change: the restore creates that cluster once; to restore into another, create another EtcdRestore"
    }]))]
    pub etcd_cluster: EtcdClusterRef,
    /// Where the snapshot is: `S3` (any S3-compatible store). The classic `ABS`, `GCS` and
    /// `OSS` are refused with a condition that says so.
    #[serde(default)]
    pub backup_storage_type: String,
    /// The S3 object holding the snapshot, e.g. an `EtcdBackup`'s `status.location` less
    /// `s3://`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub s3: Option<S3Source>,
    /// The classic operator's `abs`, `gcs` and `oss`: refused.
    #[serde(flatten)]
    pub other_storages: OtherStorages,
    /// The restored cluster's spec, as an EtcdCluster's (`size`, `version`, `storage`, ...;
    /// default `size: 3` and the default version), without `restore`, which this resource
    /// sets. The classic operator copied the replaced cluster's spec; here it is written
    /// (not in the classic API).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(schema_with = "guest_etcd_core::spec::any_object")]
    pub cluster_spec: Option<Value>,
}

/// The classic `EtcdClusterRef`.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
pub struct EtcdClusterRef {
    /// The EtcdCluster's name, in this namespace.
    #[serde(default)]
    pub name: String,
}

/// What happened, as the classic operator reported it, plus a phase and a condition.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct EtcdRestoreStatus {
    /// Whether the restored cluster runs with all its members ready.
    #[serde(default)]
    pub succeeded: bool,
    /// What the restore waits for, or why it failed.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub reason: Option<String>,
    /// `Restoring`, `Succeeded` or `Failed`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub phase: Option<String>,
    /// `Succeeded`: whether the restored cluster runs, and why not yet.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub conditions: Vec<Condition>,
    /// The `metadata.generation` this status was computed for.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub observed_generation: Option<i64>,
}

/// The parent as the plugin reads it.
#[derive(Clone, Debug, Default, Deserialize)]
pub struct EtcdRestoreObject {
    /// The spec.
    #[serde(default)]
    pub spec: EtcdRestoreSpec,
    /// The status last written.
    #[serde(default)]
    pub status: EtcdRestoreStatus,
}

/// A checked spec: the cluster to create, and its spec with `restore.s3` set.
#[derive(Clone, Debug, PartialEq)]
pub struct ValidRestore {
    /// The EtcdCluster's name.
    pub cluster: String,
    /// Its spec, restoring from the S3 object.
    pub cluster_spec: Value,
    /// The object, for messages.
    pub source: ValidS3Object,
}

impl EtcdRestoreSpec {
    /// Checks the spec; the error names the field and says what to write.
    pub fn validate(&self) -> Result<ValidRestore, String> {
        let cluster = self.etcd_cluster.name.trim();
        if cluster.is_empty()
            || cluster.len() > 63
            || !is_dns_subdomain(cluster)
            || cluster.contains('.')
        {
            return Err(format!(
                "spec.etcdCluster.name {cluster:?} is not a cluster name: write a DNS label such as example-etcd-cluster"
            ));
        }
        self.other_storages
            .refuse("backupStorageType", &self.backup_storage_type)?;
        let Some(s3) = &self.s3 else {
            return Err("spec.s3 is missing: give path (<bucket>/<object>) and awsSecret".into());
        };
        let source = s3.validate("spec.s3")?;
        let mut cluster_spec = match &self.cluster_spec {
            None => json!({"size": 3}),
            Some(Value::Object(spec)) => Value::Object(spec.clone()),
            Some(other) => {
                return Err(format!(
                    "spec.clusterSpec is {other}, not an object: write an EtcdCluster spec, e.g. {{size: 3, version: 3.6.16}}"
                ));
            }
        };
        if cluster_spec.get("restore").is_some() {
            return Err(
                "spec.clusterSpec.restore is set by the EtcdRestore from spec.s3: remove it".into(),
            );
        }
        if cluster_spec.get("size").is_none() {
            cluster_spec["size"] = json!(3);
        }
        cluster_spec["restore"] = json!({"s3": {
            "endpoint": source.endpoint,
            "bucket": source.bucket,
            "key": source.object,
            "credentialsSecret": source.credentials_secret,
        }});
        // The EtcdCluster plugin's own checks, so a wrong spec is refused here, named as this
        // resource's field, rather than by a cluster that never starts.
        let typed: EtcdClusterSpec = serde_json::from_value(cluster_spec.clone())
            .map_err(|e| format!("spec.clusterSpec is not an EtcdCluster spec: {e}"))?;
        typed
            .validate()
            .map_err(|e| format!("spec.clusterSpec: {}", e.replacen("spec.", "", 1)))?;
        Ok(ValidRestore {
            cluster: cluster.to_owned(),
            cluster_spec,
            source,
        })
    }
}

/// The CustomResourceDefinition for `EtcdRestore`, for `cargo xtask crdgen` (which writes it
/// as YAML to `deploy/crds/etcdrestore.yaml`).
#[cfg(feature = "crd")]
pub fn custom_resource_definition()
-> k8s_openapi::apiextensions_apiserver::pkg::apis::apiextensions::v1::CustomResourceDefinition {
    use kube::CustomResourceExt;
    EtcdRestore::crd()
}
