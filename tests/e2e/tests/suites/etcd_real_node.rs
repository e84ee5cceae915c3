//! The etcd plugin's create, scale, replace and upgrade on the real node (kubelet,
//! containerd, CNI, CoreDNS), the host in-process: how long each takes where members are real Pods
//! with real sandboxes, networks and DNS (issue 16's targets; BENCHMARKS.md records the
//! figures this prints). Asserts the outcome, not the time.

use std::path::Path;
use std::time::{Duration, Instant};

use k8s_openapi::api::core::v1::Pod;
use kube::api::{Api, DeleteParams, DynamicObject, ListParams, Patch, PatchParams};
use policy_host::decide::Limits;
use policy_host_e2e::etcd::{etcd_clusters, eventually, pod_endpoint, pod_ready, run_etcdctl};
use policy_host_e2e::{HostUnderTest, init_logging, install_crd};
use policy_host_testenv::shared_node;
use serde_json::{Value, json};

const NAME: &str = "timed";
const MOVING: &str = "moving";
const CONVERGE: Duration = Duration::from_secs(180);

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn create_three_and_scale_to_five_on_the_real_node() -> anyhow::Result<()> {
    init_logging();
    let env = shared_node().await?;
    let client = env.client().await?;
    install_crd(&client, "deploy/crds/etcdcluster.yaml").await?;
    let namespace = env.create_namespace("etcd-real-node").await?;
    let version = policy_host_e2e::apps::default_etcd_version(env)?
        .trim_start_matches('v')
        .to_owned();
    let etcdctl =
        policy_host_e2e::apps::etcd_dir(env, &policy_host_e2e::apps::default_etcd_version(env)?)
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
    let converged =
        |size: usize| cluster_converged(&clusters, &pods, &etcdctl, NAME, size, &version);
    let outcome = async {
        let cluster = json!({
            "apiVersion": "etcd.database.coreos.com/v1beta2", "kind": "EtcdCluster",
            "metadata": {"name": NAME}, "spec": {"size": 3, "version": version},
        });
        let applied = Instant::now();
        clusters
            .patch(NAME, &PatchParams::apply("e2e").force(), &Patch::Apply(&cluster))
            .await?;
        eventually("3/3", CONVERGE, || converged(3)).await?;
        let created = applied.elapsed();
        let resize = |size: usize, what: &'static str| {
            let (clusters, converged) = (&clusters, &converged);
            async move {
                let started = Instant::now();
                clusters
                    .patch(
                        NAME,
                        &PatchParams::default(),
                        &Patch::Merge(&json!({"spec": {"size": size}})),
                    )
                    .await?;
                eventually(what, CONVERGE, || converged(size)).await?;
                anyhow::Ok(started.elapsed())
            }
        };
        let scaled_right_after = resize(5, "5/5").await?;

        // Back to 3, then 3 -> 5 again once the cluster is in a steady state: every member
        // connected to every voter for longer than etcd's 5 s `HealthInterval`, the rule that
        // refused the first scale's `member add` right after the create. The wait is for that
        // state (3/3 seen, then held for 6 s), not a pause standing in for one.
        let shrunk = resize(3, "back to 3/3").await?;
        let settled_since = Instant::now();
        eventually("3/3 held past etcd's 5 s health window", CONVERGE, || {
            let check = converged(3);
            async move {
                check.await?;
                if settled_since.elapsed() < Duration::from_secs(6) {
                    return Err("3/3, within etcd's health window".to_owned());
                }
                Ok(())
            }
        })
        .await?;
        let steady = resize(5, "5/5 again").await?;
        println!(
            "figure: real node, etcd {version}: apply -> 3/3 {:.1} s; scale 3 -> 5 right after {:.1} s; 5 -> 3 {:.1} s; scale 3 -> 5 in steady state {:.1} s",
            created.as_secs_f64(),
            scaled_right_after.as_secs_f64(),
            shrunk.as_secs_f64(),
            steady.as_secs_f64()
        );
        Ok(())
    }
    .await;
    host.stop().await;
    outcome
}

/// The EtcdCluster `name` is `size/size` Running at `version`, as many live pods are Ready
/// (all of them running `version`), and etcd's own member list has exactly `size` voters.
async fn cluster_converged(
    clusters: &Api<DynamicObject>,
    pods: &Api<Pod>,
    etcdctl: &Path,
    name: &str,
    size: usize,
    version: &str,
) -> Result<(), String> {
    let cluster = clusters.get(name).await.map_err(|e| e.to_string())?;
    let status = &cluster.data["status"];
    if status["ready"] != json!(format!("{size}/{size}"))
        || status["phase"] != "Running"
        || status["currentVersion"] != json!(version)
    {
        return Err(format!("status {status}"));
    }
    let live = member_pods(pods, name).await?;
    if live.iter().any(|p| {
        p.spec
            .as_ref()
            .and_then(|s| s.containers.first())
            .and_then(|c| c.image.as_deref())
            .and_then(|image| image.rsplit_once(':'))
            .is_none_or(|(_, tag)| tag.trim_start_matches('v') != version)
    }) {
        return Err(format!("a member pod does not run etcd {version} yet"));
    }
    let endpoints: Vec<String> = live
        .iter()
        .filter(|p| pod_ready(p))
        .filter_map(pod_endpoint)
        .collect();
    if endpoints.len() != size {
        return Err(format!("{} Ready pods", endpoints.len()));
    }
    let text = run_etcdctl(etcdctl, &endpoints, &["member", "list", "-w", "json"]).await?;
    let list: Value = serde_json::from_str(&text).map_err(|e| e.to_string())?;
    let members = list["members"].as_array().cloned().unwrap_or_default();
    if members.len() != size || members.iter().any(|m| m["isLearner"] == true) {
        return Err(format!("members {members:?}"));
    }
    Ok(())
}

/// The live (not terminating) member pods of the cluster `name`.
async fn member_pods(pods: &Api<Pod>, name: &str) -> Result<Vec<Pod>, String> {
    Ok(pods
        .list(&ListParams::default().labels(&format!("app.kubernetes.io/instance={name}")))
        .await
        .map_err(|e| e.to_string())?
        .items
        .into_iter()
        .filter(|p| p.metadata.deletion_timestamp.is_none())
        .collect())
}

/// The two other convergence scenarios of BENCHMARKS.md on the real node: a member's Pod
/// deleted for good (its data with it) and replaced by a fresh member, and a rolling upgrade
/// of the three members from the older etcd to the newer. Asserts the outcome; prints the
/// times.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn replace_a_lost_member_and_upgrade_on_the_real_node() -> anyhow::Result<()> {
    init_logging();
    let env = shared_node().await?;
    let client = env.client().await?;
    install_crd(&client, "deploy/crds/etcdcluster.yaml").await?;
    let namespace = env.create_namespace("etcd-real-node-moves").await?;
    let versions = policy_host_e2e::apps::etcd_versions(env);
    anyhow::ensure!(
        versions.len() >= 2,
        "guest-etcd/test-images.yaml declares two etcd versions, the newer first"
    );
    let (newer, older) = (
        versions[0].trim_start_matches('v').to_owned(),
        versions[1].trim_start_matches('v').to_owned(),
    );
    // One etcdctl reads both versions' member lists.
    let etcdctl = policy_host_e2e::apps::etcd_dir(env, &versions[0])
        .ok_or_else(|| anyhow::anyhow!("etcd {newer} is not built"))?
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

    let outcome = async {
        let cluster = json!({
            "apiVersion": "etcd.database.coreos.com/v1beta2", "kind": "EtcdCluster",
            "metadata": {"name": MOVING}, "spec": {"size": 3, "version": older},
        });
        clusters
            .patch(MOVING, &PatchParams::apply("e2e").force(), &Patch::Apply(&cluster))
            .await?;
        eventually("3/3 on the older etcd", CONVERGE, || {
            cluster_converged(&clusters, &pods, &etcdctl, MOVING, 3, &older)
        })
        .await?;

        // A member lost for good: its Pod deleted at once, its emptyDir data gone with it.
        let victim = member_pods(&pods, MOVING)
            .await
            .map_err(anyhow::Error::msg)?
            .into_iter()
            .next()
            .ok_or_else(|| anyhow::anyhow!("no member pod"))?;
        let victim_uid = victim.metadata.uid.clone().unwrap_or_default();
        let lost_at = Instant::now();
        pods.delete(
            victim.metadata.name.as_deref().unwrap_or_default(),
            &DeleteParams {
                grace_period_seconds: Some(0),
                ..DeleteParams::default()
            },
        )
        .await?;
        eventually("3/3 with a fresh member", CONVERGE, || {
            let (clusters, pods, etcdctl, older, victim_uid) =
                (&clusters, &pods, &etcdctl, &older, &victim_uid);
            async move {
                cluster_converged(clusters, pods, etcdctl, MOVING, 3, older).await?;
                let live = member_pods(pods, MOVING).await?;
                if live
                    .iter()
                    .any(|p| p.metadata.uid.as_deref() == Some(victim_uid.as_str()))
                {
                    return Err("the lost member's pod is still listed".to_owned());
                }
                Ok(())
            }
        })
        .await?;
        let replaced = lost_at.elapsed();

        let upgraded_at = Instant::now();
        clusters
            .patch(
                MOVING,
                &PatchParams::default(),
                &Patch::Merge(&json!({"spec": {"version": newer}})),
            )
            .await?;
        eventually("3/3 on the newer etcd", CONVERGE, || {
            cluster_converged(&clusters, &pods, &etcdctl, MOVING, 3, &newer)
        })
        .await?;
        println!(
            "figure: real node: replace 1 lost member {:.1} s; rolling upgrade of 3 members {older} -> {newer} {:.1} s",
            replaced.as_secs_f64(),
            upgraded_at.elapsed().as_secs_f64()
        );
        Ok(())
    }
    .await;
    host.stop().await;
    outcome
}
