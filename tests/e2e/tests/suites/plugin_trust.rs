//! Signed plugins against the real API server: a host given a trusted key refuses plugin
//! ConfigMaps that are unsigned, signed by another key, or whose grants were widened after
//! signing, each with a Warning Event on the ConfigMap that says which key it expected and
//! what to do, and loads the one signed by its key. Keys are real ed25519 keys written by
//! `policy-host keygen`'s code.

use std::time::Duration;

use k8s_openapi::api::core::v1::ConfigMap;
use k8s_openapi::api::events::v1::Event;
use kube::api::{Api, DynamicObject, Patch, PatchParams};
use policy_host::Settings;
use policy_host::capability::scope::Grants;
use policy_host::decide::Limits;
use policy_host::load::pack::{self, GRANTS_KEY, PackOptions};
use policy_host::load::trust::{SigningKey, TrustPolicy, TrustedKey};
use policy_host::plugin_cli::keygen::keygen;
use policy_host_e2e::{
    HostUnderTest, init_logging, install_crd_object, plugins, probe_crd, probes,
};
use policy_host_testenv::{shared_node, wait_for};
use serde_json::json;

const WAIT: Duration = Duration::from_secs(90);
const PACK: &str = "plugin-signed";

/// A pack of `component` granting app-calls to port `http`.
fn packed(component: &[u8]) -> anyhow::Result<ConfigMap> {
    Ok(pack::to_config_map(
        component,
        &PackOptions {
            name: PACK.into(),
            grants: Grants {
                app_call_ports: vec!["http".into()],
                ..Default::default()
            },
            ..Default::default()
        },
    )?)
}

fn signed(component: &[u8], key: &SigningKey) -> anyhow::Result<ConfigMap> {
    let mut cm = packed(component)?;
    key.sign(&mut cm, &pack::sha256_hex(component));
    Ok(cm)
}

async fn apply_pack(config_maps: &Api<ConfigMap>, cm: ConfigMap) -> anyhow::Result<()> {
    plugins::apply_pack(config_maps, cm, "plugin-trust-e2e").await
}

/// The note of an Event about the pack with `reason`.
async fn pack_event(events: &Api<Event>, reason: &str) -> anyhow::Result<String> {
    let event = plugins::event_about(events, PACK, reason, |_| true).await?;
    Ok(event.note.unwrap_or_default())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn only_plugins_signed_by_a_trusted_key_load() -> anyhow::Result<()> {
    init_logging();
    let component = std::fs::read(
        policy_host_test_plugins::build_version("1.0.0").map_err(|e| anyhow::anyhow!("{e}"))?,
    )?;
    let keys = std::env::temp_dir().join(format!("policy-host-trust-e2e-{}", std::process::id()));
    std::fs::create_dir_all(&keys)?;
    let admin_key = keygen(&keys.join("admin"))?;
    let stranger_key = keygen(&keys.join("stranger"))?;
    let admin = SigningKey::from_pem_file(&admin_key.private)?;
    let stranger = SigningKey::from_pem_file(&stranger_key.private)?;

    let env = shared_node().await?;
    let client = env.client().await?;
    install_crd_object(&client, probe_crd()?).await?;
    let namespace = env.create_namespace("plugin-trust").await?;
    let settings = Settings {
        plugin_namespace: Some(namespace.to_string()),
        trust: TrustPolicy::new(vec![TrustedKey::from_pem_file(&admin_key.public)?]),
        ..HostUnderTest::settings(&namespace, Limits::default())?
    };
    let host = HostUnderTest::start_with(env, settings).await?;
    let config_maps: Api<ConfigMap> = Api::namespaced(client.clone(), &namespace);
    let events: Api<Event> = Api::namespaced(client.clone(), &namespace);
    let api: Api<DynamicObject> = Api::namespaced_with(client.clone(), &namespace, &probes());

    let outcome = async {
        // Unsigned: refused, naming the key it needs and the command that signs.
        apply_pack(&config_maps, packed(&component)?).await?;
        let note = pack_event(&events, "PluginUnsigned").await?;
        anyhow::ensure!(
            note.contains(&admin_key.id) && note.contains("policy-host pack --sign"),
            "{note}"
        );
        // Signed by a key the host does not trust.
        apply_pack(&config_maps, signed(&component, &stranger)?).await?;
        let note = pack_event(&events, "PluginUntrusted").await?;
        anyhow::ensure!(
            note.contains(&stranger_key.id) && note.contains(&admin_key.id),
            "{note}"
        );
        // Signed by the trusted key, then its grants widened by a ConfigMap writer.
        let mut widened = signed(&component, &admin)?;
        widened
            .data
            .get_or_insert_with(Default::default)
            .insert(GRANTS_KEY.into(), "{appCall: [http, client]}".into());
        apply_pack(&config_maps, widened).await?;
        pack_event(&events, "PluginSignatureInvalid").await?;

        // Nothing was loaded by any of them: a Probe gets no decision.
        let loaded = host.running.store.list();
        anyhow::ensure!(
            loaded.is_empty(),
            "untrusted plugins loaded: {}",
            loaded.len()
        );

        // Signed by the trusted key, as packed: loads and decides.
        apply_pack(&config_maps, signed(&component, &admin)?).await?;
        pack_event(&events, "PluginLoaded").await?;
        let probe = json!({
            "apiVersion": "test.policy-host.io/v1", "kind": "Probe",
            "metadata": { "name": "trusted" }, "spec": { "behaviour": "ok", "touch": "a" }
        });
        api.patch(
            "trusted",
            &PatchParams::apply("plugin-trust-e2e").force(),
            &Patch::Apply(&probe),
        )
        .await?;
        wait_for("the Probe decided by the signed plugin", WAIT, || async {
            let object = api.get_opt("trusted").await.ok().flatten()?;
            (object.data.get("status")?.get("pluginVersion")?.as_str()? == "1.0.0").then_some(())
        })
        .await?;
        Ok(())
    }
    .await;
    host.stop().await;
    let _ = api
        .patch(
            "trusted",
            &PatchParams::default(),
            &Patch::Merge(&json!({ "metadata": { "finalizers": null } })),
        )
        .await;
    let _ = std::fs::remove_dir_all(&keys);
    outcome
}
