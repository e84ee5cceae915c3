//! Plugins loaded through ConfigMaps, against the real API server: v1 loads and decides, v2
//! swaps in with no restart, broken versions are refused with an Event while v2 keeps deciding,
//! deleting the ConfigMap stops the controller, and a shadow version is compared without acting
//! until it is promoted. The `misbehaving` test plugin is built in
//! versions that write their own version into each Probe's status, so every decision says
//! which version made it.

use std::time::Duration;

use k8s_openapi::ByteString;
use k8s_openapi::api::core::v1::ConfigMap;
use k8s_openapi::api::events::v1::Event;
use kube::api::{Api, DeleteParams, DynamicObject, Patch, PatchParams};
use policy_host::decide::Limits;
use policy_host::load::pack::{self, PackOptions};
use policy_host_e2e::{
    HostUnderTest, init_logging, install_crd_object, plugins, probe_crd, probes,
};
use policy_host_testenv::{shared_node, wait_for};
use serde_json::{Value, json};

const WAIT: Duration = Duration::from_secs(90);
const PACK: &str = "plugin-probe";

fn build(version: &str) -> anyhow::Result<Vec<u8>> {
    let path =
        policy_host_test_plugins::build_version(version).map_err(|e| anyhow::anyhow!("{e}"))?;
    Ok(std::fs::read(path)?)
}

/// The pack `policy-host pack` would write for `component`.
fn packed(component: &[u8]) -> anyhow::Result<ConfigMap> {
    Ok(pack::to_config_map(
        component,
        &PackOptions {
            name: PACK.into(),
            ..Default::default()
        },
    )?)
}

/// A pack carrying `bytes` raw, with no pin: for components the CLI would refuse to pack.
fn raw_pack(bytes: &[u8]) -> ConfigMap {
    ConfigMap {
        metadata: k8s_openapi::apimachinery::pkg::apis::meta::v1::ObjectMeta {
            name: Some(PACK.into()),
            labels: Some([(pack::PLUGIN_LABEL.to_string(), "true".to_string())].into()),
            ..Default::default()
        },
        binary_data: Some([(pack::RAW_KEY.to_string(), ByteString(bytes.to_vec()))].into()),
        data: Some(Default::default()),
        ..Default::default()
    }
}

/// Replaces the pack (a full replace, so keys of an earlier version do not linger).
async fn apply_pack(config_maps: &Api<ConfigMap>, cm: ConfigMap) -> anyhow::Result<()> {
    plugins::apply_pack(config_maps, cm, "plugin-loading-e2e").await
}

async fn apply_probe(api: &Api<DynamicObject>, name: &str, touch: &str) -> anyhow::Result<()> {
    let object = json!({
        "apiVersion": "test.policy-host.io/v1", "kind": "Probe",
        "metadata": { "name": name }, "spec": { "behaviour": "ok", "touch": touch }
    });
    api.patch(
        name,
        &PatchParams::apply("plugin-loading-e2e").force(),
        &Patch::Apply(&object),
    )
    .await?;
    Ok(())
}

async fn plugin_version_in_status(api: &Api<DynamicObject>, name: &str) -> Option<String> {
    let object = api.get_opt(name).await.ok().flatten()?;
    Some(
        object
            .data
            .get("status")?
            .get("pluginVersion")?
            .as_str()?
            .to_string(),
    )
}

async fn wait_decided_by(
    api: &Api<DynamicObject>,
    name: &str,
    version: &str,
) -> anyhow::Result<()> {
    wait_for(
        &format!("{name} decided by version {version}"),
        WAIT,
        || async {
            (plugin_version_in_status(api, name).await.as_deref() == Some(version)).then_some(())
        },
    )
    .await?;
    Ok(())
}

async fn pack_event(events: &Api<Event>, reason: &str) -> anyhow::Result<Event> {
    event_about(events, PACK, reason).await
}

/// Waits until the host's status ConfigMap has `key` with `fragment` in it (or, with `None`,
/// no `key` at all).
async fn status_entry(
    config_maps: &Api<ConfigMap>,
    key: &str,
    fragment: Option<&str>,
) -> anyhow::Result<()> {
    wait_for(
        &format!("policy-host-status key {key}: {fragment:?}"),
        WAIT,
        || async {
            let cm = config_maps.get_opt("policy-host-status").await.ok()??;
            let entry = cm.data.unwrap_or_default().get(key).cloned();
            match (fragment, entry) {
                (None, None) => Some(()),
                (Some(fragment), Some(text)) if text.contains(fragment) => Some(()),
                _ => None,
            }
        },
    )
    .await?;
    Ok(())
}

async fn get(url: &str) -> anyhow::Result<String> {
    Ok(policy_host::capability::http::http_client()?
        .get(url)
        .send()
        .await?
        .text()
        .await?)
}

async fn loaded_plugins(admin: std::net::SocketAddr) -> anyhow::Result<Vec<Value>> {
    let text = get(&format!("http://{admin}/plugins")).await?;
    Ok(serde_json::from_str(&text)?)
}

/// Removes the plugin's finalizers so the namespace can go once no host runs.
async fn release(api: &Api<DynamicObject>, names: &[&str]) {
    for name in names {
        let patch = json!({ "metadata": { "finalizers": null } });
        let _ = api
            .patch(name, &PatchParams::default(), &Patch::Merge(&patch))
            .await;
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn config_map_plugins_load_swap_refuse_and_unload() -> anyhow::Result<()> {
    init_logging();
    let (v1, v2) = (build("1.0.0")?, build("2.0.0")?);
    let env = shared_node().await?;
    let client = env.client().await?;
    install_crd_object(&client, probe_crd()?).await?;
    let namespace = env.create_namespace("plugin-loading").await?;
    let limits = Limits {
        deadline: Duration::from_secs(2),
        ..Limits::default()
    };
    let host = HostUnderTest::start_loading_config_maps(env, &namespace, limits).await?;
    let admin = host
        .running
        .admin_addr
        .ok_or_else(|| anyhow::anyhow!("no admin address"))?;
    let config_maps: Api<ConfigMap> = Api::namespaced(client.clone(), &namespace);
    let events: Api<Event> = Api::namespaced(client.clone(), &namespace);
    let api: Api<DynamicObject> = Api::namespaced_with(client.clone(), &namespace, &probes());

    // v1 through a ConfigMap: the CR reconciles, and the host says what it loaded.
    apply_pack(&config_maps, packed(&v1)?).await?;
    apply_probe(&api, "first", "a").await?;
    wait_decided_by(&api, "first", "1.0.0").await?;
    pack_event(&events, "PluginLoaded").await?;
    status_entry(&config_maps, "misbehaving", Some("version: 1.0.0")).await?;
    let listed = loaded_plugins(admin).await?;
    assert_eq!(listed.len(), 1, "{listed:?}");
    assert_eq!(listed[0]["name"], "misbehaving");
    assert_eq!(listed[0]["version"], "1.0.0");
    assert_eq!(listed[0]["sha256"], pack::sha256_hex(&v1));
    assert_eq!(listed[0]["target"], "probes.test.policy-host.io/v1");
    assert_eq!(listed[0]["source"], format!("configmap {namespace}/{PACK}"));
    assert!(
        listed[0]["since"].as_str().is_some_and(|s| !s.is_empty()),
        "{listed:?}"
    );

    // v2: the same host, no restart; the swap alone makes every parent decide again.
    apply_pack(&config_maps, packed(&v2)?).await?;
    wait_decided_by(&api, "first", "2.0.0").await?;
    apply_probe(&api, "second", "a").await?;
    wait_decided_by(&api, "second", "2.0.0").await?;
    pack_event(&events, "PluginSwapped").await?;
    status_entry(&config_maps, "misbehaving", Some("version: 2.0.0")).await?;

    // Broken v3s: each refused with an Event saying why; v2 keeps deciding.
    let mut pinned_wrong = packed(&v1)?;
    pinned_wrong
        .data
        .get_or_insert_with(Default::default)
        .insert(pack::SHA256_KEY.into(), pack::sha256_hex(&v2));
    let broken: Vec<(&str, ConfigMap)> = vec![
        (
            "PluginNotAComponent",
            raw_pack(b"this is a text file, not a plugin"),
        ),
        ("PluginWrongWorld", raw_pack(b"\0asm\x0d\0\x01\0")),
        ("PluginChecksumMismatch", pinned_wrong),
    ];
    for (reason, cm) in broken {
        apply_pack(&config_maps, cm).await?;
        let event = pack_event(&events, reason).await?;
        assert_eq!(event.type_.as_deref(), Some("Warning"), "{reason}");
        let note = event.note.unwrap_or_default();
        assert!(
            note.contains("misbehaving@2.0.0 keeps running"),
            "{reason}: {note}"
        );
    }
    apply_probe(&api, "third", "a").await?;
    wait_decided_by(&api, "third", "2.0.0").await?;
    apply_probe(&api, "first", "b").await?;
    wait_decided_by(&api, "first", "2.0.0").await?;
    assert_eq!(loaded_plugins(admin).await?[0]["version"], "2.0.0");
    let metrics = get(&format!("http://{admin}/metrics")).await?;
    for outcome in [
        "Loaded",
        "Swapped",
        "PluginNotAComponent",
        "PluginWrongWorld",
        "PluginChecksumMismatch",
    ] {
        assert!(
            metrics.contains(&format!("outcome=\"{outcome}\"")),
            "no plugin_loads count for {outcome}:\n{metrics}"
        );
    }

    // Delete: the policy is unloaded and its controller stops.
    config_maps.delete(PACK, &DeleteParams::default()).await?;
    pack_event(&events, "PluginUnloaded").await?;
    wait_for("the controller of `misbehaving` stopped", WAIT, || async {
        let metrics = get(&format!("http://{admin}/metrics")).await.ok()?;
        metrics
            .contains("policy_host_controllers{policy=\"misbehaving\"} 0")
            .then_some(())
    })
    .await?;
    assert!(loaded_plugins(admin).await?.is_empty());
    status_entry(&config_maps, "misbehaving", None).await?;
    // A parent created now gets no decision. (A bounded wait for something that must *not*
    // happen; the controller is already known stopped, so this only guards against a leak.)
    apply_probe(&api, "after-unload", "a").await?;
    tokio::time::sleep(Duration::from_secs(3)).await;
    assert_eq!(plugin_version_in_status(&api, "after-unload").await, None);

    host.stop().await;
    release(&api, &["first", "second", "third", "after-unload"]).await;
    Ok(())
}

/// An Event with `reason` about the object called `name`.
async fn event_about(events: &Api<Event>, name: &str, reason: &str) -> anyhow::Result<Event> {
    plugins::event_about(events, name, reason, |_| true).await
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_shadow_compares_without_acting_and_is_promoted_by_one_field() -> anyhow::Result<()> {
    init_logging();
    const CANDIDATE: &str = "plugin-probe-candidate";
    let (v2, v4) = (build("2.0.0")?, build("4.0.0")?);
    let env = shared_node().await?;
    let client = env.client().await?;
    install_crd_object(&client, probe_crd()?).await?;
    let namespace = env.create_namespace("plugin-shadow").await?;
    let host = HostUnderTest::start_loading_config_maps(env, &namespace, Limits::default()).await?;
    let admin = host
        .running
        .admin_addr
        .ok_or_else(|| anyhow::anyhow!("no admin address"))?;
    let config_maps: Api<ConfigMap> = Api::namespaced(client.clone(), &namespace);
    let events: Api<Event> = Api::namespaced(client.clone(), &namespace);
    let api: Api<DynamicObject> = Api::namespaced_with(client.clone(), &namespace, &probes());

    apply_pack(&config_maps, packed(&v2)?).await?;
    apply_probe(&api, "shadowed", "a").await?;
    wait_decided_by(&api, "shadowed", "2.0.0").await?;

    // v4 as a shadow, from its own ConfigMap.
    let mut candidate = pack::to_config_map(
        &v4,
        &PackOptions {
            name: CANDIDATE.into(),
            mode: pack::Mode::Shadow,
            ..Default::default()
        },
    )?;
    candidate.metadata.managed_fields = None;
    config_maps
        .patch(
            CANDIDATE,
            &PatchParams::apply("plugin-loading-e2e").force(),
            &Patch::Apply(&candidate),
        )
        .await?;
    let loaded = event_about(&events, CANDIDATE, "PluginShadowLoaded").await?;
    let note = loaded.note.unwrap_or_default();
    assert!(
        note.contains("misbehaving@2.0.0"),
        "the Event names the active plugin it shadows: {note}"
    );
    status_entry(&config_maps, "misbehaving.shadow", Some("mode: shadow")).await?;
    let listed = loaded_plugins(admin).await?;
    let modes: Vec<(String, String)> = listed
        .iter()
        .map(|p| (p["version"].to_string(), p["mode"].to_string()))
        .collect();
    assert_eq!(
        modes,
        [
            ("\"2.0.0\"".to_string(), "\"active\"".to_string()),
            ("\"4.0.0\"".to_string(), "\"shadow\"".to_string())
        ]
    );

    // The next reconcile runs both; the difference is reported, and only v2's decision lands.
    apply_probe(&api, "shadowed", "b").await?;
    let diff = event_about(&events, "shadowed", "ShadowDecisionDiffers").await?;
    let note = diff.note.unwrap_or_default();
    assert!(
        note.contains(r#".pluginVersion: "2.0.0" → "4.0.0""#),
        "the Event carries a short diff: {note}"
    );
    assert_eq!(
        plugin_version_in_status(&api, "shadowed").await.as_deref(),
        Some("2.0.0"),
        "the shadow's decisions are never applied"
    );
    let metrics = get(&format!("http://{admin}/metrics")).await?;
    assert!(
        metrics
            .lines()
            .any(|l| l.starts_with("policy_host_shadow_decisions_total")
                && l.contains("shadow=\"misbehaving@4.0.0\"")
                && l.contains("outcome=\"different\"")),
        "a shadow comparison metric:\n{metrics}"
    );

    // Promotion: one field in the candidate's ConfigMap.
    let promote = json!({ "data": { pack::MODE_KEY: "active" } });
    config_maps
        .patch(CANDIDATE, &PatchParams::default(), &Patch::Merge(&promote))
        .await?;
    wait_decided_by(&api, "shadowed", "4.0.0").await?;
    let promoted = event_about(&events, CANDIDATE, "PluginPromoted").await?;
    assert!(
        promoted
            .note
            .unwrap_or_default()
            .contains("replacing misbehaving@2.0.0"),
        "the promotion says what it replaced"
    );
    event_about(&events, PACK, "PluginSuperseded").await?;
    let replaced = config_maps.get(PACK).await?;
    assert_eq!(
        replaced
            .metadata
            .annotations
            .unwrap_or_default()
            .get("policy-host.io/superseded-by")
            .map(String::as_str),
        Some(CANDIDATE),
        "the replaced ConfigMap is marked, so a restarted host does not load it again"
    );
    let listed = loaded_plugins(admin).await?;
    assert_eq!(listed.len(), 1, "{listed:?}");
    assert_eq!(listed[0]["version"], "4.0.0");
    assert_eq!(listed[0]["mode"], "active");

    // A restarted host loads the promoted plugin only, whichever ConfigMap it lists first.
    host.stop().await;
    let host = HostUnderTest::start_loading_config_maps(env, &namespace, Limits::default()).await?;
    let admin = host
        .running
        .admin_addr
        .ok_or_else(|| anyhow::anyhow!("no admin address"))?;
    apply_probe(&api, "shadowed", "c").await?;
    wait_for("the restarted host lists its plugins", WAIT, || async {
        let listed = loaded_plugins(admin).await.ok()?;
        (!listed.is_empty()).then_some(())
    })
    .await?;
    wait_decided_by(&api, "shadowed", "4.0.0").await?;
    let listed = loaded_plugins(admin).await?;
    assert_eq!(listed.len(), 1, "{listed:?}");
    assert_eq!(listed[0]["version"], "4.0.0");

    host.stop().await;
    release(&api, &["shadowed"]).await;
    Ok(())
}
