//! Faults of one member on the real node, while a client writes (issue 13 items 3 and 6):
//!
//! - **a network partition**: the member's pod loses its network (its `eth0` down, inside its
//!   network namespace). The other two keep the quorum and keep acknowledging writes; the host
//!   sees the member NotReady and does not replace it (a partition is not a failed pod); after
//!   the network heals the member catches up and the membership is the one from before;
//! - **a killed process**: the member's container is SIGKILLed through containerd, as a crash
//!   or the OOM killer would end it. The kubelet restarts it in place (same pod, same data), it
//!   rejoins as the same member, and the host replaces nothing.
//!
//! Either way every acknowledged write is there, read from the member that was hurt.
//!
//! Runs policy-host in-process against the real node's control plane, with the etcd plugin;
//! the members are real Pods on containerd.

use std::collections::BTreeSet;
use std::path::PathBuf;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::time::Duration;

use k8s_openapi::api::core::v1::Pod;
use kube::api::{Api, DynamicObject, ListParams, Patch, PatchParams};
use policy_host::decide::Limits;
use policy_host_e2e::etcd::{etcd_clusters, eventually, pod_endpoint, pod_ready, run_etcdctl};
use policy_host_e2e::{HostUnderTest, init_logging, install_crd};
use policy_host_testenv::network::cut_pod_network;
use policy_host_testenv::{TestEnv, TestNamespace, shared_node};
use serde_json::{Value, json};
use tokio::task::JoinHandle;

const NAME: &str = "split";
const CONVERGE: Duration = Duration::from_secs(180);
/// Writes acknowledged before a test stops its writer (more than `holds_every_key` asks for).
const WRITES: usize = 20;

/// Reconciles the host has started (its own metrics).
fn reconciles(host: &HostUnderTest) -> u64 {
    host.running
        .metrics
        .render()
        .lines()
        .filter(|l| l.starts_with("policy_host_reconciles_total{"))
        .filter_map(|l| l.rsplit(' ').next()?.parse::<f64>().ok())
        .sum::<f64>() as u64
}

/// A 3-member EtcdCluster `NAME` on the real node, reconciled by an in-process host.
struct Cluster {
    env: &'static TestEnv,
    host: HostUnderTest,
    namespace: TestNamespace,
    clusters: Api<DynamicObject>,
    pods: Api<Pod>,
    etcdctl: PathBuf,
}

impl Cluster {
    /// Starts the host in a fresh namespace and waits until the cluster is 3/3.
    async fn of_three(prefix: &str) -> anyhow::Result<Cluster> {
        let env = shared_node().await?;
        let client = env.client().await?;
        install_crd(&client, "deploy/crds/etcdcluster.yaml").await?;
        let namespace = env.create_namespace(prefix).await?;
        let version = policy_host_e2e::apps::default_etcd_version(env)?
            .trim_start_matches('v')
            .to_owned();
        let etcdctl = policy_host_e2e::apps::etcd_dir(
            env,
            &policy_host_e2e::apps::default_etcd_version(env)?,
        )
        .ok_or_else(|| anyhow::anyhow!("etcd {version} is not built"))?
        .join("etcdctl");
        let plugin =
            policy_host_test_plugins::build("guest-etcd").map_err(|e| anyhow::anyhow!("{e}"))?;
        let settings = policy_host::Settings {
            policy_files: vec![plugin],
            ..HostUnderTest::settings(&namespace, Limits::default())?
        };
        let host = HostUnderTest::start_with_client(client.clone(), settings).await?;
        let cluster = Cluster {
            env,
            host,
            clusters: Api::namespaced_with(client.clone(), &namespace, &etcd_clusters()),
            pods: Api::namespaced(client, &namespace),
            namespace,
            etcdctl,
        };
        let manifest = json!({
            "apiVersion": "etcd.database.coreos.com/v1beta2", "kind": "EtcdCluster",
            "metadata": {"name": NAME}, "spec": {"size": 3, "version": version},
        });
        cluster
            .clusters
            .patch(
                NAME,
                &PatchParams::apply("e2e").force(),
                &Patch::Apply(&manifest),
            )
            .await?;
        cluster.ready("3/3 on the real node", 3).await?;
        Ok(cluster)
    }

    async fn members(&self) -> Result<Vec<Pod>, String> {
        self.pods
            .list(&ListParams::default().labels(&format!("app.kubernetes.io/instance={NAME}")))
            .await
            .map(|l| l.items)
            .map_err(|e| e.to_string())
    }

    /// The member `NAME-<n>`'s pod.
    async fn member(&self, n: u32) -> anyhow::Result<Pod> {
        let name = format!("{NAME}-{n}");
        self.members()
            .await
            .map_err(anyhow::Error::msg)?
            .into_iter()
            .find(|p| p.metadata.name.as_deref() == Some(name.as_str()))
            .ok_or_else(|| anyhow::anyhow!("no pod {name}"))
    }

    /// etcd's own member IDs, asked of the Ready members.
    async fn member_ids(&self) -> Result<BTreeSet<String>, String> {
        let endpoints: Vec<String> = self
            .members()
            .await?
            .iter()
            .filter(|p| pod_ready(p))
            .filter_map(pod_endpoint)
            .collect();
        let text =
            run_etcdctl(&self.etcdctl, &endpoints, &["member", "list", "-w", "json"]).await?;
        let list: Value = serde_json::from_str(&text).map_err(|e| e.to_string())?;
        Ok(list["members"]
            .as_array()
            .into_iter()
            .flatten()
            .map(|m| m["ID"].to_string())
            .collect())
    }

    async fn status(&self) -> Result<Value, String> {
        self.clusters
            .get(NAME)
            .await
            .map(|c| c.data["status"].clone())
            .map_err(|e| e.to_string())
    }

    /// Waits until the status says `ready`/3 (all Ready: and phase Running) and as many pods
    /// are Ready.
    async fn ready(&self, what: &str, ready: usize) -> anyhow::Result<()> {
        eventually(what, CONVERGE, || async {
            let status = self.status().await?;
            let pods = self
                .members()
                .await?
                .iter()
                .filter(|p| pod_ready(p))
                .count();
            if status["ready"] == json!(format!("{ready}/3"))
                && (ready < 3 || status["phase"] == "Running")
                && pods == ready
            {
                Ok(())
            } else {
                Err(format!("status {status}, {pods} pods Ready"))
            }
        })
        .await
    }

    /// The writer: one key at a time through every member, each acknowledged key kept, until
    /// [`Writer::finish`].
    async fn start_writer(&self) -> anyhow::Result<Writer> {
        let stop = Arc::new(AtomicBool::new(false));
        let count = Arc::new(AtomicUsize::new(0));
        let endpoints: Vec<String> = self
            .members()
            .await
            .map_err(anyhow::Error::msg)?
            .iter()
            .filter_map(pod_endpoint)
            .collect();
        let handle = tokio::spawn({
            let (stop, count, etcdctl) = (stop.clone(), count.clone(), self.etcdctl.clone());
            async move {
                let mut acknowledged = Vec::new();
                let mut n = 0u32;
                while !stop.load(Ordering::Relaxed) {
                    let key = format!("w-{n:05}");
                    if run_etcdctl(&etcdctl, &endpoints, &["put", &key, "v"])
                        .await
                        .is_ok()
                    {
                        acknowledged.push(key);
                        count.store(acknowledged.len(), Ordering::Relaxed);
                    }
                    n += 1;
                    // The write rate, not a wait for anything.
                    tokio::time::sleep(Duration::from_millis(100)).await;
                }
                acknowledged
            }
        });
        Ok(Writer {
            stop,
            count,
            handle,
        })
    }

    /// Waits until the member at `endpoint` holds every acknowledged key; returns how many
    /// keys it holds.
    async fn holds_every_key(
        &self,
        endpoint: &str,
        acknowledged: &[String],
    ) -> anyhow::Result<usize> {
        anyhow::ensure!(
            acknowledged.len() > 10,
            "only {} writes acknowledged",
            acknowledged.len()
        );
        let endpoint = endpoint.to_owned();
        eventually(
            "the hurt member holds every acknowledged key",
            CONVERGE,
            || async {
                let text = run_etcdctl(
                    &self.etcdctl,
                    std::slice::from_ref(&endpoint),
                    &["get", "w-", "--prefix", "--keys-only"],
                )
                .await?;
                let keys: BTreeSet<&str> = text.lines().filter(|l| !l.is_empty()).collect();
                let missing = acknowledged
                    .iter()
                    .filter(|k| !keys.contains(k.as_str()))
                    .count();
                if missing == 0 {
                    Ok(keys.len())
                } else {
                    Err(format!("{missing} acknowledged keys missing"))
                }
            },
        )
        .await
    }
}

/// A client writing through the test, and what etcd acknowledged.
struct Writer {
    stop: Arc<AtomicBool>,
    count: Arc<AtomicUsize>,
    handle: JoinHandle<Vec<String>>,
}

impl Writer {
    /// Stops the writer once etcd has acknowledged at least `writes` of its keys (on a busy
    /// machine a fault can be over before a slow client wrote much); returns the keys.
    async fn finish(self, writes: usize) -> anyhow::Result<Vec<String>> {
        let count = self.count.clone();
        eventually(
            &format!("{writes} writes acknowledged"),
            CONVERGE,
            || async {
                let now = count.load(Ordering::Relaxed);
                (now >= writes)
                    .then_some(())
                    .ok_or_else(|| format!("{now} so far"))
            },
        )
        .await?;
        self.stop.store(true, Ordering::Relaxed);
        Ok(self.handle.await?)
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_partitioned_member_is_not_replaced_and_no_acknowledged_write_is_lost()
-> anyhow::Result<()> {
    init_logging();
    let cluster = Cluster::of_three("etcd-partition").await?;
    let outcome = async {
        let ids = cluster.member_ids().await.map_err(anyhow::Error::msg)?;
        anyhow::ensure!(ids.len() == 3, "{ids:?}");
        let writer = cluster.start_writer().await?;

        // Cut member 2 off.
        let victim = cluster.member(2).await?;
        let victim_ip = victim
            .status
            .as_ref()
            .and_then(|s| s.pod_ip.clone())
            .ok_or_else(|| anyhow::anyhow!("{NAME}-2 has no IP"))?;
        let cut = cut_pod_network(&victim_ip)?;
        cluster
            .ready("the partitioned member reported NotReady", 2)
            .await?;
        // Several decisions made while it is partitioned: none replaced it.
        let seen = reconciles(&cluster.host);
        eventually(
            "three more decisions during the partition",
            CONVERGE,
            || async {
                let now = reconciles(&cluster.host);
                (now >= seen + 3)
                    .then_some(())
                    .ok_or_else(|| format!("{now} reconciles"))
            },
        )
        .await?;
        let during = cluster.members().await.map_err(anyhow::Error::msg)?;
        anyhow::ensure!(
            during.iter().any(|p| p.metadata.uid == victim.metadata.uid
                && p.metadata.deletion_timestamp.is_none()),
            "the partitioned member's pod was deleted"
        );
        anyhow::ensure!(
            cluster.member_ids().await.map_err(anyhow::Error::msg)? == ids,
            "the membership changed during the partition"
        );

        cut.heal()?;
        cluster.ready("3/3 after healing", 3).await?;
        let acknowledged = writer.finish(WRITES).await?;
        anyhow::ensure!(
            cluster.member_ids().await.map_err(anyhow::Error::msg)? == ids,
            "the membership changed"
        );
        let keys = cluster
            .holds_every_key(&format!("http://{victim_ip}:2379"), &acknowledged)
            .await?;
        eprintln!(
            "[{}] partition: {} writes acknowledged, {keys} keys on the healed member",
            cluster.namespace,
            acknowledged.len()
        );
        Ok(())
    }
    .await;
    cluster.host.stop().await;
    outcome
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_killed_member_restarts_in_place_and_no_acknowledged_write_is_lost() -> anyhow::Result<()>
{
    init_logging();
    let cluster = Cluster::of_three("etcd-killed").await?;
    let outcome = async {
        let ids = cluster.member_ids().await.map_err(anyhow::Error::msg)?;
        anyhow::ensure!(ids.len() == 3, "{ids:?}");
        let writer = cluster.start_writer().await?;

        // SIGKILL member 1's etcd through containerd.
        let victim = cluster.member(1).await?;
        let container = victim
            .status
            .as_ref()
            .and_then(|s| s.container_statuses.as_ref())
            .and_then(|c| c.first())
            .ok_or_else(|| anyhow::anyhow!("{NAME}-1 has no container status"))?
            .clone();
        let container_id = container
            .container_id
            .ok_or_else(|| anyhow::anyhow!("{NAME}-1's container has no id"))?;
        cluster.env.kill_container(&container_id)?;

        // The kubelet restarts it in place; it rejoins as the same member.
        eventually("the killed member restarted", CONVERGE, || async {
            let pod = cluster.member(1).await.map_err(|e| e.to_string())?;
            let restarts = pod
                .status
                .as_ref()
                .and_then(|s| s.container_statuses.as_ref())
                .and_then(|c| c.first())
                .map_or(0, |c| c.restart_count);
            (restarts > container.restart_count && pod_ready(&pod))
                .then_some(())
                .ok_or_else(|| format!("{restarts} restarts, Ready {}", pod_ready(&pod)))
        })
        .await?;
        cluster.ready("3/3 after the restart", 3).await?;
        let acknowledged = writer.finish(WRITES).await?;
        let after = cluster.member(1).await?;
        anyhow::ensure!(
            after.metadata.uid == victim.metadata.uid,
            "the killed member's pod was replaced, not restarted"
        );
        anyhow::ensure!(
            cluster.member_ids().await.map_err(anyhow::Error::msg)? == ids,
            "the membership changed"
        );
        let endpoint = pod_endpoint(&after).ok_or_else(|| anyhow::anyhow!("no IP"))?;
        let keys = cluster.holds_every_key(&endpoint, &acknowledged).await?;
        eprintln!(
            "[{}] killed member: {} writes acknowledged, {keys} keys on the restarted member",
            cluster.namespace,
            acknowledged.len()
        );
        Ok(())
    }
    .await;
    cluster.host.stop().await;
    outcome
}
