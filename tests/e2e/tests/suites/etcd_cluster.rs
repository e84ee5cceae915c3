//! The etcd plugin end to end: a real kube-apiserver, the pod runner running real etcd
//! processes, policy-host in-process with the compiled `guest-etcd` component, and assertions
//! through a real etcd client (`etcdctl`).

use std::path::PathBuf;
use std::process::Command;
use std::time::Duration;

use k8s_openapi::api::core::v1::{Pod, Service};
use kube::api::{Api, ApiResource, DeleteParams, DynamicObject, ListParams, Patch, PatchParams};
use kube::core::GroupVersionKind;
use policy_host::decide::Limits;
use policy_host_e2e::{HostUnderTest, init_logging, install_crd};
use policy_host_testenv::{TestEnv, TestNamespace, shared_node, wait_for};
use serde_json::{Value, json};

const CONVERGE: Duration = Duration::from_secs(240);

fn etcd_clusters() -> ApiResource {
    ApiResource::from_gvk_with_plural(
        &GroupVersionKind::gvk("etcd.database.coreos.com", "v1beta2", "EtcdCluster"),
        "etcdclusters",
    )
}

/// The example from deploy/examples, with the etcd version this environment runs.
fn example_cluster(version: &str, size: i64) -> anyhow::Result<Value> {
    let text = std::fs::read_to_string(
        policy_host_e2e::repo_root().join("deploy/examples/etcd-cluster.yaml"),
    )?;
    let mut cluster: Value = serde_yaml::from_str(&text)?;
    cluster["spec"]["version"] = json!(version.trim_start_matches('v'));
    cluster["spec"]["size"] = json!(size);
    Ok(cluster)
}

async fn setup(
    prefix: &str,
) -> anyhow::Result<(&'static TestEnv, kube::Client, TestNamespace, HostUnderTest)> {
    init_logging();
    let env = shared_node().await?;
    let client = env.client().await?;
    install_crd(&client, "deploy/crds/etcdcluster.yaml").await?;
    let namespace = env.create_namespace(prefix).await?;
    let plugin =
        policy_host_test_plugins::build("guest-etcd").map_err(|e| anyhow::anyhow!("{e}"))?;
    let host = HostUnderTest::start(env, &[plugin], &namespace, Limits::default()).await?;
    Ok((env, client, namespace, host))
}

fn etcdctl(env: &TestEnv, version: &str) -> anyhow::Result<PathBuf> {
    let dir = policy_host_e2e::apps::etcd_dir(env, version)
        .ok_or_else(|| anyhow::anyhow!("etcd {version} is not in the test environment"))?;
    Ok(dir.join("etcdctl"))
}

/// Runs etcdctl against one endpoint and parses its JSON output.
fn etcdctl_json(etcdctl: &PathBuf, endpoint: &str, args: &[&str]) -> anyhow::Result<Value> {
    let output = Command::new(etcdctl)
        .args([
            "--endpoints",
            endpoint,
            "--dial-timeout=3s",
            "--command-timeout=5s",
            "-w",
            "json",
        ])
        .args(args)
        .output()?;
    if !output.status.success() {
        anyhow::bail!(
            "etcdctl {args:?} against {endpoint} failed: {}",
            String::from_utf8_lossy(&output.stderr)
        );
    }
    Ok(serde_json::from_slice(&output.stdout)?)
}

fn etcdctl_text(etcdctl: &PathBuf, endpoint: &str, args: &[&str]) -> anyhow::Result<String> {
    let output = Command::new(etcdctl)
        .args([
            "--endpoints",
            endpoint,
            "--dial-timeout=3s",
            "--command-timeout=5s",
        ])
        .args(args)
        .output()?;
    if !output.status.success() {
        anyhow::bail!(
            "etcdctl {args:?} against {endpoint} failed: {}",
            String::from_utf8_lossy(&output.stderr)
        );
    }
    Ok(String::from_utf8_lossy(&output.stdout).into_owned())
}

async fn member_pods(
    client: &kube::Client,
    namespace: &str,
    cluster: &str,
) -> anyhow::Result<Vec<Pod>> {
    let pods: Api<Pod> = Api::namespaced(client.clone(), namespace);
    let list = pods
        .list(&ListParams::default().labels(&format!("app.kubernetes.io/instance={cluster}")))
        .await?;
    Ok(list.items)
}

fn pod_endpoint(pod: &Pod) -> Option<String> {
    let ip = pod.status.as_ref()?.pod_ip.clone()?;
    Some(format!("http://{ip}:2379"))
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn example_cluster_of_three_becomes_three_etcd_members() -> anyhow::Result<()> {
    let (env, client, namespace, host) = setup("etcd-three").await?;
    let version = policy_host_e2e::apps::default_etcd_version(env)?;
    let clusters: Api<DynamicObject> =
        Api::namespaced_with(client.clone(), &namespace, &etcd_clusters());
    let cluster = example_cluster(&version, 3)?;
    let name = cluster["metadata"]["name"]
        .as_str()
        .unwrap_or("example-etcd-cluster")
        .to_string();
    let applied = std::time::Instant::now();
    clusters
        .patch(
            &name,
            &PatchParams::apply("e2e").force(),
            &Patch::Apply(&cluster),
        )
        .await?;

    // READY 3/3 in the printer column's field, phase Running.
    let status = wait_for(
        &format!("{namespace}/{name} to report 3/3 ready"),
        CONVERGE,
        || async {
            let object = clusters.get_opt(&name).await.ok().flatten()?;
            let status = object.data.get("status")?.clone();
            (status["ready"] == json!("3/3") && status["phase"] == json!("Running"))
                .then_some(status)
        },
    )
    .await?;
    // A figure for BENCHMARKS.md, printed with --nocapture (not asserted: timing is no test).
    eprintln!(
        "figure: apply -> READY 3/3 took {:.1} s",
        applied.elapsed().as_secs_f64()
    );
    assert_eq!(
        status["etcdMembers"].as_array().map(Vec::len),
        Some(3),
        "{status}"
    );

    // etcd itself agrees: 3 started voting members, one cluster ID seen from every member.
    let etcdctl = etcdctl(env, &version)?;
    let pods = member_pods(&client, &namespace, &name).await?;
    assert_eq!(pods.len(), 3, "three member pods");
    let mut cluster_ids = Vec::new();
    for pod in &pods {
        let endpoint = pod_endpoint(pod).ok_or_else(|| anyhow::anyhow!("pod without IP"))?;
        let list = etcdctl_json(&etcdctl, &endpoint, &["member", "list"])?;
        let members = list["members"].as_array().cloned().unwrap_or_default();
        assert_eq!(members.len(), 3, "member list from {endpoint}: {list}");
        for member in &members {
            assert!(
                member["name"].as_str().is_some_and(|n| !n.is_empty()),
                "every member started: {member}"
            );
            assert_ne!(
                member["isLearner"],
                json!(true),
                "no learner left: {member}"
            );
        }
        cluster_ids.push(list["header"]["cluster_id"].clone());
        let health = etcdctl_text(&etcdctl, &endpoint, &["endpoint", "health"])?;
        assert!(health.contains("is healthy"), "{health}");
    }
    cluster_ids.dedup();
    assert_eq!(cluster_ids.len(), 1, "one cluster ID: {cluster_ids:?}");

    // Data written through one member is read through another.
    let first = pod_endpoint(&pods[0]).unwrap_or_default();
    let last = pod_endpoint(&pods[2]).unwrap_or_default();
    etcdctl_text(&etcdctl, &first, &["put", "greeting", "hello from e2e"])?;
    let read = etcdctl_text(&etcdctl, &last, &["get", "greeting", "--print-value-only"])?;
    assert_eq!(read.trim(), "hello from e2e");

    // Deleting the EtcdCluster removes its pods and services (owner-reference GC).
    clusters.delete(&name, &DeleteParams::foreground()).await?;
    let pods_api: Api<Pod> = Api::namespaced(client.clone(), &namespace);
    let services: Api<Service> = Api::namespaced(client.clone(), &namespace);
    let selector = format!("app.kubernetes.io/instance={name}");
    wait_for(
        "pods and services of the deleted cluster to be gone",
        Duration::from_secs(180),
        || async {
            let pods = pods_api
                .list(&ListParams::default().labels(&selector))
                .await
                .ok()?;
            let services = services.list(&ListParams::default()).await.ok()?;
            let left = pods.items.len()
                + services
                    .items
                    .iter()
                    .filter(|s| {
                        s.metadata
                            .name
                            .as_deref()
                            .is_some_and(|n| n.starts_with(&name))
                    })
                    .count();
            (left == 0).then_some(())
        },
    )
    .await?;
    host.stop().await;
    Ok(())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn invalid_spec_gets_a_degraded_condition_and_an_event() -> anyhow::Result<()> {
    let (env, client, namespace, host) = setup("etcd-invalid").await?;
    let version = policy_host_e2e::apps::default_etcd_version(env)?;
    let clusters: Api<DynamicObject> =
        Api::namespaced_with(client.clone(), &namespace, &etcd_clusters());
    // What the object shows by itself is refused at apply by the CRD's CEL rules (README,
    // "Validation"): size 0 never reaches the plugin.
    let mut zero = example_cluster(&version, 0)?;
    zero["metadata"]["name"] = json!("zero-size");
    let refused = clusters
        .patch(
            "zero-size",
            &PatchParams::apply("e2e").force(),
            &Patch::Apply(&zero),
        )
        .await
        .expect_err("size 0 is refused by the API server");
    assert!(
        refused.to_string().contains("spec.size"),
        "the refusal says what to fix: {refused}"
    );

    // What needs more than the object's fields (here: the names its children would get) is
    // the plugin's to refuse: a condition and an Event, and nothing applied.
    let bad_name = format!("bad-{}", "x".repeat(56));
    let mut bad = example_cluster(&version, 3)?;
    bad["metadata"]["name"] = json!(bad_name);
    clusters
        .patch(
            &bad_name,
            &PatchParams::apply("e2e").force(),
            &Patch::Apply(&bad),
        )
        .await?;

    let condition = wait_for(
        "the long-named cluster to be Degraded with InvalidSpec",
        CONVERGE,
        || async {
            let object = clusters.get_opt(&bad_name).await.ok().flatten()?;
            let conditions = object.data["status"]["conditions"].as_array()?.clone();
            conditions.into_iter().find(|c| {
                c["type"] == json!("Degraded")
                    && c["status"] == json!("True")
                    && c["reason"] == json!("InvalidSpec")
            })
        },
    )
    .await?;
    assert!(
        condition["message"]
            .as_str()
            .is_some_and(|m| m.contains("metadata.name") && m.contains("at most 56 characters")),
        "the message says what to fix: {condition}"
    );

    let events: Api<k8s_openapi::api::events::v1::Event> =
        Api::namespaced(client.clone(), &namespace);
    wait_for(
        "a Warning event about the invalid spec",
        CONVERGE,
        || async {
            let list = events.list(&ListParams::default()).await.ok()?;
            list.items
                .into_iter()
                .find(|e| {
                    e.regarding.as_ref().and_then(|r| r.name.as_deref()) == Some(bad_name.as_str())
                        && e.type_.as_deref() == Some("Warning")
                })
                .map(|_| ())
        },
    )
    .await?;
    // No member pods for a rejected spec.
    assert!(
        member_pods(&client, &namespace, &bad_name)
            .await?
            .is_empty()
    );
    host.stop().await;
    Ok(())
}
