//! `spec.paused` rows: while paused nothing in the cluster is changed (no membership call, no
//! child written or deleted, no upgrade, no restore, no backup unless `backup.whilePaused`),
//! the status still reports what etcd says, and unpausing resumes where it stopped.

use super::*;

/// `spec` with `paused: true`.
fn paused(mut spec: Value) -> Value {
    spec["paused"] = json!(true);
    spec
}

fn three() -> FakeEtcd {
    FakeEtcd::with(vec![voter(1, "ex-0"), voter(2, "ex-1"), voter(3, "ex-2")])
}

/// Status of a cluster already recorded as paused.
fn recorded_paused(members: &[&str]) -> Value {
    let mut status = recorded(members);
    status["conditions"] = json!([{"type": "Paused", "status": "True", "reason": "Paused",
        "message": super::super::status::PAUSED_MESSAGE,
        "lastTransitionTime": "2024-05-01T11:00:00Z"}]);
    status
}

/// Nothing but the status and Events: no Apply and no Delete of any kind (not even the
/// Services), and `Paused=True` with a message that says how to resume.
fn touches_nothing(d: &Decision, _: &FakeEtcd) {
    let writes: Vec<String> = d
        .actions
        .iter()
        .map(Action::summary)
        .filter(|s| s.starts_with("apply ") || s.starts_with("delete "))
        .collect();
    assert!(writes.is_empty(), "paused but wrote {writes:?}");
    let status = summarize(d).status;
    let paused = condition(&status, "Paused").cloned().unwrap_or_default();
    assert_eq!(paused["status"], "True", "{status}");
    assert!(
        paused["message"]
            .as_str()
            .is_some_and(|m| m.contains("spec.paused") && m.contains("false")),
        "{paused}"
    );
}

pub(super) fn rows() -> Vec<Row> {
    vec![
        Row {
            name: "paused before creation: no seed pod, no Service",
            observation: observation(paused(spec(3)), None, vec![]),
            etcd: FakeEtcd::default(),
            changes: &[],
            applied: &[],
            deleted: &[],
            events: &["Normal/Paused"],
            phase: "Paused",
            requeue: Some(REQUEUE_STEADY_MS),
            check: touches_nothing,
        },
        Row {
            name: "paused while scaling up: no member add, no pod; the status still reports etcd's members",
            observation: observation(
                paused(spec(5)),
                Some(recorded_paused(&["ex-0", "ex-1", "ex-2"])),
                vec![ready("ex-0"), ready("ex-1"), ready("ex-2")],
            ),
            etcd: three(),
            changes: &[],
            applied: &[],
            deleted: &[],
            events: &[],
            phase: "Paused",
            requeue: Some(REQUEUE_STEADY_MS),
            check: |d, etcd| {
                touches_nothing(d, etcd);
                let status = summarize(d).status;
                assert_eq!(status["ready"], "3/5", "{status}");
                assert_eq!(status["etcdMembers"].as_array().map(Vec::len), Some(3));
                assert_eq!(
                    condition(&status, "Available").map(|c| c["status"].clone()),
                    Some(json!("True")),
                    "{status}"
                );
            },
        },
        Row {
            name: "paused with a failed member: not removed, not replaced",
            observation: observation(
                paused(spec(3)),
                Some(recorded_paused(&["ex-0", "ex-1", "ex-2"])),
                vec![ready("ex-0"), ready("ex-1"), failed("ex-2")],
            ),
            etcd: three(),
            changes: &[],
            applied: &[],
            deleted: &[],
            events: &[],
            phase: "Paused",
            requeue: Some(REQUEUE_STEADY_MS),
            check: touches_nothing,
        },
        Row {
            name: "paused with a new version: no member restarted",
            observation: observation(
                paused(spec(3)),
                Some(recorded_paused(&["ex-0", "ex-1", "ex-2"])),
                vec![
                    on_image(ready("ex-0"), OLD),
                    on_image(ready("ex-1"), OLD),
                    on_image(ready("ex-2"), OLD),
                ],
            ),
            etcd: FakeEtcd {
                version: "3.5.21",
                ..three()
            },
            changes: &[],
            applied: &[],
            deleted: &[],
            events: &[],
            phase: "Paused",
            requeue: Some(REQUEUE_STEADY_MS),
            check: touches_nothing,
        },
        Row {
            name: "paused with quorum lost and restoreOnQuorumLoss: nothing deleted, nothing restored",
            observation: observation(
                paused(
                    json!({"size": 3, "version": "3.6.16", "backup": {"storage": {"size": "1Gi"}, "trigger": "t1", "restoreOnQuorumLoss": true}}),
                ),
                Some(backed_up(&["ex-0", "ex-1", "ex-2"], "t1")),
                vec![starting("ex-0"), failed("ex-1"), failed("ex-2")],
            ),
            etcd: FakeEtcd {
                answering: Some(vec![]),
                ..three()
            },
            changes: &[],
            applied: &[],
            deleted: &[],
            events: &["Normal/Paused"],
            phase: "Paused",
            requeue: Some(REQUEUE_STEADY_MS),
            check: |d, etcd| {
                touches_nothing(d, etcd);
                let status = summarize(d).status;
                assert!(status.get("restoring").is_none(), "{status}");
                assert_eq!(status["clusterID"], "777", "{status}");
            },
        },
        Row {
            name: "paused with a backup trigger: no backup pod by default",
            observation: observation(
                paused(
                    json!({"size": 3, "version": "3.6.16", "backup": {"storage": {"size": "1Gi"}, "trigger": "t2"}}),
                ),
                Some(recorded_paused(&["ex-0", "ex-1", "ex-2"])),
                vec![ready("ex-0"), ready("ex-1"), ready("ex-2")],
            ),
            etcd: three(),
            changes: &[],
            applied: &[],
            deleted: &[],
            events: &[],
            phase: "Paused",
            requeue: Some(REQUEUE_STEADY_MS),
            check: touches_nothing,
        },
        Row {
            name: "paused with a backup trigger and backup.whilePaused: the backup pod starts, nothing else",
            observation: observation(
                paused(
                    json!({"size": 3, "version": "3.6.16", "backup": {"storage": {"size": "1Gi"}, "trigger": "t2", "whilePaused": true}}),
                ),
                Some(recorded_paused(&["ex-0", "ex-1", "ex-2"])),
                vec![ready("ex-0"), ready("ex-1"), failed("ex-2")],
            ),
            etcd: three(),
            changes: &[],
            applied: &["PersistentVolumeClaim/backup-ex", "Pod/ex-backup"],
            deleted: &[],
            events: &[],
            phase: "Paused",
            requeue: Some(REQUEUE_PROGRESSING_MS),
            check: |d, _| {
                let status = summarize(d).status;
                assert_eq!(
                    condition(&status, "Paused").map(|c| c["status"].clone()),
                    Some(json!("True"))
                );
            },
        },
        Row {
            name: "unpaused: Paused=False, an Event, and the scale-up resumes where it stopped",
            observation: observation(
                spec(5),
                Some(recorded_paused(&["ex-0", "ex-1", "ex-2"])),
                vec![ready("ex-0"), ready("ex-1"), ready("ex-2")],
            ),
            etcd: three(),
            changes: &["add http://ex-3.ex.ns.svc:2380 learner=true"],
            applied: &["Pod/ex-3"],
            deleted: &[],
            events: &["Normal/MemberAdded", "Normal/Resumed"],
            phase: "Scaling",
            requeue: Some(REQUEUE_ADDING_MS),
            check: |d, _| {
                let status = summarize(d).status;
                let paused = condition(&status, "Paused").cloned().unwrap_or_default();
                assert_eq!(paused["status"], "False", "{status}");
                assert_eq!(paused["reason"], "Resumed", "{status}");
            },
        },
        Row {
            name: "never paused: no Paused condition at all",
            observation: observation(
                spec(3),
                Some(recorded(&["ex-0", "ex-1", "ex-2"])),
                vec![ready("ex-0"), ready("ex-1"), ready("ex-2")],
            ),
            etcd: three(),
            changes: &[],
            applied: &[],
            deleted: &[],
            events: &[],
            phase: "Running",
            requeue: Some(REQUEUE_STEADY_MS),
            check: |d, _| {
                let status = summarize(d).status;
                assert!(condition(&status, "Paused").is_none(), "{status}");
            },
        },
    ]
}
