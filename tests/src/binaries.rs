//! Locating the programs the test environment itself runs (kube-apiserver,
//! kube-controller-manager, the control plane's own etcd), building them once per process with
//! `tests/env/build-binaries.sh` when they are missing. No app is named here: a Go program an
//! image declares is built by the script's generic `go` family ([`Binaries::build_go`]), on
//! demand. The real node's programs (family `node`: kubelet, kube-proxy, kube-scheduler, containerd,
//! runc, CoreDNS, the pause program, Debian's CNI plugins and nftables) are part of `all`, and
//! [`Binaries::ensure_node`] builds what is missing when a test starts a node. The fault
//! campaign's client (family `campaign`, [`Binaries::ensure_campaign_writer`]) is built on
//! demand too.
//!
//! Versions come from `tests/env/versions.env`; the cache is
//! `${POLICY_HOST_CACHE:-$HOME/.cache/policy-host}/bin`. `KUBEBUILDER_ASSETS`, when set to a
//! directory holding `kube-apiserver`, takes precedence for kube-apiserver,
//! kube-controller-manager (if present there) and the control plane's own etcd.

use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::sync::OnceLock;

use crate::{Error, Result};

/// Where every binary the test environment runs lives.
#[derive(Debug, Clone)]
pub struct Binaries {
    kubernetes_version: String,
    control_plane_etcd_version: String,
    helm_version: String,
    registry_version: String,
    containerd_version: String,
    runc_version: String,
    coredns_version: String,
    pause_image: String,
    cache_bin: PathBuf,
    assets: Option<PathBuf>,
}

/// The outcome of the one build attempt of this process (errors are kept as text to be shareable).
static ENSURED: OnceLock<Result<Binaries, String>> = OnceLock::new();
/// The outcome of the one `node` build attempt of this process.
static ENSURED_NODE: OnceLock<Result<(), String>> = OnceLock::new();
/// The outcome of the one `helm` build attempt of this process.
static ENSURED_HELM: OnceLock<Result<(), String>> = OnceLock::new();
/// The outcome of the one `registry` build attempt of this process.
static ENSURED_REGISTRY: OnceLock<Result<(), String>> = OnceLock::new();
/// The outcome of the one `campaign` build attempt of this process: the client's path.
static ENSURED_CAMPAIGN: OnceLock<Result<PathBuf, String>> = OnceLock::new();

/// Where Debian's containernetworking-plugins installs the CNI plugins.
const CNI_BIN_DIR: &str = "/usr/lib/cni";

impl Binaries {
    /// Finds the binaries, building the missing ones with `tests/env/build-binaries.sh` (its
    /// progress goes to stderr). The build runs at most once per process; later calls return the
    /// same answer. Blocking: a cold build takes about 20 minutes on 2 cores, a cached run well
    /// under a second. From async code, call it through `tokio::task::spawn_blocking`.
    pub fn ensure() -> Result<Binaries> {
        ENSURED
            .get_or_init(|| Self::ensure_uncached().map_err(|e| e.to_string()))
            .clone()
            .map_err(|reason| Error::Build { reason })
    }

    fn ensure_uncached() -> Result<Binaries> {
        let binaries = Self::locate()?;
        if binaries.missing().is_empty() {
            return Ok(binaries);
        }
        run_build_script(&[], &binaries.missing())?;
        match binaries.missing().first() {
            None => Ok(binaries),
            Some(missing) => Err(Error::MissingBinary {
                binary: missing.clone(),
                path: binaries.cache_bin.clone(),
            }),
        }
    }

    /// Builds the Go programs of `recipe` (once per recipe and cache: the output directory is
    /// named by a hash of it) with `build-binaries.sh go`, and returns the directory holding
    /// them, each under its program name. Blocking (cold: minutes; cached: instant): from async
    /// code, call it through `tokio::task::spawn_blocking`.
    pub fn build_go(&self, recipe: &GoPrograms) -> Result<PathBuf> {
        let name = recipe.cache_name();
        let dir = self.cache_bin.join(&name);
        let missing: Vec<String> = recipe
            .programs
            .iter()
            .map(|(program, _)| dir.join(program))
            .filter(|path| !path.is_file())
            .map(|path| path.display().to_string())
            .collect();
        if missing.is_empty() {
            return Ok(dir);
        }
        let mut args = vec!["go".to_owned(), name];
        args.extend(recipe.modules.iter().cloned());
        args.push("--".into());
        args.extend(
            recipe
                .programs
                .iter()
                .map(|(program, package)| format!("{program}={package}")),
        );
        run_build_script(&args, &missing)?;
        match recipe
            .programs
            .iter()
            .map(|(program, _)| dir.join(program))
            .find(|path| !path.is_file())
        {
            None => Ok(dir),
            Some(still) => Err(Error::MissingBinary {
                binary: still.display().to_string(),
                path: dir,
            }),
        }
    }

    /// Makes sure the real node's programs are there, running `build-binaries.sh node` when
    /// some are missing (at most once per process; cold, about 8 minutes on 2 cores with the
    /// kube build cache warm). Blocking: from async code, call it through
    /// `tokio::task::spawn_blocking`.
    pub fn ensure_node(&self) -> Result<()> {
        ensure_family(&ENSURED_NODE, "node", || self.node_missing())
    }

    /// Makes sure `helm` is built, running `build-binaries.sh helm` when it is missing (at most
    /// once per process; cold, about 4 minutes on 2 cores), and returns its path. Blocking:
    /// from async code, call it through `tokio::task::spawn_blocking`.
    pub fn ensure_helm(&self) -> Result<PathBuf> {
        let helm = self
            .cache_bin
            .join(format!("helm-{}", self.helm_version))
            .join("helm");
        ensure_family(&ENSURED_HELM, "helm", || {
            if helm.is_file() {
                vec![]
            } else {
                vec![helm.display().to_string()]
            }
        })?;
        Ok(helm)
    }

    /// Makes sure the OCI registry (distribution's `registry`) is built, running
    /// `build-binaries.sh registry` when it is missing (at most once per process; cold, about
    /// 4 minutes on 2 cores), and returns its path. Blocking: from async code, call it through
    /// `tokio::task::spawn_blocking`.
    pub fn ensure_registry(&self) -> Result<PathBuf> {
        let registry = self
            .cache_bin
            .join(format!("registry-{}", self.registry_version))
            .join("registry");
        ensure_family(&ENSURED_REGISTRY, "registry", || {
            if registry.is_file() {
                vec![]
            } else {
                vec![registry.display().to_string()]
            }
        })?;
        Ok(registry)
    }

    /// Builds the fault campaign's client (`tests/env/campaign-writer`: a writer that checks
    /// its history with porcupine) with `build-binaries.sh campaign` unless the build of its
    /// current source is cached (cold: well under a minute with its modules downloaded), and
    /// returns its path. Blocking: from async code, call it through
    /// `tokio::task::spawn_blocking`.
    pub fn ensure_campaign_writer(&self) -> Result<PathBuf> {
        ENSURED_CAMPAIGN
            .get_or_init(|| {
                let script = env_dir().join("build-binaries.sh");
                let output = Command::new("bash")
                    .arg(&script)
                    .arg("campaign")
                    .stderr(Stdio::inherit())
                    .output()
                    .map_err(|e| format!("running {}: {e}", script.display()))?;
                if !output.status.success() {
                    return Err(format!(
                        "{} campaign exited with {}; its output is above",
                        script.display(),
                        output.status
                    ));
                }
                let stdout = String::from_utf8_lossy(&output.stdout);
                let path = PathBuf::from(stdout.lines().last().unwrap_or_default().trim());
                if path.is_file() {
                    Ok(path)
                } else {
                    Err(format!(
                        "{} campaign named {} as its output, which is not a file",
                        script.display(),
                        path.display()
                    ))
                }
            })
            .clone()
            .map_err(|reason| Error::Build { reason })
    }

    fn node_missing(&self) -> Vec<String> {
        let mut programs = vec![
            self.kubelet(),
            self.kube_proxy(),
            self.kube_scheduler(),
            self.containerd_dir().join("containerd"),
            self.containerd_dir().join("containerd-shim-runc-v2"),
            self.ctr(),
            self.runc_dir().join("runc"),
            self.coredns(),
            self.cni_bin_dir().join("bridge"),
            self.cni_bin_dir().join("host-local"),
            self.cni_bin_dir().join("loopback"),
            PathBuf::from("/usr/sbin/nft"),
        ];
        match self.pause() {
            Ok(pause) => programs.push(pause),
            Err(e) => return vec![e.to_string()],
        }
        programs
            .into_iter()
            .filter(|path| !path.is_file())
            .map(|path| path.display().to_string())
            .collect()
    }

    /// The cache directory (`${POLICY_HOST_CACHE:-$HOME/.cache/policy-host}`).
    pub fn cache_dir(&self) -> PathBuf {
        self.cache_bin
            .parent()
            .map_or_else(|| self.cache_bin.clone(), Path::to_path_buf)
    }

    /// Path of kubelet (built by [`Binaries::ensure_node`]).
    pub fn kubelet(&self) -> PathBuf {
        self.kubernetes_dir().join("kubelet")
    }

    /// Path of kube-proxy (built by [`Binaries::ensure_node`]).
    pub fn kube_proxy(&self) -> PathBuf {
        self.kubernetes_dir().join("kube-proxy")
    }

    /// Path of kube-scheduler (built by [`Binaries::ensure_node`]).
    pub fn kube_scheduler(&self) -> PathBuf {
        self.kubernetes_dir().join("kube-scheduler")
    }

    /// Directory holding `containerd`, `containerd-shim-runc-v2` and `ctr`.
    pub fn containerd_dir(&self) -> PathBuf {
        self.cache_bin
            .join(format!("containerd-{}", self.containerd_version))
    }

    /// Path of `ctr`, containerd's own client (image import, container listing).
    pub fn ctr(&self) -> PathBuf {
        self.containerd_dir().join("ctr")
    }

    /// Directory holding `runc` (first on containerd's `PATH`, where its shim looks for it).
    pub fn runc_dir(&self) -> PathBuf {
        self.cache_bin.join(format!("runc-{}", self.runc_version))
    }

    /// Path of CoreDNS.
    pub fn coredns(&self) -> PathBuf {
        self.cache_bin
            .join(format!("coredns-{}", self.coredns_version))
            .join("coredns")
    }

    /// Directory of the CNI plugins (Debian's containernetworking-plugins).
    pub fn cni_bin_dir(&self) -> PathBuf {
        PathBuf::from(CNI_BIN_DIR)
    }

    /// Path of the static pod sandbox program, built from `tests/env/pause.c` into a directory
    /// keyed by the source's hash (as `build-binaries.sh` does), so an edit rebuilds it.
    pub fn pause(&self) -> Result<PathBuf> {
        use sha2::Digest as _;
        let source = env_dir().join("pause.c");
        let text = std::fs::read(&source).map_err(Error::io(format!(
            "reading {} (the pod sandbox program)",
            source.display()
        )))?;
        let hash = sha2::Sha256::digest(&text);
        let short: String = hash.iter().take(6).map(|b| format!("{b:02x}")).collect();
        Ok(self.cache_bin.join(format!("pause-{short}")).join("pause"))
    }

    /// The pod sandbox image containerd pins (`registry.k8s.io/pause:3.10`).
    pub fn pause_image(&self) -> &str {
        &self.pause_image
    }

    /// Reads the versions and the environment without checking or building anything.
    pub fn locate() -> Result<Binaries> {
        let path = env_dir().join("versions.env");
        let text = std::fs::read_to_string(&path).map_err(|e| Error::Versions {
            path: path.clone(),
            reason: e.to_string(),
        })?;
        let var = |name: &str| {
            text.lines()
                .filter_map(|line| line.trim().strip_prefix(name)?.strip_prefix('='))
                .map(|value| value.trim().trim_matches('"').trim_matches('\'').to_owned())
                .next_back()
                .ok_or_else(|| Error::Versions {
                    path: path.clone(),
                    reason: format!("{name} is not set"),
                })
        };
        let kubernetes_version = var("KUBERNETES_VERSION")?;
        let control_plane_etcd_version = var("CONTROL_PLANE_ETCD_VERSION")?;
        let helm_version = var("HELM_VERSION")?;
        let registry_version = var("REGISTRY_VERSION")?;
        let containerd_version = var("CONTAINERD_VERSION")?;
        let runc_version = var("RUNC_VERSION")?;
        let coredns_version = var("COREDNS_VERSION")?;
        let pause_image = var("PAUSE_IMAGE")?;
        let cache = match std::env::var_os("POLICY_HOST_CACHE") {
            Some(dir) => PathBuf::from(dir),
            None => std::env::var_os("HOME")
                .map(PathBuf::from)
                .unwrap_or_else(|| PathBuf::from("/root"))
                .join(".cache/policy-host"),
        };
        let assets = std::env::var_os("KUBEBUILDER_ASSETS")
            .map(PathBuf::from)
            .filter(|dir| dir.join("kube-apiserver").is_file());
        Ok(Binaries {
            kubernetes_version,
            control_plane_etcd_version,
            helm_version,
            registry_version,
            containerd_version,
            runc_version,
            coredns_version,
            pause_image,
            cache_bin: cache.join("bin"),
            assets,
        })
    }

    /// Names of the binaries not present yet.
    fn missing(&self) -> Vec<String> {
        let mut missing = Vec::new();
        for path in [self.kube_apiserver(), self.kube_controller_manager()] {
            if !path.is_file() {
                missing.push(path.display().to_string());
            }
        }
        let etcd = self.control_plane_etcd();
        if !etcd.is_file() {
            missing.push(etcd.display().to_string());
        }
        missing
    }

    fn kubernetes_dir(&self) -> PathBuf {
        self.cache_bin
            .join(format!("kubernetes-{}", self.kubernetes_version))
    }

    /// The Kubernetes version of kube-apiserver and kube-controller-manager (`v1.36.3`).
    pub fn kubernetes_version(&self) -> &str {
        &self.kubernetes_version
    }

    /// Path of kube-apiserver.
    pub fn kube_apiserver(&self) -> PathBuf {
        match &self.assets {
            Some(dir) => dir.join("kube-apiserver"),
            None => self.kubernetes_dir().join("kube-apiserver"),
        }
    }

    /// Path of kube-controller-manager (from `KUBEBUILDER_ASSETS` if it holds one).
    pub fn kube_controller_manager(&self) -> PathBuf {
        match &self.assets {
            Some(dir) if dir.join("kube-controller-manager").is_file() => {
                dir.join("kube-controller-manager")
            }
            _ => self.kubernetes_dir().join("kube-controller-manager"),
        }
    }

    /// Path of kubectl: the one built beside kube-apiserver if present, else `kubectl` from PATH.
    pub fn kubectl(&self) -> PathBuf {
        let built = self.kubernetes_dir().join("kubectl");
        if built.is_file() {
            built
        } else {
            PathBuf::from("kubectl")
        }
    }

    /// Path of the etcd the control plane stores its own data in: `KUBEBUILDER_ASSETS/etcd` if
    /// present, else the one of `CONTROL_PLANE_ETCD_VERSION` (versions.env).
    pub fn control_plane_etcd(&self) -> PathBuf {
        match &self.assets {
            Some(dir) if dir.join("etcd").is_file() => dir.join("etcd"),
            _ => self
                .cache_bin
                .join(format!("etcd-{}", self.control_plane_etcd_version))
                .join("etcd"),
        }
    }
}

/// Go programs to build (the generic `go` family of `build-binaries.sh`): a wrapper module
/// requiring `modules` (`module@version`; the first one's `./staging/` replaces are mapped to
/// published versions, as Kubernetes needs), then one `go build` per program.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct GoPrograms {
    /// `module@version` pairs the wrapper module requires, the main one first.
    pub modules: Vec<String>,
    /// `(program name, package path)`: each package is built into a file of that name.
    pub programs: Vec<(String, String)>,
}

impl GoPrograms {
    /// The cache directory's name: the main module's last path element and version, and a hash
    /// over the whole recipe (another recipe never reuses a build).
    fn cache_name(&self) -> String {
        use sha2::Digest as _;
        let mut hasher = sha2::Sha256::new();
        for module in &self.modules {
            hasher.update(module.as_bytes());
            hasher.update(b"\n");
        }
        for (program, package) in &self.programs {
            hasher.update(format!("{program}={package}\n").as_bytes());
        }
        let hash: String = hasher
            .finalize()
            .iter()
            .take(6)
            .map(|b| format!("{b:02x}"))
            .collect();
        let main = self.modules.first().map_or("", String::as_str);
        let (module, version) = main.rsplit_once('@').unwrap_or((main, ""));
        let last = module
            .split('/')
            .rev()
            .find(|part| {
                !(part.len() >= 2
                    && part.starts_with('v')
                    && part[1..].bytes().all(|b| b.is_ascii_digit()))
            })
            .unwrap_or("go");
        let clean = |s: &str| -> String {
            s.chars()
                .map(|c| {
                    if c.is_ascii_alphanumeric() || c == '.' {
                        c
                    } else {
                        '-'
                    }
                })
                .collect()
        };
        format!("go-{}-{}-{hash}", clean(last), clean(version))
    }
}

/// Runs `build-binaries.sh [args]` because `missing` are, with its progress on our stderr
/// (both streams, so `cargo test` shows a cold build making progress).
fn run_build_script(args: &[String], missing: &[String]) -> Result<()> {
    let script = env_dir().join("build-binaries.sh");
    eprintln!(
        "policy-host-testenv: missing {}; running {} {} (progress below)",
        missing.join(", "),
        script.display(),
        args.join(" ")
    );
    let status = Command::new("bash")
        .arg(&script)
        .args(args)
        .stdout(std::io::stderr())
        .stderr(Stdio::inherit())
        .status()
        .map_err(Error::io(format!("running {}", script.display())))?;
    if status.success() {
        Ok(())
    } else {
        Err(Error::Build {
            reason: format!("{} exited with {status}", script.display()),
        })
    }
}

/// `tests/env` of this crate's source tree.
fn env_dir() -> &'static Path {
    static DIR: OnceLock<PathBuf> = OnceLock::new();
    DIR.get_or_init(|| Path::new(env!("CARGO_MANIFEST_DIR")).join("env"))
}

/// Builds one on-demand family with `build-binaries.sh <family>` when `missing` names a
/// program, at most once per process (`once` keeps the outcome), and checks it is there after.
fn ensure_family(
    once: &OnceLock<Result<(), String>>,
    family: &str,
    missing: impl Fn() -> Vec<String>,
) -> Result<()> {
    once.get_or_init(|| {
        let before = missing();
        if before.is_empty() {
            return Ok(());
        }
        run_build_script(&[family.to_owned()], &before).map_err(|e| e.to_string())?;
        match missing().first() {
            None => Ok(()),
            Some(still) => Err(format!(
                "{still} is still missing after tests/env/build-binaries.sh {family}"
            )),
        }
    })
    .clone()
    .map_err(|reason| Error::Build { reason })
}
