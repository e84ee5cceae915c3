//! `kubectl policy-host`, each command against the real API server (run in-process, as the
//! `kubectl-policy_host` binary runs them): `status` shows a parent's conditions and the Pods
//! it controls; `pause`/`resume` set `spec.paused` and refuse a kind without it; `backup` sets
//! the trigger an EtcdBackup reads; `switchover` writes the annotation; `plugins` lists what a
//! running host loaded, with its grants; `simulate` runs that plugin on a live parent without
//! acting.

use std::time::Duration;

use k8s_openapi::api::core::v1::{ConfigMap, Pod};
use kube::api::{Api, DynamicObject, Patch, PatchParams, PostParams};
use kube::discovery::ApiResource;
use policy_host::capability::scope::Grants;
use policy_host::contract::Timestamp;
use policy_host::decide::Limits;
use policy_host::kubectl::{self, KubectlError, Target};
use policy_host::load::pack::{self, PackOptions};
use policy_host_e2e::{
    HostUnderTest, init_logging, install_crd, install_crd_object, plugins, probe_crd, probes,
};
use policy_host_testenv::{shared_node, wait_for};
use serde_json::json;

const WAIT: Duration = Duration::from_secs(90);
const MANAGER: &str = "kubectl-plugin-e2e";

fn etcd_clusters() -> ApiResource {
    ApiResource {
        group: "etcd.database.coreos.com".into(),
        version: "v1beta2".into(),
        api_version: "etcd.database.coreos.com/v1beta2".into(),
        kind: "EtcdCluster".into(),
        plural: "etcdclusters".into(),
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn each_command_reads_or_writes_what_it_says() -> anyhow::Result<()> {
    init_logging();
    let component = std::fs::read(
        policy_host_test_plugins::build_version("1.0.0").map_err(|e| anyhow::anyhow!("{e}"))?,
    )?;
    let env = shared_node().await?;
    let client = env.client().await?;
    install_crd_object(&client, probe_crd()?).await?;
    install_crd(&client, "deploy/crds/etcdcluster.yaml").await?;
    install_crd(&client, "deploy/crds/etcdbackup.yaml").await?;
    let namespace = env.create_namespace("kubectl-plugin").await?;
    let host = HostUnderTest::start_loading_config_maps(env, &namespace, Limits::default()).await?;
    let config_maps: Api<ConfigMap> = Api::namespaced(client.clone(), &namespace);
    let probes_api: Api<DynamicObject> =
        Api::namespaced_with(client.clone(), &namespace, &probes());
    let clusters: Api<DynamicObject> =
        Api::namespaced_with(client.clone(), &namespace, &etcd_clusters());
    let target = |text: &str| Target::parse(text, &namespace);

    let outcome = async {
        // A loaded plugin, and a parent it decides on.
        let grants = Grants {
            chaos: true,
            ..Grants::default()
        };
        let cm = pack::to_config_map(
            &component,
            &PackOptions {
                name: "kubectl-probe".into(),
                grants: grants.clone(),
                ..Default::default()
            },
        )?;
        plugins::apply_pack(&config_maps, cm, MANAGER).await?;
        let probe = json!({ "apiVersion": "test.policy-host.io/v1", "kind": "Probe",
            "metadata": { "name": "shown" }, "spec": { "behaviour": "ok" } });
        probes_api
            .patch("shown", &PatchParams::apply(MANAGER), &Patch::Apply(&probe))
            .await?;
        wait_for("the plugin's first status on the probe", WAIT, || async {
            let object = probes_api.get("shown").await.ok()?;
            object.data["status"]["pluginVersion"].as_str().map(|_| ())
        })
        .await?;

        // plugins: what the host loaded, with its grants.
        let listed = wait_for("the host's status ConfigMap to list the plugin", WAIT, || async {
            kubectl::plugins(&client, &namespace)
                .await
                .ok()
                .filter(|text| text.contains("misbehaving"))
        })
        .await?;
        anyhow::ensure!(
            listed.starts_with("PLUGIN")
                && listed.contains("1.0.0")
                && listed.contains("probes.test.policy-host.io/v1")
                && listed.contains("chaos"),
            "{listed}"
        );

        // simulate: the decision on the live parent, not carried out.
        let now = Timestamp {
            seconds: 1_800_000_000,
            nanoseconds: 0,
        };
        let simulated = kubectl::simulate(&client, &target("probe/shown")?, &namespace, now).await?;
        anyhow::ensure!(
            simulated.contains("misbehaving@1.0.0")
                && simulated.contains("apply ConfigMap shown-out")
                && simulated.contains("set-status"),
            "{simulated}"
        );
        let out: Api<ConfigMap> = Api::namespaced(client.clone(), &namespace);
        let child = out.get("shown-out").await?;
        anyhow::ensure!(
            child.data.unwrap_or_default().get("now").map(String::as_str) != Some("1800000000"),
            "simulate carried its decision out"
        );

        // status: conditions and the Pods a parent controls (an EtcdCluster no plugin runs
        // here, its status and Pod written by the test as a plugin would).
        let cluster = json!({ "apiVersion": "etcd.database.coreos.com/v1beta2", "kind": "EtcdCluster",
            "metadata": { "name": "shown" }, "spec": { "size": 3, "version": "3.6.16" } });
        let created = clusters
            .patch("shown", &PatchParams::apply(MANAGER), &Patch::Apply(&cluster))
            .await?;
        clusters
            .patch_status(
                "shown",
                &PatchParams::default(),
                &Patch::Merge(json!({ "status": { "phase": "Running", "conditions": [
                    { "type": "Available", "status": "True", "reason": "Quorum",
                      "message": "3 of 3 voters", "lastTransitionTime": "2026-11-26T20:00:00Z" } ] } })),
            )
            .await?;
        let pod: Pod = serde_json::from_value(json!({ "apiVersion": "v1", "kind": "Pod",
            "metadata": { "name": "shown-0", "ownerReferences": [{
                "apiVersion": "etcd.database.coreos.com/v1beta2", "kind": "EtcdCluster",
                "name": "shown", "uid": created.metadata.uid, "controller": true }] },
            "spec": { "containers": [{ "name": "etcd", "image": "gcr.io/etcd-development/etcd:v3.6.16",
                "command": ["sleep", "3600"] }] } }))?;
        Api::<Pod>::namespaced(client.clone(), &namespace)
            .create(&PostParams::default(), &pod)
            .await?;
        let shown = kubectl::status(&client, &target("etcdcluster/shown")?).await?;
        anyhow::ensure!(
            shown.contains("EtcdCluster")
                && shown.contains("phase Running")
                && shown.contains("Available")
                && shown.contains("3 of 3 voters")
                && shown.contains("shown-0")
                && shown.contains("gcr.io/etcd-development/etcd:v3.6.16"),
            "{shown}"
        );

        // pause / resume: spec.paused where the kind has it, a refusal where it has not.
        kubectl::pause(&client, &target("etcdcluster/shown")?, true).await?;
        anyhow::ensure!(clusters.get("shown").await?.data["spec"]["paused"] == json!(true));
        kubectl::pause(&client, &target("etcdclusters/shown")?, false).await?;
        anyhow::ensure!(clusters.get("shown").await?.data["spec"]["paused"] == json!(false));
        match kubectl::pause(&client, &target("probe/shown")?, true).await {
            Err(KubectlError::NotOffered { field, .. }) => {
                anyhow::ensure!(field == "spec.paused", "{field}")
            }
            other => anyhow::bail!("pausing a Probe: {other:?}"),
        }
        match kubectl::status(&client, &target("nosuchkind/x")?).await {
            Err(KubectlError::UnknownKind(kind)) => anyhow::ensure!(kind == "nosuchkind"),
            other => anyhow::bail!("an unknown kind: {other:?}"),
        }

        // backup: the trigger an EtcdBackup reads.
        let backups: Api<DynamicObject> = Api::namespaced_with(
            client.clone(),
            &namespace,
            &ApiResource {
                kind: "EtcdBackup".into(),
                plural: "etcdbackups".into(),
                ..etcd_clusters()
            },
        );
        let backup = json!({ "apiVersion": "etcd.database.coreos.com/v1beta2", "kind": "EtcdBackup",
            "metadata": { "name": "nightly" }, "spec": { "etcdEndpoints": ["http://shown-client:2379"],
            "storageType": "S3", "s3": { "path": "b/etcd.backup", "awsSecret": "aws" } } });
        backups
            .patch("nightly", &PatchParams::apply(MANAGER), &Patch::Apply(&backup))
            .await?;
        kubectl::backup(&client, &target("etcdbackup/nightly")?, "2026-11-26T21:00:00Z").await?;
        anyhow::ensure!(
            backups.get("nightly").await?.data["spec"]["trigger"] == json!("2026-11-26T21:00:00Z")
        );

        // switchover: the annotation of the kind's group.
        kubectl::switchover(&client, &target("probe/shown")?, "shown-1").await?;
        let annotations = probes_api.get("shown").await?.metadata.annotations.unwrap_or_default();
        anyhow::ensure!(
            annotations.get("test.policy-host.io/switchover-to").map(String::as_str)
                == Some("shown-1"),
            "{annotations:?}"
        );
        Ok::<_, anyhow::Error>(())
    }
    .await;
    host.stop().await;
    outcome
}
