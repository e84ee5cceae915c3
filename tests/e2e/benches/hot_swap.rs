//! Hot swap (issue 6, part 3): the time from applying a plugin ConfigMap to the first
//! decision made by the new version, with the real control plane and the real host
//! (in-process, loading plugin ConfigMaps), with and without the precompiled artifact cache;
//! then the compile time of the etcd component from bytes and its load time from the cache.
//!
//! The swapped plugin is the `misbehaving` test plugin built as two versions, each writing
//! its version into the status of the `Probe` it reconciles, so the status says which version
//! decided. Swaps alternate between the two versions:
//!
//! - **cache hit**: the host has an artifact cache; after the first load of each version
//!   (a miss), every swap deserializes the precompiled component;
//! - **cache miss**: a host with no artifact cache, so every swap compiles with Cranelift,
//!   which is what a version never seen before costs.
//!
//! The clock starts before the server-side apply of the ConfigMap and stops when a GET of the
//! Probe shows the new version in its status (polled every 5 ms).
//!
//! Run: `env -u RUST_BACKTRACE cargo bench -p policy-host-e2e --bench hot_swap`.
//! `HOT_SWAP_BENCH_SWAPS` (default 20), `HOT_SWAP_BENCH_LOADS` (default 20).

use std::time::{Duration, Instant};

use anyhow::{Context, Result, anyhow};
use k8s_openapi::api::core::v1::ConfigMap;
use kube::api::{Api, DynamicObject, Patch, PatchParams};
use policy_host::Settings;
use policy_host::decide::{Limits, Sandbox};
use policy_host::load::PluginLoader;
use policy_host::load::artifact_cache::{ArtifactCache, CacheOutcome};
use policy_host::load::pack::{self, PackOptions, sha256_hex};
use policy_host_e2e::{HostUnderTest, install_crd_object, probe_crd, probes};
use serde_json::json;

const PACK: &str = "plugin-probe";
const WAIT: Duration = Duration::from_secs(90);

fn env_or(name: &str, default: usize) -> usize {
    std::env::var(name)
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(default)
}

fn millis(d: Duration) -> f64 {
    d.as_secs_f64() * 1e3
}

/// Median, min and max, in ms.
fn summary(mut samples: Vec<Duration>) -> (f64, f64, f64) {
    samples.sort();
    let median = samples.get(samples.len() / 2).copied().unwrap_or_default();
    (
        millis(median),
        millis(samples.first().copied().unwrap_or_default()),
        millis(samples.last().copied().unwrap_or_default()),
    )
}

fn main() -> Result<()> {
    let runtime = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()?;
    runtime.block_on(bench())
}

async fn bench() -> Result<()> {
    let swaps = env_or("HOT_SWAP_BENCH_SWAPS", 20);
    let loads = env_or("HOT_SWAP_BENCH_LOADS", 20);
    let build = |version: &str| -> Result<Vec<u8>> {
        let path = policy_host_test_plugins::build_version(version).map_err(|e| anyhow!("{e}"))?;
        Ok(std::fs::read(path)?)
    };
    let versions = [("1.0.0", build("1.0.0")?), ("2.0.0", build("2.0.0")?)];
    let env = policy_host_testenv::shared().await?;
    let client = env.client().await?;
    install_crd_object(&client, probe_crd()?).await?;

    println!("# hot swap: ConfigMap applied -> first decision by the new version");
    println!(
        "misbehaving plugin: {} B and {} B",
        versions[0].1.len(),
        versions[1].1.len()
    );
    println!("| artifact cache | swaps | median ms | min ms | max ms | first loads ms |");
    println!("|---|---:|---:|---:|---:|---|");
    for cached in [true, false] {
        let namespace = env
            .create_namespace(if cached { "swap-hit" } else { "swap-miss" })
            .await?;
        let mut settings = HostUnderTest::settings(&namespace, Limits::default())?;
        settings = Settings {
            plugin_namespace: Some(namespace.to_string()),
            artifact_cache: cached
                .then(|| std::env::temp_dir().join(format!("hot-swap-bench-{namespace}"))),
            ..settings
        };
        let host = HostUnderTest::start_with(env, settings).await?;
        let config_maps: Api<ConfigMap> = Api::namespaced(client.clone(), &namespace);
        let probes: Api<DynamicObject> =
            Api::namespaced_with(client.clone(), &namespace, &probes());
        let mut first = Vec::new();
        let mut samples = Vec::new();
        for round in 0..swaps + 2 {
            let (version, bytes) = &versions[round % 2];
            let started = Instant::now();
            let mut cm = pack::to_config_map(
                bytes,
                &PackOptions {
                    name: PACK.into(),
                    ..Default::default()
                },
            )?;
            cm.metadata.managed_fields = None;
            config_maps
                .patch(
                    PACK,
                    &PatchParams::apply("hot-swap-bench").force(),
                    &Patch::Apply(&cm),
                )
                .await?;
            if round == 0 {
                let probe = json!({
                    "apiVersion": "test.policy-host.io/v1", "kind": "Probe",
                    "metadata": {"name": "timed"}, "spec": {"behaviour": "ok"}
                });
                probes
                    .patch(
                        "timed",
                        &PatchParams::apply("hot-swap-bench").force(),
                        &Patch::Apply(&probe),
                    )
                    .await?;
            }
            loop {
                let seen = probes.get_opt("timed").await?.and_then(|p| {
                    p.data["status"]["pluginVersion"]
                        .as_str()
                        .map(str::to_owned)
                });
                if seen.as_deref() == Some(*version) {
                    break;
                }
                if started.elapsed() > WAIT {
                    return Err(anyhow!("version {version} did not decide within {WAIT:?}"));
                }
                tokio::time::sleep(Duration::from_millis(5)).await;
            }
            let took = started.elapsed();
            eprintln!(
                "[hot swap] cache {cached}, round {round}: {version} deciding after {took:?}"
            );
            if round < 2 {
                first.push(format!("{:.0}", millis(took)));
            } else {
                samples.push(took);
            }
        }
        let n = samples.len();
        let (median, min, max) = summary(samples);
        println!(
            "| {} | {n} | {median:.0} | {min:.0} | {max:.0} | {} |",
            if cached {
                "yes (hits; the first load of each version is a miss)"
            } else {
                "none (every swap compiles)"
            },
            first.join(", ")
        );
        host.stop().await;
        // Let the namespace go: no host runs anymore to remove the plugin's finalizer.
        let _ = probes
            .patch(
                "timed",
                &PatchParams::default(),
                &Patch::Merge(json!({"metadata": {"finalizers": null}})),
            )
            .await;
    }

    // The etcd plugin: compile from bytes, load from the precompiled artifact.
    let wasm = policy_host_test_plugins::build("guest-etcd").map_err(|e| anyhow!("{e}"))?;
    let bytes = std::fs::read(&wasm)?;
    let sha = sha256_hex(&bytes);
    let sandbox = Sandbox::new()?;
    let compile_reps = loads.min(5);
    let mut compiles = Vec::new();
    let uncached = PluginLoader::new(sandbox.clone(), None);
    for _ in 0..compile_reps {
        let started = Instant::now();
        uncached
            .load("guest-etcd", &bytes, &sha, Limits::default())
            .await
            .context("compiling guest-etcd")?;
        compiles.push(started.elapsed());
    }
    let cache_dir =
        std::env::temp_dir().join(format!("hot-swap-bench-etcd-{}", std::process::id()));
    let cached = PluginLoader::new(sandbox, Some(ArtifactCache::new(&cache_dir)));
    let started = Instant::now();
    let (_, outcome) = cached
        .load("guest-etcd", &bytes, &sha, Limits::default())
        .await?;
    let first_cached = started.elapsed();
    let mut hits = Vec::new();
    for _ in 0..loads {
        let started = Instant::now();
        let (_, outcome) = cached
            .load("guest-etcd", &bytes, &sha, Limits::default())
            .await?;
        hits.push(started.elapsed());
        if !matches!(outcome, CacheOutcome::Hit) {
            return Err(anyhow!("expected an artifact cache hit, got {outcome:?}"));
        }
    }
    let _ = std::fs::remove_dir_all(&cache_dir);
    println!();
    println!(
        "# guest-etcd ({} B): load = compile or deserialize, contract check, pre-instantiate, describe()",
        bytes.len()
    );
    println!("| load | n | median ms | min ms | max ms |");
    println!("|---|---:|---:|---:|---:|");
    let (m, lo, hi) = summary(compiles);
    println!(
        "| from bytes (Cranelift compile, no cache) | {compile_reps} | {m:.1} | {lo:.1} | {hi:.1} |"
    );
    println!(
        "| first load with a cache ({outcome:?}: compile + write artifact) | 1 | {:.1} | | |",
        millis(first_cached)
    );
    let (m, lo, hi) = summary(hits);
    println!("| from the precompiled artifact cache | {loads} | {m:.1} | {lo:.1} | {hi:.1} |");
    Ok(())
}
