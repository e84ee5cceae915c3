//! The per-process shared test environments, each started on first use on a dedicated thread
//! with its own tokio runtime: [`shared`] (a control plane and the pod runner) and
//! [`shared_node`] (a control plane and a real node).
//!
//! Both load the images the crate under test declares (`$CARGO_MANIFEST_DIR/test-images.yaml`,
//! [`crate::images::declared`]), so a plugin's tests find their app's images on the node the way
//! envtest users find their CRDs installed; [`TestEnv::provide_images`] loads more on demand.
//!
//! Why a thread of its own: every `#[tokio::test]` has a runtime that dies with the test, and
//! anything shared (watchers, container supervisors, the processes' parent thread for
//! `PR_SET_PDEATHSIG`) must outlive all tests. Tests talk to it only through the API server,
//! files, and [`TestEnv`]'s methods (to the pod runner through the runtime-agnostic
//! [`PodRunnerHandle`]).

use std::path::{Path, PathBuf};
use std::sync::OnceLock;
use std::sync::atomic::{AtomicU32, Ordering};
use std::time::{Duration, Instant};

use k8s_openapi::api::core::v1::{
    Namespace, PersistentVolume, PersistentVolumeClaim, Pod, ServiceAccount,
};
use kube::Api;
use kube::api::{ObjectMeta, Patch, PatchParams, PostParams};

use crate::control_plane::{client_from, kube_config_from, random_hex};
use crate::images::declared::{self, Declarations};
use crate::images::{ImageSpec, MadeImage};
use crate::node::{Node, NodeNetwork};
use crate::{
    Binaries, ControlPlane, ControlPlaneOptions, Error, PodRunner, PodRunnerHandle, Result,
};

/// The shared environment of a test process: a control plane and what runs its Pods, a real
/// node ([`shared_node`]) or the pod runner ([`shared`]). Tests that kill, fail or read Pods go
/// through its methods, which do it the way the node at hand can.
#[derive(Debug)]
pub struct TestEnv {
    binaries: Binaries,
    kubeconfig: PathBuf,
    server: String,
    dir: PathBuf,
    logs: Vec<(String, PathBuf)>,
    pods: Pods,
    setup_time: Duration,
    /// The declared images made and loaded at start (the crate under test's).
    images: Vec<MadeImage>,
    /// Images loaded so far, by archive (node) or name (runner): each goes in once.
    loaded: std::sync::Mutex<std::collections::BTreeSet<String>>,
}

/// A test's own namespace (dereferences to its name), deleted with everything in it when
/// dropped. Why: suites share one control plane and node per test process, and a finished
/// test's app Pods would otherwise keep running (taking CPU and the node's Pod slots)
/// until the process ends. A test that panicked keeps its namespace for a look afterwards.
#[derive(Debug)]
pub struct TestNamespace {
    name: String,
    kubectl: PathBuf,
    kubeconfig: PathBuf,
}

impl TestNamespace {
    /// The namespace's name.
    pub fn name(&self) -> &str {
        &self.name
    }
}

impl std::ops::Deref for TestNamespace {
    type Target = str;
    fn deref(&self) -> &str {
        &self.name
    }
}

impl std::fmt::Display for TestNamespace {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(&self.name)
    }
}

impl Drop for TestNamespace {
    fn drop(&mut self) {
        if std::thread::panicking() {
            eprintln!(
                "policy-host-testenv: kept namespace {} of a failed test",
                self.name
            );
            return;
        }
        // Not waited for: the namespace controller deletes its objects in the background.
        // kubectl, not a kube client: a drop cannot await, and it may run on any runtime.
        let deleted = std::process::Command::new(&self.kubectl)
            .arg("--kubeconfig")
            .arg(&self.kubeconfig)
            .args([
                "delete",
                "namespace",
                &self.name,
                "--wait=false",
                "--ignore-not-found",
            ])
            .stdout(std::process::Stdio::null())
            .stderr(std::process::Stdio::null())
            .status();
        if !matches!(deleted, Ok(status) if status.success()) {
            eprintln!(
                "policy-host-testenv: could not delete namespace {} ({deleted:?})",
                self.name
            );
        }
    }
}

/// What runs the Pods of a [`TestEnv`].
#[derive(Debug)]
enum Pods {
    Runner(PodRunnerHandle),
    Node {
        images_dir: PathBuf,
        containerd_socket: PathBuf,
        pod_logs: PathBuf,
    },
}

static SHARED: OnceLock<Result<TestEnv, String>> = OnceLock::new();

/// The shared environment, started on first call (binaries ensured — built if missing —,
/// control plane and pod runner started; about 10 s with cached binaries). Later calls, from any
/// test and runtime, return the same environment, or the same startup error.
pub async fn shared() -> Result<&'static TestEnv> {
    if let Some(ready) = SHARED.get() {
        return ready.as_ref().map_err(|e| Error::Shared(e.clone()));
    }
    tokio::task::spawn_blocking(shared_blocking)
        .await
        .map_err(|e| Error::Shared(format!("the startup task panicked: {e}")))?
}

/// [`shared`] for code outside a runtime; blocks until the environment is up.
pub fn shared_blocking() -> Result<&'static TestEnv> {
    SHARED
        .get_or_init(start)
        .as_ref()
        .map_err(|e| Error::Shared(e.clone()))
}

fn start() -> Result<TestEnv, String> {
    let (sender, receiver) = std::sync::mpsc::channel();
    let spawned = std::thread::Builder::new()
        .name("policy-host-testenv".into())
        .spawn(move || {
            let runtime = match tokio::runtime::Builder::new_current_thread()
                .enable_all()
                .build()
            {
                Ok(runtime) => runtime,
                Err(e) => {
                    let _ = sender.send(Err(format!("building its tokio runtime: {e}")));
                    return;
                }
            };
            runtime.block_on(async move {
                let started = Instant::now();
                let started_env = match start_on_this_thread().await {
                    Ok((plane, runner, binaries)) => {
                        let mut env = TestEnv {
                            binaries,
                            kubeconfig: plane.kubeconfig_path().to_owned(),
                            server: plane.server_url().to_owned(),
                            dir: plane.dir().to_owned(),
                            logs: plane.log_paths(),
                            pods: Pods::Runner(runner.handle()),
                            setup_time: started.elapsed(),
                            images: Vec::new(),
                            loaded: Default::default(),
                        };
                        env.load_declared_images_of_crate_under_test()
                            .map(|()| (env, plane, runner))
                    }
                    Err(e) => Err(e),
                };
                match started_env {
                    Ok((mut env, plane, runner)) => {
                        env.setup_time = started.elapsed();
                        eprintln!(
                            "policy-host-testenv: control plane {} and pod runner up in {:.1} s (files in {})",
                            env.server,
                            env.setup_time.as_secs_f64(),
                            env.dir.display()
                        );
                        let _ = sender.send(Ok(env));
                        // Lives as long as the process; the kernel ends the children with it.
                        let _keep = (plane, runner);
                        std::future::pending::<()>().await;
                    }
                    Err(e) => {
                        let _ = sender.send(Err(e.to_string()));
                    }
                }
            });
        });
    if let Err(e) = spawned {
        return Err(format!("could not spawn its thread: {e}"));
    }
    receiver
        .recv()
        .map_err(|_| "its thread ended before reporting".to_owned())?
}

async fn start_on_this_thread() -> Result<(ControlPlane, PodRunner, Binaries)> {
    // Blocking, but this thread has nothing else to do yet.
    let binaries = Binaries::ensure()?;
    let plane = ControlPlane::start(&binaries, ControlPlaneOptions::default()).await?;
    let runner = plane.run_pods(binaries.clone()).await?;
    Ok((plane, runner, binaries))
}

/// Creates a namespace named `<prefix>-<unique suffix>` and waits until its `default`
/// ServiceAccount exists. Returns the name.
async fn create_namespace(client: kube::Client, prefix: &str) -> Result<String> {
    static COUNTER: AtomicU32 = AtomicU32::new(0);
    let clean: String = prefix
        .to_ascii_lowercase()
        .chars()
        .map(|c| if c.is_ascii_alphanumeric() { c } else { '-' })
        .take(40)
        .collect();
    let name = format!(
        "{}-{}{}",
        clean.trim_matches('-'),
        COUNTER.fetch_add(1, Ordering::Relaxed),
        random_hex(3)?
    );
    let namespaces: Api<Namespace> = Api::all(client.clone());
    let namespace = Namespace {
        metadata: ObjectMeta {
            name: Some(name.clone()),
            ..ObjectMeta::default()
        },
        ..Namespace::default()
    };
    namespaces
        .create(&PostParams::default(), &namespace)
        .await
        .map_err(Error::kube(format!("creating namespace {name}")))?;
    let accounts: Api<ServiceAccount> = Api::namespaced(client, &name);
    crate::wait_for(
        &format!(
            "the default ServiceAccount of namespace {name} (created by kube-controller-manager)"
        ),
        Duration::from_secs(60),
        || async { accounts.get_opt("default").await.ok().flatten() },
    )
    .await?;
    Ok(name)
}

/// The shared real-node environment: the control plane (with kube-scheduler, serving on
/// [`crate::node::NODE_IP`]) and one node (containerd, kubelet, CNI bridge, CoreDNS,
/// kube-proxy) with the pod sandbox and the crate under test's declared images imported.
static SHARED_NODE: OnceLock<Result<TestEnv, String>> = OnceLock::new();

/// The shared real-node environment, started on first call (binaries ensured, node family
/// included; bridge, control plane, node started and the declared images loaded: about 15 s
/// with everything cached). Later calls return the same environment, or the same startup error. Torn down when
/// the test process ends (a watchdog process does it: statics are never dropped).
pub async fn shared_node() -> Result<&'static TestEnv> {
    if let Some(ready) = SHARED_NODE.get() {
        return ready.as_ref().map_err(|e| Error::Shared(e.clone()));
    }
    tokio::task::spawn_blocking(|| {
        SHARED_NODE
            .get_or_init(start_node_env)
            .as_ref()
            .map_err(|e| Error::Shared(e.clone()))
    })
    .await
    .map_err(|e| Error::Shared(format!("the startup task panicked: {e}")))?
}

/// The environment variable naming a running real-node environment's attach file
/// ([`TestEnv::attach_file`]): with it, [`shared_node`] uses that environment instead of starting
/// one, as envtest's `USE_EXISTING_CLUSTER` does. One node runs per machine, so this is how a
/// test process (a plugin's own end-to-end test, say) runs beside another's node.
pub const ATTACH_VAR: &str = "POLICY_HOST_TESTENV_ATTACH";

/// What another process needs to use a running real-node environment.
#[derive(serde::Serialize, serde::Deserialize)]
#[serde(rename_all = "camelCase")]
struct Attachment {
    kubeconfig: PathBuf,
    server: String,
    dir: PathBuf,
    logs: Vec<(String, PathBuf)>,
    images_dir: PathBuf,
    containerd_socket: PathBuf,
    pod_logs: PathBuf,
}

/// The environment `path` describes ([`ATTACH_VAR`]), with the declared images of the crate
/// under test loaded into its node.
fn attach(path: &Path) -> Result<TestEnv> {
    let started = Instant::now();
    let text = std::fs::read_to_string(path).map_err(Error::io(format!(
        "reading {} (from {ATTACH_VAR}); unset it to start an environment of this process's own",
        path.display()
    )))?;
    let attachment: Attachment = serde_json::from_str(&text).map_err(|e| {
        Error::Shared(format!(
            "{} (from {ATTACH_VAR}) is not an attach file: {e}",
            path.display()
        ))
    })?;
    let mut env = TestEnv {
        binaries: Binaries::ensure()?,
        kubeconfig: attachment.kubeconfig,
        server: attachment.server,
        dir: attachment.dir,
        logs: attachment.logs,
        pods: Pods::Node {
            images_dir: attachment.images_dir,
            containerd_socket: attachment.containerd_socket,
            pod_logs: attachment.pod_logs,
        },
        setup_time: Duration::ZERO,
        images: Vec::new(),
        loaded: Default::default(),
    };
    env.load_declared_images_of_crate_under_test()?;
    env.setup_time = started.elapsed();
    eprintln!(
        "policy-host-testenv: attached to control plane {} and its real node ({})",
        env.server,
        path.display()
    );
    Ok(env)
}

fn start_node_env() -> Result<TestEnv, String> {
    if let Some(path) = std::env::var_os(ATTACH_VAR) {
        return attach(Path::new(&path)).map_err(|e| e.to_string());
    }
    let (sender, receiver) = std::sync::mpsc::channel();
    let spawned = std::thread::Builder::new()
        .name("policy-host-testenv-node".into())
        .spawn(move || {
            let runtime = match tokio::runtime::Builder::new_current_thread()
                .enable_all()
                .build()
            {
                Ok(runtime) => runtime,
                Err(e) => {
                    let _ = sender.send(Err(format!("building its tokio runtime: {e}")));
                    return;
                }
            };
            runtime.block_on(async move {
                let started = Instant::now();
                let started_env = match start_node_on_this_thread().await {
                    Ok((network, plane, node, binaries, images_dir)) => {
                        let mut logs = plane.log_paths();
                        logs.extend(node.log_paths());
                        let mut env = TestEnv {
                            binaries,
                            kubeconfig: plane.kubeconfig_path().to_owned(),
                            server: plane.server_url().to_owned(),
                            dir: plane.dir().to_owned(),
                            logs,
                            pods: Pods::Node {
                                images_dir,
                                containerd_socket: node.containerd_socket().to_owned(),
                                pod_logs: node.pod_logs_dir(),
                            },
                            setup_time: started.elapsed(),
                            images: Vec::new(),
                            loaded: Default::default(),
                        };
                        env.load_declared_images_of_crate_under_test()
                            .map(|()| (env, network, plane, node))
                    }
                    Err(e) => Err(e),
                };
                match started_env {
                    Ok((mut env, network, plane, node)) => {
                        env.setup_time = started.elapsed();
                        eprintln!(
                            "policy-host-testenv: control plane {} and real node up in {:.1} s (files in {})",
                            env.server,
                            env.setup_time.as_secs_f64(),
                            env.dir.display()
                        );
                        let _ = sender.send(Ok(env));
                        // Lives as long as the process; the node's watchdog tears it down.
                        let _keep = (node, plane, network);
                        std::future::pending::<()>().await;
                    }
                    Err(e) => {
                        let _ = sender.send(Err(e.to_string()));
                    }
                }
            });
        });
    if let Err(e) = spawned {
        return Err(format!("could not spawn its thread: {e}"));
    }
    receiver
        .recv()
        .map_err(|_| "its thread ended before reporting".to_owned())?
}

async fn start_node_on_this_thread() -> Result<(NodeNetwork, ControlPlane, Node, Binaries, PathBuf)>
{
    // Blocking, but this thread has nothing else to do yet.
    let binaries = Binaries::ensure()?;
    binaries.ensure_node()?;
    let network = NodeNetwork::create(Duration::from_secs(600))?;
    let plane = ControlPlane::start(
        &binaries,
        ControlPlaneOptions {
            node_ip: Some(crate::node::NODE_IP),
            ..ControlPlaneOptions::default()
        },
    )
    .await?;
    let images_dir = binaries.cache_dir().join("images");
    let images = crate::node::base_images(&binaries, &images_dir)?;
    let node = Node::start(
        &plane,
        &network,
        &binaries,
        &images,
        &plane.dir().join("node"),
    )
    .await?;
    Ok((network, plane, node, binaries, images_dir))
}

impl TestEnv {
    /// Makes and loads the images of `$CARGO_MANIFEST_DIR/test-images.yaml`, when cargo runs
    /// a crate that has one. Called once, on the environment's own thread, before it is shared.
    fn load_declared_images_of_crate_under_test(&mut self) -> Result<()> {
        let Some(dir) = std::env::var_os("CARGO_MANIFEST_DIR") else {
            return Ok(());
        };
        let path = PathBuf::from(dir).join(declared::FILE_NAME);
        if !path.is_file() {
            return Ok(());
        }
        let started = Instant::now();
        let images = self.provide_images_blocking(&path)?;
        eprintln!(
            "policy-host-testenv: {} declared image(s) of {} made and loaded in {:.1} s: {}",
            images.len(),
            path.display(),
            started.elapsed().as_secs_f64(),
            images
                .iter()
                .map(MadeImage::name)
                .collect::<Vec<_>>()
                .join(", ")
        );
        self.images = images;
        Ok(())
    }

    /// Writes the file another test process attaches to this environment with ([`ATTACH_VAR`])
    /// and returns its path. A real node's only (the pod runner lives in this process). The
    /// other process must be done before this one ends: the environment ends with its owner.
    pub fn attach_file(&self) -> Result<PathBuf> {
        let Pods::Node {
            images_dir,
            containerd_socket,
            pod_logs,
        } = &self.pods
        else {
            return Err(Error::Shared(
                "only a real node's environment (shared_node) can be attached to".into(),
            ));
        };
        let attachment = Attachment {
            kubeconfig: self.kubeconfig.clone(),
            server: self.server.clone(),
            dir: self.dir.clone(),
            logs: self.logs.clone(),
            images_dir: images_dir.clone(),
            containerd_socket: containerd_socket.clone(),
            pod_logs: pod_logs.clone(),
        };
        let path = self.dir.join("attach.json");
        let text = serde_json::to_string_pretty(&attachment)
            .map_err(|e| Error::Shared(format!("cannot write the attach file: {e}")))?;
        std::fs::write(&path, text).map_err(Error::io(format!("writing {}", path.display())))?;
        Ok(path)
    }

    /// The declared images loaded when the environment started (the crate under test's
    /// `test-images.yaml`).
    pub fn images(&self) -> &[MadeImage] {
        &self.images
    }

    /// The image named `name` among [`TestEnv::images`].
    pub fn image(&self, name: &str) -> Option<&MadeImage> {
        self.images.iter().find(|image| image.name() == name)
    }

    /// Makes the images declared in `path` (a `test-images.yaml` and what it includes) and
    /// loads them into the node (or the pod runner), each once per process: what a test does
    /// for an image only it needs. Returns them, for their names and programs.
    pub async fn provide_images(&'static self, path: &Path) -> Result<Vec<MadeImage>> {
        let path = path.to_owned();
        tokio::task::spawn_blocking(move || self.provide_images_blocking(&path))
            .await
            .map_err(|e| Error::Shared(format!("making images panicked: {e}")))?
    }

    /// [`TestEnv::provide_images`] for code outside a runtime (blocking: a cold image builds
    /// its Go programs or fetches its Debian packages, minutes; a cached one, about a second).
    pub fn provide_images_blocking(&self, path: &Path) -> Result<Vec<MadeImage>> {
        let declarations = Declarations::read(path)?;
        let mut made = Vec::new();
        for declaration in &declarations.images {
            let image = declaration.make(&self.binaries)?;
            self.load_image(&image.spec)?;
            made.push(image);
        }
        Ok(made)
    }

    /// The kubeconfig (admin token, TLS verification off), for kubectl or other processes.
    pub fn kubeconfig_path(&self) -> &Path {
        &self.kubeconfig
    }

    /// The apiserver URL (`https://10.244.0.1:<port>` with a real node).
    pub fn server_url(&self) -> &str {
        &self.server
    }

    /// The binaries in use.
    pub fn binaries(&self) -> &Binaries {
        &self.binaries
    }

    /// The directory of the control plane's data and logs (the node's is `node/` in it, the pod
    /// runner's `runner/`).
    pub fn dir(&self) -> &Path {
        &self.dir
    }

    /// Log files of the control plane and the node's processes, by component name.
    pub fn logs(&self) -> &[(String, PathBuf)] {
        &self.logs
    }

    /// How long the first [`shared`] or [`shared_node`] call took to bring everything up.
    pub fn setup_time(&self) -> Duration {
        self.setup_time
    }

    /// The pod runner's own hooks (`pod_ip`, `log_path`, `cluster_command`), when Pods run on
    /// it; `None` on a real node.
    pub fn pod_runner(&self) -> Option<&PodRunnerHandle> {
        match &self.pods {
            Pods::Runner(runner) => Some(runner),
            Pods::Node { .. } => None,
        }
    }

    /// A kube-rs config for the admin user.
    pub async fn kube_config(&self) -> Result<kube::Config> {
        kube_config_from(&self.kubeconfig).await
    }

    /// A new admin client in the caller's runtime (create one per test).
    pub async fn client(&self) -> Result<kube::Client> {
        client_from(&self.kubeconfig).await
    }

    /// Creates a namespace named `<prefix>-<unique suffix>` and waits until its `default`
    /// ServiceAccount exists (Pod admission refuses Pods before that). The namespace is
    /// deleted when the returned guard drops (at the end of the test), unless the test panicked.
    pub async fn create_namespace(&self, prefix: &str) -> Result<TestNamespace> {
        let name = create_namespace(self.client().await?, prefix).await?;
        Ok(TestNamespace {
            name,
            kubectl: self.binaries.kubectl(),
            kubeconfig: self.kubeconfig.clone(),
        })
    }

    /// SIGKILLs every running container of the Pod, like a crash or the OOM killer: its
    /// restart policy then applies (`restartCount` goes up with `Always`). On a real node
    /// through containerd, after which the kubelet sees the exit.
    pub async fn kill_pod(&self, namespace: &str, name: &str) -> Result<()> {
        match &self.pods {
            Pods::Runner(runner) => runner.kill_pod(namespace, name).await,
            Pods::Node { .. } => {
                let pod = self.pod(namespace, name).await?;
                let running: Vec<String> = pod
                    .status
                    .and_then(|s| s.container_statuses)
                    .unwrap_or_default()
                    .into_iter()
                    .filter(|c| c.state.as_ref().is_some_and(|s| s.running.is_some()))
                    .filter_map(|c| c.container_id)
                    .collect();
                if running.is_empty() {
                    return Err(Error::UnknownPod {
                        namespace: namespace.to_owned(),
                        name: name.to_owned(),
                    });
                }
                running.iter().try_for_each(|id| self.kill_container(id))
            }
        }
    }

    /// Ends the Pod for good, with no restart: a member that stays dead until the Pod is
    /// deleted. On a real node the kubelet does it: the Pod's `activeDeadlineSeconds` is set to
    /// 1 (a field that may be set on a running Pod), so the kubelet kills its containers and
    /// marks it Failed (`DeadlineExceeded`), as it marks an evicted Pod. Returns once that Pod
    /// is Failed, or already gone: its owner may delete and replace a failed Pod (same name,
    /// another uid) before a poll sees it Failed.
    pub async fn fail_pod(&self, namespace: &str, name: &str) -> Result<()> {
        match &self.pods {
            Pods::Runner(runner) => runner.fail_pod(namespace, name).await,
            Pods::Node { .. } => {
                let pods: Api<Pod> = Api::namespaced(self.client().await?, namespace);
                let uid = self
                    .pod(namespace, name)
                    .await?
                    .metadata
                    .uid
                    .unwrap_or_default();
                // The uid makes the patch a precondition: this Pod, not a later one.
                pods.patch(
                    name,
                    &PatchParams::default(),
                    &Patch::Merge(serde_json::json!({
                        "metadata": {"uid": uid},
                        "spec": {"activeDeadlineSeconds": 1},
                    })),
                )
                .await
                .map_err(Error::kube(format!(
                    "setting activeDeadlineSeconds of pod {namespace}/{name}"
                )))?;
                crate::wait_for(
                    &format!("pod {namespace}/{name} to be Failed by the kubelet (or replaced)"),
                    Duration::from_secs(60),
                    || async {
                        let pod = match pods.get_opt(name).await {
                            Ok(Some(pod)) => pod,
                            Ok(None) => return Some(()),
                            Err(_) => return None,
                        };
                        if pod.metadata.uid.as_deref() != Some(uid.as_str()) {
                            return Some(());
                        }
                        let phase = pod.status.and_then(|s| s.phase);
                        (phase.as_deref() == Some("Failed")).then_some(())
                    },
                )
                .await
            }
        }
    }

    /// Every container log of a Pod (all restarts), each under a header: for printing when a
    /// test fails. Empty when there is none.
    pub async fn pod_logs(&self, namespace: &str, name: &str) -> String {
        match &self.pods {
            Pods::Runner(runner) => runner.pod_logs(namespace, name),
            Pods::Node { pod_logs, .. } => {
                // The kubelet's layout: <namespace>_<pod>_<uid>/<container>/<restart>.log.
                let prefix = format!("{namespace}_{name}_");
                let mut files = Vec::new();
                let dirs = std::fs::read_dir(pod_logs)
                    .map(|entries| entries.flatten().map(|e| e.path()).collect::<Vec<_>>())
                    .unwrap_or_default();
                for dir in dirs.iter().filter(|d| {
                    d.file_name()
                        .is_some_and(|n| n.to_string_lossy().starts_with(&prefix))
                }) {
                    for container in std::fs::read_dir(dir).into_iter().flatten().flatten() {
                        files.extend(
                            std::fs::read_dir(container.path())
                                .into_iter()
                                .flatten()
                                .flatten()
                                .map(|e| e.path()),
                        );
                    }
                }
                files.sort();
                let mut out = String::new();
                for file in files {
                    out.push_str(&format!("==> {} <==\n", file.display()));
                    out.push_str(&std::fs::read_to_string(&file).unwrap_or_default());
                }
                out
            }
        }
    }

    /// The directory holding a PersistentVolumeClaim's data: on a real node the hostPath of
    /// the volume the claim is bound to, on the pod runner its own directory.
    pub async fn claim_dir(&self, namespace: &str, claim: &str) -> Result<PathBuf> {
        match &self.pods {
            Pods::Runner(runner) => Ok(runner.claim_dir(namespace, claim)),
            Pods::Node { .. } => {
                let client = self.client().await?;
                let claims: Api<PersistentVolumeClaim> = Api::namespaced(client.clone(), namespace);
                let found = claims
                    .get(claim)
                    .await
                    .map_err(Error::kube(format!("reading claim {namespace}/{claim}")))?;
                let unbound = || Error::UnboundClaim {
                    namespace: namespace.to_owned(),
                    claim: claim.to_owned(),
                };
                let volume = found.spec.and_then(|s| s.volume_name).ok_or_else(unbound)?;
                let volumes: Api<PersistentVolume> = Api::all(client);
                volumes
                    .get(&volume)
                    .await
                    .map_err(Error::kube(format!("reading volume {volume}")))?
                    .spec
                    .and_then(|s| s.host_path)
                    .map(|h| PathBuf::from(h.path))
                    .ok_or_else(unbound)
            }
        }
    }

    /// Writes `image` as an archive (cached) and imports it into the node's containerd, so Pods
    /// naming it start without a registry; on the pod runner, loads it there
    /// ([`PodRunnerHandle::add_image`]). An archive already imported by this process is not
    /// imported again.
    pub fn load_image(&self, image: &ImageSpec) -> Result<()> {
        let mut loaded = self
            .loaded
            .lock()
            .map_err(|_| Error::Shared("the loaded-images lock was poisoned".into()))?;
        match &self.pods {
            Pods::Runner(runner) => {
                runner.add_image(image);
                loaded.insert(image.name.clone());
                Ok(())
            }
            Pods::Node {
                images_dir,
                containerd_socket,
                ..
            } => {
                let archive = image.write_archive(images_dir)?;
                let key = archive.display().to_string();
                if loaded.contains(&key) {
                    return Ok(());
                }
                crate::node::import_image(&self.binaries.ctr(), containerd_socket, &archive)?;
                loaded.insert(key);
                Ok(())
            }
        }
    }

    /// Kills a container on the real node with SIGKILL through its containerd (`ctr tasks
    /// kill`), the way a crash or the OOM killer ends it: the kubelet sees it exit and applies
    /// the pod's restart policy. `container_id` is a pod status's `containerID`
    /// (`containerd://<id>`, or the bare id).
    pub fn kill_container(&self, container_id: &str) -> Result<()> {
        let (_, containerd_socket) = self.node_parts()?;
        let id = container_id
            .strip_prefix("containerd://")
            .unwrap_or(container_id);
        crate::node::ctr(
            &self.binaries.ctr(),
            containerd_socket,
            &["tasks", "kill", "--signal", "SIGKILL", id],
        )
        .map(drop)
    }

    fn node_parts(&self) -> Result<(&Path, &Path)> {
        match &self.pods {
            Pods::Node {
                images_dir,
                containerd_socket,
                ..
            } => Ok((images_dir, containerd_socket)),
            Pods::Runner(_) => Err(Error::NotARealNode),
        }
    }

    async fn pod(&self, namespace: &str, name: &str) -> Result<Pod> {
        let pods: Api<Pod> = Api::namespaced(self.client().await?, namespace);
        pods.get(name)
            .await
            .map_err(Error::kube(format!("reading pod {namespace}/{name}")))
    }
}
