//! The Redis policy plugin for policy-host: one primary, replicas following it, and a failover
//! to the replica with the most replicated data when the primary dies.
//!
//! policy-host watches `RedisReplication` resources (`redis.policy-host.io/v1alpha1`) and hands
//! this plugin each one with its Pods and Service. Redis speaks RESP, not HTTP, so the plugin
//! reaches the servers through the contract's generic `exchange` capability (raw bytes to the
//! granted `redis` port of its own Pods): it asks each server `INFO replication`, decides, and
//! sends `REPLICAOF`. The host knows nothing of Redis.
//!
//! - [`spec`] — the custom resource types (and, with feature `crd`, the CRD).
//! - [`resp`] — the Redis protocol, as far as needed.
//! - [`info`] — `INFO replication`, parsed.
//! - [`children`] — the server Pods and the client Service.
//! - [`reconcile`] — the decisions (pure; table-tested natively).
//!
//! This file is the only one that talks to the app: it gathers [`reconcile::Facts`] through
//! the exchange client and carries out the [`reconcile::Plan`]'s commands.

pub mod children;
pub mod info;
pub mod reconcile;
pub mod resp;
pub mod spec;

use policy_host_sdk::prelude::*;
use policy_host_sdk::{ExchangeRequest, log};
use serde::Deserialize;

use crate::info::Replication;
use crate::reconcile::{Command, Facts, Server};
use crate::spec::{RedisReplicationSpec, RedisReplicationStatus};

/// The plugin's name, as the host knows it.
pub const PLUGIN_NAME: &str = "redis";

/// How long to wait for a server's reply (ms).
const REPLY_TIMEOUT_MS: u32 = 2_000;

/// The custom resource this plugin reconciles: `redisreplications.redis.policy-host.io`.
pub fn target_kind() -> KindRef {
    KindRef::namespaced(
        "redis.policy-host.io",
        "v1alpha1",
        "RedisReplication",
        "redisreplications",
    )
}

/// The Redis plugin, as the host calls it.
pub struct RedisPlugin;

policy_host_sdk::export_plugin!(RedisPlugin);

impl Plugin for RedisPlugin {
    fn describe() -> PolicyInfo {
        PolicyInfo {
            name: PLUGIN_NAME.to_owned(),
            version: env!("CARGO_PKG_VERSION").to_owned(),
            target: target_kind(),
            children: vec![pod_kind(), service_kind()],
            capabilities: vec![Capability::Exchange(children::REDIS_PORT_NAME.to_owned())],
            wants_finalizer: false,
        }
    }

    fn reconcile(
        observation: &Observation,
        app: &mut dyn AppCall,
    ) -> Result<Decision, PolicyError> {
        let facts = gather(observation, app)?;
        let plan = reconcile::decide(&facts);
        for command in &plan.commands {
            run(command, &facts, app)?;
        }
        if !plan.commands.is_empty() {
            let done: Vec<String> = plan.commands.iter().map(|c| format!("{c:?}")).collect();
            log::info("redis commands sent", &[("commands", &done.join(", "))]);
        }
        Ok(Decision {
            actions: plan.actions,
            requeue_after_ms: plan.requeue_after_ms,
            metrics: Vec::new(),
        })
    }
}

pub use policy_host_sdk::children::{pod_kind, service_kind};

#[derive(Deserialize)]
struct Parent {
    metadata: ParentMeta,
    #[serde(default)]
    spec: RedisReplicationSpec,
    #[serde(default)]
    status: Option<RedisReplicationStatus>,
}

#[derive(Deserialize)]
struct ParentMeta {
    name: String,
    #[serde(default)]
    generation: Option<i64>,
}

/// The facts of one observation: the parent, its server Pods, and each running server's
/// answer to `INFO replication` (a server that does not answer has none).
pub fn gather(observation: &Observation, app: &mut dyn AppCall) -> Result<Facts, PolicyError> {
    let parent: Parent = observation.parent()?;
    let mut servers = Vec::new();
    for child in observation.children_of_kind(&pod_kind()) {
        let pod: serde_json::Value = child.parse()?;
        let Some(name) = pod["metadata"]["name"].as_str() else {
            continue;
        };
        if children::ordinal(&parent.metadata.name, name).is_none() {
            continue;
        }
        let mut server = Server {
            name: name.to_owned(),
            ip: pod["status"]["podIP"]
                .as_str()
                .filter(|ip| !ip.is_empty())
                .map(str::to_owned),
            image: pod["spec"]["containers"][0]["image"]
                .as_str()
                .unwrap_or_default()
                .to_owned(),
            phase: pod["status"]["phase"]
                .as_str()
                .unwrap_or("Pending")
                .to_owned(),
            deleting: !pod["metadata"]["deletionTimestamp"].is_null(),
            replication: None,
        };
        if server.reachable() {
            server.replication = info_replication(app, name);
        }
        servers.push(server);
    }
    servers.sort_by_key(|s| children::ordinal(&parent.metadata.name, &s.name));
    Ok(Facts {
        name: parent.metadata.name,
        generation: parent.metadata.generation,
        spec: parent.spec,
        status: parent.status.unwrap_or_default(),
        servers,
        now: observation.now,
    })
}

/// Sends one command and reads its reply.
fn exchange(app: &mut dyn AppCall, pod: &str, args: &[&str]) -> Result<resp::Reply, String> {
    let request = resp::command(args);
    let bytes = app
        .exchange(&ExchangeRequest {
            pod,
            port: children::REDIS_PORT_NAME,
            request: &request,
            reply_complete: &resp::is_complete,
            timeout_ms: REPLY_TIMEOUT_MS,
        })
        .map_err(|e| e.to_string())?;
    resp::parse(&bytes)
        .map(|(reply, _)| reply)
        .ok_or_else(|| "the reply is not RESP".to_owned())
}

fn info_replication(app: &mut dyn AppCall, pod: &str) -> Option<Replication> {
    match exchange(app, pod, &["INFO", "replication"]) {
        Ok(resp::Reply::Bulk(Some(text))) => Replication::parse(&String::from_utf8_lossy(&text)),
        Ok(other) => {
            log::warn(
                "unexpected INFO reply",
                &[("pod", pod), ("reply", &format!("{other:?}"))],
            );
            None
        }
        Err(error) => {
            log::debug("server does not answer", &[("pod", pod), ("error", &error)]);
            None
        }
    }
}

fn run(command: &Command, facts: &Facts, app: &mut dyn AppCall) -> Result<(), PolicyError> {
    let port = children::REDIS_PORT.to_string();
    let (pod, args): (&str, Vec<&str>) = match command {
        Command::Promote { pod } => (pod, vec!["REPLICAOF", "NO", "ONE"]),
        Command::Follow { pod, host } => (pod, vec!["REPLICAOF", host, &port]),
    };
    match exchange(app, pod, &args) {
        Ok(resp::Reply::Simple(_)) => Ok(()),
        Ok(other) => Err(PolicyError::new(
            "RedisCommandFailed",
            format!(
                "{} answered {other:?} to {}; will retry",
                pod,
                args.join(" ")
            ),
        )),
        Err(error) => Err(PolicyError::new(
            "RedisUnreachable",
            format!(
                "cannot send `{}` to {pod} of {}: {error}; will retry",
                args.join(" "),
                facts.name
            ),
        )),
    }
}
