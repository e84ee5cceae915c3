//! The classic etcd-operator's own end-to-end assertions (coreos/etcd-operator `test/e2e`:
//! create, ready-members status, pause, one-member recovery, upgrade, resize both ways, PV,
//! delete), made against policy-host the way that suite makes them: clusters created from its
//! `NewCluster` manifest (`generateName`, `size` only), changed by a full-object update, read
//! through `status.members.ready` (pod names), and member pods found by the labels
//! `app=etcd,etcd_cluster=<name>`, their version read from the first container status's image
//! (`<repository>:v<version>`). Waits are conditions with a timeout rather than its 10 s polls.
//! `TLS.static` is left out: it is refused by design (`etcd_classic`).
//!
//! Runs policy-host in-process against the shared real node, in a namespace of its own, with the
//! fixture of `policy_host_e2e::etcd`.

use std::time::Duration;

use k8s_openapi::api::core::v1::{Pod, Service};
use kube::api::{Api, DeleteParams, DynamicObject, ListParams, PostParams};
use policy_host_e2e::etcd::{EtcdFixture, etcd_version, eventually};
use serde_json::{Value, json};

/// How long a cluster may take to reach a size (a 5-member resize on 2 cores included).
const WAIT: Duration = Duration::from_secs(240);
/// How long a decision may take after a change.
const DECIDED: Duration = Duration::from_secs(60);

/// The classic suite's `NewCluster("test-etcd-", size)`, with the version given.
fn new_cluster(size: i64, version: &str) -> Value {
    json!({
        "apiVersion": "etcd.database.coreos.com/v1beta2",
        "kind": "EtcdCluster",
        "metadata": {"generateName": "test-etcd-"},
        "spec": {"size": size, "version": version},
    })
}

/// The classic suite's `CreateCluster`: a create, not an apply; returns the generated name.
async fn create_cluster(fixture: &EtcdFixture, cluster: Value) -> anyhow::Result<String> {
    let object: DynamicObject = serde_json::from_value(cluster)?;
    let created = fixture
        .clusters
        .create(&PostParams::default(), &object)
        .await?;
    created
        .metadata
        .name
        .ok_or_else(|| anyhow::anyhow!("the created EtcdCluster has no name"))
}

/// The classic suite's `UpdateCluster`: get, change the spec, update the whole object, again
/// on a conflict.
async fn update_cluster(
    fixture: &EtcdFixture,
    name: &str,
    change: impl Fn(&mut Value),
) -> anyhow::Result<()> {
    eventually(&format!("{name} updated"), DECIDED, || async {
        let mut object = fixture
            .clusters
            .get(name)
            .await
            .map_err(|e| e.to_string())?;
        change(&mut object.data["spec"]);
        match fixture
            .clusters
            .replace(name, &PostParams::default(), &object)
            .await
        {
            Ok(_) => Ok(()),
            Err(kube::Error::Api(status)) if status.code == 409 => Err(status.message),
            Err(e) => Err(format!("not a conflict, still retried: {e}")),
        }
    })
    .await
}

/// `status.members.ready` as the classic type reads it: a list of pod names in an object, or
/// why the status does not read as one.
async fn ready_members(fixture: &EtcdFixture, name: &str) -> Result<Vec<String>, String> {
    let object = fixture
        .clusters
        .get(name)
        .await
        .map_err(|e| e.to_string())?;
    let members = &object.data["status"]["members"];
    if !members.is_object() {
        return Err(format!(
            "status.members is not the classic {{ready, unready}}: {members}"
        ));
    }
    serde_json::from_value(members.get("ready").cloned().unwrap_or(json!([])))
        .map_err(|e| format!("status.members.ready is not a list of names ({e}): {members}"))
}

/// The classic `WaitUntilSizeReached`: `size` ready members in the status; their names.
async fn wait_until_size_reached(
    fixture: &EtcdFixture,
    name: &str,
    size: usize,
) -> anyhow::Result<Vec<String>> {
    eventually(
        &format!("{name} to have {size} ready members"),
        WAIT,
        || async {
            let ready = ready_members(fixture, name).await?;
            if ready.len() == size {
                Ok(ready)
            } else {
                Err(format!("ready members {ready:?}"))
            }
        },
    )
    .await
}

/// Pods labelled `app=etcd,etcd_cluster=<name>` (the classic `ClusterListOpt`).
async fn cluster_pods(fixture: &EtcdFixture, name: &str) -> Result<Vec<Pod>, String> {
    let selector = format!("app=etcd,etcd_cluster={name}");
    let list = fixture
        .pods
        .list(&ListParams::default().labels(&selector))
        .await
        .map_err(|e| e.to_string())?;
    Ok(list.items)
}

/// The classic `WaitUntilPodSizeReached` and `WaitSizeAndVersionReached`: `size` labelled pods
/// in phase `Running` (with `version`: whose first container's image is `…:v<version>`).
async fn wait_pods(
    fixture: &EtcdFixture,
    name: &str,
    size: usize,
    version: Option<&str>,
) -> anyhow::Result<Vec<Pod>> {
    eventually(
        &format!("{name} to have {size} running pods at {version:?}"),
        WAIT,
        || async {
            let pods: Vec<Pod> = cluster_pods(fixture, name)
                .await?
                .into_iter()
                .filter(|p| {
                    let status = p.status.clone().unwrap_or_default();
                    let image = status
                        .container_statuses
                        .unwrap_or_default()
                        .first()
                        .map(|c| c.image.clone())
                        .unwrap_or_default();
                    status.phase.as_deref() == Some("Running")
                        && version.is_none_or(|v| image.split(":v").nth(1) == Some(v))
                })
                .collect();
            if pods.len() == size {
                Ok(pods)
            } else {
                Err(format!("{} such pods", pods.len()))
            }
        },
    )
    .await
}

/// The classic `KillMembers`: each pod deleted at once.
async fn kill_members(fixture: &EtcdFixture, names: &[&str]) -> anyhow::Result<()> {
    for pod in names {
        fixture
            .pods
            .delete(pod, &DeleteParams::default().grace_period(0))
            .await?;
    }
    Ok(())
}

/// The classic `DeleteCluster`: the EtcdCluster deleted, then no labelled pod left (but those
/// being deleted) and no labelled Service.
async fn delete_cluster(fixture: &EtcdFixture, name: &str) -> anyhow::Result<()> {
    fixture
        .clusters
        .delete(name, &DeleteParams::background())
        .await?;
    let services: Api<Service> =
        Api::namespaced(fixture.env.client().await?, fixture.namespace.name());
    eventually(
        &format!("{name}'s labelled pods and Services to go"),
        WAIT,
        || async {
            let pods = cluster_pods(fixture, name).await?;
            let live = pods
                .iter()
                .filter(|p| p.metadata.deletion_timestamp.is_none())
                .count();
            let selector = format!("app=etcd,etcd_cluster={name}");
            let services = services
                .list(&ListParams::default().labels(&selector))
                .await
                .map_err(|e| e.to_string())?
                .items
                .len();
            if live == 0 && services == 0 {
                Ok(())
            } else {
                Err(format!("{live} pods, {services} Services left"))
            }
        },
    )
    .await
}

/// One cluster through the classic suite's life: created at the older minor (TestCreateCluster,
/// TestEtcdUpgrade's start), paused while a member is killed (TestPauseControl), one member
/// killed (TestOneMemberRecovery), upgraded (TestEtcdUpgrade), resized 3 → 5 → 3
/// (TestResizeCluster3to5, 5to3), deleted (DeleteCluster).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_classic_suite_s_assertions_hold_create_pause_recover_upgrade_resize()
-> anyhow::Result<()> {
    let fixture = EtcdFixture::start("etcd-classic-suite", "3.6", "unused").await?;
    let mut created = Vec::new();
    let outcome = async {
        let old = etcd_version(fixture.env, "3.5")?;
        let new = etcd_version(fixture.env, "3.6")?;
        let name = create_cluster(&fixture, new_cluster(3, &old)).await?;
        created.push(name.clone());
        let names = wait_until_size_reached(&fixture, &name, 3).await?;
        wait_pods(&fixture, &name, 3, Some(&old)).await?;
        eventually("the classic status fields", DECIDED, || async {
            let object = fixture
                .clusters
                .get(&name)
                .await
                .map_err(|e| e.to_string())?;
            let status = &object.data["status"];
            if status["serviceName"] == json!(format!("{name}-client"))
                && status["clientPort"] == 2379
                && status["phase"] == "Running"
                && status["currentVersion"] == json!(old)
                && status.get("targetVersion").is_none()
            {
                Ok(())
            } else {
                Err(format!("status: {status}"))
            }
        })
        .await?;

        // TestPauseControl: paused, a killed member is not brought back; resumed, it is.
        update_cluster(&fixture, &name, |spec| spec["paused"] = json!(true)).await?;
        eventually("the pause to be decided", DECIDED, || async {
            let object = fixture
                .clusters
                .get(&name)
                .await
                .map_err(|e| e.to_string())?;
            let status = &object.data["status"];
            let decided = status["observedGeneration"] == json!(object.metadata.generation);
            if decided && status["controlPaused"] == true {
                Ok(())
            } else {
                Err(format!("status: {status}"))
            }
        })
        .await?;
        let killed = names[0].clone();
        kill_members(&fixture, &[&killed]).await?;
        wait_pods(&fixture, &name, 2, None).await?;
        // A decision made after the loss reports it; its actions were written before its
        // status, so a replacement would be there by now.
        eventually("the killed member reported unready", DECIDED, || async {
            let object = fixture
                .clusters
                .get(&name)
                .await
                .map_err(|e| e.to_string())?;
            let members = &object.data["status"]["members"];
            if members["unready"] == json!([killed])
                && members["ready"].as_array().map(Vec::len) == Some(2)
            {
                Ok(())
            } else {
                Err(format!("status.members: {members}"))
            }
        })
        .await?;
        let pods = cluster_pods(&fixture, &name)
            .await
            .map_err(anyhow::Error::msg)?;
        anyhow::ensure!(
            pods.len() == 2,
            "the cluster should not be recovered: control is paused; pods {:?}",
            pods.iter()
                .map(|p| p.metadata.name.clone())
                .collect::<Vec<_>>()
        );
        update_cluster(&fixture, &name, |spec| spec["paused"] = json!(false)).await?;
        let names = wait_until_size_reached(&fixture, &name, 3).await?;

        // TestOneMemberRecovery: a killed member is replaced.
        let victim = names[2].clone();
        let victim_uid = fixture.pods.get(&victim).await?.metadata.uid;
        kill_members(&fixture, &[&victim]).await?;
        eventually("the killed member's pod to go", WAIT, || async {
            let pods = cluster_pods(&fixture, &name).await?;
            if pods.iter().any(|p| p.metadata.uid == victim_uid) {
                Err("the killed pod is still there".into())
            } else {
                Ok(())
            }
        })
        .await?;
        wait_pods(&fixture, &name, 3, None).await?;
        wait_until_size_reached(&fixture, &name, 3).await?;

        // TestEtcdUpgrade: every labelled pod runs the new version.
        update_cluster(&fixture, &name, |spec| spec["version"] = json!(new)).await?;
        wait_pods(&fixture, &name, 3, Some(&new)).await?;
        wait_until_size_reached(&fixture, &name, 3).await?;

        // TestResizeCluster3to5, then 5to3.
        update_cluster(&fixture, &name, |spec| spec["size"] = json!(5)).await?;
        wait_until_size_reached(&fixture, &name, 5).await?;
        update_cluster(&fixture, &name, |spec| spec["size"] = json!(3)).await?;
        wait_until_size_reached(&fixture, &name, 3).await?;

        delete_cluster(&fixture, &name).await
    }
    .await;
    let names: Vec<&str> = created.iter().map(String::as_str).collect();
    fixture.finish(outcome, &names).await
}

/// TestCreateClusterWithPV (the classic `pod.persistentVolumeClaimSpec`, class `standard`) and
/// TestReadyMembersStatus (one member), side by side, then DeleteCluster for both.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_classic_suite_s_assertions_hold_persistent_volumes_and_one_ready_member()
-> anyhow::Result<()> {
    let fixture = EtcdFixture::start("etcd-classic-pv", "3.6", "unused").await?;
    let mut created = Vec::new();
    let outcome = async {
        let version = etcd_version(fixture.env, "3.6")?;
        let mut with_pv = new_cluster(3, &version);
        with_pv["spec"]["pod"] = json!({"persistentVolumeClaimSpec": {
            "accessModes": ["ReadWriteOnce"],
            "resources": {"requests": {"storage": "512Mi"}},
            "storageClassName": "standard",
        }});
        let pv = create_cluster(&fixture, with_pv).await?;
        created.push(pv.clone());
        let single = create_cluster(&fixture, new_cluster(1, &version)).await?;
        created.push(single.clone());

        let ready = wait_until_size_reached(&fixture, &single, 1).await?;
        anyhow::ensure!(ready == [format!("{single}-0")], "{ready:?}");
        let names = wait_until_size_reached(&fixture, &pv, 3).await?;
        for member in &names {
            let pod = fixture.pods.get(member).await?;
            let claims: Vec<String> = pod
                .spec
                .unwrap_or_default()
                .volumes
                .unwrap_or_default()
                .iter()
                .filter_map(|v| Some(v.persistent_volume_claim.as_ref()?.claim_name.clone()))
                .collect();
            anyhow::ensure!(
                claims == [format!("data-{member}")],
                "{member} mounts {claims:?}"
            );
        }

        delete_cluster(&fixture, &pv).await?;
        delete_cluster(&fixture, &single).await
    }
    .await;
    let names: Vec<&str> = created.iter().map(String::as_str).collect();
    fixture.finish(outcome, &names).await
}
