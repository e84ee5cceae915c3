//! Two shards against one cluster: every parent is reconciled by the one shard it belongs to
//! (by the hash of its namespace and name, or by the admin's `policy-host.io/shard` label); a
//! parent whose label moves it is left by the old shard and taken by the new one; and when a
//! shard's leader dies, that shard's standby takes over within the lease duration while the
//! other shard goes on. Real kube-apiserver, real Leases (one per shard), the misbehaving test
//! plugin in its `ok` behaviour (applies `<parent>-out`, sets status, on every reconcile). A
//! decision the host already carried out sends nothing (an unchanged apply is skipped, an
//! unchanged status not written), so each change below bumps the spec's generation, which the
//! plugin records in status: a reconcile of a change always writes.
//!
//! Which host wrote for which parent is read from each host's own API requests
//! ([`policy_host_e2e::writes`]): a write for a parent is one to the parent itself (its
//! finalizer), its status, or its `<parent>-out`.
//!
//! Each shard caches only its own parents' children: the host labels every child with its
//! parent's shard (`policy-host.io/owner-shard`), and a moved parent's children are labelled
//! for the new shard, the same objects, before it decides.
//!
//! A parent moved while its old shard decides (an app-call held open by a fake pod the test
//! serves) gets no write from the old shard: its decision is not carried out.

use std::collections::BTreeSet;
use std::time::{Duration, Instant};

use k8s_openapi::api::coordination::v1::Lease;
use k8s_openapi::api::core::v1::ConfigMap;
use kube::ResourceExt;
use kube::api::{Api, DynamicObject, Patch, PatchParams};
use policy_host::decide::Limits;
use policy_host::leader::LeaseSettings;
use policy_host::shard::{CHILD_SHARD_LABEL, CHILDREN_SHARD_ANNOTATION, SHARD_LABEL, Shard};
use policy_host_e2e::etcd::eventually;
use policy_host_e2e::writes::Writes;
use policy_host_e2e::{HostUnderTest, init_logging, install_crd_object, probe_crd, probes};
use policy_host_testenv::{TestEnv, shared_node};
use serde_json::json;

const WAIT: Duration = Duration::from_secs(90);
/// The base Lease name; each shard elects through `policy-host-shard-<i>`.
const LEASE: &str = "policy-host";
const SHARDS: u32 = 2;
/// Parents assigned by hash, per shard.
const HASHED_PER_SHARD: usize = 3;

/// One replica of one shard, and the writes it sent.
struct Replica {
    name: &'static str,
    host: HostUnderTest,
    writes: Writes,
}

async fn start(
    env: &TestEnv,
    namespace: &str,
    identity: &'static str,
    shard: u32,
    plugin: &std::path::Path,
) -> anyhow::Result<Replica> {
    start_with(env, namespace, identity, shard, plugin, Limits::default()).await
}

/// [`start`] with the plugin's `limits`.
async fn start_with(
    env: &TestEnv,
    namespace: &str,
    identity: &'static str,
    shard: u32,
    plugin: &std::path::Path,
    limits: Limits,
) -> anyhow::Result<Replica> {
    let writes = Writes::default();
    let client = writes.client(env).await?;
    let base = HostUnderTest::settings(namespace, limits)?;
    let settings = policy_host::Settings {
        policy_files: vec![plugin.to_path_buf()],
        // The base name: the host elects through this shard's own Lease.
        leader_election: Some(LeaseSettings::new(namespace, LEASE, identity)),
        controller: policy_host::controller::ControllerOptions {
            shard: Shard::new(shard, SHARDS)?,
            ..base.controller.clone()
        },
        ..base
    };
    let host = HostUnderTest::start_with_client(client, settings).await?;
    Ok(Replica {
        name: identity,
        host,
        writes,
    })
}

async fn holder(leases: &Api<Lease>, name: &str) -> Option<String> {
    leases
        .get_opt(name)
        .await
        .ok()
        .flatten()?
        .spec?
        .holder_identity
}

async fn wait_leading(replica: &Replica, timeout: Duration) -> anyhow::Result<Duration> {
    let started = Instant::now();
    eventually(&format!("{} leads", replica.name), timeout, || async {
        if replica.host.running.leadership.is_leader() {
            Ok(started.elapsed())
        } else {
            Err("standing by".to_string())
        }
    })
    .await
}

/// A parent and the shard it must be reconciled by.
struct Parent {
    name: String,
    label: Option<u32>,
    shard: u32,
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn each_parent_is_reconciled_by_exactly_one_shard_and_a_dead_shard_leader_hands_over()
-> anyhow::Result<()> {
    init_logging();
    let env = shared_node().await?;
    let client = env.client().await?;
    install_crd_object(&client, probe_crd()?).await?;
    let namespace = env.create_namespace("shards").await?;
    let plugin = policy_host_test_plugins::build("misbehaving-policy")
        .map_err(|e| anyhow::anyhow!("{e}"))?;
    let leases: Api<Lease> = Api::namespaced(client.clone(), &namespace);
    let probes_api: Api<DynamicObject> =
        Api::namespaced_with(client.clone(), &namespace, &probes());
    let config_maps: Api<ConfigMap> = Api::namespaced(client.clone(), &namespace);
    let apply_probe = |name: String, label: Option<u32>, round: u32| {
        let probes_api = probes_api.clone();
        async move {
            let labels = label.map_or(json!({}), |shard| json!({ SHARD_LABEL: shard.to_string() }));
            let object = json!({
                "apiVersion": "test.policy-host.io/v1", "kind": "Probe",
                "metadata": { "name": name, "labels": labels },
                "spec": { "behaviour": "ok", "round": round }
            });
            probes_api
                .patch(
                    &name,
                    &PatchParams::apply("e2e").force(),
                    &Patch::Apply(&object),
                )
                .await
        }
    };

    // The parents: HASHED_PER_SHARD per shard by hash (the namespace's name is random, so the
    // names are picked by the host's own assignment), and one per shard pinned by label to
    // the shard its hash does not choose, so the label visibly wins.
    let any = Shard::new(0, SHARDS)?;
    let mut parents: Vec<Parent> = Vec::new();
    let mut hashed = [0usize; SHARDS as usize];
    let mut pinned = [false; SHARDS as usize];
    for n in 0.. {
        if hashed.iter().all(|&h| h == HASHED_PER_SHARD) && pinned.iter().all(|&p| p) {
            break;
        }
        let name = format!("p{n}");
        let by_hash = any.assign(&namespace, &name, None).shard;
        let other = (by_hash + 1) % SHARDS;
        if !pinned[other as usize] {
            pinned[other as usize] = true;
            parents.push(Parent {
                name,
                label: Some(other),
                shard: other,
            });
        } else if hashed[by_hash as usize] < HASHED_PER_SHARD {
            hashed[by_hash as usize] += 1;
            parents.push(Parent {
                name,
                label: None,
                shard: by_hash,
            });
        }
    }

    // Shard 0: a leader and a standby; shard 1: a leader. Each shard has its own Lease.
    let a0 = start(env, &namespace, "shard0-a", 0, &plugin).await?;
    let a1 = start(env, &namespace, "shard1-a", 1, &plugin).await?;
    wait_leading(&a0, WAIT).await?;
    wait_leading(&a1, WAIT).await?;
    let b0 = start(env, &namespace, "shard0-b", 0, &plugin).await?;
    assert_eq!(
        holder(&leases, "policy-host-shard-0").await.as_deref(),
        Some("shard0-a")
    );
    assert_eq!(
        holder(&leases, "policy-host-shard-1").await.as_deref(),
        Some("shard1-a")
    );
    assert!(
        leases.get_opt(LEASE).await?.is_none(),
        "a sharded host elected through the unsharded Lease"
    );

    for parent in &parents {
        apply_probe(parent.name.clone(), parent.label, 1).await?;
    }
    eventually("every parent reconciled", WAIT, || async {
        let mut waiting = Vec::new();
        for parent in &parents {
            let out = config_maps
                .get_opt(&format!("{}-out", parent.name))
                .await
                .map_err(|e| e.to_string())?;
            let probe = probes_api
                .get(&parent.name)
                .await
                .map_err(|e| e.to_string())?;
            if out.is_none() || probe.data.get("status").is_none() {
                waiting.push(parent.name.clone());
            }
        }
        if waiting.is_empty() {
            Ok(())
        } else {
            Err(format!("not yet: {waiting:?}"))
        }
    })
    .await?;
    let leaders = [&a0, &a1];
    // Each shard's child cache holds its own parents' children (one `-out` each), none of the
    // other shard's: the children carry their parent's shard, and the watches select on it.
    let children_held = "policy_host_cache_objects{policy=\"misbehaving\",cache=\"configmaps.v1\"}";
    let held = |shard: u32, moved: Option<&str>| {
        let owned = parents
            .iter()
            .filter(|p| {
                let on = if Some(p.name.as_str()) == moved {
                    1
                } else {
                    p.shard
                };
                on == shard
            })
            .count() as u64;
        let replica = leaders[shard as usize];
        async move {
            eventually(
                &format!("shard {shard} caches the {owned} children of its parents only"),
                WAIT,
                || async {
                    match metric(&replica.host.running, children_held) {
                        n if n == owned => Ok(()),
                        n => Err(format!("it holds {n}")),
                    }
                },
            )
            .await
        }
    };
    held(0, None).await?;
    held(1, None).await?;
    for parent in &parents {
        let out = config_maps.get(&format!("{}-out", parent.name)).await?;
        assert_eq!(
            out.labels().get(CHILD_SHARD_LABEL).map(String::as_str),
            Some(format!("{}-of-{SHARDS}", parent.shard).as_str()),
            "{}-out is labelled with its parent's shard",
            parent.name
        );
    }
    for parent in &parents {
        let writers: BTreeSet<&str> = [&a0, &a1, &b0]
            .iter()
            .filter(|r| r.writes.for_probe(&parent.name) > 0)
            .map(|r| r.name)
            .collect();
        assert_eq!(
            writers,
            BTreeSet::from([leaders[parent.shard as usize].name]),
            "{} (label {:?}) must be reconciled by shard {} alone",
            parent.name,
            parent.label,
            parent.shard
        );
    }
    assert!(
        !b0.host.running.leadership.is_leader(),
        "two replicas of shard 0 lead at once"
    );

    // The admin moves a shard-0 parent to shard 1 with the label: shard 1 takes it and
    // reconciles each of its next changes; shard 0 starts no reconcile of it any more. One
    // reconcile shard 0 had in flight at the move may still finish (at most its `-out` apply
    // and its status, 2 writes); a shard 0 still reconciling the parent would write on each
    // of the 4 changes.
    let moved = parents
        .iter()
        .find(|p| p.shard == 0 && p.label.is_none())
        .map(|p| p.name.clone())
        .ok_or_else(|| anyhow::anyhow!("no hashed parent on shard 0"))?;
    assert_eq!(a1.writes.for_probe(&moved), 0);
    let moved_out = format!("{moved}-out");
    let uid_before_move = config_maps.get(&moved_out).await?.uid();
    let a0_before_move = a0.writes.len();
    for round in 1..=4 {
        let a1_mark = a1.writes.len();
        apply_probe(moved.clone(), Some(1), round).await?;
        eventually(
            &format!("shard 1 reconciles the moved parent's change {round}"),
            WAIT,
            || async {
                match a1.writes.for_probe_since(&moved, a1_mark) {
                    0 => Err("not yet".to_string()),
                    _ => Ok(()),
                }
            },
        )
        .await?;
    }
    // Its child followed it: the same object, labelled for shard 1 and cached there, gone from
    // shard 0's cache; the parent records that its children are shard 1's.
    let out = config_maps.get(&moved_out).await?;
    assert_eq!(
        out.uid(),
        uid_before_move,
        "{moved_out} was recreated, not relabelled"
    );
    assert_eq!(
        out.labels().get(CHILD_SHARD_LABEL).map(String::as_str),
        Some("1-of-2")
    );
    let probe = probes_api.get(&moved).await?;
    assert_eq!(
        probe
            .annotations()
            .get(CHILDREN_SHARD_ANNOTATION)
            .map(String::as_str),
        Some("1-of-2")
    );
    held(0, Some(&moved)).await?;
    held(1, Some(&moved)).await?;
    let a0_after_move = a0.writes.for_probe_since(&moved, a0_before_move);
    assert!(
        a0_after_move <= 2,
        "shard 0 wrote {a0_after_move} times for {moved} after its label moved it to shard 1"
    );

    // Shard 0's leader dies without a word: its standby takes shard 0 within the lease
    // duration and reconciles shard 0's parents; shard 1 is untouched.
    let (a1_mark, b0_mark) = (a1.writes.len(), b0.writes.len());
    assert_eq!(b0_mark, 0, "the standby wrote while it stood by");
    let died = Instant::now();
    a0.host.kill();
    let takeover = wait_leading(&b0, Duration::from_secs(30)).await?;
    println!("figure: shard 0's leader killed -> its standby leads took {takeover:?}");
    assert_eq!(
        holder(&leases, "policy-host-shard-0").await.as_deref(),
        Some("shard0-b")
    );
    let shard0: Vec<&Parent> = parents
        .iter()
        .filter(|p| p.shard == 0 && p.name != moved)
        .collect();
    eventually(
        "shard 0's standby reconciles shard 0's parents",
        WAIT,
        || async {
            let waiting: Vec<&str> = shard0
                .iter()
                .filter(|p| b0.writes.for_probe(&p.name) == 0)
                .map(|p| p.name.as_str())
                .collect();
            if waiting.is_empty() {
                Ok(())
            } else {
                Err(format!("not yet: {waiting:?}"))
            }
        },
    )
    .await?;
    println!(
        "figure: shard 0's leader killed -> every shard-0 parent reconciled by the standby after {:?}",
        died.elapsed()
    );
    // Since the kill: shard 0's parents written by its standby alone, shard 1's (and the
    // moved one) by shard 1 alone.
    let since_kill = [(&b0, b0_mark), (&a1, a1_mark)];
    for parent in &parents {
        let owner = usize::from(parent.shard == 1 || parent.name == moved);
        let (other, mark) = since_kill[1 - owner];
        assert_eq!(
            other.writes.for_probe_since(&parent.name, mark),
            0,
            "{} wrote for {}, a parent of {}",
            other.name,
            parent.name,
            since_kill[owner].0.name
        );
    }
    assert!(
        a1.host.running.leadership.is_leader(),
        "shard 1 lost its leader when shard 0's died"
    );
    assert_eq!(
        holder(&leases, "policy-host-shard-1").await.as_deref(),
        Some("shard1-a")
    );

    // The probes carry the plugin's finalizer: stop the hosts, then let the namespace go.
    b0.host.stop().await;
    a1.host.stop().await;
    for parent in &parents {
        let _ = probes_api
            .patch(
                &parent.name,
                &PatchParams::default(),
                &Patch::Merge(&json!({ "metadata": { "finalizers": null } })),
            )
            .await;
    }
    Ok(())
}

/// The value of a series of an in-process host's metrics (0 when absent).
fn metric(running: &policy_host::Running, series: &str) -> u64 {
    running
        .metrics
        .render()
        .lines()
        .find_map(|l| {
            l.strip_prefix(series)?
                .strip_prefix(' ')?
                .parse::<f64>()
                .ok()
        })
        .map_or(0, |v| v as u64)
}

/// A Node no kubelet runs: the fake pod bound to it is left alone (the test kubelet runs only
/// pods of its own node).
const IDLE_NODE: &str = "sharding-idle-node";

/// A parent whose label moves it to another shard while the old shard's plugin is still
/// deciding (its app-call held open) gets nothing written by the old shard: the old shard
/// checks that the parent is still its own before the act stage (review L6). Before, the old
/// shard's status write went out beside the new shard's decision (refused only by its
/// resourceVersion; a child apply would have gone through).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_parent_moved_while_its_old_shard_decides_gets_no_write_from_the_old_shard()
-> anyhow::Result<()> {
    use k8s_openapi::api::core::v1::{Node, Pod};
    use kube::api::PostParams;
    use tokio::io::{AsyncReadExt, AsyncWriteExt};

    init_logging();
    let env = shared_node().await?;
    let client = env.client().await?;
    install_crd_object(&client, probe_crd()?).await?;
    let namespace = env.create_namespace("shard-move").await?;
    let plugin = policy_host_test_plugins::build("misbehaving-policy")
        .map_err(|e| anyhow::anyhow!("{e}"))?;
    let nodes: Api<Node> = Api::all(client.clone());
    if nodes.get_opt(IDLE_NODE).await?.is_none() {
        let node: Node = serde_json::from_value(json!({
            "apiVersion": "v1", "kind": "Node", "metadata": { "name": IDLE_NODE },
        }))?;
        // Another run may have created it meanwhile.
        let _ = nodes.create(&PostParams::default(), &node).await;
    }

    // The parent's pod `own-0`, served here: each call is held until the test lets it go.
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await?;
    let port = listener.local_addr()?.port();
    let (accepted_tx, mut accepted) = tokio::sync::mpsc::unbounded_channel::<()>();
    let (release_tx, release) = tokio::sync::watch::channel(false);
    let server = tokio::spawn(async move {
        while let Ok((mut socket, _)) = listener.accept().await {
            let _ = accepted_tx.send(());
            let mut release = release.clone();
            tokio::spawn(async move {
                // The request's head (a GET has no body), then the answer once let go.
                let mut head = Vec::new();
                let mut buffer = [0u8; 1024];
                while !head.windows(4).any(|w| w == b"\r\n\r\n") {
                    match socket.read(&mut buffer).await {
                        Ok(0) | Err(_) => return,
                        Ok(read) => head.extend_from_slice(&buffer[..read]),
                    }
                }
                let _ = release.wait_for(|go| *go).await;
                let _ = socket
                    .write_all(
                        b"HTTP/1.1 200 OK\r\ncontent-length: 2\r\nconnection: close\r\n\r\nok",
                    )
                    .await;
                let _ = socket.shutdown().await;
            });
        }
    });

    // Shard 0's decision must still be deciding when the parent moves, however slow the machine:
    // each app-call gives up after 5 s (the host's app-call timeout), so the plugin calls
    // again and again (`calls`), each call held, within a deadline long enough for all of
    // them. With one call and the default 10 s deadline, a loaded CI run moved the parent after
    // the call had timed out, and shard 0 wrote that decision while still the parent's shard.
    let limits = Limits {
        deadline: Duration::from_secs(180),
        ..Limits::default()
    };
    let a0 = start_with(env, &namespace, "move-shard0", 0, &plugin, limits.clone()).await?;
    let a1 = start_with(env, &namespace, "move-shard1", 1, &plugin, limits).await?;
    wait_leading(&a0, WAIT).await?;
    wait_leading(&a1, WAIT).await?;
    let probes_api: Api<DynamicObject> =
        Api::namespaced_with(client.clone(), &namespace, &probes());
    let object = json!({
        "apiVersion": "test.policy-host.io/v1", "kind": "Probe",
        "metadata": { "name": "mover", "labels": { SHARD_LABEL: "0" } },
        "spec": { "behaviour": "call-own", "calls": 30 }
    });
    probes_api
        .patch(
            "mover",
            &PatchParams::apply("e2e").force(),
            &Patch::Apply(&object),
        )
        .await?;
    // Decided once without its pod (the call finds none), by shard 0.
    eventually("`mover` decided by shard 0", WAIT, || async {
        let probe = probes_api.get("mover").await.map_err(|e| e.to_string())?;
        probe.data["status"]["appCall"]
            .as_str()
            .map(|_| ())
            .ok_or_else(|| "no status yet".to_string())
    })
    .await?;
    let uid = probes_api
        .get("mover")
        .await?
        .metadata
        .uid
        .unwrap_or_default();
    let pods: Api<Pod> = Api::namespaced(client.clone(), &namespace);
    let pod: Pod = serde_json::from_value(json!({
        "apiVersion": "v1", "kind": "Pod",
        "metadata": {
            "name": "own-0",
            // Made by the test, not applied by the host: it carries the parent's shard itself
            // (the shards cache only children labelled for them).
            "labels": { "policy-host.io/policy": "misbehaving", CHILD_SHARD_LABEL: "0-of-2" },
            "ownerReferences": [{ "apiVersion": "test.policy-host.io/v1", "kind": "Probe",
                "name": "mover", "uid": uid, "controller": true }],
        },
        "spec": { "nodeName": IDLE_NODE, "containers": [{ "name": "app", "image": "pause",
            "ports": [{ "name": "http", "containerPort": port }] }] },
    }))?;
    pods.create(&PostParams::default(), &pod).await?;
    pods.patch_status(
        "own-0",
        &PatchParams::default(),
        &Patch::Merge(json!({ "status": { "phase": "Running", "podIP": "127.0.0.1" } })),
    )
    .await?;

    // Shard 0 decides again with its pod, and its call is held here.
    tokio::time::timeout(WAIT, accepted.recv())
        .await
        .map_err(|_| anyhow::anyhow!("shard 0 never called `own-0`"))?;
    let since = a0.writes.len();
    let moved = json!({ "metadata": { "labels": { SHARD_LABEL: "1" } } });
    probes_api
        .patch("mover", &PatchParams::default(), &Patch::Merge(&moved))
        .await?;
    let parents_held = "policy_host_cache_objects{policy=\"misbehaving\",cache=\"parents\"}";
    eventually("shard 0 let go of `mover`", WAIT, || async {
        (metric(&a0.host.running, parents_held) == 0)
            .then_some(())
            .ok_or_else(|| "still cached".to_string())
    })
    .await?;
    release_tx.send_replace(true);

    // Shard 0's reconcile ends one way or the other; shard 1 decides.
    let abandoned = "policy_host_reconciles_abandoned_total{policy=\"misbehaving\"}";
    let stale = "policy_host_reconcile_errors_total{policy=\"misbehaving\",reason=\"StaleView\"}";
    eventually("shard 0's held reconcile ended", WAIT, || async {
        (metric(&a0.host.running, abandoned) + metric(&a0.host.running, stale) > 0)
            .then_some(())
            .ok_or_else(|| "still deciding".to_string())
    })
    .await?;
    eventually("`mover` decided by shard 1 with its pod", WAIT, || async {
        let probe = probes_api.get("mover").await.map_err(|e| e.to_string())?;
        (probe.data["status"]["appCall"] == "answered 200")
            .then_some(())
            .ok_or_else(|| format!("status {}", probe.data["status"]))
    })
    .await?;
    assert_eq!(
        a0.writes.for_probe_since("mover", since),
        0,
        "shard 0 wrote for `mover` after it moved to shard 1"
    );
    assert_eq!(metric(&a0.host.running, abandoned), 1);

    a0.host.stop().await;
    a1.host.stop().await;
    server.abort();
    let _ = probes_api
        .patch(
            "mover",
            &PatchParams::default(),
            &Patch::Merge(&json!({ "metadata": { "finalizers": null } })),
        )
        .await;
    Ok(())
}
