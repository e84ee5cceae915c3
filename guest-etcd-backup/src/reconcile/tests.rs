//! Decision tables of the EtcdBackup plugin, on observations built by hand and a scripted
//! etcd gateway (fakes for pure-logic tests; `tests/e2e/tests/suites/etcd_backup_restore.rs` runs the
//! real thing).

use guest_etcd_core::etcd_api::{GatewayEtcdApi, HASH_KV_PATH, STATUS_PATH};
use policy_host_sdk::children::pod_kind;
use policy_host_sdk::contract::{Action, AppCallRequest, Decision, EventType, Method};
use policy_host_sdk::testing::{ScriptedAppCall, observation};
use serde_json::{Value, json};

use super::reconcile;

const NOW: i64 = 1_700_000_000;

fn backup(spec: Value, status: Value) -> Value {
    json!({
        "apiVersion": "etcd.database.coreos.com/v1beta2", "kind": "EtcdBackup",
        "metadata": {"name": "nightly", "namespace": "prod", "generation": 1},
        "spec": spec, "status": status,
    })
}

fn classic_spec() -> Value {
    json!({
        "etcdEndpoints": ["http://example-client:2379", "http://example-1.example:2379"],
        "storageType": "S3",
        "s3": {"path": "etcd-backups/prod/etcd.backup", "awsSecret": "aws",
               "endpoint": "http://minio.backup:9000", "forcePathStyle": true},
    })
}

fn decide(parent: Value, pods: Vec<Value>, app: ScriptedAppCall, at: i64) -> Decision {
    let mut builder = observation(parent).at(at);
    for pod in pods {
        builder = builder.child(&pod_kind(), pod);
    }
    let mut app = app;
    let mut etcd = GatewayEtcdApi::new(|r: &AppCallRequest| {
        policy_host_sdk::app_call::AppCall::call(&mut app, r)
    });
    reconcile(&builder.build(), &mut etcd).expect("decides")
}

fn applied_pod(decision: &Decision) -> Option<&Value> {
    decision.actions.iter().find_map(|a| match a {
        Action::Apply(pod) if pod["kind"] == "Pod" => Some(pod),
        _ => None,
    })
}

fn status(decision: &Decision) -> Option<&Value> {
    decision.actions.iter().find_map(|a| match a {
        Action::SetStatus(s) => Some(s),
        _ => None,
    })
}

fn events(decision: &Decision) -> Vec<(EventType, String, String)> {
    decision
        .actions
        .iter()
        .filter_map(|a| match a {
            Action::RecordEvent(e) => Some((e.event_type, e.reason.clone(), e.message.clone())),
            _ => None,
        })
        .collect()
}

fn deleted(decision: &Decision) -> Vec<String> {
    decision
        .actions
        .iter()
        .filter_map(|a| match a {
            Action::Delete { name, .. } => Some(name.clone()),
            _ => None,
        })
        .collect()
}

fn container<'v>(pod: &'v Value, list: &str, name: &str) -> &'v Value {
    pod["spec"][list]
        .as_array()
        .and_then(|l| l.iter().find(|c| c["name"] == name))
        .unwrap_or(&Value::Null)
}

/// The snapshot Pod as the plugin made it, now at `state` (`running`: the verifying etcd is
/// Ready; `failed:<step>`: that init step exited 1).
fn pod_at(made: &Value, state: &str) -> Value {
    let mut pod = made.clone();
    pod["metadata"]["creationTimestamp"] = json!("2023-11-14T22:13:20Z");
    let done = |name: &str, code: i64| {
        json!({"name": name, "state": {"terminated": {"exitCode": code,
            "finishedAt": "2023-11-14T22:13:25Z", "message": if code == 0 { "" } else { "Access Denied." }}}})
    };
    match state {
        "running" => {
            pod["status"] = json!({
                "phase": "Running",
                "conditions": [{"type": "Ready", "status": "True", "lastTransitionTime": "2023-11-14T22:13:30Z"}],
                "initContainerStatuses": [done("save", 0), done("restore", 0), done("upload", 0)],
            });
        }
        "failed:upload" => {
            pod["status"] = json!({
                "phase": "Failed",
                "initContainerStatuses": [done("save", 0), done("restore", 0), done("upload", 1)],
            });
        }
        _ => pod["status"] = json!({"phase": "Pending"}),
    }
    pod
}

fn serving_etcd() -> ScriptedAppCall {
    ScriptedAppCall::new()
        .respond(
            Method::Post,
            "nightly-snapshot",
            STATUS_PATH,
            200,
            json!({"version": "3.6.16", "dbSize": "20480", "header": {"revision": "42"},
                   "leader": "1", "raftIndex": "3"}),
        )
        .respond(
            Method::Post,
            "nightly-snapshot",
            HASH_KV_PATH,
            200,
            json!({"header": {"revision": "42"}, "hash": 4178063679u32, "compact_revision": "-1"}),
        )
}

#[test]
fn a_classic_backup_takes_one_snapshot_from_the_first_endpoint_verifies_uploads_and_reports_it() {
    // 1. Nothing yet: the snapshot Pod, saving from the first endpoint, uploading to the path.
    let first = decide(
        backup(classic_spec(), json!({})),
        vec![],
        ScriptedAppCall::new(),
        NOW,
    );
    let made = applied_pod(&first).expect("a snapshot pod").clone();
    assert_eq!(made["metadata"]["name"], "nightly-snapshot");
    let save = container(&made, "initContainers", "save");
    assert_eq!(
        save["env"][0],
        json!({"name": "ETCDCTL_ENDPOINTS", "value": "http://example-client:2379"})
    );
    let steps: Vec<&str> = made["spec"]["initContainers"]
        .as_array()
        .into_iter()
        .flatten()
        .filter_map(|c| c["name"].as_str())
        .collect();
    assert_eq!(
        steps,
        ["save", "restore", "upload"],
        "no prune without maxBackups"
    );
    let upload = container(&made, "initContainers", "upload");
    assert_eq!(upload["command"][5], "s3/etcd-backups/prod/etcd.backup");
    assert_eq!(made["spec"]["activeDeadlineSeconds"], 3600);
    assert_eq!(status(&first).expect("status")["phase"], "Running");

    // 2. The verifying etcd serves it: revision, size, hash and place in status, an Event.
    let running = json!({"phase": "Running", "succeeded": false, "observedGeneration": 1});
    let served = decide(
        backup(classic_spec(), running.clone()),
        vec![pod_at(&made, "running")],
        serving_etcd(),
        NOW + 15,
    );
    let written = status(&served).expect("status").clone();
    assert_eq!(written["succeeded"], true, "{written}");
    assert_eq!(written["etcdRevision"], 42);
    assert_eq!(written["etcdVersion"], "3.6.16");
    assert_eq!(written["size"], 20480);
    assert_eq!(written["hashKV"], 4178063679u32);
    assert_eq!(written["location"], "s3://etcd-backups/prod/etcd.backup");
    assert_eq!(written["lastSuccessDate"], "2023-11-14T22:13:25Z");
    assert_eq!(written["trigger"], "");
    assert!(
        deleted(&served).is_empty(),
        "the pod stays until its result is observed"
    );
    let events = events(&served);
    assert!(
        events.iter().any(|(t, r, m)| *t == EventType::Normal
            && r == "BackupSucceeded"
            && m.contains("revision 42")),
        "{events:?}"
    );

    // 3. The result observed: the Pod goes, and no other snapshot is taken.
    let after = decide(
        backup(classic_spec(), written.clone()),
        vec![pod_at(&made, "running")],
        ScriptedAppCall::new(),
        NOW + 16,
    );
    assert_eq!(deleted(&after), ["nightly-snapshot"]);
    let idle = decide(
        backup(classic_spec(), written.clone()),
        vec![],
        ScriptedAppCall::new(),
        NOW + 17,
    );
    assert!(idle.actions.is_empty(), "{:?}", idle.actions);

    // 4. A new trigger takes another one.
    let mut again = classic_spec();
    again["trigger"] = json!("2023-11-15");
    let next = decide(
        backup(again, written),
        vec![],
        ScriptedAppCall::new(),
        NOW + 20,
    );
    let pod = applied_pod(&next).expect("another snapshot pod");
    assert_eq!(
        pod["metadata"]["annotations"]["etcd.database.coreos.com/backup-trigger"],
        "2023-11-15"
    );
}

#[test]
fn a_failed_upload_is_reported_with_what_to_check_and_not_retried_in_a_loop() {
    let made = applied_pod(&decide(
        backup(classic_spec(), json!({})),
        vec![],
        ScriptedAppCall::new(),
        NOW,
    ))
    .expect("pod")
    .clone();
    let failed = decide(
        backup(classic_spec(), json!({"phase": "Running"})),
        vec![pod_at(&made, "failed:upload")],
        ScriptedAppCall::new(),
        NOW + 10,
    );
    let written = status(&failed).expect("status").clone();
    assert_eq!(written["succeeded"], false);
    assert_eq!(written["phase"], "Failed");
    let reason = written["reason"].as_str().unwrap_or_default();
    assert!(
        reason.contains("mc cp exit code 1: Access Denied."),
        "{reason}"
    );
    assert!(
        reason.contains("Secret aws") && reason.contains("bucket etcd-backups"),
        "{reason}"
    );
    assert_eq!(written["conditions"][0]["reason"], "BackupFailed");
    assert!(
        events(&failed)
            .iter()
            .any(|(t, r, _)| *t == EventType::Warning && r == "BackupFailed")
    );
    // Recorded: the Pod goes and the same trigger does not start another.
    let after = decide(
        backup(classic_spec(), written.clone()),
        vec![pod_at(&made, "failed:upload")],
        ScriptedAppCall::new(),
        NOW + 11,
    );
    assert_eq!(deleted(&after), ["nightly-snapshot"]);
    assert!(applied_pod(&after).is_none());
    let idle = decide(
        backup(classic_spec(), written),
        vec![],
        ScriptedAppCall::new(),
        NOW + 12,
    );
    assert!(applied_pod(&idle).is_none());
}

#[test]
fn a_pod_with_no_result_past_the_timeout_fails() {
    let mut spec = classic_spec();
    spec["backupPolicy"] = json!({"timeoutInSecond": 120});
    let made = applied_pod(&decide(
        backup(spec.clone(), json!({})),
        vec![],
        ScriptedAppCall::new(),
        NOW,
    ))
    .expect("pod")
    .clone();
    assert_eq!(made["spec"]["activeDeadlineSeconds"], 120);
    let pending = pod_at(&made, "pending");
    let early = decide(
        backup(spec.clone(), json!({"phase": "Running"})),
        vec![pending.clone()],
        ScriptedAppCall::new(),
        NOW + 60,
    );
    assert!(status(&early).is_none_or(|s| s["phase"] == "Running"));
    let late = decide(
        backup(spec, json!({"phase": "Running"})),
        vec![pending],
        ScriptedAppCall::new(),
        NOW + 121,
    );
    let written = status(&late).expect("status");
    assert_eq!(written["phase"], "Failed");
    assert!(
        written["reason"]
            .as_str()
            .unwrap_or_default()
            .contains("120 s"),
        "{written}"
    );
}

#[test]
fn scheduled_snapshots_are_named_by_their_due_time_and_the_oldest_beyond_max_backups_removed() {
    let mut spec = classic_spec();
    spec["backupPolicy"] = json!({"backupIntervalInSecond": 60, "maxBackups": 2});
    // The first is due at once.
    let first = decide(
        backup(spec.clone(), json!({})),
        vec![],
        ScriptedAppCall::new(),
        NOW,
    );
    let pod = applied_pod(&first).expect("pod");
    assert_eq!(
        container(pod, "initContainers", "upload")["command"][5],
        "s3/etcd-backups/prod/etcd.backup_20231114T221320Z"
    );
    // Two kept, the next one due: it removes the older one after its upload.
    let kept = json!({
        "succeeded": true, "lastScheduledTime": "2023-11-14T22:13:20Z",
        "backups": ["prod/etcd.backup_20231114T221320Z", "prod/etcd.backup_20231114T221220Z"],
    });
    let not_yet = decide(
        backup(spec.clone(), kept.clone()),
        vec![],
        ScriptedAppCall::new(),
        NOW + 30,
    );
    assert!(applied_pod(&not_yet).is_none());
    assert_eq!(not_yet.requeue_after_ms, Some(30_000));
    let due = decide(
        backup(spec.clone(), kept.clone()),
        vec![],
        ScriptedAppCall::new(),
        NOW + 60,
    );
    let made = applied_pod(&due).expect("pod").clone();
    let prune = container(&made, "initContainers", "prune");
    assert_eq!(prune["command"][3], "rm");
    assert_eq!(
        prune["command"][5],
        "s3/etcd-backups/prod/etcd.backup_20231114T221220Z"
    );
    assert_eq!(
        prune["command"].as_array().map(Vec::len),
        Some(6),
        "only the one beyond maxBackups"
    );
    // Its success lists it first and forgets the removed one.
    let running = decide(
        backup(spec, kept),
        vec![pod_at(&made, "running")],
        serving_etcd(),
        NOW + 75,
    );
    let written = status(&running).expect("status");
    assert_eq!(
        written["backups"],
        json!([
            "prod/etcd.backup_20231114T221420Z",
            "prod/etcd.backup_20231114T221320Z"
        ])
    );
}

#[test]
fn a_client_tls_secret_reaches_etcdctl_with_the_classic_key_names() {
    let mut spec = classic_spec();
    spec["clientTLSSecret"] = json!("etcd-client-tls");
    let pod = applied_pod(&decide(
        backup(spec, json!({})),
        vec![],
        ScriptedAppCall::new(),
        NOW,
    ))
    .expect("pod")
    .clone();
    let save = container(&pod, "initContainers", "save");
    assert_eq!(
        save["env"][1],
        json!({"name": "ETCDCTL_CACERT", "value": "/etc/etcd/client-tls/etcd-client-ca.crt"})
    );
    assert_eq!(
        save["env"][3],
        json!({"name": "ETCDCTL_KEY", "value": "/etc/etcd/client-tls/etcd-client.key"})
    );
    assert!(
        pod["spec"]["volumes"]
            .as_array()
            .into_iter()
            .flatten()
            .any(|v| v["secret"]["secretName"] == "etcd-client-tls")
    );
    // Only the save step gets it: the upload gets the store's credentials, nothing else.
    let upload = container(&pod, "initContainers", "upload");
    assert!(!upload.to_string().contains("client-tls"));
}

#[test]
fn specs_that_cannot_be_honoured_are_refused_naming_the_field() {
    let cases: Vec<(&str, Value, &str)> = vec![
        (
            "classic GCS",
            json!({"etcdEndpoints": ["http://e:2379"], "storageType": "GCS", "gcs": {"path": "b/o"}}),
            "spec.gcs",
        ),
        (
            "ABS type",
            json!({"etcdEndpoints": ["http://e:2379"], "storageType": "ABS", "s3": {"path": "b/o", "awsSecret": "a"}}),
            "spec.storageType \"ABS\"",
        ),
        (
            "no endpoints",
            json!({"storageType": "S3", "s3": {"path": "bucket/o", "awsSecret": "a"}}),
            "spec.etcdEndpoints is empty",
        ),
        (
            "endpoint without scheme",
            json!({"etcdEndpoints": ["example-client:2379"], "storageType": "S3", "s3": {"path": "bucket/o", "awsSecret": "a"}}),
            "spec.etcdEndpoints[0]",
        ),
        (
            "no s3",
            json!({"etcdEndpoints": ["http://e:2379"], "storageType": "S3"}),
            "spec.s3 is missing",
        ),
        (
            "path without object",
            json!({"etcdEndpoints": ["http://e:2379"], "storageType": "S3", "s3": {"path": "bucket", "awsSecret": "a"}}),
            "spec.s3.path",
        ),
        (
            "bad secret",
            json!({"etcdEndpoints": ["http://e:2379"], "storageType": "S3", "s3": {"path": "bucket/o", "awsSecret": "No_Such"}}),
            "spec.s3.awsSecret",
        ),
        (
            "negative interval",
            json!({"etcdEndpoints": ["http://e:2379"], "storageType": "S3", "s3": {"path": "bucket/o", "awsSecret": "a"}, "backupPolicy": {"backupIntervalInSecond": -5}}),
            "backupIntervalInSecond",
        ),
    ];
    for (case, spec, field) in cases {
        let decision = decide(backup(spec, json!({})), vec![], ScriptedAppCall::new(), NOW);
        assert!(applied_pod(&decision).is_none(), "{case}: no pod");
        let written = status(&decision).unwrap_or_else(|| panic!("{case}: a status"));
        let reason = written["reason"].as_str().unwrap_or_default();
        assert!(reason.contains(field), "{case}: {reason}");
        assert_eq!(written["conditions"][0]["reason"], "InvalidSpec", "{case}");
        assert!(
            events(&decision)
                .iter()
                .any(|(t, r, _)| *t == EventType::Warning && r == "InvalidSpec"),
            "{case}"
        );
    }
}

#[test]
fn the_documented_example_is_a_valid_classic_backup() {
    let path = concat!(
        env!("CARGO_MANIFEST_DIR"),
        "/../deploy/examples/etcd-backup.yaml"
    );
    let text = std::fs::read_to_string(path).expect("deploy/examples/etcd-backup.yaml");
    let object: crate::spec::EtcdBackupObject = serde_yaml::from_str(&text).expect("parses");
    let valid = object.spec.validate().expect("valid");
    assert_eq!(valid.endpoint, "http://example-etcd-cluster-client:2379");
    assert_eq!(
        (valid.bucket.as_str(), valid.object.as_str()),
        ("etcd-backups", "example/etcd.backup")
    );
}
