//! Rows for the classic etcd-operator's fields: each mapped onto a member pod or storage,
//! refused with what to do, or accepted and named in the `IgnoredFields` condition — never
//! dropped silently; and for its status, as tools written for it read it (`members.ready`,
//! `serviceName`, `controlPaused`, `reason`, `targetVersion`).

use super::*;

/// A 3-member spec plus classic fields.
fn classic(fields: Value) -> Value {
    let mut spec = json!({"size": 3, "version": "3.6.16"});
    if let (Some(spec), Some(fields)) = (spec.as_object_mut(), fields.as_object()) {
        spec.extend(fields.clone());
    }
    spec
}

/// The seed pod the decision applied.
fn seed(d: &Decision) -> Value {
    d.actions
        .iter()
        .find_map(|a| match a {
            Action::Apply(o) if o["kind"] == "Pod" => Some(o.clone()),
            _ => None,
        })
        .unwrap_or_default()
}

fn refused(fragment: &'static str) -> fn(&Decision, &FakeEtcd) {
    // A fn pointer per fragment: the rows below name them.
    match fragment {
        "spec.TLS.static" => |d, _| assert_refused(d, "spec.TLS.static"),
        "\"app\"" => |d, _| assert_refused(d, "\"app\""),
        "ETCD_INITIAL_CLUSTER" => |d, _| assert_refused(d, "ETCD_INITIAL_CLUSTER"),
        _ => |d, _| assert_refused(d, "spec.storage"),
    }
}

fn assert_refused(d: &Decision, fragment: &str) {
    let status = summarize(d).status;
    let degraded = condition(&status, "Degraded").cloned().unwrap_or_default();
    assert_eq!(degraded["reason"], "InvalidSpec", "{status}");
    assert!(
        degraded["message"]
            .as_str()
            .is_some_and(|m| m.contains(fragment)),
        "{degraded}"
    );
    assert!(
        !d.actions.iter().any(|a| matches!(a, Action::Apply(_))),
        "a refused spec applies nothing"
    );
}

pub(super) fn rows() -> Vec<Row> {
    vec![
        Row {
            name: "classic TLS.static is refused, saying how to make the Secrets this operator reads; nothing starts in plaintext",
            observation: observation(
                classic(json!({"TLS": {"static": {
                    "member": {"peerSecret": "etcd-peer-tls", "serverSecret": "etcd-server-tls"},
                    "operatorSecret": "etcd-client-tls"}}})),
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
            check: refused("spec.TLS.static"),
        },
        Row {
            name: "classic pod.persistentVolumeClaimSpec becomes storage: a claim of its size and class",
            observation: observation(
                classic(json!({"pod": {"persistentVolumeClaimSpec": {
                    "accessModes": ["ReadWriteOnce"], "storageClassName": "fast",
                    "resources": {"requests": {"storage": "2Gi"}}}}})),
                None,
                vec![],
            ),
            etcd: FakeEtcd::default(),
            changes: &[],
            applied: &["PersistentVolumeClaim/data-ex-0", "Pod/ex-0"],
            deleted: &[],
            events: &["Normal/ClusterCreated"],
            phase: "Creating",
            requeue: Some(REQUEUE_PROGRESSING_MS),
            check: |d, _| {
                let claim = d
                    .actions
                    .iter()
                    .find_map(|a| match a {
                        Action::Apply(o) if o["kind"] == "PersistentVolumeClaim" => Some(o.clone()),
                        _ => None,
                    })
                    .unwrap_or_default();
                assert_eq!(
                    claim["spec"]["resources"]["requests"]["storage"], "2Gi",
                    "{claim}"
                );
                assert_eq!(claim["spec"]["storageClassName"], "fast", "{claim}");
            },
        },
        Row {
            name: "classic pod labels, annotations, etcdEnv, securityContext and antiAffinity reach the member pod",
            observation: observation(
                classic(json!({"pod": {
                    "labels": {"team": "storage"},
                    "annotations": {"prometheus.io/scrape": "true"},
                    "etcdEnv": [{"name": "ETCD_AUTO_COMPACTION_RETENTION", "value": "1"}],
                    "securityContext": {"runAsNonRoot": true, "runAsUser": 9000},
                    "antiAffinity": true}})),
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
                let pod = seed(d);
                assert_eq!(pod["metadata"]["labels"]["team"], "storage", "{pod}");
                assert_eq!(
                    pod["metadata"]["labels"]["app.kubernetes.io/instance"],
                    "ex"
                );
                assert_eq!(
                    pod["metadata"]["annotations"]["prometheus.io/scrape"],
                    "true"
                );
                let env = pod["spec"]["containers"][0]["env"]
                    .as_array()
                    .cloned()
                    .unwrap_or_default();
                assert!(
                    env.iter().any(|e| e["name"] == "ETCD_AUTO_COMPACTION_RETENTION" && e["value"] == "1"),
                    "{env:?}"
                );
                assert!(
                    env.iter().any(|e| e["name"] == "POD_IP"),
                    "the operator's own env stays"
                );
                assert_eq!(pod["spec"]["securityContext"]["runAsUser"], 9000);
                let term = &pod["spec"]["affinity"]["podAntiAffinity"]["requiredDuringSchedulingIgnoredDuringExecution"]
                    [0];
                assert_eq!(term["topologyKey"], "kubernetes.io/hostname", "{pod}");
                assert_eq!(
                    term["labelSelector"]["matchLabels"]["app.kubernetes.io/instance"],
                    "ex"
                );
            },
        },
        Row {
            name: "a classic pod label the operator uses is refused",
            observation: observation(
                classic(json!({"pod": {"labels": {"app": "etcd"}}})),
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
            check: refused("\"app\""),
        },
        Row {
            name: "a classic etcdEnv that would override the operator's flags is refused",
            observation: observation(
                classic(
                    json!({"pod": {"etcdEnv": [{"name": "ETCD_INITIAL_CLUSTER", "value": "x"}]}}),
                ),
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
            check: refused("ETCD_INITIAL_CLUSTER"),
        },
        Row {
            name: "classic persistentVolumeClaimSpec beside spec.storage is refused",
            observation: observation(
                classic(
                    json!({"storage": {"size": "1Gi"}, "pod": {"persistentVolumeClaimSpec": {
                    "resources": {"requests": {"storage": "2Gi"}}}}}),
                ),
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
            check: refused("spec.storage"),
        },
        Row {
            name: "classic fields with no meaning here are accepted and named, once, in IgnoredFields",
            observation: observation(
                classic(json!({"pod": {"busyboxImage": "busybox:1.28.0-glibc",
                    "DNSTimeoutInSecond": 60, "ClusterDomain": ".cluster.local"}})),
                None,
                vec![],
            ),
            etcd: FakeEtcd::default(),
            changes: &[],
            applied: &["Pod/ex-0"],
            deleted: &[],
            events: &["Normal/ClusterCreated", "Warning/ClassicFieldsIgnored"],
            phase: "Creating",
            requeue: Some(REQUEUE_PROGRESSING_MS),
            check: |d, _| {
                let status = summarize(d).status;
                let ignored = condition(&status, "IgnoredFields")
                    .cloned()
                    .unwrap_or_default();
                assert_eq!(ignored["status"], "True", "{status}");
                let message = ignored["message"].as_str().unwrap_or_default();
                for field in ["busyboxImage", "DNSTimeoutInSecond", "ClusterDomain"] {
                    assert!(message.contains(field), "{message}");
                }
            },
        },
        Row {
            name: "a steady cluster reports the classic status: ready members by pod name, the client Service and port, no target version",
            observation: observation(
                spec(3),
                Some(recorded(&["ex-0", "ex-1", "ex-2"])),
                vec![ready("ex-0"), ready("ex-1"), ready("ex-2")],
            ),
            etcd: FakeEtcd::with(vec![voter(3, "ex-2"), voter(1, "ex-0"), voter(2, "ex-1")]),
            changes: &[],
            applied: &[],
            deleted: &[],
            events: &[],
            phase: "Running",
            requeue: Some(REQUEUE_STEADY_MS),
            check: |d, _| {
                let status = summarize(d).status;
                assert_eq!(
                    status["members"],
                    json!({"ready": ["ex-0", "ex-1", "ex-2"]}),
                    "{status}"
                );
                assert_eq!(status["serviceName"], "ex-client");
                assert_eq!(status["clientPort"], 2379);
                assert_eq!(status["currentVersion"], "3.6.16");
                for absent in ["targetVersion", "reason", "controlPaused"] {
                    assert!(status.get(absent).is_none(), "{absent}: {status}");
                }
                assert_eq!(
                    status["etcdMembers"][0],
                    json!({"name": "ex-2", "id": "3", "ready": true, "learner": false}),
                    "etcd's own list keeps its IDs and roles"
                );
            },
        },
        Row {
            name: "a learner still catching up is a classic unready member, not a ready one",
            observation: observation(
                spec(3),
                Some(recorded(&["ex-0"])),
                vec![serial(ready("ex-0")), serial(ready("ex-1"))],
            ),
            etcd: FakeEtcd {
                promote_refused: true,
                ..FakeEtcd::with(vec![voter(1, "ex-0"), learner(2, "ex-1")])
            },
            changes: &["promote 2"],
            applied: &[],
            deleted: &[],
            events: &[],
            phase: "Scaling",
            requeue: Some(REQUEUE_ADDING_MS),
            check: |d, _| {
                let status = summarize(d).status;
                assert_eq!(
                    status["members"],
                    json!({"ready": ["ex-0"], "unready": ["ex-1"]}),
                    "{status}"
                );
                assert_eq!(status["ready"], "1/3");
            },
        },
        Row {
            name: "a member whose pod is not Ready is a classic unready member",
            observation: observation(
                spec(3),
                Some(recorded(&["ex-0", "ex-1", "ex-2"])),
                vec![ready("ex-0"), starting("ex-1"), ready("ex-2")],
            ),
            etcd: FakeEtcd::with(vec![voter(1, "ex-0"), voter(2, "ex-1"), voter(3, "ex-2")]),
            changes: &[],
            applied: &[],
            deleted: &[],
            events: &[],
            phase: "Scaling",
            requeue: Some(REQUEUE_PROGRESSING_MS),
            check: |d, _| {
                let status = summarize(d).status;
                assert_eq!(
                    status["members"],
                    json!({"ready": ["ex-0", "ex-2"], "unready": ["ex-1"]}),
                    "{status}"
                );
            },
        },
        Row {
            name: "an upgrade in progress reports the version it upgrades to as targetVersion",
            observation: observation(
                spec(3),
                Some(recorded(&["ex-0", "ex-1", "ex-2"])),
                vec![
                    on_image(ready("ex-0"), OLD),
                    on_image(ready("ex-1"), OLD),
                    on_image(ready("ex-2"), OLD),
                ],
            ),
            etcd: FakeEtcd {
                version: "3.5.21",
                ..FakeEtcd::with(vec![voter(1, "ex-0"), voter(2, "ex-1"), voter(3, "ex-2")])
            },
            changes: &[],
            applied: &["Pod/ex-1"],
            deleted: &[],
            events: &["Normal/MemberUpgrading"],
            phase: "Scaling",
            requeue: Some(REQUEUE_PROGRESSING_MS),
            check: |d, _| {
                let status = summarize(d).status;
                assert_eq!(status["currentVersion"], "3.5.21", "{status}");
                assert_eq!(status["targetVersion"], "3.6.16", "{status}");
            },
        },
        Row {
            name: "a paused cluster says controlPaused, as the classic operator did",
            observation: observation(
                json!({"size": 3, "version": "3.6.16", "paused": true}),
                Some(recorded(&["ex-0", "ex-1", "ex-2"])),
                vec![ready("ex-0"), ready("ex-1"), ready("ex-2")],
            ),
            etcd: FakeEtcd::with(vec![voter(1, "ex-0"), voter(2, "ex-1"), voter(3, "ex-2")]),
            changes: &[],
            applied: &[],
            deleted: &[],
            events: &["Normal/Paused"],
            phase: "Paused",
            requeue: Some(REQUEUE_STEADY_MS),
            check: |d, _| {
                let status = summarize(d).status;
                assert_eq!(status["controlPaused"], true, "{status}");
                assert_eq!(
                    status["members"]["ready"],
                    json!(["ex-0", "ex-1", "ex-2"]),
                    "{status}"
                );
            },
        },
        Row {
            name: "a spec refused before the cluster existed says why in the classic reason",
            observation: observation(spec(0), None, vec![]),
            etcd: FakeEtcd::default(),
            changes: &[],
            applied: &[],
            deleted: &[],
            events: &["Warning/InvalidSpec"],
            phase: "Failed",
            requeue: None,
            check: |d, _| {
                let status = summarize(d).status;
                let reason = status["reason"].as_str().unwrap_or_default();
                assert!(reason.starts_with("spec.size is 0"), "{status}");
            },
        },
        Row {
            name: "every member lost for good says why in the classic reason",
            observation: observation(spec(3), Some(recorded(&["ex-0", "ex-1", "ex-2"])), vec![]),
            etcd: FakeEtcd::default(),
            changes: &[],
            applied: &[],
            deleted: &[],
            events: &["Warning/ClusterLost"],
            phase: "Failed",
            requeue: Some(REQUEUE_STEADY_MS),
            check: |d, _| {
                let status = summarize(d).status;
                let degraded = condition(&status, "Degraded").cloned().unwrap_or_default();
                assert_eq!(status["reason"], degraded["message"], "{status}");
            },
        },
        Row {
            name: "a status written before etcdMembers (members as a list) still names the members to recover",
            observation: observation(
                with_storage(2),
                Some(json!({"clusterID": "777", "members": [
                    {"name": "ex-0", "id": "1", "ready": true, "learner": false},
                    {"name": "ex-1", "id": "2", "ready": true, "learner": false}]})),
                vec![claim("data-ex-0"), claim("data-ex-1")],
            ),
            etcd: FakeEtcd::default(),
            changes: &[],
            applied: &[
                "PersistentVolumeClaim/data-ex-0",
                "Pod/ex-0",
                "PersistentVolumeClaim/data-ex-1",
                "Pod/ex-1",
            ],
            deleted: &[],
            events: &[],
            phase: "Scaling",
            requeue: Some(REQUEUE_PROGRESSING_MS),
            check: |d, _| {
                let status = summarize(d).status;
                assert_eq!(
                    status["members"],
                    json!({"unready": ["ex-0", "ex-1"]}),
                    "{status}"
                );
                assert_eq!(status["etcdMembers"].as_array().map(Vec::len), Some(2));
            },
        },
    ]
}
