//! The CEL rules of every plugin's CRD (`x-kubernetes-validations`, generated from the spec
//! types by `cargo xtask crdgen`) at the real kube-apiserver: one row per rule, each a create,
//! or a create and then an update, refused with the rule's message; beside them the changes the
//! rules must let through. No host runs: what is refused here never reaches a plugin.
//!
//! Installing the CRDs is itself a check of the rules' cost: kube-apiserver refuses a CRD
//! whose rules may exceed its CEL cost budget (strings the rules match carry a `maxLength`, so
//! their estimated cost stays bounded).

use kube::api::{Api, ApiResource, DynamicObject, Patch, PatchParams, PostParams};
use kube::core::GroupVersionKind;
use policy_host_e2e::{init_logging, install_crd};
use policy_host_testenv::shared_node;
use serde_json::{Value, json};

/// The kinds with rules, each with a spec every rule accepts.
#[derive(Clone, Copy, Debug)]
enum Kind {
    EtcdCluster,
    EtcdBackup,
    EtcdRestore,
    RedisReplication,
    MariaDBCluster,
}

impl Kind {
    fn resource(self) -> ApiResource {
        let (group, kind, plural) = match self {
            Kind::EtcdCluster => ("etcd.database.coreos.com", "EtcdCluster", "etcdclusters"),
            Kind::EtcdBackup => ("etcd.database.coreos.com", "EtcdBackup", "etcdbackups"),
            Kind::EtcdRestore => ("etcd.database.coreos.com", "EtcdRestore", "etcdrestores"),
            Kind::RedisReplication => (
                "redis.policy-host.io",
                "RedisReplication",
                "redisreplications",
            ),
            Kind::MariaDBCluster => (
                "mariadb.policy-host.io",
                "MariaDBCluster",
                "mariadbclusters",
            ),
        };
        let version = match self {
            Kind::RedisReplication | Kind::MariaDBCluster => "v1alpha1",
            _ => "v1beta2",
        };
        ApiResource::from_gvk_with_plural(&GroupVersionKind::gvk(group, version, kind), plural)
    }

    fn valid_spec(self) -> Value {
        let s3 = json!({"path": "etcd-backups/prod/etcd.backup", "awsSecret": "s3-credentials"});
        match self {
            Kind::EtcdCluster => json!({"size": 3, "version": "3.6.16"}),
            Kind::EtcdBackup => json!({"etcdEndpoints": ["http://example-client:2379"],
                "storageType": "S3", "s3": s3}),
            Kind::EtcdRestore => json!({"etcdCluster": {"name": "restored"},
                "backupStorageType": "S3", "s3": s3}),
            Kind::RedisReplication => json!({"replicas": 3, "version": "7.0.15"}),
            Kind::MariaDBCluster => json!({"replicas": 2}),
        }
    }
}

/// One rule: an object of `kind` whose spec is the valid one merged with `create` (JSON merge
/// patch: `null` removes a field), then, with `update`, that merge patch applied to the created
/// object. The last step must be refused with a message containing `refused`, or accepted
/// when `refused` is empty.
struct Row {
    rule: &'static str,
    kind: Kind,
    create: Value,
    update: Option<Value>,
    refused: &'static str,
}

fn row(rule: &'static str, kind: Kind, create: Value, refused: &'static str) -> Row {
    Row {
        rule,
        kind,
        create,
        update: None,
        refused,
    }
}

fn row_update(
    rule: &'static str,
    kind: Kind,
    create: Value,
    update: Value,
    refused: &'static str,
) -> Row {
    Row {
        rule,
        kind,
        create,
        update: Some(update),
        refused,
    }
}

fn rows() -> Vec<Row> {
    use Kind::*;
    let tls = json!({"tls": {"peerSecret": "p", "serverSecret": "s", "operatorSecret": "o"}});
    let claim = json!({"claimName": "backup-old", "snapshot": "old-0.db"});
    let object = json!({"endpoint": "https://s3.example.com", "bucket": "etcd",
        "key": "prod/ex-0.db", "credentialsSecret": "s3-credentials"});
    let backup = |fields: Value| {
        let mut backup = json!({"storage": {"size": "1Gi"}});
        merge(&mut backup, &fields);
        json!({"backup": backup})
    };
    let maintenance = |fields: Value| json!({"maintenance": fields});
    let policy = |fields: Value| json!({"backupPolicy": fields});
    vec![
        // EtcdCluster
        row(
            "size below 1",
            EtcdCluster,
            json!({"size": 0}),
            "spec.size must be 1 to 9",
        ),
        row(
            "size above 9",
            EtcdCluster,
            json!({"size": 10}),
            "spec.size must be 1 to 9",
        ),
        row(
            "version not a version",
            EtcdCluster,
            json!({"version": "latest"}),
            "spec.version must be an etcd version",
        ),
        row(
            "restore from a claim and s3 at once",
            EtcdCluster,
            json!({"restore": {"claimName": "backup-old", "snapshot": "old-0.db", "s3": object}}),
            "spec.restore needs exactly one source",
        ),
        row(
            "restore from nothing",
            EtcdCluster,
            json!({"restore": {"claimName": "backup-old"}}),
            "spec.restore needs exactly one source",
        ),
        row_update(
            "restore added to an existing cluster",
            EtcdCluster,
            json!({}),
            json!({"restore": claim}),
            "spec.restore is read only when the cluster is created",
        ),
        row_update(
            "restore changed on an existing cluster",
            EtcdCluster,
            json!({"restore": claim}),
            json!({"restore": {"snapshot": "old-1.db"}}),
            "spec.restore is read only when the cluster is created",
        ),
        row_update(
            "tls added to an existing cluster",
            EtcdCluster,
            json!({}),
            tls.clone(),
            "spec.tls cannot be added to or removed from an existing EtcdCluster",
        ),
        row_update(
            "tls removed from an existing cluster",
            EtcdCluster,
            tls.clone(),
            json!({"tls": null}),
            "spec.tls cannot be added to or removed from an existing EtcdCluster",
        ),
        row_update(
            "member storage shrunk",
            EtcdCluster,
            json!({"storage": {"size": "2Gi"}}),
            json!({"storage": {"size": "1536Mi"}}),
            "size cannot shrink",
        ),
        row_update(
            "backup storage shrunk",
            EtcdCluster,
            backup(json!({"storage": {"size": "2Gi"}})),
            backup(json!({"storage": {"size": 1_000_000}})),
            "size cannot shrink",
        ),
        row(
            "backup keeping no snapshot",
            EtcdCluster,
            backup(json!({"keep": 0})),
            "spec.backup.keep must be at least 1",
        ),
        row(
            "backup every, not a duration",
            EtcdCluster,
            backup(json!({"every": "6 hours"})),
            "spec.backup.every must be a duration",
        ),
        row(
            "backup every zero",
            EtcdCluster,
            backup(json!({"every": "0s"})),
            "spec.backup.every must be a duration",
        ),
        row(
            "auto-compaction mode unknown",
            EtcdCluster,
            maintenance(json!({"autoCompactionMode": "daily"})),
            "must be periodic or revision",
        ),
        row(
            "quota of no bytes",
            EtcdCluster,
            maintenance(json!({"quotaBackendBytes": 0})),
            "spec.maintenance.quotaBackendBytes must be a size in bytes",
        ),
        row(
            "defragmentation above 100 percent",
            EtcdCluster,
            maintenance(json!({"defragmentAbovePercent": 101})),
            "spec.maintenance.defragmentAbovePercent must be a percentage from 1 to 100",
        ),
        row(
            "classic TLS.static",
            EtcdCluster,
            json!({"TLS": {"static": {"member": {"peerSecret": "p", "serverSecret": "s"},
                "operatorSecret": "o"}}}),
            "spec.TLS.static is the classic operator's TLS",
        ),
        // What the rules let through.
        row_update(
            "size, version, pause, growing storage and an unchanged restore and tls pass",
            EtcdCluster,
            json!({"restore": claim, "tls": tls["tls"], "storage": {"size": "1Gi"}}),
            json!({"size": 5, "version": "v3.6.17", "paused": true, "storage": {"size": "2Gi"},
                "backup": {"storage": {"size": "1Gi"}, "every": "1h30m", "keep": 1},
                "maintenance": {"autoCompactionMode": "revision", "defragmentAbovePercent": 50}}),
            "",
        ),
        // EtcdBackup
        row(
            "backup to a storage type not S3",
            EtcdBackup,
            json!({"storageType": "ABS"}),
            "only S3 (any S3-compatible store) is supported",
        ),
        row(
            "backup to a classic storage beside S3",
            EtcdBackup,
            json!({"gcs": {"path": "b/o", "gcpSecret": "g"}}),
            "only S3 (any S3-compatible store) is supported",
        ),
        row(
            "backup without s3",
            EtcdBackup,
            json!({"s3": null}),
            "spec.s3 is missing",
        ),
        row(
            "backup from an endpoint without a scheme",
            EtcdBackup,
            json!({"etcdEndpoints": ["example-client:2379"]}),
            "spec.etcdEndpoints must start with the cluster's client URL",
        ),
        row(
            "backup with a negative timeout",
            EtcdBackup,
            policy(json!({"timeoutInSecond": -1})),
            "spec.backupPolicy.timeoutInSecond must be a positive number",
        ),
        row(
            "backup with a negative interval",
            EtcdBackup,
            policy(json!({"backupIntervalInSecond": -1})),
            "spec.backupPolicy.backupIntervalInSecond must be a positive number",
        ),
        row(
            "backup keeping a negative number",
            EtcdBackup,
            policy(json!({"maxBackups": -1})),
            "spec.backupPolicy.maxBackups must be a positive number",
        ),
        // EtcdRestore
        row(
            "restore from a storage type not S3",
            EtcdRestore,
            json!({"backupStorageType": "GCS"}),
            "only S3 (any S3-compatible store) is supported",
        ),
        row(
            "restore without s3",
            EtcdRestore,
            json!({"s3": null}),
            "spec.s3 is missing",
        ),
        row(
            "restore into no cluster",
            EtcdRestore,
            json!({"etcdCluster": {"name": null}}),
            "spec.etcdCluster.name is missing",
        ),
        row_update(
            "restore moved to another cluster",
            EtcdRestore,
            json!({}),
            json!({"etcdCluster": {"name": "other"}}),
            "spec.etcdCluster cannot change",
        ),
        // RedisReplication
        row(
            "redis with no server",
            RedisReplication,
            json!({"replicas": 0}),
            "spec.replicas must be 1 to 9",
        ),
        row(
            "redis version not a version",
            RedisReplication,
            json!({"version": "7.0"}),
            "spec.version must be a Redis version",
        ),
        // MariaDBCluster
        row(
            "mariadb with more replicas than it runs",
            MariaDBCluster,
            json!({"replicas": 9}),
            "spec.replicas must be 0 to 8",
        ),
        row(
            "mariadb with only a primary",
            MariaDBCluster,
            json!({"replicas": 0}),
            "",
        ),
    ]
}

/// RFC 7386 merge: `patch` into `target`, `null` removing a field.
fn merge(target: &mut Value, patch: &Value) {
    match (target.as_object_mut(), patch.as_object()) {
        (Some(target), Some(patch)) => {
            for (key, value) in patch {
                if value.is_null() {
                    target.remove(key);
                } else {
                    merge(target.entry(key.clone()).or_insert(Value::Null), value);
                }
            }
        }
        _ => *target = patch.clone(),
    }
}

/// What the API server said to the row's last step: `Ok` if it was accepted.
async fn attempt(
    api: &Api<DynamicObject>,
    name: &str,
    row: &Row,
) -> anyhow::Result<Result<(), String>> {
    let mut spec = row.kind.valid_spec();
    merge(&mut spec, &row.create);
    let resource = row.kind.resource();
    let object = json!({
        "apiVersion": resource.api_version,
        "kind": resource.kind,
        "metadata": {"name": name},
        "spec": spec,
    });
    let created = api
        .create(&PostParams::default(), &serde_json::from_value(object)?)
        .await;
    let Some(update) = &row.update else {
        return Ok(created.map(|_| ()).map_err(|e| e.to_string()));
    };
    if let Err(e) = created {
        anyhow::bail!(
            "{}: the object to update was refused at creation: {e}",
            row.rule
        );
    }
    Ok(api
        .patch(
            name,
            &PatchParams::default(),
            &Patch::Merge(&json!({"spec": update})),
        )
        .await
        .map(|_| ())
        .map_err(|e| e.to_string()))
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn every_cel_rule_of_every_plugin_crd_refuses_at_the_api_server() -> anyhow::Result<()> {
    init_logging();
    let env = shared_node().await?;
    let client = env.client().await?;
    for crd in [
        "etcdcluster",
        "etcdbackup",
        "etcdrestore",
        "redisreplication",
        "mariadbcluster",
    ] {
        install_crd(&client, &format!("deploy/crds/{crd}.yaml")).await?;
    }
    let namespace = env.create_namespace("crd-validation").await?;
    let mut failures = Vec::new();
    for (n, row) in rows().iter().enumerate() {
        let api: Api<DynamicObject> =
            Api::namespaced_with(client.clone(), &namespace, &row.kind.resource());
        let outcome = attempt(&api, &format!("row-{n}"), row).await?;
        match (&outcome, row.refused) {
            (Ok(()), "") => {}
            (Err(message), fragment) if !fragment.is_empty() && message.contains(fragment) => {}
            (Ok(()), fragment) => failures.push(format!(
                "{}: accepted, should be refused with {fragment:?}",
                row.rule
            )),
            (Err(message), fragment) => failures.push(format!(
                "{}: refused with {message:?}, should be {}",
                row.rule,
                if fragment.is_empty() {
                    "accepted".to_owned()
                } else {
                    format!("refused with {fragment:?}")
                }
            )),
        }
    }
    anyhow::ensure!(
        failures.is_empty(),
        "{} rows failed:\n{}",
        failures.len(),
        failures.join("\n")
    );
    Ok(())
}
