//! Database maintenance on real etcd: a cluster with a small backend quota is filled by a
//! writer overwriting a few keys with large values until etcd raises NOSPACE and refuses
//! writes; with `recoverFromNoSpace` the plugin compacts, defragments every member and disarms
//! the alarm, the writer goes on, and every key holds the last value etcd acknowledged.
//!
//! Runs policy-host in-process against the shared test environment, in a namespace of its own,
//! with the fixture of `policy_host_e2e::etcd`.

use std::time::Duration;

use policy_host_e2e::etcd::{EtcdFixture, etcd_version, eventually};
use serde_json::json;

const NAME: &str = "quota";
const QUOTA: i64 = 16 << 20;
const KEYS: usize = 4;

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_full_database_recovers_from_nospace_and_keeps_every_acknowledged_write()
-> anyhow::Result<()> {
    let fixture = EtcdFixture::start("etcd-maintenance", "3.6", NAME).await?;
    let outcome = async {
        let version = etcd_version(fixture.env, "3.6")?;
        fixture
            .create_cluster_with(json!({"size": 3, "version": version,
                "maintenance": {"quotaBackendBytes": QUOTA, "recoverFromNoSpace": false}}))
            .await?;
        fixture.wait_converged(3).await?;

        // Fill the quota with history: the same few keys over and over, 120 KiB each time (a
        // command-line argument may not pass 128 KiB).
        let value = "v".repeat(120 << 10);
        let mut last: Vec<Option<String>> = vec![None; KEYS];
        let mut refused = None;
        for n in 0..600 {
            let endpoints = fixture.endpoints().await.map_err(anyhow::Error::msg)?;
            let key = format!("big-{}", n % KEYS);
            let stamped = format!("{n}:{value}");
            match fixture.etcdctl(&endpoints, &["put", &key, &stamped]).await {
                Ok(_) => last[n % KEYS] = Some(stamped),
                Err(why) => {
                    refused = Some((why, n % KEYS, stamped));
                    break;
                }
            }
        }
        let (refused, refused_key, refused_value) =
            refused.ok_or_else(|| anyhow::anyhow!("600 large writes never hit the quota"))?;
        anyhow::ensure!(refused.contains("space exceeded"), "{refused}");

        // Reported, with what to do, while recovery is not allowed.
        eventually("NOSPACE reported", Duration::from_secs(90), || async {
            let cluster = fixture.cluster().await?;
            let degraded = cluster["status"]["conditions"]
                .as_array()
                .into_iter()
                .flatten()
                .find(|c| c["type"] == "Degraded")
                .cloned()
                .unwrap_or_default();
            if degraded["reason"] == "NoSpace" {
                Ok(())
            } else {
                Err(format!("{degraded}"))
            }
        })
        .await?;

        // Allowed: compacted, defragmented, disarmed; writes go through again.
        fixture
            .patch_spec(
                json!({"maintenance": {"quotaBackendBytes": QUOTA, "recoverFromNoSpace": true}}),
            )
            .await?;
        eventually(
            "writes accepted again",
            Duration::from_secs(120),
            || async {
                let endpoints = fixture.endpoints().await?;
                fixture
                    .etcdctl(&endpoints, &["put", "after-recovery", "ok"])
                    .await
                    .map(|_| ())
            },
        )
        .await?;

        // Every key holds the last value etcd acknowledged. The write refused with NOSPACE is
        // the one exception: etcd checks the quota again when it applies an entry, and a put
        // that crosses it there is applied and still answered "database space exceeded"
        // (`quotaApplierV3::Put` in etcd's server), so its key may hold either value.
        let endpoints = fixture.endpoints().await.map_err(anyhow::Error::msg)?;
        for (n, acknowledged) in last.iter().enumerate() {
            let Some(acknowledged) = acknowledged else {
                continue;
            };
            let held = fixture
                .etcdctl(
                    &endpoints,
                    &["get", &format!("big-{n}"), "--print-value-only"],
                )
                .await
                .map_err(anyhow::Error::msg)?;
            let held_value = held.trim_end();
            let refused_but_applied = n == refused_key && held_value == refused_value;
            anyhow::ensure!(
                held_value == acknowledged || refused_but_applied,
                "big-{n} lost its acknowledged value (holds {} bytes starting {:?})",
                held.len(),
                held.get(..12)
            );
        }
        Ok(())
    }
    .await;
    fixture.finish(outcome, &[NAME]).await
}
