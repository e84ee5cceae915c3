//! `cargo xtask new-plugin <name>`: a new plugin crate from `wit/sdk/template`, renamed,
//! pointing at the SDK by path, ready to build for `wasm32-wasip2`, test and pack.
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
                &format!(
                    "policy-host-sdk = {{ path = {:?} }}",
                    sdk.display().to_string()
                ),
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
    Ok(dir.to_path_buf())
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
