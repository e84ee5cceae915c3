//! Pod volumes as directories on the machine: emptyDir per Pod, PersistentVolumeClaims per claim
//! (kept until the claim is deleted), Secrets and ConfigMaps written out as files.

use std::collections::BTreeMap;
use std::net::Ipv4Addr;
use std::path::{Path, PathBuf};

use k8s_openapi::api::core::v1::{ConfigMap, PersistentVolumeClaim, Pod, Secret, Volume};
use kube::Api;
use kube::api::{Patch, PatchParams};

use super::spec::NotStartable;

/// Directory of a PersistentVolumeClaim's data under the runner's directory.
pub(crate) fn claim_dir(runner_dir: &Path, namespace: &str, claim: &str) -> PathBuf {
    runner_dir.join("pvc").join(namespace).join(claim)
}

fn not_ready(message: String) -> NotStartable {
    NotStartable {
        reason: "ContainerCreating",
        message,
    }
}

/// Creates every volume of `pod` and returns the directory (or file) of each, by volume name.
/// A missing claim, Secret or ConfigMap is reported as not startable yet (the caller retries).
pub(crate) async fn prepare(
    client: &kube::Client,
    pod: &Pod,
    pod_dir: &Path,
    runner_dir: &Path,
    ip: Ipv4Addr,
) -> Result<BTreeMap<String, PathBuf>, NotStartable> {
    let namespace = pod.metadata.namespace.clone().unwrap_or_default();
    let mut dirs = BTreeMap::new();
    let volumes = pod
        .spec
        .as_ref()
        .and_then(|s| s.volumes.clone())
        .unwrap_or_default();
    for volume in &volumes {
        let dir = pod_dir.join("volumes").join(&volume.name);
        let dir = prepare_one(client, &namespace, pod, volume, dir, runner_dir, ip).await?;
        dirs.insert(volume.name.clone(), dir);
    }
    Ok(dirs)
}

async fn prepare_one(
    client: &kube::Client,
    namespace: &str,
    pod: &Pod,
    volume: &Volume,
    dir: PathBuf,
    runner_dir: &Path,
    ip: Ipv4Addr,
) -> Result<PathBuf, NotStartable> {
    let mkdir = |dir: &Path| {
        std::fs::create_dir_all(dir)
            .map_err(|e| not_ready(format!("creating {}: {e}", dir.display())))
    };
    if let Some(claim) = &volume.persistent_volume_claim {
        let dir = claim_dir(runner_dir, namespace, &claim.claim_name);
        bind_claim(client, namespace, &claim.claim_name).await?;
        mkdir(&dir)?;
        return Ok(dir);
    }
    if let Some(host_path) = &volume.host_path {
        let dir = PathBuf::from(&host_path.path);
        if host_path.type_.as_deref() == Some("DirectoryOrCreate") {
            mkdir(&dir)?;
        }
        return Ok(dir);
    }
    mkdir(&dir)?;
    if let Some(secret) = &volume.secret {
        let name = secret.secret_name.clone().unwrap_or_default();
        let files = secret_files(client, namespace, &name, secret.optional == Some(true)).await?;
        write_items(&dir, files, secret.items.as_deref())?;
    } else if let Some(config_map) = &volume.config_map {
        let files = config_map_files(
            client,
            namespace,
            &config_map.name,
            config_map.optional == Some(true),
        )
        .await?;
        write_items(&dir, files, config_map.items.as_deref())?;
    } else if let Some(projected) = &volume.projected {
        for source in projected.sources.iter().flatten() {
            if let Some(cm) = &source.config_map {
                let files =
                    config_map_files(client, namespace, &cm.name, cm.optional == Some(true))
                        .await?;
                write_items(&dir, files, cm.items.as_deref())?;
            }
            if let Some(secret) = &source.secret {
                let files = secret_files(
                    client,
                    namespace,
                    &secret.name,
                    secret.optional == Some(true),
                )
                .await?;
                write_items(&dir, files, secret.items.as_deref())?;
            }
            if let Some(downward) = &source.downward_api {
                for item in downward.items.iter().flatten() {
                    let value = match item.field_ref.as_ref().map(|f| f.field_path.as_str()) {
                        Some("metadata.namespace") => namespace.to_owned(),
                        Some("metadata.name") => pod.metadata.name.clone().unwrap_or_default(),
                        Some("status.podIP") => ip.to_string(),
                        _ => continue,
                    };
                    write_file(&dir.join(&item.path), value.as_bytes())?;
                }
            }
            // serviceAccountToken sources: no kubelet to mint tokens; the directory exists.
        }
    }
    // emptyDir and anything else: an empty directory of the Pod.
    Ok(dir)
}

/// Marks a claim Bound (there is no provisioner: the runner is the storage), creating nothing.
async fn bind_claim(
    client: &kube::Client,
    namespace: &str,
    claim: &str,
) -> Result<(), NotStartable> {
    let claims: Api<PersistentVolumeClaim> = Api::namespaced(client.clone(), namespace);
    let found = claims
        .get_opt(claim)
        .await
        .map_err(|e| not_ready(format!("reading persistentvolumeclaim \"{claim}\": {e}")))?
        .ok_or_else(|| not_ready(format!("persistentvolumeclaim \"{claim}\" not found")))?;
    let bound = found.status.as_ref().and_then(|s| s.phase.as_deref()) == Some("Bound");
    if !bound {
        let spec = found.spec.unwrap_or_default();
        let storage = spec
            .resources
            .and_then(|r| r.requests)
            .and_then(|r| r.get("storage").cloned());
        let patch = serde_json::json!({"status": {
            "phase": "Bound",
            "accessModes": spec.access_modes,
            "capacity": {"storage": storage},
        }});
        claims
            .patch_status(claim, &PatchParams::default(), &Patch::Merge(&patch))
            .await
            .map_err(|e| not_ready(format!("binding persistentvolumeclaim \"{claim}\": {e}")))?;
    }
    Ok(())
}

async fn secret_files(
    client: &kube::Client,
    namespace: &str,
    name: &str,
    optional: bool,
) -> Result<BTreeMap<String, Vec<u8>>, NotStartable> {
    let secrets: Api<Secret> = Api::namespaced(client.clone(), namespace);
    match secrets.get_opt(name).await {
        Ok(Some(secret)) => Ok(secret
            .data
            .unwrap_or_default()
            .into_iter()
            .map(|(k, v)| (k, v.0))
            .collect()),
        Ok(None) if optional => Ok(BTreeMap::new()),
        Ok(None) => Err(not_ready(format!("secret \"{name}\" not found"))),
        Err(e) => Err(not_ready(format!("reading secret \"{name}\": {e}"))),
    }
}

async fn config_map_files(
    client: &kube::Client,
    namespace: &str,
    name: &str,
    optional: bool,
) -> Result<BTreeMap<String, Vec<u8>>, NotStartable> {
    let config_maps: Api<ConfigMap> = Api::namespaced(client.clone(), namespace);
    match config_maps.get_opt(name).await {
        Ok(Some(cm)) => {
            let mut files: BTreeMap<String, Vec<u8>> = cm
                .data
                .unwrap_or_default()
                .into_iter()
                .map(|(k, v)| (k, v.into_bytes()))
                .collect();
            files.extend(
                cm.binary_data
                    .unwrap_or_default()
                    .into_iter()
                    .map(|(k, v)| (k, v.0)),
            );
            Ok(files)
        }
        Ok(None) if optional => Ok(BTreeMap::new()),
        Ok(None) => Err(not_ready(format!("configmap \"{name}\" not found"))),
        Err(e) => Err(not_ready(format!("reading configmap \"{name}\": {e}"))),
    }
}

fn write_items(
    dir: &Path,
    files: BTreeMap<String, Vec<u8>>,
    items: Option<&[k8s_openapi::api::core::v1::KeyToPath]>,
) -> Result<(), NotStartable> {
    match items {
        Some(items) => {
            for item in items {
                if let Some(content) = files.get(&item.key) {
                    write_file(&dir.join(&item.path), content)?;
                }
            }
        }
        None => {
            for (key, content) in &files {
                write_file(&dir.join(key), content)?;
            }
        }
    }
    Ok(())
}

fn write_file(path: &Path, content: &[u8]) -> Result<(), NotStartable> {
    if let Some(parent) = path.parent() {
        std::fs::create_dir_all(parent)
            .map_err(|e| not_ready(format!("creating {}: {e}", parent.display())))?;
    }
    std::fs::write(path, content).map_err(|e| not_ready(format!("writing {}: {e}", path.display())))
}
