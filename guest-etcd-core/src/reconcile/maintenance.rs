//! Database maintenance, when etcd answers: the NOSPACE alarm (reported, or recovered from when
//! the spec allows it: compact, defragment every member, disarm), and defragmentation of a
//! member whose database file is mostly free pages, one member per reconcile, followers first
//! and the leader last, only while nothing else is going on.

use super::Step;
use crate::etcd_api::{EndpointStatus, EtcdApi, Member, MemberList};
use crate::protocol::EventType;

/// Share of free pages under which a member needs no defragmentation to give space back
/// during a NOSPACE recovery.
const RECOVERED_PERCENT: i64 = 10;

impl Step<'_> {
    pub(super) fn maintain(
        &mut self,
        etcd: &mut impl EtcdApi,
        contact: &str,
        status: Option<&EndpointStatus>,
        list: &MemberList,
        leader: u64,
    ) {
        let maintenance = &self.spec.maintenance;
        let no_space = status.is_some_and(EndpointStatus::no_space);
        if no_space && !maintenance.recover_from_no_space {
            if self.degraded.is_none() {
                self.degraded = Some((
                    "NoSpace",
                    "etcd raised NOSPACE: the database reached its quota and the cluster takes no more writes; set spec.maintenance.recoverFromNoSpace: true to let the operator compact, defragment and disarm, or run etcdctl compact, etcdctl defrag and etcdctl alarm disarm yourself (and raise spec.maintenance.quotaBackendBytes for new members if the data itself is that large)".to_owned(),
                ));
            }
            return;
        }
        if !no_space
            && (maintenance.defragment.is_none()
                || self.progress.is_some()
                || self.degraded.is_some())
        {
            return;
        }
        // Followers first, the leader last: defragmenting the leader stalls the cluster's writes
        // for as long as it takes.
        let mut members: Vec<&Member> = list.members.iter().filter(|m| m.is_started()).collect();
        members.sort_by_key(|m| (m.id == leader, m.name.clone()));
        let pods: Vec<String> = members
            .iter()
            .filter_map(|m| self.member_pod_name(m))
            .collect();
        if no_space {
            let revision = status.map_or(0, |s| s.revision);
            if let Err(e) = etcd.compact(contact, revision) {
                self.progressing(
                    "RecoveringFromNoSpace",
                    format!("compaction at revision {revision} failed, retrying: {e}"),
                );
                return;
            }
        }
        let threshold = if no_space {
            (RECOVERED_PERCENT, 0)
        } else {
            maintenance.defragment.unwrap_or((100, i64::MAX))
        };
        for pod in &pods {
            let Ok(member) = etcd.status(pod) else {
                continue;
            };
            if member.db_size < threshold.1 || member.fragmentation_percent() < threshold.0 {
                continue;
            }
            let before = member.db_size;
            match etcd.defragment(pod) {
                Ok(()) => self.event(
                    EventType::Normal,
                    "MemberDefragmented",
                    format!(
                        "defragmented member {pod}: its database file was {before} bytes, {}% free pages",
                        member.fragmentation_percent()
                    ),
                ),
                Err(e) => self.event(
                    EventType::Warning,
                    "DefragmentFailed",
                    format!("defragmenting member {pod} failed: {e}"),
                ),
            }
            if no_space {
                self.progressing("RecoveringFromNoSpace", format!("defragmented {pod}"));
            }
            return;
        }
        if !no_space {
            return;
        }
        let quota = maintenance.quota_backend_bytes.unwrap_or(2 << 30);
        if status.is_some_and(|s| s.db_size_in_use >= quota - quota / 20) {
            if self.degraded.is_none() {
                self.degraded = Some((
                    "NoSpace",
                    format!(
                        "etcd raised NOSPACE and the data itself fills the {quota} byte quota after compaction and defragmentation: delete keys, or raise spec.maintenance.quotaBackendBytes (read by member pods created afterwards)"
                    ),
                ));
            }
            return;
        }
        match etcd.disarm_no_space(contact) {
            Ok(()) => self.event(
                EventType::Normal,
                "NoSpaceCleared",
                "compacted and defragmented every member, then disarmed NOSPACE: the cluster takes writes again".to_owned(),
            ),
            Err(e) => self.progressing("RecoveringFromNoSpace", format!("disarming NOSPACE failed, retrying: {e}")),
        }
    }
}
