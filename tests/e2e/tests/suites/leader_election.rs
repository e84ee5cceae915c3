//! Two hosts against one cluster, sharing a Lease: exactly one decides; when the leader dies
//! the standby takes over within the lease duration, and when a leader stops gracefully the
//! standby takes over within about a second. Real kube-apiserver, real Lease objects, the
//! misbehaving test plugin in its `ok` behaviour (applies `<parent>-out`, sets status); a
//! leader stopped while a reconcile waits on a slow app hands over only after that reconcile's
//! last write; then the etcd plugin with real etcd: the leader killed in the middle of a
//! scale-up, and no membership change done twice.

use std::time::{Duration, Instant};

use futures::StreamExt;
use k8s_openapi::api::coordination::v1::Lease;
use k8s_openapi::api::core::v1::{ConfigMap, Node, Pod};
use k8s_openapi::api::events::v1::Event;
use k8s_openapi::jiff::{SignedDuration, Timestamp};
use kube::ResourceExt;
use kube::api::{Api, DynamicObject, ListParams, Patch, PatchParams, PostParams};
use kube::runtime::watcher;
use policy_host::decide::Limits;
use policy_host::leader::LeaseSettings;
use policy_host_e2e::etcd::{etcd_clusters, etcd_version, eventually, pod_endpoint, run_etcdctl};
use policy_host_e2e::install_crd;
use policy_host_e2e::writes::{Write, Writes};
use policy_host_e2e::{HostUnderTest, init_logging, install_crd_object, probe_crd, probes};
use policy_host_testenv::{TestEnv, shared_node, wait_for};
use serde_json::json;
use tokio::io::{AsyncReadExt, AsyncWriteExt};

const WAIT: Duration = Duration::from_secs(90);
const LEASE: &str = "policy-host";

/// Reconciles this host has started, summed over its policies (from its own metrics).
fn reconciles(host: &HostUnderTest) -> u64 {
    host.running
        .metrics
        .render()
        .lines()
        .filter(|l| l.starts_with("policy_host_reconciles_total{"))
        .filter_map(|l| l.rsplit(' ').next()?.parse::<f64>().ok())
        .sum::<f64>() as u64
}

async fn start(
    env: &TestEnv,
    namespace: &str,
    identity: &str,
    plugin: &std::path::Path,
) -> anyhow::Result<HostUnderTest> {
    let settings = policy_host::Settings {
        policy_files: vec![plugin.to_path_buf()],
        leader_election: Some(LeaseSettings::new(namespace, LEASE, identity)),
        ..HostUnderTest::settings(namespace, Limits::default())?
    };
    HostUnderTest::start_with(env, settings).await
}

async fn holder(leases: &Api<Lease>) -> Option<String> {
    leases
        .get_opt(LEASE)
        .await
        .ok()
        .flatten()?
        .spec?
        .holder_identity
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn only_the_lease_holder_decides_and_a_standby_takes_over() -> anyhow::Result<()> {
    init_logging();
    let env = shared_node().await?;
    let client = env.client().await?;
    install_crd_object(&client, probe_crd()?).await?;
    let namespace = env.create_namespace("leader").await?;
    let plugin = policy_host_test_plugins::build("misbehaving-policy")
        .map_err(|e| anyhow::anyhow!("{e}"))?;
    let leases: Api<Lease> = Api::namespaced(client.clone(), &namespace);
    let probes_api: Api<DynamicObject> =
        Api::namespaced_with(client.clone(), &namespace, &probes());
    let config_maps: Api<ConfigMap> = Api::namespaced(client.clone(), &namespace);
    let apply_probe = |name: &'static str| {
        let probes_api = probes_api.clone();
        async move {
            let object = json!({
                "apiVersion": "test.policy-host.io/v1", "kind": "Probe",
                "metadata": { "name": name }, "spec": { "behaviour": "ok" }
            });
            probes_api
                .patch(
                    name,
                    &PatchParams::apply("e2e").force(),
                    &Patch::Apply(&object),
                )
                .await
        }
    };

    // A leads; B, started after it, stands by.
    let a = start(env, &namespace, "host-a", &plugin).await?;
    wait_for("host-a leads", WAIT, || async {
        a.running.leadership.is_leader().then_some(())
    })
    .await?;
    let b = start(env, &namespace, "host-b", &plugin).await?;
    apply_probe("first").await?;
    wait_for("first-out applied", WAIT, || async {
        config_maps.get_opt("first-out").await.ok().flatten()
    })
    .await?;
    // B has looked at the Lease at least twice by now (every second), and refrained.
    wait_for("host-b sees host-a hold the Lease", WAIT, || async {
        (holder(&leases).await.as_deref() == Some("host-a")).then_some(())
    })
    .await?;
    assert!(
        !b.running.leadership.is_leader(),
        "two replicas lead at once"
    );
    assert!(reconciles(&a) > 0, "the leader never reconciled");
    assert_eq!(
        reconciles(&b),
        0,
        "the standby reconciled beside the leader"
    );

    // A dies without a word: B takes over once the Lease expires, and only B decides after.
    let a_reconciles = reconciles(&a);
    let died = Instant::now();
    a.kill();
    wait_for(
        "host-b leads after host-a died",
        Duration::from_secs(30),
        || async { b.running.leadership.is_leader().then_some(()) },
    )
    .await?;
    let takeover = died.elapsed();
    println!("figure: leader killed -> standby leads took {takeover:?}");
    assert_eq!(holder(&leases).await.as_deref(), Some("host-b"));
    apply_probe("second").await?;
    wait_for("second-out applied by the new leader", WAIT, || async {
        config_maps.get_opt("second-out").await.ok().flatten()
    })
    .await?;
    assert!(reconciles(&b) > 0, "the new leader never reconciled");

    // B hands over gracefully to C: C leads within about a second of B's release.
    let c = start(env, &namespace, "host-c", &plugin).await?;
    wait_for("host-c stands by", WAIT, || async {
        (holder(&leases).await.as_deref() == Some("host-b")).then_some(())
    })
    .await?;
    assert!(!c.running.leadership.is_leader());
    let b_reconciles = reconciles(&b);
    b.stop().await;
    let released = Instant::now();
    wait_for(
        "host-c leads after host-b handed over",
        Duration::from_secs(10),
        || async { c.running.leadership.is_leader().then_some(()) },
    )
    .await?;
    println!(
        "figure: graceful handover -> standby leads took {:?}",
        released.elapsed()
    );
    assert_eq!(holder(&leases).await.as_deref(), Some("host-c"));
    apply_probe("third").await?;
    wait_for("third-out applied by host-c", WAIT, || async {
        config_maps.get_opt("third-out").await.ok().flatten()
    })
    .await?;
    assert!(reconciles(&c) > 0, "host-c never reconciled");
    assert!(a_reconciles > 0 && b_reconciles > 0);
    let lease = leases.get(LEASE).await?;
    assert_eq!(
        lease.spec.and_then(|s| s.lease_transitions),
        Some(2),
        "the Lease changed hands other than a -> b -> c"
    );
    c.stop().await;
    Ok(())
}

/// A Node no kubelet runs: Pods bound to it stay as the test writes them (its app-calls go to
/// an address of the test's choosing), nothing is scheduled on it, and it is never drained.
const PAPER_NODE: &str = "policy-host-e2e-paper-node";

/// How long the slow app takes to answer one app-call (under the host's 5 s app-call timeout).
const SLOW_ANSWER: Duration = Duration::from_secs(4);

/// An app on 127.0.0.1 that answers every HTTP request `SLOW_ANSWER` after it arrived; the
/// receiver counts the requests received so far.
async fn slow_app() -> anyhow::Result<(u16, tokio::sync::watch::Receiver<usize>)> {
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await?;
    let port = listener.local_addr()?.port();
    let (received_tx, received) = tokio::sync::watch::channel(0usize);
    tokio::spawn(async move {
        while let Ok((mut socket, _)) = listener.accept().await {
            let received_tx = received_tx.clone();
            tokio::spawn(async move {
                let mut request = Vec::new();
                let mut buffer = [0u8; 1024];
                loop {
                    match socket.read(&mut buffer).await {
                        Ok(0) | Err(_) => return,
                        Ok(n) => request.extend_from_slice(&buffer[..n]),
                    }
                    if request.windows(4).any(|w| w == b"\r\n\r\n") {
                        break;
                    }
                }
                received_tx.send_modify(|n| *n += 1);
                tokio::time::sleep(SLOW_ANSWER).await;
                let _ = socket
                    .write_all(b"HTTP/1.1 200 OK\r\ncontent-length: 0\r\nconnection: close\r\n\r\n")
                    .await;
            });
        }
    });
    Ok((port, received))
}

/// Makes the Pod `name`, controlled by the `Probe` `owner`, serving port `http` at
/// 127.0.0.1:`port`, Running on the paper node.
async fn paper_pod(
    client: &kube::Client,
    namespace: &str,
    name: &str,
    owner: &DynamicObject,
    port: u16,
) -> anyhow::Result<()> {
    let nodes: Api<Node> = Api::all(client.clone());
    if nodes.get_opt(PAPER_NODE).await?.is_none() {
        let node: Node = serde_json::from_value(json!({
            "apiVersion": "v1", "kind": "Node",
            "metadata": { "name": PAPER_NODE },
            "spec": { "unschedulable": true,
                "taints": [{ "key": "policy-host.io/paper-node", "effect": "NoSchedule" }] },
        }))?;
        match nodes.create(&PostParams::default(), &node).await {
            Ok(_) => {}
            Err(kube::Error::Api(status)) if status.code == 409 => {}
            Err(error) => return Err(error.into()),
        }
    }
    let pods: Api<Pod> = Api::namespaced(client.clone(), namespace);
    let pod = json!({
        "apiVersion": "v1", "kind": "Pod",
        "metadata": {
            "name": name,
            "labels": { "policy-host.io/policy": "misbehaving" },
            "ownerReferences": [{ "apiVersion": "test.policy-host.io/v1", "kind": "Probe",
                "name": owner.name_any(), "uid": owner.uid(), "controller": true }],
        },
        "spec": {
            "nodeName": PAPER_NODE,
            "tolerations": [{ "operator": "Exists" }],
            "containers": [{ "name": "app", "image": "pause",
                "ports": [{ "name": "http", "containerPort": port }] }],
        },
    });
    pods.patch(
        name,
        &PatchParams::apply("e2e").force(),
        &Patch::Apply(&pod),
    )
    .await?;
    pods.patch_status(
        name,
        &PatchParams::default(),
        &Patch::Merge(json!({ "status": {
            "phase": "Running", "podIP": "127.0.0.1", "podIPs": [{ "ip": "127.0.0.1" }],
        }})),
    )
    .await?;
    Ok(())
}

/// What one version of the Lease said: its holder and renew time.
#[derive(Clone, Debug)]
struct LeaseRecord {
    holder: Option<String>,
    renewed: Option<Timestamp>,
}

/// Review H1: a leader stopped (SIGTERM, a rollout) while a reconcile waits on a slow app keeps
/// renewing its Lease until that reconcile has written, releases it after, and only then may
/// the standby decide. Before, it stopped renewing at the signal, and the standby took the
/// Lease and wrote while the old leader's reconcile still ran and wrote after it.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_stopping_leader_keeps_the_lease_until_its_last_write() -> anyhow::Result<()> {
    /// App-calls the slow reconcile makes in a row: it outlasts the lease duration.
    const CALLS: u32 = 4;
    init_logging();
    let env = shared_node().await?;
    let client = env.client().await?;
    install_crd_object(&client, probe_crd()?).await?;
    let namespace = env.create_namespace("handover").await?;
    let plugin = policy_host_test_plugins::build("misbehaving-policy")
        .map_err(|e| anyhow::anyhow!("{e}"))?;
    let leases: Api<Lease> = Api::namespaced(client.clone(), &namespace);
    let probes_api: Api<DynamicObject> =
        Api::namespaced_with(client.clone(), &namespace, &probes());
    let config_maps: Api<ConfigMap> = Api::namespaced(client.clone(), &namespace);
    let (port, slow_requests) = slow_app().await?;

    // Every version of the Lease, as the API server served it.
    let seen: std::sync::Arc<std::sync::Mutex<Vec<LeaseRecord>>> = Default::default();
    let lease_watch = {
        let (leases, seen) = (leases.clone(), seen.clone());
        tokio::spawn(async move {
            let config = watcher::Config::default().fields(&format!("metadata.name={LEASE}"));
            let mut events = std::pin::pin!(watcher(leases, config));
            while let Some(event) = events.next().await {
                if let Ok(watcher::Event::Apply(lease) | watcher::Event::InitApply(lease)) = event {
                    let spec = lease.spec.unwrap_or_default();
                    seen.lock()
                        .unwrap_or_else(|p| p.into_inner())
                        .push(LeaseRecord {
                            holder: spec.holder_identity,
                            renewed: spec.renew_time.map(|t| t.0),
                        });
                }
            }
        })
    };

    let limits = Limits {
        deadline: Duration::from_secs(60),
        ..Limits::default()
    };
    let start = |identity: &'static str, writes: Writes| {
        let (namespace, plugin, limits) = (namespace.to_string(), plugin.clone(), limits.clone());
        async move {
            let settings = policy_host::Settings {
                policy_files: vec![plugin],
                leader_election: Some(LeaseSettings::new(namespace.as_str(), LEASE, identity)),
                ..HostUnderTest::settings(&namespace, limits)?
            };
            HostUnderTest::start_with_client(writes.client(env).await?, settings).await
        }
    };
    let (a_writes, b_writes) = (Writes::default(), Writes::default());
    let a = start("host-a", a_writes.clone()).await?;
    wait_for("host-a leads", WAIT, || async {
        a.running.leadership.is_leader().then_some(())
    })
    .await?;
    let b = start("host-b", b_writes.clone()).await?;

    // `quick` is written on every reconcile: the standby's first write, as soon as it leads.
    let apply_probe = |name: &'static str, spec: serde_json::Value| {
        let probes_api = probes_api.clone();
        async move {
            let object = json!({
                "apiVersion": "test.policy-host.io/v1", "kind": "Probe",
                "metadata": { "name": name }, "spec": spec,
            });
            probes_api
                .patch(
                    name,
                    &PatchParams::apply("e2e").force(),
                    &Patch::Apply(&object),
                )
                .await
        }
    };
    apply_probe("quick", json!({ "behaviour": "ok" })).await?;
    wait_for("quick-out applied", WAIT, || async {
        config_maps.get_opt("quick-out").await.ok().flatten()
    })
    .await?;
    // `slow` calls its pod CALLS times, each answered SLOW_ANSWER late.
    let slow = apply_probe("slow", json!({ "behaviour": "call-own", "calls": CALLS })).await?;
    paper_pod(&client, &namespace, "own-0", &slow, port).await?;
    wait_for("host-a's slow reconcile calls its app", WAIT, || async {
        (*slow_requests.borrow() >= 1).then_some(())
    })
    .await?;

    let signalled = Instant::now();
    let signalled_at = Timestamp::now();
    let a_stopped = tokio::spawn(async move {
        a.stop().await;
        Instant::now()
    });
    wait_for("host-b leads", WAIT, || async {
        b.running.leadership.is_leader().then_some(())
    })
    .await?;
    wait_for("host-b writes for quick", WAIT, || async {
        (b_writes.for_probe("quick") > 0).then_some(())
    })
    .await?;
    let a_stopped = a_stopped.await?;
    b.kill();
    lease_watch.abort();

    let parents = |writes: &Writes| -> Vec<Write> {
        writes
            .all()
            .into_iter()
            .filter(|w| !w.is_to_a_lease())
            .collect()
    };
    let (a_parents, b_parents) = (parents(&a_writes), parents(&b_writes));
    let drained = a_parents
        .iter()
        .filter(|w| w.sent > signalled && w.is_for_probe("slow"))
        .count();
    assert!(
        drained > 0,
        "host-a's slow reconcile wrote nothing after the signal: the drain is not tested"
    );
    let a_last = a_parents
        .iter()
        .map(|w| w.answered.unwrap_or(a_stopped))
        .max()
        .expect("host-a wrote");
    let b_first = b_parents
        .iter()
        .map(|w| w.sent)
        .min()
        .expect("host-b wrote");
    assert!(
        a_last < b_first,
        "host-b wrote {:?} before host-a's last write was answered: {:?} then {:?}",
        a_last - b_first,
        b_parents.first(),
        a_parents.last()
    );

    let seen = seen.lock().unwrap_or_else(|p| p.into_inner()).clone();
    let lease_duration = SignedDuration::from_secs(10);
    let renewals_by_a: Vec<Timestamp> = seen
        .iter()
        .filter(|r| r.holder.as_deref() == Some("host-a"))
        .filter_map(|r| r.renewed)
        .filter(|t| *t >= signalled_at)
        .collect();
    assert!(
        renewals_by_a
            .iter()
            .any(|t| t.duration_since(signalled_at) > lease_duration),
        "host-a did not renew the Lease through a drain longer than the lease: {seen:?}"
    );
    let first_by_b = seen
        .iter()
        .position(|r| r.holder.as_deref() == Some("host-b"))
        .expect("host-b took the Lease");
    assert!(
        first_by_b > 0 && seen[first_by_b - 1].holder.is_none(),
        "host-b took the Lease from host-a instead of after host-a released it: {seen:?}"
    );
    println!(
        "figure: stopping leader drained for {:?}, then handed over",
        a_stopped - signalled
    );
    Ok(())
}

/// `MemberAdded` Events on the cluster `name`: their notes (one per member added; a series
/// counts each repeat).
async fn members_added(events: &Api<Event>, name: &str) -> Vec<String> {
    events
        .list(&ListParams::default())
        .await
        .map(|l| l.items)
        .unwrap_or_default()
        .into_iter()
        .filter(|e| {
            e.reason.as_deref() == Some("MemberAdded")
                && e.regarding.as_ref().and_then(|r| r.name.as_deref()) == Some(name)
        })
        .flat_map(|e| {
            let times = e.series.as_ref().map_or(1, |s| s.count.max(1)) as usize;
            std::iter::repeat_n(e.note.unwrap_or_default(), times)
        })
        .collect()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_leader_killed_mid_scale_up_leaves_no_membership_change_done_twice()
-> anyhow::Result<()> {
    const NAME: &str = "handed-over";
    init_logging();
    let env = shared_node().await?;
    let client = env.client().await?;
    install_crd(&client, "deploy/crds/etcdcluster.yaml").await?;
    let namespace = env.create_namespace("leader-etcd").await?;
    let plugin =
        policy_host_test_plugins::build("guest-etcd").map_err(|e| anyhow::anyhow!("{e}"))?;
    let version = etcd_version(env, "3.6")?;
    let etcdctl = policy_host_e2e::apps::etcd_dir(env, &format!("v{version}"))
        .ok_or_else(|| anyhow::anyhow!("etcd {version} is not in the test environment"))?
        .join("etcdctl");
    let clusters: Api<DynamicObject> =
        Api::namespaced_with(client.clone(), &namespace, &etcd_clusters());
    let pods: Api<Pod> = Api::namespaced(client.clone(), &namespace);
    let events: Api<Event> = Api::namespaced(client.clone(), &namespace);
    let member_list = || async {
        let live = pods
            .list(&ListParams::default().labels(&format!("app.kubernetes.io/instance={NAME}")))
            .await
            .map_err(|e| e.to_string())?;
        let endpoints: Vec<String> = live.items.iter().filter_map(pod_endpoint).collect();
        let text = run_etcdctl(&etcdctl, &endpoints, &["member", "list", "-w", "json"]).await?;
        let list: serde_json::Value = serde_json::from_str(&text).map_err(|e| e.to_string())?;
        Ok::<Vec<serde_json::Value>, String>(
            list["members"].as_array().cloned().unwrap_or_default(),
        )
    };
    let converged = |size: usize| {
        let (clusters, member_list) = (clusters.clone(), &member_list);
        async move {
            let cluster = clusters.get(NAME).await.map_err(|e| e.to_string())?;
            let status = &cluster.data["status"];
            if status["ready"] != json!(format!("{size}/{size}")) || status["phase"] != "Running" {
                return Err(format!("status {status}"));
            }
            let members = member_list().await?;
            if members.len() != size || members.iter().any(|m| m["isLearner"] == true) {
                return Err(format!("etcd members {members:?}"));
            }
            Ok(())
        }
    };

    let a = start(env, &namespace, "host-a", &plugin).await?;
    wait_for("host-a leads", WAIT, || async {
        a.running.leadership.is_leader().then_some(())
    })
    .await?;
    let b = start(env, &namespace, "host-b", &plugin).await?;
    let cluster = json!({
        "apiVersion": "etcd.database.coreos.com/v1beta2", "kind": "EtcdCluster",
        "metadata": {"name": NAME}, "spec": {"size": 3, "version": version},
    });
    clusters
        .patch(
            NAME,
            &PatchParams::apply("e2e").force(),
            &Patch::Apply(&cluster),
        )
        .await?;
    eventually("3 members", Duration::from_secs(180), || converged(3)).await?;
    assert_eq!(
        reconciles(&b),
        0,
        "the standby reconciled beside the leader"
    );

    // Scale to 5 and kill the leader as soon as the first new member is added: the standby
    // finds the cluster mid-change and must finish it, not redo it.
    clusters
        .patch(
            NAME,
            &PatchParams::default(),
            &Patch::Merge(&json!({"spec": {"size": 5}})),
        )
        .await?;
    eventually(
        "the scale-up under way",
        Duration::from_secs(60),
        || async {
            let added = members_added(&events, NAME).await;
            if added.len() >= 3 {
                Ok(())
            } else {
                Err(format!("{added:?}"))
            }
        },
    )
    .await?;
    let died = Instant::now();
    a.kill();
    wait_for("host-b leads", Duration::from_secs(30), || async {
        b.running.leadership.is_leader().then_some(())
    })
    .await?;
    let takeover = died.elapsed();
    eventually("5 members", Duration::from_secs(180), || converged(5)).await?;
    println!(
        "figure: leader killed mid scale-up -> standby leads {takeover:?}, 5/5 after {:?}",
        died.elapsed()
    );
    assert!(
        takeover < Duration::from_secs(15),
        "takeover took {takeover:?}"
    );

    let added = members_added(&events, NAME).await;
    let members = member_list().await.map_err(anyhow::Error::msg)?;
    let names: std::collections::BTreeSet<String> = members
        .iter()
        .filter_map(|m| m["name"].as_str().map(str::to_owned))
        .collect();
    let expected: std::collections::BTreeSet<String> =
        (0..5).map(|n| format!("{NAME}-{n}")).collect();
    assert_eq!(names, expected, "etcd's members");
    assert_eq!(
        added.len(),
        4,
        "4 members added in all (2 for 3, 2 for 5), each once: {added:?}"
    );
    assert!(reconciles(&b) > 0, "the new leader never reconciled");
    b.stop().await;
    Ok(())
}
