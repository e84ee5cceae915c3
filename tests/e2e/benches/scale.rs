//! Throughput at scale (issue 6, part 2): `EtcdCluster` objects with their children in the real
//! kube-apiserver, the host's informer caches holding them, and steady-state decisions per
//! second plus the host's resident memory at 1, 10, 100 and 1,000 clusters.
//!
//! No etcd runs: each cluster's three member pods are created as the plugin creates them
//! (guest-etcd's own `children::member_pod`, the host's policy label and controller owner
//! reference) on a Node of their own that the test kubelet ignores, and their status is set
//! Running and Ready with a pod IP through the status subresource. etcd's answers come from an
//! [`AppCallScript`] built from the cached pods (member list, endpoint status), so the plugin
//! sees a healthy cluster and decides the steady decision (re-apply the Services and the
//! budget, set the status, requeue). The Services, the budget and the status are written by
//! the host's own act stage (`Executor::apply_decision`) on two passes before measuring.
//!
//! The measured process is a child of this bench holding what a host holds: a kube client,
//! the parents' cache and one child cache per declared kind built by the host's own
//! `observe::cache::{watch_parents, watch_children}` (label-selected, managedFields dropped,
//! an owner index beside each child cache, as the controller builds them), the engine and
//! guest-etcd loaded from the artifact cache (as a restarted host loads it). It runs
//! `observe` → `Plugin::reconcile` on its caches with the controller's concurrency (8) on a
//! 2-worker runtime, for a few rounds of a few seconds, and reports decisions per second and
//! its RSS from `/proc/self/status`. It also times, for every parent, finding its children
//! through the owner index and by the scan of every cached child that `observe` did before
//! the index, on the same caches.
//!
//! Once per step it also weighs the forms a child could be cached in (issue 17 item 2), on the
//! children it has cached: each child's text is read again into a `DynamicObject` (a
//! `serde_json::Value` tree, the form before), a typed k8s-openapi object, the host's
//! [`CachedChild`] (typed metadata, the rest as text) and the whole text beside typed
//! metadata. For each: the heap bytes held per child (a counting global allocator: bytes
//! asked for, without the allocator's own overhead) and the time to write the child out as
//! the observation's JSON text.
//!
//! With `SCALE_BENCH_SHARDS=2` each step is measured by two host processes at once, shard 0
//! and shard 1 of 2 (`policy_host::shard`), on this one machine: each keeps only its shard's
//! parents (the host's own filter in `watch_parents`) and their children (the children carry
//! their parent's shard label, as a sharded host writes them, and the child watches select on
//! it: `child_selector`), they wait for each
//! other once synced so that their rounds overlap, and a row per shard, after a row of one host
//! holding every parent (measured first, on the same objects), is followed by the two
//! together (decisions summed; decisions per CPU-second over both processes' CPU time).
//!
//! Run: `env -u RUST_BACKTRACE cargo bench -p policy-host-e2e --bench scale`.
//! `SCALE_BENCH_STEPS` (default `1,10,100,1000`), `SCALE_BENCH_SECONDS` (per round, default 5),
//! `SCALE_BENCH_ROUNDS` (default 3), `SCALE_BENCH_CONCURRENCY` (default 8),
//! `SCALE_BENCH_SHARDS` (default 1). Each step is measured by fresh host processes.

use std::collections::{HashMap, HashSet};
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::{Duration, Instant};

use anyhow::{Context, Result, anyhow};
use futures::{StreamExt, TryStreamExt};
use k8s_openapi::api::core::v1::{Node, Pod};
use kube::api::{Api, DynamicObject, Patch, PatchParams, PostParams};
use kube::runtime::reflector::Store;
use kube::runtime::watcher;
use kube::{Client, ResourceExt};
use serde_json::{Value, json};

use guest_etcd::children::{self, ClusterRef, ClusterState, MemberPod};
use guest_etcd::etcd_api::{MEMBER_LIST_PATH, MOVE_LEADER_PATH, STATUS_PATH};
use guest_etcd::spec::EtcdClusterSpec;
use policy_host::act::{Carried, Executor, FIELD_MANAGER, POLICY_LABEL, api_resource};
use policy_host::capability::replay::AppCallScript;
use policy_host::capability::scope::AppCallScope;
use policy_host::contract::{Action, Decision, app_call};
use policy_host::decide::{Limits, Plugin, Sandbox};
use policy_host::load::PluginLoader;
use policy_host::load::artifact_cache::ArtifactCache;
use policy_host::load::pack::sha256_hex;
use policy_host::metrics::Metrics;
use policy_host::observe::admission::CacheLimits;
use policy_host::observe::cache::{CacheBounds, child_selector, watch_children, watch_parents};
use policy_host::observe::{CachedChild, ChildCache, Observed, is_controlled_by, observe};
use policy_host::shard::{CHILD_SHARD_LABEL, Shard};

/// Set (to a JSON configuration) in the child process that plays the host.
const HOST_CHILD: &str = "SCALE_BENCH_HOST";
/// The Node the bench's pods are bound to: it exists (so pod GC keeps them) but no kubelet
/// runs it, and the test kubelet runs only pods bound to its own node.
const BENCH_NODE: &str = "scale-bench-node";
const MEMBERS: usize = 3;
const VERSION: &str = "3.6.16";

fn env_or<T: std::str::FromStr>(name: &str, default: T) -> T {
    std::env::var(name)
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(default)
}

/// The system allocator, counting the bytes held: what weighs the cache forms.
struct CountingAllocator;

static HELD_BYTES: AtomicUsize = AtomicUsize::new(0);

// SAFETY: every call is passed to the system allocator unchanged; only a counter is kept
// beside it.
#[allow(unsafe_code)]
unsafe impl std::alloc::GlobalAlloc for CountingAllocator {
    unsafe fn alloc(&self, layout: std::alloc::Layout) -> *mut u8 {
        HELD_BYTES.fetch_add(layout.size(), Ordering::Relaxed);
        // SAFETY: the caller's contract for `alloc`, passed on.
        unsafe { std::alloc::System.alloc(layout) }
    }

    unsafe fn dealloc(&self, ptr: *mut u8, layout: std::alloc::Layout) {
        HELD_BYTES.fetch_sub(layout.size(), Ordering::Relaxed);
        // SAFETY: the caller's contract for `dealloc`, passed on.
        unsafe { std::alloc::System.dealloc(ptr, layout) }
    }

    unsafe fn realloc(&self, ptr: *mut u8, layout: std::alloc::Layout, new_size: usize) -> *mut u8 {
        HELD_BYTES.fetch_add(new_size, Ordering::Relaxed);
        HELD_BYTES.fetch_sub(layout.size(), Ordering::Relaxed);
        // SAFETY: the caller's contract for `realloc`, passed on.
        unsafe { std::alloc::System.realloc(ptr, layout, new_size) }
    }
}

#[global_allocator]
static ALLOCATOR: CountingAllocator = CountingAllocator;

/// A child in one candidate cache form, held only to be weighed and written out.
trait CacheForm {
    fn write(&self) -> Result<String>;
}

impl CacheForm for DynamicObject {
    fn write(&self) -> Result<String> {
        Ok(serde_json::to_string(self)?)
    }
}

impl CacheForm for CachedChild {
    fn write(&self) -> Result<String> {
        Ok(self.to_json()?)
    }
}

/// A typed k8s-openapi object.
struct Typed<T>(T);

impl<T: serde::Serialize> CacheForm for Typed<T> {
    fn write(&self) -> Result<String> {
        Ok(serde_json::to_string(&self.0)?)
    }
}

/// The whole object's text, beside its typed metadata for the host.
struct WholeText {
    _metadata: kube::api::ObjectMeta,
    text: Box<str>,
}

impl CacheForm for WholeText {
    fn write(&self) -> Result<String> {
        Ok(self.text.to_string())
    }
}

/// Weighs the candidate forms on the cached children: heap bytes held per child, and the time
/// to write each out as observation text. Another process's heap does not enter: the counter
/// is read on this thread with nothing else allocating meanwhile except the watch tasks, whose
/// share is noise at these sizes (their steady state holds no new objects).
fn weigh_forms(caches: &[ChildCache]) -> Result<Value> {
    let texts: Vec<(String, String)> = caches
        .iter()
        .flat_map(|cache| {
            cache
                .store
                .state()
                .into_iter()
                .map(move |child| Ok((cache.kind.kind.clone(), child.to_json()?)))
        })
        .collect::<Result<_>>()?;
    let count = texts.len().max(1);
    let text_bytes: usize = texts.iter().map(|(_, t)| t.len()).sum();
    // Boxed as a store holds each object behind an `Arc`: the struct's own size counts.
    let read = |form: &str, kind: &str, text: &str| -> Result<Box<dyn CacheForm>> {
        Ok(match (form, kind) {
            ("tree", _) => Box::new(serde_json::from_str::<DynamicObject>(text)?),
            ("typed", "Pod") => Box::new(Typed(serde_json::from_str::<Pod>(text)?)),
            ("typed", "Service") => Box::new(Typed(serde_json::from_str::<
                k8s_openapi::api::core::v1::Service,
            >(text)?)),
            ("typed", "PodDisruptionBudget") => Box::new(Typed(serde_json::from_str::<
                k8s_openapi::api::policy::v1::PodDisruptionBudget,
            >(text)?)),
            ("typed", other) => return Err(anyhow!("no typed form for {other}")),
            ("compact", _) => Box::new(serde_json::from_str::<CachedChild>(text)?),
            _ => Box::new(WholeText {
                _metadata: serde_json::from_str::<CachedChild>(text)?.metadata,
                text: text.into(),
            }),
        })
    };
    let mut rows = Vec::new();
    for form in ["tree", "typed", "compact", "text"] {
        let mut held: Vec<Box<dyn CacheForm>> = Vec::with_capacity(texts.len());
        let before = HELD_BYTES.load(Ordering::Relaxed);
        for (kind, text) in &texts {
            held.push(read(form, kind, text)?);
        }
        let bytes = HELD_BYTES.load(Ordering::Relaxed).saturating_sub(before);
        let mut written = 0usize;
        let started = Instant::now();
        for child in &held {
            written += child.write()?.len();
        }
        let write_ns = started.elapsed().as_nanos() as f64 / count as f64;
        rows.push(json!({
            "form": form,
            "bytes_per_child": bytes / count,
            "write_ns_per_child": write_ns.round(),
            "written_bytes_per_child": written / count,
        }));
        drop(held);
    }
    Ok(json!({"children": texts.len(), "text_bytes_per_child": text_bytes / count, "forms": rows}))
}

/// A line of `/proc/self/status`, in KiB.
fn status_kib(field: &str) -> u64 {
    std::fs::read_to_string("/proc/self/status")
        .ok()
        .and_then(|status| {
            let line = status.lines().find(|l| l.starts_with(field))?.to_owned();
            line.split_whitespace().nth(1)?.parse().ok()
        })
        .unwrap_or(0)
}

fn mib(kib: u64) -> f64 {
    kib as f64 / 1024.0
}

/// FNV-1a: stable member and cluster IDs from names, the same in every process.
fn stable_id(text: &str) -> u64 {
    text.bytes().fold(0xcbf2_9ce4_8422_2325_u64, |h, b| {
        (h ^ u64::from(b)).wrapping_mul(0x0100_0000_01b3)
    })
}

fn percentile(samples: &mut [Duration], p: usize) -> Duration {
    if samples.is_empty() {
        return Duration::ZERO;
    }
    samples.sort();
    samples[(samples.len() - 1) * p / 100]
}

fn median(mut values: Vec<f64>) -> f64 {
    values.sort_by(f64::total_cmp);
    values.get(values.len() / 2).copied().unwrap_or(0.0)
}

/// What a host holds for one policy: the plugin and its watch caches, built by the host's own
/// functions as the controller calls them (parents unfiltered in the namespace, children
/// selected by the policy label).
struct HostCaches {
    plugin: Plugin,
    parents: Store<DynamicObject>,
    caches: Vec<ChildCache>,
    tasks: Vec<tokio::task::JoinHandle<()>>,
}

impl HostCaches {
    async fn start(client: &Client, namespace: &str, plugin: Plugin, shard: Shard) -> Result<Self> {
        let info = plugin.info().clone();
        let mut tasks = Vec::new();
        let parent_resource = api_resource(&info.target);
        let api =
            Api::<DynamicObject>::namespaced_with(client.clone(), namespace, &parent_resource);
        // Unbounded: the 10,000-cluster step holds 30,000 Pods, past a cache's default bound.
        let bounds = CacheBounds {
            policy: info.name.clone(),
            metrics: Metrics::new(),
            children: CacheLimits::UNBOUNDED,
            parents: CacheLimits::UNBOUNDED,
        };
        let (parents, stream) = watch_parents(
            api,
            parent_resource,
            watcher::Config::default(),
            shard,
            &bounds,
        );
        tasks.push(tokio::spawn(stream.for_each(|_| async {})));
        let mut caches = Vec::new();
        for kind in &info.children {
            let resource = api_resource(kind);
            let api = Api::<CachedChild>::namespaced_with(client.clone(), namespace, &resource);
            let config = watcher::Config::default().labels(&child_selector(&info.name, shard));
            let (cache, stream) =
                watch_children(api, kind.clone(), resource, config, &info.target, &bounds);
            tasks.push(tokio::spawn(stream.for_each(|_| async {})));
            caches.push(cache);
        }
        let ready = async {
            parents.wait_until_ready().await?;
            for cache in &caches {
                cache.store.wait_until_ready().await?;
            }
            anyhow::Ok(())
        };
        tokio::time::timeout(Duration::from_secs(300), ready)
            .await
            .context("the watch caches did not sync within 300 s")??;
        Ok(Self {
            plugin,
            parents,
            caches,
            tasks,
        })
    }

    fn cached(&self, kind: &str) -> usize {
        self.caches
            .iter()
            .filter(|c| c.kind.kind == kind)
            .map(|c| c.store.len())
            .sum()
    }

    /// The parents, in a stable order.
    fn parents(&self) -> Vec<Arc<DynamicObject>> {
        let mut parents = self.parents.state();
        parents.sort_by_key(|p| p.name_any());
        parents
    }

    /// etcd as the plugin would find it for `parent`: every cached member pod a started
    /// voter, the first one leader.
    fn script(&self, parent: &DynamicObject) -> AppCallScript {
        let namespace = parent.namespace().unwrap_or_default();
        let cluster = ClusterRef {
            name: parent.name_any(),
            namespace: namespace.clone(),
            tls: false,
        };
        let mut pods: Vec<String> = self
            .caches
            .iter()
            .filter(|c| c.kind.kind == "Pod" && c.kind.group.is_empty())
            .flat_map(|c| c.controlled_by(parent))
            .map(|p| p.name_any())
            .collect();
        pods.sort();
        let id = |pod: &str| stable_id(&format!("{namespace}/{pod}"));
        let cluster_id = stable_id(&format!("{namespace}/{}", cluster.name));
        let members: Vec<Value> = pods
            .iter()
            .map(|pod| {
                json!({"ID": id(pod).to_string(), "name": pod,
                    "peerURLs": [cluster.peer_url(pod)], "clientURLs": [cluster.client_url(pod)]})
            })
            .collect();
        let leader = pods.first().map(|p| id(p)).unwrap_or_default();
        AppCallScript::new(pods.iter().flat_map(|pod| {
            let header = json!({"cluster_id": cluster_id.to_string(), "member_id": id(pod).to_string(),
                "revision": "1042", "raft_term": "2"});
            let answers = [
                (
                    MEMBER_LIST_PATH,
                    json!({"header": header, "members": members}),
                ),
                (
                    STATUS_PATH,
                    json!({"header": header, "version": VERSION, "dbSize": "20480",
                        "leader": leader.to_string(), "raftIndex": "1042", "raftTerm": "2",
                        "raftAppliedIndex": "1042", "dbSizeInUse": "20480", "storageVersion": "3.6.0"}),
                ),
                (MOVE_LEADER_PATH, json!({"header": header})),
            ];
            answers.into_iter().map(move |(path, body)| {
                (
                    pod.clone(),
                    path.to_string(),
                    Ok(app_call::Response {
                        status: 200,
                        body: body.to_string(),
                    }),
                )
            })
        }))
    }

    /// The host's observe → decide path for one parent, with etcd answered by `script`.
    async fn decide(
        &self,
        parent: &DynamicObject,
        script: &AppCallScript,
    ) -> Result<(Observed, Decision, Duration, Duration)> {
        let started = Instant::now();
        let observed = observe(parent, &self.caches)?;
        let observed_at = Instant::now();
        let label = format!(
            "{}/{}",
            parent.namespace().unwrap_or_default(),
            parent.name_any()
        );
        let decision = self
            .plugin
            .reconcile(
                &observed.observation,
                AppCallScope::scripted(label, script.clone()),
                "benchmarking",
            )
            .await?;
        script.clear_calls();
        Ok((
            observed,
            decision,
            observed_at - started,
            observed_at.elapsed(),
        ))
    }
}

impl Drop for HostCaches {
    fn drop(&mut self) {
        for task in &self.tasks {
            task.abort();
        }
    }
}

/// How `observe` found a parent's children before the owner index: a scan of every cached
/// object of each child kind, kept here to compare on the same caches.
fn scan_for_children(caches: &[ChildCache], parent: &DynamicObject) -> usize {
    let uid = parent.uid().unwrap_or_default();
    let namespace = parent.namespace();
    caches
        .iter()
        .map(|cache| {
            let mut children = cache.store.state_filter(|child| {
                child.namespace() == namespace && is_controlled_by(child, &uid)
            });
            children.sort_by_key(|o| o.name_any());
            children.len()
        })
        .sum()
}

/// A steady decision changes no member: no Pod applied, nothing deleted.
fn is_steady(decision: &Decision) -> bool {
    decision.actions.iter().all(|action| match action {
        Action::Apply(text) => !text.contains("\"kind\":\"Pod\""),
        Action::Delete(_) => false,
        _ => true,
    })
}

fn main() -> Result<()> {
    if let Ok(config) = std::env::var(HOST_CHILD) {
        let config: Value = serde_json::from_str(&config)?;
        let runtime = tokio::runtime::Builder::new_multi_thread()
            .worker_threads(2)
            .enable_all()
            .build()?;
        let report = runtime.block_on(host_child(config))?;
        println!("{report}");
        return Ok(());
    }
    let runtime = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()?;
    runtime.block_on(bench())
}

async fn bench() -> Result<()> {
    let steps: Vec<usize> = std::env::var("SCALE_BENCH_STEPS")
        .unwrap_or_else(|_| "1,10,100,1000".into())
        .split(',')
        .map(|s| s.trim().parse())
        .collect::<Result<_, _>>()
        .context("SCALE_BENCH_STEPS: a comma-separated list of cluster counts")?;
    let env = policy_host_testenv::shared().await?;
    let client = env.client().await?;
    policy_host_e2e::install_crd(&client, "deploy/crds/etcdcluster.yaml").await?;
    let namespace = env.create_namespace("scale-bench").await?;
    ensure_bench_node(&client).await?;

    let wasm = policy_host_test_plugins::build("guest-etcd").map_err(|e| anyhow!("{e}"))?;
    let bytes = std::fs::read(&wasm)?;
    let cache_dir = std::env::temp_dir().join(format!("scale-bench-cache-{}", std::process::id()));
    let loader = PluginLoader::new(Sandbox::new()?, Some(ArtifactCache::new(&cache_dir)));
    let (plugin, _) = loader
        .load("guest-etcd", &bytes, &sha256_hex(&bytes), Limits::default())
        .await
        .context("loading guest-etcd")?;
    let policy = plugin.info().name.clone();
    let shards: u32 = env_or("SCALE_BENCH_SHARDS", 1);
    let shards: Vec<Shard> = (0..shards)
        .map(|i| Shard::new(i, shards))
        .collect::<Result<_, _>>()
        .context("SCALE_BENCH_SHARDS")?;
    // The children are labelled for their parent's shard, as sharded hosts label theirs: one
    // executor per shard writes them.
    let executors: Vec<Executor> = shards
        .iter()
        .map(|shard| {
            Executor::new(client.clone(), plugin.label(), plugin.info())
                .with_child_shard(shard.child_label())
        })
        .collect();
    let host = HostCaches::start(&client, &namespace, plugin, Shard::whole()).await?;

    println!(
        "# scale bench: namespace {namespace}, {MEMBERS} members per cluster, steps {steps:?}, {} shard(s)",
        shards.len()
    );
    println!(
        "| clusters | shard | parents held | objects cached | sync ms | RSS synced MiB | RSS after decisions MiB | decisions/s (median) | rounds | decisions per CPU-second | observation B | observe alone p50 µs | observe p50 µs | observe p99 µs | children by index p50 µs | children by scan p50 µs | decide p50 µs | steady | reconcile+act/s (setup pass) |"
    );
    println!(
        "|---:|---|---:|---:|---:|---:|---:|---:|---|---:|---:|---:|---:|---:|---:|---:|---:|---|---:|"
    );
    let mut created = 0;
    for &target in &steps {
        let started = Instant::now();
        let new: Vec<String> = (created..target).map(|i| format!("c{i:05}")).collect();
        let new_names: HashSet<&String> = new.iter().collect();
        create_clusters(&client, &namespace, &policy, &shards, &new).await?;
        let wrote = started.elapsed();
        // Two passes of the host's whole reconcile (observe, decide, act) over the new
        // clusters: the first applies the Services and budget and writes the status, the
        // second starts from that status (the steady state), and is timed.
        let mut act_rate = 0.0;
        for pass in 0..2 {
            wait_cached(&host, target, target, pass > 0).await?;
            let parents: Vec<Arc<DynamicObject>> = host
                .parents()
                .into_iter()
                .filter(|p| new_names.contains(&p.name_any()))
                .collect();
            let pass_started = Instant::now();
            futures::stream::iter(parents.iter().map(|parent| {
                let (host, executors, shards) = (&host, &executors, &shards);
                async move {
                    let shard = shards[0].assign_parent(parent).shard as usize;
                    let executor = &executors[shard];
                    let script = host.script(parent);
                    let (observed, decision, _, _) = host.decide(parent, &script).await?;
                    executor
                        .apply_decision(
                            parent,
                            &observed,
                            decision.actions,
                            &mut Carried::default(),
                        )
                        .await?;
                    anyhow::Ok(())
                }
            }))
            .buffer_unordered(8)
            .try_collect::<Vec<()>>()
            .await?;
            act_rate = parents.len() as f64 / pass_started.elapsed().as_secs_f64();
        }
        wait_cached(&host, target, target, true).await?;
        created = target;
        eprintln!(
            "[scale] {target} clusters in the API server ({} new written in {:.1} s); measuring",
            new.len(),
            wrote.as_secs_f64()
        );

        let all: Vec<String> = (0..target).map(|i| format!("c{i:05}")).collect();
        // With shards, one host holding every parent is measured first, on the same objects, so
        // each step compares the shards with it in one run.
        let groups: Vec<Vec<Shard>> = if shards.len() > 1 {
            vec![vec![Shard::whole()], shards.clone()]
        } else {
            vec![shards.clone()]
        };
        for (group, shards) in groups.iter().enumerate() {
            let barrier = std::env::temp_dir().join(format!(
                "scale-bench-barrier-{}-{target}-{group}",
                std::process::id()
            ));
            std::fs::create_dir_all(&barrier)?;
            let held = |shard: &Shard| {
                all.iter()
                    .filter(|name| shard.assign(&namespace, name, None).shard == shard.index())
                    .count()
            };
            // A shard that holds no parent (1 cluster, 2 shards) has nothing to measure: it is
            // not started, and its place at the barrier is taken for it.
            for shard in shards.iter().filter(|s| held(s) == 0) {
                std::fs::write(barrier.join(format!("synced-{}", shard.index())), b"")?;
            }
            let children = shards.iter().filter(|s| held(s) > 0).map(|shard| {
            let held = held(shard);
            let config = json!({
                "kubeconfig": env.kubeconfig_path(),
                "namespace": namespace.name(),
                "wasm": wasm,
                "cache": cache_dir,
                "seconds": env_or("SCALE_BENCH_SECONDS", 5.0),
                "rounds": env_or("SCALE_BENCH_ROUNDS", 3usize),
                "concurrency": env_or("SCALE_BENCH_CONCURRENCY", 8usize),
                "expect": held,
                "total": target,
                "shard": shard.index(),
                "shards": shard.count(),
                "barrier": barrier,
            });
            async move {
                let child = tokio::process::Command::new(std::env::current_exe()?)
                    .env(HOST_CHILD, config.to_string())
                    .stderr(std::process::Stdio::inherit())
                    .output()
                    .await?;
                let stdout = String::from_utf8_lossy(&child.stdout);
                if !child.status.success() {
                    return Err(anyhow!(
                        "the host process of {shard} for {target} clusters failed ({}): {stdout}",
                        child.status
                    ));
                }
                let report: Value = serde_json::from_str(stdout.trim())
                    .with_context(|| format!("the host process printed {stdout}"))?;
                anyhow::Ok((*shard, report))
            }
        });
            let reports = futures::future::try_join_all(children).await?;
            let _ = std::fs::remove_dir_all(&barrier);
            for (shard, report) in &reports {
                let number = |key: &str| report[key].as_f64().unwrap_or(0.0);
                let which = if shard.count() == 1 {
                    "all".to_string()
                } else {
                    format!("{} of {}", shard.index(), shard.count())
                };
                println!(
                    "| {target} | {which} | {} | {} | {} | {:.1} | {:.1} | {:.0} | {} | {:.0} | {} | {:.1} | {:.1} | {:.1} | {:.1} | {:.1} | {:.1} | {}/{} | {act_rate:.0} |",
                    report["clusters"],
                    report["objects"],
                    report["sync_ms"],
                    number("rss_synced_mib"),
                    number("rss_after_mib"),
                    number("rate_median"),
                    report["rates"],
                    number("per_cpu_second"),
                    report["observation_bytes"],
                    number("observe_alone_p50_us"),
                    number("observe_p50_us"),
                    number("observe_p99_us"),
                    number("index_lookup_p50_us"),
                    number("scan_lookup_p50_us"),
                    number("decide_p50_us"),
                    report["steady"],
                    report["checked"],
                );
                eprintln!("[scale] {target} ({which}): {report}");
                println!(
                    "|   forms, {target} clusters ({which}): {} children, {} B of JSON each | {} |",
                    report["forms"]["children"],
                    report["forms"]["text_bytes_per_child"],
                    report["forms"]["forms"]
                        .as_array()
                        .into_iter()
                        .flatten()
                        .map(|f| format!(
                            "{}: {} B held, written in {} ns ({} B)",
                            f["form"].as_str().unwrap_or_default(),
                            f["bytes_per_child"],
                            f["write_ns_per_child"],
                            f["written_bytes_per_child"]
                        ))
                        .collect::<Vec<_>>()
                        .join("; ")
                );
            }
            if reports.len() > 1 {
                let sum = |key: &str| -> f64 {
                    reports
                        .iter()
                        .map(|(_, r)| r[key].as_f64().unwrap_or(0.0))
                        .sum()
                };
                println!(
                    "| {target} | together | {} | | | {:.1} | {:.1} | {:.0} | | {:.0} | | | | | | | | | |",
                    sum("clusters"),
                    sum("rss_synced_mib"),
                    sum("rss_after_mib"),
                    sum("rate_median"),
                    sum("decisions") / sum("cpu_seconds").max(0.01),
                );
            }
        }
    }
    let _ = std::fs::remove_dir_all(&cache_dir);
    Ok(())
}

/// The Node the bench's pods are bound to (registered once; nothing runs on it).
async fn ensure_bench_node(client: &Client) -> Result<()> {
    let nodes: Api<Node> = Api::all(client.clone());
    if nodes.get_opt(BENCH_NODE).await?.is_none() {
        let node: Node = serde_json::from_value(json!({
            "apiVersion": "v1", "kind": "Node",
            "metadata": {"name": BENCH_NODE, "labels": {"kubernetes.io/hostname": BENCH_NODE}},
        }))?;
        nodes.create(&PostParams::default(), &node).await?;
    }
    Ok(())
}

/// Each cluster: the `EtcdCluster` (size 3), then its member pods as the plugin creates them
/// (server-side applied by the host's field manager, policy label, controller owner
/// reference), then each pod's status Running and Ready, as a kubelet would report it.
async fn create_clusters(
    client: &Client,
    namespace: &str,
    policy: &str,
    shards: &[Shard],
    names: &[String],
) -> Result<()> {
    let clusters: Api<DynamicObject> =
        Api::namespaced_with(client.clone(), namespace, &etcd_clusters());
    let pods: Api<Pod> = Api::namespaced(client.clone(), namespace);
    let valid = EtcdClusterSpec {
        size: MEMBERS as i64,
        version: VERSION.into(),
        ..Default::default()
    }
    .validate()
    .map_err(|e| anyhow!(e))?;
    futures::stream::iter(names.iter().enumerate().map(|(i, name)| {
        let (clusters, pods, valid) = (&clusters, &pods, &valid);
        async move {
            let cluster = clusters
                .patch(
                    name,
                    &PatchParams::apply("scale-bench").force(),
                    &Patch::Apply(json!({
                        "apiVersion": "etcd.database.coreos.com/v1beta2", "kind": "EtcdCluster",
                        "metadata": {"name": name},
                        "spec": {"size": MEMBERS, "version": VERSION},
                    })),
                )
                .await?;
            let uid = cluster.uid().context("the API server gave no uid")?;
            let reference = ClusterRef {
                name: name.clone(),
                namespace: namespace.to_owned(),
                tls: false,
            };
            let member_names: Vec<String> =
                (0..MEMBERS).map(|n| reference.member_name(n)).collect();
            let initial: Vec<(String, String)> = member_names
                .iter()
                .map(|n| (n.clone(), reference.peer_url(n)))
                .collect();
            for (n, member) in member_names.iter().enumerate() {
                let mut pod = children::member_pod(
                    &reference,
                    valid,
                    &MemberPod {
                        name: member.clone(),
                        initial_cluster: initial.clone(),
                        state: ClusterState::Existing,
                    },
                );
                pod["metadata"]["labels"][POLICY_LABEL] = json!(policy);
                let shard = shards[0].assign(namespace, name, None).shard as usize;
                if let Some(label) = shards[shard].child_label() {
                    pod["metadata"]["labels"][CHILD_SHARD_LABEL] = json!(label);
                }
                pod["metadata"]["ownerReferences"] = json!([{
                    "apiVersion": "etcd.database.coreos.com/v1beta2", "kind": "EtcdCluster",
                    "name": name, "uid": uid, "controller": true, "blockOwnerDeletion": true}]);
                pod["spec"]["nodeName"] = json!(BENCH_NODE);
                pods.patch(
                    member,
                    &PatchParams::apply(FIELD_MANAGER).force(),
                    &Patch::Apply(&pod),
                )
                .await?;
                let k = i * MEMBERS + n;
                let ip = format!("10.244.{}.{}", k / 250, k % 250 + 2);
                pods.patch_status(
                    member,
                    &PatchParams::default(),
                    &Patch::Merge(json!({"status": {
                        "phase": "Running",
                        "podIP": ip, "podIPs": [{"ip": ip}],
                        "hostIP": "10.0.0.1", "startTime": "2026-11-21T20:00:00Z",
                        "conditions": [
                            {"type": "PodReadyToStartContainers", "status": "True", "lastTransitionTime": "2026-11-21T20:00:01Z"},
                            {"type": "Initialized", "status": "True", "lastTransitionTime": "2026-11-21T20:00:01Z"},
                            {"type": "Ready", "status": "True", "lastTransitionTime": "2026-11-21T20:00:05Z"},
                            {"type": "ContainersReady", "status": "True", "lastTransitionTime": "2026-11-21T20:00:05Z"},
                            {"type": "PodScheduled", "status": "True", "lastTransitionTime": "2026-11-21T20:00:00Z"},
                        ],
                        "containerStatuses": [{
                            "name": "etcd", "ready": true, "started": true, "restartCount": 0,
                            "image": valid.image, "imageID": format!("{}@sha256:5b1e9d4a", valid.image),
                            "containerID": format!("containerd://{:064x}", stable_id(member)),
                            "state": {"running": {"startedAt": "2026-11-21T20:00:02Z"}},
                        }],
                    }})),
                )
                .await?;
            }
            anyhow::Ok(())
        }
    }))
    .buffer_unordered(16)
    .try_collect::<Vec<()>>()
    .await?;
    Ok(())
}

fn etcd_clusters() -> kube::api::ApiResource {
    kube::api::ApiResource::from_gvk_with_plural(
        &kube::core::GroupVersionKind::gvk("etcd.database.coreos.com", "v1beta2", "EtcdCluster"),
        "etcdclusters",
    )
}

/// Waits until the caches hold `held` parents (this shard's) and the pods of all `clusters`,
/// and (with `acted`) the Services, budgets and statuses the first pass wrote.
async fn wait_cached(host: &HostCaches, held: usize, clusters: usize, acted: bool) -> Result<()> {
    policy_host_testenv::wait_for(
        &format!("{held} of {clusters} clusters in the watch caches"),
        Duration::from_secs(300),
        || async {
            let parents = host.parents();
            // A shard caches its own parents' children only.
            let ok = parents.len() == held
                && host.cached("Pod") == held * MEMBERS
                && (!acted
                    || (host.cached("Service") == 2 * held
                        && host.cached("PodDisruptionBudget") == held
                        && parents.iter().all(|p| p.data.get("status").is_some())));
            ok.then_some(())
        },
    )
    .await?;
    Ok(())
}

/// The host process: caches synced, then steady decisions for a few rounds.
async fn host_child(config: Value) -> Result<Value> {
    let rss_start = status_kib("VmRSS:");
    let path = |key: &str| -> Result<PathBuf> {
        Ok(PathBuf::from(
            config[key]
                .as_str()
                .with_context(|| format!("{key} missing"))?,
        ))
    };
    let kubeconfig = kube::config::Kubeconfig::read_from(path("kubeconfig")?)?;
    let client = Client::try_from(
        kube::Config::from_custom_kubeconfig(kubeconfig, &Default::default()).await?,
    )?;
    let namespace = config["namespace"]
        .as_str()
        .context("namespace")?
        .to_owned();
    let bytes = std::fs::read(path("wasm")?)?;
    let cache: &Path = &path("cache")?;
    let loader = PluginLoader::new(Sandbox::new()?, Some(ArtifactCache::new(cache)));
    let (plugin, outcome) = loader
        .load("guest-etcd", &bytes, &sha256_hex(&bytes), Limits::default())
        .await?;
    let rss_loaded = status_kib("VmRSS:");
    let started = Instant::now();
    let number = |key: &str| config[key].as_u64().unwrap_or(0);
    let shard = Shard::new(number("shard") as u32, number("shards").max(1) as u32)?;
    let host = HostCaches::start(&client, &namespace, plugin, shard).await?;
    let (expect, total) = (number("expect") as usize, number("total") as usize);
    wait_cached(&host, expect, total, true).await?;
    let sync_ms = started.elapsed().as_millis();
    tokio::time::sleep(Duration::from_millis(500)).await;
    let rss_synced = status_kib("VmRSS:");
    // The shards' rounds overlap: each waits here until every shard has synced.
    let barrier = path("barrier")?;
    std::fs::write(barrier.join(format!("synced-{}", shard.index())), b"")?;
    policy_host_testenv::wait_for("every shard synced", Duration::from_secs(600), || async {
        (0..shard.count())
            .all(|i| barrier.join(format!("synced-{i}")).exists())
            .then_some(())
    })
    .await?;

    let parents = host.parents();
    let scripts: Vec<AppCallScript> = parents.iter().map(|p| host.script(p)).collect();
    let objects = parents.len() + host.caches.iter().map(|c| c.store.len()).sum::<usize>();
    let host = Arc::new(host);
    let (parents, scripts) = (Arc::new(parents), Arc::new(scripts));

    // Every parent once, checking the decision is the steady one.
    let mut steady = 0;
    let mut observation_bytes = 0;
    for (parent, script) in parents.iter().zip(scripts.iter()) {
        let observed = observe(parent, &host.caches)?;
        observation_bytes += observed.observation.parent.len()
            + observed
                .observation
                .children
                .iter()
                .map(|c| c.object.len())
                .sum::<usize>();
        let (_, decision, _, _) = host.decide(parent, script).await?;
        if is_steady(&decision) {
            steady += 1;
        }
    }

    // Finding each parent's children, alone: through the owner index (what observe does) and
    // by the scan observe did before it, on the same caches, with the same answer.
    // The whole observe is timed here too, alone on one thread: the rounds below time it
    // among 8 concurrent decisions on 2 workers.
    // Observe alone goes first, over every parent, not between the scans: a scan walks every
    // cached child (70,000 at 10,000 clusters) and leaves the CPU caches cold for whatever
    // follows, which the host never does.
    let mut observe_alone = Vec::new();
    for parent in parents.iter() {
        let started = Instant::now();
        observe(parent, &host.caches)?;
        observe_alone.push(started.elapsed());
    }
    let (mut index_times, mut scan_times) = (Vec::new(), Vec::new());
    for parent in parents.iter() {
        let started = Instant::now();
        let indexed: usize = host
            .caches
            .iter()
            .map(|c| c.controlled_by(parent).len())
            .sum();
        index_times.push(started.elapsed());
        let started = Instant::now();
        let scanned = scan_for_children(&host.caches, parent);
        scan_times.push(started.elapsed());
        if indexed != scanned {
            return Err(anyhow!(
                "{}: the owner index gives {indexed} children, a scan {scanned}",
                parent.name_any()
            ));
        }
    }

    let seconds = config["seconds"].as_f64().unwrap_or(5.0);
    let rounds = config["rounds"].as_u64().unwrap_or(3) as usize;
    let concurrency = config["concurrency"].as_u64().unwrap_or(8) as usize;
    let mut rates = Vec::new();
    let mut cpu_rates = Vec::new();
    let (mut all_decisions, mut all_cpu) = (0usize, Duration::ZERO);
    let (mut observe_times, mut decide_times) = (Vec::new(), Vec::new());
    for _ in 0..rounds {
        let next = Arc::new(AtomicUsize::new(0));
        let deadline = Instant::now() + Duration::from_secs_f64(seconds);
        let round_started = Instant::now();
        let cpu_started = policy_host_e2e::process_cpu_time();
        let mut workers = tokio::task::JoinSet::new();
        for _ in 0..concurrency {
            let (host, parents, scripts, next) =
                (host.clone(), parents.clone(), scripts.clone(), next.clone());
            workers.spawn(async move {
                let mut times = Vec::new();
                while Instant::now() < deadline {
                    let i = next.fetch_add(1, Ordering::Relaxed) % parents.len();
                    let (_, _, observing, deciding) = host.decide(&parents[i], &scripts[i]).await?;
                    times.push((observing, deciding));
                }
                anyhow::Ok(times)
            });
        }
        let mut decisions = 0;
        while let Some(joined) = workers.join_next().await {
            let times = joined??;
            decisions += times.len();
            for (o, d) in times {
                observe_times.push(o);
                decide_times.push(d);
            }
        }
        let cpu = policy_host_e2e::process_cpu_time() - cpu_started;
        rates.push(decisions as f64 / round_started.elapsed().as_secs_f64());
        cpu_rates.push(decisions as f64 / cpu.as_secs_f64().max(0.01));
        all_decisions += decisions;
        all_cpu += cpu;
    }
    tokio::time::sleep(Duration::from_millis(500)).await;
    let rss_after = status_kib("VmRSS:");
    // Last: the forms it builds would stay in the RSS read above.
    let forms = weigh_forms(&host.caches)?;
    let micros = |d: Duration| d.as_secs_f64() * 1e6;
    Ok(json!({
        "clusters": parents.len(),
        "objects": objects,
        "plugin_load": format!("{outcome:?}"),
        "sync_ms": sync_ms,
        "rss_start_mib": mib(rss_start),
        "rss_loaded_mib": mib(rss_loaded),
        "rss_synced_mib": mib(rss_synced),
        "rss_after_mib": mib(rss_after),
        "hwm_mib": mib(status_kib("VmHWM:")),
        "rates": rates.iter().map(|r| r.round()).collect::<Vec<_>>(),
        "rate_median": median(rates.clone()),
        "per_cpu_second": median(cpu_rates.clone()),
        "decisions": all_decisions,
        "cpu_seconds": all_cpu.as_secs_f64(),
        "shard": shard.to_string(),
        "observation_bytes": observation_bytes / parents.len().max(1),
        "index_lookup_p50_us": micros(percentile(&mut index_times, 50)),
        "scan_lookup_p50_us": micros(percentile(&mut scan_times, 50)),
        "observe_alone_p50_us": micros(percentile(&mut observe_alone, 50)),
        "observe_p50_us": micros(percentile(&mut observe_times, 50)),
        "observe_p99_us": micros(percentile(&mut observe_times, 99)),
        "decide_p50_us": micros(percentile(&mut decide_times, 50)),
        "decide_p99_us": micros(percentile(&mut decide_times, 99)),
        "steady": steady,
        "checked": parents.len(),
        "forms": forms,
        "loadavg": std::fs::read_to_string("/proc/loadavg").unwrap_or_default().trim(),
        "note": HashMap::from([("concurrency", concurrency), ("workers", 2)]),
    }))
}
