//! Convergence (issue 6, part 4) on the local control plane, with real etcd processes:
//! apply → a size-3 cluster with 3 healthy members, a rolling upgrade of the 3 members
//! (3.5 → 3.6), the replacement of one failed member, and scaling 3 → 5. Each scenario's
//! wall time is split into where it goes:
//!
//! - **host decisions**: the host's own `policy_host_decision_duration_seconds` (sum and
//!   count over the scenario, from its metrics): instantiate + plugin + app-calls to etcd;
//! - **host API writes**: every non-GET request of the host's kube client (server-side
//!   applies, status, deletes, Events), timed by a tower layer on that client, summed;
//! - **pod start**: pod created (or its image changed) → its container running, per pod,
//!   as the test kubelet reports it (a pod watch in this bench, millisecond clock);
//! - **etcd start + join → Ready**: container running → pod Ready (etcd starts, joins or
//!   rejoins, and its readiness probe passes; the probe runs every 5 s);
//! - the rest is waiting: the plugin's requeue delays while a member catches up, and this
//!   bench's 100 ms polling.
//!
//! Sums of per-pod or per-request durations can overlap each other (concurrent reconciles,
//! pods starting while the host waits), so the shares are of the wall time, not a partition.
//!
//! Run: `env -u RUST_BACKTRACE cargo bench -p policy-host-e2e --bench convergence`.
//! `CONVERGENCE_BENCH_REPEATS` (default 3): whole sequences, each in a fresh namespace.

use std::collections::{BTreeMap, BTreeSet};
use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex};
use std::task::{Context as TaskContext, Poll};
use std::time::{Duration, Instant};

use anyhow::{Context, Result, anyhow};
use futures::StreamExt;
use futures::future::BoxFuture;
use k8s_openapi::api::core::v1::Pod;
use k8s_openapi::api::events::v1::Event;
use kube::api::{Api, ApiResource, DynamicObject, ListParams, Patch, PatchParams};
use kube::core::GroupVersionKind;
use kube::runtime::watcher;
use kube::{Client, ResourceExt};
use policy_host::decide::Limits;
use policy_host::metrics::Metrics;
use policy_host::{Running, Settings};
use policy_host_e2e::HostUnderTest;
use policy_host_testenv::TestEnv;
use serde_json::{Value, json};
use tokio::sync::oneshot;

const NAME: &str = "conv";
const CONVERGE: Duration = Duration::from_secs(240);

/// Every request the host's kube client made: method, path, when it started, how long it took
/// until the response headers.
#[derive(Clone, Default)]
struct RequestLog(Arc<Mutex<Vec<TimedRequest>>>);

/// Method, path, start, time to the response headers.
type TimedRequest = (http::Method, String, Instant, Duration);

impl RequestLog {
    /// Writes (every method but GET) since `since`: count and summed duration.
    fn writes_since(&self, since: Instant) -> (usize, Duration) {
        let log = self.0.lock().unwrap_or_else(|p| p.into_inner());
        log.iter()
            .filter(|(method, _, at, _)| *method != http::Method::GET && *at >= since)
            .fold((0, Duration::ZERO), |(n, sum), (_, _, _, took)| {
                (n + 1, sum + *took)
            })
    }
}

/// A tower service timing each request of the service it wraps.
#[derive(Clone)]
struct Timed<S> {
    inner: S,
    log: RequestLog,
}

impl<S, B> tower::Service<http::Request<B>> for Timed<S>
where
    S: tower::Service<http::Request<B>>,
    S::Future: Send + 'static,
{
    type Response = S::Response;
    type Error = S::Error;
    type Future = BoxFuture<'static, Result<S::Response, S::Error>>;

    fn poll_ready(&mut self, cx: &mut TaskContext<'_>) -> Poll<Result<(), Self::Error>> {
        self.inner.poll_ready(cx)
    }

    fn call(&mut self, request: http::Request<B>) -> Self::Future {
        let method = request.method().clone();
        let path = request.uri().path().to_owned();
        let started = Instant::now();
        let response = self.inner.call(request);
        let log = self.log.clone();
        Box::pin(async move {
            let response = response.await;
            log.0.lock().unwrap_or_else(|p| p.into_inner()).push((
                method,
                path,
                started,
                started.elapsed(),
            ));
            response
        })
    }
}

/// `policy_host_decision_duration_seconds` sum and count, from the host's metrics text.
fn decisions(metrics: &Metrics) -> (f64, f64) {
    let text = metrics.render();
    let value = |name: &str| -> f64 {
        text.lines()
            .filter(|l| l.starts_with(name))
            .filter_map(|l| l.rsplit(' ').next()?.parse::<f64>().ok())
            .sum()
    };
    (
        value("policy_host_decision_duration_seconds_sum"),
        value("policy_host_decision_duration_seconds_count"),
    )
}

/// What happened to a pod, when (this bench's clock).
#[derive(Clone, Debug)]
struct Transition {
    at: Instant,
    pod: String,
    what: &'static str,
}

#[derive(Default)]
struct PodState {
    running_container: Option<String>,
    ready: bool,
    image: Option<String>,
    deleting: bool,
}

/// Watches the namespace's pods and the EtcdCluster's Events, recording transitions.
fn watch_timeline(
    client: &Client,
    namespace: &str,
) -> (
    Arc<Mutex<Vec<Transition>>>,
    Vec<tokio::task::JoinHandle<()>>,
) {
    let timeline = Arc::new(Mutex::new(Vec::new()));
    let record = {
        let timeline = timeline.clone();
        move |pod: String, what: &'static str| {
            timeline
                .lock()
                .unwrap_or_else(|p| p.into_inner())
                .push(Transition {
                    at: Instant::now(),
                    pod,
                    what,
                });
        }
    };
    let pods: Api<Pod> = Api::namespaced(client.clone(), namespace);
    let on_pods = record.clone();
    let pod_task = tokio::spawn(async move {
        let mut states: BTreeMap<String, PodState> = BTreeMap::new();
        let mut events = watcher(pods, watcher::Config::default()).boxed();
        while let Some(event) = events.next().await {
            let pod = match event {
                Ok(watcher::Event::Apply(pod) | watcher::Event::InitApply(pod)) => pod,
                Ok(watcher::Event::Delete(pod)) => {
                    states.remove(&pod.uid().unwrap_or_default());
                    on_pods(pod.name_any(), "gone");
                    continue;
                }
                _ => continue,
            };
            let name = pod.name_any();
            let uid = pod.uid().unwrap_or_default();
            let is_new = !states.contains_key(&uid);
            let state = states.entry(uid).or_default();
            if is_new {
                on_pods(name.clone(), "created");
            }
            let image = pod
                .spec
                .as_ref()
                .and_then(|s| s.containers.first())
                .and_then(|c| c.image.clone());
            if state.image.is_some() && image != state.image {
                on_pods(name.clone(), "image changed");
            }
            state.image = image;
            let status = pod.status.as_ref();
            let container = status
                .and_then(|s| s.container_statuses.as_ref())
                .and_then(|c| c.first())
                .filter(|c| c.state.as_ref().is_some_and(|s| s.running.is_some()))
                .map(|c| {
                    format!(
                        "{}/{}",
                        c.container_id.clone().unwrap_or_default(),
                        c.restart_count
                    )
                });
            if container.is_some() && container != state.running_container {
                on_pods(name.clone(), "running");
            }
            state.running_container = container.or(state.running_container.take());
            let ready = status
                .and_then(|s| s.conditions.as_ref())
                .is_some_and(|c| c.iter().any(|c| c.type_ == "Ready" && c.status == "True"));
            if ready != state.ready {
                on_pods(name.clone(), if ready { "ready" } else { "not ready" });
            }
            state.ready = ready;
            if pod.metadata.deletion_timestamp.is_some() && !state.deleting {
                state.deleting = true;
                on_pods(name.clone(), "deleting");
            }
        }
    });
    let events: Api<Event> = Api::namespaced(client.clone(), namespace);
    let event_task = tokio::spawn(async move {
        let mut seen = BTreeSet::new();
        let mut stream = watcher(events, watcher::Config::default()).boxed();
        while let Some(event) = stream.next().await {
            if let Ok(watcher::Event::Apply(e) | watcher::Event::InitApply(e)) = event
                && seen.insert(e.uid().unwrap_or_default())
                && let Some(reason) = e.reason.clone()
            {
                let what: &'static str = Box::leak(format!("Event {reason}").into_boxed_str());
                record(e.note.clone().unwrap_or_default(), what);
            }
        }
    });
    (timeline, vec![pod_task, event_task])
}

/// A host in this process whose kube client is timed.
struct TimedHost {
    stop: Option<oneshot::Sender<()>>,
    task: tokio::task::JoinHandle<()>,
    running: Running,
    requests: RequestLog,
}

impl TimedHost {
    async fn start(env: &TestEnv, plugin: &Path, namespace: &str) -> Result<Self> {
        let requests = RequestLog::default();
        let log = requests.clone();
        let client = kube::client::ClientBuilder::try_from(env.kube_config().await?)?
            .with_layer(&tower::layer::layer_fn(move |inner| Timed {
                inner,
                log: log.clone(),
            }))
            .build();
        let settings = Settings {
            policy_files: vec![plugin.to_owned()],
            ..HostUnderTest::settings(namespace, Limits::default())?
        };
        let (stop, stopped) = oneshot::channel::<()>();
        let (started_tx, started_rx) = oneshot::channel();
        let task = tokio::spawn(async move {
            let mut started_tx = Some(started_tx);
            let outcome = policy_host::run(
                client,
                settings,
                async {
                    let _ = stopped.await;
                },
                |running| {
                    if let Some(tx) = started_tx.take() {
                        let _ = tx.send(running.clone());
                    }
                },
            )
            .await;
            if let Err(error) = outcome {
                eprintln!("the host ended with an error: {error}");
            }
        });
        let running = tokio::time::timeout(Duration::from_secs(120), started_rx)
            .await
            .context("the host did not start within 120 s")?
            .context("the host stopped before it started")?;
        Ok(Self {
            stop: Some(stop),
            task,
            running,
            requests,
        })
    }

    async fn stop(mut self) {
        if let Some(stop) = self.stop.take() {
            let _ = stop.send(());
        }
        let _ = tokio::time::timeout(Duration::from_secs(30), &mut self.task).await;
    }
}

fn etcd_clusters() -> ApiResource {
    ApiResource::from_gvk_with_plural(
        &GroupVersionKind::gvk("etcd.database.coreos.com", "v1beta2", "EtcdCluster"),
        "etcdclusters",
    )
}

fn etcd_version(env: &TestEnv, minor: &str) -> Result<String> {
    policy_host_e2e::apps::etcd_versions(env)
        .iter()
        .map(|v| v.trim_start_matches('v').to_owned())
        .find(|v| v.starts_with(&format!("{minor}.")))
        .ok_or_else(|| {
            anyhow!("no etcd {minor}.x in the test environment; declare it in guest-etcd/test-images.yaml")
        })
}

struct Scenario<'a> {
    env: &'static TestEnv,
    namespace: String,
    clusters: Api<DynamicObject>,
    pods: Api<Pod>,
    etcdctl: PathBuf,
    host: &'a TimedHost,
    timeline: Arc<Mutex<Vec<Transition>>>,
}

/// One scenario's figures, in ms.
#[derive(Debug, Default, Clone)]
struct Figures {
    wall: f64,
    decisions: f64,
    decision_ms: f64,
    writes: f64,
    write_ms: f64,
    pod_start_ms: f64,
    running_to_ready_ms: f64,
    timeline: Vec<String>,
}

impl Scenario<'_> {
    async fn live_pods(&self) -> Result<Vec<Pod>, String> {
        let list = self
            .pods
            .list(&ListParams::default().labels(&format!(
                "app.kubernetes.io/instance={NAME},!etcd.database.coreos.com/role"
            )))
            .await
            .map_err(|e| e.to_string())?;
        Ok(list
            .items
            .into_iter()
            .filter(|p| p.metadata.deletion_timestamp.is_none())
            .collect())
    }

    /// Status `size/size` Running for the current generation (at `version`), `size` live
    /// Ready pods, and etcd's member list (through one member) naming exactly those pods,
    /// none a learner, none of `excluded` IDs.
    async fn converged(
        &self,
        size: usize,
        version: &str,
        excluded: &[String],
    ) -> Result<(), String> {
        let cluster = self.clusters.get(NAME).await.map_err(|e| e.to_string())?;
        let object = serde_json::to_value(&cluster).map_err(|e| e.to_string())?;
        let status = &object["status"];
        if status["ready"] != json!(format!("{size}/{size}"))
            || status["phase"] != json!("Running")
            || status["observedGeneration"] != object["metadata"]["generation"]
            || status["currentVersion"] != json!(version)
        {
            return Err(format!("status {status}"));
        }
        let pods = self.live_pods().await?;
        let ready = |p: &Pod| {
            p.status
                .as_ref()
                .and_then(|s| s.conditions.as_ref())
                .is_some_and(|c| c.iter().any(|c| c.type_ == "Ready" && c.status == "True"))
        };
        if pods.len() != size || !pods.iter().all(ready) {
            return Err(format!("{} pods, not all Ready", pods.len()));
        }
        let names: BTreeSet<String> = pods.iter().map(|p| p.name_any()).collect();
        let endpoint = pods
            .iter()
            .find_map(|p| {
                Some(format!(
                    "http://{}:2379",
                    p.status.as_ref()?.pod_ip.clone()?
                ))
            })
            .ok_or("no pod IP")?;
        let members = self.member_list(&endpoint).await?;
        let member_names: BTreeSet<String> = members
            .iter()
            .filter_map(|m| m["name"].as_str().map(str::to_owned))
            .collect();
        if member_names != names
            || members.iter().any(|m| m["isLearner"] == json!(true))
            || members
                .iter()
                .any(|m| excluded.contains(&m["ID"].to_string()))
        {
            return Err(format!("members {members:?}, pods {names:?}"));
        }
        Ok(())
    }

    async fn member_list(&self, endpoint: &str) -> Result<Vec<Value>, String> {
        let output = tokio::process::Command::new(&self.etcdctl)
            .arg(format!("--endpoints={endpoint}"))
            .args([
                "--dial-timeout=2s",
                "--command-timeout=5s",
                "member",
                "list",
                "-w",
                "json",
            ])
            .kill_on_drop(true)
            .output()
            .await
            .map_err(|e| e.to_string())?;
        if !output.status.success() {
            return Err(String::from_utf8_lossy(&output.stderr).into_owned());
        }
        let list: Value = serde_json::from_slice(&output.stdout).map_err(|e| e.to_string())?;
        Ok(list["members"].as_array().cloned().unwrap_or_default())
    }

    /// Runs `change`, then waits for convergence; returns the figures of that interval.
    async fn measure(
        &self,
        size: usize,
        version: &str,
        excluded: &[String],
        change: impl std::future::Future<Output = Result<()>>,
    ) -> Result<Figures> {
        let (decision_sum, decision_count) = decisions(&self.host.running.metrics);
        let started = Instant::now();
        change.await?;
        let deadline = started + CONVERGE;
        loop {
            match self.converged(size, version, excluded).await {
                Ok(()) => break,
                Err(why) if Instant::now() > deadline => {
                    return Err(anyhow!(
                        "{}: not converged after {CONVERGE:?}: {why}",
                        self.namespace
                    ));
                }
                Err(_) => tokio::time::sleep(Duration::from_millis(100)).await,
            }
        }
        let ended = Instant::now();
        let (sum, count) = decisions(&self.host.running.metrics);
        let (writes, write_time) = self.host.requests.writes_since(started);
        let ms = |d: Duration| d.as_secs_f64() * 1e3;
        let mut figures = Figures {
            wall: ms(ended - started),
            decisions: count - decision_count,
            decision_ms: (sum - decision_sum) * 1e3,
            writes: writes as f64,
            write_ms: ms(write_time),
            ..Figures::default()
        };
        // Per pod: (created | image changed) → running, running → ready.
        let timeline: Vec<Transition> = self
            .timeline
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .iter()
            .filter(|t| t.at >= started && t.at <= ended)
            .cloned()
            .collect();
        let mut began: BTreeMap<&str, Instant> = BTreeMap::new();
        let mut running: BTreeMap<&str, Instant> = BTreeMap::new();
        for t in &timeline {
            match t.what {
                "created" | "image changed" => {
                    began.insert(&t.pod, t.at);
                }
                "running" => {
                    if let Some(b) = began.remove(t.pod.as_str()) {
                        figures.pod_start_ms += ms(t.at - b);
                    }
                    running.insert(&t.pod, t.at);
                }
                "ready" => {
                    if let Some(r) = running.remove(t.pod.as_str()) {
                        figures.running_to_ready_ms += ms(t.at - r);
                    }
                }
                _ => {}
            }
            figures.timeline.push(format!(
                "{:>7.0} ms  {:<22} {}",
                ms(t.at - started),
                t.what,
                t.pod
            ));
        }
        let _ = self.env;
        Ok(figures)
    }
}

fn main() -> Result<()> {
    let runtime = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()?;
    runtime.block_on(bench())
}

async fn bench() -> Result<()> {
    let repeats: usize = std::env::var("CONVERGENCE_BENCH_REPEATS")
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(3);
    let env = policy_host_testenv::shared().await?;
    let client = env.client().await?;
    policy_host_e2e::install_crd(&client, "deploy/crds/etcdcluster.yaml").await?;
    let plugin = policy_host_test_plugins::build("guest-etcd").map_err(|e| anyhow!("{e}"))?;
    let (old, new) = (etcd_version(env, "3.5")?, etcd_version(env, "3.6")?);
    let etcdctl = policy_host_e2e::apps::etcd_dir(env, &format!("v{new}"))
        .context("etcd 3.6 is not in the test environment")?
        .join("etcdctl");

    let mut all: BTreeMap<&str, Vec<Figures>> = BTreeMap::new();
    for repeat in 0..repeats {
        let namespace = env.create_namespace("convergence").await?;
        let host = TimedHost::start(env, &plugin, &namespace).await?;
        let (timeline, watches) = watch_timeline(&client, &namespace);
        let scenario = Scenario {
            env,
            clusters: Api::namespaced_with(client.clone(), &namespace, &etcd_clusters()),
            pods: Api::namespaced(client.clone(), &namespace),
            namespace: namespace.to_string(),
            etcdctl: etcdctl.clone(),
            host: &host,
            timeline,
        };
        let create = scenario
            .measure(3, &old, &[], async {
                let cluster = json!({
                    "apiVersion": "etcd.database.coreos.com/v1beta2", "kind": "EtcdCluster",
                    "metadata": {"name": NAME}, "spec": {"size": 3, "version": old},
                });
                scenario
                    .clusters
                    .patch(
                        NAME,
                        &PatchParams::apply("convergence-bench").force(),
                        &Patch::Apply(&cluster),
                    )
                    .await?;
                Ok(())
            })
            .await?;
        let patch = |spec: Value| {
            let clusters = scenario.clusters.clone();
            async move {
                clusters
                    .patch(
                        NAME,
                        &PatchParams::default(),
                        &Patch::Merge(&json!({"spec": spec})),
                    )
                    .await?;
                anyhow::Ok(())
            }
        };
        let upgrade = scenario
            .measure(3, &new, &[], patch(json!({"version": new})))
            .await?;
        let victim = format!("{NAME}-1");
        let endpoint = scenario
            .live_pods()
            .await
            .map_err(anyhow::Error::msg)?
            .iter()
            .find_map(|p| {
                Some(format!(
                    "http://{}:2379",
                    p.status.as_ref()?.pod_ip.clone()?
                ))
            })
            .context("no pod IP")?;
        let victim_id: Vec<String> = scenario
            .member_list(&endpoint)
            .await
            .map_err(anyhow::Error::msg)?
            .iter()
            .filter(|m| m["name"] == json!(victim))
            .map(|m| m["ID"].to_string())
            .collect();
        anyhow::ensure!(victim_id.len() == 1, "{victim} is not a member");
        let replace = scenario
            .measure(3, &new, &victim_id, async {
                env.fail_pod(&namespace, &victim).await?;
                Ok(())
            })
            .await?;
        let scale = scenario
            .measure(5, &new, &victim_id, patch(json!({"size": 5})))
            .await?;
        for (name, figures) in [
            ("apply -> size 3 Ready (3.5)", create),
            ("rolling upgrade 3 members 3.5 -> 3.6", upgrade),
            ("replace 1 failed member", replace),
            ("scale 3 -> 5", scale),
        ] {
            eprintln!(
                "[convergence] repeat {repeat}: {name}: {:.1} s; decisions {} ({:.0} ms), API writes {} ({:.0} ms), pod start {:.0} ms, running->Ready {:.0} ms\n  {}",
                figures.wall / 1e3,
                figures.decisions,
                figures.decision_ms,
                figures.writes,
                figures.write_ms,
                figures.pod_start_ms,
                figures.running_to_ready_ms,
                figures.timeline.join("\n  ")
            );
            all.entry(name).or_default().push(figures);
        }
        for watch in watches {
            watch.abort();
        }
        let clusters = scenario.clusters.clone();
        drop(scenario);
        host.stop().await;
        let _ = clusters
            .delete(NAME, &kube::api::DeleteParams::background())
            .await;
    }

    let median = |values: Vec<f64>| -> f64 {
        let mut values = values;
        values.sort_by(f64::total_cmp);
        values.get(values.len() / 2).copied().unwrap_or(0.0)
    };
    println!(
        "# convergence: medians over {repeats} run(s), each scenario's share of its wall time"
    );
    println!(
        "| scenario | wall s | host decisions (n, ms) | host API writes (n, ms) | host share | pod start ms (sum over pods) | running -> Ready ms (sum) | runs (wall s) |"
    );
    println!("|---|---:|---:|---:|---:|---:|---:|---|");
    for (name, runs) in &all {
        let pick = |f: fn(&Figures) -> f64| median(runs.iter().map(f).collect());
        let wall = pick(|f| f.wall);
        let host_ms = pick(|f| f.decision_ms + f.write_ms);
        println!(
            "| {name} | {:.1} | {:.0}, {:.0} | {:.0}, {:.0} | {:.1}% | {:.0} | {:.0} | {} |",
            wall / 1e3,
            pick(|f| f.decisions),
            pick(|f| f.decision_ms),
            pick(|f| f.writes),
            pick(|f| f.write_ms),
            100.0 * host_ms / wall,
            pick(|f| f.pod_start_ms),
            pick(|f| f.running_to_ready_ms),
            runs.iter()
                .map(|f| format!("{:.1}", f.wall / 1e3))
                .collect::<Vec<_>>()
                .join(", ")
        );
    }
    Ok(())
}
