//! The fault campaign (issue 24 item 4): random fault sequences on the real node against an
//! EtcdCluster managed by the host installed as the README says (two replicas, leader
//! election, the etcd plugin from its ConfigMap), under a client that writes and reads the
//! whole time; after each run, checks that
//!
//! - **no acknowledged write is lost** (every unique key etcd acknowledged is read back);
//! - **the history is linearizable**, as porcupine (an existing checker, through the Go client
//!   `tests/env/campaign-writer`) finds the puts and gets of a few registers;
//! - **no quorum loss is the operator's doing**: a stretch of 5 s or more in which no member
//!   answers a linearizable read fails the run when the faults the campaign injected in and
//!   just before it hurt no more members than the quorum tolerates *and* the operator changed
//!   the members in it or 10 s before (`policy_host_e2e::campaign` judges; a stretch with
//!   neither is a stall of the loaded machine, counted);
//! - **every membership change is done once**: each member ID is added at most once and
//!   removed at most once (the plugin's `MemberAdded` / `MemberRemoved` Events, a series
//!   counting each repeat), and etcd's final members are the ones before the faults plus
//!   those added less those removed;
//! - **the cluster is back to its spec** within 3 minutes of the last fault: `N/N` Running at
//!   the spec's version, `N` Ready pods, `N` voting members, held for 6 s without a break.
//!
//! A run: a fresh namespace, a 3-member cluster on the older etcd, then 3 to 5 faults at
//! offsets drawn from the run's seed (the sequence and its timing are the seed's; what a fault
//! hits, e.g. which pod leads, is the cluster's state at that moment): a member killed
//! (SIGKILL through containerd, or its pod deleted with grace 0), the etcd leader killed the
//! same ways, the leading host's container SIGKILLed through containerd, a member's network
//! cut and healed, a scale 3 <-> 5, the rolling upgrade to the newer etcd, a plugin hot swap
//! (the plugin ConfigMap's limits changed, so the host compiles and swaps the plugin in). No
//! second member's pod and data is destroyed within [`DATA_LOSS_SPACING`] of another: a
//! majority's data lost is beyond any operator without a backup.
//!
//! `--app redis` runs the same campaign against a RedisReplication instead (`redis`, in
//! `fault_campaign/redis.rs`: its faults, client and checks).
//!
//! Run (dev profile: the release one would be a cold build of its own):
//! `env -u RUST_BACKTRACE cargo bench --profile dev -p policy-host-e2e --bench fault_campaign -- --runs 10 --seed 1`.
//! Run `i` uses seed `S + i`; `--seed S --runs 1` repeats one. Failed runs leave their
//! evidence (status, Events, pod logs, the client's report and the porcupine visualization)
//! in `$TMPDIR/fault-campaign/seed-<seed>/` (`redis-seed-<seed>/` for the Redis mode, with
//! `servers.txt`: every server Pod and its `INFO` replication and keys, at each change). BENCHMARKS.md records the campaigns run.

use std::collections::{BTreeMap, BTreeSet};
use std::fmt;
use std::path::{Path, PathBuf};
use std::process::Stdio;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

use anyhow::{Context, Result, anyhow, bail};
use k8s_openapi::api::apps::v1::Deployment;
use k8s_openapi::api::coordination::v1::Lease;
use k8s_openapi::api::core::v1::{ConfigMap, Pod};
use k8s_openapi::api::events::v1::Event;
use kube::Client;
use kube::api::{Api, DeleteParams, DynamicObject, ListParams, Patch, PatchParams};
use policy_host_e2e::campaign::{
    ACTION_WINDOW, Hurt, OperatorAction, QuorumVerdict, Sample, judge_no_quorum,
    no_quorum_stretches, operator_actions,
};
use policy_host_e2e::etcd::{etcd_clusters, eventually, pod_endpoint, pod_ready, run_etcdctl};
use policy_host_e2e::install::{load_host_image, run_readme_install};
use policy_host_testenv::images::MadeImage;
use policy_host_testenv::network::{PodNetworkCut, cut_pod_network};
use policy_host_testenv::{TestEnv, shared_node};
use serde_json::{Value, json};
use tokio::io::AsyncReadExt;

// The Redis mode, in a file of its own beside this one.
#[path = "fault_campaign/redis.rs"]
mod redis;

const NAME: &str = "campaign";
const HOST_NAMESPACE: &str = "policy-host";
/// How long a cluster may take to come back to its spec after the last fault.
const BACK_TO_SPEC: Duration = Duration::from_secs(180);
/// How long the spec must hold, without a break, to count as back.
const HELD: Duration = Duration::from_secs(6);
/// How long after a member's Pod and data are destroyed the campaign destroys no other's: a
/// replacement is added, started and promoted within it (up to ~20 s under load). Two
/// destroyed at once leave a 3-member cluster without the data of a majority, which no
/// operator can bring back without a backup (seed 51: `QuorumLost`, as README says).
const DATA_LOSS_SPACING: Duration = Duration::from_secs(30);

/// SplitMix64: the campaign's source of randomness, so a seed names a run.
struct Rng(u64);

impl Rng {
    fn next(&mut self) -> u64 {
        self.0 = self.0.wrapping_add(0x9E37_79B9_7F4A_7C15);
        let mut z = self.0;
        z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
        z ^ (z >> 31)
    }

    /// A number in `0..n`.
    fn below(&mut self, n: u64) -> u64 {
        self.next() % n.max(1)
    }

    /// Milliseconds in `low..high`, as a duration.
    fn millis(&mut self, low: u64, high: u64) -> Duration {
        Duration::from_millis(low + self.below(high - low))
    }
}

/// How a member (or the etcd leader) is killed.
#[derive(Clone, Copy, Debug)]
enum Kill {
    /// SIGKILL of its container through containerd: the kubelet restarts it, same pod, same data.
    Containerd,
    /// Its pod deleted with grace 0: pod and data gone, the host must replace the member.
    DeletePod,
}

#[derive(Clone, Debug)]
enum Fault {
    KillMember {
        pick: u64,
        how: Kill,
    },
    KillEtcdLeader {
        how: Kill,
    },
    KillHostLeader,
    CutNetwork {
        pick: u64,
        id: usize,
    },
    HealNetwork {
        id: usize,
    },
    Scale {
        to: u32,
    },
    Upgrade,
    PluginSwap,
    /// Redis: the server the client Service selects.
    KillPrimary {
        how: Kill,
    },
    /// Redis: a server the Service does not select.
    KillReplica {
        pick: u64,
        how: Kill,
    },
    /// Redis: the primary's network cut (healed by a later [`Fault::HealNetwork`]).
    CutPrimary {
        id: usize,
    },
}

impl fmt::Display for Fault {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Fault::KillMember { how, .. } => write!(f, "kill-member({how:?})"),
            Fault::KillEtcdLeader { how } => write!(f, "kill-etcd-leader({how:?})"),
            Fault::KillHostLeader => write!(f, "kill-host-leader"),
            Fault::CutNetwork { .. } => write!(f, "cut-network"),
            Fault::HealNetwork { .. } => write!(f, "heal-network"),
            Fault::Scale { to } => write!(f, "scale-to-{to}"),
            Fault::Upgrade => write!(f, "rolling-upgrade"),
            Fault::PluginSwap => write!(f, "plugin-hot-swap"),
            Fault::KillPrimary { how } => write!(f, "kill-primary({how:?})"),
            Fault::KillReplica { how, .. } => write!(f, "kill-replica({how:?})"),
            Fault::CutPrimary { .. } => write!(f, "cut-primary"),
        }
    }
}

impl Fault {
    /// Whether the fault takes an etcd member out for a while.
    fn hurts_a_member(&self) -> bool {
        matches!(
            self,
            Fault::KillMember { .. } | Fault::KillEtcdLeader { .. } | Fault::CutNetwork { .. }
        )
    }
}

/// Whether the fault destroys a member's Pod and data (a grace-0 delete).
fn destroys_data(fault: &Fault) -> bool {
    matches!(
        fault,
        Fault::KillMember {
            how: Kill::DeletePod,
            ..
        } | Fault::KillEtcdLeader {
            how: Kill::DeletePod
        }
    )
}

/// The faults of one run at their offsets from the start of its writer, in time order, and
/// the spec the cluster must come back to.
struct Plan {
    faults: Vec<(Duration, Fault)>,
    size: u32,
    upgraded: bool,
}

fn plan(seed: u64) -> Plan {
    let mut rng = Rng(seed);
    let count = 3 + rng.below(3);
    let mut at = Duration::from_secs(3);
    let mut faults = Vec::new();
    let (mut size, mut upgraded, mut cuts) = (3, false, 0);
    let how = |rng: &mut Rng| {
        if rng.below(2) == 0 {
            Kill::Containerd
        } else {
            Kill::DeletePod
        }
    };
    for _ in 0..count {
        let fault = match rng.below(8) {
            0 => Fault::KillMember {
                pick: rng.next(),
                how: how(&mut rng),
            },
            1 => Fault::KillEtcdLeader { how: how(&mut rng) },
            2 => Fault::KillHostLeader,
            3 => {
                cuts += 1;
                Fault::CutNetwork {
                    pick: rng.next(),
                    id: cuts,
                }
            }
            4 | 5 => {
                size = if size == 3 { 5 } else { 3 };
                Fault::Scale { to: size }
            }
            6 if !upgraded => {
                upgraded = true;
                Fault::Upgrade
            }
            _ => Fault::PluginSwap,
        };
        if let Fault::CutNetwork { id, .. } = fault {
            faults.push((at + rng.millis(3_000, 12_000), Fault::HealNetwork { id }));
        }
        faults.push((at, fault));
        at += rng.millis(500, 9_000);
    }
    faults.sort_by_key(|(at, _)| *at);
    Plan {
        faults,
        size,
        upgraded,
    }
}

fn unix_millis() -> i64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map_or(0, |d| d.as_millis() as i64)
}

/// The shared installation: the node, the host installed as the README says, the client.
struct Campaign {
    env: &'static TestEnv,
    client: Client,
    writer: PathBuf,
    etcdctl: PathBuf,
    older: String,
    newer: String,
    evidence: PathBuf,
    swaps: u32,
    /// The apps' images the campaign loaded (`tests/e2e/test-images.yaml`).
    images: Vec<MadeImage>,
}

/// What a fault did, for the run's line and the quorum analysis.
struct Done {
    at_ms: i64,
    offset: Duration,
    fault: Fault,
    target: String,
}

/// The client's report (`tests/env/campaign-writer`).
#[derive(serde::Deserialize)]
#[serde(rename_all = "camelCase")]
struct Report {
    operations: usize,
    puts_ok: usize,
    puts_unknown: usize,
    acknowledged: usize,
    lost: Vec<String>,
    final_read: String,
    linearizable: String,
    check_millis: u64,
    visualization: Option<String>,
    samples: Vec<Sample>,
}

/// One run's outcome.
struct Outcome {
    failures: Vec<String>,
    notes: Vec<String>,
    /// Stretches without quorum that neither the faults nor the operator explain.
    stalls: usize,
}

fn main() -> Result<()> {
    let mut runs = 10u64;
    let mut seed = 1u64;
    let mut app = App::Etcd;
    let mut args = std::env::args().skip(1);
    while let Some(arg) = args.next() {
        match arg.as_str() {
            "--runs" => runs = args.next().context("--runs takes a number")?.parse()?,
            "--seed" => seed = args.next().context("--seed takes a number")?.parse()?,
            "--app" => {
                app = match args.next().as_deref() {
                    Some("etcd") => App::Etcd,
                    Some("redis") => App::Redis,
                    other => bail!("--app takes etcd or redis, not {other:?}"),
                }
            }
            // cargo bench passes --bench; nothing else is understood.
            "--bench" => {}
            other => bail!("unknown argument {other}: use --runs N --seed S [--app etcd|redis]"),
        }
    }
    let runtime = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()?;
    runtime.block_on(campaign(runs, seed, app))
}

/// What the campaign runs its faults against.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum App {
    /// An EtcdCluster (the etcd plugin).
    Etcd,
    /// A RedisReplication (the redis plugin): [`redis`].
    Redis,
}

async fn campaign(runs: u64, first_seed: u64, app: App) -> Result<()> {
    let started = Instant::now();
    let mut campaign = Campaign::install().await?;
    match app {
        App::Etcd => println!(
            "fault campaign: {runs} runs from seed {first_seed}, etcd {} -> {}, evidence of failures in {}",
            campaign.older,
            campaign.newer,
            campaign.evidence.display()
        ),
        App::Redis => {
            campaign.install_redis().await?;
            println!(
                "fault campaign (redis): {runs} runs from seed {first_seed}, redis {}, evidence of failures in {}",
                campaign.redis_version()?,
                campaign.evidence.display()
            );
        }
    }
    let mut failed = Vec::new();
    let mut counts: BTreeMap<String, usize> = BTreeMap::new();
    let mut durations = Vec::new();
    let mut stalls = 0;
    for seed in first_seed..first_seed + runs {
        let plan = match app {
            App::Etcd => plan(seed),
            App::Redis => redis::plan(seed),
        };
        for (_, fault) in &plan.faults {
            *counts.entry(fault.to_string()).or_default() += 1;
        }
        let run_started = Instant::now();
        let outcome = match app {
            App::Etcd => campaign.run(seed, &plan).await,
            App::Redis => campaign.run_redis(seed, &plan).await,
        };
        let took = run_started.elapsed();
        durations.push(took);
        stalls += outcome.as_ref().map_or(0, |o| o.stalls);
        let (verdict, notes) = match outcome {
            Ok(o) if o.failures.is_empty() => ("ok".to_owned(), o.notes),
            Ok(o) => {
                failed.push(seed);
                (format!("FAILED: {}", o.failures.join("; ")), o.notes)
            }
            Err(e) => {
                failed.push(seed);
                (format!("FAILED (the run itself): {e:#}"), Vec::new())
            }
        };
        println!(
            "run seed {seed}: {:.1} s; {}; {verdict}",
            took.as_secs_f64(),
            notes.join("; ")
        );
    }
    durations.sort();
    println!(
        "summary: {runs} runs from seed {first_seed} in {:.1} min (median run {:.1} s); faults {}; {stalls} stalls of the machine without quorum; {} failed{}",
        started.elapsed().as_secs_f64() / 60.0,
        durations
            .get(durations.len() / 2)
            .copied()
            .unwrap_or_default()
            .as_secs_f64(),
        counts
            .iter()
            .map(|(k, v)| format!("{k} x{v}"))
            .collect::<Vec<_>>()
            .join(", "),
        failed.len(),
        if failed.is_empty() {
            String::new()
        } else {
            format!(" (seeds {failed:?})")
        }
    );
    Ok(())
}

impl Campaign {
    /// Starts the node, installs the host as the README says and waits until it leads, removes
    /// the README's example cluster (the campaign makes its own), builds the client.
    async fn install() -> Result<Campaign> {
        let env = shared_node().await?;
        let client = env.client().await?;
        // The apps' images, loaded here rather than found among `env.images()`: the test
        // environment loads the crate under test's declarations through `CARGO_MANIFEST_DIR`,
        // which cargo sets for `cargo bench` but not for the campaign's binary started on its
        // own (BENCHMARKS.md's command), and then the node had no etcd image at all.
        let declared = Path::new(env!("CARGO_MANIFEST_DIR")).join("test-images.yaml");
        let images = env.provide_images(&declared).await?;
        let versions = policy_host_e2e::apps::etcd_versions_in(&images);
        if versions.len() < 2 {
            bail!(
                "{} declares {} etcd version(s) (through guest-etcd/test-images.yaml); the campaign's upgrade needs two",
                declared.display(),
                versions.len()
            );
        }
        let writer =
            tokio::task::spawn_blocking(move || env.binaries().ensure_campaign_writer()).await??;
        // The checker's verdicts are trusted only once it judges known histories right.
        let checked = tokio::process::Command::new(&writer)
            .arg("-self-check")
            .output()
            .await?;
        if !checked.status.success() {
            bail!(
                "{} -self-check: {}",
                writer.display(),
                String::from_utf8_lossy(&checked.stderr)
            );
        }
        tokio::task::spawn_blocking(move || load_host_image(env).map(drop)).await??;
        tokio::task::spawn_blocking(move || run_readme_install(env).map(drop)).await??;
        let deployments: Api<Deployment> = Api::namespaced(client.clone(), HOST_NAMESPACE);
        eventually(
            "the host Deployment 2/2 available",
            Duration::from_secs(300),
            || async {
                let d = deployments
                    .get("policy-host")
                    .await
                    .map_err(|e| e.to_string())?;
                let ready = d.status.and_then(|s| s.ready_replicas).unwrap_or(0);
                (ready >= 2).then_some(()).ok_or(format!("{ready} ready"))
            },
        )
        .await?;
        let examples: Api<DynamicObject> =
            Api::namespaced_with(client.clone(), "default", &etcd_clusters());
        let _ = examples
            .delete("example-etcd-cluster", &DeleteParams::background())
            .await;
        let etcdctl = policy_host_e2e::apps::etcd_dir_in(&images, &versions[0])
            .ok_or_else(|| anyhow!("etcd {} is not built", versions[0]))?
            .join("etcdctl");
        let evidence = std::env::temp_dir().join("fault-campaign");
        std::fs::create_dir_all(&evidence)?;
        Ok(Campaign {
            env,
            client,
            writer,
            etcdctl,
            newer: versions[0].trim_start_matches('v').to_owned(),
            older: versions[1].trim_start_matches('v').to_owned(),
            evidence,
            swaps: 0,
            images,
        })
    }

    async fn run(&mut self, seed: u64, plan: &Plan) -> Result<Outcome> {
        let namespace = self.env.create_namespace("campaign").await?;
        let ns = namespace.name().to_owned();
        let clusters: Api<DynamicObject> =
            Api::namespaced_with(self.client.clone(), &ns, &etcd_clusters());
        let pods: Api<Pod> = Api::namespaced(self.client.clone(), &ns);
        let events: Api<Event> = Api::namespaced(self.client.clone(), &ns);
        let manifest = json!({
            "apiVersion": "etcd.database.coreos.com/v1beta2", "kind": "EtcdCluster",
            "metadata": {"name": NAME}, "spec": {"size": 3, "version": self.older},
        });
        clusters
            .patch(
                NAME,
                &PatchParams::apply("fault-campaign").force(),
                &Patch::Apply(&manifest),
            )
            .await?;
        eventually("the new cluster 3/3", BACK_TO_SPEC, || {
            self.converged(&clusters, &pods, 3, &self.older)
        })
        .await?;
        let before_events = membership_events(&events).await?;
        let before_ids = self.member_ids(&pods).await.map_err(anyhow::Error::msg)?;

        // The client, following the member endpoints through a file.
        let dir = tempfile::Builder::new()
            .prefix(&format!("fault-campaign-{seed}-"))
            .tempdir()?;
        let endpoints_file = dir.path().join("endpoints");
        write_endpoints(&pods, &endpoints_file).await?;
        let following = Arc::new(AtomicBool::new(true));
        let follower = tokio::spawn({
            let (pods, file, following) = (pods.clone(), endpoints_file.clone(), following.clone());
            async move {
                while following.load(Ordering::Relaxed) {
                    let _ = write_endpoints(&pods, &file).await;
                    // How often the file follows the pods, not a wait for anything.
                    tokio::time::sleep(Duration::from_millis(500)).await;
                }
            }
        });
        let mut writer = tokio::process::Command::new(&self.writer)
            .arg("-endpoints-file")
            .arg(&endpoints_file)
            .arg("-seed")
            .arg(seed.to_string())
            .arg("-out")
            .arg(dir.path())
            .stdin(Stdio::piped())
            .stdout(Stdio::piped())
            // A file, not a pipe: nobody reads the client's stderr until it ends.
            .stderr(std::fs::File::create(dir.path().join("client.stderr"))?)
            .kill_on_drop(true)
            .spawn()
            .with_context(|| format!("starting {}", self.writer.display()))?;

        // The faults, at their offsets.
        let start = Instant::now();
        let mut done = Vec::new();
        let mut cuts: BTreeMap<usize, PodNetworkCut> = BTreeMap::new();
        let mut not_made = Vec::new();
        for (offset, fault) in &plan.faults {
            // The plan's timing: the point of the campaign, not a stand-in for a condition.
            tokio::time::sleep_until((start + *offset).into()).await;
            let at_ms = unix_millis();
            if destroys_data(fault)
                && let Some(last) = done.iter().rev().find(|d: &&Done| destroys_data(&d.fault))
                && at_ms - last.at_ms < DATA_LOSS_SPACING.as_millis() as i64
            {
                not_made.push(format!(
                    "{fault} at +{:.1} s not made: {} s after {}'s data was destroyed (no second member's data within {DATA_LOSS_SPACING:?})",
                    offset.as_secs_f64(),
                    (at_ms - last.at_ms) / 1000,
                    last.target
                ));
                continue;
            }
            match self.inject(fault, &ns, &pods, &clusters, &mut cuts).await {
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
                // A fault that could not be made (no pod to hit yet) is not the system's.
                Err(e) => not_made.push(format!(
                    "{fault} at +{:.1} s not made: {e:#}",
                    offset.as_secs_f64()
                )),
            }
        }
        for (_, cut) in std::mem::take(&mut cuts) {
            let _ = cut.heal();
        }
        let version = if plan.upgraded {
            self.newer.clone()
        } else {
            self.older.clone()
        };
        let last_fault = Instant::now();
        let back = self
            .back_to_spec(&clusters, &pods, plan.size as usize, &version)
            .await
            .map(|since| since.duration_since(last_fault));
        // A few more seconds of writes on the healed cluster (the writer's pace).
        tokio::time::sleep(Duration::from_secs(2)).await;
        drop(writer.stdin.take());
        let mut stdout = writer.stdout.take().context("the client's stdout")?;
        let mut text = String::new();
        tokio::time::timeout(Duration::from_secs(240), async {
            let _ = stdout.read_to_string(&mut text).await;
            writer.wait().await
        })
        .await
        .context("the client did not finish within 240 s of being stopped")??;
        following.store(false, Ordering::Relaxed);
        let _ = follower.await;
        let report: Report = serde_json::from_str(text.trim()).with_context(|| {
            let stderr =
                std::fs::read_to_string(dir.path().join("client.stderr")).unwrap_or_default();
            format!("the client's report is not JSON: {text:?}; its stderr: {stderr}")
        })?;

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
                "back to {}/{} at {version} {:.1} s after the last fault",
                plan.size,
                plan.size,
                took.as_secs_f64()
            )),
            Err(e) => failures.push(format!("not back to its spec: {e:#}")),
        }
        notes.push(format!(
            "{} ops ({} puts acknowledged, {} unknown), {} unique writes acknowledged, porcupine {} in {} ms",
            report.operations,
            report.puts_ok,
            report.puts_unknown,
            report.acknowledged,
            report.linearizable,
            report.check_millis
        ));
        if !report.lost.is_empty() {
            failures.push(format!(
                "{} acknowledged writes lost: {:?}",
                report.lost.len(),
                &report.lost[..report.lost.len().min(10)]
            ));
        }
        if report.final_read != "ok" {
            failures.push(format!("final read failed: {}", report.final_read));
        }
        match report.linearizable.as_str() {
            "ok" => {}
            "unknown" => notes.push("linearizability not decided within 60 s".to_owned()),
            other => failures.push(format!(
                "history {other} (not linearizable); porcupine's visualization: {}",
                report.visualization.as_deref().unwrap_or("none")
            )),
        }
        let all_events = events.list(&ListParams::default()).await?.items;
        let own_deletes: Vec<(String, i64)> = done
            .iter()
            .filter(|d| destroys_data(&d.fault))
            .map(|d| (d.target.clone(), d.at_ms))
            .collect();
        let actions = operator_actions(&all_events, &format!("{NAME}-"), &own_deletes);
        let (quorum_failures, quorum_notes, stalls) =
            quorum_losses(&report.samples, &done, &actions);
        failures.extend(quorum_failures);
        notes.extend(quorum_notes);
        let after_events = membership_events(&events).await?;
        let after_ids = self.member_ids(&pods).await.map_err(anyhow::Error::msg);
        let (membership_failures, membership_note) = membership_changes(
            &before_events,
            &after_events,
            &before_ids,
            after_ids.as_ref().ok(),
        );
        failures.extend(membership_failures);
        notes.push(membership_note);
        if let Err(e) = &after_ids {
            failures.push(format!("no final member list: {e}"));
        }
        if !failures.is_empty() {
            let kept = self.evidence.join(format!("seed-{seed}"));
            if let Err(e) = self
                .keep_evidence(&kept, &ns, &clusters, &events, dir.path(), &text)
                .await
            {
                notes.push(format!("evidence not kept: {e:#}"));
            } else {
                notes.push(format!("evidence in {}", kept.display()));
            }
        }
        let _ = clusters.delete(NAME, &DeleteParams::background()).await;
        drop(namespace);
        Ok(Outcome {
            failures,
            notes,
            stalls,
        })
    }

    /// Makes one fault; returns what it hit.
    async fn inject(
        &mut self,
        fault: &Fault,
        ns: &str,
        pods: &Api<Pod>,
        clusters: &Api<DynamicObject>,
        cuts: &mut BTreeMap<usize, PodNetworkCut>,
    ) -> Result<String> {
        match fault {
            Fault::KillMember { pick, how } => {
                let live = member_pods(pods).await.map_err(anyhow::Error::msg)?;
                let victim = live
                    .get((*pick % live.len().max(1) as u64) as usize)
                    .ok_or_else(|| anyhow!("no member pod to kill"))?;
                self.kill(ns, pods, victim, *how).await
            }
            Fault::KillEtcdLeader { how } => {
                let leader = self.etcd_leader(pods).await.map_err(anyhow::Error::msg)?;
                self.kill(ns, pods, &leader, *how).await
            }
            Fault::KillHostLeader => {
                // Killing the leader while the standby is down leaves no host at all, for as long
                // as the kubelet's crash back-off lasts (up to 5 min once a container was killed
                // a few times: Redis seed 55, both replicas down for 3 min): a fault of the
                // campaign's making, not one a cluster meets, so it is not made.
                let deployments: Api<Deployment> =
                    Api::namespaced(self.client.clone(), HOST_NAMESPACE);
                let ready = deployments
                    .get("policy-host")
                    .await?
                    .status
                    .and_then(|s| s.ready_replicas)
                    .unwrap_or(0);
                if ready < 2 {
                    bail!("{ready} of 2 host replicas Ready: the standby is not running");
                }
                let leases: Api<Lease> = Api::namespaced(self.client.clone(), HOST_NAMESPACE);
                let holder = leases
                    .get("policy-host")
                    .await?
                    .spec
                    .and_then(|s| s.holder_identity)
                    .ok_or_else(|| anyhow!("the Lease has no holder"))?;
                // The identity is `<pod>-<pid>`.
                let pod = holder
                    .rsplit_once('-')
                    .map(|(pod, _)| pod.to_owned())
                    .ok_or_else(|| anyhow!("holder {holder} is not <pod>-<pid>"))?;
                self.env.kill_pod(HOST_NAMESPACE, &pod).await?;
                Ok(pod)
            }
            Fault::CutNetwork { pick, id } => {
                // Only a pod with a network can be cut off: one created a moment ago has none.
                let live: Vec<Pod> = member_pods(pods)
                    .await
                    .map_err(anyhow::Error::msg)?
                    .into_iter()
                    .filter(|p| pod_endpoint(p).is_some())
                    .collect();
                let victim = live
                    .get((*pick % live.len().max(1) as u64) as usize)
                    .ok_or_else(|| anyhow!("no member pod to cut off"))?;
                let ip = victim
                    .status
                    .as_ref()
                    .and_then(|s| s.pod_ip.clone())
                    .ok_or_else(|| anyhow!("the victim has no IP yet"))?;
                cuts.insert(*id, cut_pod_network(&ip)?);
                Ok(name_of(victim))
            }
            Fault::HealNetwork { id } => match cuts.remove(id) {
                Some(cut) => {
                    let ip = cut.pod_ip().to_owned();
                    cut.heal()?;
                    Ok(ip)
                }
                None => Ok("(its cut failed)".to_owned()),
            },
            Fault::Scale { to } => {
                clusters
                    .patch(
                        NAME,
                        &PatchParams::default(),
                        &Patch::Merge(&json!({"spec": {"size": to}})),
                    )
                    .await?;
                Ok(String::new())
            }
            Fault::Upgrade => {
                clusters
                    .patch(
                        NAME,
                        &PatchParams::default(),
                        &Patch::Merge(&json!({"spec": {"version": self.newer}})),
                    )
                    .await?;
                Ok(String::new())
            }
            Fault::PluginSwap => {
                // New limits make a new plugin for the host: compiled (or taken from its
                // artifact cache) and swapped in while reconciles go on.
                self.swaps += 1;
                let deadline = 5_000 + 1_000 * (self.swaps % 2);
                let config_maps: Api<ConfigMap> =
                    Api::namespaced(self.client.clone(), HOST_NAMESPACE);
                config_maps
                    .patch(
                        "plugin-etcd",
                        &PatchParams::default(),
                        &Patch::Merge(
                            &json!({"data": {"limits": format!("{{deadlineMs: {deadline}}}")}}),
                        ),
                    )
                    .await?;
                Ok(format!("deadlineMs {deadline}"))
            }
            Fault::KillPrimary { .. } | Fault::KillReplica { .. } | Fault::CutPrimary { .. } => {
                bail!("{fault} is a Redis fault; the Redis mode makes it")
            }
        }
    }

    async fn kill(&self, ns: &str, pods: &Api<Pod>, victim: &Pod, how: Kill) -> Result<String> {
        let name = name_of(victim);
        match how {
            Kill::Containerd => self.env.kill_pod(ns, &name).await?,
            Kill::DeletePod => {
                pods.delete(
                    &name,
                    &DeleteParams {
                        grace_period_seconds: Some(0),
                        ..DeleteParams::default()
                    },
                )
                .await?;
            }
        }
        Ok(name)
    }

    /// The member pod that etcd says leads.
    async fn etcd_leader(&self, pods: &Api<Pod>) -> Result<Pod, String> {
        let live = member_pods(pods).await?;
        for pod in &live {
            let Some(endpoint) = pod_endpoint(pod) else {
                continue;
            };
            let Ok(text) = run_etcdctl(
                &self.etcdctl,
                std::slice::from_ref(&endpoint),
                &["endpoint", "status", "-w", "json"],
            )
            .await
            else {
                continue;
            };
            let status: Value = serde_json::from_str(&text).map_err(|e| e.to_string())?;
            let status = &status[0]["Status"];
            if status["leader"].as_u64().is_some()
                && status["leader"] == status["header"]["member_id"]
            {
                return Ok(pod.clone());
            }
        }
        Err("no member says it leads".to_owned())
    }

    /// Waits until the cluster has been converged ([`Campaign::converged`]) long enough
    /// ([`held`]); returns when that stretch began.
    async fn back_to_spec(
        &self,
        clusters: &Api<DynamicObject>,
        pods: &Api<Pod>,
        size: usize,
        version: &str,
    ) -> Result<Instant> {
        held(&format!("{size}/{size} at {version}"), || {
            self.converged(clusters, pods, size, version)
        })
        .await
    }

    /// The cluster is `size/size` Running at `version`, with as many Ready pods running it and
    /// as many voting members in etcd.
    async fn converged(
        &self,
        clusters: &Api<DynamicObject>,
        pods: &Api<Pod>,
        size: usize,
        version: &str,
    ) -> Result<(), String> {
        let cluster = clusters.get(NAME).await.map_err(|e| e.to_string())?;
        let status = &cluster.data["status"];
        if status["ready"] != json!(format!("{size}/{size}"))
            || status["phase"] != "Running"
            || status["currentVersion"] != json!(version)
        {
            return Err(format!("status {status}"));
        }
        let live = member_pods(pods).await?;
        let ready: Vec<&Pod> = live.iter().filter(|p| pod_ready(p)).collect();
        if live.len() != size || ready.len() != size {
            return Err(format!("{} pods, {} Ready", live.len(), ready.len()));
        }
        if live
            .iter()
            .any(|p| image_tag(p).trim_start_matches('v') != version)
        {
            return Err(format!("a member pod does not run etcd {version} yet"));
        }
        let endpoints: Vec<String> = ready.iter().filter_map(|p| pod_endpoint(p)).collect();
        let text =
            run_etcdctl(&self.etcdctl, &endpoints, &["member", "list", "-w", "json"]).await?;
        let list: Value = serde_json::from_str(&text).map_err(|e| e.to_string())?;
        let members = list["members"].as_array().cloned().unwrap_or_default();
        if members.len() != size || members.iter().any(|m| m["isLearner"] == true) {
            return Err(format!("etcd members {members:?}"));
        }
        Ok(())
    }

    /// etcd's member IDs (hex, as the plugin's Events write them).
    async fn member_ids(&self, pods: &Api<Pod>) -> Result<BTreeSet<String>, String> {
        let endpoints: Vec<String> = member_pods(pods)
            .await?
            .iter()
            .filter(|p| pod_ready(p))
            .filter_map(pod_endpoint)
            .collect();
        let text =
            run_etcdctl(&self.etcdctl, &endpoints, &["member", "list", "-w", "json"]).await?;
        let list: Value = serde_json::from_str(&text).map_err(|e| e.to_string())?;
        Ok(list["members"]
            .as_array()
            .into_iter()
            .flatten()
            .filter_map(|m| m["ID"].as_u64())
            .map(|id| format!("{id:x}"))
            .collect())
    }

    /// The status, Events, member and host pod logs and the client's report of a failed run.
    async fn keep_evidence(
        &self,
        kept: &Path,
        ns: &str,
        clusters: &Api<DynamicObject>,
        events: &Api<Event>,
        run_dir: &Path,
        report: &str,
    ) -> Result<()> {
        std::fs::create_dir_all(kept)?;
        let cluster = clusters.get(NAME).await?;
        std::fs::write(
            kept.join("cluster.json"),
            serde_json::to_string_pretty(&cluster)?,
        )?;
        let mut lines = Vec::new();
        let mut all = events.list(&ListParams::default()).await?.items;
        all.sort_by_key(|e| e.metadata.creation_timestamp.clone());
        for e in all {
            lines.push(format!(
                "{} {} {} x{} {}",
                e.metadata
                    .creation_timestamp
                    .map(|t| t.0.to_string())
                    .unwrap_or_default(),
                e.reason.unwrap_or_default(),
                e.regarding.and_then(|r| r.name).unwrap_or_default(),
                e.series.map_or(1, |s| s.count),
                e.note.unwrap_or_default()
            ));
        }
        std::fs::write(kept.join("events.txt"), lines.join("\n"))?;
        std::fs::write(kept.join("client-report.json"), report)?;
        for entry in std::fs::read_dir(run_dir)?.flatten() {
            let name = entry.file_name().to_string_lossy().into_owned();
            if name.ends_with(".html") || name == "client.stderr" {
                std::fs::copy(entry.path(), kept.join(entry.file_name()))?;
            }
        }
        let pods: Api<Pod> = Api::namespaced(self.client.clone(), ns);
        let mut names: BTreeSet<String> = pods
            .list(&ListParams::default())
            .await?
            .items
            .iter()
            .map(name_of)
            .collect();
        for n in 0..8 {
            names.insert(format!("{NAME}-{n}"));
        }
        for name in names {
            let logs = self.env.pod_logs(ns, &name).await;
            if !logs.is_empty() {
                std::fs::write(kept.join(format!("pod-{name}.log")), logs)?;
            }
        }
        let hosts: Api<Pod> = Api::namespaced(self.client.clone(), HOST_NAMESPACE);
        for host in hosts.list(&ListParams::default()).await?.items {
            let name = name_of(&host);
            let logs = self.env.pod_logs(HOST_NAMESPACE, &name).await;
            std::fs::write(kept.join(format!("host-{name}.log")), logs)?;
        }
        Ok(())
    }
}

/// Waits until `converged` has held for [`HELD`] without a break, within [`BACK_TO_SPEC`];
/// returns when that stretch began. Held, not seen once: right after a kill the pods and the
/// status still say Ready until the kubelet and the host notice.
async fn held<F, Fut>(what: &str, converged: F) -> Result<Instant>
where
    F: Fn() -> Fut,
    Fut: std::future::Future<Output = Result<(), String>>,
{
    let deadline = Instant::now() + BACK_TO_SPEC;
    let mut since: Option<Instant> = None;
    loop {
        match converged().await {
            Ok(()) => {
                let began = *since.get_or_insert_with(Instant::now);
                if began.elapsed() >= HELD {
                    return Ok(began);
                }
            }
            Err(why) => {
                since = None;
                if Instant::now() >= deadline {
                    bail!("not {what} within {BACK_TO_SPEC:?}: {why}");
                }
            }
        }
        tokio::time::sleep(Duration::from_millis(250)).await;
    }
}

fn name_of(pod: &Pod) -> String {
    pod.metadata.name.clone().unwrap_or_default()
}

fn image_tag(pod: &Pod) -> String {
    pod.spec
        .as_ref()
        .and_then(|s| s.containers.first())
        .and_then(|c| c.image.as_deref())
        .and_then(|i| i.rsplit_once(':'))
        .map(|(_, tag)| tag.to_owned())
        .unwrap_or_default()
}

/// The cluster's live member pods (not backups, not being deleted), by name.
async fn member_pods(pods: &Api<Pod>) -> Result<Vec<Pod>, String> {
    let list = pods
        .list(&ListParams::default().labels(&format!(
            "app.kubernetes.io/instance={NAME},!etcd.database.coreos.com/role"
        )))
        .await
        .map_err(|e| e.to_string())?;
    let mut live: Vec<Pod> = list
        .items
        .into_iter()
        .filter(|p| p.metadata.deletion_timestamp.is_none())
        .collect();
    live.sort_by_key(name_of);
    Ok(live)
}

/// Writes the live member pods' client endpoints for the client to follow.
async fn write_endpoints(pods: &Api<Pod>, file: &Path) -> Result<()> {
    let endpoints: Vec<String> = member_pods(pods)
        .await
        .map_err(anyhow::Error::msg)?
        .iter()
        .filter_map(pod_endpoint)
        .collect();
    if endpoints.is_empty() {
        return Ok(());
    }
    let partial = file.with_extension("partial");
    tokio::fs::write(&partial, endpoints.join("\n")).await?;
    tokio::fs::rename(&partial, file).await?;
    Ok(())
}

/// `(reason, member ID) -> times` of the plugin's membership Events on the cluster.
async fn membership_events(events: &Api<Event>) -> Result<BTreeMap<(String, String), i32>> {
    let mut counts = BTreeMap::new();
    for e in events.list(&ListParams::default()).await?.items {
        let reason = e.reason.clone().unwrap_or_default();
        // A stale learner removed is a member removed (it is added again under a new ID).
        let reason = match reason.as_str() {
            "MemberAdded" | "MemberRemoved" => reason,
            "LearnerRemoved" => "MemberRemoved".to_owned(),
            _ => continue,
        };
        let note = e.note.clone().unwrap_or_default();
        // "added member x-3 (ID 8e9e05c52164694d) as a learner"
        let Some(id) = note
            .split_once("(ID ")
            .and_then(|(_, rest)| rest.split_once(')'))
            .map(|(id, _)| id.to_owned())
        else {
            continue;
        };
        *counts.entry((reason, id)).or_default() += e.series.map_or(1, |s| s.count.max(1));
    }
    Ok(counts)
}

/// Every ID added or removed at most once during the faults, and etcd's members after them
/// what the Events say they should be.
fn membership_changes(
    before: &BTreeMap<(String, String), i32>,
    after: &BTreeMap<(String, String), i32>,
    before_ids: &BTreeSet<String>,
    after_ids: Option<&BTreeSet<String>>,
) -> (Vec<String>, String) {
    let mut failures = Vec::new();
    let (mut added, mut removed) = (BTreeSet::new(), BTreeSet::new());
    for ((reason, id), count) in after {
        let new = count
            - before
                .get(&(reason.clone(), id.clone()))
                .copied()
                .unwrap_or(0);
        if count > &1 {
            failures.push(format!("{reason} {count} times for member ID {id}"));
        }
        if new > 0 {
            if reason == "MemberAdded" {
                added.insert(id.clone());
            } else {
                removed.insert(id.clone());
            }
        }
    }
    if let Some(after_ids) = after_ids {
        let expected: BTreeSet<String> = before_ids
            .union(&added)
            .filter(|id| !removed.contains(*id))
            .cloned()
            .collect();
        if &expected != after_ids {
            failures.push(format!(
                "etcd's members {after_ids:?} are not the members before {before_ids:?} + added {added:?} - removed {removed:?}"
            ));
        }
    }
    let note = format!(
        "membership: {} added, {} removed",
        added.len(),
        removed.len()
    );
    (failures, note)
}

/// The stretches without quorum of at least [`policy_host_e2e::campaign::QUORUM_LOSS`], each judged
/// ([`judge_no_quorum`]): the operator's are failures, the campaign's faults' and the
/// machine's stalls notes; the count of stalls.
fn quorum_losses(
    samples: &[Sample],
    done: &[Done],
    actions: &[OperatorAction],
) -> (Vec<String>, Vec<String>, usize) {
    let (mut failures, mut notes, mut stalls) = (Vec::new(), Vec::new(), 0);
    let Some(first) = samples.first() else {
        return (vec!["the client took no samples".to_owned()], notes, 0);
    };
    let hurt: Vec<Hurt> = done
        .iter()
        .filter(|d| d.fault.hurts_a_member())
        .map(|d| Hurt {
            at_ms: d.at_ms,
            member: d.target.clone(),
        })
        .collect();
    let stretches = no_quorum_stretches(samples, 3);
    for stretch in &stretches {
        let what = format!(
            "no quorum for {:.1} s from +{:.1} s ({} voters",
            stretch.lasted().as_secs_f64(),
            (stretch.from_ms - first.t) as f64 / 1000.0,
            stretch.voters
        );
        match judge_no_quorum(stretch, &hurt, actions) {
            QuorumVerdict::Brief => {}
            QuorumVerdict::CampaignFaults { hurt } => {
                notes.push(format!("{what}; hurt: {hurt:?}): the campaign's own doing"))
            }
            QuorumVerdict::MachineStall { hurt } => {
                stalls += 1;
                notes.push(format!(
                    "{what}; hurt: {hurt:?}): a stall of the machine, no operator action in it or {} s before",
                    ACTION_WINDOW.as_secs()
                ))
            }
            QuorumVerdict::Operator { hurt, actions } => failures.push(format!(
                "{what}; hurt: {hurt:?}): more than the faults explain, and the operator acted: {}",
                actions.join("; ")
            )),
        }
    }
    let longest = stretches
        .iter()
        .map(|s| s.lasted())
        .max()
        .unwrap_or_default();
    notes.push(format!(
        "{} quorum samples, longest stretch without quorum {:.1} s",
        samples.len(),
        longest.as_secs_f64()
    ));
    (failures, notes, stalls)
}
