//! What the controller guarantees under real-cluster conditions, through the real
//! `controller::run` against the real kube-apiserver, with the misbehaving test plugin:
//! no decision on a partial view of the children (a held child LIST) and readiness with it,
//! a looping parent that does not hold up the other parents of its policy, and no parent
//! stranded by its finalizer (plugin renamed, unloaded, or a finalize that keeps trapping).

use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::task::{Context as TaskContext, Poll};
use std::time::Duration;

use futures::future::BoxFuture;
use k8s_openapi::api::core::v1::{ConfigMap, Namespace};
use k8s_openapi::api::events::v1::Event;
use kube::Client;
use kube::api::{Api, DeleteParams, DynamicObject, ListParams, Patch, PatchParams};
use policy_host::decide::Limits;
use policy_host::load::pack::{self, PackOptions};
use policy_host::{Running, Settings};
use policy_host_e2e::{HostUnderTest, init_logging, install_crd_object, probe_crd, probes};
use policy_host_testenv::{TestEnv, TestNamespace, shared_node, wait_for};
use serde_json::{Value, json};
use tokio::sync::watch;

const WAIT: Duration = Duration::from_secs(90);

/// Which of the host's requests a [`Held`] client holds back.
type Selects = fn(&http::Method, &str, &str) -> bool;

/// Every LIST of the host's labelled children (not the watches): a slow API server, or a
/// namespace with very many children.
fn child_list(method: &http::Method, _path: &str, query: &str) -> bool {
    method == http::Method::GET
        && query.contains("labelSelector=policy-host.io%2Fpolicy")
        && !query.contains("watch=true")
}

/// Every WATCH of the parents (`Probe`s), not their LIST: a parent cache that stays as it was
/// first listed, as one whose watch events lag behind the host's own writes.
fn parent_watch(method: &http::Method, path: &str, query: &str) -> bool {
    method == http::Method::GET && path.ends_with("/probes") && query.contains("watch=true")
}

/// A tower service that holds the requests `selects` picks until the test lets them go.
#[derive(Clone)]
struct Held<S> {
    inner: S,
    selects: Selects,
    release: watch::Receiver<bool>,
    held: Arc<AtomicUsize>,
}

impl<S, B> tower::Service<http::Request<B>> for Held<S>
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
        let uri = request.uri();
        let selected = (self.selects)(
            request.method(),
            uri.path(),
            uri.query().unwrap_or_default(),
        );
        if !selected || *self.release.borrow() {
            return Box::pin(self.inner.call(request));
        }
        self.held.fetch_add(1, Ordering::SeqCst);
        // The client sees the answer only once released (the request itself goes out when
        // its future is first polled, i.e. then too).
        let response = self.inner.call(request);
        let mut release = self.release.clone();
        Box::pin(async move {
            let _ = release.wait_for(|released| *released).await;
            response.await
        })
    }
}

/// A client of the shared API server whose requests picked by `selects` wait for `release`.
async fn client_holding(
    env: &policy_host_testenv::TestEnv,
    selects: Selects,
    release: watch::Receiver<bool>,
    held: Arc<AtomicUsize>,
) -> anyhow::Result<Client> {
    Ok(
        kube::client::ClientBuilder::try_from(env.kube_config().await?)?
            .with_layer(&tower::layer::layer_fn(move |inner| Held {
                inner,
                selects,
                release: release.clone(),
                held: held.clone(),
            }))
            .build(),
    )
}

async fn get(url: &str) -> anyhow::Result<(u16, String)> {
    let response = policy_host::capability::http::http_client()?
        .get(url)
        .send()
        .await?;
    Ok((response.status().as_u16(), response.text().await?))
}

fn probe(name: &str, behaviour: &str) -> Value {
    json!({
        "apiVersion": "test.policy-host.io/v1", "kind": "Probe",
        "metadata": { "name": name }, "spec": { "behaviour": behaviour }
    })
}

async fn apply_probe(api: &Api<DynamicObject>, name: &str, behaviour: &str) -> anyhow::Result<()> {
    api.patch(
        name,
        &PatchParams::apply("e2e").force(),
        &Patch::Apply(&probe(name, behaviour)),
    )
    .await?;
    Ok(())
}

fn status_number(object: &DynamicObject, field: &str) -> Option<u64> {
    object.data.get("status")?.get(field)?.as_u64()
}

/// Stops the host, then removes the test plugin's finalizer so the namespace can go.
async fn release_finalizers(host: HostUnderTest, api: &Api<DynamicObject>, names: &[&str]) {
    host.stop().await;
    for name in names {
        let patch = json!({ "metadata": { "finalizers": null } });
        let _ = api
            .patch(name, &PatchParams::default(), &Patch::Merge(&patch))
            .await;
    }
}

/// A namespace whose `ok` Probe `name` a first host has decided (it has its finalizer and its
/// child), its status then cleared: the next host's first decision writes it again.
struct Forgotten {
    namespace: TestNamespace,
    settings: Settings,
    api: Api<DynamicObject>,
}

async fn decided_then_forgotten(
    env: &TestEnv,
    prefix: &str,
    name: &str,
) -> anyhow::Result<Forgotten> {
    let client = env.client().await?;
    install_crd_object(&client, probe_crd()?).await?;
    let namespace = env.create_namespace(prefix).await?;
    let plugin = policy_host_test_plugins::build("misbehaving-policy")
        .map_err(|e| anyhow::anyhow!("{e}"))?;
    let settings = Settings {
        policy_files: vec![plugin],
        ..HostUnderTest::settings(&namespace, Limits::default())?
    };
    let api: Api<DynamicObject> = Api::namespaced_with(client, &namespace, &probes());
    let host = HostUnderTest::start_with(env, settings.clone()).await?;
    apply_probe(&api, name, "ok").await?;
    wait_for(
        &format!("`{name}` observed with its child"),
        WAIT,
        || async {
            let object = api.get_opt(name).await.ok().flatten()?;
            (status_number(&object, "observedChildren")? == 1).then_some(())
        },
    )
    .await?;
    host.stop().await;
    api.patch_status(
        name,
        &PatchParams::default(),
        &Patch::Merge(json!({ "status": null })),
    )
    .await?;
    Ok(Forgotten {
        namespace,
        settings,
        api,
    })
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn first_decision_after_a_start_waits_for_the_child_list_and_readyz_with_it()
-> anyhow::Result<()> {
    init_logging();
    let env = shared_node().await?;
    // A first host gives the parent its child; what it observed is then forgotten, and a
    // host whose child LIST is held starts.
    let Forgotten {
        namespace: _namespace,
        settings,
        api,
    } = decided_then_forgotten(env, "partial-view", "seen").await?;
    let (release, released) = watch::channel(false);
    let held = Arc::new(AtomicUsize::new(0));
    let slow = client_holding(env, child_list, released, held.clone()).await?;
    let host = HostUnderTest::start_with_client(slow, settings).await?;
    let admin = host
        .running
        .admin_addr
        .ok_or_else(|| anyhow::anyhow!("no admin address"))?;
    wait_for("the host's child LIST held", WAIT, || async {
        (held.load(Ordering::SeqCst) >= 1).then_some(())
    })
    .await?;
    // While the children are not listed, nothing is decided and the host is not ready.
    let (code, why) = get(&format!("http://{admin}/readyz")).await?;
    assert_eq!(code, 503, "ready before the child caches synced: {why}");
    assert!(why.contains("misbehaving"), "{why}");
    let seen = api.get("seen").await?;
    assert_eq!(
        status_number(&seen, "firstObservedChildren"),
        None,
        "decided while the child LIST was still held"
    );

    release.send(true)?;
    let first = wait_for("`seen` decided by the restarted host", WAIT, || async {
        let object = api.get_opt("seen").await.ok().flatten()?;
        status_number(&object, "firstObservedChildren")
    })
    .await?;
    assert_eq!(
        first, 1,
        "the first decision after the start saw {first} children; the child cache was not synced"
    );
    wait_for("/readyz ok once synced", WAIT, || async {
        let (code, _) = get(&format!("http://{admin}/readyz")).await.ok()?;
        (code == 200).then_some(())
    })
    .await?;
    release_finalizers(host, &api, &["seen"]).await;
    Ok(())
}

/// The value of the series `series` (name and labels, as rendered) on the host's metrics.
fn metric(running: &Running, series: &str) -> u64 {
    running
        .metrics
        .render()
        .lines()
        .find(|l| {
            l.strip_prefix(series)
                .is_some_and(|rest| rest.starts_with(' '))
        })
        .and_then(|l| l.rsplit(' ').next())
        .and_then(|n| n.parse().ok())
        .unwrap_or(0)
}

/// A plugin keeps state in status (Redis' primary, etcd's members) and acts on it in its
/// decision (a promotion is sent before the status that records it). A decision on a view
/// older than the host's own status write would act again on the state before it: the Redis
/// suite saw two replicas promoted one after the other, each told to follow the other. The
/// host's parent cache lags its own writes by one watch event, and any other trigger (a child
/// changing) can come first; the host then waits for its write instead of deciding.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn no_decision_on_a_parent_view_older_than_the_hosts_own_status_write() -> anyhow::Result<()>
{
    init_logging();
    let env = shared_node().await?;
    let client = env.client().await?;
    let Forgotten {
        namespace,
        settings,
        api,
    } = decided_then_forgotten(env, "own-write", "written").await?;

    // A host whose parent cache keeps the parent as listed: without status.
    let (release, released) = watch::channel(false);
    let held = Arc::new(AtomicUsize::new(0));
    let lagging = client_holding(env, parent_watch, released, held.clone()).await?;
    let host = HostUnderTest::start_with_client(lagging, settings).await?;
    wait_for("the status written by the host", WAIT, || async {
        let object = api.get_opt("written").await.ok().flatten()?;
        status_number(&object, "observedChildren")
    })
    .await?;
    anyhow::ensure!(
        held.load(Ordering::SeqCst) >= 1,
        "the host's parent watch was not held"
    );
    // A child change triggers the parent while its cached view is the one the write replaced.
    let children: Api<ConfigMap> = Api::namespaced(client.clone(), &namespace);
    children
        .patch(
            "written-out",
            &PatchParams::default(),
            &Patch::Merge(json!({ "metadata": { "annotations": { "e2e/touched": "1" } } })),
        )
        .await?;
    wait_for("a reconcile on the superseded view", WAIT, || async {
        let running = &host.running;
        (deferred(running) + failures(running, "StaleView") >= 1).then_some(())
    })
    .await?;
    assert_eq!(
        failures(&host.running, "StaleView"),
        0,
        "the host decided on a view its own status write had superseded"
    );
    assert_eq!(
        decisions(&host.running),
        1,
        "decisions while the view was stale"
    );

    // Once the parent as written reaches the cache, the host decides again (and finds its
    // status already written).
    release.send(true)?;
    children
        .patch(
            "written-out",
            &PatchParams::default(),
            &Patch::Merge(json!({ "metadata": { "annotations": { "e2e/touched": "2" } } })),
        )
        .await?;
    wait_for(
        "a decision on the view with the written status",
        WAIT,
        || async { (decisions(&host.running) >= 2).then_some(()) },
    )
    .await?;
    assert_eq!(failures(&host.running, "StaleView"), 0);
    release_finalizers(host, &api, &["written"]).await;
    Ok(())
}

/// The number in `policy_host_reconciles_total{policy="misbehaving"}`.
fn reconciles(running: &Running) -> u64 {
    metric(
        running,
        "policy_host_reconciles_total{policy=\"misbehaving\"}",
    )
}

/// The number of failed reconciles of the test plugin with `reason`.
fn failures(running: &Running, reason: &str) -> u64 {
    metric(
        running,
        &format!(
            "policy_host_reconcile_errors_total{{policy=\"misbehaving\",reason=\"{reason}\"}}"
        ),
    )
}

/// How many times the test plugin decided.
fn decisions(running: &Running) -> u64 {
    metric(
        running,
        "policy_host_decision_duration_seconds_count{policy=\"misbehaving\"}",
    )
}

/// Reconciles that waited for the host's own write to the parent to reach its cache.
fn deferred(running: &Running) -> u64 {
    metric(
        running,
        "policy_host_reconciles_deferred_total{policy=\"misbehaving\"}",
    )
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn looping_parents_do_not_starve_the_other_parents_of_their_policy() -> anyhow::Result<()> {
    init_logging();
    let env = shared_node().await?;
    let client = env.client().await?;
    install_crd_object(&client, probe_crd()?).await?;
    let namespace = env.create_namespace("off-task").await?;
    let plugin = policy_host_test_plugins::build("misbehaving-policy")
        .map_err(|e| anyhow::anyhow!("{e}"))?;
    // Each decision may run 8 s: a looping parent holds its decision that long.
    let limits = Limits {
        deadline: Duration::from_secs(8),
        ..Limits::default()
    };
    let api: Api<DynamicObject> = Api::namespaced_with(client.clone(), &namespace, &probes());
    // Every parent carries the finalizer already, so the first reconcile of each decides.
    let with_finalizer = |name: &str, behaviour: &str| {
        let mut object = probe(name, behaviour);
        object["metadata"]["finalizers"] = json!(["policy-host.io/misbehaving"]);
        object
    };
    // As many looping parents as the runtime has worker threads (2, as in a Pod with 2 CPUs):
    // run on the workers, their loops would leave none for anything else.
    let loopers = ["spins-1", "spins-2"];
    for name in loopers {
        api.patch(
            name,
            &PatchParams::apply("e2e").force(),
            &Patch::Apply(&with_finalizer(name, "loop")),
        )
        .await?;
    }
    let host = HostUnderTest::start(env, &[plugin], &namespace, limits).await?;
    // Their first loops may still be instantiating when the counter moves; their retries
    // after the first deadline loop at once: once both retries have started, two decisions
    // are looping.
    wait_for("the first looping decisions stopped", WAIT, || async {
        (failures(&host.running, "PluginDeadlineExceeded") >= 2).then_some(())
    })
    .await?;
    let before_retries = reconciles(&host.running);
    wait_for("both looping decisions retried", WAIT, || async {
        (reconciles(&host.running) >= before_retries + 2).then_some(())
    })
    .await?;
    let failed_before = failures(&host.running, "PluginDeadlineExceeded");

    api.patch(
        "quick",
        &PatchParams::apply("e2e").force(),
        &Patch::Apply(&with_finalizer("quick", "ok")),
    )
    .await?;
    wait_for("`quick` decided", WAIT, || async {
        let object = api.get_opt("quick").await.ok().flatten()?;
        status_number(&object, "observedChildren")
    })
    .await?;
    assert_eq!(
        failures(&host.running, "PluginDeadlineExceeded"),
        failed_before,
        "`quick` was decided only after the looping decisions hit their 8 s deadline"
    );
    let mut names = loopers.to_vec();
    names.push("quick");
    release_finalizers(host, &api, &names).await;
    Ok(())
}

/// Events on the object called `name`.
async fn events_for(events: &Api<Event>, name: &str) -> Vec<Event> {
    events
        .list(&ListParams::default())
        .await
        .map(|l| l.items)
        .unwrap_or_default()
        .into_iter()
        .filter(|e| e.regarding.as_ref().and_then(|r| r.name.as_deref()) == Some(name))
        .collect()
}

async fn wait_gone(api: &Api<DynamicObject>, name: &str) -> anyhow::Result<()> {
    wait_for(&format!("`{name}` deleted"), WAIT, || async {
        api.get_opt(name)
            .await
            .ok()
            .and_then(|o| o.is_none().then_some(()))
    })
    .await?;
    Ok(())
}

async fn wait_finalizer(
    api: &Api<DynamicObject>,
    name: &str,
    finalizer: &str,
) -> anyhow::Result<()> {
    wait_for(&format!("{finalizer} on `{name}`"), WAIT, || async {
        let object = api.get_opt(name).await.ok().flatten()?;
        object
            .metadata
            .finalizers?
            .iter()
            .any(|f| f == finalizer)
            .then_some(())
    })
    .await?;
    Ok(())
}

/// Settings for a host of the test plugin whose finalizers are released 2 s into a deletion.
fn short_grace(namespace: &str, plugin: Option<std::path::PathBuf>) -> anyhow::Result<Settings> {
    let mut settings = HostUnderTest::settings(namespace, Limits::default())?;
    settings.controller.finalizer_grace = Duration::from_secs(2);
    settings.policy_files = plugin.into_iter().collect();
    Ok(settings)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_parent_left_by_a_renamed_plugin_is_finalized_by_its_successor() -> anyhow::Result<()> {
    init_logging();
    let env = shared_node().await?;
    let client = env.client().await?;
    install_crd_object(&client, probe_crd()?).await?;
    let namespace = env.create_namespace("renamed").await?;
    let plugin = policy_host_test_plugins::build("misbehaving-policy")
        .map_err(|e| anyhow::anyhow!("{e}"))?;
    let api: Api<DynamicObject> = Api::namespaced_with(client.clone(), &namespace, &probes());

    // A parent finalized by a plugin called `misbehaving-old` (no host runs it any more) is
    // deleted: it waits, Terminating.
    apply_probe(&api, "legacy", "ok").await?;
    let patch = json!({ "metadata": { "finalizers": ["policy-host.io/misbehaving-old"] } });
    api.patch("legacy", &PatchParams::default(), &Patch::Merge(&patch))
        .await?;
    api.delete("legacy", &DeleteParams::default()).await?;
    let terminating = api.get("legacy").await?;
    assert!(terminating.metadata.deletion_timestamp.is_some());

    // The plugin under its new name reconciles the kind: it finalizes the parent in the old
    // one's stead, and the parent goes. The grace is long: this is no release by timeout.
    let settings = Settings {
        policy_files: vec![plugin],
        ..HostUnderTest::settings(&namespace, Limits::default())?
    };
    let host = HostUnderTest::start_with(env, settings).await?;
    wait_gone(&api, "legacy").await?;

    // A live parent carrying the old finalizer swaps it for the new one.
    apply_probe(&api, "live", "ok").await?;
    wait_finalizer(&api, "live", "policy-host.io/misbehaving").await?;
    let patch = json!({ "metadata": { "finalizers": ["policy-host.io/misbehaving", "policy-host.io/misbehaving-old"] } });
    api.patch("live", &PatchParams::default(), &Patch::Merge(&patch))
        .await?;
    wait_for("the old finalizer swapped out of `live`", WAIT, || async {
        let object = api.get_opt("live").await.ok().flatten()?;
        (object.metadata.finalizers? == vec!["policy-host.io/misbehaving".to_string()])
            .then_some(())
    })
    .await?;
    api.delete("live", &DeleteParams::default()).await?;
    wait_gone(&api, "live").await?;
    host.stop().await;
    Ok(())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_parent_whose_finalize_keeps_trapping_is_released_after_the_grace() -> anyhow::Result<()>
{
    init_logging();
    let env = shared_node().await?;
    let client = env.client().await?;
    install_crd_object(&client, probe_crd()?).await?;
    let namespace = env.create_namespace("finalize-trap").await?;
    let plugin = policy_host_test_plugins::build("misbehaving-policy")
        .map_err(|e| anyhow::anyhow!("{e}"))?;
    let host = HostUnderTest::start_with(env, short_grace(&namespace, Some(plugin))?).await?;
    let api: Api<DynamicObject> = Api::namespaced_with(client.clone(), &namespace, &probes());
    let object = json!({
        "apiVersion": "test.policy-host.io/v1", "kind": "Probe",
        "metadata": { "name": "stuck" }, "spec": { "behaviour": "ok", "finalize": "trap" }
    });
    api.patch(
        "stuck",
        &PatchParams::apply("e2e").force(),
        &Patch::Apply(&object),
    )
    .await?;
    wait_finalizer(&api, "stuck", "policy-host.io/misbehaving").await?;
    api.delete("stuck", &DeleteParams::default()).await?;
    wait_gone(&api, "stuck").await?;
    let events: Api<Event> = Api::namespaced(client.clone(), &namespace);
    let released = wait_for("a FinalizerReleased event on `stuck`", WAIT, || async {
        events_for(&events, "stuck")
            .await
            .into_iter()
            .find(|e| e.reason.as_deref() == Some("FinalizerReleased"))
    })
    .await?;
    assert_eq!(released.type_.as_deref(), Some("Warning"));
    let note = released.note.unwrap_or_default();
    assert!(
        note.contains("kept failing") && note.contains("PluginCrashed"),
        "{note}"
    );
    host.stop().await;
    Ok(())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn parents_and_their_namespace_are_deleted_after_their_plugin_is_unloaded()
-> anyhow::Result<()> {
    init_logging();
    let env = shared_node().await?;
    let client = env.client().await?;
    install_crd_object(&client, probe_crd()?).await?;
    let namespace = env.create_namespace("unloaded").await?;
    let component = std::fs::read(
        policy_host_test_plugins::build("misbehaving-policy")
            .map_err(|e| anyhow::anyhow!("{e}"))?,
    )?;
    let settings = Settings {
        plugin_namespace: Some(namespace.to_string()),
        ..short_grace(&namespace, None)?
    };
    let host = HostUnderTest::start_with(env, settings).await?;
    let config_maps: Api<ConfigMap> = Api::namespaced(client.clone(), &namespace);
    let pack = pack::to_config_map(
        &component,
        &PackOptions {
            name: "plugin-probe".into(),
            ..Default::default()
        },
    )?;
    config_maps
        .patch(
            "plugin-probe",
            &PatchParams::apply("e2e").force(),
            &Patch::Apply(&pack),
        )
        .await?;
    let api: Api<DynamicObject> = Api::namespaced_with(client.clone(), &namespace, &probes());
    for name in ["orphan", "in-namespace"] {
        apply_probe(&api, name, "ok").await?;
        wait_finalizer(&api, name, "policy-host.io/misbehaving").await?;
    }

    // The plugin is unloaded; nothing reconciles Probes any more.
    config_maps
        .delete("plugin-probe", &DeleteParams::default())
        .await?;
    let store = host.running.store.clone();
    wait_for("the plugin unloaded", WAIT, || async {
        store.get("misbehaving").is_none().then_some(())
    })
    .await?;

    // Its parent is deleted: after the grace the finalizer is released, with a Warning.
    api.delete("orphan", &DeleteParams::default()).await?;
    wait_gone(&api, "orphan").await?;
    let events: Api<Event> = Api::namespaced(client.clone(), &namespace);
    let released = wait_for("a FinalizerReleased event on `orphan`", WAIT, || async {
        events_for(&events, "orphan")
            .await
            .into_iter()
            .find(|e| e.reason.as_deref() == Some("FinalizerReleased"))
    })
    .await?;
    assert_eq!(released.type_.as_deref(), Some("Warning"));

    // Its namespace is deleted with a parent still in it: the namespace goes too.
    let namespaces: Api<Namespace> = Api::all(client.clone());
    namespaces
        .delete(&namespace, &DeleteParams::default())
        .await?;
    wait_for(&format!("namespace {namespace} deleted"), WAIT, || async {
        namespaces
            .get_opt(&namespace)
            .await
            .ok()
            .and_then(|n| n.is_none().then_some(()))
    })
    .await?;
    host.stop().await;
    Ok(())
}
