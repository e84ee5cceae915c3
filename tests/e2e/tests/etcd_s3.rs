//! The etcd plugin's backups to a real S3-compatible store: a MinIO server started by the
//! test receives each verified snapshot from the backup Pod's `mc` step; after three scheduled
//! snapshots the bucket holds exactly the `keep` objects status lists (named as the slot
//! files, byte-equal to the claim's), and a new cluster restores from the newest object
//! through `spec.restore.s3` with the claim's copy gone, holding the keys the source had.
//!
//! MinIO and `mc` are built on demand (`tests/env/build-binaries.sh s3`) by this test only.
//! MinIO listens on a loopback address of its own: the pod runner rewrites `127.0.0.1` in
//! Pods' env and args to the Pod's IP, and Pod IPs are `127.<10..209>.x.y`.
//! The fixture helpers are copies of the few `etcd_backup.rs` needs here.

use std::collections::BTreeSet;
use std::net::{Ipv4Addr, SocketAddr, TcpListener};
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::{Duration, Instant};

use k8s_openapi::api::core::v1::{Pod, Secret};
use kube::api::{
    Api, ApiResource, DeleteParams, DynamicObject, ListParams, Patch, PatchParams, PostParams,
};
use kube::core::GroupVersionKind;
use policy_host::decide::Limits;
use policy_host_e2e::{HostUnderTest, init_logging, install_crd};
use policy_host_testenv::{Binaries, TestEnv, shared};
use serde_json::{Value, json};

/// How long the creation of a cluster may take to converge.
const CONVERGE: Duration = Duration::from_secs(120);
/// Name of the EtcdCluster that is backed up.
const NAME: &str = "to-s3";
/// Name of the cluster restored from its newest uploaded snapshot.
const RESTORED: &str = "from-s3";
/// The schedule: short, so three snapshots take seconds; long enough that the keys written
/// in between always move the revision on.
const EVERY: &str = "4s";
/// MinIO's address: outside the pod runner's `127.<10..209>.x.y` Pod IPs and not 127.0.0.1.
const MINIO_IP: Ipv4Addr = Ipv4Addr::new(127, 254, 0, 1);
/// MinIO's root credentials, which the credentials Secret also holds.
const ACCESS_KEY: &str = "policyhoste2e";
const SECRET_KEY: &str = "policyhoste2esecret";
/// The bucket and the object prefix the cluster uploads to.
const BUCKET: &str = "etcd-snapshots";
const PREFIX: &str = "e2e/";

fn etcd_clusters() -> ApiResource {
    ApiResource::from_gvk_with_plural(
        &GroupVersionKind::gvk("etcd.database.coreos.com", "v1beta2", "EtcdCluster"),
        "etcdclusters",
    )
}

/// Polls `check` every 200 ms until it returns `Ok`, for at most `timeout`; on timeout the
/// error carries the last reason `check` gave.
async fn eventually<T, F, Fut>(what: &str, timeout: Duration, mut check: F) -> anyhow::Result<T>
where
    F: FnMut() -> Fut,
    Fut: std::future::Future<Output = Result<T, String>>,
{
    let deadline = Instant::now() + timeout;
    loop {
        match check().await {
            Ok(value) => return Ok(value),
            Err(why) if Instant::now() >= deadline => {
                anyhow::bail!("timed out after {timeout:?} waiting for {what}; last: {why}")
            }
            Err(_) => tokio::time::sleep(Duration::from_millis(200)).await,
        }
    }
}

/// An etcd version of the test environment by minor, e.g. `3.6` → `3.6.16`.
fn etcd_version(env: &TestEnv, minor: &str) -> anyhow::Result<String> {
    env.binaries()
        .etcd_versions()
        .iter()
        .map(|v| v.trim_start_matches('v').to_owned())
        .find(|v| v.starts_with(&format!("{minor}.")))
        .ok_or_else(|| anyhow::anyhow!("no etcd {minor}.x in the test environment"))
}

/// One test's EtcdCluster, its namespace, the host reconciling it and an etcd client.
struct Fixture {
    env: &'static TestEnv,
    /// The EtcdCluster the helpers look at.
    name: String,
    started: Instant,
    namespace: String,
    host: Option<HostUnderTest>,
    clusters: Api<DynamicObject>,
    pods: Api<Pod>,
    etcdctl: PathBuf,
}

impl Fixture {
    async fn start(prefix: &str, etcdctl_minor: &str) -> anyhow::Result<Fixture> {
        init_logging();
        let env = shared().await?;
        let client = env.client().await?;
        install_crd(&client, "deploy/crds/etcdcluster.yaml").await?;
        let namespace = env.create_namespace(prefix).await?;
        let plugin =
            policy_host_test_plugins::build("guest-etcd").map_err(|e| anyhow::anyhow!("{e}"))?;
        let host = HostUnderTest::start(
            env,
            std::slice::from_ref(&plugin),
            &namespace,
            Limits::default(),
        )
        .await?;
        let version = etcd_version(env, etcdctl_minor)?;
        let etcdctl = env
            .binaries()
            .etcd_dir(&format!("v{version}"))
            .ok_or_else(|| anyhow::anyhow!("etcd {version} is not in the test environment"))?
            .join("etcdctl");
        Ok(Fixture {
            env,
            name: NAME.to_owned(),
            started: Instant::now(),
            clusters: Api::namespaced_with(client.clone(), &namespace, &etcd_clusters()),
            pods: Api::namespaced(client.clone(), &namespace),
            namespace,
            host: Some(host),
            etcdctl,
        })
    }

    async fn create_cluster_with(&self, spec: Value) -> anyhow::Result<()> {
        let cluster = json!({
            "apiVersion": "etcd.database.coreos.com/v1beta2",
            "kind": "EtcdCluster",
            "metadata": {"name": self.name},
            "spec": spec,
        });
        self.clusters
            .patch(
                &self.name,
                &PatchParams::apply("e2e").force(),
                &Patch::Apply(&cluster),
            )
            .await?;
        Ok(())
    }

    async fn patch_spec(&self, spec: Value) -> anyhow::Result<()> {
        self.clusters
            .patch(
                &self.name,
                &PatchParams::default(),
                &Patch::Merge(&json!({"spec": spec})),
            )
            .await?;
        Ok(())
    }

    async fn cluster(&self) -> Result<Value, String> {
        match self.clusters.get_opt(&self.name).await {
            Ok(Some(object)) => serde_json::to_value(&object).map_err(|e| e.to_string()),
            Ok(None) => Err("the EtcdCluster does not exist".into()),
            Err(e) => Err(e.to_string()),
        }
    }

    /// Pods of the cluster with this role label selector, not being deleted, by name.
    async fn pods_where(&self, selector: &str) -> Result<Vec<Pod>, String> {
        let list = self
            .pods
            .list(&ListParams::default().labels(&format!(
                "app.kubernetes.io/instance={},{selector}",
                self.name
            )))
            .await
            .map_err(|e| e.to_string())?;
        let mut pods: Vec<Pod> = list
            .items
            .into_iter()
            .filter(|p| p.metadata.deletion_timestamp.is_none())
            .collect();
        pods.sort_by(|a, b| a.metadata.name.cmp(&b.metadata.name));
        Ok(pods)
    }

    /// Member pods that are not being deleted.
    async fn live_pods(&self) -> Result<Vec<Pod>, String> {
        self.pods_where("!etcd.database.coreos.com/role").await
    }

    async fn endpoints(&self) -> Result<Vec<String>, String> {
        Ok(self
            .live_pods()
            .await?
            .iter()
            .filter_map(pod_endpoint)
            .collect())
    }

    async fn etcdctl(&self, endpoints: &[String], args: &[&str]) -> Result<String, String> {
        run_etcdctl(&self.etcdctl, endpoints, args).await
    }

    /// Keys under `prefix` through `endpoint`, at `revision` when given.
    async fn keys(
        &self,
        endpoint: &str,
        prefix: &str,
        revision: Option<i64>,
    ) -> anyhow::Result<BTreeSet<String>> {
        let rev = revision.map(|r| format!("--rev={r}"));
        let mut args = vec!["get", prefix, "--prefix", "--keys-only"];
        args.extend(rev.as_deref());
        let text = self
            .etcdctl(&[endpoint.to_owned()], &args)
            .await
            .map_err(anyhow::Error::msg)?;
        Ok(text
            .lines()
            .filter(|l| !l.trim().is_empty())
            .map(str::to_owned)
            .collect())
    }

    /// Waits until the cluster has `size` Ready members, as the status, the pods and etcd
    /// agree, and every endpoint is healthy.
    async fn wait_converged(&self, size: usize) -> anyhow::Result<()> {
        let started = Instant::now();
        eventually(
            &format!(
                "{}/{} to converge to {size} members",
                self.namespace, self.name
            ),
            CONVERGE,
            || async {
                let cluster = self.cluster().await?;
                let status = &cluster["status"];
                if status["ready"] != json!(format!("{size}/{size}"))
                    || status["phase"] != json!("Running")
                    || status["members"].as_array().map(Vec::len) != Some(size)
                {
                    return Err(format!("status: {status}"));
                }
                let pods = self.live_pods().await?;
                if pods.len() != size || !pods.iter().all(pod_ready) {
                    return Err(format!("{} pods, not all Ready", pods.len()));
                }
                for endpoint in pods.iter().filter_map(pod_endpoint) {
                    let text = self
                        .etcdctl(
                            std::slice::from_ref(&endpoint),
                            &["member", "list", "-w", "json"],
                        )
                        .await?;
                    let list: Value =
                        serde_json::from_str(&text).map_err(|e| format!("{e}: {text}"))?;
                    let members = list["members"].as_array().cloned().unwrap_or_default();
                    if members.len() != size || members.iter().any(|m| m["isLearner"] == true) {
                        return Err(format!("member list from {endpoint}: {members:?}"));
                    }
                    let health = self
                        .etcdctl(std::slice::from_ref(&endpoint), &["endpoint", "health"])
                        .await?;
                    if !health.contains("is healthy") {
                        return Err(health);
                    }
                }
                Ok(())
            },
        )
        .await?;
        eprintln!(
            "[{}] {} converged to {size} members in {:.1} s",
            self.namespace,
            self.name,
            started.elapsed().as_secs_f64()
        );
        Ok(())
    }

    /// Status and pod logs, for a failing test's output.
    async fn dump(&self) {
        if let Ok(cluster) = self.cluster().await {
            eprintln!(
                "[{}] {} status: {}",
                self.namespace, self.name, cluster["status"]
            );
        }
        for pod in [format!("{}-backup", self.name), format!("{}-0", self.name)] {
            let logs = self.env.pod_runner().pod_logs(&self.namespace, &pod);
            let tail: Vec<&str> = logs.lines().rev().take(20).collect();
            eprintln!(
                "[{}] {pod} last log lines (newest first):\n{}",
                self.namespace,
                tail.join("\n")
            );
        }
    }

    async fn finish(mut self, outcome: anyhow::Result<()>) -> anyhow::Result<()> {
        if outcome.is_err() {
            self.dump().await;
        }
        eprintln!(
            "[{}] test took {:.1} s",
            self.namespace,
            self.started.elapsed().as_secs_f64()
        );
        if let Some(host) = self.host.take() {
            host.stop().await;
        }
        for name in [NAME, RESTORED] {
            let _ = self
                .clusters
                .delete(name, &DeleteParams::background())
                .await;
        }
        outcome
    }
}

fn pod_endpoint(pod: &Pod) -> Option<String> {
    let ip = pod.status.as_ref()?.pod_ip.clone()?;
    Some(format!("http://{ip}:2379"))
}

fn pod_ready(pod: &Pod) -> bool {
    pod.status
        .as_ref()
        .and_then(|s| s.conditions.as_ref())
        .is_some_and(|c| c.iter().any(|c| c.type_ == "Ready" && c.status == "True"))
}

async fn run_etcdctl(
    etcdctl: &Path,
    endpoints: &[String],
    args: &[&str],
) -> Result<String, String> {
    if endpoints.is_empty() {
        return Err(format!("etcdctl {args:?}: no endpoint"));
    }
    let output = tokio::process::Command::new(etcdctl)
        .arg(format!("--endpoints={}", endpoints.join(",")))
        .args(["--dial-timeout=2s", "--command-timeout=5s"])
        .args(args)
        .kill_on_drop(true)
        .output()
        .await
        .map_err(|e| format!("running {}: {e}", etcdctl.display()))?;
    if !output.status.success() {
        return Err(format!(
            "etcdctl {args:?} against {endpoints:?} failed: {}",
            String::from_utf8_lossy(&output.stderr).trim()
        ));
    }
    Ok(String::from_utf8_lossy(&output.stdout).into_owned())
}

/// Writes `key-<n>` keys, one every 250 ms, until stopped: the revision keeps moving while
/// snapshots are taken. Returns how many etcd acknowledged.
async fn write_until_stopped(
    etcdctl: PathBuf,
    endpoints: Vec<String>,
    stop: Arc<AtomicBool>,
) -> usize {
    let mut pace = tokio::time::interval(Duration::from_millis(250));
    let mut n = 0;
    while !stop.load(Ordering::Relaxed) {
        pace.tick().await;
        let key = format!("key-{n:06}");
        if run_etcdctl(&etcdctl, &endpoints, &["put", &key, "v"])
            .await
            .is_ok()
        {
            n += 1;
        }
    }
    n
}

/// A MinIO server on `MINIO_IP` with its data in a directory of its own; killed and its
/// directory removed on drop.
struct Minio {
    /// `http://127.254.0.1:<port>`.
    endpoint: String,
    mc: PathBuf,
    dir: PathBuf,
    _server: tokio::process::Child,
}

impl Minio {
    /// Builds MinIO and mc if needed, starts the server on a free port and waits until its
    /// liveness endpoint answers.
    async fn start(binaries: &Binaries) -> anyhow::Result<Minio> {
        let build = binaries.clone();
        tokio::task::spawn_blocking(move || build.ensure_s3()).await??;
        let mc = binaries
            .mc()
            .ok_or_else(|| anyhow::anyhow!("mc is missing after building it"))?;
        let port = TcpListener::bind(SocketAddr::from((MINIO_IP, 0)))?
            .local_addr()?
            .port();
        let console = TcpListener::bind(SocketAddr::from((MINIO_IP, 0)))?
            .local_addr()?
            .port();
        let dir =
            std::env::temp_dir().join(format!("policy-host-minio-{}-{port}", std::process::id()));
        std::fs::create_dir_all(&dir)?;
        let server = tokio::process::Command::new(binaries.minio())
            .arg("server")
            .arg(&dir)
            .args(["--address", &format!("{MINIO_IP}:{port}")])
            .args(["--console-address", &format!("{MINIO_IP}:{console}")])
            .arg("--quiet")
            .env("MINIO_ROOT_USER", ACCESS_KEY)
            .env("MINIO_ROOT_PASSWORD", SECRET_KEY)
            .env("MINIO_BROWSER", "off")
            .stdout(std::process::Stdio::null())
            .kill_on_drop(true)
            .spawn()?;
        let minio = Minio {
            endpoint: format!("http://{MINIO_IP}:{port}"),
            mc,
            dir,
            _server: server,
        };
        let http = reqwest::Client::builder()
            .timeout(Duration::from_secs(2))
            .build()?;
        let live = format!("{}/minio/health/live", minio.endpoint);
        eventually("MinIO to be live", Duration::from_secs(60), || async {
            match http.get(&live).send().await {
                Ok(answer) if answer.status().is_success() => Ok(()),
                Ok(answer) => Err(format!("{live}: {}", answer.status())),
                Err(e) => Err(format!("{live}: {e}")),
            }
        })
        .await?;
        Ok(minio)
    }

    /// Runs `mc <args>` against this server (alias `s3`) and returns its stdout.
    async fn mc(&self, args: &[&str]) -> anyhow::Result<Vec<u8>> {
        let host = self
            .endpoint
            .replacen("://", &format!("://{ACCESS_KEY}:{SECRET_KEY}@"), 1);
        let output = tokio::process::Command::new(&self.mc)
            .arg("--config-dir")
            .arg(self.dir.join(".mc"))
            .args(args)
            .env("MC_HOST_s3", host)
            .kill_on_drop(true)
            .output()
            .await?;
        anyhow::ensure!(
            output.status.success(),
            "mc {args:?} failed: {}",
            String::from_utf8_lossy(&output.stderr).trim()
        );
        Ok(output.stdout)
    }

    /// Object names in `bucket`, recursively.
    async fn objects(&self, bucket: &str) -> anyhow::Result<BTreeSet<String>> {
        let text = self
            .mc(&["ls", "--json", "--recursive", &format!("s3/{bucket}")])
            .await?;
        String::from_utf8_lossy(&text)
            .lines()
            .filter(|l| !l.trim().is_empty())
            .map(|line| {
                let entry: Value = serde_json::from_str(line)?;
                entry["key"]
                    .as_str()
                    .map(str::to_owned)
                    .ok_or_else(|| anyhow::anyhow!("no key in {line}"))
            })
            .collect()
    }
}

impl Drop for Minio {
    fn drop(&mut self) {
        // The server is killed by its handle (`kill_on_drop`); its data goes with it.
        let _ = std::fs::remove_dir_all(&self.dir);
    }
}

/// `status.backup.snapshots` of a cluster object.
fn snapshots(cluster: &Value) -> Vec<Value> {
    cluster["status"]["backup"]["snapshots"]
        .as_array()
        .cloned()
        .unwrap_or_default()
}

/// SHA-256 of a file, as `sha256sum` prints it.
async fn sha256(path: &Path) -> anyhow::Result<String> {
    let output = tokio::process::Command::new("sha256sum")
        .arg(path)
        .output()
        .await?;
    anyhow::ensure!(output.status.success(), "sha256sum {}", path.display());
    String::from_utf8_lossy(&output.stdout)
        .split_whitespace()
        .next()
        .map(str::to_owned)
        .ok_or_else(|| anyhow::anyhow!("sha256sum printed nothing for {}", path.display()))
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn snapshots_go_to_s3_keeping_n_and_a_new_cluster_restores_from_it() -> anyhow::Result<()> {
    let mut fixture = Fixture::start("etcd-s3", "3.6").await?;
    let outcome = async {
        let minio = Minio::start(fixture.env.binaries()).await?;
        minio.mc(&["mb", &format!("s3/{BUCKET}")]).await?;
        let secrets: Api<Secret> = Api::namespaced(fixture.env.client().await?, &fixture.namespace);
        let credentials: Secret = serde_json::from_value(json!({
            "metadata": {"name": "s3-credentials"},
            "stringData": {"accessKeyID": ACCESS_KEY, "secretAccessKey": SECRET_KEY},
        }))?;
        secrets.create(&PostParams::default(), &credentials).await?;
        let s3 = json!({"endpoint": minio.endpoint, "bucket": BUCKET, "prefix": PREFIX,
                        "credentialsSecret": "s3-credentials"});

        let version = etcd_version(fixture.env, "3.6")?;
        fixture
            .create_cluster_with(json!({
                "size": 3, "version": version,
                "backup": {"storage": {"size": "1Gi"}, "keep": 2, "s3": s3},
            }))
            .await?;
        fixture.wait_converged(3).await?;
        let endpoints = fixture.endpoints().await.map_err(anyhow::Error::msg)?;
        fixture
            .etcdctl(&endpoints, &["put", "key-first", "v"])
            .await
            .map_err(anyhow::Error::msg)?;
        let stop = Arc::new(AtomicBool::new(false));
        let writer = tokio::spawn(write_until_stopped(
            fixture.etcdctl.clone(),
            endpoints.clone(),
            stop.clone(),
        ));
        fixture
            .patch_spec(json!({"backup": {"every": EVERY}}))
            .await?;

        // Three scheduled snapshots, each appearing at the head of the list.
        let mut taken: Vec<Value> = Vec::new();
        let schedule_started = Instant::now();
        while taken.len() < 3 {
            let last = taken.last().cloned();
            let newest = eventually(
                "the next uploaded snapshot",
                Duration::from_secs(60),
                || async {
                    let cluster = fixture.cluster().await?;
                    match snapshots(&cluster).first() {
                        Some(newest) if Some(newest) != last.as_ref() => Ok(newest.clone()),
                        _ => Err(format!("status.backup: {}", cluster["status"]["backup"])),
                    }
                },
            )
            .await?;
            taken.push(newest);
        }
        eprintln!(
            "[{}] 3 uploaded snapshots in {:.1} s",
            fixture.namespace,
            schedule_started.elapsed().as_secs_f64()
        );
        stop.store(true, Ordering::Relaxed);
        anyhow::ensure!(writer.await? > 0, "the writer wrote nothing");

        // Stop the schedule and let a snapshot in flight finish: claim and bucket at rest.
        fixture
            .patch_spec(json!({"backup": {"every": null}}))
            .await?;
        let cluster = eventually(
            "the schedule to stop and the backup pod to go",
            CONVERGE,
            || async {
                let cluster = fixture.cluster().await?;
                let backup = &cluster["status"]["backup"];
                let pods = fixture
                    .pods_where("etcd.database.coreos.com/role=backup")
                    .await?;
                if backup.get("nextScheduledTime").is_some() || !pods.is_empty() {
                    return Err(format!(
                        "{} backup pods; status.backup: {backup}",
                        pods.len()
                    ));
                }
                Ok(cluster)
            },
        )
        .await?;
        let backup = &cluster["status"]["backup"];
        anyhow::ensure!(backup["phase"] == "Succeeded", "{backup}");
        let kept = snapshots(&cluster);
        anyhow::ensure!(kept.len() == 2, "exactly keep=2 listed: {backup}");

        // The bucket holds exactly the two listed snapshots, named as their slot files, each
        // byte-equal to the claim's file, and status says where each one is.
        let files: Vec<String> = kept
            .iter()
            .filter_map(|s| s["file"].as_str().map(str::to_owned))
            .collect();
        let wanted: BTreeSet<String> = files.iter().map(|f| format!("{PREFIX}{f}")).collect();
        let objects = minio.objects(BUCKET).await?;
        anyhow::ensure!(
            objects == wanted,
            "bucket {BUCKET} holds {objects:?}, status lists {files:?}"
        );
        let claim = fixture
            .env
            .pod_runner()
            .claim_dir(&fixture.namespace, &format!("backup-{NAME}"));
        let scratch = minio.dir.join("downloaded");
        std::fs::create_dir_all(&scratch)?;
        for snapshot in &kept {
            let file = snapshot["file"].as_str().unwrap_or_default();
            anyhow::ensure!(
                snapshot["location"] == json!(format!("s3://{BUCKET}/{PREFIX}{file}")),
                "{snapshot}"
            );
            let object = minio
                .mc(&["cat", &format!("s3/{BUCKET}/{PREFIX}{file}")])
                .await?;
            let downloaded = scratch.join(file);
            std::fs::write(&downloaded, &object)?;
            let (in_claim, in_bucket) =
                (sha256(&claim.join(file)).await?, sha256(&downloaded).await?);
            anyhow::ensure!(
                !object.is_empty() && in_claim == in_bucket,
                "{file}: sha256 {in_claim} in the claim, {in_bucket} in the bucket ({} bytes)",
                object.len()
            );
            eprintln!(
                "[{}] {} ({} bytes, sha256 {in_bucket}) = claim's {file}",
                fixture.namespace,
                snapshot["location"],
                object.len()
            );
        }

        // The newest snapshot restores from the bucket alone: the claim's copy is gone.
        let newer = &kept[0];
        let file = newer["file"].as_str().unwrap_or_default().to_owned();
        std::fs::remove_file(claim.join(&file))?;
        let revision = newer["revision"].as_i64().unwrap_or_default();
        let at_newer = fixture.keys(&endpoints[0], "key-", Some(revision)).await?;
        anyhow::ensure!(!at_newer.is_empty(), "no keys at revision {revision}");
        fixture.name = RESTORED.to_owned();
        fixture
            .create_cluster_with(json!({
                "size": 1, "version": version,
                "restore": {"s3": {"endpoint": minio.endpoint, "bucket": BUCKET,
                    "key": format!("{PREFIX}{file}"), "credentialsSecret": "s3-credentials"}},
            }))
            .await?;
        fixture.wait_converged(1).await?;
        let restored_endpoints = fixture.endpoints().await.map_err(anyhow::Error::msg)?;
        let restored = fixture.keys(&restored_endpoints[0], "key-", None).await?;
        anyhow::ensure!(
            restored == at_newer,
            "restored {} keys, the source had {} at revision {revision}",
            restored.len(),
            at_newer.len()
        );
        Ok(())
    }
    .await;
    fixture.finish(outcome).await
}
