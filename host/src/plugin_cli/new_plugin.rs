//! `policy-host new-plugin`: a new plugin crate from the template and the SDK compiled into this
//! binary, so that an author needs the installed CLI and nothing of a policy-host checkout.
//! The crate is the template renamed, with its own copy of the SDK and of the contract
//! (`policy-host-sdk/`) and an end-to-end test crate (`e2e/`) that depends on policy-host's test
//! environment by the project's repository: it names no path of the machine it was made on, so
//! it can be the first commit of the author's own repository.

use std::path::{Path, PathBuf};

/// One file compiled in: its path relative to its directory, and its text.
type Embedded = (&'static str, &'static str);

/// `(path, include_str!(base + path))` for each path.
macro_rules! embed {
    ($base:literal: $($path:literal),+ $(,)?) => {
        &[$(($path, include_str!(concat!($base, $path)))),+]
    };
}

/// `wit/sdk/template`, without build output. A test compares this list with the directory, so a
/// file added to the template fails it until it is listed here.
const TEMPLATE: &[Embedded] = embed!("../../../wit/sdk/template/":
    "Cargo.lock",
    "Cargo.toml",
    "README.md",
    "crd.yaml",
    "e2e/Cargo.toml",
    "e2e/tests/real_node.rs",
    "example.yaml",
    "responses.json",
    "src/bin/crdgen.rs",
    "src/lib.rs",
    "test-images.yaml",
    "tests/crd.rs",
);

/// `wit/sdk/src`, the SDK's sources (compared with the directory by the same test).
const SDK_SOURCES: &[Embedded] = embed!("../../../wit/sdk/src/":
    "app_call.rs",
    "children.rs",
    "conditions.rs",
    "contract.rs",
    "credentials.rs",
    "desired.rs",
    "exchange.rs",
    "lib.rs",
    "log.rs",
    "metrics.rs",
    "names.rs",
    "observation.rs",
    "pods.rs",
    "schedule.rs",
    "session.rs",
    "testing.rs",
    "wasm.rs",
);

/// The workspace's resolution, written as the new crate's `e2e/Cargo.lock`: the test environment
/// then builds with the dependency versions this tree is tested with (cargo keeps what the crate
/// uses of it and drops the rest), not with whatever the registry has newest that day.
const WORKSPACE_LOCK: &str = include_str!("../../../Cargo.lock");

/// The SDK's manifest, its guide and the contract it is generated from.
const SDK_MANIFEST: &str = include_str!("../../../wit/sdk/Cargo.toml");
const SDK_README: &str = include_str!("../../../wit/sdk/README.md");
const CONTRACT: &str = include_str!("../../../wit/policy.wit");
/// The workspace's manifest: the values the SDK's manifest inherits, and the repository the
/// test crate's dependency on the test environment names.
const WORKSPACE_MANIFEST: &str = include_str!("../../../Cargo.toml");

/// Where a new plugin keeps its copy of the SDK, relative to it.
pub const VENDORED_SDK: &str = "policy-host-sdk";

/// The template's own names, replaced by the new plugin's (longest first where one contains
/// another). `plugintemplate` also covers the plural `plugintemplates`.
const PLACEHOLDERS: [&str; 4] = [
    "plugin-template",
    "plugin_template",
    "PluginTemplate",
    "plugintemplate",
];

/// The in-tree paths the template's manifests use, and what a new plugin's use instead.
const SDK_PATH_IN_TREE: &str = "policy-host-sdk = { path = \"..\" }";
const TESTENV_IN_TREE: &str = "policy-host-testenv = { path = \"../../../../tests\" }";

/// Why no plugin crate was written.
#[derive(Debug, thiserror::Error)]
pub enum NewPluginError {
    /// The name is not one the host can name things after.
    #[error(
        "plugin name `{0}` must be lower case letters, digits and single dashes, start with a letter (a DNS label like `redis` or `my-app`), and not be the template's own"
    )]
    Name(String),
    /// The directory holds something already.
    #[error("{} exists and is not empty; choose another --dir or remove it", .0.display())]
    NotEmpty(PathBuf),
    /// A file could not be written (or the directory read).
    #[error("cannot write {}: {source}; check that its directory is writable", path.display())]
    Write {
        /// The file or directory.
        path: PathBuf,
        /// Why.
        source: std::io::Error,
    },
    /// The template compiled into this binary does not have what the generator replaces: a
    /// defect of this policy-host build, caught by its tests.
    #[error(
        "the template in this policy-host build is inconsistent: {0}; report it to policy-host"
    )]
    Template(String),
}

/// Writes a new plugin named `name` into `dir` (which must not exist, or be empty) and returns
/// the files written, relative to `dir`. The name is the plugin's name (`describe().name`), its
/// package name, and gives the custom resource kind (`my-app` → `MyApp`, group
/// `my-app.example.com`).
pub fn new_plugin(name: &str, dir: &Path) -> Result<Vec<PathBuf>, NewPluginError> {
    check_name(name)?;
    let not_empty = match dir.read_dir() {
        Ok(mut entries) => entries.next().is_some(),
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => false,
        Err(source) => {
            return Err(NewPluginError::Write {
                path: dir.to_owned(),
                source,
            });
        }
    };
    if not_empty {
        return Err(NewPluginError::NotEmpty(dir.to_owned()));
    }
    let files = plugin_files(name)?;
    for (relative, text) in &files {
        write(&dir.join(relative), text)?;
    }
    Ok(files.into_iter().map(|(relative, _)| relative).collect())
}

/// Every file of the new plugin `name`, relative to its directory, with its text.
fn plugin_files(name: &str) -> Result<Vec<(PathBuf, String)>, NewPluginError> {
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
    let repository = repository()?;
    let mut files = Vec::new();
    for (relative, text) in TEMPLATE {
        let mut text = PLACEHOLDERS
            .iter()
            .zip(&replacements)
            .fold((*text).to_owned(), |text, (from, to)| {
                text.replace(from, to)
            });
        if *relative == "Cargo.toml" {
            text = replace_once(
                &text,
                SDK_PATH_IN_TREE,
                &format!("policy-host-sdk = {{ path = \"{VENDORED_SDK}\" }}"),
                relative,
            )?;
        }
        if *relative == "e2e/Cargo.toml" {
            text = replace_once(
                &text,
                TESTENV_IN_TREE,
                &format!("policy-host-testenv = {{ git = \"{repository}\" }}"),
                relative,
            )?;
        }
        files.push((PathBuf::from(relative), text));
    }
    files.push((PathBuf::from("e2e/Cargo.lock"), WORKSPACE_LOCK.to_owned()));
    let sdk = Path::new(VENDORED_SDK);
    for (relative, text) in SDK_SOURCES {
        let text = if *relative == "wasm.rs" {
            replace_once(
                text,
                "path: \"../policy.wit\"",
                "path: \"policy.wit\"",
                relative,
            )?
        } else {
            (*text).to_owned()
        };
        files.push((sdk.join("src").join(relative), text));
    }
    files.push((sdk.join("policy.wit"), CONTRACT.to_owned()));
    files.push((sdk.join("README.md"), vendored_readme(repository)?));
    files.push((sdk.join("Cargo.toml"), standalone_manifest()?));
    Ok(files)
}

/// The SDK's guide as the copy reads it: the contract beside it, and what it links in the
/// policy-host tree (`../../guest-redis`) at the project's repository instead.
fn vendored_readme(repository: &str) -> Result<String, NewPluginError> {
    let text = replace_once(
        SDK_README,
        "](../policy.wit)",
        "](policy.wit)",
        "wit/sdk/README.md",
    )?;
    let repository = repository.trim_end_matches('/');
    Ok(text.replace("](../../", &format!("]({repository}/blob/main/")))
}

/// `text` with its one `from` replaced by `to`; `file` names it in the error.
fn replace_once(text: &str, from: &str, to: &str, file: &str) -> Result<String, NewPluginError> {
    if !text.contains(from) {
        return Err(NewPluginError::Template(format!(
            "{file} no longer has `{from}`"
        )));
    }
    Ok(text.replace(from, to))
}

/// The project's repository (the workspace's `repository`), which a new crate's end-to-end
/// test depends on for the test environment.
pub fn repository() -> Result<&'static str, NewPluginError> {
    Ok(workspace_value("repository")?.trim_matches('"'))
}

/// The value (as written, quotes included) of `key = …` in the workspace's manifest.
fn workspace_value(key: &str) -> Result<&'static str, NewPluginError> {
    WORKSPACE_MANIFEST
        .lines()
        .find_map(|line| line.strip_prefix(&format!("{key} = ")))
        .ok_or_else(|| {
            NewPluginError::Template(format!("the workspace's Cargo.toml has no `{key} = ...`"))
        })
}

/// The SDK's manifest with every `key.workspace = true` replaced by the workspace's value of
/// `key` and the workspace lints dropped, so the copy builds on its own.
fn standalone_manifest() -> Result<String, NewPluginError> {
    let mut out = String::from(
        "# The policy-host SDK, copied by `policy-host new-plugin` with the contract it is\n\
         # generated from (policy.wit): replace the directory with a newer copy to upgrade.\n",
    );
    let mut in_lints = false;
    for line in SDK_MANIFEST.lines() {
        if line.starts_with('[') {
            in_lints = line.trim() == "[lints]";
        }
        if in_lints {
            continue;
        }
        match line.split_once(".workspace = true") {
            Some((key, "")) => {
                out.push_str(&format!("{key} = {}\n", workspace_value(key)?));
            }
            _ => {
                out.push_str(line);
                out.push('\n');
            }
        }
    }
    Ok(out)
}

fn write(path: &Path, text: &str) -> Result<(), NewPluginError> {
    let failed = |source| NewPluginError::Write {
        path: path.to_owned(),
        source,
    };
    if let Some(parent) = path.parent() {
        std::fs::create_dir_all(parent).map_err(failed)?;
    }
    std::fs::write(path, text).map_err(failed)
}

/// A plugin name is a DNS label (the host names things after it) and not the template's.
fn check_name(name: &str) -> Result<(), NewPluginError> {
    let label = !name.is_empty()
        && name.len() <= 63
        && name.starts_with(|c: char| c.is_ascii_lowercase())
        && !name.ends_with('-')
        && name
            .chars()
            .all(|c| c.is_ascii_lowercase() || c.is_ascii_digit() || c == '-');
    if !label || name.contains("--") || PLACEHOLDERS.iter().any(|p| name.contains(p)) {
        return Err(NewPluginError::Name(name.to_owned()));
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The files under `dir`, relative to it, without build output, sorted.
    fn listing(dir: &Path) -> Vec<String> {
        let mut files = Vec::new();
        let mut pending = vec![PathBuf::new()];
        while let Some(relative) = pending.pop() {
            for entry in std::fs::read_dir(dir.join(&relative)).expect("the directory reads") {
                let entry = entry.expect("an entry");
                let path = relative.join(entry.file_name());
                if entry.file_type().expect("a file type").is_dir() {
                    if entry.file_name() != "target" {
                        pending.push(path);
                    }
                } else {
                    files.push(path.display().to_string());
                }
            }
        }
        files.sort();
        files
    }

    fn names(embedded: &[Embedded]) -> Vec<String> {
        let mut names: Vec<String> = embedded.iter().map(|(path, _)| path.to_string()).collect();
        names.sort();
        names
    }

    #[test]
    fn every_file_of_the_template_and_the_sdk_is_compiled_in() {
        let root = Path::new(env!("CARGO_MANIFEST_DIR")).join("..");
        assert_eq!(
            names(TEMPLATE),
            listing(&root.join("wit/sdk/template")),
            "list the template's files in TEMPLATE"
        );
        assert_eq!(
            names(SDK_SOURCES),
            listing(&root.join("wit/sdk/src")),
            "list the SDK's sources in SDK_SOURCES"
        );
    }

    #[test]
    fn a_new_plugin_is_renamed_and_names_no_in_tree_path() {
        let files = plugin_files("my-app").expect("the template renders");
        for (path, text) in &files {
            for placeholder in PLACEHOLDERS {
                assert!(
                    !text.contains(placeholder),
                    "{} still says {placeholder}",
                    path.display()
                );
            }
            assert!(
                !text.contains("../../../"),
                "{} names a path outside itself",
                path.display()
            );
        }
        let text = |name: &str| {
            files
                .iter()
                .find(|(path, _)| path == Path::new(name))
                .map(|(_, text)| text.as_str())
                .unwrap_or_else(|| panic!("{name} is written"))
        };
        assert!(text("Cargo.toml").contains("name = \"my-app\""));
        assert!(text("Cargo.toml").contains("policy-host-sdk = { path = \"policy-host-sdk\" }"));
        assert!(text("e2e/Cargo.toml").contains(&format!(
            "policy-host-testenv = {{ git = \"{}\" }}",
            repository().expect("a repository")
        )));
        assert!(
            text("e2e/Cargo.lock").contains("name = \"kube\""),
            "the test environment's dependencies are pinned"
        );
        assert!(text("src/lib.rs").contains("\"MyApp\""));
        assert!(text("policy-host-sdk/src/wasm.rs").contains("path: \"policy.wit\""));
        assert!(!text("policy-host-sdk/Cargo.toml").contains(".workspace = true"));
        let guide = text("policy-host-sdk/README.md");
        assert!(guide.starts_with("# Writing a policy-host plugin"));
        assert!(
            !guide.contains("](../"),
            "the SDK's guide links outside its copy"
        );
        assert!(guide.contains("](policy.wit)"));
    }

    #[test]
    fn bad_names_and_occupied_directories_are_refused_with_what_to_do() {
        for name in [
            "",
            "My-App",
            "my--app",
            "my-app-",
            "9lives",
            "plugin-template",
        ] {
            let error = check_name(name).expect_err(name);
            assert!(error.to_string().contains("DNS label"), "{error}");
        }
        let dir = std::env::temp_dir().join(format!("new-plugin-occupied-{}", std::process::id()));
        std::fs::create_dir_all(&dir).expect("a temporary directory");
        std::fs::write(dir.join("keep"), "mine").expect("a file");
        let error = new_plugin("my-app", &dir).expect_err("an occupied directory");
        let kept = std::fs::read_to_string(dir.join("keep"));
        let _ = std::fs::remove_dir_all(&dir);
        assert!(
            error.to_string().contains("choose another --dir"),
            "{error}"
        );
        assert_eq!(kept.expect("still there"), "mine");
    }
}
