//! The cost of a sandboxed decision (issue 6, part 1), printed as tables for BENCHMARKS.md.
//!
//! For a steady `EtcdCluster` of 1, 5 and 9 members (pods, services and budget as the API
//! server returns them, built with guest-etcd's own `children` module) the same decision is
//! taken five ways, interleaved in each round so machine noise hits all of them alike:
//!
//! - **native**: `guest_etcd::reconcile::reconcile` in-process, etcd answered by a script;
//! - **wasm fresh**: `Plugin::reconcile`, the host's path (pooling + pre-instantiation, a new
//!   store and instance per decision), app-calls answered by `AppCallScope::scripted`;
//! - **wasm fresh, off-task**: the same, on a thread of tokio's blocking pool, as the
//!   controller runs it (`controller::off_task`);
//! - **wasm reused**: one instance called again and again (what statelessness costs);
//! - **webhook**: HTTP/JSON on loopback to a server calling the native logic (the
//!   Metacontroller-style alternative), keep-alive connection.
//!
//! Then where the time of *wasm fresh* goes: serializing the observation, instantiating,
//! the call itself, and parsing the decision's JSON on the host side.
//!
//! Run: `env -u RUST_BACKTRACE cargo bench -p policy-host --bench decision`.
//! `DECISION_BENCH_ITERS` (default 2000) and `DECISION_BENCH_ROUNDS` (default 5) size it;
//! `DECISION_BENCH_MEMBERS` (default `1,5,9`) picks the cluster sizes.

use std::collections::HashMap;
use std::net::SocketAddr;
use std::time::{Duration, Instant};

use anyhow::{Context, Result, anyhow};
use serde::{Deserialize, Serialize};
use serde_json::{Value, json};

use guest_etcd::children::{self, ClusterRef, ClusterState, MemberPod};
use guest_etcd::etcd_api::{GatewayEtcdApi, MEMBER_LIST_PATH, MOVE_LEADER_PATH, STATUS_PATH};
use guest_etcd::protocol as guest;
use guest_etcd::spec::EtcdClusterSpec;
use policy_host::capability::replay::AppCallScript;
use policy_host::capability::scope::AppCallScope;
use policy_host::contract::{self, app_call};
use policy_host::decide::{Limits, Plugin, Sandbox};

const NOW: guest::Timestamp = guest::Timestamp {
    seconds: 1_764_000_000,
    nanoseconds: 0,
};
const CLUSTER_ID: u64 = 14_841_639_068_965_178_418;
const VERSION: &str = "3.6.16";

fn member_id(n: usize) -> u64 {
    10_276_657_743_932_975_437_u64.wrapping_add(n as u64 * 7_919)
}

/// One steady cluster, in every form the four variants need.
struct Fixture {
    members: usize,
    /// The objects as the informer cache holds them.
    parent: Value,
    children: Vec<(guest::KindRef, Value)>,
    /// pod → path → gateway answer.
    etcd: HashMap<String, HashMap<String, String>>,
}

impl Fixture {
    fn new(members: usize) -> Result<Self> {
        let cluster = ClusterRef {
            name: "ex".into(),
            namespace: "ns".into(),
            tls: false,
        };
        let spec = EtcdClusterSpec {
            size: members as i64,
            version: VERSION.into(),
            ..Default::default()
        };
        let valid = spec.validate().map_err(|e| anyhow!(e))?;
        let names: Vec<String> = (0..members).map(|n| cluster.member_name(n)).collect();
        let initial: Vec<(String, String)> = names
            .iter()
            .map(|n| (n.clone(), cluster.peer_url(n)))
            .collect();
        let owner = json!([{"apiVersion": "etcd.database.coreos.com/v1beta2", "kind": "EtcdCluster",
            "name": "ex", "uid": "6f1d3c1e-8a7b-4d0e-9d5c-0c6b2b9f1a11", "controller": true, "blockOwnerDeletion": true}]);
        let decorate = |mut object: Value, n: usize| {
            let meta = &mut object["metadata"];
            meta["namespace"] = json!("ns");
            meta["uid"] = json!(format!("0b8e6f52-3c1d-4a7e-8f00-{n:012}"));
            meta["resourceVersion"] = json!(format!("{}", 48_210 + n));
            meta["creationTimestamp"] = json!("2025-11-24T15:50:00Z");
            meta["ownerReferences"] = owner.clone();
            meta["labels"]["policy-host.io/policy"] = json!("etcd");
            meta["managedFields"] = json!([{"manager": "policy-host", "operation": "Apply",
                "apiVersion": "v1", "time": "2025-11-24T15:50:00Z", "fieldsType": "FieldsV1"}]);
            object
        };
        let mut kids = Vec::new();
        for (n, name) in names.iter().enumerate() {
            let member = MemberPod {
                name: name.clone(),
                initial_cluster: initial.clone(),
                state: ClusterState::Existing,
            };
            let mut pod = decorate(children::member_pod(&cluster, &valid, &member), n);
            pod["spec"]["nodeName"] = json!("node-1");
            pod["spec"]["serviceAccountName"] = json!("default");
            pod["status"] = json!({
                "phase": "Running",
                "podIP": format!("10.244.0.{}", 10 + n),
                "podIPs": [{"ip": format!("10.244.0.{}", 10 + n)}],
                "hostIP": "172.18.0.2",
                "startTime": "2025-11-24T15:50:01Z",
                "qosClass": "BestEffort",
                "conditions": [
                    {"type": "PodReadyToStartContainers", "status": "True", "lastTransitionTime": "2025-11-24T15:50:02Z"},
                    {"type": "Initialized", "status": "True", "lastTransitionTime": "2025-11-24T15:50:01Z"},
                    {"type": "Ready", "status": "True", "lastTransitionTime": "2025-11-24T15:50:07Z"},
                    {"type": "ContainersReady", "status": "True", "lastTransitionTime": "2025-11-24T15:50:07Z"},
                    {"type": "PodScheduled", "status": "True", "lastTransitionTime": "2025-11-24T15:50:00Z"},
                ],
                "containerStatuses": [{
                    "name": "etcd", "ready": true, "started": true, "restartCount": 0,
                    "image": valid.image, "imageID": "sha256:5b1e9d4a",
                    "containerID": format!("containerd://{n:064}"),
                    "state": {"running": {"startedAt": "2025-11-24T15:50:02Z"}},
                }],
            });
            kids.push((children::pod_kind(), pod));
        }
        let mut headless = decorate(children::headless_service(&cluster), members);
        headless["spec"]["clusterIP"] = json!("None");
        let mut client = decorate(children::client_service(&cluster), members + 1);
        client["spec"]["clusterIP"] = json!("10.96.12.34");
        client["spec"]["clusterIPs"] = json!(["10.96.12.34"]);
        kids.push((children::service_kind(), headless));
        kids.push((children::service_kind(), client));
        let mut pdb = decorate(
            children::pod_disruption_budget(&cluster, members),
            members + 2,
        );
        pdb["status"] = json!({"currentHealthy": members, "desiredHealthy": members / 2 + 1,
            "disruptionsAllowed": members - (members / 2 + 1), "expectedPods": members, "observedGeneration": 1});
        kids.push((children::pdb_kind(), pdb));

        let member_json: Vec<Value> = names
            .iter()
            .enumerate()
            .map(|(n, name)| {
                json!({"ID": member_id(n).to_string(), "name": name,
                "peerURLs": [cluster.peer_url(name)], "clientURLs": [cluster.client_url(name)]})
            })
            .collect();
        let mut etcd: HashMap<String, HashMap<String, String>> = HashMap::new();
        for (n, name) in names.iter().enumerate() {
            let header = json!({"cluster_id": CLUSTER_ID.to_string(), "member_id": member_id(n).to_string(),
                "revision": "1042", "raft_term": "2"});
            let paths = etcd.entry(name.clone()).or_default();
            paths.insert(
                MEMBER_LIST_PATH.into(),
                json!({"header": header, "members": member_json}).to_string(),
            );
            paths.insert(
                STATUS_PATH.into(),
                json!({"header": header, "version": VERSION, "dbSize": "20480", "leader": member_id(0).to_string(),
                "raftIndex": "1042", "raftTerm": "2", "raftAppliedIndex": "1042", "dbSizeInUse": "20480", "storageVersion": "3.6.0"})
                .to_string(),
            );
            paths.insert(
                MOVE_LEADER_PATH.into(),
                json!({"header": header}).to_string(),
            );
        }

        let parent = json!({
            "apiVersion": "etcd.database.coreos.com/v1beta2",
            "kind": "EtcdCluster",
            "metadata": {"name": "ex", "namespace": "ns", "uid": "6f1d3c1e-8a7b-4d0e-9d5c-0c6b2b9f1a11",
                "generation": 2, "resourceVersion": "48200", "creationTimestamp": "2025-11-24T15:49:59Z"},
            "spec": {"size": members, "version": VERSION},
        });
        let mut fixture = Fixture {
            members,
            parent,
            children: kids,
            etcd,
        };
        // The status the plugin itself writes in the steady state, so the observation is
        // what the host sees on every later reconcile (a fixed point).
        for _ in 0..3 {
            let decision = fixture.native()?;
            let status = decision
                .actions
                .iter()
                .find_map(|a| match a {
                    guest::Action::SetStatus(s) => Some(s.clone()),
                    _ => None,
                })
                .context("the steady decision sets no status")?;
            fixture.parent["status"] = status;
        }
        Ok(fixture)
    }

    /// What the host's observe stage does: the cached objects to JSON text.
    fn host_observation(&self) -> contract::Observation {
        contract::Observation {
            parent: self.parent.to_string(),
            children: self
                .children
                .iter()
                .map(|(kind, object)| contract::Child {
                    kind: host_kind(kind),
                    object: object.to_string(),
                })
                .collect(),
            now: contract::Timestamp {
                seconds: NOW.seconds,
                nanoseconds: NOW.nanoseconds,
            },
        }
    }

    fn guest_observation(&self) -> guest::Observation {
        guest::Observation {
            parent: self.parent.to_string(),
            children: self
                .children
                .iter()
                .map(|(kind, object)| guest::Child {
                    kind: kind.clone(),
                    object: object.to_string(),
                })
                .collect(),
            now: NOW,
        }
    }

    fn native(&self) -> Result<guest::Decision> {
        native_decide(&self.guest_observation(), &self.etcd)
    }

    fn script(&self) -> AppCallScript {
        AppCallScript::new(self.etcd.iter().flat_map(|(pod, paths)| {
            paths.iter().map(move |(path, body)| {
                (
                    pod.clone(),
                    path.clone(),
                    Ok(app_call::Response {
                        status: 200,
                        body: body.clone(),
                    }),
                )
            })
        }))
    }
}

fn host_kind(kind: &guest::KindRef) -> contract::KindRef {
    contract::KindRef {
        group: kind.group.clone(),
        version: kind.version.clone(),
        kind: kind.kind.clone(),
        plural: kind.plural.clone(),
        namespaced: kind.namespaced,
    }
}

/// The decision logic in-process, etcd answered from the same script the wasm runs see
/// (the gateway JSON is decoded natively, exactly as in the plugin).
fn native_decide(
    observation: &guest::Observation,
    etcd: &HashMap<String, HashMap<String, String>>,
) -> Result<guest::Decision> {
    let mut api = GatewayEtcdApi::new(|request: &guest::AppCallRequest| {
        etcd.get(&request.pod)
            .and_then(|paths| paths.get(&request.path))
            .map(|body| guest::AppCallResponse {
                status: 200,
                body: body.clone(),
            })
            .ok_or_else(|| guest::AppCallError::Unreachable(request.pod.clone()))
    });
    guest_etcd::reconcile::reconcile(observation, &mut api).map_err(|e| anyhow!("{e}"))
}

// ---- the webhook: the same native logic behind HTTP/JSON on loopback ----

/// The observation on the wire: objects as JSON text, as in the WIT contract.
#[derive(Serialize, Deserialize)]
struct WireObservation {
    parent: String,
    children: Vec<WireChild>,
    now_seconds: i64,
}

#[derive(Serialize, Deserialize)]
struct WireChild {
    group: String,
    version: String,
    kind: String,
    plural: String,
    object: String,
}

fn wire_observation(fixture: &Fixture) -> WireObservation {
    WireObservation {
        parent: fixture.parent.to_string(),
        children: fixture
            .children
            .iter()
            .map(|(kind, object)| WireChild {
                group: kind.group.clone(),
                version: kind.version.clone(),
                kind: kind.kind.clone(),
                plural: kind.plural.clone(),
                object: object.to_string(),
            })
            .collect(),
        now_seconds: NOW.seconds,
    }
}

fn decision_json(decision: guest::Decision) -> Value {
    let actions: Vec<Value> = decision
        .actions
        .into_iter()
        .map(|action| match action {
            guest::Action::Apply(object) => json!({"apply": object}),
            guest::Action::Delete { kind, name } => {
                json!({"delete": {"kind": kind.kind, "name": name}})
            }
            guest::Action::SetStatus(status) => json!({"setStatus": status}),
            guest::Action::RecordEvent(event) => json!({"event": {
                "type": format!("{:?}", event.event_type), "reason": event.reason, "message": event.message}}),
        })
        .collect();
    json!({"actions": actions, "requeueAfterMs": decision.requeue_after_ms})
}

async fn webhook(
    axum::extract::State(etcd): axum::extract::State<
        std::sync::Arc<HashMap<String, HashMap<String, String>>>,
    >,
    body: axum::body::Bytes,
) -> (http::StatusCode, String) {
    let wire: WireObservation = match serde_json::from_slice(&body) {
        Ok(wire) => wire,
        Err(e) => return (http::StatusCode::BAD_REQUEST, e.to_string()),
    };
    let observation = guest::Observation {
        parent: wire.parent,
        children: wire
            .children
            .into_iter()
            .map(|c| guest::Child {
                kind: guest::KindRef::namespaced(&c.group, &c.version, &c.kind, &c.plural),
                object: c.object,
            })
            .collect(),
        now: guest::Timestamp {
            seconds: wire.now_seconds,
            nanoseconds: 0,
        },
    };
    match native_decide(&observation, &etcd) {
        Ok(decision) => (http::StatusCode::OK, decision_json(decision).to_string()),
        Err(e) => (http::StatusCode::INTERNAL_SERVER_ERROR, e.to_string()),
    }
}

/// Serves the webhook on its own thread and runtime (another process, in a real deployment).
fn start_webhook(etcd: HashMap<String, HashMap<String, String>>) -> Result<SocketAddr> {
    let listener = std::net::TcpListener::bind("127.0.0.1:0")?;
    listener.set_nonblocking(true)?;
    let addr = listener.local_addr()?;
    let app = axum::Router::new()
        .route("/reconcile", axum::routing::post(webhook))
        .with_state(std::sync::Arc::new(etcd));
    std::thread::Builder::new()
        .name("webhook".into())
        .spawn(move || {
            let runtime = tokio::runtime::Builder::new_current_thread()
                .enable_all()
                .build();
            if let Ok(runtime) = runtime {
                runtime.block_on(async move {
                    if let Ok(listener) = tokio::net::TcpListener::from_std(listener) {
                        let _ = axum::serve(listener, app).await;
                    }
                });
            }
        })?;
    Ok(addr)
}

// ---- measuring ----

/// Sorted per-call times of one variant in one round.
struct Samples(Vec<Duration>);

impl Samples {
    fn percentile(&self, p: usize) -> Duration {
        let at = (self.0.len() * p / 100).min(self.0.len().saturating_sub(1));
        self.0.get(at).copied().unwrap_or_default()
    }
}

async fn sample<F, Fut>(iterations: usize, mut once: F) -> Result<Samples>
where
    F: FnMut() -> Fut,
    Fut: std::future::Future<Output = Result<()>>,
{
    for _ in 0..(iterations / 10).max(10) {
        once().await?;
    }
    let mut times = Vec::with_capacity(iterations);
    for _ in 0..iterations {
        let start = Instant::now();
        once().await?;
        times.push(start.elapsed());
    }
    times.sort();
    Ok(Samples(times))
}

/// Minor page faults of this process so far (`/proc/self/stat`, field 10).
fn minor_faults() -> i64 {
    std::fs::read_to_string("/proc/self/stat")
        .ok()
        .and_then(|stat| {
            // The command name may contain spaces: count fields after its closing paren.
            let rest = stat.rsplit_once(')')?.1.to_owned();
            rest.split_whitespace().nth(7)?.parse().ok()
        })
        .unwrap_or(0)
}

fn median(mut values: Vec<f64>) -> f64 {
    values.sort_by(|a, b| a.total_cmp(b));
    values.get(values.len() / 2).copied().unwrap_or(f64::NAN)
}

fn micros(d: Duration) -> f64 {
    d.as_secs_f64() * 1e6
}

fn env_usize(name: &str, default: usize) -> usize {
    std::env::var(name)
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(default)
}

const VARIANTS: [&str; 5] = [
    "native",
    "wasm fresh",
    "wasm fresh, off-task",
    "wasm reused",
    "webhook",
];
const PARTS: [&str; 5] = [
    "serialize observation",
    "store + instantiate + drop",
    "call (reused instance)",
    "guest logic (native)",
    "parse decision JSON",
];

fn main() -> Result<()> {
    if std::env::var_os("RUST_BACKTRACE").is_some() {
        eprintln!(
            "warning: RUST_BACKTRACE is set; every wasmtime error captures a backtrace. Run with `env -u RUST_BACKTRACE`."
        );
    }
    let iterations = env_usize("DECISION_BENCH_ITERS", 2000);
    let rounds = env_usize("DECISION_BENCH_ROUNDS", 5);
    // Another build of the plugin (e.g. another profile) can be compared with
    // `DECISION_BENCH_WASM=path/to/guest_etcd.wasm`.
    let wasm = match std::env::var_os("DECISION_BENCH_WASM") {
        Some(path) => path.into(),
        None => policy_host_test_plugins::build("guest-etcd")?,
    };
    let bytes = std::fs::read(&wasm)?;
    println!("plugin: {} ({} B)", wasm.display(), bytes.len());
    let runtime = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()?;
    runtime.block_on(run(&bytes, iterations, rounds))
}

async fn run(bytes: &[u8], iterations: usize, rounds: usize) -> Result<()> {
    let sandbox = Sandbox::new()?;
    let plugin = sandbox.load("guest-etcd", bytes, Limits::default()).await?;
    let client = policy_host::capability::http::http_client().expect("the app-call client");
    println!(
        "decision cost: {iterations} decisions per variant per round, {rounds} rounds, median of the rounds' percentiles"
    );
    let sizes = std::env::var("DECISION_BENCH_MEMBERS").unwrap_or_else(|_| "1,5,9".into());
    for members in sizes
        .split(',')
        .filter_map(|n| n.trim().parse::<usize>().ok())
    {
        let fixture = Fixture::new(members)?;
        let addr = start_webhook(fixture.etcd.clone())?;
        let url = format!("http://{addr}/reconcile");
        check_same_decision(&fixture, &plugin, &client, &url).await?;

        let mut p50: HashMap<&str, Vec<f64>> = HashMap::new();
        let mut p99: HashMap<&str, Vec<f64>> = HashMap::new();
        let mut ratio50: HashMap<&str, Vec<f64>> = HashMap::new();
        let mut parts: HashMap<&str, Vec<f64>> = HashMap::new();
        let guest_observation = fixture.guest_observation();
        let host_observation = fixture.host_observation();
        let script = fixture.script();
        let body = serde_json::to_string(&wire_observation(&fixture))?;
        let mut reused = plugin
            .instantiate_for_reuse(
                AppCallScope::scripted("ns/ex".into(), script.clone()),
                Some(host_observation.now),
            )
            .await?;
        for _ in 0..rounds {
            let native = sample(iterations, || async {
                native_decide(&guest_observation, &fixture.etcd).map(drop)
            })
            .await?;
            let fresh = sample(iterations, || async {
                let scope = AppCallScope::scripted("ns/ex".into(), script.clone());
                plugin
                    .reconcile(&host_observation, scope, "benchmarking")
                    .await
                    .map(drop)
                    .map_err(Into::into)
            })
            .await?;
            // The controller's path: the same decision on a thread of the blocking pool
            // (`controller::off_task`), so a looping plugin cannot hold the controller's task.
            let shared_observation = std::sync::Arc::new(host_observation.clone());
            let off_task = sample(iterations, || {
                let (plugin, observation) = (plugin.clone(), shared_observation.clone());
                let scope = AppCallScope::scripted("ns/ex".into(), script.clone());
                async move {
                    policy_host::controller::off_task("benchmarking", async move {
                        plugin
                            .reconcile(&observation, scope, "benchmarking")
                            .await
                            .map(drop)
                    })
                    .await??;
                    Ok(())
                }
            })
            .await?;
            let mut warm = Vec::with_capacity(iterations);
            for n in 0..iterations + iterations / 10 {
                let start = Instant::now();
                reused.reconcile(&host_observation, "benchmarking").await?;
                if n >= iterations / 10 {
                    warm.push(start.elapsed());
                }
            }
            warm.sort();
            let warm = Samples(warm);
            let hook = sample(iterations, || async {
                let response = client
                    .post(&url)
                    .header("content-type", "application/json")
                    .body(body.clone())
                    .send()
                    .await?
                    .error_for_status()?;
                let decision: Value = serde_json::from_slice(&response.bytes().await?)?;
                std::hint::black_box(decision);
                Ok(())
            })
            .await?;
            script.clear_calls();
            let base50 = micros(native.percentile(50));
            for (name, samples) in VARIANTS
                .iter()
                .zip([&native, &fresh, &off_task, &warm, &hook])
            {
                let (a, b) = (
                    micros(samples.percentile(50)),
                    micros(samples.percentile(99)),
                );
                p50.entry(name).or_default().push(a);
                p99.entry(name).or_default().push(b);
                ratio50.entry(name).or_default().push(a / base50);
            }

            // Where the time of a fresh-instance decision goes.
            let serialize = sample(iterations, || async {
                std::hint::black_box(fixture.host_observation());
                Ok(())
            })
            .await?;
            let instantiate = sample(iterations, || async {
                let scope = AppCallScope::scripted("ns/ex".into(), script.clone());
                drop(
                    plugin
                        .instantiate_for_reuse(scope, Some(host_observation.now))
                        .await?,
                );
                Ok(())
            })
            .await?;
            let decision = plugin
                .reconcile(
                    &host_observation,
                    AppCallScope::scripted("ns/ex".into(), script.clone()),
                    "benchmarking",
                )
                .await?;
            let parse = sample(iterations, || async {
                for action in &decision.actions {
                    if let contract::Action::Apply(text) | contract::Action::SetStatus(text) =
                        action
                    {
                        std::hint::black_box(serde_json::from_str::<Value>(text)?);
                    }
                }
                Ok(())
            })
            .await?;
            for (name, samples) in
                PARTS
                    .iter()
                    .zip([&serialize, &instantiate, &warm, &native, &parse])
            {
                parts
                    .entry(name)
                    .or_default()
                    .push(micros(samples.percentile(50)));
            }
        }

        // Page faults explain the extra cost of a fresh instance's first call: its heap is
        // new memory (the pool resets a slot with madvise when an instance is dropped).
        let faults = |n: usize| {
            let plugin = &plugin;
            let (observation, script) = (&host_observation, &script);
            async move {
                let before = minor_faults();
                for _ in 0..n {
                    let scope = AppCallScope::scripted("ns/ex".into(), script.clone());
                    plugin.reconcile(observation, scope, "benchmarking").await?;
                }
                anyhow::Ok((minor_faults() - before) as f64 / n as f64)
            }
        };
        let fresh_faults = faults(500).await?;
        let before = minor_faults();
        for _ in 0..500 {
            reused.reconcile(&host_observation, "benchmarking").await?;
        }
        let reused_faults = (minor_faults() - before) as f64 / 500.0;

        script.clear_calls();
        plugin
            .reconcile(
                &host_observation,
                AppCallScope::scripted("ns/ex".into(), script.clone()),
                "benchmarking",
            )
            .await?;
        let calls = script.calls().len();
        let observation_bytes = host_observation.parent.len()
            + host_observation
                .children
                .iter()
                .map(|c| c.object.len())
                .sum::<usize>();
        println!();
        println!(
            "## {members} member(s): observation {observation_bytes} B of JSON ({} children), {calls} app-call(s) per decision",
            fixture.children.len()
        );
        println!("| variant | p50 µs | p99 µs | p50 / native |");
        println!("|---|---:|---:|---:|");
        for name in VARIANTS {
            println!(
                "| {name} | {:.1} | {:.1} | {:.2}× |",
                median(p50[name].clone()),
                median(p99[name].clone()),
                median(ratio50[name].clone()),
            );
        }
        println!("| part of a fresh-instance decision | p50 µs |");
        println!("|---|---:|");
        for name in PARTS {
            println!("| {name} | {:.1} |", median(parts[name].clone()));
        }
        println!(
            "minor page faults per decision: wasm fresh {fresh_faults:.1}, wasm reused {reused_faults:.1}"
        );
        guest_profile(&fixture, iterations, rounds).await?;
    }
    Ok(())
}

/// The fields guest-etcd reads from a member pod, deserialized straight from the text (serde
/// skips the rest): what reading a pod would cost if the plugin did not first build a whole
/// `serde_json::Value` tree of it and deep-clone it (see `ObservedChildren::read`).
#[derive(Deserialize)]
#[allow(dead_code)]
struct PodFields {
    metadata: PodMeta,
    #[serde(default)]
    spec: PodSpecFields,
    #[serde(default)]
    status: PodStatusFields,
}

#[derive(Deserialize)]
#[allow(dead_code)]
#[serde(rename_all = "camelCase")]
struct PodMeta {
    name: String,
    #[serde(default)]
    deletion_timestamp: Option<String>,
    #[serde(default)]
    labels: HashMap<String, String>,
}

#[derive(Deserialize, Default)]
#[allow(dead_code)]
struct PodSpecFields {
    #[serde(default)]
    containers: Vec<ContainerFields>,
}

#[derive(Deserialize)]
#[allow(dead_code)]
struct ContainerFields {
    name: String,
    #[serde(default)]
    image: String,
}

#[derive(Deserialize, Default)]
#[allow(dead_code)]
#[serde(rename_all = "camelCase")]
struct PodStatusFields {
    #[serde(default)]
    phase: String,
    #[serde(default)]
    conditions: Vec<Value>,
    #[serde(default)]
    container_statuses: Vec<Value>,
}

/// Where the guest's own time goes, natively (the wasm build runs the same code ~1.5x
/// slower): reading the children (`ObservedChildren::read`), and inside it the generic
/// `Value` parse of each pod, against a typed parse of only the fields read.
async fn guest_profile(fixture: &Fixture, iterations: usize, rounds: usize) -> Result<()> {
    let observation = fixture.guest_observation();
    let pods: Vec<&str> = observation
        .children
        .iter()
        .filter(|c| c.kind.kind == "Pod")
        .map(|c| c.object.as_str())
        .collect();
    const ROWS: [&str; 6] = [
        "whole native decision",
        "read the children (ObservedChildren::read, the SDK's ObservedPod::read)",
        "… parse each pod into a serde_json::Value",
        "(what the guest did before the SDK: also deep-clone each pod's Value)",
        "proposed: typed parse of the fields read, from the text",
        "parse the parent into a Value (about what reading it costs)",
    ];
    let mut rows: HashMap<&str, Vec<f64>> = HashMap::new();
    for _ in 0..rounds {
        let whole = sample(iterations, || async {
            native_decide(&observation, &fixture.etcd).map(drop)
        })
        .await?;
        let read = sample(iterations, || async {
            std::hint::black_box(
                children::ObservedChildren::read(&observation).map_err(|e| anyhow!("{e:?}"))?,
            );
            Ok(())
        })
        .await?;
        let parsed: Vec<Value> = pods
            .iter()
            .map(|p| serde_json::from_str(p))
            .collect::<Result<_, _>>()?;
        let parse = sample(iterations, || async {
            for pod in &pods {
                std::hint::black_box(serde_json::from_str::<Value>(pod)?);
            }
            Ok(())
        })
        .await?;
        let clone = sample(iterations, || async {
            for pod in &parsed {
                std::hint::black_box(pod.clone());
            }
            Ok(())
        })
        .await?;
        let typed = sample(iterations, || async {
            for pod in &pods {
                std::hint::black_box(serde_json::from_str::<PodFields>(pod)?);
            }
            Ok(())
        })
        .await?;
        let parent = sample(iterations, || async {
            std::hint::black_box(serde_json::from_str::<Value>(&observation.parent)?);
            Ok(())
        })
        .await?;
        for (row, samples) in ROWS
            .iter()
            .zip([&whole, &read, &parse, &clone, &typed, &parent])
        {
            rows.entry(row)
                .or_default()
                .push(micros(samples.percentile(50)));
        }
    }
    println!(
        "| where the guest's time goes (native, {} members) | p50 µs |",
        fixture.members
    );
    println!("|---|---:|");
    for row in ROWS {
        println!("| {row} | {:.1} |", median(rows[row].clone()));
    }
    Ok(())
}

/// All four variants must take the same decision, or the comparison means nothing.
async fn check_same_decision(
    fixture: &Fixture,
    plugin: &Plugin,
    client: &reqwest::Client,
    url: &str,
) -> Result<()> {
    let native = decision_json(fixture.native()?);
    let steady = native["actions"]
        .as_array()
        .map(|a| {
            a.iter()
                .all(|x| x.get("setStatus").is_some() || x["apply"]["kind"] != "Pod")
        })
        .unwrap_or(false);
    if !steady {
        return Err(anyhow!("the fixture is not a steady cluster: {native}"));
    }
    let wasm = plugin
        .reconcile(
            &fixture.host_observation(),
            AppCallScope::scripted("ns/ex".into(), fixture.script()),
            "checking",
        )
        .await?;
    let wasm_actions: Vec<Value> = wasm
        .actions
        .iter()
        .map(|a| match a {
            contract::Action::Apply(text) => {
                serde_json::from_str(text).map(|v: Value| json!({"apply": v}))
            }
            contract::Action::SetStatus(text) => {
                serde_json::from_str(text).map(|v: Value| json!({"setStatus": v}))
            }
            other => Ok(json!({"other": format!("{other:?}")})),
        })
        .collect::<Result<_, _>>()?;
    if Value::Array(wasm_actions) != native["actions"]
        || wasm.requeue_after_ms != native["requeueAfterMs"].as_u64()
    {
        return Err(anyhow!("the plugin and the native logic disagree"));
    }
    let hook: Value = client
        .post(url)
        .body(serde_json::to_string(&wire_observation(fixture))?)
        .send()
        .await?
        .error_for_status()?
        .json()
        .await?;
    if hook != native {
        return Err(anyhow!("the webhook and the native logic disagree"));
    }
    Ok(())
}
