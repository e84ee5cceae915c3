//! Decision tables of the EtcdRestore plugin, on observations built by hand (pure logic;
//! `tests/e2e/tests/suites/etcd_backup_restore.rs` runs the real thing).

use policy_host_sdk::contract::{Action, Decision, EventType};
use policy_host_sdk::testing::observation;
use serde_json::{Value, json};

use super::reconcile;

fn restore(spec: Value, status: Value) -> Value {
    json!({
        "apiVersion": "etcd.database.coreos.com/v1beta2", "kind": "EtcdRestore",
        "metadata": {"name": "back", "namespace": "prod", "generation": 1},
        "spec": spec, "status": status,
    })
}

fn classic_spec() -> Value {
    json!({
        "etcdCluster": {"name": "example-etcd-cluster"},
        "backupStorageType": "S3",
        "s3": {"path": "etcd-backups/prod/etcd.backup", "awsSecret": "aws"},
    })
}

fn decide(parent: Value, cluster: Option<Value>) -> Decision {
    let mut builder = observation(parent);
    if let Some(cluster) = cluster {
        builder = builder.child(&guest_etcd_core::target_kind(), cluster);
    }
    reconcile(&builder.build()).expect("decides")
}

fn applied(decision: &Decision) -> Option<&Value> {
    decision.actions.iter().find_map(|a| match a {
        Action::Apply(o) => Some(o),
        _ => None,
    })
}

fn status(decision: &Decision) -> Option<&Value> {
    decision.actions.iter().find_map(|a| match a {
        Action::SetStatus(s) => Some(s),
        _ => None,
    })
}

fn events(decision: &Decision) -> Vec<(EventType, String)> {
    decision
        .actions
        .iter()
        .filter_map(|a| match a {
            Action::RecordEvent(e) => Some((e.event_type, e.reason.clone())),
            _ => None,
        })
        .collect()
}

fn cluster(spec: Value, status: Value) -> Value {
    json!({"apiVersion": "etcd.database.coreos.com/v1beta2", "kind": "EtcdCluster",
           "metadata": {"name": "example-etcd-cluster"}, "spec": spec, "status": status})
}

#[test]
fn a_classic_restore_creates_the_cluster_restoring_from_s3_once_and_reports_it_running() {
    // 1. The cluster, 3 members by default, restoring from the object at AWS by default.
    let first = decide(restore(classic_spec(), json!({})), None);
    let made = applied(&first).expect("an EtcdCluster").clone();
    assert_eq!(made["kind"], "EtcdCluster");
    assert_eq!(made["metadata"]["name"], "example-etcd-cluster");
    assert_eq!(made["spec"]["size"], 3);
    assert_eq!(
        made["spec"]["restore"]["s3"],
        json!({"endpoint": "https://s3.amazonaws.com", "bucket": "etcd-backups",
               "key": "prod/etcd.backup", "credentialsSecret": "aws"})
    );
    let written = status(&first).expect("status").clone();
    assert_eq!(written["phase"], "Restoring");
    assert_eq!(written["succeeded"], false);
    assert_eq!(
        events(&first),
        [(EventType::Normal, "RestoreStarted".to_owned())]
    );

    // 2. Once it exists it is never applied again (the user's edits stay); its progress is
    // reported.
    let creating = decide(
        restore(classic_spec(), written.clone()),
        Some(cluster(
            made["spec"].clone(),
            json!({"phase": "Creating", "ready": "1/3"}),
        )),
    );
    assert!(applied(&creating).is_none());
    let waiting = status(&creating).expect("status");
    assert!(
        waiting["reason"]
            .as_str()
            .unwrap_or_default()
            .contains("phase Creating, 1/3"),
        "{waiting}"
    );

    // 3. All members ready: succeeded, once.
    let running = decide(
        restore(classic_spec(), written.clone()),
        Some(cluster(
            made["spec"].clone(),
            json!({"phase": "Running", "ready": "3/3"}),
        )),
    );
    let done = status(&running).expect("status").clone();
    assert_eq!(
        (done["succeeded"].clone(), done["phase"].clone()),
        (json!(true), json!("Succeeded"))
    );
    assert!(done.get("reason").is_none(), "{done}");
    assert_eq!(
        events(&running),
        [(EventType::Normal, "RestoreSucceeded".to_owned())]
    );

    // 4. Done: a later degraded or deleted cluster is not restored again.
    let later = decide(
        restore(classic_spec(), done.clone()),
        Some(cluster(
            made["spec"].clone(),
            json!({"phase": "Scaling", "ready": "2/3"}),
        )),
    );
    assert!(later.actions.is_empty(), "{:?}", later.actions);
    let gone = decide(restore(classic_spec(), done), None);
    assert!(applied(&gone).is_none());
    let note = status(&gone).expect("status");
    assert_eq!(note["conditions"][0]["reason"], "ClusterDeleted");
}

#[test]
fn the_cluster_spec_is_taken_as_written_and_checked_by_the_etcd_plugin_s_rules() {
    let mut spec = classic_spec();
    spec["s3"]["endpoint"] = json!("http://minio.backup:9000");
    spec["clusterSpec"] = json!({"size": 1, "version": "3.5.21"});
    let made = applied(&decide(restore(spec, json!({})), None))
        .expect("cluster")
        .clone();
    assert_eq!(made["spec"]["size"], 1);
    assert_eq!(made["spec"]["version"], "3.5.21");
    assert_eq!(
        made["spec"]["restore"]["s3"]["endpoint"],
        "http://minio.backup:9000"
    );
}

#[test]
fn a_cluster_that_fails_is_reported_in_its_own_words() {
    let written = status(&decide(restore(classic_spec(), json!({})), None))
        .expect("status")
        .clone();
    let failed = decide(
        restore(classic_spec(), written),
        Some(cluster(
            json!({"size": 3}),
            json!({"phase": "Failed", "ready": "0/3",
            "conditions": [{"type": "Degraded", "status": "True", "reason": "RestoreFailed",
                            "message": "downloading s3://etcd-backups/prod/etcd.backup failed: mc cp exit code 1"}]}),
        )),
    );
    let reported = status(&failed).expect("status");
    assert_eq!(reported["phase"], "Failed");
    assert!(
        reported["reason"]
            .as_str()
            .unwrap_or_default()
            .contains("mc cp exit code 1"),
        "{reported}"
    );
    assert_eq!(
        events(&failed),
        [(EventType::Warning, "RestoreFailed".to_owned())]
    );
}

#[test]
fn specs_that_cannot_be_honoured_are_refused_naming_the_field() {
    let with = |path: &str, value: Value| {
        let mut spec = classic_spec();
        let mut at = &mut spec;
        let parts: Vec<&str> = path.split('.').collect();
        for part in &parts[..parts.len() - 1] {
            at = &mut at[*part];
        }
        at[parts[parts.len() - 1]] = value;
        spec
    };
    let cases: Vec<(&str, Value, &str)> = vec![
        (
            "no cluster name",
            with("etcdCluster.name", json!("")),
            "spec.etcdCluster.name",
        ),
        (
            "classic GCS",
            with("gcs", json!({"path": "b/o"})),
            "spec.gcs",
        ),
        (
            "ABS type",
            with("backupStorageType", json!("ABS")),
            "spec.backupStorageType \"ABS\"",
        ),
        (
            "path without object",
            with("s3.path", json!("bucket")),
            "spec.s3.path",
        ),
        (
            "restore set by hand",
            with("clusterSpec", json!({"restore": {"claimName": "x"}})),
            "spec.clusterSpec.restore",
        ),
        (
            "a size the etcd plugin refuses",
            with("clusterSpec", json!({"size": 0})),
            "spec.clusterSpec: size",
        ),
    ];
    for (case, spec, field) in cases {
        let decision = decide(restore(spec, json!({})), None);
        assert!(applied(&decision).is_none(), "{case}: nothing created");
        let written = status(&decision).unwrap_or_else(|| panic!("{case}: a status"));
        let reason = written["reason"].as_str().unwrap_or_default();
        assert!(reason.contains(field), "{case}: {reason}");
        assert_eq!(written["phase"], "Failed", "{case}");
        assert_eq!(
            events(&decision),
            [(EventType::Warning, "InvalidSpec".to_owned())],
            "{case}"
        );
    }
}

#[test]
fn the_documented_example_is_a_valid_classic_restore() {
    let path = concat!(
        env!("CARGO_MANIFEST_DIR"),
        "/../deploy/examples/etcd-restore.yaml"
    );
    let text = std::fs::read_to_string(path).expect("deploy/examples/etcd-restore.yaml");
    let object: crate::spec::EtcdRestoreObject = serde_yaml::from_str(&text).expect("parses");
    let valid = object.spec.validate().expect("valid");
    assert_eq!(valid.cluster, "restored-etcd-cluster");
    assert_eq!(
        valid.cluster_spec["restore"]["s3"]["key"],
        "example/etcd.backup"
    );
}
