//! The decisions: which server is the primary, what each server is told, which children exist,
//! and what the status says. Pure: [`Facts`] in (the parent, each server's Pod and its answer
//! to the probe), a [`Plan`] out (SQL commands to send, then Kubernetes actions).
//!
//! The truth is re-derived from the servers on every decision, never taken from the status
//! alone: a decision's commands land before its status, and the status write can be lost
//! (SDK README, "Commands to the app land before the status"). So:
//! - **Who is primary**: `status.currentPrimary`, unless exactly one *other* server is
//!   writable and holds every replica's transactions: an earlier promotion whose status never
//!   landed, adopted rather than repeated. A writable server beside the writable recorded
//!   primary that no replica follows, with semi-sync on (an old primary back from a network
//!   cut), has had nothing acknowledged since it lost its replicas and is made read-only
//!   (`OldPrimaryFenced`), its clients disconnected first (their commits, waiting for an
//!   acknowledgement, hold `read_only` back); any other pair of writable servers is never acted on (split brain:
//!   `Degraded`, nothing sent). Every server boots read-only and does not replicate by itself
//!   ([`crate::children::SERVER_CONFIG`]), so only this plugin makes one writable.
//! - **Failover** (MOCO's, docs/clustering.md), when the primary's Pod is gone, ended, or not
//!   ready and not answering; never from Pod readiness alone:
//!   1. nothing while any replica that may hold the last acknowledged write does not answer
//!      (a known replica missing, a replica Pod not answering): `FailoverBlocked`;
//!   2. fence: stop every replica's IO thread, so the old primary can no longer get a
//!      semi-synchronous acknowledgement (its commits wait; none is acknowledged and lost);
//!   3. choose the replica whose GTIDs (executed and retrieved) contain every other's; none
//!      does: the replicas diverged, refuse (`Diverged`); errant replicas are never chosen;
//!   4. wait until it executed what it retrieved, then promote it.
//! - **Steady state**: the primary writable with semi-sync on while it has replicas; every
//!   other server read-only, replicating from it by GTID (`MASTER_USE_GTID=slave_pos`; an old
//!   primary with `MASTER_DEMOTE_TO_SLAVE=1`, never `RESET MASTER`), unless its binlog holds
//!   transactions the primary's lacks: errant, quarantined (replication stopped, role label
//!   `errant`, listed in status, a Warning Event), never promoted.
//!   Semi-sync found off while replicas replicate is `Degraded` (`SemiSyncOff`).
//! - **Switchover** on the annotation [`children::SWITCHOVER_ANNOTATION`]: the primary goes
//!   read-only, every other replica stops retrieving (only the target can acknowledge now:
//!   root writes through `read_only`), the target catches up to the primary's binlog position
//!   (`MASTER_GTID_WAIT`), stops retrieving, applies all it retrieved, and is promoted; the old
//!   primary turns semi-sync off and rejoins as a replica on the next decision.
//! - **Scale**: the primary and the lowest other ordinals, `spec.replicas` of them; the other
//!   Pods are deleted (their claims stay), only when no failover is under way.
//! - **Rolling update** of the version, image or `spec.config`: while every server is in line,
//!   one server's Pod is deleted and created again on its claim with the new image and
//!   configuration, the replicas first (lowest ordinal first), then the primary after a
//!   switchover to an updated replica (MOCO's order), so the primary restarts last and only
//!   once, as a replica. A lone primary restarts in place.

use policy_host_sdk::conditions::{Condition, already_set, set_condition};
use policy_host_sdk::prelude::*;

use crate::children::{self, Role};
use crate::probe::Probe;
use crate::spec::{MariaDBClusterSpec, MariaDBClusterStatus, ReplicaState};

/// Reconcile again this soon while a failover or switchover is under way (ms).
pub const REQUEUE_FAILOVER_MS: u64 = 1_000;

/// Reconcile again this soon while anything else moves (ms).
pub const REQUEUE_BUSY_MS: u64 = 2_000;

/// Reconcile again this soon when all is well, to notice a lost primary or a broken link (ms).
pub const REQUEUE_STEADY_MS: u64 = 5_000;

/// A server Pod's life, as far as decisions care.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum PodState {
    /// Not running yet.
    Pending,
    /// Running; `ready` is its readiness (a TCP check of the MySQL port).
    Running {
        /// The Pod's `Ready` condition.
        ready: bool,
    },
    /// Being deleted.
    Terminating,
    /// Ended (`Failed` or `Succeeded`): it will not run again by itself.
    Ended,
}

/// One server as observed: its Pod and its answer to the probe.
#[derive(Clone, Debug, PartialEq)]
pub struct Server {
    /// Pod name.
    pub name: String,
    /// The image the Pod was created with.
    pub image: String,
    /// The configuration revision the Pod was created with
    /// ([`children::CONFIG_REVISION_ANNOTATION`]).
    pub config_revision: String,
    /// Its seed step's donor and backup, if it was created with one
    /// ([`children::SEED_ANNOTATION`], [`children::RESTORE_ANNOTATION`]).
    pub seed: Option<children::Seed>,
    /// The init container (`seed`, or the backup's `download`) that keeps failing
    /// (`CrashLoopBackOff`), if one does: the server will not start by itself.
    pub seed_failing: Option<String>,
    /// The Pod's state.
    pub pod: PodState,
    /// Its answer, or why there is none.
    pub probe: Result<Probe, String>,
}

impl Server {
    fn answer(&self) -> Option<&Probe> {
        self.probe.as_ref().ok()
    }

    fn gone(&self) -> bool {
        matches!(self.pod, PodState::Terminating | PodState::Ended)
    }
}

/// Everything a decision is made from.
#[derive(Clone, Debug, PartialEq)]
pub struct Facts {
    /// `metadata.name` of the MariaDBCluster.
    pub name: String,
    /// `metadata.namespace` of the MariaDBCluster.
    pub namespace: String,
    /// `metadata.generation`.
    pub generation: Option<i64>,
    /// The spec.
    pub spec: MariaDBClusterSpec,
    /// The status as last written.
    pub status: MariaDBClusterStatus,
    /// The value of [`children::SWITCHOVER_ANNOTATION`], if set.
    pub switchover: Option<String>,
    /// The server Pods the parent controls, by ordinal.
    pub servers: Vec<Server>,
    /// Why the plugin cannot log in to the servers, if it cannot (no credentials).
    pub credentials_unavailable: Option<String>,
    /// The observation's time.
    pub now: Timestamp,
    /// The Pod taking a backup, if there is one.
    pub backup_pod: Option<crate::backup::BackupPod>,
}

/// A command for one server; each is idempotent, or checked before it is sent.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Command {
    /// `SET GLOBAL read_only = …`.
    SetReadOnly {
        /// Pod name.
        pod: String,
        /// The value.
        read_only: bool,
    },
    /// `STOP SLAVE IO_THREAD`: the fence of a failover.
    StopIo {
        /// Pod name.
        pod: String,
    },
    /// `STOP SLAVE`: quarantine of an errant replica.
    StopReplication {
        /// Pod name.
        pod: String,
    },
    /// `STOP SLAVE; RESET SLAVE ALL` (when it has a link), `SET GLOBAL read_only = OFF`: take
    /// writes.
    Promote {
        /// Pod name.
        pod: String,
        /// Forget its replication link first.
        reset_link: bool,
    },
    /// `SET GLOBAL rpl_semi_sync_master_enabled = …`.
    SemiSync {
        /// Pod name.
        pod: String,
        /// The value.
        on: bool,
    },
    /// `STOP SLAVE; CHANGE MASTER TO <source> … MASTER_USE_GTID=slave_pos; START SLAVE`.
    Replicate {
        /// Pod name.
        pod: String,
        /// The source's Pod name.
        source: String,
        /// Add `MASTER_DEMOTE_TO_SLAVE=1`: the server wrote as a primary.
        demote: bool,
    },
    /// `START SLAVE`.
    StartReplication {
        /// Pod name.
        pod: String,
    },
    /// `START SLAVE SQL_THREAD`: apply what was retrieved, the IO thread staying fenced.
    StartApplying {
        /// Pod name.
        pod: String,
    },
    /// Reads the source's `@@gtid_binlog_pos` and waits (`MASTER_GTID_WAIT`, a few seconds)
    /// until the pod executed it; fails the decision if it did not.
    CatchUp {
        /// Pod name.
        pod: String,
        /// The source's Pod name.
        source: String,
    },
    /// Reads the pod's own `Gtid_IO_Pos` and waits (`MASTER_GTID_WAIT`, a few seconds) until
    /// its SQL thread applied everything its IO thread retrieved; fails the decision if not.
    ApplyRetrieved {
        /// Pod name.
        pod: String,
    },
    /// `KILL CONNECTION` of every client of the pod's server (not its replication threads, not
    /// the plugin's own session). An old primary cut off from its replicas holds its clients'
    /// commits waiting for an acknowledgement that will not come; they hold `read_only` back,
    /// and turning semi-sync off would release them with an OK for writes no replica has.
    /// Killed, their clients see the connection lost: never acknowledged.
    Disconnect {
        /// Pod name.
        pod: String,
    },
}

/// What to do: commands first (a failed one fails the decision before any action, so the
/// status never claims what did not happen), then the actions.
#[derive(Clone, Debug, PartialEq)]
pub struct Plan {
    /// Commands, in order.
    pub commands: Vec<Command>,
    /// Kubernetes actions, in order.
    pub actions: Vec<Action>,
    /// When to look again.
    pub requeue_after_ms: Option<u64>,
    /// The domain metrics of this decision ([`crate::metrics`]).
    pub metrics: Vec<policy_host_sdk::metrics::Sample>,
}

/// What the decision concluded about the cluster, for the status.
struct Verdict {
    primary: Option<String>,
    phase: &'static str,
    degraded: Option<(&'static str, String)>,
    progressing: Option<String>,
    requeue_ms: u64,
    /// Pods may be deleted (scale-down, ended ones): not during a failover.
    may_delete: bool,
    /// The server whose Pod the rolling update deletes now (its claim stays; the Pod comes
    /// back with the spec's image and configuration).
    restart: Option<String>,
}

impl Verdict {
    fn steady(primary: Option<String>) -> Self {
        Verdict {
            primary,
            phase: "Healthy",
            degraded: None,
            progressing: None,
            requeue_ms: REQUEUE_STEADY_MS,
            may_delete: true,
            restart: None,
        }
    }
}

/// Decides, from the facts alone.
pub fn decide(facts: &Facts) -> Plan {
    let mut status = facts.status.clone();
    let mut actions = Vec::new();
    // A name cannot be fixed by editing the spec: say so before anything else.
    let invalid = policy_host_sdk::names::check_child_names(&facts.name, children::CHILD_NAMES)
        .err()
        .map(|e| e.to_string())
        .or_else(|| facts.spec.invalid());
    if let Some(message) = invalid {
        let degraded = Condition::new("Degraded", true, "InvalidSpec", message.clone())
            .observed(facts.generation);
        if !already_set(&status.conditions, &degraded) {
            actions.push(Action::RecordEvent(Event::warning("InvalidSpec", message)));
        }
        set_condition(&mut status.conditions, degraded, facts.now);
        status.phase = "Degraded".into();
        actions.push(status_action(&status));
        return Plan {
            commands: Vec::new(),
            actions,
            requeue_after_ms: None,
            metrics: Vec::new(),
        };
    }

    if facts.spec.paused {
        return paused(facts, status, actions);
    }
    // Resumed: say so once, and carry on from what the servers say now.
    if status
        .conditions
        .iter()
        .any(|c| c.type_ == "Paused" && c.status == "True")
    {
        actions.push(Action::RecordEvent(Event::normal(
            "Resumed",
            RESUMED_MESSAGE,
        )));
        set_condition(
            &mut status.conditions,
            Condition::new("Paused", false, "Resumed", RESUMED_MESSAGE).observed(facts.generation),
            facts.now,
        );
    }

    let mut commands = Vec::new();
    let mut events = Vec::new();
    let verdict = match &facts.credentials_unavailable {
        Some(why) => Verdict {
            primary: status.current_primary.clone(),
            phase: "Degraded",
            degraded: Some(("CredentialsUnavailable", why.clone())),
            progressing: None,
            requeue_ms: REQUEUE_STEADY_MS,
            may_delete: false,
            restart: None,
        },
        None => match status.current_primary.clone() {
            None => elect(facts, &mut commands, &mut events),
            Some(primary) => {
                follow_primary(facts, &primary, &mut status, &mut commands, &mut events)
            }
        },
    };

    // Which servers are errant: re-derived from GTIDs against the primary.
    let primary_probe = verdict
        .primary
        .as_deref()
        .and_then(|p| server(facts, p))
        .and_then(Server::answer);
    // Not while switching over: the old primary is still ahead of the target observed before
    // it caught up, which is no errant transaction.
    let errant: Vec<String> = match primary_probe {
        Some(p) if verdict.phase == "Healthy" => facts
            .servers
            .iter()
            .filter(|s| Some(s.name.as_str()) != verdict.primary.as_deref())
            .filter(|s| s.answer().is_some_and(|r| is_errant(r, p)))
            .map(|s| s.name.clone())
            .collect(),
        // Without a primary to compare with (or mid-switchover), keep the last list.
        _ => status.errant_replicas.clone(),
    };

    actions.extend(children_actions(facts, &verdict, &errant));
    actions.extend(events);
    if let Some(primary) = verdict.primary.as_deref()
        && status.restored_from.is_none()
        && let Some(restored) = server(facts, primary)
            .and_then(|s| s.seed.as_ref())
            .and_then(|seed| seed.restore.as_ref())
            .map(children::RestoreSource::describe)
    {
        actions.push(Action::RecordEvent(Event::normal(
            "Restored",
            format!("{primary} holds the backup {restored} and takes writes; the other servers copy it from there"),
        )));
        status.restored_from = Some(restored);
    }
    let backups = crate::backup::plan(
        &facts.name,
        &facts.namespace,
        &facts.spec,
        facts.backup_pod.as_ref(),
        &mut status.backup,
        facts.now,
        verdict.phase == "Healthy" && primary_probe.is_some_and(|p| !p.read_only),
    );
    actions.extend(backups.actions);

    // Status.
    let ready = record_servers(facts, &mut status, verdict.primary.as_deref(), &errant);
    status.current_primary = verdict.primary.clone();
    for name in &errant {
        if !status.errant_replicas.contains(name) {
            actions.push(Action::RecordEvent(Event::warning(
                "ErrantReplica",
                format!(
                    "{name} holds transactions the primary lacks; it is out of the replicas Service and will never be promoted. Keep what you need of it, then delete its Pod and PersistentVolumeClaim {} to rebuild it from the primary",
                    children::claim_name(name)
                ),
            )));
        }
    }
    status.errant_replicas = errant.clone();
    status.observed_generation = facts.generation;
    let mut degraded = verdict.degraded.clone();
    // A write is acknowledged before any replica has it once semi-sync fell back to
    // asynchronous (a replica's plugin off, or the timeout passed): failover could then lose
    // it. Judged while replicas replicate, so a cluster still starting is not flagged.
    let semi_sync_off = verdict.phase == "Healthy"
        && facts.spec.replicas > 0
        && ready > 0
        && primary_probe.is_some_and(|p| p.semi_sync_primary && !p.semi_sync_active);
    if degraded.is_none() && semi_sync_off {
        degraded = Some((
            "SemiSyncOff",
            format!(
                "semi-synchronous replication is off on {}: writes are acknowledged before a replica has them, and a failover may lose them; check rpl_semi_sync_slave_enabled on the replicas",
                verdict.primary.clone().unwrap_or_default()
            ),
        ));
    }
    if degraded.is_none() && !errant.is_empty() {
        degraded = Some((
            "ErrantReplica",
            format!("errant, quarantined: {}", errant.join(", ")),
        ));
    }
    // A server whose seed step keeps failing never starts by itself (the first server of a
    // restore, before any primary, is judged when electing): it is a replica the spec asks
    // for that will not come, and only its init container's log says why.
    if degraded.is_none()
        && let Some((name, step, donor)) = facts.servers.iter().find_map(|s| {
            Some((
                s.name.as_str(),
                s.seed_failing.as_deref()?,
                s.seed.as_ref()?.donor.as_str(),
            ))
        })
    {
        degraded = Some((
            "SeedFailing",
            format!(
                "{name} cannot copy its data from {donor}: its init container `{step}` keeps failing, and the kubelet runs it again with a growing back-off; `kubectl logs {name} -c {step}` says why (the primary not answering, the dump refused or cut short)"
            ),
        ));
    }
    let wanted_replicas = usize::try_from(facts.spec.replicas).unwrap_or(0);
    // Without credentials nothing can move: say so once, not every two seconds.
    let can_progress = facts.credentials_unavailable.is_none();
    let progressing = verdict.progressing.clone().or_else(|| {
        (can_progress && (!commands.is_empty() || ready < wanted_replicas))
            .then(|| format!("{ready} of {wanted_replicas} replicas replicate from the primary"))
    });
    let phase = match (verdict.phase, &progressing) {
        ("Healthy", Some(_)) if facts.status.current_primary.is_none() => "Creating",
        (phase, _) => phase,
    };
    status.phase = phase.to_owned();
    let available = match primary_probe {
        Some(_) if verdict.phase == "Healthy" => Condition::new(
            "Available",
            true,
            "PrimaryWritable",
            format!(
                "{} takes writes",
                verdict.primary.clone().unwrap_or_default()
            ),
        ),
        _ => Condition::new(
            "Available",
            false,
            degraded.as_ref().map_or(
                match verdict.phase {
                    "Healthy" => "NoPrimary",
                    moving => moving,
                },
                |d| d.0,
            ),
            match &verdict.primary {
                Some(p) => format!("primary {p} does not take writes now"),
                None => "no primary yet".to_owned(),
            },
        ),
    };
    let progressing = match progressing {
        Some(message) => Condition::new(
            "Progressing",
            true,
            match phase {
                "Healthy" | "Degraded" => "Converging",
                moving => moving,
            },
            message,
        ),
        None if !can_progress => Condition::new(
            "Progressing",
            false,
            "WaitingForCredentials",
            "nothing moves until the plugin can log in to the servers",
        ),
        None => Condition::new(
            "Progressing",
            false,
            "Converged",
            format!("{ready} replicas replicate from the primary"),
        ),
    };
    let degraded = match degraded {
        Some((reason, message)) => Condition::new("Degraded", true, reason, message),
        None => Condition::new("Degraded", false, "Healthy", "no server lost or errant"),
    };
    if degraded.status == "True"
        && degraded.reason != "ErrantReplica"
        && !already_set(&status.conditions, &degraded)
    {
        actions.push(Action::RecordEvent(Event::warning(
            &degraded.reason,
            degraded.message.clone(),
        )));
    }
    let converged = commands.is_empty()
        && verdict.requeue_ms == REQUEUE_STEADY_MS
        && progressing.status == "False";
    for condition in [available, progressing, degraded] {
        set_condition(
            &mut status.conditions,
            condition.observed(facts.generation),
            facts.now,
        );
    }
    actions.push(status_action(&status));
    let metrics = metrics(facts, &status, verdict.primary.as_deref(), &actions);
    Plan {
        metrics,
        commands,
        actions,
        requeue_after_ms: Some(
            if converged {
                REQUEUE_STEADY_MS
            } else {
                verdict.requeue_ms.min(REQUEUE_BUSY_MS)
            }
            .min(backups.requeue_ms.unwrap_or(u64::MAX)),
        ),
    }
}

/// The `Paused` condition's message while `spec.paused` holds.
const PAUSED_MESSAGE: &str = "spec.paused is true: no command is sent to a server (no failover, switchover or repointing) and no child is written or deleted; set spec.paused to false to resume";

/// The `Paused` condition's message once resumed.
const RESUMED_MESSAGE: &str =
    "spec.paused was set back to false: the plugin acts on what the servers say now";

/// `spec.paused`: the servers are only read (a human may be working on them, or on the Pods
/// and Services): no command, no child applied or deleted. The status keeps reporting what
/// the servers say, under the primary it last recorded.
fn paused(facts: &Facts, mut status: MariaDBClusterStatus, mut actions: Vec<Action>) -> Plan {
    let primary = status.current_primary.clone();
    let errant = status.errant_replicas.clone();
    record_servers(facts, &mut status, primary.as_deref(), &errant);
    status.observed_generation = facts.generation;
    status.phase = "Paused".into();
    let condition = Condition::new("Paused", true, "Paused", PAUSED_MESSAGE);
    if !already_set(&status.conditions, &condition) {
        actions.push(Action::RecordEvent(Event::normal("Paused", PAUSED_MESSAGE)));
    }
    for condition in [
        condition,
        Condition::new("Progressing", false, "Paused", PAUSED_MESSAGE),
    ] {
        set_condition(
            &mut status.conditions,
            condition.observed(facts.generation),
            facts.now,
        );
    }
    actions.push(status_action(&status));
    Plan {
        commands: Vec::new(),
        metrics: metrics(facts, &status, primary.as_deref(), &actions),
        actions,
        requeue_after_ms: Some(REQUEUE_STEADY_MS),
    }
}

/// What each server other than `primary` is (replicating, lagging, errant, …), how many
/// replicate, and the primary's binlog position, into `status`; returns how many replicate.
fn record_servers(
    facts: &Facts,
    status: &mut MariaDBClusterStatus,
    primary: Option<&str>,
    errant: &[String],
) -> usize {
    let replicas: Vec<ReplicaState> = facts
        .servers
        .iter()
        .filter(|s| Some(s.name.as_str()) != primary && !s.gone())
        .map(|s| replica_state(facts, s, primary, errant))
        .collect();
    let ready = replicas.iter().filter(|r| r.state == "Replicating").count();
    status.ready_replicas = i32::try_from(ready).unwrap_or(i32::MAX);
    status.replicas = replicas;
    if let Some(p) = primary
        .and_then(|p| server(facts, p))
        .and_then(Server::answer)
    {
        status.primary_gtid_pos = p.binlog_pos.to_string();
    }
    ready
}

/// The decision's domain metrics, from the status it writes and the Events it records.
fn metrics(
    facts: &Facts,
    status: &MariaDBClusterStatus,
    primary: Option<&str>,
    actions: &[Action],
) -> Vec<policy_host_sdk::metrics::Sample> {
    crate::metrics::report(&crate::metrics::Seen {
        status,
        desired: facts.spec.replicas,
        primary_pos: primary
            .and_then(|p| server(facts, p))
            .and_then(Server::answer)
            .map(|p| &p.binlog_pos),
        replicas: facts
            .servers
            .iter()
            .filter(|s| Some(s.name.as_str()) != primary)
            .filter_map(|s| Some((s.name.as_str(), &s.answer()?.current_pos)))
            .collect(),
        events: actions
            .iter()
            .filter_map(|a| match a {
                Action::RecordEvent(event) => Some(event.reason.as_str()),
                _ => None,
            })
            .collect(),
    })
}

fn server<'a>(facts: &'a Facts, name: &str) -> Option<&'a Server> {
    facts.servers.iter().find(|s| s.name == name)
}

/// A replica's binlog holds a transaction the primary's lacks.
fn is_errant(replica: &Probe, primary: &Probe) -> bool {
    !replica
        .binlog_state
        .errant_against(&primary.binlog_state)
        .is_empty()
}

/// The server among `candidates` whose GTIDs contain every other's (ties: the lowest
/// ordinal); `None` when none does (they diverged).
fn most_advanced<'a>(facts: &Facts, candidates: &[&'a Server]) -> Option<&'a Server> {
    let mut ordered: Vec<&&Server> = candidates.iter().collect();
    ordered.sort_by_key(|s| children::ordinal(&facts.name, &s.name));
    ordered
        .into_iter()
        .find(|c| {
            let mine = c.answer().map(Probe::holds).unwrap_or_default();
            candidates
                .iter()
                .all(|o| mine.contains(&o.answer().map(Probe::holds).unwrap_or_default()))
        })
        .copied()
}

/// A new cluster (no primary in status): once every server answers, the one holding the most
/// (all fresh: `<name>-0`) is promoted; a server already writable is adopted.
fn elect(facts: &Facts, commands: &mut Vec<Command>, events: &mut Vec<Action>) -> Verdict {
    let writable: Vec<&Server> = facts
        .servers
        .iter()
        .filter(|s| s.answer().is_some_and(|p| !p.read_only))
        .collect();
    if writable.len() > 1 {
        return split_brain(None, &writable);
    }
    if let [only] = writable.as_slice() {
        events.push(Action::RecordEvent(Event::normal(
            "PrimaryAdopted",
            format!("{} already takes writes; it is the primary", only.name),
        )));
        return Verdict::steady(Some(only.name.clone()));
    }
    let missing: Vec<String> = wanted_servers(facts, None)
        .into_iter()
        .filter(|n| server(facts, n).and_then(Server::answer).is_none())
        .collect();
    if !missing.is_empty() {
        // A server whose seed step keeps failing never starts by itself: with a backup to
        // restore, that is the backup (a file not on the claim, an object the store does not
        // serve), and only the user can fix it.
        let failing_restore = facts.servers.iter().find_map(|s| {
            let step = s.seed_failing.as_deref()?;
            let source = s.seed.as_ref()?.restore.as_ref()?;
            Some(format!(
                "{} cannot load the backup {}: its init container `{step}` keeps failing; `kubectl logs {} -c {step}` says why (a file not on the claim, an object the store does not serve, wrong keys); fix spec.restore, then delete the Pod {} to try again",
                s.name,
                source.describe(),
                s.name,
                s.name
            ))
        });
        return Verdict {
            degraded: failing_restore.map(|message| ("RestoreFailed", message)),
            progressing: Some(format!(
                "waiting for {} to answer before electing the first primary",
                missing.join(", ")
            )),
            requeue_ms: REQUEUE_BUSY_MS,
            ..Verdict::steady(None)
        };
    }
    let answering: Vec<&Server> = facts
        .servers
        .iter()
        .filter(|s| s.answer().is_some())
        .collect();
    let Some(chosen) = most_advanced(facts, &answering) else {
        return diverged(None, &answering);
    };
    commands.push(Command::Promote {
        pod: chosen.name.clone(),
        reset_link: chosen.answer().is_some_and(|p| p.link.is_some()),
    });
    events.push(Action::RecordEvent(Event::normal(
        "PrimaryElected",
        format!("{} is the primary", chosen.name),
    )));
    Verdict {
        progressing: Some(format!("{} elected primary", chosen.name)),
        requeue_ms: REQUEUE_BUSY_MS,
        ..Verdict::steady(Some(chosen.name.clone()))
    }
}

/// Writable servers beside a writable recorded primary that no replica follows and that wait
/// for a replica's acknowledgement at each commit (semi-sync on): a primary cut off and
/// replaced, back from the cut still configured writable. Since it lost its replicas no write
/// it took was acknowledged (semi-sync never falls back), so nothing acknowledged is lost by
/// making it read-only at once; it then rejoins as a replica or, holding those writes, is
/// quarantined as errant. Any other pair of writable servers is a split brain for a human.
fn fence_old_primaries(
    facts: &Facts,
    primary: &str,
    writable: &[&Server],
    others: &[&Server],
    commands: &mut Vec<Command>,
    events: &mut Vec<Action>,
) -> Option<Verdict> {
    if others.is_empty() || !writable.iter().any(|s| s.name == primary) {
        return None;
    }
    let followed = |name: &str| {
        let host = children::host_of(&facts.name, name);
        facts.servers.iter().filter_map(Server::answer).any(|p| {
            p.link
                .as_ref()
                .is_some_and(|l| l.io_running && l.source_host == host)
        })
    };
    let stale = |s: &Server| s.answer().is_some_and(|p| p.semi_sync_primary) && !followed(&s.name);
    if !others.iter().all(|s| stale(s)) {
        return None;
    }
    for old in others {
        commands.push(Command::Disconnect {
            pod: old.name.clone(),
        });
        commands.push(Command::SetReadOnly {
            pod: old.name.clone(),
            read_only: true,
        });
        events.push(Action::RecordEvent(Event::warning(
            "OldPrimaryFenced",
            format!(
                "{} took writes beside the primary {primary} with no replica following it (a primary cut off and replaced): made read-only; no write it took since it lost its replicas was acknowledged, and if it holds any it is quarantined as errant",
                old.name
            ),
        )));
    }
    Some(Verdict {
        progressing: Some(format!(
            "{} made read-only beside the primary {primary}",
            others
                .iter()
                .map(|s| s.name.as_str())
                .collect::<Vec<_>>()
                .join(", ")
        )),
        requeue_ms: REQUEUE_FAILOVER_MS,
        ..Verdict::steady(Some(primary.to_owned()))
    })
}

fn split_brain(primary: Option<String>, writable: &[&Server]) -> Verdict {
    let names: Vec<&str> = writable.iter().map(|s| s.name.as_str()).collect();
    Verdict {
        primary,
        phase: "Degraded",
        degraded: Some((
            "SplitBrain",
            format!(
                "{} all take writes; nothing is changed until only one does. Compare their GTIDs (SELECT @@gtid_binlog_state), keep one, and SET GLOBAL read_only=ON on the others",
                names.join(", ")
            ),
        )),
        progressing: None,
        requeue_ms: REQUEUE_BUSY_MS,
        may_delete: false,
        restart: None,
    }
}

fn diverged(primary: Option<String>, servers: &[&Server]) -> Verdict {
    let positions: Vec<String> = servers
        .iter()
        .map(|s| {
            format!(
                "{} at {}",
                s.name,
                s.answer().map(Probe::holds).unwrap_or_default()
            )
        })
        .collect();
    Verdict {
        primary,
        phase: "Degraded",
        degraded: Some((
            "Diverged",
            format!(
                "no replica holds every other's transactions ({}); nothing is promoted. Choose the server to keep and delete the others' Pods and claims",
                positions.join(", ")
            ),
        )),
        progressing: None,
        requeue_ms: REQUEUE_BUSY_MS,
        may_delete: false,
        restart: None,
    }
}

/// A cluster with a primary in status: adopt an earlier promotion, fail over, switch over, or
/// keep everyone in line.
fn follow_primary(
    facts: &Facts,
    primary: &str,
    status: &mut MariaDBClusterStatus,
    commands: &mut Vec<Command>,
    events: &mut Vec<Action>,
) -> Verdict {
    let current = server(facts, primary);
    let writable: Vec<&Server> = facts
        .servers
        .iter()
        .filter(|s| s.answer().is_some_and(|p| !p.read_only))
        .collect();
    let others: Vec<&Server> = writable
        .iter()
        .copied()
        .filter(|s| s.name != primary)
        .collect();
    if let Some(verdict) = fence_old_primaries(facts, primary, &writable, &others, commands, events)
    {
        return verdict;
    }
    if others.len() > 1 || (!others.is_empty() && others.len() < writable.len()) {
        return split_brain(Some(primary.to_owned()), &writable);
    }
    if let [adopted] = others.as_slice() {
        // Promoted by a decision whose status never landed (failover or switchover): it is
        // the primary if it holds what every replica holds (not the old primary: whatever
        // only the old primary has was never acknowledged, and makes it errant).
        let holds = adopted.answer().map(Probe::holds).unwrap_or_default();
        let covers = facts
            .servers
            .iter()
            .filter(|s| s.name != primary && s.name != adopted.name)
            .filter_map(Server::answer)
            .all(|p| holds.contains(&p.holds()));
        if !covers {
            return split_brain(
                Some(primary.to_owned()),
                &[current, Some(*adopted)]
                    .into_iter()
                    .flatten()
                    .collect::<Vec<_>>(),
            );
        }
        events.push(Action::RecordEvent(Event::normal(
            "PrimaryAdopted",
            format!(
                "{} takes writes and holds every replica's transactions: it is the primary (promoted by an earlier decision whose status was not written)",
                adopted.name
            ),
        )));
        if let Some(request) = &facts.switchover
            && switchover_target(request) == adopted.name
        {
            status.last_switchover = Some(request.clone());
        }
        return Verdict {
            progressing: Some(format!("{} adopted as primary", adopted.name)),
            requeue_ms: REQUEUE_FAILOVER_MS,
            ..Verdict::steady(Some(adopted.name.clone()))
        };
    }
    let lost = match current {
        None => true,
        Some(s) => {
            s.gone()
                || (s.answer().is_none() && !matches!(s.pod, PodState::Running { ready: true }))
        }
    };
    if lost {
        return failover(facts, primary, status, commands, events);
    }
    let Some(probe) = current.and_then(Server::answer) else {
        return Verdict {
            primary: Some(primary.to_owned()),
            phase: "Degraded",
            degraded: Some((
                "PrimaryNotAnswering",
                format!(
                    "{primary} is Ready but does not answer the plugin ({}); no failover while its Pod is Ready",
                    current
                        .map(|s| s.probe.clone().err().unwrap_or_default())
                        .unwrap_or_default()
                ),
            )),
            progressing: None,
            requeue_ms: REQUEUE_FAILOVER_MS,
            may_delete: false,
            restart: None,
        };
    };
    if let Some(verdict) = switchover(facts, primary, probe, status, commands, events) {
        return verdict;
    }
    let sent = commands.len();
    let verdict = steady(facts, primary, probe, commands, events);
    // A server being put in line is no server to restart beside.
    if commands.len() > sent {
        return verdict;
    }
    rolling_update(facts, primary, probe, commands, events).unwrap_or(verdict)
}

/// A version, image or configuration change, one server at a time: the replicas first, then
/// the primary after a switchover to an updated replica. Nothing is restarted unless every
/// wanted server runs, answers, and (the primary aside) replicates from the primary, so a
/// restart never meets a server already missing and a failover during it finds every
/// replica but one. Errant servers are left as they are (quarantined, kept for the admin).
fn rolling_update(
    facts: &Facts,
    primary: &str,
    probe: &Probe,
    commands: &mut Vec<Command>,
    events: &mut Vec<Action>,
) -> Option<Verdict> {
    let image = facts.spec.image();
    let revision = children::config_revision(&facts.spec);
    let outdated = |s: &Server| s.image != image || s.config_revision != revision;
    let errant = |s: &Server| s.name != primary && s.answer().is_some_and(|r| is_errant(r, probe));
    let wanted = wanted_servers(facts, Some(primary));
    let members: Vec<&Server> = wanted.iter().filter_map(|n| server(facts, n)).collect();
    let stale: Vec<&Server> = members
        .iter()
        .copied()
        .filter(|s| outdated(s) && !errant(s))
        .collect();
    if stale.is_empty() {
        return None;
    }
    let host = children::host_of(&facts.name, primary);
    let out_of_line: Vec<String> = wanted
        .iter()
        .filter(|name| match server(facts, name) {
            None => true,
            Some(s) if errant(s) => false,
            Some(s) => {
                s.pod != (PodState::Running { ready: true })
                    || (s.name != primary
                        && !s.answer().is_some_and(|p| {
                            p.replicating()
                                && p.link.as_ref().is_some_and(|l| l.source_host == host)
                        }))
            }
        })
        .cloned()
        .collect();
    let progress = format!(
        "rolling update to {image} with configuration {revision}: {} of {} servers updated",
        members.len() - stale.len(),
        members.len()
    );
    let rolling = |message: String, restart: Option<String>| Verdict {
        progressing: Some(message),
        requeue_ms: REQUEUE_BUSY_MS,
        restart,
        ..Verdict::steady(Some(primary.to_owned()))
    };
    if !out_of_line.is_empty() {
        return Some(rolling(
            format!(
                "{progress}; waiting for {} to run and replicate before restarting the next",
                out_of_line.join(", ")
            ),
            None,
        ));
    }
    if let Some(replica) = stale.iter().find(|s| s.name != primary) {
        events.push(Action::RecordEvent(Event::normal(
            "RollingUpdate",
            format!(
                "restarting replica {} on {image} with configuration {revision} (replicas first; its data stays on its claim)",
                replica.name
            ),
        )));
        return Some(rolling(
            format!("{progress}; restarting {}", replica.name),
            Some(replica.name.clone()),
        ));
    }
    // Only the primary is left: it hands over to an updated replica and restarts as one.
    let target = members
        .iter()
        .find(|s| s.name != primary && !outdated(s) && !errant(s));
    let Some(target) = target else {
        events.push(Action::RecordEvent(Event::normal(
            "RollingUpdate",
            format!(
                "restarting the primary {primary} in place on {image}: there is no updated replica to switch over to, so writes are refused until it is back"
            ),
        )));
        return Some(rolling(
            format!("{progress}; restarting the primary {primary} in place"),
            Some(primary.to_owned()),
        ));
    };
    switch_to(facts, primary, &target.name, commands);
    events.push(Action::RecordEvent(Event::normal(
        "Switchover",
        format!(
            "rolling update: {primary} made read-only, {} caught up with its binlog and promoted; {primary} rejoins as a replica and restarts last",
            target.name
        ),
    )));
    Some(Verdict {
        phase: "SwitchingOver",
        progressing: Some(format!(
            "{progress}; switching over from {primary} to {}",
            target.name
        )),
        requeue_ms: REQUEUE_FAILOVER_MS,
        ..Verdict::steady(Some(target.name.clone()))
    })
}

/// The commands of a switchover. `read_only` does not stop an account with `READ ONLY ADMIN`
/// (root, the account the credentials give), so the primary may take writes until the end:
/// what makes the handover safe is who can acknowledge them. Every other replica of the
/// primary is fenced first (its IO thread stopped), so from then on only the target
/// acknowledges; the target catches up with the primary's binlog, is fenced in turn, and
/// applies everything it retrieved — every write any replica acknowledged — before it is
/// promoted. A write the primary takes after that is never acknowledged (semi-sync does not
/// fall back); the old primary then holds it and is quarantined as errant when it returns.
fn switch_to(facts: &Facts, primary: &str, target: &str, commands: &mut Vec<Command>) {
    commands.push(Command::SetReadOnly {
        pod: primary.to_owned(),
        read_only: true,
    });
    let host = children::host_of(&facts.name, primary);
    commands.extend(
        facts
            .servers
            .iter()
            .filter(|s| s.name != primary && s.name != target)
            .filter(|s| {
                s.answer()
                    .and_then(|p| p.link.as_ref())
                    .is_some_and(|l| l.io_running && l.source_host == host)
            })
            .map(|s| Command::StopIo {
                pod: s.name.clone(),
            }),
    );
    commands.extend([
        Command::CatchUp {
            pod: target.to_owned(),
            source: primary.to_owned(),
        },
        Command::StopIo {
            pod: target.to_owned(),
        },
        Command::ApplyRetrieved {
            pod: target.to_owned(),
        },
        Command::Promote {
            pod: target.to_owned(),
            reset_link: true,
        },
        Command::SemiSync {
            pod: target.to_owned(),
            on: true,
        },
    ]);
}

fn switchover_target(request: &str) -> &str {
    request.split('@').next().unwrap_or(request)
}

/// The switchover the annotation asks for, if it can and must be done now.
fn switchover(
    facts: &Facts,
    primary: &str,
    probe: &Probe,
    status: &mut MariaDBClusterStatus,
    commands: &mut Vec<Command>,
    events: &mut Vec<Action>,
) -> Option<Verdict> {
    let request = facts.switchover.as_ref()?;
    if status.last_switchover.as_ref() == Some(request) {
        return None;
    }
    let target = switchover_target(request);
    if target == primary {
        status.last_switchover = Some(request.clone());
        return None;
    }
    let host = children::host_of(&facts.name, primary);
    let ready = server(facts, target)
        .filter(|s| !s.gone())
        .and_then(Server::answer)
        .filter(|t| !is_errant(t, probe))
        .filter(|t| t.replicating() && t.link.as_ref().is_some_and(|l| l.source_host == host));
    if ready.is_none() {
        return Some(Verdict {
            progressing: Some(format!(
                "switchover to {target} waits: it must be a server replicating from {primary} with both threads running"
            )),
            requeue_ms: REQUEUE_BUSY_MS,
            ..Verdict::steady(Some(primary.to_owned()))
        });
    }
    switch_to(facts, primary, target, commands);
    events.push(Action::RecordEvent(Event::normal(
        "Switchover",
        format!(
            "{primary} made read-only, {target} caught up with its binlog and promoted; {primary} rejoins as a replica"
        ),
    )));
    status.last_switchover = Some(request.clone());
    Some(Verdict {
        phase: "SwitchingOver",
        progressing: Some(format!("switchover from {primary} to {target}")),
        requeue_ms: REQUEUE_FAILOVER_MS,
        ..Verdict::steady(Some(target.to_owned()))
    })
}

/// The primary is lost: fence, choose, wait, promote; one step per decision.
fn failover(
    facts: &Facts,
    primary: &str,
    status: &MariaDBClusterStatus,
    commands: &mut Vec<Command>,
    events: &mut Vec<Action>,
) -> Verdict {
    let failing = |reason: &'static str, message: String| Verdict {
        primary: Some(primary.to_owned()),
        phase: "FailingOver",
        degraded: Some((reason, message)),
        progressing: None,
        requeue_ms: REQUEUE_FAILOVER_MS,
        may_delete: false,
        restart: None,
    };
    let errant = &status.errant_replicas;
    let known = status
        .replicas
        .iter()
        .map(|r| r.name.clone())
        .chain(facts.servers.iter().map(|s| s.name.clone()))
        .filter(|n| n != primary && !errant.contains(n));
    let mut silent: Vec<String> = known
        .filter(|n| server(facts, n).and_then(Server::answer).is_none())
        .collect();
    silent.sort();
    silent.dedup();
    if !silent.is_empty() {
        return failing(
            "FailoverBlocked",
            format!(
                "primary {primary} is lost; waiting for {} to answer before choosing a new one (one of them may hold the last acknowledged write)",
                silent.join(", ")
            ),
        );
    }
    let candidates: Vec<&Server> = facts
        .servers
        .iter()
        .filter(|s| s.name != primary && !errant.contains(&s.name) && s.answer().is_some())
        .collect();
    if candidates.is_empty() {
        return failing(
            "PrimaryLostNoReplica",
            format!(
                "primary {primary} is lost and there is no replica to promote; it comes back with its data when its Pod runs again"
            ),
        );
    }
    let unfenced: Vec<&Server> = candidates
        .iter()
        .copied()
        .filter(|s| {
            s.answer()
                .and_then(|p| p.link.as_ref())
                .is_some_and(|l| l.io_running)
        })
        .collect();
    if !unfenced.is_empty() {
        for s in &unfenced {
            commands.push(Command::StopIo {
                pod: s.name.clone(),
            });
        }
        events.push(Action::RecordEvent(Event::warning(
            "Fencing",
            format!(
                "primary {primary} is lost; stopped the IO thread of {} so it can no longer acknowledge the old primary's writes",
                unfenced.iter().map(|s| s.name.as_str()).collect::<Vec<_>>().join(", ")
            ),
        )));
        return failing(
            "PrimaryLost",
            format!("primary {primary} is lost; fencing the replicas"),
        );
    }
    let Some(chosen) = most_advanced(facts, &candidates) else {
        return Verdict {
            phase: "FailingOver",
            ..diverged(Some(primary.to_owned()), &candidates)
        };
    };
    let Some(probe) = chosen.answer() else {
        return failing("PrimaryLost", format!("primary {primary} is lost"));
    };
    let retrieved = probe
        .link
        .as_ref()
        .map(|l| l.io_pos.clone())
        .unwrap_or_default();
    if !probe.current_pos.contains(&retrieved) {
        let sql_running = probe.link.as_ref().is_some_and(|l| l.sql_running);
        if !sql_running {
            // Only the SQL thread: a running IO thread could retrieve (and acknowledge) more
            // from the old primary, and promotion discards what is retrieved but not applied.
            commands.push(Command::StartApplying {
                pod: chosen.name.clone(),
            });
        }
        return failing(
            "PrimaryLost",
            format!(
                "primary {primary} is lost; {} holds the most and is applying what it retrieved ({} of {})",
                chosen.name, probe.current_pos, retrieved
            ),
        );
    }
    commands.push(Command::Promote {
        pod: chosen.name.clone(),
        reset_link: probe.link.is_some(),
    });
    if facts.spec.replicas > 0 {
        commands.push(Command::SemiSync {
            pod: chosen.name.clone(),
            on: true,
        });
    }
    events.push(Action::RecordEvent(Event::warning(
        "Failover",
        format!(
            "primary {primary} is lost; promoted {} at {}, which holds every replica's transactions",
            chosen.name,
            probe.holds()
        ),
    )));
    Verdict {
        phase: "FailingOver",
        progressing: Some(format!("{} promoted; repointing the replicas", chosen.name)),
        requeue_ms: REQUEUE_FAILOVER_MS,
        ..Verdict::steady(Some(chosen.name.clone()))
    }
}

/// The primary answers: it takes writes, every other server follows it or is quarantined.
fn steady(
    facts: &Facts,
    primary: &str,
    probe: &Probe,
    commands: &mut Vec<Command>,
    events: &mut Vec<Action>,
) -> Verdict {
    if probe.read_only || probe.link.is_some() {
        commands.push(Command::Promote {
            pod: primary.to_owned(),
            reset_link: probe.link.is_some(),
        });
        events.push(Action::RecordEvent(Event::normal(
            "PrimaryWritable",
            format!(
                "{primary} was read-only or still replicating (it restarted, or its promotion was cut short); made writable"
            ),
        )));
    }
    let replicas: Vec<&Server> = facts
        .servers
        .iter()
        .filter(|s| s.name != primary && !s.gone())
        .collect();
    let want_semi_sync = facts.spec.replicas > 0;
    if probe.semi_sync_primary != want_semi_sync {
        commands.push(Command::SemiSync {
            pod: primary.to_owned(),
            on: want_semi_sync,
        });
    }
    let host = children::host_of(&facts.name, primary);
    for r in replicas {
        let Some(rp) = r.answer() else { continue };
        if is_errant(rp, probe) {
            if rp
                .link
                .as_ref()
                .is_some_and(|l| l.io_running || l.sql_running)
            {
                commands.push(Command::StopReplication {
                    pod: r.name.clone(),
                });
            }
            continue;
        }
        // A server that was a primary until a switchover still waits, at each commit, for a
        // replica's acknowledgement, and with `log_slave_updates` its applier commits too:
        // left on, its SQL thread hangs on the first transaction it applies.
        if rp.semi_sync_primary {
            commands.push(Command::SemiSync {
                pod: r.name.clone(),
                on: false,
            });
        }
        // No replica is writable here: another writable server was adopted or refused as a
        // split brain before.
        match &rp.link {
            Some(l) if l.source_host == host && l.uses_slave_pos => {
                if !l.io_running || !l.sql_running {
                    commands.push(Command::StartReplication {
                        pod: r.name.clone(),
                    });
                }
            }
            _ => commands.push(Command::Replicate {
                pod: r.name.clone(),
                source: primary.to_owned(),
                demote: rp.wrote_as_primary(),
            }),
        }
    }
    Verdict::steady(Some(primary.to_owned()))
}

/// The children: config, Services, budget, a claim per wanted server, and the Pods.
fn children_actions(facts: &Facts, verdict: &Verdict, errant: &[String]) -> Vec<Action> {
    let mut actions = vec![Action::Apply(children::server_config(
        &facts.name,
        &facts.spec,
    ))];
    actions.extend(children::services(&facts.name).map(Action::Apply));
    let primary = verdict.primary.as_deref();
    let wanted = wanted_servers(facts, primary);
    actions.push(Action::Apply(children::budget(&facts.name, wanted.len())));
    let role = |name: &str| {
        if Some(name) == primary {
            Role::Primary
        } else if errant.iter().any(|e| e == name) {
            Role::Errant
        } else {
            Role::Replica
        }
    };
    for name in &wanted {
        actions.push(Action::Apply(children::server_claim(
            &facts.name,
            name,
            &facts.spec,
        )));
    }
    for s in &facts.servers {
        match s.pod {
            PodState::Terminating => {}
            // Its claim stays: the Pod comes back on the same data.
            PodState::Ended if verdict.may_delete => actions.push(delete_pod(&s.name)),
            _ if !wanted.contains(&s.name) && verdict.may_delete => {
                actions.push(delete_pod(&s.name));
            }
            _ if verdict.restart.as_deref() == Some(s.name.as_str()) => {
                actions.push(delete_pod(&s.name));
            }
            _ => actions.push(Action::Apply(children::server_pod(
                &facts.name,
                &s.name,
                &s.image,
                &s.config_revision,
                s.seed.as_ref(),
                role(&s.name),
                &facts.spec,
            ))),
        }
    }
    for name in &wanted {
        if server(facts, name).is_none() {
            let seed = children::Seed {
                donor: children::donor(&facts.name),
                required: primary.is_some(),
                restore: restore_into(facts, primary, name),
            };
            actions.push(Action::Apply(children::server_pod(
                &facts.name,
                name,
                &facts.spec.image(),
                &children::config_revision(&facts.spec),
                Some(&seed),
                role(name),
                &facts.spec,
            )));
        }
    }
    actions
}

/// Whether the cluster is still to be restored from `spec.restore`: it never had a primary.
fn restoring(facts: &Facts, primary: Option<&str>) -> bool {
    facts.spec.restore.is_some() && primary.is_none() && facts.status.current_primary.is_none()
}

/// The backup a new server `name` loads: the first server's, while the cluster is being
/// restored; the others copy it from there once it is the primary.
fn restore_into(
    facts: &Facts,
    primary: Option<&str>,
    name: &str,
) -> Option<children::RestoreSource> {
    let restore = facts.spec.restore.as_ref()?;
    (restoring(facts, primary) && name == children::pod_name(&facts.name, 0))
        .then(|| children::RestoreSource::of(restore))
        .flatten()
}

/// The servers wanted: the primary, and the lowest ordinals besides it up to `spec.replicas`
/// replicas (a primary at a high ordinal survives a scale-down; the replicas go).
fn wanted_servers(facts: &Facts, primary: Option<&str>) -> Vec<String> {
    // A restore: the first server alone until it holds the backup and is the primary (its
    // load is not in its binlog, so the others must copy it, not replicate it).
    let replicas = if restoring(facts, primary) {
        0
    } else {
        usize::try_from(facts.spec.replicas).unwrap_or(0)
    };
    let mut wanted: Vec<String> = primary.map(str::to_owned).into_iter().collect();
    wanted.extend(
        (0..=children::MAX_ORDINAL)
            .map(|o| children::pod_name(&facts.name, o))
            .filter(|n| Some(n.as_str()) != primary)
            .take(replicas + usize::from(primary.is_none())),
    );
    wanted
}

fn replica_state(
    facts: &Facts,
    s: &Server,
    primary: Option<&str>,
    errant: &[String],
) -> ReplicaState {
    let host = primary.map(|p| children::host_of(&facts.name, p));
    let state = match s.answer() {
        None => "Unreachable",
        Some(_) if errant.contains(&s.name) => "Errant",
        Some(p)
            if p.replicating()
                && p.link.as_ref().map(|l| l.source_host.as_str()) == host.as_deref() =>
        {
            "Replicating"
        }
        Some(_) => "Stopped",
    };
    ReplicaState {
        name: s.name.clone(),
        state: state.to_owned(),
        gtid_current_pos: s
            .answer()
            .map(|p| p.current_pos.to_string())
            .unwrap_or_default(),
        gtid_io_pos: s
            .answer()
            .and_then(|p| p.link.as_ref())
            .map(|l| l.io_pos.to_string())
            .unwrap_or_default(),
    }
}

fn delete_pod(name: &str) -> Action {
    Action::Delete {
        kind: children::pod_kind(),
        name: name.to_owned(),
    }
}

fn status_action(status: &MariaDBClusterStatus) -> Action {
    Action::SetStatus(serde_json::to_value(status).unwrap_or_default())
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::gtid::GtidList;
    use crate::probe::Link;

    const NOW: Timestamp = Timestamp {
        seconds: 1_700_000_000,
        nanoseconds: 0,
    };

    fn gtids(text: &str) -> GtidList {
        GtidList::parse(text).expect("a GTID list")
    }

    fn name(ordinal: u32) -> String {
        format!("db-{ordinal}")
    }

    fn running(ordinal: u32, probe: Probe) -> Server {
        Server {
            name: name(ordinal),
            image: "mariadb:10.11".into(),
            config_revision: children::config_revision(&MariaDBClusterSpec::default()),
            seed: None,
            seed_failing: None,
            pod: PodState::Running { ready: true },
            probe: Ok(probe),
        }
    }

    /// A writable server at `pos`, semi-sync on.
    fn primary(ordinal: u32, pos: &str) -> Server {
        running(
            ordinal,
            Probe {
                read_only: false,
                binlog_pos: gtids(pos),
                binlog_state: gtids(pos),
                current_pos: gtids(pos),
                semi_sync_primary: true,
                semi_sync_active: true,
                ..Probe::default()
            },
        )
    }

    /// A read-only server at `pos` (executed), replicating from `of` with `io`/`sql` running,
    /// having retrieved `retrieved`.
    fn replica_with(
        ordinal: u32,
        of: u32,
        pos: &str,
        retrieved: &str,
        io: bool,
        sql: bool,
    ) -> Server {
        running(
            ordinal,
            Probe {
                read_only: true,
                binlog_pos: gtids(pos),
                binlog_state: gtids(pos),
                current_pos: gtids(pos),
                slave_pos: gtids(pos),
                semi_sync_primary: false,
                semi_sync_active: false,
                link: Some(Link {
                    source_host: format!("db-{of}.db-headless"),
                    io_running: io,
                    sql_running: sql,
                    uses_slave_pos: true,
                    io_pos: gtids(retrieved),
                    last_error: String::new(),
                }),
            },
        )
    }

    /// `s` with semi-sync off on the source side.
    fn without_semi_sync(mut s: Server) -> Server {
        if let Ok(p) = &mut s.probe {
            p.semi_sync_primary = false;
            p.semi_sync_active = false;
        }
        s
    }

    fn replica(ordinal: u32, of: u32, pos: &str) -> Server {
        replica_with(ordinal, of, pos, pos, true, true)
    }

    fn fenced(ordinal: u32, of: u32, pos: &str, retrieved: &str) -> Server {
        replica_with(ordinal, of, pos, retrieved, false, true)
    }

    /// A fresh, read-only server with no link.
    fn fresh(ordinal: u32) -> Server {
        running(
            ordinal,
            Probe {
                read_only: true,
                ..Probe::default()
            },
        )
    }

    /// A read-only server with no link that wrote `state` itself (an old primary back).
    fn returning(ordinal: u32, state: &str) -> Server {
        running(
            ordinal,
            Probe {
                read_only: true,
                binlog_pos: gtids(state),
                binlog_state: gtids(state),
                current_pos: gtids(state),
                ..Probe::default()
            },
        )
    }

    fn silent(ordinal: u32, pod: PodState) -> Server {
        Server {
            name: name(ordinal),
            image: "mariadb:10.11".into(),
            config_revision: children::config_revision(&MariaDBClusterSpec::default()),
            seed: None,
            seed_failing: None,
            pod,
            probe: Err("unreachable".into()),
        }
    }

    fn facts(primary: Option<u32>, replicas: i32, servers: Vec<Server>) -> Facts {
        let spec = MariaDBClusterSpec {
            replicas,
            ..MariaDBClusterSpec::default()
        };
        Facts {
            name: "db".into(),
            namespace: "ns".into(),
            generation: Some(1),
            spec,
            status: MariaDBClusterStatus {
                current_primary: primary.map(name),
                replicas: servers
                    .iter()
                    .filter(|s| Some(s.name.clone()) != primary.map(name))
                    .map(|s| ReplicaState {
                        name: s.name.clone(),
                        state: "Replicating".into(),
                        ..ReplicaState::default()
                    })
                    .collect(),
                ..MariaDBClusterStatus::default()
            },
            switchover: None,
            servers,
            credentials_unavailable: None,
            now: NOW,
            backup_pod: None,
        }
    }

    fn promote(o: u32) -> Command {
        Command::Promote {
            pod: name(o),
            reset_link: true,
        }
    }
    fn promote_unlinked(o: u32) -> Command {
        Command::Promote {
            pod: name(o),
            reset_link: false,
        }
    }
    fn semi_sync(o: u32, on: bool) -> Command {
        Command::SemiSync { pod: name(o), on }
    }
    fn stop_io(o: u32) -> Command {
        Command::StopIo { pod: name(o) }
    }
    fn replicate(o: u32, of: u32, demote: bool) -> Command {
        Command::Replicate {
            pod: name(o),
            source: name(of),
            demote,
        }
    }

    struct Outcome {
        primary: Option<String>,
        deleted: Vec<String>,
        degraded: String,
        events: Vec<String>,
        errant: Vec<String>,
        roles: Vec<(String, String)>,
    }

    /// The status the plan writes (its last `SetStatus`), or `null`.
    fn written_status(plan: &Plan) -> serde_json::Value {
        plan.actions
            .iter()
            .rev()
            .find_map(|a| match a {
                Action::SetStatus(s) => Some(s.clone()),
                _ => None,
            })
            .unwrap_or_default()
    }

    fn outcome(plan: &Plan) -> Outcome {
        let status = written_status(plan);
        let degraded = status["conditions"]
            .as_array()
            .into_iter()
            .flatten()
            .find(|c| c["type"] == "Degraded" && c["status"] == "True")
            .and_then(|c| c["reason"].as_str())
            .unwrap_or("")
            .to_owned();
        Outcome {
            primary: status["currentPrimary"].as_str().map(str::to_owned),
            deleted: plan
                .actions
                .iter()
                .filter_map(|a| match a {
                    Action::Delete { name, .. } => Some(name.clone()),
                    _ => None,
                })
                .collect(),
            degraded,
            events: plan
                .actions
                .iter()
                .filter_map(|a| match a {
                    Action::RecordEvent(e) => Some(e.reason.clone()),
                    _ => None,
                })
                .collect(),
            errant: status["errantReplicas"]
                .as_array()
                .into_iter()
                .flatten()
                .filter_map(|v| v.as_str().map(str::to_owned))
                .collect(),
            roles: plan
                .actions
                .iter()
                .filter_map(|a| match a {
                    Action::Apply(o) if o["kind"] == "Pod" => Some((
                        o["metadata"]["name"].as_str()?.to_owned(),
                        o["metadata"]["labels"][children::ROLE_LABEL]
                            .as_str()?
                            .to_owned(),
                    )),
                    _ => None,
                })
                .collect(),
        }
    }

    struct Row {
        situation: &'static str,
        facts: Facts,
        commands: Vec<Command>,
        primary: Option<&'static str>,
        deleted: &'static [&'static str],
        degraded: &'static str,
        events: &'static [&'static str],
    }

    fn with_switchover(mut f: Facts, request: &str, done: Option<&str>) -> Facts {
        f.switchover = Some(request.into());
        f.status.last_switchover = done.map(str::to_owned);
        f
    }

    fn with_errant(mut f: Facts, errant: &[u32]) -> Facts {
        f.status.errant_replicas = errant.iter().map(|o| name(*o)).collect();
        f
    }

    #[test]
    fn decision_table() {
        let rows = vec![
            Row {
                situation: "a new cluster gets its servers and no primary until every one answers",
                facts: facts(None, 2, vec![]),
                commands: vec![],
                primary: None,
                deleted: &[],
                degraded: "",
                events: &[],
            },
            Row {
                situation: "fresh servers all answer: db-0 is promoted",
                facts: facts(None, 2, vec![fresh(0), fresh(1), fresh(2)]),
                commands: vec![promote_unlinked(0)],
                primary: Some("db-0"),
                deleted: &[],
                degraded: "",
                events: &["PrimaryElected"],
            },
            Row {
                situation: "the first primary is not elected while a server is silent",
                facts: facts(
                    None,
                    2,
                    vec![fresh(0), fresh(1), silent(2, PodState::Pending)],
                ),
                commands: vec![],
                primary: None,
                deleted: &[],
                degraded: "",
                events: &[],
            },
            Row {
                situation: "every replica replicates from the primary: nothing to send",
                facts: facts(
                    Some(0),
                    2,
                    vec![
                        primary(0, "0-1-10"),
                        replica(1, 0, "0-1-10"),
                        replica(2, 0, "0-1-9"),
                    ],
                ),
                commands: vec![],
                primary: Some("db-0"),
                deleted: &[],
                degraded: "",
                events: &[],
            },
            Row {
                situation: "semi-sync fell back to asynchronous on the primary: Degraded says writes are no longer safe",
                facts: facts(
                    Some(0),
                    1,
                    vec![
                        running(
                            0,
                            Probe {
                                semi_sync_active: false,
                                ..primary(0, "0-1-10").probe.expect("a probe")
                            },
                        ),
                        replica(1, 0, "0-1-10"),
                    ],
                ),
                commands: vec![],
                primary: Some("db-0"),
                deleted: &[],
                degraded: "SemiSyncOff",
                events: &["SemiSyncOff"],
            },
            Row {
                situation: "a fresh replica is pointed at the primary by GTID, and semi-sync turned on with it",
                facts: facts(
                    Some(0),
                    1,
                    vec![
                        running(
                            0,
                            Probe {
                                read_only: false,
                                ..Probe::default()
                            },
                        ),
                        fresh(1),
                    ],
                ),
                commands: vec![semi_sync(0, true), replicate(1, 0, false)],
                primary: Some("db-0"),
                deleted: &[],
                degraded: "",
                events: &[],
            },
            Row {
                situation: "a replica whose threads stopped is started again",
                facts: facts(
                    Some(0),
                    1,
                    vec![primary(0, "0-1-10"), fenced(1, 0, "0-1-10", "0-1-10")],
                ),
                commands: vec![Command::StartReplication { pod: name(1) }],
                primary: Some("db-0"),
                deleted: &[],
                degraded: "",
                events: &[],
            },
            Row {
                situation: "a primary that restarted comes back read-only and is made writable again",
                facts: facts(
                    Some(0),
                    1,
                    vec![returning(0, "0-1-10"), replica(1, 0, "0-1-10")],
                ),
                commands: vec![promote_unlinked(0), semi_sync(0, true)],
                primary: Some("db-0"),
                deleted: &[],
                degraded: "",
                events: &["PrimaryWritable"],
            },
            Row {
                situation: "the primary's Pod is gone: every replica's IO thread is stopped first, nothing promoted",
                facts: facts(
                    Some(0),
                    2,
                    vec![replica(1, 0, "0-1-10"), replica(2, 0, "0-1-9")],
                ),
                commands: vec![stop_io(1), stop_io(2)],
                primary: Some("db-0"),
                deleted: &[],
                degraded: "PrimaryLost",
                events: &["Fencing", "PrimaryLost"],
            },
            Row {
                situation: "fenced: the replica that retrieved the most is promoted, even if it executed less",
                facts: facts(
                    Some(0),
                    2,
                    vec![
                        fenced(1, 0, "0-1-10", "0-1-10"),
                        fenced(2, 0, "0-1-12", "0-1-12"),
                    ],
                ),
                commands: vec![promote(2), semi_sync(2, true)],
                primary: Some("db-2"),
                deleted: &[],
                degraded: "",
                events: &["Failover"],
            },
            Row {
                situation: "fenced: the most advanced replica has not applied what it retrieved: wait",
                facts: facts(
                    Some(0),
                    2,
                    vec![
                        fenced(1, 0, "0-1-10", "0-1-10"),
                        fenced(2, 0, "0-1-11", "0-1-12"),
                    ],
                ),
                commands: vec![],
                primary: Some("db-0"),
                deleted: &[],
                degraded: "PrimaryLost",
                events: &["PrimaryLost"],
            },
            Row {
                situation: "fenced: the most advanced replica's SQL thread stopped: only its SQL thread is started, its IO thread stays fenced",
                facts: facts(
                    Some(0),
                    2,
                    vec![
                        fenced(1, 0, "0-1-10", "0-1-10"),
                        replica_with(2, 0, "0-1-11", "0-1-12", false, false),
                    ],
                ),
                commands: vec![Command::StartApplying { pod: name(2) }],
                primary: Some("db-0"),
                deleted: &[],
                degraded: "PrimaryLost",
                events: &["PrimaryLost"],
            },
            Row {
                situation: "a replica that may hold the last acknowledged write does not answer: no failover",
                facts: facts(
                    Some(0),
                    2,
                    vec![
                        fenced(1, 0, "0-1-10", "0-1-10"),
                        silent(2, PodState::Pending),
                    ],
                ),
                commands: vec![],
                primary: Some("db-0"),
                deleted: &[],
                degraded: "FailoverBlocked",
                events: &["FailoverBlocked"],
            },
            Row {
                situation: "a known replica's Pod is missing: no failover",
                facts: {
                    let mut f = facts(Some(0), 2, vec![fenced(1, 0, "0-1-10", "0-1-10")]);
                    f.status.replicas.push(ReplicaState {
                        name: name(2),
                        ..ReplicaState::default()
                    });
                    f
                },
                commands: vec![],
                primary: Some("db-0"),
                deleted: &[],
                degraded: "FailoverBlocked",
                events: &["FailoverBlocked"],
            },
            Row {
                situation: "fenced replicas that diverged: none is promoted",
                facts: facts(
                    Some(0),
                    2,
                    vec![
                        fenced(1, 0, "0-1-10,1-2-1", "0-1-10"),
                        fenced(2, 0, "0-1-12", "0-1-12"),
                    ],
                ),
                commands: vec![],
                primary: Some("db-0"),
                deleted: &[],
                degraded: "Diverged",
                events: &["Diverged"],
            },
            Row {
                situation: "a primary that runs, not ready and silent, is lost",
                facts: facts(
                    Some(0),
                    1,
                    vec![
                        silent(0, PodState::Running { ready: false }),
                        replica(1, 0, "0-1-10"),
                    ],
                ),
                commands: vec![stop_io(1)],
                primary: Some("db-0"),
                deleted: &[],
                degraded: "PrimaryLost",
                events: &["Fencing", "PrimaryLost"],
            },
            Row {
                situation: "a primary whose Pod is Ready but which does not answer the plugin is not replaced",
                facts: facts(
                    Some(0),
                    1,
                    vec![
                        silent(0, PodState::Running { ready: true }),
                        replica(1, 0, "0-1-10"),
                    ],
                ),
                commands: vec![],
                primary: Some("db-0"),
                deleted: &[],
                degraded: "PrimaryNotAnswering",
                events: &["PrimaryNotAnswering"],
            },
            Row {
                situation: "a promotion whose status never landed is adopted, not repeated on another replica",
                facts: facts(
                    Some(0),
                    2,
                    vec![fenced(1, 0, "0-1-10", "0-1-10"), primary(2, "0-1-12")],
                ),
                commands: vec![],
                primary: Some("db-2"),
                deleted: &[],
                degraded: "",
                events: &["PrimaryAdopted"],
            },
            Row {
                situation: "the old primary back from a network cut, still writable with semi-sync on and followed by no replica: made read-only (nothing it took since was acknowledged)",
                facts: facts(
                    Some(1),
                    2,
                    vec![
                        primary(0, "0-1-10,0-1-11"),
                        primary(1, "0-1-10,0-2-12"),
                        replica(2, 1, "0-1-10,0-2-12"),
                    ],
                ),
                commands: vec![
                    Command::Disconnect { pod: name(0) },
                    Command::SetReadOnly {
                        pod: name(0),
                        read_only: true,
                    },
                ],
                primary: Some("db-1"),
                deleted: &[],
                degraded: "ErrantReplica",
                events: &["OldPrimaryFenced", "ErrantReplica"],
            },
            Row {
                situation: "two writable servers, the other one without semi-sync (its writes may have been acknowledged by no one): split brain, nothing is sent",
                facts: facts(
                    Some(0),
                    2,
                    vec![
                        primary(0, "0-1-10"),
                        without_semi_sync(primary(1, "0-1-10,0-2-11")),
                        replica(2, 0, "0-1-9"),
                    ],
                ),
                commands: vec![],
                primary: Some("db-0"),
                deleted: &[],
                degraded: "SplitBrain",
                events: &["SplitBrain"],
            },
            Row {
                situation: "the old primary returns with writes the new one never received: errant, quarantined",
                facts: facts(
                    Some(2),
                    2,
                    vec![
                        returning(0, "0-1-12"),
                        replica(1, 2, "0-1-10,0-3-11"),
                        primary(2, "0-1-10,0-3-11"),
                    ],
                ),
                commands: vec![],
                primary: Some("db-2"),
                deleted: &[],
                degraded: "ErrantReplica",
                events: &["ErrantReplica"],
            },
            Row {
                situation: "the old primary returns with nothing the new one lacks: it rejoins, demoted",
                facts: facts(
                    Some(2),
                    2,
                    vec![
                        returning(0, "0-1-10"),
                        replica(1, 2, "0-1-10,0-3-11"),
                        primary(2, "0-1-10,0-3-11"),
                    ],
                ),
                commands: vec![replicate(0, 2, true)],
                primary: Some("db-2"),
                deleted: &[],
                degraded: "",
                events: &[],
            },
            Row {
                situation: "a switchover: the primary goes read-only, the target, one write behind, catches up and is promoted; the primary is not errant for being ahead",
                facts: with_switchover(
                    facts(
                        Some(0),
                        2,
                        vec![
                            primary(0, "0-1-11"),
                            replica(1, 0, "0-1-10"),
                            replica(2, 0, "0-1-10"),
                        ],
                    ),
                    "db-1",
                    None,
                ),
                commands: switch(0, 1, &[2]),
                primary: Some("db-1"),
                deleted: &[],
                degraded: "",
                events: &["Switchover"],
            },
            Row {
                situation: "a switchover already carried out is not carried out again after a failover",
                facts: with_switchover(
                    facts(
                        Some(0),
                        1,
                        vec![primary(0, "0-1-10"), replica(1, 0, "0-1-10")],
                    ),
                    "db-1",
                    Some("db-1"),
                ),
                commands: vec![],
                primary: Some("db-0"),
                deleted: &[],
                degraded: "",
                events: &[],
            },
            Row {
                situation: "a switchover to an errant replica waits",
                facts: with_errant(
                    with_switchover(
                        facts(
                            Some(0),
                            1,
                            vec![primary(0, "0-1-10"), returning(1, "0-2-3")],
                        ),
                        "db-1",
                        None,
                    ),
                    &[1],
                ),
                commands: vec![],
                primary: Some("db-0"),
                deleted: &[],
                degraded: "ErrantReplica",
                events: &[],
            },
            Row {
                situation: "scaling down to a lone primary deletes the replicas, never the primary, and turns semi-sync off",
                facts: facts(
                    Some(2),
                    0,
                    vec![
                        replica(0, 2, "0-1-10"),
                        replica(1, 2, "0-1-10"),
                        primary(2, "0-1-10"),
                    ],
                ),
                commands: vec![semi_sync(2, false)],
                primary: Some("db-2"),
                deleted: &["db-0", "db-1"],
                degraded: "",
                events: &[],
            },
            Row {
                situation: "no deletes during a failover, even of a replica past spec.replicas",
                facts: facts(Some(0), 0, vec![replica(1, 0, "0-1-10")]),
                commands: vec![stop_io(1)],
                primary: Some("db-0"),
                deleted: &[],
                degraded: "PrimaryLost",
                events: &["Fencing", "PrimaryLost"],
            },
            Row {
                situation: "without credentials the servers are created and nothing is sent",
                facts: {
                    let mut f = facts(None, 1, vec![]);
                    f.credentials_unavailable = Some("no credential path".into());
                    f
                },
                commands: vec![],
                primary: None,
                deleted: &[],
                degraded: "CredentialsUnavailable",
                events: &["CredentialsUnavailable"],
            },
        ];
        check(rows);
    }

    /// The spec asks for MariaDB `10.11.9`.
    fn to_version(mut f: Facts) -> Facts {
        f.spec.version = "10.11.9".into();
        f
    }

    /// The server already runs `10.11.9`.
    fn updated(mut s: Server) -> Server {
        s.image = "mariadb:10.11.9".into();
        s
    }

    /// A primary without replicas: semi-sync off.
    fn lone_primary(ordinal: u32, pos: &str) -> Server {
        let mut s = primary(ordinal, pos);
        if let Ok(p) = &mut s.probe {
            p.semi_sync_primary = false;
            p.semi_sync_active = false;
        }
        s
    }

    /// A switchover from `from` to `to`, fencing the other replicas `others` first.
    fn switch(from: u32, to: u32, others: &[u32]) -> Vec<Command> {
        let mut commands = vec![Command::SetReadOnly {
            pod: name(from),
            read_only: true,
        }];
        commands.extend(others.iter().map(|o| stop_io(*o)));
        commands.extend([
            Command::CatchUp {
                pod: name(to),
                source: name(from),
            },
            stop_io(to),
            Command::ApplyRetrieved { pod: name(to) },
            promote(to),
            semi_sync(to, true),
        ]);
        commands
    }

    #[test]
    fn rolling_update_table() {
        let pos = "0-1-10";
        let rows = vec![
            Row {
                situation: "a version change restarts one replica, the lowest, and sends nothing",
                facts: to_version(facts(
                    Some(0),
                    2,
                    vec![primary(0, pos), replica(1, 0, pos), replica(2, 0, pos)],
                )),
                commands: vec![],
                primary: Some("db-0"),
                deleted: &["db-1"],
                degraded: "",
                events: &["RollingUpdate"],
            },
            Row {
                situation: "while the restarted replica's Pod is not back, nothing else restarts",
                facts: to_version(facts(Some(0), 2, vec![primary(0, pos), replica(2, 0, pos)])),
                commands: vec![],
                primary: Some("db-0"),
                deleted: &[],
                degraded: "",
                events: &[],
            },
            Row {
                situation: "while the restarted replica runs but does not answer yet, nothing else restarts",
                facts: to_version(facts(
                    Some(0),
                    2,
                    vec![
                        primary(0, pos),
                        updated(silent(1, PodState::Running { ready: false })),
                        replica(2, 0, pos),
                    ],
                )),
                commands: vec![],
                primary: Some("db-0"),
                deleted: &[],
                degraded: "",
                events: &[],
            },
            Row {
                situation: "the restarted replica is first put back in line, then the next one restarts",
                facts: to_version(facts(
                    Some(0),
                    2,
                    vec![
                        primary(0, pos),
                        updated(replica_with(1, 0, pos, pos, false, false)),
                        replica(2, 0, pos),
                    ],
                )),
                commands: vec![Command::StartReplication { pod: name(1) }],
                primary: Some("db-0"),
                deleted: &[],
                degraded: "",
                events: &[],
            },
            Row {
                situation: "an updated replica replicating: the next one restarts",
                facts: to_version(facts(
                    Some(0),
                    2,
                    vec![
                        primary(0, pos),
                        updated(replica(1, 0, pos)),
                        replica(2, 0, pos),
                    ],
                )),
                commands: vec![],
                primary: Some("db-0"),
                deleted: &["db-2"],
                degraded: "",
                events: &["RollingUpdate"],
            },
            Row {
                situation: "every replica updated: the primary switches over to the lowest, after it caught up",
                facts: to_version(facts(
                    Some(0),
                    2,
                    vec![
                        primary(0, pos),
                        updated(replica(1, 0, pos)),
                        updated(replica(2, 0, pos)),
                    ],
                )),
                commands: switch(0, 1, &[2]),
                primary: Some("db-1"),
                deleted: &[],
                degraded: "",
                events: &["Switchover"],
            },
            Row {
                situation: "the old primary, replicating from the new one, restarts last",
                facts: to_version(facts(
                    Some(1),
                    2,
                    vec![
                        replica(0, 1, pos),
                        updated(primary(1, pos)),
                        updated(replica(2, 1, pos)),
                    ],
                )),
                commands: vec![],
                primary: Some("db-1"),
                deleted: &["db-0"],
                degraded: "",
                events: &["RollingUpdate"],
            },
            Row {
                situation: "every server updated: nothing restarts",
                facts: to_version(facts(
                    Some(1),
                    2,
                    vec![
                        updated(replica(0, 1, pos)),
                        updated(primary(1, pos)),
                        updated(replica(2, 1, pos)),
                    ],
                )),
                commands: vec![],
                primary: Some("db-1"),
                deleted: &[],
                degraded: "",
                events: &[],
            },
            Row {
                situation: "a lone primary restarts in place",
                facts: to_version(facts(Some(0), 0, vec![lone_primary(0, pos)])),
                commands: vec![],
                primary: Some("db-0"),
                deleted: &["db-0"],
                degraded: "",
                events: &["RollingUpdate"],
            },
            Row {
                situation: "a server option of the spec's restarts the servers like a version",
                facts: {
                    let mut f = facts(
                        Some(0),
                        2,
                        vec![primary(0, pos), replica(1, 0, pos), replica(2, 0, pos)],
                    );
                    f.spec.config = [("max_connections".to_owned(), "500".to_owned())].into();
                    f
                },
                commands: vec![],
                primary: Some("db-0"),
                deleted: &["db-1"],
                degraded: "",
                events: &["RollingUpdate"],
            },
            Row {
                situation: "an errant replica is left as it is; the others roll",
                facts: to_version(with_errant(
                    facts(
                        Some(0),
                        2,
                        vec![primary(0, pos), returning(1, "0-2-3"), replica(2, 0, pos)],
                    ),
                    &[1],
                )),
                commands: vec![],
                primary: Some("db-0"),
                deleted: &["db-2"],
                degraded: "ErrantReplica",
                events: &["RollingUpdate"],
            },
            Row {
                situation: "no rolling restart while the primary is lost",
                facts: to_version(facts(
                    Some(0),
                    2,
                    vec![
                        silent(0, PodState::Ended),
                        replica(1, 0, pos),
                        replica(2, 0, pos),
                    ],
                )),
                commands: vec![stop_io(1), stop_io(2)],
                primary: Some("db-0"),
                deleted: &[],
                degraded: "PrimaryLost",
                events: &["Fencing", "PrimaryLost"],
            },
        ];
        check(rows);
    }

    fn check(rows: Vec<Row>) {
        for row in rows {
            let plan = decide(&row.facts);
            let got = outcome(&plan);
            assert_eq!(plan.commands, row.commands, "{}: commands", row.situation);
            assert_eq!(
                got.primary.as_deref(),
                row.primary,
                "{}: primary",
                row.situation
            );
            assert_eq!(got.deleted, row.deleted, "{}: deleted", row.situation);
            assert_eq!(got.degraded, row.degraded, "{}: Degraded", row.situation);
            assert_eq!(got.events, row.events, "{}: events", row.situation);
            // The metrics say what the decision did: a failover or switchover counted in the
            // decision that records it, the errant replicas it lists.
            let decision = Decision {
                metrics: plan.metrics.clone(),
                ..Decision::default()
            };
            assert_eq!(
                policy_host_sdk::metrics::check(&crate::metrics::declared(), &plan.metrics),
                Ok(()),
                "{}: metrics declared",
                row.situation
            );
            for (counter, reason) in [
                (&crate::metrics::FAILOVERS, "Failover"),
                (&crate::metrics::SWITCHOVERS, "Switchover"),
            ] {
                let recorded = got.events.iter().filter(|e| *e == reason).count();
                assert_eq!(
                    decision.counted(counter, &[]),
                    recorded as u64,
                    "{}: {} counted",
                    row.situation,
                    counter.name
                );
            }
            assert_eq!(
                decision.gauge_value(&crate::metrics::ERRANT_REPLICAS, &[]),
                Some(got.errant.len() as f64),
                "{}: errant replicas",
                row.situation
            );
            for (pod, role) in &got.roles {
                let want = if Some(pod.as_str()) == row.primary {
                    "primary"
                } else if got.errant.contains(pod) {
                    "errant"
                } else {
                    "replica"
                };
                assert_eq!(role, want, "{}: role of {pod}", row.situation);
            }
        }
    }

    #[test]
    fn a_new_cluster_gets_its_claims_services_budget_and_config() {
        let plan = decide(&facts(None, 2, vec![]));
        let applied: Vec<String> = plan
            .actions
            .iter()
            .filter_map(|a| match a {
                Action::Apply(o) => Some(format!(
                    "{}/{}",
                    o["kind"].as_str().unwrap_or_default(),
                    o["metadata"]["name"].as_str().unwrap_or_default()
                )),
                _ => None,
            })
            .collect();
        for want in [
            "ConfigMap/db-config",
            "Service/db-primary",
            "Service/db-replicas",
            "Service/db-headless",
            "PodDisruptionBudget/db",
            "PersistentVolumeClaim/data-db-2",
            "Pod/db-0",
            "Pod/db-2",
        ] {
            assert!(applied.iter().any(|a| a == want), "{want} in {applied:?}");
        }
    }

    fn applied_pods(plan: &Plan) -> Vec<serde_json::Value> {
        plan.actions
            .iter()
            .filter_map(|a| match a {
                Action::Apply(o) if o["kind"] == "Pod" => Some(o.clone()),
                _ => None,
            })
            .collect()
    }

    #[test]
    fn a_restored_cluster_starts_its_first_server_alone_from_the_backup_then_the_others_copy_it() {
        let restore = crate::spec::Restore {
            claim: Some("old-backups".into()),
            file: Some("old-1.sql".into()),
            s3: None,
        };
        let mut new = facts(None, 2, vec![]);
        new.spec.restore = Some(restore.clone());
        let plan = decide(&new);
        let pods = applied_pods(&plan);
        assert_eq!(pods.len(), 1, "the first server alone: {pods:?}");
        assert_eq!(pods[0]["metadata"]["name"], "db-0");
        assert_eq!(
            pods[0]["metadata"]["annotations"][children::RESTORE_ANNOTATION],
            "old-backups/old-1.sql"
        );

        // It answers, holding the backup: elected, recorded, and the replicas follow, copying
        // it from the primary (not from the backup).
        let mut loaded = fresh(0);
        loaded.seed = Some(children::Seed {
            donor: children::donor("db"),
            required: false,
            restore: children::RestoreSource::parse("old-backups/old-1.sql"),
        });
        let mut answered = facts(None, 2, vec![loaded.clone()]);
        answered.spec.restore = Some(restore.clone());
        let plan = decide(&answered);
        assert_eq!(plan.commands, vec![promote_unlinked(0)]);
        let status = written_status(&plan);
        assert_eq!(status["restoredFrom"], "old-backups/old-1.sql");
        assert!(
            plan.actions
                .iter()
                .any(|a| matches!(a, Action::RecordEvent(e) if e.reason == "Restored"))
        );
        let mut primary_now = facts(Some(0), 2, vec![primary(0, "")]);
        primary_now.servers[0].seed = loaded.seed.clone();
        primary_now.spec.restore = Some(restore);
        primary_now.status.restored_from = Some("old-backups/old-1.sql".into());
        let pods = applied_pods(&decide(&primary_now));
        let names: Vec<&str> = pods
            .iter()
            .filter_map(|p| p["metadata"]["name"].as_str())
            .collect();
        assert_eq!(names, ["db-0", "db-1", "db-2"]);
        for replica in &pods[1..] {
            let annotations = &replica["metadata"]["annotations"];
            assert!(
                annotations.get(children::RESTORE_ANNOTATION).is_none()
                    && annotations[children::SEED_REQUIRED_ANNOTATION] == "true",
                "a replica copies the primary, waiting for it: {replica}"
            );
        }
        assert_eq!(
            pods[0]["metadata"]["annotations"][children::RESTORE_ANNOTATION],
            "old-backups/old-1.sql",
            "the restored server keeps the Pod it was created with"
        );
    }

    #[test]
    fn a_restore_whose_first_server_cannot_load_the_backup_is_degraded_saying_where_to_look() {
        let mut stuck = facts(None, 2, vec![silent(0, PodState::Pending)]);
        stuck.spec.restore = Some(crate::spec::Restore {
            claim: Some("old-backups".into()),
            file: Some("gone.sql".into()),
            s3: None,
        });
        stuck.servers[0].seed = Some(children::Seed {
            donor: children::donor("db"),
            required: false,
            restore: children::RestoreSource::parse("old-backups/gone.sql"),
        });
        stuck.servers[0].seed_failing = Some("seed".into());
        let plan = decide(&stuck);
        let degraded = condition(&plan, "Degraded");
        assert_eq!(degraded["status"], "True");
        assert_eq!(degraded["reason"], "RestoreFailed");
        let message = degraded["message"].as_str().unwrap_or_default();
        assert!(
            message.contains("old-backups/gone.sql")
                && message.contains("kubectl logs db-0 -c seed"),
            "{message}"
        );
        assert!(
            plan.actions
                .iter()
                .any(|a| matches!(a, Action::RecordEvent(e) if e.reason == "RestoreFailed")),
            "a Warning Event"
        );
    }

    #[test]
    fn a_new_replica_that_cannot_copy_from_the_primary_is_degraded_saying_where_to_look() {
        // db-2 joined a running cluster; its seed step (a dump of the primary through its
        // Service) keeps failing, so it never starts. The cluster still takes writes, but a
        // replica the spec asks for is missing, and only its init container's log says why.
        let mut joining = silent(2, PodState::Pending);
        joining.seed = Some(children::Seed {
            donor: children::donor("db"),
            required: true,
            restore: None,
        });
        joining.seed_failing = Some("seed".into());
        let plan = decide(&facts(
            Some(0),
            2,
            vec![primary(0, "0-1-5"), replica(1, 0, "0-1-5"), joining],
        ));
        assert!(plan.commands.is_empty(), "{:?}", plan.commands);
        assert_eq!(condition(&plan, "Available")["status"], "True");
        let degraded = condition(&plan, "Degraded");
        assert_eq!(degraded["status"], "True");
        assert_eq!(degraded["reason"], "SeedFailing");
        let message = degraded["message"].as_str().unwrap_or_default();
        assert!(
            message.contains("db-2")
                && message.contains("db-primary")
                && message.contains("kubectl logs db-2 -c seed"),
            "{message}"
        );
        assert!(
            plan.actions
                .iter()
                .any(|a| matches!(a, Action::RecordEvent(e) if e.reason == "SeedFailing")),
            "a Warning Event"
        );
    }

    #[test]
    fn a_backup_is_started_only_while_a_writable_primary_is_healthy() {
        let backup = crate::spec::Backup {
            every: None,
            trigger: Some("now".into()),
            keep: 3,
            storage: crate::spec::Storage::default(),
            s3: None,
        };
        let mut healthy = facts(
            Some(0),
            2,
            vec![
                primary(0, "0-1-10"),
                replica(1, 0, "0-1-10"),
                replica(2, 0, "0-1-10"),
            ],
        );
        healthy.spec.backup = Some(backup.clone());
        let plan = decide(&healthy);
        assert!(
            applied_pods(&plan)
                .iter()
                .any(|p| p["metadata"]["name"] == "db-backup"),
            "a backup Pod"
        );

        let mut lost = facts(
            Some(0),
            2,
            vec![
                silent(0, PodState::Ended),
                replica(1, 0, "0-1-10"),
                replica(2, 0, "0-1-10"),
            ],
        );
        lost.spec.backup = Some(backup);
        let plan = decide(&lost);
        assert!(
            applied_pods(&plan)
                .iter()
                .all(|p| p["metadata"]["name"] != "db-backup"),
            "no backup while the primary is lost"
        );
    }

    fn condition(plan: &Plan, kind: &str) -> serde_json::Value {
        let status = written_status(plan);
        status["conditions"]
            .as_array()
            .into_iter()
            .flatten()
            .find(|c| c["type"] == kind)
            .cloned()
            .unwrap_or_default()
    }

    #[test]
    fn a_paused_cluster_whose_primary_is_lost_is_only_read_no_command_no_child_written() {
        // The primary's Pod ended: unpaused, this fences and promotes (decision table).
        let mut f = facts(
            Some(0),
            2,
            vec![
                silent(0, PodState::Ended),
                replica(1, 0, "0-1-10"),
                replica(2, 0, "0-1-9"),
            ],
        );
        f.spec.paused = true;
        let plan = decide(&f);
        assert_eq!(plan.commands, vec![], "nothing is sent to a server");
        assert!(
            plan.actions
                .iter()
                .all(|a| matches!(a, Action::SetStatus(_) | Action::RecordEvent(_))),
            "no child applied or deleted: {:?}",
            plan.actions
        );
        let seen = outcome(&plan);
        assert_eq!(seen.primary.as_deref(), Some("db-0"));
        assert_eq!(seen.events, ["Paused"]);
        let paused = condition(&plan, "Paused");
        assert_eq!(paused["status"], "True", "{paused}");
        assert_eq!(condition(&plan, "Progressing")["reason"], "Paused");

        // Once the Paused condition is recorded, no second Event.
        let mut again = f.clone();
        again.status = serde_json::from_value(written_status(&plan)).expect("the status it wrote");
        assert_eq!(outcome(&decide(&again)).events, Vec::<String>::new());

        // Resumed: the failover goes ahead, and the condition says it was resumed.
        again.spec.paused = false;
        let resumed = decide(&again);
        assert!(!resumed.commands.is_empty(), "the replicas are fenced");
        assert_eq!(condition(&resumed, "Paused")["status"], "False");
        assert!(outcome(&resumed).events.iter().any(|e| e == "Resumed"));
    }

    #[test]
    fn a_name_too_long_for_the_children_is_refused_with_invalid_spec_and_changes_nothing() {
        let mut f = facts(None, 2, vec![]);
        f.name = "d".repeat(60);
        let plan = decide(&f);
        assert!(plan.commands.is_empty());
        assert!(
            plan.actions
                .iter()
                .all(|a| matches!(a, Action::SetStatus(_) | Action::RecordEvent(_)))
        );
        assert_eq!(outcome(&plan).degraded, "InvalidSpec");
    }
}
