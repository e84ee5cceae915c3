//! The `policy-host` binary: parse the command line, then run the host or a plugin tool.

use std::net::SocketAddr;
use std::path::PathBuf;
use std::time::Duration;

use anyhow::Context;
use clap::{Parser, Subcommand};
use policy_host::controller::ControllerOptions;
use policy_host::decide::{Limits, Sandbox};
use policy_host::telemetry::{self, LogFormat};

#[derive(Parser)]
#[command(name = "policy-host", version, about = "A Kubernetes operator whose reconcile decisions come from sandboxed WebAssembly plugins")]
struct Cli {
    /// Log format.
    #[arg(long, value_enum, default_value_t = LogFormat::Text, env = "POLICY_HOST_LOG_FORMAT", global = true)]
    log_format: LogFormat,
    #[command(subcommand)]
    command: Command,
}

#[derive(Subcommand)]
enum Command {
    /// Run the operator with the given plugins (uses the in-cluster config or $KUBECONFIG).
    Run {
        /// A plugin component (.wasm) to load; repeat for several.
        #[arg(long = "policy", required = true)]
        policies: Vec<PathBuf>,
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
    },
    /// Load a plugin and print what it says about itself, as JSON.
    Describe {
        /// The plugin component (.wasm).
        plugin: PathBuf,
    },
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
async fn main() -> anyhow::Result<()> {
    let cli = Cli::parse();
    telemetry::init(cli.log_format);
    let _ = rustls::crypto::ring::default_provider().install_default();
    match cli.command {
        Command::Run {
            policies,
            admin_addr,
            limits,
            concurrency,
            namespace,
        } => {
            let client = kube::Client::try_default()
                .await
                .context("cannot reach the Kubernetes API: set KUBECONFIG or run in a cluster")?;
            let settings = policy_host::Settings {
                policy_files: policies,
                limits: limits.limits(),
                admin_addr: Some(admin_addr),
                controller: ControllerOptions {
                    concurrency,
                    namespace,
                },
            };
            let shutdown = async {
                let _ = tokio::signal::ctrl_c().await;
                tracing::info!("shutting down");
            };
            policy_host::run(client, settings, shutdown, |_| {}).await?;
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
    }
    Ok(())
}
