//! When etcd does not answer: bootstrapping a new cluster, recreating lost member pods, and
//! quorum loss (reported, and with `spec.backup.restoreOnQuorumLoss` restarted from the last
//! snapshot).

use super::{Outcome, Step};
use crate::children::{self, ClusterState, quorum};
use crate::protocol::{Action, EventType};
use crate::spec::{MemberStatus, RestoreSpec, Version};

impl Step<'_> {
    /// etcd did not answer: only what is safe without its member list.
    pub(super) fn unreachable(&mut self) -> Outcome {
        let recorded = self.observed.cluster_id.is_some() || !self.observed.etcd_members.is_empty();
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
                .etcd_members
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
            .etcd_members
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
                let claim = self.cluster.claim_name(name);
                if self.children.pod(name).is_none()
                    && self.children.has_claim(&claim)
                    && !self.children.claim_terminating(&claim)
                {
                    self.create_member_pod(name, initial.clone(), ClusterState::Existing);
                    recreated.push(name.clone());
                }
            }
        }
        let last_version = self
            .observed
            .current_version
            .as_deref()
            .and_then(Version::parse);
        self.reapply_unpullable_images(last_version.as_ref());
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
}
