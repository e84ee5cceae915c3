//! The classic etcd-operator's spec fields (coreos/etcd-operator, `v1beta2` `ClusterSpec` and
//! `PodPolicy`): each is mapped onto this plugin's own, refused with what to do, or accepted and
//! named as ignored. None is dropped silently: the CRD declares them all, so the API server no
//! longer prunes them out of a migrated manifest.
//!
//! | classic field | here |
//! |---|---|
//! | `size`, `version`, `repository`, `paused` | the same fields |
//! | `pod.nodeSelector`, `pod.affinity`, `pod.tolerations`, `pod.resources` | the same fields |
//! | `pod.antiAffinity: true` | a required pod anti-affinity over hostnames among the cluster's members (what the classic operator set), unless `pod.affinity` is given |
//! | `pod.labels`, `pod.annotations` | on the member pods; keys the plugin uses are refused |
//! | `pod.etcdEnv` | environment of the etcd container; variables that would override the plugin's flags are refused |
//! | `pod.securityContext` | the member pods' security context |
//! | `pod.persistentVolumeClaimSpec` | `storage` (its `resources.requests.storage` and `storageClassName`) |
//! | `TLS.static` | refused: its Secrets use the classic key names, which the host does not read; see [`TLS_STATIC_REFUSED`] |
//! | `pod.busyboxImage`, `pod.DNSTimeoutInSecond` | ignored: no DNS-wait init container is needed here (etcd retries its peers itself) |
//! | `pod.ClusterDomain` | ignored: member URLs are `<pod>.<cluster>.<namespace>.svc`, resolved through the pod's search path |

use std::collections::BTreeMap;

use schemars::JsonSchema;
use serde::{Deserialize, Serialize};
use serde_json::Value;

use crate::spec::{EtcdClusterSpec, Quantity, StorageSpec};

/// The classic `spec.TLS`. Its `static` is refused at `kubectl apply` already (the rule below)
/// and again by [`read`], for an object stored before the rule existed.
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize, JsonSchema)]
#[schemars(extend("x-kubernetes-validations" = [{
    "rule": "!has(self.static)",
    "message": "spec.TLS.static is the classic operator's TLS, whose Secrets hold peer.crt, server.crt and etcd-client.crt (with their keys and CAs): copy each into a Secret with ca.crt, tls.crt and tls.key, set spec.tls (peerSecret, serverSecret, operatorSecret) and remove spec.TLS"
}]))]
pub struct ClassicTls {
    /// `TLS.static`: Secrets made by hand for members and the operator.
    #[serde(default, rename = "static", skip_serializing_if = "Option::is_none")]
    pub static_tls: Option<ClassicStaticTls>,
}

/// The classic `spec.TLS.static`.
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct ClassicStaticTls {
    /// Secrets of the member pods.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub member: Option<ClassicMemberSecrets>,
    /// The Secret the operator talked to members with (`etcd-client.crt`, `etcd-client.key`,
    /// `etcd-client-ca.crt`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub operator_secret: Option<String>,
}

/// The classic `spec.TLS.static.member`.
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct ClassicMemberSecrets {
    /// Peer certificates (`peer.crt`, `peer.key`, `peer-ca.crt`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub peer_secret: Option<String>,
    /// Client-port certificates (`server.crt`, `server.key`, `server-ca.crt`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub server_secret: Option<String>,
}

/// Why `spec.TLS.static` is refused, and what to do instead.
pub const TLS_STATIC_REFUSED: &str = "spec.TLS.static is the classic operator's TLS, whose Secrets hold peer.crt/peer.key/peer-ca.crt, server.crt/server.key/server-ca.crt and etcd-client.crt/etcd-client.key/etcd-client-ca.crt; this operator reads kubernetes.io/tls Secrets (ca.crt, tls.crt, tls.key): create one Secret per role with those keys (e.g. kubectl create secret generic <name> --from-file=ca.crt=peer-ca.crt --from-file=tls.crt=peer.crt --from-file=tls.key=peer.key), set spec.tls.peerSecret, serverSecret and operatorSecret, and remove spec.TLS. Nothing was created, so the cluster does not start without TLS";

/// Label keys the plugin sets on member pods, and the classic operator's reserved ones.
fn reserved_label(key: &str) -> bool {
    key == "app"
        || key.starts_with("etcd_")
        || key.starts_with("app.kubernetes.io/")
        || key.starts_with("etcd.database.coreos.com/")
        || key.starts_with("policy-host.io/")
}

/// Annotation keys the plugin or the host use.
fn reserved_annotation(key: &str) -> bool {
    key.starts_with("etcd.database.coreos.com/") || key.starts_with("policy-host.io/")
}

/// Environment variables that would override a flag the plugin sets (etcd reads `ETCD_<FLAG>`),
/// or the pod IP the flags are built from.
fn reserved_env(name: &str) -> bool {
    name == "POD_IP"
        || name == "ETCD_NAME"
        || name == "ETCD_DATA_DIR"
        || name == "ETCD_MAX_LEARNERS"
        || [
            "ETCD_LISTEN_",
            "ETCD_ADVERTISE_",
            "ETCD_INITIAL_",
            "ETCD_PEER_",
            "ETCD_CERT_",
            "ETCD_KEY_",
            "ETCD_TRUSTED_",
            "ETCD_CLIENT_CERT_",
        ]
        .iter()
        .any(|prefix| name.starts_with(prefix))
}

/// What the classic fields add to the member pods.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct ClassicPod {
    /// Extra labels of the member pods.
    pub labels: BTreeMap<String, String>,
    /// Annotations of the member pods.
    pub annotations: BTreeMap<String, String>,
    /// Extra environment of the etcd container, as written.
    pub env: Vec<Value>,
    /// The member pods' `securityContext`, as written.
    pub security_context: Option<Value>,
    /// The classic `antiAffinity: true` (and no `affinity`): spread members over nodes.
    pub anti_affinity: bool,
}

/// The classic fields of `spec` made into this plugin's terms: the pod additions, the storage
/// `persistentVolumeClaimSpec` stands for, and the fields accepted without a meaning here
/// (`field: why`). An error names the field and says what to write.
pub fn read(
    spec: &EtcdClusterSpec,
) -> Result<(ClassicPod, Option<StorageSpec>, Vec<String>), String> {
    if spec
        .classic_tls
        .as_ref()
        .is_some_and(|t| t.static_tls.is_some())
    {
        return Err(TLS_STATIC_REFUSED.to_owned());
    }
    let mut ignored = Vec::new();
    let Some(pod) = &spec.pod else {
        return Ok((ClassicPod::default(), None, ignored));
    };
    if let Some(key) = pod.labels.keys().find(|k| reserved_label(k)) {
        return Err(format!(
            "spec.pod.labels has {key:?}: app, etcd_* and the app.kubernetes.io/, etcd.database.coreos.com/ and policy-host.io/ keys are the operator's; use another key"
        ));
    }
    if let Some(key) = pod.annotations.keys().find(|k| reserved_annotation(k)) {
        return Err(format!(
            "spec.pod.annotations has {key:?}: etcd.database.coreos.com/ and policy-host.io/ annotations are the operator's; use another key"
        ));
    }
    for variable in &pod.etcd_env {
        let name = variable["name"].as_str().unwrap_or_default();
        if name.is_empty() {
            return Err(
                "spec.pod.etcdEnv has an entry without a name: give each {name, value}".to_owned(),
            );
        }
        if reserved_env(name) {
            return Err(format!(
                "spec.pod.etcdEnv sets {name}, which would override how the operator starts members (their names, URLs, data directory, cluster membership or TLS); remove it"
            ));
        }
    }
    let storage = match &pod.persistent_volume_claim_spec {
        None => None,
        Some(_) if spec.storage.is_some() => {
            return Err("spec.pod.persistentVolumeClaimSpec and spec.storage both ask for member volumes: keep spec.storage (size, storageClassName) and remove the other".to_owned());
        }
        Some(claim) => {
            let size = claim["resources"]["requests"]["storage"]
                .as_str()
                .map(str::to_owned)
                .or_else(|| claim["resources"]["requests"]["storage"].as_u64().map(|n| n.to_string()))
                .ok_or_else(|| {
                    "spec.pod.persistentVolumeClaimSpec has no resources.requests.storage: give the size of each member's volume, e.g. 1Gi (or use spec.storage.size)".to_owned()
                })?;
            Some(StorageSpec {
                size: Quantity(size),
                storage_class_name: claim["storageClassName"].as_str().map(str::to_owned),
            })
        }
    };
    if pod.busybox_image.is_some() {
        ignored.push("spec.pod.busyboxImage: no DNS-wait init container is needed here (etcd retries its peers itself)".to_owned());
    }
    if pod.dns_timeout_in_second.is_some() {
        ignored.push(
            "spec.pod.DNSTimeoutInSecond: no DNS-wait init container is needed here".to_owned(),
        );
    }
    if pod.cluster_domain.as_deref().is_some_and(|d| !d.is_empty()) {
        ignored.push("spec.pod.ClusterDomain: member URLs are <pod>.<cluster>.<namespace>.svc, resolved through the pod's DNS search path".to_owned());
    }
    Ok((
        ClassicPod {
            labels: pod.labels.clone(),
            annotations: pod.annotations.clone(),
            env: pod.etcd_env.clone(),
            security_context: pod.security_context.clone(),
            anti_affinity: pod.anti_affinity && pod.affinity.is_none(),
        },
        storage,
        ignored,
    ))
}

/// The S3 endpoint used when a classic S3 source names none: AWS, as for the classic operator.
pub const DEFAULT_S3_ENDPOINT: &str = "https://s3.amazonaws.com";

/// The classic operator's S3 object (`EtcdBackup`'s `spec.s3`, `EtcdRestore`'s `spec.s3`).
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct S3Source {
    /// `<bucket>/<object>`, e.g. `etcd-backups/prod/etcd.backup`.
    pub path: String,
    /// A Secret in this namespace with `accessKeyID` and `secretAccessKey`. The classic
    /// operator read AWS `credentials` and `config` files from it; those are not read here:
    /// add the two keys beside them.
    #[serde(rename = "awsSecret")]
    pub aws_secret: String,
    /// The store's URL, `http://` or `https://` and a host (and port); default
    /// `https://s3.amazonaws.com`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub endpoint: Option<String>,
    /// Accepted for compatibility; `mc` chooses path-style or virtual-host requests by itself
    /// (path-style for any endpoint that is not AWS).
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub force_path_style: bool,
}

/// A checked [`S3Source`].
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct ValidS3Object {
    /// `http(s)://host[:port]` of the store.
    pub endpoint: String,
    /// The bucket.
    pub bucket: String,
    /// The object, without the bucket.
    pub object: String,
    /// The credentials Secret.
    pub credentials_secret: String,
}

impl S3Source {
    /// Checks the source found at `field` (e.g. `spec.s3`); the error names the field and
    /// says what to write.
    pub fn validate(&self, field: &str) -> Result<ValidS3Object, String> {
        let (bucket, object) = self
            .path
            .trim()
            .trim_start_matches('/')
            .split_once('/')
            .filter(|(_, object)| !object.is_empty() && !object.ends_with('/'))
            .ok_or_else(|| {
                format!(
                    "{field}.path {:?} is not <bucket>/<object>: write e.g. etcd-backups/prod/etcd.backup",
                    self.path
                )
            })?;
        if !crate::spec::is_dns_subdomain(&self.aws_secret) {
            return Err(format!(
                "{field}.awsSecret {:?} is not a Secret name: name a Secret in this namespace with accessKeyID and secretAccessKey",
                self.aws_secret
            ));
        }
        Ok(ValidS3Object {
            endpoint: crate::spec::valid_endpoint(
                field,
                self.endpoint.as_deref().unwrap_or(DEFAULT_S3_ENDPOINT),
            )?,
            bucket: crate::spec::valid_bucket(field, bucket)?,
            object: object.to_owned(),
            credentials_secret: self.aws_secret.clone(),
        })
    }
}

/// The classic operator's storages other than S3 (`abs`, `gcs`, `oss` of `EtcdBackup` and
/// `EtcdRestore`): declared, so the API server keeps them in a migrated manifest, and refused.
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize, JsonSchema)]
pub struct OtherStorages {
    /// The classic operator's Azure Blob Storage source: refused (only S3 is supported).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(schema_with = "crate::spec::any_object")]
    pub abs: Option<Value>,
    /// The classic operator's Google Cloud Storage source: refused (only S3 is supported).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(schema_with = "crate::spec::any_object")]
    pub gcs: Option<Value>,
    /// The classic operator's Alibaba OSS source: refused (only S3 is supported).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(schema_with = "crate::spec::any_object")]
    pub oss: Option<Value>,
}

impl OtherStorages {
    /// Refuses any of these storages that is set, and a storage type (at `type_field`) that
    /// is not S3.
    pub fn refuse(&self, type_field: &str, storage_type: &str) -> Result<(), String> {
        for (field, set) in [
            ("abs", self.abs.is_some()),
            ("gcs", self.gcs.is_some()),
            ("oss", self.oss.is_some()),
        ] {
            if set {
                return Err(format!(
                    "spec.{field} is the classic operator's storage that policy-host does not use: write {type_field}: S3 and spec.s3 (any S3-compatible store)"
                ));
            }
        }
        if storage_type.eq_ignore_ascii_case("s3") {
            Ok(())
        } else {
            Err(format!(
                "spec.{type_field} {storage_type:?} is not supported: write {type_field}: S3 and spec.s3"
            ))
        }
    }
}
