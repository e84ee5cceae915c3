//! The test environment against itself: a real control plane, and Pods run by the pod runner.
//!
//! All tests share one control plane (one test binary = one process = one [`shared`]
//! environment); each works in a namespace of its own.

use std::time::Duration;

use anyhow::{Context as _, Result, bail};
use k8s_openapi::api::apps::v1::StatefulSet;
use k8s_openapi::api::core::v1::{ConfigMap, Namespace, PersistentVolumeClaim, Pod, Service};
use kube::Api;
use kube::api::{DeleteParams, PostParams};
use policy_host_testenv::{TestEnv, shared, wait_for};

fn from_json<T: serde::de::DeserializeOwned>(value: serde_json::Value) -> Result<T> {
    serde_json::from_value(value).context("test fixture does not deserialize")
}

async fn create_pod(pods: &Api<Pod>, pod: serde_json::Value) -> Result<Pod> {
    Ok(pods
        .create(&PostParams::default(), &from_json(pod)?)
        .await?)
}

fn condition(pod: &Pod, kind: &str) -> bool {
    pod.status
        .as_ref()
        .and_then(|s| s.conditions.as_ref())
        .and_then(|c| c.iter().find(|c| c.type_ == kind))
        .is_some_and(|c| c.status == "True")
}

fn phase(pod: &Pod) -> &str {
    pod.status
        .as_ref()
        .and_then(|s| s.phase.as_deref())
        .unwrap_or("")
}

fn restart_count(pod: &Pod) -> i32 {
    pod.status
        .as_ref()
        .and_then(|s| s.container_statuses.as_ref())
        .and_then(|c| c.first())
        .map_or(0, |c| c.restart_count)
}

fn container_pid(pod: &Pod) -> Option<u32> {
    pod.status
        .as_ref()?
        .container_statuses
        .as_ref()?
        .first()?
        .container_id
        .as_deref()?
        .strip_prefix("testenv://")?
        .parse()
        .ok()
}

/// Waits until the Pod satisfies `check`, printing its logs on timeout.
async fn wait_pod(
    env: &TestEnv,
    pods: &Api<Pod>,
    name: &str,
    what: &str,
    timeout: Duration,
    check: impl Fn(&Pod) -> bool,
) -> Result<Pod> {
    let found = wait_for(what, timeout, || async {
        pods.get_opt(name).await.ok().flatten().filter(|p| check(p))
    })
    .await;
    match found {
        Ok(pod) => Ok(pod),
        Err(e) => {
            let namespace = pods
                .get_opt(name)
                .await
                .ok()
                .flatten()
                .and_then(|p| p.metadata.namespace.clone())
                .unwrap_or_default();
            let current = pods.get_opt(name).await.ok().flatten();
            eprintln!(
                "pod {name} now: {}\nlogs:\n{}",
                serde_json::to_string_pretty(&current.map(|p| p.status)).unwrap_or_default(),
                runner(env).pod_logs(&namespace, name)
            );
            Err(e.into())
        }
    }
}

#[tokio::test]
async fn control_plane_is_ready_and_namespace_deletion_completes() -> Result<()> {
    let env = shared().await?;
    eprintln!("shared environment set up in {:?}", env.setup_time());
    let client = env.client().await?;
    let readyz = client
        .request_text(http::Request::get("/readyz").body(Vec::new())?)
        .await?;
    assert_eq!(readyz, "ok");

    let name = env.create_namespace("namespace-lifecycle").await?;
    let namespaces: Api<Namespace> = Api::all(client);
    namespaces.delete(&name, &DeleteParams::default()).await?;
    wait_for(
        "the namespace to be deleted (namespace controller)",
        Duration::from_secs(60),
        || async {
            namespaces
                .get_opt(&name)
                .await
                .ok()
                .and_then(|n| n.is_none().then_some(()))
        },
    )
    .await?;
    Ok(())
}

#[tokio::test]
async fn readiness_comes_from_the_probe() -> Result<()> {
    let env = shared().await?;
    let ns = env.create_namespace("readiness").await?;
    let pods: Api<Pod> = Api::namespaced(env.client().await?, &ns);
    let pod = |name: &str, probe: &str| {
        serde_json::json!({
            "metadata": {"name": name},
            "spec": {
                "containers": [{
                    "name": "main", "image": "busybox",
                    "command": ["sh", "-c", "sleep 2; echo ok > /mnt/ready; exec sleep 3600"],
                    "volumeMounts": [{"name": "scratch", "mountPath": "/mnt"}],
                    "readinessProbe": {"exec": {"command": ["sh", "-c", probe]}, "periodSeconds": 1},
                }],
                "volumes": [{"name": "scratch", "emptyDir": {}}],
            }
        })
    };
    create_pod(&pods, pod("ready-after-file", "cat /mnt/ready")).await?;
    create_pod(&pods, pod("never-ready", "false")).await?;

    let ready = wait_pod(
        env,
        &pods,
        "ready-after-file",
        "readiness",
        Duration::from_secs(60),
        |p| condition(p, "Ready"),
    )
    .await?;
    let ip = ready
        .status
        .as_ref()
        .and_then(|s| s.pod_ip.clone())
        .context("no pod IP")?;
    assert!(
        ip.starts_with("127."),
        "pod IP {ip} is not a loopback address"
    );
    assert_eq!(phase(&ready), "Running");
    assert_eq!(
        runner(env)
            .pod_ip(&ns, "ready-after-file")
            .await
            .map(|ip| ip.to_string()),
        Some(ip)
    );
    // The file exists only in the pod's emptyDir, not on the machine.
    assert!(!std::path::Path::new("/mnt/ready").exists());

    let never = pods.get("never-ready").await?;
    assert_eq!(phase(&never), "Running");
    assert!(
        !condition(&never, "Ready"),
        "a pod whose probe fails must not be Ready"
    );
    Ok(())
}

#[tokio::test]
async fn pods_resolve_each_other_by_hostname_subdomain_and_service() -> Result<()> {
    let env = shared().await?;
    let ns = env.create_namespace("dns").await?;
    let client = env.client().await?;
    let services: Api<Service> = Api::namespaced(client.clone(), &ns);
    services
        .create(
            &PostParams::default(),
            &from_json(serde_json::json!({
                "metadata": {"name": "peers"},
                "spec": {"clusterIP": "None", "selector": {"app": "peer"}, "ports": [{"port": 80}]},
            }))?,
        )
        .await?;
    let pods: Api<Pod> = Api::namespaced(client, &ns);
    create_pod(
        &pods,
        serde_json::json!({
            "metadata": {"name": "first", "labels": {"app": "peer"}},
            "spec": {
                "hostname": "first", "subdomain": "peers",
                "containers": [{"name": "main", "image": "busybox", "command": ["sleep", "3600"]}],
            }
        }),
    )
    .await?;
    let first = wait_pod(
        env,
        &pods,
        "first",
        "first to run",
        Duration::from_secs(60),
        |p| phase(p) == "Running",
    )
    .await?;
    let ip = first
        .status
        .and_then(|s| s.pod_ip)
        .context("first has no IP")?;
    let script = format!(
        "getent hosts first.peers.{ns}.svc && getent hosts first.peers.{ns}.svc.cluster.local && getent hosts peers.{ns}.svc"
    );
    create_pod(
        &pods,
        serde_json::json!({
            "metadata": {"name": "second"},
            "spec": {
                "restartPolicy": "Never",
                "containers": [{"name": "lookup", "image": "busybox", "command": ["sh", "-c", script]}],
            }
        }),
    )
    .await?;
    wait_pod(
        env,
        &pods,
        "second",
        "the lookup to succeed",
        Duration::from_secs(60),
        |p| phase(p) == "Succeeded",
    )
    .await?;
    let log = std::fs::read_to_string(runner(env).log_path(&ns, "second", "lookup"))?;
    assert_eq!(
        log.lines()
            .filter(|l| l.starts_with(&format!("{ip} ")))
            .count(),
        3,
        "every name resolves to first's IP {ip}:\n{log}"
    );
    Ok(())
}

#[tokio::test]
async fn an_etcd_pod_serves_etcdctl_from_its_claim() -> Result<()> {
    let env = shared().await?;
    let ns = env.create_namespace("etcd").await?;
    let client = env.client().await?;
    let version = "v3.6.16";
    let services: Api<Service> = Api::namespaced(client.clone(), &ns);
    services
        .create(
            &PostParams::default(),
            &from_json(serde_json::json!({
                "metadata": {"name": "etcd"},
                "spec": {"clusterIP": "None", "publishNotReadyAddresses": true, "selector": {"app": "etcd"}, "ports": [{"port": 2379}]},
            }))?,
        )
        .await?;
    let claims: Api<PersistentVolumeClaim> = Api::namespaced(client.clone(), &ns);
    claims
        .create(
            &PostParams::default(),
            &from_json(serde_json::json!({
                "metadata": {"name": "data-etcd-0"},
                "spec": {"accessModes": ["ReadWriteOnce"], "resources": {"requests": {"storage": "1Gi"}}},
            }))?,
        )
        .await?;
    let pods: Api<Pod> = Api::namespaced(client, &ns);
    // Peer URLs by DNS name: etcd resolves them at startup, which proves the hosts file works
    // for etcd's own (pure Go) resolver too.
    let peer = "http://$(POD_NAME).etcd.$(POD_NAMESPACE).svc:2380";
    create_pod(
        &pods,
        serde_json::json!({
            "metadata": {"name": "etcd-0", "labels": {"app": "etcd"}},
            "spec": {
                "hostname": "etcd-0", "subdomain": "etcd",
                "containers": [{
                    "name": "etcd", "image": format!("gcr.io/etcd-development/etcd:{version}"),
                    "command": ["/usr/local/bin/etcd"],
                    "args": [
                        "--name=$(POD_NAME)", "--data-dir=/var/lib/etcd",
                        "--listen-client-urls=http://0.0.0.0:2379",
                        "--advertise-client-urls=http://$(POD_IP):2379",
                        "--listen-peer-urls=http://0.0.0.0:2380",
                        format!("--initial-advertise-peer-urls={peer}"),
                        format!("--initial-cluster=$(POD_NAME)={peer}"),
                    ],
                    "env": [
                        {"name": "POD_NAME", "valueFrom": {"fieldRef": {"fieldPath": "metadata.name"}}},
                        {"name": "POD_NAMESPACE", "valueFrom": {"fieldRef": {"fieldPath": "metadata.namespace"}}},
                        {"name": "POD_IP", "valueFrom": {"fieldRef": {"fieldPath": "status.podIP"}}},
                    ],
                    "ports": [{"name": "client", "containerPort": 2379}],
                    "readinessProbe": {"httpGet": {"path": "/health", "port": "client"}, "periodSeconds": 2},
                    "volumeMounts": [{"name": "data", "mountPath": "/var/lib/etcd"}],
                }],
                "volumes": [{"name": "data", "persistentVolumeClaim": {"claimName": "data-etcd-0"}}],
            }
        }),
    )
    .await?;
    let pod = wait_pod(
        env,
        &pods,
        "etcd-0",
        "etcd to be ready",
        Duration::from_secs(90),
        |p| condition(p, "Ready"),
    )
    .await?;
    let ip = pod.status.and_then(|s| s.pod_ip).context("no pod IP")?;
    let etcdctl = etcdctl(env, version)?;
    let health = tokio::process::Command::new(&etcdctl)
        .args([
            &format!("--endpoints=http://{ip}:2379"),
            "endpoint",
            "health",
        ])
        .output()
        .await?;
    if !health.status.success() {
        bail!(
            "etcdctl endpoint health failed: {}{}",
            String::from_utf8_lossy(&health.stdout),
            String::from_utf8_lossy(&health.stderr)
        );
    }
    let claim = claims.get("data-etcd-0").await?;
    assert_eq!(claim.status.and_then(|s| s.phase).as_deref(), Some("Bound"));
    assert!(
        runner(env)
            .claim_dir(&ns, "data-etcd-0")
            .join("member")
            .is_dir(),
        "etcd's data lives in the claim's directory"
    );

    // An image the runner was not given (and a container naming no command) waits like an
    // image that cannot be pulled.
    create_pod(
        &pods,
        serde_json::json!({
            "metadata": {"name": "unknown-version"},
            "spec": {"containers": [{"name": "etcd", "image": "quay.io/coreos/etcd:v3.1.0"}]},
        }),
    )
    .await?;
    wait_pod(
        env,
        &pods,
        "unknown-version",
        "ErrImagePull",
        Duration::from_secs(30),
        |p| {
            p.status
                .as_ref()
                .and_then(|s| s.container_statuses.as_ref())
                .and_then(|c| c.first())
                .and_then(|c| c.state.as_ref()?.waiting.as_ref()?.reason.clone())
                .as_deref()
                == Some("ErrImagePull")
        },
    )
    .await?;
    Ok(())
}

#[tokio::test]
async fn killed_pods_restart_failed_pods_stay_dead_and_deleted_pods_stop() -> Result<()> {
    let env = shared().await?;
    let ns = env.create_namespace("lifecycle").await?;
    let pods: Api<Pod> = Api::namespaced(env.client().await?, &ns);
    let sleeper = |name: &str| {
        serde_json::json!({
            "metadata": {"name": name},
            "spec": {"containers": [{"name": "main", "image": "busybox", "command": ["sleep", "3600"]}]},
        })
    };
    create_pod(&pods, sleeper("crashy")).await?;
    let running = wait_pod(
        env,
        &pods,
        "crashy",
        "crashy to run",
        Duration::from_secs(60),
        |p| phase(p) == "Running" && condition(p, "Ready"),
    )
    .await?;
    let first_pid = container_pid(&running).context("no container id")?;

    runner(env).kill_pod(&ns, "crashy").await?;
    let restarted = wait_pod(
        env,
        &pods,
        "crashy",
        "a restart",
        Duration::from_secs(30),
        |p| restart_count(p) >= 1 && condition(p, "Ready"),
    )
    .await?;
    let second_pid = container_pid(&restarted).context("no container id")?;
    assert_ne!(first_pid, second_pid);
    assert!(!std::path::Path::new(&format!("/proc/{first_pid}")).exists());

    pods.delete("crashy", &DeleteParams::default()).await?;
    wait_for("crashy to be deleted", Duration::from_secs(40), || async {
        pods.get_opt("crashy")
            .await
            .ok()
            .and_then(|p| p.is_none().then_some(()))
    })
    .await?;
    assert!(
        !std::path::Path::new(&format!("/proc/{second_pid}")).exists(),
        "deleting the pod kills its process"
    );

    create_pod(&pods, sleeper("doomed")).await?;
    wait_pod(
        env,
        &pods,
        "doomed",
        "doomed to run",
        Duration::from_secs(60),
        |p| phase(p) == "Running",
    )
    .await?;
    runner(env).fail_pod(&ns, "doomed").await?;
    let failed = wait_pod(
        env,
        &pods,
        "doomed",
        "doomed to fail",
        Duration::from_secs(30),
        |p| phase(p) == "Failed",
    )
    .await?;
    assert_eq!(restart_count(&failed), 0);
    assert!(!condition(&failed, "Ready"));
    Ok(())
}

#[tokio::test]
async fn owned_objects_are_garbage_collected() -> Result<()> {
    let env = shared().await?;
    let ns = env.create_namespace("gc").await?;
    let config_maps: Api<ConfigMap> = Api::namespaced(env.client().await?, &ns);
    let owner = config_maps
        .create(
            &PostParams::default(),
            &from_json(serde_json::json!({"metadata": {"name": "owner"}}))?,
        )
        .await?;
    let uid = owner.metadata.uid.context("owner has no uid")?;
    config_maps
        .create(
            &PostParams::default(),
            &from_json(serde_json::json!({"metadata": {
                "name": "owned",
                "ownerReferences": [{"apiVersion": "v1", "kind": "ConfigMap", "name": "owner", "uid": uid}],
            }}))?,
        )
        .await?;
    config_maps
        .delete("owner", &DeleteParams::default())
        .await?;
    wait_for(
        "the owned ConfigMap to be garbage collected",
        Duration::from_secs(120),
        || async {
            config_maps
                .get_opt("owned")
                .await
                .ok()
                .and_then(|c| c.is_none().then_some(()))
        },
    )
    .await?;
    Ok(())
}

#[tokio::test]
async fn a_three_member_etcd_statefulset_forms_a_cluster_and_survives_a_pod_replacement()
-> Result<()> {
    let env = shared().await?;
    let ns = env.create_namespace("etcd-cluster").await?;
    let client = env.client().await?;
    let version = "v3.5.35";
    let services: Api<Service> = Api::namespaced(client.clone(), &ns);
    services
        .create(
            &PostParams::default(),
            &from_json(serde_json::json!({
                "metadata": {"name": "etcd"},
                "spec": {"clusterIP": "None", "publishNotReadyAddresses": true, "selector": {"app": "etcd"}, "ports": [{"name": "peer", "port": 2380}]},
            }))?,
        )
        .await?;
    let peers: Vec<String> = (0..3)
        .map(|i| format!("etcd-{i}=http://etcd-{i}.etcd.{ns}.svc:2380"))
        .collect();
    let statefulsets: Api<StatefulSet> = Api::namespaced(client.clone(), &ns);
    statefulsets
        .create(
            &PostParams::default(),
            &from_json(serde_json::json!({
                "metadata": {"name": "etcd"},
                "spec": {
                    "serviceName": "etcd", "replicas": 3, "podManagementPolicy": "Parallel",
                    "selector": {"matchLabels": {"app": "etcd"}},
                    "template": {
                        "metadata": {"labels": {"app": "etcd"}},
                        "spec": {"containers": [{
                            "name": "etcd", "image": format!("gcr.io/etcd-development/etcd:{version}"),
                            "command": ["etcd"],
                            "args": [
                                "--name=$(POD_NAME)", "--data-dir=/var/lib/etcd/data",
                                "--listen-client-urls=http://0.0.0.0:2379",
                                "--advertise-client-urls=http://$(POD_NAME).etcd.$(POD_NAMESPACE).svc:2379",
                                "--listen-peer-urls=http://0.0.0.0:2380",
                                "--initial-advertise-peer-urls=http://$(POD_NAME).etcd.$(POD_NAMESPACE).svc:2380",
                                format!("--initial-cluster={}", peers.join(",")),
                                "--initial-cluster-state=new",
                            ],
                            "env": [
                                {"name": "POD_NAME", "valueFrom": {"fieldRef": {"fieldPath": "metadata.name"}}},
                                {"name": "POD_NAMESPACE", "valueFrom": {"fieldRef": {"fieldPath": "metadata.namespace"}}},
                            ],
                            "readinessProbe": {"exec": {"command": ["etcdctl", "--endpoints=http://127.0.0.1:2379", "endpoint", "health"]}, "periodSeconds": 2},
                            "volumeMounts": [{"name": "data", "mountPath": "/var/lib/etcd"}],
                        }]},
                    },
                    "volumeClaimTemplates": [{
                        "metadata": {"name": "data"},
                        "spec": {"accessModes": ["ReadWriteOnce"], "resources": {"requests": {"storage": "1Gi"}}},
                    }],
                }
            }))?,
        )
        .await?;
    let pods: Api<Pod> = Api::namespaced(client, &ns);
    for i in 0..3 {
        wait_pod(
            env,
            &pods,
            &format!("etcd-{i}"),
            "member ready",
            Duration::from_secs(120),
            |p| condition(p, "Ready"),
        )
        .await?;
    }
    let etcdctl = etcdctl(env, version)?;
    let cluster_health = || async {
        let ip = runner(env).pod_ip(&ns, "etcd-0").await?;
        // Members advertise DNS names: resolve them as a Pod would.
        let output = runner(env)
            .cluster_command(&etcdctl)
            .args([
                &format!("--endpoints=http://{ip}:2379"),
                "endpoint",
                "health",
                "--cluster",
            ])
            .output()
            .await
            .ok()?;
        let text = String::from_utf8_lossy(&output.stdout).into_owned();
        (output.status.success() && text.matches("is healthy").count() == 3).then_some(text)
    };
    wait_for("3 healthy members", Duration::from_secs(60), cluster_health).await?;

    // Replace a member: a new Pod (new uid, new IP) on the same claim rejoins under its name.
    let old = pods.get("etcd-1").await?;
    pods.delete("etcd-1", &DeleteParams::default()).await?;
    let old_uid = old.metadata.uid.clone();
    wait_pod(
        env,
        &pods,
        "etcd-1",
        "the replacement to be ready",
        Duration::from_secs(120),
        |p| p.metadata.uid != old_uid && condition(p, "Ready"),
    )
    .await?;
    wait_for(
        "3 healthy members after the replacement",
        Duration::from_secs(60),
        cluster_health,
    )
    .await?;
    Ok(())
}

#[tokio::test]
async fn a_failing_liveness_probe_restarts_the_container() -> Result<()> {
    let env = shared().await?;
    let ns = env.create_namespace("liveness").await?;
    let pods: Api<Pod> = Api::namespaced(env.client().await?, &ns);
    create_pod(
        &pods,
        serde_json::json!({
            "metadata": {"name": "unhealthy"},
            "spec": {"containers": [{
                "name": "main", "image": "busybox", "command": ["sleep", "3600"],
                "livenessProbe": {"exec": {"command": ["false"]}, "periodSeconds": 1, "failureThreshold": 2},
            }]},
        }),
    )
    .await?;
    wait_pod(
        env,
        &pods,
        "unhealthy",
        "a liveness restart",
        Duration::from_secs(60),
        |p| restart_count(p) >= 1,
    )
    .await?;
    Ok(())
}

#[tokio::test]
async fn an_image_change_restarts_the_container_in_place_on_the_new_version() -> Result<()> {
    let env = shared().await?;
    let versions = etcd_versions(env);
    let [new, old, ..] = versions.as_slice() else {
        eprintln!("skipped: needs two etcd versions, the environment has {versions:?}");
        return Ok(());
    };
    let ns = env.create_namespace("image-change").await?;
    let pods: Api<Pod> = Api::namespaced(env.client().await?, &ns);
    create_pod(
        &pods,
        serde_json::json!({
            "metadata": {"name": "versioned"},
            "spec": {"containers": [{
                "name": "main", "image": format!("gcr.io/etcd-development/etcd:{old}"),
                "command": ["sh", "-c", "etcd --version; exec sleep 3600"],
            }]},
        }),
    )
    .await?;
    let before = wait_pod(
        env,
        &pods,
        "versioned",
        "the pod to run",
        Duration::from_secs(60),
        |p| condition(p, "Ready"),
    )
    .await?;
    let first_pid = container_pid(&before).context("no container id")?;

    // Only the image of a running Pod's container may change; kubelet then restarts that
    // container with the new image, in the same Pod (same IP, same volumes).
    let patch = serde_json::json!({"spec": {"containers": [{
        "name": "main", "image": format!("gcr.io/etcd-development/etcd:{new}"),
    }]}});
    pods.patch(
        "versioned",
        &kube::api::PatchParams::default(),
        &kube::api::Patch::Strategic(&patch),
    )
    .await?;
    let after = wait_pod(
        env,
        &pods,
        "versioned",
        "the container to restart on the new image",
        Duration::from_secs(60),
        |p| restart_count(p) == 1 && condition(p, "Ready"),
    )
    .await?;
    assert_ne!(container_pid(&after), Some(first_pid));
    assert_eq!(
        after.status.as_ref().and_then(|s| s.pod_ip.clone()),
        before.status.as_ref().and_then(|s| s.pod_ip.clone()),
        "same Pod, same IP"
    );
    let image = after
        .status
        .as_ref()
        .and_then(|s| s.container_statuses.as_ref())
        .and_then(|c| c.first())
        .map(|c| c.image.clone())
        .unwrap_or_default();
    assert!(image.ends_with(new.as_str()), "status reports {image}");
    // Ready comes with the process start (no probe), before `etcd --version` has printed.
    let runner = runner(env);
    let logs = wait_for(
        "both etcd versions in the container's log",
        Duration::from_secs(30),
        || async {
            let logs = runner.pod_logs(&ns, "versioned");
            [old, new]
                .iter()
                .all(|v| logs.contains(v.trim_start_matches('v')))
                .then_some(logs)
        },
    )
    .await;
    assert!(
        logs.is_ok(),
        "etcd {old} then {new} ran: {}",
        runner.pod_logs(&ns, "versioned")
    );
    Ok(())
}

/// The pod runner of the shared environment (these are its own tests).
/// The versions of the etcd images the environment loaded (tests/test-images.yaml includes the
/// etcd plugin's declarations), in declared order.
fn etcd_versions(env: &TestEnv) -> Vec<String> {
    env.images()
        .iter()
        .filter(|image| image.repository() == "gcr.io/etcd-development/etcd")
        .map(|image| image.tag().to_owned())
        .collect()
}

/// `etcdctl` of the loaded etcd image of `version`.
fn etcdctl(env: &TestEnv, version: &str) -> Result<std::path::PathBuf> {
    env.image(&format!("gcr.io/etcd-development/etcd:{version}"))
        .and_then(|image| image.program("etcdctl"))
        .with_context(|| format!("no etcd image {version} loaded: tests/test-images.yaml includes guest-etcd's declarations"))
}

fn runner(env: &TestEnv) -> &policy_host_testenv::PodRunnerHandle {
    env.pod_runner()
        .expect("shared() runs Pods on the pod runner")
}
