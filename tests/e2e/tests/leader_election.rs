//! Two hosts against one cluster, sharing a Lease: exactly one decides; when the leader dies
//! the standby takes over within the lease duration, and when a leader stops gracefully the
//! standby takes over within about a second. Real kube-apiserver, real Lease objects, the
//! misbehaving test plugin in its `ok` behaviour (applies `<parent>-out`, sets status).

use std::time::{Duration, Instant};

use k8s_openapi::api::coordination::v1::Lease;
use k8s_openapi::api::core::v1::ConfigMap;
use kube::api::{Api, DynamicObject, Patch, PatchParams};
use policy_host::decide::Limits;
use policy_host::leader::LeaseSettings;
use policy_host_e2e::{HostUnderTest, init_logging, install_crd_object, probe_crd, probes};
use policy_host_testenv::{TestEnv, shared, wait_for};
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
    let env = shared().await?;
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
