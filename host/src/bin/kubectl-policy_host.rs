//! `kubectl-policy_host`, the kubectl plugin (`kubectl policy-host ...`): parse the command
//! line, run one command of [`policy_host::kubectl`] with the kubeconfig's client, print.
//!
//! The underscore is kubectl's convention: kubectl looks up `kubectl policy-host` as the
//! executable `kubectl-policy_host` (a dash in a command becomes an underscore; a dash in a
//! file name separates subcommands, so `kubectl-policy-host` would be `kubectl policy host`).
//! krew links the same name (`deploy/krew/policy-host.yaml`).

use anyhow::Context;
use clap::{Parser, Subcommand};
use policy_host::kubectl::{self, Target};

#[derive(Parser)]
#[command(
    name = "kubectl policy-host",
    bin_name = "kubectl policy-host",
    version,
    about = "Ask policy-host's parents and plugins: status, pause, backup, switchover, plugins, simulate"
)]
struct Cli {
    /// Namespace of the parent (default: the kubeconfig context's, else `default`).
    #[arg(short, long, global = true)]
    namespace: Option<String>,
    /// Namespace where policy-host runs and keeps its plugin ConfigMaps.
    #[arg(long, default_value = "policy-host", global = true)]
    plugin_namespace: String,
    #[command(subcommand)]
    command: Command,
}

#[derive(Subcommand)]
enum Command {
    /// A parent's phase and conditions, and the Pods it controls: `status etcdcluster/example`.
    Status { target: String },
    /// Stop the plugin acting on a parent (`spec.paused`, where its kind has it).
    Pause { target: String },
    /// Let the plugin act on a paused parent again.
    Resume { target: String },
    /// Ask for a snapshot now (`spec.trigger` or `spec.backup.trigger`).
    Backup { target: String },
    /// Ask the plugin to make POD the primary (`<group>/switchover-to`).
    Switchover {
        target: String,
        /// The Pod to promote.
        #[arg(long)]
        to: String,
    },
    /// The plugins the host has loaded, with versions, modes, targets and grants.
    Plugins,
    /// What the loaded plugin would decide on the parent as it is now, without acting.
    Simulate { target: String },
}

#[tokio::main(flavor = "current_thread")]
async fn main() -> anyhow::Result<()> {
    let cli = Cli::parse();
    let config = kube::Config::infer()
        .await
        .context("no Kubernetes configuration: set KUBECONFIG or run inside a cluster")?;
    let namespace = cli
        .namespace
        .clone()
        .unwrap_or_else(|| config.default_namespace.clone());
    let client = kube::Client::try_from(config).context("cannot build a Kubernetes client")?;
    let target = |text: &str| Target::parse(text, &namespace);
    let now = k8s_openapi::jiff::Timestamp::now();
    let text = match &cli.command {
        Command::Status { target: t } => kubectl::status(&client, &target(t)?).await?,
        Command::Pause { target: t } => kubectl::pause(&client, &target(t)?, true).await?,
        Command::Resume { target: t } => kubectl::pause(&client, &target(t)?, false).await?,
        Command::Backup { target: t } => {
            kubectl::backup(&client, &target(t)?, &now.to_string()).await?
        }
        Command::Switchover { target: t, to } => {
            kubectl::switchover(&client, &target(t)?, to).await?
        }
        Command::Plugins => kubectl::plugins(&client, &cli.plugin_namespace).await?,
        Command::Simulate { target: t } => {
            let now = policy_host::contract::Timestamp {
                seconds: now.as_second(),
                nanoseconds: u32::try_from(now.subsec_nanosecond()).unwrap_or(0),
            };
            kubectl::simulate(&client, &target(t)?, &cli.plugin_namespace, now).await?
        }
    };
    print!("{text}");
    Ok(())
}
