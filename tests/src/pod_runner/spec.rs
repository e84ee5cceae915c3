//! Turning a container spec into a local command line: image mapping, environment, `$(VAR)`
//! expansion and the mount-namespace wrapper.

use std::collections::BTreeMap;
use std::net::Ipv4Addr;
use std::path::{Path, PathBuf};
use std::sync::Arc;

use k8s_openapi::api::core::v1::{ConfigMap, Container, Pod, Secret};
use kube::Api;

use crate::images::ImageSpec;

/// Where a container's programs come from.
#[derive(Debug, Clone)]
pub(crate) enum Image {
    /// An image loaded into the runner ([`crate::PodRunnerHandle::add_image`]): its programs
    /// are taken from its files and tree.
    Loaded(Arc<LoadedImage>),
    /// Any other image: programs are the machine's own.
    Host,
}

/// An image as the pod runner runs it: no container, so its programs run from where they are
/// on this machine, found by the directories below and by basename.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct LoadedImage {
    /// Directories searched for programs, first match wins: those holding the image's files,
    /// then its tree's program directories.
    pub(crate) dirs: Vec<PathBuf>,
    /// The image's entrypoint and default arguments.
    pub(crate) entrypoint: Vec<String>,
    pub(crate) cmd: Vec<String>,
    /// The image's environment, `NAME=value`.
    pub(crate) env: Vec<String>,
}

impl LoadedImage {
    /// The runner's view of `spec`.
    pub(crate) fn of(spec: &ImageSpec) -> LoadedImage {
        let mut dirs: Vec<PathBuf> = Vec::new();
        for file in &spec.files {
            if let Some(parent) = file.source.parent()
                && !dirs.iter().any(|d| d == parent)
            {
                dirs.push(parent.to_path_buf());
            }
        }
        if let Some(tree) = &spec.root {
            dirs.extend(
                crate::images::debian::PROGRAM_DIRS
                    .iter()
                    .map(|d| tree.join(d)),
            );
        }
        LoadedImage {
            dirs,
            entrypoint: spec.entrypoint.clone(),
            cmd: spec.cmd.clone(),
            env: spec.env.clone(),
        }
    }
}

/// Why a container cannot be started (yet): a Kubernetes waiting reason and a message.
#[derive(Debug, Clone)]
pub(crate) struct NotStartable {
    pub(crate) reason: &'static str,
    pub(crate) message: String,
}

/// Maps an image reference to local programs: an image loaded into the runner by that exact
/// name runs its own programs; any other runs the machine's.
pub(crate) fn resolve_image(image: &str, loaded: &BTreeMap<String, Arc<LoadedImage>>) -> Image {
    match loaded.get(image) {
        Some(found) => Image::Loaded(found.clone()),
        None => Image::Host,
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

/// Environment every container of `image` gets unless it sets it itself: the image's own.
pub(crate) fn image_defaults(image: &Image) -> Vec<(String, String)> {
    match image {
        Image::Loaded(loaded) => loaded
            .env
            .iter()
            .filter_map(|pair| pair.split_once('='))
            .map(|(name, value)| (name.to_owned(), value.to_owned()))
            .collect(),
        Image::Host => Vec::new(),
    }
}

/// The `PATH` of a container: the image's program directories first, then the machine's.
pub(crate) fn path_var(image: &Image) -> String {
    let system = "/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin";
    match image {
        Image::Loaded(loaded) => {
            let mut parts: Vec<String> = loaded
                .dirs
                .iter()
                .map(|d| d.display().to_string())
                .collect();
            parts.push(system.to_owned());
            parts.join(":")
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
    // Kubernetes' rule: `command` replaces the entrypoint (and drops the image's cmd);
    // `args` replaces the cmd.
    let (entrypoint, cmd) = match image {
        Image::Loaded(loaded) => (loaded.entrypoint.clone(), loaded.cmd.clone()),
        Image::Host => (Vec::new(), Vec::new()),
    };
    let mut argv: Vec<String> = match &container.command {
        Some(command) if !command.is_empty() => command.clone(),
        _ => entrypoint,
    };
    match &container.args {
        Some(args) if !args.is_empty() => argv.extend(args.iter().cloned()),
        _ if container.command.as_ref().is_none_or(Vec::is_empty) => argv.extend(cmd),
        _ => {}
    }
    if argv.is_empty() {
        // An image the runner was not given is one it cannot "pull"; a loaded one with no
        // entrypoint is the container's configuration at fault.
        let reason = match image {
            Image::Host => "ErrImagePull",
            Image::Loaded(_) => "CreateContainerConfigError",
        };
        return Err(NotStartable {
            reason,
            message: format!(
                "image {} has no entrypoint here (not loaded into the pod runner: declare it in a test-images.yaml; or it declares none); set `command`",
                container.image.clone().unwrap_or_default()
            ),
        });
    }
    let mut argv: Vec<String> = argv
        .iter()
        .map(|a| pod_local(&expand(a, vars), ip))
        .collect();
    resolve_program(&mut argv, image);
    Ok(argv)
}

/// Replaces `argv[0]` by the image's program of the same basename (`/usr/local/bin/app` →
/// where the image's `app` is on this machine), if the image has one.
pub(crate) fn resolve_program(argv: &mut [String], image: &Image) {
    if let (Image::Loaded(loaded), Some(program)) = (image, argv.first_mut()) {
        let base = Path::new(program.as_str())
            .file_name()
            .map(|b| b.to_string_lossy().into_owned())
            .unwrap_or_default();
        if base.is_empty() {
            return;
        }
        if let Some(candidate) = loaded
            .dirs
            .iter()
            .map(|d| d.join(&base))
            .find(|c| c.is_file())
        {
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
