//! Grants that bound what a plugin may create, against the real API server: a plugin loaded
//! from a ConfigMap with the default grants (baseline pod security) that applies a privileged
//! Pod gets `ActionRefused` and an Event, and nothing is written; granted `podSecurity:
//! privileged`, the same decision writes the Pod. A kind outside `grants.kinds` is refused the
//! same way.

use std::time::Duration;

use k8s_openapi::api::core::v1::{ConfigMap, Pod};
use k8s_openapi::api::events::v1::Event;
use kube::api::{Api, DynamicObject, Patch, PatchParams};
use policy_host::capability::scope::{Grants, PodSecurity};
use policy_host::decide::Limits;
use policy_host::load::pack::{self, PackOptions};
use policy_host_e2e::{
    HostUnderTest, init_logging, install_crd_object, plugins, probe_crd, probes,
};
use policy_host_testenv::{shared_node, wait_for};
use serde_json::json;

const WAIT: Duration = Duration::from_secs(90);
const PACK: &str = "plugin-granted";

/// Applies the pack with `grants` and waits until `host` runs the plugin with them: a parent
/// created before that may be decided under the grants it replaces (the host reads the
/// ConfigMap and the parent from two watches), which is not what the test is about.
async fn apply_pack(
    host: &HostUnderTest,
    config_maps: &Api<ConfigMap>,
    component: &[u8],
    grants: Grants,
) -> anyhow::Result<()> {
    let cm = pack::to_config_map(
        component,
        &PackOptions {
            name: PACK.into(),
            grants: grants.clone(),
            ..Default::default()
        },
    )?;
    plugins::apply_pack(config_maps, cm, "plugin-grants-e2e").await?;
    wait_for(
        "the host to run the plugin with the new grants",
        WAIT,
        || async {
            host.running
                .store
                .list()
                .iter()
                .any(|loaded| loaded.grants == grants)
                .then_some(())
        },
    )
    .await?;
    Ok(())
}

async fn apply_probe(api: &Api<DynamicObject>, name: &str, behaviour: &str) -> anyhow::Result<()> {
    let object = json!({
        "apiVersion": "test.policy-host.io/v1", "kind": "Probe",
        "metadata": { "name": name }, "spec": { "behaviour": behaviour }
    });
    api.patch(
        name,
        &PatchParams::apply("plugin-grants-e2e").force(),
        &Patch::Apply(&object),
    )
    .await?;
    Ok(())
}

/// The note of an `ActionRefused` Event on `probe` that contains `fragment`.
async fn refusal(events: &Api<Event>, probe: &str, fragment: &str) -> anyhow::Result<String> {
    let event = plugins::event_about(events, probe, "ActionRefused", |note| {
        note.contains(fragment)
    })
    .await?;
    Ok(event.note.unwrap_or_default())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn writes_outside_the_grants_are_refused_and_nothing_is_written() -> anyhow::Result<()> {
    init_logging();
    let component = std::fs::read(
        policy_host_test_plugins::build_version("1.0.0").map_err(|e| anyhow::anyhow!("{e}"))?,
    )?;
    let env = shared_node().await?;
    let client = env.client().await?;
    install_crd_object(&client, probe_crd()?).await?;
    let namespace = env.create_namespace("plugin-grants").await?;
    let host = HostUnderTest::start_loading_config_maps(env, &namespace, Limits::default()).await?;
    let config_maps: Api<ConfigMap> = Api::namespaced(client.clone(), &namespace);
    let events: Api<Event> = Api::namespaced(client.clone(), &namespace);
    let pods: Api<Pod> = Api::namespaced(client.clone(), &namespace);
    let api: Api<DynamicObject> = Api::namespaced_with(client.clone(), &namespace, &probes());

    let outcome = async {
        // Default grants: baseline pod security.
        apply_pack(&host, &config_maps, &component, Grants::default()).await?;
        apply_probe(&api, "escalates", "privileged-pod").await?;
        let note = refusal(&events, "escalates", "privileged").await?;
        anyhow::ensure!(note.contains("podSecurity: privileged"), "{note}");
        anyhow::ensure!(
            pods.get_opt("escalates-priv").await?.is_none(),
            "a refused decision wrote its Pod"
        );

        // Only Pods granted: the ConfigMap the `ok` behaviour applies is refused.
        apply_pack(
            &host,
            &config_maps,
            &component,
            Grants {
                kinds: Some(vec!["pods.v1".into()]),
                ..Grants::default()
            },
        )
        .await?;
        apply_probe(&api, "configures", "ok").await?;
        let note = refusal(&events, "configures", "configmaps.v1").await?;
        anyhow::ensure!(note.contains("grants"), "{note}");
        anyhow::ensure!(
            config_maps.get_opt("configures-out").await?.is_none(),
            "a refused decision wrote its ConfigMap"
        );

        // The admin grants privileged pods: the same decision now writes the Pod.
        apply_pack(
            &host,
            &config_maps,
            &component,
            Grants {
                pod_security: PodSecurity::Privileged,
                ..Grants::default()
            },
        )
        .await?;
        wait_for("the privileged Pod, once granted", WAIT, || async {
            pods.get_opt("escalates-priv").await.ok().flatten()
        })
        .await?;
        Ok(())
    }
    .await;
    host.stop().await;
    for name in ["escalates", "configures"] {
        let _ = api
            .patch(
                name,
                &PatchParams::default(),
                &Patch::Merge(&json!({ "metadata": { "finalizers": null } })),
            )
            .await;
    }
    outcome
}
