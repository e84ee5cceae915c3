//! The etcd plugin's domain metrics: members, learners, the leader and its changes, the
//! database size and the backups, as each decision found them. The host exports them per
//! EtcdCluster as `policy_host_plugin_etcd_<name>` (counters with `_total`).
//!
//! Every value comes from the decision's inputs and its new status: the plugin keeps no memory,
//! so an event is counted by comparing the status it recorded last with the one it writes now
//! (the leader it names, the backup's outcome). The host adds a counter only once the decision
//! is carried out, status included, so the next decision compares against what this one wrote
//! and counts nothing twice.

use policy_host_sdk::metrics::{Counter, Gauge, Metric, Sample};

use crate::etcd_api::EndpointStatus;
use crate::schedule::parse_rfc3339;
use crate::spec::EtcdClusterStatus;

/// Members in etcd's member list, voters and learners.
pub const MEMBERS: Gauge = Gauge::new(
    "members",
    "Members in etcd's member list, voters and learners",
);
/// Voting members that serve requests (etcd started, pod Ready).
pub const MEMBERS_READY: Gauge = Gauge::new(
    "members_ready",
    "Voting members that serve requests (etcd started, pod Ready)",
);
/// Members the spec asks for.
pub const MEMBERS_DESIRED: Gauge =
    Gauge::new("members_desired", "Members the spec asks for (spec.size)");
/// Learners: members added and not yet promoted.
pub const LEARNERS: Gauge = Gauge::new(
    "learners",
    "Members that are learners (added, not yet promoted to voters)",
);
/// 1 when the member asked knows a leader.
pub const HAS_LEADER: Gauge = Gauge::new(
    "has_leader",
    "1 when the member the plugin asked knows a leader, 0 when it knows none or no member answered",
);
/// Leader changes the plugin observed.
pub const LEADER_CHANGES: Counter = Counter::new(
    "leader_changes",
    "Times the plugin found another leader than the one its status named (status.leader)",
);
/// Size of the database file of the member asked.
pub const DB_SIZE: Gauge = Gauge::new(
    "db_size_bytes",
    "Size of the database file of the member the plugin asked (dbSize)",
);
/// Bytes of that file in use.
pub const DB_SIZE_IN_USE: Gauge = Gauge::new(
    "db_size_in_use_bytes",
    "Bytes of the database file in use (dbSizeInUse); the rest is what a defragmentation frees",
);
/// Snapshots finished, by outcome.
pub const BACKUPS: Counter = Counter::new(
    "backups",
    "Snapshots finished, by outcome (succeeded: verified and listed; failed)",
)
.labelled(&["outcome"]);
/// When the newest snapshot succeeded.
pub const BACKUP_LAST_SUCCESS: Gauge = Gauge::new(
    "backup_last_success_timestamp_seconds",
    "When the last snapshot succeeded, in Unix seconds (status.backup.lastSuccessTime)",
);
/// 1 while the last snapshot failed.
pub const BACKUP_FAILING: Gauge = Gauge::new(
    "backup_failing",
    "1 while the last snapshot failed (status.backup.phase Failed), 0 once one succeeded",
);

/// Every metric the plugin declares.
pub fn declared() -> Vec<Metric> {
    vec![
        Metric::Gauge(&MEMBERS),
        Metric::Gauge(&MEMBERS_READY),
        Metric::Gauge(&MEMBERS_DESIRED),
        Metric::Gauge(&LEARNERS),
        Metric::Gauge(&HAS_LEADER),
        Metric::Counter(&LEADER_CHANGES),
        Metric::Gauge(&DB_SIZE),
        Metric::Gauge(&DB_SIZE_IN_USE),
        Metric::Counter(&BACKUPS),
        Metric::Gauge(&BACKUP_LAST_SUCCESS),
        Metric::Gauge(&BACKUP_FAILING),
    ]
}

/// What one decision knew, for its metrics.
pub struct Seen<'a> {
    /// The status the decision started from.
    pub before: &'a EtcdClusterStatus,
    /// The status it writes.
    pub after: &'a EtcdClusterStatus,
    /// `spec.size`.
    pub desired: usize,
    /// What the member asked said of itself, when a member answered.
    pub endpoint: Option<&'a EndpointStatus>,
}

/// The samples of one decision.
pub fn report(seen: &Seen<'_>) -> Vec<Sample> {
    let Seen {
        before,
        after,
        desired,
        endpoint,
    } = seen;
    let count = |n: usize| n as f64;
    let voters_ready = after
        .etcd_members
        .iter()
        .filter(|m| !m.learner && m.ready)
        .count();
    let learners = after.etcd_members.iter().filter(|m| m.learner).count();
    let mut samples = vec![
        Sample::gauge(&MEMBERS, &[], count(after.etcd_members.len())),
        Sample::gauge(&MEMBERS_READY, &[], count(voters_ready)),
        Sample::gauge(&MEMBERS_DESIRED, &[], count(*desired)),
        Sample::gauge(&LEARNERS, &[], count(learners)),
        Sample::gauge(
            &HAS_LEADER,
            &[],
            if endpoint.is_some_and(|e| e.leader != 0) {
                1.0
            } else {
                0.0
            },
        ),
    ];
    if let Some(endpoint) = endpoint {
        samples.push(Sample::gauge(&DB_SIZE, &[], endpoint.db_size as f64));
        samples.push(Sample::gauge(
            &DB_SIZE_IN_USE,
            &[],
            endpoint.db_size_in_use as f64,
        ));
    }
    if let (Some(was), Some(is)) = (&before.leader, &after.leader)
        && was != is
    {
        samples.push(Sample::count(&LEADER_CHANGES, &[], 1));
    }
    if let Some(backup) = &after.backup {
        let last = before.backup.as_ref();
        let succeeded_now = backup.phase == "Succeeded"
            && backup.last_success_time.is_some()
            && last.and_then(|b| b.last_success_time.as_ref()) != backup.last_success_time.as_ref();
        let failed_now = backup.phase == "Failed"
            && last.is_none_or(|b| {
                b.phase != "Failed"
                    || b.message != backup.message
                    || b.trigger != backup.trigger
                    || b.last_scheduled_time != backup.last_scheduled_time
            });
        if succeeded_now {
            samples.push(Sample::count(&BACKUPS, &["succeeded"], 1));
        }
        if failed_now {
            samples.push(Sample::count(&BACKUPS, &["failed"], 1));
        }
        if let Some(at) = backup.last_success_time.as_deref().and_then(parse_rfc3339) {
            samples.push(Sample::gauge(&BACKUP_LAST_SUCCESS, &[], at as f64));
        }
        samples.push(Sample::gauge(
            &BACKUP_FAILING,
            &[],
            if backup.phase == "Failed" { 1.0 } else { 0.0 },
        ));
    }
    samples
}

#[cfg(test)]
mod tests {
    use policy_host_sdk::metrics::{SampleValue, check};

    use super::*;
    use crate::spec::{BackupStatus, MemberStatus};

    fn member(name: &str, ready: bool, learner: bool) -> MemberStatus {
        MemberStatus {
            name: name.into(),
            id: "1".into(),
            ready,
            learner,
        }
    }

    fn endpoint(leader: u64) -> EndpointStatus {
        EndpointStatus {
            version: "3.6.16".into(),
            member_id: 1,
            leader,
            is_learner: false,
            errors: Vec::new(),
            revision: 10,
            db_size: 4096,
            db_size_in_use: 2048,
        }
    }

    fn value(samples: &[Sample], name: &str, outcome: Option<&str>) -> Option<SampleValue> {
        samples
            .iter()
            .find(|s| s.name == name && outcome.is_none_or(|o| s.label("outcome") == Some(o)))
            .map(|s| s.value)
    }

    fn backup(phase: &str, success: Option<&str>, message: Option<&str>) -> BackupStatus {
        BackupStatus {
            phase: phase.into(),
            last_success_time: success.map(String::from),
            message: message.map(String::from),
            ..BackupStatus::default()
        }
    }

    #[test]
    fn members_learners_and_the_leader_are_what_the_decision_found() {
        let before = EtcdClusterStatus::default();
        let after = EtcdClusterStatus {
            etcd_members: vec![
                member("ex-0", true, false),
                member("ex-1", false, false),
                member("ex-2", false, true),
            ],
            ..EtcdClusterStatus::default()
        };
        let seen = endpoint(7);
        let samples = report(&Seen {
            before: &before,
            after: &after,
            desired: 3,
            endpoint: Some(&seen),
        });
        assert_eq!(check(&declared(), &samples), Ok(()));
        for (name, expected) in [
            ("members", 3.0),
            ("members_ready", 1.0),
            ("members_desired", 3.0),
            ("learners", 1.0),
            ("has_leader", 1.0),
            ("db_size_bytes", 4096.0),
            ("db_size_in_use_bytes", 2048.0),
        ] {
            assert_eq!(
                value(&samples, name, None),
                Some(SampleValue::Gauge(expected)),
                "{name}"
            );
        }
        // No member answered: no leader known, no database size.
        let unreachable = report(&Seen {
            before: &before,
            after: &after,
            desired: 3,
            endpoint: None,
        });
        assert_eq!(
            value(&unreachable, "has_leader", None),
            Some(SampleValue::Gauge(0.0))
        );
        assert_eq!(value(&unreachable, "db_size_bytes", None), None);
    }

    /// Each row: the leader and backup the status named before and after the decision, and
    /// what the decision counts.
    #[test]
    fn events_are_counted_once_from_the_status_before_and_after() {
        type Row = (
            &'static str,
            (Option<&'static str>, Option<BackupStatus>),
            (Option<&'static str>, Option<BackupStatus>),
            (Option<u64>, Option<u64>, Option<u64>),
        );
        let ok = |at: &str| backup("Succeeded", Some(at), None);
        let rows: Vec<Row> = vec![
            (
                "a new leader",
                (Some("ex-0"), None),
                (Some("ex-1"), None),
                (Some(1), None, None),
            ),
            (
                "the same leader",
                (Some("ex-0"), None),
                (Some("ex-0"), None),
                (None, None, None),
            ),
            (
                "the first leader recorded is no change",
                (None, None),
                (Some("ex-0"), None),
                (None, None, None),
            ),
            (
                "a snapshot succeeded",
                (None, Some(ok("2026-11-28T06:00:00Z"))),
                (None, Some(ok("2026-11-28T07:00:00Z"))),
                (None, Some(1), None),
            ),
            (
                "the same success again",
                (None, Some(ok("2026-11-28T06:00:00Z"))),
                (None, Some(ok("2026-11-28T06:00:00Z"))),
                (None, None, None),
            ),
            (
                "a snapshot failed",
                (None, Some(ok("2026-11-28T06:00:00Z"))),
                (
                    None,
                    Some(backup(
                        "Failed",
                        Some("2026-11-28T06:00:00Z"),
                        Some("disk full"),
                    )),
                ),
                (None, None, Some(1)),
            ),
            (
                "the same failure again",
                (None, Some(backup("Failed", None, Some("disk full")))),
                (None, Some(backup("Failed", None, Some("disk full")))),
                (None, None, None),
            ),
        ];
        for (situation, was, is, (leaders, succeeded, failed)) in rows {
            let before = EtcdClusterStatus {
                leader: was.0.map(String::from),
                backup: was.1,
                ..EtcdClusterStatus::default()
            };
            let after = EtcdClusterStatus {
                leader: is.0.map(String::from),
                backup: is.1,
                ..EtcdClusterStatus::default()
            };
            let samples = report(&Seen {
                before: &before,
                after: &after,
                desired: 1,
                endpoint: None,
            });
            assert_eq!(check(&declared(), &samples), Ok(()), "{situation}");
            assert_eq!(
                value(&samples, "leader_changes", None),
                leaders.map(SampleValue::Counter),
                "{situation}: leader changes"
            );
            assert_eq!(
                value(&samples, "backups", Some("succeeded")),
                succeeded.map(SampleValue::Counter),
                "{situation}: succeeded"
            );
            assert_eq!(
                value(&samples, "backups", Some("failed")),
                failed.map(SampleValue::Counter),
                "{situation}: failed"
            );
        }
    }

    #[test]
    fn the_backup_gauges_say_when_the_last_success_was_and_whether_the_last_failed() {
        let before = EtcdClusterStatus::default();
        let after = EtcdClusterStatus {
            backup: Some(backup(
                "Failed",
                Some("1970-01-01T00:01:40Z"),
                Some("no space"),
            )),
            ..EtcdClusterStatus::default()
        };
        let samples = report(&Seen {
            before: &before,
            after: &after,
            desired: 1,
            endpoint: None,
        });
        assert_eq!(
            value(&samples, "backup_last_success_timestamp_seconds", None),
            Some(SampleValue::Gauge(100.0))
        );
        assert_eq!(
            value(&samples, "backup_failing", None),
            Some(SampleValue::Gauge(1.0))
        );
    }
}
