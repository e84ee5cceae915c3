//! The host installed exactly as the README's "Running the host in a cluster" says, on the
//! real node: the README's `kubectl` commands are read from the README and run as written
//! (the `docker build` line is replaced by the image made locally from `deploy/Dockerfile`).
//! The host runs as a Pod from its image under its ServiceAccount, loads the etcd plugin from
//! its ConfigMap, and the example cluster converges; its client Service answers through
//! kube-proxy. Then the leading host pod is killed (the other replica leads within 15 s) and
//! the host is rolled out again with `kubectl rollout restart`: no write is lost and no
//! membership change is made.

use std::process::Command;
use std::time::{Duration, Instant};

use k8s_openapi::api::apps::v1::Deployment;
use k8s_openapi::api::coordination::v1::Lease;
use k8s_openapi::api::core::v1::{Pod, Service};
use kube::api::{Api, DeleteParams, DynamicObject, ListParams};
use policy_host_e2e::etcd::{etcd_clusters, eventually};
use policy_host_e2e::install::{kubectl, load_host_image, run_readme_install};
use policy_host_testenv::shared_node;

const CONVERGE: Duration = Duration::from_secs(300);

#[tokio::test]
async fn readme_install_runs_the_host_as_a_pod_and_the_example_cluster_converges()
-> anyhow::Result<()> {
    policy_host_e2e::init_logging();
    let env = shared_node().await?;
    let client = env.client().await?;
    let image = load_host_image(env)?;
    let started = Instant::now();

    let ran = run_readme_install(env)?;
    // The example EtcdCluster is the README's last command: from here on it is being created.
    let example_applied = started.elapsed();
    assert!(
        ran.iter()
            .any(|c| c.starts_with("kubectl apply -f deploy/deployment.yaml")),
        "the README installs the Deployment: {ran:?}"
    );

    let deployments: Api<Deployment> = Api::namespaced(client.clone(), "policy-host");
    let host_pods: Api<Pod> = Api::namespaced(client.clone(), "policy-host");
    let host_ready = eventually("the policy-host Deployment available", CONVERGE, || async {
        let deployment = deployments
            .get("policy-host")
            .await
            .map_err(|e| e.to_string())?;
        let status = deployment.status.unwrap_or_default();
        let ready = status.ready_replicas.unwrap_or(0);
        if ready >= 1 {
            return Ok(started.elapsed());
        }
        let pods = host_pods
            .list(&ListParams::default().labels("app.kubernetes.io/name=policy-host"))
            .await
            .map_err(|e| e.to_string())?;
        Err(format!(
            "{ready} ready; pods: {:?}",
            pods.items
                .iter()
                .map(|p| (
                    p.metadata.name.clone(),
                    p.status.as_ref().and_then(|s| s.container_statuses.clone())
                ))
                .collect::<Vec<_>>()
        ))
    })
    .await?;
    let pods = host_pods
        .list(&ListParams::default().labels("app.kubernetes.io/name=policy-host"))
        .await?;
    let host_pod = pods
        .items
        .first()
        .ok_or_else(|| anyhow::anyhow!("no policy-host pod"))?;
    let spec = host_pod.spec.clone().unwrap_or_default();
    assert_eq!(spec.service_account_name.as_deref(), Some("policy-host"));
    assert_eq!(spec.containers[0].image.as_deref(), Some(image.as_str()));

    let clusters: Api<DynamicObject> =
        Api::namespaced_with(client.clone(), "default", &etcd_clusters());
    let converged = eventually(
        "example-etcd-cluster READY 3/3, Running",
        CONVERGE,
        || async {
            let cluster = clusters
                .get("example-etcd-cluster")
                .await
                .map_err(|e| e.to_string())?;
            let status = &cluster.data["status"];
            if status["ready"] == "3/3" && status["phase"] == "Running" {
                Ok(started.elapsed())
            } else {
                Err(format!("status {status}"))
            }
        },
    )
    .await?;
    eprintln!(
        "figure: README install -> host Ready {:.1} s, example cluster 3/3 Running {:.1} s (applied -> 3/3: {:.1} s)",
        host_ready.as_secs_f64(),
        converged.as_secs_f64(),
        converged.saturating_sub(example_applied).as_secs_f64()
    );
    let listing = kubectl(env, &["get", "etcd"])?;
    assert!(
        listing.contains("example-etcd-cluster") && listing.contains("3/3"),
        "{listing}"
    );

    let services: Api<Service> = Api::namespaced(client.clone(), "default");
    let cluster_ip = services
        .get("example-etcd-cluster-client")
        .await?
        .spec
        .and_then(|s| s.cluster_ip)
        .ok_or_else(|| anyhow::anyhow!("the client Service has no ClusterIP"))?;
    let etcdctl =
        policy_host_e2e::apps::etcd_dir(env, &policy_host_e2e::apps::default_etcd_version(env)?)
            .ok_or_else(|| anyhow::anyhow!("etcdctl is not built"))?
            .join("etcdctl");
    let endpoint = format!("http://{cluster_ip}:2379");
    let run = |args: &[&str]| {
        let output = Command::new(&etcdctl)
            .args([
                "--endpoints",
                &endpoint,
                "--dial-timeout=3s",
                "--command-timeout=5s",
            ])
            .args(args)
            .output()
            .map_err(|e| e.to_string())?;
        if output.status.success() {
            Ok(String::from_utf8_lossy(&output.stdout).into_owned())
        } else {
            Err(String::from_utf8_lossy(&output.stderr).into_owned())
        }
    };
    eventually("a write through the client Service", CONVERGE, || async {
        run(&["put", "installed", "as-the-readme-says"])
    })
    .await?;
    let members = eventually("the member list", CONVERGE, || async {
        run(&["member", "list"])
    })
    .await?;
    assert_eq!(members.lines().count(), 3, "three members: {members}");
    assert_eq!(read(&run, "installed").await?, "as-the-readme-says");

    // Leader handover (issue 13 item 4, issue 12 item 4): the leading host pod killed, the
    // other replica leads within the Lease's bound; then `kubectl rollout restart` of the host.
    // Neither may lose a write or change the membership (no member added, none removed).
    let ids_before = eventually("the member IDs", CONVERGE, || async { member_ids(&run) }).await?;
    let events: Api<k8s_openapi::api::events::v1::Event> =
        Api::namespaced(client.clone(), "default");
    let added_before = membership_events(&events).await;
    let leases: Api<Lease> = Api::namespaced(client.clone(), "policy-host");
    let leader = eventually("a leader holds the Lease", CONVERGE, || async {
        holder(&leases)
            .await
            .ok_or_else(|| "no holder yet".to_owned())
    })
    .await?;
    let killed = Instant::now();
    host_pods
        .delete(&leader, &DeleteParams::default().grace_period(0))
        .await?;
    let successor = eventually("another replica leads", Duration::from_secs(60), || async {
        match holder(&leases).await {
            Some(now) if now != leader => Ok(now),
            other => Err(format!("holder {other:?}")),
        }
    })
    .await?;
    let takeover = killed.elapsed();
    eprintln!(
        "figure: leading host pod {leader} killed -> {successor} leads in {:.1} s",
        takeover.as_secs_f64()
    );
    assert!(
        takeover < Duration::from_secs(15),
        "takeover took {takeover:?}"
    );
    eventually("a write after the handover", CONVERGE, || async {
        run(&["put", "after-handover", "kept"])
    })
    .await?;

    let restarted = Instant::now();
    kubectl(
        env,
        &[
            "-n",
            "policy-host",
            "rollout",
            "restart",
            "deployment/policy-host",
        ],
    )?;
    kubectl(
        env,
        &[
            "-n",
            "policy-host",
            "rollout",
            "status",
            "deployment/policy-host",
            "--timeout=300s",
        ],
    )?;
    eprintln!(
        "figure: kubectl rollout restart of the host -> rolled out in {:.1} s",
        restarted.elapsed().as_secs_f64()
    );
    eventually("a leader after the rollout", CONVERGE, || async {
        let holder = holder(&leases)
            .await
            .ok_or_else(|| "no holder".to_owned())?;
        let pod = host_pods
            .get_opt(&holder)
            .await
            .map_err(|e| e.to_string())?;
        pod.filter(|p| p.metadata.deletion_timestamp.is_none())
            .map(|_| ())
            .ok_or_else(|| format!("holder {holder} is not a live pod"))
    })
    .await?;
    // Nothing lost, nothing done twice: the same members, no membership Event since, both
    // writes there, and the cluster still 3/3.
    eventually("3/3 after the rollout", CONVERGE, || async {
        let cluster = clusters
            .get("example-etcd-cluster")
            .await
            .map_err(|e| e.to_string())?;
        (cluster.data["status"]["ready"] == "3/3")
            .then_some(())
            .ok_or_else(|| format!("status {}", cluster.data["status"]))
    })
    .await?;
    let ids_after = eventually("the member IDs", CONVERGE, || async { member_ids(&run) }).await?;
    assert_eq!(ids_after, ids_before, "the membership changed");
    assert_eq!(
        membership_events(&events).await,
        added_before,
        "a membership change was made"
    );
    for (key, want) in [
        ("installed", "as-the-readme-says"),
        ("after-handover", "kept"),
    ] {
        assert_eq!(read(&run, key).await?, want, "{key}");
    }
    Ok(())
}

/// The leading host pod's name: the Lease's holder identity is `<pod>-<pid>`.
async fn holder(leases: &Api<Lease>) -> Option<String> {
    let identity = leases
        .get_opt("policy-host")
        .await
        .ok()
        .flatten()?
        .spec?
        .holder_identity?;
    identity.rsplit_once('-').map(|(pod, _)| pod.to_owned())
}

/// A key's value through the client Service. A request that times out (a loaded machine, a
/// member restarting) is asked again: only an answer is compared, never a timeout.
async fn read(
    run: &impl Fn(&[&str]) -> Result<String, String>,
    key: &str,
) -> anyhow::Result<String> {
    let value = eventually("a read through the client Service", CONVERGE, || async {
        run(&["get", key, "--print-value-only"])
    })
    .await?;
    Ok(value.trim().to_owned())
}

/// etcd's member IDs, sorted.
fn member_ids(run: &impl Fn(&[&str]) -> Result<String, String>) -> Result<Vec<String>, String> {
    let text = run(&["member", "list", "-w", "json"])?;
    let list: serde_json::Value = serde_json::from_str(&text).map_err(|e| e.to_string())?;
    let mut ids: Vec<String> = list["members"]
        .as_array()
        .into_iter()
        .flatten()
        .map(|m| m["ID"].to_string())
        .collect();
    ids.sort();
    Ok(ids)
}

/// Membership Events (added, removed, promoted) on the example cluster, counted with repeats.
async fn membership_events(events: &Api<k8s_openapi::api::events::v1::Event>) -> usize {
    events
        .list(&ListParams::default())
        .await
        .map(|l| l.items)
        .unwrap_or_default()
        .iter()
        .filter(|e| {
            e.regarding.as_ref().and_then(|r| r.name.as_deref()) == Some("example-etcd-cluster")
                && matches!(
                    e.reason.as_deref(),
                    Some("MemberAdded" | "MemberRemoved" | "MemberPromoted")
                )
        })
        .map(|e| e.series.as_ref().map_or(1, |s| s.count.max(1)) as usize)
        .sum()
}
