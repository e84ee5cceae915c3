//! The etcd plugin's scheduled, verified backups on real etcd: snapshots taken every few
//! seconds rotate through `keep` slot files in the backup claim, each one listed in status
//! with the revision, size and KV hash a throwaway etcd read from it after restoring it; the
//! hashes match live members', and the older kept snapshot restores into a new cluster with
//! exactly the keys the source had at its revision. An on-demand snapshot is verified the
//! same way on etcd 3.5.
//!
//! Runs policy-host in-process against the shared control plane, in a namespace of its own,
//! and asserts through a real etcd client (`etcdctl`). The fixture helpers are copies of the
//! few `etcd_lifecycle.rs` needs here.

use std::collections::BTreeSet;
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::{Duration, Instant};

use k8s_openapi::api::core::v1::Pod;
use kube::api::{Api, ApiResource, DeleteParams, DynamicObject, ListParams, Patch, PatchParams};
use kube::core::GroupVersionKind;
use policy_host::decide::Limits;
use policy_host_e2e::{HostUnderTest, init_logging, install_crd};
use policy_host_testenv::{TestEnv, shared};
use serde_json::{Value, json};

/// How long the creation of a cluster may take to converge.
const CONVERGE: Duration = Duration::from_secs(120);
/// Name of the EtcdCluster that is backed up.
const NAME: &str = "scheduled";
/// Name of the cluster restored from one of its snapshots.
const RESTORED: &str = "from-older";
/// The schedule: short, so three snapshots take seconds; long enough that the keys written
/// in between always move the revision on.
const EVERY: &str = "4s";

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

    /// `etcdctl endpoint hashkv --rev=<revision>` of one member.
    async fn hash_kv(&self, endpoint: &str, revision: i64) -> anyhow::Result<u64> {
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

/// `status.backup.snapshots` of a cluster object.
fn snapshots(cluster: &Value) -> Vec<Value> {
    cluster["status"]["backup"]["snapshots"]
        .as_array()
        .cloned()
        .unwrap_or_default()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn scheduled_snapshots_keep_the_newest_verified_and_restore() -> anyhow::Result<()> {
    let mut fixture = Fixture::start("etcd-schedule", "3.6").await?;
    let outcome = async {
        let version = etcd_version(fixture.env, "3.6")?;
        fixture
            .create_cluster_with(json!({
                "size": 3, "version": version,
                "backup": {"storage": {"size": "1Gi"}, "keep": 2},
            }))
            .await?;
        fixture.wait_converged(3).await?;
        let endpoints = fixture.endpoints().await.map_err(anyhow::Error::msg)?;
        // The schedule starts once keys are being written, so every snapshot holds some and
        // consecutive ones (at least EVERY apart) hold different revisions.
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

        // Every scheduled snapshot as it appears at the head of the list; never more than 2.
        let mut taken: Vec<Value> = Vec::new();
        let schedule_started = Instant::now();
        while taken.len() < 3 {
            let last = taken.last().cloned();
            let newest = eventually(
                "the next scheduled snapshot",
                Duration::from_secs(60),
                || async {
                    let cluster = fixture.cluster().await?;
                    let list = snapshots(&cluster);
                    if list.len() > 2 {
                        return Ok(Err(format!("more than keep=2 listed: {list:?}")));
                    }
                    match list.first() {
                        Some(newest) if Some(newest) != last.as_ref() => Ok(Ok(newest.clone())),
                        _ => Err(format!("status.backup: {}", cluster["status"]["backup"])),
                    }
                },
            )
            .await?
            .map_err(anyhow::Error::msg)?;
            anyhow::ensure!(newest["trigger"] == "scheduled", "{newest}");
            taken.push(newest);
        }
        eprintln!(
            "[{}] 3 scheduled snapshots in {:.1} s: {taken:?}",
            fixture.namespace,
            schedule_started.elapsed().as_secs_f64()
        );
        stop.store(true, Ordering::Relaxed);
        let writes = writer.await?;
        anyhow::ensure!(writes > 0, "the writer wrote nothing");

        // Stop the schedule and let any snapshot in flight finish, so the claim is at rest.
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
        let kept = snapshots(&cluster);
        anyhow::ensure!(kept.len() == 2, "exactly keep=2 listed: {backup}");
        let (newer, older) = (&kept[0], &kept[1]);
        let revision = |s: &Value| s["revision"].as_i64().unwrap_or_default();
        anyhow::ensure!(
            revision(newer) > revision(older) && revision(older) > 0,
            "newest first, revisions moving on with the writes: {kept:?}"
        );
        anyhow::ensure!(
            newer["takenAt"].as_str() >= older["takenAt"].as_str(),
            "{kept:?}"
        );
        anyhow::ensure!(backup["lastSnapshot"] == newer["file"], "{backup}");
        anyhow::ensure!(backup["phase"] == "Succeeded", "{backup}");
        let files: BTreeSet<String> = kept
            .iter()
            .filter_map(|s| s["file"].as_str().map(str::to_owned))
            .collect();
        anyhow::ensure!(
            files == BTreeSet::from([format!("{NAME}-0.db"), format!("{NAME}-1.db")]),
            "two slots: {files:?}"
        );

        // The claim holds exactly the two listed files: no third, nothing half-written.
        let dir = fixture
            .env
            .pod_runner()
            .claim_dir(&fixture.namespace, &format!("backup-{NAME}"));
        let on_disk: BTreeSet<String> = std::fs::read_dir(&dir)?
            .map(|e| e.map(|e| e.file_name().to_string_lossy().into_owned()))
            .collect::<Result<_, _>>()?;
        anyhow::ensure!(on_disk == files, "{} holds {on_disk:?}", dir.display());
        for snapshot in &kept {
            let file = dir.join(snapshot["file"].as_str().unwrap_or_default());
            let size = std::fs::metadata(&file)?.len();
            let db_size = snapshot["size"].as_u64().unwrap_or_default();
            // The file is the database plus etcdctl's 32-byte integrity hash.
            anyhow::ensure!(
                size > 0 && db_size > 0 && db_size <= size,
                "{snapshot}: {size} bytes on disk"
            );
        }

        // Each recorded hashKV is what every live member computes at that revision.
        for snapshot in &kept {
            for endpoint in &endpoints {
                let live = fixture.hash_kv(endpoint, revision(snapshot)).await?;
                anyhow::ensure!(
                    snapshot["hashKV"].as_u64() == Some(live),
                    "{snapshot}: {endpoint} hashes revision {} as {live}",
                    revision(snapshot)
                );
            }
        }

        // The older kept snapshot restores into a new cluster holding exactly the keys the
        // source held at its revision.
        let at_older = fixture
            .keys(&endpoints[0], "key-", Some(revision(older)))
            .await?;
        let now = fixture.keys(&endpoints[0], "key-", None).await?;
        anyhow::ensure!(
            !at_older.is_empty() && at_older.len() < now.len(),
            "{} keys at the older snapshot, {} now",
            at_older.len(),
            now.len()
        );
        fixture.name = RESTORED.to_owned();
        fixture
            .create_cluster_with(json!({
                "size": 1, "version": version,
                "restore": {"claimName": format!("backup-{NAME}"), "snapshot": older["file"]},
            }))
            .await?;
        fixture.wait_converged(1).await?;
        let restored_endpoints = fixture.endpoints().await.map_err(anyhow::Error::msg)?;
        let restored = fixture.keys(&restored_endpoints[0], "key-", None).await?;
        anyhow::ensure!(
            restored == at_older,
            "restored {} keys, the source had {} at revision {}",
            restored.len(),
            at_older.len(),
            revision(older)
        );
        Ok(())
    }
    .await;
    fixture.finish(outcome).await
}

/// The same verified snapshot on etcd 3.5 (whose `etcdutl` and gateway differ in details from
/// 3.6), taken on demand, beside no schedule.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_on_demand_snapshot_is_verified_on_etcd_3_5() -> anyhow::Result<()> {
    let mut fixture = Fixture::start("etcd-backup-35", "3.5").await?;
    fixture.name = "on-demand".to_owned();
    let outcome = async {
        let version = etcd_version(fixture.env, "3.5")?;
        fixture
            .create_cluster_with(json!({
                "size": 1, "version": version, "backup": {"storage": {"size": "1Gi"}},
            }))
            .await?;
        fixture.wait_converged(1).await?;
        let endpoints = fixture.endpoints().await.map_err(anyhow::Error::msg)?;
        for n in 0..5 {
            fixture
                .etcdctl(&endpoints, &["put", &format!("key-{n}"), "v"])
                .await
                .map_err(anyhow::Error::msg)?;
        }
        fixture
            .patch_spec(json!({"backup": {"trigger": "now"}}))
            .await?;
        let snapshot = eventually("the on-demand snapshot", CONVERGE, || async {
            let cluster = fixture.cluster().await?;
            let backup = &cluster["status"]["backup"];
            match snapshots(&cluster).first() {
                Some(s) if backup["trigger"] == "now" && backup["phase"] == "Succeeded" => {
                    Ok(s.clone())
                }
                _ => Err(format!("status.backup: {backup}")),
            }
        })
        .await?;
        anyhow::ensure!(
            snapshot["file"] == "on-demand-0.db" && snapshot["trigger"] == "now",
            "{snapshot}"
        );
        let revision = snapshot["revision"].as_i64().unwrap_or_default();
        anyhow::ensure!(revision >= 6, "5 puts after creation: {snapshot}");
        let live = fixture.hash_kv(&endpoints[0], revision).await?;
        anyhow::ensure!(
            snapshot["hashKV"].as_u64() == Some(live),
            "{snapshot}: live {live}"
        );
        Ok(())
    }
    .await;
    fixture.finish(outcome).await
}
