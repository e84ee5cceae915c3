//! The `policy-host` binary stops gracefully on SIGTERM (what the kubelet sends a stopping pod;
//! as PID 1 the process gets no default handler) and on SIGINT: it exits by itself, with
//! success, and gives its leader-election Lease back so that a standby takes over at once.
//! Runs the real binary against the real control plane of `policy-host-testenv`.

use std::process::{Child, Command, Stdio};
use std::time::Duration;

use k8s_openapi::api::coordination::v1::Lease;
use k8s_openapi::apiextensions_apiserver::pkg::apis::apiextensions::v1::CustomResourceDefinition;
use kube::api::{Api, Patch, PatchParams};
use policy_host_testenv::{probe_crd, shared_node, wait_for};

const WAIT: Duration = Duration::from_secs(60);

/// Kills the child on drop if the test failed before it exited (by its PID, never by name).
struct Host(Child);

impl Drop for Host {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

async fn lease_holder(leases: &Api<Lease>) -> Option<String> {
    leases
        .get_opt("policy-host")
        .await
        .ok()
        .flatten()?
        .spec?
        .holder_identity
}

async fn leads_then_stops_on(signal: &str) -> anyhow::Result<()> {
    let env = shared_node().await?;
    let client = env.client().await?;
    let crds: Api<CustomResourceDefinition> = Api::all(client.clone());
    crds.patch(
        "probes.test.policy-host.io",
        &PatchParams::apply("policy-host-tests").force(),
        &Patch::Apply(&probe_crd()?),
    )
    .await?;
    let namespace = env.create_namespace("signals").await?;
    let plugin = policy_host_test_plugins::build("misbehaving-policy")
        .map_err(|e| anyhow::anyhow!("{e}"))?;
    let identity = format!("signals-{}", signal.to_lowercase());
    let mut host = Host(
        Command::new(env!("CARGO_BIN_EXE_policy-host"))
            .args(["run", "--policy"])
            .arg(&plugin)
            .args(["--namespace", &namespace, "--lease-namespace", &namespace])
            .args(["--admin-addr", "127.0.0.1:0"])
            .env("KUBECONFIG", env.kubeconfig_path())
            .env("POD_NAME", &identity)
            .env_remove("POD_NAMESPACE")
            .stdin(Stdio::null())
            .spawn()?,
    );
    let leases: Api<Lease> = Api::namespaced(client.clone(), &namespace);
    wait_for("the host holds the Lease", WAIT, || async {
        lease_holder(&leases)
            .await
            .filter(|h| h.starts_with(&identity))
    })
    .await?;

    let status = Command::new("kill")
        .args([format!("-{signal}"), host.0.id().to_string()])
        .status()?;
    assert!(status.success(), "kill -{signal} failed");
    let exit = wait_for("the host exits after the signal", WAIT, || {
        let exited = host.0.try_wait().ok().flatten();
        async move { exited }
    })
    .await?;
    assert!(
        exit.success(),
        "the host exited with {exit} after {signal}, not success"
    );
    assert_eq!(
        lease_holder(&leases).await,
        None,
        "the host exited without releasing the Lease"
    );
    Ok(())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn sigterm_stops_the_host_gracefully_and_releases_the_lease() -> anyhow::Result<()> {
    leads_then_stops_on("TERM").await
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn sigint_stops_the_host_gracefully_and_releases_the_lease() -> anyhow::Result<()> {
    leads_then_stops_on("INT").await
}
