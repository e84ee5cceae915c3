//! Membership, when etcd answers: repairs (a member without a pod, a pod without a member, a
//! learner that can never start, a failed or crash-looping member), then at most one change:
//! grow, shrink, or an upgrade step.

use policy_host_sdk::pods::ObservedPod;

use super::{CRASH_LOOP_RESTARTS, CRASH_LOOP_SECONDS, MemberInPod, Step};
use crate::children::{self, ClusterState, ETCD_CONTAINER, quorum};
use crate::etcd_api::{EtcdApi, Member, MemberList};
use crate::protocol::{Action, EventType, Timestamp};
use crate::schedule::parse_rfc3339;

impl Step<'_> {
    pub(super) fn membership_step(
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

        // A learner that can never start is removed before anything else: it holds no vote,
        // and while it is there no other member can join.
        if let Some(stuck) = members.iter().find_map(|m| self.stuck_learner(m, &list)) {
            return self.remove_stuck_learner(etcd, contact, stuck, &list);
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
        // A member that keeps crashing (etcd answered, so the others hold a quorum without
        // it). Lifetime restarts alone say little (they pile up over months of node reboots),
        // so only a member not Ready and crash-looping for minutes counts. With emptyDir its
        // pod is deleted and a fresh member replaces it. Data on a claim is never deleted
        // here: the member is reported, and a human who deletes the claim has it replaced.
        if !repaired
            && let Some(pod) = members
                .iter()
                .filter(|m| m.member.is_started())
                .filter_map(|m| m.pod.as_deref().and_then(|p| self.children.pod(p)))
                .find(|p| !p.terminating && crash_looping(p, self.now))
        {
            let claim = self.cluster.claim_name(&pod.name);
            if self.children.has_claim(&claim) && !self.children.claim_terminating(&claim) {
                self.degraded = Some((
                    "MemberCrashLooping",
                    format!(
                        "member {} keeps crashing (not Ready, in CrashLoopBackOff for over {} s); its data on claim {claim} is kept: read its logs, and if its data is broken delete claim {claim} to have it replaced by a fresh member",
                        pod.name, CRASH_LOOP_SECONDS
                    ),
                ));
            } else {
                self.delete_member_pod_only(&pod.name);
                self.event(
                    EventType::Warning,
                    "MemberCrashLooping",
                    format!(
                        "member {} has been crashing for over {} s ({} restarts) without becoming Ready; replacing it with a fresh member (its logs say why)",
                        pod.name,
                        CRASH_LOOP_SECONDS,
                        pod.restarts(ETCD_CONTAINER)
                    ),
                );
                self.progressing(
                    "ReplacingMember",
                    format!("pod {} is crash-looping; replacing it", pod.name),
                );
                repaired = true;
            }
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
                && !self
                    .children
                    .claim_terminating(&self.cluster.claim_name(&pod))
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
        let learners: Vec<&MemberInPod> = members.iter().filter(|m| m.member.is_learner).collect();
        if !learners.is_empty() {
            // Every member on --max-learners: the next learner joins while this one catches
            // up, so etcd's 5 s wait after a promotion is not paid once per member
            // (children::MAX_LEARNERS says why).
            if members.len() < size
                && !self.version_blocked
                && learners.len() < children::MAX_LEARNERS
                && self.parallel_learners(&members)
            {
                return self.grow(etcd, contact, &list, &members);
            }
            for learner in learners {
                let pod = learner
                    .pod
                    .clone()
                    .unwrap_or_else(|| learner.member.name.clone());
                if !learner.member.is_started() {
                    self.progressing(
                        "AddingMember",
                        format!("waiting for learner {pod} to start"),
                    );
                    continue;
                }
                // Promotion fails until the learner has caught up with the leader's log:
                // that is the normal "not yet", retried on the next reconcile.
                match etcd.member_promote(contact, learner.member.id) {
                    Ok(after) => {
                        self.event(
                            EventType::Normal,
                            "MemberPromoted",
                            format!("promoted learner {pod} to voting member"),
                        );
                        self.progressing("AddingMember", format!("promoted {pod}"));
                        return after;
                    }
                    Err(e) => {
                        self.progressing(
                            "AddingMember",
                            format!("learner {pod} is catching up: {e}"),
                        );
                    }
                }
            }
            return list;
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
            // etcd answered and accepted spec.version against the version it runs.
            if !self.version_blocked {
                self.reapply_unpullable_images(Some(&self.spec.version));
            }
            self.progressing(
                "WaitingForMembers",
                format!("members not Ready: {}", not_ready.join(", ")),
            );
            return list;
        }
        self.upgrade(etcd, &members, leader);
        list
    }

    /// Why learner `m` can never start, if it cannot: it has not started, and its pod
    /// was created for a membership that has changed since (etcd compares `--initial-cluster`
    /// with the running cluster's members and refuses to join on any difference: "member
    /// count is unequal", "PeerURLs: no match found"), or its pod keeps crashing or failed.
    /// A started learner runs from its data directory and ignores these flags.
    fn stuck_learner(&self, m: &MemberInPod, list: &MemberList) -> Option<StuckLearner> {
        if !m.member.is_learner || m.member.is_started() {
            return None;
        }
        let pod = self.children.pod(m.pod.as_deref()?)?;
        if pod.terminating {
            return None;
        }
        let why = if pod.is_gone() {
            format!("its pod {} failed before it started", pod.name)
        } else if let Some(joined) = initial_cluster_urls(pod.args(ETCD_CONTAINER))
            && joined != sorted_urls(self.initial_cluster(&list.members))
        {
            format!(
                "its pod {} was created to join {} but the members are now {}: etcd refuses to start it",
                pod.name,
                url_hosts(&joined),
                url_hosts(&sorted_urls(self.initial_cluster(&list.members)))
            )
        } else if crash_looping(pod, self.now) {
            format!(
                "its pod {} has been crashing for over {CRASH_LOOP_SECONDS} s ({} restarts) without ever starting",
                pod.name,
                pod.restarts(ETCD_CONTAINER)
            )
        } else {
            return None;
        };
        Some(StuckLearner {
            id: m.member.id,
            pod: pod.name.clone(),
            why,
        })
    }

    /// `member remove` of a learner that can never start, then its pod and claim: a
    /// learner holds no vote, so this never touches the quorum, and a fresh member is added
    /// in its place by a later reconcile.
    fn remove_stuck_learner(
        &mut self,
        etcd: &mut impl EtcdApi,
        contact: &str,
        stuck: StuckLearner,
        list: &MemberList,
    ) -> MemberList {
        let StuckLearner { id, pod, why } = stuck;
        match etcd.member_remove(contact, id) {
            Ok(after) => {
                self.delete_member_pod(&pod);
                self.event(
                    EventType::Warning,
                    "LearnerRemoved",
                    format!(
                        "removed learner {pod} (ID {id:x}): {why}; a fresh member takes its place"
                    ),
                );
                self.progressing("ReplacingMember", format!("removed learner {pod}: {why}"));
                after
            }
            Err(e) => {
                self.progressing(
                    "ReplacingMember",
                    format!(
                        "learner {pod} can never start ({why}); removing it failed, retrying: {e}"
                    ),
                );
                list.clone()
            }
        }
    }

    /// Whether another learner may join beside the current ones: every member has started
    /// and runs in a pod with `--max-learners`, since each member checks the limit itself.
    fn parallel_learners(&self, members: &[MemberInPod]) -> bool {
        members.iter().all(|m| {
            m.member.is_started()
                && m.pod
                    .as_deref()
                    .and_then(|p| self.children.pod(p))
                    .is_some_and(|p| !p.is_gone() && children::runs_parallel_learners(p))
        })
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
        // A learner catching up is not Ready yet and need not be: it holds no vote.
        let waiting: Vec<String> = members
            .iter()
            .filter(|m| {
                !m.member.is_started()
                    || m.pod
                        .as_deref()
                        .and_then(|p| self.children.pod(p))
                        .is_none_or(|p| (!p.ready && !m.member.is_learner) || p.is_gone())
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
}

/// A learner that can never start, and why.
struct StuckLearner {
    id: u64,
    pod: String,
    why: String,
}

/// A member pod whose etcd keeps exiting: waiting in `CrashLoopBackOff` after at least
/// [`CRASH_LOOP_RESTARTS`] restarts, and not Ready for [`CRASH_LOOP_SECONDS`] (its `Ready`
/// condition's last change). Without that time it cannot be told from a transient fault.
fn crash_looping(pod: &ObservedPod, now: Timestamp) -> bool {
    !pod.ready
        && pod.waiting_reason(ETCD_CONTAINER) == Some("CrashLoopBackOff")
        && pod.restarts(ETCD_CONTAINER) >= CRASH_LOOP_RESTARTS
        && pod
            .ready_changed_at()
            .and_then(parse_rfc3339)
            .is_some_and(|since| now.seconds - since >= CRASH_LOOP_SECONDS)
}

/// The peer URLs of a member pod's `--initial-cluster`, sorted; `None` without the flag.
fn initial_cluster_urls(args: &[String]) -> Option<Vec<String>> {
    let value = args
        .iter()
        .find_map(|a| a.strip_prefix("--initial-cluster="))?;
    Some(sorted_urls(value.split(',').filter_map(|entry| {
        let (name, url) = entry.split_once('=')?;
        Some((name.to_owned(), url.to_owned()))
    })))
}

/// The URLs of `(name, peer URL)` pairs, sorted: etcd matches members by their peer URLs.
fn sorted_urls(members: impl IntoIterator<Item = (String, String)>) -> Vec<String> {
    let mut urls: Vec<String> = members.into_iter().map(|(_, url)| url).collect();
    urls.sort();
    urls
}

/// `ex-0, ex-1`: the pods behind peer URLs, for a message.
fn url_hosts(urls: &[String]) -> String {
    urls.iter()
        .map(|url| {
            let rest = url.split_once("://").map_or(url.as_str(), |(_, rest)| rest);
            rest.split(['.', ':', '/']).next().unwrap_or(rest)
        })
        .collect::<Vec<_>>()
        .join(", ")
}
