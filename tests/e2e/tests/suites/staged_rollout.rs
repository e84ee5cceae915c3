//! Staged rollouts against the real API server: a new version of the `misbehaving` test plugin
//! decides only for the parents its rollout selects; made to fail on demand (`spec.trapIn`),
//! it is rolled back on its own with every parent back on the old version, and the other
//! parents never ran it; a good version is widened step by step and promoted.
//!
//! Each `ok` decision writes the deciding build's version into the Probe's status
//! (`status.pluginVersion`), so the parents themselves say which version decided last.

use std::collections::BTreeMap;

use k8s_openapi::api::core::v1::ConfigMap;
use k8s_openapi::api::events::v1::Event;
use kube::ResourceExt;
use kube::api::{Api, DynamicObject, ListParams, Patch, PatchParams};
use policy_host::decide::Limits;
use policy_host::load::pack::{self, PackOptions};
use policy_host::plugin_cli::{self, PackRequest};
use policy_host::rollout::{RolloutSpec, bucket};
use policy_host_e2e::plugins::{self, WAIT};
use policy_host_e2e::{HostUnderTest, init_logging, install_crd_object, probe_crd, probes};
use policy_host_testenv::{shared_node, wait_for};
use serde_json::{Value, json};

const ACTIVE_PACK: &str = "plugin-probe";
const ROLLOUT_PACK: &str = "plugin-probe-next";
const MANAGER: &str = "staged-rollout-e2e";

fn build(version: &str) -> anyhow::Result<Vec<u8>> {
    let path =
        policy_host_test_plugins::build_version(version).map_err(|e| anyhow::anyhow!("{e}"))?;
    Ok(std::fs::read(path)?)
}

/// The pack `policy-host pack` writes, active, or with `--rollout <rollout>`.
fn packed(name: &str, component: &[u8], rollout: Option<&str>) -> anyhow::Result<ConfigMap> {
    let rollout = rollout
        .map(RolloutSpec::parse)
        .transpose()
        .map_err(anyhow::Error::msg)?;
    Ok(pack::to_config_map(
        component,
        &PackOptions {
            name: name.into(),
            mode: if rollout.is_some() {
                pack::Mode::Rollout
            } else {
                pack::Mode::Active
            },
            rollout,
            ..Default::default()
        },
    )?)
}

/// Creates or changes a Probe with `labels` and `spec` (behaviour `ok` unless it says).
async fn apply_probe(
    api: &Api<DynamicObject>,
    name: &str,
    labels: &[(&str, &str)],
    spec: Value,
) -> anyhow::Result<DynamicObject> {
    let labels: BTreeMap<&str, &str> = labels.iter().copied().collect();
    let object = json!({
        "apiVersion": "test.policy-host.io/v1", "kind": "Probe",
        "metadata": { "name": name, "labels": labels }, "spec": spec,
    });
    Ok(api
        .patch(
            name,
            &PatchParams::apply(MANAGER).force(),
            &Patch::Apply(&object),
        )
        .await?)
}

/// Waits until `name` was decided by `version` at its current generation.
async fn wait_decided_by(
    api: &Api<DynamicObject>,
    name: &str,
    version: &str,
) -> anyhow::Result<()> {
    wait_for(
        &format!("{name} decided by version {version} at its current generation"),
        WAIT,
        || async {
            let object = api.get_opt(name).await.ok()??;
            let status = object.data.get("status")?;
            let current = object.metadata.generation?;
            (status["pluginVersion"] == json!(version)
                && status["observedGeneration"] == json!(current))
            .then_some(())
        },
    )
    .await?;
    Ok(())
}

/// The host's status entry `key` in the plugin namespace, once `ready` accepts it.
async fn status_entry(
    config_maps: &Api<ConfigMap>,
    key: &str,
    ready: impl Fn(&Value) -> bool,
) -> anyhow::Result<Value> {
    Ok(wait_for(
        &format!("policy-host-status key {key} as expected"),
        WAIT,
        || async {
            let cm = config_maps.get_opt("policy-host-status").await.ok()??;
            let text = cm.data?.get(key)?.clone();
            let entry: Value = serde_yaml::from_str(&text).ok()?;
            ready(&entry).then_some(entry)
        },
    )
    .await?)
}

/// The Events with `reason` about the object called `name`.
async fn events_about(
    events: &Api<Event>,
    name: &str,
    reason: &str,
) -> anyhow::Result<Vec<String>> {
    Ok(events
        .list(&ListParams::default())
        .await?
        .items
        .into_iter()
        .filter(|e| {
            e.regarding.as_ref().and_then(|r| r.name.as_deref()) == Some(name)
                && e.reason.as_deref() == Some(reason)
        })
        .map(|e| e.note.unwrap_or_default())
        .collect())
}

async fn metrics(admin: std::net::SocketAddr) -> anyhow::Result<String> {
    Ok(policy_host::capability::http::http_client()?
        .get(format!("http://{admin}/metrics"))
        .send()
        .await?
        .text()
        .await?)
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

fn names(entry: &Value, field: &str) -> Vec<String> {
    entry["rollout"][field]
        .as_array()
        .map(|a| {
            a.iter()
                .filter_map(|v| v.as_str().map(str::to_owned))
                .collect()
        })
        .unwrap_or_default()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_bad_version_runs_only_on_its_selected_parents_and_is_rolled_back() -> anyhow::Result<()>
{
    init_logging();
    let (v2, v3) = (build("2.0.0")?, build("3.0.0")?);
    let env = shared_node().await?;
    let client = env.client().await?;
    install_crd_object(&client, probe_crd()?).await?;
    let namespace = env.create_namespace("staged-rollout-bad").await?;
    let host = HostUnderTest::start_loading_config_maps(env, &namespace, Limits::default()).await?;
    let admin = host
        .running
        .admin_addr
        .ok_or_else(|| anyhow::anyhow!("no admin address"))?;
    let config_maps: Api<ConfigMap> = Api::namespaced(client.clone(), &namespace);
    let events: Api<Event> = Api::namespaced(client.clone(), &namespace);
    let api: Api<DynamicObject> = Api::namespaced_with(client.clone(), &namespace, &probes());
    let canaries = ["canary-a", "canary-b"];
    let others = ["main-a", "main-b", "main-c"];
    let all: Vec<&str> = canaries.iter().chain(&others).copied().collect();

    plugins::apply_pack(&config_maps, packed(ACTIVE_PACK, &v2, None)?, MANAGER).await?;
    for name in canaries {
        apply_probe(
            &api,
            name,
            &[("ring", "canary")],
            json!({ "behaviour": "ok" }),
        )
        .await?;
    }
    for name in others {
        apply_probe(
            &api,
            name,
            &[("ring", "main")],
            json!({ "behaviour": "ok" }),
        )
        .await?;
    }
    for name in &all {
        wait_decided_by(&api, name, "2.0.0").await?;
    }

    // 3.0.0 rolled out to the canaries: they move to it, the others stay.
    let rollout = "{selector: {matchLabels: {ring: canary}}, maxFailureRate: 0.5, minDecisions: 4}";
    plugins::apply_pack(
        &config_maps,
        packed(ROLLOUT_PACK, &v3, Some(rollout))?,
        MANAGER,
    )
    .await?;
    let loaded =
        plugins::event_about(&events, ROLLOUT_PACK, "PluginRolloutLoaded", |_| true).await?;
    let note = loaded.note.unwrap_or_default();
    assert!(
        note.contains("over the active misbehaving@2.0.0") && note.contains("ring=canary"),
        "the Event says what is rolled out over what, for whom: {note}"
    );
    for name in canaries {
        wait_decided_by(&api, name, "3.0.0").await?;
        let moved = events_about(&events, name, "PluginVersionChanged").await?;
        assert!(
            moved
                .iter()
                .any(|n| n.contains("now decided by misbehaving@3.0.0") && n.contains("labels")),
            "{name}: {moved:?}"
        );
    }
    let entry = status_entry(&config_maps, "misbehaving.rollout", |e| {
        e["rollout"]["parents"] == json!({ "candidate": 2, "active": 3 })
    })
    .await?;
    assert_eq!(entry["mode"], "rollout");
    assert_eq!(entry["rollout"]["state"], "Running");
    assert_eq!(entry["rollout"]["over"], "misbehaving@2.0.0");
    assert_eq!(
        names(&entry, "onCandidate"),
        canaries.map(|name| format!("{namespace}/{name}"))
    );
    wait_for("a parents gauge per version", WAIT, || async {
        let text = metrics(admin).await.ok()?;
        let gauge = |version: &str, n: u32| {
            format!("policy_host_rollout_parents{{policy=\"misbehaving\",version=\"misbehaving@{version}\"}} {n}")
        };
        (text.contains(&gauge("3.0.0", 2)) && text.contains(&gauge("2.0.0", 3))).then_some(())
    })
    .await?;

    // 3.0.0 turns bad: every parent now asks to trap in 3.0.0. Only the canaries run it.
    for name in canaries {
        apply_probe(
            &api,
            name,
            &[("ring", "canary")],
            json!({ "behaviour": "ok", "trapIn": "3.0.0" }),
        )
        .await?;
    }
    for name in others {
        apply_probe(
            &api,
            name,
            &[("ring", "main")],
            json!({ "behaviour": "ok", "trapIn": "3.0.0" }),
        )
        .await?;
    }
    let rolled_back =
        plugins::event_about(&events, ROLLOUT_PACK, "PluginRolledBack", |_| true).await?;
    assert_eq!(rolled_back.type_.as_deref(), Some("Warning"));
    let note = rolled_back.note.unwrap_or_default();
    for fragment in [
        "rolled back misbehaving@3.0.0",
        "decisions failed (",
        "above maxFailureRate 50%",
        "the active version: 0 of its last",
        "every parent is back on the active version",
    ] {
        assert!(note.contains(fragment), "`{fragment}` in: {note}");
    }

    // Every parent is back on 2.0.0, which ignores trapIn 3.0.0 and decides.
    for name in &all {
        wait_decided_by(&api, name, "2.0.0").await?;
    }
    for name in canaries {
        let moved = events_about(&events, name, "PluginVersionChanged").await?;
        assert!(
            moved
                .iter()
                .any(|n| n.contains("now decided by misbehaving@2.0.0")
                    && n.contains("was rolled back")),
            "{name}: {moved:?}"
        );
        assert!(
            !events_about(&events, name, "PluginCrashed")
                .await?
                .is_empty(),
            "{name} ran the bad build"
        );
    }
    for name in others {
        assert_eq!(
            events_about(&events, name, "PluginVersionChanged").await?,
            Vec::<String>::new(),
            "{name} never moved"
        );
        assert_eq!(
            events_about(&events, name, "PluginCrashed").await?,
            Vec::<String>::new(),
            "{name} never ran the bad build"
        );
    }
    let entry = status_entry(&config_maps, "misbehaving.rollout", |e| {
        e["rollout"]["state"] == "RolledBack" && e["rollout"]["parents"]["candidate"] == 0
    })
    .await?;
    let reason = entry["rollout"]["rolledBack"].as_str().unwrap_or_default();
    assert!(reason.contains("decisions failed"), "{entry}");
    let candidate = &entry["rollout"]["candidate"]["decisions"];
    let (failed, decided) = (
        candidate["recentFailed"].as_u64().unwrap_or_default(),
        candidate["recentDecisions"].as_u64().unwrap_or_default(),
    );
    assert!(decided >= 4 && failed * 2 > decided, "{entry}");
    assert_eq!(
        entry["rollout"]["active"]["decisions"]["recentFailed"], 0,
        "{entry}"
    );
    let annotated = config_maps.get(ROLLOUT_PACK).await?;
    assert_eq!(
        annotated.annotations().get("policy-host.io/rolled-back"),
        Some(&pack::sha256_hex(&v3)),
        "the rolled-back build is marked, so a restarted host does not roll it out again"
    );
    let text = metrics(admin).await?;
    assert!(
        text.lines()
            .any(|l| l.starts_with("policy_host_rollout_decisions_total")
                && l.contains("version=\"misbehaving@3.0.0\"")
                && l.contains("outcome=\"failed\"")),
        "a failure count of the candidate:\n{text}"
    );

    // A restarted host does not roll the rolled-back build out again.
    host.stop().await;
    let host = HostUnderTest::start_loading_config_maps(env, &namespace, Limits::default()).await?;
    plugins::event_about(&events, ROLLOUT_PACK, "PluginRolledBack", |n| {
        n.starts_with("not loaded")
    })
    .await?;
    apply_probe(
        &api,
        "canary-a",
        &[("ring", "canary")],
        json!({ "behaviour": "ok", "trapIn": "3.0.0", "touch": 1 }),
    )
    .await?;
    wait_decided_by(&api, "canary-a", "2.0.0").await?;

    host.stop().await;
    release(&api, &all).await;
    Ok(())
}

/// The README's "Staged rollout" commands, run with the real `kubectl` against the real API
/// server: packed with `--rollout`, applied, a selector widened by labelling, a percentage
/// raised, promoted.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_good_version_is_widened_step_by_step_and_promoted() -> anyhow::Result<()> {
    init_logging();
    let v2 = build("2.0.0")?;
    let v4 =
        policy_host_test_plugins::build_version("4.0.0").map_err(|e| anyhow::anyhow!("{e}"))?;
    let env = shared_node().await?;
    let client = env.client().await?;
    install_crd_object(&client, probe_crd()?).await?;
    let namespace = env.create_namespace("staged-rollout-good").await?;
    let host = HostUnderTest::start_loading_config_maps(env, &namespace, Limits::default()).await?;
    let admin = host
        .running
        .admin_addr
        .ok_or_else(|| anyhow::anyhow!("no admin address"))?;
    let config_maps: Api<ConfigMap> = Api::namespaced(client.clone(), &namespace);
    let events: Api<Event> = Api::namespaced(client.clone(), &namespace);
    let api: Api<DynamicObject> = Api::namespaced_with(client.clone(), &namespace, &probes());
    let kubectl = |args: &[&str]| {
        let mut all = vec!["-n", &*namespace];
        all.extend_from_slice(args);
        policy_host_e2e::install::kubectl(env, &all)
    };
    let canaries = ["canary-a", "canary-b"];
    let others = ["main-a", "main-b", "main-c", "main-d", "main-e", "main-f"];
    let all: Vec<&str> = canaries.iter().chain(&others).copied().collect();

    plugins::apply_pack(&config_maps, packed(ACTIVE_PACK, &v2, None)?, MANAGER).await?;
    let mut uids = BTreeMap::new();
    for name in &all {
        let created = apply_probe(&api, name, &[], json!({ "behaviour": "ok" })).await?;
        uids.insert(*name, created.uid().unwrap_or_default());
    }
    for name in &all {
        wait_decided_by(&api, name, "2.0.0").await?;
    }

    // Step 1: packed with --rollout and applied; then the canaries are labelled into it.
    let yaml = plugin_cli::pack(
        &v4,
        &PackRequest {
            name: Some(ROLLOUT_PACK.into()),
            rollout: Some(
                RolloutSpec::parse(
                    "{selector: {matchLabels: {ring: canary}}, maxFailureRate: 0.2, minDecisions: 10}",
                )
                .map_err(anyhow::Error::msg)?,
            ),
            ..PackRequest::default()
        },
        &plugin_cli::host_defaults(),
    )
    .await?;
    let file = tempfile::NamedTempFile::new()?;
    std::fs::write(file.path(), yaml)?;
    kubectl(&[
        "apply",
        "--server-side",
        "-f",
        &file.path().display().to_string(),
    ])?;
    plugins::event_about(&events, ROLLOUT_PACK, "PluginRolloutLoaded", |_| true).await?;
    for name in &all {
        wait_decided_by(&api, name, "2.0.0").await?;
    }
    kubectl(&["label", "probes", "canary-a", "canary-b", "ring=canary"])?;
    for name in &all {
        let expected = if canaries.contains(name) {
            "4.0.0"
        } else {
            "2.0.0"
        };
        wait_decided_by(&api, name, expected).await?;
    }

    // Step 2: the canaries and half of the rest, by uid: exactly the parents whose bucket is
    // below 50 move, as the admin can work out beforehand.
    kubectl(&[
        "patch",
        "configmap",
        ROLLOUT_PACK,
        "--type",
        "merge",
        "-p",
        r#"{"data":{"rollout":"{selector: {matchLabels: {ring: canary}}, percent: 50, maxFailureRate: 0.2}"}}"#,
    ])?;
    plugins::event_about(&events, ROLLOUT_PACK, "PluginRolloutChanged", |_| true).await?;
    let mut on_new = 0;
    for name in &all {
        let moves = canaries.contains(name) || bucket(&uids[name]) < 50;
        on_new += usize::from(moves);
        wait_decided_by(&api, name, if moves { "4.0.0" } else { "2.0.0" }).await?;
    }
    status_entry(&config_maps, "misbehaving.rollout", |e| {
        e["rollout"]["percent"] == 50
            && e["rollout"]["parents"]
                == json!({ "candidate": on_new, "active": all.len() - on_new })
    })
    .await?;

    // Step 3: every parent.
    kubectl(&[
        "patch",
        "configmap",
        ROLLOUT_PACK,
        "--type",
        "merge",
        "-p",
        r#"{"data":{"rollout":"{percent: 100, maxFailureRate: 0.2}"}}"#,
    ])?;
    for name in &all {
        wait_decided_by(&api, name, "4.0.0").await?;
    }
    let entry = status_entry(&config_maps, "misbehaving.rollout", |e| {
        e["rollout"]["parents"] == json!({ "candidate": all.len(), "active": 0 })
    })
    .await?;
    assert_eq!(entry["rollout"]["state"], "Running");
    assert_eq!(
        entry["rollout"]["candidate"]["decisions"]["recentFailed"], 0,
        "{entry}"
    );
    let text = metrics(admin).await?;
    assert!(
        text.contains(&format!(
            "policy_host_rollout_parents{{policy=\"misbehaving\",version=\"misbehaving@4.0.0\"}} {}",
            all.len()
        )),
        "{text}"
    );

    // Promotion: the new version replaces the old one; the old ConfigMap is superseded.
    kubectl(&[
        "patch",
        "configmap",
        ROLLOUT_PACK,
        "--type",
        "merge",
        "-p",
        r#"{"data":{"mode":"active","rollout":null}}"#,
    ])?;
    let promoted = plugins::event_about(&events, ROLLOUT_PACK, "PluginPromoted", |_| true).await?;
    let note = promoted.note.unwrap_or_default();
    assert!(
        note.contains("from rollout to active") && note.contains("replacing misbehaving@2.0.0"),
        "{note}"
    );
    plugins::event_about(&events, ACTIVE_PACK, "PluginSuperseded", |_| true).await?;
    wait_for("the rollout's status entry is gone", WAIT, || async {
        let cm = config_maps.get_opt("policy-host-status").await.ok()??;
        let data = cm.data.unwrap_or_default();
        (!data.contains_key("misbehaving.rollout")
            && data
                .get("misbehaving")
                .is_some_and(|t| t.contains("version: 4.0.0")))
        .then_some(())
    })
    .await?;
    let listed: Vec<Value> = serde_json::from_str(
        &policy_host::capability::http::http_client()?
            .get(format!("http://{admin}/plugins"))
            .send()
            .await?
            .text()
            .await?,
    )?;
    assert_eq!(listed.len(), 1, "{listed:?}");
    assert_eq!(listed[0]["version"], "4.0.0");
    assert_eq!(listed[0]["mode"], "active");
    apply_probe(
        &api,
        "main-a",
        &[],
        json!({ "behaviour": "ok", "touch": 1 }),
    )
    .await?;
    wait_decided_by(&api, "main-a", "4.0.0").await?;
    // No parent moved back at the promotion: it already ran the promoted build.
    for name in &all {
        let moved = events_about(&events, name, "PluginVersionChanged").await?;
        assert!(
            moved
                .iter()
                .all(|n| n.contains("now decided by misbehaving@4.0.0")),
            "{name}: {moved:?}"
        );
    }

    host.stop().await;
    release(&api, &all).await;
    Ok(())
}
