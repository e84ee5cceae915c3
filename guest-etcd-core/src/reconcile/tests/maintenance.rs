//! `spec.maintenance` rows: etcd's compaction and quota flags on new members, defragmentation
//! one member at a time (followers first, the leader last, only when steady), and the NOSPACE
//! alarm reported or recovered from (compact, defragment, disarm).

use super::*;

const MIB: i64 = 1 << 20;

fn members() -> Vec<Child> {
    ["ex-0", "ex-1", "ex-2"].iter().map(|m| ready(m)).collect()
}

/// A steady 3-member cluster; the leader is `ex-0` (ID 1).
fn steady() -> FakeEtcd {
    FakeEtcd::with(vec![voter(1, "ex-0"), voter(2, "ex-1"), voter(3, "ex-2")])
}

fn maintained(maintenance: Value) -> Value {
    json!({"size": 3, "version": "3.6.16", "maintenance": maintenance})
}

fn no_space() -> Vec<String> {
    vec!["memberID:1 alarm:NOSPACE ".to_owned()]
}

pub(super) fn rows() -> Vec<Row> {
    vec![
        Row {
            name: "compaction and quota settings become etcd flags of new members",
            observation: observation(
                maintained(
                    json!({"autoCompactionMode": "periodic", "autoCompactionRetention": "1h",
                    "quotaBackendBytes": 16 * MIB}),
                ),
                None,
                vec![],
            ),
            etcd: FakeEtcd::default(),
            changes: &[],
            applied: &["Pod/ex-0"],
            deleted: &[],
            events: &["Normal/ClusterCreated"],
            phase: "Creating",
            requeue: Some(REQUEUE_PROGRESSING_MS),
            check: |d, _| {
                let args = pod_args(d, "ex-0");
                for flag in [
                    "--auto-compaction-mode=periodic",
                    "--auto-compaction-retention=1h",
                    "--quota-backend-bytes=16777216",
                ] {
                    assert!(args.contains(&flag.to_owned()), "{flag}: {args:?}");
                }
            },
        },
        Row {
            name: "an unknown compaction mode is an invalid spec",
            observation: observation(
                maintained(json!({"autoCompactionMode": "weekly"})),
                None,
                vec![],
            ),
            etcd: FakeEtcd::default(),
            changes: &[],
            applied: &[],
            deleted: &[],
            events: &["Warning/InvalidSpec"],
            phase: "Failed",
            requeue: None,
            check: no_check,
        },
        Row {
            name: "a fragmented follower is defragmented before the fragmented leader, one per reconcile",
            observation: observation(
                maintained(json!({"defragmentAbovePercent": 50, "defragmentMinBytes": MIB})),
                Some(recorded(&["ex-0", "ex-1", "ex-2"])),
                members(),
            ),
            etcd: FakeEtcd {
                db_sizes: vec![("ex-0", 100 * MIB, 20 * MIB), ("ex-1", 100 * MIB, 30 * MIB)],
                ..steady()
            },
            changes: &["defrag ex-1"],
            applied: &[],
            deleted: &[],
            events: &["Normal/MemberDefragmented"],
            phase: "Running",
            requeue: Some(REQUEUE_STEADY_MS),
            check: no_check,
        },
        Row {
            name: "the leader is defragmented once no follower needs it",
            observation: observation(
                maintained(json!({"defragmentAbovePercent": 50, "defragmentMinBytes": MIB})),
                Some(recorded(&["ex-0", "ex-1", "ex-2"])),
                members(),
            ),
            etcd: FakeEtcd {
                db_sizes: vec![("ex-0", 100 * MIB, 20 * MIB)],
                ..steady()
            },
            changes: &["defrag ex-0"],
            applied: &[],
            deleted: &[],
            events: &["Normal/MemberDefragmented"],
            phase: "Running",
            requeue: Some(REQUEUE_STEADY_MS),
            check: no_check,
        },
        Row {
            name: "a small or barely fragmented database is left alone",
            observation: observation(
                maintained(json!({"defragmentAbovePercent": 50})),
                Some(recorded(&["ex-0", "ex-1", "ex-2"])),
                members(),
            ),
            etcd: FakeEtcd {
                db_sizes: vec![("ex-0", 10 * MIB, 2 * MIB), ("ex-1", 100 * MIB, 90 * MIB)],
                ..steady()
            },
            changes: &[],
            applied: &[],
            deleted: &[],
            events: &[],
            phase: "Running",
            requeue: Some(REQUEUE_STEADY_MS),
            check: no_check,
        },
        Row {
            name: "no defragmentation while the cluster is changing",
            observation: observation(
                json!({"size": 5, "version": "3.6.16", "maintenance": {"defragmentAbovePercent": 50, "defragmentMinBytes": MIB}}),
                Some(recorded(&["ex-0", "ex-1", "ex-2"])),
                members(),
            ),
            etcd: FakeEtcd {
                db_sizes: vec![("ex-1", 100 * MIB, 10 * MIB)],
                ..steady()
            },
            changes: &["add http://ex-3.ex.ns.svc:2380 learner=true"],
            applied: &["Pod/ex-3"],
            deleted: &[],
            events: &["Normal/MemberAdded"],
            phase: "Scaling",
            requeue: Some(REQUEUE_ADDING_MS),
            check: no_check,
        },
        Row {
            name: "NOSPACE without recovery is reported with what to do, and nothing is touched",
            observation: observation(
                maintained(json!({"quotaBackendBytes": 16 * MIB})),
                Some(recorded(&["ex-0", "ex-1", "ex-2"])),
                members(),
            ),
            etcd: FakeEtcd {
                alarms: no_space(),
                ..steady()
            },
            changes: &[],
            applied: &[],
            deleted: &[],
            events: &["Warning/NoSpace"],
            phase: "Running",
            requeue: Some(REQUEUE_STEADY_MS),
            check: |d, _| {
                let status = summarize(d).status;
                let degraded = condition(&status, "Degraded").cloned().unwrap_or_default();
                assert_eq!(degraded["reason"], "NoSpace", "{status}");
                assert!(
                    degraded["message"]
                        .as_str()
                        .is_some_and(|m| m.contains("recoverFromNoSpace")),
                    "{degraded}"
                );
            },
        },
        Row {
            name: "NOSPACE with recovery: compact, then defragment a fragmented follower",
            observation: observation(
                maintained(json!({"quotaBackendBytes": 16 * MIB, "recoverFromNoSpace": true})),
                Some(recorded(&["ex-0", "ex-1", "ex-2"])),
                members(),
            ),
            etcd: FakeEtcd {
                alarms: no_space(),
                db_sizes: vec![("ex-2", 16 * MIB, 2 * MIB)],
                ..steady()
            },
            changes: &["compact 42", "defrag ex-2"],
            applied: &[],
            deleted: &[],
            events: &["Normal/MemberDefragmented"],
            phase: "Scaling",
            requeue: Some(REQUEUE_PROGRESSING_MS),
            check: no_check,
        },
        Row {
            name: "NOSPACE with recovery and every member defragmented: the alarm is disarmed",
            observation: observation(
                maintained(json!({"quotaBackendBytes": 16 * MIB, "recoverFromNoSpace": true})),
                Some(recorded(&["ex-0", "ex-1", "ex-2"])),
                members(),
            ),
            etcd: FakeEtcd {
                alarms: no_space(),
                db_sizes: vec![
                    ("ex-0", 2 * MIB, 2 * MIB),
                    ("ex-1", 2 * MIB, 2 * MIB),
                    ("ex-2", 2 * MIB, 2 * MIB),
                ],
                ..steady()
            },
            changes: &["compact 42", "disarm"],
            applied: &[],
            deleted: &[],
            events: &["Normal/NoSpaceCleared"],
            phase: "Running",
            requeue: Some(REQUEUE_STEADY_MS),
            check: no_check,
        },
        Row {
            name: "NOSPACE with data that fills the quota even compacted: reported, not disarmed",
            observation: observation(
                maintained(json!({"quotaBackendBytes": 16 * MIB, "recoverFromNoSpace": true})),
                Some(recorded(&["ex-0", "ex-1", "ex-2"])),
                members(),
            ),
            etcd: FakeEtcd {
                alarms: no_space(),
                db_sizes: vec![
                    ("ex-0", 16 * MIB, 16 * MIB),
                    ("ex-1", 16 * MIB, 16 * MIB),
                    ("ex-2", 16 * MIB, 16 * MIB),
                ],
                ..steady()
            },
            changes: &["compact 42"],
            applied: &[],
            deleted: &[],
            events: &["Warning/NoSpace"],
            phase: "Running",
            requeue: Some(REQUEUE_STEADY_MS),
            check: no_check,
        },
    ]
}
