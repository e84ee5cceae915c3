//! Footprint (issue 6, part 5): the etcd plugin's size raw and gzipped, the host binary's
//! size, and the resident memory of a process holding the host's engine with the etcd
//! plugin loaded (after one decision), idle.
//!
//! Run: `cargo build --release -p policy-host && env -u RUST_BACKTRACE cargo bench -p
//! policy-host --bench footprint`. The RSS is this bench process's (engine, epoch ticker,
//! compiled plugin, pre-instantiated linker, a tokio runtime), without the kube client and
//! informer caches of a running host: those are measured with the whole operator.

use std::io::Write;

use anyhow::{Context, Result};
use flate2::Compression;
use flate2::write::GzEncoder;

use policy_host::capability::scope::AppCallScope;
use policy_host::decide::{Limits, Sandbox};
use policy_host::load::PluginLoader;
use policy_host::load::artifact_cache::ArtifactCache;
use policy_host::load::pack::sha256_hex;

/// Set in the child process that loads the plugin from the artifact cache, as a restarted
/// host does: its RSS has no compiler residue.
const CACHED_CHILD: &str = "FOOTPRINT_CACHED_CHILD";

/// A line of `/proc/self/status`, in KiB.
fn status_kib(field: &str) -> Option<u64> {
    let status = std::fs::read_to_string("/proc/self/status").ok()?;
    let line = status.lines().find(|l| l.starts_with(field))?;
    line.split_whitespace().nth(1)?.parse().ok()
}

fn main() -> Result<()> {
    if let Some(dir) = std::env::var_os(CACHED_CHILD) {
        return cached_child(dir.into());
    }
    let rss_at_start = status_kib("VmRSS:");
    let wasm = policy_host_test_plugins::build("guest-etcd")?;
    let bytes = std::fs::read(&wasm)?;
    let mut gz = GzEncoder::new(Vec::new(), Compression::best());
    gz.write_all(&bytes)?;
    let gzipped = gz.finish()?;
    println!(
        "guest-etcd.wasm (profile plugin): {} B raw ({:.0} KiB), {} B gzip -9 ({:.0} KiB)",
        bytes.len(),
        bytes.len() as f64 / 1024.0,
        gzipped.len(),
        gzipped.len() as f64 / 1024.0
    );

    let host = policy_host_test_plugins::workspace_root().join("target/release/policy-host");
    match std::fs::metadata(&host) {
        Ok(meta) => println!(
            "host binary {}: {} B ({:.1} MiB)",
            host.display(),
            meta.len(),
            meta.len() as f64 / (1 << 20) as f64
        ),
        Err(_) => println!(
            "host binary {} not built: run `cargo build --release -p policy-host` first",
            host.display()
        ),
    }

    let runtime = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()?;
    let rss_before_engine = status_kib("VmRSS:");
    runtime.block_on(async {
        let sandbox = Sandbox::new()?;
        let rss_engine = status_kib("VmRSS:");
        let cache_dir =
            std::env::temp_dir().join(format!("footprint-cache-{}", std::process::id()));
        let loader = PluginLoader::new(sandbox, Some(ArtifactCache::new(&cache_dir)));
        let (plugin, _) = loader
            .load("guest-etcd", &bytes, &sha256_hex(&bytes), Limits::default())
            .await
            .context("loading guest-etcd")?;
        let rss_loaded = status_kib("VmRSS:");
        // One decision (on an empty observation the plugin refuses, which still instantiates it).
        let _ = plugin
            .reconcile(&sample_observation(), AppCallScope::none(), "measuring")
            .await;
        tokio::time::sleep(std::time::Duration::from_millis(500)).await;
        let rss_idle = status_kib("VmRSS:");
        println!(
            "RSS at start (before gzip and the build check): {}",
            show(rss_at_start)
        );
        println!("RSS with a tokio runtime: {}", show(rss_before_engine));
        println!(
            "RSS with the engine (pooling allocator, epoch ticker, linker): {}",
            show(rss_engine)
        );
        println!(
            "RSS with guest-etcd compiled (Cranelift, in-process) and pre-instantiated: {}",
            show(rss_loaded)
        );
        println!(
            "RSS idle after one decision: {}  (VmHWM {})",
            show(rss_idle),
            show(status_kib("VmHWM:"))
        );
        println!(
            "virtual size (pooling reservations): {}",
            show(status_kib("VmSize:"))
        );
        drop(plugin);
        let child = std::process::Command::new(std::env::current_exe()?)
            .env(CACHED_CHILD, &cache_dir)
            .env("FOOTPRINT_WASM", &wasm)
            .output()?;
        print!("{}", String::from_utf8_lossy(&child.stdout));
        let _ = std::fs::remove_dir_all(&cache_dir);
        anyhow::Ok(())
    })
}

/// A fresh process: engine, then guest-etcd from the artifact cache the parent filled, one
/// decision, idle.
fn cached_child(cache_dir: std::path::PathBuf) -> Result<()> {
    let wasm = std::env::var_os("FOOTPRINT_WASM").context("FOOTPRINT_WASM")?;
    let bytes = std::fs::read(wasm)?;
    let runtime = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()?;
    runtime.block_on(async {
        let loader = PluginLoader::new(Sandbox::new()?, Some(ArtifactCache::new(&cache_dir)));
        let started = std::time::Instant::now();
        let (plugin, outcome) = loader
            .load("guest-etcd", &bytes, &sha256_hex(&bytes), Limits::default())
            .await?;
        let took = started.elapsed();
        let _ = plugin
            .reconcile(&sample_observation(), AppCallScope::none(), "measuring")
            .await;
        tokio::time::sleep(std::time::Duration::from_millis(500)).await;
        println!(
            "fresh process, guest-etcd from the artifact cache ({outcome:?}, load {took:?}): RSS idle after one decision {}",
            show(status_kib("VmRSS:"))
        );
        anyhow::Ok(())
    })
}

fn show(kib: Option<u64>) -> String {
    kib.map_or("?".to_string(), |k| format!("{:.1} MiB", k as f64 / 1024.0))
}

fn sample_observation() -> policy_host::contract::Observation {
    policy_host::contract::Observation {
        parent: r#"{"apiVersion":"etcd.database.coreos.com/v1beta2","kind":"EtcdCluster","metadata":{"name":"ex","namespace":"ns"},"spec":{"size":1}}"#.into(),
        children: Vec::new(),
        now: policy_host::contract::Timestamp { seconds: 1_764_000_000, nanoseconds: 0 },
    }
}
