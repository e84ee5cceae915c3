//! Two hosts against one cluster, sharing a Lease: exactly one decides; when the leader dies
//! the standby takes over within the lease duration, and when a leader stops gracefully the
//! standby takes over within about a second. Real kube-apiserver, real Lease objects, the
//! misbehaving test plugin in its `ok` behaviour (applies `<parent>-out`, sets status); then
//! the etcd plugin with real etcd: the leader killed in the middle of a scale-up, and no
//! membership change done twice.

use std::time::{Duration, Instant};

use k8s_openapi::api::coordination::v1::Lease;
use k8s_openapi::api::core::v1::{ConfigMap, Pod};
use k8s_openapi::api::events::v1::Event;
use kube::api::{Api, DynamicObject, ListParams, Patch, PatchParams};
use policy_host::decide::Limits;
use policy_host::leader::LeaseSettings;
use policy_host_e2e::etcd::{etcd_clusters, etcd_version, eventually, pod_endpoint, run_etcdctl};
use policy_host_e2e::install_crd;
use policy_host_e2e::{HostUnderTest, init_logging, install_crd_object, probe_crd, probes};
use policy_host_testenv::{TestEnv, shared_node, wait_for};
use serde_json::json;

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
    let etcdctl = env
        .binaries()
        .etcd_dir(&format!("v{version}"))
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
