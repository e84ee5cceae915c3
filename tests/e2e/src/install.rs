//! Installing the host the way the README says, on the real node: its image made from
//! `deploy/Dockerfile` with the binaries built here, and `kubectl` (from the cache) running the
//! README's commands against the shared node environment.

use std::path::{Path, PathBuf};
use std::process::Command;
use std::sync::OnceLock;

use policy_host_testenv::NodeEnv;
use policy_host_testenv::images::DockerfileImage;

use crate::repo_root;

/// The image `deploy/deployment.yaml` runs.
pub fn deployment_image() -> anyhow::Result<String> {
    let text = std::fs::read_to_string(repo_root().join("deploy/deployment.yaml"))?;
    let deployment: serde_json::Value = serde_yaml::from_str(&text)?;
    deployment["spec"]["template"]["spec"]["containers"][0]["image"]
        .as_str()
        .map(str::to_owned)
        .ok_or_else(|| anyhow::anyhow!("deploy/deployment.yaml names no container image"))
}

/// Builds the `policy-host` binary (dev profile) once per process and returns its path.
///
/// The Dockerfile builds it with `--release`; the local image takes the dev build instead, at
/// the same path in the image: a release build of the host's dependencies would cost a cold
/// compile of its own (wasmtime, Cranelift, kube) on every machine that runs the tests.
pub fn host_binary() -> anyhow::Result<PathBuf> {
    static BUILT: OnceLock<Result<PathBuf, String>> = OnceLock::new();
    BUILT
        .get_or_init(|| {
            let cargo = std::env::var("CARGO").unwrap_or_else(|_| "cargo".into());
            let target = target_dir();
            let status = Command::new(&cargo)
                .current_dir(repo_root())
                .args([
                    "build",
                    "--quiet",
                    "-p",
                    "policy-host",
                    "--bin",
                    "policy-host",
                ])
                .arg("--target-dir")
                .arg(&target)
                .status()
                .map_err(|e| format!("cannot run `{cargo} build -p policy-host`: {e}"))?;
            if !status.success() {
                return Err(format!(
                    "`cargo build -p policy-host` failed ({status}); the compiler output is above"
                ));
            }
            Ok(target.join("debug/policy-host"))
        })
        .clone()
        .map_err(anyhow::Error::msg)
}

/// The target directory of this build (`CARGO_TARGET_DIR`, else the workspace's `target`).
fn target_dir() -> PathBuf {
    std::env::var_os("CARGO_TARGET_DIR")
        .map(PathBuf::from)
        .unwrap_or_else(|| repo_root().join("target"))
}

/// Makes the host's image as `deploy/Dockerfile` describes it (the final stage's files, user,
/// entrypoint and command; the base's CA bundle) under the name `deploy/deployment.yaml` uses,
/// and imports it into the node.
pub fn load_host_image(env: &NodeEnv) -> anyhow::Result<String> {
    let dockerfile = DockerfileImage::parse(&std::fs::read_to_string(
        repo_root().join("deploy/Dockerfile"),
    )?)?;
    let host = host_binary()?;
    let plugin =
        policy_host_test_plugins::build("guest-etcd").map_err(|e| anyhow::anyhow!("{e}"))?;
    let name = deployment_image()?;
    let spec = dockerfile.image_spec(&name, |source| match source {
        "/src/target/release/policy-host" => Some(host.clone()),
        "/src/target/wasm32-wasip2/plugin/guest_etcd.wasm" => Some(plugin.clone()),
        _ => None,
    })?;
    env.load_image(&spec)?;
    Ok(name)
}

/// Runs the cache's kubectl with the environment's kubeconfig, from the repository root (so
/// the README's relative paths work), and returns its standard output.
pub fn kubectl(env: &NodeEnv, args: &[&str]) -> anyhow::Result<String> {
    kubectl_in(env, &repo_root(), args)
}

fn kubectl_in(env: &NodeEnv, dir: &Path, args: &[&str]) -> anyhow::Result<String> {
    let output = Command::new(env.binaries().kubectl())
        .current_dir(dir)
        .env("KUBECONFIG", env.kubeconfig_path())
        .args(args)
        .output()?;
    if !output.status.success() {
        anyhow::bail!(
            "kubectl {} failed: {}",
            args.join(" "),
            String::from_utf8_lossy(&output.stderr)
        );
    }
    Ok(String::from_utf8_lossy(&output.stdout).into_owned())
}
