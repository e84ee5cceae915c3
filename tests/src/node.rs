//! A real Kubernetes node beside the local control plane: containerd with runc, a kubelet, the
//! CNI bridge, CoreDNS and kube-proxy, all under the test's own directory and cgroup, with
//! images made locally ([`crate::images`]) and imported into containerd.
//!
//! Choose it over the pod runner when a test needs what only a real node does: images and their
//! users, PID 1 and signals, cgroup limits, Services with endpoints (pod IPs are not loopback,
//! so the EndpointSlice controller fills the slices), cluster DNS, and in-cluster clients.
//!
//! Machine facts it respects (`REAL-NODE.md` of the project's notes): the node's IP cannot be
//! loopback, so a bridge `cni0` with 10.244.0.1/24 is made first ([`NodeNetwork`]) and
//! kube-apiserver binds and advertises that address; cgroup v1 without `CAP_SYS_RESOURCE`, so
//! the kubelet accepts cgroup v1, containerd restricts `oom_score_adj`, and pod cgroups go under
//! the test process's own memory cgroup (`cgroupRoot`), never at a hierarchy's root.
//!
//! The bridge, the kube-proxy nftables tables and port 53 on the bridge are machine-wide, so one
//! node runs at a time: [`NodeNetwork::create`] holds an exclusive lock for the node's life,
//! and cleans up what a test process killed before its teardown left behind.
//!
//! Teardown (on drop, by PID): the kubelet, CoreDNS and kube-proxy stop; every process in the
//! pods' cgroups and every runc shim of this containerd is killed; containerd stops; the mounts
//! under the node's directory and its network namespaces are removed, then the pods' cgroups,
//! kube-proxy's nftables tables and the bridge.

use std::fs::File;
use std::net::Ipv4Addr;
use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::{Duration, Instant};

use k8s_openapi::api::core::v1::Node as NodeObject;
use kube::Api;

use crate::control_plane::free_ports;
use crate::images::{ImageFile, ImageSpec};
use crate::process::{OwnedProcess, guarded_command, signalled_command};
use crate::{Binaries, ControlPlane, Error, Result};

/// The node's address: the bridge's gateway, where kube-apiserver, the kubelet and CoreDNS
/// listen, and what the pods reach the host network by.
pub const NODE_IP: Ipv4Addr = Ipv4Addr::new(10, 244, 0, 1);
/// The bridge the CNI plugin attaches pods to.
pub const BRIDGE: &str = "cni0";
/// The pods' addresses (host-local IPAM on the bridge).
const POD_SUBNET: &str = "10.244.0.0/24";
/// The name the node registers as.
pub const NODE_NAME: &str = "policy-host-node";
/// The cluster's DNS domain.
const CLUSTER_DOMAIN: &str = "cluster.local";
/// The machine-wide lock that lets one node run at a time.
const LOCK_FILE: &str = "/run/lock/policy-host-node.lock";
/// cgroup v1 hierarchies the kubelet places pods in; each needs the cgroup root to exist.
const HIERARCHIES: &[&str] = &[
    "memory", "cpu", "cpuacct", "cpuset", "devices", "freezer", "blkio", "pids", "systemd",
];

/// The machine-wide part of a node: the lock, and the bridge with the node's address. Made
/// before the control plane (kube-apiserver binds [`NODE_IP`]); dropped after it.
#[derive(Debug)]
pub struct NodeNetwork {
    _lock: nix::fcntl::Flock<File>,
    ip_forward: String,
}

impl NodeNetwork {
    /// Takes the machine-wide node lock (waiting up to `wait` for another test process's node
    /// to end), removes what a killed earlier node left, and makes the bridge [`BRIDGE`] with
    /// [`NODE_IP`]/24.
    pub fn create(wait: Duration) -> Result<NodeNetwork> {
        let file = std::fs::OpenOptions::new()
            .create(true)
            .truncate(false)
            .write(true)
            .open(LOCK_FILE)
            .map_err(Error::io(format!("opening {LOCK_FILE}")))?;
        let deadline = Instant::now() + wait;
        let mut file = file;
        let lock = loop {
            match nix::fcntl::Flock::lock(file, nix::fcntl::FlockArg::LockExclusiveNonblock) {
                Ok(lock) => break lock,
                Err((back, _)) if Instant::now() < deadline => {
                    file = back;
                    std::thread::sleep(Duration::from_millis(500));
                }
                Err((_, errno)) => {
                    return Err(Error::Command {
                        what: format!("locking {LOCK_FILE}"),
                        output: format!(
                            "{errno}: another test process runs a real node (bridge {BRIDGE}) for more than {} s; wait for it or end it",
                            wait.as_secs()
                        ),
                    });
                }
            }
        };
        remove_leftovers();
        let ip_forward = std::fs::read_to_string("/proc/sys/net/ipv4/ip_forward")
            .unwrap_or_else(|_| "0".into())
            .trim()
            .to_owned();
        run("ip", &["link", "add", BRIDGE, "type", "bridge"])?;
        let network = NodeNetwork {
            _lock: lock,
            ip_forward,
        };
        run(
            "ip",
            &["addr", "add", &format!("{NODE_IP}/24"), "dev", BRIDGE],
        )?;
        run("ip", &["link", "set", BRIDGE, "up"])?;
        Ok(network)
    }
}

impl Drop for NodeNetwork {
    fn drop(&mut self) {
        let _ = run("ip", &["link", "del", BRIDGE]);
        // The bridge plugin turns forwarding on (isGateway); put back what was there.
        let _ = std::fs::write("/proc/sys/net/ipv4/ip_forward", &self.ip_forward);
    }
}

/// Removes what a node of a process that died before its teardown left: its network
/// namespaces, the bridge and kube-proxy's tables. Only called with the node lock held, so
/// nothing of a live node is touched.
fn remove_leftovers() {
    for netns in cni_network_namespaces() {
        let _ = Command::new("umount").arg("-l").arg(&netns).status();
        let _ = std::fs::remove_file(&netns);
    }
    let _ = run("ip", &["link", "del", BRIDGE]);
    for family in ["ip", "ip6"] {
        let _ = run("nft", &["delete", "table", family, "kube-proxy"]);
    }
}

/// The network namespaces containerd made for pods (`/var/run/netns/cni-…`).
fn cni_network_namespaces() -> Vec<PathBuf> {
    let Ok(entries) = std::fs::read_dir("/var/run/netns") else {
        return Vec::new();
    };
    entries
        .flatten()
        .filter(|e| e.file_name().to_string_lossy().starts_with("cni-"))
        .map(|e| e.path())
        .collect()
}

/// A running node. Dropping it tears everything down (see the module documentation).
#[derive(Debug)]
pub struct Node {
    /// Stopped in this order on drop: kube-proxy, CoreDNS, kubelet first; containerd last.
    processes: Vec<OwnedProcess>,
    dir: PathBuf,
    socket: PathBuf,
    ctr: PathBuf,
    cgroup_root: String,
    created_cgroups: Vec<PathBuf>,
    ip_forward: String,
    /// `node-teardown.sh watch`: tears down if this process dies without dropping the node.
    watchdog: Option<OwnedProcess>,
}

impl Node {
    /// Starts containerd, imports `images`, then the kubelet, CoreDNS and kube-proxy against
    /// `plane` (started with `node_ip` [`NODE_IP`] inside `network`), with files in `dir`, and
    /// waits until the node is Ready, CoreDNS serves and kube-proxy has synced. Spawns from the
    /// calling thread (its processes die with it), like [`ControlPlane::start`].
    pub async fn start(
        plane: &ControlPlane,
        network: &NodeNetwork,
        binaries: &Binaries,
        images: &[PathBuf],
        dir: &Path,
    ) -> Result<Node> {
        let started = Instant::now();
        std::fs::create_dir_all(dir).map_err(Error::io(format!("creating {}", dir.display())))?;
        let (cgroup_root, created_cgroups) = prepare_cgroup_root()?;
        let mut node = Node {
            processes: Vec::new(),
            dir: dir.to_owned(),
            socket: dir.join("containerd/containerd.sock"),
            ctr: binaries.ctr(),
            cgroup_root,
            created_cgroups,
            ip_forward: network.ip_forward.clone(),
            watchdog: None,
        };
        // TERM, not KILL, on this process's death: the watchdog must live to clean up.
        let mut watchdog = signalled_command("bash", "TERM");
        watchdog
            .arg(teardown_script())
            .arg("watch")
            .args(node.teardown_args());
        node.watchdog = Some(OwnedProcess::spawn(
            "node-teardown watchdog",
            watchdog,
            node.logs().join("teardown.log"),
        )?);
        node.start_containerd(binaries)?;
        node.wait_for_containerd().await?;
        for image in images {
            node.import_image(image)?;
        }
        let [
            kubelet_healthz,
            proxy_healthz,
            proxy_metrics,
            dns_ready,
            dns_health,
        ] = free_ports()?;
        node.start_kubelet(plane, binaries, kubelet_healthz)?;
        node.start_coredns(plane, binaries, dns_ready, dns_health)?;
        node.start_kube_proxy(plane, binaries, proxy_healthz, proxy_metrics)?;
        node.wait_ready(plane, dns_ready, proxy_healthz).await?;
        create_default_storage_class(plane).await?;
        tracing::info!(
            seconds = started.elapsed().as_secs_f64(),
            "real node {NODE_NAME} ready"
        );
        Ok(node)
    }

    fn logs(&self) -> PathBuf {
        self.dir.join("logs")
    }

    fn start_containerd(&mut self, binaries: &Binaries) -> Result<()> {
        let base = self.dir.join("containerd");
        let cni_conf = self.dir.join("cni/net.d");
        std::fs::create_dir_all(&cni_conf)
            .map_err(Error::io(format!("creating {}", cni_conf.display())))?;
        let conflist = serde_json::json!({
            "cniVersion": "1.0.0",
            "name": "policy-host",
            "plugins": [{
                "type": "bridge",
                "bridge": BRIDGE,
                "isGateway": true,
                "hairpinMode": true,
                "ipam": {
                    "type": "host-local",
                    "ranges": [[{ "subnet": POD_SUBNET, "gateway": NODE_IP.to_string() }]],
                    "routes": [{ "dst": "0.0.0.0/0" }],
                    "dataDir": self.dir.join("cni/ipam").display().to_string(),
                },
            }],
        });
        write(
            &cni_conf.join("10-policy-host.conflist"),
            &conflist.to_string(),
        )?;
        let runc = binaries.runc_dir().join("runc");
        let config = format!(
            r#"version = 3
root = "{root}"
state = "{state}"

[grpc]
  address = "{socket}"

[ttrpc]
  address = "{socket}.ttrpc"

[plugins.'io.containerd.cri.v1.runtime']
  # No CAP_SYS_RESOURCE here: a negative oom_score_adj is refused, failing every sandbox.
  restrict_oom_score_adj = true
  [plugins.'io.containerd.cri.v1.runtime'.containerd]
    default_runtime_name = "runc"
    [plugins.'io.containerd.cri.v1.runtime'.containerd.runtimes.runc]
      runtime_type = "io.containerd.runc.v2"
      [plugins.'io.containerd.cri.v1.runtime'.containerd.runtimes.runc.options]
        SystemdCgroup = false
        BinaryName = "{runc}"
  [plugins.'io.containerd.cri.v1.runtime'.cni]
    bin_dirs = ["{cni_bin}"]
    conf_dir = "{cni_conf}"

[plugins.'io.containerd.cri.v1.images']
  snapshotter = "overlayfs"
  [plugins.'io.containerd.cri.v1.images'.pinned_images]
    sandbox = "{pause}"
"#,
            root = base.join("root").display(),
            state = base.join("state").display(),
            socket = self.socket.display(),
            runc = runc.display(),
            cni_bin = binaries.cni_bin_dir().display(),
            cni_conf = cni_conf.display(),
            pause = binaries.pause_image(),
        );
        let config_path = base.join("config.toml");
        std::fs::create_dir_all(&base)
            .map_err(Error::io(format!("creating {}", base.display())))?;
        write(&config_path, &config)?;
        let mut containerd = guarded_command(binaries.containerd_dir().join("containerd"));
        containerd.arg("--config").arg(&config_path);
        // The shim finds runc (and itself) on PATH.
        containerd.env(
            "PATH",
            format!(
                "{}:{}:{}",
                binaries.runc_dir().display(),
                binaries.containerd_dir().display(),
                std::env::var("PATH").unwrap_or_else(|_| "/usr/sbin:/usr/bin:/sbin:/bin".into())
            ),
        );
        self.processes.push(OwnedProcess::spawn(
            "containerd",
            containerd,
            self.logs().join("containerd.log"),
        )?);
        Ok(())
    }

    async fn wait_for_containerd(&mut self) -> Result<()> {
        let deadline = Instant::now() + Duration::from_secs(60);
        loop {
            if let Some(process) = self.processes.last_mut()
                && let Some(status) = process.exited()
            {
                return Err(process.failure(format!("exited during startup ({status})")));
            }
            if self.socket.exists() && self.ctr(&["version"]).is_ok() {
                return Ok(());
            }
            if Instant::now() > deadline {
                return Err(Error::ComponentFailed {
                    component: "containerd".into(),
                    problem: "did not answer on its socket in 60 s".into(),
                    log: self.logs().join("containerd.log"),
                });
            }
            tokio::time::sleep(Duration::from_millis(200)).await;
        }
    }

    /// Runs `ctr` against this node's containerd, in the kubelet's namespace `k8s.io`.
    fn ctr(&self, args: &[&str]) -> Result<String> {
        ctr(&self.ctr, &self.socket, args)
    }

    /// Imports a docker-archive tarball (from [`ImageSpec::write_archive`]) under the names it
    /// carries, unpacked for the kubelet.
    pub fn import_image(&self, archive: &Path) -> Result<()> {
        import_image(&self.ctr, &self.socket, archive)
    }

    /// The references of the images containerd holds.
    pub fn image_names(&self) -> Result<Vec<String>> {
        Ok(self
            .ctr(&["images", "list", "--quiet"])?
            .lines()
            .map(str::to_owned)
            .collect())
    }

    fn start_kubelet(
        &mut self,
        plane: &ControlPlane,
        binaries: &Binaries,
        healthz: u16,
    ) -> Result<()> {
        let root = self.dir.join("kubelet");
        std::fs::create_dir_all(&root)
            .map_err(Error::io(format!("creating {}", root.display())))?;
        let config = format!(
            r#"apiVersion: kubelet.config.k8s.io/v1beta1
kind: KubeletConfiguration
# This machine has cgroup v1 (hybrid); kubelet >= 1.35 refuses it unless told.
failCgroupV1: false
failSwapOn: false
cgroupDriver: cgroupfs
# Pods go under the test process's own cgroup, inside its memory accounting.
cgroupRoot: "{cgroup_root}"
containerRuntimeEndpoint: "unix://{socket}"
address: "{NODE_IP}"
port: 10250
readOnlyPort: 0
healthzBindAddress: 127.0.0.1
healthzPort: {healthz}
clusterDomain: {CLUSTER_DOMAIN}
clusterDNS: ["{NODE_IP}"]
enforceNodeAllocatable: []
evictionHard: {{}}
localStorageCapacityIsolation: false
imageGCHighThresholdPercent: 100
imageGCLowThresholdPercent: 99
podLogsDir: "{pod_logs}"
serializeImagePulls: false
# Test only: kube-apiserver reaches the kubelet (logs, exec) without a client certificate.
authentication:
  anonymous:
    enabled: true
  webhook:
    enabled: false
authorization:
  mode: AlwaysAllow
"#,
            cgroup_root = self.cgroup_root,
            socket = self.socket.display(),
            pod_logs = self.pod_logs_dir().display(),
        );
        let config_path = root.join("config.yaml");
        write(&config_path, &config)?;
        let mut kubelet = guarded_command(binaries.kubelet());
        kubelet
            .arg(format!("--config={}", config_path.display()))
            .arg(format!(
                "--kubeconfig={}",
                plane.kubeconfig_path().display()
            ))
            .arg(format!("--root-dir={}", root.display()))
            .arg(format!("--cert-dir={}", root.join("pki").display()))
            .arg(format!(
                "--volume-plugin-dir={}",
                root.join("volume-plugins").display()
            ))
            .arg(format!("--hostname-override={NODE_NAME}"))
            .arg(format!("--node-ip={NODE_IP}"))
            .arg("--v=1");
        kubelet.env("PATH", system_path(binaries));
        self.processes.insert(
            0,
            OwnedProcess::spawn("kubelet", kubelet, self.logs().join("kubelet.log"))?,
        );
        Ok(())
    }

    fn start_coredns(
        &mut self,
        plane: &ControlPlane,
        binaries: &Binaries,
        ready: u16,
        health: u16,
    ) -> Result<()> {
        let dir = self.dir.join("coredns");
        std::fs::create_dir_all(&dir).map_err(Error::io(format!("creating {}", dir.display())))?;
        // Nothing leaves this machine: names outside the cluster get NXDOMAIN at once instead
        // of timing out against an upstream that does not exist.
        let corefile = format!(
            r#"{CLUSTER_DOMAIN}:53 in-addr.arpa:53 ip6.arpa:53 {{
    bind {NODE_IP}
    errors
    ready 127.0.0.1:{ready}
    health 127.0.0.1:{health}
    kubernetes {CLUSTER_DOMAIN} in-addr.arpa ip6.arpa {{
        kubeconfig {kubeconfig} testenv
        pods insecure
    }}
}}
.:53 {{
    bind {NODE_IP}
    template ANY ANY {{
        rcode NXDOMAIN
    }}
}}
"#,
            kubeconfig = plane.kubeconfig_path().display(),
        );
        let corefile_path = dir.join("Corefile");
        write(&corefile_path, &corefile)?;
        let mut coredns = guarded_command(binaries.coredns());
        coredns.arg("-conf").arg(&corefile_path).current_dir(&dir);
        self.processes.insert(
            0,
            OwnedProcess::spawn("coredns", coredns, self.logs().join("coredns.log"))?,
        );
        Ok(())
    }

    fn start_kube_proxy(
        &mut self,
        plane: &ControlPlane,
        binaries: &Binaries,
        healthz: u16,
        metrics: u16,
    ) -> Result<()> {
        let mut proxy = guarded_command(binaries.kube_proxy());
        proxy
            .arg(format!(
                "--kubeconfig={}",
                plane.kubeconfig_path().display()
            ))
            .arg("--proxy-mode=nftables")
            .arg("--cluster-cidr=10.244.0.0/16")
            .arg(format!("--hostname-override={NODE_NAME}"))
            .arg(format!("--healthz-bind-address=127.0.0.1:{healthz}"))
            .arg(format!("--metrics-bind-address=127.0.0.1:{metrics}"))
            // NodePorts only on the bridge, never on the machine's own interfaces.
            .arg(format!("--nodeport-addresses={POD_SUBNET}"))
            // Leave the machine's conntrack table size alone.
            .arg("--conntrack-max-per-core=0")
            .arg("--v=1");
        proxy.env("PATH", system_path(binaries));
        self.processes.insert(
            0,
            OwnedProcess::spawn("kube-proxy", proxy, self.logs().join("kube-proxy.log"))?,
        );
        Ok(())
    }

    async fn wait_ready(
        &mut self,
        plane: &ControlPlane,
        dns_ready: u16,
        proxy_healthz: u16,
    ) -> Result<()> {
        let client = plane.client().await?;
        let nodes: Api<NodeObject> = Api::all(client);
        let http = reqwest::Client::builder()
            .timeout(Duration::from_secs(2))
            .build()
            .map_err(|e| Error::Command {
                what: "building an HTTP client".into(),
                output: e.to_string(),
            })?;
        let deadline = Instant::now() + Duration::from_secs(120);
        let mut waiting_for;
        loop {
            for process in &mut self.processes {
                if let Some(status) = process.exited() {
                    return Err(process.failure(format!("exited during node startup ({status})")));
                }
            }
            // Ready, and schedulable: the not-ready taint it registers with is lifted.
            let node_ready = nodes
                .get_opt(NODE_NAME)
                .await
                .ok()
                .flatten()
                .is_some_and(|node| {
                    let untainted = node
                        .spec
                        .and_then(|s| s.taints)
                        .unwrap_or_default()
                        .iter()
                        .all(|t| t.key != "node.kubernetes.io/not-ready");
                    let ready = node
                        .status
                        .and_then(|s| s.conditions)
                        .unwrap_or_default()
                        .iter()
                        .any(|c| c.type_ == "Ready" && c.status == "True");
                    ready && untainted
                });
            let answers = |port: u16, path: &'static str| {
                let http = http.clone();
                async move {
                    http.get(format!("http://127.0.0.1:{port}{path}"))
                        .send()
                        .await
                        .is_ok_and(|r| r.status().is_success())
                }
            };
            let dns = answers(dns_ready, "/ready").await;
            let proxy = answers(proxy_healthz, "/healthz").await;
            waiting_for = match (node_ready, dns, proxy) {
                (true, true, true) => return Ok(()),
                (false, _, _) => ("kubelet", "the node to be Ready and untainted"),
                (_, false, _) => ("coredns", "CoreDNS to be ready"),
                (_, _, false) => ("kube-proxy", "kube-proxy's first sync"),
            };
            if Instant::now() > deadline {
                return Err(Error::ComponentFailed {
                    component: waiting_for.0.into(),
                    problem: format!("did not get {} in 120 s", waiting_for.1),
                    log: self.logs().join(format!("{}.log", waiting_for.0)),
                });
            }
            tokio::time::sleep(Duration::from_millis(200)).await;
        }
    }

    /// The directory holding the node's configuration, state and `logs/`.
    pub fn dir(&self) -> &Path {
        &self.dir
    }

    /// containerd's socket.
    pub fn containerd_socket(&self) -> &Path {
        &self.socket
    }

    /// Where the kubelet writes container logs
    /// (`<namespace>_<pod>_<uid>/<container>/<restart>.log`).
    pub fn pod_logs_dir(&self) -> PathBuf {
        self.dir.join("pod-logs")
    }

    /// Log files of containerd, the kubelet, CoreDNS and kube-proxy, by component name.
    pub fn log_paths(&self) -> Vec<(String, PathBuf)> {
        self.processes
            .iter()
            .map(|p| (p.name.clone(), p.log.clone()))
            .collect()
    }

    fn teardown_args(&self) -> Vec<String> {
        vec![
            self.dir.display().to_string(),
            self.socket.display().to_string(),
            self.cgroup_root.clone(),
            BRIDGE.to_owned(),
            self.ip_forward.clone(),
        ]
    }
}

impl Drop for Node {
    fn drop(&mut self) {
        if let Some(mut watchdog) = self.watchdog.take() {
            watchdog.kill();
        }
        // The kubelet first, so it does not restart what the teardown kills.
        for process in &mut self.processes {
            if process.name != "containerd" {
                process.stop(Duration::from_secs(3));
            }
        }
        let _ = Command::new("bash")
            .arg(teardown_script())
            .arg("now")
            .args(self.teardown_args())
            .status();
        for process in &mut self.processes {
            process.stop(Duration::from_secs(3));
        }
        for created in self.created_cgroups.iter().rev() {
            let _ = std::fs::remove_dir(created);
        }
    }
}

/// `tests/env/node-teardown.sh`: the one place that knows what a node leaves behind.
fn teardown_script() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("env/node-teardown.sh")
}

/// Runs `ctr` (at `program`) against the containerd at `socket`, in the kubelet's namespace.
pub(crate) fn ctr(program: &Path, socket: &Path, args: &[&str]) -> Result<String> {
    let output = Command::new(program)
        .arg("--address")
        .arg(socket)
        .args(["--namespace", "k8s.io"])
        .args(args)
        .output()
        .map_err(Error::io(format!("running {}", program.display())))?;
    if output.status.success() {
        Ok(String::from_utf8_lossy(&output.stdout).into_owned())
    } else {
        Err(Error::Command {
            what: format!("ctr {}", args.join(" ")),
            output: String::from_utf8_lossy(&output.stderr).into_owned(),
        })
    }
}

/// Imports a docker-archive tarball into the containerd at `socket` under the names it carries,
/// unpacked for the kubelet.
pub(crate) fn import_image(program: &Path, socket: &Path, archive: &Path) -> Result<()> {
    let path = archive.display().to_string();
    ctr(
        program,
        socket,
        &["images", "import", "--snapshotter", "overlayfs", &path],
    )
    .map(|_| ())
}

/// The test process's own memory cgroup, made to exist in every hierarchy the kubelet uses
/// (with cpuset's cpus and mems copied down each new level, which a new cpuset needs before it
/// takes processes). Returns the path and the directories made, to remove on teardown.
fn prepare_cgroup_root() -> Result<(String, Vec<PathBuf>)> {
    let own = std::fs::read_to_string("/proc/self/cgroup")
        .map_err(Error::io("reading /proc/self/cgroup"))?;
    let memory = own
        .lines()
        .find_map(|line| {
            let mut fields = line.splitn(3, ':');
            let (_, controllers, path) = (fields.next()?, fields.next()?, fields.next()?);
            controllers.split(',').any(|c| c == "memory").then(|| path.to_owned())
        })
        .ok_or_else(|| Error::Command {
            what: "finding this process's memory cgroup".into(),
            output: "no cgroup v1 memory hierarchy in /proc/self/cgroup; the real node needs cgroup v1 (hybrid) as on the project's machines".into(),
        })?;
    // Never at a hierarchy's root: pods would escape every accounting.
    let root = if memory == "/" {
        format!("/policy-host-node-{}", std::process::id())
    } else {
        memory
    };
    let mut created = Vec::new();
    for hierarchy in HIERARCHIES {
        let mut at = Path::new("/sys/fs/cgroup").join(hierarchy);
        if !at.is_dir() {
            continue;
        }
        for part in root.trim_start_matches('/').split('/') {
            let parent = at.clone();
            at = at.join(part);
            if at.is_dir() {
                continue;
            }
            std::fs::create_dir(&at)
                .map_err(Error::io(format!("creating cgroup {}", at.display())))?;
            created.push(at.clone());
            if *hierarchy == "cpuset" {
                for file in ["cpuset.cpus", "cpuset.mems"] {
                    let value = std::fs::read_to_string(parent.join(file)).map_err(Error::io(
                        format!("reading {}", parent.join(file).display()),
                    ))?;
                    std::fs::write(at.join(file), value.trim())
                        .map_err(Error::io(format!("writing {}", at.join(file).display())))?;
                }
            }
        }
    }
    Ok((root, created))
}

/// `PATH` for the node's programs: nft (kube-proxy), mount and iptables tools of the machine.
fn system_path(binaries: &Binaries) -> String {
    format!(
        "{}:/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin",
        binaries.runc_dir().display()
    )
}

fn run(program: &str, args: &[&str]) -> Result<()> {
    let output = Command::new(program)
        .args(args)
        .output()
        .map_err(Error::io(format!("running {program}")))?;
    if output.status.success() {
        Ok(())
    } else {
        Err(Error::Command {
            what: format!("{program} {}", args.join(" ")),
            output: String::from_utf8_lossy(&output.stderr).into_owned(),
        })
    }
}

fn write(path: &Path, text: &str) -> Result<()> {
    std::fs::write(path, text).map_err(Error::io(format!("writing {}", path.display())))
}

/// The name of the node's default StorageClass.
pub const STORAGE_CLASS: &str = "standard";

/// A default StorageClass for the in-tree hostPath provisioner (kube-controller-manager runs
/// with `--enable-hostpath-provisioner`), so a claim with no class gets a volume under
/// `/tmp/hostpath_pv/`, as on a single-node development cluster.
async fn create_default_storage_class(plane: &ControlPlane) -> Result<()> {
    use k8s_openapi::api::storage::v1::StorageClass;
    let classes: Api<StorageClass> = Api::all(plane.client().await?);
    let class: StorageClass = serde_json::from_value(serde_json::json!({
        "apiVersion": "storage.k8s.io/v1",
        "kind": "StorageClass",
        "metadata": {
            "name": STORAGE_CLASS,
            "annotations": {"storageclass.kubernetes.io/is-default-class": "true"},
        },
        "provisioner": "kubernetes.io/host-path",
        "reclaimPolicy": "Delete",
        "volumeBindingMode": "Immediate",
    }))
    .map_err(|e| Error::Command {
        what: "writing the default StorageClass".into(),
        output: e.to_string(),
    })?;
    match classes
        .create(&kube::api::PostParams::default(), &class)
        .await
    {
        Ok(_) => Ok(()),
        Err(kube::Error::Api(status)) if status.code == 409 => Ok(()),
        Err(e) => Err(Error::kube(format!(
            "creating StorageClass {STORAGE_CLASS}"
        ))(e)),
    }
}

/// The images every node gets, whatever it runs: the pod sandbox (containerd pins it). Apps'
/// images are declared by the plugins whose tests run them ([`crate::images::declared`]) and
/// loaded by [`crate::TestEnv`]. Written into `dir` (cached by content).
pub fn base_images(binaries: &Binaries, dir: &Path) -> Result<Vec<PathBuf>> {
    let pause = ImageSpec {
        entrypoint: vec!["/pause".into()],
        ..ImageSpec::new(
            binaries.pause_image(),
            vec![ImageFile {
                source: binaries.pause()?,
                path: "/pause".into(),
            }],
        )
    };
    Ok(vec![pause.write_archive(dir)?])
}
