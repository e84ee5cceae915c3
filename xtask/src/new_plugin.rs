//! `cargo xtask new-plugin <name>`: a new plugin crate from `wit/sdk/template`, renamed, with
//! its own copy of the SDK and the contract (`policy-host-sdk/`, a path dependency inside the
//! crate), ready to build for `wasm32-wasip2`, test and pack wherever it is moved: it names no
//! path of this checkout, so it can be the first commit of the author's own repository.
//!
//! Only std and anyhow here: `host/tests/template.rs` includes this file to prove that what
//! it generates builds, passes its tests, loads in the sandbox and packs.

use std::path::{Path, PathBuf};

use anyhow::{Context, bail};

/// The template's own names, replaced by the new plugin's (longest first where one contains
/// another). `plugintemplate` also covers the plural `plugintemplates`.
const PLACEHOLDERS: [&str; 4] = [
    "plugin-template",
    "plugin_template",
    "PluginTemplate",
    "plugintemplate",
];

/// Writes a new plugin named `name` into `dir` (which must not exist, or be empty) from the
/// template under `workspace_root`, and returns `dir`. The name is the plugin's name
/// (`describe().name`), its package name, and gives the custom resource kind (`my-app` →
/// `MyApp`, group `my-app.example.com`).
pub fn new_plugin(workspace_root: &Path, name: &str, dir: &Path) -> anyhow::Result<PathBuf> {
    check_name(name)?;
    if dir.exists()
        && dir
            .read_dir()
            .with_context(|| format!("cannot read {}", dir.display()))?
            .next()
            .is_some()
    {
        bail!(
            "{} exists and is not empty; choose another --dir or remove it",
            dir.display()
        );
    }
    let sdk = workspace_root.join("wit/sdk");
    let sdk = sdk
        .canonicalize()
        .with_context(|| format!("the SDK is not at {}", sdk.display()))?;
    let camel: String = name
        .split('-')
        .map(|part| {
            let mut chars = part.chars();
            chars
                .next()
                .map(|first| first.to_ascii_uppercase().to_string() + chars.as_str())
                .unwrap_or_default()
        })
        .collect();
    let replacements = [
        name.to_owned(),
        name.replace('-', "_"),
        camel.clone(),
        camel.to_ascii_lowercase(),
    ];
    let template = sdk.join("template");
    for relative in template_files(&template)? {
        let text = std::fs::read_to_string(template.join(&relative))
            .with_context(|| format!("cannot read template file {}", relative.display()))?;
        let mut text = PLACEHOLDERS
            .iter()
            .zip(&replacements)
            .fold(text, |text, (from, to)| text.replace(from, to));
        if relative == Path::new("Cargo.toml") {
            let from = "policy-host-sdk = { path = \"..\" }";
            if !text.contains(from) {
                bail!(
                    "the template's Cargo.toml no longer has `{from}`; update xtask/src/new_plugin.rs"
                );
            }
            text = text.replace(
                from,
                &format!("policy-host-sdk = {{ path = \"{VENDORED_SDK}\" }}"),
            );
        }
        let target = dir.join(&relative);
        if let Some(parent) = target.parent() {
            std::fs::create_dir_all(parent)
                .with_context(|| format!("cannot create {}", parent.display()))?;
        }
        std::fs::write(&target, text)
            .with_context(|| format!("cannot write {}", target.display()))?;
    }
    vendor_sdk(workspace_root, &sdk, &dir.join(VENDORED_SDK))?;
    Ok(dir.to_path_buf())
}

/// Where a new plugin keeps its copy of the SDK, relative to it.
pub const VENDORED_SDK: &str = "policy-host-sdk";

/// Copies the SDK's sources and the contract it is generated from into `into`, with a
/// manifest of its own (the workspace's inherited fields and dependency versions written
/// out), so the new plugin builds without this checkout.
fn vendor_sdk(workspace_root: &Path, sdk: &Path, into: &Path) -> anyhow::Result<()> {
    let src = sdk.join("src");
    for relative in template_files(&src)? {
        let mut text = std::fs::read_to_string(src.join(&relative))
            .with_context(|| format!("cannot read the SDK's {}", relative.display()))?;
        if relative == Path::new("wasm.rs") {
            let from = "path: \"../policy.wit\"";
            if !text.contains(from) {
                bail!("the SDK's wasm.rs no longer has `{from}`; update xtask/src/new_plugin.rs");
            }
            text = text.replace(from, "path: \"policy.wit\"");
        }
        write(&into.join("src").join(&relative), &text)?;
    }
    let contract = std::fs::read_to_string(workspace_root.join("wit/policy.wit"))
        .context("cannot read wit/policy.wit")?;
    write(&into.join("policy.wit"), &contract)?;
    let workspace = std::fs::read_to_string(workspace_root.join("Cargo.toml"))
        .context("cannot read the workspace's Cargo.toml")?;
    let manifest = std::fs::read_to_string(sdk.join("Cargo.toml"))
        .context("cannot read the SDK's Cargo.toml")?;
    write(
        &into.join("Cargo.toml"),
        &standalone_manifest(&manifest, &workspace)?,
    )
}

/// `manifest` (the SDK's) with every `key.workspace = true` replaced by the workspace's value
/// of `key` and the workspace lints dropped.
fn standalone_manifest(manifest: &str, workspace: &str) -> anyhow::Result<String> {
    let mut out = String::from(
        "# The policy-host SDK, copied by `cargo xtask new-plugin` with the contract it is\n\
         # generated from (policy.wit): replace the directory with a newer copy to upgrade.\n",
    );
    let mut in_lints = false;
    for line in manifest.lines() {
        if line.starts_with('[') {
            in_lints = line.trim() == "[lints]";
            if in_lints {
                continue;
            }
        }
        if in_lints {
            continue;
        }
        match line.split_once(".workspace = true") {
            Some((key, "")) => {
                let value = workspace
                    .lines()
                    .find_map(|l| l.strip_prefix(&format!("{key} = ")))
                    .with_context(|| {
                        format!("the workspace's Cargo.toml has no `{key} = ...` for the SDK")
                    })?;
                out.push_str(&format!("{key} = {value}\n"));
            }
            _ => {
                out.push_str(line);
                out.push('\n');
            }
        }
    }
    Ok(out)
}

fn write(path: &Path, text: &str) -> anyhow::Result<()> {
    if let Some(parent) = path.parent() {
        std::fs::create_dir_all(parent)
            .with_context(|| format!("cannot create {}", parent.display()))?;
    }
    std::fs::write(path, text).with_context(|| format!("cannot write {}", path.display()))
}

/// A plugin name is a DNS label (the host names things after it) and not the template's.
fn check_name(name: &str) -> anyhow::Result<()> {
    let label = !name.is_empty()
        && name.len() <= 63
        && name.starts_with(|c: char| c.is_ascii_lowercase())
        && !name.ends_with('-')
        && name
            .chars()
            .all(|c| c.is_ascii_lowercase() || c.is_ascii_digit() || c == '-');
    if !label || name.contains("--") || PLACEHOLDERS.iter().any(|p| name.contains(p)) {
        bail!(
            "plugin name `{name}` must be lower case letters, digits and single dashes, start \
             with a letter (a DNS label like `redis` or `my-app`), and not be the template's own"
        );
    }
    Ok(())
}

/// The template's files, relative to it, without build output.
fn template_files(template: &Path) -> anyhow::Result<Vec<PathBuf>> {
    let mut files = Vec::new();
    let mut pending = vec![PathBuf::new()];
    while let Some(relative) = pending.pop() {
        let entries = std::fs::read_dir(template.join(&relative))
            .with_context(|| format!("cannot read the template at {}", template.display()))?;
        for entry in entries {
            let entry = entry?;
            let path = relative.join(entry.file_name());
            if entry.file_type()?.is_dir() {
                if entry.file_name() != "target" {
                    pending.push(path);
                }
            } else {
                files.push(path);
            }
        }
    }
    files.sort();
    Ok(files)
}
