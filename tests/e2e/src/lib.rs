//! Fixtures shared by the end-to-end suites: a policy-host running in-process against the
//! shared real control plane, scoped to one test namespace, plus CRD installation and small
//! waiting helpers.

pub mod apps;
pub mod campaign;
pub mod etcd;
pub mod install;
pub mod minio;
pub mod plugins;
pub mod registry;
pub mod writes;

use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Duration;

use k8s_openapi::apiextensions_apiserver::pkg::apis::apiextensions::v1::CustomResourceDefinition;
use kube::Client;
use kube::api::{Api, Patch, PatchParams};
use policy_host::decide::Limits;
use policy_host::{Running, Settings};
use policy_host_testenv::{TestEnv, wait_for};
use tokio::sync::oneshot;

/// The repository root.
pub fn repo_root() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("../..")
}

/// Waits until the disruption controller has computed the PodDisruptionBudget `name`: it counts
/// `expected` Pods and allows `allowed` evictions. A budget it cannot compute (one with
/// `maxUnavailable` over Pods a custom resource owns) counts none and allows none, guarding
/// nothing and holding a node drain forever.
pub async fn budget_computed(
    client: &Client,
    namespace: &str,
    name: &str,
    (expected, allowed): (i32, i32),
    timeout: Duration,
) -> anyhow::Result<()> {
    let budgets: Api<k8s_openapi::api::policy::v1::PodDisruptionBudget> =
        Api::namespaced(client.clone(), namespace);
    etcd::eventually(
        &format!("the budget {name} computed: {expected} Pods, {allowed} evictions allowed"),
        timeout,
        || async {
            let status = budgets
                .get(name)
                .await
                .map_err(|e| e.to_string())?
                .status
                .ok_or("no status")?;
            (status.expected_pods == Some(expected) && status.disruptions_allowed == Some(allowed))
                .then_some(())
                .ok_or_else(|| format!("{status:?}"))
        },
    )
    .await
}

/// Server-side applies a CRD from a YAML file of the repository and waits until it is served.
pub async fn install_crd(client: &Client, relative_path: &str) -> anyhow::Result<String> {
    let text = std::fs::read_to_string(repo_root().join(relative_path))?;
    let crd: CustomResourceDefinition = serde_yaml::from_str(&text)?;
    install_crd_object(client, crd).await
}

/// Server-side applies a CRD object and waits until it is Established.
pub async fn install_crd_object(
    client: &Client,
    crd: CustomResourceDefinition,
) -> anyhow::Result<String> {
    let name = crd.metadata.name.clone().unwrap_or_default();
    let crds: Api<CustomResourceDefinition> = Api::all(client.clone());
    crds.patch(
        &name,
        &PatchParams::apply("policy-host-e2e").force(),
        &Patch::Apply(&crd),
    )
    .await?;
    wait_for(
        &format!("CRD {name} established"),
        Duration::from_secs(60),
        || async {
            let crd = crds.get_opt(&name).await.ok().flatten()?;
            let established = crd
                .status?
                .conditions?
                .iter()
                .any(|c| c.type_ == "Established" && c.status == "True");
            established.then_some(())
        },
    )
    .await?;
    Ok(name)
}

/// A policy-host running in this process; stops when dropped.
pub struct HostUnderTest {
    stop: Option<oneshot::Sender<()>>,
    task: tokio::task::JoinHandle<()>,
    /// The running host's handles.
    pub running: Running,
    /// The host's artifact cache, when it has one of its own: removed with the host, so runs
    /// do not pile compiled plugins up in the temporary directory.
    artifacts: Option<tempfile::TempDir>,
}

impl HostUnderTest {
    /// Starts the host with the given plugin files, watching only `namespace`.
    pub async fn start(
        env: &TestEnv,
        plugins: &[PathBuf],
        namespace: &str,
        limits: Limits,
    ) -> anyhow::Result<Self> {
        let settings = Self::settings(namespace, limits)?;
        Self::start_with(
            env,
            Settings {
                policy_files: plugins.to_vec(),
                ..settings
            },
        )
        .await
    }

    /// Starts the host with no plugin files, loading plugin ConfigMaps from `namespace` (and
    /// reconciling there), with a fresh artifact cache that is removed with the host.
    pub async fn start_loading_config_maps(
        env: &TestEnv,
        namespace: &str,
        limits: Limits,
    ) -> anyhow::Result<Self> {
        let artifacts = tempfile::Builder::new()
            .prefix(&format!("policy-host-artifacts-{namespace}-"))
            .tempdir()?;
        let settings = Settings {
            plugin_namespace: Some(namespace.to_string()),
            artifact_cache: Some(artifacts.path().to_path_buf()),
            ..Self::settings(namespace, limits)?
        };
        let mut host = Self::start_with(env, settings).await?;
        host.artifacts = Some(artifacts);
        Ok(host)
    }

    /// Settings for a host scoped to `namespace`, admin endpoint on a free port, no plugins.
    pub fn settings(namespace: &str, limits: Limits) -> anyhow::Result<Settings> {
        Ok(Settings {
            policy_files: Vec::new(),
            plugin_namespace: None,
            artifact_cache: None,
            limits,
            admin_addr: Some("127.0.0.1:0".parse()?),
            controller: policy_host::controller::ControllerOptions {
                concurrency: 4,
                namespace: Some(namespace.to_string()),
                ..Default::default()
            },
            leader_election: None,
            trust: Default::default(),
            max_pulled_plugin_bytes: policy_host::load::oci::DEFAULT_MAX_PULL_BYTES,
        })
    }

    /// Starts the host with `settings`.
    pub async fn start_with(env: &TestEnv, settings: Settings) -> anyhow::Result<Self> {
        Self::start_with_client(env.client().await?, settings).await
    }

    /// Starts the host with `settings`, talking to the API server through `client` (a test
    /// may wrap the client's service, e.g. to delay some requests).
    pub async fn start_with_client(client: Client, settings: Settings) -> anyhow::Result<Self> {
        let (stop, stopped) = oneshot::channel::<()>();
        let (started_tx, started_rx) = oneshot::channel();
        let task = tokio::spawn(async move {
            let shutdown = async {
                let _ = stopped.await;
            };
            let mut started_tx = Some(started_tx);
            let outcome = policy_host::run(client, settings, shutdown, |running| {
                if let Some(tx) = started_tx.take() {
                    let _ = tx.send(running.clone());
                }
            })
            .await;
            if let Err(error) = outcome {
                tracing::error!(%error, "policy-host under test ended with an error");
            }
        });
        let running = tokio::time::timeout(Duration::from_secs(120), started_rx)
            .await
            .map_err(|_| anyhow::anyhow!("policy-host did not start within 120 s"))?
            .map_err(|_| {
                anyhow::anyhow!("policy-host stopped before it started; see the log above")
            })?;
        Ok(Self {
            stop: Some(stop),
            task,
            running,
            artifacts: None,
        })
    }

    /// Stops the host and waits for it to finish (like a process exit).
    pub async fn stop(mut self) {
        if let Some(stop) = self.stop.take() {
            let _ = stop.send(());
        }
        let _ = tokio::time::timeout(Duration::from_secs(30), &mut self.task).await;
    }
}

impl HostUnderTest {
    /// Ends the host the way a killed process ends: no graceful stop, no Lease released (its
    /// tasks, controllers included, are aborted).
    pub fn kill(mut self) {
        self.stop.take();
        self.task.abort();
    }
}

impl Drop for HostUnderTest {
    fn drop(&mut self) {
        if let Some(stop) = self.stop.take() {
            let _ = stop.send(());
        }
        self.task.abort();
    }
}

/// A layer of a host under test's client that counts the writes (every request but a GET) to
/// paths containing `resource`: what the host sends, whatever it believes it sent.
#[derive(Clone)]
pub struct CountingWrites<S> {
    inner: S,
    resource: &'static str,
    writes: Arc<AtomicU64>,
}

impl<S, B> tower::Service<http::Request<B>> for CountingWrites<S>
where
    S: tower::Service<http::Request<B>>,
{
    type Response = S::Response;
    type Error = S::Error;
    type Future = S::Future;

    fn poll_ready(
        &mut self,
        cx: &mut std::task::Context<'_>,
    ) -> std::task::Poll<Result<(), Self::Error>> {
        self.inner.poll_ready(cx)
    }

    fn call(&mut self, request: http::Request<B>) -> Self::Future {
        if request.method() != http::Method::GET && request.uri().path().contains(self.resource) {
            self.writes.fetch_add(1, Ordering::Relaxed);
        }
        self.inner.call(request)
    }
}

/// A client of `env`'s API server that counts its writes to `resource` (e.g. `/configmaps`)
/// into `writes`: give it to [`HostUnderTest::start_with_client`].
pub async fn client_counting_writes(
    env: &TestEnv,
    resource: &'static str,
    writes: Arc<AtomicU64>,
) -> anyhow::Result<Client> {
    Ok(
        kube::client::ClientBuilder::try_from(env.kube_config().await?)?
            .with_layer(&tower::layer::layer_fn(move |inner| CountingWrites {
                inner,
                resource,
                writes: writes.clone(),
            }))
            .build(),
    )
}

/// Installs a tracing subscriber once for the test process (`RUST_LOG` controls it).
pub fn init_logging() {
    let _ = tracing_subscriber::fmt()
        .with_env_filter(
            tracing_subscriber::EnvFilter::try_from_default_env()
                .unwrap_or_else(|_| "info,kube=warn,policy_host=debug".into()),
        )
        .with_test_writer()
        .try_init();
}

/// The `Probe` kind the misbehaving test plugin reconciles.
pub fn probes() -> kube::api::ApiResource {
    kube::api::ApiResource::from_gvk_with_plural(
        &kube::core::GroupVersionKind::gvk("test.policy-host.io", "v1", "Probe"),
        "probes",
    )
}

/// The CRD of `Probe`: free-form spec and status, with the status subresource.
pub fn probe_crd() -> anyhow::Result<CustomResourceDefinition> {
    Ok(policy_host_testenv::probe_crd()?)
}

/// CPU time this process has used (user + system, `/proc/self/stat` fields 14 and 15), for the
/// benches' decisions per CPU-second: the host in-process and the bench, not the API server.
pub fn process_cpu_time() -> Duration {
    let ticks = std::fs::read_to_string("/proc/self/stat")
        .ok()
        .and_then(|stat| {
            let rest = stat.rsplit_once(')')?.1.to_owned();
            let fields: Vec<u64> = rest
                .split_whitespace()
                .skip(11)
                .take(2)
                .filter_map(|f| f.parse().ok())
                .collect();
            Some(fields.iter().sum::<u64>())
        })
        .unwrap_or(0);
    // The kernel's USER_HZ is 100 on every Linux this runs on.
    Duration::from_millis(ticks * 10)
}
