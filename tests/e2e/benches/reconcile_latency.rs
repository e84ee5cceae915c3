//! From a change to a parent to its reconcile (issue 17, target 5): with N parents at steady
//! state and their requeues running in the background, how long after the API server
//! acknowledges a change to one parent does the host's reconcile of that parent start.
//!
//! The measured host is the real one, `policy_host::run` in this process (as the e2e suites'
//! [`HostUnderTest`] runs it) against the real kube-apiserver of the test environment, with
//! the production controller concurrency (8) on a 2-worker runtime. Its parents are `Probe`s
//! decided by the misbehaving test plugin's `steady` behaviour: re-apply `spec.applies`
//! unchanged ConfigMaps (default 0), write no status, requeue after `spec.requeueMs` (default
//! 30 s, guest-etcd's steady requeue). No etcd is involved: guest-etcd's steady decision
//! app-calls every member, which would need N live etcd clusters; this plugin keeps the part
//! of it the controller sees (a wasm decision and a requeue per parent per interval, and with
//! `LATENCY_BENCH_APPLIES=3` the three no-op server-side applies guest-etcd's makes).
//!
//! "Reconcile started" is the host's TRACE event of that name (`controller::reconcile`, with
//! the parent and its resourceVersion), caught by a tracing layer of this process: it is taken
//! right after kube-runtime's runner hands the parent to the host's `reconcile`. Each sample:
//! read the parent's resourceVersion, merge-patch its `spec.change`, and time from the patch's
//! answer (the API server's acknowledgement) to the first reconcile that sees a newer
//! resourceVersion. Two more instants split that time: the bench's own watch of the parents
//! (a second watch in the same process, on the same API server) seeing the change measures
//! watch delivery, and the rest is the wait in the controller's queue. Changes are paced, one
//! at a time, one every `LATENCY_BENCH_PACE_MS` from the start of sampling. At the end it
//! also counts the parents whose last reconcile is older than two requeue intervals: a
//! controller behind its requeues starves some parents (BENCHMARKS.md, "From a change to its
//! reconcile"). During sampling it also takes, per parent, the time between one reconcile's
//! start and the next (a parent reconciled every interval shows gaps of about one interval),
//! and counts the host's API writes (every request but a GET, on the host's own client): at
//! steady state a parent should cost none (issue 28).
//!
//! Run: `env -u RUST_BACKTRACE cargo bench -p policy-host-e2e --bench reconcile_latency`.
//! `LATENCY_BENCH_PARENTS` (a comma-separated list of steps, default `10000`; each step in a
//! fresh namespace with a fresh host), `LATENCY_BENCH_SAMPLES` (300), `LATENCY_BENCH_PACE_MS`
//! (250), `LATENCY_BENCH_REQUEUE_MS` (30000), `LATENCY_BENCH_APPLIES` (0),
//! `LATENCY_BENCH_CONCURRENCY` (8), `LATENCY_BENCH_WAIT_S` (120: a change not reconciled by
//! then counts as missed, and as that long in the percentiles), `LATENCY_BENCH_SLEEP_MS` (0: each
//! decision also sleeps this long in the plugin, without a CPU; the way to ask for more
//! reconciles than the host can make, e.g. 48 ms at 10,000 parents, 8 in flight and 30 s is
//! twice what it can).

use std::collections::HashMap;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use anyhow::{Context, Result, anyhow};
use futures::{StreamExt, TryStreamExt};
use kube::api::{Api, DynamicObject, Patch, PatchParams, PostParams};
use kube::runtime::{WatchStreamExt, watcher};
use kube::{Client, ResourceExt};
use policy_host::Settings;
use policy_host::controller::ControllerOptions;
use policy_host::decide::Limits;
use policy_host::observe::admission::CacheLimits;
use policy_host_e2e::{HostUnderTest, probes};
use serde_json::json;
use tokio::sync::oneshot;
use tracing::field::{Field, Visit};
use tracing_subscriber::Layer;
use tracing_subscriber::layer::{Context as LayerContext, SubscriberExt};
use tracing_subscriber::util::SubscriberInitExt;

fn env_or<T: std::str::FromStr>(name: &str, default: T) -> T {
    std::env::var(name)
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(default)
}

/// The change being timed: the first reconcile and the first watch event of `parent` with a
/// resourceVersion above `after` answer it.
struct Awaited {
    parent: String,
    after: u64,
    seen: Option<oneshot::Sender<Instant>>,
    started: Option<oneshot::Sender<Instant>>,
}

/// What the host's `reconcile started` events and the bench's watch report.
#[derive(Default)]
struct Starts {
    /// Every reconcile started since the host did.
    count: AtomicU64,
    awaited: Mutex<Option<Awaited>>,
    /// When each parent (`namespace/name`) last started a reconcile: a parent the controller
    /// starves shows here.
    last: Mutex<HashMap<String, Instant>>,
    /// While sampling: every time between two reconcile starts of one parent.
    gaps: Mutex<Option<Vec<Duration>>>,
}

impl Starts {
    fn expect(
        &self,
        parent: String,
        after: u64,
    ) -> (oneshot::Receiver<Instant>, oneshot::Receiver<Instant>) {
        let (seen, seen_rx) = oneshot::channel();
        let (started, started_rx) = oneshot::channel();
        *self.awaited.lock().unwrap_or_else(|p| p.into_inner()) = Some(Awaited {
            parent,
            after,
            seen: Some(seen),
            started: Some(started),
        });
        (seen_rx, started_rx)
    }

    /// `parent` at `version` was reconciled (`reconciled`) or seen by the watch, at `at`.
    fn report(&self, parent: &str, version: u64, reconciled: bool, at: Instant) {
        if reconciled {
            let before = self
                .last
                .lock()
                .unwrap_or_else(|p| p.into_inner())
                .insert(parent.to_owned(), at);
            if let (Some(before), Some(gaps)) = (
                before,
                self.gaps.lock().unwrap_or_else(|p| p.into_inner()).as_mut(),
            ) {
                gaps.push(at - before);
            }
        }
        let mut awaited = self.awaited.lock().unwrap_or_else(|p| p.into_inner());
        let Some(waiting) = awaited.as_mut() else {
            return;
        };
        if waiting.parent != parent || version <= waiting.after {
            return;
        }
        let slot = if reconciled {
            &mut waiting.started
        } else {
            &mut waiting.seen
        };
        if let Some(sender) = slot.take() {
            let _ = sender.send(at);
        }
    }
}

/// Catches the host's `reconcile started` events (TRACE, target `policy_host::controller`).
struct StartLayer(Arc<Starts>);

#[derive(Default)]
struct StartFields {
    message: String,
    parent: String,
    resource_version: u64,
}

impl Visit for StartFields {
    fn record_str(&mut self, field: &Field, value: &str) {
        if field.name() == "resource_version" {
            self.resource_version = value.parse().unwrap_or(0);
        }
    }

    fn record_debug(&mut self, field: &Field, value: &dyn std::fmt::Debug) {
        match field.name() {
            "message" => self.message = format!("{value:?}"),
            "parent" => self.parent = format!("{value:?}"),
            _ => {}
        }
    }
}

impl<S: tracing::Subscriber> Layer<S> for StartLayer {
    fn on_event(&self, event: &tracing::Event<'_>, _: LayerContext<'_, S>) {
        let at = Instant::now();
        let mut fields = StartFields::default();
        event.record(&mut fields);
        if fields.message != "reconcile started" {
            return;
        }
        self.0.count.fetch_add(1, Ordering::Relaxed);
        self.0
            .report(&fields.parent, fields.resource_version, true, at);
    }
}

/// The host's log at `warn` (kube-client's at `error`: the test certificate warns on every
/// connection), or `RUST_LOG`, on stderr, and its `reconcile started` events to
/// `starts`.
fn init_tracing(starts: Arc<Starts>) {
    let log = tracing_subscriber::fmt::layer()
        .with_writer(std::io::stderr)
        .with_filter(
            tracing_subscriber::EnvFilter::try_from_default_env()
                .unwrap_or_else(|_| "warn,kube_client=error".into()),
        );
    let reconciles = StartLayer(starts).with_filter(tracing_subscriber::filter::filter_fn(|m| {
        m.target() == "policy_host::controller" && *m.level() == tracing::Level::TRACE
    }));
    let _ = tracing_subscriber::registry()
        .with(log)
        .with(reconciles)
        .try_init();
}

fn resource_version(object: &DynamicObject) -> Result<u64> {
    object
        .resource_version()
        .context("the API server gave no resourceVersion")?
        .parse()
        .context("a resourceVersion that is not a number (this bench compares them)")
}

fn loadavg() -> String {
    std::fs::read_to_string("/proc/loadavg")
        .unwrap_or_default()
        .split_whitespace()
        .take(3)
        .collect::<Vec<_>>()
        .join(" ")
}

fn percentile(sorted: &[Duration], p: usize) -> Duration {
    if sorted.is_empty() {
        return Duration::ZERO;
    }
    sorted[(sorted.len() - 1) * p / 100]
}

fn ms(d: Duration) -> f64 {
    d.as_secs_f64() * 1e3
}

/// `p50 / p90 / p99 / max` in milliseconds.
fn spread(mut samples: Vec<Duration>) -> String {
    samples.sort();
    format!(
        "{:.1} / {:.1} / {:.1} / {:.1}",
        ms(percentile(&samples, 50)),
        ms(percentile(&samples, 90)),
        ms(percentile(&samples, 99)),
        ms(samples.last().copied().unwrap_or_default())
    )
}

/// The scenario of one step.
struct Step {
    parents: usize,
    samples: usize,
    pace: Duration,
    requeue: Duration,
    applies: u64,
    concurrency: u16,
    /// How long each decision sleeps in the plugin.
    sleep: Duration,
    /// How long a change may wait for its reconcile before it counts as missed.
    wait: Duration,
}

fn main() -> Result<()> {
    let runtime = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()?;
    runtime.block_on(bench())
}

async fn bench() -> Result<()> {
    let steps: Vec<usize> = std::env::var("LATENCY_BENCH_PARENTS")
        .unwrap_or_else(|_| "10000".into())
        .split(',')
        .map(|s| s.trim().parse())
        .collect::<Result<_, _>>()
        .context("LATENCY_BENCH_PARENTS: a comma-separated list of parent counts")?;
    let starts = Arc::new(Starts::default());
    init_tracing(starts.clone());
    let env = policy_host_testenv::shared().await?;
    let client = env.client().await?;
    policy_host_e2e::install_crd_object(&client, policy_host_e2e::probe_crd()?).await?;
    let wasm = policy_host_test_plugins::build("misbehaving-policy").map_err(|e| anyhow!("{e}"))?;
    println!(
        "| parents | requeue s | applies per decision | sleep per decision ms | concurrency | background reconciles/s (expected) | samples | not started within the wait | ack → reconcile started ms p50 / p90 / p99 / max | sent → started p99 ms | watch delivery ms p50 / p99 | queue wait ms p50 / p90 / p99 / max | started before ack | parents not reconciled for 2 requeue intervals at the end | one parent's reconcile to its next, s p50 / p99 / max | host API writes per parent per requeue interval | host CPU per reconcile µs | load avg (1 5 15 min) | setup s |"
    );
    println!(
        "|---:|---:|---:|---:|---:|---:|---:|---:|---|---:|---|---|---:|---:|---|---:|---:|---|---:|"
    );
    for parents in steps {
        let step = Step {
            parents,
            samples: env_or("LATENCY_BENCH_SAMPLES", 300),
            pace: Duration::from_millis(env_or("LATENCY_BENCH_PACE_MS", 250)),
            requeue: Duration::from_millis(env_or("LATENCY_BENCH_REQUEUE_MS", 30_000)),
            applies: env_or("LATENCY_BENCH_APPLIES", 0),
            concurrency: env_or("LATENCY_BENCH_CONCURRENCY", 8),
            sleep: Duration::from_millis(env_or("LATENCY_BENCH_SLEEP_MS", 0)),
            wait: Duration::from_secs(env_or("LATENCY_BENCH_WAIT_S", 120)),
        };
        let namespace = env.create_namespace("latency-bench").await?;
        measure(env, &client, &namespace, &wasm, &step, &starts).await?;
    }
    Ok(())
}

async fn measure(
    env: &policy_host_testenv::TestEnv,
    client: &Client,
    namespace: &str,
    wasm: &std::path::Path,
    step: &Step,
    starts: &Arc<Starts>,
) -> Result<()> {
    let setup_started = Instant::now();
    let api: Api<DynamicObject> = Api::namespaced_with(client.clone(), namespace, &probes());
    let names: Vec<String> = (0..step.parents).map(|i| format!("p{i:05}")).collect();
    futures::stream::iter(names.iter().map(|name| {
        let api = &api;
        async move {
            let probe: DynamicObject = serde_json::from_value(json!({
                "apiVersion": "test.policy-host.io/v1", "kind": "Probe",
                "metadata": {"name": name},
                "spec": {
                    "behaviour": "steady",
                    "requeueMs": step.requeue.as_millis() as u64,
                    "applies": step.applies,
                    "sleepMs": step.sleep.as_millis() as u64,
                },
            }))?;
            api.create(&PostParams::default(), &probe).await?;
            anyhow::Ok(())
        }
    }))
    .buffer_unordered(32)
    .try_collect::<Vec<()>>()
    .await?;
    eprintln!(
        "[latency] {} parents created in {namespace} in {:.1} s",
        step.parents,
        setup_started.elapsed().as_secs_f64()
    );

    // The bench's own watch of the parents: when it sees a change, the host's watch could
    // have too.
    let watch_task = {
        let starts = starts.clone();
        let stream = watcher(api.clone(), watcher::Config::default()).applied_objects();
        let namespace = namespace.to_owned();
        tokio::spawn(async move {
            stream
                .for_each(|object| {
                    let at = Instant::now();
                    if let Ok(object) = object
                        && let Ok(version) = resource_version(&object)
                    {
                        starts.report(
                            &format!("{namespace}/{}", object.name_any()),
                            version,
                            false,
                            at,
                        );
                    }
                    async {}
                })
                .await;
        })
    };

    let counted_before = starts.count.load(Ordering::Relaxed);
    let settings = HostUnderTest::settings(namespace, Limits::default())?;
    let writes = Arc::new(AtomicU64::new(0));
    let host = HostUnderTest::start_with_client(
        policy_host_e2e::client_counting_writes(env, "/", writes.clone()).await?,
        Settings {
            policy_files: vec![wasm.to_path_buf()],
            controller: ControllerOptions {
                concurrency: step.concurrency,
                namespace: Some(namespace.to_owned()),
                // 10,000 parents with 3 ConfigMaps each are past a child cache's default bound
                // (20,000 objects), which is there for hostile tenants, not for this bench.
                child_cache: CacheLimits::UNBOUNDED,
                parent_cache: CacheLimits::UNBOUNDED,
                ..Default::default()
            },
            ..settings
        },
    )
    .await?;
    // Each parent: a reconcile that sets the finalizer, then the first decision.
    let first_pass = 2 * step.parents as u64;
    policy_host_testenv::wait_for(
        &format!("{first_pass} reconciles of the first pass"),
        Duration::from_secs(1800),
        || async {
            (starts.count.load(Ordering::Relaxed) - counted_before >= first_pass).then_some(())
        },
    )
    .await?;
    // With applies, the first pass ends when every child exists: reconciles started count
    // those the children's own creation triggers too, and a parent's first decision may come
    // after them.
    let children: Api<DynamicObject> = Api::namespaced_with(
        client.clone(),
        namespace,
        &kube::api::ApiResource::erase::<k8s_openapi::api::core::v1::ConfigMap>(&()),
    );
    let expected = step.parents as u64 * step.applies;
    policy_host_testenv::wait_for(
        &format!("{expected} children of the first pass"),
        Duration::from_secs(1800),
        || async {
            // A label selector leaves `remainingItemCount` unset: count the namespace's
            // ConfigMaps, less the root CA one the control plane may publish there.
            let listed = children
                .list(&kube::api::ListParams::default().limit(1))
                .await
                .ok()?;
            let root_ca = children.get_opt("kube-root-ca.crt").await.ok()?.is_some();
            let count = (listed.items.len() as u64
                + listed.metadata.remaining_item_count.unwrap_or(0) as u64)
                .saturating_sub(u64::from(root_ca));
            (count >= expected).then_some(())
        },
    )
    .await?;
    let setup = setup_started.elapsed();
    eprintln!(
        "[latency] first pass done after {:.1} s; letting one requeue interval ({:?}) go by",
        setup.as_secs_f64(),
        step.requeue
    );
    // The load is paced, not synchronised: one requeue interval, so every parent has been
    // requeued at least once before the first change.
    tokio::time::sleep(step.requeue).await;

    *starts.gaps.lock().unwrap_or_else(|p| p.into_inner()) = Some(Vec::new());
    let (count_started, cpu_started, writes_started, window_started) = (
        starts.count.load(Ordering::Relaxed),
        policy_host_e2e::process_cpu_time(),
        writes.load(Ordering::Relaxed),
        Instant::now(),
    );
    let (mut from_ack, mut from_sent, mut delivery, mut queued) =
        (Vec::new(), Vec::new(), Vec::new(), Vec::new());
    let (mut before_ack, mut missed) = (0, 0);
    // A fixed sequence of parents (an LCG), the same in every run.
    let mut pick: u64 = 0x2545_f491;
    for sample in 0..step.samples {
        pick = pick
            .wrapping_mul(6_364_136_223_846_793_005)
            .wrapping_add(1_442_695_040_888_963_407);
        let name = &names[((pick >> 33) % step.parents as u64) as usize];
        let before = resource_version(&api.get(name).await?)?;
        let (seen, started) = starts.expect(format!("{namespace}/{name}"), before);
        let sent = Instant::now();
        api.patch(
            name,
            &PatchParams::default(),
            &Patch::Merge(json!({"spec": {"change": sample}})),
        )
        .await?;
        let acked = Instant::now();
        // A change not reconciled within the wait counts as the wait (a floor), and as missed.
        let wait = step.wait;
        let started = match tokio::time::timeout(wait, started).await {
            Ok(started) => started?,
            Err(_) => {
                missed += 1;
                acked + wait
            }
        };
        let seen = tokio::time::timeout(wait, seen)
            .await
            .with_context(|| format!("the bench's watch did not see {name}'s change"))??;
        if started < acked {
            before_ack += 1;
        }
        from_ack.push(started.saturating_duration_since(acked));
        from_sent.push(started - sent);
        delivery.push(seen.saturating_duration_since(acked));
        queued.push(started.saturating_duration_since(seen));
        if sample % 25 == 24 || started.saturating_duration_since(acked) > Duration::from_secs(1) {
            eprintln!(
                "[latency] sample {} ({name}): ack → started {:.1} ms",
                sample + 1,
                ms(started.saturating_duration_since(acked))
            );
        }
        let next = window_started + step.pace * (sample as u32 + 1);
        tokio::time::sleep_until(next.into()).await;
    }
    let window = window_started.elapsed();
    let reconciles = starts.count.load(Ordering::Relaxed) - count_started;
    let written = writes.load(Ordering::Relaxed) - writes_started;
    let mut gaps = starts
        .gaps
        .lock()
        .unwrap_or_else(|p| p.into_inner())
        .take()
        .unwrap_or_default();
    gaps.sort();
    let cpu = policy_host_e2e::process_cpu_time() - cpu_started;
    let load = loadavg();
    // Parents whose last reconcile is older than two requeue intervals: starved by the queue.
    let idle = {
        let last = starts.last.lock().unwrap_or_else(|p| p.into_inner());
        let now = Instant::now();
        names
            .iter()
            .filter(|name| {
                last.get(&format!("{namespace}/{name}"))
                    .is_none_or(|at| now - *at > 2 * step.requeue)
            })
            .count()
    };
    host.stop().await;
    watch_task.abort();

    let mut sent_sorted = from_sent.clone();
    sent_sorted.sort();
    let mut delivery_sorted = delivery.clone();
    delivery_sorted.sort();
    println!(
        "| {} | {} | {} | {} | {} | {:.0} ({:.0}) | {} | {missed} | {} | {:.1} | {:.1} / {:.1} | {} | {} | {idle} | {:.1} / {:.1} / {:.1} | {:.3} | {:.0} | {load} | {:.0} |",
        step.parents,
        step.requeue.as_secs_f64(),
        step.applies,
        step.sleep.as_millis(),
        step.concurrency,
        reconciles as f64 / window.as_secs_f64(),
        step.parents as f64 / step.requeue.as_secs_f64(),
        from_ack.len(),
        spread(from_ack.clone()),
        ms(percentile(&sent_sorted, 99)),
        ms(percentile(&delivery_sorted, 50)),
        ms(percentile(&delivery_sorted, 99)),
        spread(queued.clone()),
        before_ack,
        percentile(&gaps, 50).as_secs_f64(),
        percentile(&gaps, 99).as_secs_f64(),
        gaps.last().copied().unwrap_or_default().as_secs_f64(),
        written as f64 / step.parents as f64 / (window.as_secs_f64() / step.requeue.as_secs_f64()),
        cpu.as_secs_f64() * 1e6 / reconciles.max(1) as f64,
        setup.as_secs_f64(),
    );
    eprintln!(
        "[latency] {} parents: {} reconciles in {:.1} s of sampling; ack → started (ms, in order): {:?}",
        step.parents,
        reconciles,
        window.as_secs_f64(),
        from_ack
            .iter()
            .map(|d| (ms(*d) * 10.0).round() / 10.0)
            .collect::<Vec<_>>()
    );
    Ok(())
}
