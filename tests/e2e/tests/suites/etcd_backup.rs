//! The etcd plugin's scheduled, verified backups on real etcd: snapshots taken every few
//! seconds rotate through `keep` slot files in the backup claim, each one listed in status
//! with the revision, size and KV hash a throwaway etcd read from it after restoring it; the
//! hashes match live members', and the older kept snapshot restores into a new cluster with
//! exactly the keys the source had at its revision. An on-demand snapshot is verified the
//! same way on etcd 3.5.
//!
//! Runs policy-host in-process against the shared control plane, in a namespace of its own,
//! and asserts through a real etcd client (`etcdctl`), with the fixture of
//! `policy_host_e2e::etcd`.

use std::collections::BTreeSet;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::{Duration, Instant};

use policy_host_e2e::etcd::{
    CONVERGE, EtcdFixture, etcd_version, eventually, snapshots, write_until_stopped,
};
use serde_json::{Value, json};

/// Name of the EtcdCluster that is backed up.
const NAME: &str = "scheduled";
/// Name of the cluster restored from one of its snapshots.
const RESTORED: &str = "from-older";
/// The schedule: short, so three snapshots take seconds; long enough that the keys written
/// in between always move the revision on.
const EVERY: &str = "4s";

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn scheduled_snapshots_keep_the_newest_verified_and_restore() -> anyhow::Result<()> {
    let mut fixture = EtcdFixture::start("etcd-schedule", "3.6", NAME).await?;
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
            .claim_dir(&fixture.namespace, &format!("backup-{NAME}"))
            .await?;
        let on_disk: BTreeSet<String> = std::fs::read_dir(&dir)?
            .map(|e| e.map(|e| e.file_name().to_string_lossy().into_owned()))
            .collect::<Result<_, _>>()?;
        anyhow::ensure!(on_disk == files, "{} holds {on_disk:?}", dir.display());
        for snapshot in &kept {
            let file = dir.join(snapshot["file"].as_str().unwrap_or_default());
            let size = std::fs::metadata(&file)?.len();
            let db_size = snapshot["size"].as_u64().unwrap_or_default();
            // `size` is the restored database's, which restoring rewrites (a few pages added
            // for the new membership, free pages dropped): close to the file, either side.
            anyhow::ensure!(
                size > 0 && db_size > 0 && db_size <= 2 * size && size <= 2 * db_size,
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
    fixture.finish(outcome, &[NAME, RESTORED]).await
}

/// The same verified snapshot on etcd 3.5 (whose `etcdutl` and gateway differ in details from
/// 3.6), taken on demand, beside no schedule.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_on_demand_snapshot_is_verified_on_etcd_3_5() -> anyhow::Result<()> {
    let mut fixture = EtcdFixture::start("etcd-backup-35", "3.5", NAME).await?;
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
    fixture.finish(outcome, &[NAME, RESTORED]).await
}
