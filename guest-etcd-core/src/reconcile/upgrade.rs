//! Version changes: which ones etcd can make (one minor at a time, never down), and the
//! rolling upgrade that restarts one member at a time in place, the leader last.

use policy_host_sdk::pods::ObservedPod;

use super::{MemberInPod, Step};
use crate::children::{self, ETCD_CONTAINER};
use crate::etcd_api::{EtcdApi, Member};
use crate::protocol::{Action, EventType};
use crate::spec::Version;

impl Step<'_> {
    /// etcd upgrades one minor version at a time and never downgrades
    /// (<https://etcd.io/docs/v3.6/upgrades/>): refuse anything else.
    pub(super) fn check_version_change(&mut self, running: &Version) {
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

    /// Rolling upgrade (or image change): one member at a time, followers first and the
    /// leader last, each restarted in place with the new image only after every member
    /// already restarted runs the new version and is Ready.
    pub(super) fn upgrade(
        &mut self,
        etcd: &mut impl EtcdApi,
        members: &[MemberInPod],
        leader: u64,
    ) {
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
        match children::with_image(
            pod.object(),
            image,
            &self.spec.classic.labels,
            &self.spec.classic.annotations,
        ) {
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
}
