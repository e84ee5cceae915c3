//! The MariaDB image the MariaDB plugin declares beside itself (`guest-mariadb/test-images.yaml`:
//! Debian 12's MariaDB 10.11 packages and a small entrypoint), made by the test environment's
//! one image builder and run on the real node: a Pod from it runs `mariadbd`, sets the root
//! password and the replication account from its environment as the official image does, and
//! answers queries from the test process over the Pod network, through the image's own client.

use std::time::Duration;

use k8s_openapi::api::core::v1::Pod;
use kube::api::{Api, PostParams};
use policy_host_e2e::etcd::eventually;
use policy_host_e2e::{init_logging, repo_root};
use policy_host_testenv::images::MadeImage;
use policy_host_testenv::shared_node;
use serde_json::json;

/// A cold first start initialises the data directory (mariadb-install-db) before it listens.
const READY: Duration = Duration::from_secs(180);
const ROOT_PASSWORD: &str = "e2e-root-secret";

/// Runs `sql` as `user` on the server at `host` with the image's own `mariadb` client.
fn query(
    image: &MadeImage,
    host: &str,
    user: &str,
    password: &str,
    sql: &str,
) -> Result<String, String> {
    let mut command = image.command("mariadb").map_err(|e| e.to_string())?;
    // --no-defaults: this machine's option files are not the image's.
    let output = command
        .args([
            "--no-defaults",
            "--connect-timeout=5",
            "--batch",
            "--skip-column-names",
        ])
        .args(["-h", host, "-u", user])
        .arg(format!("-p{password}"))
        .args(["-e", sql])
        .output()
        .map_err(|e| format!("running mariadb: {e}"))?;
    if output.status.success() {
        Ok(String::from_utf8_lossy(&output.stdout).into_owned())
    } else {
        Err(String::from_utf8_lossy(&output.stderr).into_owned())
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_pod_from_the_declared_mariadb_image_runs_mariadbd_and_answers_queries()
-> anyhow::Result<()> {
    init_logging();
    let env = shared_node().await?;
    let images = env
        .provide_images(&repo_root().join("guest-mariadb/test-images.yaml"))
        .await?;
    let image = images
        .iter()
        .find(|image| image.repository() == "mariadb")
        .ok_or_else(|| {
            anyhow::anyhow!("guest-mariadb/test-images.yaml declares no mariadb image")
        })?;
    let namespace = env.create_namespace("mariadb-image").await?;
    let pods: Api<Pod> = Api::namespaced(env.client().await?, &namespace);
    let server: Pod = serde_json::from_value(json!({
        "apiVersion": "v1", "kind": "Pod",
        "metadata": { "name": "mariadb-0" },
        "spec": {
            "securityContext": {
                "runAsNonRoot": true, "runAsUser": 65532, "runAsGroup": 65532, "fsGroup": 65532,
                "seccompProfile": { "type": "RuntimeDefault" },
            },
            "containers": [{
                "name": "mariadb",
                "image": image.name(),
                // As the MariaDB plugin's Pods start it: arguments only, the image's entrypoint.
                "args": ["--server-id=1", "--log-bin", "--report-host=mariadb-0"],
                "env": [
                    { "name": "MARIADB_ROOT_PASSWORD", "value": ROOT_PASSWORD },
                    { "name": "MARIADB_ROOT_HOST", "value": "%" },
                    { "name": "MARIADB_REPLICATION_USER", "value": "repl" },
                    { "name": "MARIADB_REPLICATION_PASSWORD", "value": "e2e-repl-secret" },
                ],
                "ports": [{ "name": "mysql", "containerPort": 3306 }],
                "readinessProbe": { "tcpSocket": { "port": "mysql" }, "periodSeconds": 1 },
                "resources": { "limits": { "memory": "512Mi" } },
                "volumeMounts": [{ "name": "data", "mountPath": "/var/lib/mysql" }],
            }],
            "volumes": [{ "name": "data", "emptyDir": {} }],
        },
    }))?;
    pods.create(&PostParams::default(), &server).await?;
    let ready = eventually("mariadb-0 Ready on the real node", READY, || async {
        let pod = pods.get("mariadb-0").await.map_err(|e| e.to_string())?;
        let status = pod.status.unwrap_or_default();
        let ready = status
            .conditions
            .unwrap_or_default()
            .iter()
            .any(|c| c.type_ == "Ready" && c.status == "True");
        match (ready, status.pod_ip) {
            (true, Some(ip)) => Ok(ip),
            _ => Err(format!(
                "phase {:?}, containers {:?}",
                status.phase, status.container_statuses
            )),
        }
    })
    .await;
    let pod_ip = match ready {
        Ok(ip) => ip,
        Err(e) => {
            eprintln!("{}", env.pod_logs(&namespace, "mariadb-0").await);
            return Err(e);
        }
    };

    // Ready (the port open) means the final server listens: the entrypoint's initialising
    // server runs without networking, so root's remote account exists by then.
    let answer = query(
        image,
        &pod_ip,
        "root",
        ROOT_PASSWORD,
        "SELECT VERSION(); SELECT COUNT(*) FROM mysql.user WHERE User = 'repl' AND Host = '%'; SELECT @@log_bin, @@server_id",
    );
    let answer = match answer {
        Ok(answer) => answer,
        Err(e) => {
            eprintln!("{}", env.pod_logs(&namespace, "mariadb-0").await);
            anyhow::bail!("root's query over the Pod network failed: {e}");
        }
    };
    let lines: Vec<&str> = answer.lines().collect();
    assert!(
        lines.first().is_some_and(|v| v.starts_with("10.11.")),
        "the server is Debian 12's MariaDB 10.11: {answer}"
    );
    assert_eq!(
        lines.get(1),
        Some(&"1"),
        "the replication account exists: {answer}"
    );
    assert_eq!(
        lines.get(2),
        Some(&"1\t1"),
        "the Pod's arguments reached mariadbd: {answer}"
    );

    // The password is the one the environment set, not an open root.
    let refused = query(image, &pod_ip, "root", "not-the-password", "SELECT 1")
        .expect_err("a wrong root password is refused");
    assert!(refused.contains("Access denied"), "{refused}");

    // The replication account was made outside the binary log (each server's own, as the
    // plugin requires): the server has written no transaction yet.
    let gtid = query(
        image,
        &pod_ip,
        "root",
        ROOT_PASSWORD,
        "SELECT @@gtid_binlog_pos",
    )
    .map_err(|e| anyhow::anyhow!("{e}"))?;
    assert_eq!(gtid.trim(), "", "no GTID before any write: {gtid}");
    Ok(())
}

/// The MariaDB plugin's example (`deploy/examples/mariadb-cluster.yaml`), its bundle's plugin
/// ConfigMap loaded as an admin would load it (`policies/mariadb.yaml`: sessions on `mysql`,
/// the image grant, the generated credentials), on the declared image: the plugin creates the
/// servers, elects a primary, and the primary takes writes with the root password the host
/// generated for it.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_example_cluster_gets_a_primary_on_the_declared_image() -> anyhow::Result<()> {
    use k8s_openapi::api::core::v1::{ConfigMap, Secret};
    use kube::api::{ApiResource, DynamicObject, Patch, PatchParams};
    use kube::core::GroupVersionKind;
    use policy_host::decide::Limits;
    use policy_host_e2e::{HostUnderTest, install_crd, plugins};
    use serde::Deserialize as _;

    init_logging();
    let env = shared_node().await?;
    let images = env
        .provide_images(&repo_root().join("guest-mariadb/test-images.yaml"))
        .await?;
    let image = images
        .iter()
        .find(|image| image.repository() == "mariadb")
        .ok_or_else(|| {
            anyhow::anyhow!("guest-mariadb/test-images.yaml declares no mariadb image")
        })?;
    let client = env.client().await?;
    install_crd(&client, "deploy/crds/mariadbcluster.yaml").await?;
    let namespace = env.create_namespace("mariadb-example").await?;
    let host = HostUnderTest::start_loading_config_maps(env, &namespace, Limits::default()).await?;

    // The bundle's plugin ConfigMap, with the grants the admin signed off.
    let bundle = std::fs::read_to_string(repo_root().join("policies/mariadb.yaml"))?;
    let plugin_config_map = serde_yaml::Deserializer::from_str(&bundle)
        .filter_map(|document| serde_yaml::Value::deserialize(document).ok())
        .find(|document| document["kind"] == "ConfigMap")
        .ok_or_else(|| anyhow::anyhow!("policies/mariadb.yaml holds no plugin ConfigMap"))?;
    let mut plugin_config_map: ConfigMap = serde_yaml::from_value(plugin_config_map)?;
    plugin_config_map.metadata.namespace = None;
    let config_maps: Api<ConfigMap> = Api::namespaced(client.clone(), &namespace);
    plugins::apply_pack(&config_maps, plugin_config_map, "mariadb-image-e2e").await?;

    let example: serde_json::Value = serde_yaml::from_str(&std::fs::read_to_string(
        repo_root().join("deploy/examples/mariadb-cluster.yaml"),
    )?)?;
    let name = example["metadata"]["name"]
        .as_str()
        .unwrap_or("example-db")
        .to_owned();
    assert_eq!(
        format!(
            "mariadb:{}",
            example["spec"]["version"].as_str().unwrap_or_default()
        ),
        image.name(),
        "the example runs the declared image"
    );
    let clusters: Api<DynamicObject> = Api::namespaced_with(
        client.clone(),
        &namespace,
        &ApiResource::from_gvk_with_plural(
            &GroupVersionKind::gvk("mariadb.policy-host.io", "v1alpha1", "MariaDBCluster"),
            "mariadbclusters",
        ),
    );
    clusters
        .patch(
            &name,
            &PatchParams::apply("mariadb-image-e2e").force(),
            &Patch::Apply(&example),
        )
        .await?;

    let pods: Api<Pod> = Api::namespaced(client.clone(), &namespace);
    let primary = eventually(
        "the example's primary elected and Ready",
        Duration::from_secs(300),
        || async {
            let cluster = clusters.get(&name).await.map_err(|e| e.to_string())?;
            let status = &cluster.data["status"];
            let primary = status["currentPrimary"]
                .as_str()
                .ok_or_else(|| format!("no primary yet; status {status}"))?
                .to_owned();
            let pod = pods.get(&primary).await.map_err(|e| e.to_string())?;
            let pod_status = pod.status.unwrap_or_default();
            let ready = pod_status
                .conditions
                .unwrap_or_default()
                .iter()
                .any(|c| c.type_ == "Ready" && c.status == "True");
            match (ready, pod_status.pod_ip) {
                (true, Some(ip)) => Ok((primary, ip)),
                _ => Err(format!("primary {primary} not Ready; status {status}")),
            }
        },
    )
    .await;
    let (primary, ip) = match primary {
        Ok(found) => found,
        Err(e) => {
            for ordinal in 0..3 {
                eprintln!(
                    "{}",
                    env.pod_logs(&namespace, &format!("{name}-{ordinal}")).await
                );
            }
            host.stop().await;
            return Err(e);
        }
    };

    // The host generated the root password on the plugin's first read; the primary has it.
    let secrets: Api<Secret> = Api::namespaced(client.clone(), &namespace);
    let secret = secrets.get(&format!("{name}-credentials")).await?;
    let root_password = secret
        .data
        .as_ref()
        .and_then(|data| data.get("root-password"))
        .map(|value| String::from_utf8_lossy(&value.0).into_owned())
        .ok_or_else(|| anyhow::anyhow!("the credentials Secret has no root-password"))?;
    let written = query(
        image,
        &ip,
        "root",
        &root_password,
        "CREATE DATABASE IF NOT EXISTS e2e; CREATE TABLE IF NOT EXISTS e2e.t (k INT PRIMARY KEY); REPLACE INTO e2e.t VALUES (1); SELECT @@read_only, COUNT(*) FROM e2e.t",
    )
    .map_err(|e| anyhow::anyhow!("writing to the primary {primary} at {ip}: {e}"))?;
    assert_eq!(
        written.trim(),
        "0\t1",
        "the primary takes writes: {written}"
    );
    host.stop().await;
    Ok(())
}
