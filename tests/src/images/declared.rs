//! Images a plugin declares for its end-to-end tests, in a `test-images.yaml` beside it: each
//! image's name, what it holds — Debian packages ([`super::debian`]), Go programs this test
//! environment builds ([`crate::binaries::GoPrograms`]), files beside the declaration — and how
//! it runs. The test environment knows no app: what an app's image holds is written here, by
//! the plugin's author, and made by the one generic builder ([`super::ImageSpec`]).
//!
//! ```yaml
//! include: [../other-plugin/test-images.yaml]    # optional, relative to this file
//! images:
//!   - name: "app:{version}"      # {version}: upstream version of the first Debian package
//!     debian: [app-server]       # unpacked with their dependencies
//!     go:                        # built by build-binaries.sh's `go` family
//!       modules: [example.org/app@v1.2.3]
//!       programs: { /usr/local/bin/app: example.org/app/cmd/app }
//!     files: { /etc/app.conf: image/app.conf }   # relative to this file
//!     user: "65532"
//!     entrypoint: [/usr/local/bin/app]
//!     cmd: [--serve]
//!     env: [APP_MODE=test]
//! ```
//!
//! Which declarations a test process gets: [`crate::shared_node`] and [`crate::shared`] load
//! those of the crate under test (`$CARGO_MANIFEST_DIR/test-images.yaml`, which cargo sets for
//! tests and benches), and [`crate::TestEnv::provide_images`] any other file on demand.

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::process::Command;

use serde::Deserialize;

use super::debian::{self, DebianTree};
use super::{ImageFile, ImageSpec};
use crate::binaries::GoPrograms;
use crate::{Binaries, Error, Result};

/// The file name a crate declares its test images in.
pub const FILE_NAME: &str = "test-images.yaml";

/// A declaration file as written.
#[derive(Debug, Clone, Default, Deserialize)]
#[serde(deny_unknown_fields)]
struct DeclarationFile {
    #[serde(default)]
    include: Vec<PathBuf>,
    #[serde(default)]
    images: Vec<Declaration>,
}

/// One declared image, as written.
#[derive(Debug, Clone, PartialEq, Eq, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Declaration {
    /// The reference Pods use; `{version}` stands for the upstream version of the first Debian
    /// package (so a point release of the distribution renames the image with it).
    pub name: String,
    /// Debian packages unpacked (with their dependencies) as the image's tree.
    #[serde(default)]
    pub debian: Vec<String>,
    /// Go programs built by the test environment and put at the paths named.
    #[serde(default)]
    pub go: Option<GoDeclaration>,
    /// Files beside the declaration (relative to it), by their absolute path in the image.
    #[serde(default)]
    pub files: BTreeMap<String, PathBuf>,
    /// The image's numeric user, if any.
    #[serde(default)]
    pub user: Option<String>,
    /// The image's entrypoint.
    #[serde(default)]
    pub entrypoint: Vec<String>,
    /// The image's default arguments.
    #[serde(default)]
    pub cmd: Vec<String>,
    /// Extra environment, `NAME=value`.
    #[serde(default)]
    pub env: Vec<String>,
    /// Whether the machine's CA bundle goes in.
    #[serde(default)]
    pub ca_certificates: bool,
    /// The directory of the file it was declared in (file paths are relative to it).
    #[serde(skip)]
    base: PathBuf,
}

/// Go programs of a declared image.
#[derive(Debug, Clone, PartialEq, Eq, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct GoDeclaration {
    /// `module@version` pairs, the main one first.
    pub modules: Vec<String>,
    /// Package path by absolute path in the image (the program is named by its file name).
    pub programs: BTreeMap<String, String>,
}

/// The images of one declaration file and those it includes, in order.
#[derive(Debug, Clone, Default)]
pub struct Declarations {
    /// The declared images.
    pub images: Vec<Declaration>,
}

impl Declarations {
    /// Reads `path` and the files it includes (each once).
    pub fn read(path: &Path) -> Result<Declarations> {
        let mut declarations = Declarations::default();
        let mut seen = Vec::new();
        declarations.read_into(path, &mut seen)?;
        Ok(declarations)
    }

    fn read_into(&mut self, path: &Path, seen: &mut Vec<PathBuf>) -> Result<()> {
        let canonical = path.canonicalize().map_err(Error::io(format!(
            "reading the image declarations {}",
            path.display()
        )))?;
        if seen.contains(&canonical) {
            return Ok(());
        }
        seen.push(canonical.clone());
        let text = std::fs::read_to_string(&canonical).map_err(Error::io(format!(
            "reading the image declarations {}",
            path.display()
        )))?;
        let file: DeclarationFile = serde_yaml::from_str(&text).map_err(|e| Error::Image {
            image: path.display().to_string(),
            problem: format!("the declaration file does not parse: {e}; see tests/src/images/declared.rs for its fields"),
        })?;
        let base = canonical
            .parent()
            .map_or_else(|| PathBuf::from("/"), Path::to_path_buf);
        for include in &file.include {
            self.read_into(&base.join(include), seen)?;
        }
        for mut image in file.images {
            image.base = base.clone();
            self.images.push(image);
        }
        Ok(())
    }
}

/// A declared image, made: what goes into it and where its programs are on this machine.
#[derive(Debug, Clone)]
pub struct MadeImage {
    /// What the builder writes.
    pub spec: ImageSpec,
    /// Its Debian tree, if it has one.
    pub tree: Option<DebianTree>,
}

impl MadeImage {
    /// The image's name, as Pods reference it.
    pub fn name(&self) -> &str {
        &self.spec.name
    }

    /// The image's tag (after the last `:` of the name), e.g. `1.2.3` of `app:1.2.3`.
    pub fn tag(&self) -> &str {
        match self.spec.name.rsplit_once(':') {
            Some((_, tag)) if !tag.contains('/') => tag,
            _ => "latest",
        }
    }

    /// The repository (the name without its tag).
    pub fn repository(&self) -> &str {
        match self.spec.name.rsplit_once(':') {
            Some((repository, tag)) if !tag.contains('/') => repository,
            _ => &self.spec.name,
        }
    }

    /// The program `name` the image holds (a declared file or Go program of that file name,
    /// else one of its tree), as a path on this machine.
    pub fn program(&self, name: &str) -> Option<PathBuf> {
        self.spec
            .files
            .iter()
            .find(|file| Path::new(&file.path).file_name().is_some_and(|n| n == name))
            .map(|file| file.source.clone())
            .or_else(|| self.tree.as_ref()?.program(name))
    }

    /// A command running the image's program `name` on this machine (a test's client against
    /// a Pod): with the tree's own loader and libraries when it comes from Debian packages.
    pub fn command(&self, name: &str) -> Result<Command> {
        let program = self.program(name).ok_or_else(|| Error::Image {
            image: self.spec.name.clone(),
            problem: format!("it holds no program {name}; declare it in its {FILE_NAME}"),
        })?;
        Ok(match &self.tree {
            Some(tree) if program.starts_with(&tree.root) => tree.command(&program),
            _ => Command::new(program),
        })
    }
}

impl Declaration {
    /// Makes the image's parts (Debian tree unpacked, Go programs built; each cached under
    /// `binaries`' cache) and returns what the builder writes. Blocking.
    pub fn make(&self, binaries: &Binaries) -> Result<MadeImage> {
        let tree = if self.debian.is_empty() {
            None
        } else {
            Some(debian::unpack(
                &self.debian,
                &binaries.cache_dir().join("debian"),
            )?)
        };
        let name = match (&tree, self.name.contains("{version}")) {
            (_, false) => self.name.clone(),
            (Some(tree), true) => {
                let first = &self.debian[0];
                let version = tree.version_of(first).ok_or_else(|| Error::Image {
                    image: self.name.clone(),
                    problem: format!("apt did not resolve its first package {first}"),
                })?;
                self.name
                    .replace("{version}", debian::upstream_version(version))
            }
            (None, true) => {
                return Err(Error::Image {
                    image: self.name.clone(),
                    problem:
                        "{version} names the first Debian package's version, and it declares none"
                            .into(),
                });
            }
        };
        let mut files = Vec::new();
        if let Some(go) = &self.go {
            let recipe = GoPrograms {
                modules: go.modules.clone(),
                programs: go
                    .programs
                    .iter()
                    .map(|(path, package)| Ok((program_name(&name, path)?, package.clone())))
                    .collect::<Result<_>>()?,
            };
            let dir = binaries.build_go(&recipe)?;
            for path in go.programs.keys() {
                files.push(ImageFile {
                    source: dir.join(program_name(&name, path)?),
                    path: path.clone(),
                });
            }
        }
        for (path, source) in &self.files {
            let source = self.base.join(source);
            if !source.is_file() {
                return Err(Error::Image {
                    image: name,
                    problem: format!("its file {} (for {path}) does not exist", source.display()),
                });
            }
            files.push(ImageFile {
                source,
                path: path.clone(),
            });
        }
        Ok(MadeImage {
            spec: ImageSpec {
                root: tree.as_ref().map(|t| t.root.clone()),
                user: self.user.clone(),
                entrypoint: self.entrypoint.clone(),
                cmd: self.cmd.clone(),
                env: self.env.clone(),
                ca_certificates: self.ca_certificates,
                ..ImageSpec::new(name, files)
            },
            tree,
        })
    }
}

/// The file name of an absolute image path, refused when there is none.
fn program_name(image: &str, path: &str) -> Result<String> {
    Path::new(path)
        .file_name()
        .filter(|_| path.starts_with('/'))
        .map(|n| n.to_string_lossy().into_owned())
        .ok_or_else(|| Error::Image {
            image: image.to_owned(),
            problem: format!("its program path {path} is not an absolute file path"),
        })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_declaration_file_reads_with_its_includes_once() {
        let dir = tempfile::tempdir().expect("temp dir");
        std::fs::create_dir_all(dir.path().join("other")).expect("mkdir");
        std::fs::write(
            dir.path().join("other/test-images.yaml"),
            "images:\n  - name: other:1\n    files: { /x: x }\n",
        )
        .expect("write");
        std::fs::write(
            dir.path().join("test-images.yaml"),
            "include: [other/test-images.yaml, other/test-images.yaml]\nimages:\n  - name: \"app:{version}\"\n    debian: [app-server]\n    go:\n      modules: [example.org/app@v1.2.3]\n      programs: { /usr/local/bin/app: example.org/app/cmd/app }\n    entrypoint: [/usr/local/bin/app]\n",
        )
        .expect("write");
        let read = Declarations::read(&dir.path().join("test-images.yaml")).expect("reads");
        let names: Vec<&str> = read.images.iter().map(|i| i.name.as_str()).collect();
        assert_eq!(names, ["other:1", "app:{version}"]);
        assert!(read.images[0].base.ends_with("other"));
        assert_eq!(read.images[1].debian, ["app-server"]);
    }

    #[test]
    fn an_unknown_field_is_refused_with_the_file_named() {
        let dir = tempfile::tempdir().expect("temp dir");
        let path = dir.path().join("test-images.yaml");
        std::fs::write(&path, "images:\n  - name: a:1\n    packages: [x]\n").expect("write");
        let error = Declarations::read(&path).expect_err("`packages` is not a field");
        assert!(error.to_string().contains("packages"), "{error}");
        assert!(error.to_string().contains("test-images.yaml"), "{error}");
    }

    #[test]
    fn a_declared_file_is_found_as_a_program_and_a_missing_one_is_refused() {
        let dir = tempfile::tempdir().expect("temp dir");
        std::fs::write(dir.path().join("tool"), "#!/bin/sh\n").expect("write");
        let path = dir.path().join("test-images.yaml");
        std::fs::write(
            &path,
            "images:\n  - name: reg.example/tool:2\n    files: { /usr/bin/tool: tool }\n  - name: broken:1\n    files: { /usr/bin/gone: gone }\n",
        )
        .expect("write");
        let read = Declarations::read(&path).expect("reads");
        let binaries = Binaries::locate().expect("versions.env");
        let made = read.images[0]
            .make(&binaries)
            .expect("made from files alone");
        assert_eq!(made.program("tool"), Some(dir.path().join("tool")));
        assert_eq!((made.repository(), made.tag()), ("reg.example/tool", "2"));
        let error = read.images[1].make(&binaries).expect_err("no such file");
        assert!(error.to_string().contains("gone"), "{error}");
    }
}
