//! The `policy-host` binary: parse the command line, then run the host or a plugin tool.

use std::net::SocketAddr;
use std::path::PathBuf;
use std::time::Duration;

use anyhow::Context;
use clap::{Parser, Subcommand};
use policy_host::controller::ControllerOptions;
use policy_host::decide::{Limits, Sandbox};
use policy_host::leader::{self, LeaseSettings};
use policy_host::load::pack::LimitsSpec;
use policy_host::plugin_cli;
use policy_host::shard::Shard;
use policy_host::telemetry::{self, LogFormat};

#[derive(Parser)]
#[command(
    name = "policy-host",
    version,
    about = "A Kubernetes operator whose reconcile decisions come from sandboxed WebAssembly plugins"
)]
struct Cli {
    /// Log format.
    #[arg(long, value_enum, default_value_t = LogFormat::Text, env = "POLICY_HOST_LOG_FORMAT", global = true)]
    log_format: LogFormat,
    #[command(subcommand)]
    command: Command,
}

// Parsed once per process from the command line: the size of its largest variant costs nothing.
#[allow(clippy::large_enum_variant)]
#[derive(Subcommand)]
enum Command {
    /// Run the operator (uses the in-cluster config or $KUBECONFIG): plugins from files and
    /// from ConfigMaps labelled `policy-host.io/plugin=true` in --plugin-namespace.
    Run {
        /// A plugin component (.wasm) to load, granted what it asks for; repeat for several.
        #[arg(long = "policy")]
        policies: Vec<PathBuf>,
        /// Load plugin ConfigMaps from this namespace (the host's own, in a Pod).
        #[arg(long, env = "POD_NAMESPACE")]
        plugin_namespace: Option<String>,
        /// Cache compiled plugins in this directory (writable by the host only).
        #[arg(long, env = "POLICY_HOST_ARTIFACT_CACHE")]
        artifact_cache: Option<PathBuf>,
        /// Where to serve /healthz, /readyz and /metrics.
        #[arg(long, default_value = "0.0.0.0:8080", env = "POLICY_HOST_ADMIN_ADDR")]
        admin_addr: SocketAddr,
        #[command(flatten)]
        limits: LimitArgs,
        /// Parents of one policy reconciled at the same time.
        #[arg(long, default_value_t = 8)]
        concurrency: u16,
        /// Watch only this namespace (default: every namespace).
        #[arg(long)]
        namespace: Option<String>,
        /// Namespace of the leader-election Lease (default: `POD_NAMESPACE`). Without one,
        /// leader election is off and this process always leads: run one replica only.
        #[arg(long, env = "POD_NAMESPACE")]
        lease_namespace: Option<String>,
        /// Name of the leader-election Lease; replicas of one deployment share it. With
        /// --shards above 1, each shard's replicas elect through `<lease-name>-shard-<shard>`.
        #[arg(long, default_value = "policy-host")]
        lease_name: String,
        /// Split the parents among this many host deployments (shards): a parent labelled
        /// `policy-host.io/shard=<i>` belongs to shard i, any other to a stable hash of its
        /// namespace and name. Every deployment must be given the same number.
        #[arg(long, default_value_t = 1, env = "POLICY_HOST_SHARDS")]
        shards: u32,
        /// The shard this deployment reconciles, 0 to --shards minus 1.
        #[arg(long, default_value_t = 0, env = "POLICY_HOST_SHARD")]
        shard: u32,
        /// Take part in leader election (`--leader-election false`: always lead).
        #[arg(long, default_value_t = true, action = clap::ArgAction::Set)]
        leader_election: bool,
        /// Load only plugin ConfigMaps signed by this ed25519 public key (PEM); repeat for
        /// several. Without any (and without --trusted-keys-pem), every pack in
        /// --plugin-namespace loads.
        #[arg(long = "trusted-key", value_name = "PUBLIC_KEY_PEM")]
        trusted_keys: Vec<PathBuf>,
        /// The same, as PEM text (one or more `PUBLIC KEY` blocks). In a cluster, set it in the
        /// host's pod spec, where only who may change the host's Deployment can change it;
        /// never in a ConfigMap of the plugin namespace, which plugin authors can write.
        #[arg(
            long = "trusted-keys-pem",
            env = "POLICY_HOST_TRUSTED_KEYS",
            value_name = "PEM"
        )]
        trusted_keys_pem: Option<String>,
        /// The largest component a plugin ConfigMap may have the host pull from an OCI
        /// registry (`data.reference`), in MiB. Compiling takes several times a component's
        /// size in memory: raise the host's memory limit with it.
        #[arg(long, default_value_t = 64, value_name = "MIB")]
        max_pulled_plugin_mib: u64,
    },
    /// Write a new ed25519 key pair for signing plugin packs: `<prefix>.pem` (private, keep it
    /// out of the cluster) and `<prefix>.pub` (for the host's --trusted-key or
    /// POLICY_HOST_TRUSTED_KEYS).
    Keygen {
        /// Path prefix of the two files, e.g. `./plugin-signing`.
        prefix: PathBuf,
    },
    /// Write a new plugin crate from the template compiled into this binary: the Rust SDK and
    /// the contract copied in, native tests, its CRD from its spec type, and an end-to-end test
    /// on a real node (`e2e/`). Next: its README.md.
    NewPlugin {
        /// Plugin name, a DNS label such as `redis` or `my-app`; it names the package and the
        /// resource kind (`my-app`: kind `MyApp`, group `my-app.example.com`).
        name: String,
        /// Where to write it (default: `./<name>`); must not exist or be empty.
        #[arg(long)]
        dir: Option<PathBuf>,
    },
    /// Load a plugin and print what it says about itself, as JSON.
    Describe {
        /// The plugin component (.wasm).
        plugin: PathBuf,
    },
    /// Run a plugin's reconcile loop against an in-memory model of its parent and children,
    /// with no cluster, printing each decision; app-calls and sessions are answered from
    /// --responses. Exits 0 once a decision changes nothing (converged), 1 on a refusal or if
    /// --steps run out.
    ///
    /// The responder file (YAML), app-calls one row per pod and path (method and body are not
    /// matched; pod `*` is every pod), sessions one row per round (the bytes sent since the
    /// last read, none when the server speaks first, and the reply; `sendHex`/`replyHex` for
    /// binary protocols; without `port`, any port):
    ///   appCalls:
    ///     - { pod: "*", path: /health, status: 200, body: '{"health":"true"}' }
    ///     - { pod: example-2, path: /health, error: unreachable }
    ///   sessions:
    ///     - { pod: db-0, port: admin, reply: "HELLO 42\n" }
    ///     - { pod: db-0, port: admin, send: "AUTH x\n", reply: "OK\n" }
    ///     - { pod: db-1, port: admin, error: unreachable }
    #[command(verbatim_doc_comment)]
    Simulate {
        /// The plugin component (.wasm).
        plugin: PathBuf,
        /// The parent custom resource (YAML or JSON).
        #[arg(long)]
        cr: PathBuf,
        /// Scripted answers to app-calls and sessions (YAML); without it every app-call and
        /// session is unreachable.
        #[arg(long)]
        responses: Option<PathBuf>,
        /// Stop after this many decisions.
        #[arg(long, default_value_t = 20)]
        steps: u32,
        /// Print one JSON object per step instead of text.
        #[arg(long)]
        json: bool,
        #[command(flatten)]
        limits: PackLimitArgs,
    },
    /// Check a plugin as the host would load it (component, world, contract version,
    /// self-description within the limits, ConfigMap size) and print the result as JSON.
    Validate {
        /// The plugin component (.wasm).
        plugin: PathBuf,
        #[command(flatten)]
        limits: PackLimitArgs,
    },
    /// Write a plugin ConfigMap (gzip, sha256 pin, label, grants, limits) to stdout as YAML.
    Pack {
        /// The plugin component (.wasm).
        plugin: PathBuf,
        /// ConfigMap name (default: `plugin-<plugin name>`).
        #[arg(long)]
        name: Option<String>,
        /// ConfigMap namespace (default: none, use `kubectl apply -n`).
        #[arg(long)]
        namespace: Option<String>,
        /// Grant app-calls (HTTP) to this port of the plugin's own pods; repeat for several.
        #[arg(long = "grant", value_name = "PORT")]
        grants: Vec<String>,
        /// Grant TCP exchanges with this port of the plugin's own pods; repeat for several.
        #[arg(long = "grant-exchange", value_name = "PORT")]
        exchange_grants: Vec<String>,
        /// Grant every capability the plugin asks for.
        #[arg(long)]
        grant_requested: bool,
        /// Let its parents ask for chaos drills on their own pods (`policy-host.io/chaos`).
        #[arg(long)]
        grant_chaos: bool,
        /// Let it write only this child kind (`pods.v1`, `deployments.apps/v1`); repeat for
        /// several. Without any, every kind it declares.
        #[arg(long = "grant-kind", value_name = "KIND")]
        grant_kinds: Vec<String>,
        /// What its pods may reach of the node: `baseline` (no host namespaces, hostPath,
        /// privileged containers, host ports or extra capabilities) or `privileged`.
        #[arg(long, default_value = "baseline", value_name = "LEVEL")]
        grant_pod_security: String,
        /// Let its pods run images of this repository (every tag and digest), or under this
        /// prefix when it ends in `/`; repeat for several. Without any, any image.
        #[arg(long = "grant-image", value_name = "REPOSITORY")]
        grant_images: Vec<String>,
        /// Let it read credentials from this Secret of its parent's namespace: a name, or a
        /// pattern with `{parent}` (`{parent}-credentials`); with `:key,key` the host creates
        /// the Secret with random values for those keys when it is absent. Repeat for several.
        #[arg(long = "grant-secret", value_name = "NAME[:KEY,...]")]
        grant_secrets: Vec<String>,
        /// Load as a shadow of the active plugin instead of replacing it.
        #[arg(long)]
        shadow: bool,
        /// Roll out over the active plugin instead of replacing it: the new version decides
        /// only for the parents this selects (YAML, e.g. `{selector: {matchLabels: {ring:
        /// canary}}, percent: 10, maxFailureRate: 0.2, minDecisions: 10}`), and is rolled back
        /// when it fails more than that.
        #[arg(long, value_name = "YAML", conflicts_with = "shadow")]
        rollout: Option<String>,
        /// Sign the pack (name, component, grants, limits, mode, rollout and serial) with this ed25519
        /// private key (PEM, PKCS#8), for hosts run with --trusted-key.
        #[arg(long, value_name = "PRIVATE_KEY_PEM")]
        sign: Option<PathBuf>,
        /// The signed pack's serial: a host refuses a pack older than one it verified under
        /// the same ConfigMap name. Default: the current Unix time in seconds.
        #[arg(long, requires = "sign")]
        serial: Option<u64>,
        /// Write a one-apply bundle: the CRDs given with --crd, a ClusterRole with the rules
        /// the host needs on the plugin's kinds (aggregated into the host's role), then the
        /// ConfigMap.
        #[arg(long, requires = "crds")]
        bundle: bool,
        /// A CRD file for the bundle (the plugin crate's generated CRD); one must define the
        /// plugin's target kind. Repeat for several.
        #[arg(long = "crd", value_name = "CRD_YAML", requires = "bundle")]
        crds: Vec<PathBuf>,
        /// Push the component to this OCI registry repository
        /// (`oci://<registry>/<repository>[:tag]`, HTTPS) as a wasm artifact and write a
        /// ConfigMap that names it by digest (`data.reference`) instead of carrying it.
        #[arg(long, value_name = "OCI_REFERENCE")]
        push: Option<String>,
        /// The registry's CA (PEM) for --push; default: the system's roots.
        #[arg(long, value_name = "CA_PEM", requires = "push")]
        registry_ca: Option<PathBuf>,
        /// A docker config.json holding credentials for the registry, for --push.
        #[arg(long, value_name = "DOCKER_CONFIG_JSON", requires = "push")]
        registry_auth: Option<PathBuf>,
        /// The pull Secret (a kubernetes.io/dockerconfigjson Secret of the plugin namespace)
        /// the host pulls with: written as `data.pullSecret`.
        #[arg(long, value_name = "SECRET", requires = "push")]
        pull_secret: Option<String>,
        /// Where the host finds the registry's CA: `secret/<name>` or `configmap/<name>` of the
        /// plugin namespace, key `ca.crt`; written as `data.registryCA`.
        #[arg(long, value_name = "secret/NAME|configmap/NAME", requires = "push")]
        pull_ca: Option<String>,
        #[command(flatten)]
        limits: PackLimitArgs,
    },
}

/// Per-plugin limits written into a pack; absent ones keep the host's defaults.
#[derive(clap::Args)]
struct PackLimitArgs {
    /// Deadline of one decision, in milliseconds.
    #[arg(long = "limit-deadline-ms")]
    deadline_ms: Option<u64>,
    /// Memory cap, in MiB.
    #[arg(long = "limit-memory-mib")]
    memory_mib: Option<usize>,
    /// Output cap, in KiB.
    #[arg(long = "limit-output-kib")]
    output_kib: Option<usize>,
    /// Parents reconciled at the same time.
    #[arg(long = "limit-concurrency")]
    concurrency: Option<u16>,
}

impl PackLimitArgs {
    fn spec(&self) -> LimitsSpec {
        LimitsSpec {
            deadline_ms: self.deadline_ms,
            memory_mib: self.memory_mib,
            output_kib: self.output_kib,
            concurrency: self.concurrency,
        }
    }
}

#[derive(clap::Args)]
struct LimitArgs {
    /// Wall-clock deadline of one decision, in milliseconds.
    #[arg(long, default_value_t = 10_000)]
    deadline_ms: u64,
    /// Memory cap of one plugin instance, in MiB.
    #[arg(long, default_value_t = 64)]
    memory_mib: usize,
    /// Output cap of one decision, in KiB.
    #[arg(long, default_value_t = 4096)]
    output_kib: usize,
}

impl LimitArgs {
    fn limits(&self) -> Limits {
        Limits {
            deadline: Duration::from_millis(self.deadline_ms),
            memory_bytes: self.memory_mib << 20,
            output_bytes: self.output_kib << 10,
        }
    }
}

#[tokio::main]
async fn main() -> std::process::ExitCode {
    let cli = Cli::parse();
    telemetry::init(cli.log_format);
    let _ = rustls::crypto::ring::default_provider().install_default();
    match run(cli.command).await {
        Ok(()) => std::process::ExitCode::SUCCESS,
        Err(error) => {
            // The message says what is wrong and what to do; a backtrace of the host's own
            // frames would only bury it.
            eprintln!("error: {error:#}");
            std::process::ExitCode::FAILURE
        }
    }
}

/// Resolves on SIGTERM (what the kubelet sends a stopping pod, and PID 1 gets no default
/// handler for it) or SIGINT (Ctrl-C).
fn shutdown_signal() -> anyhow::Result<impl std::future::Future<Output = ()> + Send + 'static> {
    use tokio::signal::unix::{SignalKind, signal};
    let mut terminate = signal(SignalKind::terminate())
        .context("cannot install the SIGTERM handler; the host could not stop gracefully")?;
    let mut interrupt = signal(SignalKind::interrupt())
        .context("cannot install the SIGINT handler; the host could not stop gracefully")?;
    Ok(async move {
        let which = tokio::select! {
            _ = terminate.recv() => "SIGTERM",
            _ = interrupt.recv() => "SIGINT",
        };
        tracing::info!(signal = which, "shutting down");
    })
}

async fn run(command: Command) -> anyhow::Result<()> {
    match command {
        Command::Run {
            policies,
            plugin_namespace,
            artifact_cache,
            admin_addr,
            limits,
            concurrency,
            namespace,
            lease_namespace,
            lease_name,
            shards,
            shard,
            leader_election,
            trusted_keys,
            trusted_keys_pem,
            max_pulled_plugin_mib,
        } => {
            let shard = Shard::new(shard, shards)?;
            if policies.is_empty() && plugin_namespace.is_none() {
                anyhow::bail!(
                    "nothing to load: give --policy plugin.wasm, or --plugin-namespace (or POD_NAMESPACE) to load plugin ConfigMaps"
                );
            }
            let mut trust = policy_host::load::trust::TrustPolicy::from_files(&trusted_keys)?;
            if let Some(text) = trusted_keys_pem {
                trust = trust.with_keys(policy_host::load::trust::TrustedKey::all_from_pem_text(
                    "--trusted-keys-pem (POLICY_HOST_TRUSTED_KEYS)",
                    &text,
                )?);
            }
            if trust.is_enforced() {
                tracing::info!(keys = %trust.describe(), "plugin ConfigMaps must be signed by one of these keys");
            } else if plugin_namespace.is_some() {
                tracing::warn!(
                    "no trusted key (--trusted-key, POLICY_HOST_TRUSTED_KEYS): any ConfigMap labelled policy-host.io/plugin=true in the plugin namespace loads code; see README \"Signed plugins\""
                );
            }
            let client = kube::Client::try_default()
                .await
                .context("cannot reach the Kubernetes API: set KUBECONFIG or run in a cluster")?;
            let settings = policy_host::Settings {
                policy_files: policies,
                plugin_namespace,
                artifact_cache,
                limits: limits.limits(),
                admin_addr: Some(admin_addr),
                controller: ControllerOptions {
                    concurrency,
                    namespace,
                    shard,
                    ..ControllerOptions::default()
                },
                leader_election: match lease_namespace.filter(|_| leader_election) {
                    Some(lease_namespace) => Some(LeaseSettings::new(
                        lease_namespace,
                        lease_name,
                        leader::default_identity(),
                    )),
                    None => {
                        tracing::warn!(
                            "leader election off (no --lease-namespace or POD_NAMESPACE, or --leader-election false): run a single replica"
                        );
                        None
                    }
                },
                trust,
                max_pulled_plugin_bytes: max_pulled_plugin_mib.saturating_mul(1 << 20),
            };
            let shutdown = shutdown_signal()?;
            policy_host::run(client, settings, shutdown, |_| {}).await?;
        }
        Command::Keygen { prefix } => {
            let files = plugin_cli::keygen::keygen(&prefix)?;
            println!(
                "wrote {} (private: keep it out of the cluster) and {} (give it to the host: POLICY_HOST_TRUSTED_KEYS in its pod spec, or --trusted-key); key id {}",
                files.private.display(),
                files.public.display(),
                files.id
            );
        }
        Command::NewPlugin { name, dir } => {
            let dir = dir.unwrap_or_else(|| PathBuf::from(&name));
            plugin_cli::new_plugin::new_plugin(&name, &dir)?;
            println!(
                "created plugin `{name}` in {}; next: its README.md (cargo test, build, pack, the end-to-end test)",
                dir.display()
            );
        }
        Command::Describe { plugin } => {
            let bytes = std::fs::read(&plugin)
                .with_context(|| format!("cannot read {}", plugin.display()))?;
            let sandbox = Sandbox::new()?;
            let loaded = sandbox
                .load(&plugin.display().to_string(), &bytes, Limits::default())
                .await?;
            let info = loaded.info();
            let description = serde_json::json!({
                "name": info.name,
                "version": info.version,
                "sha256": loaded.content_sha256(),
                "target": info.target.to_string(),
                "children": info.children.iter().map(|k| k.to_string()).collect::<Vec<_>>(),
                "capabilities": info.capabilities.iter().map(|c| format!("{c:?}")).collect::<Vec<_>>(),
                "wantsFinalizer": info.wants_finalizer,
            });
            println!("{}", serde_json::to_string_pretty(&description)?);
        }
        Command::Simulate {
            plugin,
            cr,
            responses,
            steps,
            json,
            limits,
        } => {
            let request = plugin_cli::simulate::SimulateRequest {
                cr,
                responses,
                steps,
                json,
            };
            let ran = plugin_cli::simulate_plugin(&plugin, &limits.spec(), &request).await?;
            match ran.last() {
                Some(last) if last.converged => {}
                Some(last) if last.error.is_some() => {
                    anyhow::bail!(
                        "the simulation stopped at step {}: see ERROR above",
                        last.step
                    )
                }
                _ => anyhow::bail!(
                    "no convergence within {steps} steps (each decision still changed the model); raise --steps or check the plugin"
                ),
            }
        }
        Command::Validate { plugin, limits } => {
            let report =
                plugin_cli::validate(&plugin, &limits.spec(), &plugin_cli::host_defaults()).await?;
            println!("{}", serde_json::to_string_pretty(&report)?);
        }
        Command::Pack {
            plugin,
            name,
            namespace,
            grants,
            exchange_grants,
            grant_requested,
            grant_chaos,
            grant_kinds,
            grant_pod_security,
            grant_images,
            grant_secrets,
            shadow,
            rollout,
            sign,
            serial,
            bundle: _,
            crds,
            push,
            registry_ca,
            registry_auth,
            pull_secret,
            pull_ca,
            limits,
        } => {
            let request = plugin_cli::PackRequest {
                name,
                namespace,
                grants: policy_host::capability::scope::Grants {
                    app_call_ports: grants,
                    exchange_ports: exchange_grants,
                    chaos: grant_chaos,
                    kinds: (!grant_kinds.is_empty()).then_some(grant_kinds),
                    pod_security: policy_host::capability::scope::PodSecurity::parse(
                        &grant_pod_security,
                    )
                    .map_err(anyhow::Error::msg)?,
                    images: (!grant_images.is_empty()).then_some(grant_images),
                    secrets: grant_secrets
                        .iter()
                        .map(|text| policy_host::capability::credentials::SecretGrant::parse(text))
                        .collect::<Result<_, _>>()
                        .map_err(anyhow::Error::msg)?,
                },
                grant_requested,
                limits: limits.spec(),
                shadow,
                rollout: rollout
                    .as_deref()
                    .map(policy_host::rollout::RolloutSpec::parse)
                    .transpose()
                    .map_err(|e| anyhow::anyhow!("--rollout: {e}"))?,
                sign,
                serial,
                bundle_crds: crds,
                push: push.map(|target| plugin_cli::PushRequest {
                    target,
                    ca_file: registry_ca,
                    auth_file: registry_auth,
                    pull_secret,
                    pull_ca,
                }),
            };
            print!(
                "{}",
                plugin_cli::pack(&plugin, &request, &plugin_cli::host_defaults()).await?
            );
        }
    }
    Ok(())
}
