//! What the host guarantees every plugin, against the real API server, with the misbehaving
//! test plugin: children applied with the host's controller owner reference, status through the
//! status subresource, Events, a finalizer while the plugin wants one, refusals of actions on
//! kinds it did not declare, and a crash in one parent that leaves the others reconciling.

use std::time::Duration;

use k8s_openapi::api::core::v1::{ConfigMap, Secret};
use k8s_openapi::api::events::v1::Event;
use kube::api::{Api, DeleteParams, DynamicObject, ListParams, Patch, PatchParams};
use policy_host::decide::Limits;
use policy_host_e2e::{HostUnderTest, init_logging, install_crd_object, probe_crd, probes};
use policy_host_testenv::{shared_node, wait_for};
use serde_json::{Value, json};

const WAIT: Duration = Duration::from_secs(90);

async fn events_for(events: &Api<Event>, name: &str) -> Vec<Event> {
    events
        .list(&ListParams::default())
        .await
        .map(|l| l.items)
        .unwrap_or_default()
        .into_iter()
        .filter(|e| e.regarding.as_ref().and_then(|r| r.name.as_deref()) == Some(name))
        .collect()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn host_applies_owns_and_contains_a_plugin() -> anyhow::Result<()> {
    init_logging();
    let env = shared_node().await?;
    let client = env.client().await?;
    install_crd_object(&client, probe_crd()?).await?;
    let namespace = env.create_namespace("host-contract").await?;
    let plugin = policy_host_test_plugins::build("misbehaving-policy")
        .map_err(|e| anyhow::anyhow!("{e}"))?;
    let limits = Limits {
        deadline: Duration::from_millis(500),
        ..Limits::default()
    };
    let host = HostUnderTest::start(env, &[plugin], &namespace, limits).await?;

    let api: Api<DynamicObject> = Api::namespaced_with(client.clone(), &namespace, &probes());
    let apply = |name: &str, behaviour: &str| {
        let object: Value = json!({
            "apiVersion": "test.policy-host.io/v1", "kind": "Probe",
            "metadata": { "name": name }, "spec": { "behaviour": behaviour }
        });
        let api = api.clone();
        let name = name.to_string();
        async move {
            api.patch(
                &name,
                &PatchParams::apply("e2e").force(),
                &Patch::Apply(&object),
            )
            .await
        }
    };
    apply("crashes", "trap").await?;
    apply("adopts", "adopt").await?;
    apply("good", "ok").await?;

    // The good parent reconciles although another parent's reconcile keeps crashing.
    let config_maps: Api<ConfigMap> = Api::namespaced(client.clone(), &namespace);
    let child = wait_for("good-out ConfigMap applied by the plugin", WAIT, || async {
        config_maps.get_opt("good-out").await.ok().flatten()
    })
    .await?;
    let owner = child
        .metadata
        .owner_references
        .clone()
        .unwrap_or_default()
        .into_iter()
        .next()
        .ok_or_else(|| anyhow::anyhow!("child has no owner reference"))?;
    assert_eq!(owner.kind, "Probe");
    assert_eq!(owner.name, "good");
    assert_eq!(
        owner.controller,
        Some(true),
        "the host sets controller: true"
    );
    assert_eq!(
        child
            .metadata
            .labels
            .unwrap_or_default()
            .get("policy-host.io/policy")
            .map(String::as_str),
        Some("misbehaving")
    );

    // Status went through the status subresource; the finalizer is on while the plugin wants it.
    let good = wait_for("good's status", WAIT, || async {
        let object = api.get_opt("good").await.ok().flatten()?;
        object.data.get("status")?.get("observedChildren")?;
        Some(object)
    })
    .await?;
    assert!(
        good.metadata
            .finalizers
            .unwrap_or_default()
            .contains(&"policy-host.io/misbehaving".to_string()),
        "finalizer present"
    );

    // The crash is an Event on its parent, with the reason and what to do.
    let events: Api<Event> = Api::namespaced(client.clone(), &namespace);
    let crash = wait_for("a PluginCrashed event on `crashes`", WAIT, || async {
        events_for(&events, "crashes")
            .await
            .into_iter()
            .find(|e| e.reason.as_deref() == Some("PluginCrashed"))
    })
    .await?;
    assert_eq!(crash.type_.as_deref(), Some("Warning"));
    assert!(crash.note.unwrap_or_default().contains("bug in the plugin"));

    // A kind it did not declare is refused: an Event, and no Secret.
    wait_for("an ActionRefused event on `adopts`", WAIT, || async {
        events_for(&events, "adopts")
            .await
            .into_iter()
            .find(|e| e.reason.as_deref() == Some("ActionRefused"))
    })
    .await?;
    let secrets: Api<Secret> = Api::namespaced(client.clone(), &namespace);
    assert!(
        secrets.get_opt("adopts-stolen").await?.is_none(),
        "no adopted Secret"
    );

    // Metrics count the reconciles and the failures per policy.
    let admin = host
        .running
        .admin_addr
        .ok_or_else(|| anyhow::anyhow!("no admin address"))?;
    let metrics = reqwest_get(&format!("http://{admin}/metrics")).await?;
    assert!(
        metrics.contains("policy_host_reconciles_total{policy=\"misbehaving\"}"),
        "{metrics}"
    );
    assert!(metrics.contains("reason=\"PluginCrashed\""), "{metrics}");
    assert_eq!(reqwest_get(&format!("http://{admin}/readyz")).await?, "ok");

    // Deleting the parent runs finalize, then the finalizer comes off and the object goes.
    api.delete("good", &DeleteParams::default()).await?;
    wait_for("good deleted after finalize", WAIT, || async {
        api.get_opt("good")
            .await
            .ok()
            .and_then(|o| o.is_none().then_some(()))
    })
    .await?;

    // Stop the host first so crashing parents can be deleted without their finalizer.
    host.stop().await;
    for name in ["crashes", "adopts"] {
        let patch = json!({ "metadata": { "finalizers": null } });
        let _ = api
            .patch(name, &PatchParams::default(), &Patch::Merge(&patch))
            .await;
    }
    Ok(())
}

async fn reqwest_get(url: &str) -> anyhow::Result<String> {
    Ok(policy_host::capability::http::http_client()?
        .get(url)
        .send()
        .await?
        .text()
        .await?)
}
