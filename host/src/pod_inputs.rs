//! What the pods a plugin applies take in from outside their spec: the images they run, checked
//! against the admin's allow-list, and the Secrets they mount or read, which must be opted in
//! by a label (review M6).
//!
//! Without these, whoever may create a parent may run any image with any Secret of the
//! namespace: an EtcdCluster author sets `repository: evil.example/x` and `tls.peerSecret:
//! db-admin`, and the member pod ships the Secret out. That is an escalation wherever the right
//! to create parents is granted without the right to create pods or read Secrets, so it is
//! checked here, in the act stage, for every plugin:
//!
//! - **Images**: `grants.images` (the admin's, signed with the pack) lists repositories
//!   (`gcr.io/etcd-development/etcd` allows every tag and digest of it) or prefixes ending in
//!   `/` (`registry.example/team/`). Docker Hub's short names are read as the kubelet reads
//!   them (`redis` is `docker.io/library/redis`). Absent: any image (a plugin loaded from a
//!   file, or a pack without the grant); the shipped bundles carry one.
//! - **Secrets**: a Secret a pod mounts (a `secret` or `projected` volume, or any volume
//!   source's secret reference) or reads (`env[].valueFrom.secretKeyRef`, `envFrom[].secretRef`)
//!   must carry the label `mountable-by.policy-host.io/<plugin>: "true"`, set by someone who may
//!   write that Secret (and so could read it anyway). The host reads the Secret's metadata
//!   only, through the per-namespace `policy-host-secrets` binding; where it may not, the
//!   decision is refused and says to add the binding.

use serde_json::Value;

use crate::pod_security::pod_template;

/// The label prefix that opts a Secret in for a plugin: the key is this prefix and the plugin's
/// name, the value `"true"`.
pub const MOUNTABLE_BY_PREFIX: &str = "mountable-by.policy-host.io/";

/// The label key that lets `plugin`'s pods mount or read a Secret.
pub fn mountable_label(plugin: &str) -> String {
    format!("{MOUNTABLE_BY_PREFIX}{plugin}")
}

/// The containers of every kind in a pod spec.
fn containers(spec: &Value) -> impl Iterator<Item = &Value> {
    ["initContainers", "containers", "ephemeralContainers"]
        .into_iter()
        .flat_map(|list| spec[list].as_array().into_iter().flatten())
}

/// An image reference as the kubelet resolves a short Docker Hub name: `redis:7` is
/// `docker.io/library/redis:7`, `minio/mc` is `docker.io/minio/mc`.
fn normalized(reference: &str) -> String {
    match reference.split_once('/') {
        None => format!("docker.io/library/{reference}"),
        Some((first, _)) if first.contains(['.', ':']) || first == "localhost" => {
            reference.to_owned()
        }
        Some(_) => format!("docker.io/{reference}"),
    }
}

/// Whether `image` is allowed by one of `allowed` (see the module docs).
pub fn image_allowed(image: &str, allowed: &[String]) -> bool {
    let image = normalized(image.trim());
    allowed.iter().any(|entry| {
        let entry = normalized(entry.trim());
        if entry.ends_with('/') {
            return image.starts_with(&entry);
        }
        image == entry
            || image
                .strip_prefix(&entry)
                .is_some_and(|rest| rest.starts_with([':', '@']))
    })
}

/// The first container of `object`'s pod template (if any) whose image `allowed` does not
/// allow, as `Err` saying which; `None` allows every image.
pub fn check_images(object: &Value, allowed: Option<&[String]>) -> Result<(), String> {
    let (Some(allowed), Some((_, spec))) = (allowed, pod_template(object)) else {
        return Ok(());
    };
    for container in containers(spec) {
        let image = container["image"].as_str().unwrap_or_default();
        if !image_allowed(image, allowed) {
            return Err(format!(
                "container {} runs the image `{image}`, which its grants do not allow (granted images: {allowed:?})",
                container["name"].as_str().unwrap_or("unnamed")
            ));
        }
    }
    Ok(())
}

/// A Secret a pod uses, and how (for messages).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct SecretUse {
    /// The Secret's name (in the pod's namespace).
    pub name: String,
    /// Where the pod names it, e.g. `volume peer-tls`, `env S3_KEY of container upload`.
    pub used_as: String,
}

/// Every Secret `object`'s pod template mounts or reads.
pub fn secret_uses(object: &Value) -> Vec<SecretUse> {
    let Some((_, spec)) = pod_template(object) else {
        return Vec::new();
    };
    let mut uses = Vec::new();
    let mut found = |name: &Value, used_as: String| {
        if let Some(name) = name.as_str().filter(|n| !n.is_empty()) {
            uses.push(SecretUse {
                name: name.to_owned(),
                used_as,
            });
        }
    };
    for volume in spec["volumes"].as_array().into_iter().flatten() {
        let used_as = format!("volume {}", volume["name"].as_str().unwrap_or("unnamed"));
        for (kind, source) in volume.as_object().into_iter().flatten() {
            match kind.as_str() {
                "name" => {}
                "projected" => {
                    for projected in source["sources"].as_array().into_iter().flatten() {
                        found(&projected["secret"]["name"], used_as.clone());
                    }
                }
                // `secret.secretName`, `azureFile.secretName`, and every `secretRef` or
                // `nodePublishSecretRef` (CSI, CephFS, RBD, iSCSI, FlexVolume, ...).
                _ => {
                    found(&source["secretName"], used_as.clone());
                    found(&source["secretRef"]["name"], used_as.clone());
                    found(&source["nodePublishSecretRef"]["name"], used_as.clone());
                }
            }
        }
    }
    for container in containers(spec) {
        let container_name = container["name"].as_str().unwrap_or("unnamed");
        for env in container["env"].as_array().into_iter().flatten() {
            found(
                &env["valueFrom"]["secretKeyRef"]["name"],
                format!(
                    "env {} of container {container_name}",
                    env["name"].as_str().unwrap_or("unnamed")
                ),
            );
        }
        for env_from in container["envFrom"].as_array().into_iter().flatten() {
            found(
                &env_from["secretRef"]["name"],
                format!("envFrom of container {container_name}"),
            );
        }
    }
    uses
}

#[cfg(test)]
mod tests {
    use serde_json::json;

    use super::*;

    fn pod(spec: Value) -> Value {
        json!({"apiVersion": "v1", "kind": "Pod", "metadata": {"name": "p"}, "spec": spec})
    }

    #[test]
    fn an_image_is_allowed_by_its_repository_or_a_prefix_and_nothing_else() {
        let allowed = vec![
            "gcr.io/etcd-development/etcd".to_owned(),
            "minio/mc".to_owned(),
            "redis".to_owned(),
            "registry.example:5000/team/".to_owned(),
        ];
        let rows = [
            (
                "a tag of an allowed repository",
                "gcr.io/etcd-development/etcd:v3.6.16",
                true,
            ),
            (
                "a digest of it",
                "gcr.io/etcd-development/etcd@sha256:0123",
                true,
            ),
            ("the repository alone", "gcr.io/etcd-development/etcd", true),
            (
                "a Docker Hub short name",
                "minio/mc:RELEASE.2025-03-12T17-29-24Z",
                true,
            ),
            ("the same, spelled out", "docker.io/minio/mc:latest", true),
            ("an official image", "redis:7.0.15", true),
            (
                "an official image, spelled out",
                "docker.io/library/redis:7.0.15",
                true,
            ),
            (
                "under an allowed prefix",
                "registry.example:5000/team/etcd:v3",
                true,
            ),
            ("another repository", "evil.example/x:1", false),
            (
                "a longer name sharing the prefix",
                "gcr.io/etcd-development/etcd-evil:v1",
                false,
            ),
            (
                "another Hub user's image of that name",
                "evil/redis:7",
                false,
            ),
            (
                "next to an allowed prefix",
                "registry.example:5000/teams/x:1",
                false,
            ),
            ("no image at all", "", false),
        ];
        for (situation, image, expected) in rows {
            assert_eq!(
                image_allowed(image, &allowed),
                expected,
                "{situation}: {image}"
            );
        }
    }

    #[test]
    fn every_container_kind_is_checked_and_no_allow_list_allows_all() {
        let allowed = vec!["gcr.io/etcd-development/etcd".to_owned()];
        let rows = [
            (
                "an init container",
                json!({"initContainers": [{"name": "init", "image": "busybox"}], "containers": []}),
                Some("init"),
            ),
            (
                "a container",
                json!({"containers": [{"name": "etcd", "image": "evil.example/etcd:v3"}]}),
                Some("evil.example/etcd:v3"),
            ),
            (
                "an ephemeral container",
                json!({"containers": [], "ephemeralContainers": [{"name": "debug", "image": "busybox"}]}),
                Some("debug"),
            ),
            (
                "allowed images",
                json!({"containers": [{"name": "etcd", "image": "gcr.io/etcd-development/etcd:v3.6.16"}]}),
                None,
            ),
        ];
        for (situation, spec, refused) in rows {
            let outcome = check_images(&pod(spec.clone()), Some(&allowed));
            match refused {
                Some(fragment) => assert!(
                    outcome
                        .as_ref()
                        .is_err_and(|m| m.contains(fragment) && m.contains("granted images")),
                    "{situation}: {outcome:?}"
                ),
                None => assert_eq!(outcome, Ok(()), "{situation}"),
            }
            assert_eq!(
                check_images(&pod(spec), None),
                Ok(()),
                "{situation}: no allow-list"
            );
        }
        let service = json!({"apiVersion": "v1", "kind": "Service", "metadata": {"name": "s"}});
        assert_eq!(check_images(&service, Some(&allowed)), Ok(()));
    }

    #[test]
    fn every_way_a_pod_names_a_secret_is_found() {
        let deployment = json!({"apiVersion": "apps/v1", "kind": "Deployment", "metadata": {"name": "d"},
        "spec": {"template": {"spec": {
            "volumes": [
                {"name": "peer-tls", "secret": {"secretName": "peer"}},
                {"name": "all", "projected": {"sources": [
                    {"secret": {"name": "projected"}}, {"configMap": {"name": "not-a-secret"}}]}},
                {"name": "csi", "csi": {"driver": "x", "nodePublishSecretRef": {"name": "csi"}}},
                {"name": "ceph", "cephfs": {"monitors": [], "secretRef": {"name": "ceph"}}},
                {"name": "data", "emptyDir": {}},
            ],
            "initContainers": [{"name": "download", "env": [
                {"name": "S3_KEY", "valueFrom": {"secretKeyRef": {"name": "s3", "key": "k"}}},
                {"name": "PLAIN", "value": "x"}]}],
            "containers": [{"name": "app", "envFrom": [{"secretRef": {"name": "bulk"}}, {"configMapRef": {"name": "cm"}}]}],
        }}}});
        let uses = secret_uses(&deployment);
        let names: Vec<&str> = uses.iter().map(|u| u.name.as_str()).collect();
        assert_eq!(names, ["peer", "projected", "csi", "ceph", "s3", "bulk"]);
        assert_eq!(uses[0].used_as, "volume peer-tls");
        assert_eq!(uses[4].used_as, "env S3_KEY of container download");
        assert_eq!(uses[5].used_as, "envFrom of container app");
        let none = pod(json!({"containers": [{"name": "app", "image": "x"}]}));
        assert!(secret_uses(&none).is_empty());
    }
}
