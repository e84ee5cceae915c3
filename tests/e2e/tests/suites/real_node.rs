//! The real node under the end-to-end tests (containerd, runc, kubelet, CNI bridge, CoreDNS,
//! kube-proxy; images made locally): an etcd Pod from the local etcd image, run as a numeric
//! non-root user with a memory limit, becomes Ready on the kubelet, answers the test process
//! at its pod IP, behind a ClusterIP Service through kube-proxy, and by its Service's DNS name
//! from inside another Pod; its processes sit inside the test process's own cgroup.

use std::path::Path;
use std::process::Command;
use std::time::Duration;

use k8s_openapi::api::core::v1::{Pod, Service};
use kube::api::{Api, LogParams, PostParams};
use policy_host_e2e::etcd::{eventually, pod_ready};
use policy_host_testenv::shared_node;
use serde_json::json;

const READY: Duration = Duration::from_secs(120);

fn etcdctl(etcdctl: &Path, endpoint: &str, args: &[&str]) -> Result<String, String> {
    let output = Command::new(etcdctl)
        .args([
            "--endpoints",
            endpoint,
            "--dial-timeout=2s",
            "--command-timeout=3s",
        ])
        .args(args)
        .output()
        .map_err(|e| format!("running etcdctl: {e}"))?;
    if output.status.success() {
        Ok(String::from_utf8_lossy(&output.stdout).into_owned())
    } else {
        Err(String::from_utf8_lossy(&output.stderr).into_owned())
    }
}

#[tokio::test]
async fn etcd_pod_on_the_real_node_answers_by_pod_ip_service_and_dns() -> anyhow::Result<()> {
    policy_host_e2e::init_logging();
    let env = shared_node().await?;
    let client = env.client().await?;
    let namespace = env.create_namespace("real-node").await?;
    let version = policy_host_e2e::apps::default_etcd_version(env)?;
    let image = format!("gcr.io/etcd-development/etcd:{version}");
    let etcdctl_path = policy_host_e2e::apps::etcd_dir(env, &version)
        .ok_or_else(|| anyhow::anyhow!("etcd {version} is not built"))?
        .join("etcdctl");
    let pods: Api<Pod> = Api::namespaced(client.clone(), &namespace);
    let services: Api<Service> = Api::namespaced(client.clone(), &namespace);
    let non_root = json!({
        "runAsNonRoot": true, "runAsUser": 65532, "runAsGroup": 65532, "fsGroup": 65532,
        "seccompProfile": { "type": "RuntimeDefault" },
    });

    let member: Pod = serde_json::from_value(json!({
        "apiVersion": "v1", "kind": "Pod",
        "metadata": { "name": "etcd-0", "labels": { "app": "smoke" } },
        "spec": {
            "securityContext": non_root,
            "containers": [{
                "name": "etcd",
                "image": image,
                "command": ["/usr/local/bin/etcd"],
                "args": [
                    "--name=etcd-0", "--data-dir=/data/etcd",
                    "--listen-client-urls=http://0.0.0.0:2379",
                    "--advertise-client-urls=http://$(POD_IP):2379",
                    "--listen-peer-urls=http://0.0.0.0:2380",
                    "--initial-advertise-peer-urls=http://$(POD_IP):2380",
                    "--initial-cluster=etcd-0=http://$(POD_IP):2380",
                ],
                "env": [{ "name": "POD_IP", "valueFrom": { "fieldRef": { "fieldPath": "status.podIP" } } }],
                "ports": [{ "name": "client", "containerPort": 2379 }],
                "readinessProbe": { "httpGet": { "path": "/health", "port": 2379 }, "periodSeconds": 1 },
                "resources": { "limits": { "memory": "256Mi" } },
                "volumeMounts": [{ "name": "data", "mountPath": "/data" }],
            }],
            "volumes": [{ "name": "data", "emptyDir": {} }],
        },
    }))?;
    pods.create(&PostParams::default(), &member).await?;
    let pod_ip = eventually("etcd-0 Ready on the real node", READY, || async {
        let pod = pods.get("etcd-0").await.map_err(|e| e.to_string())?;
        let ready = pod_ready(&pod);
        let status = pod.status.unwrap_or_default();
        match (ready, status.pod_ip) {
            (true, Some(ip)) => Ok(ip),
            _ => Err(format!(
                "phase {:?}, containers {:?}",
                status.phase, status.container_statuses
            )),
        }
    })
    .await?;
    assert!(
        pod_ip.starts_with("10.244.0."),
        "the pod's IP {pod_ip} is on the node's bridge"
    );

    let direct = format!("http://{pod_ip}:2379");
    etcdctl(
        &etcdctl_path,
        &direct,
        &["put", "greeting", "from-the-test-process"],
    )
    .map_err(|e| anyhow::anyhow!("etcdctl put at the pod IP: {e}"))?;

    let service: Service = serde_json::from_value(json!({
        "apiVersion": "v1", "kind": "Service",
        "metadata": { "name": "smoke" },
        "spec": { "selector": { "app": "smoke" }, "ports": [{ "name": "client", "port": 2379 }] },
    }))?;
    let cluster_ip = services
        .create(&PostParams::default(), &service)
        .await?
        .spec
        .and_then(|s| s.cluster_ip)
        .ok_or_else(|| anyhow::anyhow!("the Service got no ClusterIP"))?;
    let through_proxy = format!("http://{cluster_ip}:2379");
    let value = eventually(
        "the ClusterIP Service answering through kube-proxy",
        READY,
        || async {
            etcdctl(
                &etcdctl_path,
                &through_proxy,
                &["get", "greeting", "--print-value-only"],
            )
        },
    )
    .await?;
    assert_eq!(value.trim(), "from-the-test-process");

    // etcdctl is a Go program with the pure Go resolver: the kubelet's resolv.conf (CoreDNS on
    // the bridge, search domains, ndots:5) is all it has to find the Service by name.
    let probe: Pod = serde_json::from_value(json!({
        "apiVersion": "v1", "kind": "Pod",
        "metadata": { "name": "dns-probe" },
        "spec": {
            "securityContext": non_root,
            "restartPolicy": "Never",
            "containers": [{
                "name": "etcdctl",
                "image": image,
                "command": [
                    "/usr/local/bin/etcdctl", "--endpoints=http://smoke:2379",
                    "--dial-timeout=5s", "get", "greeting", "--print-value-only",
                ],
            }],
        },
    }))?;
    pods.create(&PostParams::default(), &probe).await?;
    let phase = eventually("dns-probe to finish", READY, || async {
        let pod = pods.get("dns-probe").await.map_err(|e| e.to_string())?;
        match pod.status.and_then(|s| s.phase).as_deref() {
            Some(phase @ ("Succeeded" | "Failed")) => Ok(phase.to_owned()),
            other => Err(format!("phase {other:?}")),
        }
    })
    .await?;
    let logs = pods.logs("dns-probe", &LogParams::default()).await?;
    assert_eq!(
        (phase.as_str(), logs.trim()),
        ("Succeeded", "from-the-test-process"),
        "the probe Pod reads the value through the Service's DNS name"
    );

    let own = std::fs::read_to_string("/proc/self/cgroup")?;
    let memory = own
        .lines()
        .find_map(|l| l.split_once(":memory:").map(|(_, path)| path.to_owned()))
        .ok_or_else(|| anyhow::anyhow!("no memory cgroup"))?;
    let kubepods = Path::new("/sys/fs/cgroup/memory")
        .join(memory.trim_start_matches('/'))
        .join("kubepods");
    let pod_uid = pods
        .get("etcd-0")
        .await?
        .metadata
        .uid
        .ok_or_else(|| anyhow::anyhow!("etcd-0 has no uid"))?;
    let found = find_dir(&kubepods, &format!("pod{pod_uid}"));
    assert!(
        found.is_some(),
        "etcd-0's cgroup pod{pod_uid} is under the test process's own {}",
        kubepods.display()
    );
    Ok(())
}

fn find_dir(under: &Path, name: &str) -> Option<std::path::PathBuf> {
    for entry in std::fs::read_dir(under).ok()?.flatten() {
        if !entry.file_type().is_ok_and(|t| t.is_dir()) {
            continue;
        }
        if entry.file_name().to_string_lossy() == name {
            return Some(entry.path());
        }
        if let Some(found) = find_dir(&entry.path(), name) {
            return Some(found);
        }
    }
    None
}
