//! A chaos drill on real etcd: the etcd plugin loaded from a ConfigMap whose grants allow
//! chaos, a size-3 `emptyDir` EtcdCluster annotated `policy-host.io/chaos: kill-pod every=1s`,
//! and a writer. Every second is far faster than a member is replaced (add a learner, catch up,
//! promote: several seconds), so the drill is only safe because the host evicts (the plugin's
//! PodDisruptionBudget holds, the pod gets its grace period) and skips its turns until the last
//! victim is back (review M7): quorum is never lost, writes keep being acknowledged between
//! kills, and after the drill every acknowledged write is there. Removing the annotation stops
//! the drill.
//!
//! Runs policy-host in-process against the shared test environment, in a namespace of its own.

use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::{Duration, Instant};

use k8s_openapi::api::core::v1::{ConfigMap, Pod};
use k8s_openapi::api::events::v1::Event;
use kube::api::{Api, DynamicObject, ListParams, Patch, PatchParams};
use policy_host::capability::scope::Grants;
use policy_host::decide::Limits;
use policy_host::plugin_cli::{self, PackRequest};
use policy_host_e2e::etcd::{
    etcd_clusters, etcd_version, eventually, pod_endpoint, pod_ready, run_etcdctl,
};
use policy_host_e2e::{HostUnderTest, init_logging, install_crd};
use policy_host_testenv::shared_node;
use serde_json::{Value, json};

const NAME: &str = "drilled";
/// Far shorter than a member's replacement: the host, not the period, must keep the kills apart.
const EVERY: &str = "1s";
const KILLS: usize = 3;
/// How long the kills may take: each waits for the previous victim's replacement.
const KILLING: Duration = Duration::from_secs(300);
/// Longest time without an acknowledged write: an election and a client's reconnect, never a
/// quorum loss.
const LONGEST_GAP: Duration = Duration::from_secs(20);
const CONVERGE: Duration = Duration::from_secs(180);

/// Member pods of the cluster (not being deleted).
async fn members(pods: &Api<Pod>) -> Result<Vec<Pod>, String> {
    let list = pods
        .list(&ListParams::default().labels(&format!("app.kubernetes.io/instance={NAME}")))
        .await
        .map_err(|e| e.to_string())?;
    Ok(list
        .items
        .into_iter()
        .filter(|p| p.metadata.deletion_timestamp.is_none())
        .collect())
}

async fn converged(clusters: &Api<DynamicObject>, pods: &Api<Pod>) -> Result<(), String> {
    let cluster = clusters.get(NAME).await.map_err(|e| e.to_string())?;
    let status = &cluster.data["status"];
    let live = members(pods).await?;
    if status["ready"] == "3/3"
        && status["phase"] == "Running"
        && live.len() == 3
        && live.iter().all(pod_ready)
    {
        Ok(())
    } else {
        Err(format!("status {status}, {} live pods", live.len()))
    }
}

/// The kills recorded by `ChaosPodKilled` Events on the cluster, oldest first, one note per
/// kill. A kill of a pod name already killed once (a replaced member keeps its name) has the
/// same note, and Kubernetes folds repeats into one Event whose `series.count` counts them:
/// each is a kill.
async fn kills(events: &Api<Event>) -> Vec<String> {
    let mut found: Vec<(String, String)> = events
        .list(&ListParams::default())
        .await
        .map(|l| l.items)
        .unwrap_or_default()
        .into_iter()
        .filter(|e| {
            e.reason.as_deref() == Some("ChaosPodKilled")
                && e.regarding.as_ref().and_then(|r| r.name.as_deref()) == Some(NAME)
        })
        .flat_map(|e| {
            let at = e.event_time.map(|t| t.0.to_string()).unwrap_or_default();
            let count = e.series.as_ref().map_or(1, |s| s.count.max(1));
            let note = e.note.unwrap_or_default();
            (0..count).map(move |_| (at.clone(), note.clone()))
        })
        .collect();
    found.sort();
    found.into_iter().map(|(_, note)| note).collect()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_chaos_drill_kills_members_and_loses_no_acknowledged_write() -> anyhow::Result<()> {
    init_logging();
    let env = shared_node().await?;
    let client = env.client().await?;
    install_crd(&client, "deploy/crds/etcdcluster.yaml").await?;
    let namespace = env.create_namespace("etcd-chaos").await?;
    let version = etcd_version(env, "3.6")?;
    let etcdctl = policy_host_e2e::apps::etcd_dir(env, &format!("v{version}"))
        .ok_or_else(|| anyhow::anyhow!("etcd {version} is not in the test environment"))?
        .join("etcdctl");

    // The plugin as an admin would load it: granted what it asks for, and chaos.
    let plugin =
        policy_host_test_plugins::build("guest-etcd").map_err(|e| anyhow::anyhow!("{e}"))?;
    let yaml = plugin_cli::pack(
        &plugin,
        &PackRequest {
            name: Some("plugin-etcd".into()),
            grants: Grants {
                chaos: true,
                ..Grants::default()
            },
            grant_requested: true,
            ..PackRequest::default()
        },
        &plugin_cli::host_defaults(),
    )
    .await?;
    let pack: ConfigMap = serde_yaml::from_str(&yaml)?;
    let host = HostUnderTest::start_loading_config_maps(env, &namespace, Limits::default()).await?;
    let config_maps: Api<ConfigMap> = Api::namespaced(client.clone(), &namespace);
    config_maps
        .patch(
            "plugin-etcd",
            &PatchParams::apply("etcd-chaos-e2e").force(),
            &Patch::Apply(&pack),
        )
        .await?;
    let clusters: Api<DynamicObject> =
        Api::namespaced_with(client.clone(), &namespace, &etcd_clusters());
    let pods: Api<Pod> = Api::namespaced(client.clone(), &namespace);
    let events: Api<Event> = Api::namespaced(client.clone(), &namespace);

    let outcome = async {
        let cluster = json!({
            "apiVersion": "etcd.database.coreos.com/v1beta2", "kind": "EtcdCluster",
            "metadata": {"name": NAME}, "spec": {"size": 3, "version": version},
        });
        clusters
            .patch(NAME, &PatchParams::apply("etcd-chaos-e2e").force(), &Patch::Apply(&cluster))
            .await?;
        eventually("the cluster to converge", CONVERGE, || converged(&clusters, &pods)).await?;

        // The writer: one key at a time through whichever members are live, recording each
        // acknowledged key with when it was acknowledged.
        let stop = Arc::new(AtomicBool::new(false));
        let writer = tokio::spawn({
            let (stop, pods, etcdctl) = (stop.clone(), pods.clone(), etcdctl.clone());
            async move {
                let mut acknowledged: Vec<(String, Instant)> = Vec::new();
                let mut n = 0u32;
                while !stop.load(Ordering::Relaxed) {
                    let endpoints: Vec<String> = members(&pods)
                        .await
                        .unwrap_or_default()
                        .iter()
                        .filter(|p| pod_ready(p))
                        .filter_map(pod_endpoint)
                        .collect();
                    let key = format!("chaos-{n:05}");
                    if run_etcdctl(&etcdctl, &endpoints, &["put", &key, "v"]).await.is_ok() {
                        acknowledged.push((key, Instant::now()));
                    }
                    n += 1;
                    tokio::time::sleep(Duration::from_millis(200)).await;
                }
                acknowledged
            }
        });

        let drill = json!({"metadata": {"annotations": {"policy-host.io/chaos": format!("kill-pod every={EVERY}")}}});
        clusters
            .patch(NAME, &PatchParams::default(), &Patch::Merge(&drill))
            .await?;
        let kill_times = eventually(
            &format!("{KILLS} chaos kills"),
            KILLING,
            || async {
                let found = kills(&events).await;
                if found.len() >= KILLS {
                    Ok(Instant::now())
                } else {
                    Err(format!("{} kills so far: {found:?}", found.len()))
                }
            },
        )
        .await?;
        let stopped = json!({"metadata": {"annotations": {"policy-host.io/chaos": null}}});
        clusters
            .patch(NAME, &PatchParams::default(), &Patch::Merge(&stopped))
            .await?;
        eventually("the cluster to converge after the drill", CONVERGE, || {
            converged(&clusters, &pods)
        })
        .await?;
        stop.store(true, Ordering::Relaxed);
        let acknowledged = writer.await?;
        let notes = kills(&events).await;
        eprintln!(
            "[{namespace}] drill: {} kills ({notes:?}), {} writes acknowledged, converged {:.1} s after the last kill",
            notes.len(),
            acknowledged.len(),
            kill_times.elapsed().as_secs_f64()
        );
        anyhow::ensure!(
            notes.iter().all(|n| n.contains(&format!("killed pod {NAME}-"))),
            "a kill named something that is not a member: {notes:?}"
        );
        anyhow::ensure!(
            acknowledged.len() > 10,
            "the cluster acknowledged only {} writes during the drill",
            acknowledged.len()
        );
        // Available throughout: a kill costs one member, the other two keep the quorum.
        let longest = acknowledged
            .windows(2)
            .map(|w| w[1].1 - w[0].1)
            .max()
            .unwrap_or_default();
        anyhow::ensure!(
            longest < LONGEST_GAP,
            "no write was acknowledged for {longest:?}"
        );
        // Never a quorum loss: no QuorumLost Event, no restore from a snapshot.
        let lost_quorum: Vec<String> = events
            .list(&ListParams::default())
            .await?
            .items
            .into_iter()
            .filter(|e| e.reason.as_deref() == Some("QuorumLost"))
            .map(|e| e.note.unwrap_or_default())
            .collect();
        anyhow::ensure!(lost_quorum.is_empty(), "quorum was lost: {lost_quorum:?}");

        // Every acknowledged key is there.
        let endpoints: Vec<String> = members(&pods)
            .await
            .map_err(anyhow::Error::msg)?
            .iter()
            .filter_map(pod_endpoint)
            .collect();
        let listed = run_etcdctl(&etcdctl, &endpoints, &["get", "chaos-", "--prefix", "--keys-only", "-w", "json"])
            .await
            .map_err(anyhow::Error::msg)?;
        let listed: Value = serde_json::from_str(&listed)?;
        let count = listed["count"].as_u64().unwrap_or(0);
        let present: std::collections::BTreeSet<String> = listed["kvs"]
            .as_array()
            .into_iter()
            .flatten()
            .filter_map(|kv| kv["key"].as_str())
            .filter_map(|k| {
                use base64::Engine;
                let bytes = base64::engine::general_purpose::STANDARD.decode(k).ok()?;
                String::from_utf8(bytes).ok()
            })
            .collect();
        let lost: Vec<&String> = acknowledged
            .iter()
            .map(|(k, _)| k)
            .filter(|k| !present.contains(*k))
            .collect();
        anyhow::ensure!(
            lost.is_empty(),
            "{} acknowledged writes lost (of {}, {count} keys in etcd): {lost:?}",
            lost.len(),
            acknowledged.len()
        );
        Ok(())
    }
    .await;
    host.stop().await;
    outcome
}
