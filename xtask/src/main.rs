//! Project tasks, run as `cargo xtask <task>`: the README's commands live here so that they are
//! the same on a laptop, in CI and in the docs.
//!
//! - `setup`: the wasm target, the real control-plane and etcd binaries (cached), the plugins;
//! - `test`: `setup`, then every test in the workspace, end-to-end suites included;
//! - `lint`: `cargo fmt --check` and clippy with warnings denied;
//! - `crdgen`: writes `deploy/crds/` from the plugins' Rust types;
//! - `pack-policies`: builds the etcd, redis and mariadb plugins and writes their bundles (CRD,
//!   ClusterRole, ConfigMap) to `policies/`;
//! - `demo`: a local control plane, the host with the etcd plugin, an `EtcdCluster` converging.

mod demo;

use std::path::{Path, PathBuf};
use std::process::Command;

use anyhow::{Context, bail};
use clap::{Parser, Subcommand};

#[derive(Parser)]
#[command(name = "cargo xtask", about = "policy-host project tasks")]
struct Cli {
    #[command(subcommand)]
    task: Task,
}

#[derive(Subcommand)]
enum Task {
    /// Install the wasm target, build (or find cached) control-plane and etcd binaries, build plugins.
    Setup,
    /// Run setup, then every test of the workspace (unit, sandbox, end-to-end).
    Test {
        /// Extra arguments for `cargo test` (after `--`).
        #[arg(last = true)]
        cargo_test_args: Vec<String>,
    },
    /// Check formatting and clippy (warnings are errors).
    Lint,
    /// Write the CRDs in deploy/crds/ from the plugins' Rust types.
    Crdgen {
        /// Fail if the files on disk differ from the generated ones instead of writing them.
        #[arg(long)]
        check: bool,
    },
    /// Build the etcd, redis and mariadb plugins and write their bundles (CRD, ClusterRole, ConfigMap) to policies/ (`policy-host pack --bundle`).
    PackPolicies {
        /// Fail if the file on disk differs from the generated one instead of writing it.
        #[arg(long)]
        check: bool,
    },
    /// Start a local control plane, the host with the etcd plugin, and an example EtcdCluster.
    Demo {
        /// The EtcdCluster manifest to apply.
        #[arg(long, default_value = "deploy/examples/etcd-cluster.yaml")]
        cluster: PathBuf,
    },
    /// Create a new plugin crate from the template (wit/sdk/template), as `policy-host new-plugin`
    /// does; see wit/sdk/README.md.
    NewPlugin {
        /// Plugin name, a DNS label such as `redis` or `my-app`.
        name: String,
        /// Where to write it (relative to the workspace root); default `../<name>`.
        #[arg(long)]
        dir: Option<PathBuf>,
    },
}

fn main() -> anyhow::Result<()> {
    let cli = Cli::parse();
    let root = workspace_root();
    std::env::set_current_dir(&root).context("cannot enter the workspace root")?;
    match cli.task {
        Task::Setup => setup(&root),
        Task::NewPlugin { name, dir } => {
            // The CLI's own command (`policy-host new-plugin`), from the checkout.
            let dir = dir.unwrap_or_else(|| root.join("..").join(&name));
            policy_host::plugin_cli::new_plugin::new_plugin(&name, &dir)?;
            println!(
                "created plugin `{name}` in {}; next: its README.md (cargo test, build, pack, the end-to-end test)",
                dir.display()
            );
            Ok(())
        }
        Task::Test { cargo_test_args } => test(&root, &cargo_test_args),
        Task::Lint => {
            step("cargo fmt --check");
            run(policy_host_test_plugins::cargo_command().args(["fmt", "--all", "--", "--check"]))?;
            step("cargo clippy (warnings are errors)");
            run(policy_host_test_plugins::cargo_command().args([
                "clippy",
                "--workspace",
                "--all-targets",
                "--",
                "-D",
                "warnings",
            ]))
        }
        Task::Crdgen { check } => crdgen(&root, check),
        Task::PackPolicies { check } => pack_policies(&root, check),
        Task::Demo { cluster } => demo::run(&root, &cluster),
    }
}

fn workspace_root() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR"))
        .parent()
        .map(Path::to_path_buf)
        .unwrap_or_else(|| PathBuf::from("."))
}

fn step(what: &str) {
    eprintln!("\n==> {what}");
}

fn run(command: &mut Command) -> anyhow::Result<()> {
    let status = command
        .status()
        .with_context(|| format!("cannot start {command:?}"))?;
    if !status.success() {
        bail!("{command:?} failed with {status}");
    }
    Ok(())
}

fn setup(root: &Path) -> anyhow::Result<()> {
    wasm_target()?;
    step("control-plane, etcd and node binaries (cached after the first build; cold ~20 min)");
    run(Command::new("bash").arg(root.join("tests/env/build-binaries.sh")))?;
    plugins()
}

/// `setup`, then every test. On a cold machine the two long builds overlap: the Go programs
/// build while the plugins and the Rust test binaries do (neither keeps both cores busy all the
/// time), and the ones only a few suites need (MinIO and mc, helm) build at the lowest priority
/// while the first suites run, which mostly wait on etcd and the API server. A suite that gets
/// there first waits for that build (`build-binaries.sh` builds a family once at a time).
fn test(root: &Path, cargo_test_args: &[String]) -> anyhow::Result<()> {
    let script = root.join("tests/env/build-binaries.sh");
    wasm_target()?;
    step(
        "control-plane, etcd and node binaries, building beside the Rust build (cached after the first build)",
    );
    let mut go = Background::spawn(Command::new("bash").arg(&script), "build-binaries.sh")?;
    // The plugins build into their own target directory (target/plugins), so beside the test
    // binaries: each ends in a one-core LTO link that would otherwise leave a core idle.
    let plugins_built = std::thread::spawn(plugins);
    step(
        "cargo test --workspace --no-run (the test binaries, beside the plugins and the Go programs)",
    );
    let built =
        run(policy_host_test_plugins::cargo_command().args(["test", "--workspace", "--no-run"]));
    let plugins_built = plugins_built
        .join()
        .unwrap_or_else(|_| Err(anyhow::anyhow!("the plugin build thread panicked")));
    let go_built = go.wait();
    built?;
    plugins_built?;
    go_built?;
    let log = root.join("target/build-binaries-helm.log");
    step(&format!(
        "helm, then the OCI registry, build in the background at the lowest priority (log: {}), and the images the plugins declare are made beside the first suites",
        log.display()
    ));
    let file =
        std::fs::File::create(&log).with_context(|| format!("cannot create {}", log.display()))?;
    // One family at a time, each under its own lock: a suite that needs the registry before
    // it is built waits for this build rather than starting a second (on a cold machine the
    // OCI suite otherwise built it on demand, late, at the end of the run).
    let mut late = Background::spawn(
        Command::new("nice")
            .args([
                "-n",
                "19",
                "bash",
                "-c",
                r#"bash "$0" helm && bash "$0" registry"#,
            ])
            .arg(&script)
            .stdout(file.try_clone()?)
            .stderr(file),
        "build-binaries.sh helm, registry",
    )?;
    let images_root = root.to_owned();
    let images_made = std::thread::spawn(move || declared_images(&images_root));
    step("cargo test --workspace (unit, sandbox and end-to-end suites)");
    let tested = run(policy_host_test_plugins::cargo_command()
        // Not --all-targets: benches are bench binaries, run by `cargo bench`.
        .args(["test", "--workspace"])
        .args(["--", "--test-threads", "4"])
        .args(cargo_test_args));
    if tested.is_err() {
        late.stop();
    }
    let late_built = late.wait();
    let images_made = images_made
        .join()
        .unwrap_or_else(|_| Err(anyhow::anyhow!("the image thread panicked")));
    tested?;
    images_made?;
    late_built
}

/// The declaration files of the images the suites run: the ones every suite finds on the node,
/// and those a few suites load on demand (mc for S3, MariaDB).
const DECLARED_IMAGES: &[&str] = &[
    "tests/e2e/test-images.yaml",
    "guest-etcd/test-images-s3.yaml",
    "guest-mariadb/test-images.yaml",
];

/// Makes (or finds cached) the images of [`DECLARED_IMAGES`], so that no suite waits for a cold
/// Go build or a Debian download (a suite that gets there first waits for the same build).
fn declared_images(root: &Path) -> anyhow::Result<()> {
    let binaries = policy_host_testenv::Binaries::ensure()?;
    for file in DECLARED_IMAGES {
        for declaration in policy_host_testenv::images::Declarations::read(&root.join(file))?.images
        {
            declaration.make(&binaries)?;
        }
    }
    Ok(())
}

/// A build running beside others; stopped (by its process group) if dropped unfinished.
struct Background {
    child: Option<std::process::Child>,
    what: &'static str,
}

impl Background {
    fn spawn(command: &mut Command, what: &'static str) -> anyhow::Result<Background> {
        use std::os::unix::process::CommandExt as _;
        let child = command
            .process_group(0)
            .spawn()
            .with_context(|| format!("cannot start {what}"))?;
        Ok(Background {
            child: Some(child),
            what,
        })
    }

    fn wait(&mut self) -> anyhow::Result<()> {
        let Some(mut child) = self.child.take() else {
            return Ok(());
        };
        let status = child
            .wait()
            .with_context(|| format!("waiting for {}", self.what))?;
        if !status.success() {
            bail!("{} failed with {status}; its output says why", self.what);
        }
        Ok(())
    }

    fn stop(&mut self) {
        if let Some(child) = &self.child
            && let Ok(pid) = i32::try_from(child.id())
        {
            // The whole group: bash and the go builds it started.
            let _ = Command::new("kill")
                .args(["-TERM", "--", &format!("-{pid}")])
                .status();
        }
    }
}

impl Drop for Background {
    fn drop(&mut self) {
        self.stop();
        if let Some(mut child) = self.child.take() {
            let _ = child.wait();
        }
    }
}

fn wasm_target() -> anyhow::Result<()> {
    step("rustup target add wasm32-wasip2");
    if Command::new("rustup").arg("--version").output().is_ok() {
        run(Command::new("rustup").args(["target", "add", "wasm32-wasip2"]))?;
    } else {
        eprintln!("rustup not found: assuming the toolchain already has wasm32-wasip2");
    }
    Ok(())
}

fn plugins() -> anyhow::Result<()> {
    step("plugins (wasm32-wasip2)");
    for plugin in [
        "guest-etcd",
        "guest-etcd-backup",
        "guest-etcd-restore",
        "guest-redis",
        "guest-mariadb",
        "misbehaving-policy",
        "session-toy-policy",
    ] {
        let path = policy_host_test_plugins::build(plugin).map_err(|e| anyhow::anyhow!("{e}"))?;
        let size = std::fs::metadata(&path).map(|m| m.len()).unwrap_or(0);
        eprintln!("built {} ({} KiB)", path.display(), size / 1024);
    }
    Ok(())
}

fn crdgen(root: &Path, check: bool) -> anyhow::Result<()> {
    let crds = [
        (
            "etcdcluster.yaml",
            "guest-etcd-core/src/spec.rs",
            guest_etcd::spec::custom_resource_definition(),
        ),
        (
            "etcdbackup.yaml",
            "guest-etcd-backup/src/spec.rs",
            guest_etcd_backup::spec::custom_resource_definition(),
        ),
        (
            "etcdrestore.yaml",
            "guest-etcd-restore/src/spec.rs",
            guest_etcd_restore::spec::custom_resource_definition(),
        ),
        (
            "redisreplication.yaml",
            "guest-redis/src/spec.rs",
            guest_redis::spec::custom_resource_definition(),
        ),
        (
            "mariadbcluster.yaml",
            "guest-mariadb/src/spec.rs",
            guest_mariadb::spec::custom_resource_definition(),
        ),
    ];
    std::fs::create_dir_all(root.join("deploy/crds"))?;
    for (file, source, crd) in crds {
        let yaml = format!(
            "# Generated by `cargo xtask crdgen` from {source}. Do not edit by hand.\n{}",
            serde_yaml::to_string(&crd).context("cannot render the CRD as YAML")?
        );
        let path = root.join("deploy/crds").join(file);
        if check {
            let on_disk = std::fs::read_to_string(&path).unwrap_or_default();
            if on_disk != yaml {
                bail!(
                    "{} is out of date with {source}; run `cargo xtask crdgen` and commit it",
                    path.display()
                );
            }
            eprintln!("{} is up to date", path.display());
            continue;
        }
        std::fs::write(&path, yaml).with_context(|| format!("cannot write {}", path.display()))?;
        eprintln!("wrote {}", path.display());
    }
    Ok(())
}

/// Bundles the plugins with the host's own `pack --bundle` command, so each file in
/// `policies/` is exactly what an admin gets from the CLI: the plugin's generated CRD (from
/// `deploy/crds/`, so run `crdgen` first), the ClusterRole its kinds need, and the ConfigMap
/// in namespace `policy-host` with host default limits and the grant each asks for: etcd and
/// etcd-backup app-calls to the `client` port of their own pods (the etcd gateway), redis
/// exchanges with the `redis` port of its own pods, mariadb sessions with the `mysql` port of
/// its own pods and the Secret `<parent>-credentials` (generated when absent), etcd-restore
/// none (it only creates an EtcdCluster); and the images their pods may run: the etcd images
/// (upstream's and the classic operator's) and `minio/mc` for the etcd plugins, `redis` for
/// redis, `mariadb` and `minio/mc` (backups to S3) for mariadb.
fn pack_policies(root: &Path, check: bool) -> anyhow::Result<()> {
    let plugins: [(&str, &str, &[&str], &str, &str); 5] = [
        (
            "guest-etcd",
            "plugin-etcd",
            &[
                "--grant",
                "client",
                "--grant-image",
                "gcr.io/etcd-development/etcd",
                "--grant-image",
                "quay.io/coreos/etcd",
                "--grant-image",
                "minio/mc",
            ],
            "deploy/crds/etcdcluster.yaml",
            "policies/etcd.yaml",
        ),
        (
            "guest-etcd-backup",
            "plugin-etcd-backup",
            &[
                "--grant",
                "client",
                "--grant-image",
                "gcr.io/etcd-development/etcd",
                "--grant-image",
                "quay.io/coreos/etcd",
                "--grant-image",
                "minio/mc",
            ],
            "deploy/crds/etcdbackup.yaml",
            "policies/etcd-backup.yaml",
        ),
        (
            "guest-etcd-restore",
            "plugin-etcd-restore",
            &[],
            "deploy/crds/etcdrestore.yaml",
            "policies/etcd-restore.yaml",
        ),
        (
            "guest-redis",
            "plugin-redis",
            &["--grant-exchange", "redis", "--grant-image", "redis"],
            "deploy/crds/redisreplication.yaml",
            "policies/redis.yaml",
        ),
        (
            "guest-mariadb",
            "plugin-mariadb",
            &[
                "--grant-exchange",
                "mysql",
                "--grant-image",
                "mariadb",
                "--grant-image",
                "minio/mc",
                "--grant-secret",
                "{parent}-credentials:root-password,replication-password",
            ],
            "deploy/crds/mariadbcluster.yaml",
            "policies/mariadb.yaml",
        ),
    ];
    for (package, config_map, grant, crd, file) in plugins {
        step(&format!("build {package} (wasm32-wasip2, plugin profile)"));
        let wasm = policy_host_test_plugins::build(package).map_err(|e| anyhow::anyhow!("{e}"))?;
        step("policy-host pack");
        let output = policy_host_test_plugins::cargo_command()
            .args(["run", "--quiet", "-p", "policy-host", "--", "pack"])
            .arg(&wasm)
            .args(["--name", config_map, "--namespace", "policy-host"])
            .args(grant)
            .args(["--bundle", "--crd"])
            .arg(root.join(crd))
            .output()
            .context("cannot run `cargo run -p policy-host -- pack`")?;
        if !output.status.success() {
            bail!(
                "policy-host pack failed ({}): {}",
                output.status,
                String::from_utf8_lossy(&output.stderr)
            );
        }
        let yaml = String::from_utf8(output.stdout).context("pack wrote non-UTF-8 YAML")?;
        let path = root.join(file);
        if check {
            let on_disk = std::fs::read_to_string(&path).unwrap_or_default();
            if on_disk != yaml {
                bail!(
                    "{} is out of date with {package}; run `cargo xtask pack-policies` and commit it",
                    path.display()
                );
            }
            eprintln!("{} is up to date", path.display());
            continue;
        }
        std::fs::create_dir_all(root.join("policies"))?;
        std::fs::write(&path, yaml).with_context(|| format!("cannot write {}", path.display()))?;
        eprintln!("wrote {}", path.display());
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use std::collections::BTreeSet;

    use super::workspace_root;

    /// Every package with its features, as `cargo tree` resolves them for `args`.
    fn resolved(args: &[&str]) -> Result<BTreeSet<String>, String> {
        let output = policy_host_test_plugins::cargo_command()
            .current_dir(workspace_root())
            .args(["tree", "--offline", "--prefix", "none", "--no-dedupe"])
            .args(["--format", "{p} [{f}]"])
            .args(args)
            .output()
            .map_err(|e| format!("cannot run cargo tree: {e}"))?;
        if !output.status.success() {
            return Err(format!(
                "cargo tree {args:?} failed: {}",
                String::from_utf8_lossy(&output.stderr)
            ));
        }
        Ok(String::from_utf8_lossy(&output.stdout)
            .lines()
            .map(str::to_owned)
            .collect())
    }

    /// Why: a cold CI run builds xtask first, then the test binaries; a dependency resolved
    /// with other features for xtask is compiled twice (see xtask/Cargo.toml).
    #[test]
    fn xtask_builds_its_dependencies_as_the_test_build_does() -> Result<(), String> {
        let xtask = resolved(&["--package", "xtask", "--edges", "normal,build"])?;
        let workspace = resolved(&["--workspace", "--edges", "normal,build,dev"])?;
        let differing: Vec<&String> = xtask.difference(&workspace).collect();
        assert!(
            differing.is_empty(),
            "these are resolved with other features for `cargo xtask` than for `cargo test \
             --workspace`, so a cold build compiles them twice; add the dependency that enables \
             the missing features to xtask/Cargo.toml's unifying section: {differing:#?}"
        );
        Ok(())
    }
}
