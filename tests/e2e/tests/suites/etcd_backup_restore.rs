//! The classic etcd-operator's `EtcdBackup` and `EtcdRestore` kinds, each its own plugin, on
//! real etcd and a real MinIO: a classic backup manifest snapshots a running cluster through
//! its client Service, the snapshot is verified (restored and served; its hashKV equals the
//! source's at that revision) and uploaded to the path it names; a classic restore manifest
//! makes a new cluster from that object holding exactly the source's keys at that revision;
//! and a restore naming a cluster that already exists is refused without touching it.
//!
//! Runs policy-host in-process (the etcd, etcd-backup and etcd-restore plugins) against the
//! shared test environment, in a namespace of its own.

use std::time::Duration;

use k8s_openapi::api::core::v1::Secret;
use k8s_openapi::api::events::v1::Event;
use kube::api::{Api, ApiResource, DynamicObject, ListParams, Patch, PatchParams, PostParams};
use kube::core::GroupVersionKind;
use policy_host_e2e::etcd::{CONVERGE, EtcdFixture, etcd_version, eventually};
use policy_host_e2e::minio::{ACCESS_KEY, Minio, SECRET_KEY};
use serde_json::{Value, json};

/// The cluster backed up.
const SOURCE: &str = "classic-source";
/// The cluster the classic restore creates.
const RESTORED: &str = "classic-restored";
const BUCKET: &str = "etcd-classic";
/// The classic `spec.s3.path`: `<bucket>/<object>`.
const PATH: &str = "etcd-classic/prod/etcd.backup";
const WAIT: Duration = Duration::from_secs(180);

fn kind(kind: &str, plural: &str) -> ApiResource {
    ApiResource::from_gvk_with_plural(
        &GroupVersionKind::gvk("etcd.database.coreos.com", "v1beta2", kind),
        plural,
    )
}

async fn apply(api: &Api<DynamicObject>, object: Value) -> anyhow::Result<()> {
    let name = object["metadata"]["name"]
        .as_str()
        .unwrap_or_default()
        .to_owned();
    api.patch(
        &name,
        &PatchParams::apply("etcd-backup-restore-e2e").force(),
        &Patch::Apply(&object),
    )
    .await?;
    Ok(())
}

/// The status of `name` once `done` holds for it.
async fn status_when(
    api: &Api<DynamicObject>,
    name: &str,
    what: &str,
    done: impl Fn(&Value) -> bool,
) -> anyhow::Result<Value> {
    eventually(what, WAIT, || async {
        let object = api.get(name).await.map_err(|e| e.to_string())?;
        let status = object.data["status"].clone();
        if done(&status) {
            Ok(status)
        } else {
            Err(format!("status {status}"))
        }
    })
    .await
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_classic_backup_goes_to_s3_verified_and_a_classic_restore_brings_its_keys_back()
-> anyhow::Result<()> {
    let mut fixture = EtcdFixture::start_with_plugins(
        "etcd-classic-br",
        "3.6",
        SOURCE,
        &[
            ("guest-etcd", "etcdcluster"),
            ("guest-etcd-backup", "etcdbackup"),
            ("guest-etcd-restore", "etcdrestore"),
        ],
    )
    .await?;
    let outcome = async {
        let minio = Minio::start(fixture.env).await?;
        minio.mc(&["mb", &format!("s3/{BUCKET}")]).await?;
        let client = fixture.env.client().await?;
        let namespace = fixture.namespace.to_string();
        let secrets: Api<Secret> = Api::namespaced(client.clone(), &namespace);
        let credentials: Secret = serde_json::from_value(json!({
            // Read by the backup plugin's pods, and by the etcd plugin's when a restore
            // starts a cluster from the bucket.
            "metadata": {"name": "aws", "labels": {
                "mountable-by.policy-host.io/etcd-backup": "true",
                "mountable-by.policy-host.io/etcd": "true"}},
            "stringData": {"accessKeyID": ACCESS_KEY, "secretAccessKey": SECRET_KEY},
        }))?;
        secrets.create(&PostParams::default(), &credentials).await?;
        let backups: Api<DynamicObject> = Api::namespaced_with(
            client.clone(),
            &namespace,
            &kind("EtcdBackup", "etcdbackups"),
        );
        let restores: Api<DynamicObject> = Api::namespaced_with(
            client.clone(),
            &namespace,
            &kind("EtcdRestore", "etcdrestores"),
        );
        let events: Api<Event> = Api::namespaced(client.clone(), &namespace);

        let version = etcd_version(fixture.env, "3.6")?;
        fixture
            .create_cluster_with(json!({"size": 3, "version": version}))
            .await?;
        fixture.wait_converged(3).await?;
        let endpoints = fixture.endpoints().await.map_err(anyhow::Error::msg)?;
        for n in 0..20 {
            fixture
                .etcdctl(&endpoints, &["put", &format!("key-{n:02}"), "v"])
                .await
                .map_err(anyhow::Error::msg)?;
        }

        // The classic manifest (the store's endpoint and the etcd image named, as the test
        // environment has no AWS and one etcd build per minor).
        apply(
            &backups,
            json!({
                "apiVersion": "etcd.database.coreos.com/v1beta2", "kind": "EtcdBackup",
                "metadata": {"name": "classic-backup"},
                "spec": {
                    "etcdEndpoints": [format!("http://{SOURCE}-client.{namespace}.svc:2379")],
                    "storageType": "S3",
                    "s3": {"path": PATH, "awsSecret": "aws", "endpoint": minio.endpoint,
                           "forcePathStyle": true},
                    "image": format!("gcr.io/etcd-development/etcd:v{version}"),
                },
            }),
        )
        .await?;
        let backed_up = status_when(&backups, "classic-backup", "the backup to succeed", |s| {
            s["succeeded"] == true
        })
        .await?;
        eprintln!("[{namespace}] EtcdBackup status: {backed_up}");
        anyhow::ensure!(
            backed_up["location"] == json!(format!("s3://{PATH}")),
            "{backed_up}"
        );
        let revision = backed_up["etcdRevision"].as_i64().unwrap_or_default();
        anyhow::ensure!(
            revision > 0 && backed_up["size"].as_i64() > Some(0),
            "{backed_up}"
        );
        // Verified: the snapshot's hash is the source's at the same revision.
        let source_hash = fixture.hash_kv(&endpoints[0], revision).await?;
        anyhow::ensure!(
            backed_up["hashKV"].as_u64() == Some(source_hash),
            "snapshot hashKV {} != source's {source_hash} at revision {revision}",
            backed_up["hashKV"]
        );
        let objects = minio.objects(BUCKET).await?;
        anyhow::ensure!(
            objects.contains("prod/etcd.backup"),
            "bucket {BUCKET} holds {objects:?}"
        );
        // The snapshot Pod goes once its result is recorded.
        eventually("the snapshot pod to go", CONVERGE, || async {
            let pods = fixture
                .pods_where("app.kubernetes.io/instance=classic-backup")
                .await?;
            if pods.is_empty() {
                Ok(())
            } else {
                Err(format!("{} snapshot pods", pods.len()))
            }
        })
        .await?;
        let at_backup = fixture.keys(&endpoints[0], "key-", Some(revision)).await?;
        anyhow::ensure!(
            at_backup.len() == 20,
            "{} keys at revision {revision}",
            at_backup.len()
        );

        // The classic restore manifest, with the restored cluster's size and version.
        let classic_restore = |name: &str, cluster: &str| {
            json!({
                "apiVersion": "etcd.database.coreos.com/v1beta2", "kind": "EtcdRestore",
                "metadata": {"name": name},
                "spec": {
                    "etcdCluster": {"name": cluster},
                    "backupStorageType": "S3",
                    "s3": {"path": PATH, "awsSecret": "aws", "endpoint": minio.endpoint},
                    "clusterSpec": {"size": 1, "version": version},
                },
            })
        };
        apply(&restores, classic_restore("classic-restore", RESTORED)).await?;
        // A restore naming the running source is refused, and the source left as it was.
        apply(&restores, classic_restore("onto-the-source", SOURCE)).await?;
        let restored = status_when(
            &restores,
            "classic-restore",
            "the restore to succeed",
            |s| s["succeeded"] == true,
        )
        .await?;
        eprintln!("[{namespace}] EtcdRestore status: {restored}");
        let refusal = eventually("the refusal of a taken name", WAIT, || async {
            let list = events
                .list(&ListParams::default())
                .await
                .map_err(|e| e.to_string())?;
            list.items
                .into_iter()
                .find(|e| {
                    e.regarding.as_ref().and_then(|r| r.name.as_deref()) == Some("onto-the-source")
                        && e.type_.as_deref() == Some("Warning")
                })
                .and_then(|e| e.note)
                .ok_or_else(|| "no Warning Event on onto-the-source yet".to_owned())
        })
        .await?;
        eprintln!("[{namespace}] onto-the-source: {refusal}");
        anyhow::ensure!(refusal.contains(SOURCE), "{refusal}");
        let source = fixture.cluster().await.map_err(anyhow::Error::msg)?;
        anyhow::ensure!(
            source["spec"].get("restore").is_none()
                && source["metadata"]["ownerReferences"].is_null(),
            "the source cluster was changed: {}",
            source["metadata"]
        );

        // The restored cluster holds the source's keys at the snapshot's revision, and is the
        // restore's child.
        fixture.name = RESTORED.to_owned();
        let cluster = fixture.cluster().await.map_err(anyhow::Error::msg)?;
        anyhow::ensure!(
            cluster["metadata"]["ownerReferences"][0]["name"] == "classic-restore",
            "{}",
            cluster["metadata"]
        );
        let restored_endpoints = fixture.endpoints().await.map_err(anyhow::Error::msg)?;
        let keys = fixture.keys(&restored_endpoints[0], "key-", None).await?;
        anyhow::ensure!(
            keys == at_backup,
            "restored {} keys, the source had {} at revision {revision}",
            keys.len(),
            at_backup.len()
        );
        Ok(())
    }
    .await;
    fixture.finish(outcome, &[SOURCE, RESTORED]).await
}
