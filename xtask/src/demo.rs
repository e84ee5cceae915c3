//! `cargo xtask demo`: a local control plane and a real node, policy-host installed on it the
//! way README.md's "Running the host in a cluster" says (its image made from deploy/Dockerfile),
//! and the example `EtcdCluster` converging in a live view, until Ctrl-C tears it all down.

use std::path::Path;
use std::time::Duration;

use anyhow::Context;
use k8s_openapi::api::core::v1::Pod;
use kube::api::{Api, ApiResource, DynamicObject, ListParams};
use kube::core::GroupVersionKind;
use policy_host_testenv::images::Declarations;
use policy_host_testenv::node::{NODE_IP, Node, NodeNetwork, base_images};
use policy_host_testenv::{Binaries, ControlPlane, ControlPlaneOptions, install};
use serde_json::{Value, json};

use crate::{run as run_command, setup, step};

const NAMESPACE: &str = "default";

pub fn run(root: &Path, cluster_file: &Path) -> anyhow::Result<()> {
    setup(root)?;
    // Cargo's own progress shows: on a fresh clone this build takes minutes, and a silent one
    // looks hung. A dev build, as the install suite uses, so `cargo xtask test` left it warm;
    // deploy/Dockerfile builds release for real installs.
    step(
        "building policy-host (a dev build, shared with the tests; deploy/Dockerfile builds release)",
    );
    run_command(policy_host_test_plugins::cargo_command().args([
        "build",
        "-p",
        "policy-host",
        // As the install suite builds it, so the two share one build.
        "--bin",
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
    binaries.ensure_node()?;

    step("making the node's bridge cni0 (10.244.0.1/24)");
    let network = NodeNetwork::create(Duration::from_secs(60))?;
    step("starting etcd + kube-apiserver + kube-controller-manager + kube-scheduler on 10.244.0.1");
    let control_plane = ControlPlane::start(
        &binaries,
        ControlPlaneOptions {
            dir: Some(dir.join("control-plane")),
            node_ip: Some(NODE_IP),
            ..ControlPlaneOptions::default()
        },
    )
    .await?;
    let client = control_plane.client().await?;
    step(
        "making the images (those guest-etcd/test-images.yaml declares, pause, and policy-host as deploy/Dockerfile lays it out, with the dev build above)",
    );
    let images_dir = binaries.cache_dir().join("images");
    let mut images = base_images(&binaries, &images_dir)?;
    let mut app_images = Vec::new();
    for declaration in Declarations::read(&root.join("guest-etcd/test-images.yaml"))?.images {
        let made = declaration.make(&binaries)?;
        images.push(made.spec.write_archive(&images_dir)?);
        app_images.push(made);
    }
    let plugin =
        policy_host_test_plugins::build("guest-etcd").map_err(|e| anyhow::anyhow!("{e}"))?;
    let plugins = plugin
        .parent()
        .ok_or_else(|| anyhow::anyhow!("{} has no directory", plugin.display()))?;
    let host_image = install::host_image(root, &install::host_binary_path(root), plugins)?;
    images.push(host_image.write_archive(&images_dir)?);
    step("starting the node: containerd, kubelet, CNI bridge, CoreDNS, kube-proxy");
    let node = Node::start(
        &control_plane,
        &network,
        &binaries,
        &images,
        &dir.join("node"),
    )
    .await?;

    step("installing as README.md's \"Running the host in a cluster\" says");
    let kubectl = binaries.kubectl();
    for line in install::run_readme_install(root, &kubectl, control_plane.kubeconfig_path())? {
        println!("  $ {line}");
    }
    if cluster_file != Path::new("deploy/examples/etcd-cluster.yaml") {
        step(&format!("applying {}", cluster_file.display()));
        install::run_kubectl(
            root,
            &kubectl,
            control_plane.kubeconfig_path(),
            &["apply", "-f", &cluster_file.display().to_string()],
        )?;
    }
    let cluster: Value = serde_yaml::from_str(&std::fs::read_to_string(root.join(cluster_file))?)?;
    let name = cluster["metadata"]["name"]
        .as_str()
        .unwrap_or("example-etcd-cluster")
        .to_string();
    let resource = ApiResource::from_gvk_with_plural(
        &GroupVersionKind::gvk("etcd.database.coreos.com", "v1beta2", "EtcdCluster"),
        "etcdclusters",
    );
    let clusters: Api<DynamicObject> = Api::namespaced_with(client.clone(), NAMESPACE, &resource);

    let kube_dir = kubectl.parent().map(Path::to_path_buf).unwrap_or_default();
    let etcd_dir = app_images
        .iter()
        .find_map(|image| image.program("etcdctl")?.parent().map(Path::to_path_buf))
        .unwrap_or_default();
    println!(
        "\nThe cluster is yours to explore while this runs. In another shell:\n\n  export KUBECONFIG={}\n  export PATH={}:{}:$PATH\n  kubectl get etcd,pods,svc -A\n  kubectl -n policy-host logs deploy/policy-host\n  etcdctl --endpoints http://$(kubectl get svc {name}-client -o jsonpath='{{.spec.clusterIP}}'):2379 member list -w table\n  kubectl -n policy-host apply --server-side -f my-app.yaml   # a plugin bundle (policy-host pack --bundle) loads in the host's namespace\n\nLogs: control plane {}/control-plane/logs, node {}/node/logs\nPress Ctrl-C to tear everything down.\n",
        control_plane.kubeconfig_path().display(),
        kube_dir.display(),
        etcd_dir.display(),
        dir.display(),
        dir.display(),
    );

    let pods: Api<Pod> = Api::namespaced(client.clone(), NAMESPACE);
    let host_pods: Api<Pod> = Api::namespaced(client.clone(), "policy-host");
    let mut last = String::new();
    let mut tick = tokio::time::interval(Duration::from_secs(2));
    loop {
        tokio::select! {
            _ = tokio::signal::ctrl_c() => break,
            _ = tick.tick() => {
                let mut view = live_view(&clusters, &pods, &name).await;
                if let Ok(list) = host_pods.list(&ListParams::default().labels("app.kubernetes.io/name=policy-host")).await {
                    for pod in list.items {
                        let ready = pod.status.as_ref().and_then(|s| s.container_statuses.as_ref()).and_then(|c| c.first()).is_some_and(|c| c.ready);
                        view.push_str(&format!("\n  host pod {} ready {ready}", pod.metadata.name.unwrap_or_default()));
                    }
                }
                if view != last {
                    println!("{view}");
                    last = view;
                }
            }
        }
    }
    step("tearing down");
    drop(node);
    drop(control_plane);
    drop(network);
    Ok(())
}

/// One screen of what matters: the EtcdCluster's printer columns, its members and pods.
async fn live_view(clusters: &Api<DynamicObject>, pods: &Api<Pod>, name: &str) -> String {
    let Ok(Some(cluster)) = clusters.get_opt(name).await else {
        return format!("{name}: not found");
    };
    let Some(status) = cluster.data.get("status").cloned().filter(|s| !s.is_null()) else {
        return format!(
            "{name}: SIZE {} — waiting for the first status (the plugin writes it on its first decision)",
            cluster.data["spec"]["size"]
        );
    };
    let text = |v: &Value| {
        v.as_str()
            .map(str::to_string)
            .unwrap_or_else(|| v.to_string())
    };
    let known = |v: &Value| {
        if v.is_null() {
            "-".to_string()
        } else {
            text(v)
        }
    };
    let mut out = format!(
        "{name}: SIZE {} READY {} VERSION {} PHASE {}",
        cluster.data["spec"]["size"],
        known(&status["ready"]),
        known(&status["currentVersion"]),
        known(&status["phase"]),
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
    for member in status["etcdMembers"].as_array().into_iter().flatten() {
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
