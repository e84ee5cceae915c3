//! Builds plugin components for tests, so `cargo test` on a clean checkout needs no manual
//! build step: each plugin crate is compiled to `wasm32-wasip2` once per test process.
//!
//! The build runs a nested `cargo build` with its own target directory (`target/plugins`):
//! the outer `cargo test` may still hold the lock on the main one, and the plugin artifacts
//! are wasm anyway, so nothing would be shared.

use std::collections::HashMap;
use std::path::{Path, PathBuf};
use std::process::Command;
use std::sync::{Mutex, OnceLock};

/// The cargo profile plugins are built with (see the workspace `Cargo.toml`).
pub const PROFILE: &str = "plugin";

/// The target every plugin is built for.
pub const TARGET: &str = "wasm32-wasip2";

/// Why a plugin could not be built.
#[derive(Debug)]
pub struct BuildError(String);

impl std::fmt::Display for BuildError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(&self.0)
    }
}

impl std::error::Error for BuildError {}

/// The workspace root.
pub fn workspace_root() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("../..")
        .canonicalize()
        .unwrap_or_else(|_| Path::new(env!("CARGO_MANIFEST_DIR")).join("../.."))
}

/// Where plugin builds go.
pub fn target_dir() -> PathBuf {
    workspace_root().join("target/plugins")
}

/// `cargo` (the one running this process, if any) as a top-level invocation: without the
/// variables cargo sets for a program it runs (`CARGO_PKG_NAME`, `CARGO_MANIFEST_DIR`, …).
///
/// Why: some build scripts (ring's) declare `rerun-if-env-changed` on those names, and cargo
/// compares them with its own environment; a nested cargo that inherited them from `cargo
/// xtask` or a test binary would build ring again, and with it everything above it (rustls,
/// kube, the host), and the next top-level cargo would build them back: minutes of a CI run.
pub fn cargo_command() -> Command {
    let mut command = Command::new(std::env::var_os("CARGO").unwrap_or_else(|| "cargo".into()));
    as_top_level(&mut command);
    command
}

/// Removes from `command`'s environment what cargo sets for the program it runs.
fn as_top_level(command: &mut Command) -> &mut Command {
    for (name, _) in std::env::vars_os() {
        let Some(name) = name.to_str() else { continue };
        if name.starts_with("CARGO_PKG_")
            || name.starts_with("CARGO_MANIFEST_")
            || matches!(
                name,
                "CARGO_CRATE_NAME"
                    | "CARGO_BIN_NAME"
                    | "CARGO_PRIMARY_PACKAGE"
                    | "CARGO_TARGET_TMPDIR"
            )
        {
            command.env_remove(name);
        }
    }
    command
}

/// Builds the plugin crate `package` (e.g. `guest-etcd`) and returns the component's path.
/// Built once per process; later calls return the same path.
pub fn build(package: &str) -> Result<PathBuf, BuildError> {
    static BUILT: OnceLock<Mutex<HashMap<String, PathBuf>>> = OnceLock::new();
    let built = BUILT.get_or_init(|| Mutex::new(HashMap::new()));
    let mut built = built.lock().unwrap_or_else(|p| p.into_inner());
    if let Some(path) = built.get(package) {
        return Ok(path.clone());
    }
    ensure_target()?;
    let cargo = std::env::var("CARGO").unwrap_or_else(|_| "cargo".into());
    let status = cargo_command()
        .current_dir(workspace_root())
        .args([
            "build",
            "--quiet",
            "--package",
            package,
            "--target",
            TARGET,
            "--profile",
            PROFILE,
        ])
        .arg("--target-dir")
        .arg(target_dir())
        .args(reproducible_paths())
        .status()
        .map_err(|e| {
            BuildError(format!(
                "cannot run `{cargo} build` for plugin {package}: {e}"
            ))
        })?;
    if !status.success() {
        return Err(BuildError(format!(
            "building plugin {package} for {TARGET} failed ({status}); the compiler output is above"
        )));
    }
    let path = target_dir()
        .join(TARGET)
        .join(PROFILE)
        .join(format!("{}.wasm", package.replace('-', "_")));
    if !path.exists() {
        return Err(BuildError(format!(
            "building plugin {package} succeeded but {} is missing; is its crate-type cdylib?",
            path.display()
        )));
    }
    built.insert(package.to_string(), path.clone());
    Ok(path)
}

/// `--config` arguments that make a plugin's bytes independent of where cargo keeps its
/// crates: the component names the source files of its dependencies (panic locations), and
/// those live under `CARGO_HOME`, which differs between machines and CI caches. Workspace
/// paths are already relative. Only the wasm target's flags: build scripts and proc macros
/// are untouched, so nothing of the host's build is invalidated.
fn reproducible_paths() -> Vec<String> {
    let cargo_home = std::env::var_os("CARGO_HOME")
        .map(PathBuf::from)
        .or_else(|| std::env::var_os("HOME").map(|home| PathBuf::from(home).join(".cargo")));
    let Some(cargo_home) = cargo_home.and_then(|p| p.to_str().map(str::to_owned)) else {
        return Vec::new();
    };
    let flag = format!("--remap-path-prefix={cargo_home}=/cargo");
    let value = toml_string(&flag);
    vec![
        "--config".to_owned(),
        format!("target.{TARGET}.rustflags=[{value}]"),
    ]
}

/// `text` as a TOML basic string (the subset of escaping a path needs).
fn toml_string(text: &str) -> String {
    let mut quoted = String::with_capacity(text.len() + 2);
    quoted.push('"');
    for c in text.chars() {
        match c {
            '"' => quoted.push_str("\\\""),
            '\\' => quoted.push_str("\\\\"),
            c => quoted.push(c),
        }
    }
    quoted.push('"');
    quoted
}

/// Installs the wasm target through rustup when it is missing (a no-op when present).
fn ensure_target() -> Result<(), BuildError> {
    let listed = Command::new("rustup")
        .args(["target", "list", "--installed"])
        .output();
    match listed {
        Ok(out)
            if String::from_utf8_lossy(&out.stdout)
                .lines()
                .any(|l| l.trim() == TARGET) =>
        {
            Ok(())
        }
        Ok(_) => {
            let status = Command::new("rustup")
                .args(["target", "add", TARGET])
                .status()
                .map_err(|e| BuildError(format!("cannot run rustup to add {TARGET}: {e}")))?;
            if status.success() {
                Ok(())
            } else {
                Err(BuildError(format!(
                    "`rustup target add {TARGET}` failed; install the target and retry"
                )))
            }
        }
        // No rustup: assume the toolchain has the target; cargo will say if not.
        Err(_) => Ok(()),
    }
}

/// Builds the misbehaving plugin reporting `version` (in `describe` and in the status it
/// writes) and returns a copy of the component unique to that version, for hot-swap tests.
///
/// Builds go to their own target directory (`target/plugin-versions`), so they never race the
/// plain builds of [`build`]; only the final crate recompiles between versions.
pub fn build_version(version: &str) -> Result<PathBuf, BuildError> {
    static BUILDING: Mutex<()> = Mutex::new(());
    let _one_at_a_time = BUILDING.lock().unwrap_or_else(|p| p.into_inner());
    let out = workspace_root()
        .join("target/plugin-versions")
        .join(format!("misbehaving-{version}.wasm"));
    ensure_target()?;
    let cargo = std::env::var("CARGO").unwrap_or_else(|_| "cargo".into());
    let target_dir = workspace_root().join("target/plugin-versions");
    let status = cargo_command()
        .current_dir(workspace_root())
        .env("MISBEHAVING_POLICY_VERSION", version)
        .args([
            "build",
            "--quiet",
            "--package",
            "misbehaving-policy",
            "--target",
            TARGET,
            "--profile",
            PROFILE,
        ])
        .arg("--target-dir")
        .arg(&target_dir)
        .args(reproducible_paths())
        .status()
        .map_err(|e| {
            BuildError(format!(
                "cannot run `{cargo} build` for misbehaving-policy {version}: {e}"
            ))
        })?;
    if !status.success() {
        return Err(BuildError(format!(
            "building misbehaving-policy {version} failed ({status}); the compiler output is above"
        )));
    }
    let built = target_dir
        .join(TARGET)
        .join(PROFILE)
        .join("misbehaving_policy.wasm");
    std::fs::copy(&built, &out).map_err(|e| {
        BuildError(format!(
            "cannot copy {} to {}: {e}",
            built.display(),
            out.display()
        ))
    })?;
    Ok(out)
}

#[cfg(test)]
mod tests {
    use std::process::Command;

    use super::{as_top_level, build};

    /// A test binary run by cargo has `CARGO_PKG_NAME` set, as a program run by `cargo xtask`
    /// has: a nested cargo must not see it (see [`super::cargo_command`]).
    #[test]
    fn a_nested_cargo_does_not_inherit_what_cargo_set_for_its_parent() -> Result<(), String> {
        assert!(
            std::env::var_os("CARGO_PKG_NAME").is_some(),
            "this test expects to be run by cargo"
        );
        let output = as_top_level(&mut Command::new("env"))
            .output()
            .map_err(|e| format!("cannot run env: {e}"))?;
        let seen = String::from_utf8_lossy(&output.stdout);
        let leaked: Vec<&str> = seen
            .lines()
            .filter(|line| {
                line.starts_with("CARGO_PKG_")
                    || line.starts_with("CARGO_MANIFEST_")
                    || line.starts_with("CARGO_CRATE_NAME=")
            })
            .collect();
        assert!(leaked.is_empty(), "leaked to the nested cargo: {leaked:?}");
        assert!(
            seen.lines().any(|line| line.starts_with("PATH=")),
            "the rest of the environment is kept"
        );
        Ok(())
    }

    /// A plugin names none of this machine's paths, so `policies/` (packed on one machine)
    /// equals a build on another (see `every_bundle_carries_the_plugin_its_source_builds`).
    #[test]
    fn a_built_plugin_names_no_path_of_this_machine() -> Result<(), String> {
        let component = build("guest-redis").map_err(|e| e.to_string())?;
        let bytes =
            std::fs::read(&component).map_err(|e| format!("{}: {e}", component.display()))?;
        let text = String::from_utf8_lossy(&bytes);
        let home = std::env::var("HOME").map_err(|e| format!("HOME: {e}"))?;
        let cargo_home = std::env::var("CARGO_HOME").unwrap_or_else(|_| format!("{home}/.cargo"));
        let root = super::workspace_root().display().to_string();
        for path in [cargo_home, root] {
            assert!(
                !text.contains(&path),
                "{} names {path}: a build elsewhere would differ",
                component.display()
            );
        }
        Ok(())
    }
}
