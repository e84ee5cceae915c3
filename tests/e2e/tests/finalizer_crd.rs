//! Nothing is stranded when a CRD goes (issue 12 item 6, the CRD case): a parent whose plugin
//! was unloaded still carries the plugin's finalizer; deleting its CRD deletes the parent, the
//! host releases the finalizer after its grace, and the CRD is gone. In a test binary of its own: deleting the Probe CRD would pull it from under every
//! other suite that shares this process's control plane.

use std::time::Duration;

use k8s_openapi::api::core::v1::ConfigMap;
use k8s_openapi::apiextensions_apiserver::pkg::apis::apiextensions::v1::CustomResourceDefinition;
use kube::api::{Api, DeleteParams, DynamicObject, Patch, PatchParams};
use policy_host::Settings;
use policy_host::decide::Limits;
use policy_host::load::pack::{self, PackOptions};
use policy_host_e2e::{HostUnderTest, init_logging, install_crd_object, probe_crd, probes};
use policy_host_testenv::{shared_node, wait_for};
use serde_json::json;

const WAIT: Duration = Duration::from_secs(90);

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_crd_deleted_after_its_plugin_was_unloaded_goes_with_its_parents() -> anyhow::Result<()> {
    init_logging();
    let env = shared_node().await?;
    let client = env.client().await?;
    let crd_name = install_crd_object(&client, probe_crd()?).await?;
    let namespace = env.create_namespace("crd-gone").await?;
    let component = std::fs::read(
        policy_host_test_plugins::build("misbehaving-policy")
            .map_err(|e| anyhow::anyhow!("{e}"))?,
    )?;
    let mut settings = Settings {
        plugin_namespace: Some(namespace.to_string()),
        ..HostUnderTest::settings(&namespace, Limits::default())?
    };
    settings.controller.finalizer_grace = Duration::from_secs(2);
    let host = HostUnderTest::start_with(env, settings).await?;
    let config_maps: Api<ConfigMap> = Api::namespaced(client.clone(), &namespace);
    let pack = pack::to_config_map(
        &component,
        &PackOptions {
            name: "plugin-probe".into(),
            ..Default::default()
        },
    )?;
    config_maps
        .patch(
            "plugin-probe",
            &PatchParams::apply("e2e").force(),
            &Patch::Apply(&pack),
        )
        .await?;
    let api: Api<DynamicObject> = Api::namespaced_with(client.clone(), &namespace, &probes());
    let probe = json!({
        "apiVersion": "test.policy-host.io/v1", "kind": "Probe",
        "metadata": { "name": "left-behind" }, "spec": { "behaviour": "ok" }
    });
    api.patch(
        "left-behind",
        &PatchParams::apply("e2e").force(),
        &Patch::Apply(&probe),
    )
    .await?;
    wait_for("the plugin's finalizer on the parent", WAIT, || async {
        let object = api.get_opt("left-behind").await.ok().flatten()?;
        object
            .metadata
            .finalizers?
            .iter()
            .any(|f| f == "policy-host.io/misbehaving")
            .then_some(())
    })
    .await?;

    // The plugin is unloaded, then its kind's CRD is deleted.
    config_maps
        .delete("plugin-probe", &DeleteParams::default())
        .await?;
    let store = host.running.store.clone();
    wait_for("the plugin unloaded", WAIT, || async {
        store.get("misbehaving").is_none().then_some(())
    })
    .await?;
    let crds: Api<CustomResourceDefinition> = Api::all(client.clone());
    crds.delete(&crd_name, &DeleteParams::default()).await?;
    wait_for(&format!("CRD {crd_name} gone"), WAIT, || async {
        crds.get_opt(&crd_name)
            .await
            .ok()
            .and_then(|c| c.is_none().then_some(()))
    })
    .await?;
    host.stop().await;
    Ok(())
}
