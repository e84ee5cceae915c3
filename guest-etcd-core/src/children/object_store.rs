//! S3-compatible object stores: the `mc` containers that upload a verified snapshot and
//! download one for a restore, the object names and the credentials they are given.
//!
//! `mc` (the MinIO client) speaks to any S3-compatible store and reads a whole alias from one
//! variable, `MC_HOST_<alias>=<scheme>://<access key>:<secret key>@<host>`. The keys come
//! from the credentials Secret through `secretKeyRef` and are composed into that variable by
//! Kubernetes' `$(VAR)` expansion of env values, so the Pod spec never holds them and no
//! shell is needed (the default etcd image has none; the `mc` image's is not relied on).

use serde_json::{Value, json};

use super::{ANNOTATION_LOCATION, BACKUP_MOUNT, ClusterRef, RESTORE_CONTAINER, RESTORE_MOUNT};
use crate::spec::{S3RestoreSpec, ValidS3};

/// The backup Pod's init container that uploads the snapshot, after it restored.
pub const UPLOAD_CONTAINER: &str = "upload";
/// The restoring seed member's init container that downloads the snapshot.
pub const DOWNLOAD_CONTAINER: &str = "download";
/// The `mc` alias of the store, as in `s3/<bucket>/<object>`.
const ALIAS: &str = "s3";
/// Where the upload's `mc` keeps its configuration: a scratch `emptyDir`, because `mc`
/// writes one at start and the image's home may be read-only.
const MC_CONFIG_MOUNT: &str = "/mc";
/// The credentials Secret's key holding the access key ID.
pub const ACCESS_KEY_ID: &str = "accessKeyID";
/// The credentials Secret's key holding the secret access key.
pub const SECRET_ACCESS_KEY: &str = "secretAccessKey";

/// The object a cluster's snapshot `file` is uploaded to: `<prefix><namespace>/<file>`.
/// Files are named after the cluster (`<cluster>-<slot>.db`), and a cluster's name is unique
/// only within its namespace: without the namespace, same-named clusters of two namespaces
/// backing up to one bucket would overwrite each other's objects, and each status would list
/// a location holding the other's data.
pub fn object_name(s3: &ValidS3, cluster: &ClusterRef, file: &str) -> String {
    format!("{}{}/{file}", s3.prefix, cluster.namespace)
}

/// `s3://<bucket>/<object>`: where `file` is uploaded, as status reports it.
pub fn location(s3: &ValidS3, cluster: &ClusterRef, file: &str) -> String {
    format!("s3://{}/{}", s3.bucket, object_name(s3, cluster, file))
}

/// The environment that gives `mc` the alias `s3` for `endpoint` with the Secret's keys.
pub fn credentials_env(endpoint: &str, secret: &str) -> Value {
    // Validation guarantees a scheme; https is the safe reading of one without.
    let (scheme, host) = endpoint.split_once("://").unwrap_or(("https", endpoint));
    let key = |name: &str, key: &str| json!({"name": name, "valueFrom": {"secretKeyRef": {"name": secret, "key": key}}});
    json!([
        key("S3_ACCESS_KEY_ID", ACCESS_KEY_ID),
        key("S3_SECRET_ACCESS_KEY", SECRET_ACCESS_KEY),
        // Expanded by Kubernetes: each $(VAR) is defined above it.
        {"name": format!("MC_HOST_{ALIAS}"),
         "value": format!("{scheme}://$(S3_ACCESS_KEY_ID):$(S3_SECRET_ACCESS_KEY)@{host}")},
    ])
}

/// A backup Pod that also uploads its snapshot: an init container after the restore (so only
/// a snapshot that restores is uploaded) copies the slot file to its [`object_name`]. The
/// object is named after the slot, so the bucket rotates through the same `keep` names as the
/// claim. The Pod carries the object's location for the status.
pub fn with_upload(mut pod: Value, s3: &ValidS3, cluster: &ClusterRef, file: &str) -> Value {
    let upload = json!({
        "name": UPLOAD_CONTAINER,
        "image": s3.image,
        "command": [
            "mc", "--config-dir", MC_CONFIG_MOUNT, "cp",
            format!("{BACKUP_MOUNT}/{file}"),
            format!("{ALIAS}/{}/{}", s3.bucket, object_name(s3, cluster, file)),
        ],
        "env": credentials_env(&s3.endpoint, &s3.credentials_secret),
        "volumeMounts": [
            {"name": "backup", "mountPath": BACKUP_MOUNT, "readOnly": true},
            {"name": "mc-config", "mountPath": MC_CONFIG_MOUNT},
        ],
        "terminationMessagePolicy": "FallbackToLogsOnError",
    });
    if let Some(init) = pod["spec"]["initContainers"].as_array_mut() {
        let after_restore = init
            .iter()
            .position(|c| c["name"] == RESTORE_CONTAINER)
            .map_or(init.len(), |at| at + 1);
        init.insert(after_restore, upload);
    }
    if let Some(volumes) = pod["spec"]["volumes"].as_array_mut() {
        volumes.push(json!({"name": "mc-config", "emptyDir": {}}));
    }
    pod["metadata"]["annotations"][ANNOTATION_LOCATION] = json!(location(s3, cluster, file));
    pod
}

/// The file name a downloaded object gets in the restore volume: its last path segment.
pub fn downloaded_file(s3: &S3RestoreSpec) -> String {
    let key = s3.key.trim();
    key.rsplit('/').next().unwrap_or(key).to_owned()
}

/// The init container that copies the object `s3.key` into the restore volume (an
/// `emptyDir` at `RESTORE_MOUNT`), as [`downloaded_file`].
pub fn download_container(s3: &S3RestoreSpec, image: &str) -> Value {
    let endpoint = s3.endpoint.trim().trim_end_matches('/');
    json!({
        "name": DOWNLOAD_CONTAINER,
        "image": image,
        "command": [
            // The restore volume is scratch space the member never reads again.
            "mc", "--config-dir", format!("{RESTORE_MOUNT}/.mc"), "cp",
            format!("{ALIAS}/{}/{}", s3.bucket, s3.key.trim()),
            format!("{RESTORE_MOUNT}/{}", downloaded_file(s3)),
        ],
        "env": credentials_env(endpoint, &s3.credentials_secret),
        "volumeMounts": [{"name": "restore", "mountPath": RESTORE_MOUNT}],
        "terminationMessagePolicy": "FallbackToLogsOnError",
    })
}
