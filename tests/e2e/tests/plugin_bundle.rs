//! The README's "Write and load your own plugin" as a new user follows it: a plugin made from
//! the template (`cargo xtask new-plugin`), built for wasm32-wasip2, signed and bundled with
//! `policy-host pack --bundle --crd crd.yaml --sign`, and loaded with one
//! `kubectl apply --server-side` into a host that runs with only `deploy/rbac.yaml`'s rights
//! (its ServiceAccount, impersonated) and trusts only the signing key. deploy/rbac.yaml names
//! no kind of the new plugin: the bundle's ClusterRole, aggregated into the host's by
//! kube-controller-manager, is all the host needs to reconcile it.
//!
//! The plugin builds in `target/template-test` beside the template test's, so the SDK's
//! dependencies are compiled there once.

use std::path::PathBuf;
use std::process::Command;
use std::time::Duration;

use k8s_openapi::api::core::v1::ConfigMap;
use k8s_openapi::api::rbac::v1::ClusterRole;
use kube::Client;
use kube::api::{Api, DynamicObject};
use kube::discovery::ApiResource;
use policy_host::Settings;
use policy_host::decide::Limits;
use policy_host::load::trust::TrustPolicy;
use policy_host::plugin_cli::{self, PackRequest, keygen::keygen};
use policy_host_e2e::{HostUnderTest, init_logging, repo_root};
use policy_host_testenv::{TestEnv, shared_node, wait_for};

#[path = "../../../xtask/src/new_plugin.rs"]
mod new_plugin;

const WAIT: Duration = Duration::from_secs(90);
/// The host's namespace, as deploy/rbac.yaml names it (its Role for plugin ConfigMaps is there).
const HOST_NAMESPACE: &str = "policy-host";

fn kubectl(env: &TestEnv, args: &[&str]) -> anyhow::Result<String> {
    Ok(policy_host_testenv::install::run_kubectl(
        &repo_root(),
        &env.binaries().kubectl(),
        env.kubeconfig_path(),
        args,
    )?)
}

/// `cargo new-plugin`, then the component built as the guide builds it; returns the crate's
/// directory and the component.
fn new_built_plugin(name: &str) -> anyhow::Result<(PathBuf, PathBuf)> {
    let root = repo_root();
    let work = root.join("target/template-test");
    let dir = work.join(name);
    if dir.exists() {
        std::fs::remove_dir_all(&dir)?;
    }
    new_plugin::new_plugin(&root, name, &dir)?;
    let target_dir = work.join("target");
    let cargo = std::env::var("CARGO").unwrap_or_else(|_| "cargo".into());
    let status = Command::new(&cargo)
        .current_dir(&dir)
        .args([
            "build",
            "--quiet",
            "--target",
            "wasm32-wasip2",
            "--profile",
            "plugin",
        ])
        .arg("--target-dir")
        .arg(&target_dir)
        // The outer test's cargo settings are not the new plugin's.
        .env_remove("CARGO_TARGET_DIR")
        .env_remove("RUSTFLAGS")
        .status()?;
    anyhow::ensure!(
        status.success(),
        "building {} failed ({status})",
        dir.display()
    );
    let wasm = target_dir.join(format!(
        "wasm32-wasip2/plugin/{}.wasm",
        name.replace('-', "_")
    ));
    Ok((dir, wasm))
}

/// A client acting as the host's ServiceAccount, with exactly the rights RBAC gives it.
async fn service_account_client(env: &TestEnv) -> anyhow::Result<Client> {
    let mut config = env.kube_config().await?;
    config.auth_info.impersonate = Some(format!(
        "system:serviceaccount:{HOST_NAMESPACE}:policy-host"
    ));
    config.auth_info.impersonate_groups = Some(vec![
        "system:serviceaccounts".into(),
        format!("system:serviceaccounts:{HOST_NAMESPACE}"),
        "system:authenticated".into(),
    ]);
    Ok(Client::try_from(config)?)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_signed_bundle_loads_with_one_apply_into_a_host_with_only_its_own_rights()
-> anyhow::Result<()> {
    init_logging();
    let env = shared_node().await?;
    let admin = env.client().await?;
    kubectl(env, &["apply", "-f", "deploy/rbac.yaml"])?;

    let (dir, wasm) = tokio::task::spawn_blocking(|| new_built_plugin("my-app")).await??;
    let keys = tempfile::tempdir()?;
    let key = keygen(&keys.path().join("plugin-signing"))?;
    let bundle = plugin_cli::pack(
        &wasm,
        &PackRequest {
            name: Some("plugin-my-app".into()),
            sign: Some(key.private.clone()),
            bundle_crds: vec![dir.join("crd.yaml")],
            ..PackRequest::default()
        },
        &plugin_cli::host_defaults(),
    )
    .await?;
    let bundle_file = keys.path().join("my-app.yaml");
    std::fs::write(&bundle_file, &bundle)?;

    // The host as deploy/rbac.yaml runs it: its ServiceAccount's rights, plugin ConfigMaps
    // from its own namespace, and only packs signed by the admin's key.
    let namespace = env.create_namespace("bundle").await?;
    let settings = Settings {
        plugin_namespace: Some(HOST_NAMESPACE.into()),
        trust: TrustPolicy::from_files(std::slice::from_ref(&key.public))?,
        ..HostUnderTest::settings(&namespace, Limits::default())?
    };
    let host =
        HostUnderTest::start_with_client(service_account_client(env).await?, settings).await?;

    // The README's commands.
    let bundle_path = bundle_file.display().to_string();
    kubectl(
        env,
        &[
            "-n",
            HOST_NAMESPACE,
            "apply",
            "--server-side",
            "-f",
            &bundle_path,
        ],
    )?;
    kubectl(
        env,
        &[
            "wait",
            "--for",
            "condition=established",
            "crd/myapps.my-app.example.com",
        ],
    )?;
    let example = dir.join("example.yaml").display().to_string();
    kubectl(env, &["-n", &namespace, "apply", "-f", &example])?;

    // The aggregation controller folds the bundle's rules into the host's ClusterRole.
    let roles: Api<ClusterRole> = Api::all(admin.clone());
    wait_for(
        "the host's ClusterRole aggregates the bundle's",
        WAIT,
        || {
            let roles = roles.clone();
            async move {
                let role = roles.get("policy-host").await.ok()?;
                role.rules?
                    .iter()
                    .any(|r| {
                        r.resources
                            .as_ref()
                            .is_some_and(|rs| rs.iter().any(|x| x == "myapps"))
                    })
                    .then_some(())
            }
        },
    )
    .await?;

    // The plugin reconciles its parent: its ConfigMap, then Ready. (The host enforces its
    // trust policy, so the plugin loaded only because its signature checked out.)
    let myapps: Api<DynamicObject> = Api::namespaced_with(
        admin.clone(),
        &namespace,
        &ApiResource {
            group: "my-app.example.com".into(),
            version: "v1".into(),
            api_version: "my-app.example.com/v1".into(),
            kind: "MyApp".into(),
            plural: "myapps".into(),
        },
    );
    wait_for("the MyApp is Ready (ConfigMapReady)", WAIT, || {
        let myapps = myapps.clone();
        async move {
            let demo = myapps.get("demo").await.ok()?;
            (demo.data["status"]["conditions"][0]["reason"] == "ConfigMapReady").then_some(())
        }
    })
    .await?;
    let config_maps: Api<ConfigMap> = Api::namespaced(admin.clone(), &namespace);
    let made = config_maps.get("demo-config").await?;
    assert!(
        made.data.is_some_and(|d| d.contains_key("greeting")),
        "the plugin's ConfigMap carries the greeting"
    );
    host.stop().await;
    Ok(())
}
