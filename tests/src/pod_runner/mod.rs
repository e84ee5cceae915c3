//! The test kubelet: registers a Node, binds Pods to it (there is no kube-scheduler) and runs
//! their containers as local processes.
//!
//! Each Pod gets its own loopback IP (`127.<b>.x.y`; Linux answers every 127/8 address without
//! configuration) and a private mount namespace in which one runner-wide hosts file is
//! bind-mounted over `/etc/hosts`, so Pods reach each other by
//! `<hostname>.<subdomain>.<ns>.svc[.cluster.local]` and by `<service>.<ns>.svc[.cluster.local]`.
//! Volumes are directories bind-mounted at their mount paths in that namespace (the machine's
//! mount table is untouched; missing mount points are created as empty directories).
//!
//! Images map to programs: an image loaded into the runner ([`PodRunnerHandle::add_image`], as
//! [`crate::TestEnv`] does with the declared images) runs its own programs from where they are
//! on this machine (PATH starts with their directories, `command[0]` is resolved there by
//! basename, its entrypoint, cmd and environment apply); every other image runs its `command`
//! with the machine's programs.
//!
//! All Pods share the machine's network namespace, so what is pod-local in Kubernetes is the Pod
//! IP here: `0.0.0.0`, `127.0.0.1` and `localhost` URL hosts in commands, args, env values and
//! exec probes become the Pod IP (and a list naming it twice keeps it once); probes aimed at a
//! loopback host probe the Pod IP. A client whose *built-in* default is 127.0.0.1 is not
//! rewritten (there is nothing to rewrite): name the address in its command line.
//!
//! Limits, by design: no resource limits, no image pulls, no network isolation, no service
//! account tokens (the token volume is an empty directory), probes' timeouts at least 2 s.

mod hosts;
mod probe;
mod spec;
mod volumes;
mod worker;

use std::collections::{BTreeMap, BTreeSet};
use std::net::Ipv4Addr;
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::sync::atomic::{AtomicU32, Ordering};

use futures::StreamExt as _;
use k8s_openapi::api::core::v1::{
    Binding, Node, ObjectReference, PersistentVolumeClaim, Pod, Service,
};
use kube::api::{ObjectMeta, Patch, PatchParams, PostParams};
use kube::runtime::watcher;
use kube::{Api, ResourceExt as _};
use nix::sys::signal::Signal;
use tokio::sync::{Mutex, mpsc, oneshot, watch};

use crate::process::signal_group;
use crate::{Binaries, Error, Result};
use hosts::{HostsFile, ServiceNames};
use worker::PodCommand;

/// How to run a [`PodRunner`].
#[derive(Debug, Clone)]
pub struct PodRunnerOptions {
    /// Directory for Pod volumes, claims, logs and the hosts file. `None`: a temporary directory
    /// removed when the runner is dropped.
    pub dir: Option<PathBuf>,
    /// Name of the Node the runner registers and binds Pods to.
    pub node_name: String,
}

impl Default for PodRunnerOptions {
    fn default() -> Self {
        PodRunnerOptions {
            dir: None,
            node_name: "testenv-node".into(),
        }
    }
}

/// A Pod the runner runs.
#[derive(Debug)]
struct PodEntry {
    namespace: String,
    name: String,
    ip: Ipv4Addr,
    commands: mpsc::UnboundedSender<PodCommand>,
    latest: watch::Sender<Pod>,
}

/// State shared by the runner's tasks and handles.
struct Runner {
    client: kube::Client,
    binaries: Binaries,
    /// Images loaded into the runner, by name. A std lock: never held across an await.
    images: std::sync::RwLock<BTreeMap<String, Arc<spec::LoadedImage>>>,
    node_name: String,
    dir: PathBuf,
    hosts_path: PathBuf,
    hosts: Mutex<HostsFile>,
    /// By Pod uid.
    pods: Mutex<BTreeMap<String, PodEntry>>,
    /// Process groups of running containers, killed when the runner is dropped. A std mutex:
    /// held only for an insert or a remove, never across an await, and needed from `Drop`.
    groups: std::sync::Mutex<BTreeSet<u32>>,
    /// Tasks to abort when the runner is dropped.
    tasks: std::sync::Mutex<Vec<tokio::task::AbortHandle>>,
    next_ip: AtomicU32,
    ip_prefix: u8,
    http: reqwest::Client,
}

impl std::fmt::Debug for Runner {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Runner")
            .field("node_name", &self.node_name)
            .field("dir", &self.dir)
            .finish_non_exhaustive()
    }
}

impl Runner {
    /// The images loaded so far (a copy: the lock is not held while a container starts).
    fn loaded_images(&self) -> BTreeMap<String, Arc<spec::LoadedImage>> {
        self.images.read().map(|i| i.clone()).unwrap_or_default()
    }

    fn track_group(&self, pid: u32, running: bool) {
        if let Ok(mut groups) = self.groups.lock() {
            if running {
                groups.insert(pid);
            } else {
                groups.remove(&pid);
            }
        }
    }

    fn track_task(&self, task: tokio::task::AbortHandle) {
        if let Ok(mut tasks) = self.tasks.lock() {
            tasks.retain(|t| !t.is_finished());
            tasks.push(task);
        }
    }

    fn log_path(&self, namespace: &str, pod: &str, container: &str) -> PathBuf {
        self.dir
            .join("logs")
            .join(namespace)
            .join(pod)
            .join(format!("{container}.log"))
    }

    fn allocate_ip(&self) -> Ipv4Addr {
        let n = self.next_ip.fetch_add(1, Ordering::Relaxed);
        let third = u8::try_from((n / 250) % 256).unwrap_or(0);
        let fourth = u8::try_from(n % 250 + 2).unwrap_or(2);
        Ipv4Addr::new(127, self.ip_prefix, third, fourth)
    }
}

/// A running pod runner. Dropping it stops its tasks and kills every container it started.
#[derive(Debug)]
pub struct PodRunner {
    handle: PodRunnerHandle,
    _temp: Option<tempfile::TempDir>,
}

/// A cheap, cloneable handle on a pod runner: where its files are, and test hooks. Usable from
/// any tokio runtime.
#[derive(Debug, Clone)]
pub struct PodRunnerHandle {
    runner: Arc<Runner>,
}

impl PodRunner {
    /// Registers the Node and starts binding and running Pods, on the current tokio runtime
    /// (which must outlive the runner, and whose threads must too: containers get SIGKILL when
    /// the thread that spawned them ends).
    pub async fn start(
        client: kube::Client,
        binaries: Binaries,
        options: PodRunnerOptions,
    ) -> Result<PodRunner> {
        crate::install_crypto_provider();
        let (dir, temp) = match options.dir {
            Some(dir) => (dir, None),
            None => {
                let temp = tempfile::Builder::new()
                    .prefix(&format!(
                        "policy-host-testenv-{}-runner-",
                        std::process::id()
                    ))
                    .tempdir()
                    .map_err(Error::io(
                        "creating a temporary directory for the pod runner",
                    ))?;
                (temp.path().to_owned(), Some(temp))
            }
        };
        std::fs::create_dir_all(&dir).map_err(Error::io(format!("creating {}", dir.display())))?;
        let hosts_path = dir.join("hosts");
        let hosts = HostsFile::create(hosts_path.clone())
            .map_err(Error::io(format!("writing {}", hosts_path.display())))?;
        let http = reqwest::Client::builder()
            .tls_danger_accept_invalid_certs(true)
            .no_proxy()
            .build()
            .map_err(|e| Error::Io {
                what: "building the probe HTTP client".into(),
                source: std::io::Error::other(e.to_string()),
            })?;
        // One second octet per process, so runners of test binaries running at once differ.
        let ip_prefix = u8::try_from(10 + std::process::id() % 200).unwrap_or(10);
        let runner = Arc::new(Runner {
            client,
            binaries,
            images: std::sync::RwLock::new(BTreeMap::new()),
            node_name: options.node_name,
            dir,
            hosts_path,
            hosts: Mutex::new(hosts),
            pods: Mutex::new(BTreeMap::new()),
            groups: std::sync::Mutex::new(BTreeSet::new()),
            tasks: std::sync::Mutex::new(Vec::new()),
            next_ip: AtomicU32::new(0),
            ip_prefix,
            http,
        });
        register_node(&runner).await?;
        for task in [
            tokio::spawn(watch_pods(runner.clone())),
            tokio::spawn(watch_claims(runner.clone())),
            tokio::spawn(watch_services(runner.clone())),
        ] {
            runner.track_task(task.abort_handle());
        }
        Ok(PodRunner {
            handle: PodRunnerHandle { runner },
            _temp: temp,
        })
    }

    /// A handle for test hooks and paths.
    pub fn handle(&self) -> PodRunnerHandle {
        self.handle.clone()
    }
}

impl Drop for PodRunner {
    fn drop(&mut self) {
        if let Ok(tasks) = self.handle.runner.tasks.lock() {
            for task in tasks.iter() {
                task.abort();
            }
        }
        if let Ok(groups) = self.handle.runner.groups.lock() {
            for pid in groups.iter() {
                signal_group(*pid, Signal::SIGKILL);
            }
        }
    }
}

impl PodRunnerHandle {
    /// Loads `image` into the runner: containers naming it (exactly) then run its programs
    /// from where they are on this machine, with its entrypoint, cmd and environment. Loading
    /// the same name again replaces it.
    pub fn add_image(&self, image: &crate::images::ImageSpec) {
        if let Ok(mut images) = self.runner.images.write() {
            images.insert(image.name.clone(), Arc::new(spec::LoadedImage::of(image)));
        }
    }

    /// Name of the Node Pods are bound to.
    pub fn node_name(&self) -> &str {
        &self.runner.node_name
    }

    /// The runner's directory (`logs/`, `pods/`, `pvc/`, `hosts`).
    pub fn dir(&self) -> &Path {
        &self.runner.dir
    }

    /// The hosts file every Pod sees as `/etc/hosts`.
    pub fn hosts_file(&self) -> &Path {
        &self.runner.hosts_path
    }

    /// A command that runs `program` on the machine but resolves names like a Pod does (the
    /// runner's hosts file over `/etc/hosts`, in a private mount namespace): for example
    /// a client checking every member of a cluster whose members advertise DNS names. Add
    /// arguments with `.arg(...)`; the command dies with the thread that spawns it.
    pub fn cluster_command(&self, program: impl AsRef<std::ffi::OsStr>) -> tokio::process::Command {
        let script = format!(
            "mount --bind {} /etc/hosts && exec \"$@\"",
            spec::shell_quote(&self.runner.hosts_path.display().to_string())
        );
        let mut command = tokio::process::Command::new("setpriv");
        command
            .args(["--pdeathsig", "KILL", "--"])
            .args(["unshare", "--mount", "--propagation", "private", "--"])
            .args(["sh", "-c", &script, "sh"])
            .arg(program)
            .kill_on_drop(true);
        command
    }

    /// Log file of a container (stdout and stderr, appended across restarts).
    pub fn log_path(&self, namespace: &str, pod: &str, container: &str) -> PathBuf {
        self.runner.log_path(namespace, pod, container)
    }

    /// Every container log of a Pod, each under a header: for printing when a test fails.
    pub fn pod_logs(&self, namespace: &str, pod: &str) -> String {
        let dir = self.runner.dir.join("logs").join(namespace).join(pod);
        let mut out = String::new();
        let mut files: Vec<PathBuf> = std::fs::read_dir(&dir)
            .map(|entries| entries.flatten().map(|e| e.path()).collect())
            .unwrap_or_default();
        files.sort();
        for file in files {
            out.push_str(&format!("==> {} <==\n", file.display()));
            out.push_str(&std::fs::read_to_string(&file).unwrap_or_default());
        }
        out
    }

    /// Directory holding the data of a PersistentVolumeClaim (kept until the claim is deleted).
    pub fn claim_dir(&self, namespace: &str, claim: &str) -> PathBuf {
        volumes::claim_dir(&self.runner.dir, namespace, claim)
    }

    /// The IP the runner gave a Pod, if it runs it.
    pub async fn pod_ip(&self, namespace: &str, name: &str) -> Option<Ipv4Addr> {
        self.runner
            .pods
            .lock()
            .await
            .values()
            .find(|p| p.namespace == namespace && p.name == name)
            .map(|p| p.ip)
    }

    async fn command(
        &self,
        namespace: &str,
        name: &str,
        make: impl FnOnce(oneshot::Sender<()>) -> PodCommand,
    ) -> Result<()> {
        let unknown = || Error::UnknownPod {
            namespace: namespace.to_owned(),
            name: name.to_owned(),
        };
        let (reply, done) = oneshot::channel();
        {
            let pods = self.runner.pods.lock().await;
            let entry = pods
                .values()
                .find(|p| p.namespace == namespace && p.name == name)
                .ok_or_else(unknown)?;
            entry.commands.send(make(reply)).map_err(|_| unknown())?;
        }
        done.await.map_err(|_| unknown())
    }

    /// SIGKILLs every container of the Pod, like a crash: its restart policy then applies
    /// (`restartCount` goes up with `Always`).
    pub async fn kill_pod(&self, namespace: &str, name: &str) -> Result<()> {
        self.command(namespace, name, PodCommand::Kill).await
    }

    /// SIGKILLs every container of the Pod and marks it Failed, with no restart: a member that
    /// stays dead until the Pod is deleted.
    pub async fn fail_pod(&self, namespace: &str, name: &str) -> Result<()> {
        self.command(namespace, name, PodCommand::Fail).await
    }
}

async fn register_node(runner: &Runner) -> Result<()> {
    let nodes: Api<Node> = Api::all(runner.client.clone());
    let name = &runner.node_name;
    let node = Node {
        metadata: ObjectMeta {
            name: Some(name.clone()),
            labels: Some(BTreeMap::from([
                ("kubernetes.io/hostname".to_owned(), name.clone()),
                ("kubernetes.io/os".to_owned(), "linux".to_owned()),
            ])),
            ..ObjectMeta::default()
        },
        ..Node::default()
    };
    match nodes.create(&PostParams::default(), &node).await {
        Ok(_) => {}
        Err(kube::Error::Api(status)) if status.code == 409 => {}
        Err(e) => return Err(Error::kube(format!("registering node {name}"))(e)),
    }
    let capacity = serde_json::json!({"cpu": "64", "memory": "256Gi", "pods": "1000", "ephemeral-storage": "1Ti"});
    let now = worker::now();
    let status = serde_json::json!({"status": {
        "capacity": capacity,
        "allocatable": capacity,
        "addresses": [{"type": "InternalIP", "address": "127.0.0.1"}, {"type": "Hostname", "address": name}],
        "conditions": [{
            "type": "Ready", "status": "True", "reason": "KubeletReady",
            "message": "policy-host-testenv pod runner is ready",
            "lastHeartbeatTime": now, "lastTransitionTime": now,
        }],
        "nodeInfo": {
            "architecture": std::env::consts::ARCH, "bootID": "", "containerRuntimeVersion": "testenv://0.1",
            "kernelVersion": "", "kubeProxyVersion": "", "kubeletVersion": runner.binaries.kubernetes_version(),
            "machineID": "", "operatingSystem": "linux", "osImage": "policy-host-testenv", "systemUUID": "",
        },
    }});
    nodes
        .patch_status(name, &PatchParams::default(), &Patch::Merge(&status))
        .await
        .map_err(Error::kube(format!("reporting the status of node {name}")))?;
    Ok(())
}

/// Binds unscheduled Pods to this node and starts or updates a worker for each Pod bound here.
async fn watch_pods(runner: Arc<Runner>) {
    let pods: Api<Pod> = Api::all(runner.client.clone());
    let mut events = watcher(pods.clone(), watcher::Config::default()).boxed();
    while let Some(event) = events.next().await {
        match event {
            Ok(watcher::Event::Apply(pod) | watcher::Event::InitApply(pod)) => {
                on_pod(&runner, pod).await;
            }
            Ok(watcher::Event::Delete(pod)) => {
                let uid = pod.uid().unwrap_or_default();
                if let Some(entry) = runner.pods.lock().await.get(&uid) {
                    let _ = entry.commands.send(PodCommand::Gone);
                }
            }
            Ok(_) => {}
            Err(e) => {
                tracing::debug!("pod watch: {e}");
                tokio::time::sleep(std::time::Duration::from_millis(500)).await;
            }
        }
    }
}

async fn on_pod(runner: &Arc<Runner>, pod: Pod) {
    let namespace = pod.namespace().unwrap_or_default();
    let name = pod.name_any();
    let uid = pod.uid().unwrap_or_default();
    let node = pod.spec.as_ref().and_then(|s| s.node_name.clone());
    let Some(node) = node else {
        if pod.metadata.deletion_timestamp.is_none() {
            bind(runner, &namespace, &name, &uid).await;
        }
        return;
    };
    if node != runner.node_name {
        return;
    }
    let mut pods = runner.pods.lock().await;
    if let Some(entry) = pods.get(&uid) {
        entry.latest.send_replace(pod);
        return;
    }
    let phase = pod.status.as_ref().and_then(|s| s.phase.as_deref());
    if matches!(phase, Some("Succeeded" | "Failed")) {
        return;
    }
    let ip = runner.allocate_ip();
    let (latest_tx, latest_rx) = watch::channel(pod.clone());
    let (commands_tx, commands_rx) = mpsc::unbounded_channel();
    pods.insert(
        uid,
        PodEntry {
            namespace,
            name,
            ip,
            commands: commands_tx,
            latest: latest_tx,
        },
    );
    let task = tokio::spawn(worker::run_pod(
        runner.clone(),
        pod,
        ip,
        latest_rx,
        commands_rx,
    ));
    runner.track_task(task.abort_handle());
}

/// The scheduler's job, reduced to: every Pod goes to this node.
async fn bind(runner: &Runner, namespace: &str, name: &str, uid: &str) {
    let pods: Api<Pod> = Api::namespaced(runner.client.clone(), namespace);
    let binding = Binding {
        metadata: ObjectMeta {
            name: Some(name.to_owned()),
            namespace: Some(namespace.to_owned()),
            uid: Some(uid.to_owned()),
            ..ObjectMeta::default()
        },
        target: ObjectReference {
            api_version: Some("v1".into()),
            kind: Some("Node".into()),
            name: Some(runner.node_name.clone()),
            ..ObjectReference::default()
        },
    };
    if let Err(e) = pods
        .create_subresource::<Binding, serde_json::Value>(
            "binding",
            name,
            &PostParams::default(),
            &binding,
        )
        .await
    {
        // A conflict means it was bound meanwhile; the next event shows where.
        tracing::debug!("binding pod {namespace}/{name}: {e}");
    }
}

/// Removes a claim's directory when the claim is deleted.
async fn watch_claims(runner: Arc<Runner>) {
    let claims: Api<PersistentVolumeClaim> = Api::all(runner.client.clone());
    let mut events = watcher(claims, watcher::Config::default()).boxed();
    while let Some(event) = events.next().await {
        match event {
            Ok(watcher::Event::Delete(claim)) => {
                let dir = volumes::claim_dir(
                    &runner.dir,
                    &claim.namespace().unwrap_or_default(),
                    &claim.name_any(),
                );
                let _ = std::fs::remove_dir_all(dir);
            }
            Ok(_) => {}
            Err(e) => {
                tracing::debug!("claim watch: {e}");
                tokio::time::sleep(std::time::Duration::from_millis(500)).await;
            }
        }
    }
}

/// Keeps Service names in the hosts file.
async fn watch_services(runner: Arc<Runner>) {
    let services: Api<Service> = Api::all(runner.client.clone());
    let mut events = watcher(services, watcher::Config::default()).boxed();
    while let Some(event) = events.next().await {
        let (service, present) = match event {
            Ok(watcher::Event::Apply(s) | watcher::Event::InitApply(s)) => (s, true),
            Ok(watcher::Event::Delete(s)) => (s, false),
            Ok(_) => continue,
            Err(e) => {
                tracing::debug!("service watch: {e}");
                tokio::time::sleep(std::time::Duration::from_millis(500)).await;
                continue;
            }
        };
        let namespace = service.namespace().unwrap_or_default();
        let name = service.name_any();
        let selector = service
            .spec
            .as_ref()
            .and_then(|s| s.selector.clone())
            .unwrap_or_default();
        let entry = (present && !selector.is_empty()).then(|| ServiceNames {
            namespace: namespace.clone(),
            name: name.clone(),
            selector,
        });
        if let Err(e) = runner
            .hosts
            .lock()
            .await
            .set_service(&namespace, &name, entry)
        {
            tracing::warn!("could not update the hosts file: {e}");
        }
    }
}
