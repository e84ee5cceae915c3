//! Turning a container spec into a local command line: image mapping, environment, `$(VAR)`
//! expansion and the mount-namespace wrapper.

use std::collections::BTreeMap;
use std::net::Ipv4Addr;
use std::path::{Path, PathBuf};

use k8s_openapi::api::core::v1::{ConfigMap, Container, Pod, Secret};
use kube::Api;

use crate::Binaries;

/// Where a container's programs come from.
#[derive(Debug, Clone)]
pub(crate) enum Image {
    /// An etcd image whose version is built: programs are taken from this directory.
    Etcd(PathBuf),
    /// A redis image of the installed series: `redis-server` and `redis-cli` are taken from
    /// this directory.
    Redis(PathBuf),
    /// A `minio/mc` image: `mc` is taken from this directory (the version of versions.env,
    /// whatever the tag).
    Mc(PathBuf),
    /// Any other image: programs are the machine's own.
    Host,
}

/// Why a container cannot be started (yet): a Kubernetes waiting reason and a message.
#[derive(Debug, Clone)]
pub(crate) struct NotStartable {
    pub(crate) reason: &'static str,
    pub(crate) message: String,
}

/// Maps an image reference to local programs. `etcd`, `*/etcd` with a tag `v3.x.y` or `3.x.y`
/// (an `-N` suffix, as in registry.k8s.io/etcd:3.5.21-0, is ignored) are the cached etcd builds;
/// `redis`, `*/redis` with a tag of the installed series (`7.0.15`, `7.0`; a `-suffix` such as
/// `-alpine` is ignored) is the installed redis-server; `minio/mc` (any tag) is the built `mc`.
pub(crate) fn resolve_image(image: &str, binaries: &Binaries) -> Result<Image, NotStartable> {
    let without_digest = image.split('@').next().unwrap_or(image);
    let (repository, tag) = match without_digest.rsplit_once(':') {
        Some((repo, tag)) if !tag.contains('/') => (repo, tag),
        _ => (without_digest, "latest"),
    };
    if repository == "redis" || repository.ends_with("/redis") {
        let version = tag.split('-').next().unwrap_or(tag);
        return match binaries.redis_dir(version) {
            Some(dir) => Ok(Image::Redis(dir)),
            None => Err(NotStartable {
                reason: "ErrImagePull",
                message: format!(
                    "redis {version} (image {image}) is not installed here (available: {}); set REDIS_SERIES in tests/env/versions.env and run tests/env/build-binaries.sh redis",
                    binaries
                        .redis_version()
                        .unwrap_or_else(|| "none".to_owned())
                ),
            }),
        };
    }
    if repository == "minio/mc" || repository.ends_with("/minio/mc") {
        return match binaries.mc() {
            Some(mc) => Ok(Image::Mc(mc.parent().map(Path::to_path_buf).unwrap_or(mc))),
            None => Err(NotStartable {
                reason: "ErrImagePull",
                message: format!(
                    "mc {} (for image {image}) is not built here; run tests/env/build-binaries.sh s3 (or a test that needs it, which builds it)",
                    binaries.mc_version()
                ),
            }),
        };
    }
    if repository != "etcd" && !repository.ends_with("/etcd") {
        return Ok(Image::Host);
    }
    let version = tag.split('-').next().unwrap_or(tag);
    match binaries.etcd_dir(version) {
        Some(dir) => Ok(Image::Etcd(dir)),
        None => Err(NotStartable {
            reason: "ErrImagePull",
            message: format!(
                "etcd {version} (image {image}) is not built here (available: {}); add it to ETCD_VERSIONS in tests/env/versions.env and run tests/env/build-binaries.sh etcd",
                binaries.etcd_versions().join(", ")
            ),
        }),
    }
}

/// Kubernetes `$(VAR)` expansion: `$(NAME)` becomes the variable's value when defined and stays
/// as written otherwise; `$$` is an escaped `$`.
pub(crate) fn expand(input: &str, vars: &BTreeMap<String, String>) -> String {
    let mut out = String::with_capacity(input.len());
    let mut rest = input;
    while let Some(at) = rest.find('$') {
        out.push_str(&rest[..at]);
        let after = &rest[at + 1..];
        if let Some(tail) = after.strip_prefix('$') {
            out.push('$');
            rest = tail;
        } else if let Some(inner) = after.strip_prefix('(')
            && let Some(close) = inner.find(')')
        {
            let name = &inner[..close];
            match vars.get(name) {
                Some(value) => out.push_str(value),
                None => {
                    out.push_str("$(");
                    out.push_str(name);
                    out.push(')');
                }
            }
            rest = &inner[close + 1..];
        } else {
            out.push('$');
            rest = after;
        }
    }
    out.push_str(rest);
    out
}

/// Pods share the machine's network namespace, so a Pod's own "everywhere" and "loopback" are
/// its IP: `0.0.0.0`, `127.0.0.1` and a `localhost` URL host become the Pod IP (otherwise two
/// Pods would take the same port), and a comma-separated list that then names an address twice
/// (`http://127.0.0.1:2379,http://$(POD_IP):2379`) keeps it once.
pub(crate) fn pod_local(value: &str, ip: Ipv4Addr) -> String {
    let ip = ip.to_string();
    let replaced = value
        .replace("0.0.0.0", &ip)
        .replace("127.0.0.1", &ip)
        .replace("://localhost:", &format!("://{ip}:"))
        .replace("://localhost/", &format!("://{ip}/"));
    if replaced == value || !replaced.contains(',') {
        return replaced;
    }
    let mut seen = Vec::new();
    for part in replaced.split(',') {
        if !seen.contains(&part) {
            seen.push(part);
        }
    }
    seen.join(",")
}

/// Reads one field of the Pod for `valueFrom.fieldRef`.
fn field_of(pod: &Pod, path: &str, ip: Ipv4Addr) -> Option<String> {
    let meta = &pod.metadata;
    let spec = pod.spec.as_ref();
    let keyed = |prefix: &str, map: &Option<BTreeMap<String, String>>| {
        let key = path
            .strip_prefix(prefix)?
            .strip_suffix("']")
            .or_else(|| path.strip_prefix(prefix)?.strip_suffix("\"]"))?;
        map.as_ref()?.get(key).cloned()
    };
    match path {
        "metadata.name" => meta.name.clone(),
        "metadata.namespace" => meta.namespace.clone(),
        "metadata.uid" => meta.uid.clone(),
        "spec.nodeName" => spec.and_then(|s| s.node_name.clone()),
        "spec.serviceAccountName" => spec.and_then(|s| s.service_account_name.clone()),
        "status.podIP" | "status.podIPs" => Some(ip.to_string()),
        "status.hostIP" | "status.hostIPs" => Some("127.0.0.1".into()),
        _ if path.starts_with("metadata.labels[") => keyed("metadata.labels['", &meta.labels)
            .or_else(|| keyed("metadata.labels[\"", &meta.labels)),
        _ if path.starts_with("metadata.annotations[") => {
            keyed("metadata.annotations['", &meta.annotations)
                .or_else(|| keyed("metadata.annotations[\"", &meta.annotations))
        }
        _ => None,
    }
}

/// A container's environment, in Kubernetes order: `envFrom`, then `env` (each value expanded
/// against what is defined before it).
pub(crate) async fn environment(
    client: &kube::Client,
    pod: &Pod,
    container: &Container,
    ip: Ipv4Addr,
) -> Result<BTreeMap<String, String>, NotStartable> {
    let namespace = pod.metadata.namespace.clone().unwrap_or_default();
    let config_maps: Api<ConfigMap> = Api::namespaced(client.clone(), &namespace);
    let secrets: Api<Secret> = Api::namespaced(client.clone(), &namespace);
    let config_error = |message: String| NotStartable {
        reason: "CreateContainerConfigError",
        message,
    };
    let mut vars = BTreeMap::new();
    for source in container.env_from.iter().flatten() {
        let prefix = source.prefix.clone().unwrap_or_default();
        if let Some(reference) = &source.config_map_ref {
            match config_maps.get_opt(&reference.name).await {
                Ok(Some(cm)) => {
                    for (k, v) in cm.data.unwrap_or_default() {
                        vars.insert(format!("{prefix}{k}"), v);
                    }
                }
                Ok(None) if reference.optional == Some(true) => {}
                other => {
                    return Err(config_error(format!(
                        "configmap \"{}\" not found ({:?})",
                        reference.name,
                        other.err()
                    )));
                }
            }
        }
        if let Some(reference) = &source.secret_ref {
            match secrets.get_opt(&reference.name).await {
                Ok(Some(secret)) => {
                    for (k, v) in secret.data.unwrap_or_default() {
                        vars.insert(
                            format!("{prefix}{k}"),
                            String::from_utf8_lossy(&v.0).into_owned(),
                        );
                    }
                }
                Ok(None) if reference.optional == Some(true) => {}
                other => {
                    return Err(config_error(format!(
                        "secret \"{}\" not found ({:?})",
                        reference.name,
                        other.err()
                    )));
                }
            }
        }
    }
    for var in container.env.iter().flatten() {
        let value = if let Some(value) = &var.value {
            Some(expand(value, &vars))
        } else if let Some(from) = &var.value_from {
            if let Some(field) = &from.field_ref {
                field_of(pod, &field.field_path, ip)
            } else if let Some(key) = &from.config_map_key_ref {
                let found = config_maps
                    .get_opt(&key.name)
                    .await
                    .ok()
                    .flatten()
                    .and_then(|cm| cm.data?.get(&key.key).cloned());
                if found.is_none() && key.optional != Some(true) {
                    return Err(config_error(format!(
                        "key {} of configmap \"{}\" not found",
                        key.key, key.name
                    )));
                }
                found
            } else if let Some(key) = &from.secret_key_ref {
                let found = secrets
                    .get_opt(&key.name)
                    .await
                    .ok()
                    .flatten()
                    .and_then(|s| s.data?.get(&key.key).cloned())
                    .map(|v| String::from_utf8_lossy(&v.0).into_owned());
                if found.is_none() && key.optional != Some(true) {
                    return Err(config_error(format!(
                        "key {} of secret \"{}\" not found",
                        key.key, key.name
                    )));
                }
                found
            } else {
                // resourceFieldRef: no resource accounting here.
                None
            }
        } else {
            Some(String::new())
        };
        if let Some(value) = value {
            vars.insert(var.name.clone(), pod_local(&value, ip));
        }
    }
    Ok(vars)
}

/// Environment every container of `image` gets unless it sets it itself: etcdctl's default
/// endpoint is 127.0.0.1:2379, which here is not the Pod (see [`pod_local`]).
pub(crate) fn image_defaults(image: &Image, ip: Ipv4Addr) -> Vec<(String, String)> {
    match image {
        Image::Etcd(_) => vec![("ETCDCTL_ENDPOINTS".to_owned(), format!("http://{ip}:2379"))],
        Image::Redis(_) | Image::Mc(_) | Image::Host => Vec::new(),
    }
}

/// The `PATH` of a container: the image's programs first, then the machine's.
pub(crate) fn path_var(image: &Image) -> String {
    let system = "/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin";
    match image {
        Image::Etcd(dir) | Image::Redis(dir) | Image::Mc(dir) => {
            format!("{}:{system}", dir.display())
        }
        Image::Host => system.to_owned(),
    }
}

/// `command` + `args`, expanded, with `command[0]` resolved in the image.
pub(crate) fn argv(
    container: &Container,
    image: &Image,
    vars: &BTreeMap<String, String>,
    ip: Ipv4Addr,
) -> Result<Vec<String>, NotStartable> {
    let mut argv: Vec<String> = container.command.clone().unwrap_or_default();
    if argv.is_empty() {
        match image {
            // The etcd images' entrypoint.
            Image::Etcd(_) => argv.push("etcd".into()),
            // The redis images' entrypoint runs redis-server.
            Image::Redis(_) => argv.push("redis-server".into()),
            // The minio/mc images' entrypoint.
            Image::Mc(_) => argv.push("mc".into()),
            Image::Host => {
                return Err(NotStartable {
                    reason: "CreateContainerConfigError",
                    message: format!(
                        "image {} has no known entrypoint on the pod runner; set `command`",
                        container.image.clone().unwrap_or_default()
                    ),
                });
            }
        }
    }
    argv.extend(container.args.clone().unwrap_or_default());
    let mut argv: Vec<String> = argv
        .iter()
        .map(|a| pod_local(&expand(a, vars), ip))
        .collect();
    resolve_program(&mut argv, image);
    Ok(argv)
}

/// Replaces `argv[0]` by the image's program of the same basename (`/usr/local/bin/etcd` → the
/// cached etcd), if the image has one.
pub(crate) fn resolve_program(argv: &mut [String], image: &Image) {
    if let (Image::Etcd(dir) | Image::Redis(dir) | Image::Mc(dir), Some(program)) =
        (image, argv.first_mut())
    {
        let base = Path::new(program.as_str())
            .file_name()
            .map(|b| b.to_string_lossy().into_owned())
            .unwrap_or_default();
        let candidate = dir.join(&base);
        if !base.is_empty() && candidate.is_file() {
            *program = candidate.display().to_string();
        }
    }
}

/// Quotes a string for `sh`.
pub(crate) fn shell_quote(s: &str) -> String {
    format!("'{}'", s.replace('\'', r"'\''"))
}

/// A bind mount done inside the Pod's private mount namespace.
#[derive(Debug, Clone)]
pub(crate) struct BindMount {
    /// The directory (or file) on the machine.
    pub(crate) source: PathBuf,
    /// The path the container sees it at.
    pub(crate) target: String,
}

/// The `sh` script run by `unshare` before exec'ing the container's program: hosts file, hostname,
/// volume mounts, working directory.
pub(crate) fn wrapper_script(
    hosts: &Path,
    hostname: &str,
    mounts: &[BindMount],
    working_dir: &Path,
) -> String {
    let mut script = String::from("set -e\n");
    script.push_str(&format!(
        "mount --bind {} /etc/hosts\n",
        shell_quote(&hosts.display().to_string())
    ));
    script.push_str(&format!("hostname {}\n", shell_quote(hostname)));
    for mount in mounts {
        let target = shell_quote(&mount.target);
        if mount.source.is_dir() {
            script.push_str(&format!("mkdir -p {target}\n"));
        } else {
            script.push_str(&format!(
                "mkdir -p \"$(dirname {target})\"; [ -e {target} ] || : > {target}\n"
            ));
        }
        script.push_str(&format!(
            "mount --bind {} {target}\n",
            shell_quote(&mount.source.display().to_string())
        ));
    }
    script.push_str(&format!(
        "cd {}\n",
        shell_quote(&working_dir.display().to_string())
    ));
    script.push_str("exec \"$@\"\n");
    script
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn expansion_follows_kubernetes_rules() {
        let vars = BTreeMap::from([("IP".to_owned(), "127.10.0.2".to_owned())]);
        for (input, expected) in [
            ("http://$(IP):2379", "http://127.10.0.2:2379"),
            ("$(MISSING)", "$(MISSING)"),
            ("$$(IP)", "$(IP)"),
            ("a$b", "a$b"),
            ("$(IP", "$(IP"),
            ("$", "$"),
        ] {
            assert_eq!(expand(input, &vars), expected, "{input}");
        }
    }

    #[test]
    fn pod_local_addresses_become_the_pod_ip() {
        let ip = Ipv4Addr::new(127, 10, 0, 2);
        for (input, expected) in [
            ("http://0.0.0.0:2379", "http://127.10.0.2:2379"),
            (
                "http://127.0.0.1:2379,http://127.10.0.2:2379",
                "http://127.10.0.2:2379",
            ),
            (
                "http://localhost:2381/health",
                "http://127.10.0.2:2381/health",
            ),
            ("a,b,a", "a,b,a"),
            ("echo localhost", "echo localhost"),
        ] {
            assert_eq!(pod_local(input, ip), expected, "{input}");
        }
    }

    #[test]
    fn quoting_survives_single_quotes() {
        assert_eq!(shell_quote("it's"), r"'it'\''s'");
    }
}
