//! Container images made on this machine, without a registry or Docker: docker-archive
//! tarballs of one layer, for the real node's containerd to import under the very names the
//! Pods use. This is the one image builder; it knows no app.
//!
//! Why no registry: none is reachable here. A tagged image that is already present is used
//! as it is (`IfNotPresent` is the default for tags), so the kubelet never tries to pull it.
//!
//! An image is an [`ImageSpec`]: its name, optionally a root tree it starts from (Debian
//! packages unpacked, [`debian`]), the files it holds (each at an absolute path), its user,
//! entrypoint and environment. Every image also gets a small base: `/etc/passwd` and
//! `/etc/group` with `root` and `nonroot` (65532, the distroless convention) unless its tree
//! has them, `/tmp`, the shared libraries `ldd` lists for each dynamic program it takes from
//! this machine, and on request the machine's CA bundle. Archives are cached by a key over
//! everything that goes in, so a second test process reuses them.
//!
//! Where specs come from: a plugin declares the images its tests run in a `test-images.yaml`
//! beside it ([`declared`]); the host's own image follows `deploy/Dockerfile`
//! ([`DockerfileImage`]); the pod sandbox is made by [`crate::node`].

pub mod debian;
pub mod declared;
mod dockerfile;

pub use declared::{Declarations, MadeImage};
pub use dockerfile::{DockerfileError, DockerfileImage};

use std::collections::BTreeSet;
use std::path::{Path, PathBuf};
use std::process::Command;

use serde_json::json;
use sha2::{Digest as _, Sha256};

use crate::{Error, Result};

/// The user id of `nonroot` in every image (distroless's, and what the Pods' `runAsUser` use).
pub const NONROOT_UID: u32 = 65532;

/// Where the machine keeps its CA bundle (Debian's ca-certificates), and where images get it.
const CA_BUNDLE: &str = "/etc/ssl/certs/ca-certificates.crt";

/// One file of an image: `source` on this machine goes to the absolute `path` in the image.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ImageFile {
    /// The file on this machine (symbolic links are followed).
    pub source: PathBuf,
    /// Its absolute path in the image, e.g. `/usr/local/bin/app`.
    pub path: String,
}

/// What an image holds and how it runs.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ImageSpec {
    /// The reference Pods use, e.g. `registry.example/app:1.2.3`.
    pub name: String,
    /// A directory whose whole tree (links and modes kept) the image starts from, e.g. Debian
    /// packages unpacked by [`debian::unpack`]; the files go on top of it.
    pub root: Option<PathBuf>,
    /// The files beside the base.
    pub files: Vec<ImageFile>,
    /// The image's `USER` (numeric, so that the kubelet can check `runAsNonRoot`), if any.
    pub user: Option<String>,
    /// The image's entrypoint.
    pub entrypoint: Vec<String>,
    /// The image's default arguments.
    pub cmd: Vec<String>,
    /// Extra environment, `NAME=value`, after a standard `PATH`.
    pub env: Vec<String>,
    /// Whether the machine's CA bundle goes in (at `/etc/ssl/certs/ca-certificates.crt`).
    pub ca_certificates: bool,
}

impl ImageSpec {
    /// An image named `name` holding `files`, no user, no entrypoint, no CA bundle.
    pub fn new(name: impl Into<String>, files: Vec<ImageFile>) -> ImageSpec {
        ImageSpec {
            name: name.into(),
            root: None,
            files,
            user: None,
            entrypoint: Vec::new(),
            cmd: Vec::new(),
            env: Vec::new(),
            ca_certificates: false,
        }
    }

    /// Writes the image as a docker-archive tarball in `dir` (unless one with the same content
    /// key is there already) and returns its path.
    pub fn write_archive(&self, dir: &Path) -> Result<PathBuf> {
        let key = self.content_key()?;
        let clean: String = self
            .name
            .chars()
            .map(|c| if c.is_ascii_alphanumeric() { c } else { '-' })
            .collect();
        let archive = dir.join(format!("{clean}-{key}.tar"));
        if archive.is_file() {
            return Ok(archive);
        }
        std::fs::create_dir_all(dir).map_err(Error::io(format!("creating {}", dir.display())))?;
        let staging = tempfile::Builder::new()
            .prefix("image-")
            .tempdir_in(dir)
            .map_err(Error::io(format!(
                "creating a staging directory in {}",
                dir.display()
            )))?;
        let root = staging.path().join("rootfs");
        self.fill_root(&root)?;
        let layer = staging.path().join("layer.tar");
        run(Command::new("tar")
            .args([
                "--numeric-owner",
                "--owner=0",
                "--group=0",
                "--sort=name",
                "--mtime=@0",
                "-C",
            ])
            .arg(&root)
            .arg("-cf")
            .arg(&layer)
            .arg("."))?;
        let layer_bytes =
            std::fs::read(&layer).map_err(Error::io(format!("reading {}", layer.display())))?;
        let diff_id = hex(&Sha256::digest(&layer_bytes));
        let config = self.config_json(&diff_id);
        let config_bytes = serde_json::to_vec(&config).map_err(|e| Error::Io {
            what: format!("writing the config of image {}", self.name),
            source: std::io::Error::other(e),
        })?;
        let config_name = format!("{}.json", hex(&Sha256::digest(&config_bytes)));
        write(&staging.path().join(&config_name), &config_bytes)?;
        let manifest = json!([{
            "Config": config_name,
            "RepoTags": [self.name],
            "Layers": ["layer.tar"],
        }]);
        write(
            &staging.path().join("manifest.json"),
            manifest.to_string().as_bytes(),
        )?;
        let partial = archive.with_extension("tar.partial");
        run(Command::new("tar")
            .arg("-C")
            .arg(staging.path())
            .arg("-cf")
            .arg(&partial)
            .args(["manifest.json", &config_name, "layer.tar"]))?;
        // Renamed into place: an interrupted write never leaves an archive that looks done.
        std::fs::rename(&partial, &archive).map_err(Error::io(format!(
            "moving {} into place",
            archive.display()
        )))?;
        Ok(archive)
    }

    /// The image's config: how it runs, and the one layer's digest.
    fn config_json(&self, diff_id: &str) -> serde_json::Value {
        let mut env =
            vec!["PATH=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin".to_owned()];
        if self.ca_certificates {
            env.push(format!("SSL_CERT_FILE={CA_BUNDLE}"));
        }
        env.extend(self.env.iter().cloned());
        let mut config = json!({ "Env": env, "WorkingDir": "/" });
        if let Some(user) = &self.user {
            config["User"] = json!(user);
        }
        if !self.entrypoint.is_empty() {
            config["Entrypoint"] = json!(self.entrypoint);
        }
        if !self.cmd.is_empty() {
            config["Cmd"] = json!(self.cmd);
        }
        json!({
            "architecture": "amd64",
            "os": "linux",
            "config": config,
            "rootfs": { "type": "layers", "diff_ids": [format!("sha256:{diff_id}")] },
        })
    }

    /// Every path the image's layer holds (files and directories, absolute), without writing
    /// it: what a test compares with the Dockerfile.
    pub fn layout(&self) -> Result<BTreeSet<String>> {
        let mut paths = BTreeSet::new();
        for (_, path) in self.all_files()? {
            let mut at = Path::new(&path);
            paths.insert(path.clone());
            while let Some(parent) = at.parent() {
                if parent == Path::new("/") {
                    break;
                }
                paths.insert(parent.display().to_string());
                at = parent;
            }
        }
        paths.insert("/tmp".into());
        Ok(paths)
    }

    /// The files with the base: the listed ones, their shared libraries, the CA bundle.
    fn all_files(&self) -> Result<Vec<(PathBuf, String)>> {
        let mut files: Vec<(PathBuf, String)> = Vec::new();
        let mut seen = BTreeSet::new();
        for file in &self.files {
            if !file.path.starts_with('/') {
                return Err(Error::Image {
                    image: self.name.clone(),
                    problem: format!(
                        "the path {} of {} is not absolute",
                        file.path,
                        file.source.display()
                    ),
                });
            }
            if seen.insert(file.path.clone()) {
                files.push((file.source.clone(), file.path.clone()));
            }
            for library in shared_libraries(&file.source)? {
                let path = library.display().to_string();
                if seen.insert(path.clone()) {
                    files.push((library, path));
                }
            }
        }
        if self.ca_certificates && seen.insert(CA_BUNDLE.to_owned()) {
            files.push((PathBuf::from(CA_BUNDLE), CA_BUNDLE.to_owned()));
        }
        Ok(files)
    }

    fn fill_root(&self, root: &Path) -> Result<()> {
        std::fs::create_dir_all(root).map_err(Error::io(format!("creating {}", root.display())))?;
        if let Some(tree) = &self.root {
            // `cp -a`: the tree's symbolic links (library sonames, `/usr/sbin/mysqld` and the
            // like) and modes go in as they are.
            run(Command::new("cp").arg("-a").arg(tree.join(".")).arg(root))?;
        }
        let listed: BTreeSet<&str> = self.files.iter().map(|f| f.path.as_str()).collect();
        for (source, path) in self.all_files()? {
            let target = root.join(path.trim_start_matches('/'));
            // A library `ldd` found on this machine never replaces the tree's own.
            if self.root.is_some()
                && !listed.contains(path.as_str())
                && target.symlink_metadata().is_ok()
            {
                continue;
            }
            if let Some(parent) = target.parent() {
                std::fs::create_dir_all(parent)
                    .map_err(Error::io(format!("creating {}", parent.display())))?;
            }
            // Removed first: the tree's entry may be a link, which `copy` would write through.
            let _ = std::fs::remove_file(&target);
            std::fs::copy(&source, &target).map_err(Error::io(format!(
                "copying {} into image {}",
                source.display(),
                self.name
            )))?;
        }
        let etc = root.join("etc");
        std::fs::create_dir_all(&etc).map_err(Error::io(format!("creating {}", etc.display())))?;
        if !etc.join("passwd").exists() {
            write(
                &etc.join("passwd"),
                format!("root:x:0:0:root:/root:/sbin/nologin\nnonroot:x:{NONROOT_UID}:{NONROOT_UID}:nonroot:/tmp:/sbin/nologin\n").as_bytes(),
            )?;
        }
        if !etc.join("group").exists() {
            write(
                &etc.join("group"),
                format!("root:x:0:\nnonroot:x:{NONROOT_UID}:\n").as_bytes(),
            )?;
        }
        let tmp = root.join("tmp");
        std::fs::create_dir_all(&tmp).map_err(Error::io(format!("creating {}", tmp.display())))?;
        use std::os::unix::fs::PermissionsExt as _;
        std::fs::set_permissions(&tmp, std::fs::Permissions::from_mode(0o1777)).map_err(
            Error::io(format!("making {} world-writable", tmp.display())),
        )?;
        Ok(())
    }

    /// A key over everything that goes into the archive: name, config and each file's path,
    /// size and modification time (a rebuilt binary changes it).
    fn content_key(&self) -> Result<String> {
        let mut hasher = Sha256::new();
        hasher.update(self.config_json("").to_string());
        hasher.update(&self.name);
        if let Some(tree) = &self.root {
            // A tree is made once under a name that is its content's key (debian::unpack).
            hasher.update(format!("tree {}\n", tree.display()));
        }
        for (source, path) in self.all_files()? {
            let meta = std::fs::metadata(&source).map_err(Error::io(format!(
                "reading {} for image {}",
                source.display(),
                self.name
            )))?;
            let modified = meta
                .modified()
                .ok()
                .and_then(|t| t.duration_since(std::time::UNIX_EPOCH).ok())
                .map_or(0, |d| d.as_nanos());
            hasher.update(format!(
                "{path}\0{}\0{}\0{modified}\n",
                source.display(),
                meta.len()
            ));
        }
        Ok(hex(&hasher.finalize())[..16].to_owned())
    }
}

/// The shared libraries `ldd` lists for `program` (none for a static one), with the dynamic
/// loader, each at the path the program will look for it.
fn shared_libraries(program: &Path) -> Result<Vec<PathBuf>> {
    let output = Command::new("ldd")
        .arg(program)
        .output()
        .map_err(Error::io("running ldd (install libc-bin)"))?;
    // ldd exits non-zero for "not a dynamic executable" (static programs, data files).
    if !output.status.success() {
        return Ok(Vec::new());
    }
    let text = String::from_utf8_lossy(&output.stdout);
    Ok(text
        .lines()
        .filter_map(|line| {
            let line = line.trim();
            let path = match line.split_once("=>") {
                Some((_, right)) => right.split_whitespace().next()?,
                None => line.split_whitespace().next()?,
            };
            path.starts_with('/').then(|| PathBuf::from(path))
        })
        .collect())
}

fn run(command: &mut Command) -> Result<()> {
    let output = command
        .output()
        .map_err(Error::io(format!("running {command:?}")))?;
    if output.status.success() {
        Ok(())
    } else {
        Err(Error::Io {
            what: format!(
                "{command:?} failed: {}",
                String::from_utf8_lossy(&output.stderr)
            ),
            source: std::io::Error::other("command failed"),
        })
    }
}

fn write(path: &Path, bytes: &[u8]) -> Result<()> {
    std::fs::write(path, bytes).map_err(Error::io(format!("writing {}", path.display())))
}

fn hex(bytes: &[u8]) -> String {
    bytes.iter().map(|b| format!("{b:02x}")).collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    fn deploy_dockerfile() -> String {
        let path = Path::new(env!("CARGO_MANIFEST_DIR")).join("../deploy/Dockerfile");
        std::fs::read_to_string(&path).expect("deploy/Dockerfile is in the repository")
    }

    #[test]
    fn deploy_dockerfile_user_is_numeric_so_run_as_non_root_starts() {
        let image = DockerfileImage::parse(&deploy_dockerfile())
            .expect("deploy/Dockerfile is reproducible locally");
        assert_eq!(image.user, format!("{NONROOT_UID}:{NONROOT_UID}"));
    }

    #[test]
    fn a_named_user_is_refused_with_the_numeric_one_to_write() {
        let error = DockerfileImage::parse(
            "FROM gcr.io/distroless/cc-debian12:nonroot\nUSER nonroot\nENTRYPOINT [\"/x\"]\n",
        )
        .expect_err("a named user cannot be checked by the kubelet");
        assert!(error.to_string().contains("USER 65532:65532"), "{error}");
    }

    #[test]
    fn an_unknown_base_is_refused() {
        let error = DockerfileImage::parse("FROM alpine:3\nUSER 1:1\n").expect_err("unknown base");
        assert!(error.to_string().contains("alpine:3"), "{error}");
    }

    /// The local host image holds what the Dockerfile copies, at the same paths, runs as the
    /// Dockerfile's user with its entrypoint, and carries CA certificates (a missing CA store
    /// panicked the host's HTTP client once).
    #[test]
    fn host_image_follows_the_dockerfile() {
        let dockerfile = DockerfileImage::parse(&deploy_dockerfile()).expect("parses");
        let scratch = tempfile::tempdir().expect("temp dir");
        let fake = scratch.path().join("fake");
        std::fs::write(&fake, b"not a program").expect("write");
        let spec = dockerfile
            .image_spec("policy-host:test", |_| Some(fake.clone()))
            .expect("every COPY resolves");
        let layout = spec.layout().expect("layout");
        for (_, destination) in &dockerfile.copies {
            assert!(
                layout.contains(destination),
                "{destination} missing from {layout:?}"
            );
        }
        assert!(layout.contains("/usr/local/bin/policy-host"), "{layout:?}");
        assert!(layout.contains(CA_BUNDLE), "{layout:?}");

        let archive = spec.write_archive(scratch.path()).expect("archive");
        let listing = Command::new("tar")
            .arg("-xOf")
            .arg(&archive)
            .arg("manifest.json")
            .output()
            .expect("tar");
        let manifest: serde_json::Value =
            serde_json::from_slice(&listing.stdout).expect("manifest");
        assert_eq!(manifest[0]["RepoTags"][0], "policy-host:test");
        let config_name = manifest[0]["Config"]
            .as_str()
            .expect("config name")
            .to_owned();
        let config = Command::new("tar")
            .arg("-xOf")
            .arg(&archive)
            .arg(&config_name)
            .output()
            .expect("tar");
        let config: serde_json::Value = serde_json::from_slice(&config.stdout).expect("config");
        assert_eq!(config["config"]["User"], json!(dockerfile.user));
        assert_eq!(config["config"]["Entrypoint"], json!(dockerfile.entrypoint));
        assert_eq!(config["config"]["Cmd"], json!(dockerfile.cmd));

        let extract = scratch.path().join("extract");
        std::fs::create_dir_all(&extract).expect("mkdir");
        let status = Command::new("tar")
            .arg("-xf")
            .arg(&archive)
            .arg("-C")
            .arg(&extract)
            .arg("layer.tar")
            .status()
            .expect("tar");
        assert!(status.success());
        let layer = Command::new("tar")
            .arg("-tf")
            .arg(extract.join("layer.tar"))
            .output()
            .expect("tar");
        let entries = String::from_utf8_lossy(&layer.stdout);
        for (_, destination) in &dockerfile.copies {
            let path = format!(".{destination}");
            assert!(entries.lines().any(|e| e == path), "{path} in {entries}");
        }
        for path in [
            "./usr/local/bin/policy-host",
            "./etc/ssl/certs/ca-certificates.crt",
            "./etc/passwd",
            "./tmp/",
        ] {
            assert!(
                entries.lines().any(|l| l == path),
                "{path} not in the layer: {entries}"
            );
        }
        // A second write with the same content reuses the archive.
        assert_eq!(spec.write_archive(scratch.path()).expect("cached"), archive);
    }

    #[test]
    fn a_dynamic_program_brings_its_libraries() {
        let spec = ImageSpec::new(
            "shell:test",
            vec![ImageFile {
                source: "/bin/sh".into(),
                path: "/bin/sh".into(),
            }],
        );
        let layout = spec.layout().expect("layout");
        assert!(layout.iter().any(|p| p.contains("libc.so")), "{layout:?}");
    }
}
