//! Installing the host the way the README's "Running the host in a cluster" says, for the
//! install suite and the demo: the host's image made from `deploy/Dockerfile` under the name
//! `deploy/deployment.yaml` runs, and the README's `kubectl` lines run as written.

use std::path::{Path, PathBuf};
use std::process::Command;

use serde::Deserialize;

use crate::images::{DockerfileImage, ImageSpec};
use crate::{Error, Result};

/// The image `deploy/deployment.yaml` under `root` runs (`policy-host:0.1.0`).
pub fn deployment_image(root: &Path) -> Result<String> {
    let path = root.join("deploy/deployment.yaml");
    let text =
        std::fs::read_to_string(&path).map_err(Error::io(format!("reading {}", path.display())))?;
    // The Deployment, among the file's documents (its PodDisruptionBudget follows it).
    let mut images = Vec::new();
    for document in serde_yaml::Deserializer::from_str(&text) {
        let object = serde_json::Value::deserialize(document).map_err(|e| Error::Image {
            image: "policy-host".into(),
            problem: format!("{} is not YAML: {e}", path.display()),
        })?;
        if object["kind"] == "Deployment" {
            images.extend(
                object["spec"]["template"]["spec"]["containers"][0]["image"]
                    .as_str()
                    .map(str::to_owned),
            );
        }
    }
    images.pop().ok_or_else(|| Error::Image {
        image: "policy-host".into(),
        problem: format!("{} names no container image", path.display()),
    })
}

/// Where the Dockerfile's build stage leaves the plugins it builds (`cargo build --profile
/// plugin --target wasm32-wasip2`).
const DOCKERFILE_PLUGINS: &str = "/src/target/wasm32-wasip2/plugin/";

/// The host's image as `deploy/Dockerfile` describes it (the final stage's files, user,
/// entrypoint, command; the base's CA bundle), named as `deploy/deployment.yaml` runs it,
/// with `host` (a dev build stands in for the release one, at the same path) and the plugin
/// components it bundles taken from `plugins`, a directory holding them under the names the
/// Dockerfile copies (whichever plugins those are).
pub fn host_image(root: &Path, host: &Path, plugins: &Path) -> Result<ImageSpec> {
    let path = root.join("deploy/Dockerfile");
    let text =
        std::fs::read_to_string(&path).map_err(Error::io(format!("reading {}", path.display())))?;
    let dockerfile = DockerfileImage::parse(&text).map_err(|e| Error::Image {
        image: "policy-host".into(),
        problem: e.to_string(),
    })?;
    let name = deployment_image(root)?;
    dockerfile.image_spec(&name, |source| match source {
        "/src/target/release/policy-host" => Some(host.to_owned()),
        _ => source
            .strip_prefix(DOCKERFILE_PLUGINS)
            .map(|file| plugins.join(file)),
    })
}

/// The lines of the README's "Running the host in a cluster" shell block, without comments.
pub fn readme_install_commands(root: &Path) -> Result<Vec<String>> {
    let path = root.join("README.md");
    let readme =
        std::fs::read_to_string(&path).map_err(Error::io(format!("reading {}", path.display())))?;
    let not_found = |what: &str| Error::Command {
        what: format!("reading the install commands of {}", path.display()),
        output: format!(
            "{what}; keep the section \"## Running the host in a cluster\" with a ```sh block"
        ),
    };
    let section = readme
        .split("## Running the host in a cluster")
        .nth(1)
        .ok_or_else(|| not_found("no \"Running the host in a cluster\" section"))?;
    let block = section
        .split("```sh")
        .nth(1)
        .and_then(|rest| rest.split("```").next())
        .ok_or_else(|| not_found("the section has no ```sh block"))?;
    Ok(block
        .lines()
        .map(|line| line.split(" #").next().unwrap_or(line).trim().to_owned())
        .filter(|line| !line.is_empty())
        .collect())
}

/// Runs the README's install commands from `root` with `kubectl` and `kubeconfig`: every
/// `kubectl` line as written but `kubectl get` (a look, not a step), and no `docker build`
/// (the image is made locally from the same Dockerfile, [`host_image`]). Returns the lines run.
pub fn run_readme_install(root: &Path, kubectl: &Path, kubeconfig: &Path) -> Result<Vec<String>> {
    let mut ran = Vec::new();
    for line in readme_install_commands(root)? {
        let words: Vec<&str> = line.split_whitespace().collect();
        match words.as_slice() {
            ["docker", "build", ..] | ["kubectl", "get", ..] => continue,
            ["kubectl", args @ ..] => {
                run_kubectl(root, kubectl, kubeconfig, args)?;
                ran.push(line.clone());
            }
            _ => {
                return Err(Error::Command {
                    what: line.clone(),
                    output: "the README's install block runs a command the install step does not know; teach run_readme_install".into(),
                });
            }
        }
    }
    Ok(ran)
}

/// Runs `kubectl args` from `dir` with `kubeconfig`, returning its standard output.
pub fn run_kubectl(dir: &Path, kubectl: &Path, kubeconfig: &Path, args: &[&str]) -> Result<String> {
    let output = Command::new(kubectl)
        .current_dir(dir)
        .env("KUBECONFIG", kubeconfig)
        .args(args)
        .output()
        .map_err(Error::io(format!("running {}", kubectl.display())))?;
    if output.status.success() {
        Ok(String::from_utf8_lossy(&output.stdout).into_owned())
    } else {
        Err(Error::Command {
            what: format!("kubectl {}", args.join(" ")),
            output: String::from_utf8_lossy(&output.stderr).into_owned(),
        })
    }
}

/// Where `cargo build -p policy-host` puts the binary: `CARGO_TARGET_DIR` or `root/target`.
pub fn host_binary_path(root: &Path) -> PathBuf {
    std::env::var_os("CARGO_TARGET_DIR")
        .map(PathBuf::from)
        .unwrap_or_else(|| root.join("target"))
        .join("debug/policy-host")
}
