//! A real local Kubernetes control plane with a real node (or a local pod runner), for
//! end-to-end tests and the demo.
//!
//! There is no Docker and no registry on the machines policy-host is tested on, so this crate runs
//! everything as local processes:
//!
//! - [`binaries`] finds (or builds once, with `tests/env/build-binaries.sh`) kube-apiserver,
//!   kube-controller-manager and the control plane's own etcd of `tests/env/versions.env`, and
//!   builds the Go programs an image declares;
//! - [`control_plane`] starts etcd + kube-apiserver + kube-controller-manager on 127.0.0.1 with
//!   token auth and RBAC, and writes a kubeconfig;
//! - [`pod_runner`] is a test kubelet: it registers a Node, binds Pods to it and runs their
//!   containers as local processes, each Pod on its own loopback IP, with name resolution through
//!   one hosts file bind-mounted over `/etc/hosts` in a private mount namespace per Pod;
//! - [`node`] is a real node instead: containerd, runc, a kubelet, the CNI bridge, CoreDNS and
//!   kube-proxy beside a control plane serving on the bridge, running Pods from images that
//!   [`images`] makes: the ones a plugin declares in a `test-images.yaml` beside it (Debian
//!   packages, Go programs, files; [`images::declared`]) and the host's own from
//!   `deploy/Dockerfile`; [`install`] runs the README's install commands against it;
//! - [`shared_node`] starts a control plane and a real node once per test process, and
//!   [`shared`] a control plane and the pod runner, each on a dedicated thread with its own
//!   tokio runtime, so that every `#[tokio::test]` (each with a runtime of its own) can use it.
//!   Both give a [`TestEnv`], whose `kill_pod`, `fail_pod`, `pod_logs` and `claim_dir` do what
//!   a test needs the way the node at hand can. Both load the images the crate under test
//!   declares (`test-images.yaml` in its directory), and `provide_images` loads others.
//!
//! This crate names no app: what runs in the Pods is the caller's, declared next to it. The end-to-end suites run on the real node; the
//!   pod runner stays for the benches whose Pods no kubelet should run, and its own tests.
//!
//! ```no_run
//! # async fn example() -> Result<(), policy_host_testenv::Error> {
//! let env = policy_host_testenv::shared_node().await?;
//! let client = env.client().await?;
//! let ns = env.create_namespace("my-test").await?;
//! // ... create Pods in `ns` with `client`; the kubelet runs them in containerd ...
//! # let _ = (client, ns);
//! # Ok(()) }
//! ```
//!
//! Where the caller owns the lifetime (the demo), compose the parts on a long-lived runtime:
//!
//! ```no_run
//! # async fn example() -> Result<(), policy_host_testenv::Error> {
//! use policy_host_testenv::{Binaries, ControlPlane, ControlPlaneOptions};
//! let binaries = tokio::task::spawn_blocking(Binaries::ensure).await.expect("no panic")?;
//! let options = ControlPlaneOptions { dir: Some("/tmp/demo".into()), ..Default::default() };
//! let plane = ControlPlane::start(&binaries, options).await?;
//! let runner = plane.run_pods(binaries.clone()).await?;
//! println!("export KUBECONFIG={}", plane.kubeconfig_path().display());
//! // ... both stop (processes killed) when dropped ...
//! # drop((runner, plane));
//! # Ok(()) }
//! ```

pub mod binaries;
pub mod control_plane;
pub mod images;
pub mod install;
pub mod network;
pub mod node;
pub mod pod_runner;
mod process;
mod shared;

use std::path::PathBuf;

pub use binaries::Binaries;
pub use control_plane::{ControlPlane, ControlPlaneOptions};
pub use pod_runner::{PodRunner, PodRunnerHandle, PodRunnerOptions};
pub use shared::{ATTACH_VAR, TestEnv, TestNamespace, shared, shared_blocking, shared_node};

/// Everything that can go wrong while finding binaries, starting the control plane or running
/// Pods. Each message says what was wrong and what to do about it.
#[derive(Debug, thiserror::Error)]
pub enum Error {
    /// `tests/env/versions.env` could not be read or lacks a variable.
    #[error(
        "could not read versions from {path}: {reason}; it must define KUBERNETES_VERSION, CONTROL_PLANE_ETCD_VERSION and the node's versions"
    )]
    Versions {
        /// The versions file.
        path: PathBuf,
        /// What was wrong with it.
        reason: String,
    },
    /// The binaries were missing and `build-binaries.sh` failed to build them.
    #[error(
        "building the control-plane binaries failed ({reason}); read the build output above, fix the cause and rerun `tests/env/build-binaries.sh`"
    )]
    Build {
        /// Why the build failed.
        reason: String,
    },
    /// A binary that should exist after the build does not.
    #[error(
        "{binary} not found at {path}; run `tests/env/build-binaries.sh` or point KUBEBUILDER_ASSETS at a directory holding it"
    )]
    MissingBinary {
        /// Which binary.
        binary: String,
        /// Where it was expected.
        path: PathBuf,
    },
    /// A local file or process operation failed.
    #[error("{what}: {source}")]
    Io {
        /// What was being done.
        what: String,
        /// The underlying error.
        #[source]
        source: std::io::Error,
    },
    /// A control-plane process exited or did not become ready in time.
    #[error("{component} {problem}; its log is {log}")]
    ComponentFailed {
        /// kube-apiserver, etcd, kube-controller-manager.
        component: String,
        /// What happened.
        problem: String,
        /// Log file of the process, to read for the cause.
        log: PathBuf,
    },
    /// A Kubernetes API call failed.
    #[error("{what}: {source}")]
    Kube {
        /// What was being done.
        what: String,
        /// The underlying error.
        #[source]
        source: kube::Error,
    },
    /// The kubeconfig written by the control plane could not be turned into a client config.
    #[error("could not load kubeconfig {path}: {reason}; delete it and restart the control plane")]
    Kubeconfig {
        /// The kubeconfig file.
        path: PathBuf,
        /// What was wrong.
        reason: String,
    },
    /// A condition waited on did not become true in time.
    #[error("timed out after {seconds} s waiting for {what}")]
    Timeout {
        /// What was waited on.
        what: String,
        /// How long it waited.
        seconds: u64,
    },
    /// The Pod asked for has no running container on this node.
    #[error(
        "pod {namespace}/{name} has no running container here; wait until it is bound and started first"
    )]
    UnknownPod {
        /// Namespace of the Pod.
        namespace: String,
        /// Name of the Pod.
        name: String,
    },
    /// A claim a test asked for has no volume yet.
    #[error(
        "claim {namespace}/{claim} is not bound to a hostPath volume yet; wait until its phase is Bound"
    )]
    UnboundClaim {
        /// Namespace of the claim.
        namespace: String,
        /// Name of the claim.
        claim: String,
    },
    /// A real-node operation was asked of the pod runner's environment.
    #[error(
        "this test environment runs Pods on the pod runner, not a real node; use shared_node() for images and containerd"
    )]
    NotARealNode,
    /// A local container image could not be made.
    #[error("image {image} could not be made: {problem}")]
    Image {
        /// The image reference.
        image: String,
        /// What was wrong and what to do.
        problem: String,
    },
    /// A command the real node needs (ip, nft, ctr, ...) failed.
    #[error("{what} failed: {output}")]
    Command {
        /// The command line.
        what: String,
        /// Its standard error (or status).
        output: String,
    },
    /// The per-process shared environment failed to start earlier in this process.
    #[error("the shared test environment failed to start: {0}")]
    Shared(String),
}

/// Results of this crate.
pub type Result<T, E = Error> = std::result::Result<T, E>;

impl Error {
    pub(crate) fn io(what: impl Into<String>) -> impl FnOnce(std::io::Error) -> Error {
        let what = what.into();
        move |source| Error::Io { what, source }
    }

    pub(crate) fn kube(what: impl Into<String>) -> impl FnOnce(kube::Error) -> Error {
        let what = what.into();
        move |source| Error::Kube { what, source }
    }
}

/// Installs the ring crypto provider for rustls (reqwest is built without one); idempotent.
pub(crate) fn install_crypto_provider() {
    // Err only means another provider is already installed, which serves as well.
    let _ = rustls::crypto::ring::default_provider().install_default();
}

/// Polls `check` every 200 ms until it returns `Some`, for at most `timeout`: the way to wait on a
/// condition in a test (never a bare sleep). `what` names the condition in the timeout error.
pub async fn wait_for<T, F, Fut>(
    what: &str,
    timeout: std::time::Duration,
    mut check: F,
) -> Result<T>
where
    F: FnMut() -> Fut,
    Fut: std::future::Future<Output = Option<T>>,
{
    let deadline = tokio::time::Instant::now() + timeout;
    loop {
        if let Some(value) = check().await {
            return Ok(value);
        }
        if tokio::time::Instant::now() >= deadline {
            return Err(Error::Timeout {
                what: what.to_owned(),
                seconds: timeout.as_secs(),
            });
        }
        tokio::time::sleep(std::time::Duration::from_millis(200)).await;
    }
}

/// The CRD of the misbehaving test plugin's `Probe` kind: free-form spec and status, with the
/// status subresource (shared by the host's and the end-to-end tests).
pub fn probe_crd() -> serde_json::Result<
    k8s_openapi::apiextensions_apiserver::pkg::apis::apiextensions::v1::CustomResourceDefinition,
> {
    serde_json::from_value(serde_json::json!({
        "apiVersion": "apiextensions.k8s.io/v1",
        "kind": "CustomResourceDefinition",
        "metadata": { "name": "probes.test.policy-host.io" },
        "spec": {
            "group": "test.policy-host.io",
            "names": { "kind": "Probe", "plural": "probes", "singular": "probe", "listKind": "ProbeList" },
            "scope": "Namespaced",
            "versions": [{
                "name": "v1", "served": true, "storage": true,
                "subresources": { "status": {} },
                "schema": { "openAPIV3Schema": {
                    "type": "object",
                    "properties": {
                        "spec": { "type": "object", "x-kubernetes-preserve-unknown-fields": true },
                        "status": { "type": "object", "x-kubernetes-preserve-unknown-fields": true }
                    }
                }}
            }]
        }
    }))
}
