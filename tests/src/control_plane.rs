//! A real Kubernetes control plane on 127.0.0.1: etcd, kube-apiserver and
//! kube-controller-manager as local processes, with token auth, RBAC and a kubeconfig.
//!
//! Choose [`crate::shared`] in tests (one control plane per test process, started on first use)
//! and [`ControlPlane::start`] where the caller owns the lifetime (the demo). Everything is torn
//! down when the [`ControlPlane`] is dropped, and the processes also die with the process that
//! started them.

use std::net::{Ipv4Addr, TcpListener};
use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

use crate::Binaries;
use crate::process::{OwnedProcess, guarded_command};
use crate::{Error, Result};

/// How to start a [`ControlPlane`].
#[derive(Debug, Clone)]
pub struct ControlPlaneOptions {
    /// Directory for data, certificates, kubeconfig and logs. `None`: a fresh temporary
    /// directory, removed on drop. A given directory is kept (useful for the demo, to read logs).
    pub dir: Option<PathBuf>,
    /// Whether to run kube-controller-manager. Without it there is no garbage collection, no
    /// namespace deletion and no `default` ServiceAccount (so no Pods); leave it on unless a test
    /// only needs the API.
    pub controller_manager: bool,
    /// How long to wait for `/readyz` before giving up.
    pub ready_timeout: Duration,
    /// For a real node: the address kube-apiserver binds and advertises instead of 127.0.0.1
    /// (the node's bridge address, [`crate::node::NODE_IP`]), so that in-cluster clients reach
    /// it through the `kubernetes` Service; kube-scheduler runs too, and kube-apiserver reaches
    /// kubelets at their InternalIP.
    pub node_ip: Option<Ipv4Addr>,
}

impl Default for ControlPlaneOptions {
    fn default() -> Self {
        ControlPlaneOptions {
            dir: None,
            controller_manager: true,
            ready_timeout: Duration::from_secs(120),
            node_ip: None,
        }
    }
}

/// Controllers left out of kube-controller-manager: they need a cloud, real nodes, a CSR CA or a
/// volume plugin. The pod runner binds PersistentVolumeClaims itself, so the PV binder must not
/// fight it. Everything else (garbage collector, namespace, serviceaccount, token, replicaset,
/// statefulset, endpoints, pvc-protection ...) runs.
const DISABLED_CONTROLLERS: &[&str] = &[
    "node-ipam-controller",
    "node-lifecycle-controller",
    "taint-eviction-controller",
    "device-taint-eviction-controller",
    "persistentvolume-binder-controller",
    "persistentvolume-attach-detach-controller",
    "persistentvolume-expander-controller",
    "certificatesigningrequest-signing-controller",
    "ephemeral-volume-controller",
    "resourceclaim-controller",
];

/// The disabled controllers a real node needs back: its kubelet heartbeats (node lifecycle),
/// and its claims are bound to provisioned volumes by Kubernetes itself (the pod runner binds
/// its own).
const REAL_NODE_CONTROLLERS: &[&str] = &[
    "node-lifecycle-controller",
    "persistentvolume-binder-controller",
];

/// A running control plane. Dropping it stops the processes and removes a temporary directory.
#[derive(Debug)]
pub struct ControlPlane {
    /// Dropped last: processes first, then the directory.
    processes: Vec<OwnedProcess>,
    dir: PathBuf,
    _temp: Option<tempfile::TempDir>,
    server: String,
    token: String,
    kubeconfig: PathBuf,
}

impl ControlPlane {
    /// Starts etcd, kube-apiserver and (unless disabled) kube-controller-manager, and waits until
    /// `/readyz` answers `ok` (about 5–10 s). Spawns from the calling thread: its processes get
    /// SIGKILL when this thread ends, so call it from a thread that outlives the control plane
    /// (a runtime worker, not a `spawn_blocking` thread).
    pub async fn start(binaries: &Binaries, options: ControlPlaneOptions) -> Result<ControlPlane> {
        crate::install_crypto_provider();
        let (dir, temp) = match &options.dir {
            Some(dir) => {
                std::fs::create_dir_all(dir)
                    .map_err(Error::io(format!("creating {}", dir.display())))?;
                (dir.clone(), None)
            }
            None => {
                remove_stale_temp_dirs();
                let temp = tempfile::Builder::new()
                    .prefix(&format!("policy-host-testenv-{}-", std::process::id()))
                    .tempdir()
                    .map_err(Error::io(
                        "creating a temporary directory for the control plane",
                    ))?;
                (temp.path().to_owned(), Some(temp))
            }
        };
        let mut plane = ControlPlane {
            processes: Vec::new(),
            server: String::new(),
            token: random_hex(16)?,
            kubeconfig: dir.join("kubeconfig"),
            dir,
            _temp: temp,
        };
        plane.start_processes(binaries, &options).await?;
        Ok(plane)
    }

    async fn start_processes(
        &mut self,
        binaries: &Binaries,
        options: &ControlPlaneOptions,
    ) -> Result<()> {
        let dir = self.dir.clone();
        let logs = dir.join("logs");
        let [
            etcd_client,
            etcd_peer,
            apiserver_port,
            kcm_port,
            scheduler_port,
        ] = free_ports()?;
        let address = options.node_ip.unwrap_or(Ipv4Addr::LOCALHOST);

        let mut etcd = guarded_command(binaries.control_plane_etcd());
        etcd.args([
            "--name=control-plane",
            &format!("--data-dir={}", dir.join("etcd").display()),
            &format!("--listen-client-urls=http://127.0.0.1:{etcd_client}"),
            &format!("--advertise-client-urls=http://127.0.0.1:{etcd_client}"),
            &format!("--listen-peer-urls=http://127.0.0.1:{etcd_peer}"),
            &format!("--initial-advertise-peer-urls=http://127.0.0.1:{etcd_peer}"),
            &format!("--initial-cluster=control-plane=http://127.0.0.1:{etcd_peer}"),
            // Throwaway data: durability buys nothing and fsync is slow on shared disks.
            "--unsafe-no-fsync",
            "--log-level=warn",
        ]);
        self.processes
            .push(OwnedProcess::spawn("etcd", etcd, logs.join("etcd.log"))?);

        let sa_key = dir.join("service-account.key");
        generate_rsa_key(&sa_key)?;
        let tokens = dir.join("tokens.csv");
        write(
            &tokens,
            &format!("{},admin,admin-uid,\"system:masters\"\n", self.token),
        )?;
        let certs = dir.join("certs");
        let mut apiserver = guarded_command(binaries.kube_apiserver());
        apiserver.args([
            format!("--etcd-servers=http://127.0.0.1:{etcd_client}"),
            format!("--bind-address={address}"),
            format!("--advertise-address={address}"),
            format!("--secure-port={apiserver_port}"),
            format!("--cert-dir={}", certs.display()),
            format!("--token-auth-file={}", tokens.display()),
            "--authorization-mode=RBAC".into(),
            format!("--service-account-key-file={}", sa_key.display()),
            format!("--service-account-signing-key-file={}", sa_key.display()),
            "--service-account-issuer=https://kubernetes.default.svc.cluster.local".into(),
            "--api-audiences=https://kubernetes.default.svc.cluster.local".into(),
            "--service-cluster-ip-range=10.96.0.0/16".into(),
            "--allow-privileged=true".into(),
            "--v=1".into(),
        ]);
        if options.node_ip.is_some() {
            // The kubelet's hostname resolves nowhere; its InternalIP is the bridge address.
            apiserver.arg("--kubelet-preferred-address-types=InternalIP");
        }
        self.processes.push(OwnedProcess::spawn(
            "kube-apiserver",
            apiserver,
            logs.join("kube-apiserver.log"),
        )?);
        self.server = format!("https://{address}:{apiserver_port}");
        write(&self.kubeconfig, &self.kubeconfig_yaml())?;

        self.wait_ready(options.ready_timeout).await?;

        if options.controller_manager {
            // A real node is registered with the not-ready taint; the node lifecycle
            // controller lifts it once the kubelet reports Ready (the pod runner's Node has no
            // kubelet heartbeat, so it stays off there).
            let real_node = options.node_ip.is_some();
            let controllers = std::iter::once("*".to_owned())
                .chain(
                    DISABLED_CONTROLLERS
                        .iter()
                        .filter(|c| !(real_node && REAL_NODE_CONTROLLERS.contains(c)))
                        .map(|c| format!("-{c}")),
                )
                .collect::<Vec<_>>()
                .join(",");
            let mut kcm = guarded_command(binaries.kube_controller_manager());
            if real_node {
                // Claims get hostPath volumes under /tmp/hostpath_pv (the in-tree provisioner
                // for single-node clusters), through the node's default StorageClass.
                kcm.arg("--enable-hostpath-provisioner=true");
            }
            kcm.args([
                format!("--kubeconfig={}", self.kubeconfig.display()),
                format!("--controllers={controllers}"),
                "--use-service-account-credentials=true".into(),
                format!("--service-account-private-key-file={}", sa_key.display()),
                format!("--root-ca-file={}", certs.join("apiserver.crt").display()),
                "--bind-address=127.0.0.1".into(),
                format!("--secure-port={kcm_port}"),
                "--leader-elect=false".into(),
                "--service-cluster-ip-range=10.96.0.0/16".into(),
                // The default 12 h resync and 30 s discovery make garbage collection of new
                // kinds slow; these keep tests waiting less.
                "--concurrent-gc-syncs=5".into(),
                "--v=1".into(),
            ]);
            self.processes.push(OwnedProcess::spawn(
                "kube-controller-manager",
                kcm,
                logs.join("kube-controller-manager.log"),
            )?);
        }
        if options.node_ip.is_some() {
            let mut scheduler = guarded_command(binaries.kube_scheduler());
            scheduler.args([
                format!("--kubeconfig={}", self.kubeconfig.display()),
                "--bind-address=127.0.0.1".into(),
                format!("--secure-port={scheduler_port}"),
                "--leader-elect=false".into(),
                "--v=1".into(),
            ]);
            self.processes.push(OwnedProcess::spawn(
                "kube-scheduler",
                scheduler,
                logs.join("kube-scheduler.log"),
            )?);
        }
        Ok(())
    }

    /// Polls `/readyz` until it answers 200, failing early if a process exited.
    async fn wait_ready(&mut self, timeout: Duration) -> Result<()> {
        let http = reqwest::Client::builder()
            .tls_danger_accept_invalid_certs(true)
            .timeout(Duration::from_secs(5))
            .build()
            .map_err(|e| Error::ComponentFailed {
                component: "readiness client".into(),
                problem: format!("could not be built: {e}"),
                log: self.dir.clone(),
            })?;
        let deadline = Instant::now() + timeout;
        let url = format!("{}/readyz", self.server);
        loop {
            for process in &mut self.processes {
                if let Some(status) = process.exited() {
                    return Err(process.failure(format!("exited during startup ({status})")));
                }
            }
            let answer = http.get(&url).bearer_auth(&self.token).send().await;
            if let Ok(response) = answer
                && response.status().is_success()
            {
                return Ok(());
            }
            if Instant::now() > deadline {
                let apiserver = self
                    .processes
                    .iter()
                    .find(|p| p.name == "kube-apiserver")
                    .map_or_else(|| self.dir.clone(), |p| p.log.clone());
                return Err(Error::ComponentFailed {
                    component: "kube-apiserver".into(),
                    problem: format!("did not answer {url} in {} s", timeout.as_secs()),
                    log: apiserver,
                });
            }
            tokio::time::sleep(Duration::from_millis(200)).await;
        }
    }

    fn kubeconfig_yaml(&self) -> String {
        format!(
            "apiVersion: v1\nkind: Config\nclusters:\n- name: testenv\n  cluster:\n    server: {}\n    insecure-skip-tls-verify: true\nusers:\n- name: admin\n  user:\n    token: {}\ncontexts:\n- name: testenv\n  context:\n    cluster: testenv\n    user: admin\n    namespace: default\ncurrent-context: testenv\n",
            self.server, self.token
        )
    }

    /// The kubeconfig file (token auth, TLS verification off), usable by kubectl and kube-rs.
    pub fn kubeconfig_path(&self) -> &Path {
        &self.kubeconfig
    }

    /// The apiserver URL, `https://127.0.0.1:<port>`.
    pub fn server_url(&self) -> &str {
        &self.server
    }

    /// The bearer token of the `admin` user (group `system:masters`).
    pub fn admin_token(&self) -> &str {
        &self.token
    }

    /// The directory holding data, certificates, the kubeconfig and `logs/`.
    pub fn dir(&self) -> &Path {
        &self.dir
    }

    /// Log files of the control-plane processes, by component name.
    pub fn log_paths(&self) -> Vec<(String, PathBuf)> {
        self.processes
            .iter()
            .map(|p| (p.name.clone(), p.log.clone()))
            .collect()
    }

    /// Starts a pod runner against this control plane, with its files in `runner/` of
    /// [`ControlPlane::dir`], on the current runtime (see [`crate::PodRunner::start`]).
    pub async fn run_pods(&self, binaries: Binaries) -> Result<crate::PodRunner> {
        crate::PodRunner::start(
            self.client().await?,
            binaries,
            crate::PodRunnerOptions {
                dir: Some(self.dir.join("runner")),
                ..crate::PodRunnerOptions::default()
            },
        )
        .await
    }

    /// A kube-rs config for the admin user.
    pub async fn kube_config(&self) -> Result<kube::Config> {
        kube_config_from(&self.kubeconfig).await
    }

    /// A new admin client, living in the caller's runtime.
    pub async fn client(&self) -> Result<kube::Client> {
        client_from(&self.kubeconfig).await
    }
}

/// Reads a kubeconfig into a kube-rs config.
pub(crate) async fn kube_config_from(path: &Path) -> Result<kube::Config> {
    let bad = |reason: String| Error::Kubeconfig {
        path: path.to_owned(),
        reason,
    };
    let kubeconfig = kube::config::Kubeconfig::read_from(path).map_err(|e| bad(e.to_string()))?;
    kube::Config::from_custom_kubeconfig(kubeconfig, &kube::config::KubeConfigOptions::default())
        .await
        .map_err(|e| bad(e.to_string()))
}

/// A client from a kubeconfig, in the caller's runtime.
pub(crate) async fn client_from(path: &Path) -> Result<kube::Client> {
    let config = kube_config_from(path).await?;
    kube::Client::try_from(config).map_err(Error::kube("building a Kubernetes client"))
}

fn write(path: &Path, text: &str) -> Result<()> {
    std::fs::write(path, text).map_err(Error::io(format!("writing {}", path.display())))
}

/// `N` distinct free TCP ports on 127.0.0.1 (held open together, so they differ).
pub(crate) fn free_ports<const N: usize>() -> Result<[u16; N]> {
    let listeners = (0..N)
        .map(|_| TcpListener::bind("127.0.0.1:0"))
        .collect::<std::io::Result<Vec<_>>>()
        .map_err(Error::io("finding free ports on 127.0.0.1"))?;
    let mut ports = [0u16; N];
    for (port, listener) in ports.iter_mut().zip(&listeners) {
        *port = listener
            .local_addr()
            .map_err(Error::io("finding free ports on 127.0.0.1"))?
            .port();
    }
    Ok(ports)
}

/// `bytes` random bytes from the kernel, as hex.
pub(crate) fn random_hex(bytes: usize) -> Result<String> {
    use std::io::Read as _;
    let mut buf = vec![0u8; bytes];
    std::fs::File::open("/dev/urandom")
        .and_then(|mut f| f.read_exact(&mut buf))
        .map_err(Error::io("reading /dev/urandom"))?;
    Ok(buf.iter().map(|b| format!("{b:02x}")).collect())
}

fn generate_rsa_key(path: &Path) -> Result<()> {
    let output = std::process::Command::new("openssl")
        .args(["genrsa", "-out"])
        .arg(path)
        .arg("2048")
        .output()
        .map_err(Error::io(
            "running `openssl genrsa` (install the openssl CLI)",
        ))?;
    if output.status.success() {
        Ok(())
    } else {
        Err(Error::Io {
            what: format!(
                "`openssl genrsa` failed: {}",
                String::from_utf8_lossy(&output.stderr)
            ),
            source: std::io::Error::other("openssl genrsa failed"),
        })
    }
}

/// Removes temporary directories left by test processes that died without cleaning up.
fn remove_stale_temp_dirs() {
    let Ok(entries) = std::fs::read_dir(std::env::temp_dir()) else {
        return;
    };
    for entry in entries.flatten() {
        let name = entry.file_name();
        let Some(rest) = name
            .to_str()
            .and_then(|n| n.strip_prefix("policy-host-testenv-"))
        else {
            continue;
        };
        let Some(pid) = rest.split('-').next() else {
            continue;
        };
        if pid.parse::<u32>().is_ok() && !Path::new("/proc").join(pid).exists() {
            let _ = std::fs::remove_dir_all(entry.path());
        }
    }
}
