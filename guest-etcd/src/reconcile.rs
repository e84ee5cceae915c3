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
//!   second member.
//! - shrink: `member remove`, then delete its pod. A pod without a member (crash after
//!   `member remove`) is deleted.
//! - replace: a member whose pod failed or vanished with its emptyDir is removed, then a
//!   fresh member is added; with persistent storage its pod is recreated on its claim.
//! - upgrade: one minor at a time, each member restarted in place with the new image,
//!   followers first and the leader last; downgrades and two-minor jumps are refused.
//! - backup: one snapshot at a time, on demand or on schedule, listed in status only once a
//!   throwaway etcd has restored and served it (`reconcile/backup.rs`).
//!
//! These follow etcd's runtime reconfiguration guide
//! (<https://etcd.io/docs/v3.6/op-guide/runtime-configuration/>): change one member at a
//! time, add new members as learners, and remove a dead member before adding its
//! replacement.

use policy_host_sdk::conditions::{Condition, already_set, set_condition};
use policy_host_sdk::pods::ObservedPod;
use serde::Deserialize;
use serde_json::Value;

use crate::children::{
    self, ClusterRef, ClusterState, ETCD_CONTAINER, MemberPod, ObservedChildren, quorum,
};
use crate::etcd_api::{EndpointStatus, EtcdApi, Member, MemberList, MemberTls};
use crate::protocol::{Action, Decision, Event, EventType, Observation, PolicyError, Timestamp};
use crate::spec::{
    BackupStatus, EtcdClusterSpec, EtcdClusterStatus, MemberStatus, Phase, RestoreSpec, ValidSpec,
    Version,
};

/// Condition type: a quorum of voting members is ready, so the cluster serves requests.
pub const AVAILABLE: &str = "Available";
/// Condition type: membership is changing or the plugin waits for members to start.
pub const PROGRESSING: &str = "Progressing";
/// Condition type: something needs attention (invalid spec, lost members).
pub const DEGRADED: &str = "Degraded";

/// Requeue delay while something is changing or the plugin waits for members.
pub const REQUEUE_PROGRESSING_MS: u64 = 2_000;
/// Requeue delay when the cluster matches its spec (a health check).
pub const REQUEUE_STEADY_MS: u64 = 30_000;
/// Restarts after which a member whose pod is not Ready is crash-looping: its data or its
/// configuration is broken, and restarting it again will not help.
pub const CRASH_LOOP_RESTARTS: i64 = 5;

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
        .and_then(|s| serde_json::from_value(s).ok())
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
        actions: vec![
            Action::Apply(children::headless_service(&parent.cluster)),
            Action::Apply(children::client_service(&parent.cluster)),
            Action::Apply(children::pod_disruption_budget(&parent.cluster, spec.size)),
        ],
        events: Vec::new(),
        progress: None,
        degraded: None,
        version_blocked: false,
        now: observation.now,
        backup_status: None,
        backup_running: false,
        backup_due_in_ms: None,
        restart_from: None,
    };
    let view = step.contact(etcd);
    let outcome = match view {
        Some(view) => step.reachable(etcd, view),
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
            let serves_tls = pod.object["spec"]["containers"]
                .as_array()
                .into_iter()
                .flatten()
                .filter(|c| c["name"] == children::ETCD_CONTAINER)
                .flat_map(|c| c["args"].as_array().into_iter().flatten())
                .filter_map(Value::as_str)
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
            message,
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
    status.observed_generation = parent.generation;
    actions.push(Action::SetStatus(
        serde_json::to_value(&status).unwrap_or(Value::Null),
    ));
    Decision {
        actions,
        requeue_after_ms: None,
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

    /// etcd did not answer: only what is safe without its member list.
    fn unreachable(&mut self) -> Outcome {
        let recorded = self.observed.cluster_id.is_some() || !self.observed.members.is_empty();
        let live_pods = self.children.pods.iter().filter(|p| !p.is_gone()).count();
        if !recorded {
            if self.children.pods.is_empty() {
                // Bootstrap: no pod and no cluster ever answered, so no data can be lost.
                let seed = self.cluster.member_name(0);
                let initial = vec![(seed.clone(), self.cluster.peer_url(&seed))];
                self.create_member_pod(&seed, initial, ClusterState::New);
                self.event(
                    EventType::Normal,
                    "ClusterCreated",
                    format!("seed member {seed} created, etcd {}", self.spec.version),
                );
                // A snapshot to start from: the spec's, or the last backup after a quorum loss.
                let restore = self.spec.restore.clone().or_else(|| {
                    self.observed
                        .restoring
                        .as_ref()
                        .map(|snapshot| RestoreSpec {
                            claim_name: self.cluster.backup_claim_name(),
                            snapshot: snapshot.clone(),
                            s3: None,
                        })
                });
                if let Some(restore) = &restore
                    && let Some(Action::Apply(pod)) = self.actions.pop()
                {
                    self.actions.push(Action::Apply(children::with_restore(
                        pod,
                        self.cluster,
                        self.spec,
                        restore,
                    )));
                    self.event(
                        EventType::Normal,
                        "Restoring",
                        format!("seed member {seed} starts from {}", restore.source()),
                    );
                }
                self.progressing("Bootstrapping", format!("starting seed member {seed}"));
            } else if live_pods == 0 {
                // The seed failed before the cluster ever answered: start it again.
                for pod in self.pods_by_index() {
                    if !pod.terminating {
                        self.actions.push(Action::Delete {
                            kind: children::pod_kind(),
                            name: pod.name.clone(),
                        });
                    }
                }
                self.progressing("Bootstrapping", "the seed member failed; recreating it");
            } else {
                self.progressing(
                    "Bootstrapping",
                    "waiting for the seed member to become Ready",
                );
            }
            return Outcome::Unreachable {
                why: "the cluster has not answered yet".into(),
            };
        }
        // A recorded cluster whose majority of voters lost pod and data (emptyDir): etcd can
        // never elect a leader again (raft needs a quorum of the old membership).
        if self.spec.storage.is_none() {
            let voters: Vec<&MemberStatus> = self
                .observed
                .members
                .iter()
                .filter(|m| !m.learner)
                .collect();
            let surviving = voters
                .iter()
                .filter(|m| self.children.pod(&m.name).is_some_and(|p| !p.is_gone()))
                .count();
            if !voters.is_empty() && surviving < quorum(voters.len()) {
                return self.quorum_lost(voters.len(), surviving);
            }
        }
        // A recorded cluster. With persistent storage a member whose pod vanished still has
        // its data: recreate the pod (etcd ignores the initial-cluster flags when its data
        // dir exists). With emptyDir its data is gone and only etcd can tell whether a
        // quorum survives, so nothing is created here.
        let recorded_members: Vec<String> = self
            .observed
            .members
            .iter()
            .map(|m| m.name.clone())
            .collect();
        let mut recreated = Vec::new();
        if self.spec.storage.is_some() {
            let initial: Vec<(String, String)> = recorded_members
                .iter()
                .filter(|name| self.cluster.member_index(name).is_some())
                .map(|name| (name.clone(), self.cluster.peer_url(name)))
                .collect();
            for name in &recorded_members {
                if self.children.pod(name).is_none()
                    && self.children.has_claim(&self.cluster.claim_name(name))
                {
                    self.create_member_pod(name, initial.clone(), ClusterState::Existing);
                    recreated.push(name.clone());
                }
            }
        }
        if !recreated.is_empty() {
            self.progressing(
                "RecreatingMembers",
                format!(
                    "recreating pods {} from their volumes",
                    recreated.join(", ")
                ),
            );
        } else if live_pods == 0 {
            let message = "every member pod is gone and no member answers; with emptyDir storage \
                           their data is lost: delete and recreate the EtcdCluster (restoring a backup)";
            self.degraded = Some(("ClusterLost", message.to_owned()));
        } else {
            self.progressing(
                "WaitingForEtcd",
                "no member answered yet; waiting for member pods to become Ready",
            );
        }
        Outcome::Unreachable {
            why: self
                .progress
                .as_ref()
                .map(|(_, m)| m.clone())
                .unwrap_or_else(|| "no member pod is Ready".into()),
        }
    }

    /// Quorum is lost for good. Reported; and with `spec.backup.restoreOnQuorumLoss` and a
    /// snapshot, every member pod is deleted and the cluster forgotten in status, so the
    /// next reconciles bootstrap a new cluster from that snapshot.
    fn quorum_lost(&mut self, voters: usize, surviving: usize) -> Outcome {
        let lost = format!(
            "{} of {voters} voting members lost their pods and data, so etcd has no quorum and cannot recover by itself",
            voters - surviving
        );
        let snapshot = self
            .spec
            .backup
            .as_ref()
            .filter(|b| b.restore_on_quorum_loss)
            .and(self.observed.backup.as_ref())
            .and_then(|b| b.last_snapshot.clone());
        match snapshot {
            Some(snapshot) => {
                for pod in self.pods_by_index() {
                    if !pod.terminating {
                        self.actions.push(Action::Delete {
                            kind: children::pod_kind(),
                            name: pod.name.clone(),
                        });
                    }
                }
                self.event(
                    EventType::Warning,
                    "QuorumLost",
                    format!("{lost}; restoring a new cluster from snapshot {snapshot}"),
                );
                self.progressing(
                    "RestoringFromBackup",
                    format!("starting again from snapshot {snapshot}; writes after it are lost"),
                );
                self.restart_from = Some(snapshot);
            }
            None if surviving == 0 => {
                let message = "every member pod is gone and no member answers; with emptyDir storage their data is lost: \
                               recreate the EtcdCluster from a backup (spec.restore), or set spec.backup.restoreOnQuorumLoss with a snapshot taken";
                self.degraded = Some(("ClusterLost", message.to_owned()));
            }
            None => {
                self.degraded = Some((
                    "QuorumLost",
                    format!(
                        "{lost}: recreate the EtcdCluster from a backup (spec.restore), or set spec.backup.restoreOnQuorumLoss with a snapshot taken"
                    ),
                ));
            }
        }
        Outcome::Unreachable { why: lost }
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
        Outcome::Reachable { list, version }
    }

    /// etcd upgrades one minor version at a time and never downgrades
    /// (<https://etcd.io/docs/v3.6/upgrades/>): refuse anything else.
    fn check_version_change(&mut self, running: &Version) {
        let wanted = &self.spec.version;
        let (from, to) = ((running.major, running.minor), (wanted.major, wanted.minor));
        let problem = if to < from {
            Some((
                "DowngradeNotSupported",
                format!(
                    "the cluster runs etcd {running} and spec.version asks for {wanted}: etcd cannot be downgraded to an older minor; set spec.version back to {}.{}.x",
                    running.major, running.minor
                ),
            ))
        } else if to.0 != from.0 || to.1 > from.1 + 1 {
            Some((
                "UnsupportedUpgrade",
                format!(
                    "the cluster runs etcd {running} and spec.version asks for {wanted}: etcd upgrades one minor version at a time; set spec.version to {}.{}.x first",
                    running.major,
                    running.minor + 1
                ),
            ))
        } else {
            None
        };
        if let Some(problem) = problem {
            self.degraded = Some(problem);
            self.version_blocked = true;
        }
    }

    fn membership_step(
        &mut self,
        etcd: &mut impl EtcdApi,
        contact: &str,
        list: MemberList,
        leader: u64,
    ) -> MemberList {
        let members: Vec<MemberInPod> = list
            .members
            .iter()
            .map(|m| MemberInPod {
                member: m,
                pod: self.member_pod_name(m),
            })
            .collect();
        let member_pods: Vec<String> = members.iter().filter_map(|m| m.pod.clone()).collect();
        let mut repaired = false;

        // Pods without a member: removed from etcd, then the host stopped before the pod was
        // deleted (or left over from an earlier cluster). Their data is not part of this
        // cluster; a member must never restart from it.
        for pod in self.pods_by_index() {
            if !member_pods.contains(&pod.name) && !pod.terminating {
                self.delete_member_pod(&pod.name);
                repaired = true;
            }
        }
        for claim in &self.children.claims {
            if let Some(pod) = self.cluster.claim_member(claim)
                && !member_pods.contains(&pod)
                && self.children.pod(&pod).is_none()
            {
                self.actions.push(Action::Delete {
                    kind: children::pvc_kind(),
                    name: claim.clone(),
                });
                repaired = true;
            }
        }
        if repaired {
            self.progressing(
                "RemovingStrayPods",
                "deleting pods whose member is no longer in etcd",
            );
        }

        // Failed pods of members: delete them; the member is then recreated or replaced.
        for m in &members {
            if let Some(pod) = m.pod.as_deref().and_then(|p| self.children.pod(p))
                && !pod.terminating
                && pod.is_gone()
            {
                self.delete_member_pod_only(&pod.name);
                self.progressing(
                    "ReplacingMember",
                    format!("pod {} failed; deleting it", pod.name),
                );
                repaired = true;
            }
        }
        // A crash-looping member (etcd answered, so the others hold a quorum without it):
        // its pod goes with its claim, so the member is removed and replaced by a fresh one
        // rather than restarted again on the same data. One at a time.
        if !repaired
            && let Some(pod) = members
                .iter()
                .filter(|m| m.member.is_started())
                .filter_map(|m| m.pod.as_deref().and_then(|p| self.children.pod(p)))
                .find(|p| {
                    !p.terminating
                        && !p.ready
                        && p.waiting_reason(ETCD_CONTAINER) == Some("CrashLoopBackOff")
                        && p.restarts(ETCD_CONTAINER) >= CRASH_LOOP_RESTARTS
                })
        {
            self.delete_member_pod(&pod.name);
            self.event(
                EventType::Warning,
                "MemberCrashLooping",
                format!(
                    "member {} restarted {} times without becoming Ready; replacing it with a fresh member (its logs say why)",
                    pod.name,
                    pod.restarts(ETCD_CONTAINER)
                ),
            );
            self.progressing(
                "ReplacingMember",
                format!("pod {} is crash-looping; replacing it", pod.name),
            );
            repaired = true;
        }

        // Members without a pod.
        let voters = members.iter().filter(|m| !m.member.is_learner).count();
        let mut membership_changed = None;
        for m in &members {
            let Some(pod) = m.pod.clone() else { continue };
            if self.children.pod(&pod).is_some() {
                continue;
            }
            let initial = self.initial_cluster(&list.members);
            if !m.member.is_started() {
                // Added to etcd, then the host stopped before creating the pod: create it,
                // never add a second member (etcd allows one unstarted member at a time).
                self.create_member_pod(&pod, initial, ClusterState::Existing);
                self.progressing(
                    "AddingMember",
                    format!("creating pod {pod} for member added earlier"),
                );
                repaired = true;
            } else if self.spec.storage.is_some()
                && self.children.has_claim(&self.cluster.claim_name(&pod))
            {
                self.create_member_pod(&pod, initial, ClusterState::Existing);
                self.progressing(
                    "RecreatingMember",
                    format!("recreating pod {pod} from its volume"),
                );
                repaired = true;
            } else if membership_changed.is_none() {
                // A started member whose pod (and emptyDir data) is gone: it can never come
                // back. Remove it so a fresh member can take its place.
                if !m.member.is_learner && voters <= 1 {
                    self.degraded = Some((
                        "MemberLost",
                        format!(
                            "the only voting member {pod} lost its pod and data: recreate the EtcdCluster from a backup"
                        ),
                    ));
                    repaired = true;
                    continue;
                }
                match etcd.member_remove(contact, m.member.id) {
                    Ok(after) => {
                        self.event(
                            EventType::Normal,
                            "MemberRemoved",
                            format!("removed member {pod} (ID {:x}): its pod and data are gone; a fresh member replaces it", m.member.id),
                        );
                        self.progressing("ReplacingMember", format!("removed lost member {pod}"));
                        membership_changed = Some(after);
                    }
                    Err(e) => {
                        self.progressing(
                            "ReplacingMember",
                            format!("cannot remove lost member {pod} yet: {e}"),
                        );
                    }
                }
                repaired = true;
            }
        }
        if let Some(after) = membership_changed {
            return after;
        }
        if repaired {
            return list;
        }

        let size = self.spec.size;
        if members.len() > size {
            return self.shrink(etcd, contact, &list, leader);
        }
        if let Some(learner) = members.iter().find(|m| m.member.is_learner) {
            let pod = learner
                .pod
                .clone()
                .unwrap_or_else(|| learner.member.name.clone());
            if !learner.member.is_started() {
                self.progressing(
                    "AddingMember",
                    format!("waiting for learner {pod} to start"),
                );
                return list;
            }
            // Promotion fails until the learner has caught up with the leader's log:
            // that is the normal "not yet", retried on the next reconcile.
            return match etcd.member_promote(contact, learner.member.id) {
                Ok(after) => {
                    self.event(
                        EventType::Normal,
                        "MemberPromoted",
                        format!("promoted learner {pod} to voting member"),
                    );
                    self.progressing("AddingMember", format!("promoted {pod}"));
                    after
                }
                Err(e) => {
                    self.progressing("AddingMember", format!("learner {pod} is catching up: {e}"));
                    list
                }
            };
        }
        if self.version_blocked {
            return list;
        }
        if members.len() < size {
            return self.grow(etcd, contact, &list, &members);
        }
        let not_ready: Vec<String> = member_pods
            .iter()
            .filter(|p| !self.children.pod(p).is_some_and(|p| p.ready))
            .cloned()
            .collect();
        if !not_ready.is_empty() {
            self.progressing(
                "WaitingForMembers",
                format!("members not Ready: {}", not_ready.join(", ")),
            );
            return list;
        }
        self.upgrade(etcd, &members, leader);
        list
    }

    /// Rolling upgrade (or image change): one member at a time, followers first and the
    /// leader last, each restarted in place with the new image only after every member
    /// already restarted runs the new version and is Ready.
    fn upgrade(&mut self, etcd: &mut impl EtcdApi, members: &[MemberInPod], leader: u64) {
        let image = self.spec.image.as_str();
        let pods: Vec<(&Member, &ObservedPod)> = members
            .iter()
            .filter_map(|m| Some((m.member, self.children.pod(m.pod.as_deref()?)?)))
            .collect();
        let mut outdated: Vec<(&Member, &ObservedPod)> = pods
            .iter()
            .filter(|(_, p)| p.image(ETCD_CONTAINER) != Some(image))
            .copied()
            .collect();
        if outdated.is_empty() {
            return;
        }
        for (_, pod) in pods
            .iter()
            .filter(|(_, p)| p.image(ETCD_CONTAINER) == Some(image))
        {
            let version = etcd.status(&pod.name).map(|s| s.version);
            if !pod.ready || version.as_deref().ok() != Some(self.spec.version.text.as_str()) {
                let seen = match version {
                    Ok(v) => format!("it runs {v}"),
                    Err(e) => e.to_string(),
                };
                self.progressing(
                    "Upgrading",
                    format!(
                        "waiting for {} to run etcd {} and be Ready ({seen})",
                        pod.name, self.spec.version
                    ),
                );
                return;
            }
        }
        outdated.sort_by_key(|(m, p)| (m.id == leader, self.cluster.member_index(&p.name)));
        let Some((member, pod)) = outdated.first() else {
            return;
        };
        // The leader goes last, and hands leadership to an upgraded member first, so the
        // cluster does not sit through an election timeout with no leader while it restarts
        // (etcd's upgrade guide: <https://etcd.io/docs/v3.6/upgrades/upgrade_3_6/>).
        let transferee = pods
            .iter()
            .filter(|(m, p)| p.image(ETCD_CONTAINER) == Some(image) && m.id != member.id)
            .min_by_key(|(_, p)| self.cluster.member_index(&p.name));
        if member.id == leader
            && let Some((target, target_pod)) = transferee
        {
            match etcd.move_leader(&pod.name, target.id) {
                Ok(()) => self.event(
                    EventType::Normal,
                    "LeaderMoved",
                    format!(
                        "moved leadership from {} to {} before restarting it",
                        pod.name, target_pod.name
                    ),
                ),
                Err(e) => {
                    self.progressing(
                        "Upgrading",
                        format!(
                            "moving leadership from {} to {} before restarting it failed, retrying: {e}",
                            pod.name, target_pod.name
                        ),
                    );
                    return;
                }
            }
        }
        match children::with_image(&pod.object, image) {
            Some(object) => {
                self.actions.push(Action::Apply(object));
                self.event(
                    EventType::Normal,
                    "MemberUpgrading",
                    format!("restarting member {} with image {image}", pod.name),
                );
                self.progressing(
                    "Upgrading",
                    format!(
                        "restarting {} with image {image}; {} members left",
                        pod.name,
                        outdated.len() - 1
                    ),
                );
            }
            None => self.progressing(
                "Upgrading",
                format!("pod {} has no etcd container to upgrade", pod.name),
            ),
        }
    }

    fn delete_member_pod_only(&mut self, pod: &str) {
        self.actions.push(Action::Delete {
            kind: children::pod_kind(),
            name: pod.to_owned(),
        });
    }

    /// Adds one member: `member add` as a learner, then its pod.
    fn grow(
        &mut self,
        etcd: &mut impl EtcdApi,
        contact: &str,
        list: &MemberList,
        members: &[MemberInPod],
    ) -> MemberList {
        let waiting: Vec<String> = members
            .iter()
            .filter(|m| {
                !m.member.is_started()
                    || m.pod
                        .as_deref()
                        .and_then(|p| self.children.pod(p))
                        .is_none_or(|p| !p.ready || p.is_gone())
            })
            .map(|m| {
                m.pod
                    .clone()
                    .unwrap_or_else(|| format!("{:x}", m.member.id))
            })
            .collect();
        let terminating: Vec<&str> = self
            .children
            .pods
            .iter()
            .filter(|p| p.terminating)
            .map(|p| p.name.as_str())
            .collect();
        if !waiting.is_empty() || !terminating.is_empty() {
            let mut names = waiting;
            names.extend(terminating.iter().map(|t| format!("{t} (terminating)")));
            self.progressing(
                "WaitingForMembers",
                format!(
                    "scaling up to {} waits for members to be Ready: {}",
                    self.spec.size,
                    names.join(", ")
                ),
            );
            return list.clone();
        }
        let used: Vec<usize> = self
            .children
            .pods
            .iter()
            .filter_map(|p| self.cluster.member_index(&p.name))
            .chain(
                members
                    .iter()
                    .filter_map(|m| m.pod.as_deref().and_then(|p| self.cluster.member_index(p))),
            )
            .chain(
                self.children
                    .claims
                    .iter()
                    .filter_map(|c| self.cluster.claim_member(c))
                    .filter_map(|p| self.cluster.member_index(&p)),
            )
            .collect();
        let index = (0..).find(|n| !used.contains(n)).unwrap_or(0);
        let pod = self.cluster.member_name(index);
        let peer_url = self.cluster.peer_url(&pod);
        let as_learner = self.spec.version.supports_learners();
        match etcd.member_add(contact, std::slice::from_ref(&peer_url), as_learner) {
            Ok(added) => {
                let mut all = added.list.members.clone();
                if !all.iter().any(|m| m.id == added.member.id) {
                    all = list.members.clone();
                    all.push(added.member.clone());
                }
                let initial = self.initial_cluster(&all);
                self.create_member_pod(&pod, initial, ClusterState::Existing);
                self.event(
                    EventType::Normal,
                    "MemberAdded",
                    format!(
                        "added member {pod} (ID {:x}){}",
                        added.member.id,
                        if as_learner { " as a learner" } else { "" }
                    ),
                );
                self.progressing(
                    "AddingMember",
                    format!("added {pod}, {} of {} members", all.len(), self.spec.size),
                );
                MemberList {
                    cluster_id: if added.list.cluster_id != 0 {
                        added.list.cluster_id
                    } else {
                        list.cluster_id
                    },
                    members: all,
                }
            }
            Err(e) => {
                self.progressing(
                    "AddingMember",
                    format!("member add for {pod} failed, retrying: {e}"),
                );
                list.clone()
            }
        }
    }

    /// Removes one member: a learner first, then a member whose pod is not Ready, then the
    /// highest-numbered follower; the leader last, and never the last voter.
    fn shrink(
        &mut self,
        etcd: &mut impl EtcdApi,
        contact: &str,
        list: &MemberList,
        leader: u64,
    ) -> MemberList {
        let ready = |m: &Member| {
            self.member_pod_name(m)
                .and_then(|p| self.children.pod(&p))
                .is_some_and(|p| p.ready && !p.is_gone())
        };
        let index = |m: &Member| {
            self.member_pod_name(m)
                .and_then(|p| self.cluster.member_index(&p))
                .unwrap_or(usize::MAX)
        };
        let victim = list
            .members
            .iter()
            .max_by_key(|m| (m.is_learner, !ready(m), m.id != leader, index(m)));
        let Some(victim) = victim else {
            return list.clone();
        };
        let voters: Vec<&Member> = list.members.iter().filter(|m| !m.is_learner).collect();
        if !victim.is_learner {
            if voters.len() <= 1 {
                self.progressing("RemovingMember", "never removing the last voting member");
                return list.clone();
            }
            // Removing a Ready voter must leave a Ready quorum among the remaining voters.
            let remaining_ready = voters
                .iter()
                .filter(|m| m.id != victim.id && ready(m))
                .count();
            if ready(victim) && remaining_ready < quorum(voters.len() - 1) {
                self.progressing(
                    "RemovingMember",
                    "scaling down waits: removing a member now would leave no Ready quorum",
                );
                return list.clone();
            }
        }
        let pod = self.member_pod_name(victim);
        let label = pod.clone().unwrap_or_else(|| format!("{:x}", victim.id));
        // etcd first: a pod deleted before its member is removed leaves a member that can
        // never start again and counts against the quorum.
        match etcd.member_remove(contact, victim.id) {
            Ok(after) => {
                if let Some(pod) = &pod {
                    self.delete_member_pod(pod);
                }
                self.event(
                    EventType::Normal,
                    "MemberRemoved",
                    format!("removed member {label} (ID {:x})", victim.id),
                );
                self.progressing(
                    "RemovingMember",
                    format!(
                        "removed {label}, {} of {} members",
                        list.members.len() - 1,
                        self.spec.size
                    ),
                );
                if after.members.is_empty() {
                    MemberList {
                        cluster_id: list.cluster_id,
                        members: list
                            .members
                            .iter()
                            .filter(|m| m.id != victim.id)
                            .cloned()
                            .collect(),
                    }
                } else {
                    after
                }
            }
            Err(e) => {
                self.progressing(
                    "RemovingMember",
                    format!("member remove for {label} failed, retrying: {e}"),
                );
                list.clone()
            }
        }
    }

    /// Status, events and requeue.
    fn finish(mut self, parent: &Parent, outcome: Outcome, now: Timestamp) -> Decision {
        let size = self.spec.size;
        let mut status = parent.status.clone();
        let pod_ready = |name: &str| {
            self.children
                .pod(name)
                .is_some_and(|p| p.ready && !p.is_gone())
        };
        let available: Condition;
        match &outcome {
            Outcome::Reachable { list, version } => {
                status.members = list
                    .members
                    .iter()
                    .map(|m| {
                        let name = self.member_pod_name(m).unwrap_or_else(|| m.name.clone());
                        MemberStatus {
                            ready: m.is_started() && pod_ready(&name),
                            id: m.id.to_string(),
                            learner: m.is_learner,
                            name,
                        }
                    })
                    .collect();
                status.size = Some(i64::try_from(list.members.len()).unwrap_or(i64::MAX));
                if list.cluster_id != 0 {
                    status.cluster_id = Some(list.cluster_id.to_string());
                }
                if let Some(version) = version {
                    status.current_version = Some(version.clone());
                }
                let voters: Vec<&MemberStatus> =
                    status.members.iter().filter(|m| !m.learner).collect();
                let ready_voters = voters.iter().filter(|m| m.ready).count();
                available = if !voters.is_empty() && ready_voters >= quorum(voters.len()) {
                    Condition::new(
                        AVAILABLE,
                        true,
                        "QuorumReady",
                        format!("{ready_voters} of {} voting members Ready", voters.len()),
                    )
                } else {
                    Condition::new(
                        AVAILABLE,
                        false,
                        "QuorumNotReady",
                        format!("{ready_voters} of {} voting members Ready", voters.len()),
                    )
                };
            }
            Outcome::Unreachable { why } => {
                for member in &mut status.members {
                    member.ready = pod_ready(&member.name);
                }
                available = Condition::new(AVAILABLE, false, "EtcdUnreachable", why.clone());
            }
        }
        let ready_count = status.members.iter().filter(|m| m.ready).count();
        status.ready = Some(format!("{ready_count}/{size}"));
        status.target_version = Some(self.spec.version.text.clone());
        status.observed_generation = parent.generation;
        if let Some(backup) = self.backup_status.take() {
            status.backup = Some(backup);
        }
        if matches!(outcome, Outcome::Reachable { .. }) {
            status.restoring = None;
        }
        if let Some(snapshot) = self.restart_from.take() {
            status.cluster_id = None;
            status.members.clear();
            status.size = None;
            status.restoring = Some(snapshot);
        }

        let progressing = match &self.progress {
            Some((reason, message)) => Condition::new(PROGRESSING, true, reason, message.clone()),
            None => Condition::new(
                PROGRESSING,
                false,
                "Reconciled",
                format!("{size} of {size} members, all Ready"),
            ),
        };
        let degraded = match &self.degraded {
            Some((reason, message)) => Condition::new(DEGRADED, true, reason, message.clone()),
            None => Condition::new(DEGRADED, false, "AsExpected", "nothing needs attention"),
        };
        if degraded.status == "True" && !already_set(&parent.status.conditions, &degraded) {
            self.event(
                EventType::Warning,
                &degraded.reason,
                degraded.message.clone(),
            );
        }
        let lost = matches!(&self.degraded, Some((reason, _)) if ["ClusterLost", "MemberLost", "QuorumLost"].contains(reason));
        status.phase = Some(if lost {
            Phase::Failed
        } else if status.cluster_id.is_none() {
            Phase::Creating
        } else if self.progress.is_some() {
            Phase::Scaling
        } else {
            Phase::Running
        });
        for condition in [available, progressing, degraded] {
            set_condition(
                &mut status.conditions,
                condition.observed(parent.generation),
                now,
            );
        }

        // Degraded without progress waits for a human: no point in polling fast.
        let steady = self.progress.is_none() && !self.backup_running;
        let mut actions = self.actions;
        actions.extend(self.events.into_iter().map(Action::RecordEvent));
        actions.push(Action::SetStatus(
            serde_json::to_value(&status).unwrap_or(Value::Null),
        ));
        let requeue = if steady {
            REQUEUE_STEADY_MS
        } else {
            REQUEUE_PROGRESSING_MS
        };
        Decision {
            actions,
            requeue_after_ms: Some(
                self.backup_due_in_ms
                    .map_or(requeue, |due| due.min(requeue)),
            ),
        }
    }
}

mod backup;
#[cfg(test)]
mod tests;
