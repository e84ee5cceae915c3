//! What a parent at steady state costs and gets (issue 28), through the real host against the
//! real kube-apiserver, with the misbehaving test plugin's `steady` behaviour: no API write
//! while nothing changes, a child edited by hand put back at once, and every parent reconciled
//! again and again when the decisions asked for are twice what the controller can make.

use std::collections::HashMap;
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Duration;

use k8s_openapi::api::core::v1::ConfigMap;
use k8s_openapi::api::events::v1::Event;
use kube::api::{Api, DynamicObject, ListParams, Patch, PatchParams, PostParams};
use policy_host::decide::Limits;
use policy_host::{Running, Settings};
use policy_host_e2e::{
    HostUnderTest, client_counting_writes, init_logging, install_crd_object, probe_crd, probes,
};
use policy_host_testenv::{TestEnv, TestNamespace, shared_node, wait_for};
use serde_json::{Value, json};

const WAIT: Duration = Duration::from_secs(90);

/// The value of the series `series` (name and labels, as rendered) on the host's metrics.
fn metric(running: &Running, series: &str) -> u64 {
    running
        .metrics
        .render()
        .lines()
        .find(|l| {
            l.strip_prefix(series)
                .is_some_and(|rest| rest.starts_with(' '))
        })
        .and_then(|l| l.rsplit(' ').next())
        .and_then(|n| n.parse().ok())
        .unwrap_or(0)
}

const RECONCILES: &str = "policy_host_reconciles_total{policy=\"misbehaving\"}";
const APPLIES_SENT: &str =
    "policy_host_child_applies_total{policy=\"misbehaving\",outcome=\"sent\"}";
const APPLIES_SKIPPED: &str =
    "policy_host_child_applies_total{policy=\"misbehaving\",outcome=\"skipped\"}";

/// Waits until the host has started `more` reconciles after the ones counted now.
async fn more_reconciles(running: &Running, more: u64) -> anyhow::Result<()> {
    let until = metric(running, RECONCILES) + more;
    wait_for(&format!("{more} more reconciles"), WAIT, || async {
        (metric(running, RECONCILES) >= until).then_some(())
    })
    .await?;
    Ok(())
}

fn steady_probe(name: &str, spec: Value) -> anyhow::Result<DynamicObject> {
    let mut spec = spec;
    spec["behaviour"] = json!("steady");
    Ok(serde_json::from_value(json!({
        "apiVersion": "test.policy-host.io/v1", "kind": "Probe",
        "metadata": { "name": name }, "spec": spec,
    }))?)
}

/// A namespace with the Probe CRD installed, the test plugin built, and the settings of a host
/// reconciling there.
async fn prepared(env: &TestEnv, prefix: &str) -> anyhow::Result<(TestNamespace, Settings)> {
    let client = env.client().await?;
    install_crd_object(&client, probe_crd()?).await?;
    let namespace = env.create_namespace(prefix).await?;
    let plugin = policy_host_test_plugins::build("misbehaving-policy")
        .map_err(|e| anyhow::anyhow!("{e}"))?;
    let settings = Settings {
        policy_files: vec![plugin],
        ..HostUnderTest::settings(&namespace, Limits::default())?
    };
    Ok((namespace, settings))
}

/// Stops the host, then removes the test plugin's finalizer so the namespace can go.
async fn release_finalizers(host: HostUnderTest, api: &Api<DynamicObject>, names: &[String]) {
    host.stop().await;
    for name in names {
        let patch = json!({ "metadata": { "finalizers": null } });
        let _ = api
            .patch(name, &PatchParams::default(), &Patch::Merge(&patch))
            .await;
    }
}

/// A parent whose decision re-applies the same three children every second writes nothing
/// once they exist: the host's own count of skipped applies aside, the API server receives
/// no write to a ConfigMap from the host (counted on the host's own client).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_parent_at_steady_state_costs_no_api_write() -> anyhow::Result<()> {
    init_logging();
    let env = shared_node().await?;
    let (namespace, settings) = prepared(env, "steady-writes").await?;
    let client = env.client().await?;
    let writes = Arc::new(AtomicU64::new(0));
    let host_client = client_counting_writes(env, "/configmaps", writes.clone()).await?;
    let host = HostUnderTest::start_with_client(host_client, settings).await?;
    let api: Api<DynamicObject> = Api::namespaced_with(client.clone(), &namespace, &probes());
    api.create(
        &PostParams::default(),
        &steady_probe("still", json!({ "applies": 3, "requeueMs": 1000 }))?,
    )
    .await?;
    let config_maps: Api<ConfigMap> = Api::namespaced(client, &namespace);
    wait_for("the three children applied", WAIT, || async {
        let listed = config_maps
            .list(&ListParams::default().labels("policy-host.io/policy=misbehaving"))
            .await
            .ok()?;
        (listed.items.len() == 3).then_some(())
    })
    .await?;
    // The reconciles the children's creation triggers see them in the cache.
    more_reconciles(&host.running, 2).await?;
    let (writes_before, skipped_before) = (
        writes.load(Ordering::Relaxed),
        metric(&host.running, APPLIES_SKIPPED),
    );
    more_reconciles(&host.running, 5).await?;
    let written = writes.load(Ordering::Relaxed) - writes_before;
    let skipped = metric(&host.running, APPLIES_SKIPPED) - skipped_before;
    release_finalizers(host, &api, &["still".to_owned()]).await;
    assert_eq!(
        written, 0,
        "ConfigMap writes over 5 reconciles of a parent whose children are as applied"
    );
    assert!(
        skipped >= 15,
        "3 applies skipped per reconcile, got {skipped}"
    );
    Ok(())
}

/// A child edited by hand is applied again by the reconcile its own change triggers: the
/// parent's requeue is ten minutes away, so nothing else can put it back within the wait.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_child_edited_by_hand_is_put_back_before_the_next_requeue() -> anyhow::Result<()> {
    init_logging();
    let env = shared_node().await?;
    let (namespace, settings) = prepared(env, "steady-drift").await?;
    let client = env.client().await?;
    let host = HostUnderTest::start_with(env, settings).await?;
    let api: Api<DynamicObject> = Api::namespaced_with(client.clone(), &namespace, &probes());
    api.create(
        &PostParams::default(),
        &steady_probe("kept", json!({ "applies": 1, "requeueMs": 600_000 }))?,
    )
    .await?;
    let config_maps: Api<ConfigMap> = Api::namespaced(client, &namespace);
    let behaviour =
        |map: Option<ConfigMap>| -> Option<String> { map?.data?.get("behaviour").cloned() };
    // Applied, then skipped once: the host holds its last apply of the child.
    wait_for(
        "the child applied, then its apply skipped",
        WAIT,
        || async {
            let data = behaviour(config_maps.get_opt("kept-steady-0").await.ok()?)?;
            (data == "steady" && metric(&host.running, APPLIES_SKIPPED) >= 1).then_some(())
        },
    )
    .await?;
    let sent_before = metric(&host.running, APPLIES_SENT);
    config_maps
        .patch(
            "kept-steady-0",
            &PatchParams::default(),
            &Patch::Merge(json!({ "data": { "behaviour": "edited by hand" } })),
        )
        .await?;
    wait_for("the hand edit undone by the host", WAIT, || async {
        let data = behaviour(config_maps.get_opt("kept-steady-0").await.ok()?)?;
        (data == "steady").then_some(())
    })
    .await?;
    let sent = metric(&host.running, APPLIES_SENT) - sent_before;
    release_finalizers(host, &api, &["kept".to_owned()]).await;
    assert!(sent >= 1, "the repair was an apply the host sent");
    Ok(())
}

/// Decisions per parent, counted by their `Decided` Events, by parent name.
async fn decisions(events: &Api<Event>) -> HashMap<String, usize> {
    let mut counts = HashMap::new();
    for event in events
        .list(&ListParams::default())
        .await
        .map(|l| l.items)
        .unwrap_or_default()
    {
        if event.reason.as_deref() == Some("Decided")
            && let Some(name) = event.regarding.and_then(|r| r.name)
        {
            *counts.entry(name).or_insert(0) += 1;
        }
    }
    counts
}

/// 24 parents, each asking to be decided again 1.5 s after its decision, and a decision that
/// takes 250 ms with 2 in flight: 16 decisions a second asked for, at most 8 made. Every parent
/// is still decided again and again (later than it asked, in turn), none is left behind, and a
/// change to the parent decided least is decided. kube-runtime's own queue took parents in its
/// hash set's order under such an overload: the same ones every time, the others never.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn every_parent_is_reconciled_in_turn_when_twice_as_many_are_due() -> anyhow::Result<()> {
    init_logging();
    let env = shared_node().await?;
    let (namespace, settings) = prepared(env, "overload").await?;
    let settings = Settings {
        controller: policy_host::controller::ControllerOptions {
            concurrency: 2,
            ..settings.controller
        },
        ..settings
    };
    let client = env.client().await?;
    let api: Api<DynamicObject> = Api::namespaced_with(client.clone(), &namespace, &probes());
    let names: Vec<String> = (0..24).map(|i| format!("busy-{i:02}")).collect();
    for name in &names {
        let spec = json!({ "requeueMs": 1500, "sleepMs": 250, "recordEvent": true, "change": 0 });
        api.create(&PostParams::default(), &steady_probe(name, spec)?)
            .await?;
    }
    let host = HostUnderTest::start_with(env, settings).await?;
    let events: Api<Event> = Api::namespaced(client, &namespace);
    let reached = wait_for("every parent decided three times", WAIT, || async {
        let counts = decisions(&events).await;
        names
            .iter()
            .all(|name| counts.get(name).copied().unwrap_or(0) >= 3)
            .then_some(())
    })
    .await;
    let counts = decisions(&events).await;
    if let Err(error) = reached {
        release_finalizers(host, &api, &names).await;
        let mut left_behind: Vec<_> = names
            .iter()
            .map(|name| (counts.get(name).copied().unwrap_or(0), name))
            .filter(|(count, _)| *count < 3)
            .collect();
        left_behind.sort();
        anyhow::bail!("{error}: decisions of the parents left behind: {left_behind:?}");
    }
    let least = names
        .iter()
        .min_by_key(|name| counts.get(*name).copied().unwrap_or(0))
        .cloned()
        .unwrap_or_default();
    api.patch(
        &least,
        &PatchParams::default(),
        &Patch::Merge(json!({ "spec": { "change": 1 } })),
    )
    .await?;
    let decided = wait_for(&format!("the change to {least} decided"), WAIT, || async {
        events
            .list(&ListParams::default())
            .await
            .ok()?
            .items
            .iter()
            .any(|e| {
                e.reason.as_deref() == Some("Decided")
                    && e.note
                        .as_deref()
                        .is_some_and(|n| n.starts_with(&format!("{least} decided: change=1 ")))
            })
            .then_some(())
    })
    .await;
    release_finalizers(host, &api, &names).await;
    decided?;
    Ok(())
}
