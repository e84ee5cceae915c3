//! A tenant cannot grow the host's memory with objects the host does not need (review H3):
//! anyone with `edit` in a namespace may put the policy label on their own objects, and the
//! child caches select by that label. Here a tenant creates hundreds of labelled ConfigMaps
//! with the largest annotations the API server takes, none of them controlled by a parent; the
//! host keeps none of them, its resident memory stays within a stated bound while they arrive
//! and when a fresh host lists them all (a standby taking over), and the policy's other parents
//! go on being reconciled.
//!
//! The host runs in a process of its own, so that its resident memory is its own and not this
//! test binary's, where other suites run side by side: this binary started again with
//! [`HOST_CHILD`] set runs only [`host_process`], which starts the host as the other suites
//! do and prints its admin address. Memory is read as the scale bench reads it, from the
//! process's `/proc/<pid>/status` (`VmRSS`, and `VmHWM` for the peak), and compared with a
//! bound; nothing is timed.
//!
//! The host is scoped to the test's namespace (every suite's host is, so that suites running
//! side by side do not reconcile each other's parents): the hostile objects sit in the
//! namespace of the parents, beside their real children, which is the harder case for the
//! cache: only the controller reference tells them apart.

use std::path::PathBuf;
use std::process::Stdio;
use std::time::Duration;

use k8s_openapi::api::core::v1::ConfigMap;
use kube::api::{Api, DynamicObject, Patch, PatchParams, PostParams};
use policy_host::decide::Limits;
use policy_host_e2e::{HostUnderTest, init_logging, install_crd_object, probe_crd, probes};
use policy_host_testenv::{shared_node, wait_for};
use serde_json::json;
use tokio::io::{AsyncBufReadExt, BufReader};

const WAIT: Duration = Duration::from_secs(120);
/// Set (to a JSON configuration) in the process that runs the host.
const HOST_CHILD: &str = "BOUNDED_CACHES_HOST";
/// The line the host process prints its admin address on.
const ADMIN_LINE: &str = "bounded-caches-admin ";
/// Hostile objects, each with [`ANNOTATION_BYTES`] of annotations: 150 MiB together.
const HOSTILE: usize = 600;
/// Near the API server's limit on an object's annotations (256 KiB).
const ANNOTATION_BYTES: usize = 250 << 10;
/// What the hostile objects may add to the host's resident memory at its peak, above what it
/// held before they came: a list page of them ([`LIST_PAGE_SIZE`] x 250 KiB = 12.5 MiB) read
/// as text, decoded, and measured for admission, with the allocator's slack (a fresh host
/// listing them was seen at 72 MiB above the first host's level on the loaded CI machine, 3 MiB
/// while they arrived one by one). Kept whole they would add 150 MiB.
///
/// [`LIST_PAGE_SIZE`]: policy_host::observe::admission::LIST_PAGE_SIZE
const BOUND_MIB: u64 = 100;

/// The host process's side: runs the host with the configuration in [`HOST_CHILD`] until it
/// is killed. Ignored in an ordinary run; without the variable it does nothing.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
#[ignore = "the host process of a_tenants_labelled_objects_do_not_grow_the_host; started by it"]
async fn host_process() -> anyhow::Result<()> {
    let Ok(config) = std::env::var(HOST_CHILD) else {
        return Ok(());
    };
    init_logging();
    let config: serde_json::Value = serde_json::from_str(&config)?;
    let text = |key: &str| config[key].as_str().unwrap_or_default().to_string();
    let kubeconfig = kube::config::Kubeconfig::read_from(text("kubeconfig"))?;
    let client = kube::Client::try_from(
        kube::Config::from_custom_kubeconfig(kubeconfig, &Default::default()).await?,
    )?;
    let mut settings = HostUnderTest::settings(&text("namespace"), Limits::default())?;
    settings.policy_files = vec![PathBuf::from(text("plugin"))];
    let host = HostUnderTest::start_with_client(client, settings).await?;
    let admin = host
        .running
        .admin_addr
        .ok_or_else(|| anyhow::anyhow!("the host serves no admin endpoint"))?;
    println!("{ADMIN_LINE}{admin}");
    std::future::pending::<()>().await;
    Ok(())
}

/// A host running in a process of its own.
struct HostProcess {
    child: tokio::process::Child,
    admin: std::net::SocketAddr,
}

impl HostProcess {
    async fn start(
        kubeconfig: &std::path::Path,
        namespace: &str,
        plugin: &std::path::Path,
    ) -> anyhow::Result<Self> {
        let config = json!({
            "kubeconfig": kubeconfig, "namespace": namespace, "plugin": plugin,
        });
        let mut child = tokio::process::Command::new(std::env::current_exe()?)
            .args([
                "bounded_caches::host_process",
                "--exact",
                "--ignored",
                "--nocapture",
            ])
            .env(HOST_CHILD, config.to_string())
            .stdout(Stdio::piped())
            .kill_on_drop(true)
            .spawn()?;
        let stdout = child
            .stdout
            .take()
            .ok_or_else(|| anyhow::anyhow!("no stdout of the host process"))?;
        let mut lines = BufReader::new(stdout).lines();
        let admin = tokio::time::timeout(WAIT, async {
            while let Some(line) = lines.next_line().await? {
                if let Some(addr) = line.strip_prefix(ADMIN_LINE) {
                    return anyhow::Ok(addr.trim().parse()?);
                }
            }
            anyhow::bail!("the host process ended before it served")
        })
        .await
        .map_err(|_| anyhow::anyhow!("the host process did not serve within {WAIT:?}"))??;
        // The rest of its output is not read: drain it so the process never blocks on it.
        tokio::spawn(async move { while let Ok(Some(_)) = lines.next_line().await {} });
        Ok(Self { child, admin })
    }

    /// A field of the process's `/proc/<pid>/status`, in KiB.
    fn status_kib(&self, field: &str) -> anyhow::Result<u64> {
        let pid = self
            .child
            .id()
            .ok_or_else(|| anyhow::anyhow!("the host process has ended"))?;
        let status = std::fs::read_to_string(format!("/proc/{pid}/status"))?;
        status
            .lines()
            .find_map(|l| l.strip_prefix(field))
            .and_then(|v| v.split_whitespace().next())
            .and_then(|v| v.parse().ok())
            .ok_or_else(|| anyhow::anyhow!("no {field} in /proc/{pid}/status"))
    }

    async fn get(&self, path: &str) -> Option<String> {
        let response = reqwest::get(format!("http://{}{path}", self.admin))
            .await
            .ok()?;
        if !response.status().is_success() {
            return None;
        }
        response.text().await.ok()
    }

    /// The value of a counter or gauge series of the host's `/metrics`.
    async fn metric(&self, series: &str) -> Option<u64> {
        let text = self.get("/metrics").await?;
        text.lines()
            .find_map(|l| l.strip_prefix(series)?.trim().parse::<f64>().ok())
            .map(|v| v as u64)
    }

    async fn ready(&self) -> anyhow::Result<()> {
        wait_for("the host process ready", WAIT, || self.get("/readyz")).await?;
        Ok(())
    }

    async fn kill(mut self) {
        let _ = self.child.kill().await;
    }
}

async fn apply_probe(api: &Api<DynamicObject>, name: &str) -> anyhow::Result<()> {
    let probe = json!({
        "apiVersion": "test.policy-host.io/v1", "kind": "Probe",
        "metadata": { "name": name }, "spec": { "behaviour": "ok" }
    });
    api.patch(
        name,
        &PatchParams::apply("e2e").force(),
        &Patch::Apply(&probe),
    )
    .await?;
    Ok(())
}

/// Waits until the host decided for the new parent `name`: the plugin writes its version into
/// the status on every decision.
async fn decided(api: &Api<DynamicObject>, name: &str) -> anyhow::Result<()> {
    wait_for(&format!("`{name}` decided"), WAIT, || async {
        let probe = api.get(name).await.ok()?;
        probe.data["status"]["pluginVersion"]
            .is_string()
            .then_some(())
    })
    .await?;
    Ok(())
}

fn hostile(n: usize) -> ConfigMap {
    serde_json::from_value(json!({
        "apiVersion": "v1", "kind": "ConfigMap",
        "metadata": {
            "name": format!("tenant-{n:04}"),
            "labels": { "policy-host.io/policy": "misbehaving" },
            "annotations": { "tenant.example.com/blob": "x".repeat(ANNOTATION_BYTES) },
        },
        "data": { "n": n.to_string() },
    }))
    .expect("a valid ConfigMap")
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_tenants_labelled_objects_do_not_grow_the_host_and_other_parents_reconcile()
-> anyhow::Result<()> {
    use futures::{StreamExt, TryStreamExt};

    init_logging();
    let env = shared_node().await?;
    let client = env.client().await?;
    install_crd_object(&client, probe_crd()?).await?;
    let namespace = env.create_namespace("bounded").await?;
    let plugin = policy_host_test_plugins::build("misbehaving-policy")
        .map_err(|e| anyhow::anyhow!("{e}"))?;
    let host = HostProcess::start(env.kubeconfig_path(), &namespace, &plugin).await?;
    host.ready().await?;
    let api: Api<DynamicObject> = Api::namespaced_with(client.clone(), &namespace, &probes());
    apply_probe(&api, "before").await?;
    decided(&api, "before").await?;
    let rss_before = host.status_kib("VmRSS:")?;

    // The tenant's objects: labelled, controlled by nothing, 250 KiB of annotations each.
    let config_maps: Api<ConfigMap> = Api::namespaced(client.clone(), &namespace);
    futures::stream::iter(0..HOSTILE)
        .map(|n| {
            let config_maps = config_maps.clone();
            async move {
                config_maps
                    .create(&PostParams::default(), &hostile(n))
                    .await
            }
        })
        .buffer_unordered(8)
        .try_collect::<Vec<_>>()
        .await?;
    let ignored = "policy_host_cache_ignored_total{policy=\"misbehaving\",cache=\"configmaps.v1\"}";
    wait_for("the host saw every hostile object", WAIT, || async {
        (host.metric(ignored).await? >= HOSTILE as u64).then_some(())
    })
    .await?;

    // Another parent of the policy is decided.
    apply_probe(&api, "after").await?;
    decided(&api, "after").await?;
    let kept = host
        .metric("policy_host_cache_objects{policy=\"misbehaving\",cache=\"configmaps.v1\"}")
        .await;
    assert_eq!(kept, Some(2), "only the parents' own children are cached");
    let peak = host.status_kib("VmHWM:")?;
    println!(
        "bounded_caches: RSS before {} KiB, peak after {HOSTILE} hostile objects {} KiB",
        rss_before, peak
    );
    assert!(
        peak.saturating_sub(rss_before) <= BOUND_MIB << 10,
        "the host's peak RSS grew by {} MiB (from {} MiB) while {HOSTILE} objects of {} KiB arrived; the bound is {BOUND_MIB} MiB",
        peak.saturating_sub(rss_before) >> 10,
        rss_before >> 10,
        ANNOTATION_BYTES >> 10
    );
    host.kill().await;

    // A fresh host (a standby taking over) lists them all at its start.
    let host = HostProcess::start(env.kubeconfig_path(), &namespace, &plugin).await?;
    host.ready().await?;
    apply_probe(&api, "later").await?;
    decided(&api, "later").await?;
    let peak = host.status_kib("VmHWM:")?;
    println!("bounded_caches: a fresh host listing them peaked at {peak} KiB");
    assert!(
        peak.saturating_sub(rss_before) <= BOUND_MIB << 10,
        "a host listing {HOSTILE} objects of {} KiB peaked {} MiB above the first host's {} MiB; the bound is {BOUND_MIB} MiB",
        ANNOTATION_BYTES >> 10,
        peak.saturating_sub(rss_before) >> 10,
        rss_before >> 10
    );
    host.kill().await;
    Ok(())
}
