//! What a plugin costs the host by its size and language (issue 27 item 5), printed as a table
//! for BENCHMARKS.md: compile time and peak memory, load from the precompiled-artifact cache,
//! a fresh-instance decision, and decisions per CPU-second, for the Rust plugins and the
//! JavaScript one (QuickJS, 1.2 MiB; SpiderMonkey, 12 MiB).
//!
//! Each component is measured in a process of its own (this bench runs itself with `--one`),
//! so the peak resident memory it reports (`VmHWM`) is what loading and running that component
//! took, beside what the engine alone takes (`VmRSS` once the sandbox exists). The decision is
//! each plugin's first one for its example resource (no children yet: no app-calls), on a new
//! instance each time, as the controller runs it.
//!
//! Run: `env -u RUST_BACKTRACE cargo bench -p policy-host --bench plugin_cost`. The Rust
//! plugins are built here; the JavaScript ones are measured when built
//! (`bash guest-memcached-js/build.sh`, which writes `guest-memcached-js/dist/*.wasm`).
//! `PLUGIN_COST_DECISIONS` (default 200) decisions per component, `PLUGIN_COST_MEMORY_MIB`
//! (default: the host's default limit) the plugins' memory limit.

use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

use anyhow::{Context, Result, anyhow, bail};
use serde::{Deserialize, Serialize};
use serde_json::Value;

use policy_host::capability::replay::AppCallScript;
use policy_host::capability::scope::AppCallScope;
use policy_host::contract::{Observation, Timestamp};
use policy_host::decide::{Limits, Sandbox};
use policy_host::load::PluginLoader;
use policy_host::load::artifact_cache::ArtifactCache;

/// One component's figures, as the measuring process reports them to the table.
#[derive(Serialize, Deserialize)]
struct Figures {
    bytes: u64,
    engine_rss_mib: f64,
    compile_ms: f64,
    compile_peak_rss_mib: f64,
    cache_miss_ms: f64,
    cache_hit_ms: f64,
    artifact_bytes: u64,
    decision_p50_us: f64,
    decision_p99_us: f64,
    decisions_per_cpu_second: f64,
    peak_rss_mib: f64,
    actions: usize,
}

/// A component to measure: its label, file, and the example resource it decides about.
struct Subject {
    label: &'static str,
    wasm: PathBuf,
    example: PathBuf,
}

fn main() -> Result<()> {
    let args: Vec<String> = std::env::args().collect();
    if let Some(at) = args.iter().position(|a| a == "--one") {
        let (Some(wasm), Some(example)) = (args.get(at + 1), args.get(at + 2)) else {
            bail!("usage: plugin_cost --one <component.wasm> <example.yaml>");
        };
        let runtime = tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .build()?;
        let figures = runtime.block_on(measure(Path::new(wasm), Path::new(example)))?;
        println!("FIGURES {}", serde_json::to_string(&figures)?);
        return Ok(());
    }
    if std::env::var_os("RUST_BACKTRACE").is_some() {
        eprintln!(
            "warning: RUST_BACKTRACE is set; every wasmtime error captures a backtrace. Run with `env -u RUST_BACKTRACE`."
        );
    }
    let root = Path::new(env!("CARGO_MANIFEST_DIR")).join("..");
    let mut subjects = vec![
        Subject {
            label: "guest-etcd (Rust)",
            wasm: policy_host_test_plugins::build("guest-etcd")?,
            example: root.join("deploy/examples/etcd-cluster.yaml"),
        },
        Subject {
            label: "guest-redis (Rust)",
            wasm: policy_host_test_plugins::build("guest-redis")?,
            example: root.join("deploy/examples/redis-replication.yaml"),
        },
    ];
    for (label, file) in [
        (
            "guest-memcached-js, QuickJS (componentize-qjs)",
            "memcached-qjs.wasm",
        ),
        (
            "guest-memcached-js, SpiderMonkey (componentize-js)",
            "memcached.wasm",
        ),
    ] {
        let wasm = root.join("guest-memcached-js/dist").join(file);
        if wasm.exists() {
            subjects.push(Subject {
                label,
                wasm,
                example: root.join("guest-memcached-js/example.yaml"),
            });
        } else {
            println!(
                "skipped {label}: {} not built (bash guest-memcached-js/build.sh)",
                wasm.display()
            );
        }
    }

    let me = std::env::current_exe()?;
    println!(
        "| plugin | component | engine alone (RSS) | compile, no cache | peak RSS after compile | first load, cache miss | load, cache hit | artifact | fresh-instance decision p50 / p99 | decisions per CPU-second | peak RSS after the decisions |"
    );
    println!("|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|");
    for subject in &subjects {
        let output = std::process::Command::new(&me)
            .arg("--one")
            .arg(&subject.wasm)
            .arg(&subject.example)
            .output()
            .with_context(|| format!("running {} --one", me.display()))?;
        let stdout = String::from_utf8_lossy(&output.stdout);
        let Some(line) = stdout.lines().find_map(|l| l.strip_prefix("FIGURES ")) else {
            println!(
                "| {} | failed: {} | | | | | | | | | |",
                subject.label,
                String::from_utf8_lossy(&output.stderr)
                    .lines()
                    .last()
                    .unwrap_or("no output")
            );
            continue;
        };
        let f: Figures = serde_json::from_str(line)?;
        println!(
            "| {} | {} B | {:.0} MiB | {:.0} ms | {:.0} MiB | {:.0} ms | {:.2} ms | {} B | {:.0} / {:.0} µs | {:.0} | {:.0} MiB |",
            subject.label,
            f.bytes,
            f.engine_rss_mib,
            f.compile_ms,
            f.compile_peak_rss_mib,
            f.cache_miss_ms,
            f.cache_hit_ms,
            f.artifact_bytes,
            f.decision_p50_us,
            f.decision_p99_us,
            f.decisions_per_cpu_second,
            f.peak_rss_mib,
        );
    }
    Ok(())
}

/// Everything for one component, in this process.
async fn measure(wasm: &Path, example: &Path) -> Result<Figures> {
    let bytes = std::fs::read(wasm).with_context(|| format!("reading {}", wasm.display()))?;
    let sha256 = policy_host::load::pack::sha256_hex(&bytes);
    let mut limits = Limits::default();
    if let Some(mib) = std::env::var("PLUGIN_COST_MEMORY_MIB")
        .ok()
        .and_then(|m| m.parse::<usize>().ok())
    {
        limits.memory_bytes = mib << 20;
    }
    let sandbox = Sandbox::new()?;
    let engine_rss_mib = status_mib("VmRSS")?;

    // Compile with no cache: what a never-seen version costs.
    let uncached = PluginLoader::new(sandbox.clone(), None);
    let started = Instant::now();
    let (plugin, _) = uncached
        .load("bench", &bytes, &sha256, limits.clone())
        .await?;
    let compile_ms = ms(started.elapsed());
    let compile_peak_rss_mib = status_mib("VmHWM")?;

    // Through the artifact cache: the first load compiles and writes, the next ones read.
    let dir = std::env::temp_dir().join(format!("plugin-cost-{}", std::process::id()));
    let cached = PluginLoader::new(sandbox.clone(), Some(ArtifactCache::new(&dir)));
    let started = Instant::now();
    cached
        .load("bench", &bytes, &sha256, limits.clone())
        .await?;
    let cache_miss_ms = ms(started.elapsed());
    let mut hits = Vec::new();
    for _ in 0..5 {
        let started = Instant::now();
        cached
            .load("bench", &bytes, &sha256, limits.clone())
            .await?;
        hits.push(ms(started.elapsed()));
    }
    let artifact_bytes = std::fs::read_dir(&dir)
        .map(|entries| {
            entries
                .filter_map(|e| e.ok()?.metadata().ok())
                .map(|m| m.len())
                .sum()
        })
        .unwrap_or(0);
    let _ = std::fs::remove_dir_all(&dir);

    // Decisions: a new instance each, as the controller runs them; at least 2 s of them.
    let observation = first_observation(example)?;
    let parent = format!(
        "{}/{}",
        "bench",
        serde_json::from_str::<Value>(&observation.parent)?["metadata"]["name"]
            .as_str()
            .unwrap_or("example")
    );
    let wanted: usize = std::env::var("PLUGIN_COST_DECISIONS")
        .ok()
        .and_then(|n| n.parse().ok())
        .unwrap_or(200);
    let decide = || {
        plugin.reconcile(
            &observation,
            AppCallScope::scripted(parent.clone(), AppCallScript::default()),
            "bench",
        )
    };
    let first = decide().await?;
    let mut times = Vec::new();
    let cpu_before = cpu_seconds()?;
    let started = Instant::now();
    while times.len() < wanted || started.elapsed() < Duration::from_secs(2) {
        let one = Instant::now();
        decide().await?;
        times.push(one.elapsed().as_secs_f64() * 1e6);
    }
    let cpu = cpu_seconds()? - cpu_before;
    times.sort_by(f64::total_cmp);
    let percentile = |p: f64| times[((times.len() - 1) as f64 * p).round() as usize];
    Ok(Figures {
        bytes: bytes.len() as u64,
        engine_rss_mib,
        compile_ms,
        compile_peak_rss_mib,
        cache_miss_ms,
        cache_hit_ms: median(&mut hits),
        artifact_bytes,
        decision_p50_us: percentile(0.5),
        decision_p99_us: percentile(0.99),
        decisions_per_cpu_second: times.len() as f64 / cpu.max(f64::EPSILON),
        peak_rss_mib: status_mib("VmHWM")?,
        actions: first.actions.len(),
    })
}

/// The example resource as the informer would hand it over before any child exists.
fn first_observation(example: &Path) -> Result<Observation> {
    let text = std::fs::read_to_string(example)
        .with_context(|| format!("reading {}", example.display()))?;
    let mut parent: Value = serde_yaml::from_str(&text)?;
    let metadata = parent
        .get_mut("metadata")
        .and_then(Value::as_object_mut)
        .ok_or_else(|| anyhow!("{} has no metadata", example.display()))?;
    metadata.insert("namespace".into(), "bench".into());
    metadata.insert("uid".into(), "00000000-0000-4000-8000-000000000001".into());
    metadata.insert("generation".into(), 1.into());
    Ok(Observation {
        parent: parent.to_string(),
        children: Vec::new(),
        now: Timestamp {
            seconds: 1_764_000_000,
            nanoseconds: 0,
        },
    })
}

fn ms(elapsed: Duration) -> f64 {
    elapsed.as_secs_f64() * 1e3
}

fn median(values: &mut [f64]) -> f64 {
    values.sort_by(f64::total_cmp);
    values[values.len() / 2]
}

/// A `/proc/self/status` memory line (`VmRSS`, `VmHWM`) in MiB.
fn status_mib(field: &str) -> Result<f64> {
    let status = std::fs::read_to_string("/proc/self/status")?;
    let kib: f64 = status
        .lines()
        .find_map(|l| l.strip_prefix(field)?.strip_prefix(':'))
        .and_then(|v| v.trim().trim_end_matches("kB").trim().parse().ok())
        .ok_or_else(|| anyhow!("/proc/self/status has no {field}"))?;
    Ok(kib / 1024.0)
}

/// CPU time of this process (user + system), from `/proc/self/stat` in clock ticks (USER_HZ,
/// 100 on Linux).
fn cpu_seconds() -> Result<f64> {
    let stat = std::fs::read_to_string("/proc/self/stat")?;
    // Fields after the command name, which is in parentheses and may hold spaces.
    let rest = stat
        .rsplit_once(')')
        .map(|(_, rest)| rest)
        .ok_or_else(|| anyhow!("/proc/self/stat unreadable"))?;
    let fields: Vec<&str> = rest.split_whitespace().collect();
    let ticks = |i: usize| -> Result<f64> {
        fields
            .get(i)
            .and_then(|f| f.parse::<f64>().ok())
            .ok_or_else(|| anyhow!("/proc/self/stat has no field {i}"))
    };
    // utime and stime are fields 14 and 15 of the line, 12 and 13 after the command name.
    Ok((ticks(11)? + ticks(12)?) / 100.0)
}
