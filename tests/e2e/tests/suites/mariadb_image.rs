//! The MariaDB image the MariaDB plugin declares beside itself (`guest-mariadb/test-images.yaml`:
//! Debian 12's MariaDB 10.11 packages and a small entrypoint), made by the test environment's
//! one image builder and run on the real node: a Pod from it runs `mariadbd`, sets the root
//! password and the replication account from its environment as the official image does, and
//! answers queries from the test process over the Pod network, through the image's own client.

use std::time::Duration;

use k8s_openapi::api::core::v1::Pod;
use kube::api::{Api, PostParams};
use policy_host_e2e::etcd::{eventually, pod_ready};
use policy_host_e2e::{init_logging, repo_root};
use policy_host_testenv::images::MadeImage;
use policy_host_testenv::shared_node;
use serde_json::json;

/// A cold first start initialises the data directory (mariadb-install-db) before it listens.
const READY: Duration = Duration::from_secs(180);
const ROOT_PASSWORD: &str = "e2e-root-secret";

/// Runs `sql` as `user` on the server at `host` with the image's own `mariadb` client (the
/// MariaDB plugin's suite, `mariadb_cluster`, asks its servers with it too).
pub(crate) fn query(
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
