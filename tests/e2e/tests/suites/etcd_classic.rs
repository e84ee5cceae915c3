//! The classic etcd-operator's manifests, applied as written (`deploy/examples/classic/`):
//! its pod policy reaches the member pods and its DNS-wait fields are named as ignored, nothing
//! pruned by the CRD on the way; its static TLS is refused at `kubectl apply` (the CRD's CEL
//! rule) with what to do, and no member is started in plaintext.
//!
//! Runs policy-host in-process against the shared test environment, in a namespace of its own,
//! with the fixture of `policy_host_e2e::etcd`.

use kube::api::{ListParams, Patch, PatchParams};
use policy_host_e2e::etcd::{EtcdFixture, etcd_version};
use serde_json::Value;

/// A manifest of `deploy/examples/classic/`, with the etcd version of this environment.
fn manifest(file: &str, version: &str) -> anyhow::Result<Value> {
    let text = std::fs::read_to_string(
        policy_host_e2e::repo_root()
            .join("deploy/examples/classic")
            .join(file),
    )?;
    let mut cluster: Value = serde_yaml::from_str(&text)?;
    cluster["spec"]["version"] = Value::from(version);
    Ok(cluster)
}

fn condition<'a>(cluster: &'a Value, type_: &str) -> Option<&'a Value> {
    cluster["status"]["conditions"]
        .as_array()?
        .iter()
        .find(|c| c["type"] == type_)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn classic_manifests_are_honoured_or_refused_never_pruned() -> anyhow::Result<()> {
    let fixture = EtcdFixture::start("etcd-classic", "3.6", "classic-pod-policy").await?;
    let outcome = async {
        let version = etcd_version(fixture.env, "3.6")?;
        let clusters = &fixture.clusters;
        let apply = |cluster: Value| async move {
            let name = cluster["metadata"]["name"]
                .as_str()
                .unwrap_or_default()
                .to_owned();
            clusters
                .patch(
                    &name,
                    &PatchParams::apply("e2e").force(),
                    &Patch::Apply(&cluster),
                )
                .await
                .map(|_| name)
        };
        let name = apply(manifest("pod-policy.yaml", &version)?).await?;
        // What the API server kept: every classic field, none pruned.
        let stored = serde_json::to_value(fixture.clusters.get(&name).await?)?;
        anyhow::ensure!(
            stored["spec"]["pod"].get("busyboxImage").is_some(),
            "the CRD pruned the classic fields of pod-policy.yaml: {}",
            stored["spec"]
        );

        // Static TLS: refused at apply, saying what to do; nothing stored, so no member pod.
        let refused = match apply(manifest("static-tls.yaml", &version)?).await {
            Err(kube::Error::Api(status)) => status.message,
            other => anyhow::bail!("static TLS was not refused at apply: {other:?}"),
        };
        anyhow::ensure!(
            refused.contains("spec.TLS.static") && refused.contains("spec.tls"),
            "{refused}"
        );

        // The pod policy: members with the labels, annotations and environment asked for.
        fixture.wait_converged(3).await?;
        let pods = fixture.live_pods().await.map_err(anyhow::Error::msg)?;
        for pod in &pods {
            let labels = pod.metadata.labels.clone().unwrap_or_default();
            anyhow::ensure!(
                labels.get("team").map(String::as_str) == Some("storage"),
                "{labels:?}"
            );
            let annotations = pod.metadata.annotations.clone().unwrap_or_default();
            anyhow::ensure!(
                annotations.get("prometheus.io/scrape").map(String::as_str) == Some("true"),
                "{annotations:?}"
            );
            let env = pod
                .spec
                .as_ref()
                .and_then(|s| s.containers.first())
                .and_then(|c| c.env.clone())
                .unwrap_or_default();
            anyhow::ensure!(
                env.iter()
                    .any(|e| e.name == "ETCD_AUTO_COMPACTION_RETENTION"),
                "{env:?}"
            );
        }
        let cluster = fixture.cluster().await.map_err(anyhow::Error::msg)?;
        let ignored = condition(&cluster, "IgnoredFields")
            .cloned()
            .unwrap_or_default();
        let message = ignored["message"].as_str().unwrap_or_default();
        anyhow::ensure!(
            ignored["status"] == "True"
                && message.contains("busyboxImage")
                && message.contains("DNSTimeoutInSecond"),
            "{ignored}"
        );

        let tls_pods = fixture
            .pods
            .list(&ListParams::default().labels("app.kubernetes.io/instance=classic-static-tls"))
            .await?;
        anyhow::ensure!(
            tls_pods.items.is_empty(),
            "a refused cluster started members"
        );
        Ok(())
    }
    .await;
    fixture
        .finish(outcome, &["classic-pod-policy", "classic-static-tls"])
        .await
}
