//! `spec.paused` on real etcd: while paused a scale-up and a lost member change nothing (no
//! pod created or replaced, etcd's membership untouched) although the status keeps
//! reporting; unpausing resumes and the cluster converges with its data.
//!
//! Runs policy-host in-process against the shared test environment, in a namespace of its
//! own, with the fixture of `policy_host_e2e::etcd`.

use std::time::Duration;

use kube::api::DeleteParams;
use policy_host_e2e::etcd::{EtcdFixture, etcd_version, eventually};
use serde_json::{Value, json};

const NAME: &str = "held";
/// Long enough for a decision after a change on this 2-core machine.
const DECIDED: Duration = Duration::from_secs(60);

fn condition<'a>(cluster: &'a Value, type_: &str) -> Option<&'a Value> {
    cluster["status"]["conditions"]
        .as_array()?
        .iter()
        .find(|c| c["type"] == type_)
}

/// etcd's member IDs, sorted, as one member reports them.
async fn member_ids(fixture: &EtcdFixture) -> Result<Vec<String>, String> {
    let endpoints = fixture.endpoints().await?;
    let text = fixture
        .etcdctl(&endpoints, &["member", "list", "-w", "json"])
        .await?;
    let list: Value = serde_json::from_str(&text).map_err(|e| format!("{e}: {text}"))?;
    let mut ids: Vec<String> = list["members"]
        .as_array()
        .into_iter()
        .flatten()
        .map(|m| m["ID"].to_string())
        .collect();
    ids.sort();
    Ok(ids)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_paused_cluster_is_left_alone_and_resumes_when_unpaused() -> anyhow::Result<()> {
    let fixture = EtcdFixture::start("etcd-paused", "3.6", NAME).await?;
    let outcome = async {
        let version = etcd_version(fixture.env, "3.6")?;
        fixture
            .create_cluster_with(json!({"size": 3, "version": version}))
            .await?;
        fixture.wait_converged(3).await?;
        let endpoints = fixture.endpoints().await.map_err(anyhow::Error::msg)?;
        fixture
            .etcdctl(&endpoints, &["put", "before-pause", "kept"])
            .await
            .map_err(anyhow::Error::msg)?;
        let ids = member_ids(&fixture).await.map_err(anyhow::Error::msg)?;

        // Pause and ask for 5 members at once: the decision for this generation must say
        // Paused, and nothing may have been added.
        fixture
            .patch_spec(json!({"paused": true, "size": 5}))
            .await?;
        eventually("the paused spec to be decided", DECIDED, || async {
            let cluster = fixture.cluster().await?;
            let decided =
                cluster["status"]["observedGeneration"] == cluster["metadata"]["generation"];
            let paused = condition(&cluster, "Paused").is_some_and(|c| c["status"] == "True");
            if decided && paused && cluster["status"]["phase"] == "Paused" {
                Ok(())
            } else {
                Err(format!("status: {}", cluster["status"]))
            }
        })
        .await?;

        // A member lost while paused is reported, not replaced. The status saying 2/5 comes
        // from a decision made after the loss, whose actions are written before its status.
        fixture
            .pods
            .delete(
                &format!("{NAME}-2"),
                &DeleteParams::default().grace_period(0),
            )
            .await?;
        eventually("the lost member to be reported", DECIDED, || async {
            let cluster = fixture.cluster().await?;
            let ready = &cluster["status"]["ready"];
            let pods = fixture.live_pods().await?.len();
            if ready == "2/5" && pods == 2 {
                Ok(())
            } else {
                Err(format!("ready {ready}, {pods} live pods"))
            }
        })
        .await?;
        let live: Vec<String> = fixture
            .live_pods()
            .await
            .map_err(anyhow::Error::msg)?
            .iter()
            .filter_map(|p| p.metadata.name.clone())
            .collect();
        anyhow::ensure!(
            live == [format!("{NAME}-0"), format!("{NAME}-1")],
            "paused, yet pods changed: {live:?}"
        );
        let paused_ids = member_ids(&fixture).await.map_err(anyhow::Error::msg)?;
        anyhow::ensure!(
            paused_ids == ids,
            "paused, yet etcd's membership changed: {ids:?} -> {paused_ids:?}"
        );

        fixture.patch_spec(json!({"paused": false})).await?;
        fixture.wait_converged(5).await?;
        let cluster = fixture.cluster().await.map_err(anyhow::Error::msg)?;
        let resumed = condition(&cluster, "Paused").cloned().unwrap_or_default();
        anyhow::ensure!(
            resumed["status"] == "False" && resumed["reason"] == "Resumed",
            "Paused condition after unpausing: {resumed}"
        );
        let endpoints = fixture.endpoints().await.map_err(anyhow::Error::msg)?;
        let value = fixture
            .etcdctl(&endpoints, &["get", "before-pause", "--print-value-only"])
            .await
            .map_err(anyhow::Error::msg)?;
        anyhow::ensure!(
            value.trim() == "kept",
            "the key written before the pause: {value:?}"
        );
        Ok(())
    }
    .await;
    fixture.finish(outcome, &[NAME]).await
}
