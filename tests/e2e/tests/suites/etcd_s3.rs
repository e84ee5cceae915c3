//! The etcd plugin's backups to a real S3-compatible store: a MinIO server started by the
//! test receives each verified snapshot from the backup Pod's `mc` step; after three scheduled
//! snapshots the bucket holds exactly the `keep` objects status lists (named as the slot
//! files under the cluster's namespace, byte-equal to the claim's), and a new cluster restores from the newest object
//! through `spec.restore.s3` with the claim's copy gone, holding the keys the source had.
//!
//! MinIO and `mc` are built on demand (`tests/env/build-binaries.sh s3`) by this test only.
//! The fixture is `policy_host_e2e::etcd`, shared with `etcd_backup.rs`.

use std::collections::BTreeSet;
use std::path::Path;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::{Duration, Instant};

use k8s_openapi::api::core::v1::Secret;
use kube::api::{Api, PostParams};
use policy_host_e2e::etcd::{
    CONVERGE, EtcdFixture, etcd_version, eventually, snapshots, write_until_stopped,
};
use policy_host_e2e::minio::{ACCESS_KEY, Minio, SECRET_KEY};
use serde_json::{Value, json};

/// Name of the EtcdCluster that is backed up.
const NAME: &str = "to-s3";
/// Name of the cluster restored from its newest uploaded snapshot.
const RESTORED: &str = "from-s3";
/// The schedule: short, so three snapshots take seconds; long enough that the keys written
/// in between always move the revision on.
const EVERY: &str = "4s";
/// The bucket and the object prefix the cluster uploads to.
const BUCKET: &str = "etcd-snapshots";
const PREFIX: &str = "e2e/";

/// SHA-256 of a file, as `sha256sum` prints it.
async fn sha256(path: &Path) -> anyhow::Result<String> {
    let output = tokio::process::Command::new("sha256sum")
        .arg(path)
        .output()
        .await?;
    anyhow::ensure!(output.status.success(), "sha256sum {}", path.display());
    String::from_utf8_lossy(&output.stdout)
        .split_whitespace()
        .next()
        .map(str::to_owned)
        .ok_or_else(|| anyhow::anyhow!("sha256sum printed nothing for {}", path.display()))
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn snapshots_go_to_s3_keeping_n_and_a_new_cluster_restores_from_it() -> anyhow::Result<()> {
    let mut fixture = EtcdFixture::start("etcd-s3", "3.6", NAME).await?;
    let outcome = async {
        let minio = Minio::start(fixture.env).await?;
        minio.mc(&["mb", &format!("s3/{BUCKET}")]).await?;
        let secrets: Api<Secret> = Api::namespaced(fixture.env.client().await?, &fixture.namespace);
        let credentials: Secret = serde_json::from_value(json!({
            "metadata": {"name": "s3-credentials",
                "labels": {"mountable-by.policy-host.io/etcd": "true"}},
            "stringData": {"accessKeyID": ACCESS_KEY, "secretAccessKey": SECRET_KEY},
        }))?;
        secrets.create(&PostParams::default(), &credentials).await?;
        let s3 = json!({"endpoint": minio.endpoint, "bucket": BUCKET, "prefix": PREFIX,
                        "credentialsSecret": "s3-credentials"});

        let version = etcd_version(fixture.env, "3.6")?;
        fixture
            .create_cluster_with(json!({
                "size": 3, "version": version,
                "backup": {"storage": {"size": "1Gi"}, "keep": 2, "s3": s3},
            }))
            .await?;
        fixture.wait_converged(3).await?;
        let endpoints = fixture.endpoints().await.map_err(anyhow::Error::msg)?;
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

        // Three scheduled snapshots, each appearing at the head of the list.
        let mut taken: Vec<Value> = Vec::new();
        let schedule_started = Instant::now();
        while taken.len() < 3 {
            let last = taken.last().cloned();
            let newest = eventually(
                "the next uploaded snapshot",
                Duration::from_secs(60),
                || async {
                    let cluster = fixture.cluster().await?;
                    match snapshots(&cluster).first() {
                        Some(newest) if Some(newest) != last.as_ref() => Ok(newest.clone()),
                        _ => Err(format!("status.backup: {}", cluster["status"]["backup"])),
                    }
                },
            )
            .await?;
            taken.push(newest);
        }
        eprintln!(
            "[{}] 3 uploaded snapshots in {:.1} s",
            fixture.namespace,
            schedule_started.elapsed().as_secs_f64()
        );
        stop.store(true, Ordering::Relaxed);
        anyhow::ensure!(writer.await? > 0, "the writer wrote nothing");

        // Stop the schedule and let a snapshot in flight finish: claim and bucket at rest.
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
        anyhow::ensure!(backup["phase"] == "Succeeded", "{backup}");
        let kept = snapshots(&cluster);
        anyhow::ensure!(kept.len() == 2, "exactly keep=2 listed: {backup}");

        // The bucket holds exactly the two listed snapshots, named as their slot files, each
        // byte-equal to the claim's file, and status says where each one is.
        let files: Vec<String> = kept
            .iter()
            .filter_map(|s| s["file"].as_str().map(str::to_owned))
            .collect();
        // Objects carry the cluster's namespace: same-named clusters elsewhere never share one.
        let namespace = fixture.namespace.to_string();
        let object = move |file: &str| format!("{PREFIX}{namespace}/{file}");
        let wanted: BTreeSet<String> = files.iter().map(|f| object(f)).collect();
        let objects = minio.objects(BUCKET).await?;
        anyhow::ensure!(
            objects == wanted,
            "bucket {BUCKET} holds {objects:?}, status lists {files:?}"
        );
        let claim = fixture
            .env
            .claim_dir(&fixture.namespace, &format!("backup-{NAME}"))
            .await?;
        let scratch = minio.dir.join("downloaded");
        std::fs::create_dir_all(&scratch)?;
        for snapshot in &kept {
            let file = snapshot["file"].as_str().unwrap_or_default();
            anyhow::ensure!(
                snapshot["location"] == json!(format!("s3://{BUCKET}/{}", object(file))),
                "{snapshot}"
            );
            let bytes = minio
                .mc(&["cat", &format!("s3/{BUCKET}/{}", object(file))])
                .await?;
            let downloaded = scratch.join(file);
            std::fs::write(&downloaded, &bytes)?;
            let (in_claim, in_bucket) =
                (sha256(&claim.join(file)).await?, sha256(&downloaded).await?);
            anyhow::ensure!(
                !bytes.is_empty() && in_claim == in_bucket,
                "{file}: sha256 {in_claim} in the claim, {in_bucket} in the bucket ({} bytes)",
                bytes.len()
            );
            eprintln!(
                "[{}] {} ({} bytes, sha256 {in_bucket}) = claim's {file}",
                fixture.namespace,
                snapshot["location"],
                bytes.len()
            );
        }

        // The newest snapshot restores from the bucket alone: the claim's copy is gone.
        let newer = &kept[0];
        let file = newer["file"].as_str().unwrap_or_default().to_owned();
        std::fs::remove_file(claim.join(&file))?;
        let revision = newer["revision"].as_i64().unwrap_or_default();
        let at_newer = fixture.keys(&endpoints[0], "key-", Some(revision)).await?;
        anyhow::ensure!(!at_newer.is_empty(), "no keys at revision {revision}");
        fixture.name = RESTORED.to_owned();
        fixture
            .create_cluster_with(json!({
                "size": 1, "version": version,
                "restore": {"s3": {"endpoint": minio.endpoint, "bucket": BUCKET,
                    "key": object(&file), "credentialsSecret": "s3-credentials"}},
            }))
            .await?;
        fixture.wait_converged(1).await?;
        let restored_endpoints = fixture.endpoints().await.map_err(anyhow::Error::msg)?;
        let restored = fixture.keys(&restored_endpoints[0], "key-", None).await?;
        anyhow::ensure!(
            restored == at_newer,
            "restored {} keys, the source had {} at revision {revision}",
            restored.len(),
            at_newer.len()
        );
        Ok(())
    }
    .await;
    fixture.finish(outcome, &[NAME, RESTORED]).await
}
