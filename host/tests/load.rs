//! The loader against real components: a plugin loads and describes itself; a component built
//! against a newer contract, a component of another world, a core module and junk are each
//! refused with their own reason; the artifact cache serves the second load; `pack` writes a
//! ConfigMap that reads back to the same component.

use policy_host::decide::{Limits, Sandbox};
use policy_host::load::artifact_cache::{ArtifactCache, CacheOutcome};
use policy_host::load::pack::{PackDefaults, PluginPack, sha256_hex};
use policy_host::load::{LoadError, PluginLoader};
use policy_host::plugin_cli::{self, PackRequest};

fn misbehaving_bytes() -> Vec<u8> {
    let path = policy_host_test_plugins::build("misbehaving-policy").expect("plugin builds");
    std::fs::read(path).expect("plugin file readable")
}

fn loader(cache: Option<ArtifactCache>) -> PluginLoader {
    PluginLoader::new(Sandbox::new().expect("sandbox"), cache)
}

async fn refusal(bytes: &[u8]) -> LoadError {
    match loader(None)
        .load("test.wasm", bytes, &sha256_hex(bytes), Limits::default())
        .await
    {
        Ok(_) => panic!("expected a refusal"),
        Err(error) => error,
    }
}

/// Rewrites every `policy-host:policy/...@0.2.3` name to `@0.9.0` (same length, so the binary
/// stays valid): the component a plugin author gets when building against a newer WIT.
fn built_against_newer_contract(bytes: &[u8]) -> Vec<u8> {
    let (from, to) = (b"@0.2.3".as_slice(), b"@0.9.0".as_slice());
    let mut out = bytes.to_vec();
    let mut i = 0;
    while i + from.len() <= out.len() {
        let preceded_by_package = out[..i].ends_with(b"log")
            || out[..i].ends_with(b"app-call")
            || out[..i].ends_with(b"types")
            || out[..i].ends_with(b"exchange")
            || out[..i].ends_with(b"credentials")
            || out[..i].ends_with(b"metrics")
            || out[..i].ends_with(b"policy");
        if &out[i..i + from.len()] == from && preceded_by_package {
            out[i..i + from.len()].copy_from_slice(to);
        }
        i += 1;
    }
    out
}

#[tokio::test]
async fn a_plugin_loads_and_describes_itself() {
    let bytes = misbehaving_bytes();
    let (plugin, cache) = loader(None)
        .load(
            "misbehaving.wasm",
            &bytes,
            &sha256_hex(&bytes),
            Limits::default(),
        )
        .await
        .expect("loads");
    assert_eq!(plugin.info().name, "misbehaving");
    assert_eq!(plugin.content_sha256(), sha256_hex(&bytes));
    assert_eq!(cache, CacheOutcome::Disabled);
}

#[tokio::test]
async fn a_component_built_against_a_newer_contract_is_refused_as_too_new() {
    let error = refusal(&built_against_newer_contract(&misbehaving_bytes())).await;
    assert!(matches!(error, LoadError::TooNewContract { .. }), "{error}");
    assert!(
        error.to_string().contains("policy-host:policy@0.9.0"),
        "{error}"
    );
    assert!(error.to_string().contains("too-new contract"), "{error}");
}

#[tokio::test]
async fn a_component_of_another_world_is_refused_as_wrong_world() {
    let error = refusal(b"\0asm\x0d\0\x01\0").await;
    assert!(matches!(error, LoadError::WrongWorld { .. }), "{error}");
    assert_eq!(error.reason(), "PluginWrongWorld");
}

#[tokio::test]
async fn a_core_module_and_junk_are_not_components() {
    let core = refusal(b"\0asm\x01\0\0\0").await;
    assert!(matches!(core, LoadError::CoreModule { .. }), "{core}");
    let junk = refusal(b"#!/bin/sh\necho plugin\n").await;
    assert!(matches!(junk, LoadError::NotWasm { .. }), "{junk}");
    assert!(junk.to_string().contains("is not a component"), "{junk}");
    let broken = refusal(b"\0asm\x0d\0\x01\0\x07garbage").await;
    assert!(matches!(broken, LoadError::Compile { .. }), "{broken}");
}

#[tokio::test]
async fn the_second_load_of_a_component_comes_from_the_artifact_cache() {
    let dir = std::env::temp_dir().join(format!("policy-host-cache-test-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&dir);
    let bytes = misbehaving_bytes();
    let sha = sha256_hex(&bytes);
    let cache = ArtifactCache::new(&dir);
    let first = loader(Some(cache.clone()));
    let (_, outcome) = first
        .load("a", &bytes, &sha, Limits::default())
        .await
        .expect("loads");
    assert_eq!(outcome, CacheOutcome::Miss);
    // A new sandbox (as after a restart) with the same engine configuration hits the cache.
    let second = loader(Some(cache));
    let (plugin, outcome) = second
        .load("a", &bytes, &sha, Limits::default())
        .await
        .expect("loads");
    assert_eq!(outcome, CacheOutcome::Hit);
    assert_eq!(plugin.info().name, "misbehaving");
    let _ = std::fs::remove_dir_all(&dir);
}

#[tokio::test]
async fn pack_writes_a_config_map_that_reads_back_to_the_same_component() {
    let path = policy_host_test_plugins::build("misbehaving-policy").expect("plugin builds");
    let request = PackRequest {
        grants: policy_host::capability::scope::Grants {
            app_call_ports: vec!["http".into()],
            ..Default::default()
        },
        ..Default::default()
    };
    let yaml = plugin_cli::pack(&path, &request, &plugin_cli::host_defaults())
        .await
        .expect("packs");
    assert!(
        yaml.contains("policy-host.io/plugin: 'true'")
            || yaml.contains("policy-host.io/plugin: \"true\""),
        "{yaml}"
    );
    let cm: k8s_openapi::api::core::v1::ConfigMap =
        serde_yaml::from_str(&yaml).expect("YAML ConfigMap");
    assert_eq!(cm.metadata.name.as_deref(), Some("plugin-misbehaving"));
    let defaults = PackDefaults {
        limits: Limits::default(),
        concurrency: 8,
    };
    let pack = PluginPack::from_config_map(&cm, &defaults).expect("reads back");
    assert_eq!(pack.component, std::fs::read(&path).expect("readable"));
    assert_eq!(pack.grants.app_call_ports, vec!["http".to_string()]);

    let report = plugin_cli::validate(&path, &Default::default(), &plugin_cli::host_defaults())
        .await
        .expect("validates");
    assert_eq!(report["valid"], true);
    assert_eq!(report["name"], "misbehaving");
    assert_eq!(report["fitsConfigMap"], true);
}
