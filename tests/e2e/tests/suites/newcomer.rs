//! A plugin author's path outside the tree, as the commands they type: `policy-host new-plugin`
//! (the CLI alone, no checkout), then the new crate's *own* end-to-end test (`e2e/`, which
//! depends on policy-host's test environment as envtest users depend on envtest), run with
//! `cargo test --manifest-path e2e/Cargo.toml`: it builds the component, packs its bundle with
//! the CLI, starts a `policy-host` host, and waits for its example to become Ready on the real
//! node with the app Pod on the image its `test-images.yaml` declares.
//!
//! Two things differ from an author's machine: the crate's dependency on the test environment
//! (by the project's repository, `{ git = … }`) is pointed at this checkout's `tests/`, so what
//! is tested is this tree (cargo's `[patch]` would still fetch the repository first); and its
//! test attaches to this process's node (`POLICY_HOST_TESTENV_ATTACH`), as one node runs per
//! machine. The crate's `e2e/Cargo.lock` is the one `new-plugin` writes (the workspace's
//! resolution): after the run every package it used is at a version the workspace is tested with.

use std::path::PathBuf;
use std::process::Command;

use policy_host_e2e::{init_logging, install::host_binary, repo_root};
use policy_host_testenv::{ATTACH_VAR, shared_node};

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_new_plugin_passes_its_own_end_to_end_test_on_the_real_node() -> anyhow::Result<()> {
    init_logging();
    let env = shared_node().await?;
    let cli = tokio::task::spawn_blocking(host_binary).await??;
    let work = repo_root().join("target/template-test");
    let dir = work.join("newcomer");
    if dir.exists() {
        std::fs::remove_dir_all(&dir)?;
    }
    let created = Command::new(&cli)
        .args(["new-plugin", "newcomer", "--dir"])
        .arg(&dir)
        .output()?;
    anyhow::ensure!(
        created.status.success(),
        "policy-host new-plugin failed: {}",
        String::from_utf8_lossy(&created.stderr)
    );
    let manifest = dir.join("e2e/Cargo.toml");
    let by_repository = format!(
        "policy-host-testenv = {{ git = \"{}\" }}",
        policy_host::plugin_cli::new_plugin::repository()?
    );
    let text = std::fs::read_to_string(&manifest)?;
    anyhow::ensure!(
        text.contains(&by_repository),
        "the new crate's e2e/Cargo.toml does not depend on the test environment by the project's repository ({by_repository}):\n{text}"
    );
    let by_path = format!(
        "policy-host-testenv = {{ path = \"{}\" }}",
        repo_root().join("tests").display()
    );
    std::fs::write(&manifest, text.replace(&by_repository, &by_path))?;
    // The crate comes with the workspace's resolution, so that the test environment builds
    // with the versions this tree is tested with, not whatever the registry has newest.
    let lock = dir.join("e2e/Cargo.lock");
    anyhow::ensure!(
        lock.exists(),
        "policy-host new-plugin wrote no e2e/Cargo.lock: the test environment would build with whatever versions the registry has newest"
    );
    let attach = env.attach_file()?;
    let cargo = std::env::var_os("CARGO").unwrap_or_else(|| "cargo".into());
    // Its own target directory, shared with the template test's builds of the same
    // dependencies (host/tests/template.rs); at a lower priority than the suites beside it.
    let target: PathBuf = work.join("target");
    let output = tokio::process::Command::new("nice")
        .args(["-n", "10"])
        .arg(cargo)
        .current_dir(&dir)
        .args(["test", "--manifest-path", "e2e/Cargo.toml"])
        .env("CARGO_TARGET_DIR", &target)
        .env("POLICY_HOST", &cli)
        .env(ATTACH_VAR, &attach)
        // The outer test's cargo settings are not the new plugin's.
        .env_remove("RUSTFLAGS")
        .env_remove("CARGO_MANIFEST_DIR")
        .output()
        .await?;
    anyhow::ensure!(
        output.status.success(),
        "the new plugin's own end-to-end test failed ({}):\n{}\n{}",
        output.status,
        String::from_utf8_lossy(&output.stdout),
        String::from_utf8_lossy(&output.stderr)
    );
    let stdout = String::from_utf8_lossy(&output.stdout);
    anyhow::ensure!(
        stdout.contains("test the_example_becomes_ready_on_a_real_node ... ok"),
        "the new plugin's end-to-end test did not run: {stdout}"
    );
    // Cargo kept the pins: every package the new crate's build used is at a version the
    // workspace is tested with.
    let tested = locked_versions(&std::fs::read_to_string(repo_root().join("Cargo.lock"))?);
    let used = locked_versions(&std::fs::read_to_string(&lock)?);
    let moved: Vec<String> = used
        .iter()
        .filter(|(name, _)| tested.iter().any(|(n, _)| n == name))
        .filter(|package| !tested.contains(package))
        .map(|(name, version)| format!("{name} {version}"))
        .collect();
    anyhow::ensure!(
        moved.is_empty() && used.len() > 100,
        "the new crate's build resolved {} packages, these at versions the workspace does not use: {moved:?}",
        used.len()
    );
    Ok(())
}

/// The `(name, version)` of each `[[package]]` of a Cargo.lock.
fn locked_versions(lock: &str) -> Vec<(String, String)> {
    let mut packages = Vec::new();
    let mut name = None;
    for line in lock.lines() {
        if line == "[[package]]" {
            name = None;
        } else if let Some(value) = line.strip_prefix("name = ") {
            name = Some(value.trim_matches('"').to_owned());
        } else if let (Some(value), Some(n)) = (line.strip_prefix("version = "), name.take()) {
            packages.push((n, value.trim_matches('"').to_owned()));
        }
    }
    packages
}
