//! A network partition on the real node (issue 13 item 6): one member of a 3-member
//! EtcdCluster loses its network (its pod's `eth0` down, inside its network namespace) while a
//! client writes. The other two keep the quorum and keep acknowledging writes; the host sees
//! the member NotReady and does not replace it (a partition is not a failed pod); after the
//! network heals the member catches up, the membership is the one from before, and every
//! acknowledged write is there.
//!
//! Runs policy-host in-process against the real node's control plane, with the etcd plugin;
//! the members are real Pods on containerd.

use std::collections::BTreeSet;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::Duration;

use k8s_openapi::api::core::v1::Pod;
use kube::api::{Api, DynamicObject, ListParams, Patch, PatchParams};
use policy_host::decide::Limits;
use policy_host_e2e::etcd::{etcd_clusters, eventually, pod_endpoint, pod_ready, run_etcdctl};
use policy_host_e2e::{HostUnderTest, init_logging, install_crd};
use policy_host_testenv::network::cut_pod_network;
use policy_host_testenv::shared_node;
use serde_json::{Value, json};

const NAME: &str = "split";
const CONVERGE: Duration = Duration::from_secs(180);

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

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_partitioned_member_is_not_replaced_and_no_acknowledged_write_is_lost()
-> anyhow::Result<()> {
    init_logging();
    let env = shared_node().await?;
    let client = env.client().await?;
    install_crd(&client, "deploy/crds/etcdcluster.yaml").await?;
    let namespace = env.create_namespace("etcd-partition").await?;
    let version = env
        .binaries()
        .default_etcd_version()
        .trim_start_matches('v')
        .to_owned();
    let etcdctl = env
        .binaries()
        .etcd_dir(env.binaries().default_etcd_version())
        .ok_or_else(|| anyhow::anyhow!("etcd {version} is not built"))?
        .join("etcdctl");
    let plugin =
        policy_host_test_plugins::build("guest-etcd").map_err(|e| anyhow::anyhow!("{e}"))?;
    let settings = policy_host::Settings {
        policy_files: vec![plugin],
        ..HostUnderTest::settings(&namespace, Limits::default())?
    };
    let host = HostUnderTest::start_with_client(client.clone(), settings).await?;
    let clusters: Api<DynamicObject> =
        Api::namespaced_with(client.clone(), &namespace, &etcd_clusters());
    let pods: Api<Pod> = Api::namespaced(client.clone(), &namespace);
    let members = || async {
        pods.list(&ListParams::default().labels(&format!("app.kubernetes.io/instance={NAME}")))
            .await
            .map(|l| l.items)
            .map_err(|e| e.to_string())
    };
    let member_ids = || async {
        let endpoints: Vec<String> = members()
            .await?
            .iter()
            .filter(|p| pod_ready(p))
            .filter_map(pod_endpoint)
            .collect();
        let text = run_etcdctl(&etcdctl, &endpoints, &["member", "list", "-w", "json"]).await?;
        let list: Value = serde_json::from_str(&text).map_err(|e| e.to_string())?;
        Ok::<BTreeSet<String>, String>(
            list["members"]
                .as_array()
                .into_iter()
                .flatten()
                .map(|m| m["ID"].to_string())
                .collect(),
        )
    };
    let status = || async {
        clusters
            .get(NAME)
            .await
            .map(|c| c.data["status"].clone())
            .map_err(|e| e.to_string())
    };

    let outcome = async {
        let cluster = json!({
            "apiVersion": "etcd.database.coreos.com/v1beta2", "kind": "EtcdCluster",
            "metadata": {"name": NAME}, "spec": {"size": 3, "version": version},
        });
        clusters
            .patch(
                NAME,
                &PatchParams::apply("e2e").force(),
                &Patch::Apply(&cluster),
            )
            .await?;
        eventually("3/3 on the real node", CONVERGE, || async {
            let status = status().await?;
            let ready = members().await?.iter().filter(|p| pod_ready(p)).count();
            if status["ready"] == "3/3" && status["phase"] == "Running" && ready == 3 {
                Ok(())
            } else {
                Err(format!("status {status}, {ready} pods Ready"))
            }
        })
        .await?;
        let ids = member_ids().await.map_err(anyhow::Error::msg)?;
        anyhow::ensure!(ids.len() == 3, "{ids:?}");

        // The writer: one key at a time through every member, each acknowledged key kept.
        let stop = Arc::new(AtomicBool::new(false));
        let endpoints: Vec<String> = members()
            .await
            .map_err(anyhow::Error::msg)?
            .iter()
            .filter_map(pod_endpoint)
            .collect();
        let writer = tokio::spawn({
            let (stop, etcdctl, endpoints) = (stop.clone(), etcdctl.clone(), endpoints.clone());
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
                    }
                    n += 1;
                    tokio::time::sleep(Duration::from_millis(100)).await;
                }
                acknowledged
            }
        });

        // Cut member 2 off.
        let victim = members()
            .await
            .map_err(anyhow::Error::msg)?
            .into_iter()
            .find(|p| p.metadata.name.as_deref() == Some(&format!("{NAME}-2")))
            .ok_or_else(|| anyhow::anyhow!("no {NAME}-2"))?;
        let victim_ip = victim
            .status
            .and_then(|s| s.pod_ip)
            .ok_or_else(|| anyhow::anyhow!("{NAME}-2 has no IP"))?;
        let cut = cut_pod_network(&victim_ip)?;
        eventually(
            "the partitioned member reported NotReady",
            CONVERGE,
            || async {
                let status = status().await?;
                (status["ready"] == "2/3")
                    .then_some(())
                    .ok_or_else(|| format!("status {status}"))
            },
        )
        .await?;
        // Several decisions made while it is partitioned: none replaced it.
        let seen = reconciles(&host);
        eventually(
            "three more decisions during the partition",
            CONVERGE,
            || async {
                (reconciles(&host) >= seen + 3)
                    .then_some(())
                    .ok_or_else(|| format!("{} reconciles", reconciles(&host)))
            },
        )
        .await?;
        let during = members().await.map_err(anyhow::Error::msg)?;
        anyhow::ensure!(
            during.iter().any(|p| p.metadata.uid == victim.metadata.uid
                && p.metadata.deletion_timestamp.is_none()),
            "the partitioned member's pod was deleted"
        );
        anyhow::ensure!(
            member_ids().await.map_err(anyhow::Error::msg)? == ids,
            "the membership changed during the partition"
        );

        cut.heal()?;
        eventually("3/3 after healing", CONVERGE, || async {
            let status = status().await?;
            (status["ready"] == "3/3")
                .then_some(())
                .ok_or_else(|| format!("status {status}"))
        })
        .await?;
        stop.store(true, Ordering::Relaxed);
        let acknowledged = writer.await?;
        anyhow::ensure!(
            member_ids().await.map_err(anyhow::Error::msg)? == ids,
            "the membership changed"
        );
        anyhow::ensure!(
            acknowledged.len() > 10,
            "only {} writes acknowledged",
            acknowledged.len()
        );
        // Every acknowledged key, read from the member that was cut off (it caught up).
        let healed = format!("http://{victim_ip}:2379");
        let keys = eventually(
            "the healed member holds every acknowledged key",
            CONVERGE,
            || async {
                let text = run_etcdctl(
                    &etcdctl,
                    std::slice::from_ref(&healed),
                    &["get", "w-", "--prefix", "--keys-only"],
                )
                .await?;
                let keys: BTreeSet<String> = text
                    .lines()
                    .filter(|l| !l.is_empty())
                    .map(str::to_owned)
                    .collect();
                let missing = acknowledged.iter().filter(|k| !keys.contains(*k)).count();
                if missing == 0 {
                    Ok(keys.len())
                } else {
                    Err(format!("{missing} acknowledged keys missing"))
                }
            },
        )
        .await?;
        eprintln!(
            "[{namespace}] partition: {} writes acknowledged, {keys} keys on the healed member",
            acknowledged.len()
        );
        Ok(())
    }
    .await;
    host.stop().await;
    outcome
}
