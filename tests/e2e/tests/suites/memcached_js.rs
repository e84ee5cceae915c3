//! The JavaScript plugin end to end: `guest-memcached-js` built from its source by its own
//! script (npm's pinned toolchain, componentize-qjs with `--sync`), pushed to a real registry
//! (distribution's `registry`, HTTPS with a test CA, basic authentication) and loaded by the
//! host from a ConfigMap that names it by digest; on the real node it runs a pool of Debian 12's
//! memcached from the image the plugin declares beside itself (`test-images.yaml`), asks each
//! server `stats` over a session, scales the pool and replaces a deleted server. The test talks
//! to every server itself (memcached's text protocol over the Pod network) to see they are real,
//! and reads the pool's PodDisruptionBudget as the disruption controller computed it.

use std::io::{BufRead, BufReader, Write};
use std::net::TcpStream;
use std::path::Path;
use std::process::Command;
use std::time::Duration;

use k8s_openapi::api::core::v1::{ConfigMap, Pod};
use kube::api::{Api, ApiResource, DeleteParams, DynamicObject, ListParams, Patch, PatchParams};
use kube::core::GroupVersionKind;
use policy_host::Settings;
use policy_host::capability::scope::Grants;
use policy_host::decide::Limits;
use policy_host::load::oci::{self, RegistryAccess};
use policy_host::load::pack::{self, CaSource, PackOptions, RegistryPull};
use policy_host_e2e::etcd::eventually;
use policy_host_e2e::registry::{self, Registry};
use policy_host_e2e::{
    HostUnderTest, budget_computed, init_logging, install_crd, plugins, repo_root,
};
use policy_host_testenv::shared_node;
use serde_json::{Value, json};

const PACK: &str = "plugin-memcached";
const PULL_SECRET: &str = "registry-login";
const CA_CONFIG_MAP: &str = "registry-ca";
/// A cold pool: the image imported, three Pods started, each answering `stats`.
const CONVERGE: Duration = Duration::from_secs(180);

fn pools() -> ApiResource {
    ApiResource::from_gvk_with_plural(
        &GroupVersionKind::gvk("memcached.policy-host.io", "v1alpha1", "MemcachedPool"),
        "memcachedpools",
    )
}

/// Builds the QuickJS component with the plugin's own script (which also runs its native
/// tests and checks the component is synchronous) and returns its bytes.
fn build_component(folder: &Path) -> anyhow::Result<Vec<u8>> {
    let output = Command::new("bash")
        .arg(folder.join("build.sh"))
        .arg("quickjs")
        // The script's `policy-host validate` needs a built host; the suite loads it anyway.
        .env("POLICY_HOST", "/nonexistent")
        .output()?;
    anyhow::ensure!(
        output.status.success(),
        "guest-memcached-js/build.sh quickjs failed ({}): {}{}",
        output.status,
        String::from_utf8_lossy(&output.stdout),
        String::from_utf8_lossy(&output.stderr)
    );
    Ok(std::fs::read(folder.join("dist/memcached-qjs.wasm"))?)
}

/// What memcached at `ip` says to `version`: `VERSION <x>`.
fn version_of(ip: &str) -> Result<String, String> {
    let address = format!("{ip}:11211");
    let socket = address.parse().map_err(|e| format!("{address}: {e}"))?;
    let mut stream = TcpStream::connect_timeout(&socket, Duration::from_secs(2))
        .map_err(|e| format!("connecting to {address}: {e}"))?;
    stream
        .set_read_timeout(Some(Duration::from_secs(2)))
        .map_err(|e| e.to_string())?;
    stream
        .write_all(b"version\r\n")
        .map_err(|e| format!("writing to {address}: {e}"))?;
    let mut line = String::new();
    BufReader::new(stream)
        .read_line(&mut line)
        .map_err(|e| format!("reading from {address}: {e}"))?;
    Ok(line.trim_end().to_string())
}

/// The pool's status once it says `replicas` servers answer and Ready is True.
async fn ready_with(api: &Api<DynamicObject>, name: &str, replicas: i64) -> anyhow::Result<Value> {
    eventually(
        &format!("{name}: {replicas} servers answering, Ready"),
        CONVERGE,
        || async {
            let pool = api.get(name).await.map_err(|e| e.to_string())?;
            let status = pool.data.get("status").cloned().unwrap_or(Value::Null);
            let ready = status["conditions"]
                .as_array()
                .into_iter()
                .flatten()
                .any(|c| c["type"] == "Ready" && c["status"] == "True");
            if ready && status["readyServers"] == json!(replicas) {
                Ok(status)
            } else {
                Err(format!("status {status}"))
            }
        },
    )
    .await
}

/// The IPs of the pool's running server Pods, by name.
async fn server_ips(pods: &Api<Pod>, pool: &str) -> anyhow::Result<Vec<(String, String)>> {
    let listed = pods
        .list(&ListParams::default().labels(&format!("app.kubernetes.io/instance={pool}")))
        .await?;
    Ok(listed
        .items
        .into_iter()
        .filter(|p| p.metadata.deletion_timestamp.is_none())
        .filter_map(|p| Some((p.metadata.name?, p.status?.pod_ip?)))
        .collect())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_javascript_plugin_from_the_registry_runs_a_memcached_pool() -> anyhow::Result<()> {
    init_logging();
    let folder = repo_root().join("guest-memcached-js");
    let built = {
        let folder = folder.clone();
        tokio::task::spawn_blocking(move || build_component(&folder))
    };
    let env = shared_node().await?;
    let images = env.provide_images(&folder.join("test-images.yaml")).await?;
    anyhow::ensure!(
        images.iter().any(|i| i.repository() == "memcached"),
        "guest-memcached-js/test-images.yaml declares no memcached image"
    );
    let component = built.await??;
    let registry = Registry::start(env.binaries()).await?;
    let client = env.client().await?;
    install_crd(&client, "guest-memcached-js/crd.yaml").await?;
    let namespace = env.create_namespace("memcached-js").await?;
    registry
        .admit(&client, &namespace, PULL_SECRET, CA_CONFIG_MAP)
        .await?;

    // The admin's part: push the component, then a ConfigMap naming it by digest.
    let access = RegistryAccess {
        credentials: Some((registry::USER.into(), registry::PASSWORD.into())),
        ca_pem: Some(registry.ca_pem.clone().into_bytes()),
    };
    let reference = oci::push(
        &format!("oci://{}/plugins/memcached:js", registry.address),
        &component,
        &access,
        "the test CA",
    )
    .await?;
    let config_map = pack::to_reference_config_map(
        &RegistryPull {
            reference,
            pull_secret: Some(PULL_SECRET.into()),
            registry_ca: Some(CaSource::ConfigMap(CA_CONFIG_MAP.into())),
        },
        &pack::sha256_hex(&component),
        &PackOptions {
            name: PACK.into(),
            grants: Grants {
                exchange_ports: vec!["memcache".into()],
                ..Default::default()
            },
            ..Default::default()
        },
    );
    let artifacts = tempfile::tempdir()?;
    let settings = Settings {
        plugin_namespace: Some(namespace.to_string()),
        artifact_cache: Some(artifacts.path().to_path_buf()),
        ..HostUnderTest::settings(&namespace, Limits::default())?
    };
    let host = HostUnderTest::start_with(env, settings).await?;
    let config_maps: Api<ConfigMap> = Api::namespaced(client.clone(), &namespace);
    let api: Api<DynamicObject> = Api::namespaced_with(client.clone(), &namespace, &pools());
    let pods: Api<Pod> = Api::namespaced(client.clone(), &namespace);

    let outcome = async {
        plugins::apply_pack(&config_maps, config_map, "memcached-js-e2e").await?;
        let events = Api::namespaced(client.clone(), &namespace);
        plugins::event_about(&events, PACK, "PluginLoaded", |_| true).await?;

        let text = std::fs::read_to_string(folder.join("example.yaml"))?;
        let mut pool: Value = serde_yaml::from_str(&text)?;
        pool["metadata"]["namespace"] = json!(&*namespace);
        pool["spec"]["replicas"] = json!(2);
        let apply = |pool: Value| {
            let api = api.clone();
            async move {
                api.patch(
                    "demo",
                    &PatchParams::apply("memcached-js-e2e").force(),
                    &Patch::Apply(&pool),
                )
                .await
            }
        };
        apply(pool.clone()).await?;
        let status = ready_with(&api, "demo", 2).await?;
        let version = json!(pool["spec"]["version"]);
        anyhow::ensure!(
            status["servers"]
                .as_array()
                .is_some_and(|s| s.len() == 2 && s.iter().all(|s| s["version"] == version)),
            "each server's stats in the status, at version {version}: {status}"
        );

        // Scaled to three: a third server, and every one answers the test too.
        pool["spec"]["replicas"] = json!(3);
        apply(pool.clone()).await?;
        ready_with(&api, "demo", 3).await?;
        // The budget guards the servers: one of three may go. (One with `maxUnavailable` was
        // SyncFailed here, "no matches for kind MemcachedPool": it asks for the owner's scale.)
        budget_computed(&client, &namespace, "demo", (3, 1), CONVERGE).await?;
        let ips = server_ips(&pods, "demo").await?;
        anyhow::ensure!(ips.len() == 3, "three server Pods: {ips:?}");
        for (name, ip) in &ips {
            let answer = tokio::task::spawn_blocking({
                let ip = ip.clone();
                move || version_of(&ip)
            })
            .await?
            .map_err(anyhow::Error::msg)?;
            anyhow::ensure!(
                answer == format!("VERSION {}", pool["spec"]["version"].as_str().unwrap_or("")),
                "{name} answers {answer}"
            );
        }

        // A server deleted: the plugin creates it again, and the pool is whole.
        let (victim, _) = &ips[0];
        pods.delete(victim, &DeleteParams::default()).await?;
        eventually(
            &format!("{victim} back and answering"),
            CONVERGE,
            || async {
                let ips = server_ips(&pods, "demo").await.map_err(|e| e.to_string())?;
                let ip = ips
                    .iter()
                    .find(|(name, _)| name == victim)
                    .map(|(_, ip)| ip.clone())
                    .ok_or_else(|| format!("no running {victim}: {ips:?}"))?;
                tokio::task::spawn_blocking(move || version_of(&ip))
                    .await
                    .map_err(|e| e.to_string())?
            },
        )
        .await?;
        ready_with(&api, "demo", 3).await?;
        Ok(())
    }
    .await;
    if outcome.is_err() {
        for (name, _) in server_ips(&pods, "demo").await.unwrap_or_default() {
            eprintln!("{}", env.pod_logs(&namespace, &name).await);
        }
    }
    host.stop().await;
    outcome
}
