//! An etcd fixture for the end-to-end suites of the etcd plugin's backups: a namespace, the
//! CRD, the plugin and a host in-process against the shared control plane, one EtcdCluster
//! looked at through the API and a real etcd client (`etcdctl`), and waiting helpers.

use std::collections::BTreeSet;
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::{Duration, Instant};

use k8s_openapi::api::core::v1::Pod;
use kube::api::{Api, ApiResource, DeleteParams, DynamicObject, ListParams, Patch, PatchParams};
use kube::core::GroupVersionKind;
use policy_host::decide::Limits;
use policy_host_testenv::{TestEnv, TestNamespace, shared_node};
use serde_json::{Value, json};

use crate::{HostUnderTest, init_logging, install_crd};

/// How long the creation of a cluster may take to converge.
pub const CONVERGE: Duration = Duration::from_secs(120);

/// The EtcdCluster resource (`etcd.database.coreos.com/v1beta2`).
pub fn etcd_clusters() -> ApiResource {
    ApiResource::from_gvk_with_plural(
        &GroupVersionKind::gvk("etcd.database.coreos.com", "v1beta2", "EtcdCluster"),
        "etcdclusters",
    )
}

/// Polls `check` every 200 ms until it returns `Ok`, for at most `timeout`; on timeout the
/// error carries the last reason `check` gave.
pub async fn eventually<T, F, Fut>(what: &str, timeout: Duration, mut check: F) -> anyhow::Result<T>
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
pub fn etcd_version(env: &TestEnv, minor: &str) -> anyhow::Result<String> {
    crate::apps::etcd_versions(env)
        .iter()
        .map(|v| v.trim_start_matches('v').to_owned())
        .find(|v| v.starts_with(&format!("{minor}.")))
        .ok_or_else(|| {
            anyhow::anyhow!(
                "no etcd {minor}.x in the test environment ({:?}); declare one in guest-etcd/test-images.yaml",
                crate::apps::etcd_versions(env)
            )
        })
}

/// One test's EtcdCluster, its namespace, the host reconciling it and an etcd client.
pub struct EtcdFixture {
    /// The shared test environment.
    pub env: &'static TestEnv,
    /// The EtcdCluster the helpers look at.
    pub name: String,
    /// When the fixture started (after the shared environment was up).
    pub started: Instant,
    /// The test's own namespace.
    pub namespace: TestNamespace,
    /// The host under test, until `finish`.
    pub host: Option<HostUnderTest>,
    /// EtcdClusters of the namespace.
    pub clusters: Api<DynamicObject>,
    /// Pods of the namespace.
    pub pods: Api<Pod>,
    /// The etcdctl binary of the chosen version.
    pub etcdctl: PathBuf,
}

impl EtcdFixture {
    /// A namespace `<prefix>-…`, the CRD, the etcd plugin and a host; no cluster yet. The
    /// helpers look at the EtcdCluster `name`; `etcdctl_minor` picks the client version.
    pub async fn start(
        prefix: &str,
        etcdctl_minor: &str,
        name: &str,
    ) -> anyhow::Result<EtcdFixture> {
        Self::start_with_plugins(
            prefix,
            etcdctl_minor,
            name,
            &[("guest-etcd", "etcdcluster")],
        )
        .await
    }

    /// As [`EtcdFixture::start`], the host loading each `(plugin package, CRD file stem in
    /// deploy/crds/)` of `plugins`.
    pub async fn start_with_plugins(
        prefix: &str,
        etcdctl_minor: &str,
        name: &str,
        plugins: &[(&str, &str)],
    ) -> anyhow::Result<EtcdFixture> {
        init_logging();
        let env = shared_node().await?;
        let client = env.client().await?;
        let mut files = Vec::new();
        for (package, crd) in plugins {
            install_crd(&client, &format!("deploy/crds/{crd}.yaml")).await?;
            files.push(
                policy_host_test_plugins::build(package).map_err(|e| anyhow::anyhow!("{e}"))?,
            );
        }
        let namespace = env.create_namespace(prefix).await?;
        let host = HostUnderTest::start(env, &files, &namespace, Limits::default()).await?;
        let version = etcd_version(env, etcdctl_minor)?;
        let etcdctl = crate::apps::etcd_dir(env, &format!("v{version}"))
            .ok_or_else(|| anyhow::anyhow!("etcd {version} is not in the test environment"))?
            .join("etcdctl");
        Ok(EtcdFixture {
            env,
            name: name.to_owned(),
            started: Instant::now(),
            clusters: Api::namespaced_with(client.clone(), &namespace, &etcd_clusters()),
            pods: Api::namespaced(client.clone(), &namespace),
            namespace,
            host: Some(host),
            etcdctl,
        })
    }

    /// Server-side applies the EtcdCluster `name` with this spec.
    pub async fn create_cluster_with(&self, spec: Value) -> anyhow::Result<()> {
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

    /// Merge-patches the spec of the EtcdCluster `name`.
    pub async fn patch_spec(&self, spec: Value) -> anyhow::Result<()> {
        self.clusters
            .patch(
                &self.name,
                &PatchParams::default(),
                &Patch::Merge(&json!({"spec": spec})),
            )
            .await?;
        Ok(())
    }

    /// The EtcdCluster `name` as JSON.
    pub async fn cluster(&self) -> Result<Value, String> {
        match self.clusters.get_opt(&self.name).await {
            Ok(Some(object)) => serde_json::to_value(&object).map_err(|e| e.to_string()),
            Ok(None) => Err("the EtcdCluster does not exist".into()),
            Err(e) => Err(e.to_string()),
        }
    }

    /// Pods of the cluster with this role label selector, not being deleted, by name.
    pub async fn pods_where(&self, selector: &str) -> Result<Vec<Pod>, String> {
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
    pub async fn live_pods(&self) -> Result<Vec<Pod>, String> {
        self.pods_where("!etcd.database.coreos.com/role").await
    }

    /// `http://<pod IP>:2379` of the live member pods that have an IP.
    pub async fn endpoints(&self) -> Result<Vec<String>, String> {
        Ok(self
            .live_pods()
            .await?
            .iter()
            .filter_map(pod_endpoint)
            .collect())
    }

    /// Runs the fixture's etcdctl against `endpoints`.
    pub async fn etcdctl(&self, endpoints: &[String], args: &[&str]) -> Result<String, String> {
        run_etcdctl(&self.etcdctl, endpoints, args).await
    }

    /// Keys under `prefix` through `endpoint`, at `revision` when given.
    pub async fn keys(
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

    /// `etcdctl endpoint hashkv --rev=<revision>` of one member.
    pub async fn hash_kv(&self, endpoint: &str, revision: i64) -> anyhow::Result<u64> {
        let text = self
            .etcdctl(
                &[endpoint.to_owned()],
                &[
                    "endpoint",
                    "hashkv",
                    &format!("--rev={revision}"),
                    "-w",
                    "json",
                ],
            )
            .await
            .map_err(anyhow::Error::msg)?;
        let answer: Value = serde_json::from_str(&text)?;
        answer[0]["HashKV"]["hash"]
            .as_u64()
            .ok_or_else(|| anyhow::anyhow!("no hash in {text}"))
    }

    /// Waits until the cluster has `size` Ready members, as the status, the pods and etcd
    /// agree, and every endpoint is healthy.
    pub async fn wait_converged(&self, size: usize) -> anyhow::Result<()> {
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
                    || status["etcdMembers"].as_array().map(Vec::len) != Some(size)
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
    pub async fn dump(&self) {
        if let Ok(cluster) = self.cluster().await {
            eprintln!(
                "[{}] {} status: {}",
                self.namespace, self.name, cluster["status"]
            );
        }
        for pod in [format!("{}-backup", self.name), format!("{}-0", self.name)] {
            let logs = self.env.pod_logs(&self.namespace, &pod).await;
            let tail: Vec<&str> = logs.lines().rev().take(20).collect();
            eprintln!(
                "[{}] {pod} last log lines (newest first):\n{}",
                self.namespace,
                tail.join("\n")
            );
        }
    }

    /// Dumps status and logs if `outcome` failed, stops the host and deletes `clusters`.
    pub async fn finish(
        mut self,
        outcome: anyhow::Result<()>,
        clusters: &[&str],
    ) -> anyhow::Result<()> {
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
        for name in clusters {
            let _ = self
                .clusters
                .delete(name, &DeleteParams::background())
                .await;
        }
        outcome
    }
}

/// `http://<pod IP>:2379`, once the pod has an IP.
pub fn pod_endpoint(pod: &Pod) -> Option<String> {
    let ip = pod.status.as_ref()?.pod_ip.clone()?;
    Some(format!("http://{ip}:2379"))
}

/// Whether the pod's `Ready` condition is `True`.
pub fn pod_ready(pod: &Pod) -> bool {
    pod.status
        .as_ref()
        .and_then(|s| s.conditions.as_ref())
        .is_some_and(|c| c.iter().any(|c| c.type_ == "Ready" && c.status == "True"))
}

/// Runs `etcdctl --endpoints=… args`, with short timeouts; its stdout, or why it failed.
pub async fn run_etcdctl(
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
pub async fn write_until_stopped(
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

/// `status.backup.snapshots` of a cluster object.
pub fn snapshots(cluster: &Value) -> Vec<Value> {
    cluster["status"]["backup"]["snapshots"]
        .as_array()
        .cloned()
        .unwrap_or_default()
}
