//! The README's "Write and load your own plugin" as a new user follows it: a plugin made from
//! the template (`policy-host new-plugin`), built for wasm32-wasip2, signed and bundled with
//! `policy-host pack --bundle --crd crd.yaml --sign`, and loaded with one
//! `kubectl apply --server-side` into a host that runs with only `deploy/rbac.yaml`'s rights
//! (its ServiceAccount, impersonated) and trusts only the signing key. deploy/rbac.yaml names
//! no kind of the new plugin: the bundle's ClusterRole, aggregated into the host's by
//! kube-controller-manager, is all the host needs to reconcile it.
//!
//! The plugin builds in `target/template-test` beside the template test's, so the SDK's
//! dependencies are compiled there once.
//!
//! With the same rights, a plugin unloaded while its bundle stays leaves no parent stranded:
//! its finalizer is released after the grace (review M1). The two tests share the host
//! namespace's plugin ConfigMaps, so they run one after the other.

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

/// `policy-host new-plugin` (its code), then its native tests run and the component built as the guide does;
/// returns the crate's directory and the component.
fn new_built_plugin(name: &str) -> anyhow::Result<(PathBuf, PathBuf)> {
    let root = repo_root();
    let work = root.join("target/template-test");
    let dir = work.join(name);
    if dir.exists() {
        std::fs::remove_dir_all(&dir)?;
    }
    plugin_cli::new_plugin::new_plugin(name, &dir)?;
    let target_dir = work.join("target");
    let cargo = std::env::var("CARGO").unwrap_or_else(|_| "cargo".into());
    // The guide's steps 2 and 3: the native tests, then the component.
    for args in [
        &["test", "--quiet"][..],
        &[
            "build",
            "--quiet",
            "--target",
            "wasm32-wasip2",
            "--profile",
            "plugin",
        ],
    ] {
        let status = Command::new(&cargo)
            .current_dir(&dir)
            .args(args)
            .arg("--target-dir")
            .arg(&target_dir)
            // The outer test's cargo settings are not the new plugin's.
            .env_remove("CARGO_TARGET_DIR")
            .env_remove("RUSTFLAGS")
            .status()?;
        anyhow::ensure!(
            status.success(),
            "`cargo {}` in {} failed ({status})",
            args.join(" "),
            dir.display()
        );
    }
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

/// Held for the whole of each test: both load plugins from [`HOST_NAMESPACE`].
static ONE_AT_A_TIME: tokio::sync::Mutex<()> = tokio::sync::Mutex::const_new(());

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_signed_bundle_loads_with_one_apply_into_a_host_with_only_its_own_rights()
-> anyhow::Result<()> {
    let _one = ONE_AT_A_TIME.lock().await;
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
            // The template holds sessions with its Pods' `app` port (README: `--grant-exchange
            // app`); granting what it asks for grants that.
            grant_requested: true,
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
    // The template's example, its app Pods on the image the new plugin declares for its tests
    // (its own test-images.yaml, made and loaded by the test environment: no registry here).
    let declared = env.provide_images(&dir.join("test-images.yaml")).await?;
    let app_image = declared
        .first()
        .ok_or_else(|| anyhow::anyhow!("the new plugin's test-images.yaml declares no image"))?
        .name()
        .to_owned();
    let example = keys.path().join("example.yaml");
    std::fs::write(
        &example,
        format!(
            "{}  image: {app_image}\n",
            std::fs::read_to_string(dir.join("example.yaml"))?
        ),
    )?;
    let example = example.display().to_string();
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

/// Waits until the host's ClusterRole carries the rules of a bundle for `resource`.
async fn aggregated(admin: &Client, resource: &str) -> anyhow::Result<()> {
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
                            .is_some_and(|rs| rs.iter().any(|x| x == resource))
                    })
                    .then_some(())
            }
        },
    )
    .await?;
    Ok(())
}

/// A plugin that sets finalizers is unloaded (its ConfigMap deleted, the rest of its bundle
/// kept, as the README says) and one of its parents is then deleted: the host, with only its
/// ServiceAccount's rights, releases the finalizer after the grace, with its Warning Event.
/// The release used to read the parent first, a `get` no bundle grants; the 403 was dropped
/// without a word and the parent stayed Terminating (review M1).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_unloaded_plugins_finalizer_is_released_with_only_the_bundles_rights()
-> anyhow::Result<()> {
    use k8s_openapi::api::events::v1::Event;
    use kube::api::{DeleteParams, ListParams, Patch, PatchParams};
    use policy_host_e2e::{probe_crd, probes};

    let _one = ONE_AT_A_TIME.lock().await;
    init_logging();
    let env = shared_node().await?;
    let admin = env.client().await?;
    kubectl(env, &["apply", "-f", "deploy/rbac.yaml"])?;

    // The misbehaving test plugin (it sets a finalizer) bundled with the Probe CRD.
    let plugin = policy_host_test_plugins::build("misbehaving-policy")
        .map_err(|e| anyhow::anyhow!("{e}"))?;
    let work = tempfile::tempdir()?;
    let crd_file = work.path().join("probe-crd.yaml");
    std::fs::write(&crd_file, serde_yaml::to_string(&probe_crd()?)?)?;
    let bundle = plugin_cli::pack(
        &plugin,
        &PackRequest {
            name: Some("plugin-probe".into()),
            bundle_crds: vec![crd_file],
            ..PackRequest::default()
        },
        &plugin_cli::host_defaults(),
    )
    .await?;
    let bundle_file = work.path().join("probe.yaml");
    std::fs::write(&bundle_file, &bundle)?;
    kubectl(
        env,
        &[
            "-n",
            HOST_NAMESPACE,
            "apply",
            "--server-side",
            "-f",
            &bundle_file.display().to_string(),
        ],
    )?;
    kubectl(
        env,
        &[
            "wait",
            "--for",
            "condition=established",
            "crd/probes.test.policy-host.io",
        ],
    )?;
    aggregated(&admin, "probes").await?;

    let namespace = env.create_namespace("orphan-rbac").await?;
    let mut settings = Settings {
        plugin_namespace: Some(HOST_NAMESPACE.into()),
        ..HostUnderTest::settings(&namespace, Limits::default())?
    };
    settings.controller.finalizer_grace = Duration::from_secs(2);
    let host =
        HostUnderTest::start_with_client(service_account_client(env).await?, settings).await?;

    let api: Api<DynamicObject> = Api::namespaced_with(admin.clone(), &namespace, &probes());
    let probe = serde_json::json!({
        "apiVersion": "test.policy-host.io/v1", "kind": "Probe",
        "metadata": { "name": "orphan" }, "spec": { "behaviour": "ok" }
    });
    api.patch(
        "orphan",
        &PatchParams::apply("e2e").force(),
        &Patch::Apply(&probe),
    )
    .await?;
    wait_for("the plugin's finalizer on `orphan`", WAIT, || async {
        let object = api.get_opt("orphan").await.ok().flatten()?;
        object
            .metadata
            .finalizers?
            .contains(&"policy-host.io/misbehaving".to_string())
            .then_some(())
    })
    .await?;

    // Unloaded: its ConfigMap goes, its ClusterRole and CRD stay.
    let config_maps: Api<ConfigMap> = Api::namespaced(admin.clone(), HOST_NAMESPACE);
    config_maps
        .delete("plugin-probe", &DeleteParams::default())
        .await?;
    let store = host.running.store.clone();
    wait_for("the plugin unloaded", WAIT, || async {
        store.get("misbehaving").is_none().then_some(())
    })
    .await?;

    api.delete("orphan", &DeleteParams::default()).await?;
    wait_for("`orphan` released and gone", WAIT, || async {
        api.get_opt("orphan")
            .await
            .ok()
            .and_then(|o| o.is_none().then_some(()))
    })
    .await?;
    let events: Api<Event> = Api::namespaced(admin.clone(), &namespace);
    let released = wait_for("a FinalizerReleased event on `orphan`", WAIT, || async {
        events
            .list(&ListParams::default())
            .await
            .ok()?
            .items
            .into_iter()
            .find(|e| {
                e.reason.as_deref() == Some("FinalizerReleased")
                    && e.regarding.as_ref().and_then(|r| r.name.as_deref()) == Some("orphan")
            })
    })
    .await?;
    assert_eq!(released.type_.as_deref(), Some("Warning"));
    host.stop().await;
    Ok(())
}
