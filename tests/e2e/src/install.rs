//! Installing the host the way the README says, on the real node: its image made from
//! `deploy/Dockerfile` with the binaries built here, and `kubectl` (from the cache) running the
//! README's commands against the shared node environment.

use std::path::PathBuf;
use std::sync::OnceLock;

use policy_host_testenv::{TestEnv, install};

use crate::repo_root;

/// Builds the `policy-host` binary (dev profile) once per process and returns its path.
///
/// The Dockerfile builds it with `--release`; the local image takes the dev build instead, at
/// the same path in the image: a release build of the host's dependencies would cost a cold
/// compile of its own (wasmtime, Cranelift, kube) on every machine that runs the tests.
///
/// It is built by the README's test command itself, `cargo test --workspace` (`--no-run`):
/// the host's integration tests need the binary, so that build makes it, and under
/// `cargo xtask test` this finds it built and returns at once. Any narrower command resolves
/// other features and recompiles part of the dependency tree: `cargo build -p policy-host`
/// took 13 minutes on a cold 2-core machine (BENCHMARKS.md), and even a target filter
/// (`--test rbac`) leaves the end-to-end crate's dev-dependencies out and rebuilds rustls and
/// ring.
pub fn host_binary() -> anyhow::Result<PathBuf> {
    static BUILT: OnceLock<Result<PathBuf, String>> = OnceLock::new();
    BUILT
        .get_or_init(|| {
            let target = target_dir();
            let command = "cargo test --workspace --no-run";
            let status = policy_host_test_plugins::cargo_command()
                .current_dir(repo_root())
                .args(["test", "--quiet", "--workspace", "--no-run"])
                .arg("--target-dir")
                .arg(&target)
                .status()
                .map_err(|e| format!("cannot run `{command}`: {e}"))?;
            if !status.success() {
                return Err(format!(
                    "`{command}` failed ({status}); the compiler output is above"
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

/// Makes the host's image as `deploy/Dockerfile` describes it, under the name
/// `deploy/deployment.yaml` uses, imports it into the node, and returns the name.
pub fn load_host_image(env: &TestEnv) -> anyhow::Result<String> {
    let host = host_binary()?;
    // The plugin deploy/Dockerfile bundles, built where the others are.
    let plugin =
        policy_host_test_plugins::build("guest-etcd").map_err(|e| anyhow::anyhow!("{e}"))?;
    let plugins = plugin
        .parent()
        .ok_or_else(|| anyhow::anyhow!("{} has no directory", plugin.display()))?;
    let spec = install::host_image(&repo_root(), &host, plugins)?;
    env.load_image(&spec)?;
    Ok(spec.name)
}

/// Runs the cache's kubectl with the environment's kubeconfig, from the repository root (so
/// the README's relative paths work), and returns its standard output.
pub fn kubectl(env: &TestEnv, args: &[&str]) -> anyhow::Result<String> {
    Ok(install::run_kubectl(
        &repo_root(),
        &env.binaries().kubectl(),
        env.kubeconfig_path(),
        args,
    )?)
}

/// Runs the README's install commands as written (see
/// [`policy_host_testenv::install::run_readme_install`]); returns the lines run.
pub fn run_readme_install(env: &TestEnv) -> anyhow::Result<Vec<String>> {
    Ok(install::run_readme_install(
        &repo_root(),
        &env.binaries().kubectl(),
        env.kubeconfig_path(),
    )?)
}
