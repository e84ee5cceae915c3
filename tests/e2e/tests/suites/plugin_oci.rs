//! Plugins from an OCI registry by digest, against the real API server and a real registry
//! (distribution's `registry`, built from source, serving HTTPS with a CA the test makes and
//! basic authentication): `policy-host pack --push` pushes the `misbehaving` test plugin and
//! writes a signed ConfigMap naming it by digest; the host pulls it with the pull Secret and
//! CA the ConfigMap names, loads v1, hot-swaps to v2, and refuses a digest the registry does not
//! hold, a component altered in the registry's storage, an unsigned reference, a component over
//! its pull limit, an unreachable registry, a registry whose CA it was not given and a
//! component that needs component-model async, each with a Warning Event on the ConfigMap while
//! v2 keeps deciding.

use std::path::Path;

use k8s_openapi::api::core::v1::ConfigMap;
use k8s_openapi::api::events::v1::Event;
use kube::api::{Api, DynamicObject, Patch, PatchParams};
use policy_host::Settings;
use policy_host::decide::Limits;
use policy_host::load::oci::{self, PluginReference, RegistryAccess};
use policy_host::load::pack::{self, CaSource, PackOptions, RegistryPull};
use policy_host::load::trust::{SERIAL_KEY, SigningKey, TrustPolicy, TrustedKey};
use policy_host::plugin_cli::keygen::keygen;
use policy_host::plugin_cli::{self, PackRequest, PushRequest};
use policy_host_e2e::registry::Registry;
use policy_host_e2e::{
    HostUnderTest, init_logging, install_crd_object, plugins, probe_crd, probes,
};
use policy_host_testenv::{shared_node, wait_for};
use serde_json::json;

const PACK: &str = "plugin-oci";
const PULL_SECRET: &str = "registry-login";
const CA_CONFIG_MAP: &str = "registry-ca";
/// The host's pull limit in this suite: above the test plugin, below the padded one.
const PULL_LIMIT: u64 = 1 << 20;

/// What the suite's signed packs share: the key and the next serial (each pack signs a higher
/// one, so none is a replay of the last).
struct Signer {
    key: SigningKey,
    serial: u64,
}

impl Signer {
    fn sign(&mut self, mut cm: ConfigMap, component_sha256: &str) -> ConfigMap {
        self.serial += 1;
        cm.data
            .get_or_insert_with(Default::default)
            .insert(SERIAL_KEY.into(), self.serial.to_string());
        self.key.sign(&mut cm, component_sha256);
        cm
    }
}

/// A pack naming `reference` (pulled with the suite's Secret and CA), pinned to `sha256`.
fn by_reference(reference: &PluginReference, sha256: &str, with_ca: bool) -> ConfigMap {
    pack::to_reference_config_map(
        &RegistryPull {
            reference: reference.clone(),
            pull_secret: Some(PULL_SECRET.into()),
            registry_ca: with_ca.then(|| CaSource::ConfigMap(CA_CONFIG_MAP.into())),
        },
        sha256,
        &PackOptions {
            name: PACK.into(),
            ..Default::default()
        },
    )
}

/// `pack` without its pull Secret: an anonymous pull.
fn anonymous(mut pack: ConfigMap) -> ConfigMap {
    if let Some(data) = pack.data.as_mut() {
        data.remove(pack::PULL_SECRET_KEY);
    }
    pack
}

/// `policy-host pack --push --sign` of the plugin at `path`, as the ConfigMap it writes.
async fn pack_and_push(
    path: &Path,
    registry: &Registry,
    work: &Path,
    key: &Path,
    serial: u64,
    tag: &str,
) -> anyhow::Result<ConfigMap> {
    let yaml = plugin_cli::pack(
        path,
        &PackRequest {
            name: Some(PACK.into()),
            sign: Some(key.to_path_buf()),
            serial: Some(serial),
            push: Some(PushRequest {
                target: format!("oci://{}/plugins/misbehaving:{tag}", registry.address),
                ca_file: Some(work.join("ca.crt")),
                auth_file: Some(work.join("config.json")),
                pull_secret: Some(PULL_SECRET.into()),
                pull_ca: Some(format!("configmap/{CA_CONFIG_MAP}")),
            }),
            ..PackRequest::default()
        },
        &plugin_cli::host_defaults(),
    )
    .await
    .map_err(|e| anyhow::anyhow!("{e}"))?;
    Ok(serde_yaml::from_str(&yaml)?)
}

fn reference_of(cm: &ConfigMap) -> anyhow::Result<PluginReference> {
    let text = cm
        .data
        .as_ref()
        .and_then(|d| d.get(pack::REFERENCE_KEY))
        .ok_or_else(|| anyhow::anyhow!("the pack names no reference"))?;
    Ok(PluginReference::parse(text)?)
}

/// `(component (import "wasi:cli/environment@0.3.0" (instance)))`: what an async toolchain's
/// WASI 0.3 world looks like to the host (none is installed here).
fn importing_wasi_0_3() -> Vec<u8> {
    use wasm_encoder::{
        Component, ComponentImportSection, ComponentTypeRef, ComponentTypeSection, InstanceType,
    };
    let mut types = ComponentTypeSection::new();
    types.instance(&InstanceType::new());
    let mut imports = ComponentImportSection::new();
    imports.import("wasi:cli/environment@0.3.0", ComponentTypeRef::Instance(0));
    let mut component = Component::new();
    component.section(&types).section(&imports);
    component.finish()
}

async fn apply_probe(api: &Api<DynamicObject>, name: &str, touch: &str) -> anyhow::Result<()> {
    let object = json!({
        "apiVersion": "test.policy-host.io/v1", "kind": "Probe",
        "metadata": { "name": name }, "spec": { "behaviour": "ok", "touch": touch }
    });
    api.patch(
        name,
        &PatchParams::apply("plugin-oci-e2e").force(),
        &Patch::Apply(&object),
    )
    .await?;
    Ok(())
}

async fn wait_decided_by(
    api: &Api<DynamicObject>,
    name: &str,
    version: &str,
) -> anyhow::Result<()> {
    wait_for(
        &format!("{name} decided by version {version}"),
        plugins::WAIT,
        || async {
            let object = api.get_opt(name).await.ok().flatten()?;
            (object.data.get("status")?.get("pluginVersion")?.as_str()? == version).then_some(())
        },
    )
    .await?;
    Ok(())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn plugins_by_digest_load_swap_and_are_refused_keeping_the_old_one() -> anyhow::Result<()> {
    init_logging();
    let v1_path =
        policy_host_test_plugins::build_version("1.0.0").map_err(|e| anyhow::anyhow!("{e}"))?;
    let v2_path =
        policy_host_test_plugins::build_version("2.0.0").map_err(|e| anyhow::anyhow!("{e}"))?;
    let (v1, v2) = (std::fs::read(&v1_path)?, std::fs::read(&v2_path)?);
    let env = shared_node().await?;
    let registry = Registry::start(env.binaries()).await?;
    let work = tempfile::tempdir()?;
    std::fs::write(work.path().join("ca.crt"), &registry.ca_pem)?;
    std::fs::write(
        work.path().join("config.json"),
        registry.docker_config_json(),
    )?;
    let admin_key = keygen(&work.path().join("admin"))?;
    let mut signer = Signer {
        key: SigningKey::from_pem_file(&admin_key.private)?,
        serial: 100,
    };

    let client = env.client().await?;
    install_crd_object(&client, probe_crd()?).await?;
    let namespace = env.create_namespace("plugin-oci").await?;
    let config_maps: Api<ConfigMap> = Api::namespaced(client.clone(), &namespace);
    let events: Api<Event> = Api::namespaced(client.clone(), &namespace);
    let api: Api<DynamicObject> = Api::namespaced_with(client.clone(), &namespace, &probes());
    // What the admin creates beside the plugin ConfigMap: the pull Secret and the CA.
    registry
        .admit(&client, &namespace, PULL_SECRET, CA_CONFIG_MAP)
        .await?;
    let artifacts = tempfile::tempdir()?;
    let settings = Settings {
        plugin_namespace: Some(namespace.to_string()),
        artifact_cache: Some(artifacts.path().to_path_buf()),
        trust: TrustPolicy::new(vec![TrustedKey::from_pem_file(&admin_key.public)?]),
        max_pulled_plugin_bytes: PULL_LIMIT,
        ..HostUnderTest::settings(&namespace, Limits::default())?
    };
    let host = HostUnderTest::start_with(env, settings).await?;
    let apply = |cm: ConfigMap| plugins::apply_pack(&config_maps, cm, "plugin-oci-e2e");

    let outcome = async {
        // v1: `pack --push` pushes it and writes a signed ConfigMap by digest, no bytes.
        let v1_pack = pack_and_push(
            &v1_path,
            &registry,
            work.path(),
            &admin_key.private,
            1,
            "1.0.0",
        )
        .await?;
        anyhow::ensure!(
            v1_pack.binary_data.is_none(),
            "a pack by reference carries bytes"
        );
        let v1_reference = reference_of(&v1_pack)?;
        anyhow::ensure!(v1_reference.registry == registry.address, "{v1_reference}");
        apply(v1_pack).await?;
        apply_probe(&api, "first", "a").await?;
        wait_decided_by(&api, "first", "1.0.0").await?;
        plugins::event_about(&events, PACK, "PluginLoaded", |_| true).await?;

        // v2 by its digest: swapped in with no restart.
        let v2_pack = pack_and_push(
            &v2_path,
            &registry,
            work.path(),
            &admin_key.private,
            2,
            "2.0.0",
        )
        .await?;
        let v2_reference = reference_of(&v2_pack)?;
        apply(v2_pack).await?;
        wait_decided_by(&api, "first", "2.0.0").await?;
        plugins::event_about(&events, PACK, "PluginSwapped", |_| true).await?;

        let (v1_sha, v2_sha) = (pack::sha256_hex(&v1), pack::sha256_hex(&v2));
        let access = RegistryAccess {
            credentials: Some((
                policy_host_e2e::registry::USER.into(),
                policy_host_e2e::registry::PASSWORD.into(),
            )),
            ca_pem: Some(registry.ca_pem.clone().into_bytes()),
        };
        let repository = format!("oci://{}/plugins/misbehaving", registry.address);

        // A digest the registry does not hold.
        let unknown = PluginReference {
            digest: format!("sha256:{}", pack::sha256_hex(b"never pushed")),
            ..v2_reference.clone()
        };
        // v1's component altered in the registry's storage (one byte, same length).
        let blob = registry.blob_file(&format!("sha256:{v1_sha}"));
        let mut altered = std::fs::read(&blob)?;
        let middle = altered.len() / 2;
        altered[middle] ^= 0xff;
        std::fs::write(&blob, altered)?;
        // A component over the host's pull limit, pushed without `pack`'s checks.
        let big = plugins::padded(&v1, usize::try_from(PULL_LIMIT)? + (512 << 10));
        let big_reference =
            oci::push(&format!("{repository}:big"), &big, &access, "the test CA").await?;
        // A component of a WASI 0.3 world.
        let async_component = importing_wasi_0_3();
        let async_reference = oci::push(
            &format!("{repository}:async"),
            &async_component,
            &access,
            "the test CA",
        )
        .await?;
        // A registry address nothing listens on.
        let dead = std::net::TcpListener::bind("127.0.0.1:0")?.local_addr()?;
        let unreachable = PluginReference {
            registry: dead.to_string(),
            ..v2_reference.clone()
        };

        // (situation, pack, Event reason, a fragment of its note)
        let refused: Vec<(&str, ConfigMap, &str, String)> = vec![
            (
                "a digest the registry does not hold",
                signer.sign(by_reference(&unknown, &v2_sha, true), &v2_sha),
                "PluginPullFailed",
                unknown.digest.clone(),
            ),
            (
                "a component altered in the registry",
                signer.sign(by_reference(&v1_reference, &v1_sha, true), &v1_sha),
                "PluginDigestMismatch",
                "digest mismatch".into(),
            ),
            (
                "an unsigned reference",
                by_reference(&v1_reference, &v1_sha, true),
                "PluginUnsigned",
                "is not signed".into(),
            ),
            (
                "a component over the pull limit",
                signer.sign(
                    by_reference(&big_reference, &pack::sha256_hex(&big), true),
                    &pack::sha256_hex(&big),
                ),
                "PluginTooLarge",
                format!("pull limit of {PULL_LIMIT} bytes"),
            ),
            (
                "an unreachable registry",
                // No pull Secret: it holds no credentials for this address, which the host
                // refuses before any connection (its own Event, checked above).
                signer.sign(
                    anonymous(by_reference(&unreachable, &v2_sha, true)),
                    &v2_sha,
                ),
                "PluginPullFailed",
                dead.to_string(),
            ),
            (
                "a registry whose CA the host was not given",
                signer.sign(by_reference(&v2_reference, &v2_sha, false), &v2_sha),
                "PluginPullFailed",
                "certificate".into(),
            ),
            (
                "a component that needs component-model async",
                signer.sign(
                    by_reference(&async_reference, &pack::sha256_hex(&async_component), true),
                    &pack::sha256_hex(&async_component),
                ),
                "PluginNeedsAsync",
                "wasi:cli/environment@0.3.0".into(),
            ),
        ];
        for (situation, cm, reason, says) in refused {
            apply(cm).await?;
            let event = plugins::event_about(&events, PACK, reason, |note| note.contains(&says))
                .await
                .map_err(|e| anyhow::anyhow!("{situation}: {e}"))?;
            let note = event.note.unwrap_or_default();
            anyhow::ensure!(
                event.type_.as_deref() == Some("Warning")
                    && note.contains("misbehaving@2.0.0 keeps running"),
                "{situation}: {note}"
            );
            let loaded = host.running.store.list();
            anyhow::ensure!(
                loaded.len() == 1 && loaded[0].plugin.info().version == "2.0.0",
                "{situation}: v2 no longer loaded"
            );
        }
        // v2 still decides.
        apply_probe(&api, "second", "a").await?;
        wait_decided_by(&api, "second", "2.0.0").await?;
        Ok(())
    }
    .await;
    host.stop().await;
    for name in ["first", "second"] {
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
