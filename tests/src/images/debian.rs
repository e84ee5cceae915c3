//! Image trees made of Debian packages: the packages a declaration names, with everything they
//! depend on as apt resolves it for an empty system, fetched with `apt-get download` and
//! unpacked with `dpkg-deb -x` into a directory an [`ImageSpec`](super::ImageSpec) starts from.
//!
//! Why this way: the machine reaches Debian's archive and nothing else, and a package's own
//! files are what its upstream image holds too. Maintainer scripts are not run (no users, no
//! alternatives, no services): what a program needs from them, its declaration adds as files.
//! Why the closure "for an empty system" (`Dir::State::status=/dev/null`): the tree must not
//! depend on what this machine happens to have installed.
//!
//! A tree is made once per package set and version set: its directory is named by a hash of
//! the resolved `name=version` list, so a Debian point release makes a new tree, and a second
//! test process finds the first one's.

use std::path::{Path, PathBuf};
use std::process::Command;

use sha2::{Digest as _, Sha256};

use crate::{Error, Result};

/// The file in a finished tree that lists its packages; its presence says the tree is whole.
const MANIFEST: &str = ".policy-host-packages";

/// Directories of a tree that no image needs (documentation and translations).
const LEFT_OUT: &[&str] = &[
    "usr/share/doc",
    "usr/share/man",
    "usr/share/info",
    "usr/share/locale",
    "usr/share/lintian",
];

/// Where programs are looked for in a tree, as a Debian `PATH` has them.
pub const PROGRAM_DIRS: &[&str] = &["usr/local/bin", "usr/bin", "bin", "usr/sbin", "sbin"];

/// The x86-64 dynamic loader's path in a Debian tree and the directories of its libraries.
const LOADER: &str = "lib64/ld-linux-x86-64.so.2";
const LIBRARY_DIRS: &[&str] = &["lib/x86_64-linux-gnu", "usr/lib/x86_64-linux-gnu"];

/// A tree of unpacked Debian packages.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct DebianTree {
    /// The directory holding the unpacked files (the image's `/`).
    pub root: PathBuf,
    /// Every package in it, `(name, version)`, in apt's install order.
    pub packages: Vec<(String, String)>,
}

impl DebianTree {
    /// The version of package `name` in the tree.
    pub fn version_of(&self, name: &str) -> Option<&str> {
        self.packages
            .iter()
            .find(|(package, _)| package == name)
            .map(|(_, version)| version.as_str())
    }

    /// The program `name` of the tree (looked for where a Debian `PATH` looks), on this machine.
    pub fn program(&self, name: &str) -> Option<PathBuf> {
        PROGRAM_DIRS
            .iter()
            .map(|dir| self.root.join(dir).join(name))
            .find(|path| path.exists())
    }

    /// A command that runs `program` (a file of the tree) on this machine with the tree's own
    /// loader and libraries, so it needs nothing installed here: how a test runs the image's
    /// client against a Pod.
    pub fn command(&self, program: &Path) -> Command {
        let loader = self.root.join(LOADER);
        if !loader.exists() {
            return Command::new(program);
        }
        let libraries: Vec<String> = LIBRARY_DIRS
            .iter()
            .map(|dir| self.root.join(dir).display().to_string())
            .collect();
        let mut command = Command::new(loader);
        command
            .arg("--library-path")
            .arg(libraries.join(":"))
            .arg(program);
        command
    }
}

/// The upstream part of a Debian version: `5:7.0.15-1~deb12u10` → `7.0.15` (no epoch, no
/// Debian revision).
pub fn upstream_version(version: &str) -> &str {
    let without_epoch = version.split_once(':').map_or(version, |(_, rest)| rest);
    without_epoch
        .rsplit_once('-')
        .map_or(without_epoch, |(upstream, _)| upstream)
}

/// Unpacks `packages` and their dependencies (no recommends) into a tree under `cache`
/// (`<cache>/<hash>/root`), or finds the tree made before. Blocking: apt and dpkg-deb run.
pub fn unpack(packages: &[String], cache: &Path) -> Result<DebianTree> {
    let closure = closure(packages)?;
    let mut hasher = Sha256::new();
    for (name, version) in &closure {
        hasher.update(format!("{name}={version}\n"));
    }
    let key: String = hasher
        .finalize()
        .iter()
        .take(8)
        .map(|b| format!("{b:02x}"))
        .collect();
    let dir = cache.join(&key);
    let tree = DebianTree {
        root: dir.join("root"),
        packages: closure,
    };
    if tree.root.join(MANIFEST).is_file() {
        return Ok(tree);
    }
    let debs = dir.join("debs");
    std::fs::create_dir_all(&debs).map_err(Error::io(format!("creating {}", debs.display())))?;
    // One maker of a tree at a time, across threads and processes (the lock is the open
    // file's): the others wait here, then find it made. apt-get's downloads and the staging
    // directory are not safe to share.
    let lock_path = dir.join("lock");
    let lock = std::fs::File::create(&lock_path)
        .map_err(Error::io(format!("creating {}", lock_path.display())))?;
    lock.lock()
        .map_err(Error::io(format!("locking {}", lock_path.display())))?;
    if tree.root.join(MANIFEST).is_file() {
        return Ok(tree);
    }
    let wanted: Vec<String> = tree
        .packages
        .iter()
        .map(|(name, version)| format!("{name}={version}"))
        .collect();
    run(
        Command::new("apt-get")
            .arg("download")
            // Root's downloads otherwise warn that the `_apt` user cannot write here.
            .args(["-o", "APT::Sandbox::User=root"])
            .args(&wanted)
            .current_dir(&debs),
        "downloading Debian packages (apt-get download); the machine must reach its Debian mirror",
    )?;
    let staging = dir.join(format!("root.{}.partial", std::process::id()));
    let _ = std::fs::remove_dir_all(&staging);
    std::fs::create_dir_all(&staging)
        .map_err(Error::io(format!("creating {}", staging.display())))?;
    let mut files: Vec<PathBuf> = std::fs::read_dir(&debs)
        .map_err(Error::io(format!("reading {}", debs.display())))?
        .flatten()
        .map(|e| e.path())
        .filter(|p| p.extension().is_some_and(|e| e == "deb"))
        .collect();
    files.sort();
    for (name, _) in &tree.packages {
        if !files.iter().any(|f| {
            f.file_name()
                .is_some_and(|n| n.to_string_lossy().starts_with(&format!("{name}_")))
        }) {
            return Err(Error::Image {
                image: packages.join(" "),
                problem: format!(
                    "apt-get download left no file for package {name} in {}",
                    debs.display()
                ),
            });
        }
    }
    for deb in &files {
        run(
            Command::new("dpkg-deb").arg("-x").arg(deb).arg(&staging),
            "unpacking a Debian package (dpkg-deb -x)",
        )?;
    }
    for dir in LEFT_OUT {
        let _ = std::fs::remove_dir_all(staging.join(dir));
    }
    let manifest: String = wanted.iter().map(|line| format!("{line}\n")).collect();
    std::fs::write(staging.join(MANIFEST), manifest).map_err(Error::io(format!(
        "writing {MANIFEST} in {}",
        staging.display()
    )))?;
    // Renamed into place: an interrupted unpack never leaves a tree that looks whole. Another
    // process may have finished the same tree first; then its tree is as good as this one.
    if std::fs::rename(&staging, &tree.root).is_err() {
        let _ = std::fs::remove_dir_all(&staging);
        if !tree.root.join(MANIFEST).is_file() {
            return Err(Error::Image {
                image: packages.join(" "),
                problem: format!(
                    "could not move the unpacked tree to {}",
                    tree.root.display()
                ),
            });
        }
    }
    Ok(tree)
}

/// `packages` and what they depend on, `(name, version)` in install order, as apt would install
/// them on a system with nothing installed. Refreshes apt's lists once (as root) if apt does
/// not know a package.
fn closure(packages: &[String]) -> Result<Vec<(String, String)>> {
    let simulate = || {
        Command::new("apt-get")
            .args([
                "-s",
                "-o",
                "Dir::State::status=/dev/null",
                "-o",
                "Debug::NoLocking=1",
            ])
            .args(["install", "--no-install-recommends"])
            .args(packages)
            .output()
            .map_err(Error::io(
                "running apt-get (this test environment needs Debian's apt)",
            ))
    };
    let mut output = simulate()?;
    if !output.status.success() && running_as_root() {
        let _ = Command::new("apt-get").arg("update").output();
        output = simulate()?;
    }
    if !output.status.success() {
        return Err(Error::Image {
            image: packages.join(" "),
            problem: format!(
                "apt cannot resolve these Debian packages: {}; check their names (apt-cache policy <name>) or run `apt-get update`",
                String::from_utf8_lossy(&output.stderr).trim()
            ),
        });
    }
    let text = String::from_utf8_lossy(&output.stdout);
    let resolved: Vec<(String, String)> = text
        .lines()
        .filter_map(|line| {
            // `Inst libc6 (2.36-9+deb12u13 Debian:12.12/stable [amd64])`
            let rest = line.strip_prefix("Inst ")?;
            let (name, rest) = rest.split_once(' ')?;
            let version = rest.strip_prefix('(')?.split_whitespace().next()?;
            Some((name.to_owned(), version.to_owned()))
        })
        .collect();
    if resolved.is_empty() {
        return Err(Error::Image {
            image: packages.join(" "),
            problem: format!("apt resolved nothing to install: {}", text.trim()),
        });
    }
    Ok(resolved)
}

/// Whether this process runs as root (`/proc/self` belongs to the effective user), which
/// `apt-get update` needs.
fn running_as_root() -> bool {
    use std::os::unix::fs::MetadataExt as _;
    std::fs::metadata("/proc/self").is_ok_and(|m| m.uid() == 0)
}

fn run(command: &mut Command, what: &str) -> Result<()> {
    let output = command
        .output()
        .map_err(Error::io(format!("{what}: running {command:?}")))?;
    if output.status.success() {
        Ok(())
    } else {
        Err(Error::Command {
            what: format!("{what}: {command:?}"),
            output: String::from_utf8_lossy(&output.stderr).into_owned(),
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_upstream_version_drops_epoch_and_debian_revision() {
        for (debian, upstream) in [
            ("5:7.0.15-1~deb12u10", "7.0.15"),
            ("1:10.11.19-0+deb12u1", "10.11.19"),
            ("2.36-9+deb12u13", "2.36"),
            ("1.2.3", "1.2.3"),
        ] {
            assert_eq!(upstream_version(debian), upstream, "{debian}");
        }
    }

    /// The suites' tests that need one image start together (a process's threads, and other
    /// processes): each gets the whole tree, made once. Downloads `hostname` and what it
    /// depends on (a few MiB) from the machine's Debian mirror, as the images do.
    #[test]
    fn concurrent_unpacks_of_one_tree_each_get_it_whole() {
        let cache = tempfile::tempdir().expect("a temporary directory");
        let packages = ["hostname".to_owned()];
        let trees: Vec<Result<DebianTree>> = std::thread::scope(|scope| {
            let unpacks: Vec<_> = (0..4)
                .map(|_| scope.spawn(|| unpack(&packages, cache.path())))
                .collect();
            unpacks
                .into_iter()
                .map(|u| u.join().expect("the unpack thread did not panic"))
                .collect()
        });
        for tree in trees {
            let tree = tree.expect("each unpack succeeds");
            assert!(
                tree.root.join("bin/hostname").is_file(),
                "{}",
                tree.root.display()
            );
            assert!(tree.root.join(MANIFEST).is_file());
        }
    }
}
