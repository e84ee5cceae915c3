//! Plugins by digest: what a pull from a real registry costs beside the compile it feeds. The
//! registry is the one the OCI suite runs (distribution's, HTTPS on 127.0.0.1 with a test CA
//! and htpasswd); the components are guest-etcd (the biggest plugin of the tree) and
//! guest-etcd padded with a custom section to 20 MiB, the size of a Python or JavaScript
//! component (padding costs the pull, the hashes and the size checks, not the compile).
//!
//! For each, `OCI_PULL_BENCH_RUNS` times (default 5): `load::oci::pull` (manifest by digest,
//! re-hashed; layer pulled and hashed), then for guest-etcd `PluginLoader::load` from the
//! pulled bytes with no artifact cache (Cranelift compile, contract check, pre-instantiate,
//! `describe()`), which is what the host does after a pull of a version it has not seen.
//!
//! Run: `env -u RUST_BACKTRACE cargo bench -p policy-host-e2e --bench oci_pull`.

use std::time::{Duration, Instant};

use anyhow::{Result, anyhow};
use policy_host::decide::{Limits, Sandbox};
use policy_host::load::PluginLoader;
use policy_host::load::oci::{self, RegistryAccess};
use policy_host_e2e::registry::{PASSWORD, Registry, USER};

fn millis(d: Duration) -> f64 {
    d.as_secs_f64() * 1e3
}

/// Median, min and max, in ms.
fn summary(mut samples: Vec<Duration>) -> String {
    samples.sort();
    let median = samples.get(samples.len() / 2).copied().unwrap_or_default();
    format!(
        "median {:.1} ms, min {:.1} ms, max {:.1} ms (n={})",
        millis(median),
        millis(samples.first().copied().unwrap_or_default()),
        millis(samples.last().copied().unwrap_or_default()),
        samples.len()
    )
}

fn main() -> Result<()> {
    let runs: usize = std::env::var("OCI_PULL_BENCH_RUNS")
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(5);
    let runtime = tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .build()?;
    runtime.block_on(async {
        let binaries = policy_host_testenv::Binaries::ensure()?;
        let registry = Registry::start(&binaries).await?;
        let etcd = std::fs::read(
            policy_host_test_plugins::build("guest-etcd").map_err(|e| anyhow!("{e}"))?,
        )?;
        let big =
            policy_host_e2e::plugins::padded(&etcd, (20usize << 20).saturating_sub(etcd.len()));
        let access = RegistryAccess {
            credentials: Some((USER.into(), PASSWORD.into())),
            ca_pem: Some(registry.ca_pem.clone().into_bytes()),
        };
        let loader = PluginLoader::new(Sandbox::new()?, None);
        for (what, component, compile) in [("guest-etcd", &etcd, true), ("padded", &big, false)] {
            let target = format!("oci://{}/bench/{what}:1", registry.address);
            let reference = oci::push(&target, component, &access, "the test CA").await?;
            let (mut pulls, mut compiles) = (Vec::new(), Vec::new());
            for _ in 0..runs {
                let started = Instant::now();
                let pulled = oci::pull(&reference, &access, "the test CA", 64 << 20).await?;
                pulls.push(started.elapsed());
                anyhow::ensure!(pulled.bytes == *component, "pulled other bytes");
                if compile {
                    let started = Instant::now();
                    loader
                        .load(what, &pulled.bytes, &pulled.sha256, Limits::default())
                        .await?;
                    compiles.push(started.elapsed());
                }
            }
            println!("{what} ({} B): pull {}", component.len(), summary(pulls));
            if compile {
                println!(
                    "{what}: load from the pulled bytes, no cache: {}",
                    summary(compiles)
                );
            }
        }
        Ok(())
    })
}
