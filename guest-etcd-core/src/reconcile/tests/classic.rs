//! Rows for the classic etcd-operator's fields: each mapped onto a member pod or storage,
//! refused with what to do, or accepted and named in the `IgnoredFields` condition — never
//! dropped silently.

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
    ]
}
