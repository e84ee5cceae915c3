//! The end of a reconcile: the status (members, conditions, phase), the Events, and when to
//! look again.

use policy_host_sdk::conditions::{Condition, already_set, set_condition};
use serde_json::Value;

use super::{
    AVAILABLE, DEGRADED, IGNORED_FIELDS, Outcome, PAUSED, PROGRESSING, Parent, REQUEUE_ADDING_MS,
    REQUEUE_PROGRESSING_MS, REQUEUE_STEADY_MS, Step,
};
use crate::children::{CLIENT_PORT, ClusterRef, quorum};
use crate::protocol::{Action, Decision, EventType, Timestamp};
use crate::spec::{ClassicMembers, MemberStatus, Phase};

/// The `Paused` condition's message while `spec.paused` holds.
pub(super) const PAUSED_MESSAGE: &str = "spec.paused is true: no member is added, removed, replaced or upgraded and no child is written; set spec.paused to false to resume";
/// The `Paused` condition's message once unpaused.
const RESUMED_MESSAGE: &str = "spec.paused is false: changes resumed";

impl Step<'_> {
    /// Status, events and requeue.
    pub(super) fn finish(mut self, parent: &Parent, outcome: Outcome, now: Timestamp) -> Decision {
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
                status.etcd_members = list
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
                if self.leader.is_some() {
                    status.leader = self.leader.clone();
                }
                let voters: Vec<&MemberStatus> =
                    status.etcd_members.iter().filter(|m| !m.learner).collect();
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
                for member in &mut status.etcd_members {
                    member.ready = pod_ready(&member.name);
                }
                available = Condition::new(AVAILABLE, false, "EtcdUnreachable", why.clone());
            }
        }
        status.observed_generation = parent.generation;
        if let Some(backup) = self.backup_status.take() {
            status.backup = Some(backup);
        }
        if matches!(outcome, Outcome::Reachable { .. }) {
            status.restoring = None;
        }
        if let Some(snapshot) = self.restart_from.take() {
            status.cluster_id = None;
            status.leader = None;
            status.etcd_members.clear();
            status.size = None;
            status.restoring = Some(snapshot);
        }
        status.members = classic_members(self.cluster, &status.etcd_members);
        status.ready = Some(format!("{}/{size}", status.members.ready.len()));
        let target = &self.spec.version.text;
        status.target_version =
            (status.current_version.as_ref() != Some(target)).then(|| target.clone());
        status.service_name = Some(self.cluster.client_service_name());
        status.client_port = Some(i64::from(CLIENT_PORT));

        let paused = self.spec.paused;
        if paused {
            // What would be progressing is held: say that instead, and poll slowly.
            self.progress = None;
        }
        let progressing = match &self.progress {
            _ if paused => Condition::new(PROGRESSING, false, "Paused", PAUSED_MESSAGE),
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
        let paused_condition = if paused {
            Some(Condition::new(PAUSED, true, "Paused", PAUSED_MESSAGE))
        } else {
            parent
                .status
                .conditions
                .iter()
                .any(|c| c.type_ == PAUSED && c.status == "True")
                .then(|| Condition::new(PAUSED, false, "Resumed", RESUMED_MESSAGE))
        };
        if let Some(condition) = &paused_condition
            && !already_set(&parent.status.conditions, condition)
        {
            self.event(
                EventType::Normal,
                &condition.reason,
                condition.message.clone(),
            );
        }
        let ignored_condition = if self.spec.ignored.is_empty() {
            parent
                .status
                .conditions
                .iter()
                .any(|c| c.type_ == IGNORED_FIELDS && c.status == "True")
                .then(|| {
                    Condition::new(
                        IGNORED_FIELDS,
                        false,
                        "NoneIgnored",
                        "every field of the spec is used",
                    )
                })
        } else {
            Some(Condition::new(
                IGNORED_FIELDS,
                true,
                "ClassicFieldsIgnored",
                format!(
                    "fields of the classic etcd-operator with no meaning here, accepted and ignored: {}",
                    self.spec.ignored.join("; ")
                ),
            ))
        };
        if let Some(condition) = ignored_condition
            .as_ref()
            .filter(|c| c.status == "True" && !already_set(&parent.status.conditions, c))
        {
            self.event(
                EventType::Warning,
                &condition.reason,
                condition.message.clone(),
            );
        }
        status.phase = Some(if paused {
            Phase::Paused
        } else if lost {
            Phase::Failed
        } else if status.cluster_id.is_none() {
            Phase::Creating
        } else if self.progress.is_some() {
            Phase::Scaling
        } else {
            Phase::Running
        });
        status.control_paused = paused;
        status.reason = (status.phase == Some(Phase::Failed)).then(|| degraded.message.clone());
        for condition in [available, progressing, degraded]
            .into_iter()
            .chain(paused_condition)
            .chain(ignored_condition)
        {
            set_condition(
                &mut status.conditions,
                condition.observed(parent.generation),
                now,
            );
        }

        // Degraded without progress waits for a human: no point in polling fast.
        let steady = self.progress.is_none() && !self.backup_running;
        let metrics = crate::metrics::report(&crate::metrics::Seen {
            before: &parent.status,
            after: &status,
            desired: size,
            endpoint: self.endpoint.as_ref(),
        });
        let mut actions = self.actions;
        actions.extend(self.events.into_iter().map(Action::RecordEvent));
        actions.push(Action::SetStatus(
            serde_json::to_value(&status).unwrap_or(Value::Null),
        ));
        let requeue = if steady {
            REQUEUE_STEADY_MS
        } else if matches!(self.progress, Some(("AddingMember", _))) {
            // A learner starting or catching up is done within a second or two: look again
            // at the host's shortest requeue rather than the usual pace.
            REQUEUE_ADDING_MS
        } else {
            REQUEUE_PROGRESSING_MS
        };
        Decision {
            actions,
            requeue_after_ms: Some(
                self.backup_due_in_ms
                    .map_or(requeue, |due| due.min(requeue)),
            ),
            metrics,
        }
    }
}

/// The classic `status.members`: the pod names of voting members that serve requests (etcd
/// started, pod Ready) and of every other member, each in member order (`ex-2` before
/// `ex-10`). A learner is unready until promoted: it serves no client request.
fn classic_members(cluster: &ClusterRef, members: &[MemberStatus]) -> ClassicMembers {
    let mut named: Vec<&MemberStatus> = members.iter().filter(|m| !m.name.is_empty()).collect();
    named.sort_by_key(|m| (cluster.member_index(&m.name).unwrap_or(usize::MAX), &m.name));
    let (ready, unready): (Vec<&MemberStatus>, Vec<&MemberStatus>) =
        named.into_iter().partition(|m| m.ready && !m.learner);
    let names = |list: Vec<&MemberStatus>| list.into_iter().map(|m| m.name.clone()).collect();
    ClassicMembers {
        ready: names(ready),
        unready: names(unready),
    }
}
