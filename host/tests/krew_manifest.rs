//! The krew manifest of `kubectl policy-host` (`deploy/krew/policy-host.yaml`) passes the checks
//! krew makes before it installs a plugin (`pkg/index/validation` of kubernetes-sigs/krew:
//! apiVersion and kind, a safe name equal to the file's, a short description, a `v`-prefixed
//! semantic version, and per platform a URI, a sha256 of 64 lower-case hex digits, a `bin`,
//! file operations and an `os`/`arch` selector), and installs the binary this crate builds:
//! its `bin` is the executable cargo makes of `src/bin/`, whose name kubectl runs for
//! `kubectl policy-host`.

use std::path::{Path, PathBuf};

use serde_yaml::Value;

fn repo_root() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR"))
        .parent()
        .expect("host/ has a parent")
        .to_path_buf()
}

/// The name kubectl looks up for `kubectl <command>`: dashes in the command become
/// underscores, because a dash in an executable's name separates subcommands
/// (kubernetes/kubectl `HandlePluginCommand`).
fn executable_for(command: &str) -> String {
    format!("kubectl-{}", command.replace('-', "_"))
}

/// The problems krew's `ValidatePlugin` would report for the manifest in `file`.
fn krew_problems(file: &str, manifest: &Value) -> Vec<String> {
    let mut problems = Vec::new();
    let mut problem = |p: String| problems.push(p);
    if manifest["apiVersion"].as_str() != Some("krew.googlecontainertools.github.com/v1alpha2") {
        problem(format!("apiVersion {:?}", manifest["apiVersion"]));
    }
    if manifest["kind"].as_str() != Some("Plugin") {
        problem(format!("kind {:?}", manifest["kind"]));
    }
    let name = manifest["metadata"]["name"].as_str().unwrap_or_default();
    let safe = !name.is_empty()
        && name
            .chars()
            .all(|c| c.is_ascii_alphanumeric() || c == '_' || c == '-');
    if !safe {
        problem(format!("name {name:?} must match ^[\\w-]+$"));
    }
    if format!("{name}.yaml") != file {
        problem(format!("name {name:?} must be the file's name, {file}"));
    }
    let spec = &manifest["spec"];
    if spec["shortDescription"].as_str().is_none_or(str::is_empty) {
        problem("no shortDescription".into());
    }
    let version = spec["version"].as_str().unwrap_or_default();
    let semver = version.strip_prefix('v').is_some_and(|v| {
        let core = v.split(['-', '+']).next().unwrap_or_default();
        let parts: Vec<&str> = core.split('.').collect();
        parts.len() == 3
            && parts
                .iter()
                .all(|p| !p.is_empty() && p.chars().all(|c| c.is_ascii_digit()))
    });
    if !semver {
        problem(format!(
            "version {version:?} is not v<major>.<minor>.<patch>"
        ));
    }
    let platforms = spec["platforms"].as_sequence().cloned().unwrap_or_default();
    if platforms.is_empty() {
        problem("no platforms".into());
    }
    for platform in &platforms {
        if platform["uri"].as_str().is_none_or(str::is_empty) {
            problem("a platform without uri".into());
        }
        let sha = platform["sha256"].as_str().unwrap_or_default();
        if sha.len() != 64
            || !sha
                .chars()
                .all(|c| c.is_ascii_digit() || ('a'..='f').contains(&c))
        {
            problem(format!("sha256 {sha:?} is not 64 lower-case hex digits"));
        }
        if platform["bin"].as_str().is_none_or(str::is_empty) {
            problem("a platform without bin".into());
        }
        if platform["files"].as_sequence().is_none_or(Vec::is_empty) {
            problem("a platform without files".into());
        }
        let selector = &platform["selector"];
        let mut keys: Vec<String> = selector["matchLabels"]
            .as_mapping()
            .map(|m| {
                m.keys()
                    .filter_map(|k| k.as_str().map(String::from))
                    .collect()
            })
            .unwrap_or_default();
        keys.extend(
            selector["matchExpressions"]
                .as_sequence()
                .into_iter()
                .flatten()
                .filter_map(|e| e["key"].as_str().map(String::from)),
        );
        if keys.is_empty() {
            problem("an empty selector".into());
        }
        if let Some(key) = keys.iter().find(|k| *k != "os" && *k != "arch") {
            problem(format!("selector key {key:?} is neither os nor arch"));
        }
    }
    problems
}

fn manifest() -> Value {
    let path = repo_root().join("deploy/krew/policy-host.yaml");
    let text = std::fs::read_to_string(&path).expect("deploy/krew/policy-host.yaml");
    serde_yaml::from_str(&text).expect("the manifest is YAML")
}

#[test]
fn the_krew_manifest_passes_krews_validation() {
    let problems = krew_problems("policy-host.yaml", &manifest());
    assert!(problems.is_empty(), "{problems:?}");
}

#[test]
fn the_krew_manifest_installs_the_binary_kubectl_runs_for_policy_host() {
    let manifest = manifest();
    let command = manifest["metadata"]["name"].as_str().expect("a name");
    // The binary cargo builds: the file name of its source under src/bin/.
    let built = env!("CARGO_BIN_EXE_kubectl-policy_host");
    let built_name = Path::new(built)
        .file_name()
        .and_then(|n| n.to_str())
        .expect("a file name");
    assert_eq!(
        built_name,
        executable_for(command),
        "kubectl runs `kubectl {command}` as {}",
        executable_for(command)
    );
    for platform in manifest["spec"]["platforms"]
        .as_sequence()
        .expect("platforms")
    {
        let bin = platform["bin"].as_str().expect("bin");
        assert_eq!(bin, built_name, "the platform installs the built binary");
        let copied = platform["files"]
            .as_sequence()
            .expect("files")
            .iter()
            .any(|f| f["from"].as_str() == Some(bin));
        assert!(copied, "the archive's {bin} is among the files krew copies");
        let uri = platform["uri"].as_str().expect("uri");
        assert!(
            uri.starts_with("https://") && uri.contains(bin),
            "the archive {uri} is fetched over HTTPS and named after {bin}"
        );
    }
}

/// The validation itself fails on what krew refuses, so the test above can fail.
#[test]
fn the_validation_refuses_what_krew_refuses() {
    let good = manifest();
    let rows: Vec<(&str, &str, Value)> = vec![
        ("another file name", "other.yaml", good.clone()),
        (
            "a version without v",
            "policy-host.yaml",
            with(&good, |m| m["spec"]["version"] = "0.1.0".into()),
        ),
        (
            "an upper-case sha256",
            "policy-host.yaml",
            with(&good, |m| {
                m["spec"]["platforms"][0]["sha256"] = "A".repeat(64).into();
            }),
        ),
        (
            "a selector on a zone",
            "policy-host.yaml",
            with(&good, |m| {
                m["spec"]["platforms"][0]["selector"] =
                    serde_yaml::from_str("matchLabels: {zone: a}").expect("yaml");
            }),
        ),
        (
            "no files",
            "policy-host.yaml",
            with(&good, |m| {
                m["spec"]["platforms"][0]["files"] = Value::Sequence(Vec::new());
            }),
        ),
    ];
    for (situation, file, manifest) in rows {
        assert!(
            !krew_problems(file, &manifest).is_empty(),
            "{situation} is refused"
        );
    }
}

fn with(manifest: &Value, change: impl FnOnce(&mut Value)) -> Value {
    let mut changed = manifest.clone();
    change(&mut changed);
    changed
}
