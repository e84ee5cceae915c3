//! Locating the kube-apiserver, kube-controller-manager, etcd and redis binaries, building (or
//! installing) them once per process with `tests/env/build-binaries.sh` when they are missing.
//! MinIO and `mc` (family `s3`) are built separately, only when a test asks for them
//! ([`Binaries::ensure_s3`]): most tests do not need them, and they take ~10 minutes cold.
//! The real node's programs (family `node`: kubelet, kube-proxy, kube-scheduler, containerd,
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
    etcd_versions: Vec<String>,
    redis_series: String,
    minio_version: String,
    mc_version: String,
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
/// The outcome of the one `s3` build attempt of this process.
static ENSURED_S3: OnceLock<Result<(), String>> = OnceLock::new();
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
        run_build_script(None, &binaries.missing())?;
        match binaries.missing().first() {
            None => Ok(binaries),
            Some(missing) => Err(Error::MissingBinary {
                binary: missing.clone(),
                path: binaries.cache_bin.clone(),
            }),
        }
    }

    /// Makes sure `minio` and `mc` are built, running `build-binaries.sh s3` when they are
    /// missing (at most once per process; cold, about 10 minutes on 2 cores). Blocking: from
    /// async code, call it through `tokio::task::spawn_blocking`.
    pub fn ensure_s3(&self) -> Result<()> {
        ensure_family(&ENSURED_S3, "s3", || self.s3_missing())
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

    /// Builds the fault campaign's client (`tests/env/campaign-writer`: an etcd writer that
    /// checks its history with porcupine) with `build-binaries.sh campaign` unless the build
    /// of its current source is cached (cold: well under a minute with the etcd modules
    /// downloaded), and returns its path. Blocking: from async code, call it through
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

    fn s3_missing(&self) -> Vec<String> {
        [self.minio(), self.mc_path()]
            .into_iter()
            .filter(|path| !path.is_file())
            .map(|path| path.display().to_string())
            .collect()
    }

    /// Path of the MinIO server of versions.env (built by [`Binaries::ensure_s3`]).
    pub fn minio(&self) -> PathBuf {
        self.cache_bin
            .join(format!("minio-{}", self.minio_version))
            .join("minio")
    }

    fn mc_path(&self) -> PathBuf {
        self.cache_bin
            .join(format!("mc-{}", self.mc_version))
            .join("mc")
    }

    /// Path of the MinIO client `mc` of versions.env, if built.
    pub fn mc(&self) -> Option<PathBuf> {
        Some(self.mc_path()).filter(|path| path.is_file())
    }

    /// The `mc` version of versions.env (a Go pseudo-version), for messages.
    pub fn mc_version(&self) -> &str {
        &self.mc_version
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
        let etcd_versions: Vec<String> = var("ETCD_VERSIONS")?
            .split_whitespace()
            .map(str::to_owned)
            .collect();
        if etcd_versions.is_empty() {
            return Err(Error::Versions {
                path,
                reason: "ETCD_VERSIONS is empty".into(),
            });
        }
        let redis_series = var("REDIS_SERIES")?;
        let minio_version = var("MINIO_VERSION")?;
        let mc_version = var("MC_VERSION")?;
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
            etcd_versions,
            redis_series,
            minio_version,
            mc_version,
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
        for version in &self.etcd_versions {
            let dir = self.cache_bin.join(format!("etcd-{version}"));
            for name in ["etcd", "etcdctl", "etcdutl"] {
                if !dir.join(name).is_file() {
                    missing.push(dir.join(name).display().to_string());
                }
            }
        }
        let redis = self.redis_series_dir();
        for name in ["redis-server", "redis-cli"] {
            if !redis.join(name).is_file() {
                missing.push(redis.join(name).display().to_string());
            }
        }
        missing
    }

    fn redis_series_dir(&self) -> PathBuf {
        self.cache_bin.join(format!("redis-{}", self.redis_series))
    }

    /// The full version of the installed redis-server (`7.0.15`), if installed.
    pub fn redis_version(&self) -> Option<String> {
        let text = std::fs::read_to_string(self.redis_series_dir().join("VERSION")).ok()?;
        Some(text.trim().to_owned()).filter(|v| !v.is_empty())
    }

    /// Directory holding `redis-server` and `redis-cli` for an image tag `version` of the
    /// installed series (`7.0.15`, `7.0.11` or `7.0`): the distribution picks the patch
    /// release, so any patch of the series runs the installed one.
    pub fn redis_dir(&self, version: &str) -> Option<PathBuf> {
        self.redis_version()?;
        let matches =
            version == self.redis_series || version.starts_with(&format!("{}.", self.redis_series));
        let dir = self.redis_series_dir();
        (matches && dir.join("redis-server").is_file()).then_some(dir)
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
    /// present, else the default version's.
    pub fn control_plane_etcd(&self) -> PathBuf {
        match &self.assets {
            Some(dir) if dir.join("etcd").is_file() => dir.join("etcd"),
            _ => self
                .cache_bin
                .join(format!("etcd-{}", self.default_etcd_version()))
                .join("etcd"),
        }
    }

    /// Directory holding `etcd`, `etcdctl` and `etcdutl` of `version` (`v3.6.16`; `3.6.16` is
    /// accepted too), if that version is listed in versions.env and built.
    pub fn etcd_dir(&self, version: &str) -> Option<PathBuf> {
        let version = format!("v{}", version.trim_start_matches('v'));
        if !self.etcd_versions.contains(&version) {
            return None;
        }
        let dir = self.cache_bin.join(format!("etcd-{version}"));
        dir.join("etcd").is_file().then_some(dir)
    }

    /// The etcd versions available, in the order of versions.env.
    pub fn etcd_versions(&self) -> &[String] {
        &self.etcd_versions
    }

    /// The first etcd version of versions.env: the control plane's own, and the one tests use
    /// unless they ask for another.
    pub fn default_etcd_version(&self) -> &str {
        // `locate` refuses an empty list.
        self.etcd_versions.first().map_or("v3.6.16", String::as_str)
    }
}

/// Runs `build-binaries.sh [family]` because `missing` are, with its progress on our stderr
/// (both streams, so `cargo test` shows a cold build making progress).
fn run_build_script(family: Option<&str>, missing: &[String]) -> Result<()> {
    let script = env_dir().join("build-binaries.sh");
    eprintln!(
        "policy-host-testenv: missing {}; running {} {} (progress below)",
        missing.join(", "),
        script.display(),
        family.unwrap_or_default()
    );
    let status = Command::new("bash")
        .arg(&script)
        .args(family)
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
        run_build_script(Some(family), &before).map_err(|e| e.to_string())?;
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
