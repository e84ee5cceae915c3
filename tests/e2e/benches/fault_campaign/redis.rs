//! The campaign's Redis mode (`--app redis`): random fault sequences against a
//! RedisReplication run by the installed host's redis plugin (`policies/redis.yaml`), under a
//! client that writes unique keys to the server the client Service selects, each followed by
//! `WAIT 1 1000`. Redis replication is asynchronous, so a write the primary alone took may die
//! with it; what README's `RedisReplication` section promises, and so what a run checks:
//!
//! - **a write a replica acknowledged survives failovers** (on the final primary), unless every
//!   server that had it was killed or scaled away before another copied it
//!   ([`lost_replicated_writes`]: the recorder follows which servers run and whose link is up
//!   to whom, every 250 ms);
//! - **one primary**: exactly one server says `role:master`, the Service selects exactly its
//!   Pod, every other server follows it with `master_link_status:up`;
//! - **a cut-but-running primary is not replaced**: no `Failover` away from it while its
//!   network is cut (nor 2 s after the heal) unless the campaign also killed it;
//! - **one `Failover` Event per primary lost**;
//! - **back to spec** within 3 minutes of the last fault: `replicas` servers, all Ready, the
//!   status `Available`, not `Progressing`, `replicas - 1` following, held 6 s.
//!
//! Faults: the primary killed (SIGKILL through containerd, or its Pod deleted with grace 0;
//! its servers never restart in place), a replica killed the same ways, the host leader
//! killed, the primary's network cut and healed 3–12 s later, a scale 3 <-> 5.

use std::collections::{BTreeMap, BTreeSet};
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::{Duration, Instant};

use anyhow::{Context, Result, anyhow, bail};
use k8s_openapi::api::core::v1::{Pod, Service};
use k8s_openapi::api::events::v1::Event;
use kube::api::{Api, ApiResource, DeleteParams, DynamicObject, ListParams, Patch, PatchParams};
use kube::core::GroupVersionKind;
use policy_host_e2e::campaign::{ReplicatedWrite, ServerSeen, lost_replicated_writes};
use policy_host_e2e::etcd::{eventually, pod_ready};
use policy_host_e2e::install::kubectl;
use policy_host_testenv::network::{PodNetworkCut, cut_pod_network};
use serde_json::json;
use tokio::io::{AsyncBufReadExt, AsyncReadExt, AsyncWriteExt, BufReader};
use tokio::net::TcpStream;
use tokio::sync::watch;

use super::{
    BACK_TO_SPEC, Campaign, Done, Fault, Kill, NAME, Outcome, Plan, Rng, held, member_pods,
    name_of, unix_millis,
};

const REDIS_PORT: u16 = 6379;
/// The plugin's role label; the client Service selects `primary`.
const ROLE_LABEL: &str = "redis.policy-host.io/role";
/// How long `WAIT` waits for a replica's acknowledgement.
const WAIT_MS: u64 = 1_000;

fn redis_replications() -> ApiResource {
    ApiResource::from_gvk_with_plural(
        &GroupVersionKind::gvk("redis.policy-host.io", "v1alpha1", "RedisReplication"),
        "redisreplications",
    )
}

/// A run's faults: 3 to 5, the first at 3 s, then every 0.5–9 s; a primary kill twice as
/// likely as any other, as failover is what the mode is about.
pub(super) fn plan(seed: u64) -> Plan {
    let mut rng = Rng(seed);
    let count = 3 + rng.below(3);
    let mut at = Duration::from_secs(3);
    let mut faults = Vec::new();
    let (mut size, mut cuts) = (3, 0);
    let how = |rng: &mut Rng| {
        if rng.below(2) == 0 {
            Kill::Containerd
        } else {
            Kill::DeletePod
        }
    };
    for _ in 0..count {
        let fault = match rng.below(7) {
            0 | 1 => Fault::KillPrimary { how: how(&mut rng) },
            2 => Fault::KillReplica {
                pick: rng.next(),
                how: how(&mut rng),
            },
            3 => Fault::KillHostLeader,
            4 => {
                cuts += 1;
                Fault::CutPrimary { id: cuts }
            }
            _ => {
                size = if size == 3 { 5 } else { 3 };
                Fault::Scale { to: size }
            }
        };
        if let Fault::CutPrimary { id } = fault {
            faults.push((at + rng.millis(3_000, 12_000), Fault::HealNetwork { id }));
        }
        faults.push((at, fault));
        at += rng.millis(500, 9_000);
    }
    faults.sort_by_key(|(at, _)| *at);
    Plan {
        faults,
        size,
        upgraded: false,
    }
}

/// One RESP reply.
#[derive(Debug)]
enum Reply {
    Simple(String),
    Error(String),
    Integer(i64),
    Bulk(Option<Vec<u8>>),
    Array(Vec<Reply>),
}

/// A connection to one Redis server, speaking just enough RESP for the campaign: commands
/// out, simple, error, integer, bulk replies and arrays of them in.
struct Connection {
    stream: BufReader<TcpStream>,
}

impl Connection {
    async fn open(ip: &str) -> Result<Connection> {
        let stream =
            tokio::time::timeout(Duration::from_secs(1), TcpStream::connect((ip, REDIS_PORT)))
                .await
                .with_context(|| format!("connecting to {ip}:{REDIS_PORT} timed out"))??;
        Ok(Connection {
            stream: BufReader::new(stream),
        })
    }

    /// Sends one command and reads its reply within `within`.
    async fn call(&mut self, args: &[&str], within: Duration) -> Result<Reply> {
        let mut out = format!("*{}\r\n", args.len()).into_bytes();
        for arg in args {
            out.extend_from_slice(format!("${}\r\n{arg}\r\n", arg.len()).as_bytes());
        }
        tokio::time::timeout(within, async {
            self.stream.get_mut().write_all(&out).await?;
            self.reply().await
        })
        .await
        .with_context(|| format!("{} got no reply within {within:?}", args[0]))?
    }

    async fn line(&mut self) -> Result<String> {
        let mut line = String::new();
        if self.stream.read_line(&mut line).await? == 0 {
            bail!("the server closed the connection");
        }
        Ok(line.trim_end_matches("\r\n").to_owned())
    }

    async fn scalar(&mut self, line: &str) -> Result<Reply> {
        let (kind, rest) = line.split_at(line.len().min(1));
        Ok(match kind {
            "+" => Reply::Simple(rest.to_owned()),
            "-" => Reply::Error(rest.to_owned()),
            ":" => Reply::Integer(rest.parse()?),
            "$" => {
                let len: i64 = rest.parse()?;
                if len < 0 {
                    Reply::Bulk(None)
                } else {
                    let mut data = vec![0; len as usize + 2];
                    self.stream.read_exact(&mut data).await?;
                    data.truncate(len as usize);
                    Reply::Bulk(Some(data))
                }
            }
            _ => bail!("not a RESP reply: {line:?}"),
        })
    }

    async fn reply(&mut self) -> Result<Reply> {
        let line = self.line().await?;
        if let Some(count) = line.strip_prefix('*') {
            let count: i64 = count.parse()?;
            let mut items = Vec::new();
            for _ in 0..count.max(0) {
                let item = self.line().await?;
                items.push(self.scalar(&item).await?);
            }
            return Ok(Reply::Array(items));
        }
        self.scalar(&line).await
    }
}

/// The server Pod that is the primary: the one the Service selects, and the status names,
/// running.
async fn the_primary(objects: &Api<DynamicObject>, pods: &Api<Pod>) -> Result<Pod> {
    let named = objects.get(NAME).await?.data["status"]["primary"].clone();
    match selected(pods).await.map_err(anyhow::Error::msg)?.as_slice() {
        // Running: a primary whose process ended (`Failed`) is already lost, not lost again
        // (seed 18 counted one loss twice).
        [one]
            if json!(name_of(one)) == named
                && one.status.as_ref().and_then(|s| s.phase.as_deref()) == Some("Running") =>
        {
            Ok(one.clone())
        }
        other => bail!(
            "no one primary: the Service selects {:?}, the status names {named}",
            other.iter().map(name_of).collect::<Vec<_>>()
        ),
    }
}

/// `INFO replication` of the server at `ip`, as field -> value.
async fn replication(ip: &str) -> Result<BTreeMap<String, String>> {
    info(ip, &["INFO", "replication"], Duration::from_secs(2)).await
}

/// The answer to `command` (an `INFO …`) from the server at `ip`, as field -> value.
async fn info(ip: &str, command: &[&str], timeout: Duration) -> Result<BTreeMap<String, String>> {
    let mut connection = Connection::open(ip).await?;
    match connection.call(command, timeout).await? {
        Reply::Bulk(Some(text)) => Ok(String::from_utf8_lossy(&text)
            .lines()
            .filter_map(|l| {
                let (k, v) = l.trim().split_once(':')?;
                Some((k.to_owned(), v.to_owned()))
            })
            .collect()),
        other => bail!("{} from {ip} answered {other:?}", command.join(" ")),
    }
}

/// One server Pod as the recorder saw it: the state the write check follows (which server —
/// its Pod's UID —, whether it runs, its IP, whom it follows with its link up) and a line for
/// the evidence with what it said to `INFO replication keyspace`.
async fn look_at_server(pod: &Pod, at_ms: i64) -> (ServerSeen, String) {
    let uid = pod.metadata.uid.clone().unwrap_or_default();
    let ip = pod_ip(pod);
    let phase = pod
        .status
        .as_ref()
        .and_then(|s| s.phase.as_deref())
        .unwrap_or("-");
    let label = pod
        .metadata
        .labels
        .as_ref()
        .and_then(|l| l.get(ROLE_LABEL))
        .map_or("-", String::as_str);
    let deleting = pod.metadata.deletion_timestamp.is_some();
    let running = phase == "Running" && !deleting;
    let mut following = None;
    let said = match &ip {
        Some(ip) if running => match server_info(ip).await {
            Ok(info) => {
                let field = |k: &str| info.get(k).map_or("-", String::as_str);
                let keys = field("db0")
                    .split(',')
                    .find_map(|kv| kv.strip_prefix("keys="))
                    .unwrap_or("0");
                if field("role") == "master" {
                    format!("master offset {} keys {keys}", field("master_repl_offset"))
                } else {
                    if field("master_link_status") == "up" {
                        following = info.get("master_host").cloned();
                    }
                    format!(
                        "replica of {} link {} offset {} keys {keys}",
                        field("master_host"),
                        field("master_link_status"),
                        field("slave_repl_offset")
                    )
                }
            }
            Err(e) => format!("no answer ({e:#})"),
        },
        _ => "not asked".to_owned(),
    };
    let line = format!(
        "uid {} ip {} {phase}{} label {label}: {said}",
        uid.get(..8).unwrap_or(&uid),
        ip.as_deref().unwrap_or("-"),
        if deleting { " deleting" } else { "" },
    );
    let seen = ServerSeen {
        at_ms,
        server: server_id(pod),
        ip,
        running,
        following,
    };
    (seen, line)
}

/// Which server a Pod runs: its name and the start of its UID (a Pod created again under the
/// name is another server).
fn server_id(pod: &Pod) -> String {
    let uid = pod.metadata.uid.as_deref().unwrap_or_default();
    format!("{}/{}", name_of(pod), uid.get(..8).unwrap_or(uid))
}

/// A server the campaign killed, as the write check follows it: not running from `at_ms`.
fn stopped(pod: &Pod, at_ms: i64) -> ServerSeen {
    ServerSeen {
        at_ms,
        server: server_id(pod),
        ip: pod_ip(pod),
        running: false,
        following: None,
    }
}

/// `INFO replication keyspace` of the server at `ip`, as field -> value, within 1 s.
async fn server_info(ip: &str) -> Result<BTreeMap<String, String>> {
    tokio::time::timeout(
        Duration::from_secs(1),
        info(
            ip,
            &["INFO", "replication", "keyspace"],
            Duration::from_secs(1),
        ),
    )
    .await
    .context("INFO got no reply within 1 s")?
}

/// What the recorder saw: each server's state at each change (for the write check), and the
/// evidence's lines.
#[derive(Default)]
struct ServersSeen {
    changes: Vec<ServerSeen>,
    lines: Vec<String>,
}

/// Every server Pod and what it says, looked at every 250 ms while `recording`, kept at each
/// change. A failed run keeps the lines (`servers.txt`): a Pod's logs go with it, and which
/// server synced from which, with how many keys, is what a lost write turns on.
async fn record_servers(pods: Api<Pod>, recording: Arc<AtomicBool>) -> ServersSeen {
    let mut seen = ServersSeen::default();
    let mut last_line: BTreeMap<String, String> = BTreeMap::new();
    let mut last_state: BTreeMap<String, ServerSeen> = BTreeMap::new();
    while recording.load(Ordering::Relaxed) {
        let at_ms = unix_millis();
        let listed = pods
            .list(&ListParams::default().labels(&format!("app.kubernetes.io/instance={NAME}")))
            .await;
        let clock = k8s_openapi::jiff::Timestamp::from_millisecond(at_ms)
            .map(|t| t.to_string())
            .unwrap_or_default();
        if let Ok(list) = listed {
            let looked =
                futures::future::join_all(list.items.iter().map(|pod| look_at_server(pod, at_ms)))
                    .await;
            let mut lines = BTreeMap::new();
            let mut states = BTreeMap::new();
            for (state, line) in looked {
                let name = state
                    .server
                    .split('/')
                    .next()
                    .unwrap_or_default()
                    .to_owned();
                if last_line.get(&name) != Some(&line) {
                    seen.lines.push(format!("{clock} {name} {line}"));
                }
                let changed = last_state.get(&state.server).is_none_or(|last| {
                    (&last.ip, last.running, &last.following)
                        != (&state.ip, state.running, &state.following)
                });
                if changed {
                    seen.changes.push(state.clone());
                }
                lines.insert(name, line);
                states.insert(state.server.clone(), state);
            }
            for name in last_line.keys().filter(|n| !lines.contains_key(*n)) {
                seen.lines.push(format!("{clock} {name} gone"));
            }
            for (server, last) in &last_state {
                if !states.contains_key(server) && last.running {
                    seen.changes.push(ServerSeen {
                        at_ms,
                        running: false,
                        following: None,
                        ..last.clone()
                    });
                }
            }
            last_line = lines;
            last_state = states;
        }
        // How often the recorder looks, not a wait for anything.
        tokio::time::sleep(Duration::from_millis(250)).await;
    }
    seen
}

/// What the client did.
#[derive(Default)]
struct WriteLog {
    /// Writes sent.
    sent: usize,
    /// Writes the primary answered `OK`.
    acknowledged: usize,
    /// Writes with no answer (connection lost or timed out): they may or may not be there.
    unknown: usize,
    /// Writes refused (e.g. `READONLY` from a server no longer primary), by the error's
    /// first word.
    refused: BTreeMap<String, usize>,
    /// Writes `WAIT` reported a replica had.
    replicated: Vec<ReplicatedWrite>,
}

/// Writes `w-<seed>-<n>` to whichever server `primary` names until `stop`, each followed by
/// `WAIT 1`; reconnects when the primary moves or a call fails.
async fn write(
    seed: u64,
    mut primary: watch::Receiver<Option<String>>,
    stop: Arc<AtomicBool>,
) -> WriteLog {
    let mut log = WriteLog::default();
    let mut connection: Option<Connection> = None;
    let mut n = 0u64;
    while !stop.load(Ordering::Relaxed) {
        if primary.has_changed().unwrap_or(false) {
            connection = None;
        }
        let Some(ip) = primary.borrow_and_update().clone() else {
            // No server selected yet: how often the client looks again, not a wait for it.
            tokio::time::sleep(Duration::from_millis(100)).await;
            continue;
        };
        let mut open = match connection.take() {
            Some(open) => open,
            None => match Connection::open(&ip).await {
                Ok(open) => open,
                Err(_) => {
                    tokio::time::sleep(Duration::from_millis(100)).await;
                    continue;
                }
            },
        };
        n += 1;
        let key = format!("w-{seed}-{n}");
        log.sent += 1;
        match open
            .call(&["SET", &key, &n.to_string()], Duration::from_secs(2))
            .await
        {
            Ok(Reply::Simple(ok)) if ok == "OK" => log.acknowledged += 1,
            Ok(other) => {
                let why = match other {
                    Reply::Error(e) => e.split(' ').next().unwrap_or_default().to_owned(),
                    other => format!("{other:?}"),
                };
                *log.refused.entry(why).or_default() += 1;
                // How soon the client tries again, not a wait for anything.
                tokio::time::sleep(Duration::from_millis(100)).await;
                continue;
            }
            Err(_) => {
                log.unknown += 1;
                continue;
            }
        }
        // No answer to WAIT: the write is the primary's only, as far as anyone knows.
        if let Ok(Reply::Integer(replicas)) = open
            .call(
                &["WAIT", "1", &WAIT_MS.to_string()],
                Duration::from_millis(WAIT_MS + 2_000),
            )
            .await
        {
            if replicas >= 1 {
                log.replicated.push(ReplicatedWrite {
                    key,
                    at_ms: unix_millis(),
                    replicas,
                    to: ip.clone(),
                });
            }
            connection = Some(open);
        }
    }
    log
}

/// The live server Pods the client Service's selector selects.
async fn selected(pods: &Api<Pod>) -> Result<Vec<Pod>, String> {
    let list = pods
        .list(&ListParams::default().labels(&format!(
            "app.kubernetes.io/instance={NAME},{ROLE_LABEL}=primary"
        )))
        .await
        .map_err(|e| e.to_string())?;
    Ok(list
        .items
        .into_iter()
        .filter(|p| p.metadata.deletion_timestamp.is_none())
        .collect())
}

fn pod_ip(pod: &Pod) -> Option<String> {
    pod.status
        .as_ref()?
        .pod_ip
        .clone()
        .filter(|ip| !ip.is_empty())
}

/// `(when, lost primary, promoted)` of the plugin's `Failover` Events, a repeat counted again.
async fn failovers(events: &Api<Event>) -> Result<Vec<(i64, String, String)>> {
    let mut found = Vec::new();
    for e in events.list(&ListParams::default()).await?.items {
        if e.reason.as_deref() != Some("Failover") {
            continue;
        }
        let note = e.note.clone().unwrap_or_default();
        // "primary x-0 is gone; promoted x-2 (replication offset ...)"
        let lost = note
            .strip_prefix("primary ")
            .and_then(|r| r.split_once(' '))
            .map(|(pod, _)| pod.to_owned())
            .unwrap_or_default();
        let promoted = note
            .split_once("promoted ")
            .and_then(|(_, r)| r.split_once(' '))
            .map(|(pod, _)| pod.to_owned())
            .unwrap_or_default();
        let at = e.event_time.as_ref().map_or(0, |t| t.0.as_millisecond());
        for _ in 0..e.series.as_ref().map_or(1, |s| s.count.max(1)) {
            found.push((at, lost.clone(), promoted.clone()));
        }
    }
    Ok(found)
}

impl Campaign {
    /// Applies the redis plugin's bundle as the README says and waits for its kind.
    pub(super) async fn install_redis(&self) -> Result<()> {
        let env = self.env;
        tokio::task::spawn_blocking(move || {
            kubectl(
                env,
                &["apply", "--server-side", "-f", "policies/redis.yaml"],
            )?;
            kubectl(
                env,
                &[
                    "wait",
                    "--for",
                    "condition=established",
                    "--timeout=120s",
                    "crd/redisreplications.redis.policy-host.io",
                ],
            )
        })
        .await??;
        Ok(())
    }

    /// The node's Redis image tag.
    pub(super) fn redis_version(&self) -> Result<String> {
        Ok(policy_host_e2e::apps::redis_image_in(&self.images)?
            .tag()
            .to_owned())
    }

    pub(super) async fn run_redis(&mut self, seed: u64, plan: &Plan) -> Result<Outcome> {
        let namespace = self.env.create_namespace("campaign-redis").await?;
        let ns = namespace.name().to_owned();
        let objects: Api<DynamicObject> =
            Api::namespaced_with(self.client.clone(), &ns, &redis_replications());
        let pods: Api<Pod> = Api::namespaced(self.client.clone(), &ns);
        let services: Api<Service> = Api::namespaced(self.client.clone(), &ns);
        let events: Api<Event> = Api::namespaced(self.client.clone(), &ns);
        let version = self.redis_version()?;
        let manifest = json!({
            "apiVersion": "redis.policy-host.io/v1alpha1", "kind": "RedisReplication",
            "metadata": {"name": NAME}, "spec": {"replicas": 3, "version": version},
        });
        objects
            .patch(
                NAME,
                &PatchParams::apply("fault-campaign").force(),
                &Patch::Apply(&manifest),
            )
            .await?;
        eventually(
            "the new RedisReplication 3 servers, 2 following",
            BACK_TO_SPEC,
            || converged(&objects, &pods, &services, 3),
        )
        .await?;

        // The client, following the Service's selection.
        let (primary_tx, primary_rx) = watch::channel(None);
        let following = Arc::new(AtomicBool::new(true));
        let follower = tokio::spawn({
            let (pods, following) = (pods.clone(), following.clone());
            async move {
                while following.load(Ordering::Relaxed) {
                    if let Ok(selected) = selected(&pods).await {
                        let ip = match selected.as_slice() {
                            [one] => pod_ip(one),
                            _ => None,
                        };
                        primary_tx.send_if_modified(|current| {
                            let changed = ip.is_some() && *current != ip;
                            if changed {
                                current.clone_from(&ip);
                            }
                            changed
                        });
                    }
                    // How often the client follows the Service, not a wait for anything.
                    tokio::time::sleep(Duration::from_millis(300)).await;
                }
            }
        });
        // The recorder first, so the servers the first writes reach are seen.
        let recording = Arc::new(AtomicBool::new(true));
        let recorder = tokio::spawn(record_servers(pods.clone(), recording.clone()));
        let stop = Arc::new(AtomicBool::new(false));
        let writer = tokio::spawn(write(seed, primary_rx, stop.clone()));

        // The faults, at their offsets.
        let start = Instant::now();
        let mut done = Vec::new();
        let mut cuts: BTreeMap<usize, PodNetworkCut> = BTreeMap::new();
        let mut cut_pods: BTreeMap<usize, (String, i64)> = BTreeMap::new();
        let mut cut_windows: Vec<(String, i64, i64)> = Vec::new();
        // The servers killed, as the write check follows them (`running: false` at the kill).
        let mut killed: Vec<ServerSeen> = Vec::new();
        let mut primaries_lost: Vec<String> = Vec::new();
        let mut size = 3u32;
        let mut not_made = Vec::new();
        for (offset, fault) in &plan.faults {
            // The plan's timing: the point of the campaign, not a stand-in for a condition.
            tokio::time::sleep_until((start + *offset).into()).await;
            let at_ms = unix_millis();
            let made = match fault {
                Fault::KillPrimary { how } => {
                    async {
                        let victim = the_primary(&objects, &pods).await?;
                        let name = self.kill(&ns, &pods, &victim, *how).await?;
                        killed.push(stopped(&victim, at_ms));
                        primaries_lost.push(name.clone());
                        Ok(name)
                    }
                    .await
                }
                Fault::KillReplica { pick, how } => {
                    async {
                        // Neither the labelled primary nor one the status already names (the
                        // label moves a moment after a promotion).
                        let named = objects.get(NAME).await?.data["status"]["primary"].clone();
                        let live: Vec<Pod> = member_pods(&pods)
                            .await
                            .map_err(anyhow::Error::msg)?
                            .into_iter()
                            .filter(|p| {
                                p.metadata.labels.as_ref().and_then(|l| l.get(ROLE_LABEL))
                                    == Some(&"replica".to_owned())
                                    && json!(name_of(p)) != named
                            })
                            .collect();
                        let victim = live
                            .get((*pick % live.len().max(1) as u64) as usize)
                            .ok_or_else(|| anyhow!("no replica to kill"))?;
                        let name = self.kill(&ns, &pods, victim, *how).await?;
                        killed.push(stopped(victim, at_ms));
                        Ok(name)
                    }
                    .await
                }
                Fault::CutPrimary { id } => {
                    async {
                        let victim = the_primary(&objects, &pods).await?;
                        let ip =
                            pod_ip(&victim).ok_or_else(|| anyhow!("the primary has no IP yet"))?;
                        cuts.insert(*id, cut_pod_network(&ip)?);
                        cut_pods.insert(*id, (name_of(&victim), at_ms));
                        Ok(name_of(&victim))
                    }
                    .await
                }
                Fault::HealNetwork { id } => {
                    let healed = self.inject(fault, &ns, &pods, &objects, &mut cuts).await;
                    if let Some((pod, from)) = cut_pods.remove(id) {
                        cut_windows.push((pod, from, unix_millis()));
                    }
                    healed
                }
                Fault::Scale { to } => {
                    size = *to;
                    objects
                        .patch(
                            NAME,
                            &PatchParams::default(),
                            &Patch::Merge(&json!({"spec": {"replicas": to}})),
                        )
                        .await
                        .map(|_| String::new())
                        .map_err(anyhow::Error::from)
                }
                _ => self.inject(fault, &ns, &pods, &objects, &mut cuts).await,
            };
            match made {
                Ok(target) => {
                    eprintln!(
                        "[seed {seed}] +{:.1} s {fault} {target}",
                        offset.as_secs_f64()
                    );
                    done.push(Done {
                        at_ms,
                        offset: *offset,
                        fault: fault.clone(),
                        target,
                    })
                }
                // A fault that could not be made (no primary selected, say) is not the system's.
                Err(e) => not_made.push(format!(
                    "{fault} at +{:.1} s not made: {e:#}",
                    offset.as_secs_f64()
                )),
            }
        }
        for (_, cut) in std::mem::take(&mut cuts) {
            let _ = cut.heal();
        }
        for (_, (pod, from)) in std::mem::take(&mut cut_pods) {
            cut_windows.push((pod, from, unix_millis()));
        }
        let last_fault = Instant::now();
        let back = held(&format!("{size} servers, {} following", size - 1), || {
            converged(&objects, &pods, &services, size)
        })
        .await
        .map(|since| since.duration_since(last_fault));
        // A few more writes on the healed servers (the writer's pace).
        tokio::time::sleep(Duration::from_secs(2)).await;
        stop.store(true, Ordering::Relaxed);
        let log = tokio::time::timeout(Duration::from_secs(30), writer)
            .await
            .context("the client did not stop within 30 s")??;
        following.store(false, Ordering::Relaxed);
        let _ = follower.await;
        recording.store(false, Ordering::Relaxed);
        let ServersSeen {
            changes: mut seen,
            lines: server_lines,
        } = recorder.await.unwrap_or_default();

        // The checks.
        let mut failures = Vec::new();
        let mut notes = vec![format!(
            "faults {}",
            done.iter()
                .map(|d| format!(
                    "+{:.1}s {}{}",
                    d.offset.as_secs_f64(),
                    d.fault,
                    if d.target.is_empty() {
                        String::new()
                    } else {
                        format!(" {}", d.target)
                    }
                ))
                .collect::<Vec<_>>()
                .join(", ")
        )];
        notes.extend(not_made);
        match &back {
            Ok(took) => notes.push(format!(
                "back to {size} servers, {} following, one primary, {:.1} s after the last fault",
                size - 1,
                took.as_secs_f64()
            )),
            Err(e) => failures.push(format!("not back to its spec: {e:#}")),
        }
        notes.push(format!(
            "{} writes ({} acknowledged, {} unknown, refused {:?}), {} acknowledged by a replica",
            log.sent,
            log.acknowledged,
            log.unknown,
            log.refused,
            log.replicated.len()
        ));
        seen.extend(killed.iter().cloned());
        match self.present(&pods, &log.replicated).await {
            Ok(present) => {
                let (lost, excused) = lost_replicated_writes(&log.replicated, &present, &seen);
                if !lost.is_empty() {
                    failures.push(format!(
                        "{} writes a replica acknowledged are not on the primary: {:?}",
                        lost.len(),
                        lost.iter().take(10).collect::<Vec<_>>()
                    ));
                }
                if !excused.is_empty() {
                    notes.push(format!(
                        "{} replicated writes gone with every server that had them (killed or scaled away before another copied them)",
                        excused.len()
                    ));
                }
            }
            Err(e) => failures.push(format!("the replicated writes could not be read: {e:#}")),
        }
        let failovers = failovers(&events).await?;
        if failovers.len() != primaries_lost.len() {
            failures.push(format!(
                "{} Failover Events for {} primaries lost ({primaries_lost:?}): {failovers:?}",
                failovers.len(),
                primaries_lost.len()
            ));
        }
        notes.push(format!("{} failovers", failovers.len()));
        for (pod, from, to) in &cut_windows {
            // Killed while cut, or killed before the cut with its failover still to come (seed
            // 39: the primary killed through containerd at +19.8 s and cut, restarting, at
            // +21.8 s; the failover the kill caused came during the cut).
            let killed = done.iter().any(|d| {
                matches!(d.fault, Fault::KillPrimary { .. })
                    && &d.target == pod
                    && d.at_ms <= *to
                    && (d.at_ms >= *from
                        || !failovers
                            .iter()
                            .any(|(at, lost, _)| lost == pod && *at >= d.at_ms && at < from))
            });
            let replaced: Vec<&(i64, String, String)> = failovers
                .iter()
                .filter(|(at, lost, _)| lost == pod && *at >= *from && *at <= to + 2_000)
                .collect();
            if !killed && !replaced.is_empty() {
                failures.push(format!(
                    "primary {pod} was replaced while its network was cut, running: {replaced:?}"
                ));
            }
        }
        if !failures.is_empty() {
            let kept = self.evidence.join(format!("redis-seed-{seed}"));
            let report = json!({
                "sent": log.sent, "acknowledged": log.acknowledged, "unknown": log.unknown,
                "refused": log.refused,
                "replicated": log.replicated.iter().map(|w| json!([w.key, w.at_ms, w.replicas, w.to])).collect::<Vec<_>>(),
                "killed": killed.iter().map(|k| json!([k.server, k.at_ms])).collect::<Vec<_>>(),
                "primariesLost": primaries_lost,
            });
            let scratch = tempfile::tempdir()?;
            if let Err(e) = self
                .keep_evidence(
                    &kept,
                    &ns,
                    &objects,
                    &events,
                    scratch.path(),
                    &report.to_string(),
                )
                .await
            {
                notes.push(format!("evidence not kept: {e:#}"));
            } else if let Err(e) = std::fs::write(kept.join("servers.txt"), server_lines.join("\n"))
            {
                notes.push(format!("the servers' timeline not kept: {e:#}"));
            } else {
                notes.push(format!("evidence in {}", kept.display()));
            }
        }
        let _ = objects.delete(NAME, &DeleteParams::background()).await;
        drop(namespace);
        Ok(Outcome {
            failures,
            notes,
            stalls: 0,
        })
    }

    /// Which of the replicated writes the server the Service selects has.
    async fn present(
        &self,
        pods: &Api<Pod>,
        writes: &[ReplicatedWrite],
    ) -> Result<BTreeSet<String>> {
        let primary = match selected(pods).await.map_err(anyhow::Error::msg)?.as_slice() {
            [one] => pod_ip(one).ok_or_else(|| anyhow!("the primary has no IP"))?,
            other => bail!("the Service selects {} servers", other.len()),
        };
        let mut connection = Connection::open(&primary).await?;
        let mut present = BTreeSet::new();
        for chunk in writes.chunks(500) {
            let mut args = vec!["MGET"];
            args.extend(chunk.iter().map(|w| w.key.as_str()));
            match connection.call(&args, Duration::from_secs(10)).await? {
                Reply::Array(values) => {
                    for (write, value) in chunk.iter().zip(values) {
                        if matches!(value, Reply::Bulk(Some(_))) {
                            present.insert(write.key.clone());
                        }
                    }
                }
                other => bail!("MGET answered {other:?}"),
            }
        }
        Ok(present)
    }
}

/// The RedisReplication is back to `size` servers: the status `Available` and not
/// `Progressing` with `size - 1` following; `size` live server Pods, all Ready; exactly one
/// says `role:master`, it is the one the status names and the only Pod the Service selects,
/// and every other follows it with its link up.
async fn converged(
    objects: &Api<DynamicObject>,
    pods: &Api<Pod>,
    services: &Api<Service>,
    size: u32,
) -> Result<(), String> {
    let object = objects.get(NAME).await.map_err(|e| e.to_string())?;
    let status = &object.data["status"];
    let condition = |kind: &str| {
        status["conditions"]
            .as_array()
            .into_iter()
            .flatten()
            .find(|c| c["type"] == kind)
            .map(|c| c["status"].clone())
    };
    if condition("Available") != Some(json!("True"))
        || condition("Progressing") != Some(json!("False"))
        || status["followingReplicas"] != json!(size - 1)
    {
        return Err(format!("status {status}"));
    }
    let live = member_pods(pods).await?;
    if live.len() != size as usize || !live.iter().all(pod_ready) {
        return Err(format!(
            "{} server pods, {} Ready",
            live.len(),
            live.iter().filter(|p| pod_ready(p)).count()
        ));
    }
    let mut masters = Vec::new();
    let mut infos = Vec::new();
    for pod in &live {
        let ip = pod_ip(pod).ok_or_else(|| format!("{} has no IP", name_of(pod)))?;
        let info = replication(&ip)
            .await
            .map_err(|e| format!("{}: {e:#}", name_of(pod)))?;
        if info.get("role").map(String::as_str) == Some("master") {
            masters.push((name_of(pod), ip.clone()));
        }
        infos.push((name_of(pod), info));
    }
    let [(primary, primary_ip)] = masters.as_slice() else {
        return Err(format!("servers saying role:master: {masters:?}"));
    };
    if status["primary"] != json!(primary) {
        return Err(format!(
            "{primary} is master, the status says {}",
            status["primary"]
        ));
    }
    for (name, info) in infos.iter().filter(|(name, _)| name != primary) {
        if info.get("master_host") != Some(primary_ip)
            || info.get("master_link_status").map(String::as_str) != Some("up")
        {
            return Err(format!(
                "{name} does not follow {primary} with its link up: {info:?}"
            ));
        }
    }
    let selector = services
        .get(NAME)
        .await
        .map_err(|e| e.to_string())?
        .spec
        .and_then(|s| s.selector)
        .unwrap_or_default();
    let selector: Vec<String> = selector.iter().map(|(k, v)| format!("{k}={v}")).collect();
    let chosen: Vec<String> = pods
        .list(&ListParams::default().labels(&selector.join(",")))
        .await
        .map_err(|e| e.to_string())?
        .items
        .iter()
        .filter(|p| p.metadata.deletion_timestamp.is_none())
        .map(name_of)
        .collect();
    if chosen != [primary.clone()] {
        return Err(format!(
            "the Service selects {chosen:?}, the master is {primary}"
        ));
    }
    Ok(())
}
