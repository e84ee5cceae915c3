//! `cargo xtask demo`: a local control plane and pod runner, policy-host with the etcd plugin,
//! and an `EtcdCluster` converging in a live view, until Ctrl-C tears it all down.

use std::path::Path;
use std::process::Stdio;
use std::time::Duration;

use anyhow::Context;
use k8s_openapi::api::core::v1::Pod;
use k8s_openapi::apiextensions_apiserver::pkg::apis::apiextensions::v1::CustomResourceDefinition;
use kube::api::{Api, ApiResource, DynamicObject, ListParams, Patch, PatchParams};
use kube::core::GroupVersionKind;
use policy_host_testenv::{
    Binaries, ControlPlane, ControlPlaneOptions, PodRunner, PodRunnerOptions,
};
use serde_json::{Value, json};

use crate::{cargo, run as run_command, setup, step};

const NAMESPACE: &str = "default";

pub fn run(root: &Path, cluster_file: &Path) -> anyhow::Result<()> {
    setup(root)?;
    step("building policy-host");
    run_command(std::process::Command::new(cargo()).args([
        "build",
        "--quiet",
        "-p",
        "policy-host",
    ]))?;
    let runtime = tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .build()
        .context("cannot start the tokio runtime")?;
    runtime.block_on(demo(root, cluster_file))
}

async fn demo(root: &Path, cluster_file: &Path) -> anyhow::Result<()> {
    let dir = root.join("target/demo");
    let _ = std::fs::remove_dir_all(&dir);
    std::fs::create_dir_all(&dir)?;
    let binaries = Binaries::ensure()?;

    step("starting etcd + kube-apiserver + kube-controller-manager on 127.0.0.1");
    let control_plane = ControlPlane::start(
        &binaries,
        ControlPlaneOptions {
            dir: Some(dir.join("control-plane")),
            ..ControlPlaneOptions::default()
        },
    )
    .await?;
    let client = control_plane.client().await?;
    step("starting the local pod runner (a test kubelet running pods as local processes)");
    let runner = PodRunner::start(
        client.clone(),
        binaries.clone(),
        PodRunnerOptions {
            dir: Some(dir.join("pods")),
            ..PodRunnerOptions::default()
        },
    )
    .await?;

    step("installing the EtcdCluster CRD (deploy/crds/etcdcluster.yaml)");
    let crd: CustomResourceDefinition = serde_yaml::from_str(&std::fs::read_to_string(
        root.join("deploy/crds/etcdcluster.yaml"),
    )?)?;
    let crds: Api<CustomResourceDefinition> = Api::all(client.clone());
    crds.patch(
        "etcdclusters.etcd.database.coreos.com",
        &PatchParams::apply("policy-host-demo").force(),
        &Patch::Apply(&crd),
    )
    .await?;
    policy_host_testenv::wait_for(
        "the CRD to be established",
        Duration::from_secs(60),
        || async {
            let crd = crds
                .get_opt("etcdclusters.etcd.database.coreos.com")
                .await
                .ok()
                .flatten()?;
            crd.status?
                .conditions?
                .iter()
                .any(|c| c.type_ == "Established" && c.status == "True")
                .then_some(())
        },
    )
    .await?;

    step("starting policy-host with the etcd plugin");
    let plugin =
        policy_host_test_plugins::build("guest-etcd").map_err(|e| anyhow::anyhow!("{e}"))?;
    let host_log = dir.join("policy-host.log");
    let mut host = tokio::process::Command::new(root.join("target/debug/policy-host"))
        .args(["run", "--policy"])
        .arg(&plugin)
        .args(["--admin-addr", "127.0.0.1:0"])
        // Plugin ConfigMaps applied in the demo namespace load too (README: your own plugin).
        .args(["--plugin-namespace", NAMESPACE])
        .env("KUBECONFIG", control_plane.kubeconfig_path())
        .stdout(Stdio::null())
        .stderr(std::fs::File::create(&host_log)?)
        .kill_on_drop(true)
        .spawn()
        .context("cannot start target/debug/policy-host")?;

    // Pods are refused until kube-controller-manager has made the namespace's ServiceAccount.
    let accounts: Api<k8s_openapi::api::core::v1::ServiceAccount> =
        Api::namespaced(client.clone(), NAMESPACE);
    policy_host_testenv::wait_for(
        "the default ServiceAccount",
        Duration::from_secs(60),
        || async { accounts.get_opt("default").await.ok().flatten() },
    )
    .await?;

    step(&format!("applying {}", cluster_file.display()));
    let mut cluster: Value =
        serde_yaml::from_str(&std::fs::read_to_string(root.join(cluster_file))?)?;
    let version = binaries
        .default_etcd_version()
        .trim_start_matches('v')
        .to_string();
    if cluster["spec"]["version"].as_str() != Some(version.as_str()) {
        eprintln!("(using etcd {version}, the version this environment has built)");
        cluster["spec"]["version"] = json!(version);
    }
    let name = cluster["metadata"]["name"]
        .as_str()
        .unwrap_or("example-etcd-cluster")
        .to_string();
    let resource = ApiResource::from_gvk_with_plural(
        &GroupVersionKind::gvk("etcd.database.coreos.com", "v1beta2", "EtcdCluster"),
        "etcdclusters",
    );
    let clusters: Api<DynamicObject> = Api::namespaced_with(client.clone(), NAMESPACE, &resource);
    clusters
        .patch(
            &name,
            &PatchParams::apply("policy-host-demo").force(),
            &Patch::Apply(&cluster),
        )
        .await?;

    let kube_bin = binaries.kube_apiserver();
    let kube_dir = kube_bin.parent().map(Path::to_path_buf).unwrap_or_default();
    let etcd_dir = binaries
        .etcd_dir(binaries.default_etcd_version())
        .unwrap_or_default();
    println!(
        "\nThe cluster is yours to explore while this runs. In another shell:\n\n  export KUBECONFIG={}\n  export PATH={}:{}:$PATH\n  kubectl get etcd,pods,svc      # if you have a kubectl\n  etcdctl --endpoints http://<pod IP>:2379 member list -w table\n  kubectl apply -f my-plugin.yaml # a plugin ConfigMap (policy-host pack) loads here too\n\nLogs: policy-host {}, pods {}/pods, control plane {}/control-plane\nPress Ctrl-C to tear everything down.\n",
        control_plane.kubeconfig_path().display(),
        kube_dir.display(),
        etcd_dir.display(),
        host_log.display(),
        dir.display(),
        dir.display(),
    );

    let pods: Api<Pod> = Api::namespaced(client.clone(), NAMESPACE);
    let mut last = String::new();
    let mut tick = tokio::time::interval(Duration::from_secs(2));
    loop {
        tokio::select! {
            _ = tokio::signal::ctrl_c() => break,
            exited = host.wait() => {
                eprintln!("policy-host exited ({exited:?}); see {}", host_log.display());
                break;
            }
            _ = tick.tick() => {
                let view = live_view(&clusters, &pods, &name).await;
                if view != last {
                    println!("{view}");
                    last = view;
                }
            }
        }
    }
    step("tearing down");
    let _ = host.kill().await;
    drop(runner);
    drop(control_plane);
    Ok(())
}

/// One screen of what matters: the EtcdCluster's printer columns, its members and pods.
async fn live_view(clusters: &Api<DynamicObject>, pods: &Api<Pod>, name: &str) -> String {
    let Ok(Some(cluster)) = clusters.get_opt(name).await else {
        return format!("{name}: not found");
    };
    let status = cluster.data.get("status").cloned().unwrap_or(Value::Null);
    let text = |v: &Value| {
        v.as_str()
            .map(str::to_string)
            .unwrap_or_else(|| v.to_string())
    };
    let mut out = format!(
        "{name}: SIZE {} READY {} VERSION {} PHASE {}",
        cluster.data["spec"]["size"],
        text(&status["ready"]),
        text(&status["currentVersion"]),
        text(&status["phase"]),
    );
    for condition in status["conditions"].as_array().into_iter().flatten() {
        if condition["status"] == json!("True") {
            out.push_str(&format!(
                "\n  condition {} ({}): {}",
                text(&condition["type"]),
                text(&condition["reason"]),
                text(&condition["message"])
            ));
        }
    }
    for member in status["members"].as_array().into_iter().flatten() {
        out.push_str(&format!(
            "\n  member {} id {} ready {}",
            text(&member["name"]),
            text(&member["id"]),
            member["ready"]
        ));
    }
    let selector = format!("app.kubernetes.io/instance={name}");
    if let Ok(list) = pods.list(&ListParams::default().labels(&selector)).await {
        for pod in list.items {
            let status = pod.status.unwrap_or_default();
            out.push_str(&format!(
                "\n  pod {} {} ip {}",
                pod.metadata.name.unwrap_or_default(),
                status.phase.unwrap_or_default(),
                status.pod_ip.unwrap_or_default()
            ));
        }
    }
    out
}
