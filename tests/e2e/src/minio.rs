//! A real MinIO server for the suites that back up to S3: built on demand (the test
//! environment's generic Go build; the `mc` image the etcd plugins declare in
//! `guest-etcd/test-images-s3.yaml` loaded into the node), started on the node's address (the bridge's gateway, which Pods and the test process both reach),
//! with `mc` to look into its buckets.

use std::collections::BTreeSet;
use std::net::{Ipv4Addr, SocketAddr, TcpListener};
use std::path::PathBuf;
use std::time::Duration;

use policy_host_testenv::TestEnv;
use policy_host_testenv::binaries::GoPrograms;
use serde_json::Value;

use crate::etcd::eventually;

/// The MinIO server's Go module (a pseudo-version of github.com/minio/minio).
const MINIO_MODULE: &str = "github.com/minio/minio@v0.0.0-20260212201848-7aac2a2c5b7c";

/// MinIO's address: the real node's, where the control plane also serves.
pub const MINIO_IP: Ipv4Addr = policy_host_testenv::node::NODE_IP;
/// MinIO's root user, which a test's credentials Secret also holds.
pub const ACCESS_KEY: &str = "policyhoste2e";
/// MinIO's root password, which a test's credentials Secret also holds.
pub const SECRET_KEY: &str = "policyhoste2esecret";
/// A MinIO server on `MINIO_IP` with its data in a directory of its own; killed and its
/// directory removed on drop.
pub struct Minio {
    /// `http://10.244.0.1:<port>`.
    pub endpoint: String,
    mc: PathBuf,
    /// Its data directory (scratch files of a test may go there too).
    pub dir: PathBuf,
    _server: tokio::process::Child,
}

impl Minio {
    /// Builds MinIO and mc if needed (and imports the `mc` image into the node), starts the
    /// server on a free port and waits until its liveness endpoint answers.
    pub async fn start(env: &'static TestEnv) -> anyhow::Result<Minio> {
        let build = env.binaries().clone();
        let recipe = GoPrograms {
            modules: vec![MINIO_MODULE.to_owned()],
            programs: vec![("minio".to_owned(), "github.com/minio/minio".to_owned())],
        };
        let minio_dir = tokio::task::spawn_blocking(move || build.build_go(&recipe)).await??;
        let images = env
            .provide_images(&crate::repo_root().join("guest-etcd/test-images-s3.yaml"))
            .await?;
        let mc = images
            .iter()
            .find_map(|image| image.program("mc"))
            .ok_or_else(|| anyhow::anyhow!("guest-etcd/test-images-s3.yaml declares no mc"))?;
        let port = TcpListener::bind(SocketAddr::from((MINIO_IP, 0)))?
            .local_addr()?
            .port();
        let console = TcpListener::bind(SocketAddr::from((MINIO_IP, 0)))?
            .local_addr()?
            .port();
        let dir =
            std::env::temp_dir().join(format!("policy-host-minio-{}-{port}", std::process::id()));
        std::fs::create_dir_all(&dir)?;
        let server = tokio::process::Command::new(minio_dir.join("minio"))
            .arg("server")
            .arg(&dir)
            .args(["--address", &format!("{MINIO_IP}:{port}")])
            .args(["--console-address", &format!("{MINIO_IP}:{console}")])
            .arg("--quiet")
            .env("MINIO_ROOT_USER", ACCESS_KEY)
            .env("MINIO_ROOT_PASSWORD", SECRET_KEY)
            .env("MINIO_BROWSER", "off")
            .stdout(std::process::Stdio::null())
            .kill_on_drop(true)
            .spawn()?;
        let minio = Minio {
            endpoint: format!("http://{MINIO_IP}:{port}"),
            mc,
            dir,
            _server: server,
        };
        let http = reqwest::Client::builder()
            .timeout(Duration::from_secs(2))
            .build()?;
        let live = format!("{}/minio/health/live", minio.endpoint);
        eventually("MinIO to be live", Duration::from_secs(60), || async {
            match http.get(&live).send().await {
                Ok(answer) if answer.status().is_success() => Ok(()),
                Ok(answer) => Err(format!("{live}: {}", answer.status())),
                Err(e) => Err(format!("{live}: {e}")),
            }
        })
        .await?;
        Ok(minio)
    }

    /// Runs `mc <args>` against this server (alias `s3`) and returns its stdout.
    pub async fn mc(&self, args: &[&str]) -> anyhow::Result<Vec<u8>> {
        let host = self
            .endpoint
            .replacen("://", &format!("://{ACCESS_KEY}:{SECRET_KEY}@"), 1);
        let output = tokio::process::Command::new(&self.mc)
            .arg("--config-dir")
            .arg(self.dir.join(".mc"))
            .args(args)
            .env("MC_HOST_s3", host)
            .kill_on_drop(true)
            .output()
            .await?;
        anyhow::ensure!(
            output.status.success(),
            "mc {args:?} failed: {}",
            String::from_utf8_lossy(&output.stderr).trim()
        );
        Ok(output.stdout)
    }

    /// Object names in `bucket`, recursively.
    pub async fn objects(&self, bucket: &str) -> anyhow::Result<BTreeSet<String>> {
        let text = self
            .mc(&["ls", "--json", "--recursive", &format!("s3/{bucket}")])
            .await?;
        String::from_utf8_lossy(&text)
            .lines()
            .filter(|l| !l.trim().is_empty())
            .map(|line| {
                let entry: Value = serde_json::from_str(line)?;
                entry["key"]
                    .as_str()
                    .map(str::to_owned)
                    .ok_or_else(|| anyhow::anyhow!("no key in {line}"))
            })
            .collect()
    }
}

impl Drop for Minio {
    fn drop(&mut self) {
        // The server is killed by its handle (`kill_on_drop`); its data goes with it.
        let _ = std::fs::remove_dir_all(&self.dir);
    }
}
