//! The decisions: from one observation (the EtcdCluster, its children, etcd's member list)
//! to the actions that move the cluster one safe step toward its spec.
//!
//! Every decision is derived only from what is observed, never from memory of earlier
//! calls: the host may restart between any two steps, and the next reconcile must finish
//! what the previous one started. Membership changes one member at a time, and the etcd
//! side of a change always happens before the Kubernetes side:
//!
//! - grow: `member add` (as a learner), then create its pod; promote it once it caught up.
//!   A member in etcd without a pod (crash after `member add`) gets its pod, never a
//!   second member. A learner that can never start (its pod joined a membership that has
//!   changed since, or keeps crashing) is removed and added again with a fresh pod.
//! - shrink: `member remove`, then delete its pod. A pod without a member (crash after
//!   `member remove`) is deleted.
//! - replace: a member whose pod failed or vanished with its emptyDir is removed, then a
//!   fresh member is added; with persistent storage its pod is recreated on its claim.
//! - upgrade: one minor at a time, each member restarted in place with the new image,
//!   followers first and the leader last; downgrades and two-minor jumps are refused.
//! - backup: one snapshot at a time, on demand or on schedule, listed in status only once a
//!   throwaway etcd has restored and served it (`reconcile/backup.rs`).
//! - paused (`spec.paused`): etcd is only read; no membership change, no child written or
//!   deleted, no snapshot unless `backup.whilePaused`. Since every decision starts from what
//!   it observes, unpausing resumes exactly where the cluster stands.
//!
//! These follow etcd's runtime reconfiguration guide
//! (<https://etcd.io/docs/v3.6/op-guide/runtime-configuration/>): change one member at a
//! time, add new members as learners, and remove a dead member before adding its
//! replacement.
//!
//! This file holds the data path ([`reconcile`]: read, validate, contact etcd, then
//! [`Step`]'s phases, then the status) and the shared state of one reconcile; each phase is a
//! file of `impl Step` methods: `recovery.rs` (etcd does not answer), `membership.rs` (repairs
//! and one change), `upgrade.rs`, `backup.rs`, and `status.rs` (status, Events, requeue).

use policy_host_sdk::conditions::{Condition, already_set, set_condition};
use policy_host_sdk::names::check_child_names;
use policy_host_sdk::pods::ObservedPod;
use serde::Deserialize;
use serde_json::Value;

use crate::children::{self, ClusterRef, ClusterState, MemberPod, ObservedChildren};
use crate::etcd_api::{EndpointStatus, EtcdApi, Member, MemberList, MemberTls};
use crate::protocol::{Action, Decision, Event, EventType, Observation, PolicyError, Timestamp};
use crate::spec::{BackupStatus, EtcdClusterSpec, EtcdClusterStatus, Phase, ValidSpec, Version};

/// Condition type: a quorum of voting members is ready, so the cluster serves requests.
pub const AVAILABLE: &str = "Available";
/// Condition type: membership is changing or the plugin waits for members to start.
pub const PROGRESSING: &str = "Progressing";
/// Condition type: something needs attention (invalid spec, lost members).
pub const DEGRADED: &str = "Degraded";
/// Condition type: `spec.paused` holds every change (present once a cluster was paused).
pub const PAUSED: &str = "Paused";
/// Condition type: fields of the classic operator that mean nothing here were accepted and
/// ignored (present once a spec had some).
pub const IGNORED_FIELDS: &str = "IgnoredFields";

/// Requeue delay while something is changing or the plugin waits for members.
pub const REQUEUE_PROGRESSING_MS: u64 = 2_000;
/// Requeue delay while a learner starts or catches up (the host's floor is 1 s).
pub const REQUEUE_ADDING_MS: u64 = 1_000;
/// Requeue delay when the cluster matches its spec (a health check).
pub const REQUEUE_STEADY_MS: u64 = 30_000;
/// Restarts (in the pod's life) below which a member is never taken for crash-looping.
pub const CRASH_LOOP_RESTARTS: i64 = 5;
/// Seconds a member must have been not Ready, and be in `CrashLoopBackOff`, to be taken for
/// crash-looping: its data or its configuration is broken, and restarting it again will not
/// help. Long enough for a transient fault (a full disk freed, a node's hiccup) to pass, and
/// for the kubelet's back-off (10 s doubling) to have restarted it several times.
pub const CRASH_LOOP_SECONDS: i64 = 120;

/// The parent EtcdCluster, as far as the decisions need it.
struct Parent {
    cluster: ClusterRef,
    generation: Option<i64>,
    spec: Result<EtcdClusterSpec, String>,
    status: EtcdClusterStatus,
}

#[derive(Deserialize)]
struct ParentObject {
    #[serde(default)]
    metadata: ParentMeta,
    #[serde(default)]
    spec: Option<Value>,
    #[serde(default)]
    status: Option<Value>,
}

#[derive(Deserialize, Default)]
struct ParentMeta {
    #[serde(default)]
    name: String,
    #[serde(default)]
    namespace: String,
    #[serde(default)]
    generation: Option<i64>,
}

fn read_parent(json: &str) -> Result<Parent, PolicyError> {
    let object: ParentObject = serde_json::from_str(json).map_err(|e| {
        PolicyError::new(
            "BadObservation",
            format!("the parent is not an EtcdCluster object ({e}); this is a host bug"),
        )
    })?;
    let ParentMeta {
        name,
        namespace,
        generation,
    } = object.metadata;
    if name.is_empty() || namespace.is_empty() {
        return Err(PolicyError::new(
            "BadObservation",
            "the parent has no metadata.name or metadata.namespace; EtcdCluster is namespaced, this is a host bug",
        ));
    }
    let spec = match object.spec {
        None => Err("spec is missing: set spec.size and spec.version".to_owned()),
        Some(spec) => serde_json::from_value::<EtcdClusterSpec>(spec)
            .map_err(|e| format!("spec does not parse ({e}): fix the field it names")),
    };
    // A status we cannot read is treated as absent: it is only our own bookkeeping, and
    // everything it records is observed again from the children and etcd.
    let status = object
        .status
        .and_then(EtcdClusterStatus::read)
        .unwrap_or_default();
    let tls = spec.as_ref().is_ok_and(|s| s.tls.is_some());
    Ok(Parent {
        cluster: ClusterRef {
            name,
            namespace,
            tls,
        },
        generation,
        spec,
        status,
    })
}

/// Decides what to do for one observation of an EtcdCluster. `etcd` reaches the cluster's
/// members through the host's app-call.
///
/// Errors only on an observation the host should never send (no name, unparseable JSON);
/// everything wrong with the spec or the cluster is reported in its status instead.
pub fn reconcile(
    observation: &Observation,
    etcd: &mut impl EtcdApi,
) -> Result<Decision, PolicyError> {
    let parent = read_parent(&observation.parent)?;
    let children = ObservedChildren::read(observation)?;
    // A name cannot be fixed by editing the spec: say so before anything else.
    if let Err(error) = check_child_names(&parent.cluster.name, children::CHILD_NAMES) {
        return Ok(invalid_spec(&parent, error.to_string(), observation.now));
    }
    let spec = match parent.spec.clone().and_then(|s| s.validate()) {
        Ok(spec) => spec,
        Err(message) => return Ok(invalid_spec(&parent, message, observation.now)),
    };
    if let Some(message) = tls_change(&spec, &children) {
        return Ok(invalid_spec(&parent, message, observation.now));
    }
    if let Some(tls) = &spec.tls {
        etcd.use_tls(MemberTls {
            secret: tls.operator_secret.clone(),
            host_suffix: parent.cluster.member_domain(),
        });
    }
    let mut step = Step {
        cluster: &parent.cluster,
        spec: &spec,
        children: &children,
        observed: &parent.status,
        // Paused: not even the Services are re-applied (a human may be editing them).
        actions: if spec.paused {
            Vec::new()
        } else {
            vec![
                Action::Apply(children::headless_service(&parent.cluster)),
                Action::Apply(children::client_service(&parent.cluster)),
                Action::Apply(children::pod_disruption_budget(&parent.cluster, spec.size)),
            ]
        },
        events: Vec::new(),
        progress: None,
        degraded: None,
        version_blocked: false,
        now: observation.now,
        backup_status: None,
        backup_running: false,
        backup_due_in_ms: None,
        restart_from: None,
        endpoint: None,
        leader: None,
    };
    let view = step.contact(etcd);
    if let Some(view) = &view {
        step.endpoint = view.status.clone();
        step.leader = view.status.as_ref().and_then(|status| {
            let leader = view.list.members.iter().find(|m| m.id == status.leader)?;
            Some(
                step.member_pod_name(leader)
                    .unwrap_or_else(|| leader.name.clone()),
            )
        });
    }
    let outcome = match view {
        Some(view) if spec.paused => step.reachable_paused(etcd, view),
        Some(view) => step.reachable(etcd, view),
        None if spec.paused => Outcome::Unreachable {
            why: step.progress.as_ref().map_or_else(
                || "no member pod is Ready to ask".to_owned(),
                |(_, why)| why.clone(),
            ),
        },
        None => step.unreachable(),
    };
    Ok(step.finish(&parent, outcome, observation.now))
}

/// Invalid spec: touch nothing, say what to fix, warn once.
/// Why the spec cannot be carried out when `spec.tls` was added to, or removed from, a cluster
/// whose members already serve the other way: their URLs are in etcd's membership and in each
/// member's data, and a half-switched cluster cannot talk to itself, so nothing is changed.
fn tls_change(spec: &ValidSpec, children: &ObservedChildren) -> Option<String> {
    let wanted = spec.tls.is_some();
    let member = children
        .pods
        .iter()
        .filter(|p| !p.terminating)
        .find(|pod| {
            let serves_tls = pod
                .args(children::ETCD_CONTAINER)
                .iter()
                .any(|arg| arg.starts_with("--listen-client-urls=https://"));
            serves_tls != wanted
        })?;
    Some(if wanted {
        format!(
            "spec.tls was set, but the members already serve plain HTTP (pod {}): a running cluster cannot switch to TLS; remove spec.tls, or create a new EtcdCluster with spec.tls and spec.restore from a snapshot of this one",
            member.name
        )
    } else {
        format!(
            "spec.tls was removed, but the members serve TLS (pod {}): a running cluster cannot switch to plain HTTP; put spec.tls back",
            member.name
        )
    })
}

fn invalid_spec(parent: &Parent, message: String, now: Timestamp) -> Decision {
    let degraded = Condition::new(DEGRADED, true, "InvalidSpec", message.clone());
    let mut actions = Vec::new();
    let mut status = parent.status.clone();
    if !already_set(&status.conditions, &degraded) {
        actions.push(Action::RecordEvent(Event {
            event_type: EventType::Warning,
            reason: "InvalidSpec".into(),
            message: message.clone(),
        }));
    }
    // Availability stays as last observed: nothing was checked, and the cluster (if any)
    // keeps running untouched.
    for available in status
        .conditions
        .iter_mut()
        .filter(|c| c.type_ == AVAILABLE)
    {
        available.observed_generation = parent.generation;
    }
    let progressing = Condition::new(
        PROGRESSING,
        false,
        "InvalidSpec",
        "waiting for a valid spec",
    );
    for condition in [progressing, degraded] {
        set_condition(
            &mut status.conditions,
            condition.observed(parent.generation),
            now,
        );
    }
    if status.cluster_id.is_none() {
        status.phase = Some(Phase::Failed);
    }
    status.reason = (status.phase == Some(Phase::Failed)).then_some(message);
    status.observed_generation = parent.generation;
    actions.push(Action::SetStatus(
        serde_json::to_value(&status).unwrap_or(Value::Null),
    ));
    Decision {
        actions,
        requeue_after_ms: None,
        metrics: Vec::new(),
    }
}

/// What etcd said, through which pod.
struct EtcdView {
    contact: String,
    list: MemberList,
    status: Option<EndpointStatus>,
}

/// How the reconcile ended, for the status.
enum Outcome {
    /// etcd answered: this is the membership after this reconcile's change.
    Reachable {
        list: MemberList,
        version: Option<String>,
    },
    /// No member answered.
    Unreachable { why: String },
}

/// One reconcile in progress: the inputs and the actions decided so far.
struct Step<'a> {
    cluster: &'a ClusterRef,
    spec: &'a ValidSpec,
    children: &'a ObservedChildren,
    observed: &'a EtcdClusterStatus,
    actions: Vec<Action>,
    events: Vec<Event>,
    /// Why the cluster is not steady yet: (reason, message) of `Progressing=True`.
    progress: Option<(&'static str, String)>,
    /// What needs a human: (reason, message) of `Degraded=True`.
    degraded: Option<(&'static str, String)>,
    /// The spec asks for a version change etcd cannot make (downgrade, or more than one
    /// minor at once): no member is added or upgraded until the spec is fixed.
    version_blocked: bool,
    /// The observation's time.
    now: Timestamp,
    /// The backup result to record, when a snapshot finished in this reconcile.
    backup_status: Option<BackupStatus>,
    /// A snapshot is being taken: look again soon.
    backup_running: bool,
    /// The next scheduled snapshot is due in this many milliseconds: look again then.
    backup_due_in_ms: Option<u64>,
    /// Quorum is lost for good: forget the cluster and start again from this snapshot.
    restart_from: Option<String>,
    /// What the member asked said of itself (leader, database size), when one answered.
    endpoint: Option<EndpointStatus>,
    /// The pod name of the member that leads, as the member asked reported it.
    leader: Option<String>,
}

/// A member and the pod it runs in.
struct MemberInPod<'m> {
    member: &'m Member,
    pod: Option<String>,
}

impl<'a> Step<'a> {
    fn progressing(&mut self, reason: &'static str, message: impl Into<String>) {
        if self.progress.is_none() {
            self.progress = Some((reason, message.into()));
        }
    }

    fn event(&mut self, event_type: EventType, reason: &str, message: String) {
        self.events.push(Event {
            event_type,
            reason: reason.to_owned(),
            message,
        });
    }

    /// Member pods by index, so `ex-2` comes before `ex-10`.
    fn pods_by_index(&self) -> Vec<&'a ObservedPod> {
        let mut pods: Vec<&ObservedPod> = self.children.pods.iter().collect();
        pods.sort_by_key(|p| {
            (
                self.cluster.member_index(&p.name).unwrap_or(usize::MAX),
                p.name.clone(),
            )
        });
        pods
    }

    /// Asks the Ready members, in order, for the member list; the first answer wins.
    fn contact(&mut self, etcd: &mut impl EtcdApi) -> Option<EtcdView> {
        let candidates: Vec<String> = self
            .pods_by_index()
            .into_iter()
            .filter(|p| p.ready && !p.is_gone())
            .map(|p| p.name.clone())
            .collect();
        let mut errors = Vec::new();
        for pod in candidates {
            match etcd.member_list(&pod) {
                Ok(list) if let Some(problem) = self.foreign_answer(&pod, &list) => {
                    errors.push(format!("{pod}: {problem}"));
                }
                Ok(list) => {
                    let status = etcd.status(&pod).ok();
                    return Some(EtcdView {
                        contact: pod,
                        list,
                        status,
                    });
                }
                Err(e) => errors.push(format!("{pod}: {e}")),
            }
        }
        if !errors.is_empty() {
            self.progressing("EtcdUnreachable", errors.join("; "));
        }
        None
    }

    /// Why a member list `pod` answered is not this cluster's to act on, if it is not: it
    /// names another cluster than the one recorded in status, or does not list `pod` itself.
    /// Every pod carrying the EtcdCluster's controller reference is observed, so a Ready pod
    /// that is no member (someone's, or a removed member's) could otherwise have the real
    /// members deleted as strays by its answer.
    fn foreign_answer(&self, pod: &str, list: &MemberList) -> Option<String> {
        if let Some(recorded) = &self.observed.cluster_id
            && list.cluster_id.to_string() != *recorded
        {
            return Some(format!(
                "answered for cluster {}, not this cluster's {recorded} (status.clusterID); ignored",
                list.cluster_id
            ));
        }
        let listed = list
            .members
            .iter()
            .any(|m| self.member_pod_name(m).as_deref() == Some(pod));
        (!listed).then(|| "answered with a member list that does not list it; ignored".to_owned())
    }

    fn member_pod_name(&self, member: &Member) -> Option<String> {
        if self.cluster.member_index(&member.name).is_some() {
            return Some(member.name.clone());
        }
        member
            .peer_urls
            .iter()
            .find_map(|url| self.cluster.pod_of_peer_url(url))
    }

    fn initial_cluster(&self, members: &[Member]) -> Vec<(String, String)> {
        members
            .iter()
            .filter_map(|m| {
                let pod = self.member_pod_name(m)?;
                let url = m.peer_urls.first()?.clone();
                let name = if m.name.is_empty() {
                    pod
                } else {
                    m.name.clone()
                };
                Some((name, url))
            })
            .collect()
    }

    /// Claim (with storage) and pod of a member, in that order: the pod mounts the claim.
    fn create_member_pod(
        &mut self,
        pod: &str,
        initial_cluster: Vec<(String, String)>,
        state: ClusterState,
    ) {
        if let Some(claim) = children::member_claim(self.cluster, self.spec, pod) {
            self.actions.push(Action::Apply(claim));
        }
        let member = MemberPod {
            name: pod.to_owned(),
            initial_cluster,
            state,
        };
        self.actions.push(Action::Apply(children::member_pod(
            self.cluster,
            self.spec,
            &member,
        )));
    }

    /// Pod, then its claim: the claim is only released once no pod mounts it.
    fn delete_member_pod(&mut self, pod: &str) {
        if self.children.pod(pod).is_some_and(|p| !p.terminating) {
            self.actions.push(Action::Delete {
                kind: children::pod_kind(),
                name: pod.to_owned(),
            });
        }
        let claim = self.cluster.claim_name(pod);
        if self.children.has_claim(&claim) {
            self.actions.push(Action::Delete {
                kind: children::pvc_kind(),
                name: claim,
            });
        }
    }

    /// etcd answered: repair, then at most one membership change.
    fn reachable(&mut self, etcd: &mut impl EtcdApi, view: EtcdView) -> Outcome {
        let version = view
            .status
            .as_ref()
            .map(|s| s.version.clone())
            .filter(|v| !v.is_empty());
        let leader = view.status.as_ref().map(|s| s.leader).unwrap_or(0);
        if let Some(running) = version.as_deref().and_then(Version::parse) {
            self.check_version_change(&running);
        }
        let list = self.membership_step(etcd, &view.contact, view.list, leader);
        self.backup(etcd, &view.contact);
        self.maintain(etcd, &view.contact, view.status.as_ref(), &list, leader);
        Outcome::Reachable { list, version }
    }

    /// etcd answered, but `spec.paused`: only read, and take snapshots if asked to.
    fn reachable_paused(&mut self, etcd: &mut impl EtcdApi, view: EtcdView) -> Outcome {
        let version = view
            .status
            .as_ref()
            .map(|s| s.version.clone())
            .filter(|v| !v.is_empty());
        if self.spec.backup.as_ref().is_some_and(|b| b.while_paused) {
            self.backup(etcd, &view.contact);
        }
        Outcome::Reachable {
            list: view.list,
            version,
        }
    }
}

mod backup;
mod maintenance;
mod membership;
mod recovery;
mod status;
#[cfg(test)]
mod tests;
mod upgrade;
